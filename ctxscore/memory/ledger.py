"""The session fact ledger: the current value of every slot, pinned in the window as compact lines.

As messages arrive, their facts (:mod:`ctxscore.memory.facts`) enter the ledger. A new value for
the same slot within a task supersedes the old one (kept and marked: the line says ``was ...``; the
ledger answers "what is current") when it replaces it: the new message is a correction ("actually",
"make it", "change the meeting to", 改成 ...; a correction whose value no earlier value's slot
names replaces the task's one current value of its kind, under that slot, as does one whose slot
shares a noun with that value's ("the confirmation email" after "send all confirmations to ...",
an assistant's echo of the old value leaving with it; when the user gave that value for another
thing too, "my billing email is ... as well", only the copy whose slot shares the noun is replaced,
the other stays); one whose slot is a
shorter or longer name of one current value's slot replaces it, whatever its kind: 预算 after
酒店预算), the message says the old value is not the one ("Wednesday, not Tuesday", 不是周二), the
old value was only proposed or denied (a new offer replaces the last), or both come from the same tool-call argument or JSON path (a state update) -- except under a slot
only the value's entity kind names (``id``, ``name``, ``amount``, ``date``: no word named it), where
only a correction of a date, time or email replaces (a flight number is no new member number, a
hotel total no new flight price, a return date no new outbound date); otherwise,
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
a status weight, halved for the fields of a result's rows: one option of a search) are left to the
store, where page-in finds them. A row of a later tool result (another search, another page) is
new data, not a correction: it takes the place of the row at its index with no ``was``.
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
from ..store.stemming import porter_stem
from ..window.history import Entry, Pin
from ..window.layers import Layer, LayerContext, check_share
from .facts import _NAME_STOP, Extractor, Fact, FactContext, extract_facts, kind_label, session_date, slot_key

#: Default share of the budget the ledger may use.
DEFAULT_SHARE = 0.1
#: Priority weight per status (x the source message's intrinsic value); 0: not shown (an offer the
#: user has not taken stays in the history and the store).
STATUS_WEIGHT = {"confirmed": 1.0, "stated": 1.2, "proposed": 0.0, "denied": 0.0}
#: Lines that did not fit, after which the section counts as full.
MAX_MISSES = 16
_DENY = re.compile(r"(?i)^\s*(no\b|nope|not (that|this)|i don'?t (want|like)|don'?t book|i'?d rather not)|不要|不用了|不是这个|换一")
_CONFIRM_CHARS = 80
#: Corrections the rule file's lexicon leaves to the ledger: "change the meeting to ...", "move it to
#: ...", "use ... as my email" (a broader cue would pin more messages; here it only decides supersession).
_CHANGE = re.compile(r"(?i)\b(?:change|move|switch|update|push)\s+(?:(?:the|my|our|your|it|that|this)\s+)?"
                     r"(?:[\w-]+\s+){0,3}?to\b|\buse\b.{1,60}\bas\s+(?:my|the|our)\b|^\W*correction\b"
                     r"|改到|改为|改成|换成|应该是")
#: Entity kinds of which a correction that names no slot replaces the task's one current value
#: (dates, times, an email): not amounts, counts or ids, of which a task holds several that mean
#: different things (a parking fee beside a room rate, 3 days beside 4 people).
_KIND_LINKED = frozenset({"email", "url", "date_words", "date_zh", "datetime_iso", "date_slash", "weekday", "time",
                          "time_zh"})
#: Words a slot read from a correction is made of when the correction names no slot ("I meant ...",
#: "use ... as my email", 改成 ...): such a value takes the slot of the value of its kind it replaces.
_UNNAMING = frozenset({"meant", "mean", "use", "actually", "instead", "make", "it", "change", "switch", "sorry",
                       "correction", "no", "wait", "rather", "改成", "改为", "改到", "换成", "应该是", "是", "不对", "还是"})
_HEADER = "Facts so far (slot: value (source message); superseded values after 'was'):"


def _unnamed(f: Fact) -> bool:
    """Whether ``f``'s slot names nothing: read from a correction's own words (:data:`_UNNAMING`), or
    the entity kind's label."""
    words = f.slot.lower().split()
    return f.slot == kind_label(f.kind) or bool(words) and all(w in _UNNAMING for w in words)


