"""The server store: sessions, their original messages, layer records and events in PostgreSQL.

``PostgresStore("postgresql://user:pass@host/db")`` (or ``ContextManager(store="postgresql://...")``)
implements :class:`~ctxscore.store.base.Store` and :class:`~ctxscore.store.base.RecordStore` with
psycopg 3 and a connection pool (extra ``postgres``: ``pip install 'ctxscore[postgres]'``). The
schema is created and upgraded by the versioned SQL files of :mod:`ctxscore.store.migrations`.

Writes: :meth:`PostgresStore.add` takes the session's row lock (``INSERT ... ON CONFLICT DO
UPDATE`` on ``ctx_sessions``), reads the last turn and the used ids, and inserts the batch in one
transaction, so writers on any number of processes or machines never collide and a batch is stored
whole or not at all. Every connection runs with ``synchronous_commit = on``: a write is acknowledged
(the call returns) only after its commit is flushed to the server's write-ahead log, so it survives
a crash of the client or of the server. ``lock_timeout`` (5 s) bounds the wait for a session that
another writer holds.

Search returns the hits :class:`~ctxscore.store.sqlite.SQLiteStore` returns for the same session
(``tests/test_store_contract.py``): every row stores, besides the message, what ranking needs --
the indexed text (the head and tail of a long one), the trigram count, the Porter stems of text and
context that a query can match (:mod:`ctxscore.store.stemming`) with the token count, and the
embedding -- and a search ranks the session in this process with
:class:`~ctxscore.store.session_index.SessionIndex` (FTS5's bm25 over trigram substrings and over
stems, the ``exact`` list of a rare code, the two-character ``LIKE`` list, the numpy vector list), fused by
:func:`~ctxscore.store.retrieval.fuse`. The index of a session is read once and then only the rows
added since (one indexed query per search; a detach makes it read again), in an LRU of
``session_cache`` sessions. With the pgvector extension (migration 0003) the vector list is ranked
by the server instead.

Why not rank in SQL: a search is scoped to one session, so no table-wide index (``pg_trgm`` GIN,
``tsvector`` GIN) narrows it further than the ``(session_id, turn)`` key, and computing bm25 over
the session's text in SQL took 150-300 ms per search on a 620-message tau-bench session, against a
few milliseconds here (``docs/scale.md``). PostgreSQL's word-based full-text search would also rank
differently from SQLite (no substrings, no Chinese without a segmenter). The bm25 statistics
(rows, average length, rows holding a term) span the session, in this store and in SQLite's, which
ranks with the same :class:`~ctxscore.store.session_index.SessionIndex`.

Failures of the server, the network or the pool are raised as :class:`~ctxscore.errors.StoreError`
(the message names the database without its password); bad input as
:class:`~ctxscore.errors.InputError`. Neither changes anything stored.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import numpy as np

from ..errors import ConfigError, InputError, StoreError
from ..messages import Message, Tier
from . import migrations
from .base import (
    Event,
    NewRecord,
    Record,
    StoredMessage,
    check_ids,
    check_limit,
    check_name,
    decode_embedding,
    dump_json,
)
from .retrieval import Hit, RankedList, fuse, query_terms, stem_terms
from .session_index import SessionIndex, index_fields, indexed_message
from .sqlite import index_text, keyword_text
from .stemming import porter_stem

try:  # the extra `postgres`
    import psycopg
    from psycopg import conninfo as _conninfo
    from psycopg_pool import ConnectionPool, PoolTimeout
except ImportError:  # pragma: no cover - exercised without the extra
    psycopg = None  # type: ignore[assignment]

#: URL query parameters read by ctxscore (the others go to libpq): ``schema``, ``pool_min``, ``pool_max``.
#: A pooled connection idle for longer than this (seconds) is tested before it is lent.
CHECK_IDLE_S = 1.0
URL_OPTIONS = ("schema", "pool_min", "pool_max", "timeout", "redis")
_T = TypeVar("_T")
_SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
#: A ``key=value`` pair of a libpq keyword string (a quoted value, closed or not, or a word).
_KEY_VALUE = re.compile(r"(\w+)\s*=\s*('(?:[^'\\]|\\.)*'?|\S*)")
_COLUMNS = "id, turn, role, text, text_exact, message, prediction, tier, embedding"
#: The server's system identifier (the same however a worker spells the host), for :attr:`PostgresStore.identity`.
_SYSTEM_ID_SQL = "SELECT system_identifier FROM pg_control_system()"
log = logging.getLogger("ctxscore")

def _require_driver() -> None:
    if psycopg is None:
        raise ConfigError("the PostgreSQL store needs psycopg 3 and psycopg_pool; install them with "
                          "`pip install 'ctxscore[postgres]'` (or `pip install 'psycopg[binary,pool]'`)")


def split_url(url: str) -> tuple[str, dict[str, str]]:
    """Split a ``postgresql://`` URL into the libpq URL and ctxscore's options (:data:`URL_OPTIONS`).

    A ``key=value`` conninfo string is returned as is, with no options. The libpq URL keeps its
    other parameters exactly as written (:func:`split_query`).

    Raises:
        ConfigError: the URL cannot be read (the message shows no password).
    """
    if "://" not in url:
        return url, {}
    try:
        rest, opts = split_query(url, URL_OPTIONS)
    except ValueError as exc:  # "Invalid IPv6 URL": an unclosed [
        raise ConfigError(f"bad PostgreSQL URL {redact(url)!r}: {exc}") from None
    return rest, dict(opts)


def split_query(url: str, names: Collection[str]) -> tuple[str, list[tuple[str, str]]]:
    """(``url`` without its query parameters named in ``names``, those parameters decoded, in order).

    The other parameters are kept exactly as written: they go to libpq, which decodes ``%20`` but
    takes ``+`` literally, so re-encoding them (``+`` for a space) would change them
    (``options=-c%20statement_timeout%3D5000``).

    Raises:
        ValueError: the URL cannot be split (an unclosed ``[``).
    """
    parts = urlsplit(url)
    kept: list[str] = []
    taken: list[tuple[str, str]] = []
    for piece in parts.query.split("&"):
        pair = parse_qsl(piece, keep_blank_values=True)
        if pair and pair[0][0] in names:
            taken.append(pair[0])
        elif piece:
            kept.append(piece)
    return urlunsplit(parts._replace(query="&".join(kept))), taken


def _libpq_message(message: str, dsn: str) -> str:
    """libpq's message about a ``key=value`` string it cannot read, with every quoted word that is not
    one of the string's keys (or ``=``) masked: ``missing "=" after "hunter2"`` quotes a lone word,
    which may be a password written without its key."""
    keys = {k for k, _ in _KEY_VALUE.findall(dsn)} | {"="}
    return re.sub(r'"([^"]*)"', lambda m: m.group(0) if m.group(1) in keys else '"***"', message.strip())


def redact(dsn: str) -> str:
    """``dsn`` without its password, for messages (``postgresql://user@host:5432/db``). One libpq
    cannot read is shown as its scheme and host part (a URL), or as the ``key=value`` pairs that
    can be made out, the password's value masked (a keyword string)."""
    try:
        info = _conninfo.conninfo_to_dict(dsn) if psycopg is not None else {}
    except Exception:  # noqa: BLE001 - a DSN that does not parse is shown without what may be secret
        scheme, sep, rest = dsn.partition("://")
        if sep:
            return f"{scheme}://{rest.split('@')[-1]}"
        return " ".join(f"{k}=***" if k == "password" else f"{k}={v}" for k, v in _KEY_VALUE.findall(dsn))
    user = info.get("user", "")
    host = info.get("host", "localhost")
    port = info.get("port", "5432")
    db = info.get("dbname", "")
    return f"postgresql://{user + '@' if user else ''}{host}:{port}/{db}"


def _pg_text(text: str) -> tuple[str, str | None]:
    """(text PostgreSQL can hold, the exact text as JSON or ``None``): NUL becomes U+FFFD."""
    if "\x00" not in text:
        return text, None
    return text.replace("\x00", "\ufffd"), json.dumps(text)


class ConnectionLost(StoreError):
    """The server dropped the connection an operation used (a read is then retried once)."""


class PostgresStore:
    """PostgreSQL implementation of :class:`~ctxscore.store.base.Store` and
    :class:`~ctxscore.store.base.RecordStore` (see the module docstring).

    Args:
        dsn: a ``postgresql://`` URL or a libpq ``key=value`` string. URL query parameters
            ``schema``, ``pool_min``, ``pool_max`` and ``timeout`` set the arguments below.
        schema: the PostgreSQL schema holding the tables (created if missing; default: the
            server's ``search_path``, usually ``public``). Letters, digits and ``_``, used exactly
            as given (a quoted identifier: ``TenantA`` and ``tenanta`` are two schemas).
        pool_min, pool_max: connections kept open / opened at most (a manager uses one at a time).
        timeout: seconds to wait for a connection (the server is down or every connection busy)
            before :class:`StoreError`; also the connect timeout.
        session_cache: sessions whose search index (:class:`~ctxscore.store.session_index.SessionIndex`)
            this object keeps in memory (LRU).

    Attributes:
        identity: what names this store's data -- the server's cluster (its system identifier;
            when the role may not read it, as on managed services that revoke
            ``pg_control_system()`` from PUBLIC, the random id the store keeps in its schema,
            ``store:<hex>``, migration 0004), the database and the schema; no user, password or
            host. A :class:`~ctxscore.store.redis_state.HotStore` namespaces its Redis keys by a
            hash of it, so deployments on other databases or schemas sharing one Redis never share
            a session's hot state or lock, and workers of one deployment share them however they
            spell the host. A copy of the database made with ``pg_dump`` keeps the schema's id:
            before its deployment shares a Redis (and prefix) with the original's on such a server,
            ``DELETE FROM ctx_store`` in the copy (the next open writes a new id).

    Raises:
        ConfigError: psycopg is not installed, or a bad argument.
        StoreError: the server cannot be reached, refuses the login, the database is not UTF-8,
            or its schema is newer than this code (nothing is changed then).
    """

    def __init__(self, dsn: str, *, schema: str | None = None, pool_min: int = 1, pool_max: int = 8,
                 timeout: float = 10.0, session_cache: int = 64) -> None:
        _require_driver()
        if not isinstance(dsn, str) or not dsn:
            raise ConfigError(f"dsn must be a PostgreSQL URL or conninfo string, got {dsn!r}")
        dsn, opts = split_url(dsn)
        if "redis" in opts:
            raise ConfigError("the redis= URL parameter is read by ctxscore.store.open_store, not PostgresStore")
        schema = opts.get("schema", schema)
        try:
            pool_min = int(opts.get("pool_min", pool_min))
            pool_max = int(opts.get("pool_max", pool_max))
            timeout = float(opts.get("timeout", timeout))
        except ValueError as exc:
            raise ConfigError(f"bad store URL option: {exc}") from None
        if schema is not None and not _SCHEMA_NAME.match(schema):
            raise ConfigError(f"schema must be letters, digits and _ (at most 63), got {schema!r}")
        if not 1 <= pool_min <= pool_max:
            raise ConfigError(f"need 1 <= pool_min <= pool_max, got {pool_min}, {pool_max}")
        if not 0 < timeout < math.inf:  # nan too: int(timeout) below would raise
            raise ConfigError(f"timeout must be positive, finite seconds, got {timeout}")
        self.where = redact(dsn) + (f" (schema {schema})" if schema else "")
        self.schema = schema
        self.timeout = timeout
        self._cache_size = max(0, int(session_cache))
        self._indexes: OrderedDict[str, SessionIndex] = OrderedDict()  # LRU of the sessions' search indexes
        self._ilock = threading.Lock()
        self._closed = False
        self._last_used: dict[int, float] = {}
        options = "-c synchronous_commit=on -c lock_timeout=5000"
        try:
            base = _conninfo.conninfo_to_dict(dsn)
        except psycopg.Error as exc:
            hint = ""
            if any(f'option "{k}"' in str(exc) for k in URL_OPTIONS):
                hint = ("; with a key=value string, ctxscore's options (schema, pool_min, pool_max, timeout) are "
                        "keyword arguments: open_store(dsn, schema=...), or use a postgresql:// URL")
            raise ConfigError(f"cannot parse the PostgreSQL DSN {redact(dsn)}: {_libpq_message(str(exc), dsn)}{hint}") from None
        if base.get("options"):
            options = f"{base['options']} {options}"
        self.pgvector = False
        try:
            with psycopg.connect(dsn, autocommit=True, connect_timeout=max(1, int(timeout)), options=options) as conn:
                self._check_server(conn)
                migrations.migrate(conn, schema)
                self.identity = self._identity(conn, base, schema)
                self.pgvector = 3 in migrations.applied_versions(conn)
                if self.pgvector:
                    self._backfill_vectors(conn)
        except psycopg.Error as exc:
            raise StoreError(f"cannot open store {self.where}: {_first_line(exc)}; check that the server is up, "
                             "the URL, user and password, and that the database exists. Nothing was changed") from None
        if schema:  # quoted as the migration created it: "TenantA" is not tenanta
            options += f' -c search_path="{schema}",public'
        self._pool = ConnectionPool(dsn, min_size=pool_min, max_size=pool_max, timeout=timeout, open=False,
                                    kwargs={"autocommit": True, "options": options,
                                            "connect_timeout": max(1, int(timeout))},
                                    check=self._check_idle, reset=self._returned, name="ctxscore")
        try:
            self._pool.open(wait=True, timeout=timeout)
        except PoolTimeout as exc:
            self._pool.close()
            raise StoreError(f"cannot open store {self.where}: no connection within {timeout} s ({exc})") from None

    def _returned(self, conn: Any) -> None:
        """Pool callback when a connection comes back: remember when (see :meth:`_check_idle`)."""
        self._last_used[id(conn)] = time.monotonic()

    def _check_idle(self, conn: Any) -> None:
        """Pool callback before lending a connection: one that sat idle for more than
        :data:`CHECK_IDLE_S` is tested with an empty query (the server may have restarted or dropped
        it); a broken one raises, and the pool replaces it. Recently used ones are lent as they are
        (when an operation finds its connection dropped, :meth:`_conn` tests the idle ones at once)."""
        if time.monotonic() - self._last_used.get(id(conn), 0.0) > CHECK_IDLE_S:
            ConnectionPool.check_connection(conn)

    def _check_server(self, conn: Any) -> None:
        enc = conn.execute("SELECT pg_encoding_to_char(encoding) FROM pg_database WHERE datname = current_database()"
                           ).fetchone()[0]
        if isinstance(enc, bytes):  # a SQL_ASCII database returns text undecoded
            enc = enc.decode("ascii", "replace")
        if enc != "UTF8":
            raise StoreError(f"cannot open store {self.where}: the database encoding is {enc}; ctxscore needs "
                             "UTF8 (CREATE DATABASE ... ENCODING 'UTF8' TEMPLATE template0). Nothing was changed")
    @staticmethod
    def _identity(conn: Any, base: dict[str, Any], schema: str | None) -> str:
        """What names this store's data for :attr:`identity` (on a migrated connection): the server's
        cluster (its system identifier, the same however a worker spells the host; when the role may
        not read it, the store's own id, :meth:`_store_id`), the database and the schema."""
        try:
            with conn.transaction():
                server = str(conn.execute(_SYSTEM_ID_SQL).fetchone()[0])
        except psycopg.Error:  # a role without the function's privilege (managed services revoke it)
            try:
                server = f"store:{PostgresStore._store_id(conn)}"
            except psycopg.Error as exc:  # e.g. a role that may not read ctx_store
                server = f"{base.get('host') or 'localhost'}:{base.get('port') or '5432'}"
                log.warning("cannot read the store id (%s); the Redis namespace of this store names the host as "
                            "written, %s: give every worker the same spelling", _first_line(exc), server)
        db, default = conn.execute("SELECT current_database(), current_schema()").fetchone()
        return f"postgresql {server} {db} {schema or default}"

    @staticmethod
    def _store_id(conn: Any) -> str:
        """The random id kept in the schema's ``ctx_store`` (migration 0004), written the first time
        it is needed: concurrent first opens insert with ``ON CONFLICT DO NOTHING`` and read back the
        one row, so they agree (three statements, each its own transaction on this autocommit
        connection: the last one sees the row another open committed, at any isolation level)."""
        row = conn.execute("SELECT store_id FROM ctx_store").fetchone()
        if row is None:
            conn.execute("INSERT INTO ctx_store(store_id) VALUES (%s) ON CONFLICT (one) DO NOTHING",
                         (uuid.uuid4().hex,))
            row = conn.execute("SELECT store_id FROM ctx_store").fetchone()
        return str(row[0])

    def _backfill_vectors(self, conn: Any) -> None:
        """Copy the embeddings stored before pgvector was installed into ``embedding_v``."""
        while True:
            rows = conn.execute("SELECT seq, embedding FROM ctx_messages WHERE embedding IS NOT NULL "
                                "AND embedding_v IS NULL LIMIT 1000").fetchall()
            if not rows:
                return
            with conn.cursor() as cur:
                cur.executemany("UPDATE ctx_messages SET embedding_v = %s::vector WHERE seq = %s",
                                [(_vector_literal(np.frombuffer(b, dtype=np.float32)), q) for q, b in rows])

    # -- plumbing ---------------------------------------------------------------------------------
    @contextmanager
    def _conn(self, what: str, write: bool = False) -> Iterator[Any]:
        """A pooled connection for one operation; server, network and pool failures -> StoreError."""
        if self._closed:
            raise StoreError(f"store {self.where} is closed; open a new one")
        conn = None
        try:
            with self._pool.connection(timeout=self.timeout) as conn:
                yield conn
        except PoolTimeout:
            raise StoreError(f"store {self.where}: cannot {what}: no connection within {self.timeout} s; check "
                             "that the server is up and reachable (or raise pool_max); nothing was changed") from None
        except psycopg.errors.LockNotAvailable:
            raise StoreError(f"store {self.where}: cannot {what}: another writer held the session for more than "
                             "5 s; retry; nothing was changed") from None
        except psycopg.Error as exc:
            tail = ("nothing was changed" if not write else
                    "nothing was acknowledged (if the connection was lost while committing, load the session to "
                    "see whether the write was applied)")
            lost = isinstance(exc, psycopg.OperationalError) and conn is not None and conn.broken
            if lost:  # the server that dropped it (a restart, a failover) has likely dropped the others too:
                self._pool.check()  # test the idle ones now; the dropped ones are replaced (no backoff)
            raise (ConnectionLost if lost else StoreError)(
                f"store {self.where}: cannot {what}: {_first_line(exc)}; {tail}") from None

    def _read(self, what: str, fn: Callable[[Any], _T]) -> _T:
        """Run a read on a pooled connection; when the server dropped that connection (a restart, a
        failover, an idle timeout) the read runs once more on a new or tested one (the pool's idle
        connections are tested when one is found dropped, and the dropped ones replaced)."""
        try:
            with self._conn(what) as conn:
                return fn(conn)
        except ConnectionLost:
            with self._conn(what) as conn:
                return fn(conn)

    # -- writing ----------------------------------------------------------------------------------
    def add(self, session_id: str, records: Sequence[NewRecord]) -> list[StoredMessage]:
        """Append ``records`` to a session in one transaction (see :class:`~ctxscore.store.base.Store`).

        Raises:
            InputError: an explicit id is already used in the session, or a session id or message id
                is too long or holds NUL (:func:`~ctxscore.store.base.check_ids`; nothing is stored).
            StoreError: the server cannot be written (nothing is acknowledged).
        """
        recs = list(records)
        check_ids(session_id, recs)
        if not recs:
            return []
        out: list[StoredMessage] = []
        # one pipeline: BEGIN, the session's lock, its last turn and the wanted ids already used (the
        # explicit ones and the automatic m<turn> ids after the last turn) in one round trip; the
        # rows and COMMIT in another
        explicit = [r.message.id for r in recs if r.message.id is not None]
        with self._conn("add messages", write=True) as conn, conn.pipeline(), conn.transaction():
            conn.execute("INSERT INTO ctx_sessions(session_id) VALUES (%s) ON CONFLICT (session_id) "
                         "DO UPDATE SET epoch = ctx_sessions.epoch", (session_id,))  # takes the session's lock
            last, used_ids = conn.execute(
                "WITH l AS (SELECT COALESCE(MAX(turn), -1) AS last FROM ctx_messages WHERE session_id = %(s)s) "
                "SELECT l.last, ARRAY(SELECT id FROM ctx_messages WHERE session_id = %(s)s AND id = ANY("
                "%(ids)s::text[] || ARRAY(SELECT 'm' || (l.last + 1 + g) FROM generate_series(0, %(n)s - 1) g))) FROM l",
                {"s": session_id, "ids": explicit, "n": len(recs)}).fetchone()
            used = set(used_ids)
            rows = []
            for k, rec in enumerate(recs):
                turn = last + 1 + k
                if rec.message.id is not None:
                    mid = rec.message.id
                    if mid in used:
                        raise InputError(f"message id {mid!r} already exists in session {session_id!r}; give each "
                                         "message a unique id (or none: automatic ids skip the used ones)")
                else:
                    mid = self._free_id(conn, session_id, f"m{turn}", used)
                used.add(mid)
                msg = replace(rec.message, id=mid, turn=turn)
                text, exact = _pg_text(rec.text)
                context, _ = _pg_text(rec.context)
                # the stems and document length of the head and tail of a long text (the keyword list
                # counts terms in more of it, keyword_text); itext, which kept that part, is no longer written
                ntok, stems, stems_ctx, stem_ntok = index_fields(index_text(text), context)
                blob = None if rec.embedding is None else np.asarray(rec.embedding, dtype=np.float32).tobytes()
                row = [session_id, mid, turn, msg.role, text, exact, None, context,
                       ntok, " ".join(stems), " ".join(stems_ctx), stem_ntok,
                       json.dumps(msg.to_openai(), ensure_ascii=False),
                       None if rec.prediction is None else json.dumps(rec.prediction, ensure_ascii=False), blob]
                if self.pgvector:
                    row.append(None if rec.embedding is None else _vector_literal(rec.embedding))
                rows.append(row)
                out.append(StoredMessage(msg, rec.text, rec.prediction, Tier.VERBATIM, rec.embedding))
            cols = ("session_id, id, turn, role, text, text_exact, itext, context, ntok, stems, stems_ctx, stem_ntok, "
                    "message, prediction, embedding")
            if self.pgvector:
                cols += ", embedding_v"
            marks = ", ".join(["%s"] * len(rows[0]))
            with conn.cursor() as cur:
                cur.executemany(f"INSERT INTO ctx_messages({cols}) VALUES ({marks})", rows)
        return out

    @staticmethod
    def _free_id(conn: Any, session_id: str, base: str, used: set[str]) -> str:
        """``base``, or ``base-1``, ``base-2`` ... the first id not used in the session."""
        mid, k = base, 0
        while mid in used or (k > 0 and conn.execute("SELECT 1 FROM ctx_messages WHERE session_id = %s AND id = %s",
                                                     (session_id, mid)).fetchone()):
            k += 1
            mid = f"{base}-{k}"
        return mid

    def set_tiers(self, session_id: str, tiers: Iterable[tuple[str, Tier]]) -> None:
        """Record the current tier of messages: ``tiers`` is (message id, tier) pairs (unknown ids are
        ignored).

        Raises:
            StoreError: the server cannot be written (no tier is changed).
        """
        rows = [(str(Tier(t)), session_id, i) for i, t in tiers]
        if not rows:
            return
        with self._conn("record tiers", write=True) as conn, conn.transaction(), conn.cursor() as cur:
            cur.executemany("UPDATE ctx_messages SET tier = %s WHERE session_id = %s AND id = %s", rows)

    def detach(self, session_id: str, from_turn: int) -> str:
        """Move the messages of ``session_id`` from ``from_turn`` on to a new session and return its id
        (``<session_id>~detached~<n>``); they stay stored and searchable there."""
        with self._conn("detach messages", write=True) as conn, conn.transaction():
            (n,) = conn.execute(
                "INSERT INTO ctx_sessions(session_id, detached, epoch) VALUES (%s, 1, 1) ON CONFLICT (session_id) "
                "DO UPDATE SET detached = ctx_sessions.detached + 1, epoch = ctx_sessions.epoch + 1 RETURNING detached",
                (session_id,)).fetchone()
            target = f"{session_id}~detached~{n}"
            while conn.execute("SELECT 1 FROM ctx_messages WHERE session_id = %s LIMIT 1", (target,)).fetchone():
                n = conn.execute("UPDATE ctx_sessions SET detached = detached + 1 WHERE session_id = %s "
                                 "RETURNING detached", (session_id,)).fetchone()[0]
                target = f"{session_id}~detached~{n}"
            conn.execute("INSERT INTO ctx_sessions(session_id) VALUES (%s) ON CONFLICT (session_id) "
                         "DO UPDATE SET epoch = ctx_sessions.epoch + 1", (target,))
            conn.execute("UPDATE ctx_messages SET session_id = %s WHERE session_id = %s AND turn >= %s",
                         (target, session_id, from_turn))
        with self._ilock:
            self._indexes.pop(session_id, None)
            self._indexes.pop(target, None)
        return target

    # -- reading ----------------------------------------------------------------------------------
    def _row(self, session_id: str, r: tuple[Any, ...]) -> StoredMessage:
        mid, turn, role, text, exact, message, prediction, tier, blob = r
        try:
            msg = Message.from_dict(json.loads(message), where=f"stored message {mid!r}")
            pred = None if prediction is None else json.loads(prediction)
            if pred is not None and not isinstance(pred, dict):
                raise ValueError(f"its prediction is a JSON {type(pred).__name__}, not an object")
            tier = Tier(tier)
            if exact is not None:
                text = json.loads(exact)
        except (ValueError, InputError) as exc:
            raise StoreError(
                f"store {self.where}: session {session_id!r} message {mid!r} (turn {turn}) is damaged ({exc}); "
                "restore it from a backup or remove that row"
            ) from None
        emb = decode_embedding(blob, f"store {self.where}: session {session_id!r} message {mid!r} (turn {turn})")
        return StoredMessage(replace(msg, id=mid, turn=turn), text, pred, tier, emb)

    def load(self, session_id: str, after_turn: int = -1) -> list[StoredMessage]:
        """The session's messages with a turn above ``after_turn``, in turn order.

        Raises:
            InputError: the session id holds NUL (PostgreSQL cannot hold it: no such session).
            StoreError: the server cannot be read, or a row is damaged (it names the row).
        """
        check_name(session_id, "session id")
        rows = self._read("read the session", lambda conn: conn.execute(
            f"SELECT {_COLUMNS} FROM ctx_messages WHERE session_id = %s AND turn > %s ORDER BY turn",
            (session_id, after_turn)).fetchall())
        return [self._row(session_id, r) for r in rows]

    def get(self, session_id: str, message_id: str) -> StoredMessage | None:
        """One stored message, or ``None``."""
        r = self._read("read a message", lambda conn: conn.execute(
            f"SELECT {_COLUMNS} FROM ctx_messages WHERE session_id = %s AND id = %s", (session_id, message_id)).fetchone())
        return None if r is None else self._row(session_id, r)

    def count(self, session_id: str) -> int:
        """Number of stored messages in a session."""
        return self._read("count messages", lambda conn: conn.execute(
            "SELECT count(*) FROM ctx_messages WHERE session_id = %s", (session_id,)).fetchone()[0])

    @contextmanager
    def _session_index(self, conn: Any, session_id: str) -> Iterator[SessionIndex]:
        """The session's search index, up to date and locked for the caller: read once, then only
        the rows added since (by any writer); read again whole when messages left the session (its
        epoch changed)."""
        with self._ilock:
            index = self._indexes.get(session_id)
            if index is None:
                index = SessionIndex()
                if self._cache_size:
                    self._indexes[session_id] = index
                    while len(self._indexes) > self._cache_size:
                        self._indexes.popitem(last=False)
            else:
                self._indexes.move_to_end(session_id)
        with index.lock:
            while True:
                rows = conn.execute(
                    "SELECT s.epoch, m.seq, m.id, m.turn, m.text, m.context, m.ntok, m.stems, m.stems_ctx, "
                    "m.stem_ntok, m.embedding FROM ctx_sessions s LEFT JOIN ctx_messages m "
                    "ON m.session_id = s.session_id AND m.seq > %s WHERE s.session_id = %s ORDER BY m.seq",
                    (index.seen, session_id)).fetchall()
                if not rows or index.epoch in (None, rows[0][0]):
                    break
                index.reset()  # messages moved out: read the session again
            if rows:
                index.epoch = rows[0][0]
                new = [indexed_message(mid, turn, text, keyword_text(text), context, ntok,  # the keyword list's part
                                       stems.split(), sctx.split(), sn,
                                       decode_embedding(blob, f"store {self.where}: session {session_id!r} "
                                                              f"message {mid!r} (turn {turn})"))
                       for _, seq, mid, turn, text, context, ntok, stems, sctx, sn, blob in rows
                       if seq is not None]
                if new:
                    index.extend(new)
                    index.seen = max(r[1] for r in rows if r[1] is not None)
            yield index

    def search(self, session_id: str, query: str, k: int = 10, *, query_embedding: np.ndarray | None = None,
               only: Callable[[str], bool] | None = None, limit: int = 100) -> list[Hit]:
        """Hybrid search of a session's messages (see the module docstring).

        Args:
            session_id: the session.
            query: free text (any characters; nothing is interpreted as SQL, LIKE or regex syntax).
            k: number of hits to return.
            query_embedding: the query's ``(dim,)`` embedding (same embedder as the stored ones).
            only: keep only message ids for which this returns True.
            limit: candidates taken from each ranked list before fusion.

        Returns:
            Up to ``k`` hits, best first.

        Raises:
            StoreError: the server cannot be read.
        """
        query = query.replace("\x00", " ")
        fts_terms, short_terms = query_terms(query)
        stems = [porter_stem(w) for w in stem_terms(query)]

        def ranked(conn: Any) -> tuple[list[RankedList], dict[str, float]]:
            lists: list[RankedList] = []
            similarity: dict[str, float] = {}
            with self._session_index(conn, session_id) as index:
                lists.extend(index.lexical(fts_terms, stems, short_terms, limit))
                vec = index.vector(np.asarray(query_embedding, dtype=np.float32), limit) \
                    if query_embedding is not None and not self.pgvector else None
            if vec is not None:
                lists.append(vec[0])
                similarity = vec[1]
            elif query_embedding is not None:
                q = _vector_literal(np.asarray(query_embedding, dtype=np.float32))  # pgvector ranks in the server
                rows = conn.execute(
                    "SELECT id, turn, substr(text, 1, 120), -(embedding_v <#> %s::vector) AS sim FROM ctx_messages "
                    "WHERE session_id = %s AND embedding_v IS NOT NULL ORDER BY embedding_v <#> %s::vector, seq "
                    "LIMIT %s", (q, session_id, q, limit)).fetchall()
                lists.append(("vector", [(r[0], r[1], r[2]) for r in rows]))
                similarity = {r[0]: float(r[3]) for r in rows}
            return lists, similarity

        lists, similarity = self._read("search", ranked)
        return fuse(lists, k=k, only=only, similarity=similarity)

    # -- layer records and events (ctxscore.store.base.RecordStore) -------------------------------
    def put_records(self, scope: str, kind: str, records: Mapping[str, Any]) -> dict[str, int]:
        """Insert or replace records (key -> JSON value) under (scope, kind) in one transaction.

        Returns each key's new version (1 for a new key). Raises :class:`InputError` (bad names or
        values) or :class:`StoreError`; nothing is stored then.
        """
        from .sqlite import _record_rows

        rows = _record_rows(scope, kind, records)
        out: dict[str, int] = {}
        if not rows:
            return out
        with self._conn("put records", write=True) as conn, conn.transaction():
            for key, value in rows:
                (version,) = conn.execute(
                    "INSERT INTO ctx_records(scope, kind, key, value, version) VALUES (%s, %s, %s, %s, 1) "
                    "ON CONFLICT (scope, kind, key) DO UPDATE SET value = EXCLUDED.value, "
                    "version = ctx_records.version + 1, updated = now() RETURNING version",
                    (scope, kind, key, value)).fetchone()
                out[key] = version
        return out

    def records(self, scope: str, kind: str) -> dict[str, Record]:
        """Every record under (scope, kind), by key."""
        from .sqlite import _load_json

        check_name(scope, "scope")
        check_name(kind, "kind")
        rows = self._read("read records", lambda conn: conn.execute("SELECT key, value, version, extract(epoch FROM updated)::float8 FROM ctx_records "
                                "WHERE scope = %s AND kind = %s ORDER BY key", (scope, kind)).fetchall())
        return {k: Record(k, _load_json(v, f"record {scope!r}/{kind!r}/{k!r}", self.where), n, u)
                for k, v, n, u in rows}

    def delete_records(self, scope: str, kind: str, keys: Iterable[str]) -> int:
        """Delete records by key under (scope, kind); returns how many existed."""
        check_name(scope, "scope")
        check_name(kind, "kind")
        ks = [check_name(k, "record key") for k in keys]
        if not ks:
            return 0
        with self._conn("delete records", write=True) as conn, conn.transaction():
            cur = conn.execute("DELETE FROM ctx_records WHERE scope = %s AND kind = %s AND key = ANY(%s)",
                               (scope, kind, ks))
            return cur.rowcount

    def append_events(self, scope: str, events: Sequence[Any]) -> list[int]:
        """Append JSON values to the scope's log in one transaction; returns their sequence numbers
        (gap-free per scope, in commit order: appenders hold the scope's head row until they commit)."""
        check_name(scope, "scope")
        data = [dump_json(e, f"event {i}") for i, e in enumerate(events)]
        if not data:
            return []
        with self._conn("append events", write=True) as conn, conn.transaction():
            (last,) = conn.execute(
                "INSERT INTO ctx_event_heads(scope, last_seq) VALUES (%s, %s) ON CONFLICT (scope) "
                "DO UPDATE SET last_seq = ctx_event_heads.last_seq + EXCLUDED.last_seq RETURNING last_seq",
                (scope, len(data))).fetchone()
            first = last - len(data) + 1
            with conn.cursor() as cur:
                cur.executemany("INSERT INTO ctx_events(scope, seq, data) VALUES (%s, %s, %s)",
                                [(scope, first + i, d) for i, d in enumerate(data)])
        return list(range(first, last + 1))

    def events(self, scope: str, after: int = 0, limit: int | None = None) -> list[Event]:
        """The scope's events with ``seq > after``, in order, at most ``limit``."""
        from .sqlite import _load_json

        check_name(scope, "scope")
        lim = check_limit(limit)
        if isinstance(after, bool) or not isinstance(after, int):
            raise InputError(f"after must be an integer sequence number, got {after!r}")
        rows = self._read("read events", lambda conn: conn.execute(
            "SELECT seq, data, extract(epoch FROM created)::float8 FROM ctx_events WHERE scope = %s AND seq > %s "
            "ORDER BY seq LIMIT %s", (scope, after, lim)).fetchall())
        return [Event(q, _load_json(d, f"event {scope!r}/{q}", self.where), t) for q, d, t in rows]

    # -- life cycle -------------------------------------------------------------------------------
    def close(self) -> None:
        """Close the pool's connections (a second call does nothing)."""
        if not self._closed:
            self._closed = True
            self._pool.close()

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PostgresStore({self.where!r})"


def _vector_literal(v: np.ndarray | Sequence[float]) -> str:
    """A pgvector text literal ``[x,y,...]`` of a float32 vector (exact round trip)."""
    return "[" + ",".join(repr(float(x)) for x in np.asarray(v, dtype=np.float32)) + "]"


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def wait_for_server(dsn: str, timeout: float = 30.0) -> None:
    """Block until ``dsn`` accepts a connection (for scripts that start a server).

    Raises:
        StoreError: no connection within ``timeout`` seconds.
    """
    _require_driver()
    dsn, _ = split_url(dsn)
    end = time.monotonic() + timeout
    while True:
        try:
            psycopg.connect(dsn, connect_timeout=2).close()
            return
        except psycopg.Error as exc:
            if time.monotonic() > end:
                raise StoreError(f"no PostgreSQL server at {redact(dsn)} after {timeout} s: {_first_line(exc)}") from None
            time.sleep(0.2)
