"""The archive ("swap"): every original message, stored whole in SQLite, searchable for page-in.

Storage: one SQLite file (stdlib ``sqlite3``) in WAL mode, or an in-memory database. Tables:
``sessions`` (per-session state), ``messages`` (the original OpenAI-style message as JSON, its
rendered text, the scorer's prediction and the current tier) and ``messages_fts``, an FTS5 index with
the trigram tokenizer over the rendered text and a context column (the start of the previous
messages, weighted 0.4 in bm25) (https://www.sqlite.org/fts5.html#the_trigram_tokenizer),
so Chinese text matches without a word segmenter.

Search is hybrid: FTS5 ``bm25`` ranking for terms of three or more characters, a ``LIKE`` scan for
shorter terms (the trigram tokenizer cannot match two-character Chinese words), and, when message
embeddings are stored, cosine similarity to the query embedding. The ranked lists are fused with
weighted reciprocal rank fusion, score = sum over lists of w / (k + rank), k = 60 (Cormack, Clarke
and Buettcher, SIGIR 2009; the per-list weights :data:`RRF_WEIGHTS` favour the bm25 list). User
text never reaches FTS5 as syntax: every term is passed as a quoted string with embedded quotes
doubled, and ``LIKE`` patterns escape ``%`` and ``_``.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CtxScoreError, InputError
from .retrieval import CONTEXT_WEIGHT, Hit, fts_match_expression, fuse, like_pattern, query_terms


class ArchiveError(CtxScoreError):
    """The archive file is unreadable, locked or not a ctxscore archive."""


class Archive:
    """SQLite store of every original message of one or more sessions, with hybrid search.

    Args:
        path: database file (created if missing; WAL mode) or ``None`` / ``":memory:"`` for memory.

    Raises:
        ArchiveError: the file is not a SQLite database, is locked, or has an incompatible schema;
            the message says which and leaves the file untouched.
    """

    SCHEMA_VERSION = 2

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = None if path in (None, ":memory:") else Path(path)
        self._lock = threading.RLock()
        try:
            self._db = sqlite3.connect(
                ":memory:" if self.path is None else str(self.path), check_same_thread=False, isolation_level=None
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA busy_timeout=5000")
            self._init_schema()
        except sqlite3.DatabaseError as exc:
            raise ArchiveError(
                f"cannot open archive {self.path or ':memory:'}: {exc}. If the file is not a ctxscore archive, "
                "pass another archive_path; the file was not modified."
            ) from None
        self._embeddings: dict[tuple[str, str], np.ndarray] = {}
        self._load_embeddings()

    # -- schema ---------------------------------------------------------------------------------
    def _init_schema(self) -> None:
        db = self._db
        db.execute("CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT)")
        row = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is not None and int(row[0]) != self.SCHEMA_VERSION:
            raise sqlite3.DatabaseError(f"schema version {row[0]} != {self.SCHEMA_VERSION}")
        db.executescript(
            """
            CREATE TABLE IF NOT EXISTS sessions(
                session_id TEXT PRIMARY KEY, created REAL, state TEXT);
            CREATE TABLE IF NOT EXISTS messages(
                rowid INTEGER PRIMARY KEY,
                session_id TEXT NOT NULL, id TEXT NOT NULL, turn INTEGER NOT NULL,
                role TEXT NOT NULL, text TEXT NOT NULL, context TEXT NOT NULL DEFAULT '', message TEXT NOT NULL,
                prediction TEXT, tier TEXT NOT NULL DEFAULT 'verbatim', embedding BLOB,
                UNIQUE(session_id, id));
            CREATE INDEX IF NOT EXISTS messages_turn ON messages(session_id, turn);
            CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts USING fts5(
                text, context, content='messages', content_rowid='rowid', tokenize='trigram');
            """
        )
        db.execute("INSERT OR IGNORE INTO meta VALUES('schema_version', ?)", (str(self.SCHEMA_VERSION),))

    def _load_embeddings(self) -> None:
        for sid, mid, blob in self._db.execute("SELECT session_id, id, embedding FROM messages WHERE embedding IS NOT NULL"):
            self._embeddings[(sid, mid)] = np.frombuffer(blob, dtype=np.float32)

    # -- writing --------------------------------------------------------------------------------
    def add(
        self,
        session_id: str,
        message_id: str,
        turn: int,
        role: str,
        text: str,
        message: dict[str, Any],
        prediction: dict[str, Any] | None = None,
        embedding: np.ndarray | None = None,
        context: str = "",
    ) -> None:
        """Store one original message (whole) and index its text.

        ``context`` (for example the start of the previous message) is indexed in a second FTS column
        with a lower bm25 weight, so a reply like "your reference number is Q1XUDH9Y" is found by a
        question that names what the user asked for ("the booking at Ali Baba").

        Raises:
            InputError: a message with this id already exists in the session (ids must be unique).
        """
        blob = None if embedding is None else np.asarray(embedding, dtype=np.float32).tobytes()
        with self._lock:
            try:
                self._db.execute("BEGIN")
                cur = self._db.execute(
                    "INSERT INTO messages(session_id, id, turn, role, text, context, message, prediction, embedding) "
                    "VALUES(?,?,?,?,?,?,?,?,?)",
                    (
                        session_id, message_id, turn, role, text, context,
                        json.dumps(message, ensure_ascii=False),
                        None if prediction is None else json.dumps(prediction, ensure_ascii=False),
                        blob,
                    ),
                )
                self._db.execute(
                    "INSERT INTO messages_fts(rowid, text, context) VALUES(?, ?, ?)", (cur.lastrowid, text, context)
                )
                self._db.execute("COMMIT")
            except sqlite3.IntegrityError:
                self._db.execute("ROLLBACK")
                raise InputError(
                    f"message id {message_id!r} already exists in session {session_id!r}; give each message a unique id"
                ) from None
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
        if embedding is not None:
            self._embeddings[(session_id, message_id)] = np.asarray(embedding, dtype=np.float32)

    def set_tiers(self, session_id: str, tiers: Iterable[tuple[str, str]]) -> None:
        """Record the current tier of messages: ``tiers`` is (message id, tier) pairs."""
        with self._lock:
            self._db.execute("BEGIN")
            self._db.executemany(
                "UPDATE messages SET tier=? WHERE session_id=? AND id=?", [(t, session_id, i) for i, t in tiers]
            )
            self._db.execute("COMMIT")

    def save_state(self, session_id: str, state: dict[str, Any]) -> None:
        """Store small per-session state (JSON) that a resumed session needs."""
        with self._lock:
            self._db.execute(
                "INSERT INTO sessions(session_id, created, state) VALUES(?,?,?) "
                "ON CONFLICT(session_id) DO UPDATE SET state=excluded.state",
                (session_id, time.time(), json.dumps(state)),
            )

    # -- reading --------------------------------------------------------------------------------
    def load_state(self, session_id: str) -> dict[str, Any] | None:
        """The state saved by :meth:`save_state`, or ``None``."""
        row = self._db.execute("SELECT state FROM sessions WHERE session_id=?", (session_id,)).fetchone()
        return None if row is None or row[0] is None else json.loads(row[0])

    def messages(self, session_id: str) -> list[dict[str, Any]]:
        """All stored messages of a session in turn order: dicts with id, turn, role, text, message,
        prediction (dict or None), tier and embedding (array or None)."""
        rows = self._db.execute(
            "SELECT id, turn, role, text, message, prediction, tier, embedding FROM messages "
            "WHERE session_id=? ORDER BY turn",
            (session_id,),
        ).fetchall()
        return [
            {
                "id": r[0], "turn": r[1], "role": r[2], "text": r[3], "message": json.loads(r[4]),
                "prediction": None if r[5] is None else json.loads(r[5]), "tier": r[6],
                "embedding": None if r[7] is None else np.frombuffer(r[7], dtype=np.float32),
            }
            for r in rows
        ]

    def get(self, session_id: str, message_id: str) -> dict[str, Any] | None:
        """The original OpenAI-style message, or ``None``."""
        row = self._db.execute(
            "SELECT message FROM messages WHERE session_id=? AND id=?", (session_id, message_id)
        ).fetchone()
        return None if row is None else json.loads(row[0])

    def count(self, session_id: str) -> int:
        """Number of stored messages in a session."""
        return self._db.execute("SELECT COUNT(*) FROM messages WHERE session_id=?", (session_id,)).fetchone()[0]

    def search(
        self,
        session_id: str,
        query: str,
        k: int = 10,
        *,
        only: Callable[[str], bool] | None = None,
        query_embedding: np.ndarray | None = None,
        limit: int = 100,
    ) -> list[Hit]:
        """Hybrid search of a session's messages.

        Args:
            session_id: the session.
            query: free text (any characters; nothing is interpreted as FTS5 syntax).
            k: number of hits to return.
            only: keep only message ids for which this returns True (for example archived ones).
            query_embedding: the query's embedding (same embedder as the stored ones) for vector search.
            limit: candidates taken from each ranked list before fusion.

        Returns:
            Up to ``k`` hits, best first, by weighted reciprocal rank fusion of the keyword, LIKE and
            vector lists (:data:`RRF_WEIGHTS`).
        """
        fts_terms, short_terms = query_terms(query)
        lists: list[tuple[str, list[tuple[str, int, str]]]] = []
        with self._lock:
            if fts_terms:
                rows = self._db.execute(
                    "SELECT m.id, m.turn, substr(m.text, 1, 120) FROM messages_fts f JOIN messages m ON m.rowid = f.rowid "
                    "WHERE messages_fts MATCH ? AND m.session_id = ? ORDER BY bm25(messages_fts, 1.0, ?) LIMIT ?",
                    (fts_match_expression(fts_terms), session_id, CONTEXT_WEIGHT, limit),
                ).fetchall()
                lists.append(("keyword", rows))
            for term in short_terms:
                rows = self._db.execute(
                    "SELECT id, turn, substr(text, 1, 120) FROM messages WHERE session_id = ? AND text LIKE ? ESCAPE '\\' "
                    "ORDER BY turn DESC LIMIT ?",
                    (session_id, like_pattern(term), limit),
                ).fetchall()
                lists.append(("short", rows))
            if query_embedding is not None:
                items = [(mid, vec) for (sid, mid), vec in self._embeddings.items() if sid == session_id]
                if items:
                    mat = np.stack([v for _, v in items])
                    sims = mat @ np.asarray(query_embedding, dtype=np.float32)
                    order = np.argsort(-sims)[:limit]
                    ids = [items[i][0] for i in order]
                    meta = {
                        r[0]: (r[1], r[2])
                        for r in self._db.execute(
                            f"SELECT id, turn, substr(text, 1, 120) FROM messages WHERE session_id=? AND id IN ({','.join('?' * len(ids))})",
                            (session_id, *ids),
                        )
                    }
                    lists.append(("vector", [(i, *meta[i]) for i in ids if i in meta]))
        return fuse(lists, k=k, only=only)

    def close(self) -> None:
        """Checkpoint the WAL and close the database."""
        with self._lock:
            try:
                if self.path is not None:
                    self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                self._db.close()

    def __enter__(self) -> Archive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
