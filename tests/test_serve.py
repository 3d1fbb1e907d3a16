"""The OpenAI-compatible proxy, end to end: the official ``openai`` client -> the proxy (uvicorn on
loopback) -> a fake upstream. A 300-turn conversation within the budget at the upstream, streaming
passed through unchanged, sessions kept apart, errors passed through with their status."""

from __future__ import annotations

import json
import re
import socket
import threading
import time

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from fake_openai import FakeOpenAI, last_user_text  # noqa: E402

from ctxscore import Message, TokenCounter  # noqa: E402
from ctxscore.serve import Background, create_app, derive_session_id  # noqa: E402

SYSTEM = "You are a travel agent. Never book without the traveller's explicit confirmation."
COUNTER = TokenCounter()


def window_tokens(messages: list[dict]) -> int:
    """Tokens of a forwarded message list, counted as ctxscore counts a window (reply priming included)."""
    return sum(COUNTER.count_message(Message.from_dict(m)) for m in messages) + 3


def tool_pairs_intact(messages: list[dict]) -> bool:
    """Every tool result follows the assistant message that made its call, and every call has its results."""
    open_calls: set[str] = set()
    for m in messages:
        if m["role"] == "tool":
            if m["tool_call_id"] not in open_calls:
                return False
            open_calls.discard(m["tool_call_id"])
        else:
            if open_calls:
                return False  # a call left without its result
            open_calls = {c["id"] for c in m.get("tool_calls") or ()}
    return not open_calls


def agent(body: dict) -> dict:
    """The fake upstream model: a tool call on every fourth turn, an answer with facts otherwise."""
    last = body["messages"][-1]
    found = re.search(r"#(\d+)", last_user_text(body))
    n = found.group(1) if found else "0"
    if last["role"] == "tool":
        return {"content": f"Leg #{n} is on flight HAT{n} departing 09:40; fare $212.50, refundable until May 3."}
    if last["role"] == "user" and int(n) % 4 == 0:
        return {"content": None, "tool_calls": [{"id": f"call_{n}", "type": "function", "function": {
            "name": "search_flights", "arguments": json.dumps({"leg": int(n), "to": "SEA"})}}]}
    return {"content": f"Noted for leg #{n}: confirmation code CF-{int(n):05d}, seat 14A, total $318."}


def user_turn(i: int) -> str:
    if i % 10 == 1:
        return f"Please plan leg #{i} to Seattle; it must arrive before 6pm."
    if i % 3 == 0:
        return f"Thanks, that works for leg #{i}."
    return f"My frequent flyer number for leg #{i} is FF-{i:06d} and I prefer an aisle seat."


@pytest.fixture
def upstream():
    with FakeOpenAI(agent) as f:
        yield f


@pytest.fixture
def proxy(upstream):
    app = create_app(upstream.url, 3000, scorer="rules")
    with Background(app) as srv:
        srv.app = app
        yield srv


def client_for(srv, session: str | None = None, **kw) -> openai.OpenAI:
    headers = {"X-Session-Id": session} if session else None
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-client", max_retries=0, default_headers=headers, **kw)


