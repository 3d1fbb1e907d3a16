"""The OpenAI-compatible client against a fake server on loopback: retries, backoff, timeouts,
malformed bodies, streaming, the concurrency limit and token accounting."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("openai")

from fake_openai import FakeOpenAI, echo  # noqa: E402

from ctxscore.errors import ConfigError  # noqa: E402
from ctxscore.llm import LLMClient, LLMError, LLMResponseError  # noqa: E402

HI = [{"role": "user", "content": "hi there"}]


@pytest.fixture
def fake():
    with FakeOpenAI() as f:
        yield f


def client(fake: FakeOpenAI, **kw) -> LLMClient:
    kw.setdefault("backoff", 0.01)
    kw.setdefault("timeout", 5.0)
    return LLMClient(base_url=fake.url, model="fake-model", api_key="sk-test", **kw)


def test_completion_text_usage_and_request(fake):
    c = client(fake, temperature=0.0)
    out = c.complete(HI, max_tokens=50)
    assert out.text == "echo: hi there" and out.attempts == 1 and not out.estimated
    assert out.prompt_tokens > 0 and out.completion_tokens > 0
    body = fake.chat_requests()[-1]
    assert body["model"] == "fake-model" and body["messages"] == HI and body["max_tokens"] == 50
    assert body["temperature"] == 0.0
    assert fake.requests[-1]["headers"]["authorization"] == "Bearer sk-test"
    u = c.usage
    assert (u.requests, u.attempts, u.retries, u.failures) == (1, 1, 0, 0)
    assert u.prompt_tokens == out.prompt_tokens and u.completion_tokens == out.completion_tokens


def test_429_and_500_are_retried_with_backoff_and_retry_after(fake):
    c = client(fake, max_retries=3)
    fake.push({"status": 429, "headers": {"Retry-After": "0.3"}}, {"status": 500}, {"status": 503})
    t0 = time.perf_counter()
    out = c.complete(HI)
    took = time.perf_counter() - t0
    assert out.text == "echo: hi there" and out.attempts == 4
    assert took >= 0.3  # Retry-After was honoured
    u = c.usage
    assert (u.attempts, u.retries, u.failures) == (4, 3, 0)
    assert u.by_status == {"429": 1, "500": 1, "503": 1}
    assert len(fake.chat_requests()) == 4


def test_retries_exhausted_raise_with_the_last_status(fake):
    c = client(fake, max_retries=2)
    fake.push({"status": 500}, {"status": 502}, {"status": 500, "message": "still down"})
    with pytest.raises(LLMError, match="500: still down; gave up after 3 attempts") as info:
        c.complete(HI)
    assert info.value.status == 500 and info.value.attempts == 3
    assert c.usage.failures == 1 and len(fake.chat_requests()) == 3


def test_client_errors_are_not_retried(fake):
    c = client(fake, max_retries=3)
    fake.push({"status": 400, "message": "bad model"})
    with pytest.raises(LLMError, match="400: bad model") as info:
        c.complete(HI)
    assert info.value.attempts == 1 and len(fake.chat_requests()) == 1


def test_timeout_is_retried_then_fails(fake):
    c = client(fake, timeout=0.3, max_retries=1)
    fake.push({"delay": 1.0})
    assert c.complete(HI).attempts == 2  # the first attempt timed out
    fake.push({"delay": 1.0}, {"delay": 1.0})
    with pytest.raises(LLMError, match="did not answer within 0.3 s") as info:
        c.complete(HI)
    assert info.value.status is None and c.usage.by_status["timeout"] == 3


def test_dropped_connection_is_retried(fake):
    c = client(fake, max_retries=2)
    fake.push({"close": True})
    assert c.complete(HI).text == "echo: hi there"
    assert c.usage.by_status == {"connection": 1}


def test_malformed_body_is_retried_then_raises(fake):
    c = client(fake, max_retries=1)
    fake.push({"raw": b"{not json"})
    assert c.complete(HI).attempts == 2
    fake.push({"raw": b"{not json"}, {"raw": b'{"id": "x", "object": "chat.completion"}'})  # no choices
    with pytest.raises(LLMResponseError, match="malformed completion"):
        c.complete(HI)
    assert c.usage.by_status == {"malformed": 3}


def test_streaming_accumulates_content_tool_calls_and_usage(fake):
    c = client(fake)
    fake.push({"reply": {"content": "Looking up the order now.", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_order", "arguments": '{"order_id": "ORD-991"}'}}]}})
    out = c.complete(HI, stream=True)
    assert out.text == "Looking up the order now."
    assert out.tool_calls == ({"id": "call_1", "type": "function",
                               "function": {"name": "get_order", "arguments": '{"order_id": "ORD-991"}'}},)
    assert out.finish_reason == "tool_calls" and not out.estimated and out.prompt_tokens > 0
    body = fake.chat_requests()[-1]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_a_stream_request_answered_without_a_stream_is_retried_then_raises(fake):
    # an endpoint that ignores "stream": true and sends a JSON body (or an HTML error page) with 200:
    # complete(stream=True) returned an empty completion as if the model had answered ""
    c = client(fake, max_retries=1)
    whole = {"id": "x", "object": "chat.completion", "created": 1, "model": "fake-model",
             "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}]}
    fake.push({"raw": json.dumps(whole).encode()})
    assert c.complete(HI, stream=True).attempts == 2  # retried, then the real stream
    fake.push({"raw": json.dumps(whole).encode()}, {"raw": b"<html>bad gateway</html>"})
    with pytest.raises(LLMResponseError, match="malformed completion"):
        c.complete(HI, stream=True)
    assert c.usage.by_status == {"malformed": 3} and c.usage.requests == 1


def test_tokens_are_estimated_when_the_endpoint_reports_no_usage():
    with FakeOpenAI(usage=False) as f:
        c = client(f)
        out = c.complete(HI)
        s = c.complete(HI, stream=True)
    assert out.estimated and s.estimated
    assert out.prompt_tokens == c.counter.count_message(__import__("ctxscore").Message.from_dict(HI[0])) + 3
    assert out.completion_tokens == c.counter.count("echo: hi there")
    assert c.usage.estimated == 2


def test_concurrency_limit_holds_across_threads():
    active = peak = 0
    lock = threading.Lock()

    def slow(body):
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        time.sleep(0.15)
        with lock:
            active -= 1
        return echo(body)

    with FakeOpenAI(slow) as f:
        c = client(f, max_concurrency=2)
        threads = [threading.Thread(target=c.complete, args=(HI,)) for _ in range(6)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        took = time.perf_counter() - t0
    assert peak == 2 and c.usage.requests == 6
    assert took >= 3 * 0.15  # 6 requests, 2 at a time


def test_settings_from_the_environment(fake, monkeypatch):
    monkeypatch.setenv("CTXSCORE_LLM_BASE_URL", fake.url)
    monkeypatch.setenv("CTXSCORE_LLM_MODEL", "env-model")
    monkeypatch.setenv("CTXSCORE_LLM_API_KEY", "sk-env")
    c = LLMClient()
    assert c.complete(HI).text == "echo: hi there"
    assert fake.chat_requests()[-1]["model"] == "env-model"
    assert fake.requests[-1]["headers"]["authorization"] == "Bearer sk-env"


def test_bad_settings_are_refused(monkeypatch):
    monkeypatch.delenv("CTXSCORE_LLM_MODEL", raising=False)
    with pytest.raises(ConfigError, match="needs a model"):
        LLMClient(base_url="http://127.0.0.1:9/v1")
    for kw in ({"timeout": 0}, {"max_retries": -1}, {"max_concurrency": 0}, {"backoff": "1"}):
        with pytest.raises(ConfigError):
            LLMClient(base_url="http://127.0.0.1:9/v1", model="m", **kw)


def test_import_without_openai_names_the_extra():
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'openai': raise ImportError('blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import ctxscore\n"
        "try:\n"
        "    import ctxscore.llm\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "pip install 'ctxscore[llm]'" in out and "'openai'" in out
