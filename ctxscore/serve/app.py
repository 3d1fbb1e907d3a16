"""The OpenAI-compatible proxy: clients keep sending their whole history; the upstream model sees a
window that fits the budget.

``POST /v1/chat/completions``:

1. the session is the ``X-Session-Id`` header, else derived from the conversation's first messages
   (the system messages and the first user message: :func:`derive_session_id`); one
   :class:`~ctxscore.ContextManager` per session, requests of one session are served one at a time,
   sessions in parallel;
2. the resent history is synced (:meth:`ContextManager.sync`: only new messages are added; a
   trimmed or edited history is followed, nothing is lost), and the window is built for the last
   user message as the query, within the budget less the tokens of the request's ``tools``;
3. the request goes upstream with the window as ``messages`` and every other parameter as the
   client sent it, and the same headers (``Authorization`` included, unless the proxy has its own
   upstream key), hop-by-hop ones aside;
4. the answer comes back unchanged: a JSON body with the upstream's status, or the server-sent
   events as they arrive; an upstream error keeps its status and body; an unreachable upstream is
   502, a timeout 504 (OpenAI-style error bodies);
5. the assistant's reply (choice 0: content and tool calls, accumulated from the stream's deltas)
   is recorded in the session before the client sees the end of the answer, so its next request
   finds it in place (a client that goes on with another choice, or edits the reply, is followed:
   the sync rebases). Tool calls and their results stay one unit in every window.

With ``store="postgresql://..."`` and ``redis="redis://..."`` (``ctxscore serve --store ... --redis
...``) the sessions are shared by every proxy process given the same two URLs: each request runs
inside :meth:`~ctxscore.store.redis_state.SharedSessions.turn` (the session's Redis lock from the
sync to the recorded reply; see :class:`SharedProxySessions`; a request waiting for a session
another process holds waits in the event loop, holding no worker thread). Redis is pinged at start: a proxy
whose Redis does not answer is not started (:class:`~ctxscore.errors.StoreError`).

Other ``/v1/...`` routes (``GET /v1/models``, embeddings ...) are passed through as they are.
``GET /v1/ctxscore/stats`` (and ``/v1/ctxscore/stats/{session_id}``) give per session the tokens
received (the messages of the client's full history) vs forwarded (the messages of the window; the
``tools`` definitions, sent as they are, are in neither), requests, sync modes, upstream errors and
the proxy's own time per request (p50 / p95 ms, upstream time excluded).

A session's work (the sync and build of a request, the recording of its reply) runs in worker
threads. When all of it is local CPU work -- the proxy's own sessions in memory or in a SQLite file,
the packaged or rule scorer, no LLM compressor or query writer, no Redis (:func:`local_work`) -- it
runs one request at a time, in arrival order (``create_app(in_order=...)`` and ``ctxscore serve
--in-order`` decide otherwise). Two requests run at once on one interpreter take turns at its lock
(5 ms slices), so both finish late; in order, the first finishes in its own time and the second no
later. With 16 concurrent 300-turn sessions on this 2-core machine (rules scorer,
``benchmarks/load_proxy.py``) the proxy's p95 fell from 31-36 to 23 ms. Work that waits on a network
(PostgreSQL, Redis, an LLM compressor or query writer, a scorer of your own) runs in the shared
thread pool, many requests at once.

The upstream is called with aiohttp's client (one pooled session per proxy): under 16 concurrent
sessions it cost about a fifth of the CPU httpx's ``AsyncClient`` did on this machine (0.43 vs 2.1
ms of event-loop CPU a request on loopback), whose connection pool polls every pooled connection's
socket at each request (https://github.com/encode/httpcore/pull/928).

Responses carry ``X-Ctxscore-Session``, ``X-Ctxscore-Tokens-Received``, ``X-Ctxscore-Tokens-Forwarded``,
on non-streamed answers ``X-Ctxscore-Proxy-Ms`` (the proxy's own milliseconds for the request, upstream
excluded) and, when the window had any, ``X-Ctxscore-Warnings`` (the kinds, comma-separated: for example
``pinned_over_budget`` when the pinned instructions alone exceed the budget; the window is then
forwarded anyway, over budget, and the warning is logged).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import os
import random
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from .._optional import require

fastapi = require("fastapi", "serve", "ctxscore.serve")
aiohttp = require("aiohttp", "serve", "ctxscore.serve")
orjson = require("orjson", "serve", "ctxscore.serve")

import anyio  # noqa: E402
import anyio.to_thread  # noqa: E402
from fastapi import FastAPI, Request  # noqa: E402
from starlette.concurrency import run_in_threadpool  # noqa: E402
from starlette.responses import JSONResponse, Response, StreamingResponse  # noqa: E402

from ..config import Policy, check_budget  # noqa: E402
from ..errors import ConfigError, CtxScoreError, InputError, StoreError  # noqa: E402
from ..messages import Message, last_user_text  # noqa: E402
from ..store import is_postgres, redis_in_url, shown_url  # noqa: E402
from ..store.redis_state import SessionBusy  # noqa: E402
from ..tokens import REPLY_PRIMING_TOKENS  # noqa: E402
from ..window.layers import check_layers  # noqa: E402
from ..window.manager import ContextManager  # noqa: E402

log = logging.getLogger("ctxscore.serve")

#: Request headers never forwarded upstream (hop-by-hop, or recomputed by the HTTP client).
HOP_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive", "te", "trailer",
                         "upgrade", "proxy-authorization", "proxy-connection", "accept-encoding"})
#: Response headers never passed back (hop-by-hop, or no longer true of the body sent).
HOP_RESPONSE_HEADERS = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding",
                                  "trailer", "upgrade", "date", "server"})
#: The message fields of the chat-completions API that ctxscore keeps (others are dropped before
#: syncing, and a message forwarded verbatim gets them back: :func:`with_client_fields`; a
#: ``refusal`` becomes a content part; of an ``audio`` object the ``id`` the request sends back).
MESSAGE_FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id", "refusal", "audio")
#: Fields of a resent answer that the chat-completions response has and no request takes: never
#: forwarded (``function_call`` only as null; a legacy call is refused).
OUTPUT_ONLY_FIELDS = ("annotations", "function_call")
_KNOWN_FIELDS = frozenset(MESSAGE_FIELDS + OUTPUT_ONLY_FIELDS)
#: Proxy timings kept per session for the percentiles.
TIMINGS_KEPT = 10_000


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """An OpenAI-style error body ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def derive_session_id(messages: list[Any]) -> str:
    """The session of a request without ``X-Session-Id``: ``auto-`` and 16 hex digits of the sha256 of
    the conversation's leading system messages and its first user message (role and content).

    Two conversations that open with the same system prompt and the same first user message share a
    session: send ``X-Session-Id`` to keep them apart.
    """
    head = []
    for m in messages:
        if not isinstance(m, dict):
            break
        head.append([m.get("role"), m.get("content")])
        if m.get("role") not in ("system", "developer"):
            break
    digest = hashlib.sha256(json.dumps(head, ensure_ascii=False, sort_keys=True).encode()).hexdigest()
    return "auto-" + digest[:16]


def normalize_message(m: Any, i: int) -> dict[str, Any]:
    """A client's message as ctxscore takes it: the fields of :data:`MESSAGE_FIELDS` that are not null,
    ``developer`` mapped to ``system``.

    Raises:
        InputError: not an object (the window is never built from a list it cannot read).
    """
    if not isinstance(m, dict):
        raise InputError(f"messages[{i}]: expected an object with 'role' and 'content', got {type(m).__name__}")
    if m.get("function_call") is not None:
        raise InputError(f"messages[{i}]: the legacy 'function_call' field is not supported; send 'tool_calls'")
    out = {k: m[k] for k in MESSAGE_FIELDS if m.get(k) is not None}
    if out.get("role") == "developer":
        out["role"] = "system"
    if out.get("tool_calls") == []:
        del out["tool_calls"]
    return out