def chat(client, messages, stream: bool, tool_result=None) -> None:
    """One user turn as an agent runs it: call the model, run the tool it asks for, call again."""
    while True:
        if stream:
            text, calls = "", {}
            for ch in client.chat.completions.create(model="gpt-test", messages=messages, stream=True):
                for c in ch.choices:
                    text += c.delta.content or ""
                    for tc in c.delta.tool_calls or ():
                        d = calls.setdefault(tc.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                        d["id"] = tc.id or d["id"]
                        d["function"]["name"] += tc.function.name or ""
                        d["function"]["arguments"] += tc.function.arguments or ""
            msg = {"role": "assistant", "content": text}
            if calls:
                msg["tool_calls"] = [calls[k] for k in sorted(calls)]
            messages.append(msg)
        else:
            r = client.chat.completions.create(model="gpt-test", messages=messages)
            messages.append(r.choices[0].message)  # the message object, as agents append it
            msg = r.choices[0].message.model_dump(exclude_none=True)
        if not msg.get("tool_calls"):
            return
        for c in msg["tool_calls"]:
            leg = json.loads(c["function"]["arguments"])["leg"]
            messages.append({"role": "tool", "tool_call_id": c["id"],
                             "content": json.dumps({"flights": [{"flight": f"HAT{leg}", "depart": "09:40", "fare": "212.50"}]})})


def stats(srv, session: str | None = None) -> dict:
    url = srv.url + "/v1/ctxscore/stats" + (f"/{session}" if session else "")
    return httpx.get(url).json()


def test_a_300_turn_conversation_stays_within_the_budget_at_the_upstream(proxy, upstream):
    c = client_for(proxy, "trip-1")
    messages: list = [{"role": "system", "content": SYSTEM}]
    for i in range(1, 301):
        messages.append({"role": "user", "content": user_turn(i)})
        chat(c, messages, stream=i % 2 == 0)
    reqs = upstream.chat_requests()
    assert len(reqs) == 300 + 75  # a second call after each of the 75 tool calls
    sizes = [window_tokens(r["messages"]) for r in reqs]
    assert max(sizes) <= 3000, max(sizes)
    assert all(tool_pairs_intact(r["messages"]) for r in reqs)
    assert all(r["messages"][0] == {"role": "system", "content": SYSTEM} for r in reqs)
    # the newest message is always sent: turn 300 called a tool, so its first call ends with the user's
    # message and its second with the tool's result
    assert reqs[-2]["messages"][-1] == {"role": "user", "content": user_turn(300)}
    assert reqs[-1]["messages"][-1]["role"] == "tool" and reqs[-1]["messages"][-1]["tool_call_id"] == "call_300"
    assert all(r["model"] == "gpt-test" for r in reqs)
    s = stats(proxy, "trip-1")
    assert s["requests"] == 375 and s["messages"] == len([m for m in messages]) and s["replies_recorded"] == 375
    assert s["sync_modes"] == {"append": 375}  # the recorded replies matched what the client resent
    assert s["tokens_forwarded"] < 0.5 * s["tokens_received"]
    assert s["last_received"] > 6 * 3000 and s["last_forwarded"] <= 3000
    assert s["overhead_ms"]["n"] == 375 and s["overhead_ms"]["p50"] > 0
    print("proxy 300 turns:", json.dumps({k: s[k] for k in ("tokens_received", "tokens_forwarded", "forwarded_share",
                                                            "overhead_ms")}))


def test_streaming_is_passed_through_unchanged_and_the_reply_recorded(proxy, upstream):
    script = {"reply": {"content": "Checking flights to Seattle for you now.", "tool_calls": [
        {"id": "call_9", "type": "function", "function": {"name": "search_flights", "arguments": '{"to": "SEA", "day": "May 20"}'}}]}}
    body = {"model": "gpt-test", "stream": True, "messages": [{"role": "system", "content": SYSTEM},
                                                              {"role": "user", "content": "Find me a flight to SEA."}]}
    upstream.push(script)
    direct = httpx.post(upstream.url + "/chat/completions", json=body).content
    upstream.push(script)
    with httpx.stream("POST", proxy.url + "/v1/chat/completions", json=body, headers={"X-Session-Id": "s1"}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-ctxscore-session"] == "s1"
        pieces = list(r.iter_bytes())
    assert b"".join(pieces) == direct  # byte for byte what the upstream sent
    assert len(pieces) > 3  # streamed, not buffered into one piece
    # the reply (content and the accumulated tool call) was recorded: the client's resend is an append
    call = {"id": "call_9", "type": "function", "function": {"name": "search_flights", "arguments": '{"to": "SEA", "day": "May 20"}'}}
    follow = body["messages"] + [{"role": "assistant", "content": "Checking flights to Seattle for you now.", "tool_calls": [call]},
                                 {"role": "tool", "tool_call_id": "call_9", "content": "[HAT136 09:40]"}]
    r2 = httpx.post(proxy.url + "/v1/chat/completions", json={"model": "gpt-test", "messages": follow},
                    headers={"X-Session-Id": "s1"})
    assert r2.status_code == 200
    s = stats(proxy, "s1")
    assert s["sync_modes"] == {"append": 2} and s["replies_recorded"] == 2 and s["messages"] == 5
    sent = upstream.chat_requests()[-1]["messages"]
    assert sent[2] == {"role": "assistant", "content": "Checking flights to Seattle for you now.", "tool_calls": [call]}


def test_streaming_with_the_openai_client_and_usage(proxy, upstream):
    c = client_for(proxy, "s2")
    chunks = list(c.chat.completions.create(model="gpt-test", stream=True, stream_options={"include_usage": True},
                                            messages=[{"role": "user", "content": "Hello #5 there"}]))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == "Noted for leg #5: confirmation code CF-00005, seat 14A, total $318."
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens > 0
    assert upstream.chat_requests()[-1]["stream_options"] == {"include_usage": True}  # the client's parameters


def test_two_sessions_run_at_once_and_never_see_each_other(proxy, upstream):
    errors: list[BaseException] = []

    def run(name: str) -> None:
        try:
            c = client_for(proxy, name)
            messages = [{"role": "system", "content": f"{SYSTEM} Traveller: {name}."}]
            for i in range(1, 41):
                messages.append({"role": "user", "content": f"[{name}] " + user_turn(i)})
                chat(c, messages, stream=i % 2 == 1)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in ("alice", "bob")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    reqs = upstream.chat_requests()
    assert len(reqs) == 2 * (40 + 10)
    for r in reqs:
        blob = json.dumps(r["messages"])
        assert ("alice" in blob) != ("bob" in blob), blob[:300]  # one traveller per request, never both
    for name in ("alice", "bob"):
        s = stats(proxy, name)
        assert s["requests"] == 50 and s["sync_modes"] == {"append": 50}
    assert set(stats(proxy)["sessions"]) == {"alice", "bob"}


def test_sessions_without_a_header_are_derived_from_the_first_messages(proxy):
    c = client_for(proxy)
    a = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "I am Carol. Trip #1 please."}]
    b = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "I am Dave. Trip #1 please."}]
    c.chat.completions.create(model="m", messages=a)
    c.chat.completions.create(model="m", messages=b)
    r = c.chat.completions.with_raw_response.create(model="m", messages=a + [
        {"role": "assistant", "content": "Noted for leg #1: confirmation code CF-00001, seat 14A, total $318."},
        {"role": "user", "content": "And trip #2?"}])
    assert r.headers["x-ctxscore-session"] == derive_session_id(a)
    sessions = stats(proxy)["sessions"]
    assert set(sessions) == {derive_session_id(a), derive_session_id(b)}
    assert sessions[derive_session_id(a)]["requests"] == 2 and sessions[derive_session_id(a)]["messages"] == 5


