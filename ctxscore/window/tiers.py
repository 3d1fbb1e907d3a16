"""Tier policy: what is pinned, the compressed forms, occupancy, and staged compaction.

When occupancy (window tokens / budget) reaches the high-water mark ``t_archive`` (0.8), one
compaction pass runs in stages on the units outside the last ``recent_turns`` turns that have no
pinned member (:func:`plan_compaction`):

==============================  ================================================================
stage                           action
==============================  ================================================================
1 (occupancy >= ``t_compact``)    ``failure`` units -> archived; ``reasoning`` -> compressed
2 (still >= ``t_structure``)      ``key_state`` -> structured; ``reasoning`` units -> archived
3 (still > ``low_water``)         units archived by ascending value until occupancy <= ``low_water``
==============================  ================================================================

Compaction goes down to the low-water mark in one batch, so the window prefix then stays stable
for several turns (provider prompt caches stay warm). While occupancy stays above the high-water
mark, recency protection is relaxed turn by turn down to the last message alone.
:func:`plan_compaction` reads the history and returns the tier changes; it changes no tier itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..compress.base import Compressor, compress_verified
from ..compress.blocks import (
    BLOCK_MAX_CHARS,
    BLOCK_MIN_CHARS,
    Block,
    blocked_form,
    key_blocks,
    query_blocks,
    rank_query_blocks,
    split_blocks,
)
from ..compress.extractive import archive_stub
from ..compress.verify import key_spans
from ..config import Policy
from ..messages import Category, Message, Role, Tier
from ..scoring.base import Prediction
from ..scoring.rules import RuleConfig
from ..tokens import REPLY_PRIMING_TOKENS, TokenCounter
from .history import ARCHIVED, CODE, Entry, Form, History, Pin
from .result import WarningKind, WindowWarning

#: Allowance for the line that collapses the oldest stubs, in tokens (occupancy estimate).
COLLAPSED_LINE_TOKENS = 40
#: Compressed forms prepared ahead of need per build (:func:`prepare_forms`): more than the messages
#: a turn adds, so the backlog drains (a proxy process that serves every other turn sees twice as many).
PREPARE_PER_BUILD = 6
#: A user correction longer than this many characters is an ordinary message, not pinned.
CORRECTION_MAX_CHARS = 400
#: Occupancy (share of the budget) under which compacted messages come back verbatim, newest first,
#: up to the low-water mark (:func:`plan_restore`), when the last compaction ran at a budget so much
#: smaller (one build at a small budget, a proxy request whose tools took most of it) that what set it
#: off is under the low-water mark of this one; the window would otherwise stay that small for good.
RESTORE_BELOW = 0.4
#: Share of the budget the last unit counts for at most, in occupancy, when a build may cut it
#: (:func:`last_excess`); also the size above which a unit in the recent turns is archived first
#: when the recent turns alone hold more than the high-water mark (:func:`plan_compaction`). A
#: quarter: a huge output then leaves the earlier turns whole while they and a quarter of the
#: budget fit below the high-water mark, and the cut gives the output all the room they leave.
LARGE_UNIT_SHARE = 0.25


def pin_reason(msg: Message, pred: Prediction, entities: tuple[str, ...], config: RuleConfig) -> Pin | None:
    """Why a new message is pinned, or ``None``: system messages; instructions (of the active task, whose
    first user message :func:`~ctxscore.window.ingest.append` pins too, whatever its category:
    :meth:`History.start_task` unpins them when the task ends); user corrections (a short user
    message with a value and a ``correction`` keyword of the rule file: it restates a requirement, so
    the new value is never archived while the old request stays)."""
    if msg.role == Role.SYSTEM:
        return Pin.SYSTEM
    if pred.category == Category.INSTRUCTION:
        return Pin.INSTRUCTION
    if msg.role != Role.USER or not entities or len(msg.content) > CORRECTION_MAX_CHARS or "correction" not in config.keywords:
        return None
    return Pin.CORRECTION if config.keyword_counts(msg.content).get("correction", 0) > 0 else None


def collapsed_line(n: int, first: str, last: str) -> str:
    """The line of the stub note that stands for ``n`` collapsed (oldest) archived messages, the ids of
    the first and the last named."""
    return f"[archived {n} earlier messages {first} … {last}; ask about them to page them back in]"


class Forms:
    """Computes (once per entry and tier) the form an entry takes in a tier.

    Args:
        counter: token counter.
        compressor: proposes compressed forms (verified by the shared verifier).
        config: rule file (entity patterns for the verifier).
        max_compress_chars: longer messages are never compressed, only archived.
        extractor: the learned key-span extractor (``text -> spans``, e.g. ``LearnedScorer.key_spans``)
            whose spans every compressed form keeps besides the entities, or ``None`` (the rules alone;
            see :func:`ctxscore.compress.verify.key_spans`).
    """

    def __init__(self, counter: TokenCounter, compressor: Compressor, config: RuleConfig, max_compress_chars: int,
                 extractor: Callable[[str], Sequence[str]] | None = None) -> None:
        self.counter = counter
        self.compressor = compressor
        self.config = config
        self.max_compress_chars = max_compress_chars
        self.extractor = extractor
        # the query forms of the last query's terms: (entry id, limit) -> form, entry id -> ranked blocks
        self._query: tuple[tuple[str, ...], dict[tuple[str, int], Form | None], dict[str, list[int]]] = ((), {}, {})
        # the fitted forms of the last unit: (id of the entry object, limit, terms) -> (entry, form)
        self._fitted: dict[tuple[int, int, tuple[str, ...]], tuple[Entry, Form]] = {}

    def text_tokens(self, e: Entry) -> int:
        """Tokens of the text of ``e`` alone (no media parts, tool calls or chat overhead): what a cut
        can shorten (computed once, kept on the entry)."""
        if e.text_tokens is None:
            e.text_tokens = self.counter.count(e.msg.content)
        return e.text_tokens

    def forget(self) -> None:
        """Drop the forms made for single builds (query forms, fitted forms): the history was read
        again, and a message id may now name another message (after a rebase or a truncation)."""
        self._query = ((), {}, {})
        self._fitted.clear()

    def key_spans(self, e: Entry) -> list[str]:
        """The spans every compressed form of ``e`` keeps: its entities, the extractor's key spans and
        its hard constraints (substrings of its content, distinct, in that order)."""
        spans = key_spans(e.msg.content, self.config, extractor=self.extractor)
        return list(dict.fromkeys([*spans, *e.constraints]))

    def get(self, e: Entry, tier: Tier) -> Form:
        """The form of ``e`` in ``tier`` (compression may fall back to a gentler tier; see
        :func:`ctxscore.compress.base.compress_verified`). Messages with media parts and empty ones
        are never compressed; a message longer than :data:`~ctxscore.compress.blocks.BLOCK_MIN_CHARS`
        characters is compacted block by block (its head, errors, key blocks and tail kept
        byte-exact, the other blocks archived in place); a long JSON message keeps its verified
        structured summary instead when that (up to ``max_compress_chars``) is at most half as long."""
        if tier == Tier.VERBATIM:
            return Form(e.msg.content, e.tokens, Tier.VERBATIM)
        got = e.forms.get(tier)
        if got is None:
            content = e.msg.content
            if tier == Tier.ARCHIVED:
                stub = archive_stub(e.msg.id or "", e.text)
                got = Form(stub, self.counter.count(stub) + 1, Tier.ARCHIVED)
            elif not content.strip() or e.msg.has_media:
                got = Form(content, e.tokens, Tier.VERBATIM)
            else:
                got = None
                long = len(content) > BLOCK_MIN_CHARS
                if len(content) <= self.max_compress_chars and (not long or content.lstrip()[:1] in "[{"):
                    got = self._compressed(e, tier)  # long prose and logs go straight to blocks
                    if got is None:
                        return Form(content, e.tokens, Tier.VERBATIM, pending=True)
                if long and (got is None or got.tier == Tier.VERBATIM or len(got.text) * 2 > len(content)):
                    got = self._blocked(e)
                got = got or Form(content, e.tokens, Tier.VERBATIM)
            e.forms[tier] = got
            if tier == Tier.COMPRESSED and got.tier == Tier.STRUCTURED:
                # the compressed form failed verification and the structured one passed: that is the
                # structured form too (compress_verified from STRUCTURED on), so it is not computed twice
                e.forms.setdefault(Tier.STRUCTURED, got)
        return got

    def _compressed(self, e: Entry, tier: Tier) -> Form | None:
        """The verified form of a message's text for ``tier`` (``None`` while an async compressor works)."""
        spans = self.key_spans(e) if e.constraints or self.extractor is not None else None
        res = compress_verified(self.compressor, e.msg.content, tier, spans=spans, config=self.config)
        if res.pending:  # an asynchronous compressor has no form yet: verbatim now, ask again later
            return None
        return Form(res.text, self.counter.count_message(e.msg, content=res.text), res.tier)

    def blocks(self, e: Entry) -> list[Block]:
        """The semantic blocks of a long message (computed once)."""
        if e.blocks is None:
            e.blocks = split_blocks(e.msg.content)
        return e.blocks

    def _blocked(self, e: Entry) -> Form:
        """A long message with its key blocks kept and the others archived in place (see :mod:`ctxscore.compress.blocks`)."""
        content = e.msg.content
        blocks = self.blocks(e)
        if len(blocks) < 3:
            return Form(content, e.tokens, Tier.VERBATIM)
        wanted = [*(self.extractor(content) if self.extractor is not None else ()), *e.constraints]
        text = blocked_form(content, blocks, key_blocks(content, blocks, spans=wanted), e.msg.id or "")
        return Form(text, self.counter.count_message(e.msg, content=text), Tier.COMPRESSED)

    def query_form(self, e: Entry, terms: list[str], limit_tokens: int) -> Form | None:
        """A long message shown for a query: its first block and the blocks holding the query's terms,
        within about ``limit_tokens`` tokens; ``None`` for a short message or when no block matches."""
        content = e.msg.content
        if len(content) <= BLOCK_MIN_CHARS or e.msg.has_media or not terms:
            return None
        key = tuple(terms)
        if self._query[0] != key or len(self._query[1]) > 4096:  # a new query: forget the last one's forms
            self._query = (key, {}, {})
        forms, ranks = self._query[1], self._query[2]
        key_id = e.msg.id or str(id(e))
        if (key_id, limit_tokens) in forms:
            return forms[key_id, limit_tokens]
        blocks = self.blocks(e)
        ranked = ranks.get(key_id)
        if ranked is None:
            ranked = ranks[key_id] = rank_query_blocks(content, blocks, terms)
        got = None
        chars = max(0, limit_tokens) * 3.0  # a first guess of characters per token, corrected below
        for _ in range(3):
            keep = query_blocks(content, blocks, terms, limit_chars=int(chars), ranked=ranked)
            if len(keep) <= 1:
                break
            text = blocked_form(content, blocks, keep, e.msg.id or "")
            form = Form(text, self.counter.count_message(e.msg, content=text), Tier.COMPRESSED)
            if form.tokens <= limit_tokens:
                got = form
                break
            chars *= 0.9 * limit_tokens / form.tokens
        forms[key_id, limit_tokens] = got
        return got

    def fitted_form(self, e: Entry, limit_tokens: int, terms: Sequence[str] = ()) -> Form | None:
        """A message of the last unit shown within ``limit_tokens`` tokens when it must be (the last
        unit alone is larger than the room the budget leaves it): the blocks holding the query's
        ``terms`` best (:func:`~ctxscore.compress.blocks.rank_query_blocks`) within half of the room,
        then its first and last blocks, the blocks with errors, key spans (the extractor's and the
        hard constraints) and the densest in key-like tokens, then the other blocks in order, as many
        as fit, the rest archived in place (:func:`~ctxscore.compress.blocks.blocked_form`); when even
        the first and last blocks do not fit, the first block alone, then the marker alone. A
        message with media parts keeps them (counted in ``limit_tokens``; only its text is cut).
        ``None`` for a message of one block (nothing to cut); the result may exceed ``limit_tokens``
        only when the marker alone (with the media parts) does. The forms are remembered per entry object
        (a proxy builds the same last unit at every retry; an id reused after a rebase is another entry)."""
        content = e.msg.content
        if not content:
            return None
        key = (id(e), limit_tokens, tuple(terms))
        hit = self._fitted.get(key)
        if hit is not None and hit[0] is e:
            return hit[1]
        media = sum(self.counter.count_part(p) for p in e.msg.parts if p.text is None)
        room = limit_tokens - media  # what its text may take
        # blocks of at most a sixth of the room (at least 100 characters), so its head and tail fit
        per_token = len(content) / max(1, e.tokens - media)
        blocks = split_blocks(content, max(100, min(BLOCK_MAX_CHARS, int(room * per_token / 6))))
        if len(blocks) < 2:
            return None
        spans = [*(self.extractor(content) if self.extractor is not None else ()), *e.constraints]
        mid = e.msg.id or ""
        ranked = rank_query_blocks(content, blocks, terms) if terms else []

        def form(keep: set[int]) -> Form:
            text = blocked_form(content, blocks, keep, mid)
            return Form(text, self.counter.count_message(e.msg, content=text) + media, Tier.COMPRESSED)

        def chosen(chars: float) -> set[int]:
            keep = query_blocks(content, blocks, terms, int(chars / 2), ranked) - {0} if ranked else set()
            used = sum(blocks[i].end - blocks[i].start for i in keep)
            keep |= key_blocks(content, blocks, share=max(0.0, chars - used) / len(content), spans=spans)
            used = sum(blocks[i].end - blocks[i].start for i in keep)
            for i, b in enumerate(blocks):  # the room left: the other blocks in order
                if i not in keep and used + b.end - b.start <= chars:
                    keep.add(i)
                    used += b.end - b.start
            return keep

        got: Form | None = None
        chars = max(0, room) * per_token * 0.95  # the message's own characters per token, corrected below
        for _ in range(4):
            got = form(chosen(chars))
            if got.tokens <= limit_tokens:
                break
            chars *= 0.9 * max(0, room) / max(1, got.tokens - media)
        else:
            for keep in ({0}, set()):
                got = form(keep)
                if got.tokens <= limit_tokens:
                    break
        if len(self._fitted) > 64:
            self._fitted.clear()
        self._fitted[key] = (e, got)
        return got

    def reached(self, e: Entry, tier: Tier) -> Tier:
        """The tier ``e`` actually reaches when asked for ``tier``; marks it ``no_compress`` when
        compression fell back to verbatim."""
        if tier in (Tier.STRUCTURED, Tier.COMPRESSED):
            form = self.get(e, tier)
            tier = form.tier
            if tier == Tier.VERBATIM and not form.pending:
                e.no_compress = True
        return tier


    def condensed(self, e: Entry) -> tuple[Tier, Form] | None:
        """The tier and form a pinned entry is condensed to (its structured form, or the gentler tier
        compression reaches), or ``None`` when no form is smaller than what it shows now (tokens)."""
        tier = self.reached(e, Tier.STRUCTURED)
        if tier == Tier.VERBATIM:
            return None
        form = self.get(e, tier)
        return (tier, form) if form.tokens < e.cur_tokens else None

    def set_tier(self, history: History, i: int, tier: Tier) -> bool:
        """Move entry ``i`` to ``tier`` (or the gentler tier its compression reaches); True if it changed."""
        e = history.entries[i]
        tier = self.reached(e, tier)
        return history.set_tier(i, tier, self.get(e, tier))


