"""A client for any OpenAI-compatible chat-completions endpoint, on the official ``openai`` package.

:class:`LLMClient` adds what the LLM path of ctxscore needs on top of ``openai.OpenAI``: settings
from arguments or the environment, a timeout per request, retries with exponential backoff (and
jitter) on 429, 5xx, timeouts, dropped connections and malformed response bodies, honouring
``Retry-After``; a limit on concurrent requests shared by every thread; and token accounting
(the endpoint's ``usage`` when it reports one, else a count with tiktoken, marked estimated).

Environment (used when the argument is not given): ``CTXSCORE_LLM_BASE_URL`` (else
``OPENAI_BASE_URL``, else OpenAI's), ``CTXSCORE_LLM_MODEL`` (required one way or the other),
``CTXSCORE_LLM_API_KEY`` (else ``OPENAI_API_KEY``; local servers that need none get a placeholder).

Nothing here runs unless an :class:`LLMClient` is made: default ctxscore runs need no LLM and no network.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .._optional import require
from ..errors import ConfigError, CtxScoreError
from ..messages import Message
from ..tokens import REPLY_PRIMING_TOKENS, TokenCounter

openai = require("openai", "llm", "ctxscore.llm")

log = logging.getLogger("ctxscore")

#: HTTP statuses retried (besides timeouts, dropped connections and malformed bodies).
RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})


class LLMError(CtxScoreError):
    """A request to the LLM endpoint failed for good (a refused request, or retries exhausted).

    Attributes:
        status: the last HTTP status, or ``None`` (timeout, connection, malformed body).
        attempts: requests made.
    """

    def __init__(self, message: str, status: int | None = None, attempts: int = 1) -> None:
        super().__init__(message)
        self.status = status
        self.attempts = attempts


class LLMResponseError(LLMError):
    """The endpoint answered 200 with a body that is not a chat completion (malformed JSON, no choices)."""


@dataclass(frozen=True)
class Completion:
    """One chat completion.

    Attributes:
        text: the assistant's content (``""`` when it sent none).
        tool_calls: OpenAI-style tool-call dicts (may be empty).
        finish_reason: as the endpoint reported it, or ``None``.
        prompt_tokens, completion_tokens: tokens of the request and the answer.
        estimated: the token counts are ctxscore's tiktoken counts (the endpoint reported no usage).
        attempts: requests made (1 without retries).
        seconds: wall time of the call, retries and backoff included.
    """

    text: str
    tool_calls: tuple[dict[str, Any], ...] = ()
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    estimated: bool = False
    attempts: int = 1
    seconds: float = 0.0


@dataclass
class Usage:
    """Running totals of one client (read a copy with :attr:`LLMClient.usage`).

    Attributes:
        requests: completions returned.
        attempts: HTTP requests made (retries included).
        retries: attempts that were retried.
        failures: calls that raised :class:`LLMError`.
        prompt_tokens, completion_tokens: tokens of the returned completions.
        estimated: completions whose tokens were counted by ctxscore (no ``usage`` from the endpoint).
        by_status: failed attempts per HTTP status (``"timeout"``, ``"connection"``, ``"malformed"`` otherwise).
    """

    requests: int = 0
    attempts: int = 0
    retries: int = 0
    failures: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    estimated: int = 0
    by_status: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready copy."""
        return {"requests": self.requests, "attempts": self.attempts, "retries": self.retries,
                "failures": self.failures, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "estimated": self.estimated,
                "by_status": dict(self.by_status)}


def _env(*names: str) -> str | None:
    for n in names:
        v = os.environ.get(n)
        if v:
            return v
    return None


