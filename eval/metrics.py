"""Aggregate metrics of the replay traces, per policy and budget.

All rates are micro-averages over the pooled checks of all sessions (each (probe point, fact) pair
is one check); token figures are sums over every turn of every session.

- ``recall`` / ``recall_pagein``: fraction of checks where the fact value was present without /
  with page-in. ``recall_end*``: the same on the final probe of each session only.
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
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import numpy as np

from .replay import Trace

WINDOW_128K = 128_000


def _rate(num: int, den: int) -> float | None:
    return round(num / den, 4) if den else None


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 4) if values else None


def _recall_counts(traces: list[Trace]) -> dict[str, Any]:
    """Pooled counts of the probe checks: all, at the end of each session, superseded, per fact kind."""
    c: dict[str, Any] = dict.fromkeys(("checks", "hit", "hit_p", "end_n", "end_hit", "end_hit_p", "sup_n", "leak",
                                       "leak_p"), 0)
    by_kind: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for tr in traces:
        for p in tr.probes:
            c["checks"] += 1
            c["hit"] += p.present
            c["hit_p"] += p.present_pagein
            k = by_kind[p.kind]
            k[0] += 1
            k[1] += p.present
            k[2] += p.present_pagein
            if p.is_end:
                c["end_n"] += 1
                c["end_hit"] += p.present
                c["end_hit_p"] += p.present_pagein
            if p.superseded:
                c["sup_n"] += 1
                c["leak"] += p.leak
                c["leak_p"] += p.leak_pagein
    c["by_kind"] = by_kind
    return c


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
    return {
        "sessions": len(traces),
        "messages": turns,
        "checks": c["checks"],
        "recall": _rate(c["hit"], c["checks"]),
        "recall_pagein": _rate(c["hit_p"], c["checks"]),
        "recall_end": _rate(c["end_hit"], c["end_n"]),
        "recall_end_pagein": _rate(c["end_hit_p"], c["end_n"]),
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
        "recall_by_kind": {
            k: {"checks": v[0], "recall": _rate(v[1], v[0]), "recall_pagein": _rate(v[2], v[0])}
            for k, v in sorted(c["by_kind"].items())
        },
    }
