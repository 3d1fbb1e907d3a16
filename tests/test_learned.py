"""LearnedScorer: prediction, packaging, safe loading, the uncertainty callback and the score command.

Uses the hashing embedder (no model weights) and a few handwritten messages per category.
"""

from __future__ import annotations

import json
import shutil
import warnings

import numpy as np
import pytest

from ctxscore.errors import InputError, ModelLoadError
from ctxscore.messages import CATEGORIES, Message
from ctxscore.scoring import learned
from ctxscore.scoring.base import Prediction, Scorer
from ctxscore.scoring.embedders import get_embedder
from ctxscore.scoring.features import FeatureSpec, tabular_features
from ctxscore.scoring.learned import LearnedScorer
from ctxscore.scoring.rules import RuleClassifier

TRAIN = [
    ("system", "You are an airline agent. Never change a booking without explicit confirmation.", "instruction", 1.0),
    ("user", "Please book me a flight to Boston on May 3, I need a window seat.", "instruction", 1.0),
    ("user", "I want a hotel in the centre, budget at most 150 dollars per night.", "instruction", 1.0),
    ("user", "Fix the bug in parse_date so that empty strings raise ValueError.", "instruction", 1.0),
    ("user", "我想找一家评分4.5分以上的餐馆，人均消费不要超过100元。", "instruction", 1.0),
    ("user", "Can you cancel my reservation ZFA04Y please?", "instruction", 1.0),
    ("assistant", "Your reservation ZFA04Y has been cancelled; the refund of $320 goes to card 9448.", "key_state", 0.67),
    ("user", "My user id is mia_li_3668.", "key_state", 0.67),
    ("assistant", "Booked: flight HAT047 on 2024-05-03, seat 14A, total $412.", "key_state", 0.67),
    ("tool", '{"reservation_id": "4NQLHD", "status": "confirmed", "total": 897}', "key_state", 0.67),
    ("assistant", "The root cause is the off-by-one in page_count(); the patch is applied and tests pass.", "key_state", 0.67),
    ("assistant", "已为您预订北京饭店，入住时间3月4日，共2晚。", "key_state", 0.67),
    ("assistant", "THOUGHT: Let me look at the repository layout first to find the parser.", "reasoning", 0.33),
    ("assistant", "I think I should check the available flights before suggesting anything.", "reasoning", 0.33),
    ("assistant", "Maybe the issue is in the tokenizer; let me grep for the function.", "reasoning", 0.33),
    ("assistant", "Would you like an economy or a business seat?", "reasoning", 0.33),
    ("assistant", "There are several options: HAT052 at 3am or HAT102 at 9pm.", "reasoning", 0.33),
    ("assistant", "让我看看还有哪些餐馆可以选择。", "reasoning", 0.33),
    ("tool", "Error: flight HAT030 not available on date 2024-05-13", "failure", 0.0),
    ("user", "<returncode>1</returncode>\n<output>\nTraceback (most recent call last):\nValueError\n</output>", "failure", 0.0),
    ("user", "Thanks, bye!", "failure", 0.0),
    ("assistant", "Sorry, that failed. Unable to process the request.", "failure", 0.0),
    ("assistant", "You're welcome, have a nice day!", "failure", 0.0),
    ("user", "谢谢，再见！", "failure", 0.0),
]


def _messages(rows=TRAIN):
    return [Message(role=r, content=c, turn=i) for i, (r, c, _, _) in enumerate(rows)]


@pytest.fixture(scope="module")
def scorer() -> LearnedScorer:
    from sklearn.calibration import CalibratedClassifierCV
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    emb = get_embedder("hashing-64", shared=False)
    rules = RuleClassifier()
    spec = FeatureSpec(embedder_id=emb.model_id, embed_dim=emb.dim, signal_names=RuleClassifier.signal_names,
                       max_chars=emb.max_chars, head_chars=emb.head_chars, lexical_dim=32)
    msgs = _messages()
    clf = Pipeline([("scale", StandardScaler()),
                    ("cal", CalibratedClassifierCV(LogisticRegression(C=1.0, max_iter=2000), cv=2))])
    reg = Pipeline([("scale", StandardScaler()), ("ridge", Ridge(alpha=10.0))])
    probe = LearnedScorer(clf, reg, spec, rules=rules, embedder=emb)
    X = probe.features(msgs)
    y = np.array([c for _, _, c, _ in TRAIN])
    clf.fit(X, y)
    reg.fit(X, np.array([v for _, _, _, v in TRAIN]))
    return LearnedScorer(clf, reg, spec, rules=rules, embedder=emb)


