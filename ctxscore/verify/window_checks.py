"""Checks of one assembled window (what the model will actually see), run after every build.

- **constraint missing / weakened**: every hard-constraint sentence in force (the system messages' and
  the active task's) must be in the window byte-exact. When it is not, the closest sentence of the
  window (word overlap; character pairs for Chinese) is compared with it: a dropped negation or
  number is ``constraint_weakened`` (an error), a reworded one a warning, none close enough
  ``constraint_missing``.
- **unsupported conclusion**: a result an assistant message states (a reference, an id, a total) whose
  value is in no user, tool or system message of the window nor in a section note. When an earlier
  message of the session gives it, the finding names that message to page in; in a tool-using session
  a value no message gave at all is reported too. The cheap pass reads the recent turns, the full
  pass every assistant message in the window.
- **stale fact** (with a fact ledger): a superseded value is in the window while the current value of its
  slot is not.
- **duplicate fact**: the same content (80 characters or more) shown twice.
- **conflicting fact** (with a profile): a profile item that needs clarification.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ..memory import lexicon as lx
from ..memory.facts import slot_key
from ..messages import Role
from .analysis import Tracker, is_observation
from .findings import Action, Finding, FindingKind, Severity
from .values import num, values_in

#: Word overlap above which a window sentence counts as a rendering of a constraint.
OVERLAP = 0.5
DUPLICATE_CHARS = 80
_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
_WORDS = re.compile(r"[a-z0-9']+|[\u4e00-\u9fff]")
_CJK = re.compile(r"[\u4e00-\u9fff]")
_SENT = re.compile(r"(?<=[.!?;。！？；\n])")


@dataclass(frozen=True, slots=True)
class Shown:
    """One window message: the history entry it renders (``None`` for a section note), its section and text."""

    index: int | None
    section: str
    content: str


def _text(m: dict[str, Any]) -> str:
    c = m.get("content")
    if isinstance(c, list):
        return "\n".join(str(p.get("text", "")) for p in c if isinstance(p, dict))
    return c if isinstance(c, str) else ""


def window_map(window: Any, view: Any) -> list[Shown]:
    """The window's messages with the entries they render (from the sections and the build's tier codes)."""
    from ..window.history import ARCHIVED  # noqa: PLC0415

    codes = view.codes
    n = len(codes)  # the entries of that build: messages added since are in no section of its window
    out: list[Shown] = []
    k = 0
    for info in window.sections:
        msgs = window.messages[k: k + info.messages]
        k += info.messages
        idx: list[int | None] | None = None
        if info.name == "system":
            idx = view.system_indices()
        elif info.name in ("history", "recent"):
            lo, hi = (view.lead, view.recent) if info.name == "history" else (view.recent, n)
            live = [i for i in range(lo, hi) if codes[i] != ARCHIVED]
            at = getattr(view, "recalled_at", None)  # the recalled note comes before this entry
            idx = [x for i in live for x in ((None, i) if i == at else (i,))]
        if idx is not None and len(idx) != len(msgs):
            idx = None
        out += [Shown(idx[j] if idx is not None else None, info.name, _text(m)) for j, m in enumerate(msgs)]
    return out


def _tokens(s: str) -> set[str]:
    words = _WORDS.findall(s.lower())
    cjk = [w for w in words if "\u4e00" <= w <= "\u9fff"]
    return {w for w in words if not ("\u4e00" <= w <= "\u9fff")} | {a + b for a, b in zip(cjk, cjk[1:], strict=False)}


def _closest(sentence: str, blob: str) -> tuple[str, float]:
    target = _tokens(sentence)
    best, score = "", 0.0
    for cand in _SENT.split(blob):
        toks = _tokens(cand)
        if not toks or not target:
            continue
        s = len(target & toks) / len(target)
        if s > score:
            best, score = cand.strip(), s
    return best, score


def constraint_checks(tr: Tracker, view: Any, blob: str) -> list[Finding]:
    """Constraint missing or weakened (module docstring)."""
    h = view.history
    out = []
    for i, sent in (*tr.constraints.get(-1, []), *tr.constraints.get(h.task_no, [])):
        if sent in blob or i >= len(h.entries):
            continue
        mid = h.entries[i].msg.id or ""
        near, score = _closest(sent, blob)
        if score < OVERLAP:
            out.append(Finding(FindingKind.CONSTRAINT_MISSING, Severity.ERROR,
                               f"the hard constraint {sent!r} is not in the window", (mid,), Action.RE_PIN,
                               details={"constraint": sent}))
            continue
        lost_neg = bool(lx.NEGATION.search(sent)) and not lx.NEGATION.search(near)
        lost_num = sorted(set(_NUMBER.findall(sent)) - set(_NUMBER.findall(near)))
        what = ("its negation is gone" if lost_neg else "") + ("; " if lost_neg and lost_num else "") + (
            f"the number(s) {', '.join(lost_num)} are gone" if lost_num else "")
        out.append(Finding(FindingKind.CONSTRAINT_WEAKENED, Severity.ERROR if what else Severity.WARNING,
                           f"the hard constraint {sent!r} is shown as {near[:160]!r}: {what or 'reworded'}", (mid,),
                           Action.RE_PIN, details={"constraint": sent, "shown": near[:300], "negation_lost": lost_neg,
                                                   "numbers_lost": lost_num}))
    return out


def _derivable(x: float, nums: list[float]) -> bool:
    """``x`` follows from shown numbers the way an assistant computes a total: a small multiple
    (``3 x $547``), a sum or difference of two small multiples, or a unit change by a power of ten
    (fen -> yuan -> 万元), rounded to cents."""
    for i, a in enumerate(nums):
        if any(abs(a * k - x) < 0.005 for k in range(2, 11)):
            return True
        if a and any(abs(round(a / 10 ** k, 2) - x) < 0.005 for k in range(1, 9)):
            return True
        for b in nums[i + 1:]:
            for k in range(1, 5):
                for j in range(1, 5):
                    if abs(a * k + b * j - x) < 0.005 or abs(abs(a * k - b * j) - x) < 0.005:
                        return True
    return False


def _own_amounts(tr: Tracker, mid: str, but: str) -> list[float]:
    """The other amounts a conclusion message states ("$547 per person, $1,641 in total")."""
    out = []
    for v in tr.conclusions.get(mid, ()):
        if v.group == "money" and v.norm != but:
            try:
                out.append(float(v.norm))
            except ValueError:
                continue
    return out


def _evidence(tr: Tracker, view: Any, shown: list[Shown]) -> tuple[set[str], Counter[str], list[float]]:
    """(normal forms shown by users, tools, the system and notes; normal forms the assistant's shown
    messages say, counted; the shown evidence numbers, for sums)."""
    h = view.history
    evidence: set[str] = set()
    said: Counter[str] = Counter()
    for s in shown:
        if s.index is None:
            evidence |= {v.norm for v in values_in(s.content, tr.config)}
            evidence |= {num(x) for x in _NUMBER.findall(s.content)}
            continue
        mid = h.entries[s.index].msg.id or ""
        if h.entries[s.index].msg.role != Role.ASSISTANT:
            evidence |= {n for _, n in tr.values.get(mid, frozenset())} | tr.numbers.get(mid, frozenset())
        elif not tr.uses_tools:
            said.update({n for _, n in tr.values.get(mid, frozenset())})
    nums = []
    for n in evidence:
        try:
            nums.append(float(n))
        except ValueError:
            pass
    return evidence, said, sorted(nums)[-60:]


def conclusion_checks(tr: Tracker, view: Any, shown: list[Shown], full: bool) -> list[Finding]:
    """Unsupported conclusions (module docstring). Evidence is what the user, the tools, the system and
    the section notes show (numbers match whatever their group: ``"paid": 369`` backs "369元"; a sum
    of shown numbers counts); in a session without tools the assistant's other messages count too
    (its values come from a backend the conversation does not show)."""
    h = view.history
    cands = [s.index for s in shown if s.index is not None and (full or s.index >= view.recent)
             and h.entries[s.index].msg.id in tr.conclusions]
    if not cands:
        return []
    evidence, said, nums = _evidence(tr, view, shown)
    out = []
    for i in cands:
        mid = h.entries[i].msg.id or ""
        own = {n for _, n in tr.values.get(mid, frozenset())}
        for v in tr.conclusions[mid]:
            if v.norm in evidence or said[v.norm] - (v.norm in own) > 0:
                continue
            if v.group == "money" and _derivable(float(v.norm), [*nums, *_own_amounts(tr, mid, v.norm)]):
                continue  # a total of shown numbers, or of the message's own (checked on their own): 3 x $547
            srcs = [x for x in (*tr.sources.get((v.group, v.norm), []), *tr.number_sources.get(v.norm, []))
                    if x != mid and tr.order.get(x, 1 << 30) < tr.order[mid]
                    and (tr.roles.get(x) != "assistant" or not tr.uses_tools)]
            if srcs:
                out.append(Finding(FindingKind.UNSUPPORTED_CONCLUSION, Severity.WARNING,
                                   f"states {v.text!r}, whose evidence ({srcs[0]}) is not in the window", (mid, srcs[0]),
                                   Action.PAGE_IN, details={"value": v.text, "group": v.group}))
            elif tr.uses_tools:
                out.append(Finding(FindingKind.UNSUPPORTED_CONCLUSION, Severity.WARNING,
                                   f"states {v.text!r}, which no tool result or user message gave", (mid,),
                                   Action.RECHECK, details={"value": v.text, "group": v.group}))
    return out


def _distinct(value: str) -> bool:
    """A value specific enough to look for in the window as text (three characters, or two with a digit)."""
    return len(value) >= 3 or (len(value) == 2 and any(c.isdigit() for c in value))


def _user_fact(f: Any, view: Any) -> bool:
    """A fact the user stated in text (the values the user corrects; code and tool arguments are not)."""
    i = view.history.ids.get(f.source)
    if f.origin != "text" or i is None:
        return False
    msg = view.history.entries[i].msg
    return msg.role == Role.USER and not is_observation(msg)


def stale_checks(ledger: Any, view: Any, blob: str) -> list[Finding]:
    """Stale facts of the active task (module docstring)."""
    out = []
    task = view.history.task_no
    for (t, _), cur in ledger.current.items():
        olds = ledger.was_of(cur)  # a value kept beside a newer one of its slot has its own history
        if t != task or not olds or not _distinct(cur.value) or cur.value in blob or not _user_fact(cur, view):
            continue
        slot, key = cur.slot, slot_key(cur.slot)
        for old in olds:
            prev = next((f for f in ledger.facts if f.task == t and f.value == old and slot_key(f.slot) == key), None)
            if _distinct(old) and old in blob and prev is not None and _user_fact(prev, view):
                src = prev.source
                out.append(Finding(FindingKind.STALE_FACT, Severity.WARNING,
                                   f"shows the superseded {slot} {old!r} but not the current {cur.value!r}",
                                   (src, cur.source), Action.PAGE_IN,
                                   details={"slot": slot, "shown": old, "current": cur.value}))
                break
    return out


def duplicate_checks(shown: list[Shown], view: Any) -> list[Finding]:
    """The same content shown twice (module docstring)."""
    seen: dict[str, Shown] = {}
    out = []
    h = view.history
    for s in shown:
        key = " ".join(s.content.split())
        if len(key) + len(_CJK.findall(key)) < DUPLICATE_CHARS:  # a Chinese character counts twice
            continue
        first = seen.get(key)
        if first is None:
            seen[key] = s
            continue
        ids = tuple(h.entries[x.index].msg.id or "" if x.index is not None else x.section for x in (s, first))
        out.append(Finding(FindingKind.DUPLICATE_FACT, Severity.INFO,
                           f"the same {len(key)} characters are shown twice", ids, Action.DROP))
    return out


def profile_checks(profile: Any) -> list[Finding]:
    """Profile items that need clarification (module docstring)."""
    out = []
    for it in profile.items.values():
        others = (it.conflict or {}).get("with")
        if it.status != "needs_clarification" or not it.evidence or not isinstance(others, list):
            continue  # one finding per conflict: on the item of the newer statement, which names the others
        ids = (it.evidence[-1].message, *dict.fromkeys(e.message for o in others if o in profile.items
                                                       for e in reversed(profile.items[o].evidence)))
        out.append(Finding(FindingKind.CONFLICTING_FACT, Severity.WARNING,
                           f"profile item {it.describe()} conflicts with {', '.join(others)}; ask the user which holds",
                           ids, Action.ASK_USER, details={"item": it.key, "with": others}))
    return out


def check_window(tr: Tracker, window: Any, view: Any, full: bool = False, ledger: Any = None,
                 profile: Any = None) -> list[Finding]:
    """Every window check (module docstring); ``full`` reads every assistant message, not only the recent ones."""
    shown = window_map(window, view)
    blob = "\n".join(s.content for s in shown)
    out = constraint_checks(tr, view, blob)
    out += conclusion_checks(tr, view, shown, full)
    if ledger is not None:
        out += stale_checks(ledger, view, blob)
    out += duplicate_checks(shown, view)
    if profile is not None:
        out += profile_checks(profile)
    return out
