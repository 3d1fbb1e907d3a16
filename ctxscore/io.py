"""Reading files: the one JSONL reader (:func:`iter_jsonl`, plain or gzip) and conversations
(:func:`read_sessions`: JSONL with one message per line, a JSON array of messages, or the
evaluation's session JSONL with one ``{"session_id", "messages", ...}`` object per line).

``-`` is standard input; standard input, a pipe, a FIFO or another file that is not a regular file
(``/dev/stdin``, ``<(cmd)``) is read once, whole, so nothing it sends is lost.

Every error is an :class:`~ctxscore.errors.InputError` that names the file and line (or array
position) and says how to fix it.
"""

from __future__ import annotations

import gzip
import io
import json
import stat
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import InputError

#: Largest input file read, in bytes (1 GiB).
MAX_FILE_BYTES = 1 << 30


@dataclass
class Conversation:
    """One conversation read from a file.

    Attributes:
        session_id: the session's id (``None`` for a plain message file).
        messages: OpenAI-style message dicts, validated.
        extra: the other fields of a session line (``key_facts`` ...).
    """

    session_id: str | None
    messages: list[dict[str, Any]]
    extra: dict[str, Any] = field(default_factory=dict)


#: A value nested deeper than Python's JSON reader goes (about 1,000 levels, its recursion limit).
TOO_DEEP = ("the JSON nests arrays and objects too deeply to be read (Python's JSON reader stops near 1,000 "
            "levels); write a flatter value (one of that depth is likely a serialisation loop)")

#: The name standing for standard input.
STDIN = "-"


