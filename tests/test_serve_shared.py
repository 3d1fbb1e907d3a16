"""Proxy processes sharing sessions through a real PostgreSQL store and a real Redis: two proxies
(``create_app(store="postgresql://...", redis=...)``, each served by uvicorn on loopback) in front of
the fake upstream. A conversation whose requests alternate between them stays whole (every message
once, in order, the window within budget); the proxy that never saw the session continues it
without re-scoring; concurrent requests of one session through both proxies never overlap at the
upstream; a rebase made through one proxy is followed by the other. Skipped without the servers
(``CTXSCORE_PG_DSN`` / ``CTXSCORE_REDIS_URL``), failed under ``CI=true``."""

from __future__ import annotations

import threading
import time

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
pytest.importorskip("redis")

from fake_openai import FakeOpenAI  # noqa: E402
from test_serve import SYSTEM, agent, chat, client_for, stats, tool_pairs_intact, user_turn, window_tokens  # noqa: E402

from ctxscore.errors import ConfigError  # noqa: E402
from ctxscore.messages import Message  # noqa: E402
from ctxscore.scoring.rules import RuleClassifier  # noqa: E402
from ctxscore.serve import Background, create_app  # noqa: E402
from ctxscore.store import open_store  # noqa: E402
from ctxscore.store.redis_state import RedisHotState  # noqa: E402

BUDGET = 1500


class SpyScorer:
    """The rule scorer, recording every message it scores (shared by both proxies of a test)."""

    def __init__(self) -> None:
        self.rules = RuleClassifier()
        self.scored: list[str] = []
        self._lock = threading.Lock()

    def predict(self, messages):
        with self._lock:
            self.scored.extend(m.content for m in messages)
        return self.rules.predict(messages)


@pytest.fixture
def shared(pg_url, redis_server_url, redis_prefix):
    """(make_proxy, store URL): ``make_proxy(upstream_url, scorer)`` starts one more proxy process's
    app on the shared PostgreSQL schema and Redis prefix."""
    servers: list[Background] = []

    def make(upstream_url: str, scorer) -> Background:
        hot = RedisHotState(redis_server_url, prefix=redis_prefix, renew_s=120.0)
        app = create_app(upstream_url, BUDGET, scorer=scorer, store=pg_url, redis=hot)
        srv = Background(app).start()
        srv.app = app
        servers.append(srv)
        return srv

    yield make, pg_url
    for srv in servers:
        srv.stop()


class Alternating:
    """An OpenAI client whose requests go to the proxies in turn (a round-robin load balancer)."""

    def __init__(self, proxies: list[Background], session: str) -> None:
        self.clients = [client_for(p, session) for p in proxies]
        self.n = 0
        self.chat = self
        self.completions = self

    def create(self, **kw):
        c = self.clients[self.n % len(self.clients)]
        self.n += 1
        return c.chat.completions.create(**kw)


def stored(pg_url: str, session: str) -> list[tuple[str, str]]:
    """(role, content) of the session's messages in the store, in order."""
    s = open_store(pg_url)
    try:
        return [(r.message.role, r.message.content) for r in s.load(session)]
    finally:
        s.close()


