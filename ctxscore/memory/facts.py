"""Facts: (slot, value) pairs found in a message, each naming what its value is.

Sources, in order (:func:`extract_facts`):

1. tool calls: every scalar argument, slot ``function.argument`` (``book_reservation.user_id``);
2. JSON content (tool results): scalar leaves, slot = their key path (``reservations.0``,
   ``flights.1.flight_number``), values as written (``12.50`` stays ``12.50``), at most
   :data:`MAX_JSON_FACTS` per message, shallow leaves first;
3. text (its first and last 1,200 characters when longer than 3,000): the rule file's entity patterns, the
   slot named by the words before the value in its
   sentence (``reference number is Q1XUDH9Y`` -> ``reference number``), else by the unit of a number
   (``4 people`` -> ``people``), else by the kind of entity (``date``, ``time``, ``money``, ``id`` ...);
4. a pluggable extractor (the learned key-span extractor): ``extractor(text) -> [(slot, value)]``,
   values being substrings of the text; a value that contains or lies inside a value of 3. is left
   out (the rule value is the exact one), so the extractor adds what the rules miss.

Status: user statements are ``stated``; an assistant's values are ``proposed`` unless the message
confirms ("booked", "confirmed", "reference number") -- then ``confirmed``; a value the text says
is not the one ("Wednesday, not Tuesday", "instead of 7pm", 是周三不是周二) is ``denied`` (origin
``negated``: the ledger drops it and lets the message's value beside it replace it); the ledger turns a
proposal ``confirmed`` or ``denied`` by the user's next reply. Relative dates ("tomorrow", "next
Friday", "明天") are resolved to absolute ones when the session gives a date (a system message's
"current time is ...", a ``[date]`` marker at the start of a message).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

from ..messages import Message, Role
from ..scoring.rules import UNTYPED_KINDS, RuleConfig, scan_text, sentences

#: A learned extractor: ``text -> [(slot, value)]`` with each value a substring of ``text``.
Extractor = Callable[[str], Sequence[tuple[str, str]]]

#: At most this many facts from one JSON message (shallow leaves first).
MAX_JSON_FACTS = 24
#: At most this many facts from one text message.
MAX_TEXT_FACTS = 12
#: Values longer than this (characters) are not facts.
MAX_VALUE_CHARS = 80
#: A ledger line names at most this many superseded values (the latest ones).
MAX_WAS = 2

# Words that never name a slot (they lead into a value without saying what it is).
_NAME_STOP = frozenset("""a an the of for to in on at by from with and or but is are was were be been being do does did i me my
you your we our us it its this that these those there here please would like want need can could will shall should
may might must have has had just also so as if then than about around approximately only new next last one
what which who when where why how yes no ok okay sure thanks thank great perfect make made book find need want get
give take check checking set change plan visit go going leave leaving arrive arriving reserve try looking look let
actually instead noted confirmed booked changed updated moved more less most least under above below
within max maximum min minimum i'm i've i'd you're we're it's that's""".split())
#: A word of a slot name: Latin letters, accented ones included ("café order number", not "caf order number").
_LATIN = "A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f"
_WORD = re.compile(f"[{_LATIN}][{_LATIN}'-]*")
#: A Chinese slot name: the Chinese characters right before a value (at most 12 read), less what
#: :data:`_CJK_TRAIL` and :data:`_CJK_LEAD` strip, at most :data:`_CJK_NAME_MAX` characters.
_CJK_NAME = re.compile(r"([\u4e00-\u9fff]{2,12})[：:\s]*$")
_CJK_NAME_MAX = 6
#: Words between a slot's name and its value: the copula, a change verb (时间改成 8点: the slot is 时间,
#: the value replaces it), a bound, a rate or an estimate (预算每晚不超过 800元).
_CJK_TRAIL = re.compile(r"(?:是|为|在|改成|改为|换成|变成|改到|调到|调成|改|不超过|不要超过|不能超过|不超|不高于|不低于|"
                        r"最多|至少|最少|以内|以下|大概|大约|每晚|每人|每天|每间|每位|一晚|人均|一共|总计|合计|"
                        r"能|可以|想|要|需要)$")
#: Words before a slot's name: its owner and fillers (我的航班 is the slot 航班).
_CJK_LEAD = re.compile(r"^(?:另外|还有|对了|其实|那么|那|就|请|把|将|我们的|我的|您的|你的|他的|她的|我|您|你)+")
#: Words right before a value that say it is not the one (a correction's "not Tuesday").
_NEGATED = re.compile(r"(?i)(?:(?<!why )\bnot|\binstead of|\brather than|\bno longer)\s+(?:(?:on|at|for|in|the)\s+)?$"
                      r"|(?:(?<!是)不是|而不是|并非|不要)\s*$")
