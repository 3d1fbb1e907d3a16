"""Syncing with a client that resends the whole conversation on every call (OpenAI-style clients).

:func:`plan_sync` compares the client's list with the history and says what to do:

- ``append``: the history is a prefix of the list; add the rest.
- ``trimmed``: the list is the history's leading system messages followed by a suffix of the history
  (the client trimmed its own copy) and new messages; add the new ones.
- ``rebased``: the list differs from the history at some position (the client edited or retried an
  earlier turn); the history from there on is detached in the store (kept, not deleted) and the rest
  of the list is added.

Two messages are the same when role, content (parts included), name, tool calls and tool_call_id
are equal, and the ids too when the client sent one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..messages import Message, Role
from .history import History


@dataclass(frozen=True)
class SyncResult:
    """What :meth:`ContextManager.sync` did.

    Attributes:
        added: the messages added (stored, with ids and turns).
        mode: ``"append"`` (the history was a prefix of the list), ``"trimmed"`` (the client sent only
            a suffix of the history, after its system messages), or ``"rebased"`` (the list differs
            from the history at ``kept``: the history from there on moved to the session ``detached``).
        kept: messages of the history kept as they were.
        detached: the session now holding the replaced messages (``"rebased"`` only), else ``None``.
    """

    added: list[Message]
    mode: str
    kept: int
    detached: str | None = None


@dataclass(frozen=True)
class SyncPlan:
    """What :func:`plan_sync` decided: the mode, the index in the client's list of the first message
    to add (for ``rebased``: also the first turn of the history to detach), and the history messages kept."""

    mode: str
    start: int
    kept: int


def plan_sync(hist: Sequence[Message], incoming: Sequence[Message]) -> SyncPlan:
    """Compare the history with the client's list (see the module docstring)."""
    p = _common_prefix(hist, incoming)
    if p == len(hist):
        return SyncPlan("append", p, p)
    start = _trimmed_start(hist, incoming)
    if start is not None:
        return SyncPlan("trimmed", start, len(hist))
    return SyncPlan("rebased", p, p)


def is_append(hist: Sequence[Message], incoming: Sequence[Message]) -> bool:
    """True when ``hist`` is a prefix of ``incoming`` (message by message, as :func:`plan_sync` compares)."""
    return len(hist) <= len(incoming) and _common_prefix(hist, incoming) == len(hist)


def _same(a: Message, b: Message) -> bool:
    """Same message, ignoring the turn, and the id when the incoming ``b`` has none."""
    return (b.id is None or b.id == a.id) and (a.role, a.content, a.name, a.tool_call_id, a.tool_calls, a.parts) == (
        b.role, b.content, b.name, b.tool_call_id, b.tool_calls, b.parts)


def _common_prefix(hist: Sequence[Message], incoming: Sequence[Message]) -> int:
    n = 0
    for a, b in zip(hist, incoming, strict=False):
        if not _same(a, b):
            break
        n += 1
    return n


def _trimmed_start(hist: Sequence[Message], incoming: Sequence[Message]) -> int | None:
    """Index of the first new message when ``incoming`` is the history's leading system messages
    followed by a suffix of the history and new messages; ``None`` otherwise."""
    s = 0
    while s < len(incoming) and s < len(hist) and incoming[s].role == Role.SYSTEM and _same(hist[s], incoming[s]):
        s += 1
    if s == len(incoming):
        return None
    for q in range(len(hist) - 1, s - 1, -1):  # the latest alignment wins
        if _same(hist[q], incoming[s]) and all(_same(a, b) for a, b in zip(hist[q:], incoming[s:], strict=False)):
            if len(incoming) - s >= len(hist) - q:
                return s + len(hist) - q
    return None


def prefix_history(history: History, p: int) -> History:
    """A history view holding the ids and calls of the first ``p`` entries (for validating a rebase)."""
    view = History()
    for e in history.entries[:p]:
        view.ids[e.msg.id] = e.msg.turn  # type: ignore[index]
        for c in e.msg.tool_calls:
            view.call_owner[c.id] = e.msg.turn  # type: ignore[assignment]
    return view