def test_a_conversation_alternating_between_two_proxies_stays_whole_without_rescoring(shared, monkeypatch):
    make, pg_url = shared
    spy = SpyScorer()
    read = []  # every message validated from a dict, by either proxy (requests, store rows)
    from_dict = Message.from_dict.__func__
    monkeypatch.setattr(Message, "from_dict", classmethod(lambda cls, *a, **k: read.append(1) or from_dict(cls, *a, **k)))
    with FakeOpenAI(agent) as up:
        a, b = make(up.url, spy), make(up.url, spy)
        client = Alternating([a, b], "trip-shared")
        messages: list = [{"role": "system", "content": SYSTEM}]
        for i in range(1, 41):
            messages.append({"role": "user", "content": user_turn(i)})
            chat(client, messages, stream=i % 3 == 0)
        reqs = up.chat_requests()
    reads = len(read)
    assert len(reqs) == 40 + 10  # a second call after each of the 10 tool calls
    assert max(window_tokens(r["messages"]) for r in reqs) <= BUDGET
    assert all(tool_pairs_intact(r["messages"]) for r in reqs)
    assert all(r["messages"][0] == {"role": "system", "content": SYSTEM} for r in reqs)
    assert reqs[-2]["messages"][-1]["content"] == user_turn(40)  # the newest message always goes up (turn 40
    assert reqs[-1]["messages"][-1]["role"] == "tool"  # called a tool: its second request ends with the result)
    # every message once, in order, in the shared store
    plain = [m if isinstance(m, dict) else m.model_dump(exclude_none=True) for m in messages]
    assert stored(pg_url, "trip-shared") == [(m["role"], m.get("content") or "") for m in plain]
    # each message scored once over both proxies: the one that did not see a turn did not re-score it
    assert len(spy.scored) == len(plain)
    sa, sb = stats(a)["shared"], stats(b)["shared"]
    assert sa["opened"] == 1 and sb["opened"] == 1  # each proxy read the session from the store once
    assert sa["refreshed"] + sb["refreshed"] >= len(reqs) - 2  # then caught up with the other's turns
    assert stats(a, "trip-shared")["replies_recorded"] + stats(b, "trip-shared")["replies_recorded"] == len(reqs)
    # a request costs what is new in it: the resent history is not validated again, not even by the
    # proxy that did not serve the previous turn (each message is read a few times: from the request,
    # when stored, and by the other proxy from the store; in full it would be 50 x 50 = 2,500 more)
    assert reads <= 6 * len(plain)


def slow_agent(log: list[tuple[str, float, float]], lock: threading.Lock, delay: float = 0.25):
    """The fake model answering after ``delay`` seconds, logging (session, start, end) of each call."""

    def respond(body: dict) -> dict:
        t0 = time.monotonic()
        time.sleep(delay)
        with lock:
            log.append((body["messages"][-1]["content"].split(":")[0], t0, time.monotonic()))
        return {"content": f"answer to {body['messages'][-1]['content']}"}

    return respond


def overlaps(spans: list[tuple[float, float]]) -> int:
    """Pairs of time spans that overlap."""
    s = sorted(spans)
    return sum(1 for (_, e0), (b1, _) in zip(s, s[1:], strict=False) if b1 < e0)


def test_concurrent_requests_of_one_session_through_both_proxies_never_interleave(shared):
    make, pg_url = shared
    log: list[tuple[str, float, float]] = []
    with FakeOpenAI(slow_agent(log, threading.Lock())) as up:
        a, b = make(up.url, "rules"), make(up.url, "rules")
        clients = {"one": [client_for(a, "one"), client_for(b, "one")],
                   "other": [client_for(a, "other"), client_for(b, "other")]}
        codes: list[int] = []

        def send(session: str, k: int) -> None:
            c = clients[session][k % 2]
            msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"{session}: question {k}"}]
            r = c.chat.completions.with_raw_response.create(model="m", messages=msgs)
            codes.append(r.status_code)

        threads = [threading.Thread(target=send, args=(sid, k)) for sid in ("one", "other") for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert codes == [200] * 8
    one = [(t0, t1) for sid, t0, t1 in log if sid == "one"]
    assert len(one) == 4 and overlaps(one) == 0  # one session: one turn at a time over both proxies
    # sessions apart do run at once (the check above could see an overlap)
    assert overlaps([(t0, t1) for _, t0, t1 in log]) > 0
    # the session's store is consistent: the system prompt once, then whole question/answer turns
    rows = stored(pg_url, "one")
    assert rows[0] == ("system", SYSTEM) and [r for r, _ in rows[1:]] == ["user", "assistant"]


def test_a_rebase_through_one_proxy_is_followed_by_the_other(shared):
    make, pg_url = shared
    with FakeOpenAI(agent) as up:
        a, b = make(up.url, "rules"), make(up.url, "rules")
        ca, cb = client_for(a, "edit"), client_for(b, "edit")
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user_turn(1)}]
        for i, c in enumerate([ca, cb, ca]):
            r = c.chat.completions.create(model="m", messages=msgs)
            msgs += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": user_turn(i + 2)}]
        edited = msgs[:2] + [{"role": "assistant", "content": "An edited answer."},
                             {"role": "user", "content": "A new direction."}]
        rb = cb.chat.completions.create(model="m", messages=edited)  # b rebases the session
        cont = [*edited, rb.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "And then?"}]
        r = ca.chat.completions.create(model="m", messages=cont)  # a had the old branch: it must follow b's
        last = up.chat_requests()[-1]["messages"]
        modes_a, modes_b = stats(a, "edit")["sync_modes"], stats(b, "edit")["sync_modes"]
    contents = [m["content"] for m in last]
    assert "An edited answer." in contents and "A new direction." in contents
    assert user_turn(3) not in contents and user_turn(4) not in contents  # the replaced branch is gone
    rows = stored(pg_url, "edit")
    assert [c for _, c in rows[:6]] == [SYSTEM, user_turn(1), "An edited answer.", "A new direction.",
                                        rb.choices[0].message.content or "", "And then?"]
    assert len(rows) == 7 and rows[6][0] == "assistant" and r.choices[0].message.tool_calls  # a's reply recorded
    # a read b's rebased session from the store: it appended, it did not rebase (and re-score) again
    assert modes_b.get("rebased") == 1 and "rebased" not in modes_a, (modes_a, modes_b)