def client_fields(m: Any) -> dict[str, Any] | None:
    """A client's message fields outside :data:`MESSAGE_FIELDS` (and :data:`OUTPUT_ONLY_FIELDS`) that
    are not null, such as OpenRouter's ``reasoning_details`` (a reasoning model's signed thoughts, which
    a tool-using turn must send back), else ``None``."""
    if not isinstance(m, dict) or m.keys() <= _KNOWN_FIELDS:
        return None
    extra = {k: v for k, v in m.items() if k not in _KNOWN_FIELDS and v is not None}
    return extra or None


def with_client_fields(window: list[dict[str, Any]], kept: list[tuple[dict[str, Any], dict[str, Any]]]) -> list[dict[str, Any]]:
    """The window with each message it keeps verbatim carrying the client's other fields again.

    Args:
        window: the window's message dicts (not changed).
        kept: ``(verbatim dict, client fields)`` of the history's messages that had such fields, in
            conversation order; a window dict equal to the next one's verbatim dict (in order) is that
            message, and gets its fields back. A compressed message, a summary or a note gets none.

    Returns:
        a new list (new dicts where fields were added).
    """
    out, k = list(window), 0
    at: dict[tuple[str, str], list[int]] = {}  # (role, text) -> window positions: a message missing costs no scan
    for j, d in enumerate(out):
        at.setdefault(_text_key(d), []).append(j)
    for form, extra in kept:
        hit = next((j for j in at.get(_text_key(form), ()) if j >= k and out[j] == form), None)
        if hit is not None:
            out[hit], k = {**out[hit], **extra}, hit + 1
    return out


def _text_key(d: dict[str, Any]) -> tuple[str, str]:
    c = d.get("content")
    return d.get("role", ""), c if isinstance(c, str) else f"{type(c).__name__}:{len(c) if isinstance(c, list) else 0}"


def _percentile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


@dataclass
class SessionStats:
    """What the proxy measured for one session (tokens as the session's counter counts them)."""

    requests: int = 0
    tokens_received: int = 0
    tokens_forwarded: int = 0
    last_received: int = 0
    last_forwarded: int = 0
    replies_recorded: int = 0
    upstream_errors: int = 0
    modes: Counter[str] = field(default_factory=Counter)
    overhead_ms: deque[float] = field(default_factory=lambda: deque(maxlen=TIMINGS_KEPT))

    def count(self, received: int, forwarded: int) -> None:
        """One request's tokens."""
        self.requests += 1
        self.tokens_received += received
        self.tokens_forwarded += forwarded
        self.last_received, self.last_forwarded = received, forwarded

    def as_dict(self, cm: ContextManager | None) -> dict[str, Any]:
        """A JSON-ready summary (``overhead_ms``: the proxy's own time per request, upstream excluded;
        ``cm`` is ``None`` for a shared session this process never opened)."""
        xs = list(self.overhead_ms)
        return {
            "requests": self.requests, "messages": len(cm) if cm is not None else None,
            "budget": cm.budget if cm is not None else None,
            "tokens_received": self.tokens_received, "tokens_forwarded": self.tokens_forwarded,
            "forwarded_share": round(self.tokens_forwarded / self.tokens_received, 4) if self.tokens_received else None,
            "last_received": self.last_received, "last_forwarded": self.last_forwarded,
            "replies_recorded": self.replies_recorded, "upstream_errors": self.upstream_errors,
            "sync_modes": dict(self.modes),
            "overhead_ms": {"p50": round(_percentile(xs, 0.5), 3), "p95": round(_percentile(xs, 0.95), 3),
                            "max": round(max(xs), 3) if xs else 0.0, "n": len(xs)},
        }


class _Session:
    def __init__(self, sid: str, cm: ContextManager | None) -> None:
        self.id, self.cm = sid, cm
        #: The shared turn this request holds (a ``SharedSessions.turn`` context), else ``None``.
        self.turn: Any = None
        self.lock = asyncio.Lock()
        self.stats = SessionStats()
        #: The first messages of the history as the normalized dicts they were made from (``None``:
        #: unknown, sync in full), valid while the history's entry ``len(known) - 1`` still holds
        #: ``known_last`` (another process may have appended since; a rebuilt history fails the check).
        self.known: list[dict[str, Any]] | None = None
        self.known_last: Message | None = None
        #: The dicts as the client (or the upstream, for replies) sent them, one per ``known`` dict:
        #: a resent message equal to its raw dict is not normalized again.
        self.raw: list[Any] = []
        #: ``(index, verbatim dict, client fields)`` of the ``raw`` dicts with fields outside the
        #: chat-completions format (:func:`client_fields`), given back where the window keeps them.
        self.extra: list[tuple[int, dict[str, Any], dict[str, Any]]] = []
        #: Requests holding or waiting for this session (it is never closed while any does).
        self.users = 0
        #: ``(request, query)``: the query writer's expansion of the last request, reused while an
        #: agent's tool loop serves the same request (one model call a request, and the same query,
        #: so the build keeps its page-in).
        self.expanded: tuple[str, str] | None = None


class Sessions:
    """One :class:`ContextManager` per session id, at most ``max_sessions`` (the least recently used
    idle one is closed first; a client that comes back resends its history and is synced from scratch,
    or resumed from the store when it is a file)."""

    #: True when the sessions are shared with other proxy processes (:class:`SharedProxySessions`).
    shared = False

    def __init__(self, factory: Callable[[str], ContextManager | None], max_sessions: int,
                 close_managers: bool = True) -> None:
        self.factory, self.max_sessions = factory, max_sessions
        #: False when every manager uses one store the proxy closes itself (a PostgreSQL store).
        self.close_managers = close_managers
        self._by_id: OrderedDict[str, _Session] = OrderedDict()
        self._opening: dict[str, threading.Event] = {}  # sessions whose manager a request is making
        self._lock = threading.Lock()

    def _close(self, s: _Session) -> None:
        if self.close_managers and s.cm is not None:
            s.cm.close()

    async def take(self, s: _Session) -> None:
        """Start a request's turn of ``s`` (in the event loop, under ``s.lock``): nothing here, the
        session lives in this process."""

    def leave(self, s: _Session) -> None:
        """End the turn :meth:`enter` started (nothing here)."""

    def figures(self) -> dict[str, Any] | None:
        """Figures of the shared sessions (``None`` here)."""
        return None

    def kept(self, sid: str) -> _Session | None:
        """The session ``sid`` when this process keeps it, counted as in use until :meth:`done`;
        ``None`` (nothing is made) otherwise."""
        with self._lock:
            return self._use(sid)

    def _use(self, sid: str) -> _Session | None:
        """:meth:`kept` for a caller holding the lock."""
        s = self._by_id.get(sid)
        if s is not None:
            self._by_id.move_to_end(sid)
            s.users += 1
        return s

    def get(self, sid: str) -> _Session:
        """The session ``sid`` (made on first use), counted as in use until :meth:`done`.

        A new session's manager is made outside the sessions' lock (the proxy calls this in a
        worker thread), so a session that is slow to open -- one resumed from its store -- holds up
        no other session's request; a second request for a session being opened waits for that one
        manager (a session is opened once).

        Raises:
            whatever the factory raises (nothing is kept then; the next request tries again).
        """
        while True:
            with self._lock:
                s = self._use(sid)
                if s is not None:
                    return s
                opening = self._opening.get(sid)
                if opening is None:
                    opening = self._opening[sid] = threading.Event()
                    break
            opening.wait()  # another request is opening it: then look again
        try:
            cm = self.factory(sid)
        except BaseException:
            with self._lock:
                del self._opening[sid]
            opening.set()
            raise
        with self._lock:
            s = self._by_id[sid] = _Session(sid, cm)
            del self._opening[sid]
            if len(self._by_id) > self.max_sessions:
                for old_id, old in list(self._by_id.items()):
                    if old is not s and old.users == 0:
                        del self._by_id[old_id]
                        self._close(old)
                        break
            s.users += 1
        opening.set()
        return s

    def done(self, s: _Session) -> None:
        """A request is finished with ``s``."""
        with self._lock:
            s.users -= 1

    def find(self, sid: str) -> _Session | None:
        """The session ``sid`` when this process keeps it."""
        with self._lock:
            return self._by_id.get(sid)

    def all(self) -> list[_Session]:
        """The sessions this process keeps."""
        with self._lock:
            return list(self._by_id.values())

    def close(self) -> None:
        """Close every session's manager (when they own their stores)."""
        with self._lock:
            for s in self._by_id.values():
                self._close(s)
            self._by_id.clear()


