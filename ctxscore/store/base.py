"""The Store protocol: where every original message lives, durable and searchable.

A store keeps whole originals (they are never lost: compressed forms live only in the window),
allocates each message's turn and automatic id atomically (so two writers on one session never
collide), and searches a session with the shared retrieval of :mod:`ctxscore.store.retrieval`.
Implementations: :class:`ctxscore.store.sqlite.SQLiteStore` (embedded default, file or memory).
Every failure of the backend is raised as :class:`~ctxscore.errors.StoreError`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

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
