"""Data layer, without the corpora: splits, value target, weak-label patterns, chaining, the LoCoMo
loader on its fixture, the bundled loader and a bundled-only build."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from ctxscore import ContextManager
from training.data import (
    BuildConfig,
    CorporaMissingError,
    build,
    importance_to_value,
    load_dataset_dict,
    load_eval_sessions,
    load_locomo,
    split_of,
)
from training.data.chain import build_eval_sessions
from training.data.facts import check_facts, find_value
from training.data.labels import LabelFormatError, load_distilled
from training.data.locomo import LocomoFormatError
from training.data.schema import make_message, render_text, span_visible
from training.data.sources.bundled import BundledFormatError, load_bundled
from training.data.splits import assign_few
from training.data.weak import is_pleasantry

FIXTURES = Path(__file__).parent / "fixtures"


# --- splits and targets ---------------------------------------------------------------------------

def test_split_by_group_is_deterministic_and_near_the_fractions():
    groups = [f"sgd/{i}_{j:05d}" for i in range(1, 21) for j in range(500)]
    first = [split_of(g) for g in groups]
    assert first == [split_of(g) for g in groups]
    c = Counter(first)
    assert abs(c["train"] / len(groups) - 0.70) < 0.02
    assert abs(c["dev"] / len(groups) - 0.15) < 0.02
    assert abs(c["test"] / len(groups) - 0.15) < 0.02
    with pytest.raises(ValueError):
        split_of("x", (0.5, 0.2, 0.2))


def test_few_groups_get_dev_and_test():
    fams = [f"bundled/f{i}" for i in range(6)]
    a = assign_few(fams)
    assert Counter(a.values()) == {"train": 4, "dev": 1, "test": 1}
    assert a == assign_few(list(reversed(fams)))
    assert set(assign_few(["bundled/a", "bundled/b"]).values()) == {"train"}


def test_value_is_importance_over_three():
    assert [importance_to_value(i) for i in range(4)] == pytest.approx([0.0, 1 / 3, 2 / 3, 1.0])
    assert importance_to_value(7) == 1.0 and importance_to_value(-1) == 0.0


def test_distilled_loader_names_the_bad_line(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"id": "a#0", "category": "key_state", "importance": 2, "key_spans": []}\n'
                 '{"id": "a#1", "category": "noise", "importance": 1, "key_spans": []}\n', encoding="utf-8")
    with pytest.raises(LabelFormatError, match=r"d\.jsonl:2: category 'noise'"):
        load_distilled(p)
    p.write_text('{"id": "a#0", "category": "key_state", "importance": 2, "key_spans": []}\n\n{"id": "a#1",\n',
                 encoding="utf-8")
    with pytest.raises(LabelFormatError, match=r"d\.jsonl: line 3: invalid JSON"):
        load_distilled(p)


# --- rendering, spans, value search -----------------------------------------------------------------

def test_rendering_matches_the_annotators_view():
    calls = [{"id": "c1", "type": "function", "function": {"name": "get_user_details", "arguments": '{"user_id":"x"}'}},
             {"id": "c2", "type": "function", "function": {"name": "think", "arguments": "{}"}}]
    assert render_text("assistant", "", tool_calls=calls) == 'TOOL_CALL get_user_details({"user_id":"x"}); think({})'
    assert render_text("assistant", "ok", tool_calls=calls[:1]) == 'ok\nTOOL_CALL get_user_details({"user_id":"x"})'
    assert render_text("tool", "{}", name="think") == "[think] {}"
    m = make_message("tau_airline/airline-t3-r0", 4, "assistant", None, tool_calls=calls[:1])
    assert m["id"] == "tau_airline/airline-t3-r0#4" and m["content"] == ""


def test_span_visibility_follows_the_cut():
    text = "A" * 900 + "MIDDLE" + "B" * 1000 + "END"
    assert span_visible(text, "END") and span_visible(text, "AAA")
    assert not span_visible(text, "MIDDLE")
    assert span_visible("short MIDDLE text", "MIDDLE")


def test_find_value_uses_whole_words_and_keeps_the_text_casing():
    msgs = [{"role": "user", "content": "a feast in the East"}, {"role": "assistant", "content": "east side"}]
    assert find_value(msgs, "east") == (0, "East")
    assert find_value(msgs, "east", ignore_case=False) == (1, "east")
    assert find_value([{"role": "user", "content": "我想去故宫"}], "故宫", language="zh") == (0, "故宫")


def test_pleasantries():
    assert is_pleasantry("Thanks, bye!")
    assert is_pleasantry("No, that's all. Thank you!")
    assert not is_pleasantry("I need a taxi to the airport at 5 pm.")
    assert is_pleasantry("谢谢，再见！", "zh")
    assert not is_pleasantry("帮我找一家评分4.5分以上的餐馆", "zh")


# --- chaining ---------------------------------------------------------------------------------------

def _unit(sid: str, n: int, fact_at: int, system: str | None = "policy") -> dict:
    msgs = []
    for i in range(n):
        role = "system" if (i == 0 and system) else ("user" if i % 2 else "assistant")
        content = system if role == "system" else f"{sid} turn {i}"
        msgs.append({"id": f"{sid}#{i}", "index": i, "role": role, "content": content, "name": None,
                     "tool_calls": None, "tool_call_id": None, "text": content})
    fact = {"fact_id": f"{sid}:f", "value": f"{sid} turn {fact_at}", "source_index": fact_at, "probe": "?", "kind": "k"}
    return {"session_id": sid, "source": "tau_airline", "group": sid, "language": "en", "upstream_split": "test",
            "messages": msgs, "key_facts": [fact], "meta": {"user_id": "u", "task_id": int(sid[1:]), "trial": 0}}


def test_chaining_drops_repeated_system_and_shifts_facts():
    units = [_unit(f"t{i}", 30, 5 + i) for i in range(6)]
    out = build_eval_sessions({"tau_airline": units}, "test", {"tau_airline": 2}, seed=1)
    assert out, "expected at least one chained session"
    for s in out:
        assert 50 <= s["n_messages"] <= 600
        assert sum(1 for m in s["messages"] if m["role"] == "system") == 1
        assert check_facts(s["messages"], s["key_facts"]) == []
        # the second unit lost its system message: its turn 1 directly follows the first unit
        assert s["messages"][30]["id"] == f"{s['members'][1]}#1"
        second_fact = s["key_facts"][1]
        assert second_fact["source_index"] == 30 + int(s["members"][1][1:]) + 5 - 1


def test_chaining_drops_an_empty_turn_the_runtime_refuses_and_keeps_facts_on_their_messages():
    units = [_unit(f"t{i}", 30, 5 + i) for i in range(6)]
    for u in units:  # an empty assistant turn (SGD has some) before each unit's fact
        u["messages"][2]["content"] = u["messages"][2]["text"] = ""
    out = build_eval_sessions({"tau_airline": units}, "test", {"tau_airline": 2}, seed=1)
    assert out
    for s in out:
        assert all(m["content"].strip() for m in s["messages"])
        assert check_facts(s["messages"], s["key_facts"]) == []
        assert len(s["key_facts"]) == len(s["members"])
        for f in s["key_facts"]:
            assert s["messages"][f["source_index"]]["content"] == f["value"]
        ContextManager(budget=10**6).extend(s["messages"])  # the runtime takes every message


# --- LoCoMo -----------------------------------------------------------------------------------------

def test_locomo_fixture_loads_with_evidence_turns_as_key_facts():
    sessions = {s["session_id"]: s for s in load_locomo(FIXTURES / "locomo_mini.json")}
    assert set(sessions) == {"locomo/conv-mini-1", "locomo/conv-mini-2"}
    s1 = sessions["locomo/conv-mini-1"]
    assert len(s1["messages"]) == 9
    assert [m["role"] for m in s1["messages"][:3]] == ["user", "assistant", "user"]  # speaker_a = user
    by_probe = {f["probe"]: f for f in s1["key_facts"]}
    expected = {  # probe -> (dia_id of the evidence turn, value), worked out by hand from the fixture
        "What did Caroline research?": ("D1:5", "adoption agencies"),
        "What class did Melanie sign up for?": ("D1:4", "pottery class"),
        "In what year did Caroline move?": ("D2:2", "2022"),
        "What did Melanie paint?": ("D2:3", "a lake sunset"),
        "Where is Melanie's grandma from?": ("D2:1", "Sweden"),
        "How did the adoption interview go?": ("D2:4", "went well"),
    }
    assert set(by_probe) == set(expected)
    for probe, (dia, value) in expected.items():
        f = by_probe[probe]
        assert s1["messages"][f["source_index"]]["dia_id"] == dia
        assert f["value"] == value
        assert value in s1["messages"][f["source_index"]]["content"]
    assert by_probe["What did Melanie paint?"]["match"] == "best_span"
    assert s1["skipped"] == {"adversarial": 1, "no_evidence": 0, "no_match": 1}
    assert s1["messages"][0]["content"].startswith("[1:56 pm on 8 May, 2023] Caroline: ")
    s2 = sessions["locomo/conv-mini-2"]  # top-level layout, image caption
    f = {x["probe"]: x for x in s2["key_facts"]}["What pet did Gina adopt?"]
    assert s2["messages"][f["source_index"]]["dia_id"] == "D1:2" and f["value"] == "small brown dog"


def test_locomo_rejects_other_json(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{"dialogues": []}', encoding="utf-8")
    with pytest.raises(LocomoFormatError, match="speaker_a"):
        load_locomo(p)


# --- bundled set ------------------------------------------------------------------------------------

def _bundled_session(family: str, lang: str, v: int) -> dict:
    user = "请帮我订 3 月 5 日去上海的机票，预算 800 元以内" if lang == "zh" else "Book me a flight to Oslo on 5 March, budget 300 EUR"
    call = {"id": f"c{v}", "type": "function", "function": {"name": "search", "arguments": '{"q": "flight"}'}}
    msgs = [
        {"role": "system", "content": f"You are the {family} agent.",
         "label": {"category": "instruction", "importance": 3, "key_spans": []}},
        {"role": "user", "content": user, "label": {"category": "instruction", "importance": 3,
                                                    "key_spans": ["800 元以内" if lang == "zh" else "budget 300 EUR"]}},
        {"role": "assistant", "content": "", "tool_calls": [call],
         "label": {"category": "reasoning", "importance": 1, "key_spans": []}},
        {"role": "tool", "name": "search", "tool_call_id": f"c{v}", "content": f'{{"flight": "XY{100 + v}"}}',
         "label": {"category": "key_state", "importance": 2, "key_spans": [f"XY{100 + v}"]}},
    ]
    for k in range(24):
        msgs.append({"role": "user" if k % 2 == 0 else "assistant", "content": f"step {k} of {family} {v}",
                     "label": {"category": "reasoning", "importance": 1, "key_spans": []}})
    msgs.append({"role": "user", "content": "thanks, bye", "label": {"category": "failure", "importance": 0, "key_spans": []}})
    facts = [{"fact_id": f"{family}-{lang}-{v}:flight", "value": f"XY{100 + v}", "source_index": 3,
              "probe": "Which flight was found?", "kind": "tool_result"}]
    return {"session_id": f"bundled/{family}-{lang}-{v:02d}", "language": lang, "scenario": family,
            "messages": msgs, "key_facts": facts}


def _write_bundled(path: Path, families=("travel", "shop", "code", "ops")) -> Path:
    with path.open("w", encoding="utf-8") as fh:
        for fam in families:
            for lang in ("en", "zh"):
                for v in range(2):
                    fh.write(json.dumps(_bundled_session(fam, lang, v), ensure_ascii=False) + "\n")
    return path


def test_bundled_loader_validates(tmp_path):
    p = _write_bundled(tmp_path / "b.jsonl")
    sessions = load_bundled(p)
    assert len(sessions) == 16
    s = sessions[0]
    assert s["group"] == "bundled/travel" and s["messages"][3]["text"].startswith("[search] ")
    assert s["messages"][1]["gold"]["key_spans"] == ["budget 300 EUR"]
    bad = _bundled_session("travel", "en", 0)
    bad["messages"][1]["label"]["key_spans"] = ["budget 999 EUR"]
    (tmp_path / "bad.jsonl").write_text(json.dumps(bad) + "\n", encoding="utf-8")
    with pytest.raises(BundledFormatError, match=r"bad\.jsonl:1 message 1: key_spans not found"):
        load_bundled(tmp_path / "bad.jsonl")
    (tmp_path / "bad.jsonl").write_bytes(json.dumps(_bundled_session("travel", "en", 0)).encode() + b"\n\xff\n")
    with pytest.raises(BundledFormatError, match=r"bad\.jsonl: line \d+: not valid UTF-8"):
        load_bundled(tmp_path / "bad.jsonl")


def test_bundled_only_build_is_idempotent_and_split_by_group(tmp_path):
    bpath = _write_bundled(tmp_path / "b.jsonl")
    out = tmp_path / "processed"
    m = build(out=out, bundled_path=bpath, use_corpora=False, progress=False)
    assert m["mode"] == "bundled-only" and not m.get("skipped")
    dd = load_dataset_dict(out)
    assert set(dd) == {"train", "dev", "test"}
    assert all(len(dd[sp]) > 0 for sp in dd)
    groups = {sp: set(dd[sp]["group"]) for sp in dd}
    assert not (groups["train"] & groups["dev"] or groups["train"] & groups["test"] or groups["dev"] & groups["test"])
    assert set(dd["train"]["label_source"]) == {"bundled"}
    row = dd["train"][1]
    assert row["value"] == pytest.approx(row["importance"] / 3)
    assert row["prev_text"] == dd["train"][0]["text"]
    ev = load_eval_sessions(out)
    assert ev and all(check_facts(s["messages"], s["key_facts"]) == [] for s in ev)
    assert {s["language"] for s in ev} <= {"en", "zh"}
    again = build(out=out, bundled_path=bpath, use_corpora=False, progress=False)
    assert again.get("skipped") is True and again["dataset_fingerprint"] == m["dataset_fingerprint"]
    forced = build(out=out, bundled_path=bpath, use_corpora=False, progress=False, force=True)
    assert not forced.get("skipped") and forced["dataset_fingerprint"] == m["dataset_fingerprint"]
    other = build(out=out, bundled_path=bpath, use_corpora=False, progress=False, config=BuildConfig(seed=3))
    assert not other.get("skipped")  # a config change invalidates the manifest


def test_missing_corpora_error_names_path_and_variable(tmp_path):
    with pytest.raises(CorporaMissingError) as err:
        build(corpora=tmp_path / "nowhere", out=tmp_path / "o", bundled_path=tmp_path / "none.jsonl", progress=False)
    msg = str(err.value)
    assert str(tmp_path / "nowhere") in msg and "CTXSCORE_CORPORA" in msg


def test_cli_reports_missing_corpora(tmp_path, monkeypatch, capsys):
    from training.data.__main__ import main

    monkeypatch.setenv("CTXSCORE_CORPORA", str(tmp_path / "absent"))
    rc = main(["build", "--out", str(tmp_path / "o"), "--bundled", str(tmp_path / "none.jsonl"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "CTXSCORE_CORPORA" in err and str(tmp_path / "absent") in err


def test_locomo_output_that_is_the_input_is_refused(tmp_path, capsys):
    """``locomo X.json --output X.json`` overwrote the LoCoMo file with the converted sessions."""
    from training.data.__main__ import main

    src = tmp_path / "locomo.json"
    src.write_bytes((FIXTURES / "locomo_mini.json").read_bytes())
    before = src.read_bytes()
    assert main(["locomo", str(src), "--output", str(tmp_path / "." / "locomo.json")]) == 2
    assert "is the LoCoMo file being converted" in capsys.readouterr().err and src.read_bytes() == before
