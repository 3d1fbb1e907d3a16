"""Extractive compressors (no LLM): structured summary, aggressive compression, archive stub.

- :func:`structured_summary` (tier ``structured``, for ``key_state``): JSON tool output becomes compact
  ``key=value`` lines; prose keeps only the sentences that carry an entity (ID, number with unit,
  date, time, name, address, path ...) or a decision / confirmation / constraint word.
- :func:`aggressive_compress` (tier ``compressed``, for ``reasoning``): keeps the first sentence
  (the goal), the sentences with a conclusion marker and the last sentence; drops exploration.
- :func:`archive_stub` (tier ``archived``): ``[archived <id>: <first words> …]``.

Values are kept byte-exact: JSON numbers keep their original spelling (``12.50``, ``1e3``),
literals keep JSON's (``true``, ``false``), and filler is removed only as whole words ("Okay, ..."
but never "Okayama"). :class:`ExtractiveCompressor` is the default :class:`~ctxscore.compress.base.Compressor`;
:func:`compress` is its verified form (:func:`~ctxscore.compress.base.compress_verified`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..messages import Tier
from ..scoring.rules import RuleConfig, default_config, entity_spans
from .base import CompressionResult, compress_verified

_SENT_SPLIT = re.compile(r"(?<=[.!?。！？；;])\s+|(?<=[。！？；])|\n+")
# Filler words at the start of a sentence, removed only as whole words: an ASCII word must not be
# followed by a letter or digit ("Okayama", "Thanksgiving" stay whole), a Chinese one must be
# followed by punctuation or a space.
_LEAD_FILLER = re.compile(
    r"^(?:(?:(?:sure|great|okay|ok|alright|certainly|of course|absolutely|perfect|thanks|thank you|got it)"
    r"(?![\w])|(?:好的|好|嗯|收到)(?=[,!.，！。\s]|$))[,!.，！。\s]*)+",
    re.IGNORECASE,
)
#: JSON nested deeper than this is summarised as text, not flattened.
MAX_JSON_DEPTH = 32
_WS = re.compile(r"[ \t]+")


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENT_SPLIT.split(text) if s and s.strip()]


class _Raw(str):
    """A JSON number kept as the text it was written as (``12.50`` stays ``12.50``)."""


class _TooDeep(Exception):
    pass


def _scalar(v: Any) -> str:
    """A JSON scalar as JSON spells it: numbers as written, ``true`` / ``false``, strings as they are."""
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _flatten_json(obj: object, prefix: str = "", depth: int = 0) -> list[str]:
    """``key=value`` lines for the scalar leaves of a JSON value; nulls and empty values dropped.

    Raises:
        _TooDeep: nesting deeper than :data:`MAX_JSON_DEPTH`.
    """
    if depth > MAX_JSON_DEPTH:
        raise _TooDeep
    out: list[str] = []
    head = prefix.rstrip(".") + ": " if prefix else ""
    if isinstance(obj, dict):
        scalars = []
        for k, v in obj.items():
            if v is None or v == "" or v == [] or v == {}:
                continue
            if isinstance(v, dict | list):
                out.extend(_flatten_json(v, f"{prefix}{k}.", depth + 1))
            else:
                scalars.append(f"{k}={_scalar(v)}")
        if scalars:
            out.insert(0, head + "; ".join(scalars))
    elif isinstance(obj, list):
        if all(not isinstance(v, dict | list) for v in obj):
            vals = [_scalar(v) for v in obj if v is not None and v != ""]
            if vals:
                out.append(head + ", ".join(vals))
        else:
            for i, v in enumerate(obj):
                out.extend(_flatten_json(v, f"{prefix}{i}.", depth + 1))
    elif obj is not None and obj != "":
        out.append(head + _scalar(obj))
    return out


def _parse_json(text: str) -> object | None:
    """The JSON value of ``text`` with numbers kept as written, or ``None`` (not JSON, or too deep to parse)."""
    t = text.strip()
    if not t or t[0] not in "[{":
        return None
    try:
        return json.loads(t, parse_float=_Raw, parse_int=_Raw, parse_constant=_Raw)
    except (ValueError, RecursionError):
        return None


def structured_summary(text: str, config: RuleConfig | None = None, spans: list[tuple[int, int]] | None = None) -> str:
    """Structured summary of a ``key_state`` message.

    Args:
        text: the message content.
        config: rule file for entity patterns and keywords (default: the packaged one).
        spans: the text's entity spans if already computed (:func:`ctxscore.rules.entity_spans`).

    Returns:
        For JSON content, ``key=value`` lines of its non-empty leaves (nested keys joined with ``.``);
        otherwise the sentences that carry an entity or a decision / confirmation / constraint word,
        one per line with leading filler ("Sure, ...", "好的，") removed. Empty if nothing qualifies.
    """
    cfg = config or default_config()
    data = _parse_json(text)
    if data is not None:
        try:
            return "\n".join(_flatten_json(data))
        except _TooDeep:
            pass  # summarised as text below
    kw = cfg.keyword_regexes
    keep_rx = [kw[g] for g in ("decision", "confirmation", "constraint", "hard_constraint") if g in kw]
    starts = [s for s, _ in (entity_spans(text, cfg) if spans is None else spans)]
    lines = []
    pos = 0
    j = 0
    for m in _SENT_SPLIT.finditer(text + "\n"):
        lo, hi = pos, m.start()
        pos = m.end()
        sent = text[lo:hi].strip()
        if not sent:
            continue
        while j < len(starts) and starts[j] < lo:
            j += 1
        has_entity = j < len(starts) and starts[j] < hi
        if has_entity or any(rx.search(sent) for rx in keep_rx):
            sent = _LEAD_FILLER.sub("", sent).strip()
            if sent:
                lines.append(_WS.sub(" ", sent))
    return "\n".join(lines)


def aggressive_compress(text: str, config: RuleConfig | None = None, max_sentences: int = 6) -> str:
    """Aggressive extractive compression of a ``reasoning`` message.

    Keeps the first sentence, sentences with a conclusion marker (the rule file's ``conclusion``
    keywords: "so", "therefore", "the issue is", 所以, 因此 ...) and the last sentence, at most
    ``max_sentences`` in all (the earliest conclusions are dropped first); code blocks are dropped.
    """
    cfg = config or default_config()
    body = re.sub(r"```.*?```", " ", text, flags=re.DOTALL)
    sents = _sentences(body)
    if len(sents) <= 2:
        return "\n".join(sents)
    concl = cfg.keyword_regexes.get("conclusion")
    middle = [s for s in sents[1:-1] if concl is not None and concl.search(s)]
    budget = max(0, max_sentences - 2)
    middle = middle[-budget:] if budget else []
    return "\n".join([sents[0], *middle, sents[-1]])


def archive_stub(message_id: str, text: str, words: int = 8) -> str:
    """One-line stub for an archived message: ``[archived <id>: <first words> …]``.

    ``words`` counts whitespace-separated words; for text without spaces (Chinese) the first
    ``3 * words`` characters are used.
    """
    flat = " ".join(text.split())
    parts = flat.split(" ")
    head = " ".join(parts[:words]) if len(parts) > 1 else flat
    if len(head) > 6 * words:
        head = head[: 3 * words]
    return f"[archived {message_id}: {head} …]"


class ExtractiveCompressor:
    """The default compressor (no LLM): :func:`structured_summary` and :func:`aggressive_compress`.

    Args:
        config: rule file for entity patterns and keywords (default: packaged).
    """

    def __init__(self, config: RuleConfig | None = None) -> None:
        self.config = config or default_config()

    def compress(self, text: str, tier: Tier) -> str | None:
        """The unverified form of ``text`` for ``tier`` (see :class:`~ctxscore.compress.base.Compressor`)."""
        if tier == Tier.STRUCTURED:
            return structured_summary(text, self.config)
        if tier == Tier.COMPRESSED:
            return aggressive_compress(text, self.config)
        return None


def compress(text: str, tier: str, config: RuleConfig | None = None) -> CompressionResult:
    """Verified extractive compression of ``text`` to ``tier`` (``structured`` or ``compressed``),
    falling back to a gentler tier when a form would lose a key span or invent one
    (:func:`~ctxscore.compress.base.compress_verified` with :class:`ExtractiveCompressor`).

    Raises:
        ValueError: ``tier`` is not one of the two compressing tiers.
    """
    return compress_verified(ExtractiveCompressor(config), text, tier, config=config)
