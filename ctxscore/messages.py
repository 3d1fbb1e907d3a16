"""Messages and the vocabulary around them: roles, categories, tiers, the validated Message value.

All token figures are in tokens of the configured tiktoken encoding (``cl100k_base`` by default).
"""

from __future__ import annotations

from dataclasses import dataclass
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
