"""Extractive compressors (no LLM): structured summary, aggressive compression, archive stub.

- :func:`structured_summary` (tier ``structured``, for ``key_state``): JSON tool output becomes compact
  ``key=value`` lines; prose keeps only the sentences that carry an entity (ID, number with unit,
  date, time, name, address, path ...) or a decision / confirmation / constraint word.
- :func:`aggressive_compress` (tier ``compressed``, for ``reasoning``): keeps the first sentence
  (the goal), the sentences with a conclusion marker and the last sentence; drops exploration.
- :func:`archive_stub` (tier ``archived``): ``[archived <id>: <first words> …]``.

:func:`compress` runs a compressor and verifies the result: every entity detected in the original
must appear in the output, else it falls back to the next gentler tier (compressed -> structured ->
verbatim). The result says which tier was reached and which entities were missing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from ..messages import Tier
from ..scoring.rules import RuleConfig, default_config, entity_spans

_SENT_SPLIT = re.compile(r"(?<=[.!?。！？；;])\s+|(?<=[。！？；])|\n+")
_LEAD_FILLER = re.compile(
    r"^(?:(?:sure|great|okay|ok|alright|certainly|of course|absolutely|perfect|thanks|thank you|got it|好的|好|嗯|收到)[,!.，！。\s]*)+",
    re.IGNORECASE,
)
_WS = re.compile(r"[ \t]+")


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENT_SPLIT.split(text) if s and s.strip()]


def _flatten_json(obj: object, prefix: str = "") -> list[str]:
    """``key=value`` lines for the scalar leaves of a JSON value; nulls and empty values dropped."""
    out: list[str] = []
    if isinstance(obj, dict):
        scalars = []
        for k, v in obj.items():
            if v is None or v == "" or v == [] or v == {}:
                continue
            if isinstance(v, dict | list):
                out.extend(_flatten_json(v, f"{prefix}{k}."))
            else:
                scalars.append(f"{k}={v}")
        if scalars:
            out.insert(0, (prefix.rstrip(".") + ": " if prefix else "") + "; ".join(scalars))
    elif isinstance(obj, list):
        if all(not isinstance(v, dict | list) for v in obj):
            vals = [str(v) for v in obj if v is not None and v != ""]
            if vals:
                out.append((prefix.rstrip(".") + ": " if prefix else "") + ", ".join(vals))
        else:
            for i, v in enumerate(obj):
                out.extend(_flatten_json(v, f"{prefix}{i}."))
    elif obj is not None and obj != "":
        out.append((prefix.rstrip(".") + ": " if prefix else "") + str(obj))
    return out


def _parse_json(text: str) -> object | None:
    t = text.strip()
    if not t or t[0] not in "[{":
        return None
    try:
        return json.loads(t)
    except ValueError:
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
        return "\n".join(_flatten_json(data))
    kw = cfg.keyword_regexes
    keep_rx = [kw[g] for g in ("decision", "confirmation", "constraint") if g in kw]
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


@dataclass(slots=True)
class CompressionResult:
    """Outcome of :func:`compress`.

    Attributes:
        tier: the tier actually reached (may be gentler than requested).
        text: the content to place in the window (the original when ``tier`` is verbatim).
        missing: entities of the original absent from the rejected stronger form(s), for diagnostics.
    """

    tier: str
    text: str
    missing: list[str] = field(default_factory=list)


_QUOTES = "\"'`“”「」《》‘’"


def _missing(entities: list[str], out: str) -> list[str]:
    """Entities (compared without surrounding quotes) that do not occur in ``out``."""
    return [e for e in entities if (e.strip(_QUOTES) or e) not in out]


def compress(text: str, tier: str, config: RuleConfig | None = None, entities: list[str] | None = None) -> CompressionResult:
    """Compress ``text`` to ``tier`` (``structured`` or ``compressed``), verified.

    The output must contain every entity detected in the original and be shorter than it; otherwise
    the next gentler tier is tried (compressed -> structured -> verbatim).

    Args:
        text: the original content.
        tier: ``"structured"`` or ``"compressed"``.
        config: rule file (default: packaged).
        entities: the original's entities if already known.

    Raises:
        ValueError: ``tier`` is not one of the two compressing tiers.
    """
    if tier not in (Tier.STRUCTURED, Tier.COMPRESSED):
        raise ValueError(f"compress() takes tier 'structured' or 'compressed', got {tier!r}")
    cfg = config or default_config()
    spans = entity_spans(text, cfg)
    ents = list(dict.fromkeys(text[a:b].strip() for a, b in spans)) if entities is None else entities
    missing: list[str] = []
    if tier == Tier.COMPRESSED:
        out = aggressive_compress(text, cfg)
        miss = _missing(ents, out)
        if out and not miss and len(out) < len(text):
            return CompressionResult(Tier.COMPRESSED, out)
        missing = miss
    out = structured_summary(text, cfg, spans)
    miss = _missing(ents, out)
    if out and not miss and len(out) < len(text):
        return CompressionResult(Tier.STRUCTURED, out, missing)
    return CompressionResult(Tier.VERBATIM, text, missing or miss)
