"""Assembly: the window is composed of named sections in a fixed order, each with its own tokens.

A :class:`Section` renders OpenAI-style messages from a :class:`BuildView` (the history with this
build's tiers and page-ins). The assembler sorts sections by ``position`` and concatenates them;
the window's tokens are the sum of the sections' tokens plus the reply priming. The documented
order (``../shared/DESIGN.md``) and the built-in positions:

===============  ========  ==========================================================
section          position  content
===============  ========  ==========================================================
system           0         system messages, pinned instructions, task statement
constraints      10        hard constraints (a layer)
goal             20        goal and task state (a layer)
profile          30        user profile (a layer)
ledger           40        fact ledger (a layer)
archive_stubs    50        stubs of archived messages
history          60        the rest of the conversation in order
recent           70        the last turns, verbatim
===============  ========  ==========================================================

A layer adds a section (any object with ``name``, ``position`` and ``render``) through
``ContextManager(sections=[...])``; the manager is not touched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..config import Policy
from ..messages import Message, Role, Tier
from ..tokens import REPLY_PRIMING_TOKENS, TokenCounter
from .history import ARCHIVED, CODE, TIERS, Form, History
from .pagein import PageInPlan
from .result import ContextWindow, Decision, SectionInfo, WindowWarning
from .tiers import Forms, stub_cap
from .value import ValueModel

SECTION_POSITIONS = {
    "system": 0, "constraints": 10, "goal": 20, "profile": 30, "ledger": 40,
    "archive_stubs": 50, "history": 60, "recent": 70,
}


@dataclass
class BuildView:
    """What sections read during one build.

    Attributes:
        history: the session history.
        forms: the form cache.
        counter: the token counter.
        policy: the tier policy.
        budget: the token budget (tokens).
        query: the build's query, or ``None``.
        codes: the tier code of every entry for this build (page-ins and evictions applied), shape (n,).
        stubs: stub tokens of every entry, shape (n,).
        shown_stubs: indices of archived entries whose stub line is shown (the newest ones within
            the stub cap; the older ones are collapsed into one line).
        collapsed: indices of archived entries collapsed into one line.
        paged: entry index -> hit id of the entries paged in for the query.
        lead: entries before this index are the system section: the leading system messages, the
            pinned system and user messages that follow them and the active task's statement
            (:func:`_system_end`; :meth:`system_indices`, the archived ones among them are stubs).
        recent: entries from this index on belong to the last ``recent_turns`` turns.
        values: the value of every entry in this build, shape (n,), or ``None``.
        overrides: entries shown in a form made for this build (the blocks a query names), index -> form.
    """

    history: History
    forms: Forms
    counter: TokenCounter
    policy: Policy
    budget: int
    query: str | None
    codes: np.ndarray
    stubs: np.ndarray
    shown_stubs: np.ndarray
    collapsed: np.ndarray
    paged: dict[int, str] = field(default_factory=dict)
    lead: int = 0
    recent: int = 0
    values: np.ndarray | None = None
    overrides: dict[int, Form] = field(default_factory=dict)

    def system_indices(self) -> list[int]:
        """The entries the system section shows: those before :attr:`lead` not archived, in order."""
        return [i for i in range(self.lead) if self.codes[i] != ARCHIVED]

    def note(self, lines: Sequence[str]) -> tuple[dict[str, Any], int]:
        """A system note holding ``lines`` and its tokens."""
        msg = Message(role="system", content="\n".join(lines))
        return msg.to_openai(), self.counter.count_message(msg)

    def collapsed_line(self) -> str:
        """The line that stands for the collapsed (oldest) archived messages."""
        entries, c = self.history.entries, self.collapsed
        return (f"[archived {len(c)} earlier messages {entries[int(c[0])].msg.id} … "
                f"{entries[int(c[-1])].msg.id}; ask about them to page them back in]")

    def render_entry(self, i: int) -> tuple[dict[str, Any], int]:
        """Entry ``i`` in its tier for this build (verbatim keeps content parts whole) and its tokens."""
        e = self.history.entries[i]
        tier = TIERS[self.codes[i]]
        if tier == Tier.VERBATIM:
            return e.msg.to_openai(), e.tokens
        form = self.overrides.get(i) or self.forms.get(e, tier)
        return e.msg.to_openai(content=form.text), form.tokens


@runtime_checkable
class Section(Protocol):
    """A named part of the window.

    Attributes:
        name: the section's name (reported in :attr:`ContextWindow.sections`).
        position: where it goes (see :data:`SECTION_POSITIONS`); sections are sorted by it.

    ``render(view)`` returns the section's OpenAI-style messages and their tokens (with chat
    overhead). It must not change the history.
    """

    name: str
    position: float

    def render(self, view: BuildView) -> tuple[list[dict[str, Any]], int]: ...


def _render(view: BuildView, indices: Sequence[int]) -> tuple[list[dict[str, Any]], int]:
    out: list[dict[str, Any]] = []
    tokens = 0
    for i in indices:
        msg, n = view.render_entry(i)
        out.append(msg)
        tokens += n
    return out, tokens


class SystemSection:
    """The system messages at the start of the conversation, the pinned system and user messages that
    follow them and the active task's statement (after archived earlier tasks), in order and in their
    current form (:meth:`BuildView.system_indices`). They come before the archive stubs, whose note
    changes at every compaction, so the prefix a provider's prompt cache reuses holds them."""

    name = "system"
    position = SECTION_POSITIONS["system"]

    def render(self, view: BuildView) -> tuple[list[dict[str, Any]], int]:
        return _render(view, view.system_indices())


