"""PostgreSQL store specifics, against a real server: versioned migrations (recorded once, checksums,
newer schemas refused, concurrent first opens), durability settings, the pool (a lost connection is
replaced, an exhausted pool is a StoreError), UTF-8 only, per-session search statistics, pgvector
when the server has it. The behaviour shared with SQLite is in ``test_store_contract.py``."""

from __future__ import annotations

import threading
import time
import uuid

import numpy as np
import pytest

from ctxscore import ContextManager
from ctxscore.errors import ConfigError, StoreError
from ctxscore.messages import Message
from ctxscore.store import NewRecord, open_store, redis_in_url
from ctxscore.store.migrations import latest_version, migrations

psycopg = pytest.importorskip("psycopg")
from ctxscore.store.postgres import PostgresStore, redact, split_url  # noqa: E402


def rec(mid, text, embedding=None):
    return NewRecord(Message(role="user", content=text, id=mid), text, embedding=embedding)


def admin(pg_url: str):
    dsn, opts = split_url(pg_url)
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(f'SET search_path TO "{opts["schema"]}"')
    return conn


def test_migrations_are_recorded_once(pg_url):
    s = PostgresStore(pg_url)
    s.close()
    s = PostgresStore(pg_url)  # a second open applies nothing
    with admin(pg_url) as conn:
        rows = conn.execute("SELECT version, name, checksum FROM ctx_schema_migrations ORDER BY version").fetchall()
    files = {m.version: m for m in migrations()}
    required = [m.version for m in files.values() if m.requires is None]
    assert [r[0] for r in rows if files[r[0]].requires is None] == required == [1, 2, 4]
    assert all(files[v].checksum == c and files[v].name == n for v, n, c in rows)
    assert s.pgvector == (3 in [r[0] for r in rows])
    s.close()


def test_newer_schema_is_refused_and_untouched(pg_url):
    PostgresStore(pg_url).close()
    with admin(pg_url) as conn:
        conn.execute("INSERT INTO ctx_schema_migrations(version, name, checksum) VALUES (%s, 'future', 'x')",
                     (latest_version() + 1,))
        before = conn.execute("SELECT version, checksum FROM ctx_schema_migrations ORDER BY version").fetchall()
    with pytest.raises(StoreError, match="newer than this ctxscore"):
        PostgresStore(pg_url)
    with admin(pg_url) as conn:
        assert conn.execute("SELECT version, checksum FROM ctx_schema_migrations ORDER BY version").fetchall() == before


def test_edited_migration_is_refused(pg_url):
    PostgresStore(pg_url).close()
    with admin(pg_url) as conn:
        conn.execute("UPDATE ctx_schema_migrations SET checksum = 'edited' WHERE version = 1")
    with pytest.raises(StoreError, match="never edit an applied migration"):
        PostgresStore(pg_url)


def test_concurrent_first_opens_migrate_once(pg_url):
    stores, errors = [], []

    def open_one() -> None:
        try:
            stores.append(PostgresStore(pg_url, pool_min=1, pool_max=2))
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors and len(stores) == 4
    stores[0].add("s", [rec(None, "written by the first")])
    assert [r.text for r in stores[3].load("s")] == ["written by the first"]
    with admin(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM ctx_schema_migrations WHERE version = 1").fetchone()[0] == 1
    for s in stores:
        s.close()


def test_concurrent_first_opens_agree_on_one_store_id(pg_url, monkeypatch):
    """Without the server's system identifier (a role that may not call pg_control_system()) the
    identity is the store's own id, written by the first open that needs it: opens racing for it
    agree on one; a deleted id (a copy of the database) is written anew at the next open."""
    from ctxscore.store import postgres

    monkeypatch.setattr(postgres, "_SYSTEM_ID_SQL", "SELECT system_identifier FROM ctx_no_such_function()")
    PostgresStore(pg_url).close()  # migrated; the id is written below, by the racing opens
    with admin(pg_url) as conn:
        conn.execute("DELETE FROM ctx_store")
    stores, errors = [], []

    def open_one() -> None:
        try:
            stores.append(PostgresStore(pg_url, pool_min=1, pool_max=1))
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors and len({s.identity for s in stores}) == 1
    with admin(pg_url) as conn:
        (stored,) = conn.execute("SELECT store_id FROM ctx_store").fetchall()
        assert stores[0].identity.split(" ")[1] == f"store:{stored[0]}"
        conn.execute("DELETE FROM ctx_store")
    again = PostgresStore(pg_url)
    assert again.identity != stores[0].identity
    for s in [*stores, again]:
        s.close()


def test_acknowledged_writes_are_synchronous(pg_url):
    s = PostgresStore(pg_url)
    with s._pool.connection() as conn:
        assert conn.execute("SHOW synchronous_commit").fetchone()[0] == "on"
        assert conn.execute("SHOW fsync").fetchone()[0] == "on"
    s.close()


def _kill_connections(pg_url: str) -> int:
    with admin(pg_url) as conn:  # the server ends every other connection (a restart, a failover)
        return conn.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
            "AND datname = current_database() AND backend_type = 'client backend'").fetchone()[0]