#: Longest pause (seconds) between two tries of a request waiting for a session another process holds
#: (:meth:`SharedProxySessions.take`: the pauses start at the hot state's ``lock_poll_s`` and double).
LOCK_POLL_CAP_S = 0.05


class SharedProxySessions(Sessions):
    """Sessions shared by every proxy process over one PostgreSQL store and one Redis
    (:class:`~ctxscore.store.redis_state.SharedSessions`): each request runs inside
    ``shared.turn(session_id)`` -- the session's Redis lock, held from the sync and build to the
    recording of the reply, and this process's manager brought up to date (a process that never saw
    the session opens it from the store with its stored predictions: no re-scoring).

    Args:
        shared: the worker's :class:`~ctxscore.store.redis_state.SharedSessions` (closed with this).
        max_sessions: sessions whose figures this process keeps (the managers are kept by ``shared``).
    """

    shared = True

    def __init__(self, shared: Any, max_sessions: int) -> None:
        super().__init__(lambda sid: None, max_sessions, close_managers=False)
        self.turns = shared

    async def take(self, s: _Session) -> None:
        """Take the session's Redis lock and bring its manager up to date, waiting for another process
        that holds the session in the event loop: each try (:meth:`enter` without waiting: one Redis
        round trip, then the catch-up when the lock is taken) runs in a worker thread, and between
        tries the request sleeps holding no thread. A request blocked in a thread would keep it from
        the turns that hold a lock and need one to record their reply and release it: with every
        thread of both processes waiting for the other's sessions, nothing moved until
        ``lock_wait_s``.

        The pauses back off: the first is the hot state's ``lock_poll_s`` (5 ms: a session released
        soon is taken soon), each next one twice as long up to :data:`LOCK_POLL_CAP_S` (50 ms), each
        drawn within 20% of that (requests that started waiting together do not try together), the
        last one cut to end at ``lock_wait_s``. A request waiting for a model's answer (seconds)
        tries about 20 times a second instead of 200 (each try a thread hop and a Redis round trip:
        100 waiting requests made 20,000 a second), and starts at most about 60 ms after the
        session is released.

        Raises:
            StoreError: another process held the session longer than ``lock_wait_s`` (busy), or
                Redis / PostgreSQL failed; nothing of the turn has run then.
        """
        hot = self.turns.hot
        deadline = time.monotonic() + hot.lock_wait_s
        pause, cap = hot.lock_poll_s, max(hot.lock_poll_s, LOCK_POLL_CAP_S)
        while True:
            try:
                await run_in_threadpool(self.enter, s, False)
                return
            except SessionBusy:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise hot.busy(s.id) from None
            await asyncio.sleep(min(left, pause * random.uniform(0.8, 1.2)))
            pause = min(2 * pause, cap)

    def enter(self, s: _Session, wait: bool = True) -> None:
        """Take the session's Redis lock and bring its manager up to date (a worker thread; ``wait``:
        blocks until the lock is free, up to ``lock_wait_s``; else one try).

        Raises:
            StoreError: another process held the session too long, or Redis / PostgreSQL failed.
            SessionBusy: ``wait`` is false and another process holds the session.
        """
        turn = self.turns.turn(s.id, wait=wait)
        cm = turn.__enter__()
        if cm is not s.cm:
            s.known = None  # a new manager: sync in full (after another process's turn the known
            # dicts still hold for the messages this one saw: Proxy.prepare checks them)
        s.cm, s.turn = cm, turn

    def leave(self, s: _Session) -> None:
        """Publish the turn's token counts and release the session's lock."""
        turn, s.turn = s.turn, None
        if turn is not None:
            turn.__exit__(None, None, None)

    def figures(self) -> dict[str, Any]:
        """This process's managers: opened from the store, refreshed after another process's turn,
        current (see :attr:`SharedSessions.stats`)."""
        return dict(self.turns.stats)

    def close(self) -> None:
        """Forget the sessions and close the shared store."""
        super().close()
        self.turns.close()


class _Accumulator:
    """Reads an SSE chat-completions stream and accumulates choice 0's message."""

    def __init__(self) -> None:
        self.buf = b""
        self.content: list[str] = []
        self.refusal: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.audio_id: str | None = None  # a streamed audio reply's id (its data and transcript are not kept)
        self.done = False
        self.finished = False

    def feed(self, chunk: bytes) -> bool:
        """Read ``chunk``; True once ``data: [DONE]`` was seen."""
        self.buf += chunk
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                self.done = True
                continue
            try:
                obj = json.loads(data)
            except ValueError:
                continue
            for ch in obj.get("choices") or ():
                if not isinstance(ch, dict) or ch.get("index", 0) != 0:
                    continue
                if ch.get("finish_reason"):
                    self.finished = True
                d = ch.get("delta") or {}
                if isinstance(d.get("content"), str):
                    self.content.append(d["content"])
                if isinstance(d.get("refusal"), str):
                    self.refusal.append(d["refusal"])
                audio = d.get("audio")
                if isinstance(audio, dict) and isinstance(audio.get("id"), str) and audio["id"]:
                    self.audio_id = audio["id"]
                for tc in d.get("tool_calls") or ():
                    c = self.calls.setdefault(int(tc.get("index", 0)),
                                              {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                    c["id"] = tc.get("id") or c["id"]
                    fn = tc.get("function") or {}
                    c["function"]["name"] += fn.get("name") or ""
                    c["function"]["arguments"] += fn.get("arguments") or ""
        return self.done

    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": "".join(self.content)}
        if self.refusal:
            msg["refusal"] = "".join(self.refusal)
        if self.calls:
            msg["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        if self.audio_id is not None:
            msg["audio"] = {"id": self.audio_id}
        return msg


class _Stream(StreamingResponse):
    """A streaming response that runs ``on_close`` however it ends (finished, failed, client gone)."""

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], Any], **kw: Any) -> None:
        super().__init__(content, **kw)
        self._on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._on_close()