class StubSection:
    """One system note with a stub line per archived message: the newest within ``stub_fraction`` of
    the budget, the older ones collapsed into a single line. Empty when nothing is archived."""

    name = "archive_stubs"
    position = SECTION_POSITIONS["archive_stubs"]

    def render(self, view: BuildView) -> tuple[list[dict[str, Any]], int]:
        lines = [view.collapsed_line()] if len(view.collapsed) else []
        lines += [view.forms.get(view.history.entries[i], Tier.ARCHIVED).text for i in view.shown_stubs.tolist()]
        if not lines:
            return [], 0
        note, n = view.note(lines)
        return [note], n


class HistorySection:
    """The conversation after the system section and before the recent turns, in order:
    originals, compressed forms and messages paged in for the query (archived ones are stubs)."""

    name = "history"
    position = SECTION_POSITIONS["history"]

    def render(self, view: BuildView) -> tuple[list[dict[str, Any]], int]:
        live = np.flatnonzero(view.codes[view.lead:view.recent] != ARCHIVED) + view.lead
        return _render(view, live.tolist())


class RecentSection:
    """The last ``recent_turns`` turns, in order (verbatim unless recency protection was relaxed)."""

    name = "recent"
    position = SECTION_POSITIONS["recent"]

    def render(self, view: BuildView) -> tuple[list[dict[str, Any]], int]:
        live = np.flatnonzero(view.codes[view.recent:] != ARCHIVED) + view.recent
        return _render(view, live.tolist())


DEFAULT_SECTIONS: tuple[Section, ...] = (SystemSection(), StubSection(), HistorySection(), RecentSection())


def sort_sections(sections: Sequence[Section]) -> list[Section]:
    """Sections in window order (by ``position``; the built-in ones first on ties)."""
    return sorted(sections, key=lambda s: float(s.position))


def make_view(history: History, forms: Forms, counter: TokenCounter, policy: Policy, budget: int,
              query: str | None, plan: PageInPlan, values: np.ndarray | None = None,
              stub_budget: int | None = None) -> BuildView:
    """The :class:`BuildView` of one build: tier codes with the page-in plan applied, and which stubs
    are shown and which collapse. ``stub_budget`` (default ``budget``) sizes the stub lines: the
    session keeps it from the last build that changed tiers, so a budget that grows with the session
    (a share of the full context) does not rewrite the stub note at every turn."""
    n = len(history)
    codes = history.codes()
    stubs = history.stub.a[:n].copy()
    for i in plan.evicted:
        codes[i] = ARCHIVED
        stubs[i] = forms.get(history.entries[i], Tier.ARCHIVED).tokens
    for i in plan.shown:
        codes[i] = CODE[Tier.COMPRESSED if i in plan.texts else plan.forms.get(i, Tier.VERBATIM)]
    for i, tier in plan.condensed.items():  # pins condensed for this build to make room for the best hit
        codes[i] = CODE[tier]
    arch = np.flatnonzero(codes == ARCHIVED)
    cap = stub_cap(policy, min(budget, stub_budget or budget))
    keep = int(np.searchsorted(np.cumsum(stubs[arch][::-1]), cap, side="right")) if len(arch) else 0
    lead = _system_end(history, codes)
    recent = max(lead, int(np.searchsorted(history.turn.a[:n], history.turn_no - policy.recent_turns, side="right")))
    return BuildView(history=history, forms=forms, counter=counter, policy=policy, budget=budget, query=query,
                     codes=codes, stubs=stubs, shown_stubs=arch[len(arch) - keep:], collapsed=arch[: len(arch) - keep],
                     paged=dict(plan.shown), lead=lead, recent=recent, values=values, overrides=dict(plan.texts))


