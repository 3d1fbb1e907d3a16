"""The history of one session: entries, units, turn numbers and tier state with running token totals.

An :class:`Entry` is one message with what the manager computed once when it arrived (tokens,
prediction, entities, unit, pinned) and its mutable tier state (tier, tokens in that tier, the
cached compressed forms). A *unit* is what must never be split: an assistant message with tool
calls and the tool results that answer them. A *turn* starts at each user message.

:class:`History` keeps per-entry numpy arrays (intrinsic value, turn number, later references, tier
code, stub tokens) so value and tier computations are vectorised, and running totals so occupancy
is O(1) per build.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from enum import StrEnum
from typing import Any

import numpy as np

from ..memory.lexicon import OBSERVATION_HEAD, OBSERVATION_HEAD_CHARS, TASK_STATEMENT, TASK_STATEMENT_CHARS
from ..messages import Category, Message, Role, Tier
from ..scoring.base import Prediction


def is_observation(msg: Message) -> bool:
    """Whether ``msg`` starts as a tool observation sent as a user message
    (:data:`~ctxscore.memory.lexicon.OBSERVATION_HEAD`, mini-SWE-agent's ``<returncode>``): not the user speaking."""
    return OBSERVATION_HEAD.search(msg.content[:OBSERVATION_HEAD_CHARS]) is not None


def is_task_statement(msg: Message) -> bool:
    """Whether ``msg`` is a task statement handed to an agent: a user message, no tool observation
    (:func:`is_observation`), holding :data:`~ctxscore.memory.lexicon.TASK_STATEMENT` in its first
    characters. It opens a task (:func:`ctxscore.window.tasks.starts_task`) and, pinned, is never
    released while its task is active (:meth:`History.release_instructions`)."""
    return (msg.role == Role.USER and TASK_STATEMENT.search(msg.content[:TASK_STATEMENT_CHARS]) is not None
            and not is_observation(msg))


#: Tier codes in the per-entry array, gentlest first.
TIERS: tuple[Tier, ...] = (Tier.VERBATIM, Tier.STRUCTURED, Tier.COMPRESSED, Tier.ARCHIVED)
CODE: dict[Tier, int] = {t: i for i, t in enumerate(TIERS)}
ARCHIVED = CODE[Tier.ARCHIVED]

#: Category strength, for the category of a unit (its strongest member).
CATEGORY_RANK = {Category.FAILURE: 0, Category.REASONING: 1, Category.KEY_STATE: 2, Category.INSTRUCTION: 3}


class Pin(StrEnum):
    """Why an entry is pinned (never compressed or archived)."""

    SYSTEM = "system"  #: a system message
    INSTRUCTION = "instruction"  #: an instruction of the active task (unpinned when the task ends)
    CORRECTION = "correction"  #: a user correction of a requirement


@dataclass(frozen=True, slots=True)
class Form:
    """A message in one tier: the content shown, its tokens (with chat overhead), the tier reached
    (a compressor may fall back to a gentler one) and whether the compressor's form is still pending."""

    text: str
    tokens: int
    tier: Tier
    pending: bool = False


@dataclass(slots=True)
class Entry:
    """One message of the history (see the module docstring).

    Attributes:
        msg: the message (immutable; ``id`` and ``turn`` set).
        text: its rendered text (:meth:`Message.text`).
        tokens: tokens of the verbatim message with chat overhead.
        pred: the scorer's prediction.
        entities: entities of its scan text (head and tail of long texts).
        unit: index of the first entry of its unit.
        turn_no: number of the conversational turn it belongs to (0 before the first user message).
        pinned: never compressed or archived (``pin`` says why).
        task: number of the task it belongs to (a new task starts at a detected task boundary).
        constraints: its hard-constraint sentences: kept byte-exact in every compressed form, and the
            entry is never archived.
        pin: why it is pinned, or ``None``.
        date_from: index of the message whose date governs this one (a session's date marker), or ``None``.
        static: value factors that do not change with time (base, density ...), for explanations.
        confirmed: the user confirmed it right after.
        tier: its current tier.
        cur_tokens: tokens in the current tier (stub tokens when archived).
        forms: cached forms per tier.
        no_compress: compression fell back to verbatim; do not retry.
        blocks: the semantic blocks of a long message, once computed.
        text_tokens: tokens of its text alone (no media parts, tool calls or chat overhead), once
            computed (:meth:`ctxscore.window.tiers.Forms.text_tokens`).
        values: its typed values, ``(entity kind, lower-cased text)`` pairs of its scan text
            (:func:`ctxscore.window.supersede.typed_values`).
        successor: index of the first later user message that restates what this one said (a
            correction, a request for an alternative, or another value of the same kind) within
            :data:`~ctxscore.window.supersede.LOOKAHEAD` messages of the same task, or ``None``
            (:mod:`ctxscore.window.supersede`; the first restatement wins).
    """

    msg: Message
    text: str
    tokens: int
    pred: Prediction
    entities: tuple[str, ...]
    unit: int
    turn_no: int
    pinned: bool
    task: int = 0
    constraints: tuple[str, ...] = ()
    pin: Pin | None = None
    date_from: int | None = None
    static: dict[str, float] = field(default_factory=dict)
    confirmed: bool = False
    tier: Tier = Tier.VERBATIM
    cur_tokens: int = 0
    forms: dict[Tier, Form] = field(default_factory=dict)
    no_compress: bool = False
    blocks: list[Any] | None = None
    text_tokens: int | None = None
    values: frozenset[tuple[str, str]] = frozenset()
    successor: int | None = None

    @property
    def category(self) -> str:
        """The predicted category."""
        return self.pred.category

    @property
    def tier_category(self) -> str:
        """The category the tier policy treats it as: an instruction of a finished task is a goal
        record, summarised like ``key_state`` and competing by value."""
        c = self.pred.category
        return Category.KEY_STATE if c == Category.INSTRUCTION and not self.pinned else c


class _Grow:
    """A numpy array that grows by doubling (amortised O(1) append)."""

    def __init__(self, dtype: Any) -> None:
        self.a = np.zeros(64, dtype=dtype)

    def set(self, i: int, v: Any) -> None:
        if i >= len(self.a):
            self.a = np.concatenate([self.a, np.zeros_like(self.a)])
        self.a[i] = v


class History:
    """Entries of one session in order, their units and tier state.

    Token totals (tokens): ``total_tokens`` (every message verbatim), ``pinned_tokens`` (the pinned
    entries in their current tier: verbatim, or condensed while pins exceed the budget),
    ``msg_tokens`` (current tokens of the entries not archived) and ``stub_tokens`` (stub tokens of
    the archived ones); ``n_compacted`` counts entries not verbatim.
    """

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.ids: dict[str, int] = {}
        self.units: dict[int, list[int]] = {}
        self.call_owner: dict[str, int] = {}  # tool_call_id -> index of the assistant message
        self.turn_no = 0
        self.task_no = 0
        self.task_opened = False  # the active task's opening user message has come (ingest.append)
        self.today: date | None = None  # the session's date, when a message gave one
        self.date_source: int | None = None  # index of the message that gave it
        self.task_starts: list[int] = [0]  # index of the first entry of each task
        self.active_pins: list[int] = []  # entries pinned as instructions of the active task
        self.statements: set[int] = set()  # those of them that are task statements (a user's, lexicon.TASK_STATEMENT)
        self.task_corrections: list[int] = []  # entries pinned as corrections in the active task
        self.condensed: set[int] = set()  # pinned entries shown condensed (pins over the budget)
        self.constrained: set[int] = set()  # units with a member that holds a hard constraint
        self.total_tokens = 0
        self.pinned_tokens = 0
        self.msg_tokens = 0
        self.stub_tokens = 0
        self.n_compacted = 0
        self.intr = _Grow(np.float64)  # intrinsic value (set by the value model)
        self.turn = _Grow(np.int64)
        self.refs = _Grow(np.int64)
        self.code = _Grow(np.int8)
        self.stub = _Grow(np.int64)

    def __len__(self) -> int:
        return len(self.entries)

    def unit_of(self, msg: Message) -> int | None:
        """The unit a new message joins (a tool result joins its call), or ``None`` for a new unit."""
        if msg.role == Role.TOOL and msg.tool_call_id in self.call_owner:
            return self.entries[self.call_owner[msg.tool_call_id]].unit
        return None

    def start_task(self) -> list[int]:
        """Begin a new task at the next entry: the previous task's instructions and corrections are
        unpinned (they become goal records that compete by value; the corrections of 90 finished
        bookings, "Actually make it 8pm instead, table 12.", took a 1,200-token window to 1,514);
        returns their indices."""
        done = self.active_pins + [i for i in self.task_corrections if self.entries[i].pinned]
        for i in done:
            self._unpin(i)
        self.active_pins, self.task_corrections = [], []
        self.statements = set()
        self.task_no += 1
        self.task_starts.append(len(self.entries))
        self.task_opened = False
        return done

    def release_instructions(self, limit: int) -> list[int]:
        """Unpin the oldest instructions of the active task, never its newest one nor a task
        statement handed to an agent (:data:`~ctxscore.memory.lexicon.TASK_STATEMENT`), until
        pinned content is within ``limit`` tokens (a budget too tight for every instruction): they
        become goal records (summarised like ``key_state``, their hard-constraint sentences kept
        byte-exact and never archived) that compete by value, as a finished task's instructions
        do. A mini-SWE-agent session at 2,000 tokens released its task's ``<pr_description>``
        (1,635 tokens) for the harness's next format reminder ("Please always provide EXACTLY ONE
        action ...", an instruction too), and the rest of that task ran without its statement; the
        statement is shown condensed instead when pinned content exceeds the budget
        (:meth:`~ctxscore.window.session.SessionState.fit_pins`).

        Args:
            limit: the most tokens pinned entries may hold (the budget less reply priming and the
                layers' sections; after a build over the budget, also less the recent turns and the
                stub note's one line).

        Returns:
            The indices released, oldest first (empty when pinned content fits or only the newest
            instruction and the task statements are left).
        """
        out: list[int] = []
        for i in self._releasable():
            if self.pinned_tokens <= limit:
                break
            self.active_pins.remove(i)
            self._unpin(i)
            out.append(i)
        return out

    def _releasable(self) -> list[int]:
        """The active task's instructions :meth:`release_instructions` may unpin, oldest first."""
        return [i for i in self.active_pins[:-1] if i not in self.statements]

    def _unpin(self, i: int) -> None:
        """Entry ``i`` is pinned no longer (its shown tokens leave :attr:`pinned_tokens`)."""
        e = self.entries[i]
        e.pinned, e.pin = False, None
        self.pinned_tokens -= e.cur_tokens
        self.condensed.discard(i)

    def condensable_pins(self) -> list[int]:
        """Indices of the pinned entries that may be shown condensed while pinned content exceeds the
        budget: the instructions of the active task and the user corrections (never a system
        message), largest verbatim size first."""
        idx = [i for i, e in enumerate(self.entries) if e.pinned and e.pin in (Pin.INSTRUCTION, Pin.CORRECTION)]
        return sorted(idx, key=lambda i: (-self.entries[i].tokens, i))

    def append(self, msg: Message, text: str, tokens: int, pred: Prediction, entities: tuple[str, ...],
               pin: Pin | None, constraints: tuple[str, ...] = ()) -> Entry:
        """Add the entry of a new message (its ``turn`` is its index) and return it."""
        idx = len(self.entries)
        unit = self.unit_of(msg)
        if msg.role == Role.USER:
            self.turn_no += 1
        pinned = pin is not None
        e = Entry(msg=msg, text=text, tokens=tokens, pred=pred, entities=entities,
                  unit=idx if unit is None else unit, turn_no=self.turn_no, pinned=pinned, task=self.task_no,
                  constraints=constraints, pin=pin, date_from=self.date_source, cur_tokens=tokens)
        if pin == Pin.INSTRUCTION:
            self.active_pins.append(idx)
            if is_task_statement(msg):
                self.statements.add(idx)
        elif pin == Pin.CORRECTION:
            self.task_corrections.append(idx)
        self.entries.append(e)
        self.ids[msg.id] = idx  # type: ignore[index]
        self.units.setdefault(e.unit, []).append(idx)
        if constraints:
            self.constrained.add(e.unit)
        for call in msg.tool_calls:
            self.call_owner[call.id] = idx
        self.total_tokens += tokens
        self.msg_tokens += tokens
        if pinned:
            self.pinned_tokens += tokens
        self.turn.set(idx, e.turn_no)
        self.refs.set(idx, 0)
        self.code.set(idx, 0)
        self.stub.set(idx, 0)
        self.intr.set(idx, 0.0)
        return e

    def set_tier(self, i: int, tier: Tier, form: Form) -> bool:
        """Move entry ``i`` to ``tier`` shown as ``form``; True if the tier changed."""
        e = self.entries[i]
        if tier == e.tier:
            return False
        if e.tier == Tier.ARCHIVED:
            self.stub_tokens -= e.cur_tokens
        else:
            self.msg_tokens -= e.cur_tokens
        if e.pinned:  # a condensed pin (see SessionState.fit_pins): pinned_tokens counts what is shown
            self.pinned_tokens += form.tokens - e.cur_tokens
            (self.condensed.add if tier != Tier.VERBATIM else self.condensed.discard)(i)
        self.n_compacted += (tier != Tier.VERBATIM) - (e.tier != Tier.VERBATIM)
        e.tier = tier
        e.cur_tokens = form.tokens
        if tier == Tier.ARCHIVED:
            self.stub_tokens += e.cur_tokens
            self.stub.a[i] = e.cur_tokens
        else:
            self.msg_tokens += e.cur_tokens
        self.code.a[i] = CODE[tier]
        return True

    def eligible_units(self, k: int) -> dict[int, list[int]]:
        """Units (first index -> member indices) outside the last ``k`` turns with no pinned member.

        ``k = 0`` protects only the unit of the last message (the relaxation of last resort).
        """
        cutoff = self.turn_no - k  # turns with a number above the cutoff are recent
        entries = self.entries
        last_unit = entries[-1].unit if entries else -1
        return {
            u: members
            for u, members in self.units.items()
            if u != last_unit and all(not entries[i].pinned and entries[i].turn_no <= cutoff for i in members)
        }

    def recent_tokens(self, k: int) -> int:
        """Tokens the unpinned entries of the last ``k`` turns hold in their current forms (what
        recency protection keeps beside the pinned content); with ``k = 0``, of the last unit."""
        if not self.entries:
            return 0
        if k <= 0:
            members = self.units[self.entries[-1].unit]
            return sum(self.entries[i].cur_tokens for i in members if not self.entries[i].pinned)
        cutoff, n = self.turn_no - k, 0
        for e in reversed(self.entries):
            if e.turn_no <= cutoff:
                break
            if not e.pinned and e.tier != Tier.ARCHIVED:
                n += e.cur_tokens
        return n

    def releasable_tokens(self) -> int:
        """Tokens of the active task's instructions :meth:`release_instructions` may unpin (all but
        the newest and the task statements)."""
        return sum(self.entries[i].cur_tokens for i in self._releasable())

    def unit_category(self, members: list[int]) -> str:
        """The strongest tier category among a unit's members (:attr:`Entry.tier_category`)."""
        return max((self.entries[i].tier_category for i in members), key=lambda c: CATEGORY_RANK[Category(c)])

    def archivable(self, members: list[int]) -> bool:
        """A unit (its member indices, as :attr:`units` lists them) may be archived unless a member
        holds a hard constraint (it is only compressed)."""
        return not members or self.entries[members[0]].unit not in self.constrained

    def codes(self) -> np.ndarray:
        """A copy of the tier codes of every entry, shape (n,)."""
        return self.code.a[: len(self.entries)].copy()
