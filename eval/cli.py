"""Command line: ``python -m eval run | promote | validate | summary | boundaries``.

Examples::

    python -m eval validate data/processed/eval_sessions.jsonl
    python -m eval run --sessions data/processed/eval_sessions.jsonl --budget 0.25 --budget 0.5 \\
        --budget-tokens 4000 --policies full,sliding_turns,trim_messages,rules,learned --out out/eval
    python -m eval run --sessions data/bundled/sessions.jsonl --max-sessions 4 --probe-every 20 --no-mlflow
    python -m eval run --engine ray --workers 2 ...   # the same figures, the sessions replayed on Ray
    python -m eval promote --reference-budget 0.25 --max-recall-drop 0.0 --max-reduction-drop 0.0
    python -m eval summary --out out/eval
    python -m eval run --sessions data/processed/eval_sessions.jsonl --ledger --policies rules,learned \\
        --budget 0.25 --budget-tokens 4000 --out out/eval-ledger
    python -m eval boundaries --sessions data/processed/dev_sessions.jsonl
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from training.extra import require_train_extra
from training.paths import DEFAULT_OUT, OUT_DIR, REPO_ROOT, corpora_root

from .budgets import DEFAULT_MIN_BUDGET, Budget, parse_budgets
from .policies import ALL_POLICIES, KNOWN_POLICIES, with_ledger
from .sessions import SessionFormatError, load_sessions
from .tracking import EXPERIMENT as EVAL_EXPERIMENT

require_train_extra("eval", "eval.cli", ("mlflow", "matplotlib", "langchain_core", "tqdm"), __name__)

log = logging.getLogger("eval")
DEFAULT_SESSIONS = DEFAULT_OUT / "eval_sessions.jsonl"


def _policies(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in names if p not in KNOWN_POLICIES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown policy {', '.join(bad) or '(none)'}; choose from {', '.join(KNOWN_POLICIES)}")
    return list(dict.fromkeys(names))


def _fraction_of(what: str, hint: str = "") -> Callable[[str], float]:
    """An argparse type: a float in (0, 1], refused as ``"<what> must be in (0, 1], got X<hint>"``."""

    def check(text: str) -> float:
        v = float(text)
        if not 0 < v <= 1:
            raise argparse.ArgumentTypeError(f"{what} must be in (0, 1], got {text}{hint}")
        return v

    return check


_fraction = _fraction_of("a fraction budget", " (use --budget-tokens for tokens)")
_final_fraction = _fraction_of("a fraction of the final length")


def _positive(text: str) -> int:
    v = int(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return v


def _non_negative(text: str) -> int:
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text}")
    return v


def _drop(text: str) -> float:
    v = float(text)
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"an allowed drop must be a fraction >= 0 (0.01 for one point), got {text}")
    return v


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (sub-commands ``run``, ``promote``, ``validate``, ``summary``, ``boundaries``)."""
    ap = argparse.ArgumentParser(prog="python -m eval", description="Evaluate ctxscore context policies on held-out sessions.")
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--sessions", type=Path, default=DEFAULT_SESSIONS,
                       help="session JSONL file, LoCoMo JSON file, or a folder of them (default: %(default)s)")
        p.add_argument("--max-sessions", type=_positive, default=None, help="evaluate only the first N sessions")
        p.add_argument("--probe-every", type=_positive, default=10, help="probe every N messages and at the end (default 10)")
        p.add_argument("--pagein", choices=("missed", "all", "none"), default="missed",
                       help="page-in checks: only for facts missed without a query (default), for all facts, or none")
        p.add_argument("--min-budget", type=_positive, default=DEFAULT_MIN_BUDGET,
                       help="floor of fraction budgets in tokens (default %(default)s)")
        p.add_argument("--experiment", default=EVAL_EXPERIMENT, help="MLflow experiment (default %(default)s)")
        p.add_argument("--quiet", action="store_true", help="no progress bar")

    r = sub.add_parser("run", help="replay sessions through the policies and write metrics, report and plots")
    common(r)
    r.add_argument("--budget", type=_fraction, action="extend", nargs="+", default=None, metavar="FRACTION",
                   help="budget(s) as a fraction of the full context at each turn (e.g. --budget 0.25 0.5; "
                        "repeatable; default 0.25 0.5)")
    r.add_argument("--budget-final", type=_final_fraction, action="extend", nargs="+", default=None, metavar="FRACTION",
                   help="budget(s) as a fraction of the session's final length, fixed for the whole replay (key e0.25, "
                        "label '25%% of end'; repeatable; default 0.25)")
    r.add_argument("--budget-tokens", type=_positive, action="extend", nargs="+", default=None, metavar="N",
                   help="absolute token budget(s) (e.g. --budget-tokens 2000 4000; repeatable; "
                        "default 2000 4000 8000 16000 128000)")
    r.add_argument("--policies", type=_policies, default=list(ALL_POLICIES),
                   help=f"comma-separated subset of {','.join(KNOWN_POLICIES)} (default: {','.join(ALL_POLICIES)})")
    r.add_argument("--ledger", action="store_true",
                   help="also run each managed policy with the fact ledger layer, as rules_ledger / learned_ledger "
                        "(ledger tokens and precision in the report)")
    r.add_argument("--model", default="auto",
                   help="learned scorer: auto (registry candidate, then champion, then the shipped default), default, "
                        "none, an alias, a version number, or a packaged-scorer folder")
    r.add_argument("--out", type=Path, default=OUT_DIR / "eval", help="output folder (default %(default)s)")
    r.add_argument("--labels", type=Path, default=None,
                   help="distilled labels for key-span retention (default: <corpora>/labels/distilled.jsonl if present)")
    r.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    r.add_argument("--no-feedback", action="store_true", help="do not append recall failures to data/feedback/")
    r.add_argument("--reuse", action=argparse.BooleanOptionalAction, default=False,
                   help="skip the replay when OUT/metrics.json comes from the same sessions, budgets, policies, "
                        "model and code (make run uses it)")
    r.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="where the sessions are replayed: in this process (default) or on Ray (extra scale); "
                        "the figures are the same")
    r.add_argument("--address", default=None, help="Ray cluster address for --engine ray (default: a local cluster)")
    r.add_argument("--workers", type=_positive, default=None,
                   help="Ray workers for --engine ray (default: the cluster's CPUs)")
    r.add_argument("--feedback-dir", type=Path, default=None, help="feedback folder (default data/feedback)")
    r.add_argument("--feedback-budgets", default=None, metavar="KEYS",
                   help="record failures only at these budgets, comma-separated keys such as f0.25,t4000 "
                        "(default: every budget)")

    p = sub.add_parser("promote", help="evaluate candidate vs champion and move the champion alias if not worse")
    common(p)
    p.add_argument("--reference-budget", type=_fraction, default=0.25, help="fraction budget compared (default 0.25)")
    p.add_argument("--max-recall-drop", type=_drop, default=0.0, help="allowed drop in recall with page-in (fraction)")
    p.add_argument("--max-reduction-drop", type=_drop, default=0.0, help="allowed drop in token reduction (fraction)")
    p.add_argument("--out", type=Path, default=OUT_DIR / "promote", help="output folder (default %(default)s)")
    p.add_argument("--dry-run", action="store_true", help="decide and report, but do not move the alias")
    p.add_argument("--no-reuse", action="store_true",
                   help="re-evaluate both versions even when an earlier eval run has their figures for these sessions")

    v = sub.add_parser("validate", help="check session files against the evaluation session format")
    v.add_argument("paths", type=Path, nargs="+")

    s = sub.add_parser("summary", help="print the headline of an earlier run (its metrics.json) and the targets")
    s.add_argument("--out", type=Path, default=OUT_DIR / "eval", help="the run's output folder (default %(default)s)")
    s.add_argument("--budget-key", default=None, help="only this budget (e.g. f0.25, e0.25, t4000); default: all")

    bd = sub.add_parser("boundaries", help="task-boundary detection against the chained sessions' real boundaries")
    bd.add_argument("--sessions", type=Path, default=DEFAULT_SESSIONS,
                    help="session JSONL file, LoCoMo JSON file, or a folder of them (default: %(default)s)")
    bd.add_argument("--max-sessions", type=_positive, default=None, help="only the first N sessions")
    bd.add_argument("--tolerance", type=_non_negative, default=0,
                    help="a detected boundary at most this many messages from a real one matches it (default 0)")
    bd.add_argument("--json", type=Path, default=None, help="also write the figures and per-session rows here")
    return ap