class Proxy:
    """The proxy's state: the sessions, the upstream client and the settings (see :func:`create_app`)."""

    def __init__(self, upstream: str, budget: int, factory: Callable[[str], ContextManager] | Sessions, *,
                 upstream_api_key: str | None, timeout: float, max_sessions: int, session_header: str,
                 query_writer: Any, in_order: bool = False) -> None:
        self.upstream = upstream.rstrip("/")
        self.budget = budget
        self.sessions = factory if isinstance(factory, Sessions) else Sessions(factory, max_sessions)
        self.upstream_api_key = upstream_api_key
        self.timeout = timeout
        self.session_header = session_header
        self.query_writer = query_writer
        self.client: Any = None
        self._proxy: str | None = None  # the upstream's proxy from the environment (see http())
        self._tools_tokens: OrderedDict[str, int] = OrderedDict()
        self._tools_lock = threading.Lock()  # prepare() runs in worker threads, many sessions at once
        #: Sessions' work one request at a time, in arrival order (see the module docstring); the
        #: limiter is made in the event loop, at the first request.
        self.in_order = in_order
        self._limiter: anyio.CapacityLimiter | None = None

    async def work(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in a worker thread: one at a time, first come first served, when
        :attr:`in_order`; else in the shared thread pool (Starlette's ``run_in_threadpool``). As
        there, a cancelled request waits for the call to end, so a session's work never overlaps."""
        if not self.in_order:
            return await run_in_threadpool(fn, *args)
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(1)
        return await anyio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    # ------------------------------------------------------------------ helpers
    def http(self) -> Any:
        """The upstream client (created in the running event loop at the first request): no limit on
        connections, at most 10 s to connect (name lookup included) and ``timeout`` seconds between
        reads; the upstream's ``HTTP(S)_PROXY`` / ``NO_PROXY`` from the environment is used (no
        ``.netrc`` credentials are read or sent) and TLS is verified as httpx does (``SSL_CERT_FILE``
        / ``SSL_CERT_DIR``, else certifi's bundle when installed, else the system's)."""
        if self.client is None:
            connect = min(self.timeout, 10.0)
            self._proxy = _env_proxy(self.upstream)
            self.client = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, connect=connect, sock_connect=connect, sock_read=self.timeout),
                connector=aiohttp.TCPConnector(limit=0, limit_per_host=0, ssl=_tls_context()), auto_decompress=True)
        return self.client

    async def aclose(self) -> None:
        """Drop what belongs to the event loop that served the app -- the upstream client (closed)
        and the in-order limiter -- so the next loop to serve it makes its own."""
        self._limiter = None
        if self.client is not None:
            await self.client.close()
            self.client = None

    async def _call(self, method: str, url: str, body: bytes, headers: dict[str, str]) -> Any:
        """Send one request upstream: its response (headers read, body not yet), or an error
        :class:`Response` (504 when the upstream did not answer in time, 502 when unreachable)."""
        try:
            # no body for a bodiless request, and no Content-Type the client did not send
            client = self.http()
            return await client.request(method, url, data=body or None, headers=headers, allow_redirects=False,
                                        skip_auto_headers=("Content-Type",), proxy=self._proxy)
        except TimeoutError as exc:  # aiohttp's timeouts are TimeoutError too (check them first)
            return JSONResponse(error_body(f"the upstream {self.upstream} did not answer in time ({exc!r})",
                                           kind="upstream_timeout"), status_code=504)
        except aiohttp.ClientError as exc:
            return JSONResponse(error_body(f"the upstream {self.upstream} is unreachable ({exc!r})",
                                           kind="upstream_error"), status_code=502)

    def headers_up(self, request: Request, stream: bool = False) -> dict[str, str]:
        skip = HOP_HEADERS | {self.session_header.lower()}
        h = {k: v for k, v in request.headers.items() if k.lower() not in skip}
        if self.upstream_api_key:
            h = {k: v for k, v in h.items() if k.lower() != "authorization"}
            h["authorization"] = f"Bearer {self.upstream_api_key}"
        if stream:
            h["accept-encoding"] = "identity"
        return h

    @staticmethod
    def headers_down(headers: Any) -> dict[str, str]:
        """The upstream's response headers passed back (hop-by-hop ones left out); a repeated
        header keeps its last value here and :func:`_repeated` adds the others."""
        return {k: v for k, v in headers.items() if k.lower() not in HOP_RESPONSE_HEADERS}

    def tools_tokens(self, cm: ContextManager, tools: Any) -> int:
        """Tokens of a request's ``tools`` definitions (their JSON), reserved from the budget; cached."""
        if not tools:
            return 0
        text = json.dumps(tools, ensure_ascii=False, sort_keys=True)
        with self._tools_lock:
            n = self._tools_tokens.get(text)
        if n is None:
            n = cm.counter.count(text)
            with self._tools_lock:
                self._tools_tokens[text] = n
                while len(self._tools_tokens) > 256:
                    self._tools_tokens.popitem(last=False)
        return n

    def prepare(self, sess: _Session, messages: list[Any], tools: Any) -> tuple[list[dict[str, Any]], int, int, list[str]]:
        """Sync and build (runs in a worker thread): ``(window messages, tokens received, tokens
        forwarded, the window's warning kinds)``; a shared session's turn was taken before
        (:meth:`Sessions.take`)."""
        cm = sess.cm
        known, sess.known = sess.known, None
        p = _raw_prefix(messages, sess.raw) if known is not None else 0
        msgs = [*known[:p], *(normalize_message(m, i) for i, m in enumerate(messages[p:], p))] if p else [
            normalize_message(m, i) for i, m in enumerate(messages)]
        mode = cm.sync(msgs, verified=_verified(cm, known, sess.known_last, msgs)).mode
        extra = [x for x in sess.extra if x[0] < p] + _extra_fields(messages, msgs, p)
        if mode != "trimmed":
            sess.known, sess.known_last, sess.raw = msgs, cm.history.entries[-1].msg if len(cm) else None, messages
            sess.extra = extra
        sess.stats.modes[mode] += 1
        if mode == "trimmed":
            received = sum(cm.counter.count_message(Message.from_dict(m)) for m in msgs) + REPLY_PRIMING_TOKENS
        else:
            received = cm.total_tokens
        query = last_user_text(msgs)
        if query and self.query_writer is not None:
            if sess.expanded is None or sess.expanded[0] != query:
                sess.expanded = (query, self.query_writer.expand(query))
            query = sess.expanded[1]
        reserve = self.tools_tokens(cm, tools)
        window = cm.build(query=query, budget=max(1, self.budget - reserve))
        forward = with_client_fields(window.messages, [(f, e) for _, f, e in extra]) if extra else window.messages
        return forward, received, window.tokens, sorted({str(w.kind) for w in window.warnings})

    async def record(self, sess: _Session, message: dict[str, Any], finished: bool = True) -> None:
        """Add the assistant's reply to the session, an empty one too when the answer finished (the
        client sends it back in its next request; a stream that ended without a finish reason, such
        as an error event then ``[DONE]``, records nothing empty); an invalid reply is skipped, logged."""
        msg = normalize_message(message, 0)
        if not finished and not (msg.get("content") or msg.get("tool_calls") or msg.get("refusal")):
            return
        known, sess.known = sess.known, None
        try:
            stored = await self.work(sess.cm.add, msg)
            sess.stats.replies_recorded += 1
        except CtxScoreError as exc:
            log.warning("session %s: the reply was not recorded (%s)", sess.id, exc)
            return
        if known is not None:
            sess.extra += _extra_fields([message], [msg], 0, len(known))
            sess.known, sess.known_last, sess.raw = [*known, msg], stored, [*sess.raw, message]

    # ------------------------------------------------------------------ the routes
    async def _open(self, sid: str) -> _Session:
        """:meth:`Sessions.get` in a worker thread (a new session's manager may read its store); when
        this request is cancelled meanwhile, the session it got is given back (:meth:`Sessions.done`)."""
        job = asyncio.ensure_future(run_in_threadpool(self.sessions.get, sid))
        try:
            return await asyncio.shield(job)
        except asyncio.CancelledError:
            job.add_done_callback(lambda j: j.cancelled() or j.exception() is not None
                                  or self.sessions.done(j.result()))
            raise

    async def chat(self, request: Request) -> Response:
        """``POST /v1/chat/completions`` (see the module docstring)."""
        t0 = time.perf_counter()
        body, problem = _read_chat_body(await request.body())
        if problem is not None:
            return problem
        try:
            sid = request.headers.get(self.session_header) or derive_session_id(body["messages"])
        except RecursionError:
            return _too_deep()
        if not sid.strip() or len(sid) > 256:
            return JSONResponse(error_body(f"{self.session_header} must be 1-256 characters"), status_code=400)
        try:
            sess = self.sessions.kept(sid) or await self._open(sid)
        except StoreError as exc:  # the session's store is busy or away: retry
            return JSONResponse(error_body(str(exc), kind="store_unavailable"), status_code=503)
        except CtxScoreError as exc:  # the session's manager cannot be made (its options, its layers)
            return JSONResponse(error_body(f"session {sid!r} cannot be opened: {exc}", kind="server_error"),
                                status_code=500)
        try:
            await sess.lock.acquire()
        except BaseException:
            self.sessions.done(sess)
            raise
        release = _Release(sess, self.sessions)
        try:
            try:
                await self.sessions.take(sess)  # a shared session's lock: waited for holding no thread
                window, received, forwarded, warns = await self.work(self.prepare, sess, body["messages"],
                                                                     body.get("tools"))
            except InputError as exc:
                return JSONResponse(error_body(str(exc), param="messages"), status_code=400)
            except RecursionError:  # read, but too deep to be measured or written (tools, content parts)
                return _too_deep()
            except StoreError as exc:  # a busy shared session, or the store / Redis away: retry
                return JSONResponse(error_body(str(exc), kind="store_unavailable"), status_code=503)
            except CtxScoreError as exc:
                return JSONResponse(error_body(str(exc), kind="server_error"), status_code=500)
            sess.stats.count(received, forwarded)
            ctx = {"x-ctxscore-session": sid, "x-ctxscore-tokens-received": str(received),
                   "x-ctxscore-tokens-forwarded": str(forwarded)}
            if warns:
                ctx["x-ctxscore-warnings"] = ",".join(warns)
            fwd = {**body, "messages": window}
            if body.get("stream"):
                return await self._stream(request, sess, fwd, ctx, time.perf_counter() - t0, release)
            return await self._plain(request, sess, fwd, ctx, time.perf_counter() - t0, release)
        finally:
            if not release.handed_off:
                await release()

    async def _send(self, request: Request, fwd: dict[str, Any], stream: bool) -> Any:
        """The upstream's response to the chat request (see :meth:`_call`)."""
        headers = {**self.headers_up(request, stream=stream), "content-type": "application/json"}
        try:
            body = _dump_json(fwd)
        except RecursionError:  # orjson writes 254 levels, the json module runs out of stack near 1,000
            return _too_deep()
        return await self._call("POST", self.upstream + "/chat/completions", body, headers)

    @staticmethod
    async def _body(r: Any) -> bytes | Response:
        """The whole body of an upstream response, or an error :class:`Response` when the upstream
        broke off (502) or stalled (504) while sending it."""
        try:
            return await r.read()
        except TimeoutError as exc:
            return JSONResponse(error_body(f"the upstream's answer stalled ({exc!r})", kind="upstream_timeout"),
                                status_code=504)
        except aiohttp.ClientError as exc:
            return JSONResponse(error_body(f"the upstream's answer broke off ({exc!r})", kind="upstream_error"),
                                status_code=502)
        finally:
            r.release()

    async def _plain(self, request: Request, sess: _Session, fwd: dict[str, Any], ctx: dict[str, str],
                     spent: float, release: _Release) -> Response:
        r = await self._send(request, fwd, stream=False)
        st = sess.stats
        content = r if isinstance(r, Response) else await self._body(r)
        if isinstance(content, Response):
            st.upstream_errors += 1
            content.headers.update(ctx)
            return content
        if r.status != 200:
            st.upstream_errors += 1
        else:
            t1 = time.perf_counter()
            try:
                reply = orjson.loads(content)["choices"][0]["message"]
            except (ValueError, KeyError, IndexError, TypeError):
                reply = None
            if isinstance(reply, dict):
                await self.record(sess, reply)
            await release()  # a shared session's turn ends here (its lock released): counted
            spent += time.perf_counter() - t1
        st.overhead_ms.append(spent * 1000.0)
        return _repeated(Response(content, status_code=r.status, headers={
            **self.headers_down(r.headers), **ctx, "x-ctxscore-proxy-ms": f"{spent * 1000.0:.3f}"}), r.headers)

    async def _stream(self, request: Request, sess: _Session, fwd: dict[str, Any], ctx: dict[str, str],
                      spent: float, release: _Release) -> Response:
        r = await self._send(request, fwd, stream=True)
        st = sess.stats
        if isinstance(r, Response):
            st.upstream_errors += 1
            r.headers.update(ctx)
            return r
        down = {**self.headers_down(r.headers), **ctx}
        if r.status != 200:
            content = await self._body(r)
            st.upstream_errors += 1
            st.overhead_ms.append(spent * 1000.0)
            if isinstance(content, Response):
                content.headers.update(ctx)
                return content
            return _repeated(Response(content, status_code=r.status, headers=down), r.headers)

        def broke_off(exc: BaseException) -> bytes:
            st.upstream_errors += 1  # the client gets an error event, which OpenAI clients raise
            return b"data: " + orjson.dumps(error_body(f"the upstream's answer broke off ({exc!r}); retry the request",
                                                       kind="upstream_error")) + b"\n\n"

        timed = False

        def time_it() -> None:  # once per request, as soon as the reply is recorded (before the client sees the end)
            nonlocal timed
            if not timed:
                timed = True
                st.overhead_ms.append(spent * 1000.0)

        async def events() -> AsyncIterator[bytes]:
            nonlocal spent
            acc = _Accumulator()
            recorded = False
            async for chunk in _chunks(r, broke_off):
                if acc.feed(chunk) and not recorded:
                    t1 = time.perf_counter()
                    recorded = True
                    await self.record(sess, acc.message(), acc.finished)  # before the client sees the end
                    spent += time.perf_counter() - t1
                    time_it()
                yield chunk
            if not recorded and acc.finished:  # an upstream that sends no [DONE]
                await self.record(sess, acc.message())
            time_it()

        async def close() -> None:
            time_it()  # a stream the client left early
            r.release()
            await release()

        release.handed_off = True
        return _repeated(_Stream(events(), close, status_code=200, headers=down,
                                 media_type=r.headers.get("content-type", "text/event-stream")), r.headers)

    async def passthrough(self, path: str, request: Request) -> Response:
        """Any other ``/v1/{path}``: sent upstream as it is, the answer streamed back as it is."""
        url = f"{self.upstream}/{path}"
        if request.url.query:
            url += "?" + request.url.query
        r = await self._call(request.method, url, await request.body(), self.headers_up(request, stream=True))
        if isinstance(r, Response):
            return r

        async def close() -> None:
            r.release()

        return _repeated(_Stream(_chunks(r), close, status_code=r.status, headers=self.headers_down(r.headers)),
                         r.headers)

    def stats(self) -> dict[str, Any]:
        """``GET /v1/ctxscore/stats``: every session's figures and the totals."""
        rows = {s.id: s.stats.as_dict(s.cm) for s in self.sessions.all()}
        received = sum(r["tokens_received"] for r in rows.values())
        forwarded = sum(r["tokens_forwarded"] for r in rows.values())
        shared = self.sessions.figures()
        return {"upstream": self.upstream, "budget": self.budget, "sessions": rows,
                **({"shared": shared} if shared is not None else {}),
                "totals": {"sessions": len(rows), "requests": sum(r["requests"] for r in rows.values()),
                           "tokens_received": received, "tokens_forwarded": forwarded,
                           "forwarded_share": round(forwarded / received, 4) if received else None}}


