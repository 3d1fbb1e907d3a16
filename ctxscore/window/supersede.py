"""Supersession links: which later user message restates what an earlier message said.

In a task dialogue a value is often replaced a turn or two after it was given: "book a table at
12:00" -> "not available" -> "how about at 11:00 instead?". A window that shows the earlier message
alone (kept verbatim, or paged in because the query names the booking) says the old value as if it
were current. Each entry therefore records its *successor* (:attr:`Entry.successor`): the first
user message within :data:`LOOKAHEAD` messages after it, in the same task, that

- is a correction or asks for an alternative (the rule file's ``correction`` keywords: "actually",
  "instead", "make it" ..., 改成 ...; its ``alternative`` keywords: "how about", "any other",
  "find another" ..., 换一, 再找 ...) and, when it names a value that an earlier message of the
  lookahead holds a value of the kind of, that message holds one (:func:`slot_families`: "Actually,
  change the hotel budget to €240" restates the €210 budget, not the flight date given between
  them; "Actually, I'd rather have Italian food, for 2 people" restates the French restaurant
  request, which holds no count), or
- gives another value of a kind the earlier message holds (a time after a time, a date after a
  date, another amount, another name), i.e. a typed value the earlier message does not hold.
  Identifiers (:data:`IDENTIFIER_KINDS`: codes, long numbers, emails, paths ...) do not count: a
  second one names another thing far more often than it replaces the first ("My booking reference
  is QX7PLM." then "My frequent flyer number is FF88213."); a correction cue still links them.

A later message that names the slot of its value right before it ("make the flight budget €520",
"change the meeting to 4:30pm"; :func:`slot_names`) restates by another value alone only earlier
messages that name that slot too ("My flight budget is €480" restates no hotel's "€172 per night"),
and as a correction only those, when some message of the lookahead names it (else the rules above
apply as they are: "make the reservation 8pm" after "a table ... at 7pm").

Page-in (:mod:`ctxscore.window.pagein`) shows the successor next to a hit, so the window holding
the old statement also holds the one that replaced it. The link is computed once, when the later
message arrives; nothing is dropped or rewritten (the originals stay as they were).
"""

from __future__ import annotations

import re

from ..messages import Message, Role
from ..scoring.rules import RESTATE_LOOKAHEAD, RuleConfig, asks_to_replace, restates  # noqa: F401 - restates is part of this module's API
from ..scoring.rules import typed_values as text_values
from ..store.retrieval import _EN_STOP
from ..store.stemming import porter_stem
from .history import History

#: A successor is looked for among this many messages after an entry (see
#: :data:`ctxscore.scoring.rules.RESTATE_LOOKAHEAD`).
LOOKAHEAD = RESTATE_LOOKAHEAD
#: Entity kinds of the rule file's ``[patterns]`` that identify rather than fill a slot: a new value of
#: one of them restates an earlier message only with a correction cue.
IDENTIFIER_KINDS = frozenset({"email", "url", "path", "filename", "id_mixed", "long_number", "snake_case",
                              "camel_case", "dotted_call", "hash_tag"})


def typed_values(msg: Message, config: RuleConfig) -> frozenset[tuple[str, str]]:
    """The typed values of a message: :func:`ctxscore.scoring.rules.typed_values` of its text.

    Returns:
        A frozenset of ``(entity kind, lower-cased text)`` pairs (empty for a system message or one
        without entities).
    """
    if msg.role == Role.SYSTEM:
        return frozenset()
    return text_values(msg.text(), config)


def slot_values(values: frozenset[tuple[str, str]]) -> frozenset[tuple[str, str]]:
    """The typed values that fill a slot (times, dates, amounts, names ...): ``values`` less those of
    :data:`IDENTIFIER_KINDS`."""
    return frozenset(v for v in values if v[0] not in IDENTIFIER_KINDS)


#: Entity kinds that fill the same slot in other spellings (a date in words, with slashes, in Chinese ...).
KIND_FAMILIES = {**dict.fromkeys(("date_words", "date_slash", "datetime_iso", "weekday", "date_zh"), "date"),
                 **dict.fromkeys(("time", "time_zh"), "time"), **dict.fromkeys(("number_unit", "count_noun"), "count")}


def slot_families(values: frozenset[tuple[str, str]]) -> frozenset[str]:
    """The slot kinds of ``values`` (:func:`slot_values`), each spelling of a date, a time or a count
    read as one (:data:`KIND_FAMILIES`)."""
    return frozenset(KIND_FAMILIES.get(k, k) for k, _ in slot_values(values))


