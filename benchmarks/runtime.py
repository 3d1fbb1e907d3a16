"""Benchmark of the rule path: milliseconds per turn for ``add`` + ``build``.

Replays sessions of 100, 300 and 1,000 messages and prints p50 / p95 / max per turn. The messages
are real trajectories from ``$CTXSCORE_CORPORA`` (default ``../shared/datasets``): mini-SWE-agent
trajectories chained one after another (their system prompt kept once), else the bundled
project-written sessions. Target on a 2-core machine: p95 <= 5 ms at 300 messages, and a per-turn
cost that stays flat as sessions grow.

Usage: ``python benchmarks/runtime.py [--budget 8000] [--sizes 100 300 1000] [--source swe|tau|bundled]``
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: import the checkout's packages

from ctxscore import ContextManager  # noqa: E402
from ctxscore.io import iter_jsonl  # noqa: E402
from ctxscore.tokens import TokenCounter  # noqa: E402
from training.paths import DEFAULT_BUNDLED, corpora_root  # noqa: E402


def swe_messages(root: Path, n: int) -> list[dict]:
    out: list[dict] = []
    for path in sorted((root / "swe_mini" / "trajs").glob("*.traj.json.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            msgs = json.load(f)["messages"]
        out.extend(msgs if not out else msgs[1:])  # one system prompt for the chained session
        if len(out) >= n:
            break
    return out[:n]


def tau_messages(root: Path, n: int) -> list[dict]:
    data = json.loads((root / "tau_bench" / "historical_trajectories" / "gpt-4o-airline.json").read_text())
    out: list[dict] = []
    for i, t in enumerate(data):
        traj = t["traj"] if not out else t["traj"][1:]
        # tool_call ids repeat across trials: make them unique per trajectory
        for m in traj:
            m = dict(m)
            if m.get("tool_calls"):
                m["tool_calls"] = [dict(c, id=f"{c['id']}-{i}") for c in m["tool_calls"]]
            if m.get("tool_call_id"):
                m["tool_call_id"] = f"{m['tool_call_id']}-{i}"
            out.append(m)
        if len(out) >= n:
            break
    return out[:n]


def bundled_messages(n: int) -> list[dict]:
    out: list[dict] = []
    for _, session in iter_jsonl(DEFAULT_BUNDLED):
        msgs = [{k: v for k, v in m.items() if k != "label"} for m in session["messages"]]
        for m in msgs:
            if m.get("tool_calls"):
                m["tool_calls"] = [dict(c, id=f"{c['id']}-{len(out)}") for c in m["tool_calls"]]
        out.extend(msgs)
        if len(out) >= n:
            break
    return out[:n]


def replay(messages: list[dict], budget: int) -> tuple[list[float], list[float]]:
    """Wall-clock and CPU milliseconds of add + build for each message.

    CPU time (``time.process_time``) is reported beside wall-clock time because it is not inflated
    when other processes compete for the two cores.
    """
    cm = ContextManager(budget=budget, scorer="rules")
    wall, cpu = [], []
    for m in messages:
        t0, c0 = time.perf_counter(), time.process_time()
        cm.add(m)
        cm.build()
        wall.append((time.perf_counter() - t0) * 1000.0)
        cpu.append((time.process_time() - c0) * 1000.0)
    cm.close()
    return wall, cpu


def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] if len(xs) > 1 else xs[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=8000, help="token budget (default 8000)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 300, 1000])
    ap.add_argument("--source", choices=["swe", "tau", "bundled"], default=None)
    args = ap.parse_args()
    logging.disable(logging.WARNING)  # pinned-overflow warnings of chained sessions are expected here
    root = corpora_root()
    source = args.source or ("swe" if (root / "swe_mini").is_dir() else "bundled")
    print(f"rule path, add + build per turn, budget {args.budget} tokens, source {source}")
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(f"{'messages':>8} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} {'p95 last 100':>13} {'p95 CPU ms':>11} {'full tokens':>12}")
    for n in args.sizes:
        if source == "swe":
            msgs = swe_messages(root, n)
        elif source == "tau":
            msgs = tau_messages(root, n)
        else:
            msgs = bundled_messages(n)
        replay(msgs[: min(30, len(msgs))], args.budget)  # warm caches (encodings, regexes)
        t, c = replay(msgs, args.budget)
        full = TokenCounter().count_messages(msgs)
        print(
            f"{len(msgs):>8} {pct(t, 50):>8.2f} {pct(t, 95):>8.2f} {max(t):>8.2f} {pct(t[-100:], 95):>13.2f} "
            f"{pct(c, 95):>11.2f} {full:>12,}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
