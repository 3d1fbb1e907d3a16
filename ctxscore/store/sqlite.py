"""The embedded store: every original message of one or more sessions in one SQLite file (or memory).

Storage: stdlib ``sqlite3`` in WAL mode with a :data:`BUSY_TIMEOUT_S` busy timeout, so several
processes may share a file; opening retries a lock SQLite reports without waiting, and a closing
connection no longer holds the write lock while it waits for other connections' readers. Tables: ``meta`` (schema version), ``messages`` (the original OpenAI-style message as JSON, its
rendered text, its index context -- the start of the previous messages and the message's facts --,
the scorer's prediction, the current tier and the embedding), ``records`` and ``events`` (the
layers' records and event logs). Schema version 5; a version 2, 3 or 4 file is upgraded in place
the first time it is opened (5 dropped the FTS5 tables ``messages_fts`` and ``messages_stem`` of the
earlier versions: search no longer reads them).

Writes are atomic: :meth:`SQLiteStore.add` allocates turns and automatic ids inside one
``BEGIN IMMEDIATE`` transaction, so two managers or processes appending to one session never
collide, and a batch is stored whole or not at all.

Search ranks one session in this process with :class:`~ctxscore.store.session_index.SessionIndex`,
the PostgreSQL store's engine: bm25 over case-folded substrings of three or more characters (what
FTS5's trigram tokenizer matches, https://www.sqlite.org/fts5.html#the_trigram_tokenizer, so
Chinese text matches without a segmenter) and over Porter stems (FTS5's ``porter unicode61``), with
the context weighted :data:`~ctxscore.store.retrieval.CONTEXT_WEIGHT`; a ``LIKE`` list per
two-character term (Chinese words a trigram cannot match), newest first; the messages holding a
rare code of the query (the ``exact`` list); cosine similarity to the query embedding; fused by :func:`ctxscore.store.retrieval.fuse`. The bm25 statistics are the
session's, so every store ranks a session the same, whatever else its file holds. A session's
index is read from the file at its first search and then only the rows added since (by any
connection), in an LRU of :data:`SESSION_INDEXES` sessions. Measured against the FTS5 indexes of
schema 4 (same hits on a file of one session): a 620-message tau-bench session 11.2 -> 4.8 ms a
search, a 300-message mini-SWE-agent session with its observations as queries 112 -> 19 ms, and
``add`` no longer writes two full-text indexes. Every ``sqlite3`` failure (a damaged or foreign
file, a full disk, a lock held too long) is raised as :class:`~ctxscore.errors.StoreError`.
"""

from __future__ import annotations

import functools
import json
import os
import random
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError, StoreError
from ..messages import Message, Tier
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
from .retrieval import Hit, RankedList, fuse, like_pattern, query_terms, stem_terms
from .session_index import IndexedMessage, SessionIndex, index_fields, indexed_message
from .stemming import porter_stem

#: Seconds a connection waits for a lock another connection holds (SQLite's busy timeout; a write
#: of another process, or opening a file another process is creating) before :class:`StoreError`
#: (read when a store is opened).
BUSY_TIMEOUT_S = 15.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions(session_id TEXT PRIMARY KEY, created REAL, state TEXT);
CREATE TABLE IF NOT EXISTS messages(
    rowid INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL, id TEXT NOT NULL, turn INTEGER NOT NULL,
    role TEXT NOT NULL, text TEXT NOT NULL, context TEXT NOT NULL DEFAULT '', message TEXT NOT NULL,
    prediction TEXT, tier TEXT NOT NULL DEFAULT 'verbatim', embedding BLOB,
    UNIQUE(session_id, id));
CREATE INDEX IF NOT EXISTS messages_turn ON messages(session_id, turn);
CREATE TABLE IF NOT EXISTS records(
    scope TEXT NOT NULL, kind TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
    version INTEGER NOT NULL, updated REAL NOT NULL, PRIMARY KEY(scope, kind, key));
CREATE TABLE IF NOT EXISTS events(
    scope TEXT NOT NULL, seq INTEGER NOT NULL, data TEXT NOT NULL, created REAL NOT NULL,
    PRIMARY KEY(scope, seq));