def test_a_lost_connection_is_replaced(pg_url):
    s = PostgresStore(pg_url, pool_min=2, pool_max=2)
    s.add("s", [rec(None, "before the server dropped us")])
    assert _kill_connections(pg_url) >= 2
    assert [r.text for r in s.load("s")] == ["before the server dropped us"]  # a read is retried on a new one
    s.add("s", [rec(None, "after")])
    assert [r.text for r in s.load("s")] == ["before the server dropped us", "after"]
    s.close()


def test_a_write_on_a_dropped_connection_is_refused_whole(pg_url):
    s = PostgresStore(pg_url, pool_min=1, pool_max=1)
    s.add("s", [rec(None, "first")])
    assert _kill_connections(pg_url) >= 1
    with pytest.raises(StoreError, match="nothing was acknowledged"):  # just used: lent without a check
        s.add("s", [rec(None, "not acknowledged"), rec(None, "nor this")])
    s.add("s", [rec(None, "second")])  # the pool replaced the connection; the client retries
    assert [r.text for r in s.load("s")] == ["first", "second"]
    time.sleep(1.2)
    assert _kill_connections(pg_url) >= 1
    s.add("s", [rec(None, "third")])  # idle for over a second: tested before it is lent, and replaced
    assert [r.text for r in s.load("s")] == ["first", "second", "third"]
    s.close()


def test_exhausted_pool_is_a_store_error(pg_url):
    s = PostgresStore(pg_url, pool_min=1, pool_max=1, timeout=1)
    held = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with s._pool.connection():
            held.set()
            release.wait(10)

    th = threading.Thread(target=hold)
    th.start()
    held.wait(10)
    try:
        with pytest.raises(StoreError, match="no connection within 1.0 s"):
            s.load("s")
    finally:
        release.set()
        th.join()
    assert s.load("s") == []
    s.close()
    with pytest.raises(StoreError, match="closed"):
        s.load("s")


def test_non_utf8_database_is_refused(pg_dsn):
    name = "ctx_ascii_" + uuid.uuid4().hex[:8]
    try:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name} ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
    except psycopg.Error as exc:
        pytest.skip(f"cannot create a test database here: {exc}")
    try:
        url = pg_dsn.rsplit("/", 1)[0] + f"/{name}"
        with pytest.raises(StoreError, match="encoding is SQL_ASCII"):
            PostgresStore(url)
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name}")


def test_search_statistics_are_per_session(pg_url, tmp_path):
    """Another session never changes a session's ranking (bm25 statistics per session, as in SQLite)."""
    texts = [f"the booking reference of trip {i} is REF{i:03d}" for i in range(6)] + ["hotel hotel booking"] * 2
    pg = PostgresStore(pg_url)
    pg.add("a", [rec(None, t) for t in texts])
    before = [(h.id, h.score) for h in pg.search("a", "booking hotel reference")]
    pg.add("b", [rec(None, "booking " * 50) for _ in range(40)])
    assert [(h.id, h.score) for h in pg.search("a", "booking hotel reference")] == before
    lite = open_store(str(tmp_path / "one.db"))
    lite.add("a", [rec(None, t) for t in texts])
    assert [h.id for h in lite.search("a", "booking hotel reference")] == [h for h, _ in before]
    pg.close()
    lite.close()