def stub_cap(policy: Policy, budget: int) -> int:
    """Tokens the stub lines may use before older stubs collapse into one line."""
    return int(policy.stub_fraction * budget)


def cuttable_last(history: History) -> list[int]:
    """Indices of the last unit's members a build may cut to fit (see
    :meth:`~ctxscore.window.session.SessionState.build`): unpinned, verbatim, with text (a message
    with media parts too: its text is cut, its media parts are kept)."""
    if not history.entries:
        return []
    entries = history.entries
    return [i for i in history.units[entries[-1].unit] if not entries[i].pinned and entries[i].tier == Tier.VERBATIM
            and entries[i].msg.content]


def last_excess(history: History, budget: int, forms: Forms) -> int:
    """Tokens by which the last unit's cuttable members exceed :data:`LARGE_UNIT_SHARE` of ``budget``,
    at most the text tokens of those longer than :data:`~ctxscore.compress.blocks.BLOCK_MAX_CHARS`
    characters (the text cut into blocks, :meth:`Forms.text_tokens`; a short one only takes its
    compressed form, and media parts and tool calls are never cut).

    Occupancy, compaction and page-in count the last unit this much smaller: a build cuts it to the
    room the rest of the window leaves (:meth:`Forms.fitted_form`), so a huge last tool output makes
    neither compaction archive the earlier turns for good nor page-in find no room. 0 when the last
    unit is within the share or holds nothing to cut."""
    members = [history.entries[i] for i in cuttable_last(history)]
    cuttable = sum(forms.text_tokens(e) for e in members if len(e.msg.content) > BLOCK_MAX_CHARS)
    if not cuttable:
        return 0
    return int(min(cuttable, max(0.0, sum(e.tokens for e in members) - LARGE_UNIT_SHARE * budget)))


