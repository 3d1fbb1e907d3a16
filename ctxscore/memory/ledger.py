"""The session fact ledger: the current value of every slot, pinned in the window as compact lines.

As messages arrive, their facts (:mod:`ctxscore.memory.facts`) enter the ledger. A new value for
the same slot within a task supersedes the old one (kept and marked: the line says ``was ...``; the
ledger answers "what is current") when it replaces it: the new message is a correction ("actually",
"make it", "change to", 改成 ...), the old value was only proposed or denied (a new offer replaces
the last), or both come from the same tool-call argument or JSON path (a state update); otherwise,
and always for two values of one message (two flights of one offer, the ends of "10:00-22:00"),
both values stay current (two trips, two references). A value nothing names (slot
:data:`~ctxscore.scoring.spans.UNNAMED_SLOT`: the learned key-span extractor finds values, not their
names) is recorded in :attr:`FactLedger.facts` but is no slot's current value: it replaces none, is
replaced by none and is shown in no line (a bare value is not a ledger line, and values of different
kinds under one generic slot would read as superseding one another). A proposal the user confirms
right after becomes ``confirmed``; one the user turns down (``no``, ``not that one``) is ``denied``
and leaves the ledger.

The ledger section (position 40, after the system messages and before the stubs) shows the current
facts whose source message is not verbatim in the window -- a fact visible in its message needs no
second copy, and the section then changes only when tiers change, which keeps provider prompt caches
warm -- as lines such as ``hotel nightly cap: €240 (m63; was €210)``. Its tokens are capped at
``share`` of the budget; when it is full, the lowest-priority facts (the source's intrinsic value x
a status weight) are left to the store, where page-in finds them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from datetime import date
from typing import Any

from ..messages import Message, Role
from ..scoring.rules import typed_entity_spans
from ..scoring.spans import UNNAMED_SLOT, facts_of
from ..window.history import Entry, Pin
from ..window.layers import Layer, LayerContext
from .facts import Extractor, Fact, FactContext, extract_facts, session_date, slot_key

#: Default share of the budget the ledger may use.
DEFAULT_SHARE = 0.1
#: Priority weight per status (x the source message's intrinsic value); 0: not shown (an offer the
#: user has not taken stays in the history and the store).
STATUS_WEIGHT = {"confirmed": 1.0, "stated": 1.2, "proposed": 0.0, "denied": 0.0}
#: Lines that did not fit, after which the section counts as full.
MAX_MISSES = 16
_DENY = re.compile(r"(?i)^\s*(no\b|nope|not (that|this)|i don'?t (want|like)|don'?t book|i'?d rather not)|不要|不用了|不是这个|换一")
_CONFIRM_CHARS = 80
_HEADER = "Facts so far (slot: value (source message); superseded values after 'was'):"


def _key(f: Fact) -> tuple[int, str]:
    """The ledger's key of a fact: its task and :func:`~ctxscore.memory.facts.slot_key` of its slot."""
    return f.task, slot_key(f.slot)


def _alt_key(f: Fact) -> tuple[int, str]:
    """The key of a fact kept current beside a newer value of its slot: ``(task, "slot#turn#value")``
    (one message may hold several values of a slot: two flights of one offer)."""
    return f.task, f"{slot_key(f.slot)}#{f.turn}#{f.value}"