"""
_META = "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT);"
_COLUMNS = "id, turn, role, text, message, prediction, tier, embedding"


@functools.cache
def _schema_columns() -> dict[str, frozenset[str]]:
    """The columns of every table ctxscore creates (read from :data:`_SCHEMA` in a memory database)."""
    db = sqlite3.connect(":memory:")
    try:
        db.executescript(_META + _SCHEMA)
        names = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {t: frozenset(r[1] for r in db.execute(f'PRAGMA table_info("{t}")')) for t in names}
    finally:
        db.close()
#: The tables a ctxscore store holds, or held (the FTS5 indexes of schema 2-4 and their shadow tables).
_OUR_TABLES = frozenset({"meta", "sessions", "messages", "records", "events", "messages_fts", "messages_stem"})
_OUR_TABLE_PREFIXES = ("messages_fts_", "messages_stem_", "sqlite_")
#: The stem list and the keyword list's document lengths read at most the first ``INDEX_HEAD`` and
#: last ``INDEX_TAIL`` characters of a message (a multi-KB tool dump: stemming all of it would cost
#: about 0.13 ms a KB); the keyword list counts a term in the first ``KEYWORD_HEAD`` and last
#: ``KEYWORD_TAIL`` (an ID in the middle of a 30 KB log is found; a 200 KB dump is kept to 64 KB in
#: memory), and the two-character lists search all of it.
INDEX_HEAD = 10_000
INDEX_TAIL = 2_000
KEYWORD_HEAD = 60_000
KEYWORD_TAIL = 4_000
#: Sessions whose search index a store keeps in memory (least recently used dropped first).
SESSION_INDEXES = 64


def index_text(text: str) -> str:
    """The part of a message's text the stem list reads (see :data:`INDEX_HEAD`)."""
    if len(text) <= INDEX_HEAD + INDEX_TAIL:
        return text
    return text[:INDEX_HEAD] + "\n" + text[-INDEX_TAIL:]


def keyword_text(text: str) -> str:
    """The part of a message's text the keyword list counts terms in (see :data:`KEYWORD_HEAD`)."""
    if len(text) <= KEYWORD_HEAD + KEYWORD_TAIL:
        return text
    return text[:KEYWORD_HEAD] + "\n" + text[-KEYWORD_TAIL:]


def _indexed(row: tuple[Any, ...], where: str, session_id: str) -> IndexedMessage:
    """A stored ``(rowid, id, turn, text, context, embedding)`` row as its session index holds it
    (two-character terms are answered by ``LIKE``, so no copy of the whole text is kept).

    Raises:
        StoreError: the row's embedding is damaged (its length is not whole float32 values).
    """
    _, mid, turn, text, context, blob = row
    embedding = decode_embedding(blob, f"store {where}: session {session_id!r} message {mid!r} (turn {turn})")
    return indexed_message(mid, turn, text, keyword_text(text), context, *index_fields(index_text(text), context),
                           embedding, short_terms=False)


def _check_path(path: str) -> None:
    """Refuse a path no file can have: one holding NUL, or a lone surrogate that is not a byte of a
    file name that is not UTF-8 (``os.fsdecode`` gives those as ``\udc80``-``\udcff``; they open).

    Raises:
        StoreError: naming the character and its position.
    """
    bad = path.find("\0")
    if bad < 0:
        try:
            os.fsencode(path)
        except UnicodeEncodeError as exc:
            bad = exc.start
    if bad >= 0:
        raise StoreError(f"cannot open store {path!r}: the path holds {path[bad]!r} at character {bad}, which no file "
                         "name can hold; remove it")


