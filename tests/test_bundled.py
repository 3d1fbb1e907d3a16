"""The bundled project-written labelled set (data/bundled/sessions.jsonl) keeps its contract.

Fast and self-contained: needs neither the corpora nor any model. The rendering used to check key
spans is ``ctxscore.types.Message.text`` (the rendering of the distilled labels).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from ctxscore.messages import Message

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "data" / "bundled"
SESSIONS = BUNDLED / "sessions.jsonl"
CATEGORIES = ("instruction", "key_state", "reasoning", "failure")
CJK = re.compile(r"[\u4e00-\u9fff]")


@pytest.fixture(scope="module")
def sessions() -> list[dict]:
    with open(SESSIONS, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def test_size_and_languages(sessions):
    n_msgs = sum(len(s["messages"]) for s in sessions)
    langs = Counter(s["language"] for s in sessions)
    assert len(sessions) >= 40
    assert n_msgs >= 1500
    assert set(langs) == {"en", "zh"}
    assert langs["en"] >= 15 and langs["zh"] >= 15
    assert SESSIONS.stat().st_size < 1_500_000


def test_session_fields(sessions):
    ids = [s["session_id"] for s in sessions]
    assert len(ids) == len(set(ids)), "duplicate session ids"
    for s in sessions:
        sid = s["session_id"]
        assert sid.startswith("bundled/") and len(sid) > len("bundled/"), sid
        assert isinstance(s["scenario"], str) and s["scenario"], sid
        assert 25 <= len(s["messages"]) <= 60, (sid, len(s["messages"]))
        assert 4 <= len(s["key_facts"]) <= 12, (sid, len(s["key_facts"]))
        assert s["messages"][0]["role"] == "system", sid


def test_languages_are_written_natively(sessions):
    for s in sessions:
        users = [m["content"] for m in s["messages"] if m["role"] in ("user", "system")]
        with_cjk = sum(bool(CJK.search(t)) for t in users)
        if s["language"] == "zh":
            assert with_cjk == len(users), f"{s['session_id']}: a user/system message without Chinese"
        else:
            assert with_cjk == 0, f"{s['session_id']}: Chinese text in an English session"


def test_labels_valid_and_spans_in_rendered_text(sessions):
    for s in sessions:
        for i, m in enumerate(s["messages"]):
            where = f"{s['session_id']}#{i}"
            msg = Message.from_dict(m, where=where)  # raises on malformed messages
            label = m["label"]
            assert set(label) == {"category", "importance", "key_spans"}, where
            assert label["category"] in CATEGORIES, where
            assert isinstance(label["importance"], int) and 0 <= label["importance"] <= 3, where
            spans = label["key_spans"]
            assert isinstance(spans, list) and len(spans) <= 8, where
            text = msg.text()
            for span in spans:
                assert isinstance(span, str) and span, where
                assert span in text, f"{where}: key span {span!r} not in {text[:120]!r}"


def test_label_conventions(sessions):
    """Tie-breaks of the annotation guide that hold by construction in this set."""
    for s in sessions:
        for i, m in enumerate(s["messages"]):
            where = f"{s['session_id']}#{i}"
            label = m["label"]
            if m["role"] == "system":
                assert label["category"] == "instruction", where
            if m["role"] == "tool" and m["content"].startswith("Error:"):
                assert label["category"] == "failure", where
            if label["category"] == "failure":
                assert label["importance"] <= 1, where


def test_key_facts(sessions):
    n_superseded = Counter()
    for s in sessions:
        msgs = s["messages"]
        fids = [f["fact_id"] for f in s["key_facts"]]
        assert len(fids) == len(set(fids)), s["session_id"]
        for f in s["key_facts"]:
            where = f"{s['session_id']} fact {f['fact_id']}"
            assert {"fact_id", "value", "source_index", "probe", "kind"} <= set(f), where
            assert set(f) <= {"fact_id", "value", "source_index", "probe", "kind", "superseded"}, where
            idx = f["source_index"]
            assert isinstance(idx, int) and 0 <= idx < len(msgs), where
            assert f["value"] and f["value"] in msgs[idx]["content"], where
            assert f["probe"].strip() and f["kind"].strip(), where
            if "superseded" in f:
                old = f["superseded"]
                assert old and old != f["value"], where
                assert any(old in m["content"] for m in msgs[:idx]), f"{where}: {old!r} in no earlier message"
                n_superseded[s["language"]] += 1
    assert n_superseded["en"] >= 8 and n_superseded["zh"] >= 8, n_superseded


def test_tool_calls_and_results_pair(sessions):
    for s in sessions:
        pending: dict[str, str] = {}
        seen: set[str] = set()
        for i, m in enumerate(s["messages"]):
            where = f"{s['session_id']}#{i}"
            if m["role"] == "tool":
                cid = m.get("tool_call_id")
                assert cid in pending, f"{where}: result for unknown or already answered call {cid!r}"
                assert m.get("name") == pending.pop(cid), f"{where}: tool name differs from the call"
                continue
            assert not pending, f"{where}: calls {sorted(pending)} not answered before a {m['role']} message"
            for call in m.get("tool_calls") or []:
                assert m["role"] == "assistant", where
                assert call["type"] == "function" and call["id"] not in seen, where
                json.loads(call["function"]["arguments"])  # arguments are a JSON string
                seen.add(call["id"])
                pending[call["id"]] = call["function"]["name"]
        assert not pending, f"{s['session_id']}: calls {sorted(pending)} never answered"


def test_category_balance(sessions):
    for lang in ("en", "zh"):
        labels = [m["label"] for s in sessions if s["language"] == lang for m in s["messages"]]
        counts = Counter(lb["category"] for lb in labels)
        for cat in CATEGORIES:
            share = counts[cat] / len(labels)
            assert 0.10 <= share <= 0.45, (lang, cat, round(share, 3))
        imps = Counter(lb["importance"] for lb in labels)
        assert all(imps[k] >= 20 for k in range(4)), (lang, imps)
    for s in sessions:
        assert {m["label"]["category"] for m in s["messages"]} == set(CATEGORIES), s["session_id"]


def test_build_is_deterministic(tmp_path):
    out = tmp_path / "sessions.jsonl"
    subprocess.run([sys.executable, str(BUNDLED / "build.py"), "--out", str(out)], check=True,
                   capture_output=True, cwd=tmp_path)
    assert out.read_bytes() == SESSIONS.read_bytes(), "data/bundled/sessions.jsonl is stale: run data/bundled/build.py"


def test_data_card_says_project_written():
    card = (ROOT / "data" / "README.md").read_text(encoding="utf-8")
    assert "## Bundled project-written set" in card
    section = card.split("## Bundled project-written set", 1)[1].split("\n## ", 1)[0]
    assert "written by the project" in section
