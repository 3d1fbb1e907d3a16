"""Core value types: messages, categories, tiers, per-message decisions and the assembled window.

All token figures are in tokens of the configured tiktoken encoding (``cl100k_base`` by default).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from .errors import InputError

ROLES = ("system", "user", "assistant", "tool")

#: Largest accepted message content, in characters (about 4 MB of UTF-8 at worst). Bigger
#: messages are rejected with an :class:`InputError` instead of silently truncated.
MAX_CONTENT_CHARS = 4_000_000


class Category(StrEnum):
    """What a message is (the annotation guide's four labels, see ``data/README.md``)."""

    INSTRUCTION = "instruction"
    KEY_STATE = "key_state"
    REASONING = "reasoning"
    FAILURE = "failure"


CATEGORIES: tuple[str, ...] = tuple(c.value for c in Category)


class Tier(StrEnum):
    """How a message is represented in the assembled window, gentlest first."""

    VERBATIM = "verbatim"
    STRUCTURED = "structured"
    COMPRESSED = "compressed"
    ARCHIVED = "archived"


@dataclass(slots=True)
class Message:
    """One chat message.

    Attributes:
        role: one of ``system``, ``user``, ``assistant``, ``tool``.
        content: the text ("" is allowed only for an assistant message that carries ``tool_calls``).
        id: stable identifier; the manager assigns ``m{turn}`` style ids when missing.
        turn: 0-based position in the conversation (assigned by the manager on ``add``).
        name: optional tool or participant name (OpenAI ``name``).
        tool_call_id: for ``tool`` messages, the id of the assistant tool call they answer.
        tool_calls: for assistant messages, OpenAI-style tool calls
            (``[{"id", "type": "function", "function": {"name", "arguments"}}]``).
    """

    role: str
    content: str
    id: str | None = None
    turn: int | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[dict[str, Any]] | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, where: str = "message") -> Message:
        """Build a message from an OpenAI-style dict, validating it.

        Raises:
            InputError: unknown role, content of the wrong type, empty content without tool calls,
                content above :data:`MAX_CONTENT_CHARS`, or malformed ``tool_calls``. The message
                names ``where`` (for example ``"line 12"``) and says how to fix the input.
        """
        if not isinstance(data, dict):
            raise InputError(f"{where}: expected a JSON object with 'role' and 'content', got {type(data).__name__}")
        role = data.get("role")
        if role is None:
            raise InputError(f"{where}: missing 'role'; every message needs one of {', '.join(ROLES)}")
        if role not in ROLES:
            raise InputError(
                f"{where}: unknown role {role!r}; use one of {', '.join(ROLES)} "
                "(map 'developer' to 'system' and 'function' to 'tool')"
            )
        content = data.get("content")
        if content is None:
            content = ""
        if isinstance(content, list):  # OpenAI content parts: keep the text parts
            parts = []
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    parts.append(part["text"])
                elif isinstance(part, str):
                    parts.append(part)
            content = "\n".join(parts)
        if not isinstance(content, str):
            raise InputError(f"{where}: 'content' must be a string or a list of text parts, got {type(content).__name__}")
        tool_calls = data.get("tool_calls") or None
        if tool_calls is not None:
            if not isinstance(tool_calls, list) or not all(isinstance(c, dict) for c in tool_calls):
                raise InputError(f"{where}: 'tool_calls' must be a list of objects")
            if role != "assistant":
                raise InputError(f"{where}: only assistant messages may carry 'tool_calls' (role is {role!r})")
        if not content.strip() and not tool_calls and role != "tool":
            raise InputError(
                f"{where}: empty content in a {role} message; drop the message or give it text "
                "(only tool results and assistant messages with tool_calls may be empty)"
            )
        if len(content) > MAX_CONTENT_CHARS:
            raise InputError(
                f"{where}: content has {len(content):,} characters, above the limit of {MAX_CONTENT_CHARS:,}; "
                "store large tool output elsewhere and pass a reference or an excerpt"
            )
        tool_call_id = data.get("tool_call_id")
        if role == "tool" and tool_call_id is not None and not isinstance(tool_call_id, str):
            raise InputError(f"{where}: 'tool_call_id' must be a string")
        mid = data.get("id")
        return cls(
            role=role,
            content=content,
            id=str(mid) if mid is not None else None,
            turn=data.get("turn") if isinstance(data.get("turn"), int) else None,
            name=data.get("name") if isinstance(data.get("name"), str) else None,
            tool_call_id=tool_call_id,
            tool_calls=tool_calls,
        )

    def text(self) -> str:
        """The text the scorer and the archive see: content plus rendered tool calls.

        Tool calls are rendered as ``TOOL_CALL name(arguments)`` joined with ``"; "`` after the content
        (the rendering used by the distilled labels, see ``../shared/datasets/README.md``); a tool
        message with a ``name`` is rendered as ``[name] content``.
        """
        if self.role == "tool" and self.name:
            return f"[{self.name}] {self.content}"
        if self.tool_calls:
            calls = "; ".join(
                f"{(c.get('function') or {}).get('name', '')}({(c.get('function') or {}).get('arguments', '')})"
                for c in self.tool_calls
            )
            return f"{self.content}\nTOOL_CALL {calls}" if self.content else f"TOOL_CALL {calls}"
        return self.content

    def to_openai(self, content: str | None = None) -> dict[str, Any]:
        """OpenAI chat-completions dict, optionally with replaced ``content``."""
        out: dict[str, Any] = {"role": self.role, "content": self.content if content is None else content}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


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
        warnings: human-readable warnings (for example pinned content above the budget).
    """

    __slots__ = ("messages", "tokens", "budget", "paged_in", "warnings", "_decisions", "_decide")

    def __init__(
        self,
        messages: list[dict[str, Any]],
        tokens: int,
        budget: int,
        decisions: list[Decision] | None = None,
        paged_in: list[str] | None = None,
        warnings: list[str] | None = None,
        decide: Callable[[], list[Decision]] | None = None,
    ) -> None:
        self.messages = messages
        self.tokens = tokens
        self.budget = budget
        self.paged_in = paged_in or []
        self.warnings = warnings or []
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
            "warnings": self.warnings,
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
