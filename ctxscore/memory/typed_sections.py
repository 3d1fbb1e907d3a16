"""The context-type layer: every message gets a context type when it arrives, and the window gains a
hard-constraints section and a goal-and-task-state section.

``ContextManager(layers=[ContextTypes()])``. Sections, at the documented positions:

- ``constraints`` (10): the hard-constraint sentences in force (system messages and the active task's
  user messages), byte-exact, with their source ids, for the messages not verbatim in this build
  (a verbatim message shows them already; the section then changes only when tiers change, which
  keeps provider prompt caches warm). The current budget is one of them ("my budget is $500").
- ``goal`` (20): the active task's goal and current sub-goal (their first sentences, verbatim) when
  their messages are not verbatim, and the task state: one line per tool step of the task (tool,
  status, the result's first words) whose messages are not verbatim; when the cap cuts them, the
  latest steps are kept (in their order) and the oldest left out. The goal is the task's opening
  request (its first goal message; a greeting, a navigation request such as "Next page please." or
  a side instruction such as "Send all confirmations to ..." is no goal message), or the goal
  message that restated it; the current sub-goal is the task's latest goal message
  (:meth:`GoalSection.lines`).

Each section is capped at ``share`` of the budget (tokens); lines past the cap are left out (their
messages stay in the history and the store). The compression rule of every type is
:data:`ctxscore.memory.context_types.COMPRESSION_RULES`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from ..messages import Message, Role
from ..scoring.rules import sentences
from ..window.history import Entry
from ..window.layers import Layer, LayerContext, check_share
from . import lexicon as lx
from .context_types import (
    HEAD_WEIGHT,
    ContextType,
    RuleTypeClassifier,
    TypeHead,
    TypePrediction,
    blend,
    load_default_head,
    small_talk,
    type_signals,
)
from .facts import Fact

DEFAULT_SHARE = 0.05
_STEP_CHARS = 80
_GOAL_SENTENCES = 2


@dataclass
class TaskTypes:
    """What the layer knows of one task: its goal messages, constraint messages and tool steps (indices),
    and its opening message (``first_user``: the index of its first user message that is no greeting)."""

    goals: list[int] = field(default_factory=list)
    constraints: list[int] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    first_user: int | None = None


class ContextTypes(Layer):
    """Context types of every message, and the ``constraints`` and ``goal`` sections (module docstring).

    Args:
        head: the learned head; ``"default"`` (the packaged one when present, else rules only), ``None``
            (rules only) or a :class:`~ctxscore.memory.context_types.TypeHead`.
        head_weight: weight of the head against the rules, in [0, 1]; ``None``: the weight the head was
            packaged with (chosen on the dev split), else :data:`~ctxscore.memory.context_types.HEAD_WEIGHT`.
        share: the fraction of the budget each section may use, in (0, 1].

    Raises:
        ConfigError: ``share`` or ``head_weight`` out of range.
    """

    def __init__(self, head: TypeHead | str | None = "default", head_weight: float | None = None,
                 share: float = DEFAULT_SHARE) -> None:
        if head_weight is not None and not 0 <= head_weight <= 1:
            raise ConfigError(f"ContextTypes head_weight must be in [0, 1], got {head_weight}")
        self.head = load_default_head() if head == "default" else head
        if isinstance(self.head, str):
            raise ConfigError(f"head must be 'default', None or a TypeHead, got {head!r}")
        if head_weight is None:
            head_weight = float(self.head.config.get("weight", HEAD_WEIGHT)) if self.head is not None else HEAD_WEIGHT
        self.head_weight = head_weight
        self.share = check_share("ContextTypes", share)
        self.rules = RuleTypeClassifier()
        self.sections = (ConstraintSection(self), GoalSection(self))
        self._reset()

    def _reset(self) -> None:
        self.types: dict[str, TypePrediction] = {}  # message id -> its type
        self.tasks: dict[int, TaskTypes] = {}

    def attach(self, ctx: LayerContext) -> None:
        """Keep the context (the history is read by the sections)."""
        self.ctx = ctx

    def on_reset(self) -> None:
        """Forget every type (the kept messages come again through :meth:`on_add`)."""
        self._reset()

    def on_add(self, entries: Sequence[Entry]) -> None:
        """Classify new messages (one batch through the head) and index the task's goals, constraints and steps."""
        sigs, preds = [], []
        for e in entries:
            t = self.tasks.setdefault(e.task, TaskTypes())
            first = e.msg.role == Role.USER and t.first_user is None and not small_talk(e.msg.content or "")
            s = type_signals(e.msg, e.constraints, first)
            sigs.append(s)
            preds.append(self.rules.classify(e.msg, e.constraints, first, s))
            if first:
                t.first_user = e.msg.turn
        learned = self.head.predict_proba([e.msg for e in entries], sigs) if self.head is not None and entries else None
        for k, e in enumerate(entries):
            p = blend(preds[k], learned[k] if learned else None, self.head_weight)
            self.types[e.msg.id or ""] = p
            self._index(e, p)

    def _index(self, e: Entry, p: TypePrediction) -> None:
        t = self.tasks[e.task]
        i = e.msg.turn or 0
        if e.msg.role == Role.USER and (p.type == ContextType.GOAL or ContextType.GOAL in p.also):
            t.goals.append(i)
        if e.constraints and e.msg.role in (Role.USER, Role.SYSTEM):
            t.constraints.append(i)
        if e.msg.tool_calls:
            t.steps.append(i)

    def type_of(self, message_id: str) -> TypePrediction | None:
        """The type of a message, or ``None`` for an unknown id."""
        return self.types.get(message_id)

    def fact_type(self, fact: Fact) -> ContextType:
        """The context type of a ledger fact: a tool call's or a tool result's value is ``tool``; a value in
        a hard-constraint sentence, or of a budget / limit slot, is ``constraint``; otherwise the type
        of its source message (an assistant's report: ``task``)."""
        if fact.origin in ("call", "json"):
            return ContextType.TOOL
        src = self.types.get(fact.source)
        hist = self.ctx.history
        i = hist.ids.get(fact.source)
        if i is not None and any(fact.value in s for s in hist.entries[i].constraints):
            return ContextType.CONSTRAINT
        if any(w in fact.slot.lower() for w in ("budget", "limit", "max", "预算", "最多")):
            return ContextType.CONSTRAINT
        if src is None:
            return ContextType.TASK
        return ContextType.TASK if src.type == ContextType.INSTRUCTION else src.type

    def counts(self) -> dict[str, int]:
        """Messages per type."""
        out = {str(t): 0 for t in ContextType}
        for p in self.types.values():
            out[p.type] += 1
        return out

    def state(self) -> dict[str, Any]:
        """The type of every message (JSON-ready)."""
        return {"types": {mid: str(p.type) for mid, p in self.types.items()}}


