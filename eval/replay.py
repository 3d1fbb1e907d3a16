"""Replay of sessions, message by message, through each policy at each budget.

After every message the policy builds a window at the turn's budget (no query): its tokens, the
budget and the build time are recorded per turn (cumulative prompt tokens, utilization, latency).
At probe points (every ``probe_every`` messages and after the last one) every key fact whose source
message came strictly before the probe turn is checked by normalised text presence
(:mod:`eval.textnorm`) in that window ("without page-in"). "With page-in": the policy builds again
at the same budget with the fact's ``probe`` as the query (the context manager pages archived
originals back in) and the fact is checked in that window. By default (``pagein="missed"``) the
query build runs only for facts missing from the no-query window, and a fact present without page-in
counts as present with it; ``pagein="all"`` builds with every probe (slower; for checking that
assumption). Page-in builds of the same probe at the same turn are shared.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxscore.messages import Message
from ctxscore.tokens import REPLY_PRIMING_TOKENS, TokenCounter
from ctxscore.window.result import WarningKind

from .budgets import Budget
from .policies import WindowStrategy, clean_message
from .sessions import EvalSession, KeyFact
from .textnorm import present, window_text


@dataclass(slots=True)
class ProbeResult:
    """One check of one fact at one probe point.

    Attributes:
        turn: index of the last message added before the probe.
        fact_id, kind: the fact.
        present: value found in the window built without a query.
        present_pagein: value found with page-in (the probe as the query).
        superseded: whether the fact has a superseded value.
        leak, leak_pagein: the superseded value is present while the new value is missing.
        is_end: the probe after the session's last message.
    """

    turn: int
    fact_id: str
    kind: str
    present: bool
    present_pagein: bool
    superseded: bool = False
    leak: bool = False
    leak_pagein: bool = False
    is_end: bool = False


@dataclass(slots=True)
class Trace:
    """Everything recorded for one session under one policy at one budget.

    Per-turn lists have one entry per message (index = turn). Tokens are window tokens including
    chat overhead and reply priming; ``full`` is the full-context tokens at that turn; ``budget`` the
    budget at that turn (tokens); times are milliseconds.
    """

    session_id: str
    policy: str
    budget_key: str
    n_messages: int
    tokens: list[int] = field(default_factory=list)
    full: list[int] = field(default_factory=list)
    budget: list[int] = field(default_factory=list)
    add_ms: list[float] = field(default_factory=list)
    build_ms: list[float] = field(default_factory=list)
    pagein_ms: list[float] = field(default_factory=list)
    probes: list[ProbeResult] = field(default_factory=list)
    misses: list[dict[str, Any]] = field(default_factory=list)
    warning_turns: int = 0
    pinned_overflow_turns: int = 0
    infeasible: list[bool] = field(default_factory=list)  # per turn: the policy warned (relaxed recency, over budget)

    def with_budget(self, budget: Budget) -> Trace:
        """A copy for a budget-independent policy under another budget (only ``budget`` differs)."""
        return Trace(
            session_id=self.session_id, policy=self.policy, budget_key=budget.key, n_messages=self.n_messages,
            tokens=self.tokens, full=self.full, budget=[budget.tokens_at(f) for f in self.full],
            add_ms=self.add_ms, build_ms=self.build_ms, pagein_ms=self.pagein_ms, probes=self.probes,
            misses=[], warning_turns=self.warning_turns, pinned_overflow_turns=self.pinned_overflow_turns,
            infeasible=self.infeasible,
        )


def probe_turns(n_messages: int, probe_every: int) -> list[int]:
    """Probe turns: ``probe_every - 1, 2 * probe_every - 1, ...`` and the last turn ``n_messages - 1``.

    Raises:
        ValueError: ``probe_every`` < 1.
    """
    if probe_every < 1:
        raise ValueError(f"probe_every must be at least 1, got {probe_every}")
    turns = list(range(probe_every - 1, n_messages, probe_every))
    if n_messages and (not turns or turns[-1] != n_messages - 1):
        turns.append(n_messages - 1)
    return turns


def full_context_tokens(session: EvalSession, counter: TokenCounter) -> list[int]:
    """Full-context tokens after each message (every message verbatim + reply priming)."""
    out, total = [], REPLY_PRIMING_TOKENS
    for m in session.messages:
        total += counter.count_message(clean_message(m))
        out.append(total)
    return out


def replay(
    session: EvalSession,
    policy: WindowStrategy,
    budget: Budget,
    full: Sequence[int],
    *,
    probe_every: int = 10,
    pagein: str = "missed",
    record_misses: bool = False,
    clock: Callable[[], float] = time.perf_counter,
) -> Trace:
    """Replay ``session`` through ``policy`` at ``budget``.

    Args:
        session: a validated session.
        policy: a fresh policy (it is fed every message of the session).
        budget: the budget rule.
        full: full-context tokens after each message (:func:`full_context_tokens`).
        probe_every: probe after every this many messages (and after the last).
        pagein: ``"missed"`` (query builds only for facts missing without a query), ``"all"`` or
            ``"none"`` (no query builds; with-page-in equals without).
        record_misses: collect a feedback record for every fact missing without page-in.
        clock: seconds clock (tests inject a fake).

    Returns:
        The :class:`Trace`.

    Raises:
        ValueError: bad ``pagein`` or ``probe_every``.
    """
    if pagein not in ("missed", "all", "none"):
        raise ValueError(f"pagein must be 'missed', 'all' or 'none', got {pagein!r}")
    n = len(session.messages)
    trace = Trace(session.session_id, policy.name, budget.key, n)
    probes = set(probe_turns(n, probe_every))
    last = n - 1
    facts = sorted(session.key_facts, key=lambda f: f.source_index)
    seen_miss: set[str] = set()  # one record per fact per trace (policy and budget are fixed)
    for t, msg in enumerate(session.messages):
        t0 = clock()
        policy.add(msg)
        t1 = clock()
        b = budget.tokens_at(full[t])
        win = policy.build(b)
        t2 = clock()
        trace.tokens.append(win.tokens)
        trace.full.append(full[t])
        trace.budget.append(b)
        trace.add_ms.append((t1 - t0) * 1000)
        trace.build_ms.append((t2 - t1) * 1000)
        trace.infeasible.append(bool(win.warnings))  # the policy said it could not keep to its own limits
        if win.warnings:
            trace.warning_turns += 1
            trace.pinned_overflow_turns += any(w.kind == WarningKind.PINNED_OVER_BUDGET for w in win.warnings)
        due = [f for f in facts if f.source_index < t] if t in probes else []
        if due:
            _probe(session, policy, budget, trace, win, t, due, b, pagein=pagein, is_end=t == last,
                   record_misses=record_misses, seen_miss=seen_miss, clock=clock)
    return trace


def _probe(session: EvalSession, policy: WindowStrategy, budget: Budget, trace: Trace, win: Any, t: int,
           due: Sequence[KeyFact], b: int, *, pagein: str, is_end: bool, record_misses: bool, seen_miss: set[str],
           clock: Callable[[], float]) -> None:
    """Check the facts ``due`` at probe turn ``t`` in the window ``win`` (built at ``b`` tokens) and,
    per the page-in mode, in the window built with each fact's probe as the query; appends the
    :class:`ProbeResult` s (and feedback records of missed facts, once per fact) to ``trace``."""
    text = window_text(win.messages)
    decisions: dict[str, Any] | None = None
    pagein_cache: dict[str, str] = {}  # page-in builds of the same probe at this turn are shared
    for f in due:
        hit = present(f.value, text)
        if pagein == "none" or not policy.uses_query:
            hit_p, text_p = hit, text
        elif hit and pagein == "missed":
            hit_p, text_p = True, text
        else:
            if f.probe not in pagein_cache:
                p0 = clock()
                w2 = policy.build(b, query=f.probe)
                trace.pagein_ms.append((clock() - p0) * 1000)
                pagein_cache[f.probe] = window_text(w2.messages)
            text_p = pagein_cache[f.probe]
            hit_p = present(f.value, text_p)
        res = ProbeResult(turn=t, fact_id=f.fact_id, kind=f.kind, present=hit, present_pagein=hit_p,
                          superseded=f.superseded is not None, is_end=is_end)
        if f.superseded is not None:
            res.leak = not hit and present(f.superseded, text)
            res.leak_pagein = not hit_p and present(f.superseded, text_p)
        trace.probes.append(res)
        if record_misses and not hit and f.fact_id not in seen_miss:
            seen_miss.add(f.fact_id)
            if decisions is None:
                decisions = win.decisions or {}
            trace.misses.append(_miss_record(session, f, policy, decisions, t, hit_p, budget))


#: Feedback records keep at most this many characters of the message text: the first and last half,
#: as the distilled-label annotators saw long texts (``../shared/datasets/README.md``).
FEEDBACK_TEXT_CHARS = 1800


def _cut(text: str, limit: int = FEEDBACK_TEXT_CHARS) -> str:
    """``text`` or, when longer than ``limit``, its first and last ``limit // 2`` characters joined by " … "."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]} … {text[-half:]}"