def _check_file(path: Path) -> int:
    """The file's size in bytes; an :class:`InputError` for a missing path, a folder or an unreadable file."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise InputError(f"{path}: file not found; pass an existing file (or - for standard input)") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read it ({exc.strerror})") from None
    if path.is_dir():
        raise InputError(f"{path}: is a folder, not a file; pass the path of a JSONL or JSON file")
    return st.st_size


def _is_stream(path: Path) -> bool:
    """``-`` or a path that is not a regular file (a pipe, a FIFO, ``/dev/stdin``): it can be read only once."""
    if str(path) == STDIN:
        return True
    _check_file(path)
    return not stat.S_ISREG(path.stat().st_mode)


def _read_stream(path: Path) -> bytes:
    """Every byte of standard input or a pipe, read once (an :class:`InputError` above :data:`MAX_FILE_BYTES`)."""
    try:
        if str(path) == STDIN:
            data = sys.stdin.buffer.read(MAX_FILE_BYTES + 1)
        else:
            with open(path, "rb") as fh:
                data = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise InputError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if len(data) > MAX_FILE_BYTES:
        raise InputError(f"{path}: more than {MAX_FILE_BYTES:,} bytes is above the limit; split the input")
    if path.suffix == ".gz":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise InputError(f"{path}: the gzip stream is damaged ({exc})") from None
    return data


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, Any]]:
    """Yield ``(line number, parsed JSON value)`` for every non-blank line of a JSONL file.

    Files ending in ``.gz`` are read through gzip. Lines are numbered from 1. ``-`` (standard input)
    and a pipe are read once, whole.

    Raises:
        InputError: a missing file or a folder, bytes that are not UTF-8, or a line that is not valid
            JSON; the message names the file and the line.
    """
    p = Path(path)
    if _is_stream(p):
        yield from _iter_lines(Path("<stdin>") if str(p) == STDIN else p, io.BytesIO(_read_stream(p)))
        return
    try:
        fh = gzip.open(p, "rb") if p.suffix == ".gz" else open(p, "rb")
    except OSError as exc:
        raise InputError(f"{p}: cannot read it ({exc.strerror})") from None
    yield from _iter_lines(p, fh)


def _iter_lines(p: Path, fh: Any) -> Iterator[tuple[int, Any]]:
    """:func:`iter_jsonl` over the open binary file ``fh`` (closed at the end), named ``p`` in errors."""
    n = 0
    with fh:
        try:
            for n, raw in enumerate(fh, 1):
                try:
                    line = raw.decode("utf-8-sig" if n == 1 else "utf-8")
                except UnicodeDecodeError as exc:
                    raise InputError(
                        f"{p}: line {n}: not valid UTF-8 ({exc.reason}); re-encode the file as UTF-8") from None
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise InputError(
                        f"{p}: line {n}: invalid JSON ({exc.msg} at column {exc.colno}); write one JSON value per line"
                    ) from None
                except RecursionError:
                    raise InputError(f"{p}: line {n}: {TOO_DEEP}") from None
                yield n, value
        except (OSError, EOFError, zlib.error) as exc:  # a damaged gzip stream
            raise InputError(f"{p}: line {n + 1}: the file is damaged ({exc})") from None


def _first_char(path: Path) -> str:
    """The first non-blank character of a regular text file ("" when empty)."""
    with open(path, "rb") as fh:
        head = fh.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    return head[:1].decode("ascii", "replace")


def _first_char_of(data: bytes) -> str:
    """The first non-blank character of bytes read from a stream ("" when empty)."""
    return data[:4096].lstrip(b"\xef\xbb\xbf \t\r\n")[:1].decode("ascii", "replace")


def _session_field(obj: dict[str, Any], key: str, where: str) -> str | None:
    """A session line's ``session_id`` or ``user``: ``None`` when absent or ``null`` (the caller falls back:
    the session to ``line<n>``, the user to the session id), an integer as its decimal string (``17`` ->
    ``"17"``), else a non-empty string of valid Unicode (an :class:`InputError` for a float, a boolean, an
    object or a list, which would become "1.5", "True" or "{'a': 1}", and for a lone surrogate)."""
    v = obj.get(key)
    if v is None:
        return None
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    if not isinstance(v, str) or not v.strip():
        raise InputError(f"{where}: {key!r} must be a non-empty string (or a whole number), got {json.dumps(v)[:60]}; "
                         f"write it as a string (\"{key}\": \"alice-1\") or leave it out")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(f"{where}: {key!r} holds a lone surrogate {v[exc.start]!r} at character {exc.start}, which is "
                         "not valid Unicode text; remove the character") from None
    return v


def _validate_messages(items: list[Any], where: list[str], src: str) -> list[dict[str, Any]]:
    """``items`` after checking them as one conversation (each a valid message, ids unique, every tool
    message after its call), each named in an error by ``where`` (its file and line); ``src`` (the
    file, or its line) names a conversation nested too deeply to be checked."""
    from .window.history import History  # noqa: PLC0415 - the window package imports this module
    from .window.ingest import validate  # noqa: PLC0415

    try:
        validate(items, History(), 0, where)
    except RecursionError:  # read, but too deep to be checked (the reader stops near 1,000 levels)
        raise InputError(f"{src}: {TOO_DEEP}") from None
    return items


def read_sessions(path: str | Path) -> list[Conversation]:
    """Read a conversation file in any of the accepted formats.

    Returns:
        One :class:`Conversation` for a message-per-line JSONL file or a JSON array of messages; one
        per line for the session JSONL format.

    Raises:
        InputError: missing file or a folder, a file above :data:`MAX_FILE_BYTES`, non-UTF-8 bytes,
            malformed JSON (with the line number), JSON nested too deeply to be read or checked (about
            1,000 levels), a line that is neither a message nor a session,
            an invalid message (unknown role, empty content, a lone surrogate ...), or no messages.
    """
    p = Path(path)
    stream = _read_stream(p) if _is_stream(p) else None  # a pipe is read once: its bytes cannot be read again
    if str(p) == STDIN:
        p = Path("<stdin>")
    if stream is None:
        size = _check_file(p)
        if size > MAX_FILE_BYTES:
            raise InputError(f"{p}: {size:,} bytes is above the {MAX_FILE_BYTES:,}-byte limit; split the file")
    if (_first_char(p) if stream is None else _first_char_of(stream)) == "[":
        try:
            data = json.loads((p.read_bytes() if stream is None else stream).decode("utf-8-sig"))
        except UnicodeDecodeError as exc:
            raise InputError(f"{p}: bytes at offset {exc.start} are not valid UTF-8 ({exc.reason}); "
                             "re-encode the file as UTF-8 (for example: iconv -f latin1 -t utf-8)") from None
        except json.JSONDecodeError as exc:
            raise InputError(f"{p}: line {exc.lineno}: invalid JSON array: {exc.msg}") from None
        except RecursionError:
            raise InputError(f"{p}: {TOO_DEEP}") from None
        if not data:
            raise InputError(f"{p}: the JSON array is empty; give at least one message")
        return [Conversation(None, _validate_messages(data, [f"{p}: message {i}" for i in range(len(data))], str(p)))]
    sessions: list[Conversation] = []
    loose: list[dict[str, Any]] = []
    lines: list[str] = []
    for lineno, obj in (iter_jsonl(p) if stream is None else _iter_lines(p, io.BytesIO(stream))):
        if not isinstance(obj, dict):
            raise InputError(f"{p}: line {lineno}: expected a JSON object, got {type(obj).__name__}")
        if "messages" in obj:
            if not isinstance(obj["messages"], list) or not obj["messages"]:
                raise InputError(f"{p}: line {lineno}: 'messages' must be a non-empty list")
            sid = _session_field(obj, "session_id", f"{p}: line {lineno}") or f"line{lineno}"
            user = _session_field(obj, "user", f"{p}: line {lineno} (session {sid})")
            msgs = _validate_messages(obj["messages"], [f"{p}: line {lineno} (session {sid}) message {i}"
                                                        for i in range(len(obj["messages"]))], f"{p}: line {lineno}")
            extra = {k: v for k, v in obj.items() if k not in ("session_id", "messages", "user")}
            sessions.append(Conversation(sid, msgs, extra if user is None else {**extra, "user": user}))
        else:
            loose.append(obj)
            lines.append(f"{p}: line {lineno}")
    if sessions and loose:
        raise InputError(f"{p}: mixes session lines and message lines; use one format per file")
    if loose:
        return [Conversation(None, _validate_messages(loose, lines, str(p)))]
    if not sessions:
        raise InputError(f"{p}: no messages found; the file is empty")
    return sessions