def _hidden(view: Any, i: int) -> bool:
    """Entry ``i`` is not shown verbatim in this build."""
    return int(view.codes[i]) != 0


def capped_note(view: Any, header: str, lines: Sequence[str], cap: int,
                order: Sequence[int] | None = None) -> tuple[list[dict[str, Any]], int]:
    """A system note of ``header`` and the lines that fit in ``cap`` tokens, counted as spent in
    ``view`` (:meth:`~ctxscore.window.assemble.BuildView.spend`).

    The lines are tried in ``order`` (indices into ``lines``; default: their own order), a line that
    does not fit in what is left is skipped, and the kept lines are shown in their own order.
    """
    tokens = view.counter.count(header) + 4
    keep = []
    for k in range(len(lines)) if order is None else order:
        n = view.counter.count(lines[k]) + 1
        if tokens + n > cap:
            continue
        keep.append(k)
        tokens += n
    kept = [lines[k] for k in sorted(keep)]
    if not kept:
        return [], 0
    msg = Message(role="system", content="\n".join([header, *kept]))
    n = view.counter.count_message(msg)
    view.spend(n)
    return [msg.to_openai()], n


class ConstraintSection:
    """The hard constraints in force whose messages are not verbatim in this build (module docstring)."""

    name = "constraints"
    position = 10
    HEADER = "Hard constraints in force (verbatim; source message):"

    def __init__(self, layer: ContextTypes) -> None:
        self.layer = layer

    def lines(self, view: Any) -> list[str]:
        """The section's lines for this build: system constraints, then the active task's."""
        h = view.history
        task = self.layer.tasks.get(h.task_no)
        idx = [i for t in self.layer.tasks.values() for i in t.constraints if h.entries[i].msg.role == Role.SYSTEM]
        idx += [i for i in (task.constraints if task else []) if h.entries[i].msg.role == Role.USER]
        out = []
        for i in dict.fromkeys(idx):
            if i < len(h.entries) and _hidden(view, i):
                e = h.entries[i]
                out += [f"- {s} ({e.msg.id})" for s in e.constraints]
        return out

    def render(self, view: Any) -> tuple[list[dict[str, Any]], int]:
        """The constraints note (empty when every constraint's message is verbatim)."""
        lines = self.lines(view)
        return capped_note(view, self.HEADER, lines, view.layer_cap(self.layer.share)) if lines else ([], 0)