class LLMClient:
    """Chat completions from an OpenAI-compatible endpoint, with retries, a concurrency limit and
    token accounting. Thread-safe: one client may serve many threads.

    Args:
        base_url: the API base, for example ``http://127.0.0.1:8000/v1`` (default: environment, see
            the module docstring).
        model: the model name sent with every request (default: ``CTXSCORE_LLM_MODEL``).
        api_key: the key (default: environment; a placeholder when none is set).
        timeout: seconds per request (connect and each read), > 0.
        max_retries: retries after the first attempt (>= 0) on 429, 5xx, timeouts, dropped
            connections and malformed bodies.
        backoff: first backoff in seconds; attempt k waits ``backoff * 2**k`` (at most ``max_backoff``),
            times a jitter factor in [0.5, 1], or the endpoint's ``Retry-After`` when that is longer
            (capped at ``max_backoff``).
        max_backoff: longest wait between attempts, seconds.
        max_concurrency: requests in flight at once across all threads (>= 1).
        temperature: sent with every request unless a call overrides it (``None``: not sent).
        counter: token counter for estimated usage (default ``TokenCounter()``).
        default_headers: extra headers sent with every request.

    Raises:
        ConfigError: no model, or an invalid number.
    """

    def __init__(self, base_url: str | None = None, model: str | None = None, api_key: str | None = None, *,
                 timeout: float = 60.0, max_retries: int = 3, backoff: float = 0.5, max_backoff: float = 8.0,
                 max_concurrency: int = 4, temperature: float | None = 0.0, counter: TokenCounter | None = None,
                 default_headers: dict[str, str] | None = None) -> None:
        self.model = model or _env("CTXSCORE_LLM_MODEL")
        if not self.model:
            raise ConfigError("LLMClient needs a model: pass model= or set CTXSCORE_LLM_MODEL")
        for name, v, lo in (("timeout", timeout, 0.0), ("backoff", backoff, 0.0), ("max_backoff", max_backoff, 0.0)):
            if isinstance(v, bool) or not isinstance(v, int | float) or v < lo or (name == "timeout" and v == 0):
                raise ConfigError(f"{name} must be a number of seconds{' > 0' if name == 'timeout' else ' >= 0'}, got {v!r}")
        for name, n, lo in (("max_retries", max_retries, 0), ("max_concurrency", max_concurrency, 1)):
            if isinstance(n, bool) or not isinstance(n, int) or n < lo:
                raise ConfigError(f"{name} must be an integer >= {lo}, got {n!r}")
        self.base_url = base_url or _env("CTXSCORE_LLM_BASE_URL", "OPENAI_BASE_URL")
        key = api_key or _env("CTXSCORE_LLM_API_KEY", "OPENAI_API_KEY") or "not-needed"
        self.timeout, self.max_retries, self.backoff, self.max_backoff = float(timeout), max_retries, backoff, max_backoff
        self.temperature = temperature
        self.counter = counter or TokenCounter()
        self._sem = threading.BoundedSemaphore(max_concurrency)
        self.max_concurrency = max_concurrency
        self._lock = threading.Lock()
        self._usage = Usage()
        self._client = openai.OpenAI(base_url=self.base_url, api_key=key, timeout=self.timeout, max_retries=0,
                                     default_headers=default_headers)

    @property
    def usage(self) -> Usage:
        """A copy of the running totals."""
        with self._lock:
            u = self._usage
            return Usage(u.requests, u.attempts, u.retries, u.failures, u.prompt_tokens, u.completion_tokens,
                         u.estimated, dict(u.by_status))

    def complete(self, messages: Sequence[dict[str, Any]], *, stream: bool = False, json_mode: bool = False,
                 max_tokens: int | None = None, **params: Any) -> Completion:
        """One chat completion of ``messages`` (OpenAI-style dicts).

        Args:
            messages: the prompt.
            stream: ask for server-sent events and accumulate them (the same :class:`Completion`).
            json_mode: send ``response_format={"type": "json_object"}``.
            max_tokens: cap on the answer's tokens (sent as ``max_tokens``).
            params: more chat-completions parameters (``temperature`` overrides the client's).

        Raises:
            LLMError: a status that is not retried (400, 401, 404 ...) or retries exhausted;
                :class:`LLMResponseError` when the last attempt got a malformed body.
        """
        if not messages:
            raise ConfigError("complete() needs at least one message")
        req: dict[str, Any] = {"model": self.model, "messages": list(messages)}
        if self.temperature is not None:
            req["temperature"] = self.temperature
        if json_mode:
            req["response_format"] = {"type": "json_object"}
        if max_tokens is not None:
            req["max_tokens"] = max_tokens
        req.update(params)
        t0 = time.perf_counter()
        attempt = 0
        while True:
            attempt += 1
            wait: float | None = None
            try:
                with self._sem:
                    self._count(attempts=1)
                    out = self._stream(req) if stream else self._once(req)
            except openai.APIStatusError as exc:
                status, kind = exc.status_code, str(exc.status_code)
                retry = status in RETRY_STATUSES or status >= 500
                wait = _retry_after(exc.response.headers) if retry else None
                err: LLMError = LLMError(f"LLM endpoint answered {status}: {_error_message(exc)}", status, attempt)
            except openai.APITimeoutError:
                kind, retry = "timeout", True
                err = LLMError(f"LLM endpoint did not answer within {self.timeout:g} s", None, attempt)
            except openai.APIConnectionError as exc:
                kind, retry = "connection", True
                err = LLMError(f"LLM endpoint unreachable ({exc.__cause__ or exc})", None, attempt)
            except (ValueError, TypeError, AttributeError, LLMResponseError,
                    openai.APIResponseValidationError) as exc:  # a body that is not a completion
                kind, retry = "malformed", True
                err = LLMResponseError(f"LLM endpoint sent a malformed completion ({exc})", 200, attempt)
            except openai.OpenAIError as exc:  # anything else the client raises: not retried
                kind, retry = "client", False
                err = LLMError(f"LLM request failed ({type(exc).__name__}: {exc})", None, attempt)
            else:
                return self._account(out, messages, attempt, time.perf_counter() - t0)
            self._count(status=kind)
            if not retry or attempt > self.max_retries:
                self._count(failures=1)
                if retry:
                    err.args = (f"{err.args[0]}; gave up after {attempt} attempts",)
                log.warning("llm: %s", err)
                raise err
            delay = self._delay(attempt - 1, wait)
            log.info("llm: %s; retry %d of %d in %.2f s", err, attempt, self.max_retries, delay)
            self._count(retries=1)
            time.sleep(delay)

    def complete_text(self, system: str, user: str, **kwargs: Any) -> Completion:
        """:meth:`complete` of one system and one user message."""
        return self.complete([{"role": "system", "content": system}, {"role": "user", "content": user}], **kwargs)

    def close(self) -> None:
        """Close the HTTP connections."""
        self._client.close()

    # ------------------------------------------------------------------ internals
    def _once(self, req: dict[str, Any]) -> Completion:
        r = self._client.chat.completions.create(**req)
        if not getattr(r, "choices", None):
            raise LLMResponseError("no choices in the answer")
        ch = r.choices[0]
        msg = ch.message
        calls = tuple(c.model_dump() for c in (msg.tool_calls or ()))
        u = getattr(r, "usage", None)
        return Completion(text=msg.content or "", tool_calls=calls, finish_reason=ch.finish_reason,
                          prompt_tokens=int(getattr(u, "prompt_tokens", 0) or 0) if u else -1,
                          completion_tokens=int(getattr(u, "completion_tokens", 0) or 0) if u else -1)

    def _stream(self, req: dict[str, Any]) -> Completion:
        req = dict(req, stream=True, stream_options={"include_usage": True})
        parts: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        finish = None
        prompt = completion = -1
        answered = False
        for chunk in self._client.chat.completions.create(**req):
            if getattr(chunk, "usage", None):
                prompt, completion = int(chunk.usage.prompt_tokens or 0), int(chunk.usage.completion_tokens or 0)
            for ch in chunk.choices or ():
                answered = True
                d = ch.delta
                if d is None:
                    continue
                if d.content:
                    parts.append(d.content)
                for tc in d.tool_calls or ():
                    c = calls.setdefault(tc.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                    c["id"] = tc.id or c["id"]
                    if tc.function is not None:
                        c["function"]["name"] += tc.function.name or ""
                        c["function"]["arguments"] += tc.function.arguments or ""
                finish = ch.finish_reason or finish
        if not answered:  # no event held a choice: a JSON body or an error page sent instead of a stream
            raise LLMResponseError("no choices in the stream")
        return Completion(text="".join(parts), tool_calls=tuple(calls[i] for i in sorted(calls)), finish_reason=finish,
                          prompt_tokens=prompt, completion_tokens=completion)

    def _account(self, out: Completion, messages: Sequence[dict[str, Any]], attempts: int, seconds: float) -> Completion:
        estimated = out.prompt_tokens < 0
        prompt, completion = out.prompt_tokens, out.completion_tokens
        if estimated:
            prompt = sum(self.counter.count_message(Message.from_dict(m)) for m in messages) + REPLY_PRIMING_TOKENS
            completion = self.counter.count(out.text + "".join(json.dumps(c) for c in out.tool_calls))
        with self._lock:
            u = self._usage
            u.requests += 1
            u.prompt_tokens += prompt
            u.completion_tokens += completion
            u.estimated += estimated
        return Completion(out.text, out.tool_calls, out.finish_reason, prompt, completion, estimated, attempts, seconds)

    def _count(self, attempts: int = 0, retries: int = 0, failures: int = 0, status: str | None = None) -> None:
        with self._lock:
            u = self._usage
            u.attempts += attempts
            u.retries += retries
            u.failures += failures
            if status is not None:
                u.by_status[status] = u.by_status.get(status, 0) + 1

    def _delay(self, k: int, retry_after: float | None) -> float:
        d = min(self.max_backoff, self.backoff * (2 ** k)) * random.uniform(0.5, 1.0)
        if retry_after is not None:
            d = max(d, min(retry_after, self.max_backoff))
        return d

    def __repr__(self) -> str:
        return f"LLMClient(base_url={self.base_url!r}, model={self.model!r})"


def _retry_after(headers: Any) -> float | None:
    """Seconds from ``retry-after-ms`` or ``Retry-After`` (seconds), if present and numeric."""
    try:
        if headers.get("retry-after-ms"):
            return float(headers["retry-after-ms"]) / 1000.0
        if headers.get("retry-after"):
            return float(headers["retry-after"])
    except (TypeError, ValueError):
        return None
    return None


def _error_message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
    return str(getattr(exc, "message", exc))
