"""The Store protocol: where every original message lives, durable and searchable.

A store keeps whole originals (they are never lost: compressed forms live only in the window),
allocates each message's turn and automatic id atomically (so two writers on one session never
collide), and searches a session with the shared retrieval of :mod:`ctxscore.store.retrieval`.
Implementations: :class:`ctxscore.store.sqlite.SQLiteStore` (embedded default, file or memory) and
:class:`ctxscore.store.postgres.PostgresStore` (server default, extra ``postgres``).
Every failure of the backend is raised as :class:`~ctxscore.errors.StoreError`.

:class:`RecordStore` is the small companion protocol both implement for the layers (fact ledger,
profiles, events): records keyed by (scope, kind, key) with JSON values and versions, and an
append-only event log per scope.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..errors import InputError, StoreError
from ..messages import Message, Tier
from .retrieval import Hit


@dataclass(frozen=True, slots=True)
class NewRecord:
    """One message to store.

    Attributes:
        message: the validated message (``id`` may be ``None``: the store assigns one).
        text: its rendered text (:meth:`Message.text`), the text that is indexed.
        prediction: the scorer's prediction as a JSON-ready dict (category, probs, value, source, signals).
        embedding: its ``(dim,)`` float32 embedding for vector search, or ``None``.
        context: text indexed beside it with a lower weight (the start of the messages before it).
    """

    message: Message
    text: str
    prediction: dict[str, Any] | None = None
    embedding: np.ndarray | None = field(default=None, repr=False)
    context: str = ""


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """One message as stored.

    Attributes:
        message: the original, with its ``id`` and ``turn``.
        text: its rendered text.
        prediction: the stored prediction dict, or ``None``.
        tier: its last recorded tier.
        embedding: its embedding, or ``None``.
    """

    message: Message
    text: str
    prediction: dict[str, Any] | None
    tier: Tier
    embedding: np.ndarray | None = field(default=None, repr=False)

    @property
    def id(self) -> str:
        """The message id."""
        return self.message.id  # type: ignore[return-value]

    @property
    def turn(self) -> int:
        """0-based position in the session."""
        return self.message.turn  # type: ignore[return-value]


@runtime_checkable
class Store(Protocol):
    """Durable, searchable storage of sessions' original messages.

    Methods:
        add(session_id, records) -> list[StoredMessage]: append records in one transaction (all or
            nothing), allocating consecutive turns after the session's last one and ``m{turn}`` ids
            for records without an id (skipping ids already used); raises
            :class:`~ctxscore.errors.InputError` when an explicit id is already used in the session.
        get(session_id, message_id) -> StoredMessage | None.
        load(session_id, after_turn=-1) -> list[StoredMessage]: the session's messages with a turn
            above ``after_turn``, in turn order (a manager reads what other writers appended).
        search(session_id, query, k=10, *, query_embedding=None, only=None) -> list[Hit]: hybrid
            search fused by :func:`ctxscore.store.retrieval.fuse`.
        set_tiers(session_id, tiers): record (message id, tier) pairs.
        detach(session_id, from_turn) -> str: move the messages from ``from_turn`` on to a new
            session (returned) and out of this one; nothing is deleted.
        close(): release the backend.
    """

    def add(self, session_id: str, records: Sequence[NewRecord]) -> list[StoredMessage]: ...

    def get(self, session_id: str, message_id: str) -> StoredMessage | None: ...

    def load(self, session_id: str, after_turn: int = -1) -> list[StoredMessage]: ...

    def search(self, session_id: str, query: str, k: int = 10, *, query_embedding: np.ndarray | None = None,
               only: Callable[[str], bool] | None = None) -> list[Hit]: ...

    def set_tiers(self, session_id: str, tiers: Iterable[tuple[str, Tier]]) -> None: ...

    def detach(self, session_id: str, from_turn: int) -> str: ...

    def close(self) -> None: ...


# -- layer records and events ----------------------------------------------------------------------
#: Longest scope, kind or key accepted by :class:`RecordStore` methods (characters).
MAX_NAME_CHARS = 512
#: Longest session id or message id accepted by :meth:`Store.add` (bytes in UTF-8, besides at most
#: :data:`MAX_NAME_CHARS` characters): a (session id, message id) pair stays under PostgreSQL's
#: largest index entry (2,704 bytes), and every store refuses the same ids.
MAX_ID_BYTES = 1024


def check_ids(session_id: Any, records: Sequence[Any]) -> None:
    """Check the session id and the explicit message ids of a :meth:`Store.add` batch (every store).

    Raises:
        InputError: an id that is not a non-empty string, holds NUL, or is longer than
            :data:`MAX_NAME_CHARS` characters or :data:`MAX_ID_BYTES` bytes in UTF-8 (the message
            says the limit).
    """
    check_id(session_id, "session id")
    for r in records:
        if r.message.id is not None:
            check_id(r.message.id, "message id")


def check_id(value: Any, what: str) -> str:
    """``value`` if it is a valid session id or message id (see :func:`check_ids`)."""
    check_name(value, what)
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > MAX_ID_BYTES:
        raise InputError(f"{what} is {size:,} bytes in UTF-8; at most {MAX_ID_BYTES:,} bytes (and "
                         f"{MAX_NAME_CHARS} characters) are allowed")
    return value


@dataclass(frozen=True, slots=True)
class Record:
    """One layer record as stored.

    Attributes:
        key: its key within (scope, kind).
        value: its JSON value (decoded: dict, list, str, int, float, bool or None).
        version: 1 when first put, plus one at every later put of the same key.
        updated: time of the last put, seconds since the Unix epoch (the store's clock).
    """

    key: str
    value: Any
    version: int
    updated: float


@dataclass(frozen=True, slots=True)
class Event:
    """One appended event.

    Attributes:
        seq: its position in the scope's log: 1, 2, 3 ... with no gaps, in commit order.
        data: its JSON value (decoded).
        time: when it was appended, seconds since the Unix epoch (the store's clock).
    """

    seq: int
    data: Any
    time: float


@runtime_checkable
class RecordStore(Protocol):
    """Generic, durable place for the records of layers (fact ledger, profiles, events ...).

    A companion of :class:`Store` implemented by every built-in store (``SQLiteStore``,
    ``PostgresStore``); a layer checks ``isinstance(store, RecordStore)`` before using it. A *scope*
    is whatever the layer keys its records by: a session id, or a user id such as ``"user:42"``.

    Methods:
        put_records(scope, kind, records) -> dict[str, int]: insert or replace ``records`` (key ->
            JSON value) under (scope, kind) in one transaction (all or nothing); returns each key's
            new version.
        records(scope, kind) -> dict[str, Record]: every record under (scope, kind), by key.
        delete_records(scope, kind, keys) -> int: delete the keys (missing ones are ignored); the
            number deleted.
        append_events(scope, events) -> list[int]: append JSON values to the scope's append-only
            log in one transaction; their sequence numbers (consecutive, starting after the last).
        events(scope, after=0, limit=None) -> list[Event]: the scope's events with ``seq > after``,
            in order, at most ``limit``.

    Scopes, kinds and keys are non-empty strings of at most :data:`MAX_NAME_CHARS` characters
    without NUL; values are JSON (no NaN or infinity). Anything else raises
    :class:`~ctxscore.errors.InputError` and stores nothing; a backend failure raises
    :class:`~ctxscore.errors.StoreError` and stores nothing.
    """

    def put_records(self, scope: str, kind: str, records: Mapping[str, Any]) -> dict[str, int]: ...

    def records(self, scope: str, kind: str) -> dict[str, Record]: ...

    def delete_records(self, scope: str, kind: str, keys: Iterable[str]) -> int: ...

    def append_events(self, scope: str, events: Sequence[Any]) -> list[int]: ...

    def events(self, scope: str, after: int = 0, limit: int | None = None) -> list[Event]: ...


def decode_embedding(blob: Any, where: str) -> np.ndarray | None:
    """A stored embedding (float32 bytes) as a ``(dim,)`` array, ``None`` for NULL.

    Raises:
        StoreError: the stored value is not whole float32 values; the message names ``where`` (the
            store, session, message id and turn) and how to repair it.
    """
    if blob is None:
        return None
    if not isinstance(blob, bytes | bytearray | memoryview) or len(blob) % 4:
        size = f"{len(blob)} bytes" if isinstance(blob, bytes | bytearray | memoryview) else type(blob).__name__
        raise StoreError(f"{where} has a damaged embedding ({size}, not whole float32 values); restore it from a "
                         "backup or set that row's embedding to NULL")
    return np.frombuffer(blob, dtype=np.float32)


def check_name(value: Any, what: str) -> str:
    """``value`` if it is a valid scope, kind or key (see :class:`RecordStore`).

    Raises:
        InputError: not a string, empty, longer than :data:`MAX_NAME_CHARS`, or holding NUL.
    """
    if not isinstance(value, str) or not value:
        raise InputError(f"{what} must be a non-empty string, got {value!r}")
    if len(value) > MAX_NAME_CHARS:
        raise InputError(f"{what} has {len(value)} characters; at most {MAX_NAME_CHARS} are allowed")
    if "\x00" in value:
        raise InputError(f"{what} {value!r} holds a NUL character; remove it")
    return value


def dump_json(value: Any, what: str) -> str:
    """``value`` as JSON text (UTF-8 safe, NaN refused), the form records and events are stored in.

    Raises:
        InputError: ``value`` is not JSON (a set, an object, NaN, a lone surrogate ...).
    """
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
        text.encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise InputError(f"{what} is not a JSON value: {exc}; use dicts, lists, strings, numbers, booleans "
                         "and None (no NaN or infinity)") from None
    return text


def check_limit(limit: Any) -> int | None:
    """``limit`` if it is ``None`` or a non-negative integer.

    Raises:
        InputError: anything else.
    """
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise InputError(f"limit must be None or a non-negative integer, got {limit!r}")
    return limit
