"""The fact ledger's cost and precision in the windows of a replay.

With ``--ledger`` the managed policies also run as ``rules_ledger`` / ``learned_ledger``:
``ContextManager(layers=[FactLedger()])``. Its section (``"ledger"`` in
:attr:`ctxscore.window.result.ContextWindow.sections`) is one system note: a header line, then one
line per shown fact, ``slot: value (source id[, status][; was old, ...])``
(:meth:`ctxscore.memory.facts.Fact.line`).

Per no-query window (one per turn):

- ``ledger_tokens``: the section's tokens (with chat overhead); reported as the mean per turn and as
  the share of all window tokens (``sum(ledger tokens) / sum(window tokens)``).
- every shown line is matched to the ledger's current fact that renders to it, and counted
  **precise** when both hold:

  1. *value*: the fact's value occurs byte-exact (no normalisation) in the text of the message the
     line cites (its source id): the message's content plus its rendered tool calls
     (:func:`eval.textnorm.message_search_text`);
  2. *slot*: every slot word occurs, case-folded, in the case-folded text of that message or of the
     message right before it in the session. Slot words are the maximal runs of letters of the slot
     (``[^\\W\\d_]+``: digits, ``_``, ``.`` and spaces separate words; CJK characters are letters):
     ``book_reservation.user_id`` -> ``book``, ``reservation``, ``user``, ``id``;
     ``flights.1.flight_number`` -> ``flights``, ``flight``, ``number``. A slot without letters
     (a bare JSON index) claims no name and passes.

  A line that matches no current fact (or cites an id the session lacks) is not precise and is
  counted in ``ledger_unmatched``. ``ledger_precision`` = precise lines / shown lines, pooled over
  every (turn, line) pair of every session (a line shown at 50 turns counts 50 times: it cost
  window tokens 50 times); ``ledger_value_ok`` and ``ledger_slot_ok`` are the shares meeting each
  condition alone.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .sessions import EvalSession
from .textnorm import message_search_text

_SLOT_WORD = re.compile(r"[^\W\d_]+")
#: A value may hold line breaks; a shown line is looked up joined with at most this many following lines.
MAX_JOIN = 4


def slot_words(slot: str) -> list[str]:
    """The case-folded letter runs of a slot name: ``"flights.1.flight_number"`` -> ``["flights", "flight", "number"]``."""
    return [w.casefold() for w in _SLOT_WORD.findall(slot)]


@dataclass(slots=True)
class LineCounts:
    """Counts of the ledger lines of one window: shown, precise, value in the source, slot words found,
    lines matched to no current fact."""

    lines: int = 0
    precise: int = 0
    value_ok: int = 0
    slot_ok: int = 0
    unmatched: int = 0


class LedgerAudit:
    """Checks the ledger lines shown in one session's windows (see the module docstring).

    Args:
        session: the session being replayed (its message ids are the ids the ledger cites).
    """

    def __init__(self, session: EvalSession) -> None:
        self.index = {session.message_id(i): i for i in range(len(session.messages))}
        self.texts = [message_search_text(m) for m in session.messages]
        self._facts: dict[tuple[str, str, str], tuple[bool, bool]] = {}
        self._last: tuple[str, LineCounts] | None = None

    def check_fact(self, slot: str, value: str, source: str) -> tuple[bool, bool]:
        """``(value_ok, slot_ok)`` of one fact (the two conditions of the module docstring); memoised.
        A source id the session lacks gives ``(False, False)``."""
        key = (slot, value, source)
        got = self._facts.get(key)
        if got is None:
            i = self.index.get(source)
            if i is None:
                got = (False, False)
            else:
                text = self.texts[i]
                near = (text + "\n" + (self.texts[i - 1] if i > 0 else "")).casefold()
                got = (bool(value) and value in text, all(w in near for w in slot_words(slot)))
            self._facts[key] = got
        return got

    def check_window(self, content: str | None, facts: Callable[[], Mapping[str, Any]]) -> LineCounts:
        """Counts of the lines of one window's ledger note.

        Args:
            content: the ledger message's content (header line, then the lines), or ``None`` when
                the window has no ledger section.
            facts: returns the ledger's current facts by rendered line (``{line: Fact}``); called
                only when the note differs from the previous window's (the note changes only when
                tiers change, so most turns reuse the previous counts).
        """
        if not content:
            return LineCounts()
        if self._last is not None and self._last[0] == content:
            return self._last[1]
        by_line = facts()
        pieces = content.split("\n")[1:]  # the first line is the header
        out = LineCounts()
        i = 0
        while i < len(pieces):
            j, line = i, pieces[i]
            while line not in by_line and j + 1 < len(pieces) and j - i < MAX_JOIN:
                j += 1
                line = line + "\n" + pieces[j]
            fact = by_line.get(line)
            if fact is None:
                out.lines += 1
                out.unmatched += 1
                i += 1
                continue
            value_ok, slot_ok = self.check_fact(fact.slot, fact.value, fact.source)
            out.lines += 1
            out.value_ok += value_ok
            out.slot_ok += slot_ok
            out.precise += value_ok and slot_ok
            i = j + 1
        self._last = (content, out)
        return out
