"""Redis hot state shared by workers, against real PostgreSQL and Redis servers: a worker that never
saw a session continues it without re-scoring or re-tokenising; workers taking turns build the same
windows as one worker alone; the per-session lock keeps turns whole; TTLs; a busy session or an
unreachable Redis is a clear StoreError that runs nothing; a Redis failure after a durable write
loses nothing."""

from __future__ import annotations

import re
import threading
import time
from contextlib import contextmanager

import pytest

from ctxscore import ContextManager
from ctxscore.errors import ConfigError, StoreError
from ctxscore.messages import Message
from ctxscore.scoring.rules import RuleClassifier
from ctxscore.store import NewRecord, open_store

redis = pytest.importorskip("redis")
from ctxscore.store.redis_state import (  # noqa: E402
    HotStore,
    RedisHotState,
    SessionBusy,
    SharedSessions,
    SharedTokenCounter,
    text_key,
)
from ctxscore.tokens import TokenCounter  # noqa: E402


class SpyScorer:
    """The rule scorer, counting the messages it is asked to score."""

    def __init__(self) -> None:
        self.rules = RuleClassifier()
        self.scored: list[str] = []

    def predict(self, messages):
        self.scored.extend(m.content for m in messages)
        return self.rules.predict(messages)


def conversation(n: int) -> list[dict]:
    """A session that compacts at small budgets: bookings with references, tool calls, chatter."""
    out: list[dict] = [{"role": "system", "content": "You are a travel agent. Never book without a yes."}]
    for i in range(n):
        out.append({"role": "user", "content": f"Trip {i}: book a hotel in city {i} for {i % 4 + 1} nights, "
                                               f"budget under ${100 + i * 7}. Also tell me about the weather there."})
        out.append({"role": "assistant", "content": "", "tool_calls": [{"id": f"c{i}", "type": "function",
                    "function": {"name": "search_hotels", "arguments": f'{{"city": "city {i}"}}'}}]})
        out.append({"role": "tool", "tool_call_id": f"c{i}",
                    "content": f'[{{"hotel": "Hotel {i}A", "price": {90 + i}}}, {{"hotel": "Hotel {i}B", "price": {120 + i}}}]'})
        out.append({"role": "assistant", "content": f"I found Hotel {i}A at ${90 + i} per night; reference "
                                                    f"R{i:04d}X. The weather in city {i} is mild, around {15 + i % 10} C, "
                                                    "with some clouds in the afternoon and a light breeze."})
    return out


@pytest.fixture
def hot_url(pg_url, redis_server_url, redis_prefix):
    """(store URL, Redis URL, prefix) of one test."""
    return pg_url, redis_server_url, redis_prefix


def workers(hot_url, n: int, **kw) -> list[SharedSessions]:
    pg, rurl, prefix = hot_url
    out = []
    for _ in range(n):
        store = HotStore(open_store(pg), RedisHotState(rurl, prefix=prefix, **kw.get("hot", {})))
        out.append(SharedSessions(store, ContextManager, budget=kw.get("budget", 700), scorer=kw.get("scorer", "rules")))
    return out


def turns(msgs: list[dict]) -> list[int]:
    """End index of each request: a client sends the history up to each user message and the last."""
    ends = [i for i, m in enumerate(msgs) if m["role"] == "user" and i > 0] + [len(msgs)]
    return ends


def test_worker_that_never_saw_the_session_continues_without_rescoring(hot_url):
    msgs = conversation(12)
    (a,) = workers(hot_url, 1)
    ends = turns(msgs)
    for end in ends[:-1]:
        with a.turn("s") as cm:
            cm.sync(msgs[:end])
            cm.build(query="which hotel in city 3?")
    pg, rurl, prefix = hot_url
    spy = SpyScorer()
    b = SharedSessions(HotStore(open_store(pg), RedisHotState(rurl, prefix=prefix)), ContextManager, budget=700,
                       scorer=spy)
    with b.turn("s") as cm:
        kept = b._kept["s"]
        assert len(cm) == ends[-2] and spy.scored == []  # opened from the store: stored predictions
        assert kept.counter.hits > 0 and not kept.counter.fresh  # and shared token counts
        res = cm.sync(msgs)
        assert res.mode == "append" and spy.scored == [m["content"] for m in msgs[ends[-2]:]]
        win_b = cm.build(query="which hotel in city 3?")
    ref = ContextManager(budget=700, scorer="rules")
    for end in ends:
        ref.sync(msgs[:end])
        win_ref = ref.build(query="which hotel in city 3?")
    assert win_b.messages == win_ref.messages
    assert b.stats == {"opened": 1, "refreshed": 0, "current": 0}


