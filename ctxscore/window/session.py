"""The state of one session and the build pipeline over it.

:class:`SessionState` holds what the manager derives from the stored messages -- the history, the
value model, the form cache, the layers -- and runs one build: values, staged compaction, page-in,
assembly of the sections, post-build hooks and the warnings. :class:`~ctxscore.window.manager.ContextManager`
is the public facade over it (argument checks, the seams, the lock).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from ..compress.blocks import BLOCK_MAX_CHARS
from ..config import OnOverflow, Policy
from ..errors import BudgetError, StoreError
from ..messages import Message, Tier
from ..scoring.base import Scorer
from ..scoring.rules import RuleClassifier
from ..store.base import Store
from ..store.retrieval import Hit, query_terms
from ..tokens import REPLY_PRIMING_TOKENS, TokenCounter
from . import ingest, tiers
from .assemble import PostBuildHook, Section, assemble, make_view
from .history import Entry, Form, History
from .layers import Layer, LayerContext, claim_layers
from .pagein import RELEVANCE_HITS, PageInPlan, fit_page_in, plan_page_in
from .result import ContextWindow, WarningKind, WindowWarning
from .value import ValueModel

log = logging.getLogger("ctxscore")

#: A build over the budget releases instructions and is built again at most this many times: each
#: round releases at least what the window is over, and the released instructions, compacted, take
#: part of it back (a travel chat of 14 questions at 400 tokens: 423 -> 386 tokens).
RELEASE_RETRIES = 3


@dataclass(frozen=True)
class _LastPlan:
    """A query build's page-in plan (after :func:`~ctxscore.window.pagein.fit_page_in`), the query and
    budget it was made for, the tier codes of the history when the build ended, the search hits it
    was planned from, the tokens of the layers' sections in that build and what replaced each entry
    the plan shows or lists (:attr:`~ctxscore.window.history.Entry.successor`, ``None`` for none)."""

    query: str
    budget: int
    codes: np.ndarray
    plan: PageInPlan
    hits: list[Hit]
    reserved: int
    successors: dict[int, int | None]


class SessionState:
    """History, values, forms and layers of one session, and its build pipeline.

    Args:
        store, session_id, scorer, rules, counter, policy: the manager's seams and settings.
        forms: the form cache (compressor + verifier).
        sections: the built-in sections (the layers' sections are added, all sorted by position).
        hooks: post-build hooks.
        layers: the layers (:class:`~ctxscore.window.layers.Layer`).
    """

    def __init__(self, store: Store, session_id: str, scorer: Scorer, rules: RuleClassifier, counter: TokenCounter,
                 policy: Policy, forms: tiers.Forms, sections: Sequence[Section], hooks: Sequence[PostBuildHook],
                 layers: Sequence[Layer]) -> None:
        self.store, self.session_id, self.scorer, self.rules = store, session_id, scorer, rules
        self.counter, self.policy, self.forms = counter, policy, forms
        self.layers = list(layers)
        claim_layers(self.layers, self)
        self.layer_sections = [s for layer in self.layers for s in layer.sections]
        self.sections = sorted([*sections, *self.layer_sections], key=lambda s: float(s.position))
        self.hooks = list(hooks)
        self.reset()

    def reset(self) -> None:
        """Forget everything derived from the stored messages (they are read again by :meth:`catch_up`)."""
        self.history = History()
        self.values = ValueModel(self.rules.config.factors, self.rules.config.base_weights, self.policy.blend)
        self.prepared = 0  # entries before this index have their compressed forms computed
        self.stuck: tuple[int, int] | None = None  # (messages, budget) at which compaction could do no more
        self.compacted_at: int | None = None  # the budget of the last compaction that changed tiers
        self.unsaved: dict[str, Tier] = {}  # tiers the store could not record yet
        self.stub_budget: int | None = None  # the budget of the last build that changed tiers (sizes the stub note)
        self.recalled: tuple[str, int] | None = None  # the last window's recalled note and the entry it precedes
        self.last_plan: _LastPlan | None = None  # the last build's page-in plan (see _kept_plan)
        self.forms.forget()  # forms made for a build, remembered by message id: the ids may be reused
        ctx = LayerContext(self.session_id, self.store, self.counter, self.rules, self.policy, self.history,
                           self.scorer)
        for layer in self.layers:
            layer.on_reset()
            layer.attach(ctx)

    def catch_up(self) -> None:
        """Append what the store holds beyond the history (a resumed session, other writers)."""
        rows = self.store.load(self.session_id, after_turn=len(self.history) - 1)
        start = len(self.history)
        for row in rows:
            if row.message.turn != len(self.history):  # a duplicate or missing turn: written by something else
                where = getattr(self.store, "where", None) or getattr(self.store, "path", None) or ":memory:"
                raise StoreError(
                    f"store {where}: session {self.session_id!r} message {row.message.id!r} has turn "
                    f"{row.message.turn} where turn {len(self.history)} comes next (a duplicate or missing turn): the "
                    "stored data is damaged; restore it from a backup or renumber the session's turns from 0")
            ingest.append(self.history, self.values, self.rules, self.counter, row.message, ingest.stored_prediction(row))
            if row.tier != Tier.VERBATIM:
                self.forms.set_tier(self.history, len(self.history) - 1, row.tier)
        self._notify_add(start)

    def add(self, msgs: list[Message]) -> list[Message]:
        """Score, store (one transaction) and append validated messages; returns them stored."""
        scored = ingest.score(self.scorer, self.rules, msgs, len(self.history))
        rows = self.store.add(self.session_id, ingest.records(scored, self.history, self.rules))
        if rows[0].turn != len(self.history):  # another writer appended in between: read its messages first
            if rows[0].turn < len(self.history):  # another manager rebased the session since (an edited
                self.reset()  # history moved to a detached session): what this one holds is no longer it
            self.catch_up()
            return [self.history.entries[r.turn].msg for r in rows]
        start = len(self.history)
        for s, row in zip(scored, rows, strict=True):
            ingest.append(self.history, self.values, self.rules, self.counter, row.message, s.pred, s.entities)
        self._notify_add(start)
        return [r.message for r in rows]

    def _notify_add(self, start: int) -> None:
        if self.layers and start < len(self.history):
            added = self.history.entries[start:]
            for layer in self.layers:
                layer.on_add(added)

    def build(self, query: str | None, B: int, hits: list[Hit], warns: list[WindowWarning],
              retry: int = RELEASE_RETRIES, refresh: Callable[[], list[Hit]] | None = None) -> ContextWindow:
        """One build at budget ``B`` (tokens) for ``query`` with its search ``hits`` (best first; the last
        build's with ``refresh``, the search to run if this build plans afresh after all, :meth:`_page_in`).

        A window over the budget although pinned content fits (the active task's instructions pile
        up, as in a long chat of separate questions that never ends a task) releases the task's
        older instructions until pinned content, the recent turns in their current forms and the
        stub note's one line fit, and at least as many tokens of them as the window is over, and is
        built again (at most ``retry`` more times); when even releasing all of them would not make
        room (a large tool output in the recent turns), nothing is released.
        A last unit over a quarter of the budget counts at a quarter until the end of the build,
        which cuts it to the room left (:func:`~ctxscore.window.tiers.last_excess`)."""
        pol, h = self.policy, self.history
        given = list(warns)
        relevance = {x.id: x.score / hits[0].score for x in hits[:RELEVANCE_HITS]} if hits else {}
        vals, rel = self.values.values(h, relevance)
        reserved = self._reserved(query, B, vals)
        limit = B - REPLY_PRIMING_TOKENS - reserved
        if h.release_instructions(limit):
            self.stuck = None  # the released instructions can be compacted
        changed: list[int] = self.fit_pins(limit)
        # a last unit larger than its share counts at its share: the cut at the end of this build
        # gives it the room the rest leaves (the earlier turns are not archived for its sake)
        excess = tiers.last_excess(h, B, self.forms)
        changed += self._settle_tiers(vals, B, reserved, excess)
        pinned = h.pinned_tokens + REPLY_PRIMING_TOKENS + reserved
        if pol.on_overflow == OnOverflow.RAISE and pinned > B:
            self._save_tiers(changed, [])  # what this build changed (condensed pins) stays in step with the store
            raise BudgetError(tiers.pinned_overflow(pinned, B).message)
        window, plan, hits, planned_from, refresh = self._page_in(query, B, hits, changed, vals, rel, warns,
                                                                  reserved, excess, refresh)
        if (not plan.changes and window.tokens - excess >= pol.t_archive * B
                and self.stuck != (len(h), B)):
            # the estimate (stub notes; layer sections grow as messages are compacted) was under the
            # high-water mark but the assembled window is not: compact again on the exact figures
            more = self._compact(vals, B, self._reserved(query, B, vals), excess)
            if more:
                changed += more
                window = self._assemble(query, B, plan, vals, rel, warns)
        self._save_tiers(changed, warns)
        if changed or self.stub_budget is None:
            if self.stub_budget != B:
                self.stub_budget = B
                window = self._assemble(query, B, plan, vals, rel, warns)
        if plan.changes and window.tokens - excess > pol.page_in_limit * B:
            window, plan = fit_page_in(plan, pol.page_in_limit * B + excess,
                                       lambda pl: self._assemble(query, B, pl, vals, rel, warns))
        kept = plan
        if window.tokens - excess > B and not plan.stubs_collapsed and h.stub_tokens > tiers.COLLAPSED_LINE_TOKENS:
            # pinned content and the recent turns leave the stub note no room: its one line for this build
            plan = replace(plan, stubs_collapsed=True)
            window = self._assemble(query, B, plan, vals, rel, warns)
        if retry and window.tokens - excess > B and h.pinned_tokens <= limit:
            room = limit - h.recent_tokens(pol.recent_turns) - tiers.COLLAPSED_LINE_TOKENS
            # only when releasing makes them fit (not for a large output passing through the recent turns);
            # at least by what the window is over (corrections and hard constraints, which stay, may take the room)
            over = window.tokens - excess - B
            if (room >= h.pinned_tokens - h.releasable_tokens()
                    and h.release_instructions(min(room, h.pinned_tokens - over))):
                self.stuck = None
                warns[:] = given
                return self.build(query, B, hits, warns, retry=retry - 1, refresh=refresh)
        if plan.shown and h.n_compacted:
            window, plan = self._whole_history(query, B, plan, vals, rel, warns, window, reserved)
        window, plan = self._fit_end(query, B, plan, vals, rel, warns, window, reserved)
        warns += tiers.build_warnings(h, pol, B, window.tokens, plan, reserved)
        window.warnings[:] = warns
        self.last_plan = None
        if pol.on_overflow == OnOverflow.RAISE and window.tokens > B:  # the tiers are saved: the state stays whole
            over = next((w for w in warns if w.kind in (WarningKind.OVER_BUDGET, WarningKind.PINNED_OVER_BUDGET)), None)
            raise BudgetError(str(over) if over else f"window needs {window.tokens} tokens, above the budget of {B}")
        self._remember(query, B, kept, planned_from, reserved)
        for w in warns:
            (log.warning if w.kind == WarningKind.PINNED_OVER_BUDGET else log.info)(str(w))
        for layer in self.layers:
            layer.after_build(window, self.view)
        return window

    def _page_in(self, query: str | None, B: int, hits: list[Hit], changed: Sequence[int], vals: np.ndarray,
                 rel: np.ndarray, warns: list[WindowWarning], reserved: int, excess: int,
                 refresh: Callable[[], list[Hit]] | None
                 ) -> tuple[ContextWindow, PageInPlan, list[Hit], list[Hit], Callable[[], list[Hit]] | None]:
        """The page-in of a build and its assembled window: the last build's plan when it can be kept
        (:meth:`_kept_plan`; its lowest-ranked page-ins undone when the new messages take their room,
        planned afresh when even its best hit would go), else a plan made from ``hits``, searched
        again with ``refresh`` (:meth:`kept_hits`: ``hits`` are then the last build's) first.
        Returns ``(window, plan, hits, the hits the plan was made from, refresh or None once used)``."""
        pol = self.policy
        plan = self._kept_plan(query, B, changed)
        if plan is not None and self.last_plan is not None:
            window = self._assemble(query, B, plan, vals, rel, warns)
            if window.tokens - excess > pol.page_in_limit * B:  # the new messages took room: the last page-ins go
                best = next((x for x in plan.shown.values() if x not in plan.context), None)
                window, plan = fit_page_in(plan, pol.page_in_limit * B + excess,
                                           lambda pl: self._assemble(query, B, pl, vals, rel, warns))
                if best not in plan.shown.values():  # the best hit too: planned afresh, it may make room
                    plan = None
            if plan is not None:
                return window, plan, hits, self.last_plan.hits, refresh
        if refresh is not None:  # the last build's hits were reused, but this build plans afresh
            hits, refresh = refresh(), None
        plan = (plan_page_in(hits, self.history, vals, self.forms, pol, B, reserved, _terms(query), excess)
                if hits else PageInPlan())
        return self._assemble(query, B, plan, vals, rel, warns), plan, hits, hits, refresh

    def _remember(self, query: str | None, B: int, plan: PageInPlan, hits: list[Hit], reserved: int) -> None:
        """Keep ``plan`` (after :func:`~ctxscore.window.pagein.fit_page_in`) for the next build of the
        same request (:meth:`_kept_plan`) when it shows something and came of a search (``hits``)."""
        h = self.history
        if query is not None and plan.shown and hits:
            self.last_plan = _LastPlan(query, B, h.codes(), plan, hits, reserved,
                                       {i: h.entries[i].successor for i in (*plan.shown, *plan.digest)})

    def _kept_plan(self, query: str | None, B: int, changed: Sequence[int]) -> PageInPlan | None:
        """The last build's page-in plan when this build asks the same: the same query at the same
        budget, the history only grown since (no tier changed, none in this build so far) and the last
        plan showing something; else ``None`` (plan afresh). An agent's tool loop sends one user
        request with a new tool result at every step: planned afresh, page-in made room for other
        messages at each step (the room and the ranks move with every message), which rewrote the
        window from the first change on and left a provider's prompt cache only the part before it.
        The kept plan stays within the limit as any plan does (:meth:`build` undoes its lowest-ranked
        page-ins, :func:`~ctxscore.window.pagein.fit_page_in`, when the new messages take their room,
        and plans afresh when even the best hit would go: a fresh plan may leave other messages out
        for it); a compaction plans afresh, and it rewrites the window anyway."""
        last, h = self.last_plan, self.history
        if last is None or changed or not self._same_request(query, B):
            return None
        # a message shown or listed that a newer one replaced since: planned afresh, it would come with
        # what replaced it (and a digest line would not list it)
        return last.plan if all(h.entries[i].successor == j for i, j in last.successors.items()) else None

    def _same_request(self, query: str | None, B: int) -> bool:
        """Whether the last build planned a page-in for ``query`` at ``B`` and the history has only
        grown since (no tier changed)."""
        last, h = self.last_plan, self.history
        if last is None or query != last.query or B != last.budget:
            return False
        n = len(last.codes)
        return n <= len(h) and bool(np.array_equal(h.codes()[:n], last.codes))

    def kept_hits(self, query: str | None, B: int) -> list[Hit] | None:
        """The last build's search hits when this build is likely to keep its plan (:meth:`_kept_plan`:
        the same request, and no compaction due at ``B`` with the last build's layer sections), so
        that the caller need not search again; else ``None``. Their relevance raises the values of
        this build as it raised the last one's (the messages added since, the newest, get none). A
        build that plans afresh after all (a tier changed) searches then (:meth:`build`'s ``refresh``)."""
        h, pol, last = self.history, self.policy, self.last_plan
        if last is None or not self._same_request(query, B):
            return None
        occ = tiers.occupancy(h.msg_tokens - tiers.last_excess(h, B, self.forms), h.stub_tokens, pol, B)
        return last.hits if occ + last.reserved < pol.t_archive * B else None

    def _fit_end(self, query: str | None, B: int, plan: PageInPlan, vals: np.ndarray, rel: np.ndarray,
                 warns: list[WindowWarning], window: ContextWindow, reserved: int) -> tuple[ContextWindow, PageInPlan]:
        """The window and plan of a build still over ``B`` at its end: the last message cut to its blocks
        that fit (when pinned content fits), then the layers' notes within what is left (the recent turns
        beside a cut last output leave them less room than :meth:`BuildView.layer_cap
        <ctxscore.window.assemble.BuildView.layer_cap>` counts)."""
        if window.tokens > B and self.history.pinned_tokens + REPLY_PRIMING_TOKENS + reserved <= B:
            fitted = self._fit_last(window.tokens - B, _terms(query))
            if fitted:  # the last message alone is larger than the room left: its blocks that fit
                plan = replace(plan, fitted=fitted)
                window = self._assemble(query, B, plan, vals, rel, warns)
        spent = self.view.layers_spent if self.view is not None else 0
        if window.tokens > B and spent:
            window = self._assemble(query, B, plan, vals, rel, warns, layer_room=max(0, spent - (window.tokens - B)))
        return window, plan

    def _whole_history(self, query: str | None, B: int, plan: PageInPlan, vals: np.ndarray, rel: np.ndarray,
                       warns: list[WindowWarning], window: ContextWindow,
                       reserved: int) -> tuple[ContextWindow, PageInPlan]:
        """The window and plan of a query build: the whole history verbatim, for this build, when the
        page-ins make ``window`` more than :data:`WHOLE_MARGIN` larger than it and it fits ``B``
        (it gives up the cached prefix, so only for a real saving); else ``window`` and ``plan``."""
        h = self.history
        whole = h.total_tokens + REPLY_PRIMING_TOKENS + reserved
        if window.tokens <= (1 + WHOLE_MARGIN) * whole or whole > B:
            return window, plan
        every = frozenset(np.flatnonzero(h.codes()).tolist())
        full = PageInPlan(shown={i: h.entries[i].msg.id or "" for i in every}, in_place=every, stubs_kept=False)
        verbatim = self._assemble(query, B, full, vals, rel, warns)
        if verbatim.tokens <= window.tokens:
            return verbatim, full
        return self._assemble(query, B, plan, vals, rel, warns), plan  # the view and hooks follow the window returned

    def _settle_tiers(self, vals: np.ndarray, B: int, reserved: int, excess: int) -> list[int]:
        """The tier changes of a build before page-in (indices changed): all verbatim when the whole
        history fits below the first threshold; a compaction pass at the high-water mark (counting
        the last unit ``excess`` tokens smaller); else compressed forms prepared a few at a time,
        and, far under the low-water mark after a compaction at a much smaller budget, the newest
        compacted units back verbatim (that budget is kept in memory only: a resumed or rebased
        session, or another proxy worker, whose stored tiers leave the window under
        :data:`~ctxscore.window.tiers.RESTORE_BELOW` of the budget restores too; a compaction at
        this budget leaves it near the low-water mark, above that)."""
        pol, h = self.policy, self.history
        occ = tiers.occupancy(h.msg_tokens - excess, h.stub_tokens, pol, B) + reserved
        if h.total_tokens + REPLY_PRIMING_TOKENS + reserved <= pol.t_compact * B:
            # the full history fits below the first threshold: all verbatim
            return [int(i) for i in np.flatnonzero(h.codes()) if self.forms.set_tier(h, int(i), Tier.VERBATIM)]
        if occ >= pol.t_archive * B and self.stuck != (len(h), B):
            return self._compact(vals, B, reserved, excess)  # computes the forms it needs that are not ready
        back: list[int] = []
        if (occ < tiers.RESTORE_BELOW * B and h.n_compacted
                and (self.compacted_at is None or B * pol.low_water > self.compacted_at * pol.t_archive)):
            # compacted for a budget so much smaller that what set it off is under the low-water
            # mark now: the newest compacted units come back verbatim up to that mark (never at
            # the budget of the compaction itself, which would undo it and redo it turn after turn)
            # the recent turns up to just under the high-water mark (a compaction at B keeps them too)
            back = [i for i in tiers.plan_restore(h, occ, pol.low_water * B, pol.recent_turns, pol.t_archive * B - 1)
                    if self.forms.set_tier(h, i, Tier.VERBATIM)]
            self._notify_tiers(back)
            self.stuck = None
        # compaction has begun or will: prepare forms a few at a time, in the builds between passes
        self.prepared = tiers.prepare_forms(h, self.forms, self.prepared, pol.recent_turns)
        return back

    def _fit_last(self, over: int, terms: list[str]) -> dict[int, Form]:
        """Forms that bring the window ``over`` tokens down, for the unpinned members of the last unit
        (the latest request, or the latest tool call and its results, which recency protection never
        compacts): the members cut into blocks give up their share of ``over`` in proportion to their
        tokens (:meth:`~ctxscore.window.tiers.Forms.fitted_form`, preferring the blocks that hold the
        query's ``terms``) after the others take their compressed form where it is smaller (the
        originals stay whole in the store). Empty when nothing can be made smaller."""
        entries = self.history.entries
        members = tiers.cuttable_last(self.history)
        out: dict[int, Form] = {}
        blocked = [i for i in members if len(entries[i].msg.content) > BLOCK_MAX_CHARS]
        for i in (i for i in members if i not in blocked):
            form = self.forms.get(entries[i], Tier.COMPRESSED)
            if form.tokens < entries[i].tokens and not form.pending:
                out[i] = form
                over -= entries[i].tokens - form.tokens
        total = sum(entries[i].tokens for i in blocked)
        for i in blocked if over > 0 else ():
            e = entries[i]
            form = self.forms.fitted_form(e, int(e.tokens - over * e.tokens / total), terms)
            if form is not None and form.tokens < e.tokens:
                out[i] = form
        return out

    def fit_pins(self, limit: int) -> list[int]:
        """Show pinned instructions and corrections condensed while pinned content exceeds ``limit``
        tokens, verbatim again once it fits.

        Over the limit (after :meth:`History.release_instructions`), the largest pinned instruction
        or correction still verbatim is moved to its structured form (a long message: its head, key
        blocks and tail, the other blocks archived in place) -- its hard-constraint sentences,
        entities and key spans byte-exact, the prose around them dropped -- one at a time until pinned
        content fits or none is left that a form makes smaller; it stays pinned (never archived).
        Within the limit, condensed pins are restored verbatim while they still fit. System messages
        are never condensed.

        Args:
            limit: the most tokens pinned entries may hold (the budget less reply priming and the
                layers' sections).

        Returns:
            The indices whose tier changed (for the store and the layers).
        """
        h, forms = self.history, self.forms
        changed: list[int] = []
        if h.pinned_tokens > limit:
            for i in h.condensable_pins():
                if h.pinned_tokens <= limit:
                    break
                e = h.entries[i]
                if e.tier != Tier.VERBATIM or e.no_compress:
                    continue
                got = forms.condensed(e)
                if got is not None and forms.set_tier(h, i, got[0]):
                    changed.append(i)
        elif h.condensed:
            for i in sorted(h.condensed, key=lambda j: h.entries[j].tokens - h.entries[j].cur_tokens):
                e = h.entries[i]
                if h.pinned_tokens + e.tokens - e.cur_tokens <= limit and forms.set_tier(h, i, Tier.VERBATIM):
                    changed.append(i)
        self._notify_tiers(changed)
        return changed

    def _notify_tiers(self, changed: list[int]) -> None:
        """Tell the layers which entries changed tier."""
        if changed and self.layers:
            entries: list[Entry] = [self.history.entries[i] for i in changed]
            for layer in self.layers:
                layer.on_tiers(entries)

    def _reserved(self, query: str | None, B: int, vals: np.ndarray) -> int:
        """Tokens of the layers' sections (they count like pinned content)."""
        if not self.layer_sections:
            return 0
        view = make_view(self.history, self.forms, self.counter, self.policy, B, query, PageInPlan(), vals)
        return sum(s.render(view)[1] for s in self.layer_sections)

    def _compact(self, vals: np.ndarray, B: int, reserved: int, excess: int) -> list[int]:
        plan = tiers.plan_compaction(self.history, vals, self.forms, self.policy, B, reserved, excess)
        if plan.changes:
            self.compacted_at = B
        if plan.stuck:
            self.stuck = (len(self.history), B)  # nothing left to compact until the history changes
        changed = [i for i, t in plan.changes.items() if self.forms.set_tier(self.history, i, t)]
        self._notify_tiers(changed)
        return changed

    def _save_tiers(self, changed: list[int], warns: list[WindowWarning]) -> None:
        """Record changed tiers in the store; on failure keep them and retry at the next build."""
        self.unsaved.update((self.history.entries[i].msg.id, self.history.entries[i].tier) for i in changed)  # type: ignore[misc]
        if self.unsaved:
            try:
                self.store.set_tiers(self.session_id, list(self.unsaved.items()))
                self.unsaved.clear()
            except StoreError as exc:
                warns.append(tiers.store_unavailable("record tiers", exc))

    def _assemble(self, query: str | None, B: int, plan: PageInPlan, vals: np.ndarray, rel: np.ndarray,
                  warns: list[WindowWarning], layer_room: int | None = None) -> ContextWindow:
        view = self.view = make_view(self.history, self.forms, self.counter, self.policy, B, query, plan, vals,
                                     self.stub_budget, self.recalled)
        view.layer_room = layer_room
        window = assemble(view, self.sections, self.values, vals, rel, warns)
        self.recalled = view.recalled_anchor()
        for hook in self.hooks:
            hook(window, view)
        return window


#: A query build shows the whole history verbatim instead of its page-ins when they make the window
#: more than this share larger than the whole history and the whole history fits the budget.
WHOLE_MARGIN = 0.1


def _terms(query: str | None) -> list[str]:
    """The words of a query that page-in looks for inside long messages."""
    if not query:
        return []
    fts, short = query_terms(query)
    return [*fts, *short]