def occupancy(msg_tokens: int, stub_tokens: int, policy: Policy, budget: int) -> int:
    """Estimated window tokens: messages not archived, the stubs shown (capped) and reply priming."""
    stubs = min(stub_tokens, stub_cap(policy, budget) + COLLAPSED_LINE_TOKENS) if stub_tokens else 0
    return msg_tokens + stubs + REPLY_PRIMING_TOKENS


class _Overlay:
    """Tentative tiers over a history: planning reads the history and changes only this overlay."""

    def __init__(self, history: History, forms: Forms, policy: Policy, budget: int, reserved: int,
                 excess: int = 0) -> None:
        self.h, self.forms, self.policy, self.budget, self.reserved = history, forms, policy, budget, reserved
        self.excess = excess  # the last unit counts this much smaller (last_excess); compaction never changes it
        self.msg_tokens, self.stub_tokens = history.msg_tokens - excess, history.stub_tokens
        self.changes: dict[int, Tier] = {}
        self.cur: dict[int, int] = {}

    def tier(self, i: int) -> Tier:
        return self.changes.get(i, self.h.entries[i].tier)

    def tokens(self, i: int) -> int:
        return self.cur.get(i, self.h.entries[i].cur_tokens)

    def occupancy(self) -> int:
        return occupancy(self.msg_tokens, self.stub_tokens, self.policy, self.budget) + self.reserved

    def set(self, i: int, tier: Tier) -> bool:
        e = self.h.entries[i]
        tier = self.forms.reached(e, tier)
        old = self.tier(i)
        if tier == old:
            return False
        if old == Tier.ARCHIVED:
            self.stub_tokens -= self.tokens(i)
        else:
            self.msg_tokens -= self.tokens(i)
        self.cur[i] = self.forms.get(e, tier).tokens
        if tier == Tier.ARCHIVED:
            self.stub_tokens += self.cur[i]
        else:
            self.msg_tokens += self.cur[i]
        self.changes[i] = tier
        return True

    def revert(self, i: int, tier: Tier) -> None:
        """Undo :meth:`set`: entry ``i`` back to ``tier``, its tier before."""
        self.set(i, tier)
        if tier == self.h.entries[i].tier:
            self.changes.pop(i, None)
            self.cur.pop(i, None)


