"""``ctxscore serve``: the proxy from the command line, with and without the LLM compressor."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from fake_openai import FakeOpenAI, echo  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(*args: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ctxscore.cli", "serve", *args, "--port", str(port)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(url + "/healthz").status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"ctxscore serve did not start: {proc.communicate()}")
        time.sleep(0.1)


def test_serve_with_the_llm_compressor():
    from ctxscore.compress import key_spans
    from ctxscore.llm.prompts import COMPRESSOR_RULES

    def responder(body):
        if body["messages"][0]["content"].startswith(COMPRESSOR_RULES):
            items = json.loads(body["messages"][1]["content"])["items"]
            return json.dumps({"items": [{"id": it["id"], "form": "; ".join(key_spans(it["text"]))} for it in items]})
        return echo(body) + " The booking reference is BK-4471 for flight HAT136, departing 09:40 on May 20, fare $212.50."

    with FakeOpenAI(responder) as f:
        proc, url = _serve("--upstream", f.url, "--budget", "2000", "--model", "rules", "--llm-model", "summarizer",
                           "--summary-every", "2", "--summary-timing", "deferred", "--recent-turns", "2")
        try:
            c = openai.OpenAI(base_url=url + "/v1", api_key="sk-x", default_headers={"X-Session-Id": "cli"})
            msgs = [{"role": "system", "content": "You are a travel agent."}]
            for i in range(8):
                msgs.append({"role": "user", "content": f"ok, thanks for leg {i}"})
                r = c.chat.completions.create(model="agent", messages=msgs)
                msgs.append({"role": "assistant", "content": r.choices[0].message.content})
            deadline = time.monotonic() + 20
            while not any(r["model"] == "summarizer" for r in f.chat_requests()) and time.monotonic() < deadline:
                time.sleep(0.1)
            stats = httpx.get(url + "/v1/ctxscore/stats/cli").json()
            # a second session gets its own summary layer (one shared layer refused every session after the first)
            other = openai.OpenAI(base_url=url + "/v1", api_key="sk-x", default_headers={"X-Session-Id": "cli-2"})
            other.chat.completions.create(model="agent", messages=[{"role": "user", "content": "hello"}])
        finally:
            proc.terminate()
            proc.wait(timeout=20)
        models = [r["model"] for r in f.chat_requests()]
    assert models.count("agent") == 9 and "summarizer" in models  # the batches went to --llm-base-url (the upstream)
    assert stats["requests"] == 8 and stats["sync_modes"] == {"append": 8}


def _summarizing(wait_for=None):
    """A responder: the compressor's batches get key-span forms (after ``wait_for`` is set, when
    given); the agent's requests an answer worth summarising."""
    from ctxscore.compress import key_spans
    from ctxscore.llm.prompts import COMPRESSOR_RULES

    def responder(body):
        if body["messages"][0]["content"].startswith(COMPRESSOR_RULES):
            if wait_for is not None:
                wait_for.wait(120)
            items = json.loads(body["messages"][1]["content"])["items"]
            return json.dumps({"items": [{"id": it["id"], "form": "; ".join(key_spans(it["text"]))} for it in items]})
        return echo(body) + " The booking reference is BK-4471 for flight HAT136, departing 09:40 on May 20, fare $212.50."

    return responder


def _until_summarizing(f: FakeOpenAI, url: str, turns: int = 4) -> None:
    """Chat through the proxy at ``url`` until a summary batch reaches the fake ``f``."""
    c = openai.OpenAI(base_url=url + "/v1", api_key="sk-client", default_headers={"X-Session-Id": "s"})
    msgs = [{"role": "system", "content": "You are a travel agent."}]
    for i in range(turns):
        msgs.append({"role": "user", "content": f"ok, thanks for leg {i}"})
        r = c.chat.completions.create(model="agent", messages=msgs)
        msgs.append({"role": "assistant", "content": r.choices[0].message.content})
    deadline = time.monotonic() + 20
    while not any(r["model"] == "summarizer" for r in f.chat_requests()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert any(r["model"] == "summarizer" for r in f.chat_requests())


def test_serve_stops_at_once_while_a_summary_batch_waits_on_the_llm():
    # Ctrl-C while a batch waited on a stalled LLM: the process waited for it (60 s timeout, 3 retries):
    # about 4 minutes before it exited
    gate = threading.Event()
    with FakeOpenAI(_summarizing(gate)) as f:
        proc, url = _serve("--upstream", f.url, "--budget", "2000", "--model", "rules", "--llm-model", "summarizer",
                           "--summary-every", "1")
        try:
            _until_summarizing(f, url)
            t0 = time.monotonic()
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=30)
            took = time.monotonic() - t0
        finally:
            proc.kill()
            gate.set()
            err = proc.communicate()[1]
    assert proc.returncode == 0 and took < 10, (took, err[-2000:])


