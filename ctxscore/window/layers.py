"""Layers: parts of the context that live beside the history (a fact ledger, a user profile, a
context verifier, an event log), plugged in with ``ContextManager(layers=[...])``.

A layer sees every message once it is stored (:meth:`Layer.on_add`, in turn order, whoever wrote
it), every tier change (:meth:`Layer.on_tiers`), a rebuilt history (:meth:`Layer.on_reset`, after a
client's edit detached part of it) and every window (:meth:`Layer.after_build`); its
:attr:`Layer.sections` are assembled into the window at their positions, and their tokens count
against the budget like pinned content. A layer never edits the manager.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..config import Policy
from ..scoring.rules import RuleClassifier
from ..store.base import Store
from ..tokens import TokenCounter
from .history import Entry, History

if TYPE_CHECKING:
    from .assemble import BuildView, Section
    from .result import ContextWindow


@dataclass(frozen=True)
class LayerContext:
    """What a layer may read: the session's id, store, counter, rules, policy and history (read only).

    Attributes:
        session_id: the session.
        store: the session's store (a layer may keep its own records there).
        counter: the token counter of the window.
        rules: the rule classifier (entity patterns, keywords).
        policy: the tier policy.
        history: the session history; read it, never change it.
        scorer: the session's scorer (a learned one may carry a key-span extractor, ``scorer.spans``),
            or ``None``.
    """

    session_id: str
    store: Store
    counter: TokenCounter
    rules: RuleClassifier
    policy: Policy
    history: History
    scorer: Any = None


class Layer:
    """Base class of layers: every hook is optional (the defaults do nothing)."""

    #: The window sections this layer renders (see :class:`ctxscore.window.assemble.Section`).
    sections: Sequence[Section] = ()

    def attach(self, ctx: LayerContext) -> None:
        """Called once, before any message is read, with what the layer may use."""

    def on_add(self, entries: Sequence[Entry]) -> None:
        """Called with the entries just appended to the history, in turn order."""

    def on_tiers(self, entries: Sequence[Entry]) -> None:
        """Called with the entries whose tier changed in a build (``entry.tier`` is the new tier)."""

    def on_reset(self) -> None:
        """Called when the history is rebuilt (a rebase): forget what was derived from it; the kept
        messages are passed to :meth:`on_add` again."""

    def after_build(self, window: ContextWindow, view: BuildView) -> None:
        """Called with every assembled window (after the post-build hooks)."""

    def state(self) -> dict[str, Any]:
        """A JSON-ready summary of the layer's state (for snapshots and inspection)."""
        return {}