#: Words before a value that name no slot: cue and filler words of a correction, verbs ("book 8pm",
#: "try 8pm") and words that name only the value's kind ("change the time to 8pm", "the day to
#: Saturday"), which the message that gave the old value rarely says.
_NOT_SLOT = frozenset("""make change actually instead rather set move switch update use per each about around only
just like want need prefer please sorry let lets let's also now then new same other another total book try
reserve schedule arrange order pay send get take put have see show find search go come bring push shift
time times day days date dates hour hours minute minutes week weeks month months year years night nights
price prices cost costs amount amounts number numbers value values count people person persons""".split())
#: Characters of an earlier message searched for the slot a correction names (:func:`names_slot`).
SLOT_SEARCH_CHARS = 2000
_SLOT_BEFORE = re.compile(r"([a-z][a-z-]{2,})(?:\s+(?:to|the|a|an|for|at|of|is|be|on|by|from|as|into|around|about))*\s*$")
#: A message longer than this names no slot (a tool output in a user turn, a long request).
SLOT_NAME_CHARS = 600


def slot_names(text: str, values: frozenset[tuple[str, str]]) -> frozenset[str]:
    """The slots a short English message names right before its slot values, as normalised stems:
    "make the flight budget €520" -> ``{"budget"}``, "change the meeting to 4:30pm" -> ``{"meet"}``,
    "change the check-in to June 14" -> ``{"checkin"}``; none for "make it 8pm", "how about 11:00?" or
    "Italian food, for 2 people" (a comma between). Empty for a message over :data:`SLOT_NAME_CHARS`."""
    if len(text) > SLOT_NAME_CHARS:
        return frozenset()
    low = text.lower()
    spans = [(a, a + len(v)) for _, v in values if (a := low.find(v)) >= 0]
    out = set()
    for _, v in slot_values(values):
        at = low.find(v)
        m = _SLOT_BEFORE.search(low, 0, at) if at > 0 else None
        if (m is None or m.group(1) in _NOT_SLOT or m.group(1) in _EN_STOP
                or any(a <= m.start(1) < b for a, b in spans)):  # "2 people at 7pm": "people" is a value's
            continue
        out.add(porter_stem(m.group(1).replace("-", "")))
    return frozenset(out)


def names_slot(text: str, names: frozenset[str]) -> bool:
    """Whether the start of ``text`` (:data:`SLOT_SEARCH_CHARS`) names one of the slot stems ``names``
    (:func:`slot_names`): a word with that stem ("deliveries" names ``deliveri``), or two words that
    make it ("check in" names ``checkin``)."""
    low = text[:SLOT_SEARCH_CHARS].lower()
    words = re.findall(r"[a-z][a-z-]*", low)
    for n in names:
        head = n[:3]
        if head not in low:
            continue
        for i, w in enumerate(words):
            if w.startswith(head) and (porter_stem(w.replace("-", "")) == n or (
                    i + 1 < len(words) and porter_stem(w + words[i + 1]) == n)):
                return True
    return False


def link(history: History, config: RuleConfig) -> list[int]:
    """Make the last entry of ``history`` the successor of the earlier entries it restates (see the
    module docstring); entries that have a successor keep it (the first restatement wins).

    Returns:
        The indices of the entries linked to it (empty unless the last entry is a user message).
    """
    n = len(history)
    if not n:
        return []
    j = n - 1
    e = history.entries[j]
    if e.msg.role != Role.USER:
        return []
    correction = asks_to_replace(e.msg.content, config)
    new = slot_values(e.values)
    start = max(history.task_starts[-1] if e.task == history.task_no else 0, j - LOOKAHEAD)
    cands = [k for k in range(start, j) if history.entries[k].successor is None and history.entries[k].task == e.task
             and history.entries[k].msg.role != Role.SYSTEM]
    # a correction naming a value restates the messages holding a value of its kind, when there are any
    # (when none does, it restates every one, as before)
    kinds = slot_families(e.values) if correction else frozenset()
    shared = {k for k in cands if kinds & slot_families(history.entries[k].values)} if kinds else set()
    names = slot_names(e.msg.content, new) if new else frozenset()
    named = {k for k in cands if names_slot(history.entries[k].text, names)} if names else set()
    # a correction restates only the messages naming its slot when some does ("flight budget €520"
    # after a hotel's €172 and a flight budget), else as before ("make the reservation 8pm"); another
    # value alone restates a message only if that names its slot too ("My flight budget is €480" is
    # no new hotel price)
    out = []
    for k in cands:
        old = history.entries[k]
        corrects = correction and (not shared or k in shared) and (not named or k in named)
        if corrects or (restates(slot_values(old.values), new) and (not names or k in named)):
            old.successor = j
            out.append(k)
    return out