def one_thread(app):
    """``app`` served with a thread pool of one token (anyio's default limiter, per event loop)."""
    import anyio.to_thread

    async def limited(scope, receive, send):
        anyio.to_thread.current_default_thread_limiter().total_tokens = 1
        await app(scope, receive, send)

    return limited


def test_a_request_waiting_for_another_proxys_session_holds_no_worker_thread(pg_url, redis_server_url, redis_prefix):
    """A request waiting for the Redis lock of a session another process held blocked one of the
    proxy's worker threads, and a turn holding a lock needs one to record its reply and release it:
    two proxies, each holding a session in a model call while a request for the other's session
    came in, waited for each other until ``lock_wait_s`` (with a one-thread pool: two sessions; with
    anyio's 40 threads: 45) and answered 503. The wait is now in the event loop."""
    servers = []

    def respond(body: dict) -> dict:
        if "slow" in body["messages"][-1]["content"]:
            time.sleep(1.5)
        return {"content": "ok"}

    with FakeOpenAI(respond) as up:
        try:
            for _ in range(2):
                hot = RedisHotState(redis_server_url, prefix=redis_prefix, renew_s=60.0, lock_wait_s=8.0)
                app = create_app(up.url, BUDGET, scorer="rules", store=pg_url, redis=hot)
                servers.append(Background(one_thread(app)).start())
            a, b = servers
            results: dict[str, tuple[int, float]] = {}

            def send(srv, session: str, text: str, tag: str) -> None:
                t0 = time.monotonic()
                r = httpx.post(f"{srv.url}/v1/chat/completions", timeout=60,
                               headers={"X-Session-Id": session},
                               json={"model": "m", "messages": [{"role": "user", "content": text}]})
                results[tag] = (r.status_code, time.monotonic() - t0)

            first = [threading.Thread(target=send, args=(a, "cyc-1", "slow one", "a1")),
                     threading.Thread(target=send, args=(b, "cyc-2", "slow two", "b2"))]
            for t in first:
                t.start()
            time.sleep(0.5)  # both sessions held, each in its model call
            second = [threading.Thread(target=send, args=(a, "cyc-2", "quick two", "a2")),
                      threading.Thread(target=send, args=(b, "cyc-1", "quick one", "b1"))]
            for t in second:
                t.start()
            for t in first + second:
                t.join()
        finally:
            for srv in servers:
                srv.stop()
    assert {k: code for k, (code, _) in results.items()} == {"a1": 200, "b2": 200, "a2": 200, "b1": 200}
    assert max(dt for _, dt in results.values()) < 5.0, results
    # each waiting request ran after the other proxy's turn (its history replaced that one's)
    assert stored(pg_url, "cyc-1") == [("user", "quick one"), ("assistant", "ok")]
    assert stored(pg_url, "cyc-2") == [("user", "quick two"), ("assistant", "ok")]