@pytest.mark.parametrize("stream", [False, True])
def test_upstream_errors_pass_through_with_their_status(proxy, upstream, stream):
    c = client_for(proxy, f"err-{stream}")
    msgs = [{"role": "user", "content": "Hello #2"}]
    upstream.push({"status": 429, "message": "slow down", "headers": {"Retry-After": "7"}})
    with pytest.raises(openai.RateLimitError) as info:
        list(c.chat.completions.create(model="m", messages=msgs, stream=True)) if stream else \
            c.chat.completions.create(model="m", messages=msgs)
    assert info.value.status_code == 429 and "slow down" in str(info.value)
    assert info.value.response.headers["retry-after"] == "7"
    upstream.push({"status": 500, "message": "upstream broke"})
    with pytest.raises(openai.InternalServerError, match="upstream broke"):
        c.chat.completions.create(model="m", messages=msgs)
    r = c.chat.completions.create(model="m", messages=msgs)  # the session goes on
    assert r.choices[0].message.content.startswith("Noted for leg #2")
    s = stats(proxy, f"err-{stream}")
    assert s["upstream_errors"] == 2 and s["replies_recorded"] == 1 and s["messages"] == 2


def test_repeated_headers_bodiless_requests_and_a_stream_that_breaks_off(proxy, upstream):
    """Every value of a repeated upstream header reaches the client (two Set-Cookie); a bodiless
    passthrough request goes upstream without a body or a Content-Type; a stream the upstream
    breaks off ends with an error event (the OpenAI client raises it), is counted as an upstream
    error, and the session goes on."""
    upstream.push({"status": 429, "headers": [("Set-Cookie", "a=1; Path=/"), ("Set-Cookie", "b=2; Path=/")]})
    body = {"model": "m", "messages": [{"role": "user", "content": "Hello #2"}]}
    r = httpx.post(proxy.url + "/v1/chat/completions", json=body, headers={"X-Session-Id": "cut"})
    assert r.status_code == 429 and r.headers.get_list("set-cookie") == ["a=1; Path=/", "b=2; Path=/"]
    assert httpx.get(proxy.url + "/v1/models").status_code == 200
    sent = upstream.requests[-1]["headers"]
    assert "content-type" not in sent and sent.get("content-length", "0") == "0"
    upstream.push({"cut": True})
    with pytest.raises(openai.APIError, match="broke off"):  # an error event, not an answer that looks complete
        list(client_for(proxy, "cut").chat.completions.create(model="m", messages=body["messages"], stream=True))
    assert stats(proxy, "cut")["upstream_errors"] == 2  # the 429 and the stream cut short
    r = httpx.post(proxy.url + "/v1/chat/completions", json=body, headers={"X-Session-Id": "cut"})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"].startswith("Noted for leg #2")


def test_unreachable_and_slow_upstreams(upstream):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"  # nothing listens there
    with Background(create_app(dead, 1000, scorer="rules")) as srv:
        with pytest.raises(openai.APIStatusError) as info:
            client_for(srv, "x").chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert info.value.status_code == 502 and "unreachable" in str(info.value)
    with Background(create_app(upstream.url, 1000, scorer="rules", timeout=0.3)) as srv:
        upstream.push({"delay": 1.0})
        with pytest.raises(openai.APIStatusError) as info:
            client_for(srv, "y").chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert info.value.status_code == 504


def test_bad_requests_get_openai_style_errors(proxy, upstream):
    c = client_for(proxy, "bad")
    with pytest.raises(openai.BadRequestError, match="no earlier assistant message made that call"):
        c.chat.completions.create(model="m", messages=[{"role": "tool", "tool_call_id": "nope", "content": "x"}])
    r = httpx.post(proxy.url + "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(proxy.url + "/v1/chat/completions", json={"model": "m", "messages": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    r = httpx.post(proxy.url + "/v1/chat/completions", headers={"content-type": "application/json"},
                   content=b'{"model": "m", "temperature": NaN, "messages": [{"role": "user", "content": "hi"}]}')
    assert r.status_code == 400 and "NaN is not a JSON number" in r.json()["error"]["message"]  # never forwarded changed
    r = httpx.post(proxy.url + "/v1/chat/completions", headers={"content-type": "application/json"},
                   content=b'{"model": "m", "temperature": 1e400, "messages": [{"role": "user", "content": "hi"}]}')
    assert r.status_code == 400 and "1e400 is too large" in r.json()["error"]["message"]  # was forwarded as null
    assert upstream.chat_requests() == []  # nothing bad reached the upstream


