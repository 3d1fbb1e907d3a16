"""Aggregate metrics of the replay traces, per policy and budget.

All rates are micro-averages over the pooled checks of all sessions (each (probe point, fact) pair
is one check); token figures are sums over every turn of every session.

- ``recall`` / ``recall_pagein``: fraction of checks where the fact value was present without /
  with page-in. ``recall_end`` / ``recall_end_pagein``: the same on the final probe of each session
  only (``end_checks`` of them). ``recall_by_kind`` and ``recall_by_source`` give the four figures
  (and ``checks``, ``end_checks``) per fact kind and per session source.
- ``leakage`` / ``leakage_pagein``: over checks of facts that superseded an older value, the fraction
  where the old value was present while the new one was missing.
- ``cum_tokens``: sum over turns of the window tokens (the prompt tokens of an LLM call after every
  message); ``token_ratio`` = cum_tokens / cum_full_tokens; ``token_reduction`` = 1 - token_ratio.
- ``util_peak_feasible``: the peak over turns where the policy issued no warning, i.e. it did not have
  to relax recency protection or exceed the budget because pinned content and the recent turns do not
  fit (``infeasible_turns``: the share of turns with such a warning).
- ``util_mean`` / ``util_peak`` / ``util_p95``: window tokens / budget per turn, mean, maximum and 95th
  percentile over turns.
- ``over_budget_turns``: fraction of turns whose window exceeded the budget.
- ``warning_turns``: turns whose build warned (over budget); ``pinned_overflow_turns``: fraction of
  turns where pinned content (instructions, system messages) alone exceeded the budget.
- ``longest_fit_128k``: messages in the longest session whose window stayed within 128,000 tokens
  at every turn (``sessions_fit_128k`` counts such sessions).
- ``build_ms_p50`` / ``build_ms_p95``: per-turn build latency percentiles (numpy ``percentile``,
  linear interpolation); ``add_ms_*`` for ``add``, ``pagein_ms_*`` for the query builds at probes.
- ``cache_reuse``: share of window tokens that repeat the previous turn's identical message prefix,
  pooled over turns (weighted by window tokens); ``effective_token_ratio``: cumulative tokens with
  the reused ones priced at 0.1, over cumulative full-context tokens (:mod:`eval.cache`; ``None``
  when the replay had no counter).
- ``ledger_tokens_mean``: mean tokens per turn of the fact ledger's section; ``ledger_share``: its
  tokens / all window tokens; ``ledger_lines``: shown (turn, line) pairs; ``ledger_precision``:
  share of them whose value occurs byte-exact in the cited source message and whose slot words
  occur in that message or the one before it; ``ledger_value_ok`` / ``ledger_slot_ok``: the share
  meeting each condition; ``ledger_unmatched``: lines matching no current fact (:mod:`eval.ledger`;
  all ``None`` for a policy without a ledger).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import numpy as np

from .cache import cache_figures
from .replay import Trace

WINDOW_128K = 128_000


def _rate(num: int, den: int) -> float | None:
    return round(num / den, 4) if den else None


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 4) if values else None


def _tally(row: list[int], present: bool, present_p: bool, is_end: bool) -> None:
    """Add one check to ``row`` = [checks, hit, hit page-in, end checks, end hit, end hit page-in]."""
    row[0] += 1
    row[1] += present
    row[2] += present_p
    if is_end:
        row[3] += 1
        row[4] += present
        row[5] += present_p


def _recall_block(row: list[int]) -> dict[str, Any]:
    """The recall figures of one tally row (see :func:`_tally`)."""
    return {"checks": row[0], "recall": _rate(row[1], row[0]), "recall_pagein": _rate(row[2], row[0]),
            "end_checks": row[3], "recall_end": _rate(row[4], row[3]), "recall_end_pagein": _rate(row[5], row[3])}


def _recall_counts(traces: list[Trace]) -> dict[str, Any]:
    """Pooled tallies of the probe checks: all, per fact kind, per session source, and the superseded ones."""
    c: dict[str, Any] = {"all": [0] * 6, "sup_n": 0, "leak": 0, "leak_p": 0}
    by_kind: dict[str, list[int]] = defaultdict(lambda: [0] * 6)
    by_source: dict[str, list[int]] = defaultdict(lambda: [0] * 6)
    for tr in traces:
        for p in tr.probes:
            for row in (c["all"], by_kind[p.kind], by_source[tr.source]):
                _tally(row, p.present, p.present_pagein, p.is_end)
            if p.superseded:
                c["sup_n"] += 1
                c["leak"] += p.leak
                c["leak_p"] += p.leak_pagein
    c["by_kind"], c["by_source"] = by_kind, by_source
    return c


def _ledger_figures(traces: list[Trace]) -> dict[str, Any]:
    """Ledger figures of the traces that carry a ledger (see the module docstring); ``None`` values without one."""
    led = [tr for tr in traces if tr.ledger_tokens]
    names = ("ledger_tokens_mean", "ledger_share", "ledger_lines", "ledger_precision", "ledger_value_ok",
             "ledger_slot_ok", "ledger_unmatched")
    if not led:
        return dict.fromkeys(names)
    turns = sum(len(tr.ledger_tokens) for tr in led)
    tokens = sum(sum(tr.ledger_tokens) for tr in led)
    window = sum(sum(tr.tokens) for tr in led)
    lines = sum(tr.ledger_lines for tr in led)
    return {"ledger_tokens_mean": round(tokens / turns, 2), "ledger_share": _rate(tokens, window), "ledger_lines": lines,
            "ledger_precision": _rate(sum(tr.ledger_precise for tr in led), lines),
            "ledger_value_ok": _rate(sum(tr.ledger_value_ok for tr in led), lines),
            "ledger_slot_ok": _rate(sum(tr.ledger_slot_ok for tr in led), lines),
            "ledger_unmatched": sum(tr.ledger_unmatched for tr in led)}


def _cache(traces: list[Trace]) -> dict[str, float | None]:
    """``cache_reuse`` and ``effective_token_ratio`` pooled over the traces with per-turn reuse figures."""
    with_cache = [tr for tr in traces if tr.cached]
    if not with_cache:
        return {"cache_reuse": None, "effective_token_ratio": None}
    return cache_figures([x for tr in with_cache for x in tr.tokens], [x for tr in with_cache for x in tr.cached],
                         [x for tr in with_cache for x in tr.full])


def _turn_figures(traces: list[Trace]) -> dict[str, Any]:
    """Pooled per-turn figures: token sums, utilization (all and feasible turns), over-budget and
    warning counts, latencies, and the sessions that fit 128k."""
    f: dict[str, Any] = {"cum": 0, "cum_full": 0, "over": 0, "turns": 0, "infeasible_turns": 0, "warning_turns": 0,
                         "pinned_turns": 0, "util": [], "util_feasible": [], "build_ms": [], "add_ms": [],
                         "pagein_ms": [], "fit_lengths": []}
    for tr in traces:
        f["cum"] += sum(tr.tokens)
        f["cum_full"] += sum(tr.full)
        infeasible = tr.infeasible or [False] * len(tr.tokens)
        for tok, b, inf in zip(tr.tokens, tr.budget, infeasible, strict=True):
            f["util"].append(tok / b)
            f["over"] += tok > b
            if inf:
                f["infeasible_turns"] += 1
            else:
                f["util_feasible"].append(tok / b)  # turns the policy did not report as impossible to fit
        f["turns"] += len(tr.tokens)
        f["build_ms"] += tr.build_ms
        f["add_ms"] += tr.add_ms
        f["pagein_ms"] += tr.pagein_ms
        f["warning_turns"] += tr.warning_turns
        f["pinned_turns"] += tr.pinned_overflow_turns
        if tr.tokens and max(tr.tokens) <= WINDOW_128K:
            f["fit_lengths"].append(tr.n_messages)
    return f


def aggregate(traces: Iterable[Trace]) -> dict[str, Any]:
    """Metrics of the traces of one policy at one budget (see the module docstring).

    Returns:
        A JSON-ready dict (rates in [0, 1] or ``None`` when there was nothing to check).
    """
    traces = list(traces)
    c = _recall_counts(traces)
    f = _turn_figures(traces)
    util, util_feasible, turns, cum, cum_full = f["util"], f["util_feasible"], f["turns"], f["cum"], f["cum_full"]
    overall = _recall_block(c["all"])
    return {
        "sessions": len(traces),
        "messages": turns,
        **overall,
        "superseded_checks": c["sup_n"],
        "leakage": _rate(c["leak"], c["sup_n"]),
        "leakage_pagein": _rate(c["leak_p"], c["sup_n"]),
        "cum_tokens": cum,
        "cum_full_tokens": cum_full,
        "token_ratio": _rate(cum, cum_full),
        "token_reduction": round(1 - cum / cum_full, 4) if cum_full else None,
        "util_mean": round(float(np.mean(util)), 4) if util else None,
        "util_peak": round(float(np.max(util)), 4) if util else None,
        "util_p95": _pct(util, 95),
        "util_peak_feasible": round(float(np.max(util_feasible)), 4) if util_feasible else None,
        "infeasible_turns": _rate(f["infeasible_turns"], turns),
        "over_budget_turns": _rate(f["over"], turns),
        "longest_fit_128k": max(f["fit_lengths"]) if f["fit_lengths"] else 0,
        "sessions_fit_128k": len(f["fit_lengths"]),
        "build_ms_p50": _pct(f["build_ms"], 50),
        "build_ms_p95": _pct(f["build_ms"], 95),
        "add_ms_p50": _pct(f["add_ms"], 50),
        "add_ms_p95": _pct(f["add_ms"], 95),
        "pagein_builds": len(f["pagein_ms"]),
        "pagein_ms_p50": _pct(f["pagein_ms"], 50),
        "pagein_ms_p95": _pct(f["pagein_ms"], 95),
        "warning_turns": f["warning_turns"],
        "pinned_overflow_turns": _rate(f["pinned_turns"], turns),
        **_cache(traces),
        **_ledger_figures(traces),
        "recall_by_kind": {k: _recall_block(v) for k, v in sorted(c["by_kind"].items())},
        "recall_by_source": {k: _recall_block(v) for k, v in sorted(c["by_source"].items())},
    }