def test_is_a_scorer_and_predicts_all_categories(scorer):
    assert isinstance(scorer, Scorer)
    preds = scorer.predict(_messages())
    assert len(preds) == len(TRAIN)
    for p in preds:
        assert set(p.probs) == set(CATEGORIES)
        assert abs(sum(p.probs.values()) - 1.0) < 1e-6
        assert 0.0 <= p.value <= 1.0
        assert p.source == "learned"
        assert set(RuleClassifier.signal_names) <= set(p.signals)
        assert p.embedding.shape == (64,) and abs(float(np.linalg.norm(p.embedding)) - 1.0) < 1e-5
    acc = np.mean([p.category == c for p, (_, _, c, _) in zip(preds, TRAIN, strict=True)])
    assert acc >= 0.8  # fits its own training set
    values = {c: np.mean([p.value for p, row in zip(preds, TRAIN, strict=True) if row[2] == c]) for c in CATEGORIES}
    assert values["instruction"] > values["failure"]


def test_features_layout_matches_spec(scorer):
    msgs = _messages()[:3]
    X = scorer.features(msgs)
    assert X.shape == (3, scorer.spec.n_features) == (3, len(scorer.spec.names()))
    tab = tabular_features(msgs)
    start = scorer.spec.embed_dim + scorer.spec.lexical_dim
    np.testing.assert_array_equal(X[:, start:start + tab.shape[1]], tab)
    names = scorer.spec.names()
    assert X[0, names.index("is_first")] == 1.0 and X[1, names.index("is_first")] == 0.0
    assert X[0, names.index("role=system")] == 1.0 and X[1, names.index("role=user")] == 1.0
    assert X[2, names.index("log_chars")] == pytest.approx(np.log1p(len(msgs[2].content)))
    tc = Message(role="assistant", content="", tool_calls=[{"function": {"name": "f", "arguments": "{}"}}], turn=4)
    assert scorer.features([tc])[0, names.index("has_tool_calls")] == 1.0
    # the rule signals come last, in the spec's order
    sig = RuleClassifier().signals(msgs[1])
    np.testing.assert_allclose(X[1, scorer.spec.signal_start:], [sig[k] for k in scorer.spec.signal_names], rtol=1e-6)


def test_accepts_openai_dicts_and_rejects_bad_input(scorer):
    scorer._warned_turn = False
    with pytest.warns(UserWarning, match="Message.turn"):  # no turn in the dict: position unknown
        preds = scorer.predict([{"role": "user", "content": "Please book a table for two at 7pm."}])
    assert preds[0].category in CATEGORIES
    with pytest.raises(InputError):
        scorer.predict([{"role": "robot", "content": "beep"}])
    assert scorer.predict([]) == []


def test_save_and_load_round_trip(scorer, tmp_path):
    folder = scorer.save_pretrained(tmp_path / "m", metrics={"dev_macro_f1": 0.5})
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["labels"] == list(CATEGORIES)
    assert cfg["embedder"]["model_id"] == "hashing-64"
    assert cfg["feature_spec"]["signal_names"] == list(RuleClassifier.signal_names)
    assert set(cfg["files"]) == {"classifier.skops", "regressor.skops", "rules.toml"}
    loaded = LearnedScorer.from_pretrained(folder)
    msgs = _messages()
    a, b = scorer.predict(msgs), loaded.predict(msgs)
    for p, q in zip(a, b, strict=True):
        assert p.category == q.category
        assert p.value == pytest.approx(q.value, abs=1e-9)
        for c in CATEGORIES:
            assert p.probs[c] == pytest.approx(q.probs[c], abs=1e-9)


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        LearnedScorer.from_pretrained(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="config.json is missing"):
        LearnedScorer.from_pretrained(tmp_path / "empty")


