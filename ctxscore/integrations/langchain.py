"""LangChain: message conversion both ways, a middleware for LangChain v1 agents, and
:func:`trim_messages`, a drop-in for ``langchain_core.messages.trim_messages`` that keeps what
matters instead of the newest messages.

- :func:`to_openai_dicts` / :func:`to_langchain`: LangChain messages <-> OpenAI-style dicts (the
  form ctxscore reads and writes). Tool calls keep their ids; their arguments travel as the JSON text
  the model wrote (``additional_kwargs["tool_calls"]`` when a provider kept it, else the parsed
  ``args`` dumped); arguments that are not JSON come back as ``invalid_tool_calls``.
- :class:`ContextMiddleware` (needs the ``langchain`` package, v1): the agent's state keeps the full
  history; before each model call the middleware syncs it into a :class:`~ctxscore.ContextManager`
  (one per LangGraph thread) and the model sees the built window (``wrap_model_call``; the
  window's system messages ahead of the conversation -- the system prompt, the layers' notes and
  the archive note -- become the request's one system message).
- :func:`trim_messages`: one window of a message list, as LangChain messages (one system message
  first, the same way).

Importing this module without ``langchain-core`` raises :class:`ImportError` with the install hint;
without ``langchain`` only :class:`ContextMiddleware` does.
"""

from __future__ import annotations

import asyncio
import json
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from .._optional import require
from ..errors import ConfigError, InputError
from ..messages import Role, last_user_text
from ..window.manager import ContextManager

require("langchain_core", "langchain", "ctxscore.integrations.langchain")