#: The end of the sentence a value stands in (a question denies nothing: "Why not Tuesday?", 是不是周二？).
_SENTENCE_END = re.compile(r"[.!?。！？\n]")


def negated(text: str, value: str, at: int | None = None) -> bool:
    """Whether ``value`` (at ``at`` in ``text``, default its first occurrence) follows words that say
    it is not the one (:data:`_NEGATED`: "Wednesday, not Tuesday", "instead of 7pm", 是周三不是周二),
    in a sentence that is not a question."""
    at = text.find(value) if at is None else at
    if at <= 0 or not _NEGATED.search(text[max(0, at - 40):at]):
        return False
    end = _SENTENCE_END.search(text, at + len(value))
    return end is None or end.group() not in "?？"


_UNIT = re.compile(r"(?i)\d[\d,.]*\s?([a-z\u4e00-\u9fff]+)\s*$")
# The kind of entity, by the rule file's pattern name, when no word names it.
_KIND = {
    "email": "email", "url": "url", "path": "path", "filename": "file", "datetime_iso": "date", "date_slash": "date",
    "date_words": "date", "weekday": "day", "time": "time", "date_zh": "日期", "time_zh": "时间", "money": "amount",
    "number_unit": "quantity", "id_mixed": "id", "code3": "code", "long_number": "number", "snake_case": "name",
    "camel_case": "name", "dotted_call": "name", "quoted": "quoted", "proper_name": "name", "hash_tag": "tag",
}

def kind_label(kind: str) -> str:
    """The slot a value of entity kind ``kind`` gets when no word names it (``date``, ``time``, ``money`` ...)."""
    return _KIND.get(kind, kind)


#: Chinese slot words and the English slot word each stands for, so that a slot named in one
#: language and changed in the other is one slot of the ledger (:func:`slot_key`): "flight" on May 20,
#: then "航班改到5月22日". The slot nouns of the travel and booking dialogues (CrossWOZ, RiSAWOZ-style
#: schemas) and of orders.
_ZH_SLOT_WORDS = {
    "航班": "flight", "机票": "flight", "酒店": "hotel", "宾馆": "hotel", "预算": "budget", "出发": "departure",
    "到达": "arrival", "抵达": "arrival", "时间": "time", "日期": "date", "价格": "price", "费用": "cost",
    "人数": "people", "房间": "room", "房型": "room type", "餐厅": "restaurant", "火车": "train", "高铁": "train",
    "座位": "seat", "目的地": "destination", "出发地": "origin", "地址": "address", "电话": "phone", "邮箱": "email",
    "姓名": "name", "名字": "name", "数量": "quantity", "金额": "amount", "订单": "order", "编号": "number",
    "号码": "number", "城市": "city", "景点": "attraction", "入住": "check-in", "退房": "check-out", "晚数": "nights",
    "会员": "membership", "行李": "baggage", "租车": "rental car", "会议": "meeting", "截止": "deadline",
    "手机": "phone", "手机号": "phone number", "电话号码": "phone number", "会员号": "membership number",
    "订单号": "order number", "车次": "train number",
}
_ZH_SLOT_MAX = max(map(len, _ZH_SLOT_WORDS))
_CJK = re.compile(r"[\u4e00-\u9fff]")


def slot_key(slot: str) -> str:
    """The key under which the ledger keeps a slot: the English words of a Chinese slot made only of
    the slot words it knows (``酒店预算`` -> ``hotel budget``, ``航班`` -> ``flight``), else the slot
    case-folded. A value stated under "flight" and changed under "航班" then supersedes the old one."""
    if not _CJK.search(slot):
        return slot.casefold()
    words, i = [], 0
    while i < len(slot):
        for n in range(min(_ZH_SLOT_MAX, len(slot) - i), 1, -1):  # the longest slot word at i
            if slot[i:i + n] in _ZH_SLOT_WORDS:
                words.append(_ZH_SLOT_WORDS[slot[i:i + n]])
                i += n
                break
        else:
            return slot
    return " ".join(words)


_RELATIVE = {"today": 0, "tonight": 0, "tomorrow": 1, "yesterday": -1, "今天": 0, "今晚": 0, "明天": 1, "后天": 2, "昨天": -1}
_WEEKDAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
_DATE_MARKER = re.compile(r"^\s*\[([^\]]{6,40})\]")
_CURRENT_TIME = re.compile(r"(?i)current (?:time|date) is\s+(\d{4}-\d{2}-\d{2})")