class SQLiteStore:
    """SQLite implementation of :class:`ctxscore.store.base.Store`.

    Args:
        path: database file (created if missing; a name that is not UTF-8 may come as
            :func:`os.fsdecode` gives it) or ``None`` / ``":memory:"`` for a private in-memory database.

    Raises:
        StoreError: the path is a folder or holds NUL or a lone surrogate, the file is not a SQLite database or not a ctxscore store
            (another application's tables, a ``meta`` table holding other rows, a ``messages`` table
            without ctxscore's columns), has another schema version, or cannot be opened. A file
            refused as not ours or of another version is left untouched (checked before any table is
            created or the journal mode is switched to WAL); the error says so.
    """

    #: 3 added the stemmed index, 4 the layer records and events, 5 dropped the FTS5 indexes.
    SCHEMA_VERSION = 5
    #: Older schema versions this version upgrades in place.
    UPGRADES_FROM = ("2", "3", "4")

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = None if path in (None, ":memory:") else Path(path)
        self._lock = threading.RLock()
        self._indexes: OrderedDict[str, SessionIndex] = OrderedDict()  # session -> its search index (LRU)
        self._closed = False
        self._last_turn: dict[str, int] = {}  # session -> last turn this connection wrote or read
        self._data_version: int | None = None  # PRAGMA data_version when _last_turn was last known exact
        where = self.path or ":memory:"
        if self.path is not None and self.path.is_dir():
            raise StoreError(f"cannot open store {where}: it is a folder; pass the path of a database file")
        _check_path(str(where))
        try:
            self._db = sqlite3.connect(str(where), check_same_thread=False, isolation_level=None)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open store {where}: {exc}; check the path and its permissions") from None
        touched = False  # the file was changed (its journal mode): the error must not say it was not
        start = time.monotonic()
        deadline = start + BUSY_TIMEOUT_S
        while True:
            try:
                # the time left of BUSY_TIMEOUT_S, so the retries below wait no longer in all
                left_ms = max(1, int((deadline - time.monotonic()) * 1000))
                self._db.execute(f"PRAGMA busy_timeout={left_ms}")
                self._check_ours()  # before anything is created or the journal mode is changed
                was = self._db.execute("PRAGMA journal_mode").fetchone()[0].lower()
                now = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0].lower()
                touched = touched or (now == "wal" and was != "wal")
                self._db.execute("PRAGMA synchronous=NORMAL")
                self._init_schema()
                self._db.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
                return
            except (sqlite3.Error, StoreError) as exc:
                busy = (isinstance(exc, sqlite3.OperationalError)
                        and getattr(exc, "sqlite_errorcode", 0) & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED))
                if busy and time.monotonic() < deadline:
                    # SQLite returns SQLITE_BUSY without its busy wait where waiting could deadlock
                    # (https://www.sqlite.org/c3ref/busy_handler.html: a connection promoting its read
                    # lock while another promotes its own, as two connections switching a new file to
                    # WAL together may). Try the whole opening again, a little later.
                    time.sleep(0.05 + 0.05 * random.random())
                    continue
                self._db.close()
                kept = ("its journal mode was switched to WAL, nothing else was changed" if touched
                        else "the file was not modified")
                if busy:
                    raise StoreError(
                        f"cannot open store {where}: it is locked by another connection (a process in the middle of "
                        f"a write, or one that holds a transaction open) and stayed locked for "
                        f"{time.monotonic() - start:.1f} s; retry, or end that transaction; {kept}"
                    ) from None
                raise StoreError(
                    f"cannot open store {where}: {exc}. If the file is not a ctxscore store, pass another path; {kept}."
                ) from None

    def _columns(self, table: str) -> set[str]:
        return {r[1] for r in self._db.execute(f'PRAGMA table_info("{table}")')}

    def _check_ours(self) -> None:
        """Refuse a database that is not a ctxscore store, or one of another schema version, before
        anything is written (it only reads). An empty file is new; a file of ours has the table ``meta``
        with a ``schema_version`` row, or is one an earlier ctxscore was creating (it created ``meta``
        first, the version row last): an empty ``meta`` and only tables of ours. Every table of ours
        the file holds must have at least ctxscore's columns (another application's ``messages`` or
        ``meta(key, value)`` holding its own rows is refused).

        Raises:
            StoreError: not a ctxscore store (it names the tables or columns), or another schema version.
        """
        tables = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not tables:
            return
        foreign = "it is a SQLite database of another application ({}), not a ctxscore store; pass the path of a new " \
                  "file or of a ctxscore store"
        others = sorted(t for t in tables if t not in _OUR_TABLES and not t.startswith(_OUR_TABLE_PREFIXES))
        for table, want in _schema_columns().items():
            if table in tables and not want <= (cols := self._columns(table)):
                raise StoreError(foreign.format(f"its table {table} has the columns {', '.join(sorted(cols))}, not "
                                                f"ctxscore's {', '.join(sorted(want))}"))
        version = None
        if "meta" in tables:
            row = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            version = None if row is None else str(row[0])
        if version is None:
            rows = self._db.execute("SELECT COUNT(*) FROM meta").fetchone()[0] if "meta" in tables else 0
            if "meta" not in tables or others or rows:
                shown = ", ".join(others[:5] or sorted(tables)[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
                held = f"; its meta table holds {rows} other row{'s' * (rows != 1)}" if rows else ""
                raise StoreError(foreign.format(f"tables {shown}; no ctxscore schema version{held}"))
        if version not in (None, *self.UPGRADES_FROM, str(self.SCHEMA_VERSION)):
            raise StoreError(f"schema version {version} is not one this ctxscore reads "
                             f"({', '.join(self.UPGRADES_FROM)} or {self.SCHEMA_VERSION})")

    def _init_schema(self) -> None:
        """Create what is missing and write the schema version, in one transaction (another process
        opening the new file at the same time sees no table or all of them, with the version row)."""
        db = self._db
        drops = "".join(f"DROP TABLE IF EXISTS {t};" for t in ("messages_fts", "messages_stem"))  # 5: not read any more
        try:
            db.executescript(f"BEGIN IMMEDIATE;{_META}{_SCHEMA}{drops}"
                             f"INSERT OR REPLACE INTO meta VALUES('schema_version', '{int(self.SCHEMA_VERSION)}');COMMIT;")
        except sqlite3.Error:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    @contextmanager
    def _guard(self, what: str, transaction: bool = False) -> Iterator[sqlite3.Connection]:
        """Run one operation under the lock; map ``sqlite3`` errors to :class:`StoreError` and roll back."""
        with self._lock:
            if self._closed:
                raise StoreError(f"store {self.path or ':memory:'}: cannot {what}: the store was closed "
                                 "(ContextManager.close); open it again, e.g. a new ContextManager with the same store")
            try:
                if transaction:
                    self._db.execute("BEGIN IMMEDIATE")
                yield self._db
                if transaction:
                    self._db.execute("COMMIT")
            except BaseException as exc:
                if self._db.in_transaction:
                    try:
                        self._db.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass
                if isinstance(exc, sqlite3.Error):
                    hint = "free disk space and retry" if "full" in str(exc) else "check the database file"
                    raise StoreError(f"store {self.path or ':memory:'}: cannot {what}: {exc}; {hint}; "
                                     "nothing was changed") from None
                raise

    # -- writing --------------------------------------------------------------------------------
    def add(self, session_id: str, records: Sequence[NewRecord]) -> list[StoredMessage]:
        """Append ``records`` to a session in one transaction (see :class:`~ctxscore.store.base.Store`).

        Raises:
            InputError: an explicit id is already used in the session, or an id is too long or holds
                NUL (:func:`~ctxscore.store.base.check_ids`; nothing is stored).
            StoreError: the database cannot be written (nothing is stored).
        """
        records = list(records)
        check_ids(session_id, records)
        out: list[StoredMessage] = []
        with self._guard("add messages", transaction=True) as db:
            (last,) = db.execute("SELECT COALESCE(MAX(turn), -1) FROM messages WHERE session_id=?", (session_id,)).fetchone()
            for k, rec in enumerate(records):
                turn = last + 1 + k
                mid = rec.message.id or self._free_id(db, session_id, f"m{turn}")
                msg = replace(rec.message, id=mid, turn=turn)
                blob = None if rec.embedding is None else np.asarray(rec.embedding, dtype=np.float32).tobytes()
                try:
                    db.execute(
                        "INSERT INTO messages(session_id, id, turn, role, text, context, message, prediction, embedding) "
                        "VALUES(?,?,?,?,?,?,?,?,?)",
                        (session_id, mid, turn, msg.role, rec.text, rec.context,
                         json.dumps(msg.to_openai(), ensure_ascii=False),
                         None if rec.prediction is None else json.dumps(rec.prediction, ensure_ascii=False), blob),
                    )
                except sqlite3.IntegrityError:
                    raise InputError(
                        f"message id {mid!r} already exists in session {session_id!r}; give each message a unique id "
                        "(or none: automatic ids skip the used ones)"
                    ) from None
                out.append(StoredMessage(msg, rec.text, rec.prediction, Tier.VERBATIM, rec.embedding))
            if out and last == self._last_turn.get(session_id, -1):
                self._last_turn[session_id] = out[-1].turn  # nothing unseen in between
        return out

    @staticmethod
    def _free_id(db: sqlite3.Connection, session_id: str, base: str) -> str:
        mid, k = base, 0
        while db.execute("SELECT 1 FROM messages WHERE session_id=? AND id=?", (session_id, mid)).fetchone():
            k += 1
            mid = f"{base}-{k}"
        return mid

    def set_tiers(self, session_id: str, tiers: Iterable[tuple[str, Tier]]) -> None:
        """Record the current tier of messages: ``tiers`` is (message id, tier) pairs.

        Raises:
            StoreError: the database cannot be written (no tier is changed).
        """
        rows = [(str(t), session_id, i) for i, t in tiers]
        with self._guard("record tiers", transaction=True) as db:
            db.executemany("UPDATE messages SET tier=? WHERE session_id=? AND id=?", rows)

    def detach(self, session_id: str, from_turn: int) -> str:
        """Move the messages of ``session_id`` from ``from_turn`` on to a new session and return its id
        (``<session_id>~detached~<n>``); they stay stored and searchable there."""
        with self._guard("detach messages", transaction=True) as db:
            n = db.execute("SELECT COUNT(DISTINCT session_id) FROM messages WHERE session_id LIKE ? ESCAPE '\\'",
                           (like_pattern(f"{session_id}~detached~")[1:],)).fetchone()[0]
            target = f"{session_id}~detached~{n + 1}"
            db.execute("UPDATE messages SET session_id=? WHERE session_id=? AND turn>=?", (target, session_id, from_turn))
            self._indexes.pop(session_id, None)
            self._last_turn.pop(session_id, None)
        return target

    # -- reading --------------------------------------------------------------------------------
    def _row(self, session_id: str, r: tuple[Any, ...]) -> StoredMessage:
        mid, turn, role, text, message, prediction, tier, blob = r
        try:
            msg = Message.from_dict(json.loads(message), where=f"stored message {mid!r}")
            pred = None if prediction is None else json.loads(prediction)
            if pred is not None and not isinstance(pred, dict):
                raise ValueError(f"its prediction is a JSON {type(pred).__name__}, not an object")
            tier = Tier(tier)
        except (ValueError, InputError) as exc:
            raise StoreError(
                f"store {self.path or ':memory:'}: session {session_id!r} message {mid!r} (turn {turn}) is damaged "
                f"({exc}); restore the file from a backup or remove that row"
            ) from None
        emb = decode_embedding(blob, f"store {self.path or ':memory:'}: session {session_id!r} message {mid!r} "
                                     f"(turn {turn})")
        return StoredMessage(replace(msg, id=mid, turn=turn), text, pred, tier, emb)

    def load(self, session_id: str, after_turn: int = -1) -> list[StoredMessage]:
        """The session's messages with a turn above ``after_turn``, in turn order.

        Raises:
            StoreError: the database cannot be read, or a row is damaged (it names the row).
        """
        with self._guard("read the session") as db:
            (version,) = db.execute("PRAGMA data_version").fetchone()  # changes when another connection commits
            known = self._last_turn.get(session_id)
            if version == self._data_version and known is not None and after_turn >= known:
                return []  # nobody wrote since this connection last knew the session's end
            rows = db.execute(f"SELECT {_COLUMNS} FROM messages WHERE session_id=? AND turn>? ORDER BY turn",
                              (session_id, after_turn)).fetchall()
            last = db.execute("SELECT COALESCE(MAX(turn), -1) FROM messages WHERE session_id=?", (session_id,)).fetchone()[0]
            self._data_version, self._last_turn = version, {session_id: last}
        return [self._row(session_id, r) for r in rows]

    def get(self, session_id: str, message_id: str) -> StoredMessage | None:
        """One stored message, or ``None``."""
        with self._guard("read a message") as db:
            r = db.execute(f"SELECT {_COLUMNS} FROM messages WHERE session_id=? AND id=?",
                           (session_id, message_id)).fetchone()
        return None if r is None else self._row(session_id, r)

    def count(self, session_id: str) -> int:
        """Number of stored messages in a session."""
        with self._guard("count messages") as db:
            return db.execute("SELECT COUNT(*) FROM messages WHERE session_id=?", (session_id,)).fetchone()[0]

    def _session_index(self, db: sqlite3.Connection, session_id: str) -> SessionIndex:
        """The session's search index, up to date (call under the store's lock): read once, then
        only the rows added since, by any connection; read again whole when rows left the session
        (a detach, here or in another process)."""
        index = self._indexes.pop(session_id, None) or SessionIndex()
        self._indexes[session_id] = index
        while len(self._indexes) > SESSION_INDEXES:
            self._indexes.popitem(last=False)
        if index.seen and db.execute("SELECT COUNT(*) FROM messages WHERE session_id=? AND rowid<=?",
                                     (session_id, index.seen)).fetchone()[0] != len(index.messages):
            index.reset()
        rows = db.execute("SELECT rowid, id, turn, text, context, embedding FROM messages "
                          "WHERE session_id=? AND rowid>? ORDER BY rowid", (session_id, index.seen)).fetchall()
        if rows:
            new = [_indexed(r, str(self.path or ":memory:"), session_id) for r in rows]  # all or none
            index.extend(new)
            index.seen = rows[-1][0]
        return index

    def _lexical(self, db: sqlite3.Connection, session_id: str, index: SessionIndex, fts_terms: Sequence[str],
                 stems: Sequence[str], short_terms: Sequence[str], limit: int) -> list[RankedList]:
        """The lexical ranked lists of a query (see :meth:`SessionIndex.lexical`): ``keyword``,
        ``exact`` and ``stem`` from the index, each two-character term's list from ``LIKE`` over the whole text
        (ASCII case folded, newest first), which keeps no second copy of the session's text."""
        lists = index.lexical(fts_terms, stems, short_terms, limit, short_lists=False)
        for term in short_terms:
            lists.append(("short", db.execute(
                "SELECT id, turn, substr(text, 1, 120) FROM messages WHERE session_id = ? AND text LIKE ? ESCAPE '\\' "
                "ORDER BY turn DESC LIMIT ?", (session_id, like_pattern(term), limit)).fetchall()))
        return lists

    def search(self, session_id: str, query: str, k: int = 10, *, query_embedding: np.ndarray | None = None,
               only: Callable[[str], bool] | None = None, limit: int = 100) -> list[Hit]:
        """Hybrid search of a session's messages (see the module docstring).

        Args:
            session_id: the session.
            query: free text (any characters; nothing is interpreted as a query language).
            k: number of hits to return.
            query_embedding: the query's ``(dim,)`` embedding (same embedder as the stored ones) for
                vector search; stored embeddings of another size are left out.
            only: keep only message ids for which this returns True.
            limit: candidates taken from each ranked list before fusion.

        Returns:
            Up to ``k`` hits, best first.

        Raises:
            StoreError: the database cannot be read.
        """
        fts_terms, short_terms = query_terms(query)
        stems = [porter_stem(w) for w in stem_terms(query)]
        similarity: dict[str, float] = {}
        with self._guard("search") as db:
            index = self._session_index(db, session_id)
            lists = self._lexical(db, session_id, index, fts_terms, stems, short_terms, limit)
            if query_embedding is not None:
                vec, similarity = index.vector(np.asarray(query_embedding, dtype=np.float32), limit)
                lists.append(vec)
        return fuse(lists, k=k, only=only, similarity=similarity)

    # -- layer records and events (ctxscore.store.base.RecordStore) ----------------------------------
    def put_records(self, scope: str, kind: str, records: Mapping[str, Any]) -> dict[str, int]:
        """Insert or replace records (key -> JSON value) under (scope, kind) in one transaction.

        Returns each key's new version (1 for a new key). Raises :class:`InputError` (bad names or
        values) or :class:`StoreError`; nothing is stored then. See :class:`~ctxscore.store.base.RecordStore`.
        """
        rows = _record_rows(scope, kind, records)
        out: dict[str, int] = {}
        now = time.time()
        with self._guard("put records", transaction=True) as db:
            for key, value in rows:
                (version,) = db.execute(
                    "INSERT INTO records(scope, kind, key, value, version, updated) VALUES(?,?,?,?,1,?) "
                    "ON CONFLICT(scope, kind, key) DO UPDATE SET value=excluded.value, version=records.version+1, "
                    "updated=excluded.updated RETURNING version", (scope, kind, key, value, now)).fetchone()
                out[key] = version
        return out

    def records(self, scope: str, kind: str) -> dict[str, Record]:
        """Every record under (scope, kind), by key (see :class:`~ctxscore.store.base.RecordStore`)."""
        check_name(scope, "scope")
        check_name(kind, "kind")
        with self._guard("read records") as db:
            rows = db.execute("SELECT key, value, version, updated FROM records WHERE scope=? AND kind=? ORDER BY key",
                              (scope, kind)).fetchall()
        return {k: Record(k, _load_json(v, f"record {scope!r}/{kind!r}/{k!r}", self.path), n, u) for k, v, n, u in rows}

    def delete_records(self, scope: str, kind: str, keys: Iterable[str]) -> int:
        """Delete records by key under (scope, kind); returns how many existed."""
        check_name(scope, "scope")
        check_name(kind, "kind")
        ks = [check_name(k, "record key") for k in keys]
        with self._guard("delete records", transaction=True) as db:
            return sum(db.execute("DELETE FROM records WHERE scope=? AND kind=? AND key=?", (scope, kind, k)).rowcount
                       for k in ks)

    def append_events(self, scope: str, events: Sequence[Any]) -> list[int]:
        """Append JSON values to the scope's log in one transaction; returns their sequence numbers."""
        check_name(scope, "scope")
        data = [dump_json(e, f"event {i}") for i, e in enumerate(events)]
        now = time.time()
        with self._guard("append events", transaction=True) as db:
            (last,) = db.execute("SELECT COALESCE(MAX(seq), 0) FROM events WHERE scope=?", (scope,)).fetchone()
            db.executemany("INSERT INTO events(scope, seq, data, created) VALUES(?,?,?,?)",
                           [(scope, last + 1 + i, d, now) for i, d in enumerate(data)])
        return list(range(last + 1, last + 1 + len(data)))

    def events(self, scope: str, after: int = 0, limit: int | None = None) -> list[Event]:
        """The scope's events with ``seq > after``, in order, at most ``limit``."""
        check_name(scope, "scope")
        lim = check_limit(limit)
        if isinstance(after, bool) or not isinstance(after, int):
            raise InputError(f"after must be an integer sequence number, got {after!r}")
        with self._guard("read events") as db:
            rows = db.execute("SELECT seq, data, created FROM events WHERE scope=? AND seq>? ORDER BY seq LIMIT ?",
                              (scope, after, -1 if lim is None else lim)).fetchall()
        return [Event(q, _load_json(d, f"event {scope!r}/{q}", self.path), t) for q, d, t in rows]

    def close(self) -> None:
        """Checkpoint the WAL and close the database (a second call does nothing)."""
        with self._lock:
            try:
                if self.path is not None:
                    # No waiting: a TRUNCATE checkpoint holds the write lock while it waits for readers, so
                    # with the busy timeout a closing connection would stall every other writer of the file
                    # for as long (it then does what it can, as a PASSIVE checkpoint).
                    self._db.execute("PRAGMA busy_timeout=0")
                    self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error:
                pass  # another connection holds the file: its last close checkpoints
            finally:
                self._db.close()
                self._indexes.clear()
                self._closed = True

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _record_rows(scope: str, kind: str, records: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Validated (key, JSON text) pairs of a :meth:`put_records` call (shared by the stores)."""
    check_name(scope, "scope")
    check_name(kind, "kind")
    if not isinstance(records, Mapping):
        raise InputError(f"records must be a mapping of key -> JSON value, got {type(records).__name__}")
    return [(check_name(k, "record key"), dump_json(v, f"record {k!r}")) for k, v in records.items()]


def _load_json(text: str, what: str, where: object) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise StoreError(f"store {where or ':memory:'}: {what} is damaged ({exc}); restore it from a backup") from None