def test_serve_sends_its_upstream_key_to_the_llm_on_the_upstream(monkeypatch):
    # --upstream-key-env with --llm-model and no --llm-base-url: the summaries went to the upstream
    # with "Bearer not-needed" (a real upstream answers 401 to every batch), the chat with the key
    for name in ("CTXSCORE_LLM_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CTXSCORE_TEST_UPSTREAM_KEY", "sk-proxy-own")
    with FakeOpenAI(_summarizing()) as f:
        proc, url = _serve("--upstream", f.url, "--budget", "2000", "--model", "rules", "--llm-model", "summarizer",
                           "--summary-every", "1", "--upstream-key-env", "CTXSCORE_TEST_UPSTREAM_KEY")
        try:
            _until_summarizing(f, url)
        finally:
            proc.terminate()
            proc.wait(timeout=20)
        auth = {(r["body"]["model"], r["headers"].get("authorization")) for r in f.requests
                if r["path"].endswith("/chat/completions")}
    assert auth == {("agent", "Bearer sk-proxy-own"), ("summarizer", "Bearer sk-proxy-own")}


def test_serve_cli_refuses_bad_options():
    r = subprocess.run([sys.executable, "-m", "ctxscore.cli", "serve", "--upstream", "http://127.0.0.1:9/v1",
                        "--budget", "1000", "--query-writer"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 2 and "--query-writer needs --llm-model" in r.stderr
    r = subprocess.run([sys.executable, "-m", "ctxscore.cli", "serve", "--upstream", "ftp://x", "--budget", "1000"],
                       cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 2 and "upstream must be an http(s) URL" in r.stderr
    r = subprocess.run([sys.executable, "-m", "ctxscore.cli", "serve", "--upstream", "http://x/v1", "--budget", "0"],
                       cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 2 and "budget must be positive" in r.stderr


@pytest.fixture
def served(monkeypatch):
    """``ctxscore serve``'s apps, uvicorn's ``run`` replaced; the collector's frozen objects given
    back afterwards (the command freezes the process's heap)."""
    import gc

    import ctxscore.serve

    apps: list = []
    monkeypatch.setattr(ctxscore.serve, "run", lambda app, **kw: apps.append(app))
    gc.unfreeze()
    yield apps
    gc.unfreeze()


@pytest.mark.parametrize(("flags", "in_order"), [
    ((), True),  # in memory, the rule scorer: local CPU work
    (("--in-order", "off"), False),
    (("--llm-model", "summarizer"), False),  # an LLM compressor waits on a network
    (("--llm-model", "summarizer", "--in-order", "on"), True),
])
def test_serve_in_order_flag(served, flags, in_order):
    from ctxscore.cli import main

    assert main(["serve", "--upstream", "http://127.0.0.1:9/v1", "--budget", "1000", "--model", "rules", *flags]) == 0
    assert served[0].state.proxy.in_order is in_order


def test_serve_moves_its_warmed_up_heap_out_of_the_collector(served):
    import gc

    from ctxscore.cli import main

    assert gc.get_freeze_count() == 0
    assert main(["serve", "--upstream", "http://127.0.0.1:9/v1", "--budget", "1000", "--model", "rules"]) == 0
    assert len(served) == 1 and gc.get_freeze_count() > 10_000  # modules, tokenizers, the app
