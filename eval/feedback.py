"""The feedback loop: recall failures to ``data/feedback/`` and the history of evaluation runs.

``recall_failures.jsonl`` (git-ignored) gets one record per key fact that a managed policy
(``rules`` / ``learned``) lost from its window, deduplicated per (message id, fact id, policy, budget)
within a run. Fields: ``message_id``, ``session_id``, ``message_index``, ``role``, ``text`` (as the
labels render it; texts over 1,800 characters keep their first and last 900, as the annotators saw
them), ``text_chars`` (the full length), ``predicted_category`` and ``predicted_value`` (the scorer's intrinsic value),
``tier`` and ``window_value`` (the manager's decision when the loss was found), ``fact`` (``fact_id``,
``value``, ``kind``, ``probe``, ``superseded``), ``policy``, ``budget``, ``probe_turn``,
``recovered_by_pagein``, ``run_id``, ``timestamp``, ``feedback_iteration``. The next training run
reads the file (``training/train.py``): each failure's source message becomes a positive target of
the outcome value head (``training/outcomes.py``; a train message also has its importance target
raised), and each failure that page-in did not recover becomes a ranker query at its probe turn whose
positives are the messages holding the fact (``training/ranker.py``, weighted above the train-session
probes). Records from the held-out test split never feed training.

``feedback_iteration`` is the feedback iteration of the evaluated model: the ``feedback_iteration``
tag of its MLflow model version or training run (training writes ``"<records>-<sha256[:12]>"`` of the
feedback file it read), ``"0"`` when absent. Failures found on iteration N feed iteration N+1.
Training (``training/train.py``) reads ``message_id`` and raises that message's value target.

``eval_history.jsonl`` (git-ignored) keeps the headline metrics of every evaluation run, so the
report can show iteration N against N+1 on the same sessions.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ctxscore.errors import InputError
from ctxscore.io import iter_jsonl
from training.paths import FEEDBACK_DIR

log = logging.getLogger("eval")

FAILURES_FILE = FEEDBACK_DIR / "recall_failures.jsonl"
HISTORY_FILE = FEEDBACK_DIR / "eval_history.jsonl"


def append_failures(misses: list[dict[str, Any]], path: Path, *, run_id: str | None,
                    feedback_iteration: str) -> int:
    """Append feedback records (deduplicated per message, fact, policy and budget); return how many.

    Raises:
        OSError: the file cannot be written (the message names it).
    """
    seen: set[tuple[str, str, str, str]] = set()
    now = datetime.now(UTC).isoformat(timespec="seconds")
    rows = []
    for m in misses:
        key = (m["message_id"], m["fact"]["fact_id"], m["policy"], m["budget"])
        if key in seen:
            continue
        seen.add(key)
        rows.append({**m, "run_id": run_id, "timestamp": now, "feedback_iteration": feedback_iteration})
    if not rows:
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    return len(rows)


def headline(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{"policy@budget label": {recall, recall_pagein, token_ratio, util_peak, leakage}}``."""
    out = {}
    for r in summary["results"]:
        out[f"{r['policy']}@{r['budget']['label']}"] = {
            k: r[k] for k in ("recall", "recall_pagein", "token_ratio", "util_peak", "leakage")
        }
    return out


def read_history(path: Path) -> list[dict[str, Any]]:
    """Earlier runs from the history file, oldest first (``[]`` when there is none).

    A line that is not valid JSON (for example the last line of a run that was killed while
    writing) ends the reading with a warning naming the file and line; the runs before it are
    returned, so a damaged history never stops an evaluation.
    """
    if not path.is_file():
        return []
    out = []
    try:
        for _, rec in iter_jsonl(path):
            if isinstance(rec, dict):
                out.append(rec)
    except InputError as exc:
        log.warning("eval history: %s; using the %d run(s) before it", exc, len(out))
    return out


def compare_with_history(summary: dict[str, Any], path: Path, *, run_id: str | None,
                         feedback_iteration: str, record: bool = True) -> dict[str, Any]:
    """Pick the earlier run to compare with and (when ``record``) append this run to the history.

    Runs on the same sessions hash are numbered by feedback iteration in order of first appearance
    (``iteration_index`` 0, 1, ...). The earlier run is the latest one on the same sessions hash with
    a different feedback iteration (iteration N against this N+1); failing that, the latest one on
    the same sessions hash (a re-run of the same iteration).

    Returns:
        ``{"previous": entry | None, "current": entry}`` where an entry holds ``run_id``, ``created``,
        ``feedback_iteration``, ``iteration_index``, ``sessions_hash``, ``model`` and ``headline``.
    """
    same = [h for h in read_history(path) if h.get("sessions_hash") == summary["run"]["sessions_hash"]]
    order = list(dict.fromkeys(str(h.get("feedback_iteration")) for h in same))
    fi = str(feedback_iteration)
    cur = {
        "run_id": run_id,
        "created": summary["run"]["created"],
        "feedback_iteration": fi,
        "iteration_index": order.index(fi) if fi in order else len(order),
        "sessions_hash": summary["run"]["sessions_hash"],
        "model": summary["run"].get("model"),
        "headline": headline(summary),
    }
    other = [h for h in same if str(h.get("feedback_iteration")) != fi]
    prev = (other or same or [None])[-1]
    if record:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(cur, ensure_ascii=False) + "\n")
    return {"previous": prev, "current": cur}


def iteration_table(path: Path, sessions_hash: str | None = None, policy: str = "learned") -> str:
    """Markdown table of the feedback iterations in the history file: one row per (iteration, run),
    the recall and recall with page-in of ``policy`` at every budget the run measured.

    Args:
        path: ``eval_history.jsonl``.
        sessions_hash: only runs on these sessions (default: the sessions of the latest run).
        policy: the policy whose figures are shown.
    """
    runs = read_history(path)
    if not runs:
        return "(no evaluation runs recorded)"
    want = sessions_hash or runs[-1].get("sessions_hash")
    runs = [r for r in runs if r.get("sessions_hash") == want]
    budgets = list(dict.fromkeys(k.split("@", 1)[1] for r in runs for k in r.get("headline", {})
                                 if k.startswith(f"{policy}@")))
    head = ["iteration", "feedback", "model", *(f"{b} recall / page-in / tokens" for b in budgets)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        model = r.get("model") or {}
        cells = [str(r.get("iteration_index")), str(r.get("feedback_iteration")),
                 str(model.get("version") or model.get("path") or model.get("uri") or "")]
        for b in budgets:
            h = r.get("headline", {}).get(f"{policy}@{b}")
            cells.append("–" if h is None else f"{h['recall']:.3f} / {h['recall_pagein']:.3f} / {h['token_ratio']:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m eval.feedback table [--history PATH] [--policy learned]``: print :func:`iteration_table`."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m eval.feedback", description="feedback iterations")
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("table", help="markdown table of the feedback iterations (recall per budget)")
    t.add_argument("--history", type=Path, default=HISTORY_FILE)
    t.add_argument("--policy", default="learned")
    t.add_argument("--sessions-hash", default=None)
    args = ap.parse_args(argv)
    print(iteration_table(args.history, args.sessions_hash, args.policy))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
