"""Normalised text presence, the recall check of the evaluation.

A fact counts as present in a window when its normalised value is a substring of the normalised
text of the window's messages. Normalisation: Unicode NFKC, casefold, every run of whitespace
collapsed to one space, stripped (so full-width digits, case and line breaks do not matter).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from typing import Any

from .sessions import message_search_text

_WS = re.compile(r"\s+")


def normalize(text: str) -> str:
    """NFKC + casefold + collapsed whitespace, stripped. ``"  A\\n  B "`` -> ``"a b"``."""
    return _WS.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


def window_text(messages: Iterable[dict[str, Any]]) -> str:
    """Normalised text of a window: each message's content and tool calls, joined by a separator.

    The separator (``" \\x00 "``) keeps a value from matching across two messages.
    """
    return " \x00 ".join(normalize(message_search_text(m)) for m in messages)


def present(value: str, normalized_window: str) -> bool:
    """Whether ``value`` (raw) occurs in an already normalised window text."""
    nv = normalize(value)
    return bool(nv) and nv in normalized_window