from langchain_core.messages import (  # noqa: E402
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

try:  # LangChain v1 agents; the conversions and trim_messages work without it
    from langchain.agents.middleware import AgentMiddleware as _MiddlewareBase
    _MIDDLEWARE_ERROR: ImportError | None = None
except ImportError as exc:  # pragma: no cover - exercised by the import test in a subprocess
    _MiddlewareBase = object  # type: ignore[assignment,misc]
    _MIDDLEWARE_ERROR = exc

__all__ = ["ContextMiddleware", "to_langchain", "to_openai_dicts", "trim_messages"]

_ROLE_OF = {"system": "system", "developer": "system", "human": "user", "user": "user", "ai": "assistant",
            "assistant": "assistant", "tool": "tool"}


def _content(content: Any, role: str) -> Any:
    """LangChain content -> OpenAI content: a string, or parts. User and tool messages keep their
    blocks whole (images, files, a text block's ``cache_control``; several text blocks stay
    several parts) unless the content is one plain text block; system and assistant messages get
    their text blocks joined (reasoning and tool_use blocks are dropped: chat completions has no
    place for them)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InputError(f"message content must be a string or a list of blocks, got {type(content).__name__}")
    keep = role in ("user", "tool")
    parts = []
    for b in content:
        if isinstance(b, str):
            parts.append({"type": "text", "text": b})
        elif isinstance(b, dict) and b.get("type") == "text":
            parts.append(dict(b) if keep else {"type": "text", "text": b.get("text", "")})
        elif isinstance(b, dict) and keep:
            parts.append(dict(b))  # images, files ... kept whole
    plain = all(p.get("type") == "text" and p.keys() <= {"type", "text"} for p in parts)
    if not keep or (plain and len(parts) <= 1):
        return "\n".join(p.get("text", "") for p in parts if p.get("type") == "text")
    return parts


def _raw_arguments(msg: AIMessage) -> dict[str, str]:
    """The argument strings a provider kept in ``additional_kwargs["tool_calls"]``, by call id."""
    out = {}
    for c in msg.additional_kwargs.get("tool_calls") or ():
        if isinstance(c, dict) and isinstance((c.get("function") or {}).get("arguments"), str) and c.get("id"):
            out[c["id"]] = c["function"]["arguments"]
    return out


def _arguments(raw: str | None, args: Any) -> str:
    """A call's argument string: the provider's own (byte-exact) while it still says what
    ``tool_calls[i]["args"]`` says (as JSON: ``true`` is not ``1``), else ``args`` as JSON (a call
    edited after the model made it, as LangChain's human-in-the-loop middleware edits ``tool_calls``
    and leaves the raw ones)."""
    if raw is not None:
        try:
            if json.dumps(json.loads(raw), sort_keys=True) == json.dumps(args, sort_keys=True):
                return raw
        except (ValueError, TypeError):
            pass
    return json.dumps(args if args is not None else {}, ensure_ascii=False)


def to_openai_dicts(messages: Sequence[BaseMessage | dict[str, Any]]) -> list[dict[str, Any]]:
    """LangChain messages (or OpenAI dicts, passed through) -> OpenAI-style dicts, same order.

    ``SystemMessage`` -> system, ``HumanMessage`` -> user, ``AIMessage`` -> assistant with
    ``tool_calls`` (valid and invalid ones, ids kept) and its ``refusal`` (from ``additional_kwargs``,
    where langchain-openai puts it), ``ToolMessage`` -> tool, ``ChatMessage`` by its
    role (``developer`` -> system). Message ids and metadata are not carried.

    Raises:
        InputError: a message type or role ctxscore cannot represent, or content that is neither
            a string nor a list of blocks.
    """
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if isinstance(m, dict):
            out.append(dict(m))
            continue
        if not isinstance(m, BaseMessage):
            raise InputError(f"message {i}: expected a LangChain message or a dict, got {type(m).__name__}")
        role = _ROLE_OF.get(m.role if isinstance(m, ChatMessage) else m.type)
        if role is None:
            raise InputError(f"message {i}: a {type(m).__name__} ({m.type!r}) has no chat-completions role; "
                             "use System, Human, AI, Tool or ChatMessage")
        d: dict[str, Any] = {"role": role, "content": _content(m.content, role)}
        if isinstance(m, AIMessage):
            raw = _raw_arguments(m)
            calls = [{"id": c.get("id") or f"call_{i}_{k}", "type": "function",
                      "function": {"name": c["name"], "arguments": _arguments(raw.get(c.get("id") or ""), c.get("args", {}))}}
                     for k, c in enumerate(m.tool_calls)]
            calls += [{"id": c.get("id") or f"call_{i}_x{k}", "type": "function",
                       "function": {"name": c.get("name") or "unknown", "arguments": c.get("args") or ""}}
                      for k, c in enumerate(m.invalid_tool_calls)]
            if calls:
                d["tool_calls"] = calls
            if isinstance(m.additional_kwargs.get("refusal"), str):  # where langchain-openai puts a refusal
                d["refusal"] = m.additional_kwargs["refusal"]
        if isinstance(m, ToolMessage):
            d["tool_call_id"] = m.tool_call_id
            if m.name:
                d["name"] = m.name
        elif m.name and role in ("user", "assistant"):
            d["name"] = m.name
        out.append(d)
    return out


def to_langchain(messages: Sequence[dict[str, Any]]) -> list[BaseMessage]:
    """OpenAI-style dicts (a ctxscore window) -> LangChain messages, same order.

    An assistant message's refusal part goes to ``additional_kwargs["refusal"]``, as langchain-openai
    keeps it. Tool-call arguments are parsed into ``tool_calls[i]["args"]``; arguments that are not a JSON
    object become ``invalid_tool_calls`` (with the text and the parse error). The raw calls are also
    kept in ``additional_kwargs["tool_calls"]``, as langchain-openai does.

    Raises:
        InputError: a message that is not a dict or has an unknown role.
    """
    out: list[BaseMessage] = []
    for i, d in enumerate(messages):
        if not isinstance(d, dict):
            raise InputError(f"message {i}: expected a dict, got {type(d).__name__}")
        role, content = d.get("role"), d.get("content")
        content = "" if content is None else content
        if role == Role.SYSTEM:
            out.append(SystemMessage(content=content))
        elif role == Role.USER:
            out.append(HumanMessage(content=content, **({"name": d["name"]} if d.get("name") else {})))
        elif role == Role.TOOL:
            out.append(ToolMessage(content=content, tool_call_id=d.get("tool_call_id", ""), name=d.get("name")))
        elif role == Role.ASSISTANT:
            calls, invalid = [], []
            for c in d.get("tool_calls") or ():
                fn = c.get("function") if isinstance(c, dict) else None
                if not isinstance(fn, dict):
                    raise InputError(f"message {i}: a tool call must be a dict with a 'function' object, got {c!r:.80}")
                args = fn.get("arguments") or ""
                if not isinstance(args, str):
                    raise InputError(f"message {i}: tool call {c.get('id')!r} has arguments of type "
                                     f"{type(args).__name__}; chat-completions arguments are a JSON string: json.dumps them")
                try:
                    parsed = json.loads(args) if args.strip() else {}
                    if not isinstance(parsed, dict):
                        raise ValueError(f"arguments are a JSON {type(parsed).__name__}, not an object")
                    calls.append({"name": fn.get("name", ""), "args": parsed, "id": c.get("id"), "type": "tool_call"})
                except ValueError as exc:
                    invalid.append({"name": fn.get("name"), "args": args, "id": c.get("id"), "error": str(exc),
                                    "type": "invalid_tool_call"})
            extra = {"tool_calls": [dict(c) for c in d["tool_calls"]]} if d.get("tool_calls") else {}
            if isinstance(content, list):  # a refusal part back where langchain-openai keeps it
                refusal = "".join(p.get("refusal") or "" for p in content if isinstance(p, dict) and p.get("type") == "refusal")
                if refusal:
                    extra["refusal"] = refusal
                    content = "\n".join(p.get("text") or "" for p in content if isinstance(p, dict) and p.get("type") == "text")
            out.append(AIMessage(content=content, tool_calls=calls, invalid_tool_calls=invalid, additional_kwargs=extra,
                                 **({"name": d["name"]} if d.get("name") else {})))
        else:
            raise InputError(f"message {i}: unknown role {role!r}")
    return out


def trim_messages(messages: Sequence[BaseMessage | dict[str, Any]], *, max_tokens: int, query: str | None = None,
                  scorer: Any = "rules", encoding: str = "cl100k_base", **manager_kwargs: Any) -> list[BaseMessage]:
    """The ctxscore window of ``messages`` as LangChain messages (like ``trim_messages(messages,
    max_tokens=...)``, but by value: instructions, system messages and recent turns stay verbatim,
    facts are summarised, and archived messages leave a stub note).

    Args:
        messages: the conversation (LangChain messages or OpenAI dicts).
        max_tokens: the token budget (> 0).
        query: page archived messages relevant to this back in (default: the last user message).
        scorer: the scorer (default ``"rules"``: every call scores the whole list again; keep a
            :class:`~ctxscore.ContextManager` or use :class:`ContextMiddleware` across turns).
        encoding: the tiktoken encoding of the budget.
        manager_kwargs: more :class:`~ctxscore.ContextManager` arguments (``policy``, ``compressor`` ...).

    Warns:
        RuntimeWarning: the window is over ``max_tokens`` (system messages and the last turn, which are
            never dropped, take more; LangChain's ``trim_messages`` would drop them).

    Raises:
        InputError: a message that cannot be converted or is invalid (tool result without its call ...).
        ConfigError: a bad budget.
        BudgetError: the window is over ``max_tokens`` and ``policy=Policy(on_overflow="raise")``.

    Returns:
        the window: a joined system message first (when there is one), then each message the window
        keeps verbatim as the caller's own object (its id, status, reasoning blocks kept) and new
        messages for compressed ones, summaries and notes.
    """
    dicts = to_openai_dicts(messages)
    with ContextManager(budget=max_tokens, scorer=scorer, encoding=encoding, **manager_kwargs) as cm:
        cm.extend(dicts)
        window = cm.build(query=query if query is not None else last_user_text(dicts))
    if window.tokens > max_tokens:  # what cannot be compacted (system messages, the last turn) is over the budget
        over = [str(w) for w in window.warnings if w.kind in ("over_budget", "pinned_over_budget")]
        warnings.warn(f"trim_messages: the window holds {window.tokens} tokens, above max_tokens={max_tokens}"
                      + (f" ({over[0]})" if over else ""), RuntimeWarning, stacklevel=2)
    system, rest = _split_system(window)
    return ([SystemMessage(content=system)] if system is not None else []) + _with_originals(rest, list(messages), dicts)


def _key(d: dict[str, Any]) -> str:
    """A message dict as canonical JSON (what two equal dicts share)."""
    return json.dumps(d, sort_keys=True, ensure_ascii=False, default=str)


def _with_originals(window: Sequence[dict[str, Any]], originals: Sequence[Any],
                    dicts: Sequence[dict[str, Any]]) -> list[BaseMessage]:
    """The window's messages as LangChain messages, each message the window kept verbatim as the
    caller's own object.

    ``originals[i]`` converts to ``dicts[i]``. A window message equal to the next unused one of them
    (in order) is that original object, with what the conversion to chat-completions dicts leaves
    out: its id, a ``ToolMessage``'s ``status`` and ``artifact``, an ``AIMessage``'s reasoning or
    thinking blocks (Anthropic's API asks for the thinking blocks of a tool-using turn back), its
    metadata. Compressed messages, summaries and notes are new messages (:func:`to_langchain`); a
    compressed tool result keeps its original's ``status``. The window's token count does not include
    what only the originals hold (reasoning blocks).
    """
    out = to_langchain(window)
    index: dict[str, list[int]] = {}
    for i, d in enumerate(dicts):
        index.setdefault(_key(d), []).append(i)
    status = {m.tool_call_id: m.status for m in originals if isinstance(m, ToolMessage)}
    after = 0  # originals before this position are used or passed
    for k, d in enumerate(window):
        hit = next((i for i in index.get(_key(d), ()) if i >= after), None)
        if hit is not None:
            after = hit + 1
            if isinstance(originals[hit], BaseMessage):  # an OpenAI dict given to trim_messages stays converted
                out[k] = originals[hit]
        elif isinstance(out[k], ToolMessage) and status.get(out[k].tool_call_id) not in (None, "success"):
            out[k].status = status[out[k].tool_call_id]
    return out


def _split_system(window: Any) -> tuple[str | None, list[dict[str, Any]]]:
    """The window's system messages ahead of its conversation joined (text), and the other messages.

    Ahead of the conversation are the sections before ``history`` and ``recent``: the system prompt,
    the layers' notes and the archive note, which the window may place after a pinned task statement
    (a user message; :class:`~ctxscore.window.assemble.SystemSection`). Chat models that take one
    system message first (Anthropic's) need them joined; the user messages among them keep their order.
    The note of messages paged in for the query (:class:`~ctxscore.window.assemble.RecalledSection`,
    after the last message or where the window before had it) is joined last. System messages inside the conversation stay where they are. The joined message holds the archive
    note, which changes at every compaction, so a provider's prompt cache does not reuse the task
    statement here as it does for the OpenAI-style window.
    """
    from ..window.pagein import RECALLED_HEADER  # noqa: PLC0415

    msgs = window.messages
    head = 0
    for info in window.sections:
        if info.name in ("history", "recent"):
            break
        head += info.messages

    def recalled(d: dict[str, Any]) -> bool:  # the note of page-ins, last or where the window before had it
        return d["role"] == "system" and isinstance(d["content"], str) and d["content"].startswith(RECALLED_HEADER)

    system = [d for d in msgs[:head] if d["role"] == "system"] + [d for d in msgs[head:] if recalled(d)]
    texts = []
    for d in system:
        c = d["content"]
        texts.append(c if isinstance(c, str) else "\n".join(p.get("text", "") for p in c if isinstance(p, dict)))
    rest = [d for d in msgs[:head] if d["role"] != "system"] + [d for d in msgs[head:] if not recalled(d)]
    return ("\n\n".join(texts) if system else None), rest


class ContextMiddleware(_MiddlewareBase):  # type: ignore[misc,valid-type]
    """LangChain v1 agent middleware: the model sees the ctxscore window of the agent's history.

    ``create_agent(model, tools, middleware=[ContextMiddleware(budget=8000)])``. The agent's state
    keeps every message; before each model call the state's messages (with the system prompt) are
    synced into the session's :class:`~ctxscore.ContextManager` (only new ones are scored) and the
    model is called with the window built for the last user message; a message the window keeps
    verbatim is the state's own object (id, ``status``, thinking blocks kept). The window's system messages
    ahead of the conversation (the system prompt, the layers' notes, the archive note) become the
    request's system message.

    Args:
        budget: token budget of the window (the model's messages; > 0).
        scorer: the sessions' scorer (``"auto"``, ``"rules"``, a folder or a scorer object).
        manager_factory: ``factory(session_id) -> ContextManager``, replacing ``budget`` / ``scorer`` /
            ``manager_kwargs`` (a store file, an LLM compressor ...).
        session_id: ``fn(request) -> str``; default: the LangGraph thread id, else ``"default"``.
        manager_kwargs: more :class:`~ctxscore.ContextManager` arguments; ``layers`` as a function that
            makes one thread's layers (``lambda: [FactLedger()]``: a layer holds one session's state).

    Raises:
        ImportError: the ``langchain`` package (v1) is not installed.
        ConfigError: ``layers`` given as a list (not a function), or beside ``manager_factory``.

    Attributes:
        last_window: the last :class:`~ctxscore.ContextWindow` built (for inspection).
    """

    def __init__(self, budget: int = 8000, *, scorer: Any = "auto",
                 manager_factory: Callable[[str], ContextManager] | None = None,
                 session_id: Callable[[Any], str] | None = None, **manager_kwargs: Any) -> None:
        if _MIDDLEWARE_ERROR is not None:
            raise ImportError("ContextMiddleware needs LangChain v1 agents: pip install 'ctxscore[langchain]' "
                              "(in a checkout: pip install -e '.[langchain]')") from _MIDDLEWARE_ERROR
        layers = manager_kwargs.pop("layers", None)
        if layers and (manager_factory is not None or not callable(layers)):
            raise ConfigError("ContextMiddleware(layers=[...]) would give every thread the same layer objects, and "
                              "a layer holds one session's state (a ledger would show one user's facts to another): "
                              "pass layers=lambda: [FactLedger(), ...] (a function that makes each thread's), or make "
                              "them in manager_factory" + (" (a factory is given: layers= would be ignored)"
                                                          if manager_factory is not None else ""))
        super().__init__()
        self.budget = budget
        self._factory = manager_factory or (lambda sid: ContextManager(
            budget=budget, scorer=scorer, session_id=sid, **manager_kwargs, **({"layers": layers()} if layers else {})))
        self._session_id = session_id or _thread_id
        self._managers: dict[str, ContextManager] = {}
        self._lock = threading.Lock()
        self.last_window: Any = None

    def manager(self, session_id: str) -> ContextManager:
        """The context manager of a session (created on first use)."""
        with self._lock:
            cm = self._managers.get(session_id)
            if cm is None:
                cm = self._managers[session_id] = self._factory(session_id)
            return cm

    def _windowed(self, request: Any) -> Any:
        cm = self.manager(self._session_id(request))
        head = [request.system_message] if request.system_message is not None else []
        dicts = to_openai_dicts([*head, *request.messages])
        cm.sync(dicts)
        window = cm.build(query=last_user_text(dicts))
        self.last_window = window
        system, rest = _split_system(window)
        return request.override(system_message=SystemMessage(content=system) if system is not None else None,
                                messages=_with_originals(rest, list(request.messages), dicts[len(head):]))

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """Call the model with the window instead of the full history."""
        return handler(self._windowed(request))

    async def awrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """Async :meth:`wrap_model_call` (the sync and build run in a worker thread)."""
        return await handler(await asyncio.to_thread(self._windowed, request))


def _thread_id(request: Any) -> str:
    """The LangGraph thread id of a model request, else ``"default"``."""
    info = getattr(getattr(request, "runtime", None), "execution_info", None)
    tid = getattr(info, "thread_id", None)
    if tid:
        return str(tid)
    try:
        from langgraph.config import get_config  # noqa: PLC0415

        tid = (get_config().get("configurable") or {}).get("thread_id")
    except (ImportError, RuntimeError):
        tid = None
    return str(tid) if tid else "default"
