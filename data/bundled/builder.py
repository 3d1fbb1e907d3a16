"""Session builder for the bundled project-written set (standard library only).

A :class:`Session` collects OpenAI-style messages, each with its label (category, importance 0-3,
key spans), and the session's key facts. Every addition is checked at once, so a template that
breaks the data contract (a key span that is not in the rendered text, a fact value that is not in
its source message, a tool result without a pending call) fails the build with a message naming the
session and the message index.

The rendering used for key spans is the one the distilled labels used (see
``../shared/datasets/labels/README.md``) and that ``ctxscore.types.Message.text`` implements: a tool
message with a name is ``[name] content``; an assistant message with tool calls is the content, a
newline when the content is non-empty, then ``TOOL_CALL `` and the calls joined by ``"; "``, each as
``name(arguments)``.
"""

from __future__ import annotations

import json
import random
from typing import Any

I = "instruction"  # noqa: E741  (short category constants keep the templates readable)
K = "key_state"
R = "reasoning"
F = "failure"
CATEGORIES = (I, K, R, F)
MAX_SPANS = 8


def render(msg: dict[str, Any]) -> str:
    """The labelled text of one message dict (same rule as ``ctxscore.types.Message.text``)."""
    if msg["role"] == "tool" and msg.get("name"):
        return f"[{msg['name']}] {msg['content']}"
    calls = msg.get("tool_calls")
    if calls:
        rendered = "; ".join(f"{c['function']['name']}({c['function']['arguments']})" for c in calls)
        return f"{msg['content']}\nTOOL_CALL {rendered}" if msg["content"] else f"TOOL_CALL {rendered}"
    return msg["content"]


def dumps(obj: Any) -> str:
    """Compact, readable JSON for tool arguments and tool results (non-ASCII kept as is)."""
    return json.dumps(obj, ensure_ascii=False)


class BuildError(ValueError):
    """A template broke the data contract; the message names the session and message index."""


class Session:
    """One session under construction.

    Args:
        slug: the part after ``bundled/`` in the session id.
        language: ``"en"`` or ``"zh"``.
        scenario: scenario family name (for example ``"travel_booking"``).
        rng: the session's own random generator (used for tool-call ids).
    """

    def __init__(self, slug: str, language: str, scenario: str, rng: random.Random) -> None:
        self.session_id = f"bundled/{slug}"
        self.language = language
        self.scenario = scenario
        self.rng = rng
        self.messages: list[dict[str, Any]] = []
        self.key_facts: list[dict[str, Any]] = []
        self._pending: list[tuple[str, str]] = []  # (call id, function name) awaiting a result

    # -- messages -------------------------------------------------------------------------------
    def _err(self, index: int, what: str) -> BuildError:
        return BuildError(f"{self.session_id}#{index}: {what}")

    def _add(self, msg: dict[str, Any], cat: str, imp: int, spans: tuple[str, ...] | list[str]) -> int:
        index = len(self.messages)
        if cat not in CATEGORIES:
            raise self._err(index, f"unknown category {cat!r}")
        if imp not in (0, 1, 2, 3):
            raise self._err(index, f"importance must be 0-3, got {imp!r}")
        if msg["role"] != "tool" and self._pending:
            raise self._err(index, f"tool calls {self._pending} have no result before this {msg['role']} message")
        spans = list(dict.fromkeys(spans))  # drop duplicates, keep order
        if len(spans) > MAX_SPANS:
            raise self._err(index, f"{len(spans)} key spans, at most {MAX_SPANS}")
        text = render(msg)
        for span in spans:
            if not span or span not in text:
                raise self._err(index, f"key span {span!r} is not in the rendered text {text[:200]!r}")
        msg["label"] = {"category": cat, "importance": imp, "key_spans": spans}
        self.messages.append(msg)
        return index

    def system(self, text: str, imp: int = 3, spans: tuple[str, ...] | list[str] = ()) -> int:
        """Add the operator's system prompt (always ``instruction``)."""
        return self._add({"role": "system", "content": text}, I, imp, spans)

    def user(self, text: str, cat: str, imp: int, spans: tuple[str, ...] | list[str] = ()) -> int:
        """Add a user message; returns its index."""
        return self._add({"role": "user", "content": text}, cat, imp, spans)

    def say(self, text: str, cat: str, imp: int, spans: tuple[str, ...] | list[str] = ()) -> int:
        """Add an assistant message without tool calls; returns its index."""
        return self._add({"role": "assistant", "content": text}, cat, imp, spans)

    def call(
        self,
        name: str,
        args: dict[str, Any],
        cat: str,
        imp: int,
        spans: tuple[str, ...] | list[str] = (),
        text: str = "",
        more: list[tuple[str, dict[str, Any]]] | None = None,
    ) -> int:
        """Add an assistant message with one tool call (plus parallel calls in ``more``).

        Each call must be answered by :meth:`tool`, in order, before the next non-tool message.
        """
        calls = []
        for fname, fargs in [(name, args), *(more or [])]:
            cid = "call_" + format(self.rng.getrandbits(48), "012x")
            calls.append({"id": cid, "type": "function", "function": {"name": fname, "arguments": dumps(fargs)}})
        msg = {"role": "assistant", "content": text, "tool_calls": calls}
        index = self._add(msg, cat, imp, spans)
        self._pending.extend((c["id"], c["function"]["name"]) for c in calls)
        return index

    def tool(self, content: Any, cat: str, imp: int, spans: tuple[str, ...] | list[str] = ()) -> int:
        """Add the result of the oldest pending tool call (``content`` dicts/lists become JSON)."""
        if not self._pending:
            raise self._err(len(self.messages), "tool result without a pending tool call")
        cid, fname = self._pending[0]
        text = content if isinstance(content, str) else dumps(content)
        msg = {"role": "tool", "content": text, "name": fname, "tool_call_id": cid}
        self._pending.pop(0)
        return self._add(msg, cat, imp, spans)

    # -- key facts ------------------------------------------------------------------------------
    def fact(
        self,
        fact_id: str,
        value: str,
        kind: str,
        probe: str,
        at: int | None = None,
        superseded: str | None = None,
    ) -> None:
        """Record a key fact whose ``value`` is in the content of message ``at`` (default: the last).

        ``superseded`` is the old value a correction replaced; it must be in an earlier message.
        """
        index = len(self.messages) - 1 if at is None else at
        if not 0 <= index < len(self.messages):
            raise self._err(index, f"fact {fact_id!r} points outside the session")
        if value not in self.messages[index]["content"]:
            raise self._err(index, f"fact {fact_id!r} value {value!r} is not in the message content")
        if any(f["fact_id"] == fact_id for f in self.key_facts):
            raise self._err(index, f"duplicate fact id {fact_id!r}")
        fact: dict[str, Any] = {"fact_id": fact_id, "value": value, "source_index": index, "probe": probe, "kind": kind}
        if superseded is not None:
            if not any(superseded in m["content"] for m in self.messages[:index]):
                raise self._err(index, f"fact {fact_id!r}: superseded value {superseded!r} is in no earlier message")
            fact["superseded"] = superseded
        self.key_facts.append(fact)

    # -- output ---------------------------------------------------------------------------------
    def finish(self) -> dict[str, Any]:
        """The session record (checks that every tool call got its result)."""
        if self._pending:
            raise self._err(len(self.messages), f"tool calls {self._pending} never got a result")
        return {
            "session_id": self.session_id,
            "language": self.language,
            "scenario": self.scenario,
            "messages": self.messages,
            "key_facts": self.key_facts,
        }