def test_a_request_waiting_for_a_session_backs_off_and_keeps_its_deadline(pg_url, redis_server_url, redis_prefix):
    """A request waiting for a session another process held tried the lock every 5 ms, each try a
    thread hop and a Redis round trip (about 200 a second: 100 waiting requests made 20,000). The
    pauses now double from 5 ms up to 50 ms: a request waiting about 1 s tries at most 40 times and
    still starts soon after the release; one waiting past ``lock_wait_s`` is busy at its deadline."""
    import asyncio
    import itertools

    from ctxscore import ContextManager
    from ctxscore.errors import StoreError
    from ctxscore.serve.app import SharedProxySessions, _Session
    from ctxscore.store.redis_state import SharedSessions

    def proxy(**hot) -> SharedProxySessions:
        state = RedisHotState(redis_server_url, prefix=redis_prefix, **hot)
        return SharedProxySessions(SharedSessions(open_store(pg_url, redis=state), ContextManager, budget=BUDGET,
                                                  scorer="rules"), 16)

    holder, waiter, impatient = proxy(), proxy(), proxy(lock_wait_s=0.3)
    tries: list[float] = []
    enter = waiter.enter

    def counted(s, wait=True):
        tries.append(time.monotonic())
        return enter(s, wait)

    waiter.enter = counted
    try:
        held = _Session("wait-1", None)
        asyncio.run(holder.take(held))  # another process's turn, in its model call
        with pytest.raises(StoreError, match="busy"):
            t0 = time.monotonic()
            asyncio.run(impatient.take(_Session("wait-1", None)))
        assert 0.3 <= time.monotonic() - t0 < 0.6
        release = threading.Timer(1.0, holder.leave, args=(held,))
        t0 = time.monotonic()
        release.start()
        mine = _Session("wait-1", None)
        asyncio.run(waiter.take(mine))
        waited = time.monotonic() - t0
        waiter.leave(mine)
        release.join()
        assert 1.0 <= waited < 1.5, waited  # started soon after the release (at most ~60 ms of pause)
        assert 10 <= len(tries) <= 40, len(tries)  # 180 before, about 22 now
        gaps = [b - a for a, b in itertools.pairwise(tries)]
        assert gaps[0] < 0.05 and max(gaps) < 0.25, gaps
    finally:
        for p in (holder, waiter, impatient):
            p.close()


def test_bad_shared_settings_are_config_errors(pg_url, tmp_path):
    with pytest.raises(ConfigError, match="needs a server store"):
        create_app("http://127.0.0.1:9/v1", 1000, store=str(tmp_path / "s.db"), redis="redis://127.0.0.1:6390/0")
    with pytest.raises(ConfigError, match="needs a server store"):
        create_app("http://127.0.0.1:9/v1", 1000, redis="redis://127.0.0.1:6390/0")
    with pytest.raises(ConfigError, match="redis://"):
        create_app("http://127.0.0.1:9/v1", 1000, store=pg_url, redis="http://127.0.0.1:6390")
    with pytest.raises(ConfigError, match="manager_options"):
        create_app("http://127.0.0.1:9/v1", 1000, store=pg_url, redis="redis://127.0.0.1:6390/0",
                   manager_factory=lambda sid: None)
    with pytest.raises(ConfigError, match="unsupported store URL"):
        create_app("http://127.0.0.1:9/v1", 1000, store="mysql://x/y")


def test_a_postgres_store_without_redis_keeps_the_sessions_there(pg_url):
    with FakeOpenAI(agent) as up:
        app = create_app(up.url, BUDGET, scorer="rules", store=pg_url)
        with Background(app) as srv:
            c = client_for(srv, "pg-only")
            msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user_turn(1)}]
            r = c.chat.completions.create(model="m", messages=msgs)
            assert "shared" not in stats(srv)
    assert stored(pg_url, "pg-only") == [("system", SYSTEM), ("user", user_turn(1)),
                                         ("assistant", r.choices[0].message.content)]


def test_serve_cli_refuses_redis_without_a_server_store(capsys, tmp_path):
    from ctxscore.cli import main

    rc = main(["serve", "--upstream", "http://127.0.0.1:9/v1", "--budget", "1000", "--model", "rules",
               "--store", str(tmp_path / "s.db"), "--redis", "redis://127.0.0.1:6390/0"])
    assert rc == 2 and "needs a server store" in capsys.readouterr().err