def test_models_and_other_routes_pass_through(proxy, upstream):
    c = client_for(proxy)
    assert [m.id for m in c.models.list()] == ["fake-model"]
    r = httpx.get(proxy.url + "/v1/nowhere")
    assert r.status_code == 404 and "no route /v1/nowhere" in r.json()["error"]["message"]
    assert httpx.get(proxy.url + "/v1/ctxscore/stats/unknown").status_code == 404


def test_headers_are_forwarded_and_the_proxy_key_replaces_the_clients(upstream):
    with Background(create_app(upstream.url, 1000, scorer="rules")) as srv:
        client_for(srv, "h", default_query=None).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], extra_headers={"OpenAI-Organization": "org-1"})
    h = upstream.requests[-1]["headers"]
    assert h["authorization"] == "Bearer sk-client" and h["openai-organization"] == "org-1"
    assert "x-session-id" not in h
    with Background(create_app(upstream.url, 1000, scorer="rules", upstream_api_key="sk-proxy")) as srv:
        client_for(srv, "h").chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert upstream.requests[-1]["headers"]["authorization"] == "Bearer sk-proxy"


def test_trimmed_and_edited_histories_are_followed(proxy, upstream):
    c = client_for(proxy, "edit")
    msgs = [{"role": "system", "content": SYSTEM}]
    for i in range(1, 6):
        msgs.append({"role": "user", "content": f"Hello #{2 * i + 1}"})  # no tool call (not a multiple of 4)
        chat(c, msgs, stream=False)
    # the client trims its own copy (system + the last turn) and adds a message
    trimmed = [msgs[0], *msgs[-2:], {"role": "user", "content": "Hello #21"}]
    c.chat.completions.create(model="m", messages=trimmed)
    # the client edits its second turn
    edited = [msgs[0], msgs[1], msgs[2], {"role": "user", "content": "Hello #99, changed my mind"}]
    c.chat.completions.create(model="m", messages=edited)
    modes = stats(proxy, "edit")["sync_modes"]
    assert modes == {"append": 5, "trimmed": 1, "rebased": 1}
    assert upstream.chat_requests()[-1]["messages"][-1]["content"] == "Hello #99, changed my mind"
    assert "Hello #21" not in json.dumps(upstream.chat_requests()[-1]["messages"])


@pytest.mark.parametrize("stream", [False, True])
def test_empty_replies_and_refusals_are_recorded_and_the_conversation_goes_on(proxy, upstream, stream):
    # the model answers with an empty message, then refuses (content null, `refusal` set): the client
    # appends both replies as it got them and carries on; before, the next request was a 400
    c = client_for(proxy, f"empty-{stream}")
    msgs: list = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Say nothing."}]
    upstream.push({"reply": {"content": ""}})
    upstream.push({"reply": {"content": None, "refusal": "I can't help with that request."}})
    for ask in ("Now refuse, please.", "Fine. What's 2 + 2?"):
        if stream:
            text, refusal = "", ""
            for ch in c.chat.completions.create(model="m", messages=msgs, stream=True):
                for x in ch.choices:
                    text += x.delta.content or ""
                    refusal += x.delta.refusal or ""
            msgs.append({"role": "assistant", "content": text or None, **({"refusal": refusal} if refusal else {})})
        else:
            msgs.append(c.chat.completions.create(model="m", messages=msgs).choices[0].message)
        msgs.append({"role": "user", "content": ask})
    c.chat.completions.create(model="m", messages=msgs)
    s = stats(proxy, f"empty-{stream}")
    assert s["sync_modes"] == {"append": 3} and s["replies_recorded"] == 3 and s["messages"] == 7
    sent = upstream.chat_requests()[-1]["messages"]
    assert sent[2] == {"role": "assistant", "content": ""}
    assert sent[4] == {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't help with that request."}]}


def test_an_audio_reply_reference_reaches_the_upstream(proxy, upstream):
    """The next request after a model's audio reply sends its ``audio: {"id"}`` back (OpenAI continues
    the audio conversation from it): the proxy dropped the field (a new user's report)."""
    c = client_for(proxy, "audio")
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "audio": {"id": "audio_abc123"}},
            {"role": "user", "content": "again"}]
    reply = c.chat.completions.create(model="m", messages=msgs).choices[0].message
    assert upstream.chat_requests()[-1]["messages"][1] == {"role": "assistant", "content": "", "audio": {"id": "audio_abc123"}}
    c.chat.completions.create(model="m", messages=[*msgs, reply, {"role": "user", "content": "and now?"}])
    assert stats(proxy, "audio")["sync_modes"] == {"append": 2}  # the stored reference matches the resent one
    assert upstream.chat_requests()[-1]["messages"][1]["audio"] == {"id": "audio_abc123"}


