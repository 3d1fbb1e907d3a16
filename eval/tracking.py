"""What an evaluation run records in MLflow. Every MLflow call goes through :mod:`training.registry`
(the one owner of the store, the registered model ``ctxscore-scorer`` and its aliases); this
module only decides the names and values.

An evaluation run is tagged ``ctxscore.run_type=eval``, ``model_name``, ``model_version``,
``model_alias`` and ``feedback_iteration``; its params give the sessions hash, budgets, policies and
model URI; metrics are flattened as ``{policy}/{budget key}/{metric}`` (e.g.
``learned/f0.25/recall_pagein``), the recall figures per fact kind and per session source as
``{policy}/{budget key}/{metric}/kind/{kind}`` and ``.../source/{source}``, the source ranks as
``{scorer}/source_rank/{top1|top4|top10|top40|mrr}`` (and ``.../source/{source}/...``,
``.../kind/{kind}/...``, and ``.../{value|distinct|ceiling}/...`` overall, :func:`eval.ranks.rank_figures`), the task boundaries as ``boundaries/{precision|recall|f1}`` and
``boundaries/{source}/...``; artifacts are the output folder (metrics.json, report.md, plots).
When the model version points at an MLflow 3 LoggedModel, the run declares it as an input
(``mlflow.log_input(model=LoggedModelInput(model_id))``) and the reference-budget metrics are also
logged against the model (``log_metrics(..., model_id=...)``), which links the evaluation to it.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

log = logging.getLogger("eval")

#: The MLflow experiment of evaluation and promotion runs.
EXPERIMENT = "ctxscore-eval"
SCALAR_METRICS = (
    "recall", "recall_pagein", "recall_end", "recall_end_pagein", "leakage", "leakage_pagein", "token_ratio",
    "token_reduction", "util_mean", "util_peak", "over_budget_turns", "longest_fit_128k", "build_ms_p50",
    "build_ms_p95", "add_ms_p95", "pagein_ms_p95", "cum_tokens", "cache_reuse", "effective_token_ratio",
    "ledger_tokens_mean", "ledger_share", "ledger_lines", "ledger_precision", "ledger_value_ok", "ledger_slot_ok",
)
#: Figures of each fact kind and each source logged per policy and budget.
BREAKDOWN_METRICS = ("recall", "recall_pagein", "recall_end", "recall_end_pagein")
RANK_METRICS = ("top1", "top4", "top10", "top40", "mrr")
BOUNDARY_METRICS = ("precision", "recall", "f1")
#: Characters MLflow allows in a metric name (others in kind or source names become ``_``).
_UNSAFE = re.compile(r"[^A-Za-z0-9_\-. /]")


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _put(out: dict[str, float], name: str, v: Any) -> None:
    if _number(v):
        out[_UNSAFE.sub("_", name)] = float(v)


def _breakdowns(r: dict[str, Any], out: dict[str, float]) -> None:
    """The per-kind and per-source recall figures of one result entry."""
    head = f"{r['policy']}/{r['budget']['key']}"
    for part, key in (("kind", "recall_by_kind"), ("source", "recall_by_source")):
        for name, fig in (r.get(key) or {}).items():
            for m in BREAKDOWN_METRICS:
                _put(out, f"{head}/{m}/{part}/{name}", fig.get(m))


def _ranks_and_boundaries(summary: dict[str, Any], out: dict[str, float]) -> None:
    """The source-rank figures per scorer and the task-boundary figures."""
    for scorer, fig in (summary.get("source_rank") or {}).items():
        for m in RANK_METRICS:
            _put(out, f"{scorer}/source_rank/{m}", fig.get(m))
        for reading in ("value", "distinct", "ceiling"):
            for m in RANK_METRICS:
                _put(out, f"{scorer}/source_rank/{reading}/{m}", (fig.get(reading) or {}).get(m))
        for part in ("source", "kind"):
            for name, sub in (fig.get(f"by_{part}") or {}).items():
                for m in RANK_METRICS:
                    _put(out, f"{scorer}/source_rank/{part}/{name}/{m}", sub.get(m))
    bd = summary.get("boundaries") or {}
    for m in BOUNDARY_METRICS:
        _put(out, f"boundaries/{m}", (bd.get("overall") or {}).get(m))
    for name, sub in (bd.get("by_source") or {}).items():
        for m in BOUNDARY_METRICS:
            _put(out, f"boundaries/{name}/{m}", sub.get(m))


def flat_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """``{policy}/{budget key}/{metric}`` -> value for every numeric scalar metric, the per-kind and
    per-source recall, the source ranks, the task boundaries and the run figures (names in the
    module docstring; a character MLflow refuses becomes ``_``)."""
    out: dict[str, float] = {}
    for r in summary["results"]:
        for m in SCALAR_METRICS:
            _put(out, f"{r['policy']}/{r['budget']['key']}/{m}", r.get(m))
        _breakdowns(r, out)
    _ranks_and_boundaries(summary, out)
    ret = summary.get("retention", {}).get("by_compressor", {})
    for name, c in ret.items():
        if c.get("retained") is not None:
            out[f"retention/{name.replace(':', '_')}"] = float(c["retained"])
    out["eval_runtime_s"] = float(summary["run"]["runtime_s"])
    tg = summary.get("targets") or {}
    if tg.get("evaluated"):
        out["targets_passed"] = float(bool(tg["passed"]))
    return out


def log_results(summary: dict[str, Any], out_dir: Path, *, params: dict[str, Any],
                reference_budget_key: str = "f0.25") -> None:
    """Log params, the flattened metrics (:func:`flat_metrics`) and the output folder to the active
    run (:func:`training.registry.start_run`); when the evaluated version is an MLflow 3 LoggedModel,
    link the run to it with the learned policy's figures at ``reference_budget_key``."""
    from training import registry

    registry.log_run(params=params, metrics=flat_metrics(summary))
    model_id = (summary["run"].get("model") or {}).get("model_id")
    if model_id:
        ref = {f"eval_{m}": float(r[m]) for r in summary["results"]
               if r["policy"] == "learned" and r["budget"]["key"] == reference_budget_key
               for m in ("recall", "recall_pagein", "token_ratio", "util_peak") if r.get(m) is not None}
        try:
            registry.link_model(model_id, ref)
        except Exception as exc:  # noqa: BLE001 - the link is informative; the run stands without it
            log.warning("could not link the evaluation run to logged model %s: %s", model_id, exc)
    registry.log_run(folder=out_dir)
