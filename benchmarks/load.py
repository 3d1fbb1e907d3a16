"""Load benchmark of the server backends: N concurrent agent sessions through proxy workers sharing
PostgreSQL (the store) and Redis (hot state and the per-session lock).

``--mode proxy`` sends them through the real proxy (``ctxscore serve`` on loopback, in memory and
then ``--workers`` processes with ``--store postgresql://... --redis redis://...``, a fake upstream
taking ``--llm-ms`` per answer; ``--routing`` as below): :mod:`benchmarks.load_proxy` describes it.

``--mode library`` (the default) plays the proxy's part with the library API, the way the proxy
uses it: ``--workers`` processes (default: one per core),
each a :class:`ctxscore.store.redis_state.SharedSessions` over one PostgreSQL store and one Redis;
every request is the OpenAI-style JSON body an agent sends before each assistant message (the
whole history so far), and the worker parses it, runs ``sync`` + ``build(query=<last user
message>)`` inside the session's turn (Redis lock, catch-up, hot state) and serialises the window.
Requests of one session are routed round-robin over the workers (``--routing round-robin``, the
default), so nearly every request lands on a worker that was behind: the worst case for the hot
state; ``--routing sticky`` sends a session to one worker (session affinity). Each of the ``--sessions`` clients waits
``--llm-ms`` after each answer (the model's reply time) before its next request.

Figures: requests per second, the latency the worker adds per request (from the request bytes to
the window bytes, measured in the worker: p50 / p95 / p99 / max), the client round trip, CPU per
request, errors, and the stored bytes per session (PostgreSQL table + indexes, Redis keys).

Sessions: real tau-bench airline trajectories chained (``$CTXSCORE_CORPORA``, default
``../shared/datasets``), a different rotation per session; the bundled sessions without corpora.

Usage::

    CTXSCORE_PG_DSN=postgresql://... CTXSCORE_REDIS_URL=redis://... python benchmarks/load.py \\
        [--mode library|proxy] [--sessions 16] [--turns 300] [--workers 2] [--scorer rules|learned] \
        [--llm-ms 200] [--budget 16000] [--routing round-robin|sticky]
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import statistics
import sys
import threading
import time
import uuid
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: import the checkout's packages

from benchmarks.load_proxy import pct, run_threads  # noqa: E402
from training.paths import DEFAULT_BUNDLED, corpora_root  # noqa: E402


def tau_trajectories(root: Path) -> list[list[dict]]:
    """The tau-bench airline trajectories (lists of OpenAI-style messages)."""
    data = json.loads((root / "tau_bench" / "historical_trajectories" / "gpt-4o-airline.json").read_text())
    return [t["traj"] for t in data]


def bundled_trajectories() -> list[list[dict]]:
    """The bundled sessions (labels dropped)."""
    out = []
    for line in DEFAULT_BUNDLED.read_text(encoding="utf-8").splitlines():
        out.append([{k: v for k, v in m.items() if k != "label"} for m in json.loads(line)["messages"]])
    return out


def session_messages(trajs: list[list[dict]], rotation: int, turns: int) -> list[dict]:
    """Trajectories chained from ``rotation`` on (one system prompt) until ``turns`` assistant
    messages; tool-call ids made unique per trajectory."""
    out: list[dict] = []
    k = 0
    while sum(m["role"] == "assistant" for m in out) < turns:
        traj = trajs[(rotation + k) % len(trajs)]
        for m in traj if not out else [m for m in traj if m["role"] != "system"]:
            m = dict(m)
            if m.get("tool_calls"):
                m["tool_calls"] = [dict(c, id=f"{c['id']}-{k}") for c in m["tool_calls"]]
            if m.get("tool_call_id"):
                m["tool_call_id"] = f"{m['tool_call_id']}-{k}"
            if m.get("content") is None:
                m["content"] = ""
            out.append({key: m[key] for key in ("role", "content", "name", "tool_calls", "tool_call_id") if m.get(key)
                        or key == "content"})
        k += 1
    ends = [i for i, m in enumerate(out) if m["role"] == "assistant"][:turns]
    return out[: ends[-1] + 1]


def request_points(messages: list[dict]) -> list[int]:
    """The request before each assistant message: the history length the client sends."""
    return [i for i, m in enumerate(messages) if m["role"] == "assistant"]


def last_user(messages: list[dict]) -> str | None:
    """The last non-empty user message of the history (the query of ``build``), or None."""
    for m in reversed(messages):
        if m["role"] == "user" and isinstance(m.get("content"), str) and m["content"].strip():
            return m["content"]
    return None


# -- the worker (a proxy process) -------------------------------------------------------------------
def worker_main(idx: int, conns: list[Connection], pg_url: str, redis_url: str, prefix: str, scorer_name: str,
                budget: int, ready: Any) -> None:
    """One proxy-like worker process: answers the requests of its pipes (sync + build inside the
    session's turn) until every client has sent ``stop``, then sends back its per-request figures."""
    from ctxscore import ContextManager
    from ctxscore.store import open_store
    from ctxscore.store.redis_state import RedisHotState, SharedSessions

    logging.disable(logging.WARNING)
    scorer: Any = "rules"
    if scorer_name == "learned":
        from ctxscore.messages import Message
        from ctxscore.scoring.learned import LearnedScorer
        from ctxscore.scoring.package import DEFAULT_MODEL_DIR

        scorer = LearnedScorer.from_pretrained(DEFAULT_MODEL_DIR)
        scorer.predict([Message(role="user", content="warm up the embedder", turn=0)])
    if pg_url == "memory":  # the baseline: each worker's sessions in memory (sticky routing only)
        store, sessions = None, _MemorySessions(budget, scorer)
    else:
        store = open_store(pg_url, redis=RedisHotState(redis_url, prefix=prefix))
        sessions = SharedSessions(store, ContextManager, budget=budget, scorer=scorer, max_sessions=256)
    ready.put(idx)
    stats: list[dict[str, Any]] = []
    live = list(conns)
    while live:
        for conn in wait(live):
            try:
                raw = conn.recv_bytes()
            except EOFError:
                live.remove(conn)
                continue
            if raw == b"stop":
                conn.send_bytes(json.dumps({"stats": stats, "sessions": sessions.stats}).encode())
                live.remove(conn)
                continue
            t0, c0 = time.perf_counter(), time.process_time()
            phases: dict[str, float] = {}
            n_msgs = 0
            try:
                body = json.loads(raw)
                sid, msgs = body["session"], body["messages"]
                n_msgs = len(msgs)
                with sessions.turn(sid) as cm:
                    t1 = time.perf_counter()
                    cm.sync(msgs)
                    t2 = time.perf_counter()
                    win = cm.build(query=last_user(msgs))
                    t3 = time.perf_counter()
                out = json.dumps({"messages": win.messages, "tokens": win.tokens}, ensure_ascii=False).encode()
                phases = {"turn_in": t1 - t0, "sync": t2 - t1, "build": t3 - t2}
                err = None
            except Exception as exc:  # noqa: BLE001 - counted and reported
                out, err = json.dumps({"error": str(exc)}).encode(), f"{type(exc).__name__}: {exc}"
            dt = time.perf_counter() - t0
            conn.send_bytes(out)
            stats.append({"ms": dt * 1000, "cpu_ms": (time.process_time() - c0) * 1000, "error": err, "n": n_msgs,
                          **{k: v * 1000 for k, v in phases.items()}})
    if store is not None:
        store.close()


class _MemorySessions:
    """The baseline of ``--store memory``: one in-memory manager per session, no lock, no sharing."""

    def __init__(self, budget: int, scorer: Any) -> None:
        """No sessions yet; ``budget`` and ``scorer`` are those of every manager made."""
        self.budget, self.scorer, self.cms, self.stats = budget, scorer, {}, {"opened": 0, "refreshed": 0, "current": 0}

    def turn(self, sid: str) -> Any:
        """The session's manager (made on first use), as a context manager like ``SharedSessions.turn``."""
        import contextlib

        from ctxscore import ContextManager

        if sid not in self.cms:
            self.cms[sid] = ContextManager(budget=self.budget, scorer=self.scorer, session_id=sid)
            self.stats["opened"] += 1
        else:
            self.stats["current"] += 1
        return contextlib.nullcontext(self.cms[sid])


# -- the clients ----------------------------------------------------------------------------------
def client(k: int, sid: str, messages: list[dict], pipes: list[Connection], llm_s: float,
           out: list[dict[str, Any]], errors: list[str], sticky: bool = False) -> None:
    """One agent session: sends the history before each assistant message, round robin over the
    workers (or to one worker when ``sticky``), records the round trip and waits ``llm_s``."""
    parts = [json.dumps(m, ensure_ascii=False) for m in messages]  # each message serialised once
    head = f'{{"session": {json.dumps(sid)}, "messages": ['
    for j, end in enumerate(request_points(messages)):
        conn = pipes[k % len(pipes)] if sticky else pipes[(j + k) % len(pipes)]  # one worker, or round robin
        body = (head + ", ".join(parts[:end]) + "]}").encode()
        t0 = time.perf_counter()
        conn.send_bytes(body)
        answer = json.loads(conn.recv_bytes())
        out.append({"rtt_ms": (time.perf_counter() - t0) * 1000, "bytes": len(body)})
        if "error" in answer:
            errors.append(answer["error"])
        if llm_s:
            time.sleep(llm_s)


def storage(pg_url: str, redis_url: str, prefix: str, sessions: list[str]) -> dict[str, float]:
    """Bytes per session in PostgreSQL (ctx_messages + ctx_sessions with their indexes and TOAST)
    and in Redis (the hot-state keys)."""
    import psycopg
    import redis

    from ctxscore.store.postgres import split_url

    dsn, opts = split_url(pg_url)
    with psycopg.connect(dsn) as conn:
        schema = opts["schema"]
        pg = sum(conn.execute("SELECT pg_total_relation_size(%s)", (f'"{schema}".{t}',)).fetchone()[0]
                 for t in ("ctx_messages", "ctx_sessions"))
        msgs = conn.execute(f'SELECT count(*) FROM "{schema}".ctx_messages').fetchone()[0]
    r = redis.Redis.from_url(redis_url)
    rbytes = sum(r.memory_usage(k) or 0 for k in r.scan_iter(match=f"{prefix}:*", count=1000))
    return {"pg_bytes_per_session": pg / len(sessions), "messages_per_session": msgs / len(sessions),
            "redis_bytes_per_session": rbytes / len(sessions)}


def parse_args() -> argparse.Namespace:
    """The command-line options (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=16, help="concurrent sessions (default 16)")
    ap.add_argument("--turns", type=int, default=300, help="requests per session (default 300)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="worker processes (default: the cores)")
    ap.add_argument("--scorer", choices=("rules", "learned"), default="rules")
    ap.add_argument("--llm-ms", type=float, default=200.0, help="the model's reply time per request (default 200 ms)")
    ap.add_argument("--budget", type=int, default=16000, help="token budget (default 16000)")
    ap.add_argument("--pg", default=os.environ.get("CTXSCORE_PG_DSN"), help="PostgreSQL URL (default $CTXSCORE_PG_DSN)")
    ap.add_argument("--redis", default=os.environ.get("CTXSCORE_REDIS_URL"), help="Redis URL (default $CTXSCORE_REDIS_URL)")
    ap.add_argument("--routing", choices=("round-robin", "sticky"), default="round-robin",
                    help="requests of a session go to the workers in turn (default: the worst case for the hot "
                         "state) or always to one worker (session affinity)")
    ap.add_argument("--store", choices=("postgres", "memory"), default="postgres",
                    help="postgres (with Redis; default) or memory: the baseline, each worker's sessions in an "
                         "in-memory SQLite store (sticky routing), i.e. what the runtime alone costs here")
    ap.add_argument("--mode", choices=("library", "proxy"), default="library",
                    help="library: workers calling SharedSessions directly (default); proxy: HTTP requests through "
                         "`ctxscore serve` (in memory, then PostgreSQL + Redis)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    args = ap.parse_args()
    if args.store == "memory":
        args.routing = "sticky"
    return args


def start_workers(args: argparse.Namespace, n_clients: int, pg_url: str, prefix: str) -> tuple[list, list]:
    """Start the worker processes; returns (processes, pipes[client][worker] = (client end, worker end))."""
    ctx = mp.get_context("spawn")
    ready = ctx.Queue()
    pairs = [[ctx.Pipe() for _ in range(args.workers)] for _ in range(n_clients)]
    procs = []
    for w in range(args.workers):
        p = ctx.Process(target=worker_main, args=(w, [pairs[c][w][1] for c in range(n_clients)], pg_url, args.redis,
                                                   prefix, args.scorer, args.budget, ready), daemon=True)
        p.start()
        procs.append(p)
    for _ in procs:
        ready.get(timeout=600)
    return procs, pairs


def stop_workers(procs: list, pairs: list) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Stop the workers; returns their per-request figures and their manager counts."""
    stats: list[dict[str, Any]] = []
    managers = {"opened": 0, "refreshed": 0, "current": 0}
    for w in range(len(procs)):
        for c in range(len(pairs)):
            pairs[c][w][0].send_bytes(b"stop")
            got = json.loads(pairs[c][w][0].recv_bytes())
            if c == 0:
                stats += got["stats"]
                for k, v in got["sessions"].items():
                    managers[k] += v
    for p in procs:
        p.join(timeout=60)
    return stats, managers


def summary(args: argparse.Namespace, stats: list[dict[str, Any]], results: list[list[dict[str, Any]]],
            errors: list[str], wall: float, managers: dict[str, int], sessions: dict[str, list[dict]]) -> dict[str, Any]:
    """The run's figures: throughput, added latency, round trips, CPU, phases, manager counts."""
    ms = [s["ms"] for s in stats]
    rtt = [r["rtt_ms"] for rs in results for r in rs]
    phases = ("turn_in", "sync", "build")
    return {
        "scorer": args.scorer, "sessions": args.sessions, "turns": args.turns, "workers": args.workers,
        "routing": args.routing,
        "llm_ms": args.llm_ms, "budget": args.budget,
        "requests": len(ms), "errors": len(errors) + sum(1 for s in stats if s["error"]),
        "wall_s": round(wall, 1), "rps": round(len(ms) / wall, 1),
        "added_ms": {q: round(pct(ms, q), 2) for q in (50, 95, 99)} | {"max": round(max(ms), 1)},
        "rtt_ms": {q: round(pct(rtt, q), 2) for q in (50, 95, 99)},
        "cpu_ms_per_request": round(statistics.fmean(s["cpu_ms"] for s in stats), 2),
        "phase_p50_ms": {k: round(pct([s[k] for s in stats if k in s], 50), 2) for k in phases},
        "phase_p95_ms": {k: round(pct([s[k] for s in stats if k in s], 95), 2) for k in phases},
        "added_ms_up_to_300_messages": {q: round(pct([s["ms"] for s in stats if s["n"] <= 300], q), 2) for q in (50, 95)},
        "managers": managers,
        "messages_at_end": sum(len(m) for m in sessions.values()) // len(sessions),
        "request_kb_p50": round(pct([r["bytes"] / 1024 for rs in results for r in rs], 50), 1),
    }


def main() -> int:
    """Run the benchmark and print its figures (JSON); exit status 1 when any request failed."""
    args = parse_args()
    if args.store == "postgres" and (not args.pg or not args.redis):
        print("error: give --pg and --redis (or set CTXSCORE_PG_DSN and CTXSCORE_REDIS_URL)", file=sys.stderr)
        return 2
    root = corpora_root()
    tau = (root / "tau_bench" / "historical_trajectories" / "gpt-4o-airline.json").is_file()
    trajs = tau_trajectories(root) if tau else bundled_trajectories()
    run = uuid.uuid4().hex[:8]
    pg_url = f"{args.pg}{'&' if '?' in args.pg else '?'}schema=load_{run}" if args.pg else "memory"
    prefix = f"ctxload-{run}"
    sids = [f"s{k:02d}" for k in range(args.sessions)]
    sessions = {sid: session_messages(trajs, 7 * k, args.turns) for k, sid in enumerate(sids)}
    if args.mode == "proxy":
        return main_proxy(args, run, trajs, pg_url if args.store == "postgres" else None, "tau-bench" if tau else "bundled")
    if args.store == "memory":
        pg_url = "memory"
    else:
        from ctxscore.store import open_store

        open_store(pg_url).close()  # migrate once, before the workers start
    procs, pairs = start_workers(args, len(sids), pg_url, prefix)
    results: list[list[dict[str, Any]]] = [[] for _ in sids]
    errors: list[str] = []
    threads = [threading.Thread(target=client, args=(k, sid, sessions[sid], [pairs[k][w][0] for w in range(args.workers)],
                                                     args.llm_ms / 1000, results[k], errors, args.routing == "sticky"))
               for k, sid in enumerate(sids)]
    load0 = os.getloadavg()[0]
    wall = run_threads(threads)
    stats, managers = stop_workers(procs, pairs)
    figures = summary(args, stats, results, errors, wall, managers, sessions)
    figures["source"] = "tau-bench" if tau else "bundled"
    figures["load_average"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
    figures["cores"] = os.cpu_count()
    figures["store"] = args.store
    if args.store == "postgres":
        figures.update({k: round(v, 1) for k, v in storage(pg_url, args.redis, prefix, sids).items()})
    print(json.dumps(figures, indent=2))
    if errors:
        print("first errors:", *errors[:3], sep="\n  ")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return 0 if figures["errors"] == 0 else 1


def main_proxy(args: argparse.Namespace, run: str, trajs: list[list[dict]], pg_url: str | None, source: str) -> int:
    """``--mode proxy``: both phases of :mod:`benchmarks.load_proxy`; prints the figures (JSON)."""
    from benchmarks.load_proxy import run_proxy

    sessions = {f"{run}-s{k:02d}": session_messages(trajs, 7 * k, args.turns) for k in range(args.sessions)}
    if pg_url:
        from ctxscore.store import open_store

        open_store(pg_url).close()  # migrate once, before the proxies start
    figures = run_proxy(args, sessions, pg_url)
    figures["source"] = source
    figures["messages_at_end"] = sum(len(m) for m in sessions.values()) // len(sessions)
    if pg_url:
        import redis

        r = redis.Redis.from_url(args.redis)
        keys = list(r.scan_iter(match=f"ctxscore:{{{run}-*", count=1000))
        if keys:
            r.delete(*keys)
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return 0 if all(p["errors"] == 0 for p in figures["phases"]) else 1


if __name__ == "__main__":
    sys.exit(main())