@dataclass(frozen=True)
class CompactionPlan:
    """What :func:`plan_compaction` decided.

    Attributes:
        changes: entry index -> new tier, in the order decided.
        stuck: nothing could be compacted (until the history or the budget changes).
    """

    changes: dict[int, Tier] = field(default_factory=dict)
    stuck: bool = False


def _stage(ov: _Overlay, values: np.ndarray, k: int, relaxed: bool = False) -> None:
    """One compaction pass over the units outside the last ``k`` turns (module docstring).

    ``relaxed``: a pass after recency protection was relaxed: the newly eligible units are only
    summarised (key_state, reasoning), then units are archived by ascending value until occupancy is
    back under the high-water mark -- not down to the low-water mark -- so relaxing disturbs the
    recent turns as little as it can.
    """
    pol, h, B = ov.policy, ov.h, ov.budget
    units = h.eligible_units(k)
    cap = stub_cap(pol, B)
    # a pass only compresses and archives: what the history holds archived (or compacted) stays so,
    # and the scans below look only at the rest (in a long session most of it is archived already)
    codes = h.code.a[: len(h.entries)]
    verbatim = [i for i in np.flatnonzero(codes == CODE[Tier.VERBATIM]).tolist() if h.entries[i].unit in units]
    open_units = sorted({h.entries[i].unit for i in np.flatnonzero(codes != ARCHIVED).tolist()} & units.keys())

    def occ() -> float:
        return ov.occupancy() / B

    def unit_value(members: list[int]) -> float:
        return float(max(values[i] for i in members))

    def compress_all(category: str, tier: Tier) -> None:
        for i in verbatim:
            e = h.entries[i]
            if e.tier_category == category and ov.tier(i) == Tier.VERBATIM and not e.no_compress:
                ov.set(i, tier)

    def stub(u: int) -> int:
        return sum(ov.forms.get(h.entries[i], Tier.ARCHIVED).tokens for i in units[u] if ov.tier(i) != Tier.ARCHIVED)

    def archive_units(unit_ids: list[int], until: float | None) -> None:
        order = sorted(unit_ids, key=lambda u: (unit_value(units[u]), u))
        # once the stubs overflow the cap, older stubs collapse into one line: archiving then frees a
        # message's tokens even when its own stub is not smaller than it (many short messages)
        collapsing = ov.stub_tokens + sum(stub(u) for u in order) > cap + COLLAPSED_LINE_TOKENS
        before, done = ov.occupancy(), []
        for u in order:
            if until is not None and occ() <= until:
                break
            members = units[u]
            if not collapsing and ov.stub_tokens + stub(u) <= cap and sum(ov.tokens(i) for i in members) <= stub(u):
                continue  # its stub would be shown and would not be smaller than the message itself
            for i in members:
                prev = ov.tier(i)
                if ov.set(i, Tier.ARCHIVED):
                    done.append((i, prev))
        if done and ov.occupancy() >= before:
            # the collapsed line of stubs costs more than the messages free (a budget of a few dozen
            # tokens): archiving them would make the window larger, so they stay as they were
            for i, prev in reversed(done):
                ov.revert(i, prev)

    def live() -> list[int]:
        """Units that may still be archived (not all archived; no hard constraint)."""
        return [u for u in open_units if h.archivable(units[u]) and any(ov.tier(i) != Tier.ARCHIVED for i in units[u])]

    if relaxed:
        compress_all(Category.REASONING, Tier.COMPRESSED)
        compress_all(Category.KEY_STATE, Tier.STRUCTURED)
        if occ() > pol.t_archive:
            archive_units(live(), pol.t_archive)
        return
    if occ() >= pol.t_compact:
        archive_units([u for u in live() if h.unit_category(units[u]) == Category.FAILURE], None)
        compress_all(Category.REASONING, Tier.COMPRESSED)
    if occ() >= pol.t_structure:
        compress_all(Category.KEY_STATE, Tier.STRUCTURED)
        archive_units([u for u in live() if h.unit_category(units[u]) == Category.REASONING], None)
    if occ() > pol.low_water:
        archive_units(live(), pol.low_water)