@pytest.mark.parametrize("n_workers, budget", [(2, 650), (3, 1200)])
def test_workers_taking_turns_build_the_windows_of_one_worker(hot_url, n_workers, budget):
    """Round-robin routing: each worker is n - 1 turns behind when its turn comes. (At 1,200 tokens
    two of the 17 windows differ when the stale worker ignores the other workers' tiers.)"""
    msgs = conversation(16)
    ws = workers(hot_url, n_workers, budget=budget)
    ref = ContextManager(budget=budget, scorer="rules")
    compacted = 0
    for k, end in enumerate(turns(msgs)):
        with ws[k % n_workers].turn("s") as cm:
            cm.sync(msgs[:end])
            got = cm.build(query=f"what is the reference of the hotel in city {k // 2}?")
        ref.sync(msgs[:end])
        want = ref.build(query=f"what is the reference of the hotel in city {k // 2}?")
        assert got.messages == want.messages, f"turn {k}"
        assert [d.tier for d in got.decisions] == [d.tier for d in want.decisions]
        compacted = max(compacted, sum(d.tier != "verbatim" for d in want.decisions))
    assert compacted > 10  # the workers had compaction to share
    assert all(w.stats["refreshed"] >= 17 // n_workers - 1 for w in ws)


def test_a_worker_catching_up_reuses_the_token_counts_of_the_other_worker(hot_url):
    """Round-robin: the messages another worker added since this worker's last turn are read with
    the counts that worker published when its turn ended (no re-tokenising); the turn's state, tier
    changes and those counts come with the lock."""
    msgs = conversation(6)
    ends = turns(msgs)
    a, b = workers(hot_url, 2)
    for k, end in enumerate(ends):
        w = (a, b)[k % 2]
        with w.turn("s") as cm:
            kept = w._kept["s"]
            if k >= 2:
                assert w.brought("s") == "refreshed"
                assert not kept.counter.fresh  # everything caught up was counted by the other worker
            cm.sync(msgs[:end])
            cm.build(query="which hotel in city 2?")
        assert kept.version == w.hot.version("s") and kept.toklog == w.hot.client.llen(w.hot.keys("s")[4])
    assert a.stats["refreshed"] + b.stats["refreshed"] == len(ends) - 2


def test_lock_keeps_each_turn_whole(hot_url):
    ws = workers(hot_url, 4)
    errors: list[BaseException] = []

    def work(w: int) -> None:
        try:
            for i in range(15):
                with ws[w].turn("s") as cm:
                    cm.add({"role": "user", "content": f"worker {w} question {i}"})
                    time.sleep(0.002)  # another worker would slip in here without the lock
                    cm.add({"role": "assistant", "content": f"worker {w} answer {i}"})
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    rows = ws[0].store.load("s")
    assert len(rows) == 120 and [r.turn for r in rows] == list(range(120))
    for q, a in zip(rows[::2], rows[1::2], strict=True):
        assert q.message.content.replace("question", "answer") == a.message.content


def test_keys_expire_and_the_session_is_rebuilt_from_the_store(hot_url):
    msgs = conversation(4)
    a, b = workers(hot_url, 2, hot={"ttl_s": 1.0})
    with a.turn("s") as cm:
        cm.sync(msgs)
        cm.build()
    hot = a.hot
    assert 0 < hot.ttl_s("s") <= 1.0
    assert all(0 < a.hot.client.pttl(k) <= 1000 for k in hot.keys("s"))
    time.sleep(1.3)
    assert hot.version("s") is None and hot.ttl_s("s") is None
    with b.turn("s") as cm:  # nothing lost: the durable store has the session
        assert [m.content for m in cm.messages] == [m["content"] for m in msgs]
    assert hot.version("s") is not None


def test_a_dropped_hot_state_whose_version_comes_back_is_not_taken_as_current(hot_url):
    """The hot state is dropped (forget, or expiry) and rebuilt by another worker: its version starts
    again and can reach the number a stale worker holds; that worker must still read what was written."""
    a, b = workers(hot_url, 2)
    with a.turn("s") as cm:
        cm.add({"role": "user", "content": "first question"})
    held = a._kept["s"].version
    a.hot.forget("s")
    with b.turn("s") as cm:
        cm.add({"role": "user", "content": "written while the hot state was new"})
    meta = a.hot.keys("s")[0]
    a.hot.client.hset(meta, "version", held)  # the restarted counter reaches the stale worker's number
    with a.turn("s") as cm:
        assert [m.content for m in cm.messages] == ["first question", "written while the hot state was new"]
    assert a.brought("s") == "opened"


def test_busy_session_is_a_store_error(hot_url):
    a, b = workers(hot_url, 2, hot={"lock_wait_s": 0.3})
    inside, done = threading.Event(), threading.Event()

    def hold() -> None:
        with a.turn("s"):
            inside.set()
            done.wait(5)

    th = threading.Thread(target=hold)
    th.start()
    inside.wait(5)
    try:
        with pytest.raises(StoreError, match="busy"), b.turn("s") as cm:
            cm.add({"role": "user", "content": "never runs"})
    finally:
        done.set()
        th.join()
    assert b.store.count("s") == 0


def test_a_turn_that_outlives_its_lock_drops_the_hot_state(hot_url):
    """Without renewal a turn longer than ``lock_timeout_s`` loses its lock: another worker may have
    run a turn meanwhile, so the hot state is dropped and every worker reads the store again."""
    a, b = workers(hot_url, 2, hot={"lock_timeout_s": 0.2})
    with a.turn("s") as cm:
        cm.add({"role": "user", "content": "first question"})
    assert a.hot.version("s") is not None and a._kept["s"].version is not None
    with a.turn("s") as cm:
        cm.add({"role": "user", "content": "asked during a slow turn"})
        time.sleep(0.5)
        assert a.hot.client.exists(a.hot._key("s", "lock")) == 0  # expired while the turn ran
    assert a.hot.version("s") is None and a._kept["s"].version is None
    with b.turn("s") as cm:  # nothing lost: the durable store has both messages
        assert [m.content for m in cm.messages] == ["first question", "asked during a slow turn"]
    assert b.brought("s") == "opened"
    with a.turn("s") as cm:
        assert [m.content for m in cm.messages] == ["first question", "asked during a slow turn"]
    assert a.brought("s") == "opened"


def _resend_reads_the_store_again(b, hist: list[dict], reply: dict) -> None:
    """Worker ``b`` takes the next turn with the client's resent history: it opens the session from
    the store and stores the reply once."""
    with b.turn("s") as cm:
        res = cm.sync([*hist, reply, {"role": "user", "content": "Yes, book it."}])
        assert res.mode == "append"
        assert [m.role for m in cm.messages] == ["system", "user", "assistant", "user"]
    assert b.brought("s") == "opened"
    assert [r.message.role for r in b.store.load("s")] == ["system", "user", "assistant", "user"]


def test_a_worker_dead_between_the_store_commit_and_redis_leaves_no_stale_hot_state(hot_url):
    """A worker killed after PostgreSQL committed its reply but before Redis recorded it: once its
    lock expired, another worker took its manager for current (the version never moved), skipped the
    load and appended the client's resent reply again (stored twice). A turn that never ended now
    drops the hot state when the next one starts, and that one reads the session from the store."""
    (a,) = workers(hot_url, 1, hot={"lock_timeout_s": 1.0})
    (b,) = workers(hot_url, 1)
    hist = [{"role": "system", "content": "You are a travel agent."}, {"role": "user", "content": "Book HA1 to Paris?"}]
    reply = {"role": "assistant", "content": "HA1 is available at 09:40; shall I book it?"}
    with b.turn("s") as cm:
        cm.sync(hist)
    with a.turn("s") as cm:  # a catches up, then its next turn dies half-way
        assert len(cm) == 2
    assert a.hot.version("s") == b._kept["s"].version  # (no turn outlived its lock so far)
    dying = a.turn("s")
    cm = dying.__enter__()
    a.store.hot.bump = lambda *args, **kw: None  # the process dies right after the commit: Redis never hears
    cm.add(reply)
    time.sleep(1.3)  # its lock expires; the turn never ends
    _resend_reads_the_store_again(b, hist, reply)
    with b.turn("s") as cm:  # a turn that ended leaves the hot state in place
        assert len(cm) == 4
    assert b.brought("s") == "current"


def redis_away(hot: RedisHotState, *calls: str) -> None:
    """Make the next call of each of ``hot``'s Redis operations named ``calls`` (as its ``_guard``
    names them: "record a write", "drop the hot state" ...) fail as if Redis were briefly away."""
    away, guard = set(calls), hot._guard

    @contextmanager
    def flaky(what: str, *key: str | None):
        with guard(what, *key):
            if what in away:
                away.discard(what)
                raise redis.ConnectionError("Error 111 connecting to Redis: Connection refused (injected)")
            yield

    hot._guard = flaky


def test_a_turn_whose_write_redis_missed_leaves_no_stale_hot_state(hot_url):
    """PostgreSQL committed a turn's reply, then Redis was briefly away: the version bump and the
    drop of the hot state both failed (logged, the write is durable), and the turn's end, Redis back,
    deleted the turn mark. The next turn took its manager for current (the version never moved),
    skipped the load and stored the client's resent reply twice. The turn's end now drops the hot
    state, and the next turn reads the session from the store."""
    a, b = workers(hot_url, 2)
    hist = [{"role": "system", "content": "You are a travel agent."}, {"role": "user", "content": "Book HA1 to Paris?"}]
    reply = {"role": "assistant", "content": "HA1 is available at 09:40; shall I book it?"}
    with b.turn("s") as cm:
        cm.sync(hist)
    with a.turn("s") as cm:
        assert len(cm) == 2
    with a.turn("s") as cm:
        redis_away(a.hot, "record a write", "drop the hot state")
        cm.add(reply)  # durable; Redis heard nothing
    _resend_reads_the_store_again(b, hist, reply)
    with b.turn("s") as cm:  # a turn whose writes Redis recorded leaves the hot state in place
        assert len(cm) == 4
    assert b.brought("s") == "current"
    with a.hot.lock("s"):  # the plain lock drops it too
        redis_away(a.hot, "record a write", "drop the hot state")
        a.store.add("s", [NewRecord(Message(role="assistant", content="Booked."), "Booked.")])
    assert a.hot.version("s") is None and b.store.count("s") == 5


def test_two_deployments_sharing_one_redis_keep_their_sessions_apart(pg_dsn, pg_url, redis_server_url, redis_prefix):
    """Two deployments on other schemas (or databases) given the same Redis URL and a session id
    both compute (derived from the conversation): the keys were not namespaced by store, so one
    deployment's turn held the other's session (busy), and each one's writes moved the other's
    version, message count, tiers and rebase count. The keys now carry a hash of the store."""
    import uuid
    from urllib.parse import urlsplit

    import psycopg
    from _servers import with_query

    schema = "t_" + uuid.uuid4().hex[:12]
    other_url = with_query(pg_dsn, schema=schema)

    def worker(url: str) -> SharedSessions:
        return SharedSessions(open_store(url, redis=RedisHotState(redis_server_url, prefix=redis_prefix)),
                              ContextManager, budget=3000, scorer="rules")

    made = []
    try:
        made += [worker(pg_url), worker(pg_url), worker(other_url)]
        x1, x2, y = made
        conv = [{"role": "system", "content": "You are a helpful agent."}] + [
            {"role": "user" if i % 2 == 0 else "assistant", "content": f"A-side message {i}"} for i in range(9)]
        with x1.turn("auto-1") as cm:
            cm.sync(conv)
        conv += [{"role": "assistant", "content": "A reply 9"}, {"role": "user", "content": "A user 10"}]
        with x2.turn("auto-1") as cm:
            cm.sync(conv)
        with y.turn("auto-1") as cm:  # the other deployment, the same session id
            cm.sync([{"role": "user", "content": "B-side hello"}])
        with y.turn("auto-1") as cm:  # whose client edits its first message: a rebase from turn 0
            cm.sync([{"role": "user", "content": "B-side hello, edited"}])
            with x1.turn("auto-1", wait=False) as cm_a:  # not held up by the other deployment's turn
                assert len(cm_a) == len(conv)
        conv += [{"role": "assistant", "content": "A reply 11"}]
        with x1.turn("auto-1") as cm:
            assert cm.sync(conv).mode == "append" and len(cm) == len(conv)
        assert [r.message.content for r in x1.store.load("auto-1")] == [m["content"] for m in conv]
        assert [r.message.content for r in y.store.load("auto-1")] == ["B-side hello, edited"]
        assert x1.hot.namespace == x2.hot.namespace != y.hot.namespace
        assert x1.hot.keys("auto-1")[0].startswith(f"{redis_prefix}:{x1.hot.namespace}:{{auto-1}}")
        url = urlsplit(pg_dsn)  # the identity holds the server, database and schema, no credentials
        kind, _server, database, held = x1.store.store.identity.split(" ")
        assert (kind, database, held) == ("postgresql", url.path.lstrip("/"), x1.store.store.schema)
    finally:
        for w in made:
            w.close()
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def other_spelling(url: str) -> str:
    """``url`` with its host spelled another way (``127.0.0.1`` <-> ``localhost``, a name -> its address)."""
    import socket
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    other = "localhost" if host == "127.0.0.1" else socket.gethostbyname(host)
    if other == host:
        pytest.skip(f"no other spelling of the PostgreSQL host {host!r}")
    user, _, hostport = parts.netloc.rpartition("@")
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit(parts._replace(netloc=f"{user}@{other}{port}" if user else f"{other}{port}"))


def test_workers_spelling_the_host_differently_share_the_lock_without_the_system_identifier(
        pg_dsn, pg_url, redis_server_url, redis_prefix, monkeypatch):
    """Where the store's role may not call pg_control_system() (managed services revoke it from
    PUBLIC), the store identity fell back to the host and port as written: workers of one
    deployment spelling the host differently got other Redis namespaces and no longer shared the
    session lock. The identity is then the random id the store keeps in its schema (one per
    schema: another schema of the same database stays apart)."""
    import uuid

    import psycopg
    from _servers import with_query

    from ctxscore.store import postgres

    monkeypatch.setattr(postgres, "_SYSTEM_ID_SQL", "SELECT system_identifier FROM ctx_no_such_function()")
    schema = "t_" + uuid.uuid4().hex[:12]

    def worker(url: str) -> SharedSessions:
        return SharedSessions(open_store(url, redis=RedisHotState(redis_server_url, prefix=redis_prefix)),
                              ContextManager, budget=3000, scorer="rules")

    made = []
    try:
        made += [worker(pg_url), worker(other_spelling(pg_url)), worker(with_query(pg_dsn, schema=schema))]
        x1, x2, y = made
        assert x1.store.store.identity == x2.store.store.identity
        assert x1.store.store.identity.split(" ")[1].startswith("store:")
        assert x1.hot.namespace == x2.hot.namespace != y.hot.namespace
        with x1.turn("s") as cm:
            cm.add({"role": "user", "content": "held by the first worker"})
            with pytest.raises(SessionBusy), x2.turn("s", wait=False):
                pass
            with y.turn("s", wait=False):  # the other schema's session of the same id
                pass
        with x2.turn("s") as cm:
            assert [m.content for m in cm.messages] == ["held by the first worker"]
        assert x2.brought("s") == "opened"
    finally:
        for w in made:
            w.close()
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_a_renewed_lock_outlives_its_timeout_and_keeps_the_hot_state(hot_url):
    """With ``renew_s`` a turn longer than ``lock_timeout_s`` (a proxy waiting for the model) keeps
    its lock: another worker finds the session busy, and the hot state stays."""
    a, = workers(hot_url, 1, hot={"lock_timeout_s": 1.0, "renew_s": 10.0})  # renewed every 0.33 s
    b, = workers(hot_url, 1, hot={"lock_wait_s": 0.2})
    with a.turn("s") as cm:
        cm.add({"role": "user", "content": "first question"})
        time.sleep(3.0)  # three timeouts
        with pytest.raises(StoreError, match="busy"), b.turn("s"):
            pass
        cm.add({"role": "assistant", "content": "answered after a long wait"})
    version = a.hot.version("s")
    assert version is not None and a._kept["s"].version == version
    with b.turn("s") as cm:
        assert [m.content for m in cm.messages] == ["first question", "answered after a long wait"]
    assert b.store.count("s") == 2


@pytest.mark.parametrize("name", ["ttl_s", "lock_timeout_s", "lock_wait_s", "lock_poll_s"])
@pytest.mark.parametrize("value", [0, float("inf"), float("nan")])
def test_times_must_be_positive_finite_seconds(name, value):
    """inf was accepted for ttl_s and then failed as a bare OverflowError (int(inf * 1000))."""
    with pytest.raises(ConfigError, match=f"{name} must be positive, finite seconds, got {value}"):
        RedisHotState("redis://127.0.0.1:1/0", **{name: value})


@pytest.mark.parametrize("url", ["redis://127.0.0.1:1/abc", "redis://127.0.0.1:1/1a", "redis://127.0.0.1:1/0?db=x"])
def test_a_database_that_is_not_a_number_is_refused(url):
    """redis-py read /abc and /1a as database 0: a worker with such a typo took its session locks on a
    database the other workers do not use, so two workers could interleave one session's turns."""
    with pytest.raises(ConfigError, match="is not a number; expected redis://"):
        RedisHotState(url)
    RedisHotState("redis://127.0.0.1:1/3?socket_timeout=2")  # a number, and other parameters: accepted


def test_unreachable_redis(hot_url):
    from _servers import free_port

    pg, _, _ = hot_url
    dead = RedisHotState(f"redis://127.0.0.1:{free_port()}/0")
    sessions = SharedSessions(HotStore(open_store(pg), dead), ContextManager, budget=500, scorer="rules")
    with pytest.raises(StoreError, match="cannot take the session lock"), sessions.turn("s") as cm:
        cm.add({"role": "user", "content": "never runs"})
    store = HotStore(open_store(pg), dead)
    cm = ContextManager(budget=500, scorer="rules", store=store, session_id="t")
    cm.add({"role": "user", "content": "durable even with Redis down"})  # logged, not raised
    assert [r.text for r in open_store(pg).load("t")] == ["durable even with Redis down"]


def test_open_store_with_redis(hot_url):
    pg, rurl, prefix = hot_url
    s = open_store(pg, redis=RedisHotState(rurl, prefix=prefix))
    assert isinstance(s, HotStore)
    s.add("s", [])
    cm = ContextManager(budget=500, scorer="rules", store=s, session_id="s")
    cm.add({"role": "user", "content": "hello"})
    assert s.hot.version("s") == 1
    cm.close()
    from urllib.parse import quote

    s2 = open_store(f"{pg}&redis={quote(rurl, safe='')}")
    assert isinstance(s2, HotStore) and s2.count("s") == 1
    s2.close()


def test_shared_counter_counts_like_tiktoken():
    plain = TokenCounter()
    texts = ["hello world", "中文文本 with mixed script", "x" * 3000, "<|endoftext|> literal"]
    a = SharedTokenCounter()
    assert [a.count(t) for t in texts] == [plain.count(t) for t in texts]
    b = SharedTokenCounter(known=a.take_fresh())
    assert [b.count(t) for t in texts] == [plain.count(t) for t in texts] and b.hits == 4 and not b.fresh
    assert len(text_key("x")) == 16


def test_the_message_count_is_never_set_back_by_a_late_bump(hot_url):
    """Two writers without the turn lock: B commits after A, but A's bump reaches Redis last. The
    count was set back to A's, and a reader skipped B's committed rows; it is only raised now."""
    pg, rurl, prefix = hot_url
    a, b, c = (HotStore(open_store(pg), RedisHotState(rurl, prefix=prefix)) for _ in range(3))
    reader = ContextManager(budget=2000, scorer="rules", store=c, session_id="race")
    a.store.add("race", [NewRecord(Message(role="user", content="from A"), "from A")])  # A committed, not bumped yet
    ContextManager(budget=2000, scorer="rules", store=b, session_id="race").extend(
        [{"role": "user", "content": f"from B {i}"} for i in range(3)])
    a.hot.bump("race", messages=1)  # A's bump, late
    assert c.hot.messages("race") == 4
    reader.build(query="from B")
    assert [m.content for m in reader.messages] == ["from A", "from B 0", "from B 1", "from B 2"]
    a.hot.detached("race", 2)  # a rebase does lower it
    assert c.hot.messages("race") == 2
    for s in (a, b, c):
        s.close()


@pytest.mark.parametrize("part", ["meta", "tiers", "tierlog", "tok", "toklog", "turn", "lock"])
def test_a_foreign_value_under_a_session_key_is_named_and_leaves_no_lock(hot_url, part):
    """A key of the session holding another kind of value (another application writing under
    ctxscore's prefix): the turn's script took the lock, then failed with WRONGTYPE, so the lock
    stayed and every worker found the session "busy" until it expired -- and then the same again.
    The turn now fails at once naming the key, takes no lock, and works once the key is deleted."""
    a, b = workers(hot_url, 2, hot={"lock_wait_s": 3.0})
    with a.turn("s") as cm:
        cm.add({"role": "user", "content": "first question"})
    meta, tiers, tierlog, tok, toklog = a.hot.keys("s")
    key = {"meta": meta, "tiers": tiers, "tierlog": tierlog, "tok": tok, "toklog": toklog,
           "turn": a.hot._key("s", "turn"), "lock": a.hot._key("s", "lock")}[part]
    client = a.hot.client
    client.delete(key)
    if part in ("turn", "lock"):
        client.hset(key, "foreign", "value")
    else:
        client.set(key, "foreign value")
    for w in (b, a, b):
        t0 = time.monotonic()
        with pytest.raises(StoreError, match=re.escape(f"key {key} holds a Redis ") + "(string|hash), not"), w.turn("s"):
            pass
        assert time.monotonic() - t0 < 1.5  # refused at once, not waited for as busy (3 s)
    assert client.type(a.hot._key("s", "lock")) in (b"none", b"hash")  # no lock left behind
    client.delete(key)
    with b.turn("s") as cm:
        cm.add({"role": "assistant", "content": "answered"})
        assert [m.content for m in cm.messages] == ["first question", "answered"]


@pytest.mark.parametrize("part", ["tiers", "tok"])
def test_an_unreadable_value_in_the_hot_state_is_a_store_error_naming_the_key(hot_url, part):
    """A tier or token count ctxscore cannot read (``"bogus"``, ``"nan"``): a worker opening the
    session raised a bare ValueError ("'bogus' is not a valid Tier"), which the proxy answered
    with a bare 500. It is a StoreError naming the key now, and once the key is deleted the
    session is read from the durable store."""
    a, b = workers(hot_url, 2)
    with a.turn("s") as cm:
        cm.add({"role": "user", "content": "first question"})
    meta, tiers, _, tok, _ = a.hot.keys("s")
    key = tiers if part == "tiers" else tok
    a.hot.client.hset(key, "x", "bogus" if part == "tiers" else "nan")
    with pytest.raises(StoreError, match=re.escape(f"key {key} holds a value ctxscore cannot read")), b.turn("s"):
        pass
    a.hot.client.delete(key)
    with b.turn("s") as cm:
        assert [m.content for m in cm.messages] == ["first question"]


def test_an_unreadable_message_count_is_read_past(hot_url):
    """A message count that is not a number: a manager over the HotStore raised a bare ValueError
    at its first read; the count is unknown then, and the session is read from the durable store."""
    pg, rurl, prefix = hot_url
    store = HotStore(open_store(pg), RedisHotState(rurl, prefix=prefix))
    ContextManager(budget=500, scorer="rules", store=store, session_id="s").add({"role": "user", "content": "kept"})
    store.hot.client.hset(store.hot.keys("s")[0], "messages", "abc")
    cm = ContextManager(budget=500, scorer="rules", store=store, session_id="s")
    cm.add({"role": "user", "content": "added"})
    assert [m.content for m in cm.messages] == ["kept", "added"] and store.count("s") == 2
    with pytest.raises(StoreError, match="holds a value ctxscore cannot read"):
        store.hot.client.hset(store.hot.keys("s")[0], "messages", "abc")
        store.hot.messages("s")
    store.close()