def test_a_turn_longer_than_the_lock_timeout_keeps_its_lock_when_renewed(redis_server_url, redis_prefix):
    from ctxscore.errors import StoreError

    mine = RedisHotState(redis_server_url, prefix=redis_prefix, lock_timeout_s=0.3, renew_s=10.0)
    other = RedisHotState(redis_server_url, prefix=redis_prefix, lock_timeout_s=0.3, lock_wait_s=0.2)
    try:
        with mine.lock("long"):
            time.sleep(1.0)  # a slow model answer: three lock timeouts
            with pytest.raises(StoreError, match="busy"):
                with other.lock("long"):
                    pass
        with other.lock("long"):  # released at the end of the turn
            pass
    finally:
        mine.close()
        other.close()


def test_the_store_urls_redis_parameter_shares_sessions_like_redis(pg_url, redis_server_url):
    """``--store "postgresql://...?redis=redis://..."`` (open_store's URL form) ran without the
    session lock: two proxies interleaved one session's turns. It is now the same as ``--redis``."""
    from urllib.parse import quote

    import redis as redis_py

    sid = f"url-redis-{time.monotonic_ns()}"
    store = pg_url + "&redis=" + quote(redis_server_url, safe="")
    log: list[tuple[str, float, float]] = []
    try:
        with FakeOpenAI(slow_agent(log, threading.Lock())) as up:
            apps = [create_app(up.url, BUDGET, scorer="rules", store=store) for _ in range(2)]
            with Background(apps[0]) as a, Background(apps[1]) as b:
                assert "shared" in stats(a) and "shared" in stats(b)
                clients = [client_for(a, sid), client_for(b, sid)]
                codes: list[int] = []

                def send(k: int) -> None:
                    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"{sid}: question {k}"}]
                    codes.append(clients[k % 2].chat.completions.with_raw_response.create(
                        model="m", messages=msgs).status_code)

                threads = [threading.Thread(target=send, args=(k,)) for k in range(4)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
        assert codes == [200] * 4
        assert overlaps([(t0, t1) for _, t0, t1 in log]) == 0
        rows = stored(pg_url, sid)
        assert rows[0] == ("system", SYSTEM) and [r for r, _ in rows[1:]] == ["user", "assistant"]
        with pytest.raises(ConfigError, match="redis://, rediss:// or unix://"):
            create_app("http://127.0.0.1:9/v1", 1000, store=pg_url + "&redis=http://x")
        with pytest.raises(ConfigError, match="not both"):
            create_app("http://127.0.0.1:9/v1", 1000, store=store, redis=redis_server_url)
    finally:
        client = redis_py.Redis.from_url(redis_server_url)
        keys = list(client.scan_iter(match=f"ctxscore:{{{sid}}}:*"))
        if keys:
            client.delete(*keys)


def test_redis_is_checked_at_start_and_bad_urls_are_clear_errors(pg_url, capsys):
    """A proxy given a Redis where nothing listens started, said ok on /healthz and answered every
    request 503; bad Redis and PostgreSQL URLs were raw ValueErrors. Both are clear errors at start,
    with no password in the message."""
    from _servers import free_port

    from ctxscore.cli import main
    from ctxscore.errors import StoreError

    nobody = f"redis://:secretpw@127.0.0.1:{free_port()}/0"
    with pytest.raises(StoreError, match="check that Redis is up") as err:
        create_app("http://127.0.0.1:9/v1", 1000, scorer="rules", store=pg_url, redis=nobody, warm=False)
    assert "secretpw" not in str(err.value)
    rc = main(["serve", "--upstream", "http://127.0.0.1:9/v1", "--budget", "1000", "--model", "rules",
               "--store", pg_url, "--redis", nobody])
    out = capsys.readouterr().err
    assert rc == 2 and "check that Redis is up" in out and "secretpw" not in out
    for url in ("redis://127.0.0.1:notaport/0", "redis://:secretpw@[::1/0"):
        with pytest.raises(ConfigError, match="bad Redis URL") as err:
            create_app("http://127.0.0.1:9/v1", 1000, scorer="rules", store=pg_url, redis=url, warm=False)
        assert "secretpw" not in str(err.value)
    with pytest.raises(ConfigError, match="bad store URL") as err:
        create_app("http://127.0.0.1:9/v1", 1000, scorer="rules", store="postgresql://u:secretpw@[::1/db", warm=False)
    assert "secretpw" not in str(err.value)
    with pytest.raises(ConfigError, match="unsupported store URL") as err:
        open_store("POSTGRESQL://u:secretpw@127.0.0.1/db")
    assert "secretpw" not in str(err.value)