def _archive_large_recent(ov: _Overlay, k: int) -> None:
    """When the unpinned entries of the last ``k`` turns alone keep occupancy above the high-water
    mark (recency protection cannot hold), archive the units among them larger than
    :data:`LARGE_UNIT_SHARE` of the budget (an earlier huge tool output), largest first, until the
    recent turns fit below it: before, the first stage archived every older unit down to the
    low-water mark without getting there, then relaxed recency anyway. Never the last unit, a unit
    with a pinned member or a hard constraint."""
    h, B = ov.h, ov.budget
    if not h.entries:
        return
    cutoff, last = h.turn_no - k, h.entries[-1].unit
    recent: dict[int, list[int]] = {}
    for i in range(len(h.entries) - 1, -1, -1):
        e = h.entries[i]
        if e.turn_no <= cutoff:
            break
        if e.unit != last:
            recent.setdefault(e.unit, h.units[e.unit])
    high = ov.policy.t_archive * B
    protected = h.pinned_tokens + h.recent_tokens(k) - ov.excess + REPLY_PRIMING_TOKENS + ov.reserved
    large = [(sum(ov.tokens(i) for i in m if ov.tier(i) != Tier.ARCHIVED), u, m) for u, m in recent.items()
             if not any(h.entries[i].pinned for i in m) and h.archivable(m)]
    for size, _, members in sorted(large, reverse=True):
        if protected <= high or size <= LARGE_UNIT_SHARE * B:
            return
        for i in members:
            ov.set(i, Tier.ARCHIVED)
        protected -= size


