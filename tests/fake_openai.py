"""A fake OpenAI-compatible server on loopback, for tests (stdlib only, no network).

``FakeOpenAI`` serves ``POST /v1/chat/completions`` (plain JSON, or server-sent events when the
request asks ``"stream": true``) and ``GET /v1/models`` on ``127.0.0.1`` at a free port, in a
background thread. Every request is recorded (``.requests``: path, headers with lower-case names, parsed body).

What it answers:

- by default, ``responder(body)``: a callable returning the assistant text, or a dict
  ``{"content": str | None, "tool_calls": [...], "refusal": str, "finish_reason": ...}``; the default echoes
  ``"echo: <last user text>"``;
- first, any scripted faults queued with :meth:`FakeOpenAI.push`, one per request, in order:
  ``{"status": 429, "headers": {...}}`` (an error status with an OpenAI error body),
  ``{"delay": 2.0}`` (sleep before answering: a client timeout), ``{"raw": b"..."}`` (this body with
  status 200: malformed JSON), ``{"reply": ...}`` (this reply instead of the responder's),
  ``{"close": True}`` (drop the connection without an answer), ``{"cut": True}`` (a stream that
  breaks off: the first event, then the connection dropped). ``headers`` may be a dict or a list
  of ``(name, value)`` pairs (a header sent several times).

Streams are sent with chunked transfer encoding: a role chunk, the content in pieces of
``chunk_chars`` characters, tool-call deltas (id and name first, then the arguments in pieces),
a finish chunk, a usage chunk when ``stream_options.include_usage`` is set, and ``data: [DONE]``.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Responder = Callable[[dict[str, Any]], "str | dict[str, Any]"]
#: The ``created`` time of every answer (fixed, so that two answers to one script are byte-identical).
CREATED = 1_700_000_000


def last_user_text(body: dict[str, Any]) -> str:
    """The text of the last user message of a chat request (text parts joined)."""
    for m in reversed(body.get("messages") or []):
        if m.get("role") == "user":
            c = m.get("content")
            if isinstance(c, list):
                return "\n".join(p.get("text", "") for p in c if isinstance(p, dict))
            return c or ""
    return ""


def echo(body: dict[str, Any]) -> str:
    """The default responder: ``echo: <last user text>``."""
    return "echo: " + last_user_text(body)


def _approx_tokens(text: str) -> int:
    return max(1, len(text) // 4)


class FakeOpenAI:
    """The fake server (see the module docstring). Use as a context manager or call start/stop.

    Args:
        responder: answers requests without a scripted fault.
        models: model ids listed by ``GET /v1/models``.
        chunk_chars: characters of content per streamed chunk.
        usage: include ``usage`` in answers (approximate token counts).
    """

    def __init__(self, responder: Responder | None = None, models: tuple[str, ...] = ("fake-model",),
                 chunk_chars: int = 7, usage: bool = True) -> None:
        self.responder = responder or echo
        self.models = models
        self.chunk_chars = chunk_chars
        self.usage = usage
        self.requests: list[dict[str, Any]] = []
        self.script: deque[dict[str, Any]] = deque()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ control
    @property
    def url(self) -> str:
        """The base URL, ``http://127.0.0.1:<port>/v1``."""
        assert self._server is not None, "start() the server first"
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def push(self, *faults: dict[str, Any]) -> None:
        """Queue scripted answers for the next requests, one each, in order."""
        with self._lock:
            self.script.extend(faults)

    def chat_requests(self) -> list[dict[str, Any]]:
        """The bodies of the chat-completions requests received so far."""
        with self._lock:
            return [r["body"] for r in self.requests if r["path"].endswith("/chat/completions")]

    def start(self) -> FakeOpenAI:
        fake = self

        class Handler(_Handler):
            owner = fake

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ answers
    def _next_fault(self) -> dict[str, Any] | None:
        with self._lock:
            return self.script.popleft() if self.script else None

    def _record(self, path: str, headers: dict[str, str], body: Any) -> None:
        with self._lock:
            self.requests.append({"path": path, "headers": headers, "body": body})


