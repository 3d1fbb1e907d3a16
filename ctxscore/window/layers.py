"""Layers: parts of the context that live beside the history (a fact ledger, a user profile, a
context verifier, an event log), plugged in with ``ContextManager(layers=[...])``.

A layer sees every message once it is stored (:meth:`Layer.on_add`, in turn order, whoever wrote
it), every tier change (:meth:`Layer.on_tiers`), a rebuilt history (:meth:`Layer.on_reset`, after a
client's edit detached part of it) and every window (:meth:`Layer.after_build`); its
:attr:`Layer.sections` are assembled into the window at their positions, and their tokens count
against the budget like pinned content. A layer never edits the manager.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..config import Policy
from ..errors import ConfigError
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


#: The hooks every layer has (a :class:`Layer` subclass inherits them all).
LAYER_HOOKS = ("sections", "attach", "on_add", "on_tiers", "on_reset", "after_build", "state")
#: The attribute that names the session a layer serves (a weak reference to its session state).
_OWNER = "_ctxscore_owner"


def check_layers(layers: Any) -> list[Layer]:
    """The layers of one manager, checked: instances with every hook of :class:`Layer`, each given
    once, none serving another live manager's session (a layer holds one session's state: a ledger
    shared by two managers mixed one user's facts into another's window).

    Raises:
        ConfigError: ``layers`` is not a sequence of layers, or one of them is a class, lacks a hook,
            is given twice or already serves another session; the message names it and the fix.
    """
    if layers is None:
        return []
    if isinstance(layers, (str, bytes)) or not isinstance(layers, Iterable):
        raise ConfigError(f"layers must be a list of layers (e.g. [FactLedger()]), got {type(layers).__name__}")
    out = list(layers)
    seen: set[int] = set()
    for i, layer in enumerate(out):
        if isinstance(layer, type):
            raise ConfigError(f"layers[{i}] is the class {layer.__name__}, not a layer: pass an instance, "
                              f"e.g. {layer.__name__}()")
        name = type(layer).__name__
        missing = [h for h in LAYER_HOOKS if not hasattr(layer, h)]
        if missing:
            raise ConfigError(f"layers[{i}] ({name}) is not a layer: it has no {', '.join(missing)}; "
                              "subclass ctxscore.window.layers.Layer")
        if id(layer) in seen:
            raise ConfigError(f"layers[{i}] ({name}) is given twice; pass each layer once")
        seen.add(id(layer))
        ref = getattr(layer, _OWNER, None)
        owner = ref() if ref is not None else None
        if owner is not None:
            raise ConfigError(f"layers[{i}] ({name}) already serves session {owner.session_id!r} of another "
                              "ContextManager: a layer holds one session's state, so give each manager its own "
                              "instance (close the other manager first to hand it over)")
    return out


def claim_layers(layers: Sequence[Layer], owner: Any) -> None:
    """Mark ``layers`` as serving ``owner`` (a session state, held weakly: a manager that is gone
    frees them). A layer that takes no attributes (``__slots__``) is not marked."""
    for layer in layers:
        try:
            setattr(layer, _OWNER, weakref.ref(owner))
        except AttributeError:
            pass


def free_layers(layers: Sequence[Layer], owner: Any) -> None:
    """Free the ``layers`` that still serve ``owner`` (:meth:`ctxscore.ContextManager.close`); one another
    manager took over since stays its (a second close of the first manager frees nothing)."""
    for layer in layers:
        ref = getattr(layer, _OWNER, None)
        if ref is not None and ref() is owner:
            setattr(layer, _OWNER, None)


def check_share(owner: str, share: Any) -> float:
    """A layer's share of the budget: a number in (0, 1].

    Raises:
        ConfigError: ``share`` is not a number (a string, ``None``, a bool) or is outside (0, 1].
    """
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
        raise ConfigError(f"{owner} share must be a number in (0, 1] (a fraction of the budget), got {share!r}")
    return float(share)