def plan_compaction(history: History, values: np.ndarray, forms: Forms, policy: Policy, budget: int,
                    reserved: int = 0, excess: int = 0) -> CompactionPlan:
    """One batch of compaction at the high-water mark (module docstring); while occupancy stays above
    it, recency protection is relaxed turn by turn (down to the last message alone) with gentle passes.
    A unit in the recent turns larger than :data:`LARGE_UNIT_SHARE` of the budget is archived first
    when the recent turns alone are above the high-water mark (:func:`_archive_large_recent`).

    Args:
        history: the session history (read only).
        values: the value of every entry, shape (n,).
        forms: the form cache.
        policy: the tier policy.
        budget: the token budget of this build.
        reserved: tokens of the layers' sections (they count like pinned content).
        excess: tokens the last unit counts less than it holds (:func:`last_excess`).
    """
    ov = _Overlay(history, forms, policy, budget, reserved, excess)
    # more turns than the session has are all of them, its messages before the first user message
    # too (turn 0): a huge setting relaxed one turn at a time (recent_turns=10**12 never finished)
    k = min(policy.recent_turns, history.turn_no + 1)
    _archive_large_recent(ov, k)
    _stage(ov, values, k)
    while ov.occupancy() > policy.t_archive * budget and k > 0:
        k -= 1
        _stage(ov, values, k, relaxed=True)
    return CompactionPlan(changes=ov.changes, stuck=not ov.changes)