class _Release:
    """Releases a session's lock and use count once, whoever calls it first (the handler or the stream)."""

    def __init__(self, sess: _Session, sessions: Sessions) -> None:
        self.sess, self.sessions = sess, sessions
        self.handed_off = False  # the stream releases it when it closes
        self._done = False

    async def __call__(self) -> None:
        if not self._done:
            self._done = True
            try:
                if self.sess.turn is not None:  # a shared turn: its Redis lock must go, even when cancelled
                    with anyio.CancelScope(shield=True):
                        await run_in_threadpool(self.sessions.leave, self.sess)
            finally:
                self.sess.lock.release()
                self.sessions.done(self.sess)


async def _chunks(r: Any, broke_off: Callable[[BaseException], bytes] | None = None) -> AsyncIterator[bytes]:
    """An upstream response's body as it arrives: each HTTP chunk of a chunked body (or the part of
    it received so far) as one piece, not several chunks merged. When the upstream breaks off or
    stalls: with ``broke_off``, one log line and the bytes it returns end the body (an error event
    of a chat stream); without, the error is raised, so the client's response is aborted rather
    than ended as if complete."""
    try:
        async for data, _ in r.content.iter_chunks():
            if data:
                yield data
    except (TimeoutError, aiohttp.ClientError) as exc:
        if broke_off is None:
            raise
        log.warning("the upstream's answer broke off (%r); the client gets an error event", exc)
        yield broke_off(exc)


