"""Page-in: which archived or compressed messages come back verbatim for the current query.

The planner takes the query's search hits (best first), drops those below the relevance floor (no
query term in them and an embedding similarity under ``page_in_floor``), and shows up to
``page_in_k`` units verbatim for this build only, each followed by its neighbour (the question an
answer replies to, the answer a question got) when that fits. When a hit does not fit within
``page_in_limit`` of the budget, the lowest-value evictable units (not pinned, not recent) are
shown as stubs for this build to make room: the best hit may displace anything evictable, later
hits only units worth less than themselves; when even that is not enough, the best hit's unit is
shown in its structured form. Tiers do not change: the next build without a query is the same.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config import Policy
from ..messages import Role, Tier
from ..scoring.ranker import RERANK_POOL
from ..store.base import Store
from ..store.retrieval import Hit
from .history import History
from .tiers import Forms

log = logging.getLogger("ctxscore")

#: Search hits fetched per query build; the best :data:`RELEVANCE_HITS` of them raise values.
SEARCH_HITS = 40
RELEVANCE_HITS = 20
#: Search hits considered per unit that may be paged in.
CANDIDATES_PER_SLOT = 3


@dataclass(frozen=True)
class PageInPlan:
    """What one build pages in.

    Attributes:
        shown: entry index -> id of the hit it is shown for (a unit's members share it), in the order
            the hits ranked.
        evicted: entries shown as stubs for this build to make room.
        unplaced: hits that had no room even after eviction (ids, best first).
        forms: entries of ``shown`` that are shown in a compressed tier rather than verbatim (the
            best hit's unit did not fit verbatim), entry index -> tier.
    """

    shown: dict[int, str] = field(default_factory=dict)
    evicted: frozenset[int] = frozenset()
    unplaced: tuple[str, ...] = ()
    forms: dict[int, Tier] = field(default_factory=dict)

    def without_last(self) -> PageInPlan:
        """The plan with its lowest-ranked page-in undone (evictions stay)."""
        order = list(dict.fromkeys(self.shown.values()))
        if not order:
            return self
        drop = order[-1]
        shown = {i: h for i, h in self.shown.items() if h != drop}
        return PageInPlan(shown, self.evicted, (*self.unplaced, drop), {i: t for i, t in self.forms.items() if i in shown})


def plan_page_in(hits: list[Hit], history: History, values: np.ndarray, forms: Forms, policy: Policy,
                 budget: int, occupancy: int) -> PageInPlan:
    """Plan the page-in of one build (see the module docstring).

    Args:
        hits: the query's search hits, best first.
        history: the session history (read only).
        values: the value of every entry, shape (n,).
        forms: the form cache (stub sizes of evicted units).
        policy: ``page_in_k``, ``page_in_limit`` and ``recent_turns``.
        budget: the token budget of this build.
        occupancy: the window's estimated tokens before page-in.
    """
    entries, ids = history.entries, history.ids
    limit = policy.page_in_limit * budget
    hits = [h for h in hits if h.lexical or (h.similarity is not None and h.similarity >= policy.page_in_floor)]
    cands = [h for h in hits if h.id in ids and entries[ids[h.id]].tier != Tier.VERBATIM]
    cands = cands[: policy.page_in_k * CANDIDATES_PER_SLOT]
    shown: dict[int, str] = {}
    forms_of: dict[int, Tier] = {}
    unplaced: list[str] = []
    occ = occupancy
    evicted: set[int] = set()
    units_done: set[int] = set()
    evictable: dict[int, list[int]] | None = None  # computed once, when room is first needed

    def unit_value(members: list[int]) -> float:
        return float(max(values[i] for i in members))

    for h in cands:
        if len(units_done) >= policy.page_in_k:
            break
        hit = ids[h.id]
        u = entries[hit].unit
        if u in units_done:
            continue
        members = history.units[u]
        delta = sum(entries[i].tokens - entries[i].cur_tokens for i in members)
        tiers: dict[int, Tier] = {}
        if occ + delta > limit:
            if evictable is None:
                evictable = history.eligible_units(policy.recent_turns)
            room = sorted(
                (m for uu, m in evictable.items()
                 if uu != u and uu not in units_done and not evicted.intersection(m) and history.archivable(m)
                 and any(entries[i].tier != Tier.ARCHIVED for i in m)),
                key=unit_value,
            )
            for m in room:
                if occ + delta <= limit:
                    break
                if units_done and unit_value(m) >= values[hit]:
                    break  # later hits displace only units worth less than themselves
                occ -= sum(entries[i].cur_tokens - forms.get(entries[i], Tier.ARCHIVED).tokens
                           for i in m if entries[i].tier != Tier.ARCHIVED)
                evicted.update(m)
            if occ + delta > limit and not units_done:  # the best hit: its structured form rather than nothing
                delta, tiers = _structured(members, hit, forms, history, occ, limit, delta)
            if occ + delta > limit:
                unplaced.append(h.id)
                continue
        for i in members:
            shown[i] = h.id
        forms_of.update(tiers)
        occ += delta
        units_done.add(u)
        nb = _neighbour(history, hit)
        if nb is not None and nb not in units_done:
            extra = sum(entries[i].tokens - entries[i].cur_tokens for i in history.units[nb] if i not in shown)
            if occ + extra <= limit:
                for i in history.units[nb]:
                    shown.setdefault(i, h.id)
                occ += extra
    return PageInPlan(shown=shown, evicted=frozenset(evicted - set(shown)), unplaced=tuple(unplaced), forms=forms_of)


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


def _structured(members: list[int], hit: int, forms: Forms, history: History, occ: int, limit: float,
                delta: int) -> tuple[int, dict[int, Tier]]:
    """The cheapest way to show a unit that does not fit verbatim: the hit verbatim and the other
    members structured, else every member structured; ``(tokens added, tiers)`` of the first that
    fits, else the verbatim figures."""
    entries = history.entries
    for keep in (hit, None):
        tiers = {i: forms.reached(entries[i], Tier.STRUCTURED) for i in members if i != keep}
        d = sum((forms.get(entries[i], tiers[i]).tokens if i in tiers else entries[i].tokens) - entries[i].cur_tokens
                for i in members)
        if occ + d <= limit:
            return d, {i: t for i, t in tiers.items() if t != Tier.VERBATIM}
    return delta, {}


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
    while plan.shown:
        plan = plan.without_last()
        window = assemble(plan)
        if window.tokens <= limit:
            return window, plan
    plan = PageInPlan(unplaced=plan.unplaced)
    return assemble(plan), plan
