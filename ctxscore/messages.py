"""Messages and the vocabulary around them: roles, categories, tiers and the validated :class:`Message`.

A :class:`Message` is a pure value: frozen, holding no reference to the caller's dicts, and every
dict it hands out (:meth:`Message.to_openai`) is a fresh copy. :meth:`Message.from_dict` is the one
validation of an OpenAI-style chat message at the boundary; every error is an
:class:`~ctxscore.errors.InputError` that names the message and says how to fix it.

Content may be a string or a list of OpenAI content parts (``text``, ``image_url``, ``input_audio``,
``file``, ``refusal`` ...). Parts are kept whole and passed through to the window; the scorer and the
store's search see the text parts joined by newlines.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from .errors import InputError
from .memory.lexicon import OBSERVATION_HEAD, OBSERVATION_HEAD_CHARS


class Role(StrEnum):
    """The chat roles of OpenAI's chat-completions API."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


ROLES: tuple[str, ...] = tuple(r.value for r in Role)

#: Largest accepted message content, in characters (about 4 MB of UTF-8 at worst), counting the
#: content, a refusal and the arguments of the tool calls together (the text the scorer and the
#: store read). Bigger messages are rejected with an :class:`InputError` instead of silently truncated.
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


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call of an assistant message (OpenAI ``tool_calls[i]``).

    Attributes:
        id: the call id that the tool message's ``tool_call_id`` answers.
        name: the function name.
        arguments: the arguments as the JSON text the model produced (kept byte-exact).
        type: ``"function"``.
    """

    id: str
    name: str
    arguments: str
    type: str = "function"

    def to_openai(self) -> dict[str, Any]:
        """A fresh OpenAI-style dict ``{"id", "type", "function": {"name", "arguments"}}``."""
        return {"id": self.id, "type": self.type, "function": {"name": self.name, "arguments": self.arguments}}

    def render(self) -> str:
        """``name(arguments)``: the rendering the scorer, the labels and the token count use."""
        return f"{self.name}({self.arguments})"


@dataclass(frozen=True, slots=True)
class ContentPart:
    """One OpenAI content part, kept whole.

    Attributes:
        type: the part type (``text``, ``image_url``, ``input_audio``, ``file``, ``refusal`` ...).
        text: the text of a ``text`` (or ``refusal``) part, else ``None``.
        data: the whole part as canonical JSON (what :meth:`to_openai` gives back).
    """

    type: str
    text: str | None
    data: str

    def to_openai(self) -> dict[str, Any]:
        """A fresh copy of the part as given."""
        return json.loads(self.data)


def _check_text(value: str, what: str, where: str) -> None:
    """Refuse text that cannot be stored or encoded (lone UTF-16 surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(
            f"{where}: {what} holds a lone surrogate {value[exc.start]!r} at character {exc.start}, which is not "
            "valid Unicode text; decode the source bytes with errors='replace' or remove the character"
        ) from None


def _tool_call(raw: Any, i: int, where: str) -> ToolCall:
    w = f"{where}: tool_calls[{i}]"
    if not isinstance(raw, dict):
        raise InputError(f"{w} must be an object {{'id', 'type': 'function', 'function': {{'name', 'arguments'}}}}")
    fn = raw.get("function")
    if not isinstance(fn, dict):
        raise InputError(
            f"{w}: 'function' must be an object {{'name': str, 'arguments': JSON string}}, got {type(fn).__name__}"
        )
    cid, name, args = raw.get("id"), fn.get("name"), fn.get("arguments", "")
    if not isinstance(cid, str) or not cid:
        raise InputError(f"{w}: 'id' must be a non-empty string (the tool message's tool_call_id refers to it)")
    if not isinstance(name, str) or not name:
        raise InputError(f"{w}: 'function.name' must be a non-empty string")
    if not isinstance(args, str):
        raise InputError(f"{w}: 'function.arguments' must be a JSON string, got {type(args).__name__}; json.dumps it")
    kind = raw.get("type", "function")
    if kind != "function":
        raise InputError(f"{w}: 'type' must be 'function', got {kind!r}")
    for what, v in (("the call id", cid), ("the function name", name), ("the arguments", args)):
        _check_text(v, what, w)
    return ToolCall(id=cid, name=name, arguments=args)


def _tool_calls(raw: Any, role: str, where: str) -> tuple[ToolCall, ...]:
    """The validated ``tool_calls`` of a message (``None``: none)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InputError(f"{where}: 'tool_calls' must be a list of objects")
    if role != "assistant":
        raise InputError(f"{where}: only assistant messages may carry 'tool_calls' (role is {role!r})")
    return tuple(_tool_call(c, i, where) for i, c in enumerate(raw))


def _audio(audio: Any, role: str, where: str) -> str | None:
    """An assistant message's ``audio`` as :attr:`Message.audio` keeps it: ``{"id"}`` as JSON, what a
    request sends back (a resent answer also holds the audio's data, transcript and expiry, which the
    chat-completions request does not take); ``None`` when absent."""
    if audio is None:
        return None
    if role != "assistant" or not isinstance(audio, dict) or not isinstance(audio.get("id"), str):
        raise InputError(f"{where}: 'audio' must be an object {{'id': str}} on an assistant message (a model's "
                         f"audio reply), got {type(audio).__name__} on a {role} message")
    _check_text(audio["id"], "the audio id", where)
    return json.dumps({"id": audio["id"]}, ensure_ascii=False)


def _content_parts(raw: list[Any], where: str) -> tuple[ContentPart, ...]:
    parts = []
    for i, p in enumerate(raw):
        w = f"{where}: content[{i}]"
        if isinstance(p, str):  # a bare string is taken as a text part
            p = {"type": "text", "text": p}
        if not isinstance(p, dict) or not isinstance(p.get("type"), str):
            raise InputError(f"{w}: a content part must be an object with a 'type' (text, image_url, ...)")
        text = p.get("text") if p["type"] == "text" else p.get("refusal") if p["type"] == "refusal" else None
        if p["type"] in ("text", "refusal") and not isinstance(text, str):
            raise InputError(f"{w}: a {p['type']} part needs a string {p['type'] if p['type'] == 'refusal' else 'text'!r}")
        img = p.get("image_url") if p["type"] == "image_url" else None
        if p["type"] == "image_url" and not (isinstance(img, dict) and isinstance(img.get("url"), str)):
            got = "" if img is None or isinstance(img, dict) else (
                f", got 'image_url' as a {type(img).__name__}; write the URL as {{'image_url': {{'url': ...}}}}")
            raise InputError(f"{w}: an image_url part needs {{'image_url': {{'url': str, 'detail'?: 'low'|'high'|'auto'}}}} "
                             f"(the OpenAI form){got}")
        try:
            data = json.dumps(p, ensure_ascii=False, sort_keys=True)
        except (TypeError, ValueError, RecursionError) as exc:
            raise InputError(f"{w}: the part is not JSON-serialisable ({exc})") from None
        _check_text(data, "the part", w)
        parts.append(ContentPart(type=p["type"], text=text, data=data))
    return tuple(parts)


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message, immutable.

    Attributes:
        role: one of :data:`ROLES`.
        content: the text: the string content, or the text parts joined by ``"\\n"``.
        id: stable identifier; the store assigns ``m{turn}`` style ids when missing (skipping used ones).
        turn: 0-based position in the conversation (assigned when the message is added).
        name: optional tool or participant name (OpenAI ``name``).
        tool_call_id: for ``tool`` messages, the id of the assistant tool call they answer.
        tool_calls: for assistant messages, the :class:`ToolCall` s (OpenAI-style dicts are accepted
            by the constructor and converted).
        parts: the content parts when the content was given as a list (empty for string content).
        audio: an assistant message's ``audio`` reference as JSON, ``{"id": ...}`` only (what the next
            request sends back after a model's audio reply), else ``None``.

    Use :meth:`from_dict` to build one from untrusted input (it validates); the constructor trusts
    its arguments. Change a field with :func:`dataclasses.replace`.
    """

    role: str
    content: str
    id: str | None = None
    turn: int | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    parts: tuple[ContentPart, ...] = field(default=(), repr=False)
    audio: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        calls = self.tool_calls
        if calls is None:
            object.__setattr__(self, "tool_calls", ())
        elif not isinstance(calls, tuple) or not all(isinstance(c, ToolCall) for c in calls):
            object.__setattr__(self, "tool_calls", tuple(
                c if isinstance(c, ToolCall) else ToolCall(
                    id=str(c.get("id") or ""), name=str((c.get("function") or {}).get("name", "")),
                    arguments=str((c.get("function") or {}).get("arguments", "")), type=str(c.get("type", "function")))
                for c in calls
            ))

    @classmethod
    def from_dict(cls, data: Any, *, where: str = "message") -> Message:
        """Build a message from an OpenAI-style dict, validating it (the dict is not kept or changed).

        An assistant message's ``refusal`` (what chat.completions returns when the model refuses,
        with ``content`` null) is kept as the equivalent ``{"type": "refusal"}`` content part, after
        the content's text when it has some; the window sends it back in that form. A refusal part's
        text is part of the message's text (what the scorer, the search and compressed forms read).
        The size limit counts the content (with a refusal) and the arguments of the tool calls
        together, as :meth:`text` joins them.

        Raises:
            InputError: not an object; unknown role; content of the wrong type, empty in a system or
                user message, holding a lone surrogate, or with its refusal and the arguments of its
                tool calls above :data:`MAX_CONTENT_CHARS` characters in all; malformed
                ``tool_calls`` (``function`` not an object, arguments not a string ...); a ``refusal``
                that is not a string or not on an assistant message; an ``audio`` that is not
                ``{"id": str}`` on an assistant message; a ``tool``
                message without ``tool_call_id``; a non-string ``name``; an ``id`` that is not a
                non-empty string or an integer. The message names ``where`` (for example ``"line 12"``).
        """
        if isinstance(data, Message):
            data = data.to_openai() | ({"id": data.id} if data.id is not None else {})
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
        if data.get("function_call") is not None:  # the openai SDK's model_dump() gives it as null
            raise InputError(f"{where}: the legacy 'function_call' field is not supported; send it as 'tool_calls'")
        content, parts = _content(data.get("content"), where)
        calls = _tool_calls(data.get("tool_calls") or None, role, where)
        refusal = data.get("refusal")
        if refusal is not None:
            if role != "assistant" or not isinstance(refusal, str):
                raise InputError(f"{where}: 'refusal' must be a string on an assistant message (the model's "
                                 f"refusal), got {type(refusal).__name__} on a {role} message")
            if refusal and not any(p.type == "refusal" and p.text == refusal for p in parts):
                # kept as the equivalent refusal content part (chat.completions takes both forms)
                if len(content) + len(refusal) > MAX_CONTENT_CHARS:
                    raise InputError(f"{where}: content and refusal have {len(content) + len(refusal):,} characters, "
                                     f"above the limit of {MAX_CONTENT_CHARS:,}")
                text_part = (_content_parts([content], where) if content else ())
                parts = (*(parts or text_part), *_content_parts([{"type": "refusal", "refusal": refusal}], where))
                content = _parts_text(parts)
        size = len(content) + sum(len(c.arguments) for c in calls)
        if size > MAX_CONTENT_CHARS:
            raise InputError(f"{where}: content and tool-call arguments have {size:,} characters, above the limit "
                             f"of {MAX_CONTENT_CHARS:,}; pass large arguments by reference (a path or an id)")
        if refuses_empty(role, content, tool_calls=bool(calls), parts=bool(parts)):
            raise InputError(
                f"{where}: empty content in a {role} message; drop the message or give it text "
                "(only tool results and assistant messages may be empty)"
            )
        tool_call_id = data.get("tool_call_id")
        if role == "tool":
            if tool_call_id is not None and not isinstance(tool_call_id, str):
                raise InputError(f"{where}: 'tool_call_id' must be a string (the id of the assistant tool call it "
                                 f"answers), got {type(tool_call_id).__name__} {tool_call_id!r}; write it as "
                                 f"\"{tool_call_id}\", the id the call carries")
            if not tool_call_id:
                raise InputError(
                    f"{where}: a tool message needs 'tool_call_id', the id of the assistant tool call it answers "
                    "(chat.completions rejects it otherwise); send the text as a user message if it answers no call"
                )
            _check_text(tool_call_id, "tool_call_id", where)
        else:
            tool_call_id = None
        name = data.get("name")
        if name is not None:
            if not isinstance(name, str):
                raise InputError(f"{where}: 'name' must be a string, got {type(name).__name__}")
            _check_text(name, "name", where)
        return cls(role=role, content=content, id=_message_id(data.get("id"), where), name=name,
                   tool_call_id=tool_call_id, tool_calls=calls, parts=parts, audio=_audio(data.get("audio"), role, where))

    def text(self) -> str:
        """The text the scorer and the store see: content plus rendered tool calls.

        Tool calls are rendered as ``TOOL_CALL name(arguments)`` joined with ``"; "`` after the content
        (the rendering used by the distilled labels, see ``../shared/datasets/README.md``); a tool
        message with a ``name`` is rendered as ``[name] content``.
        """
        if self.role == "tool" and self.name:
            return f"[{self.name}] {self.content}"
        if self.tool_calls:
            calls = "; ".join(c.render() for c in self.tool_calls)
            return f"{self.content}\nTOOL_CALL {calls}" if self.content else f"TOOL_CALL {calls}"
        return self.content

    def to_openai(self, content: str | None = None, keep_media: bool = False) -> dict[str, Any]:
        """A fresh OpenAI chat-completions dict; ``content`` replaces the content (a compressed form).

        Content parts are given back whole unless ``content`` replaces them; with ``keep_media``, a
        message with media parts keeps them (images, audio, files) in their order and ``content``
        replaces only its text: one text part where the first text part was (the last message cut to
        fit the budget: a screenshot beside a huge page text).
        """
        if content is None and self.parts:
            body: Any = [p.to_openai() for p in self.parts]
        elif content is not None and keep_media and self.has_media:
            body, placed = [], False
            for p in self.parts:
                if p.text is None:
                    body.append(p.to_openai())
                elif not placed:
                    body.append({"type": "text", "text": content})
                    placed = True
            if not placed:
                body.insert(0, {"type": "text", "text": content})
        else:
            body = self.content if content is None else content
        out: dict[str, Any] = {"role": self.role, "content": body}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.audio is not None:
            out["audio"] = json.loads(self.audio)
        return out

    @property
    def has_media(self) -> bool:
        """True when the content has parts other than text (images, audio, files)."""
        return any(p.text is None for p in self.parts)


def refuses_empty(role: str, content: str, *, tool_calls: bool = False, parts: bool = False) -> bool:
    """True when a message is refused for its empty text (:meth:`Message.from_dict` raises
    :class:`InputError`): a system or user message needs text (or content parts); tool results and
    assistant messages may be empty or whitespace (a model's reply can be empty, and a client sends
    the replies it got back in its next request)."""
    return not content.strip() and not tool_calls and not parts and role not in (Role.TOOL, Role.ASSISTANT)


def _parts_text(parts: Sequence[ContentPart]) -> str:
    """A message's text from its content parts: the text and refusal parts, one per line."""
    return "\n".join(p.text for p in parts if p.type in ("text", "refusal") and p.text is not None)


def _content(raw: Any, where: str) -> tuple[str, tuple[ContentPart, ...]]:
    if raw is None:
        raw = ""
    if isinstance(raw, list):
        parts = _content_parts(raw, where)
        text = _parts_text(parts)
    elif isinstance(raw, str):
        parts, text = (), raw
    else:
        raise InputError(f"{where}: 'content' must be a string or a list of content parts, got {type(raw).__name__}")
    if len(text) > MAX_CONTENT_CHARS:
        raise InputError(
            f"{where}: content has {len(text):,} characters, above the limit of {MAX_CONTENT_CHARS:,}; "
            "store large tool output elsewhere and pass a reference or an excerpt"
        )
    _check_text(text, "content", where)
    return text, parts


def _message_id(mid: Any, where: str) -> str | None:
    if mid is None:
        return None
    if isinstance(mid, bool) or not isinstance(mid, str | int):
        raise InputError(f"{where}: 'id' must be a string or an integer, got {type(mid).__name__}")
    mid = str(mid)
    if not mid.strip():
        raise InputError(f"{where}: 'id' must not be empty; omit it to get an automatic id")
    _check_text(mid, "id", where)
    return mid


def last_user_text(messages: Sequence[dict[str, Any]]) -> str | None:
    """The text of the last user message of OpenAI-style dicts (text parts joined by newlines) that is
    no tool observation, or ``None`` when there is none or it is empty: the query the proxy and the
    LangChain middleware build the window for.

    A tool observation sent as a user message (mini-SWE-agent's ``<returncode>...``,
    :data:`~ctxscore.memory.lexicon.OBSERVATION_HEAD`) is not the user asking: the request it serves
    stays the query, as it does while an agent reads ``tool`` messages, so the steps of one request
    keep their page-in (on the dev sessions' mini-SWE-agent trajectories at 4,000 tokens, the share of
    window tokens a provider's prompt cache reuses went from 0.50 to 0.64 with it).
    """
    for m in reversed(messages):
        if m.get("role") == Role.USER:
            c = m.get("content")
            if isinstance(c, list):
                c = "\n".join(p.get("text", "") for p in c if isinstance(p, dict) and p.get("type") == "text")
            if isinstance(c, str) and OBSERVATION_HEAD.search(c[:OBSERVATION_HEAD_CHARS]):
                continue
            return c or None
    return None