@dataclass(frozen=True, slots=True)
class Fact:
    """One fact of the session.

    Attributes:
        slot: what the value is (``pickup time``, ``book_reservation.user_id``, ``people``).
        value: the value, byte-exact as in the source.
        source: the source message id.
        turn: the source message's position.
        task: the task the source message belongs to.
        status: ``stated`` | ``proposed`` | ``confirmed`` | ``denied``.
        origin: ``call`` | ``json`` | ``text`` | ``negated`` (a text value said not to be the one) | ``extractor``.
        resolved: the absolute date of a relative date value (ISO), or ``None``.
        kind: the entity kind of a text value (the rule file's pattern name: ``date_words``,
            ``money`` ...), else ``""``.
    """

    slot: str
    value: str
    source: str
    turn: int
    task: int = 0
    status: str = "stated"
    origin: str = "text"
    resolved: str | None = None
    kind: str = ""

    def line(self, was: Sequence[str] = ()) -> str:
        """The ledger line: ``slot: value (source; was old)`` (the last :data:`MAX_WAS` superseded values)."""
        value = f"{self.value} (= {self.resolved})" if self.resolved else self.value
        tail = f"; was {', '.join(was[-MAX_WAS:])}" if was else ""
        status = "" if self.status in ("stated", "confirmed") else f", {self.status}"
        return f"{self.slot}: {value} ({self.source}{status}{tail})"


@dataclass
class FactContext:
    """What extraction needs besides the message: the rule file, the session's reference date and
    the optional learned extractor."""

    config: RuleConfig
    today: date | None = None
    extractor: Extractor | None = None
    #: ``text -> [(start, end, kind)]`` (``typed_entity_spans``; read in order of start).
    spans: Callable[[str], list[tuple[int, int, str]]] | None = field(default=None, repr=False)


def _scalar_text(v: Any) -> str | None:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None or isinstance(v, dict | list):
        return None
    t = str(v).strip()
    return t if t and len(t) <= MAX_VALUE_CHARS else None


def _leaves(obj: Any, prefix: str = "", depth: int = 0) -> list[tuple[int, str, str]]:
    """(depth, path, value text) of the scalar leaves of a JSON value, to depth 6."""
    if depth > 6:
        return []
    out: list[tuple[int, str, str]] = []
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        path = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict | list):
            out += _leaves(v, path, depth + 1)
        else:
            t = _scalar_text(v)
            if t is not None:
                out.append((depth, path, t))
    return out


def _json_value(text: str) -> Any:
    t = text.strip()
    if not t or t[0] not in "[{":
        return None
    from ..compress.extractive import _parse_json  # numbers kept as written

    return _parse_json(t)


def _slot_name(before: str) -> str | None:
    """The naming words at the end of ``before`` (up to three content words), or ``None``."""
    m = _CJK_NAME.search(before)
    if m:  # 我的预算每晚不超过 800元: the slot is 预算 (the change verb, the bound, the unit and the owner left out)
        name = m.group(1)
        while True:  # a strip is kept only when a name of two characters or more is left (预约 keeps its 约)
            cut = _CJK_TRAIL.sub("", name)
            if cut == name or len(_CJK_LEAD.sub("", cut)) < 2:
                break
            name = cut
        lead = _CJK_LEAD.sub("", name)
        return (lead if len(lead) >= 2 else name)[-_CJK_NAME_MAX:]
    words = [w.lower() for w in _WORD.findall(before[-60:])]
    name: list[str] = []
    for w in reversed(words):
        if w in _NAME_STOP:
            if name:
                break
            continue
        name.insert(0, w)
        if len(name) == 3:
            break
    return " ".join(name) or None


def resolve_date(value: str, today: date | None) -> str | None:
    """The ISO date a relative date value means on ``today`` ("tomorrow", "next Friday", "Tuesday next
    week", "明天", "下周五": Friday of next week), or ``None``."""
    if today is None:
        return None
    low = value.lower().strip()
    if low in _RELATIVE:
        return (today + timedelta(days=_RELATIVE[low])).isoformat()
    m = re.fullmatch(r"(next |this )?(monday|tuesday|wednesday|thursday|friday|saturday|sunday)", low)
    if m:  # "Friday" / "this Friday": the next one on or after today; "next Friday": a week after that
        delta = (_WEEKDAYS.index(m.group(2)) - today.weekday()) % 7 + (7 if m.group(1) == "next " else 0)
        return (today + timedelta(days=delta)).isoformat()
    m = re.fullmatch(r"(monday|tuesday|wednesday|thursday|friday|saturday|sunday) (next|this) week", low)
    if m:  # "Tuesday next week": that weekday of the week after today's (weeks start on Monday)
        monday = today - timedelta(days=today.weekday()) + timedelta(days=7 if m.group(2) == "next" else 0)
        return (monday + timedelta(days=_WEEKDAYS.index(m.group(1)))).isoformat()
    m = re.fullmatch(r"([下上这本])?个?(?:周|星期|礼拜)([一二三四五六日天])", low)
    if m:  # 周五: the next one on or after today; 这周五 / 本周五 this week's, 下周五 next week's, 上周五 last week's
        wd = "一二三四五六日天".index(m.group(2)) if m.group(2) != "天" else 6
        if m.group(1) is None:
            return (today + timedelta(days=(wd - today.weekday()) % 7)).isoformat()
        monday = today - timedelta(days=today.weekday()) + timedelta(days={"下": 7, "上": -7}.get(m.group(1), 0))
        return (monday + timedelta(days=wd)).isoformat()
    return None