def test_tool_definitions_count_against_the_budget(upstream):
    tools = [{"type": "function", "function": {"name": f"tool_{k}", "description": "does a thing " * 20,
                                               "parameters": {"type": "object", "properties": {}}}} for k in range(5)]
    with Background(create_app(upstream.url, 1500, scorer="rules")) as srv:
        c = client_for(srv, "tools")
        msgs = [{"role": "system", "content": SYSTEM}]
        for i in range(1, 40):
            msgs.append({"role": "user", "content": user_turn(i)})
            r = c.chat.completions.create(model="m", messages=msgs, tools=tools)
            msgs.append({"role": "assistant", "content": r.choices[0].message.content or "ok"})
    tools_tokens = COUNTER.count(json.dumps(tools, ensure_ascii=False, sort_keys=True))
    assert tools_tokens > 300
    for r in upstream.chat_requests():
        assert r["tools"] == tools
        assert window_tokens(r["messages"]) + tools_tokens <= 1500


def test_pinned_overflow_is_forwarded_with_a_warning_header(upstream):
    long_system = "Rules: " + " ".join(f"never do thing {k}." for k in range(200))
    with Background(create_app(upstream.url, 300, scorer="rules")) as srv:
        r = client_for(srv, "big").chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "system", "content": long_system}, {"role": "user", "content": "hi"}])
    assert r.headers["x-ctxscore-warnings"] == "pinned_over_budget"
    assert int(r.headers["x-ctxscore-tokens-forwarded"]) > 300  # never dropped silently
    assert upstream.chat_requests()[-1]["messages"][0]["content"] == long_system