def test_vector_cache_follows_other_writers_and_detach(pg_url):
    a, b = PostgresStore(pg_url), PostgresStore(pg_url)
    e = np.eye(4, dtype=np.float32)
    a.add("s", [rec("x", "first", e[0]), rec("y", "second", e[1])])
    assert a.search("s", "zzz", query_embedding=e[1])[0].id == "y"
    b.add("s", [rec("z", "third", e[2])])  # another process appends: the cache reads only the new row
    assert a.search("s", "zzz", query_embedding=e[2])[0].id == "z"
    b.detach("s", 1)  # messages leave the session: the cache is read again
    assert [h.id for h in a.search("s", "zzz", query_embedding=e[2])] == ["x"]
    a.close()
    b.close()


def test_url_options_and_redaction(pg_url):
    assert split_url("postgresql://u:p@h:1/db?schema=x&sslmode=disable&pool_max=3") == (
        "postgresql://u:p@h:1/db?sslmode=disable", {"schema": "x", "pool_max": "3"})
    assert redact("postgresql://u:secret@h:1/db") == "postgresql://u@h:1/db"
    with pytest.raises(ConfigError, match="schema"):
        PostgresStore(pg_url.split("?")[0], schema="bad-name; drop")
    with pytest.raises(ConfigError, match="pool_min"):
        open_store(pg_url + "&pool_min=3&pool_max=2")
    cm = ContextManager(budget=500, scorer="rules", store=pg_url + "&pool_max=2", session_id="u")
    cm.add({"role": "user", "content": "hello"})
    assert cm.store.count("u") == 1 and "secret" not in repr(cm.store)
    cm.close()


def test_pgvector_ranks_in_the_server_when_present(pg_url):
    s = PostgresStore(pg_url)
    if not s.pgvector:
        s.close()
        pytest.skip("the server has no pgvector extension (not packaged for Debian 12's PostgreSQL 15): "
                    "vector search runs in numpy")
    e = np.eye(4, dtype=np.float32)
    s.add("s", [rec("x", "first", e[0]), rec("y", "second", e[1] * 0.5 + e[0] * 0.1)])
    assert [h.id for h in s.search("s", "zzz", query_embedding=e[1])][:1] == ["y"]
    s.close()