def _system_end(history: History, codes: np.ndarray) -> int:
    """Where the system section ends: after the leading system messages (always pinned, never
    archived) and the pinned system and user messages that follow them, and after the pinned
    messages that open the active task (its system prompt or statement) when only archived messages
    of earlier tasks come between. Hard constraints and corrections are never archived, so an
    earlier task that holds one keeps the active task's statement after the note, in conversation
    order. They stay ahead of the stub note, which changes at every compaction: what precedes it is
    the prefix a provider's prompt cache reuses."""
    entries, n, j = history.entries, len(history), 0

    def pinned(i: int) -> bool:
        return codes[i] != ARCHIVED and entries[i].pinned and entries[i].msg.role in (Role.SYSTEM, Role.USER)

    while j < n and pinned(j):
        j += 1
    start = history.task_starts[-1]  # the active task's first entry
    if j < start < n and bool(np.all(codes[j:start] == ARCHIVED)) and pinned(start):
        j = start  # everything between is archived earlier tasks: their stubs follow the statement
        while j < n and pinned(j):
            j += 1
    return j


def assemble(view: BuildView, sections: Sequence[Section], values: ValueModel, vals: np.ndarray, rel: np.ndarray,
             warnings: list[WindowWarning]) -> ContextWindow:
    """Render ``sections`` (already sorted) into a :class:`ContextWindow`; its decisions are built on
    first access from a snapshot of this build."""
    messages: list[dict[str, Any]] = []
    infos: list[SectionInfo] = []
    tokens = REPLY_PRIMING_TOKENS
    for s in sections:
        msgs, n = s.render(view)
        messages.extend(msgs)
        tokens += n
        infos.append(SectionInfo(s.name, len(msgs), n))
    h = view.history
    paged_ids = [h.entries[i].msg.id for i in sorted(view.paged)]
    snapshot = _Snapshot(view, vals.copy(), rel.copy(), h.refs.a[: len(h)].copy(), h.turn_no)
    return ContextWindow(messages=messages, tokens=tokens, budget=view.budget, paged_in=paged_ids,  # type: ignore[arg-type]
                         warnings=warnings, sections=infos, decide=lambda: snapshot.decisions(values))


@dataclass
class _Snapshot:
    view: BuildView
    vals: np.ndarray
    rel: np.ndarray
    refs: np.ndarray
    turn_no: int

    def decisions(self, values: ValueModel) -> list[Decision]:
        v = self.view
        shown = set(v.shown_stubs.tolist())
        out = []
        for i in range(len(v.codes)):
            e = v.history.entries[i]
            tier = TIERS[v.codes[i]]
            if v.codes[i] == ARCHIVED:
                after = int(v.stubs[i]) if i in shown else 0
            else:
                after = (v.overrides.get(i) or v.forms.get(e, tier)).tokens
            paged = i in v.paged
            out.append(Decision(
                id=e.msg.id or "", turn=i, role=e.msg.role, category=e.category, value=float(self.vals[i]), tier=tier,
                tokens_before=e.tokens, tokens_after=after, pinned=e.pinned, paged_in=paged,
                factors=values.explain(e, self.turn_no, int(self.refs[i]), float(self.rel[i])),
                reason="paged in for the query" if paged else ("pinned" if e.pinned else ""),
            ))
        return out


#: A post-build hook: called with the window and the build's view; it may add warnings or findings.
PostBuildHook = Callable[[ContextWindow, BuildView], None]
