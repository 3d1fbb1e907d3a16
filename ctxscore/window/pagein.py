"""Page-in: which archived or compressed messages come back, quoted whole, for the current query.

The planner takes the query's search hits (best first), drops those below the relevance floor (no
query term in them, an embedding similarity under ``page_in_floor`` and, when a learned ranker
ordered them, a ranker probability under ``page_in_rank_floor``; for a query that resembles nothing in
the session, anything without a query term or the ranker's support, ``page_in_query_floor``), and quotes up to
``page_in_k`` units verbatim for this build only, each followed by its neighbour (the question an
answer replies to, the answer a question got) and by the message that gave its date (a session's
date marker) when they fit. A hit below the floor that lies within :data:`CONTEXT_SPAN` messages of a
placed hit of the same task is the rest of that exchange: once the hits above the floor are placed,
it is quoted too, in the room they leave (nothing is left out for it), within ``page_in_k`` units in
all; it never decides how the page-ins are shown and is undone first when the window is over
(:meth:`_Planner.context`). The quotes go into one note after the last message
(:class:`~ctxscore.window.assemble.RecalledSection`, in conversation order); the messages stay in the
conversation in their tier, so the window before the note is the one a build without a query shows
and a provider's prompt cache keeps reusing it. Only the members of a unit that are not verbatim in
the conversation are quoted. A hit whose value a later user message replaced (its successor,
:mod:`ctxscore.window.supersede`: "12:00" -> "how about 11:00 instead?") is quoted with that
message, which may make room like a later hit, and its line names the message that replaced it, so
the window does not show the old value as if it were current; a hit already verbatim in the window
whose successor is not brings the successor in (within the first ``page_in_k`` units, and after them
in the room left). When a hit does not fit within ``page_in_limit`` of the budget, the lowest-value
evictable units (not pinned, not recent) are left out of the conversation for this build (the stub
note stays as it was) to make room: the best hit may displace anything evictable; later hits may too
while the window is above the low-water mark (``Policy.low_water``, which a compaction would bring it
down to anyway), and below it only units worth less than themselves. A unit that still does not fit
is quoted as the blocks the query names (long messages), or, for the best hit, in its structured
form (where that is richer than its form in the conversation). When even that does not fit, the
stub note shows only its collapsed line for this build (``[archived N earlier messages first …
last; ...]``: every archived message keeps a stub with its id; at tight budgets, where pinned
content and the recent turns fill the window, the note's lines are often all a page-in can free:
dev sessions at 25% of the full context 0.911 -> 0.924, at 2k tokens 0.937 -> 0.946), and when the
best hit still does not fit, the pinned instructions and corrections are shown condensed for this
build (largest first, as
:meth:`~ctxscore.window.session.SessionState.fit_pins` condenses them when pins exceed the budget:
hard constraints, entities and key spans byte-exact; only as far as the hit's smallest form needs),
and the hit takes the richest of those forms that then fits. Once the best hit is placed, the
quotes leave ``page_in_digest`` of the budget (0.1) to a digest: the further hits (up to
``page_in_k``) that are neither quoted nor verbatim in the window, nor replaced by a later message,
each as one line of its key values only (:func:`digest_line`: entities, key spans and hard
constraints, byte-exact), under :data:`DIGEST_HEADER` in the same note, so that a value the quotes
had no room for is still in the window and the reader can ask for its message (when no digest line
fits, the plan is made again without the share). The later quotes then leave units out or collapse
the stub note more often, which costs prompt-cache reuse when every build has a query; see
``Policy.page_in_digest`` for the figures. Tiers do not change: the next build without a query is
the same.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..config import Policy
from ..messages import Message, Role, Tier
from ..scoring.ranker import RERANK_POOL
from ..store.base import Store
from ..store.retrieval import Hit, query_terms
from ..tokens import TOKENS_PER_MESSAGE
from .history import CODE, Form, History
from .tiers import Forms, collapsed_line, occupancy

log = logging.getLogger("ctxscore")

#: Search hits fetched per query build; the best :data:`RELEVANCE_HITS` of them raise values.
SEARCH_HITS = 40
RELEVANCE_HITS = 20
#: A ranker that puts some hit at this probability or more keeps its say for a query that resembles
#: nothing in the session (:func:`above_floor`). On the dev sessions' ends, of the queries under the
#: query floor, 17 of 18 probe questions and 62 of 374 off-topic questions have such a hit (at 0.6:
#: 17 and 110; at 0.8: 12 and 26).
QUERY_RANK_SURE = 0.7
#: Search hits considered per unit that may be paged in.
CANDIDATES_PER_SLOT = 3
#: A hit below the relevance floor is shown when it lies within this many messages of a placed hit
#: of the same task, in the room left (:meth:`_Planner.context`).
CONTEXT_SPAN = 4
#: How a plan shows its page-ins, in the order they are tried (:func:`plan_page_in`): quoted in the
#: recalled note after the last message (the window before it stays as it was); in place of the
#: entries' current forms with the stub note unchanged; in place, their stub lines dropped (the most
#: room, but the window changes from the stub note on).
MODES = ("quote", "in_place_kept", "in_place")
#: The first line of the note that quotes the page-ins (:class:`~ctxscore.window.assemble.RecalledSection`).
RECALLED_HEADER = "Earlier messages paged back in (in their original order; a newer message overrides them):"
#: The line that opens the digest part of the recalled note: further hits shown as their key values only.
DIGEST_HEADER = "Other matches, key values only (ask about one to see it whole):"
#: Characters of key values a digest line shows at most (spans past it are left out whole).
DIGEST_CHARS = 200


def digest_line(history: History, forms: Forms, i: int) -> str | None:
    """The digest line of entry ``i``: its tag (:func:`recalled_tag`) and its key spans
    (:meth:`~ctxscore.window.tiers.Forms.key_spans`: entities, the extractor's spans, hard
    constraints) byte-exact with their whitespace collapsed, in text order, a span inside another
    left out, joined by `` | `` while they total at most :data:`DIGEST_CHARS` characters; ``None``
    when it has none. ``"[#117 assistant] 9 options | 6:20 am | $55"``."""
    e = history.entries[i]
    spans = sorted(forms.key_spans(e), key=lambda s: (e.msg.content.find(s), -len(s)))
    out: list[str] = []
    size = 0
    for s in spans:
        s = " ".join(s.split())
        if not s or any(s in o for o in out):
            continue
        if size + len(s) > DIGEST_CHARS:
            break
        out.append(s)
        size += len(s) + 3
    if not out:
        return None
    return recalled_tag(history, i) + " | ".join(out)


def recalled_tag(history: History, i: int) -> str:
    """The tag that opens the quote of entry ``i``: its position in the conversation and its role,
    ``[#12 user] `` (a tool result names its tool and call, ``[#13 tool search_flights call_9] ``; a
    message that a later user message restates names its position, ``[#12 user, restated in #63] ``,
    :mod:`~ctxscore.window.supersede`). Positions, not message ids: ids can be long, and the quote
    should cost about what the message does."""
    e = history.entries[i]
    m = e.msg
    tag = " ".join(x for x in (f"#{i}", m.role, m.name if m.role == Role.TOOL else None, m.tool_call_id) if x)
    if e.successor is not None:
        tag += f", restated in #{e.successor}"
    return f"[{tag}] "


@dataclass(frozen=True)
class PageInPlan:
    """What one build pages in.

    Attributes:
        shown: entry index -> id of the hit it is quoted for in the recalled note (a unit's members
            share it), in the order the hits ranked.
        evicted: entries left out of the conversation for this build to make room (no stub line).
        unplaced: hits that had no room even after eviction (ids, best first).
        forms: entries of ``shown`` that are quoted in a compressed tier rather than verbatim (the
            best hit's unit did not fit verbatim), entry index -> tier.
        texts: long entries of ``shown`` quoted as the blocks the query names, entry index -> form.
        condensed: pinned entries shown condensed for this build to make room for the best hit,
            entry index -> tier (structured or compressed).
        in_place: entries of ``shown`` shown in the conversation in place of their current form or
            stub rather than quoted (quoting them would have placed fewer hits).
        stubs_kept: the stub note keeps the lines of archived entries shown in place.
        stubs_collapsed: every line of the stub note is collapsed into its one line ``[archived N
            earlier messages first … last; ask about them ...]`` for this build, to make room for a hit.
        fitted: members of the last unit shown in a form fitted to the room the budget leaves them
            for this build (:meth:`~ctxscore.window.tiers.Forms.fitted_form`: the last message alone
            is larger than the budget), entry index -> form.
        digest: entry index -> its line (:func:`digest_line`) for hits not quoted, shown after the
            quotes in the recalled note; :meth:`without_last` drops them after ``context``.
        context: ids of the hits below the relevance floor shown beside a placed hit
            (:meth:`_Planner.context`); :meth:`covers` does not ask for them and
            :meth:`without_last` drops them first.
    """

    shown: dict[int, str] = field(default_factory=dict)
    evicted: frozenset[int] = frozenset()
    unplaced: tuple[str, ...] = ()
    forms: dict[int, Tier] = field(default_factory=dict)
    texts: dict[int, Form] = field(default_factory=dict)
    condensed: dict[int, Tier] = field(default_factory=dict)
    in_place: frozenset[int] = frozenset()
    stubs_kept: bool = True
    stubs_collapsed: bool = False
    fitted: dict[int, Form] = field(default_factory=dict)
    digest: dict[int, str] = field(default_factory=dict)
    context: frozenset[str] = frozenset()

    @property
    def changes(self) -> bool:
        """Whether the plan changes the window: an entry shown, evicted or in the digest."""
        return bool(self.shown or self.evicted or self.digest)

    def richness(self, i: int) -> int:
        """How much of shown entry ``i`` this plan shows: 0 verbatim, 1 the blocks the query names,
        else the code of its tier (:data:`~ctxscore.window.history.CODE`)."""
        return 1 if i in self.texts else CODE[self.forms.get(i, Tier.VERBATIM)]

    def covers(self, other: PageInPlan) -> bool:
        """Every entry ``other`` shows for a hit above the floor (not ``context``) is shown at least as
        richly here, and nothing more is left out (evicted) or condensed. (A plan that collapses the
        stub note may cover one that does not: both change the window from the note on; requiring
        the note kept lost a little recall on the dev sessions.)"""
        return (all(i in self.shown and self.richness(i) <= other.richness(i)
                    for i, h in other.shown.items() if h not in other.context)
                and self.evicted <= other.evicted and self.condensed.keys() <= other.condensed.keys())

    def without_last(self) -> PageInPlan:
        """The plan with its lowest-ranked page-in undone (evictions stay): the hits shown beside a
        placed hit (``context``) first, then the digest lines, then the quotes."""
        order = list(dict.fromkeys(self.shown.values()))
        context = [h for h in order if h in self.context]
        if self.digest and not context:
            return replace(self, digest={})
        if not order:
            return self
        drop = (context or order)[-1]
        shown = {i: h for i, h in self.shown.items() if h != drop}
        return PageInPlan(shown, self.evicted, (*self.unplaced, drop), {i: t for i, t in self.forms.items() if i in shown},
                          {i: f for i, f in self.texts.items() if i in shown}, self.condensed if shown else {},
                          self.in_place & shown.keys(), self.stubs_kept, self.stubs_collapsed and bool(shown),
                          digest=self.digest, context=self.context - {drop})


def plan_page_in(hits: list[Hit], history: History, values: np.ndarray, forms: Forms, policy: Policy,
                 budget: int, reserved: int = 0, terms: Sequence[str] = (), excess: int = 0) -> PageInPlan:
    """Plan the page-in of one build (see the module docstring).

    The room is counted as :func:`~ctxscore.window.tiers.occupancy` counts the window (the messages
    shown plus the archive stubs up to their cap), plus the recalled note: a quote adds its tokens and
    its tag's, the first one the note's header too, and frees nothing (the message keeps its form or
    stub in the conversation); an evicted unit frees its tokens and adds no stub.

    Args:
        hits: the query's search hits, best first.
        history: the session history (read only).
        values: the value of every entry, shape (n,).
        forms: the form cache (stub sizes of evicted units).
        policy: ``page_in_k``, ``page_in_limit``, ``recent_turns`` and ``stub_fraction`` (the stub cap).
        budget: the token budget of this build.
        reserved: tokens of the window's layer sections (beside the messages and their stubs).
        terms: the query's terms (a long message that does not fit is shown as the blocks holding them).
        excess: tokens the last unit counts less than it holds: the build cuts it to the room left
            (:func:`~ctxscore.window.tiers.last_excess`).
    """
    idents = identifier_terms(terms)
    holds = (lambda h: _holds(history, h.id, idents)) if idents else None
    above = above_floor(hits, policy, holds)
    copy = _copies(history)  # once for the build's planners: a copy of a better hit or a shown message
    placeable = [h for h in above if (i := history.ids.get(h.id)) is not None and not copy(i)]
    if not placeable:
        return PageInPlan()
    # below the floor: only beside a placed hit (_Planner.context), and never for a query that
    # resembles nothing in the session (the query-level floor)
    kept = {h.id for h in above}
    near = [] if resembles_nothing(hits, policy) else [
        h for h in hits if h.id not in kept and (i := history.ids.get(h.id)) is not None and not copy(i)]
    hits = placeable
    first = _Planner(history, values, forms, policy, budget, reserved, terms, "in_place", excess=excess)

    def planned(planner: _Planner) -> PageInPlan:
        plan = planner.plan(hits, near)
        if plan.digest or not planner.digest_room:
            return plan
        # no digest line came of the share the later quotes left it: the plan that gives them all of it
        return _Planner(history, values, forms, policy, budget, reserved, terms, planner.mode, first, excess,
                        digest=False).plan(hits, near)

    best = planned(first)
    if not best.shown:
        return best
    for mode in ("quote", "in_place_kept"):  # the first that shows everything the roomiest one does
        plan = planned(_Planner(history, values, forms, policy, budget, reserved, terms, mode, first, excess))
        if plan.covers(best):
            return plan
    return best


def above_floor(hits: Sequence[Hit], policy: Policy, holds: Callable[[Hit], bool] | None = None) -> list[Hit]:
    """The hits above the relevance floor, in their order: a query term occurs in the message (or
    its index context, :attr:`Hit.lexical <ctxscore.store.retrieval.Hit.lexical>`), its
    embedding's cosine similarity to the query's is at least ``policy.page_in_floor``, or a learned
    ranker gave it a probability of at least ``policy.page_in_rank_floor`` (:attr:`Hit.learned
    <ctxscore.store.retrieval.Hit.learned>`). When no hit's similarity reaches
    ``policy.page_in_query_floor`` (the query resembles nothing in the session) and the ranker is
    sure of none (:data:`QUERY_RANK_SURE`), a hit needs both: a query term in it and, when a ranker
    ordered the hits, the ranker's probability -- or it holds an identifier the query names
    (``holds``, see :func:`identifier_terms`): the ranker reads a long message's first and last
    1,200 characters only, so it put a 22 KB log holding the asked ``TX-88412-ZQ`` at 0.01."""
    if resembles_nothing(hits, policy):
        return [h for h in hits if h.lexical and (h.learned is None or h.learned >= policy.page_in_rank_floor
                                                  or (holds is not None and holds(h)))]
    return [h for h in hits if h.lexical or (h.similarity is not None and h.similarity >= policy.page_in_floor)
            or (h.learned is not None and h.learned >= policy.page_in_rank_floor)]


def resembles_nothing(hits: Sequence[Hit], policy: Policy) -> bool:
    """Whether the query resembles nothing in the session: no hit's embedding similarity reaches
    ``policy.page_in_query_floor`` and no learned ranker probability :data:`QUERY_RANK_SURE`
    (:func:`above_floor`); ``False`` when no hit has a similarity (keyword search alone)."""
    sims = [h.similarity for h in hits if h.similarity is not None]
    sure = max((h.learned for h in hits if h.learned is not None), default=0.0) >= QUERY_RANK_SURE
    return bool(sims) and max(sims) < policy.page_in_query_floor and not sure


#: A query term that names an identifier: letters and two digits or more together (``tx-88412-zq``,
#: ``ord-1039``, ``hat136``; not ``python3``, ``utf-8`` or ``gpt-4o``), or six digits or more (an
#: order or a phone number).
_IDENT = re.compile(r"(?=(?:[^\d]*\d){2})(?=.*[^\W\d_])[\w-]{5,}|\d{6,}")


def identifier_terms(terms: Sequence[str]) -> list[str]:
    """The query terms (lower-cased, :func:`~ctxscore.store.retrieval.query_terms`) that name an
    identifier (:data:`_IDENT`)."""
    return [t for t in terms if _IDENT.fullmatch(t)]


#: Entries at the end of the history that a hit is compared with for a copy (:func:`_copies`).
COPIES_LOOKBACK = 40


def _copies(history: History) -> Callable[[int], bool]:
    """``copy(i)``: whether entry ``i``'s text repeats a better hit's asked before (the first of them
    wins) or a message verbatim among the last :data:`COPIES_LOOKBACK` entries. An agent that says
    "Still failing; ..." after every test run had 12 identical quotes paged in for one question,
    which left no room for the run that showed the first error. Messages without text (a tool call)
    or with media parts (two screenshots sent with one caption) are never copies."""
    entries = history.entries
    start = max(0, len(entries) - COPIES_LOOKBACK)
    seen = {(e.msg.role, e.msg.content): j for j, e in enumerate(entries[start:], start)
            if e.tier == Tier.VERBATIM and isinstance(e.msg.content, str) and e.msg.content and not e.msg.has_media}

    def copy(i: int) -> bool:
        msg = entries[i].msg
        if not isinstance(msg.content, str) or not msg.content or msg.has_media:  # two screenshots, one caption
            return False
        j = seen.setdefault((msg.role, msg.content), i)
        return j != i  # another message with this text is shown or was asked before

    return copy


def _holds(history: History, hit_id: str, idents: Sequence[str]) -> bool:
    """Whether the message of ``hit_id`` holds one of the identifiers ``idents`` (case-folded)."""
    i = history.ids.get(hit_id)
    if i is None:
        return False
    text = history.entries[i].msg.text().lower()
    # whole: epoch3 is not in epoch30
    return any(re.search(rf"(?<![\w-]){re.escape(t)}(?![\w-])", text) for t in idents if t in text)


def _evictable(history: History, values: np.ndarray, policy: Policy) -> list[tuple[int, list[int]]]:
    """The units a page-in may leave out to make room, ``(unit, members)`` lowest value first: outside
    the recent turns, nothing pinned, no hard constraint, not archived already."""
    entries = history.entries
    units = [(u, m) for u, m in history.eligible_units(policy.recent_turns).items()
             if history.archivable(m) and any(entries[i].tier != Tier.ARCHIVED for i in m)]
    return sorted(units, key=lambda um: float(max(values[i] for i in um[1])))


class _Planner:
    """The state of one page-in plan (see :func:`plan_page_in`)."""

    def __init__(self, history: History, values: np.ndarray, forms: Forms, policy: Policy, budget: int,
                 reserved: int, terms: Sequence[str], mode: str,
                 like: _Planner | None = None, excess: int = 0, digest: bool = True) -> None:
        self.h, self.values, self.forms, self.policy, self.terms = history, values, forms, policy, terms
        self.budget, self.reserved = budget, reserved
        self.limit = policy.page_in_limit * budget
        self.full_limit = self.limit  # the digest's lines may fill the window up to it
        self.digest_room = policy.page_in_digest * budget if digest else 0.0  # what quotes after the best leave it
        self.low_water = policy.low_water * budget
        # what the window's occupancy is made of, as this plan changes it: message tokens, stub tokens,
        # and each entry the plan changed (shown, evicted, condensed) -> (archived, tokens)
        self.msg, self.stub = history.msg_tokens - excess, history.stub_tokens
        self.state: dict[int, tuple[bool, int]] = {}
        self.shown: dict[int, str] = {}
        self.quoted = 0  # entries counted in the recalled note
        self.mode = mode
        # what depends on the history alone, counted once for the plans of one build (``like``)
        self._header: int | None = like._header if like else None
        self._collapsed: int | None = like._collapsed if like else None
        self._extra: dict[int, int] = like._extra if like else {}
        self.tiers: dict[int, Tier] = {}
        self.texts: dict[int, Form] = {}
        self.unplaced: list[str] = []
        self.evicted: set[int] = set()
        self.done: set[int] = set()
        self.keep: set[int] = set()  # units never evicted: what replaced a hit (see plan)
        self.placed: list[int] = []  # the entries of the hits placed, in order (context's anchors)
        self.context_hits: set[str] = set()  # ids of the hits context showed
        self.condensed: dict[int, Tier] = {}  # pinned entries condensed for the best hit (see condense_pins)
        # (unit, members) that may make room, lowest value first; computed when first needed
        self._evictable: list[tuple[int, list[int]]] | None = like._evictable if like else None
        self.stubs_collapsed = False

    def unit_value(self, members: list[int]) -> float:
        return float(max(self.values[i] for i in members))

    @property
    def occ(self) -> int:
        """The window's estimated tokens under the plan so far."""
        return occupancy(self.msg, self.stub, self.policy, self.budget) + self.reserved

    def _now(self, i: int) -> tuple[bool, int]:
        """Entry ``i`` under the plan so far: (shown as a stub, tokens)."""
        e = self.h.entries[i]
        return self.state.get(i, (e.tier == Tier.ARCHIVED, e.cur_tokens))

    def _moved(self, targets: dict[int, int]) -> tuple[int, int]:
        """``(message tokens, stub tokens)`` after showing each entry of ``targets`` at its tokens, as
        the plan's mode shows them (:data:`MODES`): quoted (the entry keeps its form or stub in the
        conversation; the note grows by its line and, with the first quote, by its header), or in place
        of its current form (``in_place`` frees its stub too, ``in_place_kept`` keeps the stub line)."""
        if self.mode == "quote":
            msg = self.msg + sum(t + self.quote_extra(i) for i, t in targets.items())
            return msg + (self.header_tokens if targets and not self.quoted else 0), self.stub
        msg, stub = self.msg, self.stub
        for i, t in targets.items():
            was_stub, cur = self._now(i)
            if not was_stub:
                msg -= cur
            elif self.mode == "in_place" and not self.stubs_collapsed:  # the collapsed line stays as it is
                stub -= cur
            msg += t
        return msg, stub

    @property
    def collapsed_tokens(self) -> int:
        """Tokens of the stub note collapsed into its one line (every archived message), as the build
        shows it. The allowance :data:`~ctxscore.window.tiers.COLLAPSED_LINE_TOKENS` (40) is off either
        way: the line takes 26 tokens with ids like ``m2`` and 48 with long ones; counted at 40, a
        travel chat's 33-token best hit was left out at 600 tokens."""
        if self._collapsed is None:
            arch = [e.msg.id for e in self.h.entries if e.tier == Tier.ARCHIVED]
            self._collapsed = 0 if not arch else self.forms.counter.count_message(
                Message(role="system", content=collapsed_line(len(arch), str(arch[0]), str(arch[-1]))))
        return self._collapsed

    @property
    def header_tokens(self) -> int:
        """Tokens of the recalled note's header line and chat overhead."""
        if self._header is None:
            self._header = self.forms.counter.count_message(Message(role="system", content=RECALLED_HEADER))
        return self._header

    def quote_extra(self, i: int) -> int:
        """Tokens a quote of entry ``i`` costs beyond the entry's own tokens: its tag and line break,
        less the chat overhead a message has and a quote does not."""
        got = self._extra.get(i)
        if got is None:
            e, count = self.h.entries[i], self.forms.counter.count
            got = self._extra[i] = count(recalled_tag(self.h, i)) + 1 - TOKENS_PER_MESSAGE - count(e.msg.role)
        return got

    def fits(self, targets: dict[int, int]) -> bool:
        """Whether the window stays within the plan's limit (``page_in_limit`` of the budget, less the
        digest's share once the best hit is placed) when each entry of ``targets`` is shown at its
        tokens (``occ + delta(targets) <= limit``, counted once)."""
        msg, stub = self._moved(targets)
        return occupancy(msg, stub, self.policy, self.budget) + self.reserved <= self.limit

    def delta(self, targets: dict[int, int]) -> int:
        """Tokens the window grows by when each entry of ``targets`` is shown at its tokens."""
        msg, stub = self._moved(targets)
        return occupancy(msg, stub, self.policy, self.budget) - occupancy(self.msg, self.stub, self.policy, self.budget)

    def show(self, targets: dict[int, int]) -> None:
        """Count each entry of ``targets`` as shown at its tokens."""
        self.msg, self.stub = self._moved(targets)
        if self.mode == "quote":
            self.quoted += len(targets)
        else:
            for i, t in targets.items():
                self.state[i] = (False, t)

    def verbatim(self, members: list[int]) -> dict[int, int]:
        """The tokens of ``members`` shown verbatim."""
        return {i: self.h.entries[i].tokens for i in members}

    def plan(self, hits: list[Hit], near: Sequence[Hit] = ()) -> PageInPlan:
        entries, ids = self.h.entries, self.h.ids
        cands: list[tuple[str, int]] = []  # (hit id, entry to show)
        shown_above: list[int] = []  # per candidate: how many hits verbatim in the window rank above it
        verbatim: list[int] = []  # the units of those hits, best first
        for h in hits:  # known, and no copies (plan_page_in)
            i = ids[h.id]
            if entries[i].successor is not None:  # what replaced a hit is never evicted to make room
                self.keep.add(entries[entries[i].successor].unit)  # type: ignore[index]
            if entries[i].tier != Tier.VERBATIM:
                cands.append((h.id, i))
                shown_above.append(len(verbatim))
                continue
            if _successor(self.h, i) is not None:  # shown already; what replaced it is not
                cands.append((h.id, entries[i].successor))  # type: ignore[arg-type]
                shown_above.append(len(verbatim))
            verbatim.append(entries[i].unit)
        for k, (hid, hit) in enumerate(cands[: self.policy.page_in_k * CANDIDATES_PER_SLOT]):
            if len(self.done) >= self.policy.page_in_k:
                break
            # a better hit the window shows is never left out to make room for this one (it evicted
            # the message answering "what is my booking ref?" for a tool result that ranked lower)
            self.keep.update(verbatim[: shown_above[k]])
            if entries[hit].unit not in self.done:
                self.place(hid, hit)
            if self.done:  # the best hit had the whole limit; the later ones leave the digest its share
                self.limit = self.full_limit - self.digest_room
        for hid, hit in cands:  # the rest of the window's outdated statements: what replaced them, in the room left
            if entries[ids[hid]].tier == Tier.VERBATIM and entries[hit].unit not in self.done and hit not in self.shown:
                self.companion(hid, entries[hit].unit, hit)
        self.context(near)
        digest = self.digest([hit for _, hit in cands])
        return PageInPlan(digest=digest, shown=self.shown, evicted=frozenset(self.evicted - set(self.shown)),
                          unplaced=tuple(self.unplaced), forms=self.tiers, texts=self.texts, condensed=self.condensed,
                          in_place=frozenset() if self.mode == "quote" else frozenset(self.shown),
                          stubs_kept=self.mode != "in_place", stubs_collapsed=self.stubs_collapsed,
                          context=frozenset(self.context_hits))

    def context(self, near: Sequence[Hit]) -> None:
        """Show the hits below the relevance floor (``near``, best first) that lie beside a placed
        hit, in the room the placed hits leave (nothing is left out for them): within
        :data:`CONTEXT_SPAN` messages of a placed hit of the same task (not of what came with it: a
        date marker, a message that replaced it), up to ``page_in_k`` units in all. A hit a later
        message replaced (``successor``) comes with that message or not at all; a unit left out to
        make room stays out. The floor keeps a hit that shares nothing with the query out; beside a
        placed hit, it is the rest of that exchange ("So I will play Malibu in the Living Room
        right?" four turns after the "find me some music" a query for the music request's device
        placed)."""
        if not self.placed or not near:
            return
        entries, ids = self.h.entries, self.h.ids
        for h in near:
            if len(self.done) >= self.policy.page_in_k:
                break
            i = ids[h.id]
            e = entries[i]
            if e.tier == Tier.VERBATIM or e.unit in self.done or i in self.shown:
                continue
            if not any(abs(j - i) <= CONTEXT_SPAN and entries[j].task == e.task for j in self.placed):
                continue
            succ = _successor(self.h, i)  # what replaced it comes with it, or it does not come
            units = [e.unit] if succ is None or succ in self.done else [e.unit, succ]
            members = [j for u in units for j in self.quotable(self.h.units[u]) if j not in self.shown]
            if not members or not self.evicted.isdisjoint(members) or not self.fits(self.verbatim(members)):
                continue
            for u in units:
                self.companion(h.id, u, i)
            if self.shown.get(i) == h.id:
                self.done.add(e.unit)
                self.context_hits.add(h.id)

    def digest(self, hits: list[int]) -> dict[int, str]:
        """Digest lines (:func:`digest_line`) of the candidate entries ``hits`` (best first) that are
        not shown, not verbatim in the window, not replaced by a later message (no successor), not
        left out of the conversation and not of a unit already placed, up to ``Policy.page_in_k``
        lines while the window stays within ``page_in_limit`` of the budget; their tokens (and the
        note's header line) are counted as shown. ``{}`` when the policy's ``page_in_digest`` is 0
        or no hit was placed (the window holds the best match: lower ones would only add noise)."""
        out: dict[int, str] = {}
        if not self.digest_room or not self.done:
            return out
        count, entries = self.forms.counter.count, self.h.entries
        # its header line; the note's own header and chat overhead too when the note quotes nothing
        extra = count(DIGEST_HEADER) + 1 + (0 if self.quoted and self.mode == "quote" else self.header_tokens)
        for i in hits:
            e = entries[i]
            if (len(out) >= self.policy.page_in_k or i in self.shown or e.unit in self.done
                    or e.tier == Tier.VERBATIM or e.successor is not None or i in self.evicted):
                continue
            line = digest_line(self.h, self.forms, i)
            if line is None:
                continue
            t = extra + count(line) + 1
            if occupancy(self.msg + t, self.stub, self.policy, self.budget) + self.reserved > self.full_limit:
                continue
            self.msg += t
            extra = 0
            out[i] = line
        return out

    def bring_back(self, u: int) -> list[int]:
        """Count the members of unit ``u`` (of several messages: a tool call with its results) an
        earlier hit's room left out as shown again in their current forms (a unit is left out whole
        or not at all); returns them, for :meth:`leave_out` when what brought them back is not shown
        after all. A unit of one message is left as it was: shown, it is no longer left out. So a
        unit is left out whole or not at all, and no tool result is sent without its call."""
        members = self.h.units[u]
        if len(members) < 2:
            return []
        back = [i for i in members if i in self.evicted]
        for i in back:
            self.evicted.discard(i)
            if self.state.get(i) == (True, 0) and self.h.entries[i].tier != Tier.ARCHIVED:
                del self.state[i]
                self.msg += self.h.entries[i].cur_tokens
        return back

    def leave_out(self, members: list[int]) -> None:
        """Leave ``members`` (a whole unit) out of this build, with no stub line (:meth:`make_room`;
        undoes :meth:`bring_back`)."""
        for i in members:
            was_stub, cur = self._now(i)
            if not was_stub:
                self.msg -= cur
                self.state[i] = (True, 0)
        self.evicted.update(members)

    def place(self, hid: str, hit: int) -> None:
        """Show the unit of ``hit`` (making room, or in a smaller form, when it does not fit; then
        collapsing the stub note and, for the best hit, condensing the pins when even that does not
        fit), then its neighbours."""
        u = self.h.entries[hit].unit
        members = self.quotable(self.h.units[u])
        if not members or all(i in self.shown for i in members):
            return  # shown already with an earlier hit (what replaced it, its question): no second slot
        back = self.bring_back(u)  # a unit an earlier hit's room left out: whole again, its tokens counted
        targets = self.verbatim(members)
        tiers: dict[int, Tier] = {}
        texts: dict[int, Form] = {}
        if not self.fits(targets):
            self.make_room(u, targets, hit)
            targets, texts, tiers = self.fitted(members, hit)
            saved, stub = 0, self.stub
            if not self.fits(targets) and stub > self.collapsed_tokens and not self.stubs_collapsed:
                # the stub note collapsed into its one line for this build (the pins stay as they are if that is enough)
                self.stubs_collapsed, self.stub = True, self.collapsed_tokens
                targets, texts, tiers = self.fitted(members, hit)
            if not self.fits(targets) and not self.done:
                # the best hit: the pins condensed for this build, as far as its smallest form needs
                smallest = min(self.delta(self.verbatim(members)), self.delta(self.all_structured(members)))
                saved = self.condense_pins(smallest)
                if saved:
                    targets, texts, tiers = self.fitted(members, hit)
            if not targets or not self.fits(targets):
                self.unplaced.append(hid)
                self.leave_out(back)
                if saved:  # condensing the pins did not make room for it: show them as they were
                    for i in self.condensed:
                        self.msg += self.h.entries[i].cur_tokens - self.state.pop(i)[1]
                    self.condensed.clear()
                if self.stubs_collapsed and self.stub != stub:  # nor did collapsing the stub note: keep it
                    self.stubs_collapsed, self.stub = False, stub
                return
        for i in targets:
            self.shown[i] = hid
        self.tiers.update(tiers)
        self.texts.update(texts)
        self.show(targets)
        self.done.add(u)
        self.placed.append(self.h.ids[hid])
        pair = _neighbour(self.h, hit)
        # what replaced the hit (or the question it answers) first: it may make room, like the hit
        for src in (hit, pair):
            nb = _successor(self.h, src) if src is not None else None
            if nb is not None and nb not in self.done:
                self.companion(hid, nb, hit, room=True)
        for nb in (pair, _date_source(self.h, hit)):
            if nb is not None and nb not in self.done:
                self.companion(hid, nb, hit)

    def companion(self, hid: str, nb: int, hit: int, room: bool = False) -> None:
        """Show unit ``nb`` verbatim with the hit ``hid`` when it fits (``room``: making room for it
        like for a later hit, units worth less than the hit ``hit``)."""
        targets = self.verbatim([i for i in self.quotable(self.h.units[nb]) if i not in self.shown])
        if not targets:
            return
        back = self.bring_back(nb)
        if room and not self.fits(targets):
            self.make_room(nb, targets, hit)
        if self.fits(targets):
            for i in targets:
                self.shown.setdefault(i, hid)
            self.show(targets)
        else:
            self.leave_out(back)

    def quotable(self, members: list[int]) -> list[int]:
        """The members of a unit that a quote shows more of: those not verbatim in the conversation."""
        return [i for i in members if self.h.entries[i].tier != Tier.VERBATIM]

    def fitted(self, members: list[int], hit: int) -> tuple[dict[int, int], dict[int, Form], dict[int, Tier]]:
        """The richest form of a unit that fits in the room left: verbatim, the blocks the query
        names (long members), for the best hit its structured form; ``(tokens of each member, block
        forms, tiers)`` of the first that fits, else of the last one tried."""
        full = self.verbatim(members)
        if self.fits(full):
            return full, {}, {}
        targets, texts = self.query_blocks(members)
        if self.fits(targets) or self.done:
            return targets, texts, {}
        targets, tiers = self.structured(members, hit)
        return targets, {}, tiers

    def query_blocks(self, members: list[int]) -> tuple[dict[int, int], dict[int, Form]]:
        """The unit with its long members shown as the blocks holding the query's terms: ``(tokens of
        each member, forms)``, or the verbatim figures when no member is long or no block matches."""
        entries = self.h.entries
        room = self.limit - self.occ
        texts: dict[int, Form] = {}
        targets: dict[int, int] = {}
        for i in members:
            e = entries[i]
            f = (self.forms.query_form(e, list(self.terms), int(room) - self.delta({**targets, i: 0} if self.mode == "quote" else targets))
                 if e.tokens > room / 2 else None)
            if f is not None and f.tokens < e.tokens:
                texts[i] = f
                targets[i] = f.tokens
            else:
                targets[i] = e.tokens
        return (targets, texts) if texts else (self.verbatim(members), {})

    def structured(self, members: list[int], hit: int) -> tuple[dict[int, int], dict[int, Tier]]:
        """The cheapest way to show a unit that does not fit verbatim: the hit verbatim and the other
        members structured, else every member structured (a member whose structured form is no richer
        than its form in the conversation is not quoted); ``(tokens of each quoted member, tiers)`` of
        the first that fits, else the verbatim figures."""
        entries = self.h.entries
        for keep in (hit, None):
            tiers = {i: self.forms.reached(entries[i], Tier.STRUCTURED) for i in members if i != keep}
            tiers = {i: t for i, t in tiers.items() if CODE[t] < CODE[entries[i].tier]}
            targets = {i: self.forms.get(entries[i], tiers[i]).tokens if i in tiers else entries[i].tokens
                       for i in members if i in tiers or i == keep}
            if not targets:
                continue
            if self.fits(targets):
                return targets, {i: t for i, t in tiers.items() if t != Tier.VERBATIM}
        return self.verbatim(members), {}

    def all_structured(self, members: list[int]) -> dict[int, int]:
        """The tokens of every member of a unit in its structured form (its smallest form)."""
        entries = self.h.entries
        return {i: self.forms.get(entries[i], self.forms.reached(entries[i], Tier.STRUCTURED)).tokens for i in members}

    def condense_pins(self, delta: int) -> int:
        """Show pinned instructions and corrections (never a system message) in their structured form
        for this build, the largest first, until ``delta`` more tokens fit; returns the tokens saved."""
        saved = 0
        for i in self.h.condensable_pins():
            if self.occ + delta <= self.limit:
                break
            e = self.h.entries[i]
            if e.tier != Tier.VERBATIM or e.no_compress or i in self.shown:
                continue
            got = self.forms.condensed(e)
            if got is not None:
                self.condensed[i] = got[0]
                self.state[i] = (False, got[1].tokens)
                self.msg -= e.cur_tokens - got[1].tokens
                saved += e.cur_tokens - got[1].tokens
        return saved

    def make_room(self, u: int, targets: dict[int, int], hit: int) -> None:
        """Leave the lowest-value evictable units out of this build until ``targets`` (entry -> tokens
        shown) fit: the best hit may displace anything evictable; later hits too while the window is
        above the low-water mark (a compaction would archive those units down to it anyway), below
        it only units worth less than themselves."""
        if self.fits(targets):
            return
        if self._evictable is None:
            self._evictable = _evictable(self.h, self.values, self.policy)
        for uu, m in self._evictable:
            if (uu == u or uu in self.done or uu in self.keep or not self.evicted.isdisjoint(m)
                    or any(i in self.shown for i in m)):
                continue
            if self.done and self.unit_value(m) >= self.values[hit] and self.occ <= self.low_water:
                break
            self.leave_out(m)  # for this build: the stub note stays as it was
            if self.fits(targets):
                break


def _neighbour(history: History, i: int) -> int | None:
    """The unit of the message that pairs with entry ``i`` as question and answer (the user message an
    assistant reply answers, or the assistant reply to a user message), when it is not verbatim."""
    entries = history.entries
    role = entries[i].msg.role
    j = entries[i].unit - 1 if role == Role.ASSISTANT else (i + 1 if role == Role.USER else None)
    if j is None or not 0 <= j < len(entries):
        return None
    e = entries[j]
    want = Role.USER if role == Role.ASSISTANT else Role.ASSISTANT
    if e.msg.role != want or all(entries[k].tier == Tier.VERBATIM for k in history.units[e.unit]):
        return None
    return e.unit


def _successor(history: History, i: int) -> int | None:
    """The unit of the later user message that restates entry ``i`` (:attr:`Entry.successor`, see
    :mod:`ctxscore.window.supersede`), when it is not verbatim: a page-in of an old statement then
    carries the one that replaced it."""
    j = history.entries[i].successor
    if j is None:
        return None
    u = history.entries[j].unit
    return None if all(history.entries[k].tier == Tier.VERBATIM for k in history.units[u]) else u


def _date_source(history: History, i: int) -> int | None:
    """The unit of the message whose date marker governs entry ``i`` ("[8 May 2023] ..."), when it is
    not verbatim: a page-in then carries the date the hit happened on."""
    j = history.entries[i].date_from
    if j is None or j == i:
        return None
    u = history.entries[j].unit
    return None if all(history.entries[k].tier == Tier.VERBATIM for k in history.units[u]) else u


#: Letters outside ASCII that are not CJK (Cyrillic, Hangul, Arabic ...): a query in such a script has
#: no keyword terms (:func:`~ctxscore.store.retrieval.query_terms`) and is searched by embedding.
_OTHER_LETTER = re.compile(r"[^\W\d_A-Za-z\u3400-\u9fff\uf900-\ufaff]")


def names_anything(query: str) -> bool:
    """Whether a query can page anything in: it has a keyword term
    (:func:`~ctxscore.store.retrieval.query_terms`; stop words such as "yes", "please", "ok" are
    none), or letters of a script the keyword search does not split (searched by embedding alone).
    The proxy and the middleware ask with the last user message: "Yes please." paged in 10 messages
    of restaurant searches by embedding similarity alone."""
    fts, short = query_terms(query)
    return bool(fts or short) or _OTHER_LETTER.search(query) is not None


def search(store: Store, session_id: str, scorer: Any, query: str, k: int) -> list[Hit]:
    """The store's hybrid search for ``query``, with the query embedded by the scorer when it can
    (``embed_texts``); an embedding failure falls back to keyword search with one log line.

    A scorer with a learned ranker (``rerank(query, embedding, hits, store, session_id)``, see
    :mod:`ctxscore.scoring.ranker`) re-orders a pool of :data:`~ctxscore.scoring.ranker.RERANK_POOL`
    fused hits and the best ``k`` are returned; a ranker failure keeps the fused order (one log line).
    """
    embedding = None
    embed = getattr(scorer, "embed_texts", None)
    if embed is not None:
        try:
            embedding = embed([query])[0]
        except Exception as exc:  # noqa: BLE001 - vector search is optional; keyword search still runs
            log.warning("query embedding failed (%s); using keyword search only", exc)
    rerank = getattr(scorer, "rerank", None) if getattr(scorer, "ranker", None) is not None else None
    if rerank is None:
        return store.search(session_id, query, k=k, query_embedding=embedding)
    hits = store.search(session_id, query, k=max(k, RERANK_POOL), query_embedding=embedding)
    try:
        return rerank(query, embedding, hits, store, session_id)[:k]
    except Exception as exc:  # noqa: BLE001 - the learned order is optional; the fused one still works
        log.warning("learned re-ranking failed (%s); using the fused order", exc)
        return hits[:k]


def fit_page_in(plan: PageInPlan, limit: float, assemble: Callable[[PageInPlan], Any]) -> tuple[Any, PageInPlan]:
    """Undo page-ins, the lowest-ranked first, until ``assemble(plan).tokens`` is within ``limit``
    (planning uses per-message estimates; the assembled size can differ); with no page-in left, the
    evictions are undone too. Returns the last assembled window and its plan."""
    while plan.shown or plan.digest:
        plan = plan.without_last()
        window = assemble(plan)
        if window.tokens <= limit:
            return window, plan
    plan = PageInPlan(unplaced=plan.unplaced)
    return assemble(plan), plan