def _repeated(response: Response, upstream: Any) -> Response:
    """``response`` with every value of the upstream's repeated headers (several ``Set-Cookie``),
    of which its dict of headers kept one."""
    values: dict[str, list[str]] = {}
    for k, v in upstream.items():
        if k.lower() not in HOP_RESPONSE_HEADERS and not k.lower().startswith("x-ctxscore-"):  # ours win
            values.setdefault(k.lower(), []).append(v)
    for k, vs in values.items():
        if len(vs) > 1:
            key = k.encode("latin-1")
            response.raw_headers[:] = [(a, b) for a, b in response.raw_headers if a != key]
            response.raw_headers.extend((key, v.encode("latin-1")) for v in vs)
    return response


def _tls_context() -> Any:
    """The CA certificates httpx would trust, as an SSL context: ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``
    when set, else certifi's bundle when certifi is installed; ``True`` (the system's) otherwise."""
    import os  # noqa: PLC0415
    import ssl  # noqa: PLC0415

    cafile, capath = os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR")
    if cafile or capath:
        return ssl.create_default_context(cafile=cafile or None, capath=capath or None)
    try:
        import certifi  # noqa: PLC0415 - optional: httpx and the openai client bring it
    except ImportError:
        return True
    return ssl.create_default_context(cafile=certifi.where())


def _env_proxy(upstream: str) -> str | None:
    """The proxy URL the environment names for ``upstream`` (``HTTPS_PROXY`` / ``HTTP_PROXY`` by its
    scheme, ``NO_PROXY`` honoured; standard library rules), or ``None``."""
    import urllib.request  # noqa: PLC0415
    from urllib.parse import urlsplit  # noqa: PLC0415

    parts = urlsplit(upstream)
    if parts.hostname and urllib.request.proxy_bypass(parts.hostname):
        return None
    return urllib.request.getproxies().get(parts.scheme)


def _non_finite(name: str) -> Any:
    """``json.loads``'s hook for ``NaN`` / ``Infinity``: refused (JSON has no such numbers, and the
    upstream would receive them changed)."""
    raise ValueError(f"{name} is not a JSON number; send a finite number or null")


def _finite_float(text: str) -> float:
    """``json.loads``'s hook for decimal numbers: one too large for a double (``1e400``) is refused,
    as orjson refuses it (it would be forwarded as ``null``)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is too large for a JSON number the upstream can read; send a finite number")
    return value


def _dump_json(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON (orjson; the json module for what orjson refuses, such as
    integers over 64 bits)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def _extra_fields(messages: list[Any], msgs: list[dict[str, Any]], start: int,
                  offset: int = 0) -> list[tuple[int, dict[str, Any], dict[str, Any]]]:
    """``(index, verbatim dict, client fields)`` of ``messages[start:]`` holding fields outside the
    chat-completions format; ``msgs`` are their normalized dicts, ``offset`` is added to each index."""
    out = []
    for i in range(start, len(messages)):
        extra = client_fields(messages[i])
        if extra is not None:
            out.append((i + offset, Message.from_dict(msgs[i]).to_openai(), extra))
    return out


def _raw_prefix(messages: list[Any], raw: list[Any]) -> int:
    """How many leading ``messages`` equal the ``raw`` dicts of the last request, item by item."""
    n = min(len(messages), len(raw))
    if messages[:n] == raw[:n]:
        return n
    p = 0
    while p < n and messages[p] == raw[p]:
        p += 1
    return p


def _verified(cm: ContextManager, known: list[dict[str, Any]] | None, last: Message | None,
              msgs: list[dict[str, Any]]) -> int:
    """How many leading ``msgs`` are known to be the history's first messages: those equal to the
    dicts the history was made from (``known``), when the history still holds them (its entry
    ``len(known) - 1`` is ``last``); 0 when unknown."""
    n = 0 if known is None else len(known)
    if not n or n > len(cm) or n > len(msgs) or cm.history.entries[n - 1].msg is not last:
        return 0
    return n if msgs[:n] == known else 0


#: The deepest nesting of arrays and objects a request body read by the json module (what orjson
#: refuses) may have: orjson reads 1,024 levels and writes 254, and the json module, which writes the
#: deeper ones, runs out of stack near 1,000 (a body of 990 levels was a bare 500).
MAX_JSON_DEPTH = 500
TOO_DEEP = ("the request body nests arrays and objects too deeply to be forwarded (at most about 500 levels); "
            "send a flatter body (a JSON schema or tool argument of that depth is likely a serialisation loop)")


def _too_deep() -> JSONResponse:
    """The 400 for a body nested too deeply to be measured or forwarded (:data:`TOO_DEEP`)."""
    return JSONResponse(error_body(TOO_DEEP), status_code=400)


def _nested_deeper(value: Any, limit: int) -> bool:
    """Whether a parsed JSON value nests arrays and objects more than ``limit`` levels deep (a
    top-level object is level 1); iterative, so any depth is measured."""
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        v, depth = stack.pop()
        children = v.values() if isinstance(v, dict) else v
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def _read_chat_body(raw: bytes) -> tuple[dict[str, Any], Response | None]:
    """The request body as a dict with a non-empty ``messages`` list, or a 400 response (not JSON,
    not an object, no messages, a lone surrogate, nested deeper than :data:`MAX_JSON_DEPTH`)."""
    try:  # orjson reads at most 1,024 levels; a body it reads deeper than it writes fails when forwarded (:meth:`_send`)
        body = orjson.loads(raw)
    except ValueError:
        try:  # what orjson refuses and the json module reads (integers over 64 bits, lone surrogates)
            body = json.loads(raw, parse_constant=_non_finite, parse_float=_finite_float)
        except ValueError as exc:
            why = ("a number has more digits than Python reads (4,300): send it as a string"
                   if "integer string conversion" in str(exc) else str(exc))
            return {}, JSONResponse(error_body(f"the request body is not JSON ({why})"), status_code=400)
        except RecursionError:  # orjson stops at 1,024 levels, the json module at the stack's depth
            return {}, _too_deep()
        if _nested_deeper(body, MAX_JSON_DEPTH):  # before the recursive surrogate search below
            return {}, _too_deep()
        bad = _lone_surrogate(body, "")
        if bad is not None:  # neither counted, stored nor forwarded: say where it is
            where, char, at = bad
            return {}, JSONResponse(error_body(
                f"{where or 'the request body'} holds a lone surrogate {char!r} at character {at}, which is not valid "
                "Unicode text; decode the source bytes with errors='replace' or remove the character",
                param=where.split("[")[0].split(".")[0] or None), status_code=400)
    if not isinstance(body, dict):
        return {}, JSONResponse(error_body("the request body must be a JSON object"), status_code=400)
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        return {}, JSONResponse(error_body("'messages' must be a non-empty list", param="messages"), status_code=400)
    return body, None


def _lone_surrogate(value: Any, where: str) -> tuple[str, str, int] | None:
    """The first string of a parsed JSON value (keys included) that holds a lone UTF-16 surrogate:
    ``(its path such as "messages[0].content", the character, its index)``, or ``None``."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return where, value[exc.start], exc.start
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            found = _lone_surrogate(k, f"{where} (a key)" if where else "a key of the request body") or _lone_surrogate(v, f"{where}.{k}" if where else str(k))
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found = _lone_surrogate(v, f"{where}[{i}]")
            if found is not None:
                return found
    return None


