"""The ``--mode proxy`` of ``benchmarks/load.py``: the sessions sent through the real proxy.

Processes on loopback: ``ctxscore serve`` (uvicorn), a fake OpenAI-compatible upstream in this
process that answers each request after ``--llm-ms`` (the model's time) with the session's next
assistant message (so the client's next request resends exactly what the proxy recorded), and one
httpx client thread per session sending the whole history before each assistant message, one
request at a time; session ``k`` of ``N`` sends its first request ``k / N`` of ``--llm-ms`` after the
first session (independent agents; started together, the sessions would stay in step and every
turn's requests would arrive at once). Two phases in one run:

- ``memory``: one proxy process, every session in memory (the baseline);
- ``postgres+redis``: ``--workers`` proxy processes started with ``--store postgresql://...
  --redis redis://...``; request ``j`` of session ``k`` goes to process ``(j + k) % workers`` (a
  round-robin load balancer: nearly every request lands on a process that did not serve the
  session's previous turn), or with ``--routing sticky`` always to process ``k % workers`` (a load
  balancer with session affinity).

Per request: the proxy's own time (its ``X-Ctxscore-Proxy-Ms`` header: parse, sync, build,
forward, record, the shared turn's lock; the upstream excluded), and the round trip minus the
upstream's own time (its ``X-Bench-Upstream-Ms`` header, passed down by the proxy): what a client
sees the proxy add, HTTP hops included.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from benchmarks.proxy import cpu_seconds, free_port  # the same helpers as the single-session proxy benchmark

REPO = Path(__file__).resolve().parents[1]


def pct(xs: list[float], q: int) -> float:
    """The ``q``-th percentile of ``xs`` (inclusive method; 0.0 for no values)."""
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] if len(xs) > 1 else (xs[0] if xs else 0.0)


def run_threads(threads: list[threading.Thread]) -> float:
    """Start ``threads``, wait for them all; the wall seconds that took."""
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return time.perf_counter() - t0


def start_upstream(sessions: dict[str, list[dict]], llm_s: float) -> ThreadingHTTPServer:
    """The fake upstream: ``POST /v1/chat/completions`` answers after ``llm_s`` with the assistant
    message named by the request's ``X-Bench-Reply: <session>|<index>`` header."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence the access log
            pass

        def setup(self) -> None:
            super().setup()  # headers and body are two writes: without this, Nagle + delayed ACK add 40 ms
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            t0 = time.perf_counter()
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
            sid, idx = self.headers.get("x-bench-reply", "|0").split("|")
            msg = sessions[sid][int(idx)]
            time.sleep(llm_s)
            out = json.dumps({"id": "chatcmpl-bench", "object": "chat.completion", "model": body.get("model"),
                              "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}]}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(out)))
            self.send_header("x-bench-upstream-ms", f"{(time.perf_counter() - t0) * 1000:.3f}")
            self.end_headers()
            self.wfile.write(out)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def start_proxy(upstream: str, budget: int, model: str, store: list[str]) -> tuple[subprocess.Popen, str]:
    """``ctxscore serve`` in a process of its own; returns it and its base URL once it answers."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ctxscore.cli", "serve", "--upstream", upstream, "--budget",
                             str(budget), "--port", str(port), "--model", model, "--max-sessions", "10000", *store],
                            cwd=REPO, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        try:
            urllib.request.urlopen(base + "/healthz", timeout=2).read()
            return proc, base
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the proxy did not start: {proc.stderr.read() if proc.stderr else ''}") from None
            time.sleep(0.2)


def play(k: int, sid: str, messages: list[dict], bases: list[str], rows: list[dict[str, Any]],
         errors: list[str], start_s: float = 0.0, sticky: bool = False) -> None:
    """One agent session: the history before each assistant message, round robin over ``bases``
    (``sticky``: always ``bases[k % len(bases)]``), the first request ``start_s`` seconds after the call."""
    import httpx

    time.sleep(start_s)
    parts = [json.dumps(m, ensure_ascii=False) for m in messages]
    ends = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    clients = [httpx.Client(base_url=b, timeout=120) for b in bases]
    try:
        for j, end in enumerate(ends):
            body = ('{"model": "bench", "messages": [' + ", ".join(parts[:end]) + "]}").encode()
            headers = {"content-type": "application/json", "x-session-id": sid, "x-bench-reply": f"{sid}|{end}"}
            t0 = time.perf_counter()
            try:
                r = clients[(k if sticky else j + k) % len(clients)].post("/v1/chat/completions", content=body, headers=headers)
            except Exception as exc:  # noqa: BLE001 - counted and reported
                errors.append(f"{sid}#{j}: {exc!r}")
                continue
            rtt = (time.perf_counter() - t0) * 1000
            if r.status_code != 200:
                errors.append(f"{sid}#{j}: HTTP {r.status_code} {r.text[:200]}")
                continue
            up = float(r.headers.get("x-bench-upstream-ms", "nan"))
            rows.append({"rtt_ms": rtt, "proxy_ms": float(r.headers.get("x-ctxscore-proxy-ms", "nan")),
                         "added_ms": rtt - up, "kb": len(body) / 1024})
    finally:
        for c in clients:
            c.close()


def phase(name: str, sessions: dict[str, list[dict]], upstream: str, args: Any, store: list[str],
          workers: int) -> dict[str, Any]:
    """One phase: start ``workers`` proxies, play every session at once, stop them; the figures."""
    procs = [start_proxy(upstream, args.budget, args.model_arg, store) for _ in range(workers)]
    bases = [b for _, b in procs]
    rows: list[list[dict[str, Any]]] = [[] for _ in sessions]
    errors: list[str] = []
    # independent agents: the sessions' first requests spread evenly over one model time (started at
    # the same instant they would stay in step, 16 requests arriving together every turn)
    threads = [threading.Thread(target=play, args=(k, sid, msgs, bases, rows[k], errors,
                                                   k * args.llm_ms / 1000 / len(sessions),
                                                   args.routing == "sticky"))
               for k, (sid, msgs) in enumerate(sessions.items())]
    cpu0 = [cpu_seconds(p.pid) for p, _ in procs]
    load0 = os.getloadavg()[0]
    wall = run_threads(threads)
    cpu = sum(cpu_seconds(p.pid) - c for (p, _), c in zip(procs, cpu0, strict=True))
    managers: dict[str, int] = {}
    for b in bases:
        shared = json.loads(urllib.request.urlopen(b + "/v1/ctxscore/stats", timeout=30).read()).get("shared") or {}
        for key, v in shared.items():
            managers[key] = managers.get(key, 0) + v
    for p, _ in procs:
        p.terminate()
        p.wait(timeout=30)
    flat = [r for rs in rows for r in rs]
    return {"phase": name, "proxies": workers, "requests": len(flat), "errors": len(errors),
            "first_errors": errors[:3], "wall_s": round(wall, 1), "rps": round(len(flat) / wall, 1),
            "proxy_ms": {f"p{q}": round(pct([r["proxy_ms"] for r in flat], q), 2) for q in (50, 95, 99)},
            "added_ms": {f"p{q}": round(pct([r["added_ms"] for r in flat], q), 2) for q in (50, 95, 99)},
            "rtt_ms": {f"p{q}": round(pct([r["rtt_ms"] for r in flat], q), 1) for q in (50, 95)},
            "proxy_cpu_ms_per_request": round(cpu / max(1, len(flat)) * 1000, 2),
            "request_kb_p50": round(pct([r["kb"] for r in flat], 50), 1),
            "managers": managers, "load_average": [round(load0, 2), round(os.getloadavg()[0], 2)]}


def run_proxy(args: Any, sessions: dict[str, list[dict]], pg_url: str | None) -> dict[str, Any]:
    """Both phases (``memory``, then ``postgres+redis`` when ``pg_url``) over one fake upstream."""
    if args.scorer == "learned":
        from ctxscore.scoring.package import DEFAULT_MODEL_DIR

        args.model_arg = str(DEFAULT_MODEL_DIR)
    else:
        args.model_arg = "rules"
    server = start_upstream(sessions, args.llm_ms / 1000)
    upstream = f"http://127.0.0.1:{server.server_address[1]}/v1"
    out: dict[str, Any] = {"mode": "proxy", "scorer": args.scorer, "sessions": len(sessions), "turns": args.turns,
                           "llm_ms": args.llm_ms, "budget": args.budget, "routing": args.routing, "cores": os.cpu_count(),
                           "phases": []}
    try:
        out["phases"].append(phase("memory", sessions, upstream, args, [], 1))
        print(json.dumps(out["phases"][-1]), file=sys.stderr, flush=True)  # each phase as soon as it ends
        if pg_url:
            out["phases"].append(phase("postgres+redis", sessions, upstream, args,
                                       ["--store", pg_url, "--redis", args.redis], args.workers))
    finally:
        server.shutdown()
    return out