def test_tampered_file_is_refused(scorer, tmp_path):
    folder = scorer.save_pretrained(tmp_path / "m")
    data = bytearray((folder / "classifier.skops").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (folder / "classifier.skops").write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="corrupt or was modified"):
        LearnedScorer.from_pretrained(folder)


def test_tampered_rules_file_is_refused(scorer, tmp_path):
    folder = scorer.save_pretrained(tmp_path / "m")
    with open(folder / "rules.toml", "a", encoding="utf-8") as fh:
        fh.write("\n# edited\n")
    with pytest.raises(ModelLoadError, match="rules.toml is corrupt or was modified"):
        LearnedScorer.from_pretrained(folder)


class Boom:
    """A class whose construction would be code execution: loading must never build it."""

    created = 0

    def __init__(self):
        Boom.created += 1

    def __setstate__(self, state):
        Boom.created += 1
        self.__dict__.update(state)

    def predict_proba(self, X):  # pragma: no cover - must never run
        raise AssertionError("executed")


def test_disallowed_type_is_refused_without_executing(scorer, tmp_path):
    import hashlib

    import skops.io as sio

    folder = scorer.save_pretrained(tmp_path / "m")
    obj = Boom()
    before = Boom.created
    sio.dump(obj, folder / "classifier.skops")
    cfg = json.loads((folder / "config.json").read_text())
    # a consistent config (as an attacker would write it): the hash check passes, the type check must not
    cfg["files"]["classifier.skops"] = hashlib.sha256((folder / "classifier.skops").read_bytes()).hexdigest()
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="outside the allowlist") as err:
        LearnedScorer.from_pretrained(folder)
    assert "Boom" in str(err.value)
    assert Boom.created == before


def test_bad_config_and_version(scorer, tmp_path):
    folder = scorer.save_pretrained(tmp_path / "m")
    (folder / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        LearnedScorer.from_pretrained(folder)
    folder = scorer.save_pretrained(tmp_path / "m2")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["format_version"] = 99
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="format_version"):
        LearnedScorer.from_pretrained(folder)


def test_feature_count_mismatch_is_refused(scorer, tmp_path):
    folder = scorer.save_pretrained(tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["feature_spec"]["lexical_dim"] = 16
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="expects .* features"):
        LearnedScorer.from_pretrained(folder)


def test_uncertain_messages_go_to_the_callback(scorer):
    seen = []

    def llm(message: Message, pred: Prediction) -> Prediction | None:
        seen.append((message.content, pred.confidence))
        if "flight" in message.content:
            return Prediction(category="key_state", probs={c: float(c == "key_state") for c in CATEGORIES})
        return None

    scorer.fallback, scorer.uncertainty_threshold = llm, 1.0
    try:
        msgs = [Message(role="assistant", content="The flight is at noon.", turn=5),
                Message(role="assistant", content="Hmm.", turn=6)]
        preds = scorer.predict(msgs)
    finally:
        scorer.fallback, scorer.uncertainty_threshold = None, 0.0
    assert len(seen) == 2  # threshold 1.0: every message is uncertain
    assert preds[0].source == "callback" and preds[0].category == "key_state"
    assert preds[0].value is not None  # the learned value fills in
    assert preds[1].source == "learned"
    # threshold 0 never calls it
    scorer.fallback = llm
    try:
        scorer.predict(msgs)
    finally:
        scorer.fallback = None
    assert len(seen) == 2


