"""Key facts for the evaluation sessions: records, value filters and text search.

A key fact is ``{"fact_id", "value", "source_index", "probe", "kind", "superseded"?}`` where
``value`` is an exact substring of ``messages[source_index]["content"]`` (the eval contract in
``docs/contracts.md``). Indices are positions in the session the fact was built for; chaining
shifts them (:mod:`training.data.chain`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from .schema import MessageRecord

#: Values that are too generic to probe (their text is present almost anywhere).
TRIVIAL_VALUES = frozenset(
    {"true", "false", "yes", "no", "none", "dontcare", "don't care", "dont care", "not mentioned", "?",
     "any", "free", "是", "否", "无", "有"}
)


def usable_value(value: Any, language: str = "en") -> str | None:
    """``value`` as a probe-able string, or ``None`` when it is empty or too generic.

    Kept: strings and numbers whose text has at least 3 characters (2 for Chinese) and is not in
    :data:`TRIVIAL_VALUES`; pure numbers need at least 3 digits (``"2"`` people matches any text).
    """
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        value = str(value)
    if not isinstance(value, str):
        return None
    v = value.strip()
    if v.casefold() in TRIVIAL_VALUES:
        return None
    min_len = 2 if language == "zh" else 3
    if len(v) < min_len:
        return None
    if re.fullmatch(r"[\d.,]+", v) and len(re.sub(r"\D", "", v)) < 3:
        return None
    return v


def _word_pattern(value: str, ignore_case: bool = True) -> re.Pattern[str]:
    # word boundaries only where the value itself starts/ends with a word character
    left = r"(?<!\w)" if re.match(r"\w", value) else ""
    right = r"(?!\w)" if re.search(r"\w$", value) else ""
    return re.compile(left + re.escape(value) + right, re.IGNORECASE if ignore_case else 0)


def find_value(
    messages: Sequence[MessageRecord],
    value: str,
    *,
    language: str = "en",
    start: int = 0,
    stop: int | None = None,
    roles: tuple[str, ...] | None = None,
    ignore_case: bool = True,
) -> tuple[int, str] | None:
    """Earliest message (position in ``messages``) whose content mentions ``value``.

    English: whole-word match (``"east"`` does not match ``"feast"``), case-insensitive unless
    ``ignore_case`` is false; the returned string is the content's own substring, so it keeps the
    content's casing. Chinese: plain case-sensitive substring (no word boundaries in Chinese).
    Returns ``(position, exact substring)`` or ``None``.
    """
    stop = len(messages) if stop is None else min(stop, len(messages))
    pat = None if language == "zh" else _word_pattern(value, ignore_case)
    for pos in range(max(start, 0), stop):
        msg = messages[pos]
        if roles is not None and msg["role"] not in roles:
            continue
        content = msg["content"] or ""
        if pat is None:
            if value in content:
                return pos, value
            continue
        m = pat.search(content)
        if m:
            return pos, m.group(0)
    return None


def make_fact(
    fact_id: str,
    value: str,
    source_index: int,
    probe: str,
    kind: str,
    superseded: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A key-fact record (``superseded`` only when given)."""
    fact: dict[str, Any] = {
        "fact_id": fact_id,
        "value": value,
        "source_index": source_index,
        "probe": probe,
        "kind": kind,
    }
    if superseded:
        fact["superseded"] = superseded
    fact.update(extra)
    return fact


def overlaps(seen: set[tuple[int, str]], hit: tuple[int, str]) -> bool:
    """True when ``seen`` (``(source_index, value)`` pairs already used) holds a value from the same
    message that contains ``hit``'s value or is contained in it (case-insensitive)."""
    v = hit[1].casefold()
    return any(i == hit[0] and (s.casefold() in v or v in s.casefold()) for i, s in seen)


def check_facts(messages: Sequence[dict[str, Any]], facts: Sequence[dict[str, Any]]) -> list[str]:
    """Problems with ``facts`` against ``messages`` (empty list when all hold): index in range and
    ``value`` an exact substring of that message's ``content``; fact ids unique."""
    problems: list[str] = []
    seen: set[str] = set()
    for f in facts:
        i = f.get("source_index")
        if f["fact_id"] in seen:
            problems.append(f"duplicate fact_id {f['fact_id']}")
        seen.add(f["fact_id"])
        if not isinstance(i, int) or not 0 <= i < len(messages):
            problems.append(f"{f['fact_id']}: source_index {i} out of range 0..{len(messages) - 1}")
            continue
        if f["value"] not in (messages[i].get("content") or ""):
            problems.append(f"{f['fact_id']}: value {f['value']!r} not in content of message {i}")
    return problems


def humanize(name: str) -> str:
    """``"restaurant_name"`` -> ``"restaurant name"``; ``"ReserveRestaurant"`` -> ``"reserve restaurant"``;
    ``"Restaurants_2"`` -> ``"restaurants"``."""
    name = re.sub(r"_\d+$", "", name)
    name = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", name)
    return name.replace("_", " ").strip().lower()
