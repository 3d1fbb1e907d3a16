"""Key-span runs in Chinese text end on word boundaries (jieba's segmentation, :func:`ctxscore.scoring.spans._snap`)."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from ctxscore.scoring import spans as spans_mod
from ctxscore.scoring.spans import MAX_SPANS, SpanExtractor, runs_of, tokenize

jieba = pytest.importorskip("jieba")


def _runs(text: str, kept: list[str], snap: bool = True) -> list[str]:
    """The runs of ``text`` when the characters of each of ``kept`` (found in order) are the kept tokens."""
    toks = tokenize(text)
    chars: set[int] = set()
    pos = 0
    for k in kept:
        at = text.index(k, pos)
        chars.update(range(at, at + len(k)))
        pos = at + len(k)
    keep = np.array([a in chars for a, _ in toks])
    runs = runs_of(text, toks, keep, keep.astype(float), snap=snap)
    return [text[a:b] for a, b in runs]


def test_a_run_starting_or_ending_inside_a_word_gets_the_whole_word():
    text = "顺便问一下，潮汕砂锅粥有什么招牌菜吗？"
    assert _runs(text, ["汕砂锅粥", "么招牌"], snap=False) == ["汕砂锅粥", "么招牌"]
    assert _runs(text, ["汕砂锅粥", "么招牌"]) == ["潮汕砂锅粥", "什么招牌菜"]
    assert _runs("36 周婷说周二下午有事", ["午有事"]) == ["下午有事"]
    assert _runs("就客家人家吧", ["家人家"]) == ["客家人家"]


def test_the_number_written_against_the_first_character_is_taken_in():
    text = "帮我订8月9日（周六）晚上的位子…"
    assert _runs(text, ["月9日（周六）晚上"]) == ["8月9日（周六）晚上"]
    assert _runs("人均消费在150-500元之间", ["元之间"]) == ["150-500元之间"]


def test_a_particle_at_an_edge_is_dropped_but_not_a_character_of_a_word():
    assert _runs("这个景点的周边餐馆都有哪些？", ["的周边餐馆"]) == ["周边餐馆"]
    assert _runs("去八达岭长城吧", ["八达岭长城吧"]) == ["八达岭长城"]
    assert _runs("最好离滨江公园近一点", ["好离滨江公园"]) == ["最好离滨江公园"]
    assert _runs("这个景点的电话", ["的"]) == []  # nothing but a particle


def test_snapped_runs_that_meet_are_merged_and_stay_within_the_limit():
    text = "周边有北京天伦王朝酒店、北京都季商旅酒店。"
    assert _runs(text, ["北京天伦王", "酒店"]) == ["北京天伦王朝酒店"]  # 王 | 朝 | 酒店: the word 王朝 joins them
    many = "，".join(["潮汕砂锅粥"] * (MAX_SPANS + 4))
    got = _runs(many, ["汕砂锅粥"] * (MAX_SPANS + 4))
    assert got == ["潮汕砂锅粥"] * MAX_SPANS


def test_english_text_and_ascii_tokens_are_left_alone():
    text = "Call 010-69771665 or visit 33 - 34 Saint Andrews Street."
    toks = tokenize(text)
    keep = np.array([text[a:b] not in ("Call", "or", "visit") for a, b in toks])
    assert runs_of(text, toks, keep, keep.astype(float)) == runs_of(text, toks, keep, keep.astype(float), snap=False)
    assert _runs("ABT恤", ["恤"]) == ["恤"]  # jieba's word T恤 would cut the token ABT


def test_without_jieba_the_ends_stay(monkeypatch):
    monkeypatch.setitem(sys.modules, "jieba", None)
    spans_mod._segment.cache_clear()
    try:
        assert _runs("顺便问一下，潮汕砂锅粥有什么招牌菜吗？", ["汕砂锅粥"]) == ["汕砂锅粥"]
        assert _runs("帮我订8月9日", ["月9日"]) == ["8月9日"]  # the number rule needs no segmentation
    finally:
        spans_mod._segment.cache_clear()


def test_the_shipped_extractor_keeps_whole_words():
    from ctxscore.scoring.package import DEFAULT_MODEL_DIR, SPANS_FILE, load_skops
    from ctxscore.scoring.rules import RuleConfig

    cfg = json.loads((DEFAULT_MODEL_DIR / "config.json").read_text()).get("spans") or {}
    ext = SpanExtractor(load_skops(DEFAULT_MODEL_DIR / SPANS_FILE), float(cfg.get("threshold", spans_mod.THRESHOLD)),
                        config=RuleConfig.load(DEFAULT_MODEL_DIR / "rules.toml"),
                        require_threshold=float(cfg.get("require_threshold", spans_mod.REQUIRE_THRESHOLD)))
    text = "顺便问一下，潮汕砂锅粥有什么招牌菜吗？"
    got = ext.key_spans(text, "user")  # what a compressed form must keep and the fact ledger records
    assert "潮汕砂锅粥" in got and "汕砂锅粥" not in got
    assert ext.spans("帮我订8月9日（周六）晚上的位子…", "user")[0].startswith("8月9日")
    for a, b in ext.keep_positions(text, "user"):
        assert 0 <= a < b <= len(text)