def _generic(f: Fact) -> bool:
    """Whether ``f``'s slot is only its entity kind's label (``id``, ``name``, ``amount``, ``date`` ...): no
    word named it."""
    return bool(f.kind) and f.slot == kind_label(f.kind)


_INDEX = re.compile(r"(?:^|\.)\d+(?:\.|$)")
#: A field of a list item of a JSON result (``search_hotels.0.price_per_night_eur``): one option of many.
_ROW = re.compile(r"(?:^|\.)\d+\.")
#: Priority weight of such a field (x the status weight): a search's rows come after what the user said.
ROW_WEIGHT = 0.5


def _listed(f: Fact) -> bool:
    """Whether ``f`` is a leaf of a list item of a JSON message (a path with an index:
    ``search_hotels.0.price_per_night_eur``): a row of one result, not a state."""
    return f.origin == "json" and bool(_INDEX.search(f.slot))


#: Entity kinds by what they are: a date and a weekday are both the day of something.
_FAMILY = {"date_words": "date", "date_zh": "date", "datetime_iso": "date", "date_slash": "date", "weekday": "date",
           "time": "time", "time_zh": "time"}


def _family(kind: str) -> str:
    """What a value of entity kind ``kind`` is (:data:`_FAMILY`; the kind itself otherwise)."""
    return _FAMILY.get(kind, kind)


def _related(a: str, b: str) -> bool:
    """Whether two slot keys name one thing at two lengths: the words of one are all in the other
    (``check-in`` and ``check-in time``)."""
    wa, wb = set(a.split()), set(b.split())
    return bool(wa and wb) and (wa <= wb or wb <= wa)


#: Words that name a kind of value, not what it is for: a slot sharing only these with another names
#: another thing ("hotel date" and "flight date").
_KIND_WORDS = frozenset({"email", "mail", "address", "url", "link", "date", "day", "time", "number", "id", "code",
                         "name", "amount", "price", "quantity"})
_SLOT_WORD = re.compile(r"[^\W\d_]+")


def _share_noun(a: str, b: str) -> bool:
    """Whether slot keys ``a`` and ``b`` share a word (by its stem; ``confirmations`` and ``confirmation``)
    other than a name of a kind of value (:data:`_KIND_WORDS`) or a word that names no slot."""
    def nouns(key: str) -> set[str]:
        words = _SLOT_WORD.findall(key.split("#")[0])
        return {porter_stem(w) for w in words if w not in _KIND_WORDS and w not in _UNNAMING and w not in _NAME_STOP}
    return bool(nouns(a) & nouns(b))


#: Statuses of a value the user gave (not an assistant's echo or proposal).
_USER_STATUSES = ("stated", "confirmed")


