"""``python -m eval``: run (outputs, MLflow, feedback, history), validate, and promotion decisions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eval.cli import main
from eval.promote import decide

FIX = Path(__file__).parent / "fixtures"
MINI = FIX / "eval_sessions_mini.jsonl"


@pytest.fixture
def sqlite_mlflow(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


def test_validate_command(tmp_path, capsys):
    assert main(["validate", str(MINI)]) == 0
    assert "2 sessions, 37 messages, 22 key facts" in capsys.readouterr().out
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"session_id": "x", "messages": [{"role": "user", "content": "hi"}], '
                   '"key_facts": [{"fact_id": "f", "value": "bye", "source_index": 0, "probe": "?", "kind": "k"}]}\n',
                   encoding="utf-8")
    assert main(["validate", str(bad)]) == 1
    assert "session 'x' fact 'f': value 'bye' is not an exact substring" in capsys.readouterr().err


def test_run_without_mlflow_writes_outputs(tmp_path, capsys):
    out, fb = tmp_path / "out", tmp_path / "fb"
    rc = main(["run", "--sessions", str(MINI), "--budget", "0.25", "--budget-tokens", "400", "128000", "--policies", "full,sliding_turns,trim_messages,rules,learned",
               "--model", "none", "--probe-every", "4", "--out", str(out), "--no-mlflow", "--feedback-dir", str(fb),
               "--quiet"])
    assert rc == 0
    metrics = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    combos = {(r["policy"], r["budget"]["key"]) for r in metrics["results"]}
    assert combos == {(p, b) for p in ("full", "sliding_turns", "trim_messages", "rules")
                      for b in ("f0.25", "t400", "t128000")}
    assert metrics["run"]["skipped_policies"] == {"learned": "disabled with --model none"}
    full = next(r for r in metrics["results"] if r["policy"] == "full" and r["budget"]["key"] == "f0.25")
    assert full["recall"] == 1.0 and full["token_ratio"] == 1.0
    for r in metrics["results"]:
        if r["budget"]["key"] == "t128000":
            assert r["recall"] == 1.0 and r["longest_fit_128k"] == 25
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "| rules | 25% |" in report and "learned policy skipped" in report
    assert "rules** policy is checked in its place" in report
    assert metrics["targets"]["stand_in"] and metrics["targets"]["policy"] == "rules"
    assert [c["name"] for c in metrics["targets"]["checks"]][-1] == "recall with page-in > trim_messages recall"
    assert (out / "recall_vs_budget.png").stat().st_size > 1000 and (out / "tokens_per_turn.png").is_file()
    # feedback: only managed policies, deduplicated, with the run fields
    rows = [json.loads(x) for x in (fb / "recall_failures.jsonl").read_text(encoding="utf-8").splitlines()]
    assert rows and {r["policy"] for r in rows} == {"rules"}
    keys = [(r["message_id"], r["fact"]["fact_id"], r["policy"], r["budget"]) for r in rows]
    assert len(keys) == len(set(keys))
    assert all(r["feedback_iteration"] == "0" and r["run_id"] is None and r["text"] for r in rows)
    assert metrics["feedback"]["appended"] == len(rows)
    capsys.readouterr()
    assert main(["summary", "--out", str(out), "--budget-key", "f0.25"]) == 0
    printed = capsys.readouterr().out
    assert "targets at f0.25 for rules (stand-in for learned)" in printed and "t400" not in printed
    assert main(["summary", "--out", str(tmp_path / "nothing")]) == 2
    # a second run on the same sessions compares against the first in the report
    out2 = tmp_path / "out2"
    assert main(["run", "--sessions", str(MINI), "--budget", "0.25", "--budget-tokens", "400", "--policies", "full,rules",
                 "--probe-every", "4", "--out", str(out2), "--no-mlflow", "--feedback-dir", str(fb), "--quiet",
                 "--feedback-budgets", "t400"]) == 0
    rows2 = [json.loads(x) for x in (fb / "recall_failures.jsonl").read_text(encoding="utf-8").splitlines()][len(rows):]
    assert rows2 and {r["budget"] for r in rows2} == {"t400"}
    assert "Same feedback iteration: a re-run" in (out2 / "report.md").read_text(encoding="utf-8")
    assert len((fb / "eval_history.jsonl").read_text(encoding="utf-8").splitlines()) == 2


def test_run_logs_to_mlflow(tmp_path, sqlite_mlflow):
    import mlflow

    out = tmp_path / "out"
    assert main(["run", "--sessions", str(MINI), "--budget", "0.25", "--budget-tokens", "300",
                 "--policies", "full,trim_messages,rules", "--probe-every", "6", "--out", str(out),
                 "--no-feedback", "--quiet"]) == 0
    metrics = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    mlflow.set_tracking_uri(sqlite_mlflow)
    run = mlflow.get_run(metrics["run_id"])
    assert run.data.tags["ctxscore.run_type"] == "eval" and run.data.tags["feedback_iteration"] == "0"
    assert run.data.params["budgets"] == "f0.25,t300"
    assert run.data.metrics["rules/f0.25/recall_pagein"] == next(
        r["recall_pagein"] for r in metrics["results"] if r["policy"] == "rules" and r["budget"]["key"] == "f0.25")
    arts = {a.path for a in mlflow.MlflowClient().list_artifacts(run.info.run_id)}
    assert {"metrics.json", "report.md", "recall_vs_budget.png", "tokens_per_turn.png"} <= arts


def test_run_rejects_bad_input(tmp_path, capsys):
    assert main(["run", "--sessions", str(tmp_path / "none.jsonl"), "--no-mlflow", "--quiet"]) == 2
    assert "no such session file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", "--sessions", str(MINI), "--policies", "full,magic"])
    with pytest.raises(SystemExit):
        main(["run", "--sessions", str(MINI), "--budget", "25"])


def test_promote_without_candidate(tmp_path, sqlite_mlflow, capsys):
    assert main(["promote", "--sessions", str(MINI), "--out", str(tmp_path / "p"), "--quiet"]) == 2
    assert "no 'candidate' alias" in capsys.readouterr().err


def test_promotion_decisions():
    cand = {"version": "3", "recall_pagein": 0.95, "token_reduction": 0.70}
    assert decide(cand, None).promote
    # the candidate must beat the champion: a tie keeps the champion
    tie = decide(cand, {"version": "2", "recall_pagein": 0.95, "token_reduction": 0.70})
    assert not tie.promote and "does not beat" in tie.reason
    assert decide(cand, {"version": "2", "recall_pagein": 0.94, "token_reduction": 0.70}).promote
    assert decide(cand, {"version": "2", "recall_pagein": 0.95, "token_reduction": 0.69}).promote
    worse = decide(cand, {"version": "2", "recall_pagein": 0.96, "token_reduction": 0.60})
    assert not worse.promote and "worse on recall" in worse.reason and "0.9500 vs 0.9600" in worse.reason
    assert decide(cand, {"version": "2", "recall_pagein": 0.96, "token_reduction": 0.60}, max_recall_drop=0.02).promote
    red = decide(cand, {"version": "2", "recall_pagein": 0.90, "token_reduction": 0.75}, max_reduction_drop=0.01)
    assert not red.promote and "token reduction" in red.reason
    assert not decide(cand, dict(cand)).promote  # same version
    with pytest.raises(ValueError):
        decide(cand, None, max_recall_drop=-0.1)
    with pytest.raises(ValueError):
        decide({"version": "3", "recall_pagein": None, "token_reduction": 0.5}, None)


def test_history_compares_feedback_iterations(tmp_path):
    from eval.feedback import compare_with_history

    def summary(recall):
        return {"run": {"created": "t", "sessions_hash": "h1", "model": {}},
                "results": [{"policy": "learned", "budget": {"label": "25%"}, "recall": recall, "recall_pagein": recall,
                             "token_ratio": 0.3, "util_peak": 0.8, "leakage": 0.0}]}

    hist = tmp_path / "h.jsonl"
    first = compare_with_history(summary(0.80), hist, run_id="r1", feedback_iteration="0")
    assert first["previous"] is None and first["current"]["iteration_index"] == 0
    compare_with_history(summary(0.81), hist, run_id="r2", feedback_iteration="0")
    nxt = compare_with_history(summary(0.90), hist, run_id="r3", feedback_iteration="120-abc")
    assert nxt["previous"]["run_id"] == "r2" and nxt["current"]["iteration_index"] == 1
    from eval.report import _history_lines

    text = "\n".join(_history_lines(nxt))
    assert "Iteration 0" in text and "iteration 1" in text and "| learned | 25% | 0.810 | 0.900 | +0.090 |" in text
    # a run killed while writing leaves a broken last line: the runs before it are still read
    with hist.open("a", encoding="utf-8") as fh:
        fh.write('{"run_id": "r4", "sessions_hash": ')
    from eval.feedback import read_history

    assert [h["run_id"] for h in read_history(hist)] == ["r1", "r2", "r3"]


def test_module_entry_point():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "eval", "validate", str(MINI)], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1], timeout=120)
    assert proc.returncode == 0 and "OK, 2 sessions" in proc.stdout


def test_run_reuse_skips_an_unchanged_evaluation(tmp_path, capsys):
    out = tmp_path / "out"
    args = ["run", "--sessions", str(MINI), "--budget", "0.25", "--policies", "full,rules", "--model", "none",
            "--probe-every", "4", "--out", str(out), "--no-mlflow", "--no-feedback", "--quiet", "--reuse"]
    assert main(args) == 0
    first = (out / "metrics.json").read_text(encoding="utf-8")
    capsys.readouterr()
    assert main(args) == 0
    assert "reusing its figures" in capsys.readouterr().out
    assert (out / "metrics.json").read_text(encoding="utf-8") == first
    # a different budget is a different evaluation
    assert main([*args[:4], "0.5", *args[5:]]) == 0
    assert "reusing" not in capsys.readouterr().out
    assert json.loads((out / "metrics.json").read_text(encoding="utf-8"))["run"]["budgets"][0]["key"] == "f0.5"
