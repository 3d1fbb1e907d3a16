"""What a build returns: the assembled :class:`ContextWindow` and one :class:`Decision` per message.

All token figures are in tokens of the configured tiktoken encoding (``cl100k_base`` by default).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class WarningKind(StrEnum):
    """What a :class:`WindowWarning` is about."""

    PINNED_OVER_BUDGET = "pinned_over_budget"  #: pinned content alone exceeds the budget
    RECENCY_RELAXED = "recency_relaxed"  #: recent turns had to be compacted to fit
    OVER_BUDGET = "over_budget"  #: the window is above the budget although pinned content fits
    LAST_MESSAGE_FITTED = "last_message_fitted"  #: the last message alone exceeds the room left: shown cut to fit
    PAGE_IN_SKIPPED = "page_in_skipped"  #: a relevant hit could not be paged in for lack of room
    STORE_UNAVAILABLE = "store_unavailable"  #: the store could not record tiers; the window is built from memory


@dataclass(frozen=True, slots=True)
class WindowWarning:
    """A warning of one build: its kind, the human-readable message (``str(w)``) and its figures.

    Attributes:
        kind: the :class:`WarningKind`.
        message: what happened and what to do, with the figures.
        figures: the figures by name (tokens, budgets, turns), for programs.
    """

    kind: WarningKind
    message: str
    figures: dict[str, int | float] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.message

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON representation."""
        return {"kind": str(self.kind), "message": self.message, "figures": dict(self.figures)}


@dataclass(frozen=True, slots=True)
class SectionInfo:
    """One section of a window: its name, how many messages it holds and their tokens (with chat overhead)."""

    name: str
    messages: int
    tokens: int


@dataclass(slots=True)
class Decision:
    """What the manager did with one original message in one build.

    Attributes:
        id: the message id.
        turn: 0-based position in the conversation.
        role: the message role.
        category: predicted :class:`Category` value.
        value: value score in [0, 1].
        tier: the :class:`Tier` value chosen.
        tokens_before: tokens of the original message (content + chat overhead).
        tokens_after: tokens it occupies in the window (0 if paged out entirely, stub tokens if archived).
        pinned: never compressed or archived (instruction / hard constraint / recent turns).
        paged_in: the original was brought back from the archive for the current query.
        factors: the value factors (name -> multiplier or term), for explanations.
        reason: short human-readable reason for the tier.
    """

    id: str
    turn: int
    role: str
    category: str
    value: float
    tier: str
    tokens_before: int
    tokens_after: int
    pinned: bool = False
    paged_in: bool = False
    factors: dict[str, float] = field(default_factory=dict)
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON representation."""
        return {
            "id": self.id,
            "turn": self.turn,
            "role": self.role,
            "category": self.category,
            "value": round(self.value, 4),
            "tier": self.tier,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "pinned": self.pinned,
            "paged_in": self.paged_in,
            "factors": {k: round(v, 4) for k, v in self.factors.items()},
            "reason": self.reason,
        }


class ContextWindow:
    """The assembled context for one LLM call.

    Attributes:
        messages: OpenAI-style message dicts, in conversation order, ready to send.
        tokens: tokens of ``messages`` including per-message chat overhead and reply priming.
        budget: the token budget the window was built for.
        decisions: one :class:`Decision` per original message, in conversation order (built on first
            access from a snapshot taken at build time, so reading it later still describes this build).
        paged_in: ids of archived messages brought back for the query.
        warnings: :class:`WindowWarning` s of this build (``str(w)`` is the message).
        sections: one :class:`SectionInfo` per section, in window order.
        findings: what post-build hooks (the context verifier) found, in the order they ran.
    """

    __slots__ = ("messages", "tokens", "budget", "paged_in", "warnings", "sections", "findings", "_decisions", "_decide")

    def __init__(
        self,
        messages: list[dict[str, Any]],
        tokens: int,
        budget: int,
        decisions: list[Decision] | None = None,
        paged_in: list[str] | None = None,
        warnings: list[WindowWarning] | None = None,
        decide: Callable[[], list[Decision]] | None = None,
        sections: list[SectionInfo] | None = None,
    ) -> None:
        self.messages = messages
        self.tokens = tokens
        self.budget = budget
        self.paged_in = paged_in or []
        self.warnings = warnings or []
        self.sections = sections or []
        self.findings: list[Any] = []
        self._decisions = decisions
        self._decide = decide

    @property
    def decisions(self) -> list[Decision]:
        """One :class:`Decision` per original message."""
        if self._decisions is None:
            self._decisions = self._decide() if self._decide is not None else []
            self._decide = None
        return self._decisions

    @property
    def utilization(self) -> float:
        """``tokens / budget`` as a fraction (may exceed 1.0 only when pinned content does)."""
        return self.tokens / self.budget if self.budget else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON representation (what ``ctxscore compress`` writes)."""
        return {
            "messages": self.messages,
            "tokens": self.tokens,
            "budget": self.budget,
            "utilization": round(self.utilization, 4),
            "paged_in": self.paged_in,
            "warnings": [w.to_dict() for w in self.warnings],
            "sections": [{"name": x.name, "messages": x.messages, "tokens": x.tokens} for x in self.sections],
            "findings": [f.to_dict() if hasattr(f, "to_dict") else f for f in self.findings],
            "decisions": [d.to_dict() for d in self.decisions],
        }

    def to_json(self, **kwargs: Any) -> str:
        """JSON text of :meth:`to_dict`."""
        return json.dumps(self.to_dict(), ensure_ascii=False, **kwargs)

    def __repr__(self) -> str:
        return (
            f"ContextWindow(messages={len(self.messages)}, tokens={self.tokens}, budget={self.budget}, "
            f"utilization={self.utilization:.3f}, paged_in={self.paged_in}, warnings={len(self.warnings)})"
        )
