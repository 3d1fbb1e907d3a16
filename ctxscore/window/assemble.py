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
recalled         80        messages paged back in for the query (one note)
===============  ========  ==========================================================

Page-in appends: the messages a query brings back are quoted in one system note after the last
message, in conversation order, and the sections before it are what the same build without a query
would show (its archive stubs included). A provider's prompt cache therefore keeps reusing the
window's prefix from turn to turn when every build has a query (the proxy, the LangChain middleware),
as it does for builds without one.

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
from .pagein import DIGEST_HEADER, RECALLED_HEADER, PageInPlan, recalled_tag
from .result import ContextWindow, Decision, SectionInfo, WindowWarning
from .tiers import COLLAPSED_LINE_TOKENS, Forms, collapsed_line, last_excess, stub_cap
from .value import ValueModel

SECTION_POSITIONS = {
    "system": 0, "constraints": 10, "goal": 20, "profile": 30, "ledger": 40,
    "archive_stubs": 50, "history": 60, "recent": 70, "recalled": 80,
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
        quoted: the entries of ``paged`` quoted in the recalled note, in order (``codes`` keeps their
            tier in the conversation); the others are shown in place (``codes`` has their page-in tier).
        paged_tiers: entries of ``paged`` shown in a compressed tier rather than verbatim, index -> tier.
        digest: entry index -> its digest line in the recalled note (:attr:`PageInPlan.digest`).
        lead: entries before this index are the system section: the leading system messages, the
            pinned system and user messages that follow them and the active task's statement
            (:func:`_system_end`; :meth:`system_indices`, the archived ones among them are stubs).
        recent: entries from this index on belong to the last ``recent_turns`` turns.
        values: the value of every entry in this build, shape (n,), or ``None``.
        overrides: entries shown in a form made for this build, index -> form: entries of ``paged``
            (the blocks a query names) and members of the last unit fitted to the budget.
        recalled_at: the recalled note comes right before this entry (the first of its unit, in the
            history or recent section): the last unit (the latest request, or the latest tool call
            and its results), or where the window before had the same note (:func:`make_view`);
            ``None``: after the last message (:class:`RecalledSection`).
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
    quoted: list[int] = field(default_factory=list)
    digest: dict[int, str] = field(default_factory=dict)
    paged_tiers: dict[int, Tier] = field(default_factory=dict)
    lead: int = 0
    recent: int = 0
    values: np.ndarray | None = None
    overrides: dict[int, Form] = field(default_factory=dict)
    recalled_at: int | None = None
    _note: tuple[dict[str, Any], int] | None = field(default=None, init=False, repr=False)
    _layer_tokens: int = field(default=0, init=False, repr=False)  # what the layers' notes took so far (spend)
    #: What the layers' notes may take together in this build (``None``: no limit beyond
    #: :meth:`layer_cap`'s); a build sets it when its window is over the budget at the end.
    layer_room: int | None = field(default=None, init=False, repr=False)

    def recalled_text(self) -> str | None:
        """The content of the recalled note (:class:`RecalledSection`): its header (which the
        LangChain middleware and readers find the note by), the quoted lines, then, when the plan has a
        digest, :data:`~ctxscore.window.pagein.DIGEST_HEADER` and the digest lines in conversation
        order; ``None`` when nothing is quoted or digested."""
        if not self.quoted and not self.digest:
            return None
        lines = [RECALLED_HEADER, *(self.recalled_line(i) for i in self.quoted)]  # the header names the note
        if self.digest:
            lines += [DIGEST_HEADER, *(self.digest[i] for i in sorted(self.digest))]
        return "\n".join(lines)

    @property
    def recalls(self) -> bool:
        """Whether this build has a recalled note (quotes or digest lines)."""
        return bool(self.quoted or self.digest)

    def recalled_note(self) -> tuple[dict[str, Any], int]:
        """The recalled note and its tokens (call only when :attr:`recalls`); made once
        per build (the same dict each call, so :func:`assemble` finds it in the section that shows it)."""
        if self._note is None:
            msg = Message(role="system", content=self.recalled_text() or "")
            self._note = msg.to_openai(), self.counter.count_message(msg)
        return self._note

    def recalled_anchor(self) -> tuple[str, int] | None:
        """``(note content, index of the entry it precedes)`` of this build's recalled note, for the
        next build (:func:`make_view`'s ``anchor``), or ``None`` when there is none or it is last."""
        text = self.recalled_text()
        if text is None or self.recalled_at is None:
            return None
        return text, self.recalled_at

    def system_indices(self) -> list[int]:
        """The entries the system section shows: those before :attr:`lead` not archived, in order."""
        return [i for i in range(self.lead) if self.codes[i] != ARCHIVED]

    def layer_cap(self, share: float) -> int:
        """Tokens a layer's section may take in this build: ``share`` of the budget, and no more than
        the budget leaves beside the pinned messages, the last unit (verbatim, or a huge one at the
        size the build cuts it to, :func:`~ctxscore.window.tiers.last_excess`), the stub note's one
        line, reply priming and the notes of the layers rendered before it (:meth:`spend`), so that an
        optional note gives way before the latest message is cut (a ledger's 138 tokens beside a
        1,340-token system prompt at 1,500 cut the user's question); within :attr:`layer_room` when a
        build set it (its window was over the budget: the recent turns beside a cut last output)."""
        h = self.history
        last = h.units[h.entries[-1].unit] if h.entries else []
        members = [i for i in last if not h.entries[i].pinned]
        if any(i in self.overrides for i in members):  # the last unit as this build cut it
            newest = sum(self.overrides[i].tokens if i in self.overrides else h.entries[i].tokens for i in members)
        else:  # a huge last output counts as the build counts it before the cut (last_excess)
            newest = sum(h.entries[i].tokens for i in members) - last_excess(h, self.budget, self.forms)
        stubs = COLLAPSED_LINE_TOKENS if h.stub_tokens else 0
        room = self.budget - REPLY_PRIMING_TOKENS - h.pinned_tokens - newest - stubs - self._layer_tokens
        if self.layer_room is not None:
            room = min(room, self.layer_room - self._layer_tokens)
        return max(0, min(int(share * self.budget), room))

    def spend(self, tokens: int) -> None:
        """Count ``tokens`` of a layer's note rendered in this view (the room :meth:`layer_cap` gives
        the layers rendered after it shrinks by them)."""
        self._layer_tokens += tokens

    @property
    def layers_spent(self) -> int:
        """Tokens the layers' notes took in this view so far (:meth:`spend`)."""
        return self._layer_tokens

    def note(self, lines: Sequence[str]) -> tuple[dict[str, Any], int]:
        """A system note holding ``lines`` and its tokens."""
        msg = Message(role="system", content="\n".join(lines))
        return msg.to_openai(), self.counter.count_message(msg)

    def collapsed_line(self) -> str:
        """The line that stands for the collapsed (oldest) archived messages."""
        entries, c = self.history.entries, self.collapsed
        return collapsed_line(len(c), str(entries[int(c[0])].msg.id), str(entries[int(c[-1])].msg.id))

    def render_entry(self, i: int) -> tuple[dict[str, Any], int]:
        """Entry ``i`` in its tier for this build (verbatim keeps content parts whole) and its tokens."""
        e = self.history.entries[i]
        tier = TIERS[self.codes[i]]
        if tier == Tier.VERBATIM:
            return e.msg.to_openai(), e.tokens
        override = self.overrides.get(i) if i not in self.quoted else None
        form = override or self.forms.get(e, tier)
        # only a fitted form can be of a message with media parts (no other form is made of one): it keeps them
        return e.msg.to_openai(content=form.text, keep_media=override is not None), form.tokens

    def recalled_line(self, i: int) -> str:
        """The line that quotes paged-in entry ``i``: its tag (:func:`~ctxscore.window.pagein.recalled_tag`,
        ``[m12 user] ``), then the entry verbatim (content and rendered tool calls, byte-exact), as the
        blocks the query names or in its compressed tier (:attr:`overrides`, :attr:`paged_tiers`)."""
        e = self.history.entries[i]
        if i in self.overrides:
            text = self.overrides[i].text
        elif i in self.paged_tiers:
            text = self.forms.get(e, self.paged_tiers[i]).text
        else:
            text = e.msg.text()
        return recalled_tag(self.history, i) + text


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
        if i == view.recalled_at:
            msg, n = view.recalled_note()
            out.append(msg)
            tokens += n
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


class RecalledSection:
    """The messages paged back in for the query, quoted in one system note (:meth:`BuildView.recalled_line`,
    in conversation order). The note goes right before the last unit (the latest request, or the latest
    tool call and its results), so the window ends as the conversation does, or stays where the window
    before had it; this section renders it after the last message only when neither can be shown
    (:attr:`BuildView.recalled_at` is ``None``). The window before the note is what the same build
    without a query shows, so a provider's prompt cache reuses that prefix."""

    name = "recalled"
    position = SECTION_POSITIONS["recalled"]

    def render(self, view: BuildView) -> tuple[list[dict[str, Any]], int]:
        if not view.recalls or view.recalled_at is not None:
            return [], 0
        note, n = view.recalled_note()
        return [note], n


class RecentSection:
    """The last ``recent_turns`` turns, in order (verbatim unless recency protection was relaxed)."""

    name = "recent"
    position = SECTION_POSITIONS["recent"]

    def render(self, view: BuildView) -> tuple[list[dict[str, Any]], int]:
        live = np.flatnonzero(view.codes[view.recent:] != ARCHIVED) + view.recent
        return _render(view, live.tolist())


DEFAULT_SECTIONS: tuple[Section, ...] = (SystemSection(), StubSection(), HistorySection(), RecentSection(),
                                         RecalledSection())


def sort_sections(sections: Sequence[Section]) -> list[Section]:
    """Sections in window order (by ``position``; the built-in ones first on ties)."""
    return sorted(sections, key=lambda s: float(s.position))


def make_view(history: History, forms: Forms, counter: TokenCounter, policy: Policy, budget: int,
              query: str | None, plan: PageInPlan, values: np.ndarray | None = None,
              stub_budget: int | None = None, anchor: tuple[str, int] | None = None) -> BuildView:
    """The :class:`BuildView` of one build: tier codes with the page-in plan's evictions and condensed
    pins applied (its page-ins are quoted in the recalled note and keep their codes), and which stubs
    are shown and which collapse. ``stub_budget`` (default ``budget``) sizes the stub lines: the
    session keeps it from the last build that changed tiers, so a budget that grows with the session
    (a share of the full context) does not rewrite the stub note at every turn. ``anchor`` is the last
    window's recalled note and the entry it preceded (:meth:`BuildView.recalled_anchor`): when this
    build quotes the same (a tool loop under one user request), the note stays before that entry, so
    the window up to and including it repeats the last one's prefix; else it goes before the last
    unit. A plan that collapses the stub note (:attr:`PageInPlan.stubs_collapsed`) shows its one
    collapsed line only."""
    n = len(history)
    codes = history.codes()
    stubs = history.stub.a[:n].copy()
    # the stub note and the system section are the ones the build without a query shows (evictions
    # and condensed pins are for this build only), unless page-ins in place drop their stub lines
    if plan.stubs_kept:
        arch = np.flatnonzero(codes == ARCHIVED)
        lead = _system_end(history, codes)
    for i in plan.in_place:  # page-ins shown in place of their current form
        codes[i] = CODE[Tier.COMPRESSED] if i in plan.texts else CODE[plan.forms.get(i, Tier.VERBATIM)]
    if not plan.stubs_kept:
        arch = np.flatnonzero(codes == ARCHIVED)
        lead = _system_end(history, codes)
    for i in plan.evicted:  # left out for this build, with no stub line
        codes[i] = ARCHIVED
    for i, tier in plan.condensed.items():  # pins condensed for this build to make room for the best hit
        codes[i] = CODE[tier]
    for i, form in plan.fitted.items():  # the last unit fitted to the room the budget leaves it
        codes[i] = CODE[form.tier]
    cap = stub_cap(policy, min(budget, stub_budget or budget))
    keep = int(np.searchsorted(np.cumsum(stubs[arch][::-1]), cap, side="right")) if len(arch) else 0
    recent = max(lead, int(np.searchsorted(history.turn.a[:n], history.turn_no - policy.recent_turns, side="right")))
    if plan.stubs_collapsed:  # one line for this build, to make room for a page-in
        keep = 0
    view = BuildView(history=history, forms=forms, counter=counter, policy=policy, budget=budget, query=query,
                     codes=codes, stubs=stubs, shown_stubs=arch[len(arch) - keep:], collapsed=arch[: len(arch) - keep],
                     paged=dict(plan.shown), quoted=[i for i in sorted(plan.shown) if i not in plan.in_place],
                     paged_tiers=dict(plan.forms), lead=lead, recent=recent, values=values,
                     overrides={**plan.texts, **plan.fitted}, digest=plan.digest)
    if view.recalls:
        last = history.entries[n - 1].unit  # the first entry of the last unit
        # an unchanged note stays where it was; one with only a digest does not (workers sharing a
        # session do not share where it stood: they would show it in different places)
        kept = anchor is not None and view.quoted and view.recalled_text() == anchor[0]
        for at in ((anchor[1],) if kept else ()) + (last,):  # type: ignore[index]
            # a unit's first entry (never between a tool call and its result), shown, after the system section
            if lead <= at < n and history.entries[at].unit == at and codes[at] != ARCHIVED:
                view.recalled_at = at
                break
    return view


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
    note = view.recalled_note() if view.recalls and view.recalled_at is not None else None
    inline = 0  # tokens of the recalled note where a conversation section rendered it in place
    for s in sections:
        msgs, n = s.render(view)
        messages.extend(msgs)
        tokens += n
        if note is not None and any(m is note[0] for m in msgs):
            inline = note[1]
            infos.append(SectionInfo(s.name, len(msgs) - 1, n - inline))
        else:
            infos.append(SectionInfo(s.name, len(msgs), n))
    if inline:  # counted as the recalled section, wherever it stands
        infos = [SectionInfo(i.name, 1, inline) if i.name == RecalledSection.name else i for i in infos]
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
        quoted = set(v.quoted)
        out = []
        for i in range(len(v.codes)):
            e = v.history.entries[i]
            tier = TIERS[v.codes[i]]
            if v.codes[i] == ARCHIVED:
                after = int(v.stubs[i]) if i in shown else 0
            else:
                after = ((v.overrides.get(i) if i not in v.quoted else None) or v.forms.get(e, tier)).tokens
            paged = i in v.paged
            out.append(Decision(
                id=e.msg.id or "", turn=i, role=e.msg.role, category=e.category, value=float(self.vals[i]), tier=tier,
                tokens_before=e.tokens, tokens_after=after, pinned=e.pinned, paged_in=paged,
                factors=values.explain(e, self.turn_no, int(self.refs[i]), float(self.rel[i])),
                reason=("paged in for the query" + (" (quoted after the last message)" if i in quoted else "")) if paged else (
                    "pinned" if e.pinned else ""),
            ))
        return out


#: A post-build hook: called with the window and the build's view; it may add warnings or findings.
PostBuildHook = Callable[[ContextWindow, BuildView], None]