def test_searches_while_other_threads_append(pg_url):
    s = PostgresStore(pg_url, pool_max=4)
    errors: list[BaseException] = []

    def write(t: int) -> None:
        try:
            for i in range(25):
                s.add("s", [rec(None, f"booking reference R{t}{i:03d} for the hotel in city {i}")])
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    def read() -> None:
        try:
            for _ in range(25):
                s.search("s", "which booking reference for the hotel?")
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(t,)) for t in range(2)] + [threading.Thread(target=read) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    got = [(h.id, h.score) for h in s.search("s", "which booking reference for the hotel?", k=20)]
    fresh = PostgresStore(pg_url)  # its own index, read in one go
    assert [(h.id, h.score) for h in fresh.search("s", "which booking reference for the hotel?", k=20)] == got
    assert len(s._indexes["s"].messages) == 50 == s.count("s")
    s.close()
    fresh.close()


def test_a_schema_with_capitals_holds_the_data(pg_dsn):
    """``schema=TenantA`` is the schema the migration creates ("TenantA", quoted), not ``tenanta``
    or ``public`` (the connections' search_path was unquoted: the rows landed in public)."""
    schema = "T_Case" + uuid.uuid4().hex[:8]
    sid = "case-" + uuid.uuid4().hex[:8]
    try:
        with PostgresStore(f"{pg_dsn}?schema={schema}") as s:
            s.add(sid, [rec(None, "tenant secret")])
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            n = conn.execute(f'SELECT count(*) FROM "{schema}".ctx_messages WHERE session_id = %s', (sid,)).fetchone()
            assert n[0] == 1
            leaked = conn.execute("SELECT to_regclass('public.ctx_messages')").fetchone()[0]
            if leaked is not None:
                assert conn.execute("SELECT count(*) FROM public.ctx_messages WHERE session_id = %s",
                                    (sid,)).fetchone()[0] == 0
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_a_libpq_keyword_string_opens_postgres_not_a_file(pg_url, tmp_path, monkeypatch):
    """``"host=... dbname=..."`` (the DSN form PostgresStore documents) was taken for a SQLite file
    named after it, password included; it opens the PostgreSQL store, in the manager and the proxy."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    dsn, opts = split_url(pg_url)
    PostgresStore(pg_url).close()  # creates the test's schema
    info = conninfo_to_dict(dsn)
    info.setdefault("password", "pw-not-on-disk")
    conninfo = make_conninfo(**info, options=f"-c search_path={opts['schema']}")
    assert not conninfo.startswith("postgres")
    monkeypatch.chdir(tmp_path)
    cm = ContextManager(budget=500, scorer="rules", store=conninfo, session_id="kv")
    cm.add({"role": "user", "content": "hello"})
    assert isinstance(cm.store, PostgresStore) and cm.store.count("kv") == 1
    cm.close()
    with open_store(conninfo, schema=opts["schema"]) as s:
        assert isinstance(s, PostgresStore) and s.count("kv") == 1
    from ctxscore.serve import create_app

    app = create_app("http://127.0.0.1:9/v1", 500, scorer="rules", store=conninfo, warm=False)
    cm = app.state.proxy.sessions.factory("kv")
    assert isinstance(cm.store, PostgresStore) and len(cm) == 1
    app.state.proxy.sessions.close()
    assert list(tmp_path.iterdir()) == []


def test_a_read_after_the_server_dropped_every_connection_succeeds(pg_url):
    """Every pooled connection used just before the server dropped them all: the read's one retry
    landed on another dropped connection (lent untested, as recently used) and failed."""
    s = PostgresStore(pg_url, pool_min=4, pool_max=4)
    s.add("s", [rec(None, "hello")])
    start = threading.Barrier(4)

    def reads() -> None:
        start.wait()
        for _ in range(30):
            s.load("s")

    threads = [threading.Thread(target=reads) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _kill_connections(pg_url) >= 4
    for _ in range(6):
        assert [r.text for r in s.load("s")] == ["hello"]
    s.close()


def test_libpq_url_parameters_with_spaces_reach_the_server(pg_url):
    """``?options=-c%20statement_timeout%3D5000`` (libpq's way to set a server parameter) and an
    ``application_name`` with a space: ctxscore re-encoded the URL's query with ``+`` for a space,
    which libpq does not decode, and the server refused the login ("unrecognized configuration
    parameter +statement_timeout") or kept ``my+app``. They reach the server as written now."""
    url = pg_url + "&options=-c%20statement_timeout%3D4321&application_name=my%20app"
    assert split_url(url)[0].endswith("?options=-c%20statement_timeout%3D4321&application_name=my%20app")
    assert redis_in_url(url + "&redis=redis%3A%2F%2Fh%3A1%2F0") == (url, "redis://h:1/0")
    with open_store(url) as s, s._conn("read settings") as conn:
        assert conn.execute("SHOW statement_timeout").fetchone()[0] == "4321ms"
        assert conn.execute("SHOW application_name").fetchone()[0] == "my app"


@pytest.mark.parametrize("dsn", [
    "host=127.0.0.1 dbname=db user=u password=hunter2 schema=x",
    "host=127.0.0.1 password='hunter2 and more' pool_max=3",
    "host=127.0.0.1 password='hunter2",
    "host=127.0.0.1 user=u hunter2",  # a lone word, quoted by libpq: missing "=" after "hunter2"
])
def test_a_keyword_string_that_does_not_parse_never_shows_its_password(dsn):
    """A libpq ``key=value`` string libpq cannot read (a ctxscore URL option in it, an unclosed
    quote) was shown whole in the ConfigError, password included; libpq's own message quoted a lone
    word (a password written without its key)."""
    with pytest.raises(ConfigError, match="cannot parse the PostgreSQL DSN host=127.0.0.1") as err:
        open_store(dsn)
    assert "hunter2" not in str(err.value) and "hunter2" not in redact(dsn)
    assert ("password=***" in str(err.value)) == ("password" in dsn)
    if "schema" in dsn:  # ctxscore's own options go as keyword arguments with such a string
        assert "open_store(dsn, schema=...)" in str(err.value)


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
def test_a_timeout_that_is_not_a_positive_finite_number_is_a_config_error(pg_url, value):
    """``?timeout=nan`` or ``inf`` passed the check (``nan <= 0`` is false) and failed deep inside
    with a bare ValueError / OverflowError (``int(timeout)``); ``ctxscore serve`` printed a traceback."""
    with pytest.raises(ConfigError, match=f"timeout must be positive, finite seconds, got {value}"):
        open_store(pg_url + f"&timeout={value}")