def plan_restore(history: History, occupancy_tokens: int, target: float, recent_turns: int = 0,
                 recent_target: float | None = None) -> list[int]:
    """Compacted entries to show verbatim again, whole units from the newest back, while the
    occupancy estimate (``occupancy_tokens``, tokens) stays within ``target`` tokens (the low-water
    mark); it stops at the first unit that does not fit, so what stays compacted is the oldest part
    of the history. A unit of the last ``recent_turns`` turns, which recency protection keeps verbatim
    at any budget the history fits, may grow the estimate up to ``recent_target`` instead (below the
    high-water mark: a build at the budget restored to would not compact them either); without it a
    recent tool result larger than the low-water mark left the whole window compacted. Units with a
    pinned member are left to :meth:`~ctxscore.window.session.SessionState.fit_pins`.

    Returns:
        The entry indices to set verbatim, newest unit first.
    """
    entries, out, occ = history.entries, [], occupancy_tokens
    codes = history.code.a[: len(entries)]
    cutoff = history.turn_no - recent_turns  # turns with a number above it are recent
    seen: set[int] = set()
    for i in np.flatnonzero(codes)[::-1].tolist():
        u = entries[i].unit
        if u in seen:
            continue
        seen.add(u)
        members = history.units[u]
        if any(entries[j].pinned for j in members):
            continue
        # stubs of archived members leave the note (counted as freeing nothing: the estimate stays high)
        grow = sum(entries[j].tokens - (0 if entries[j].tier == Tier.ARCHIVED else entries[j].cur_tokens) for j in members)
        recent = recent_target is not None and all(entries[j].turn_no > cutoff for j in members)
        if occ + grow > (recent_target if recent else target):
            break
        occ += grow
        out += [j for j in members if entries[j].tier != Tier.VERBATIM]
    return out


def prepare_forms(history: History, forms: Forms, start: int, recent_turns: int, limit: int = PREPARE_PER_BUILD) -> int:
    """Compute the compressed forms of up to ``limit`` entries that have left the recent turns, from
    index ``start`` on, and return the index to start from next time.

    Spreads the cost of compression over the turns between compactions (a few messages per build),
    so a compaction pass mostly switches tiers; a form not prepared yet is computed when needed.
    """
    cutoff = history.turn_no - recent_turns
    entries = history.entries
    i, done = start, 0
    while i < len(entries) and entries[i].turn_no <= cutoff and done < limit:
        e = entries[i]
        if not e.pinned and e.tier_category in (Category.REASONING, Category.KEY_STATE):
            forms.get(e, Tier.COMPRESSED if e.tier_category == Category.REASONING else Tier.STRUCTURED)
            done += 1
        i += 1
    return i


def pinned_overflow(pinned_tokens: int, budget: int) -> WindowWarning:
    """The warning (or :class:`~ctxscore.errors.BudgetError` message) when pinned content exceeds the budget."""
    return WindowWarning(
        WarningKind.PINNED_OVER_BUDGET,
        f"pinned content (instructions, system messages and layer sections) needs {pinned_tokens} tokens, above the budget of "
        f"{budget}; raise the budget to at least {pinned_tokens} or shorten the instructions",
        {"pinned_tokens": pinned_tokens, "budget": budget})


def recency_relaxed(compacted: int, recent_turns: int, budget: int) -> WindowWarning:
    """The warning that ``compacted`` messages of the last ``recent_turns`` turns are not verbatim."""
    return WindowWarning(
        WarningKind.RECENCY_RELAXED,
        f"recency protection relaxed: {compacted} message(s) of the last {recent_turns} turn(s) are compacted to "
        f"fit the budget of {budget} tokens; raise the budget to keep recent turns verbatim",
        {"messages": compacted, "recent_turns": recent_turns, "budget": budget})


