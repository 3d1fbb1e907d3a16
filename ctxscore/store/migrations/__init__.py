"""Versioned SQL migrations of the PostgreSQL store.

The files ``postgres/NNNN_name.sql`` are applied in order by :func:`migrate`, each version once,
all pending ones in one transaction under a transaction-level advisory lock (two processes opening
a new database at once do not race). ``ctx_schema_migrations`` records the version, name and
SHA-256 of every applied file: an applied file whose content changed, or a database holding a
version this code does not know (written by a newer ctxscore), is refused with a
:class:`~ctxscore.errors.StoreError` and nothing is changed.

A file whose header says ``-- requires-extension: NAME`` is optional: it is applied only when the
server offers that extension (``pg_available_extensions``) and otherwise retried at every open, so
installing pgvector later enables it. Rules for new files: never edit an applied file, add the
next number; keep each file valid in one transaction.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ...errors import StoreError

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_REQUIRES = re.compile(r"^--\s*requires-extension:\s*([A-Za-z0-9_]+)\s*$", re.M)
#: Advisory lock key of the migration transaction (any constant shared by every ctxscore process).
LOCK_KEY = 0x63747873  # "ctxs"
log = logging.getLogger("ctxscore")


@dataclass(frozen=True, slots=True)
class Migration:
    """One SQL file: ``version`` (its number), ``name``, ``sql``, ``checksum`` (SHA-256 hex) and the
    extension it needs (``None`` when it is not optional)."""

    version: int
    name: str
    sql: str
    checksum: str
    requires: str | None


def migrations() -> list[Migration]:
    """Every migration file, in version order.

    Raises:
        StoreError: two files share a version, or the versions are not 1, 2, 3 ...
    """
    out: list[Migration] = []
    for entry in resources.files(__package__).joinpath("postgres").iterdir():
        m = _NAME.match(entry.name)
        if not m:
            continue
        sql = entry.read_text(encoding="utf-8")
        req = _REQUIRES.search(sql)
        out.append(Migration(int(m.group(1)), m.group(2), sql, hashlib.sha256(sql.encode()).hexdigest(),
                             req.group(1) if req else None))
    out.sort(key=lambda x: x.version)
    if [x.version for x in out] != list(range(1, len(out) + 1)):
        raise StoreError(f"migration files are not numbered 1..{len(out)}: {[x.version for x in out]}")
    return out


def latest_version() -> int:
    """The highest migration version this code knows."""
    return migrations()[-1].version


def migrate(conn: Any, schema: str | None = None) -> list[int]:
    """Apply the pending migrations on ``conn`` (a psycopg connection in autocommit mode); returns
    the versions applied now.

    Args:
        conn: the connection.
        schema: the PostgreSQL schema of the tables (created if missing, then set as the session's
            ``search_path`` with ``public`` after it), or ``None`` for the connection's ``search_path``.

    Raises:
        StoreError: the database was migrated by newer code, an applied file changed, or a
            migration failed (the transaction is rolled back: nothing is changed).
        psycopg.Error: the server failed (the caller maps it to StoreError).
    """
    known = migrations()
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
        if schema is not None:  # under the lock: CREATE SCHEMA IF NOT EXISTS races with itself
            from psycopg import sql

            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
            conn.execute(sql.SQL("SET search_path TO {}, public").format(sql.Identifier(schema)))
        conn.execute("CREATE TABLE IF NOT EXISTS ctx_schema_migrations (version integer PRIMARY KEY, "
                     "name text NOT NULL, checksum text NOT NULL, applied timestamptz NOT NULL DEFAULT now())")
        applied = {v: (n, c) for v, n, c in conn.execute("SELECT version, name, checksum FROM ctx_schema_migrations")}
        unknown = sorted(set(applied) - {m.version for m in known})
        if unknown:
            raise StoreError(f"the database holds schema version(s) {unknown}, newer than this ctxscore knows "
                             f"(1..{known[-1].version}); upgrade ctxscore. Nothing was changed")
        for m in known:
            if m.version in applied and applied[m.version][1] != m.checksum:
                raise StoreError(f"migration {m.version:04d}_{m.name}.sql differs from the one applied to this "
                                 "database (checksum); restore the file, never edit an applied migration. "
                                 "Nothing was changed")
        available = {r[0] for r in conn.execute("SELECT name FROM pg_available_extensions")}
        done: list[int] = []
        for m in known:
            if m.version in applied:
                continue
            if m.requires is not None:
                if m.requires not in available:
                    continue  # optional: retried at the next open
                try:
                    with conn.transaction():  # a savepoint: a refused extension skips only this file
                        _apply(conn, m)
                except Exception as exc:  # noqa: BLE001 - e.g. no privilege to create the extension
                    log.warning("optional migration %04d_%s skipped: %s", m.version, m.name,
                                str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
                    continue
            else:
                _apply(conn, m)
            done.append(m.version)
    return done


def _apply(conn: Any, m: Migration) -> None:
    conn.execute(m.sql)
    conn.execute("INSERT INTO ctx_schema_migrations(version, name, checksum) VALUES (%s, %s, %s)",
                 (m.version, m.name, m.checksum))


def applied_versions(conn: Any) -> set[int]:
    """Versions recorded in ``ctx_schema_migrations`` (empty when the table does not exist)."""
    row = conn.execute("SELECT to_regclass('ctx_schema_migrations')").fetchone()
    if row is None or row[0] is None:
        return set()
    return {r[0] for r in conn.execute("SELECT version FROM ctx_schema_migrations")}
