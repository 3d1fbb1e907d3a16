"""Training helpers that need no data: feedback targets, message reconstruction, variant choice, rows."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("datasets")

from ctxscore.messages import Message  # noqa: E402
from training import train  # noqa: E402


def _split(name, ids, label_source, values=None):
    n = len(ids)
    return train.Split(
        name=name, ids=np.array(ids, dtype=object), messages=[Message(role="user", content=f"m{i}", turn=i) for i in range(n)],
        y=np.array(["key_state"] * n, dtype=object), value=np.array(values or [0.2] * n, dtype=np.float64),
        importance=np.ones(n), source=np.array(["sgd"] * n, dtype=object), language=np.array(["en"] * n, dtype=object),
        label_source=np.array(label_source, dtype=object), weak_confidence=np.linspace(0.5, 1.0, n),
        group=np.array([f"g{i % 3}" for i in range(n)], dtype=object),
    )


def test_feedback_raises_train_targets_and_adds_value_rows(tmp_path):
    splits = {"train": _split("train", ["a#0", "a#1", "b#0"], ["distilled", "weak", "weak"], [0.0, 0.95, 0.3]),
              "dev": _split("dev", ["d#0"], ["distilled"]), "test": _split("test", ["t#0"], ["distilled"])}
    path = tmp_path / "recall_failures.jsonl"
    records = [
        {"message_id": "a#0", "text": "ignored for train rows", "role": "user"},
        {"message_id": "a#1", "role": "user", "text": "x"},  # already above the floor
        {"message_id": "t#0", "role": "assistant", "text": "Your booking code is ZFA04Y.", "message_index": 7},
        {"message_id": "t#0", "role": "assistant", "text": "Your booking code is ZFA04Y."},  # same message again
        {"message_id": "d#0", "role": "tool", "text": "order 12345 shipped"},
        {"message_id": "x#1", "role": "user", "text": "a held-out message", "session_id": "test/sgd/000"},
        {"message_id": "z#9"},  # not in train, no text: unusable
        {"fact": "no id at all"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    loaded = train.load_feedback(path)
    assert len(loaded) == len(records)
    stats = train.apply_feedback(splits, loaded)
    # the test message t#0 (twice) and the record from a test/ session never feed training
    assert stats == {"records": 8, "raised_train": 2, "added_rows": 1, "from_dev": 1, "skipped_test": 3, "unusable": 2}
    np.testing.assert_allclose(splits["train"].value, [train.FEEDBACK_VALUE, 0.95, 0.3])
    fb = splits["feedback"]
    assert list(fb.ids) == ["d#0"]
    assert fb.messages[0].role == "tool"
    np.testing.assert_allclose(fb.value, train.FEEDBACK_VALUE)
    # dev/test rows used for metrics are untouched
    assert splits["dev"].value[0] == 0.2 and splits["test"].value[0] == 0.2
    assert train.feedback_tag(loaded).startswith("8-") and train.feedback_tag([]).startswith("0-")


def test_feedback_bad_line_names_it(tmp_path):
    path = tmp_path / "f.jsonl"
    path.write_text('{"message_id": "a"}\nnot json\n')
    with pytest.raises(ValueError, match="line 2"):
        train.load_feedback(path)
    assert train.load_feedback(tmp_path / "absent.jsonl") == []


@pytest.mark.parametrize("row", [
    {"id": "x#1", "index": 1, "role": "tool", "text": "[get_user_details] {\"name\": \"Mia\"}"},
    {"id": "x#2", "index": 2, "role": "assistant", "text": "TOOL_CALL get_user_details({\"user_id\": \"mia_li_3668\"})"},
    {"id": "x#3", "index": 3, "role": "assistant",
     "text": "Let me check.\nTOOL_CALL search({\"a\": 1}); book({\"b\": \"x; y\"})"},
    {"id": "x#4", "index": 4, "role": "user", "text": "plain text"},
])
def test_message_from_row_renders_the_same_text(row):
    m = train.message_from_row(row)
    assert m.text() == row["text"]
    assert m.turn == row["index"]
    if row["role"] == "tool":
        assert m.name == "get_user_details"
    if "TOOL_CALL" in row["text"]:
        assert m.tool_calls and m.tool_calls[0].name in {"get_user_details", "search"}


def test_training_rows_and_weights():
    sp = _split("train", ["a", "b", "c", "d"], ["distilled", "weak", "bundled", "weak"])
    mask, w = train.training_rows(sp, train.Variant(labels="distilled"))
    assert mask.tolist() == [True, False, False, False]
    mask, w = train.training_rows(sp, train.Variant(labels="distilled+weak", weak_weight=0.5))
    assert mask.tolist() == [True, True, False, True]
    np.testing.assert_allclose(w[[1, 3]], 0.5 * sp.weak_confidence[[1, 3]])
    assert w[0] == 1.0
    with pytest.raises(ValueError, match="unknown label set"):
        train.training_rows(sp, train.Variant(labels="nope"))


class _R:
    def __init__(self, name, f1, p95, mb=0.5):
        self.variant = train.Variant(embedder=name)
        self.dev = {"metrics": {"macro_f1": f1}}
        self.latency = {"p95_ms": p95}
        self.package_bytes = int(mb * 1e6)


def test_choose_prefers_f1_then_latency_within_budget():
    a, b, c = _R("a", 0.920, 30.0), _R("b", 0.917, 8.0), _R("c", 0.900, 5.0)
    assert train.choose([a, b, c]) is b  # a is over the 20 ms budget
    assert train.choose([a, b, c], latency_budget_ms=None) is b  # within the 0.005 tie, faster
    assert train.choose([a, c], latency_budget_ms=None, tie=0.001) is a
    assert train.choose([a], latency_budget_ms=20.0) is a  # nobody meets the budget: best overall


def test_choose_respects_the_package_size_limit():
    big, small = _R("big", 0.922, 16.0, mb=6.7), _R("small", 0.914, 16.0, mb=0.8)
    assert train.choose([big, small]) is small  # the default ships in the package: at most 2 MB
    assert train.choose([big, small], max_package_mb=None) is big
    assert train.choose([big], max_package_mb=2.0) is big  # nobody fits: best overall


class _SlowRound:
    """A scorer whose second timing round is slowed down, as by a load burst on a shared machine."""

    def __init__(self, n: int):
        self.calls, self.n = 0, n
        self.embedder = None

    def predict(self, messages):
        import time

        self.calls += 1
        round_ = (self.calls - 2) // self.n  # the first call is the warm-up
        time.sleep(0.02 if round_ == 1 else 0.001)
        return []


def test_latency_is_the_median_of_repeated_rounds():
    msgs = [Message(role="user", content=f"m{i}", turn=i) for i in range(10)]
    scorer = _SlowRound(n=10)
    lat = train.measure_latency(scorer, msgs, n=10, repeats=3)
    assert scorer.calls == 1 + 3 * 10
    assert lat["repeats"] == 3
    assert lat["p95_ms_max"] >= 20.0  # the slow round is seen ...
    assert 1.0 <= lat["p95_ms"] < 10.0  # ... but does not decide the figure
    assert lat["p95_ms_min"] <= lat["p95_ms"] <= lat["p95_ms_max"]
    with pytest.raises(ValueError, match="repeats"):
        train.measure_latency(scorer, msgs, repeats=0)


def test_train_without_a_dataset_or_with_an_unknown_embedder(tmp_path, capsys):
    """``python -m training.train`` with no dataset was a FileNotFoundError traceback; ``--embedder bogus``
    was found only after the data had loaded."""
    from training.train import main

    assert main(["--data", str(tmp_path / "none"), "--no-mlflow"]) == 2
    assert "run `python -m training.data build` first" in capsys.readouterr().err
    assert main(["--data", str(tmp_path / "none"), "--embedder", "bogus", "--no-mlflow"]) == 2
    assert "--embedder: unknown embedder 'bogus'" in capsys.readouterr().err