def _load_scorer(scorer: Any) -> Any:
    """A packaged scorer folder loaded once for every session; any other scorer as it is."""
    if scorer not in ("auto", "rules", None) and isinstance(scorer, str):
        from ..scoring.learned import LearnedScorer  # noqa: PLC0415

        return LearnedScorer.from_pretrained(scorer)
    return scorer


#: ``ContextManager`` arguments that may bring work of the user's own (an LLM compressor, layers,
#: hooks, sections): a proxy given any of them keeps the shared thread pool.
_USER_WORK = frozenset({"compressor", "layers", "hooks", "sections"})


def local_work(store: Any, redis: Any, manager_factory: Any, query_writer: Any, options: dict[str, Any]) -> bool:
    """Whether a proxy's session work is local CPU work only, so that it runs one request at a time
    (see the module docstring): no Redis, no manager factory, no query writer, a store in memory or
    in a SQLite file, the rule scorer or a :class:`~ctxscore.scoring.learned.LearnedScorer` with one
    of ctxscore's embedders and no fallback classifier (``"auto"``, ``"rules"``, a packaged folder;
    not a subclass, whose methods may call a network), and none of the ``ContextManager``
    arguments that bring the user's own work (``compressor``, ``layers``, ``hooks``, ``sections``).

    A SQLite file shared with another process would make every session of the proxy wait while
    that process holds the file's write lock (up to the store's busy timeout,
    :data:`ctxscore.store.sqlite.BUSY_TIMEOUT_S`): pass ``create_app(..., in_order=False)`` (``ctxscore serve --in-order off``) then."""
    from ..scoring.embedders import EMBEDDERS, HashingEmbedder  # noqa: PLC0415
    from ..scoring.learned import LearnedScorer  # noqa: PLC0415
    from ..scoring.rules import RuleClassifier  # noqa: PLC0415

    scorer = options.get("scorer")
    local_scorer = scorer in ("auto", "rules", None) or type(scorer) is RuleClassifier or (
        type(scorer) is LearnedScorer and scorer.fallback is None
        and type(scorer.embedder) in (*EMBEDDERS.values(), HashingEmbedder))
    local_store = store is None or (isinstance(store, str | os.PathLike) and not _is_server_url(store))
    return (redis is None and manager_factory is None and query_writer is None and local_store and local_scorer
            and not any(options.get(k) for k in _USER_WORK))


def _is_server_url(store: Any) -> bool:
    """A PostgreSQL store: a ``postgresql://`` URL or a libpq ``key=value`` string."""
    return is_postgres(store)