def _noun_sharing_copy(slot: str, fam: list[tuple[tuple[int, str], Fact]]) -> tuple[tuple[int, str], Fact] | None:
    """The entry of ``fam`` (the task's current values of one kind) that a correction under ``slot``
    replaces through a shared noun (:func:`_share_noun`), or ``None``: ``fam`` holds one value and some
    slot of it shares a noun with ``slot``; its one user-stated copy (else its first entry) -- or, when
    the user gave the value for several things ("send all confirmations to john@..." and "my billing
    email is john@... as well"), the one user-stated copy whose slot shares the noun (none or several:
    no guess)."""
    if len({c.value for _, c in fam}) != 1 or not any(_share_noun(slot, k[1]) for k, _ in fam):
        return None
    users = [kc for kc in fam if kc[1].status in _USER_STATUSES]
    if len(users) <= 1:
        return users[0] if users else fam[0]
    sharing = [kc for kc in users if _share_noun(slot, kc[0][1])]
    return sharing[0] if len(sharing) == 1 else None


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
        self.share = check_share("FactLedger", share)
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
            head = e.msg.content[:300]
            correction = (e.pin == Pin.CORRECTION or bool(self._correction.search(head))
                          or (e.msg.role == Role.USER and bool(_CHANGE.search(head))))
            kept = [f for f in facts if f.origin != "negated"]
            for f in kept:
                self._put(f, correction)
            for f in facts:
                if f.origin == "negated":
                    self._negate(f, facts)
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
        other_kind = old is not None and bool(old.kind and f.kind) and _family(old.kind) != _family(f.kind)
        if (old is None or other_kind) and correction and f.kind in _KIND_LINKED:
            # a correction that names no slot ("actually, use alice.w@... as my email", 改成周三 after
            # 订周二), a shorter or longer name of it (入住 for 入住时间), or a slot whose value is of
            # another kind ("change the meeting to 4:30pm" after "the meeting on Tuesday at 3pm"): it
            # replaces the task's one current value of its kind, under that value's slot
            unnamed = _unnamed(f)
            kin = [(k, c) for k, c in self.current.items() if k[0] == f.task and _family(c.kind) == _family(f.kind)]
            if unnamed and any(c.value == f.value for _, c in kin):
                return  # the correction said again ("I meant June 2" once more): the value is current already
            fam = [(k, c) for k, c in kin if c.source != f.source and c.value != f.value]
            related = [(k, c) for k, c in fam if _related(key[1], k[1].split("#")[0])]
            # the task's one value of the kind, when nothing names another; else the one whose slot it names
            loose = len(fam) == 1 and (unnamed or other_kind or fam[0][1].slot == kind_label(fam[0][1].kind))
            same = fam if loose else related
            if len(same) == 1:
                self._take_place(*same[0], f)
                return
            rep = _noun_sharing_copy(key[1], fam) if not same else None
            if rep is not None:
                # the task's one value of the kind (an assistant's echo of it aside) under a slot sharing a
                # noun with the correction's ("change the confirmation email to ..." after "send all
                # confirmations to ..."): it takes the stated copy's place, and the echoes and other
                # copies under slots sharing the noun leave; the same value the user gave for another
                # thing stays ("my billing email is ... as well")
                for kc in fam:
                    if kc[0] != rep[0] and (kc[1].status not in _USER_STATUSES or _share_noun(key[1], kc[0][1])):
                        del self.current[kc[0]]
                        self.was.pop(kc[0], None)
                self._take_place(*rep, f)
                return
        elif old is None and correction and f.kind and not _unnamed(f):
            # a correction naming a shorter or longer name of a slot, for values of kinds a task holds
            # several of (预算改成每晚1000元 after 酒店预算每晚不超过800元: an amount): it replaces the one
            # current value of its kind whose slot it names, no other (a flight budget is no hotel budget)
            related = [(k, c) for k, c in self.current.items()
                       if k[0] == f.task and _family(c.kind) == _family(f.kind) and c.source != f.source
                       and c.value != f.value and not _generic(c) and _related(key[1], k[1].split("#")[0])]
            if len(related) == 1:
                self._take_place(*related[0], f)
                return
        if old is not None and old.value == f.value and f.status == "proposed" and old.status in ("stated", "confirmed"):
            return  # the assistant repeats what the user stated: it stays stated (an offer would not be shown)
        if old is not None and old.value != f.value and _listed(old) and _listed(f) and old.source != f.source:
            # a row of another tool result (another search, another page): new data, not a correction
            # of the earlier row at that index; it is current instead, with no old value
            self.was.pop(key, None)
        elif old is not None and old.value != f.value:
            state_update = f.origin == old.origin and f.origin in ("call", "json")
            # a slot nothing names (``id``, ``name``, ``amount``, ``date``: the kind's label) holds values of
            # different things (a member number and a flight, a nightly rate and a total, the outbound and the
            # return date); only a correction of a kind a task holds one of (a date, a time, an email) replaces
            generic = _generic(f) and not (correction and f.kind in _KIND_LINKED)
            if (old.source != f.source and not other_kind and not generic
                    and (correction or old.status in ("proposed", "denied") or state_update)):
                was = self.was.setdefault(key, [])
                if f.value in was:  # back to an earlier value: it is current, no longer an old one
                    was.remove(f.value)
                if old.value not in was[-1:]:
                    was.append(old.value)
            else:  # another value of the same kind (or of the same message: two flights of one offer, the
                # two ends of "10:00-22:00"): both stay current (the old one with what it replaced)
                alt = _alt_key(old)
                self.current[alt] = old
                if key in self.was:
                    self.was[alt] = self.was.pop(key)
        self.current[key] = f
        self._order = None

    def _negate(self, f: Fact, facts: Sequence[Fact]) -> None:
        """A value a message says is not the one ("I meant Wednesday, not Tuesday", 是周三不是周二): it
        is no current value; the task's current values equal to it (case aside) from earlier messages
        leave the ledger, and the first is replaced by the message's value of the same kind beside it
        (just before it in ``facts``, the message's facts in order, else just after), which then
        stands under the old value's slot (and key) with ``was`` the old value and what either had
        replaced."""
        self.facts.append(f)
        k = next(i for i, g in enumerate(facts) if g is f)

        def kin(gs: Sequence[Fact]) -> list[Fact]:
            return [g for g in gs if g.origin != "negated" and g.kind == f.kind]

        new = next(iter(kin(facts[:k])[::-1] or kin(facts[k + 1:])), None)
        for key, cur in list(self.current.items()):
            if key[0] != f.task or cur.source == f.source or cur.value.lower() != f.value.lower():
                continue
            if new is None:  # other current copies of the denied value only leave
                del self.current[key]
                continue
            was: list[str] = []
            for k2, g in list(self.current.items()):
                if g is new:  # the value moves: it stood under its own slot until now
                    del self.current[k2]
                    was += self.was.pop(k2, [])
            self._take_place(key, cur, new, was)
            new = None  # one replacement
        self._order = None

    def _take_place(self, key: tuple[int, str], cur: Fact, new: Fact, was: Sequence[str] = ()) -> None:
        """Current value ``cur`` (under ``key``) is replaced by ``new``, which takes its slot and its
        place (its slot's key, or the key beside a newer value where ``cur`` stood), with ``was`` the
        values ``cur`` had replaced, ``was`` and ``cur``'s value (each once, not ``new``'s)."""
        del self.current[key]
        moved = replace(new, slot=cur.slot)
        target = _key(moved) if key == _key(cur) else _alt_key(moved)
        self.was[target] = [v for v in dict.fromkeys([*self.was.pop(key, []), *was, cur.value]) if v != moved.value]
        self.current[target] = moved
        self._order = None

    def was_of(self, f: Fact) -> list[str]:
        """The values current fact ``f`` replaced, oldest first: those of its slot, or, for a value kept
        current beside a newer one of its slot (both stay current), those it had replaced itself."""
        alt = _alt_key(f)
        was = self.was.get(alt if self.current.get(alt) is f else _key(f), [])
        return [v for v in was if v != f.value]  # a value said again is no old value of itself

    def ordered(self) -> list[Fact]:
        """Current facts by priority (status weight x the source's intrinsic value, x :data:`ROW_WEIGHT`
        for a field of a JSON result's list item), highest first."""
        if self._order is None:
            intr = self.ctx.history.intr.a
            ids = self.ctx.history.ids

            def priority(f: Fact) -> float:
                i = ids.get(f.source)
                row = ROW_WEIGHT if f.origin == "json" and _ROW.search(f.slot) else 1.0
                return row * STATUS_WEIGHT.get(f.status, 1.0) * (float(intr[i]) if i is not None else 0.3)

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
