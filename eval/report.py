"""Outputs of an evaluation run: ``metrics.json``, ``report.md`` and PNG plots."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .boundaries import boundary_table
from .cache import CACHED_PRICE
from .policies import base_policy
from .replay import Trace
from .runner import REFERENCE_BUDGET_KEY

PLOT_RECALL = "recall_vs_budget.png"
PLOT_TOKENS = "tokens_per_turn.png"
POLICY_STYLE = {"full": "C7", "sliding_turns": "C1", "trim_messages": "C2", "rules": "C0", "learned": "C3",
                "rules_ledger": "C9", "learned_ledger": "C6"}
_X_LABEL = {"fraction": "budget (fraction of full context per turn)",
            "final_fraction": "budget (fraction of the session's final length)", "tokens": "budget (tokens)"}


def _f(v: Any, digits: int = 3) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def write_metrics(summary: dict[str, Any], out_dir: Path) -> Path:
    """Write ``metrics.json`` (the summary, UTF-8, indented) and return its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "metrics.json"
    path.write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def plot_recall(summary: dict[str, Any], path: Path) -> Path | None:
    """Recall versus budget per policy: fraction budgets and absolute budgets side by side.

    Solid lines: recall with page-in; dashed: without. Returns ``None`` when there is nothing to plot.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = summary["results"]
    kinds = [k for k in ("fraction", "final_fraction", "tokens") if any(r["budget"]["kind"] == k for r in results)]
    if not kinds:
        return None
    fig, axes = plt.subplots(1, len(kinds), figsize=(6 * len(kinds), 4.2), squeeze=False)
    for ax, kind in zip(axes[0], kinds, strict=True):
        for pol in dict.fromkeys(r["policy"] for r in results):
            rows = sorted((r for r in results if r["policy"] == pol and r["budget"]["kind"] == kind),
                          key=lambda r: r["budget"]["value"])
            xs = [r["budget"]["value"] for r in rows]
            color = POLICY_STYLE.get(pol)
            ax.plot(xs, [r["recall_pagein"] for r in rows], marker="o", color=color, label=f"{pol} (page-in)")
            if any(r["recall_pagein"] != r["recall"] for r in rows):
                ax.plot(xs, [r["recall"] for r in rows], marker=".", ls="--", color=color, label=f"{pol} (no page-in)")
        if kind == "tokens":
            ax.set_xscale("log")
        ax.set_xlabel(_X_LABEL[kind])
        ax.set_ylabel("key-fact recall")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.set_title(f"recall vs budget ({kind})")
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def representative_session(traces: dict[tuple[str, str], list[Trace]]) -> str | None:
    """The longest session (most messages; ties by id) among the traces."""
    best: tuple[int, str] | None = None
    for trs in traces.values():
        for t in trs:
            cand = (t.n_messages, t.session_id)
            if best is None or cand[0] > best[0] or (cand[0] == best[0] and cand[1] < best[1]):
                best = cand
    return best[1] if best else None


def plot_tokens(traces: dict[tuple[str, str], list[Trace]], budget_key: str, path: Path,
                session_id: str | None = None) -> tuple[Path, str] | None:
    """Window tokens per turn of one session for every policy at ``budget_key`` (plus the budget line).

    Returns ``(path, session_id)`` or ``None`` when no trace exists at that budget.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    at = {pol: trs for (pol, key), trs in traces.items() if key == budget_key}
    if not at:
        return None
    sid = session_id or representative_session({k: v for k, v in traces.items() if k[1] == budget_key})
    fig, ax = plt.subplots(figsize=(9, 4.2))
    budget_line = None
    for pol, trs in at.items():
        tr = next((t for t in trs if t.session_id == sid), None)
        if tr is None:
            continue
        ax.plot(range(len(tr.tokens)), tr.tokens, color=POLICY_STYLE.get(pol), label=pol, lw=1.2)
        budget_line = tr.budget
    if budget_line is not None:
        ax.plot(range(len(budget_line)), budget_line, color="k", ls=":", lw=1, label="budget")
    ax.set_xlabel("turn (messages added)")
    ax.set_ylabel("window tokens")
    ax.set_title(f"tokens per turn, {sid}, budget {budget_key}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path, sid


def _run_lines(summary: dict[str, Any]) -> list[str]:
    """Title and the facts of the run (timings, sessions, settings, model, skipped policies)."""
    run = summary["run"]
    lines = ["# ctxscore evaluation report", ""]
    model = run.get("model") or {}
    lines += [
        f"- created: {run['created']}; eval runtime {run['runtime_s']} s "
        f"(per policy: {', '.join(f'{k} {v} s' for k, v in run['policy_runtime_s'].items())})",
        f"- sessions: {run['sessions']} ({run['messages']:,} messages, {run['session_lengths']['min']}-"
        f"{run['session_lengths']['max']} per session), key facts: {run['key_facts']:,} "
        f"({run['superseded_facts']} superseded); sessions hash `{run['sessions_hash']}`",
        f"- probes every {run['probe_every']} messages and after the last; page-in mode `{run['pagein']}`; "
        f"encoding `{run['encoding']}`; fraction budgets floored at {run['min_budget_tokens']} tokens",
    ]
    if model:
        lines.append("- learned model: " + ", ".join(f"{k} `{v}`" for k, v in model.items() if v is not None))
    if run.get("learned_scoring_ms") is not None and run["messages"]:
        lines.append(f"- learned scoring: {run['learned_scoring_ms'] / 1000:.1f} s for {run['messages']:,} messages "
                     f"({run['learned_scoring_ms'] / run['messages']:.2f} ms per message, one batch per session; "
                     "not part of the build latency)")
    for pol, why in run.get("skipped_policies", {}).items():
        lines.append(f"- **{pol} policy skipped**: {why}")
    if run.get("validator_notes"):
        lines.append(f"- validator notes: {run['validator_notes']} (superseded values never stated before their "
                     "replacement; they cannot leak)")
    if summary.get("run_id"):
        lines.append(f"- MLflow run `{summary['run_id']}`")
    return lines


def _policy_table(summary: dict[str, Any]) -> list[str]:
    """The policy x budget table with its legend."""
    lines = ["", "## Policies x budgets", "",
              "Recall: fraction of (probe, fact) checks with the fact's value in the window, without / with "
              "page-in (the probe as the query). Leakage: superseded value present while the new one is missing "
              "(without / with page-in). Tokens: cumulative prompt tokens over all turns / full context. "
              "Utilization: window tokens / budget per turn; over budget: share of turns above it; pinned over: share "
              "of turns where pinned content (instructions, system messages) alone exceeded the budget; peak feasible: peak "
              "over the turns where the policy gave no warning (it did not have to relax recency protection or "
              "exceed the budget). Fit 128k: longest session (messages) whose window "
              "stayed within 128k tokens.", "",
              "| policy | budget | recall | recall page-in | recall end | recall end page-in | leakage | leakage page-in "
              "| tokens / full | reduction | util mean | util p95 | util peak | peak feasible | over budget | pinned over | fit 128k "
              "| build ms p50 | p95 |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary["results"]:
        lines.append(
            f"| {r['policy']} | {r['budget']['label']} | {_f(r['recall'])} | {_f(r['recall_pagein'])} | "
            f"{_f(r['recall_end'])} | {_f(r['recall_end_pagein'])} | {_f(r['leakage'])} | {_f(r['leakage_pagein'])} | "
            f"{_f(r['token_ratio'])} | {_f(r['token_reduction'])} | {_f(r['util_mean'])} | {_f(r['util_p95'])} | "
            f"{_f(r['util_peak'])} | {_f(r.get('util_peak_feasible'))} | {_f(r['over_budget_turns'])} | {_f(r.get('pinned_overflow_turns'))} | "
            f"{r['longest_fit_128k']} ({r['sessions_fit_128k']}/{r['sessions']}) | "
            f"{_f(r['build_ms_p50'], 2)} | {_f(r['build_ms_p95'], 2)} |"
        )
    return lines


def _target_lines(summary: dict[str, Any]) -> list[str]:
    """The targets of the reference budget, check by check."""
    tg = summary.get("targets") or {}
    lines = ["", f"## Targets (issue 5 item 9, budget {REFERENCE_BUDGET_KEY})", ""]
    if not tg.get("evaluated"):
        lines.append(f"Not evaluated: {tg.get('reason', 'no result')}.")
    else:
        if tg["stand_in"]:
            lines.append("The learned policy did not run; the **rules** policy is checked in its place.")
            lines.append("")
        lines += ["| check | value | target | result |", "|---|---|---|---|"]
        for c in tg["checks"]:
            lines.append(f"| {c['name']} ({tg['policy']}) | {_f(c['value'])} | {c['target']} | "
                         f"{'info' if c.get('info') else ('pass' if c['passed'] else '**FAIL**')} |")
        lines += ["", f"Overall: {'pass' if tg['passed'] else '**not met**'}."]
    return lines


def _retention_lines(summary: dict[str, Any]) -> list[str]:
    """The compressors' retention of annotated key spans."""
    ret = summary.get("retention") or {}
    lines = ["", "## Compressors: retention of annotated key spans", ""]
    if not ret.get("messages"):
        lines.append("No message of these sessions has annotated key spans (distilled or inline labels).")
    else:
        lines += [f"{ret['messages']} labelled messages, {ret['spans']} key spans that occur in the content. "
                  "`compress:*` is the verified runtime path (falls back to a gentler tier when an entity would be "
                  "lost; `fallback` = share returned verbatim); `runtime` applies the tier the manager uses for the "
                  "labelled category (key_state -> structured, reasoning -> compressed). Key spans the compressors keep: "
                  + ("the entities and the learned scorer's extractor spans (the learned runtime)."
                     if ret.get("span_source") == "learned" else "the entities (rules)."), "",
                  "| compressor | messages | spans retained | tokens out / in | fallback | by category |",
                  "|---|---|---|---|---|---|"]
        for name, c in ret["by_compressor"].items():
            cats = ", ".join(f"{k} {_f(v['retained'])} ({v['spans']})" for k, v in c["by_category"].items())
            lines.append(f"| {name} | {c['messages']} | {_f(c['retained'])} | {_f(c['token_ratio'])} | "
                         f"{_f(c['fallback'])} | {cats} |")
    return lines


def _four(fig: dict[str, Any] | None) -> str:
    """``recall / page-in · end / end page-in`` of one breakdown entry."""
    if not fig:
        return "–"
    return (f"{_f(fig.get('recall'))} / {_f(fig.get('recall_pagein'))} · {_f(fig.get('recall_end'))} / "
            f"{_f(fig.get('recall_end_pagein'))}")


def _rank_of(summary: dict[str, Any], policy: str) -> dict[str, Any]:
    """The source-rank figures of a policy's scorer (``{}`` for the baselines)."""
    return (summary.get("source_rank") or {}).get(base_policy(policy)) or {}


def _headline_table(summary: dict[str, Any]) -> list[str]:
    """Per policy x budget: the four recall figures, cost, prompt-cache figures and source ranks."""
    lines = ["", "## Headline", "",
             "Recall over all probes and at the session end (the last probe), without / with page-in; tokens / full: "
             "cumulative window tokens over cumulative full-context tokens; cache reuse: share of window tokens that "
             "repeat the previous turn's identical message prefix (weighted by tokens); effective ratio: the same "
             f"cumulative tokens with the reused ones priced at {CACHED_PRICE:g}, over full context; source top-k: "
             "share of facts whose source message ranks in the top k of the manager's search for the probe (the "
             "policy's scorer, at the session end; the same at every budget).", "",
             "| policy | budget | recall | recall page-in | recall end | recall end page-in | tokens / full "
             "| cache reuse | effective ratio | source top-1 | top-4 | top-10 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary["results"]:
        rk = _rank_of(summary, r["policy"])
        lines.append(
            f"| {r['policy']} | {r['budget']['label']} | {_f(r['recall'])} | {_f(r['recall_pagein'])} | "
            f"{_f(r['recall_end'])} | {_f(r['recall_end_pagein'])} | {_f(r['token_ratio'])} | "
            f"{_f(r.get('cache_reuse'))} | {_f(r.get('effective_token_ratio'))} | {_f(rk.get('top1'))} | "
            f"{_f(rk.get('top4'))} | {_f(rk.get('top10'))} |")
    return lines


def _source_recall_table(summary: dict[str, Any]) -> list[str]:
    """Recall per session source, every policy and budget."""
    results = summary["results"]
    sources = sorted({s for r in results for s in r.get("recall_by_source", {})})
    if not sources:
        return []
    lines = ["", "## Recall by source", "",
             "Each cell: recall / recall with page-in · at the end / at the end with page-in.", "",
             "| policy | budget | " + " | ".join(sources) + " |", "|---|---|" + "---|" * len(sources)]
    for r in results:
        cells = [_four(r.get("recall_by_source", {}).get(src)) for src in sources]
        lines.append(f"| {r['policy']} | {r['budget']['label']} | " + " | ".join(cells) + " |")
    return lines


def _kind_tables(summary: dict[str, Any]) -> list[str]:
    """Recall per fact kind: one table per budget, a column per policy."""
    results = summary["results"]
    if not results:
        return []
    lines = ["", "## Recall by fact kind", "",
             "Each cell: recall / recall with page-in · at the end / at the end with page-in; checks: (probe, fact) "
             "checks of the kind, at the end in brackets."]
    for key in dict.fromkeys(r["budget"]["key"] for r in results):
        rows = [r for r in results if r["budget"]["key"] == key]
        kinds = sorted({k for r in rows for k in r["recall_by_kind"]})
        lines += ["", f"### Budget {rows[0]['budget']['label']}", "",
                  "| kind | checks | " + " | ".join(r["policy"] for r in rows) + " |", "|---|---|" + "---|" * len(rows)]
        for k in kinds:
            first = next(r["recall_by_kind"][k] for r in rows if k in r["recall_by_kind"])
            lines.append(f"| {k} | {first['checks']} ({first.get('end_checks', '–')}) | "
                         + " | ".join(_four(r["recall_by_kind"].get(k)) for r in rows) + " |")
    return lines


#: The readings of a source-rank group shown under it (:func:`eval.ranks.rank_figures`).
_READINGS = (("distinct", "distinct probes"), ("value", "a hit holding the value"), ("ceiling", "ceiling"))


def _rank_tables(summary: dict[str, Any]) -> list[str]:
    """Source rank per scorer: overall, per source, per fact kind."""
    ranks = summary.get("source_rank") or {}
    if not ranks:
        return []
    lines = ["", "## Source rank of the probe's fact", "",
             "`ContextManager.search(probe, k=40)` at the session end (the hybrid search page-in uses): the share of "
             "facts whose source message is the first hit, in the top 4, 10, 40 (page-in shows up to `Policy.page_in_k`, 20, units a query); not found: not "
             "in the top 40; MRR: mean of 1/rank (0 when not found). Beside each group: the same over the facts whose probe "
             "text no other fact of the session shares (distinct probes); the same for the first hit holding the fact's value "
             "(any message holding it answers the probe); and the ceiling: facts sharing one probe text share one hit list, so "
             "of a group of n at most min(n, k) rank in the top k.", "",
             "| scorer | group | facts | top-1 | top-4 | top-10 | top-40 | not found | MRR |",
             "|---|---|---|---|---|---|---|---|---|"]
    for scorer, fig in ranks.items():
        groups = [("**all**", fig), *((f"source {k}", v) for k, v in fig["by_source"].items()),
                  *((f"kind {k}", v) for k, v in fig["by_kind"].items())]
        for name, g in groups:
            readings = [(name, g), *((f"{name}, {label}", g.get(key)) for key, label in _READINGS)]
            for label, b in readings:
                if not b or not b.get("facts", 1):
                    continue
                lines.append(f"| {scorer} | {label} | {b.get('facts', g['facts'])} | {_f(b.get('top1'))} | "
                             f"{_f(b.get('top4'))} | {_f(b.get('top10'))} | {_f(b.get('top40'))} | "
                             f"{_f(b.get('not_found'))} | {_f(b.get('mrr'))} |")
    return lines


def _ledger_table(summary: dict[str, Any]) -> list[str]:
    """Ledger tokens and precision of the ledger policies, with recall beside the plain policy's."""
    rows = [r for r in summary["results"] if r.get("ledger_tokens_mean") is not None]
    if not rows:
        return []
    plain = {(r["policy"], r["budget"]["key"]): r for r in summary["results"]}
    lines = ["", "## Fact ledger", "",
             "Ledger tokens: the ledger section's tokens per turn (mean) and their share of all window tokens. "
             "Precision: share of the shown (turn, line) pairs whose value occurs byte-exact in the cited source "
             "message and whose slot words occur in that message or the one before it (value ok / slot ok: each "
             "condition alone; unmatched: lines that match no current fact). Recall page-in: the ledger policy "
             "against the same policy without the ledger at the same budget.", "",
             "| policy | budget | ledger tokens / turn | share of window | lines shown | precision | value ok | slot ok "
             "| unmatched | recall page-in | without ledger | tokens / full | without ledger |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        b = plain.get((base_policy(r["policy"]), r["budget"]["key"])) or {}
        lines.append(
            f"| {r['policy']} | {r['budget']['label']} | {_f(r['ledger_tokens_mean'], 1)} | {_f(r['ledger_share'])} | "
            f"{_f(r['ledger_lines'])} | {_f(r['ledger_precision'])} | {_f(r['ledger_value_ok'])} | "
            f"{_f(r['ledger_slot_ok'])} | {_f(r['ledger_unmatched'])} | {_f(r['recall_pagein'])} | "
            f"{_f(b.get('recall_pagein'))} | {_f(r['token_ratio'])} | {_f(b.get('token_ratio'))} |")
    return lines


def _boundary_lines(summary: dict[str, Any]) -> list[str]:
    """Task-boundary detection against the sessions' real boundaries."""
    bd = summary.get("boundaries")
    if not bd or not bd.get("by_source"):
        return []
    return ["", "## Task boundaries", "",
            "Real boundary: the member dialogue or trajectory changes (the message id's part before `#`); detected: "
            "the runtime starts a new task (`Entry.task` changes). Matched: same message index"
            + (f" (within {bd['tolerance']} messages)" if bd.get("tolerance") else "") + ".", "",
            *boundary_table(bd)]


def render_report(summary: dict[str, Any], plots: Sequence[str] = (), history: dict[str, Any] | None = None) -> str:
    """Markdown report: run facts, the policy x budget table, targets, retention, feedback, plots."""
    lines = [*_run_lines(summary), *_headline_table(summary), *_policy_table(summary), *_target_lines(summary),
             *_source_recall_table(summary), *_kind_tables(summary), *_rank_tables(summary), *_ledger_table(summary),
             *_boundary_lines(summary), *_retention_lines(summary)]
    lines += ["", "## Feedback iterations", ""]
    lines += _history_lines(history)
    fb = summary.get("feedback") or {}
    if fb:
        lines += ["", f"Feedback records appended this run: {fb.get('appended', 0)} (to `{fb.get('path')}`, "
                  f"iteration {fb.get('feedback_iteration')})."]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def _history_lines(history: dict[str, Any] | None) -> list[str]:
    if not history or not history.get("previous"):
        return ["No earlier evaluation run on these sessions to compare with (the first run of a feedback loop)."]
    prev, cur = history["previous"], history["current"]
    same = prev.get("feedback_iteration") == cur.get("feedback_iteration")
    out = [f"Iteration {prev.get('iteration_index', '?')} (feedback `{prev.get('feedback_iteration')}`, run "
           f"`{prev.get('run_id')}`, {prev.get('created')}) against iteration {cur.get('iteration_index', '?')} "
           f"(feedback `{cur.get('feedback_iteration')}`, this run), same sessions hash."
           + (" Same feedback iteration: a re-run, not N against N+1." if same else ""), "",
           "| policy | budget | recall page-in (N) | recall page-in (N+1) | delta | tokens / full (N) | (N+1) |",
           "|---|---|---|---|---|---|---|"]
    for key, c in cur["headline"].items():
        p = prev["headline"].get(key)
        if p is None:
            continue
        pol, label = key.split("@", 1)
        d = None if None in (p.get("recall_pagein"), c.get("recall_pagein")) else round(c["recall_pagein"] - p["recall_pagein"], 4)
        out.append(f"| {pol} | {label} | {_f(p.get('recall_pagein'))} | {_f(c.get('recall_pagein'))} | "
                   f"{'–' if d is None else f'{d:+.3f}'} | {_f(p.get('token_ratio'))} | {_f(c.get('token_ratio'))} |")
    return out
