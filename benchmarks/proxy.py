"""Benchmark of the proxy: its own milliseconds per request on a long conversation, and the tokens
it received vs forwarded.

Three processes on loopback: a fake OpenAI-compatible upstream (``tests/fake_openai.py``, echo
answers), ``ctxscore serve`` and this client (the official ``openai`` package), which plays a
conversation of ``--turns`` user turns (every other one streamed; a tool call and its result every
fourth turn) resending the whole history each time. The proxy's own time per request (parse, sync,
build, forward, record; the upstream's time excluded) and the token totals come from its stats
endpoint; its CPU time per request (from ``/proc``) does not grow when other jobs share the machine.

Usage: ``python benchmarks/proxy.py [--turns 300] [--budget 3000] [--model rules|auto]``
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux ``/proc``), seconds; NaN elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def user_turn(i: int) -> str:
    if i % 10 == 1:
        return f"Please plan leg #{i} to Seattle; it must arrive before 6pm."
    if i % 3 == 0:
        return f"Thanks, that works for leg #{i}."
    return f"My frequent flyer number for leg #{i} is FF-{i:06d} and I prefer an aisle seat."


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--turns", type=int, default=300)
    p.add_argument("--budget", type=int, default=3000)
    p.add_argument("--model", default="rules")
    args = p.parse_args()
    import openai  # noqa: PLC0415

    up = subprocess.Popen([sys.executable, str(REPO / "tests" / "fake_openai.py")], stdout=subprocess.PIPE, text=True)
    upstream = up.stdout.readline().strip()
    port = free_port()
    proxy = subprocess.Popen([sys.executable, "-m", "ctxscore.cli", "serve", "--upstream", upstream, "--budget",
                              str(args.budget), "--port", str(port), "--model", args.model], cwd=REPO,
                             stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_up(base + "/healthz")
        client = openai.OpenAI(base_url=base + "/v1", api_key="sk-bench", default_headers={"X-Session-Id": "bench"})
        msgs: list = [{"role": "system", "content": "You are a travel agent. Never book without explicit confirmation."}]
        t0 = time.perf_counter()
        cpu0 = cpu_seconds(proxy.pid)
        for i in range(1, args.turns + 1):
            msgs.append({"role": "user", "content": user_turn(i)})
            if i % 2:
                r = client.chat.completions.create(model="bench", messages=msgs)
                msgs.append({"role": "assistant", "content": r.choices[0].message.content})
            else:
                text = "".join(c.choices[0].delta.content or "" for c in
                               client.chat.completions.create(model="bench", messages=msgs, stream=True) if c.choices)
                msgs.append({"role": "assistant", "content": text})
            if i % 4 == 0:  # a tool call and its result
                msgs.append({"role": "assistant", "content": "", "tool_calls": [{"id": f"c{i}", "type": "function",
                             "function": {"name": "search_flights", "arguments": json.dumps({"leg": i})}}]})
                msgs.append({"role": "tool", "tool_call_id": f"c{i}",
                             "content": json.dumps({"flight": f"HAT{i}", "depart": "09:40", "fare": "212.50"})})
        wall = time.perf_counter() - t0
        cpu = cpu_seconds(proxy.pid) - cpu0
        s = json.loads(urllib.request.urlopen(base + "/v1/ctxscore/stats/bench").read())
    finally:
        proxy.terminate()
        up.terminate()
        proxy.wait()
        up.wait()
    o = s["overhead_ms"]
    print(f"{args.turns} turns, {s['requests']} requests, {s['messages']} messages, budget {args.budget}, scorer {args.model}")
    print(f"proxy time per request: p50 {o['p50']:.2f} ms, p95 {o['p95']:.2f} ms, max {o['max']:.2f} ms")
    print(f"proxy CPU per request: {cpu / s['requests'] * 1000:.2f} ms (user + system, all its threads)")
    print(f"tokens received {s['tokens_received']:,} vs forwarded {s['tokens_forwarded']:,} "
          f"({s['forwarded_share']:.1%}); last request {s['last_received']:,} -> {s['last_forwarded']:,}")
    print(f"end to end: {wall / s['requests'] * 1000:.1f} ms per request (client, proxy and fake upstream)")


if __name__ == "__main__":
    main()