def _sessions(store: Any, redis: Any, manager_factory: Callable[[str], ContextManager] | None,
              options: dict[str, Any], *, encoding: str, max_sessions: int, timeout: float) -> Sessions:
    """The proxy's sessions for the ``store`` / ``redis`` arguments of :func:`create_app` (a callable
    ``options["layers"]`` makes each session's layers; a store URL's ``redis=`` parameter is taken
    as ``redis``)."""
    layers = options.get("layers")
    if layers and not callable(layers):
        raise ConfigError("manager_options['layers'] would give every session the same layer objects, and a layer "
                          "holds one session's state: pass a function that makes them, "
                          "manager_options={'layers': lambda: [FactLedger()]}")
    manager: Callable[..., ContextManager] = ContextManager
    if callable(layers):
        make_layers: Callable[[], Any] = layers
        try:  # one set made now, so that a factory that gives no layers fails here, not at a request
            check_layers(make_layers())
        except ConfigError as exc:
            raise ConfigError(f"manager_options['layers'] must make a new list of layers at each call: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - the user's factory: any failure is a configuration error
            raise ConfigError(f"manager_options['layers'] failed: {type(exc).__name__}: {exc}") from None

        def manager(**kw: Any) -> ContextManager:
            return ContextManager(**{**kw, "layers": make_layers()})

    if _is_server_url(store):  # the URL form of --redis (open_store's redis= parameter) shares sessions too
        store, redis = redis_in_url(store, redis)
    if redis is not None:
        if not _is_server_url(store):
            raise ConfigError("redis (--redis) shares sessions between proxy processes and needs a server store: "
                              f"give store='postgresql://...' (--store), not {store!r} (a SQLite file or memory "
                              "is private to one process)")
        if manager_factory is not None:
            raise ConfigError("manager_factory cannot be combined with redis: pass the ContextManager settings "
                              "as manager_options")
        if isinstance(redis, str) and not redis.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigError(f"redis must be a redis://, rediss:// or unix:// URL, got {redis!r}")
        from ..store import open_store  # noqa: PLC0415
        from ..store.redis_state import RedisHotState, SharedSessions  # noqa: PLC0415

        if isinstance(redis, str):  # a turn may wait for the model: its lock is renewed meanwhile
            redis = RedisHotState(redis, lock_wait_s=max(30.0, timeout + 10.0), renew_s=timeout + 60.0)
            _ping(redis, close=True)
        elif isinstance(redis, RedisHotState):
            _ping(redis, close=False)
        shared = SharedSessions(open_store(store, redis=redis), manager, max_sessions=max_sessions,
                                encoding=encoding, **options)
        return SharedProxySessions(shared, max_sessions)
    if manager_factory is not None:
        return Sessions(manager_factory, max_sessions)
    if isinstance(store, str) and "://" in store and not store.startswith("sqlite:///") and not _is_server_url(store):
        raise ConfigError(f"unsupported store URL {shown_url(store)!r}; use a SQLite path, sqlite:///path or "
                          "postgresql://...")
    if _is_server_url(store):  # one PostgreSQL store (one connection pool) for every session
        from ..store import open_store  # noqa: PLC0415

        store = open_store(store)
        server = store

        def on_server(sid: str) -> ContextManager:
            return manager(store=server, encoding=encoding, session_id=sid, **options)

        sessions = Sessions(on_server, max_sessions, close_managers=False)
        sessions.close = _then(sessions.close, server.close)  # type: ignore[method-assign]
        return sessions

    def default_factory(sid: str) -> ContextManager:
        return manager(store=store, encoding=encoding, session_id=sid, **options)

    return Sessions(default_factory, max_sessions)


def _ping(hot: Any, close: bool) -> None:
    """Check at start that Redis answers (``close``: close ``hot`` when it does not).

    Raises:
        StoreError: Redis cannot be reached.
    """
    try:
        hot.ping()
    except StoreError:
        if close:
            hot.close()
        raise


def warm_up(scorer: Any = "auto", encoding: str = "cl100k_base") -> float:
    """Load what the first requests would otherwise wait for: the tiktoken encoding, jieba's
    dictionary (Chinese queries) and, for ``"auto"`` (the packaged learned scorer, once per process)
    or a :class:`~ctxscore.scoring.learned.LearnedScorer`, the scorer and its embedder's model (one
    made-up message is scored). Any other scorer (the rules, a scorer of your own, which may call a
    service) is not called. :func:`create_app` runs this before it returns the app, so the proxy
    accepts no request before they are loaded.

    Returns:
        Seconds it took (about 5-8 s with the learned scorer on a 2-core machine, 1 s without).

    Raises:
        ModelLoadError: the packaged scorer is installed but cannot be loaded.
    """
    from ..scoring.learned import LearnedScorer  # noqa: PLC0415
    from ..store.retrieval import query_terms  # noqa: PLC0415

    t0 = time.perf_counter()
    if not (scorer == "auto" or isinstance(scorer, LearnedScorer)):
        scorer = "rules"
    cm = ContextManager(budget=1000, scorer=scorer, encoding=encoding)
    try:
        cm.add({"role": "user", "content": "Warm-up: load the scorer and the tokenizers. 预热。"})
    finally:
        cm.close()
    query_terms("预热 warm-up")
    return time.perf_counter() - t0


def _then(first: Callable[[], Any], second: Callable[[], Any]) -> Callable[[], None]:
    def both() -> None:
        try:
            first()
        finally:
            second()
    return both


def create_app(upstream: str, budget: int, *, scorer: Any = "auto", store: Any = None,
               policy: Policy | None = None, encoding: str = "cl100k_base",
               manager_factory: Callable[[str], ContextManager] | None = None, upstream_api_key: str | None = None,
               timeout: float = 600.0, max_sessions: int = 1000, session_header: str = "X-Session-Id",
               query_writer: Any = None, redis: Any = None, manager_options: dict[str, Any] | None = None,
               warm: bool = True, in_order: bool | None = None) -> FastAPI:
    """The proxy as a FastAPI app (serve it with uvicorn; see the module docstring).

    Args:
        upstream: the upstream API base, including ``/v1`` (``https://api.openai.com/v1``).
        budget: the window's token budget (messages and the request's tool definitions), > 0.
        scorer: the sessions' scorer (``"auto"``, ``"rules"``, a packaged scorer folder or a scorer).
        store: where every session's messages live: ``None`` (a private in-memory store per
            session), a SQLite file (sessions then survive restarts; one process), or a
            ``postgresql://`` URL or libpq ``key=value`` string (extra ``postgres``: one store, opened
            once, for every session).
        policy: the tier policy (default :class:`~ctxscore.Policy`).
        encoding: the tiktoken encoding of the budget.
        manager_factory: ``factory(session_id) -> ContextManager``, replacing the settings above
            (an LLM compressor, layers, a shared store ...); not with ``redis``.
        upstream_api_key: sent upstream instead of the client's ``Authorization``.
        timeout: seconds to wait for the upstream (connect: at most 10).
        max_sessions: sessions kept in memory (least recently used closed first).
        session_header: the header naming the session.
        query_writer: an object with ``expand(request) -> str`` (:class:`ctxscore.llm.LLMQueryWriter`)
            used on the page-in query; ``None`` (default) uses the request as it is.
        redis: a Redis URL (``redis://host:6379/0``; extra ``redis``) or a
            :class:`~ctxscore.store.redis_state.RedisHotState`, with a ``postgresql://`` ``store``:
            the sessions are shared by every proxy process given the same two URLs (behind a load
            balancer): each request holds the session's Redis lock from its sync to the recording of
            the reply, and a process that never saw a session continues it from the store without
            re-scoring (:class:`SharedProxySessions`). A ``redis=`` parameter of the store URL
            (URL-encoded, as :func:`~ctxscore.store.open_store` reads it) is the same as this argument.
        manager_options: more :class:`~ctxscore.ContextManager` keyword arguments of every session
            (``rules``, ``compressor`` ...); ``layers`` as a function that makes one session's layers
            (``lambda: [FactLedger()]``: a layer holds one session's state).
        warm: run :func:`warm_up` before returning, so that no request waits for the scorer's
            models or the tokenizers to load (with ``manager_factory``, whose managers may use any
            scorer, only the tokenizers are loaded).
        in_order: run the sessions' work (sync, build, the reply's recording) one request at a
            time, in arrival order (``True``), or many at once in the shared thread pool
            (``False``); ``None`` (default): in order when it is all local CPU work
            (:func:`local_work`). In order, one process serves at most about 1,000 / (CPU ms a
            request) requests a second: about 70 with the rules scorer and 25-40 with the learned
            one on this project's 2-core machine; run more processes (PostgreSQL + Redis) beyond.

    Raises:
        ConfigError: a bad budget, upstream URL, count, store or Redis URL, ``redis`` without a
            PostgreSQL store, ``layers`` that are not a function, or a missing extra (the message says
            which to install).
        StoreError: the PostgreSQL store or Redis cannot be reached.
        ModelLoadError: the scorer (a packaged folder, or the installed default for ``"auto"``)
            cannot be loaded.
    """
    budget = check_budget(budget)
    if not isinstance(upstream, str) or not upstream.startswith(("http://", "https://")):
        raise ConfigError(f"upstream must be an http(s) URL such as https://api.openai.com/v1, got {upstream!r}")
    if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 1:
        raise ConfigError(f"max_sessions must be a positive integer, got {max_sessions!r}")
    options = {"budget": budget, "scorer": _load_scorer(scorer), "policy": policy, **(manager_options or {})}
    sessions = _sessions(store, redis, manager_factory, options, encoding=encoding, max_sessions=max_sessions,
                         timeout=timeout)
    if warm:
        _warm(sessions, options["scorer"] if manager_factory is None else "rules", encoding)
    proxy = Proxy(upstream, budget, sessions, upstream_api_key=upstream_api_key,
                  timeout=timeout, max_sessions=max_sessions, session_header=session_header, query_writer=query_writer,
                  in_order=local_work(store, redis, manager_factory, query_writer, options) if in_order is None
                  else bool(in_order))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await proxy.aclose()
        proxy.sessions.close()

    app = FastAPI(title="ctxscore proxy", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.proxy = proxy
    _add_routes(app, proxy)
    return app


def _warm(sessions: Sessions, scorer: Any, encoding: str) -> None:
    """:func:`warm_up` for :func:`create_app` (the sessions are closed when it fails)."""
    try:
        took = warm_up(scorer, encoding)
    except BaseException:
        sessions.close()
        raise
    log.info("ctxscore proxy warmed up in %.1f s (scorer, embedder, tokenizers)", took)


def _add_routes(app: FastAPI, proxy: Proxy) -> None:
    """The proxy's routes: chat completions, its stats, health, then every other ``/v1/...`` passed
    through (in this order: the first route that matches answers)."""
    app.add_api_route("/v1/chat/completions", proxy.chat, methods=["POST"])

    @app.get("/v1/ctxscore/stats")
    async def stats_all() -> dict[str, Any]:
        return proxy.stats()

    @app.get("/v1/ctxscore/stats/{session_id}")
    async def stats_one(session_id: str) -> Response:
        s = proxy.sessions.find(session_id)
        if s is None:
            return JSONResponse(error_body(f"no session {session_id!r}", code="session_not_found"), status_code=404)
        return JSONResponse(s.stats.as_dict(s.cm))

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"ok": True, "sessions": len(proxy.sessions.all())}

    app.add_api_route("/v1/{path:path}", proxy.passthrough, methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