def session_date(msg: Message) -> date | None:
    """A reference date a message gives: "current time is 2024-05-15" or a leading ``[1 May 2023]`` marker."""
    m = _CURRENT_TIME.search(msg.content[:4000])
    if m:
        return date.fromisoformat(m.group(1))
    m = _DATE_MARKER.match(msg.content)
    if m:
        try:
            from dateutil import parser  # noqa: PLC0415 - light, only when a marker is present

            return parser.parse(m.group(1), fuzzy=True).date()
        except (ValueError, OverflowError):
            return None
    return None


def _status(msg: Message, config: RuleConfig) -> str:
    if msg.role != Role.ASSISTANT:
        return "stated"
    rx = config.keyword_regexes.get("confirmation")
    return "confirmed" if rx is not None and rx.search(msg.content) else "proposed"


def _call_facts(msg: Message) -> list[tuple[str, str, str]]:
    out = []
    for c in msg.tool_calls:
        args = _json_value(c.arguments)  # numbers as written; None when not JSON or nested too deeply
        for _, path, value in _leaves(args) if isinstance(args, dict) else []:
            if value in c.arguments:
                out.append((f"{c.name}.{path}", value, "call"))
    return out


def _text_facts(text: str, ctx: FactContext) -> list[tuple[str, str, str, str]]:
    out: list[tuple[str, str, str, str]] = []
    # sorted by start (stable: a sorted list stays as it is) so each sentence bisects to its own spans
    spans = sorted(ctx.spans(text), key=lambda sp: sp[0]) if ctx.spans is not None else []
    starts = [s for s, _, _ in spans]
    pos = 0
    for sent in sentences(text) if spans else ():
        base = text.find(sent, pos)
        if base < 0:
            continue
        pos = start = base  # naming words are looked for after the previous value of the sentence
        for s, e, kind in spans[bisect.bisect_left(starts, base):bisect.bisect_left(starts, base + len(sent))]:
            if kind in UNTYPED_KINDS:
                continue
            value = text[s:e].strip()
            if not value or len(value) > MAX_VALUE_CHARS:
                start = max(start, e)
                continue
            unit = _UNIT.search(value) if kind == "number_unit" else None
            train = kind == "id_mixed" and value.endswith("次")  # G1次, D2315次列车: a train number
            denied = negated(text[start:], value, s - start)  # a cue after the sentence's previous value
            slot = ((unit.group(1).lower() if unit else None) or ("车次" if train else None)
                    or (None if denied else _slot_name(text[start:s])) or kind_label(kind))
            out.append((slot, value, "negated" if denied else "text", kind))
            start = max(start, e)
        if len(out) >= MAX_TEXT_FACTS:
            break
    if ctx.extractor is not None:  # only what the rules missed: a value overlapping a rule value adds nothing
        ruled = [v for _, v, _, _ in out]
        out += [(slot, v, "extractor", "") for slot, v in ctx.extractor(text)
                if v and v in text and not any(v in r or r in v for r in ruled)]
    return out[:MAX_TEXT_FACTS]


def extract_facts(msg: Message, task: int, ctx: FactContext) -> tuple[Fact, ...]:
    """The facts of one stored message (``id`` and ``turn`` set); see the module docstring."""
    found: list[tuple[str, str, str, str]] = []
    if msg.tool_calls:
        found += [(*c, "") for c in _call_facts(msg)]
    data = _json_value(msg.content) if msg.role in (Role.TOOL, Role.ASSISTANT, Role.USER) else None
    if data is not None:
        leaves = sorted(_leaves(data), key=lambda x: x[0])[:MAX_JSON_FACTS]
        scope = f"{msg.name}." if msg.role == Role.TOOL and msg.name else ""
        found += [(scope + path, value, "json", "") for _, path, value in leaves if value in msg.content]
    elif msg.content and msg.role != Role.SYSTEM:
        found += _text_facts(scan_text(msg.text()), ctx)  # the scorer's scan text: one entity scan, bounded
    status = _status(msg, ctx.config)
    seen: set[tuple[str, str]] = set()
    facts = []
    for slot, value, origin, kind in found:
        if (slot, value) in seen:
            continue
        seen.add((slot, value))
        facts.append(Fact(slot=slot, value=value, source=msg.id or "", turn=msg.turn or 0, task=task,
                          status="denied" if origin == "negated" else status, origin=origin,
                          resolved=resolve_date(value, ctx.today), kind=kind))
    return tuple(facts)