def test_a_tool_result_larger_than_the_budget_is_forwarded_cut_to_fit(upstream):
    log = "\n".join(f"[{k:05d}] GET /api/orders/{k * 7919 % 100000} 200 {k % 89 + 4} ms" for k in range(8000))
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Why is /api/orders slow? Read the access log."},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_log", "type": "function",
                                                                   "function": {"name": "read_log", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_log", "content": log}]
    assert COUNTER.count(log) > 60000
    with Background(create_app(upstream.url, 4000, scorer="rules")) as srv:
        r = client_for(srv, "big-log").chat.completions.with_raw_response.create(model="m", messages=msgs)
    assert "last_message_fitted" in r.headers["x-ctxscore-warnings"].split(",")
    sent = upstream.chat_requests()[-1]["messages"]
    assert int(r.headers["x-ctxscore-tokens-forwarded"]) == window_tokens(sent) <= 4000
    assert tool_pairs_intact(sent) and sent[-1]["tool_call_id"] == "call_log"
    assert sent[-1]["content"].startswith(log[:200]) and len(sent[-1]["content"]) < len(log) / 10


def test_the_proxy_with_the_llm_compressor(upstream):
    from ctxscore import ContextManager
    from ctxscore.compress import key_spans
    from ctxscore.llm import LLMClient, LLMCompressor
    from ctxscore.llm.prompts import COMPRESSOR_RULES

    def responder(body):
        if body["messages"][0]["content"].startswith(COMPRESSOR_RULES):  # the summary batches
            items = json.loads(body["messages"][1]["content"])["items"]
            return json.dumps({"items": [{"id": it["id"], "form": "facts: " + "; ".join(key_spans(it["text"]))}
                                         for it in items]})
        return agent(body)

    upstream.responder = responder
    comp = LLMCompressor(LLMClient(base_url=upstream.url, model="summarizer", backoff=0.01), every=2)

    def factory(sid):
        return ContextManager(budget=1200, scorer="rules", session_id=sid, compressor=comp, layers=[comp.layer()])

    with Background(create_app(upstream.url, 1200, manager_factory=factory)) as srv:
        c = client_for(srv, "llm")
        messages = [{"role": "system", "content": SYSTEM}]
        for i in range(1, 41):
            messages.append({"role": "user", "content": user_turn(i)})
            chat(c, messages, stream=False)
            assert comp.wait(10)
    agent_calls = [r for r in upstream.chat_requests() if r["model"] == "gpt-test"]
    batches = [r for r in upstream.chat_requests() if r["model"] == "summarizer"]
    assert batches and comp.stats["accepted"] > 0
    assert all(window_tokens(r["messages"]) <= 1200 for r in agent_calls)
    assert any(m["content"].startswith("facts: ") for r in agent_calls for m in r["messages"] if m.get("content"))
    comp.close()


def test_the_scorer_and_its_models_are_loaded_before_the_first_request(upstream, monkeypatch):
    """The first requests of a proxy's traffic do not wait seconds for the learned scorer, its embedder
    or jieba: create_app loads them (the real packaged scorer)."""
    from ctxscore.scoring import learned

    if not learned.embedder_available(json.loads((learned.DEFAULT_MODEL_DIR / "config.json").read_text())
                                      ["embedder"]["model_id"]):
        pytest.skip("the packaged scorer's embedder is not installed (extra embed)")
    import jieba

    monkeypatch.setattr(learned, "_default_scorer", None)
    app = create_app(upstream.url, 3000, scorer="auto")
    loaded = learned._default_scorer
    assert isinstance(loaded, learned.LearnedScorer) and loaded.embedder._model is not None
    assert jieba.dt.initialized
    with Background(app) as srv:
        chat(client_for(srv, "warm"), [{"role": "user", "content": user_turn(1)}], stream=False)
    assert learned._default_scorer is loaded  # the sessions use the scorer loaded at startup
    assert create_app(upstream.url, 3000, scorer="auto", warm=False) and learned._default_scorer is loaded


def test_a_session_that_is_slow_to_open_holds_up_no_other():
    """A new session's manager is made outside the sessions' lock (a resumed session is read from its
    store first): meanwhile the other sessions are served."""
    from ctxscore import ContextManager
    from ctxscore.serve.app import Sessions

    opening, gate = threading.Event(), threading.Event()

    def factory(sid: str) -> ContextManager:
        if sid == "slow":
            opening.set()
            gate.wait(30)
        return ContextManager(budget=1000, scorer="rules")

    sessions = Sessions(factory, max_sessions=10)
    slow = threading.Thread(target=sessions.get, args=("slow",))
    slow.start()
    assert opening.wait(30)
    fast = sessions.get("fast")
    assert slow.is_alive()  # "fast" was made while "slow" was still opening
    gate.set()
    slow.join()
    again = sessions.get("slow")
    assert again.users == 2 and fast.users == 1 and {s.id for s in sessions.all()} == {"slow", "fast"}
    sessions.close()


def test_a_session_asked_for_twice_while_it_opens_is_opened_once():
    """Two first requests of one session at once: one manager is made and both requests get it (a
    second one would be closed, and with it a store the factory shares between sessions)."""
    from ctxscore import ContextManager
    from ctxscore.serve.app import Sessions
    from ctxscore.store.sqlite import SQLiteStore

    store = SQLiteStore(":memory:")
    made, opening, gate = [], threading.Event(), threading.Event()

    def factory(sid: str) -> ContextManager:
        made.append(sid)
        opening.set()
        gate.wait(30)
        return ContextManager(budget=1000, scorer="rules", store=store, session_id=sid)

    sessions = Sessions(factory, max_sessions=10)
    got: list = []
    first = threading.Thread(target=lambda: got.append(sessions.get("x")))
    first.start()
    assert opening.wait(30)
    second = threading.Thread(target=lambda: got.append(sessions.get("x")))
    second.start()
    time.sleep(0.3)  # the second request reaches get while the first is still opening the session
    gate.set()
    first.join()
    second.join()
    assert made == ["x"] and len(got) == 2 and got[0] is got[1] and got[0].users == 2
    got[0].cm.add({"role": "user", "content": "the store is still open"})
    assert [r.text for r in store.load("x")] == ["the store is still open"]
    store.close()


def test_a_session_whose_manager_cannot_be_made_is_tried_again():
    from ctxscore import ContextManager
    from ctxscore.serve.app import Sessions

    calls = []

    def factory(sid: str) -> ContextManager:
        calls.append(sid)
        if len(calls) == 1:
            raise OSError("the store is away")
        return ContextManager(budget=1000, scorer="rules")

    sessions = Sessions(factory, max_sessions=10)
    with pytest.raises(OSError):
        sessions.get("x")
    assert sessions.all() == [] and sessions.get("x").users == 1 and calls == ["x", "x"]
    sessions.close()


class _Overlap:
    """Counts the calls running at once (the most seen in ``peak``)."""

    def __init__(self) -> None:
        self.lock, self.active, self.peak, self.calls = threading.Lock(), 0, 0, 0

    def __enter__(self) -> None:
        with self.lock:
            self.active += 1
            self.calls += 1
            self.peak = max(self.peak, self.active)

    def __exit__(self, *exc) -> None:
        with self.lock:
            self.active -= 1


def _first_requests_at_once(srv, n: int) -> None:
    """The first request of ``n`` sessions, sent together from ``n`` threads; each must succeed."""
    start, errors = threading.Barrier(n), []

    def one(i: int) -> None:
        start.wait(10)
        try:
            chat(client_for(srv, f"s{i}"), [{"role": "user", "content": user_turn(i + 1)}], stream=False)
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors


def test_local_session_work_runs_one_request_at_a_time(upstream):
    """With only local CPU work (sessions in memory, a rule scorer) the proxy scores one request at a
    time, in arrival order: requests that take turns at the interpreter lock all finish late."""
    from ctxscore.scoring.rules import RuleClassifier

    overlap = _Overlap()

    class SlowRules(RuleClassifier):
        def predict(self, messages):
            with overlap:
                time.sleep(0.05)
                return super().predict(messages)

    app = create_app(upstream.url, 3000, scorer=SlowRules(), in_order=True)  # a subclass: not local by itself
    assert app.state.proxy.in_order
    with Background(app) as srv:
        _first_requests_at_once(srv, 6)
    assert overlap.calls >= 12 and overlap.peak == 1  # each request and each reply scored, never two at once
    assert not create_app(upstream.url, 3000, scorer="rules", in_order=False, warm=False).state.proxy.in_order


def test_session_work_that_waits_on_a_network_runs_at_once(upstream):
    """A query writer (an LLM call per request) keeps the shared thread pool: two requests wait for
    their queries at the same time (run in order, the first would wait for the second forever)."""
    together, overlap = threading.Barrier(2), _Overlap()

    class Writer:
        def expand(self, query: str) -> str:
            with overlap:
                together.wait(10)  # raises BrokenBarrierError when the two are not in it at once
                return query

    app = create_app(upstream.url, 3000, scorer="rules", query_writer=Writer())
    assert not app.state.proxy.in_order
    with Background(app) as srv:
        _first_requests_at_once(srv, 2)
    assert overlap.peak == 2


def test_a_query_writer_is_asked_once_a_request_while_a_tool_loop_serves_it(upstream):
    """The proxy expands each user request once: the tool loop's second call (after the tool result)
    reuses the expansion, so the build keeps its page-in and no second model call is made."""
    asked: list[str] = []

    class Writer:
        def expand(self, query: str) -> str:
            asked.append(query)
            return query + " (expanded)"

    app = create_app(upstream.url, 3000, scorer="rules", query_writer=Writer())
    with Background(app) as srv:
        c, messages = client_for(srv, "loop"), [{"role": "system", "content": SYSTEM}]
        for i in range(1, 9):
            messages.append({"role": "user", "content": user_turn(i)})
            chat(c, messages, stream=False)
    assert len(upstream.chat_requests()) == 8 + 2  # legs 4 and 8 call a tool, then the model again
    assert asked == [user_turn(i) for i in range(1, 9)]  # once each, the tool loop's second call included


def test_which_proxies_run_their_sessions_work_in_order():
    from ctxscore.scoring.embedders import HashingEmbedder
    from ctxscore.scoring.learned import LearnedScorer
    from ctxscore.scoring.rules import RuleClassifier
    from ctxscore.serve.app import local_work

    def local(store=None, redis=None, factory=None, writer=None, **options):
        return local_work(store, redis, factory, writer, {"scorer": "auto", "budget": 1000, "policy": None, **options})

    assert local() and local("sessions.db") and local(scorer="rules") and local(layers=[])
    assert not local("postgresql://u@h/db") and not local("postgresql://u@h/db", "redis://h:6379/0")
    assert not local(factory=lambda sid: None) and not local(writer=object())
    assert not local(compressor=object()) and not local(layers=[object()]) and not local(scorer=object())
    fallback = LearnedScorer.__new__(LearnedScorer)
    fallback.fallback = lambda message, prediction: None  # an LLM classifier behind the learned one
    fallback.embedder = HashingEmbedder(64)
    assert not local(scorer=fallback)
    packaged = LearnedScorer.__new__(LearnedScorer)
    packaged.fallback, packaged.embedder = None, HashingEmbedder(64)
    assert local(scorer=packaged) and local(scorer=RuleClassifier())

    class Remote:  # an embedder of the user's own, which may call an embedding API
        model_id, dim = "remote", 64

        def embed(self, texts):
            raise AssertionError("not called")

    remote = LearnedScorer.__new__(LearnedScorer)
    remote.fallback, remote.embedder = None, Remote()
    assert not local(scorer=remote)
    assert not local(scorer=type("MyRules", (RuleClassifier,), {})())  # a subclass's methods are the user's


def test_least_recently_used_sessions_are_closed_and_come_back_whole(upstream):
    with Background(create_app(upstream.url, 2000, scorer="rules", max_sessions=2)) as srv:
        histories = {}
        for name in ("a", "b", "c"):
            c = client_for(srv, name)
            histories[name] = [{"role": "user", "content": f"Hello #1 from {name}"}]
            chat(c, histories[name], stream=False)
        assert set(stats(srv)["sessions"]) == {"b", "c"}  # "a" was the least recently used
        histories["a"].append({"role": "user", "content": "Hello #3 again from a"})
        chat(client_for(srv, "a"), histories["a"], stream=False)
        s = stats(srv, "a")
    assert s["requests"] == 1 and s["messages"] == 4  # the resent history rebuilt the session
    assert upstream.chat_requests()[-1]["messages"][0] == {"role": "user", "content": "Hello #1 from a"}


def test_each_session_gets_its_own_layers(upstream):
    """manager_options={'layers': [...]} gave every session the same layer objects (one user's facts
    in another's window; with the ownership check, a refused second session): layers come from a function."""
    from ctxscore.errors import ConfigError
    from ctxscore.memory.ledger import FactLedger

    with pytest.raises(ConfigError, match="pass a function that makes them"):
        create_app(upstream.url, 2000, scorer="rules", manager_options={"layers": [FactLedger()]})
    app = create_app(upstream.url, 2000, scorer="rules", manager_options={"layers": lambda: [FactLedger()]})
    with Background(app) as srv:
        for sid in ("alice", "bob"):
            client_for(srv, sid).chat.completions.create(
                model="m", messages=[{"role": "user", "content": f"My booking reference number is {sid.upper()}77XQ."}])
        managers = {sid: app.state.proxy.sessions.get(sid).cm for sid in ("alice", "bob")}
    ledgers = {sid: cm.state.layers[0] for sid, cm in managers.items()}
    assert ledgers["alice"] is not ledgers["bob"]
    values = {sid: {f.value for f in led.facts} for sid, led in ledgers.items()}
    assert "ALICE77XQ" in values["alice"] - values["bob"] and "BOB77XQ" in values["bob"] - values["alice"]
    with pytest.raises(ConfigError, match="must make a new list of layers"):
        create_app(upstream.url, 2000, scorer="rules", manager_options={"layers": FactLedger})  # the class
    shared = FactLedger()  # a factory that hands out one ledger: the second session cannot be opened, and says so
    with Background(create_app(upstream.url, 2000, scorer="rules", manager_options={"layers": lambda: [shared]})) as srv:
        ok = httpx.post(srv.url + "/v1/chat/completions", headers={"x-session-id": "one"},
                        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        bad = httpx.post(srv.url + "/v1/chat/completions", headers={"x-session-id": "two"},
                         json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert ok.status_code == 200 and bad.status_code == 500
    assert "cannot be opened" in bad.json()["error"]["message"] and "already serves session" in bad.json()["error"]["message"]


def test_a_streamed_audio_reply_is_recorded_with_its_id():
    from ctxscore.serve.app import _Accumulator

    acc = _Accumulator()
    for chunk in ({"choices": [{"index": 0, "delta": {"role": "assistant", "audio": {"id": "audio_9", "data": "AAAA"}}}]},
                  {"choices": [{"index": 0, "delta": {"audio": {"transcript": "hello"}}, "finish_reason": "stop"}]}):
        acc.feed(b"data: " + json.dumps(chunk).encode() + b"\n")
    assert acc.feed(b"data: [DONE]\n")
    assert acc.message() == {"role": "assistant", "content": "", "audio": {"id": "audio_9"}}


def test_a_providers_own_message_fields_reach_it_again():
    """OpenRouter answers a reasoning model's tool call with ``reasoning_details`` (signed thoughts) and
    asks for them back with the call's results (Gemini 3 refuses the turn without them): the proxy
    dropped every field outside the chat-completions format. A message the window keeps verbatim
    now carries the client's other fields; a resent answer's ``annotations`` stay out."""
    details = [{"type": "reasoning.encrypted", "data": "c2lnbmVkLXRob3VnaHRz", "id": "r1", "format": "google-gemini-v1"}]

    def model(body: dict) -> dict:
        if body["messages"][-1]["role"] == "user":
            return {"content": None, "message_fields": {"reasoning_details": details},
                    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "wx", "arguments": '{"city": "Oslo"}'}}]}
        return {"content": "It is 4C in Oslo.", "message_fields": {"annotations": [{"type": "url_citation"}]}}

    with FakeOpenAI(model) as up, Background(create_app(up.url, 3000, scorer="rules")) as srv:
        url, head = srv.url + "/v1/chat/completions", {"X-Session-Id": "s"}
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Weather in Oslo?"}]
        reply = httpx.post(url, json={"model": "m", "messages": msgs}, headers=head).json()["choices"][0]["message"]
        assert reply["reasoning_details"] == details
        msgs += [reply, {"role": "tool", "tool_call_id": "c1", "content": "4C, light snow"}]
        answer = httpx.post(url, json={"model": "m", "messages": msgs}, headers=head).json()["choices"][0]["message"]
        sent = up.chat_requests()[-1]["messages"]
        assert sent[2] == {"role": "assistant", "content": "", "reasoning_details": details, "tool_calls": reply["tool_calls"]}
        msgs += [answer, {"role": "user", "content": "And tomorrow?"}]
        httpx.post(url, json={"model": "m", "messages": msgs}, headers=head)
        sent = up.chat_requests()[-1]["messages"]
        assert sent[2]["reasoning_details"] == details and sent[4] == {"role": "assistant", "content": "It is 4C in Oslo."}
        assert stats(srv, "s")["sync_modes"] == {"append": 3}
        # a message the window does not keep verbatim carries none of them
        long = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Plan the day."},
                {"role": "assistant", "content": "Step one of the plan: " + "walk along the harbour and look at the boats. " * 60,
                 "reasoning_details": details}, {"role": "user", "content": "Shorter please."}]
    with FakeOpenAI(model) as up, Background(create_app(up.url, 300, scorer="rules")) as srv:
        httpx.post(srv.url + "/v1/chat/completions", json={"model": "m", "messages": long})
        sent = up.chat_requests()[-1]["messages"]
        assert len(sent) == 4 and sent[2]["content"] != long[2]["content"] and "reasoning_details" not in sent[2]
