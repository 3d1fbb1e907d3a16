"""Stores: the Store protocol, retrieval shared by every store (terms, ranked lists, fusion), SQLite."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from .base import NewRecord, Store, StoredMessage
from .sqlite import SQLiteStore

__all__ = ["NewRecord", "SQLiteStore", "Store", "StoredMessage", "open_store"]


def open_store(spec: Store | str | Path | None) -> Store:
    """The store for a ``ContextManager(store=...)`` argument.

    Args:
        spec: ``None`` or ``":memory:"`` (a private in-memory SQLite store), a SQLite file path or
            ``sqlite:///path`` URL, or an object implementing :class:`~ctxscore.store.base.Store`.

    Raises:
        ConfigError: an unsupported URL scheme or object.
        StoreError: the store cannot be opened.
    """
    if spec is None:
        return SQLiteStore(None)
    if isinstance(spec, str | Path):
        text = str(spec)
        if text.startswith("sqlite:///"):
            return SQLiteStore(text[len("sqlite:///"):] or None)
        if "://" in text:
            raise ConfigError(f"unsupported store URL {text!r}; use a SQLite path, sqlite:///path, or a Store object")
        return SQLiteStore(text)
    if isinstance(spec, Store):
        return spec
    raise ConfigError(f"store must be a path, a URL or a Store object, got {type(spec).__name__}")
