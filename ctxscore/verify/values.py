"""Values the verifier compares, normalised so that differently written equal values match.

:func:`values_in` reads the values of a text by group:

======  =========================================================  ===================
group   found from                                                 normal form
======  =========================================================  ===================
date    ISO, ``5/20/2024``, ``May 20``, ``2nd of March``, 3月5日  ``05-20``
        weekdays and relative dates (tomorrow, 明天)                ``rel:friday``
time    ``7pm``, ``7:30 pm``, ``19:30``, 下午3点, 3点半             ``19:00`` (24 h)
money   ``$620``, ``620 dollars``, ``620元``                       ``620`` (``54.50`` -> ``54.5``)
people  ``4 people``, ``four passengers``, 2个人, 3位               ``4``
place   a capitalised name after to / from / in / at, 去上海        ``seattle``
id      mixed ids, long numbers, emails                            lower case, no ``#``
======  =========================================================  ===================

:func:`call_values` reads the arguments of a tool call: an argument's key names its group
(``date``, ``departure_time``, ``destination``, ``passengers``, ``price`` ...), other string
arguments are read as text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace

from ..messages import ToolCall
from ..scoring.rules import RuleConfig, default_config, typed_entity_spans

GROUPS = ("date", "time", "money", "people", "place", "id")
_MONTHS = {m: i + 1 for i, m in enumerate(
    ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"])}
_NUMBER_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
                 "ten": 10, "a couple of": 2, "一": 1, "两": 2, "二": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8,
                 "九": 9, "十": 10}
_DATE_KINDS = frozenset({"datetime_iso", "date_slash", "date_words", "date_zh", "weekday"})
_TIME_KINDS = frozenset({"time", "time_zh"})
_ID_KINDS = frozenset({"id_mixed", "long_number", "email"})
_ISO_DATETIME = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2})(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?")
_CJK_CHAR = re.compile(r"[\u4e00-\u9fff]")
_GLUED_ID = re.compile(r"(?<![A-Za-z0-9_])(?=[A-Za-z0-9_-]*\d)(?=[A-Za-z0-9_-]*[A-Za-z])[A-Za-z0-9][A-Za-z0-9_-]{3,}(?![A-Za-z0-9_])"
                       r"|(?<!\d)\d{8,}(?!\d)")
_SLASH = re.compile(r"\b(\d{1,2})/(\d{1,2})/(\d{2,4})\b")
_PEOPLE = re.compile(r"(?i)\b(\d+|one|two|three|four|five|six|seven|eight|nine|ten|a couple of)\s+(?:people|persons?|"
                     r"adults?|guests?|passengers?|travell?ers|tickets?|seats?)\b|([0-9一两二三四五六七八九十]+)\s*(?:个人|位|人|张票)")
_PLACE = re.compile(r"\b(?:to|from|in|at|into|towards|near)\s+((?-i:[A-Z][a-z]+(?:[ -](?:[A-Z][a-z]+|de|la))*))")
_PLACE_ZH = re.compile(r"(?:去|到|飞往|飞|前往|从)([\u4e00-\u9fff]{2,3}?)(?=的|，|,|。|出发|玩|旅|市|$|\s)")
_NOT_PLACE = frozenset("I Me My The This That Monday Tuesday Wednesday Thursday Friday Saturday Sunday January February "
                       "March April May June July August September October November December Economy Business First "
                       "Basic Gold Silver Platinum".split())
#: Arguments whose dates and times are no part of the task's goal (a passenger's birth date ...).
_NOT_GOAL_KEY = re.compile(r"(?i)birth|dob|born|expir|created|updated|modified|timestamp")
_KEY_GROUPS = (
    ("date", re.compile(r"(?i)date|day|check_?in|check_?out|^when$|日期")),
    ("time", re.compile(r"(?i)time|hour|时间")),
    ("money", re.compile(r"(?i)price|amount|cost|total|fare|budget|fee|refund|(?:^|_)rate$|价格|金额|预算")),
    ("people", re.compile(r"(?i)passengers?|people|guests?|party|adults?|travell?ers|num_|number_of|count|tickets?|seats?|人数")),
    ("place", re.compile(r"(?i)^(?:to|from|origin|destination|dest|city|location|where|departure|arrival|source|target)"
                         r"(?:_city|_airport|_location)?$|目的地|出发地|城市")),
)


@dataclass(frozen=True, slots=True)
class Value:
    """One value: its group, its normal form, the text it was read from (byte-exact) and, for a time
    without am / pm (``6点``, ``7:30``), the other reading twelve hours later (``alt``)."""

    group: str
    norm: str
    text: str
    alt: str = ""
    key: str = ""  #: the tool-call argument it came from, if any

    @property
    def norms(self) -> tuple[str, ...]:
        """Every reading of the value."""
        return (self.norm, self.alt) if self.alt else (self.norm,)


def num(s: str) -> str:
    """``54.50`` -> ``54.5``, ``1,200`` -> ``1200`` (money and counts compare as numbers)."""
    s = s.replace(",", "").strip()
    try:
        f = float(s)
    except ValueError:
        return s
    return str(int(f)) if f == int(f) else repr(f)


def norm_date(text: str) -> str | None:
    """``MM-DD`` of a date text, ``rel:<word>`` for a weekday or a relative date, or ``None``."""
    t = text.strip().lower()
    m = re.match(r"(\d{4})-(\d{2})-(\d{2})", t)
    if m:
        return f"{m.group(2)}-{m.group(3)}"
    m = _SLASH.match(t)
    if m:
        return f"{int(m.group(1)):02d}-{int(m.group(2)):02d}"
    m = re.search(r"(\d{1,2})月(\d{1,2})", t)
    if m:
        return f"{int(m.group(1)):02d}-{int(m.group(2)):02d}"
    month = next((v for k, v in _MONTHS.items() if re.search(rf"\b{k}", t)), None)
    day = re.search(r"\b(\d{1,2})(?:st|nd|rd|th)?\b", t)
    if month and day:
        return f"{month:02d}-{int(day.group(1)):02d}"
    if re.search(r"day|tomorrow|tonight|today|周|星期|天", t):
        return "rel:" + " ".join(t.split())
    return None


def norm_time(text: str) -> str | None:
    """``HH:MM`` (24 h) of a time text, or ``None``."""
    t = text.strip().lower().replace(".", "")
    m = re.search(r"(\d{1,2})(?:[:：点](\d{1,2}))?", t)
    if not m:
        return None
    h, mi = int(m.group(1)), int(m.group(2) or 0)
    if "半" in t:
        mi = 30
    if re.search(r"pm|下午|晚上|傍晚", t) and h < 12:
        h += 12
    if re.search(r"am", t) and h == 12:
        h = 0
    return f"{h:02d}:{mi:02d}" if h < 24 and mi < 60 else None


def time_value(text: str) -> Value | None:
    """The time of ``text``; without am / pm (or 上午 / 下午 ...) an hour from 1 to 12 has both readings."""
    n = norm_time(text)
    if n is None:
        return None
    h = int(n[:2])
    marked = re.search(r"(?i)[ap]\.?m|上午|下午|晚上|傍晚|早上|凌晨|中午", text)
    alt = f"{(h + 12) % 24:02d}{n[2:]}" if not marked and 1 <= h <= 12 else ""
    return Value("time", n, text, alt)


def _span_value(text: str, kind: str) -> Value | None:
    if kind in _DATE_KINDS:
        n = norm_date(text)
        return Value("date", n, text) if n else None
    if kind in _TIME_KINDS:
        return time_value(text)
    if kind == "money":
        m = re.search(r"\d[\d,]*(?:\.\d+)?", text)
        return Value("money", num(m.group(0)), text) if m else None
    if kind in _ID_KINDS:
        return Value("id", text.lower().lstrip("#"), text)
    return None


def values_in(text: str, config: RuleConfig | None = None) -> list[Value]:
    """The values of ``text`` (module docstring), in order of appearance, without repeats."""
    cfg = config or default_config()
    out: dict[tuple[str, str], Value] = {}
    for m in _ISO_DATETIME.finditer(text):  # 2025-09-08T06:00:00+08:00: a date and a time, not the offset
        out.setdefault(("date", f"{m.group(2)}-{m.group(3)}"), Value("date", f"{m.group(2)}-{m.group(3)}", m.group(0)))
        out.setdefault(("time", f"{m.group(4)}:{m.group(5)}"), Value("time", f"{m.group(4)}:{m.group(5)}", m.group(0)))
    if out:
        text = _ISO_DATETIME.sub(" ", text)
    for m in _SLASH.finditer(text):
        n = norm_date(m.group(0))
        if n:
            out.setdefault(("date", n), Value("date", n, m.group(0)))
    for s, e, kind in typed_entity_spans(text, cfg):
        if kind == "quoted" and e - s > 3:  # a quoted string hides the values inside it from the entity scan
            for s2, e2, k2 in typed_entity_spans(text[s + 1: e - 1], cfg):
                v = _span_value(text[s + 1 + s2: s + 1 + e2], k2)
                if v is not None:
                    out.setdefault((v.group, v.norm), v)
            continue
        v = _span_value(text[s:e], kind)
        if v is not None:
            out.setdefault((v.group, v.norm), v)
    if _CJK_CHAR.search(text):  # ids glued to Chinese text (确认号KJ20250611) escape the entity patterns' \\b
        for m in _GLUED_ID.finditer(text):
            out.setdefault(("id", m.group(0).lower()), Value("id", m.group(0).lower(), m.group(0)))
    for m in _PEOPLE.finditer(text):
        raw = (m.group(1) or m.group(2) or "").lower()
        n = str(_NUMBER_WORDS.get(raw, raw)) if not raw.isdigit() else str(int(raw))
        if n.isdigit():
            out.setdefault(("people", n), Value("people", n, m.group(0)))
    for rx in (_PLACE, _PLACE_ZH):
        for m in rx.finditer(text):
            name = m.group(1)
            if name.split()[0] not in _NOT_PLACE:
                out.setdefault(("place", name.lower()), Value("place", name.lower(), name))
    return list(out.values())


def _arg_value(key: str, value: object, cfg: RuleConfig) -> list[Value]:
    text = str(value)
    for group, rx in _KEY_GROUPS:
        if not rx.search(key):
            continue
        if group == "date" and not _ISO_DATETIME.search(text) and (n := norm_date(text)):
            return [Value("date", n, text)]
        if group == "time" and not _ISO_DATETIME.search(text) and (tv := time_value(text)):
            return [tv]
        if group in ("money", "people") and re.fullmatch(r"\s*\d[\d,]*(?:\.\d+)?\s*", text):
            return [Value(group, num(text), text)]
        if group == "place" and isinstance(value, str) and 2 <= len(text) <= 40 and not re.fullmatch(r"[A-Z]{3}", text) \
                and not re.search(r"\d", text):
            return [Value("place", text.lower(), text)]
    return values_in(text, cfg) if isinstance(value, str) else []


def _leaves(obj: object, prefix: str = "", depth: int = 0) -> list[tuple[str, object]]:
    if depth > 4:
        return []
    if isinstance(obj, dict):
        return [x for k, v in obj.items() for x in _leaves(v, str(k), depth + 1)]
    if isinstance(obj, list):
        return [x for v in obj for x in _leaves(v, prefix, depth + 1)]
    return [(prefix, obj)]


def call_values(call: ToolCall, config: RuleConfig | None = None) -> list[Value]:
    """The values of a tool call's arguments (module docstring); unparsable arguments are read as text."""
    cfg = config or default_config()
    try:
        args = json.loads(call.arguments) if call.arguments.strip() else {}
    except ValueError:
        return values_in(call.arguments, cfg)
    out: dict[tuple[str, str], Value] = {}
    for key, v in _leaves(args):
        if v is None or isinstance(v, bool) or _NOT_GOAL_KEY.search(key):
            continue
        for val in _arg_value(key, v, cfg):
            out.setdefault((val.group, val.norm), replace(val, key=key))
    return list(out.values())


#: Argument names of bounds ("earliest", "not_after", "max_price"): the value limits a search, it is no goal value.
BOUND_KEY = re.compile(r"(?i)earliest|latest|not_(?:after|before)|^(?:after|before|until|since)$|_(?:after|before)$|"
                       r"^(?:min|max)_|_(?:min|max)$|^(?:from|to)_(?:time|date)$|range")


def by_group(values: list[Value]) -> dict[str, set[str]]:
    """``group -> {normal forms}``."""
    out: dict[str, set[str]] = {}
    for v in values:
        out.setdefault(v.group, set()).add(v.norm)
    return out
