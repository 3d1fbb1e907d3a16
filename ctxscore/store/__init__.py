"""Stores: the Store protocol, retrieval shared by every store (terms, ranked lists, fusion), SQLite,
PostgreSQL (extra ``postgres``) and the Redis hot state for workers that share sessions."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .base import Event, NewRecord, Record, RecordStore, Store, StoredMessage
from .sqlite import SQLiteStore

__all__ = ["Event", "NewRecord", "Record", "RecordStore", "SQLiteStore", "Store", "StoredMessage", "is_postgres",
           "open_store", "redis_in_url", "shown_url"]

#: URL schemes of the PostgreSQL store.
POSTGRES_SCHEMES = ("postgresql://", "postgres://")
#: URL schemes of Redis (redis-py's).
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
#: The start of a libpq ``key=value`` connection string (``host=db port=5432 dbname=app ...``):
#: one of libpq's keywords followed by ``=``.
_CONNINFO = re.compile(
    r"^\s*(host|hostaddr|port|dbname|user|password|passfile|service|sslmode|sslcert|sslkey|sslrootcert|"
    r"sslpassword|connect_timeout|options|application_name|client_encoding|target_session_attrs|"
    r"gssencmode|channel_binding|require_auth|load_balance_hosts|keepalives)\s*=")


def is_postgres(spec: object) -> bool:
    """Whether a store argument names a PostgreSQL database: a ``postgresql://`` / ``postgres://``
    URL or a libpq ``key=value`` string that starts with a libpq keyword (``host=... dbname=...``).
    Such a string is never taken for a SQLite file name (write ``./host=x.db`` for that file)."""
    return isinstance(spec, str) and (spec.startswith(POSTGRES_SCHEMES) or bool(_CONNINFO.match(spec)))


def open_store(spec: Store | str | Path | None, *, redis: Any = None, **options: Any) -> Store:
    """The store for a ``ContextManager(store=...)`` argument.

    Args:
        spec: ``None`` or ``":memory:"`` (a private in-memory SQLite store), a SQLite file path or
            ``sqlite:///path`` URL, a ``postgresql://`` URL (:class:`~ctxscore.store.postgres.PostgresStore`;
            query parameters ``schema``, ``pool_min``, ``pool_max``, ``timeout``, and ``redis`` -- a
            URL-encoded Redis URL) or a libpq ``key=value`` string (``"host=db port=5432 dbname=app"``,
            :func:`is_postgres`; options as keyword arguments), or an object implementing
            :class:`~ctxscore.store.base.Store`.
        redis: a Redis URL, a ``redis.Redis`` client or a
            :class:`~ctxscore.store.redis_state.RedisHotState`: wrap the store in a
            :class:`~ctxscore.store.redis_state.HotStore` that keeps the hot per-session state of
            workers there (tiers, token counts, versions, the per-session lock).
        options: keyword arguments of :class:`~ctxscore.store.postgres.PostgresStore` (``schema``,
            ``pool_max`` ...) for a PostgreSQL URL.

    Raises:
        ConfigError: an unsupported URL scheme or object, a URL that cannot be read (no password in
            the message), or the ``postgres`` extra is missing.
        StoreError: the store cannot be opened.
    """
    store: Store
    if is_postgres(spec):
        from .postgres import PostgresStore

        spec, redis = redis_in_url(spec, redis)
        store = PostgresStore(spec, **options)
    elif options:
        raise ConfigError(f"store options {sorted(options)} apply to a postgresql:// URL only")
    elif spec is None:
        store = SQLiteStore(None)
    elif isinstance(spec, str | Path):
        text = str(spec)
        if text.startswith("sqlite:///"):
            store = SQLiteStore(text[len("sqlite:///"):] or None)
        elif "://" in text:
            raise ConfigError(f"unsupported store URL {shown_url(text)!r}; use a SQLite path, sqlite:///path, postgresql://..., "
                              "or a Store object")
        else:
            store = SQLiteStore(text)
    elif isinstance(spec, Store):
        store = spec
    else:
        raise ConfigError(f"store must be a path, a URL or a Store object, got {type(spec).__name__}")
    if redis is None:
        return store
    from .redis_state import HotStore, RedisHotState

    if isinstance(store, HotStore):
        raise ConfigError("the store already keeps its hot state in Redis")
    try:
        hot = redis if isinstance(redis, RedisHotState) else RedisHotState(redis)
        return HotStore(store, hot)  # binds the hot state's keys to this store (RedisHotState.bind)
    except BaseException:
        store.close()  # a store opened here is not left with its connections open
        raise


def shown_url(url: str) -> str:
    """``url`` for a message: its scheme and what follows the last ``@`` (no user or password)."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}{rest.split('@')[-1]}" if sep else url.split("@")[-1]


def redis_in_url(url: str, redis: Any = None) -> tuple[str, Any]:
    """(``url`` without its ``redis=`` query parameter, the Redis to use): the parameter's URL, else
    ``redis``.

    Raises:
        ConfigError: both are given, or the parameter is not a ``redis://``, ``rediss://`` or
            ``unix://`` URL.
    """
    from .postgres import split_query

    if "://" not in url:
        return url, redis
    try:
        rest, taken = split_query(url, ("redis",))
    except ValueError as exc:  # "Invalid IPv6 URL": an unclosed [
        raise ConfigError(f"bad store URL {shown_url(url)!r}: {exc}") from None
    in_url = [v for _, v in taken]
    if not in_url:
        return url, redis
    if redis is not None or len(in_url) > 1:
        raise ConfigError("give Redis once: either as the URL's redis= parameter or as redis= (--redis), not both")
    if not in_url[0].startswith(REDIS_SCHEMES):
        raise ConfigError(f"the store URL's redis= parameter must be a redis://, rediss:// or unix:// URL, got "
                          f"{in_url[0].split('@')[-1]!r}")
    return rest, in_url[0]