def page_in_skipped(skipped: int, tokens: int, budget: int, limit: int, smallest: int | None = None) -> WindowWarning:
    """The warning that relevant stored messages could not be paged in within the page-in limit
    (``limit`` tokens), beside pinned content, the recent turns and the other page-ins (the forms
    page-in tries: verbatim, the blocks the query names, for the best hit its structured form);
    ``smallest``: tokens of the smallest of them verbatim, when known (what the room left lacked)."""
    need = f"; the smallest of them holds {smallest} tokens" if smallest is not None else ""
    return WindowWarning(
        WarningKind.PAGE_IN_SKIPPED,
        f"{skipped} message(s) relevant to the query could not be paged in within the page-in limit of {limit} "
        f"tokens: the window holds {tokens} of {budget} (pinned content, the recent turns and what was paged "
        f"in){need}; raise the budget or the policy's page_in_limit, or ask about one thing at a time",
        {"skipped": skipped, "tokens": tokens, "budget": budget, "limit": limit, "smallest": smallest})


def store_unavailable(what: str, error: Exception) -> WindowWarning:
    """The warning that the store failed during a build (the window was built from memory)."""
    return WindowWarning(WarningKind.STORE_UNAVAILABLE,
                         f"the store could not {what} ({error}); the window was built from memory and the "
                         "change is retried at the next build", {})


def build_warnings(history: History, policy: Policy, budget: int, tokens: int, plan: Any,
                   reserved: int = 0) -> list[WindowWarning]:
    """The warnings that follow from the state after a build (recomputed at every build, so a second
    build of the same state warns the same): pinned content over the budget, compacted recent turns,
    a window over budget although pinned content fits, and hits that could not be paged in (``plan``:
    the final page-in plan; ``reserved``: tokens of the layers' sections, counted as pinned)."""
    pinned_tokens = history.pinned_tokens + REPLY_PRIMING_TOKENS + reserved
    out = [pinned_overflow(pinned_tokens, budget)] if pinned_tokens > budget else []
    n = len(history)
    start = int(np.searchsorted(history.turn.a[:n], history.turn_no - policy.recent_turns, side="right"))
    compacted = int(np.count_nonzero(history.code.a[start:n]))
    if compacted:
        out.append(recency_relaxed(compacted, policy.recent_turns, budget))
    if tokens > budget and pinned_tokens <= budget:
        out.append(over_budget(tokens, budget, policy.recent_turns))
    if plan.fitted:
        out.append(last_fitted(history, plan.fitted, budget))
    if plan.unplaced:
        sizes = [history.entries[history.ids[h]].tokens for h in plan.unplaced if h in history.ids]
        out.append(page_in_skipped(len(plan.unplaced), tokens, budget, int(policy.page_in_limit * budget),
                                   min(sizes) if sizes else None))
    return out


def last_fitted(history: History, fitted: dict[int, Form], budget: int) -> WindowWarning:
    """The warning that members of the last unit are shown cut to the budget (``fitted``: entry
    index -> the form shown)."""
    ids = [history.entries[i].msg.id or "" for i in sorted(fitted)]
    before = sum(history.entries[i].tokens for i in fitted)
    after = sum(f.tokens for f in fitted.values())
    one = len(ids) == 1
    return WindowWarning(
        WarningKind.LAST_MESSAGE_FITTED,
        f"the last {'message' if one else 'messages'} ({', '.join(ids)}: {before} tokens) "
        f"{'does' if one else 'do'} not fit the budget of {budget} tokens: shown in {after} tokens, cut to fit "
        "(the first and last blocks, the blocks the query names and the key blocks kept byte-exact, the others "
        "archived in place; the originals stay whole in the store); raise the budget or have the tool return less",
        {"tokens_before": before, "tokens_after": after, "budget": budget})


def over_budget(tokens: int, budget: int, recent_turns: int) -> WindowWarning:
    """The warning that the window stays above the budget although pinned content fits."""
    return WindowWarning(
        WarningKind.OVER_BUDGET,
        f"window needs {tokens} tokens, above the budget of {budget}: the last {recent_turns} turn(s) and "
        "pinned messages cannot be compacted further", {"tokens": tokens, "budget": budget})
