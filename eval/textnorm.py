"""Normalised text presence, the recall check of the evaluation.

A fact counts as present in a window when its normalised value is a substring of the normalised
text of the window's messages. Normalisation: Unicode NFKC, casefold, every run of whitespace
collapsed to one space, stripped (so full-width digits, case and line breaks do not matter). The
text of a message is its content plus its rendered tool calls (:func:`message_search_text`); the
session validator (:mod:`eval.sessions`) checks fact values against the same text.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable
from typing import Any

_WS = re.compile(r"\s+")


def normalize(text: str) -> str:
    """NFKC + casefold + collapsed whitespace, stripped. ``"  A\\n  B "`` -> ``"a b"``."""
    return _WS.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


def message_search_text(message: dict[str, Any]) -> str:
    """Text in which a fact value may be found: content plus rendered tool calls.

    Tool calls are rendered as ``name(arguments)``, and the decoded argument values are appended
    (so a value written with JSON escapes, e.g. non-ASCII, still matches).
    """
    content = message.get("content")
    if isinstance(content, list):
        content = "\n".join(
            p.get("text", "") if isinstance(p, dict) else str(p) for p in content if isinstance(p, dict | str)
        )
    parts = [content if isinstance(content, str) else ""]
    for call in message.get("tool_calls") or []:
        if not isinstance(call, dict):
            continue
        fn = call.get("function") or {}
        args = fn.get("arguments", "")
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        parts.append(f"{fn.get('name', '')}({args})")
        try:
            decoded = json.loads(args)
        except (TypeError, ValueError):
            continue
        parts.append(json.dumps(decoded, ensure_ascii=False))
    return "\n".join(parts)


def window_text(messages: Iterable[dict[str, Any]]) -> str:
    """Normalised text of a window: each message's content and tool calls, joined by a separator.

    The separator (``" \\x00 "``) keeps a value from matching across two messages.
    """
    return " \x00 ".join(normalize(message_search_text(m)) for m in messages)


def present(value: str, normalized_window: str) -> bool:
    """Whether ``value`` (raw) occurs in an already normalised window text."""
    nv = normalize(value)
    return bool(nv) and nv in normalized_window