def _progress(quiet: bool):
    if quiet:
        return None
    from tqdm import tqdm

    return lambda it: tqdm(it, desc="sessions", unit="session", file=sys.stderr)


def cmd_validate(args: argparse.Namespace) -> int:
    """Validate each path; print a summary or the errors. Exit status 1 when any file is bad."""
    status = 0
    for path in args.paths:
        try:
            ss = load_sessions(path)
        except (SessionFormatError, FileNotFoundError) as exc:
            print(exc, file=sys.stderr)
            status = 1
            continue
        notes = sum(len(s.notes) for s in ss)
        print(f"{path}: OK, {len(ss)} sessions, {sum(len(s.messages) for s in ss):,} messages, "
              f"{sum(len(s.key_facts) for s in ss):,} key facts" + (f", {notes} notes" if notes else ""))
        for s in ss:
            for n in s.notes[:5]:
                print(f"  note: {n}")
    return status


def _labels(arg: Path | None) -> dict[str, dict[str, Any]]:
    """The distilled labels for key-span retention: ``--labels``, else the corpora's when present.

    Raises:
        SystemExit: (exit status 2) ``--labels`` is not a file, or a line of it is not a label.
    """
    from .retention import load_labels

    if arg is not None and not arg.is_file():
        print(f"error: --labels {arg}: no such file (distilled labels, e.g. <corpora>/labels/distilled.jsonl)",
              file=sys.stderr)
        raise SystemExit(2)
    p = arg if arg is not None else corpora_root() / "labels" / "distilled.jsonl"
    try:
        return load_labels(p if p.is_file() else None)
    except ValueError as exc:  # LabelFormatError names the file and line
        print(f"error: --labels: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _run_inputs(args: argparse.Namespace) -> tuple[list, list[Budget]]:
    """The sessions and budgets of ``eval run``.

    Raises:
        SystemExit: (exit status 2) a missing or malformed session file, a bad budget, no sessions,
            a ``--feedback-budgets`` key that is not one of the budgets.
    """
    try:
        sessions = load_sessions(args.sessions, args.max_sessions)
        budgets = parse_budgets(args.budget, args.budget_tokens, args.min_budget, args.budget_final)
    except (SessionFormatError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if not sessions:
        print(f"error: {args.sessions} holds no sessions", file=sys.stderr)
        raise SystemExit(2)
    keys = [b.key for b in budgets]
    unknown = [k for k in (args.feedback_budgets or "").split(",") if k.strip() and k.strip() not in keys]
    if unknown and not args.no_feedback:  # else no record would match it and the run would append none
        print(f"error: --feedback-budgets {','.join(unknown)}: not a budget of this run; its budget keys: "
              f"{', '.join(keys)}", file=sys.stderr)
        raise SystemExit(2)
    return sessions, budgets


def _learned_model(args: argparse.Namespace) -> tuple[Any, dict[str, Any], str | None]:
    """``(scorer or None, model info, skip reason)`` of the learned policy (see :func:`eval.models.resolve_learned`).

    Raises:
        SystemExit: (exit status 2) an explicitly requested model cannot be loaded.
    """
    from .models import ModelUnavailable, resolve_learned

    if not any(p.startswith("learned") for p in args.policies):
        return None, {}, None
    try:
        return resolve_learned(args.model, use_mlflow=not args.no_mlflow)
    except ModelUnavailable as exc:
        print(f"error: --model {args.model}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def eval_run_tags(model: dict[str, Any], feedback_iteration: str, sessions_hash: str) -> dict[str, str]:
    """Tags of an evaluation run; :func:`training.registry.find_eval_figures` finds runs by them."""
    return {"ctxscore.run_type": "eval", "feedback_iteration": feedback_iteration, "code_hash": code_hash(),
            "model_name": model.get("name", ""), "model_version": model.get("version", ""),
            "model_alias": model.get("alias") or "", "sessions_hash": sessions_hash}


def eval_run_params(args: argparse.Namespace, summary: dict[str, Any]) -> dict[str, Any]:
    """Params of an evaluation run (sessions, budgets, policies, probe and page-in settings, model)."""
    run = summary["run"]
    model = run.get("model") or {}
    return {"sessions_file": str(args.sessions), "sessions_hash": run["sessions_hash"], "sessions": run["sessions"],
            "budgets": ",".join(b["key"] for b in run["budgets"]), "policies": ",".join(run["policies"]),
            "probe_every": args.probe_every, "pagein": args.pagein, "min_budget": args.min_budget,
            "model_uri": model.get("uri") or model.get("source") or "", "model_version": model.get("version", ""),
            "skipped": ",".join(run["skipped_policies"])}


def _record_feedback(args: argparse.Namespace, res: Any, summary: dict[str, Any], run_id: str | None) -> dict:
    """Append the recall failures (unless ``--no-feedback``) and compare with the history; returns the history."""
    from . import feedback

    fb_dir = args.feedback_dir or feedback.FEEDBACK_DIR
    fb_iter = summary["run"]["feedback_iteration"]
    if not args.no_feedback:
        misses = res.misses
        if args.feedback_budgets:
            keep = {k.strip() for k in args.feedback_budgets.split(",") if k.strip()}
            misses = [m for m in misses if m["budget"] in keep]
        n = feedback.append_failures(misses, fb_dir / feedback.FAILURES_FILE.name, run_id=run_id,
                                     feedback_iteration=fb_iter)
        summary["feedback"] = {"appended": n, "path": str(fb_dir / feedback.FAILURES_FILE.name),
                               "feedback_iteration": fb_iter}
    history = feedback.compare_with_history(summary, fb_dir / feedback.HISTORY_FILE.name, run_id=run_id,
                                            feedback_iteration=fb_iter, record=not args.no_feedback)
    summary["history"] = {"previous_run_id": (history.get("previous") or {}).get("run_id")}
    return history


def _write_outputs(res: Any, summary: dict[str, Any], budgets: list[Budget], out: Path, history: dict) -> str:
    """Write the plots, ``metrics.json`` and ``report.md`` to ``out``; returns the reference budget key."""
    from . import report
    from .runner import REFERENCE_BUDGET_KEY

    plots = []
    if report.plot_recall(summary, out / report.PLOT_RECALL):
        plots.append(report.PLOT_RECALL)
    ref = REFERENCE_BUDGET_KEY if any(b.key == REFERENCE_BUDGET_KEY for b in budgets) else budgets[0].key
    got = report.plot_tokens(res.traces, ref, out / report.PLOT_TOKENS)
    if got:
        plots.append(report.PLOT_TOKENS)
        summary["run"]["tokens_plot_session"] = got[1]
    report.write_metrics(summary, out)
    (out / "report.md").write_text(report.render_report(summary, plots, history), encoding="utf-8")
    return ref


def _out_is_a_file(out: Path, what: str) -> bool:
    """Print an error and return True when ``--out`` is an existing file (the command writes a folder)."""
    if out.exists() and not out.is_dir():
        print(f"error: --out {out}: is a file; the command writes a folder ({what}); give a folder path",
              file=sys.stderr)
        return True
    return False


def cmd_run(args: argparse.Namespace) -> int:
    """``python -m eval run``: see the module docstring. Exit status 0, or 2 on bad input."""
    from ctxscore.errors import ConfigError

    from . import tracking
    from .engine import make_engine
    from .runner import EvalConfig, run_eval
    from .sessions import sessions_hash

    if args.ledger:
        args.policies = with_ledger(args.policies)
    if _out_is_a_file(args.out, "metrics.json, report.md, plots"):
        return 2
    try:
        sessions, budgets = _run_inputs(args)
        labels = _labels(args.labels)
        scorer, model, skip = _learned_model(args)
    except SystemExit as exc:
        return int(exc.code)
    fp = _run_fingerprint(args, sessions, budgets, model)
    if args.reuse and _reuse(args.out, fp):
        return 0
    try:
        engine = make_engine(args.engine, args.address, args.workers)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    cfg = EvalConfig(budgets=budgets, policies=args.policies, probe_every=args.probe_every, pagein=args.pagein,
                     learned_scorer=scorer, learned_skip_reason=skip, model=model,
                     labels=labels)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    fb_iter = str(model.get("feedback_iteration") or "0")
    run_ctx: Any = contextlib.nullcontext(None)
    if not args.no_mlflow:
        from training import registry

        run_ctx = registry.start_run(args.experiment, run_name=f"eval-{args.sessions.stem}",
                                     tags=eval_run_tags(model, fb_iter, sessions_hash(sessions)))
    quiet_ctxscore = logging.getLogger("ctxscore")
    old_level = quiet_ctxscore.level
    quiet_ctxscore.setLevel(logging.ERROR)  # per-build warnings are counted in the metrics instead
    try:
        with run_ctx as run_id:
            res = run_eval(sessions, cfg, progress=_progress(args.quiet), engine=engine)
            summary = res.summary
            summary["run_id"] = run_id
            summary["run"].update({"sessions_file": str(args.sessions), "feedback_iteration": fb_iter,
                                   "fingerprint": fp})
            history = _record_feedback(args, res, summary, run_id)
            ref = _write_outputs(res, summary, budgets, out, history)
            if run_id is not None:
                tracking.log_results(summary, out, params=eval_run_params(args, summary), reference_budget_key=ref)
    finally:
        quiet_ctxscore.setLevel(old_level)
        engine.close()
    _print_summary(summary, out)
    return 0


#: Code whose content decides an evaluation's figures (part of the run fingerprint).
_FINGERPRINT_DIRS = ("eval", "ctxscore")


def _run_fingerprint(args: argparse.Namespace, sessions: list, budgets: list[Budget], model: dict[str, Any]) -> str:
    """sha256 of what an evaluation's figures depend on: the sessions, budgets, policies, probe and
    page-in settings, the learned model (run id and version, or a folder's ``config.json`` hash) and
    the code of ``eval/`` and ``ctxscore/``."""
    import hashlib
    import json

    from .sessions import sessions_hash

    h = hashlib.sha256()
    h.update(sessions_hash(sessions).encode())
    h.update(json.dumps([[b.key for b in budgets], args.policies, args.probe_every, args.pagein, args.min_budget,
                         model.get("run_id"), model.get("version"), model.get("source"), model.get("config_sha256"),
                         str(args.model)],
                        sort_keys=True, default=str).encode())
    h.update(code_hash().encode())
    return h.hexdigest()


def code_hash() -> str:
    """sha256 (first 16 hex) of the ``.py`` and ``.toml`` files of ``eval/`` and ``ctxscore/`` (not
    the packaged model): figures computed by other code are not reused."""
    import hashlib

    h = hashlib.sha256()
    for d in _FINGERPRINT_DIRS:
        for f in sorted((REPO_ROOT / d).rglob("*")):
            if f.suffix in (".py", ".toml") and "models" not in f.parts:
                h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _reuse(out: Path, fp: str) -> bool:
    """Print the earlier run's summary and return True when ``out/metrics.json`` has fingerprint ``fp``."""
    import json

    path = out / "metrics.json"
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if summary.get("run", {}).get("fingerprint") != fp:
        return False
    print(f"unchanged since the run in {out} (same sessions, budgets, policies, model and code): reusing its "
          "figures; --no-reuse evaluates again")
    _print_summary(summary, out)
    return True


def _print_summary(summary: dict[str, Any], out: Path) -> None:
    run = summary["run"]
    print(f"evaluated {run['sessions']} sessions ({run['messages']:,} messages, {run['key_facts']:,} facts) "
          f"in {run['runtime_s']} s -> {out}/report.md")
    for r in summary["results"]:
        print(f"  {r['policy']:<14} {r['budget']['label']:>5}  recall {r['recall']}  page-in {r['recall_pagein']}  "
              f"tokens/full {r['token_ratio']}  cache reuse {r.get('cache_reuse')}  util peak {r['util_peak']}  "
              f"build p95 {r['build_ms_p95']} ms")
    for pol, why in run.get("skipped_policies", {}).items():
        print(f"  {pol} skipped: {why}")
    if summary.get("run_id"):
        print(f"MLflow run {summary['run_id']}")


def cmd_summary(args: argparse.Namespace) -> int:
    """``python -m eval summary``: the table and targets of ``OUT/metrics.json``. Exit 2 when absent
    or damaged."""
    import json

    path = args.out / "metrics.json"
    if not path.is_file():
        print(f"error: {path} not found; run `python -m eval run --out {args.out}` first", file=sys.stderr)
        return 2
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        summary = {"error": exc}
    if not isinstance(summary, dict) or not {"run", "results"} <= summary.keys():
        why = f"not valid JSON ({summary['error']})" if "error" in summary else "no 'run' and 'results'"
        print(f"error: {path}: not the metrics of an evaluation run ({why}); run `python -m eval run --out "
              f"{args.out}` again", file=sys.stderr)
        return 2
    if args.budget_key:
        known = list(dict.fromkeys(r["budget"]["key"] for r in summary["results"]))
        if args.budget_key not in known:
            print(f"error: --budget-key {args.budget_key}: the run in {args.out} has no such budget; its budgets: "
                  f"{', '.join(known) or '(none)'}", file=sys.stderr)
            return 2
        summary["results"] = [r for r in summary["results"] if r["budget"]["key"] == args.budget_key]
    _print_summary(summary, args.out)
    tg = summary.get("targets") or {}
    if tg.get("evaluated"):
        who = f"{tg['policy']}{' (stand-in for learned)' if tg.get('stand_in') else ''}"
        print(f"targets at {tg['budget']} for {who}: {'met' if tg['passed'] else 'NOT met'}")
        for c in tg["checks"]:
            verdict = "info" if c.get("info") else ("pass" if c["passed"] else "FAIL")
            print(f"  {verdict}  {c['name']}: {c['value']} (target {c['target']})")
    else:
        print(f"targets not evaluated: {tg.get('reason', 'no result')}")
    return 0


def _promotion_figures(args: argparse.Namespace, sessions: list, budget: Budget, version: Any,
                       alias: str) -> dict[str, Any]:
    """The learned policy's figures of one registered version at ``budget``: reused from an earlier
    eval run of the same version, sessions, settings and code when there is one (unless
    ``--no-reuse``), else replayed now and logged as an eval run (so the next promotion reuses them).

    Raises:
        SystemExit: the version cannot be loaded.
    """
    from training import registry

    from . import tracking
    from .models import ModelUnavailable, load_version
    from .runner import EvalConfig, find_result, run_eval
    from .sessions import sessions_hash

    shash = sessions_hash(sessions)
    if not args.no_reuse:
        found = registry.find_eval_figures(args.experiment, str(version.version), shash,
                                           {"probe_every": args.probe_every, "pagein": args.pagein,
                                            "min_budget": args.min_budget}, budget.key, code=code_hash())
        if found is not None:
            print(f"{alias} (version {version.version}): reusing eval run {found['reused_run_id']}")
            return {"version": str(version.version), "alias": alias, **found}
    try:
        scorer, info = load_version(version, alias)
    except ModelUnavailable as exc:
        raise SystemExit(f"error: cannot load {alias} (version {version.version}): {exc}") from exc
    cfg = EvalConfig(budgets=[budget], policies=["learned"], probe_every=args.probe_every, pagein=args.pagein,
                     learned_scorer=scorer, model=info)
    with registry.start_run(args.experiment, run_name=f"eval-{alias}-v{version.version}",
                            tags=eval_run_tags(info, info["feedback_iteration"], shash)):
        res = run_eval(sessions, cfg, progress=_progress(args.quiet))
        res.summary["run"]["sessions_file"] = str(args.sessions)
        registry.log_run(params=eval_run_params(args, res.summary), metrics=tracking.flat_metrics(res.summary))
    r = find_result(res.summary, "learned", budget.key) or {}
    return {"version": str(version.version), "alias": alias, "runtime_s": res.summary["run"]["runtime_s"],
            **{k: r.get(k) for k in ("recall", "recall_pagein", "token_ratio", "token_reduction", "util_peak",
                                     "leakage_pagein", "checks")}}


def cmd_promote(args: argparse.Namespace) -> int:
    """``python -m eval promote``: evaluate ``candidate`` and ``champion`` on the held-out sessions
    and move ``champion`` to the candidate only if it beats the champion (:func:`eval.promote.decide`).
    A store without a champion first gets the shipped scorer as the baseline champion
    (:func:`training.registry.ensure_champion`). Exit status 0 (decided), 2 on bad input or a
    missing candidate."""
    from training import registry

    from .promote import decide, write_decision

    if _out_is_a_file(args.out, "the decision and its figures"):
        return 2
    try:
        sessions = load_sessions(args.sessions, args.max_sessions)
    except (SessionFormatError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    cand_v = registry.get_version("candidate")
    if cand_v is None:
        print(f"error: registered model {registry.MODEL_NAME!r} has no 'candidate' alias; train and register one first "
              "(python -m training.train)", file=sys.stderr)
        return 2
    registry.ensure_champion()
    champ_v = registry.get_version("champion")
    budget = Budget("fraction", args.reference_budget, args.min_budget)
    logging.getLogger("ctxscore").setLevel(logging.ERROR)
    cand = _promotion_figures(args, sessions, budget, cand_v, "candidate")
    same = str(champ_v.version) == str(cand_v.version)
    champ = dict(cand, alias="champion") if same else _promotion_figures(args, sessions, budget, champ_v, "champion")
    champ["baseline"] = (champ_v.tags or {}).get(registry.BASELINE_TAG)
    decision = decide(cand, champ, max_recall_drop=args.max_recall_drop, max_reduction_drop=args.max_reduction_drop)
    md = write_decision(decision, args.out, budget.label)
    with registry.start_run(args.experiment, run_name="promotion",
                            tags={"ctxscore.run_type": "promotion", "candidate_version": cand["version"],
                                  "champion_version": champ["version"], "promoted": str(decision.promote)}):
        registry.log_run(params={"sessions_file": str(args.sessions), "reference_budget": budget.key,
                                 "max_recall_drop": args.max_recall_drop, "max_reduction_drop": args.max_reduction_drop},
                         metrics={f"{who}_{k}": float(v) for who, d in (("candidate", cand), ("champion", champ))
                                  for k, v in d.items() if k in ("recall_pagein", "token_reduction") and v is not None},
                         folder=args.out)
    if decision.promote and not args.dry_run:
        registry.set_alias("champion", cand["version"])
    verb = "promoted" if decision.promote and not args.dry_run else ("would promote" if decision.promote else "kept champion")
    print(f"{verb}: {decision.reason} -> {md}")
    return 0


def cmd_boundaries(args: argparse.Namespace) -> int:
    """``python -m eval boundaries``: feed each session to a rules ``ContextManager`` and print the
    precision and recall of its task boundaries against the real ones, per source and overall
    (:mod:`eval.boundaries`). Exit status 0, or 2 on bad input."""
    import json

    from .boundaries import boundary_figures, boundary_table, detect_tasks, session_row

    if args.json is not None and args.json.is_dir():
        print(f"error: --json {args.json}: is a folder; give a file path such as {args.json / 'boundaries.json'}",
              file=sys.stderr)
        return 2
    try:
        sessions = load_sessions(args.sessions, args.max_sessions)
    except (SessionFormatError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logging.getLogger("ctxscore").setLevel(logging.ERROR)
    rows = [session_row(s, detect_tasks(s), args.tolerance) for s in sessions]
    fig = boundary_figures(rows, args.tolerance)
    print(f"task boundaries of {len(sessions)} sessions in {args.sessions} (tolerance {args.tolerance} messages)")
    print("\n".join(boundary_table(fig)))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**fig, "sessions": rows}, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m eval``; returns the exit status."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    if args.cmd == "validate":
        return cmd_validate(args)
    if args.cmd == "run":
        return cmd_run(args)
    if args.cmd == "summary":
        return cmd_summary(args)
    if args.cmd == "boundaries":
        return cmd_boundaries(args)
    return cmd_promote(args)
