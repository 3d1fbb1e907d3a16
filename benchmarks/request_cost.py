"""What one proxy request costs without contention: the proxy's own work per request, in this process.

The load benchmark (``benchmarks/load.py --mode proxy``) measures 16 sessions at once on the same
cores as their clients, the fake upstream, PostgreSQL and Redis, so its tail is mostly requests
waiting for a core. This one replays chained tau-bench sessions (``$CTXSCORE_CORPORA``, the bundled
sessions without corpora) one request at a time through the proxy's own code path: the body parsed
(orjson), :meth:`~ctxscore.serve.app.Proxy.prepare` (the turn entered, ``sync``, ``build`` with the
last user message as the query) and :meth:`~ctxscore.serve.app.Proxy.record` (the reply stored, the
turn left), without HTTP and without an upstream. Two stores:

- ``memory``: one proxy, each session in its own in-memory SQLite store (the default proxy);
- ``postgres``: two proxies on one PostgreSQL store and one Redis (``$CTXSCORE_PG_DSN``,
  ``$CTXSCORE_REDIS_URL``), request ``j`` of a session on proxy ``j % 2`` (round-robin: every request
  catches up with the other proxy's turn).

Prints wall and CPU milliseconds per request (mean, p50, p95, p99; the first two requests of each
session, which load the tokenizer and open the session, are left out).

Usage: ``python benchmarks/request_cost.py [--store memory|postgres] [--sessions 2] [--turns 300]
[--budget 16000] [--scorer rules]``
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.load import bundled_trajectories, request_points, session_messages, tau_trajectories  # noqa: E402
from ctxscore.serve.app import _read_chat_body, create_app  # noqa: E402
from training.paths import corpora_root  # noqa: E402


def pct(xs: list[float], q: int) -> float:
    """The ``q``-th percentile of ``xs`` (inclusive method)."""
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", choices=("memory", "postgres"), default="memory")
    ap.add_argument("--sessions", type=int, default=2)
    ap.add_argument("--turns", type=int, default=300, help="requests per session")
    ap.add_argument("--budget", type=int, default=16000, help="token budget (default 16000)")
    ap.add_argument("--scorer", default="rules")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    root = corpora_root()
    tau = root / "tau_bench" / "historical_trajectories" / "gpt-4o-airline.json"
    trajs = tau_trajectories(root) if tau.is_file() else bundled_trajectories()
    if args.store == "postgres":
        pg, redis = os.environ.get("CTXSCORE_PG_DSN"), os.environ.get("CTXSCORE_REDIS_URL")
        if not pg or not redis:
            print("--store postgres needs CTXSCORE_PG_DSN and CTXSCORE_REDIS_URL", file=sys.stderr)
            return 2
        apps = [create_app("http://127.0.0.1:9/v1", args.budget, scorer=args.scorer, store=pg, redis=redis)
                for _ in range(2)]
    else:
        apps = [create_app("http://127.0.0.1:9/v1", args.budget, scorer=args.scorer)]
    proxies = [a.state.proxy for a in apps]
    loop = asyncio.new_event_loop()
    wall: list[float] = []
    cpu: list[float] = []
    run = uuid.uuid4().hex[:8]
    for k in range(args.sessions):
        msgs = session_messages(trajs, k, args.turns)
        sid = f"bench-{run}-{k}"
        for n, j in enumerate(request_points(msgs)):
            proxy = proxies[n % len(proxies)]
            raw = orjson.dumps({"model": "m", "messages": msgs[:j]})
            c0, t0 = time.process_time(), time.perf_counter()
            body, _ = _read_chat_body(raw)
            sess = proxy.sessions.get(sid)
            window = proxy.prepare(sess, body["messages"], None)[0]
            orjson.dumps({**body, "messages": window})
            loop.run_until_complete(proxy.record(sess, dict(msgs[j])))
            proxy.sessions.leave(sess)
            proxy.sessions.done(sess)
            if n >= 2:
                wall.append((time.perf_counter() - t0) * 1000)
                cpu.append((time.process_time() - c0) * 1000)
    for p in proxies:
        p.sessions.close()
    print(f"{args.store}, {args.scorer}, {args.sessions} x {args.turns} requests, budget {args.budget}, "
          f"{'tau-bench' if tau.is_file() else 'bundled'} sessions, load {os.getloadavg()[0]:.2f}")
    for name, xs in (("wall", wall), ("CPU", cpu)):
        print(f"  {name} ms a request: mean {statistics.mean(xs):.2f}  p50 {pct(xs, 50):.2f}  "
              f"p95 {pct(xs, 95):.2f}  p99 {pct(xs, 99):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
