"""The OpenAI-compatible proxy (extra ``serve``): ``ctxscore serve --upstream URL --budget N``.

:func:`create_app` builds the FastAPI app (:mod:`ctxscore.serve.app` describes what it does),
:func:`run` serves it with uvicorn in the foreground, :class:`Background` in a thread (tests,
notebooks). Importing this package without FastAPI, uvicorn or aiohttp raises :class:`ImportError` with
the install hint (``pip install 'ctxscore[serve]'``).
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from .._optional import require
from .app import Proxy, SessionStats, create_app, derive_session_id, error_body, normalize_message

uvicorn = require("uvicorn", "serve", "ctxscore.serve")

__all__ = ["Background", "Proxy", "SessionStats", "create_app", "derive_session_id", "error_body",
           "normalize_message", "run"]


#: The cyclic garbage collector's thresholds in a serving process (``gc.set_threshold``; Python's
#: default is 700, 10, 10). A proxy holds every live session's history (hundreds of thousands of
#: objects): with the defaults a full collection walks them all every few hundred requests and
#: stalls every request in flight for about 0.1 s (measured on 600-message sessions); with these,
#: a young collection comes after 20,000 net allocations instead of 700 and a full one after at
#: most 2,500 young ones instead of 100.
GC_THRESHOLDS = (20_000, 50, 50)


def run(app: Any, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
    """Serve ``app`` with uvicorn until interrupted (this process's collector set to :data:`GC_THRESHOLDS`,
    what is loaded by then frozen out of its collections)."""
    import gc  # noqa: PLC0415

    gc.collect()
    gc.freeze()  # modules, the scorer and its models: never garbage, never walked again
    gc.set_threshold(*GC_THRESHOLDS)
    uvicorn.run(app, host=host, port=port, log_level=log_level)


class Background:
    """Serve an ASGI app with uvicorn in a daemon thread (``port=0``: a free port).

    Use as a context manager; :attr:`url` is ``http://host:port``.

    Raises:
        RuntimeError: the server did not start within ``start_timeout`` seconds.
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, start_timeout: float = 10.0) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.host, self.port = host, self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.start_timeout = start_timeout

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> Background:
        self.thread.start()
        deadline = time.monotonic() + self.start_timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server on {self.url} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()

    def __enter__(self) -> Background:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
