"""What an evaluation run records in MLflow. Every MLflow call goes through :mod:`training.registry`
(the one owner of the store, the registered model ``ctxscore-scorer`` and its aliases); this
module only decides the names and values.

An evaluation run is tagged ``ctxscore.run_type=eval``, ``model_name``, ``model_version``,
``model_alias`` and ``feedback_iteration``; its params give the sessions hash, budgets, policies and
model URI; metrics are flattened as ``{policy}/{budget key}/{metric}`` (e.g.
``learned/f0.25/recall_pagein``); artifacts are the output folder (metrics.json, report.md, plots).
When the model version points at an MLflow 3 LoggedModel, the run declares it as an input
(``mlflow.log_input(model=LoggedModelInput(model_id))``) and the reference-budget metrics are also
logged against the model (``log_metrics(..., model_id=...)``), which links the evaluation to it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("eval")

#: The MLflow experiment of evaluation and promotion runs.
EXPERIMENT = "ctxscore-eval"
SCALAR_METRICS = (
    "recall", "recall_pagein", "recall_end", "recall_end_pagein", "leakage", "leakage_pagein", "token_ratio",
    "token_reduction", "util_mean", "util_peak", "over_budget_turns", "longest_fit_128k", "build_ms_p50",
    "build_ms_p95", "add_ms_p95", "pagein_ms_p95", "cum_tokens",
)


def flat_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """``{policy}/{budget key}/{metric}`` -> value for every numeric scalar metric, plus run figures."""
    out: dict[str, float] = {}
    for r in summary["results"]:
        for m in SCALAR_METRICS:
            v = r.get(m)
            if isinstance(v, int | float) and not isinstance(v, bool):
                out[f"{r['policy']}/{r['budget']['key']}/{m}"] = float(v)
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