class _Handler(BaseHTTPRequestHandler):
    owner: FakeOpenAI
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence the access log
        pass

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no Nagle delay between writes

    def handle(self) -> None:
        try:
            super().handle()
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout test)
            pass

    # ------------------------------------------------------------------ helpers
    def _send_json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers.items() if isinstance(headers, dict) else headers or ():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    # ------------------------------------------------------------------ routes
    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.owner._record(self.path, {k.lower(): v for k, v in self.headers.items()}, None)
        if self.path.rstrip("/") == "/v1/models":
            self._send_json(200, {"object": "list", "data": [
                {"id": m, "object": "model", "created": 0, "owned_by": "fake"} for m in self.owner.models]})
        else:
            self._send_json(404, {"error": {"message": f"no route {self.path}", "type": "invalid_request_error"}})

    def do_POST(self) -> None:  # noqa: N802
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n)
        try:
            body = json.loads(raw)
        except ValueError:
            body = {"_raw": raw.decode("utf-8", "replace")}
        self.owner._record(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._send_json(404, {"error": {"message": f"no route {self.path}", "type": "invalid_request_error"}})
            return
        fault = self.owner._next_fault() or {}
        if fault.get("delay"):
            time.sleep(float(fault["delay"]))
        if fault.get("close"):
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        if "status" in fault:
            status = int(fault["status"])
            self._send_json(status, {"error": {"message": fault.get("message", f"fake error {status}"),
                                               "type": "rate_limit_error" if status == 429 else "server_error",
                                               "code": None}}, fault.get("headers"))
            return
        if "raw" in fault:
            data = fault["raw"] if isinstance(fault["raw"], bytes) else str(fault["raw"]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        try:
            reply = fault["reply"] if "reply" in fault else self.owner.responder(body)
        except Exception as exc:  # noqa: BLE001 - a broken responder is a test bug: say so in a 500
            self._send_json(500, {"error": {"message": f"fake responder failed: {exc!r}", "type": "server_error"}})
            return
        if isinstance(reply, str):
            reply = {"content": reply}
        if body.get("stream"):
            self._stream(body, reply, cut=bool(fault.get("cut")))
        else:
            self._complete(body, reply)

    def _usage(self, body: dict[str, Any], reply: dict[str, Any]) -> dict[str, int]:
        prompt = _approx_tokens(json.dumps(body.get("messages", []), ensure_ascii=False))
        completion = _approx_tokens((reply.get("content") or "") + json.dumps(reply.get("tool_calls") or []))
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _complete(self, body: dict[str, Any], reply: dict[str, Any]) -> None:
        msg: dict[str, Any] = {"role": "assistant", "content": reply.get("content")}
        if reply.get("refusal") is not None:
            msg["refusal"] = reply["refusal"]
        if reply.get("tool_calls"):
            msg["tool_calls"] = reply["tool_calls"]
        msg.update(reply.get("message_fields") or {})  # a provider's own fields (OpenRouter's reasoning_details)
        out: dict[str, Any] = {
            "id": "chatcmpl-fake", "object": "chat.completion", "created": CREATED,
            "model": body.get("model", "fake-model"),
            "choices": [{"index": 0, "message": msg,
                         "finish_reason": reply.get("finish_reason") or ("tool_calls" if reply.get("tool_calls") else "stop")}],
        }
        if self.owner.usage:
            out["usage"] = self._usage(body, reply)
        self._send_json(200, out)

    def _stream(self, body: dict[str, Any], reply: dict[str, Any], cut: bool = False) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": CREATED,
                "model": body.get("model", "fake-model")}

        def event(delta: dict[str, Any], finish: str | None = None) -> None:
            obj = dict(base, choices=[{"index": 0, "delta": delta, "finish_reason": finish}])
            self._chunk(b"data: " + json.dumps(obj).encode() + b"\n\n")

        event({"role": "assistant", "content": ""})
        if cut:  # the upstream dies mid-answer
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        text = reply.get("content") or ""
        k = self.owner.chunk_chars
        for i in range(0, len(text), k):
            event({"content": text[i:i + k]})
        refusal = reply.get("refusal") or ""
        for i in range(0, len(refusal), k):
            event({"refusal": refusal[i:i + k]})
        for j, call in enumerate(reply.get("tool_calls") or []):
            fn = call.get("function", {})
            event({"tool_calls": [{"index": j, "id": call.get("id"), "type": "function",
                                   "function": {"name": fn.get("name"), "arguments": ""}}]})
            args = fn.get("arguments", "")
            for i in range(0, len(args), k):
                event({"tool_calls": [{"index": j, "function": {"arguments": args[i:i + k]}}]})
        event({}, reply.get("finish_reason") or ("tool_calls" if reply.get("tool_calls") else "stop"))
        if self.owner.usage and (body.get("stream_options") or {}).get("include_usage"):
            obj = dict(base, choices=[], usage=self._usage(body, reply))
            self._chunk(b"data: " + json.dumps(obj).encode() + b"\n\n")
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")


def main() -> None:
    """``python tests/fake_openai.py [--port N]``: serve the echo responder until interrupted (prints the URL)."""
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    fake = FakeOpenAI()
    fake._server = ThreadingHTTPServer(("127.0.0.1", args.port), type("H", (_Handler,), {"owner": fake}))
    fake._server.daemon_threads = True
    print(fake.url, flush=True)
    try:
        fake._server.serve_forever(poll_interval=0.05)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
