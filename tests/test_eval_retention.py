"""Key-span retention of the compressors, on hand-made labelled messages."""

from __future__ import annotations

from ctxscore.compress import aggressive_compress, compress, structured_summary
from eval.retention import key_span_retention, labelled_messages, load_labels
from eval.sessions import validate_records

KEY_STATE = ("Sure! I have booked flight HAT047 on 2024-05-03 for you. The seat is 14A and the total is $412. "
             "It was a pleasure to help and I hope you have a lovely trip with lots of sunshine.")
REASONING = ("Let me think about which flights are possible. There are many carriers and the prices vary a lot. "
             "Maybe I should compare a few of them first. Therefore the cheapest option is HAT052 at 3am.")


def _session():
    msgs = [
        {"role": "user", "content": "Book me a flight on May 3, under $500.",
         "label": {"category": "instruction", "importance": 3, "key_spans": ["May 3", "under $500"]}},
        {"role": "assistant", "content": KEY_STATE,
         "label": {"category": "key_state", "importance": 2, "key_spans": ["HAT047", "2024-05-03", "14A", "$412", "not in text"]}},
        {"role": "assistant", "content": REASONING,
         "label": {"category": "reasoning", "importance": 1, "key_spans": ["HAT052 at 3am"]}},
        {"role": "user", "content": "Thanks!", "label": {"category": "failure", "importance": 0, "key_spans": []}},
    ]
    (s,) = validate_records([("line 1", {"session_id": "r/1", "messages": msgs, "key_facts": []})])
    return s


def _kept(spans, out):
    return sum(1 for sp in spans if sp.casefold() in out.casefold())


def test_labelled_messages_use_spans_in_content_only():
    rows = labelled_messages([_session()], {})
    assert [(mid, cat) for mid, cat, _, _ in rows] == [("r/1#0", "instruction"), ("r/1#1", "key_state"), ("r/1#2", "reasoning")]
    assert rows[1][3] == ["HAT047", "2024-05-03", "14A", "$412"]


def test_retention_matches_the_compressors_outputs():
    res = key_span_retention([_session()], {})
    assert res["messages"] == 3 and res["spans"] == 7
    spans = {"u": ["May 3", "under $500"], "k": ["HAT047", "2024-05-03", "14A", "$412"], "r": ["HAT052 at 3am"]}
    texts = {"u": "Book me a flight on May 3, under $500.", "k": KEY_STATE, "r": REASONING}
    ss = sum(_kept(spans[k], structured_summary(texts[k])) for k in spans)
    assert res["by_compressor"]["structured_summary"]["retained"] == round(ss / 7, 4)
    ac = sum(_kept(spans[k], aggressive_compress(texts[k])) for k in spans)
    assert res["by_compressor"]["aggressive_compress"]["retained"] == round(ac / 7, 4)
    # runtime: key_state -> structured, reasoning -> compressed; the instruction is never compressed
    rt = _kept(spans["k"], compress(KEY_STATE, "structured").text) + _kept(spans["r"], compress(REASONING, "compressed").text)
    runtime = res["by_compressor"]["runtime"]
    assert runtime["messages"] == 2 and runtime["spans"] == 5 and runtime["retained"] == round(rt / 5, 4)
    assert set(runtime["by_category"]) == {"key_state", "reasoning"}
    assert 0 < res["by_compressor"]["structured_summary"]["token_ratio"] < 1


def test_distilled_labels_join_by_id(tmp_path):
    path = tmp_path / "distilled.jsonl"
    path.write_text('{"id": "s/2#0", "category": "key_state", "importance": 2, "key_spans": ["ZX9"]}\n', encoding="utf-8")
    labels = load_labels(path)
    (s,) = validate_records([("line 1", {"session_id": "s/2", "key_facts": [],
                                         "messages": [{"role": "assistant", "content": "Your code is ZX9, see you."}]})])
    assert labelled_messages([s], labels) == [("s/2#0", "key_state", "Your code is ZX9, see you.", ["ZX9"])]
    assert load_labels(tmp_path / "absent.jsonl") == {} and load_labels(None) == {}