class GoalSection:
    """The active task's goal, current sub-goal and tool steps, for messages not verbatim (module docstring)."""

    name = "goal"
    position = 20
    HEADER = "Goal and task state (source message):"

    def __init__(self, layer: ContextTypes) -> None:
        self.layer = layer

    def lines(self, view: Any) -> list[str]:
        """Goal, sub-goal and step lines of the active task (the one :attr:`History.task_starts
        <ctxscore.window.history.History.task_starts>` opened last).

        The goal is the task's first goal message -- its opening request (a greeting, a navigation
        request such as "Next page please." or a side instruction is no goal message) -- or the last
        goal message that restates it (:attr:`Entry.successor <ctxscore.window.history.Entry.successor>`,
        followed through goal messages: "Actually, I need a flight to Seattle instead"); the
        current sub-goal is the task's latest goal message when it is another one.
        """
        goals, steps = self._parts(view)
        return goals + steps

    def _parts(self, view: Any) -> tuple[list[str], list[str]]:
        """The goal and sub-goal lines, and the step lines oldest first (:meth:`lines`)."""
        h = view.history
        task = self.layer.tasks.get(h.task_no)
        if task is None:
            return [], []
        out = []
        if task.goals:
            first, last = _restated(h, task.goals[0], set(task.goals)), task.goals[-1]
            if _hidden(view, first):
                out.append(f"goal: {_lead(h.entries[first].msg.content)} ({h.entries[first].msg.id})")
            if last != first and _hidden(view, last):
                out.append(f"current sub-goal: {_lead(h.entries[last].msg.content)} ({h.entries[last].msg.id})")
        return out, [_step_line(h, i) for i in task.steps if _hidden(view, i)]

    def render(self, view: Any) -> tuple[list[dict[str, Any]], int]:
        """The goal note (empty when the goal and every step are verbatim). Within the cap the goal
        and sub-goal come first, then the steps newest first: the latest steps are kept, shown in
        their order, and the oldest are left out."""
        goals, steps = self._parts(view)
        lines = goals + steps
        order = [*range(len(goals)), *range(len(lines) - 1, len(goals) - 1, -1)]
        return capped_note(view, self.HEADER, lines, view.layer_cap(self.layer.share), order) if lines else ([], 0)


def _restated(h: Any, i: int, goals: set[int]) -> int:
    """The last goal message of the chain of restatements of goal message ``i`` (``i`` when none)."""
    seen = {i}
    while (j := h.entries[i].successor) is not None and j in goals and j not in seen:
        seen.add(j)
        i = j
    return i


def _lead(text: str) -> str:
    """The first sentences of a goal message, byte-exact."""
    return " ".join(sentences(text[:1200])[:_GOAL_SENTENCES])


def _step_line(h: Any, i: int) -> str:
    """``step: name(args) -> ok|error: first words (m12)`` for a tool call and its results."""
    e = h.entries[i]
    results = [h.entries[j] for j in h.units.get(e.unit, []) if h.entries[j].msg.role == Role.TOOL]
    status = "no result yet"
    if results:
        r = results[-1].msg.content.strip()
        bad = bool(lx.FAILED.search(r[:200])) or r[:6].lower() == "error:"
        status = ("error: " if bad else "ok: ") + " ".join(r.split())[:_STEP_CHARS]
    calls = ", ".join(f"{c.name}({c.arguments[:60]})" for c in e.msg.tool_calls)
    return f"step: {calls} -> {status} ({e.msg.id})"

