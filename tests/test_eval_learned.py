"""The learned policy and promotion with a tiny packaged scorer (hashing embedder, no model weights)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from eval.cli import main

FIX = Path(__file__).parent / "fixtures"
MINI = FIX / "eval_sessions_mini.jsonl"

ROWS = [
    ("system", "You are an airline agent. Never change a booking without explicit confirmation.", "instruction", 1.0),
    ("user", "Please book me a flight to Boston on May 3, I need a window seat.", "instruction", 1.0),
    ("user", "I want a hotel in the centre, budget at most 150 dollars per night.", "instruction", 1.0),
    ("user", "Can you cancel my reservation ZFA04Y please?", "instruction", 1.0),
    ("assistant", "Your reservation ZFA04Y has been cancelled; the refund of $320 goes to card 9448.", "key_state", 0.7),
    ("user", "My user id is mia_li_3668.", "key_state", 0.7),
    ("assistant", "Booked: flight HAT047 on 2024-05-03, seat 14A, total $412.", "key_state", 0.7),
    ("tool", '{"reservation_id": "4NQLHD", "status": "confirmed", "total": 897}', "key_state", 0.7),
    ("assistant", "I think I should check the available flights before suggesting anything.", "reasoning", 0.3),
    ("assistant", "Maybe the issue is in the tokenizer; let me grep for the function.", "reasoning", 0.3),
    ("assistant", "Would you like an economy or a business seat?", "reasoning", 0.3),
    ("assistant", "There are several options: HAT052 at 3am or HAT102 at 9pm.", "reasoning", 0.3),
    ("tool", "Error: flight HAT030 not available on date 2024-05-13", "failure", 0.0),
    ("user", "Thanks, bye!", "failure", 0.0),
    ("assistant", "Sorry, that failed. Unable to process the request.", "failure", 0.0),
    ("assistant", "You're welcome, have a nice day!", "failure", 0.0),
]


def _train(value_shift: float = 0.0):
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    from ctxscore.messages import Message
    from ctxscore.scoring.embedders import get_embedder
    from ctxscore.scoring.features import FeatureSpec
    from ctxscore.scoring.learned import LearnedScorer
    from ctxscore.scoring.rules import RuleClassifier

    emb = get_embedder("hashing-64", shared=False)
    rules = RuleClassifier()
    spec = FeatureSpec(embedder_id=emb.model_id, embed_dim=emb.dim, signal_names=RuleClassifier.signal_names,
                       max_chars=emb.max_chars, head_chars=emb.head_chars)
    clf = Pipeline([("scale", StandardScaler()), ("lr", LogisticRegression(C=1.0, max_iter=2000))])
    reg = Pipeline([("scale", StandardScaler()), ("ridge", Ridge(alpha=10.0))])
    msgs = [Message(role=r, content=c, turn=i) for i, (r, c, _, _) in enumerate(ROWS)]
    X = LearnedScorer(clf, reg, spec, rules=rules, embedder=emb).features(msgs)
    clf.fit(X, np.array([c for _, _, c, _ in ROWS]))
    reg.fit(X, np.clip(np.array([v for *_, v in ROWS]) + value_shift, 0, 1))
    return LearnedScorer(clf, reg, spec, rules=rules, embedder=emb)


@pytest.fixture(scope="module")
def packaged(tmp_path_factory):
    root = tmp_path_factory.mktemp("scorers")
    return _train().save_pretrained(root / "a"), _train(-0.3).save_pretrained(root / "b")


@pytest.fixture
def sqlite_mlflow(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


def test_learned_policy_from_folder(packaged, tmp_path):
    out = tmp_path / "out"
    assert main(["run", "--sessions", str(MINI), "--budget", "0.25", "--budget-tokens", "128000",
                 "--policies", "trim_messages,rules,learned", "--model", str(packaged[0]), "--probe-every", "4",
                 "--out", str(out), "--no-mlflow", "--feedback-dir", str(tmp_path / "fb"), "--quiet"]) == 0
    m = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    learned = {r["budget"]["key"]: r for r in m["results"] if r["policy"] == "learned"}
    assert set(learned) == {"f0.25", "t128000"}
    assert learned["t128000"]["recall"] == 1.0
    assert m["targets"]["policy"] == "learned" and not m["targets"]["stand_in"]
    assert m["run"]["model"]["uri"] == str(Path(packaged[0]).resolve())
    assert m["run"]["learned_scoring_ms"] > 0
    rows = [json.loads(x) for x in (tmp_path / "fb" / "recall_failures.jsonl").read_text(encoding="utf-8").splitlines()]
    learned_rows = [r for r in rows if r["policy"] == "learned"]
    assert learned_rows and all(r["predicted_category"] and r["predicted_value"] is not None for r in learned_rows)


def _register(folder: Path, alias: str) -> str:
    import mlflow

    from training.registry import configure

    configure("ctxscore-scorer")
    with mlflow.start_run() as run:
        mlflow.log_artifacts(str(folder), artifact_path="scorer")
        mlflow.set_tag("feedback_iteration", f"{alias}-tag")
    client = mlflow.MlflowClient()
    try:
        client.create_registered_model("ctxscore-scorer")
    except mlflow.exceptions.MlflowException:
        pass
    mv = client.create_model_version("ctxscore-scorer", source=f"{run.info.artifact_uri}/scorer", run_id=run.info.run_id)
    client.set_registered_model_alias("ctxscore-scorer", alias, mv.version)
    return str(mv.version)


def test_promote_and_eval_run_linked_to_version(packaged, tmp_path, sqlite_mlflow, capsys):
    import mlflow

    v1 = _register(packaged[0], "candidate")
    # no champion: the candidate is promoted
    assert main(["promote", "--sessions", str(MINI), "--probe-every", "4", "--out", str(tmp_path / "p1"), "--quiet"]) == 0
    client = mlflow.MlflowClient()
    assert str(client.get_model_version_by_alias("ctxscore-scorer", "champion").version) == v1
    decision = json.loads((tmp_path / "p1" / "promotion.json").read_text(encoding="utf-8"))
    assert decision["promote"] and decision["champion"] is None
    # a second candidate: promoted only if not worse; the decision is consistent with the figures
    v2 = _register(packaged[1], "candidate")
    assert main(["promote", "--sessions", str(MINI), "--probe-every", "4", "--out", str(tmp_path / "p2"), "--quiet",
                 "--max-recall-drop", "0.0", "--max-reduction-drop", "0.0"]) == 0
    d2 = json.loads((tmp_path / "p2" / "promotion.json").read_text(encoding="utf-8"))
    c, h = d2["candidate"], d2["champion"]
    expect = c["recall_pagein"] >= h["recall_pagein"] and c["token_reduction"] >= h["token_reduction"]
    assert d2["promote"] == expect
    champion = str(client.get_model_version_by_alias("ctxscore-scorer", "champion").version)
    assert champion == (v2 if expect else v1)
    # an eval run of the candidate carries the version link and its feedback iteration
    out = tmp_path / "out"
    assert main(["run", "--sessions", str(MINI), "--budget", "0.25", "--policies", "full,learned", "--model", "candidate",
                 "--probe-every", "6", "--out", str(out), "--feedback-dir", str(tmp_path / "fb"), "--quiet"]) == 0
    m = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    run = mlflow.get_run(m["run_id"])
    assert run.data.tags["model_version"] == v2 and run.data.tags["model_alias"] == "candidate"
    assert run.data.tags["feedback_iteration"] == "candidate-tag"
    rows = [json.loads(x) for x in (tmp_path / "fb" / "recall_failures.jsonl").read_text(encoding="utf-8").splitlines()]
    assert all(r["run_id"] == m["run_id"] and r["feedback_iteration"] == "candidate-tag" for r in rows)
    # promotion reuses that run's figures for the candidate (same sessions and settings)
    capsys.readouterr()
    assert main(["promote", "--sessions", str(MINI), "--probe-every", "6", "--out", str(tmp_path / "p3"), "--quiet",
                 "--dry-run"]) == 0
    assert f"candidate (version {v2}): reusing eval run {m['run_id']}" in capsys.readouterr().out
    d3 = json.loads((tmp_path / "p3" / "promotion.json").read_text(encoding="utf-8"))
    learned = next(r for r in m["results"] if r["policy"] == "learned")
    assert d3["candidate"]["recall_pagein"] == learned["recall_pagein"]


def test_eval_run_linked_to_logged_model(packaged, tmp_path, sqlite_mlflow):
    """A version registered the way training does it (pyfunc LoggedModel with the ``scorer`` artifact)."""
    import mlflow
    from mlflow.models import infer_signature

    from ctxscore.scoring.learned import LearnedScorer
    from training.pyfunc_model import predict_frame
    from training.registry import PYFUNC_CODE, configure, input_example, set_alias

    configure("ctxscore-scorer")
    scorer = LearnedScorer.from_pretrained(packaged[0])
    with mlflow.start_run():
        mlflow.set_tag("feedback_iteration", "7-0123456789ab")
        ex = input_example()
        info = mlflow.pyfunc.log_model(name="scorer_model", python_model=str(PYFUNC_CODE),
                                       artifacts={"scorer": str(packaged[0])},
                                       signature=infer_signature(ex, predict_frame(scorer, ex)), input_example=ex,
                                       pip_requirements=["numpy"])
    mv = mlflow.register_model(info.model_uri, "ctxscore-scorer")
    set_alias("candidate", mv.version)
    out = tmp_path / "out"
    assert main(["run", "--sessions", str(MINI), "--budget", "0.25", "--policies", "learned", "--model", "candidate",
                 "--probe-every", "6", "--out", str(out), "--no-feedback", "--quiet"]) == 0
    m = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    model_id = m["run"]["model"]["model_id"]
    assert model_id and model_id.startswith("m-")
    run = mlflow.get_run(m["run_id"])
    assert [x.model_id for x in run.inputs.model_inputs] == [model_id]
    assert run.data.tags["feedback_iteration"] == "7-0123456789ab"
    linked = {x.key: x.value for x in mlflow.get_logged_model(model_id).metrics if x.run_id == m["run_id"]}
    learned = next(r for r in m["results"] if r["policy"] == "learned")
    assert linked["eval_recall_pagein"] == learned["recall_pagein"]