def _cli_rows(capsys, *argv):
    from ctxscore.cli import main

    assert main(["score", *map(str, argv)]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_score_command_single_session(scorer, tmp_path, capsys):
    folder = scorer.save_pretrained(tmp_path / "m")
    path = tmp_path / "session.jsonl"
    path.write_text("\n".join(json.dumps({"role": r, "content": c}) for r, c, _, _ in TRAIN[:5]) + "\n")
    rows = _cli_rows(capsys, path, "--model", folder)
    assert len(rows) == 5
    assert all("session_id" not in r and r["category"] in CATEGORIES for r in rows)
    direct = scorer.predict(_messages(TRAIN[:5]))
    assert [r["category"] for r in rows] == [p.category for p in direct]


def test_score_command_eval_sessions_loads_model_once(scorer, tmp_path, monkeypatch, capsys):
    folder = scorer.save_pretrained(tmp_path / "m")
    calls = []
    real = LearnedScorer.from_pretrained.__func__

    def counting(cls, path, **kw):
        calls.append(path)
        return real(cls, path, embedder=get_embedder("hashing-64", shared=False), **kw)

    monkeypatch.setattr(LearnedScorer, "from_pretrained", classmethod(counting))
    path = tmp_path / "eval.jsonl"
    sessions = [{"session_id": f"s{k}", "messages": [{"role": r, "content": c} for r, c, _, _ in TRAIN[k:k + 4]],
                 "key_facts": []} for k in range(3)]
    path.write_text("\n".join(json.dumps(s, ensure_ascii=False) for s in sessions) + "\n")
    rows = _cli_rows(capsys, path, "--model", folder)
    assert len(calls) == 1
    assert [(r["session_id"], r["index"]) for r in rows] == [(f"s{k}", i) for k in range(3) for i in range(4)]
    assert all(set(r["probs"]) == set(CATEGORIES) and 0 <= r["value"] <= 1 for r in rows)


def test_score_command_bad_lines(scorer, tmp_path, capsys):
    from ctxscore.cli import main

    folder = scorer.save_pretrained(tmp_path / "m")
    path = tmp_path / "bad.jsonl"
    path.write_text('{"role": "user", "content": "hi"}\n{oops\n')
    assert main(["score", str(path), "--model", str(folder)]) == 2
    assert "line 2" in capsys.readouterr().err
    path.write_text('{"role": "user", "content": ""}\n')
    assert main(["score", str(path), "--model", str(folder)]) == 2
    assert "line 1" in capsys.readouterr().err


def test_default_scorer_missing_embedder_warns_once(monkeypatch, scorer, tmp_path):
    folder = scorer.save_pretrained(tmp_path / "default")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["embedder"]["model_id"] = "all-minilm-l6-v2"
    (folder / "config.json").write_text(json.dumps(cfg))
    monkeypatch.setattr(learned, "DEFAULT_MODEL_DIR", folder)
    monkeypatch.setattr(learned, "_warned_default", False)
    monkeypatch.setattr(learned, "embedder_available", lambda model_id: False)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        assert learned.load_default_scorer() is None
        assert learned.load_default_scorer() is None
    msgs = [str(w.message) for w in rec]
    assert len(msgs) == 1 and "all-minilm-l6-v2" in msgs[0] and "rules" in msgs[0]


def test_default_scorer_is_loaded_once_when_sessions_open_at_once(monkeypatch, scorer, tmp_path):
    """A proxy opens the first sessions of its traffic in threads at once: "auto" loads the packaged
    scorer once and every session gets that one (each load holds an embedder model in memory)."""
    import threading
    import time

    from ctxscore.scoring.rules import RuleClassifier

    folder = scorer.save_pretrained(tmp_path / "default")
    monkeypatch.setattr(learned, "DEFAULT_MODEL_DIR", folder)
    monkeypatch.setattr(learned, "_default_scorer", None)
    real = LearnedScorer.from_pretrained.__func__
    loads = []

    def slow_load(cls, *a, **k):  # the real load, made slow enough for the threads to meet
        loads.append(1)
        time.sleep(0.3)
        return real(cls, *a, **k)

    monkeypatch.setattr(LearnedScorer, "from_pretrained", classmethod(slow_load))
    rules, got = RuleClassifier(), []
    threads = [threading.Thread(target=lambda: got.append(learned.resolve_scorer("auto", rules))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(loads) == 1 and len(got) == 4
    assert isinstance(got[0], LearnedScorer) and all(g is got[0] for g in got)


def test_default_scorer_loads_when_available(monkeypatch, scorer, tmp_path):
    folder = scorer.save_pretrained(tmp_path / "default")
    monkeypatch.setattr(learned, "DEFAULT_MODEL_DIR", folder)
    s = learned.load_default_scorer()
    assert isinstance(s, LearnedScorer)
    shutil.rmtree(folder)
    monkeypatch.setattr(learned, "_warned_default", False)
    with pytest.warns(UserWarning, match="no default learned scorer"):
        assert learned.load_default_scorer() is None