def _miss_record(session: EvalSession, fact: KeyFact, policy: WindowStrategy, decisions: dict[str, Any] | None,
                 turn: int, recovered: bool, budget: Budget) -> dict[str, Any]:
    """Feedback record of a fact missing from a managed policy's window (see :mod:`eval.feedback`)."""
    src = session.messages[fact.source_index]
    mid = session.message_id(fact.source_index)
    msg = Message.from_dict(clean_message(src), where=mid)
    preds = policy.predictions()
    cat, val = preds.get(mid, (None, None))
    dec = (decisions or {}).get(mid)
    return {
        "session_id": session.session_id,
        "message_id": mid,
        "message_index": fact.source_index,
        "role": msg.role,
        "text": _cut(msg.text()),
        "text_chars": len(msg.text()),
        "predicted_category": cat,
        "predicted_value": None if val is None else round(float(val), 4),
        "tier": dec.tier if dec is not None else None,
        "window_value": round(dec.value, 4) if dec is not None else None,
        "fact": {"fact_id": fact.fact_id, "value": fact.value, "kind": fact.kind, "probe": fact.probe,
                 **({"superseded": fact.superseded} if fact.superseded is not None else {})},
        "policy": policy.name,
        "budget": budget.key,
        "probe_turn": turn,
        "recovered_by_pagein": recovered,
    }