class FactLedger(Layer):
    """The fact ledger layer (see the module docstring).

    Args:
        share: the fraction of the budget its section may use, in (0, 1].
        extractor: a learned key-span extractor ``text -> [(slot, value)]`` (optional; default: the
            session scorer's span extractor when it has one, :func:`ctxscore.scoring.spans.facts_of`,
            else none: the rules and JSON paths alone). Values it returns with the slot
            :data:`~ctxscore.scoring.spans.UNNAMED_SLOT` are recorded but not shown (module docstring).
    """

    position = 40

    def __init__(self, share: float = DEFAULT_SHARE, extractor: Extractor | None = None) -> None:
        if not 0 < share <= 1:
            from ..errors import ConfigError

            raise ConfigError(f"FactLedger share must be in (0, 1], got {share}")
        self.share = share
        self.extractor = extractor
        self.sections = (LedgerSection(self),)
        self._reset()

    def _reset(self) -> None:
        self.facts: list[Fact] = []  # every fact, in order
        self.current: dict[tuple[int, str], Fact] = {}  # (task, slot) -> current fact
        self.was: dict[tuple[int, str], list[str]] = {}  # (task, slot) -> superseded values, oldest first
        self.today: date | None = None
        self._last_assistant: list[Fact] = []
        self._order: list[Fact] | None = None  # current facts by priority (None: to be sorted)
        self._lines: dict[tuple[Fact, tuple[str, ...]], tuple[str, int]] = {}

    def attach(self, ctx: LayerContext) -> None:
        """Keep the context; facts are extracted with the session's rule file and the given extractor,
        else the session scorer's span extractor (when it has one)."""
        self.ctx = ctx
        cfg = ctx.rules.config
        extractor = self.extractor if self.extractor is not None else facts_of(getattr(ctx, "scorer", None))
        self.fctx = FactContext(config=cfg, extractor=extractor, spans=lambda t: typed_entity_spans(t, cfg))
        self._correction = cfg.keyword_regexes.get("correction") or re.compile(r"(?!x)x")

    def on_reset(self) -> None:
        """Forget every fact (the kept messages come again through :meth:`on_add`)."""
        self._reset()

    def on_add(self, entries: Sequence[Entry]) -> None:
        """Extract the facts of new messages, apply confirmations, denials and supersession."""
        for e in entries:
            day = session_date(e.msg)
            if day is not None:
                self.today = day
            self.fctx.today = self.today
            self._reply(e.msg)
            facts = extract_facts(e.msg, e.task, self.fctx)
            correction = e.pin == Pin.CORRECTION or bool(self._correction.search(e.msg.content[:300]))
            for f in facts:
                self._put(f, correction)
            if e.msg.role == Role.ASSISTANT:
                self._last_assistant = list(facts)
            elif e.msg.role == Role.USER:
                self._last_assistant = []

    def _reply(self, msg: Message) -> None:
        """A short user reply confirms or denies the previous assistant message's proposals."""
        if msg.role != Role.USER or not self._last_assistant or len(msg.content) > _CONFIRM_CHARS:
            return
        cfg = self.ctx.rules.config
        if _DENY.search(msg.content):
            status = "denied"
        elif cfg.keyword_regexes["confirmation"].search(msg.content):
            status = "confirmed"
        else:
            return
        for f in self._last_assistant:
            for key in (_key(f), _alt_key(f)):  # current under its slot, or beside a newer value of it
                if self.current.get(key) is f and f.status == "proposed":
                    self.current[key] = replace(f, status=status)
                    if status == "denied":
                        del self.current[key]
                    self._order = None
        self._last_assistant = []

    def _put(self, f: Fact, correction: bool) -> None:
        self.facts.append(f)
        if f.slot == UNNAMED_SLOT:  # a value nothing names is no slot's value: recorded, not a ledger line
            return
        key = _key(f)
        old = self.current.get(key)
        if old is not None and old.value == f.value and f.status == "proposed" and old.status in ("stated", "confirmed"):
            return  # the assistant repeats what the user stated: it stays stated (an offer would not be shown)
        if old is not None and old.value != f.value:
            state_update = f.origin == old.origin and f.origin in ("call", "json")
            if old.source != f.source and (correction or old.status in ("proposed", "denied") or state_update):
                self.was.setdefault(key, []).append(old.value)
            else:  # another value of the same kind (or of the same message: two flights of one offer, the
                # two ends of "10:00-22:00"): both stay current (the old one with what it replaced)
                alt = _alt_key(old)
                self.current[alt] = old
                if key in self.was:
                    self.was[alt] = self.was.pop(key)
        self.current[key] = f
        self._order = None

    def was_of(self, f: Fact) -> list[str]:
        """The values current fact ``f`` replaced, oldest first: those of its slot, or, for a value kept
        current beside a newer one of its slot (both stay current), those it had replaced itself."""
        alt = _alt_key(f)
        return self.was.get(alt if self.current.get(alt) is f else _key(f), [])

    def ordered(self) -> list[Fact]:
        """Current facts by priority (status weight x the source's intrinsic value), highest first."""
        if self._order is None:
            intr = self.ctx.history.intr.a
            ids = self.ctx.history.ids

            def priority(f: Fact) -> float:
                i = ids.get(f.source)
                return STATUS_WEIGHT.get(f.status, 1.0) * (float(intr[i]) if i is not None else 0.3)

            self._order = sorted(self.current.values(), key=lambda f: (-priority(f), -f.turn))
        return self._order

    def rendered(self, f: Fact, counter: Any) -> tuple[str, int]:
        """The line of a current fact and its tokens (with the newline), memoised."""
        was = tuple(self.was_of(f))
        got = self._lines.get((f, was))
        if got is None:
            line = f.line(was)
            if counter is None:
                return line, 0
            got = self._lines[(f, was)] = (line, counter.count(line) + 1)
        return got

    def lines(self) -> list[str]:
        """Every current fact as a ledger line, in order of source turn."""
        return [self.rendered(f, None)[0] for f in sorted(self.current.values(), key=lambda x: x.turn)]

    def state(self) -> dict[str, Any]:
        """The current facts and superseded values (JSON-ready)."""
        return {"facts": [{"slot": f.slot, "value": f.value, "source": f.source, "turn": f.turn, "task": f.task,
                           "status": f.status, "resolved": f.resolved, "was": self.was_of(f)}
                          for f in sorted(self.current.values(), key=lambda x: x.turn)]}


class LedgerSection:
    """The ledger's window section (see the module docstring)."""

    name = "ledger"
    position = 40

    def __init__(self, ledger: FactLedger) -> None:
        self.ledger = ledger

    def render(self, view: Any) -> tuple[list[dict[str, Any]], int]:
        """The ledger note: current facts whose source is not verbatim in this build, highest priority
        first until the cap, then in order of source turn. Work per build is proportional to the
        lines shown (the order is kept between builds), not to the session."""
        led, ids, counter = self.ledger, view.history.ids, view.counter
        cap = view.layer_cap(led.share)
        tokens = counter.count(_HEADER) + 4
        chosen: list[tuple[int, str]] = []
        misses = 0
        for f in led.ordered():
            i = ids.get(f.source)
            if i is None or view.codes[i] == 0:
                continue  # verbatim in the window already
            if not STATUS_WEIGHT.get(f.status, 1.0):
                break  # proposals and denials come last and are not shown (the store keeps them)
            line, n = led.rendered(f, counter)
            if tokens + n > cap:
                misses += 1
                if misses > MAX_MISSES or tokens + 8 > cap:
                    break  # full
                continue
            chosen.append((f.turn, line))
            tokens += n
        if not chosen:
            return [], 0
        msg = Message(role="system", content="\n".join([_HEADER, *(line for _, line in sorted(chosen))]))
        n = view.counter.count_message(msg)
        view.spend(n)
        return [msg.to_openai()], n
