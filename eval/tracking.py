"""MLflow: the tracking store, the registered scorer's versions, and the evaluation run.

Store: the one training uses (:mod:`training.registry`): ``MLFLOW_TRACKING_URI`` when set, else
``sqlite:///<repo>/mlruns/mlflow.db`` with artifacts under ``mlruns/artifacts``. Registered model
``ctxscore-scorer`` with aliases ``candidate`` and ``champion``; a version's artifacts hold the
packaged scorer folder (``artifacts/scorer`` inside the pyfunc model).

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
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger("eval")

MODEL_NAME = "ctxscore-scorer"
EXPERIMENT = "ctxscore-eval"
SCALAR_METRICS = (
    "recall", "recall_pagein", "recall_end", "recall_end_pagein", "leakage", "leakage_pagein", "token_ratio",
    "token_reduction", "util_mean", "util_peak", "over_budget_turns", "longest_fit_128k", "build_ms_p50",
    "build_ms_p95", "add_ms_p95", "pagein_ms_p95", "cum_tokens",
)


def tracking_uri() -> str:
    """The project store (:func:`training.registry.tracking_uri`): ``MLFLOW_TRACKING_URI`` or
    ``sqlite:///<repo>/mlruns/mlflow.db``."""
    from training.registry import tracking_uri as _uri

    return _uri()


def setup(experiment: str = EXPERIMENT) -> Any:
    """Point MLflow at the project store (:func:`training.registry.configure`, shared with training),
    select or create ``experiment`` and return the ``mlflow`` module."""
    import mlflow

    from training.registry import configure

    configure(experiment)
    return mlflow


def get_version(alias_or_version: str, name: str = MODEL_NAME) -> Any | None:
    """The registered model version for an alias (``candidate``/``champion``) or a version number,
    or ``None`` when the model or alias does not exist."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient()
    try:
        if alias_or_version.isdigit():
            return client.get_model_version(name, alias_or_version)
        return client.get_model_version_by_alias(name, alias_or_version)
    except MlflowException:
        return None


def feedback_iteration_of(version: Any) -> str:
    """The ``feedback_iteration`` tag of a model version, else of its source run, else ``"0"``.

    Training tags each run with ``"<feedback records>-<sha256[:12]>"`` of the feedback it read
    (:func:`training.train.feedback_tag`); the tag is treated as an opaque label here.
    """
    from mlflow import MlflowClient

    tags = dict(getattr(version, "tags", None) or {})
    val = tags.get("feedback_iteration")
    if val is None and getattr(version, "run_id", None):
        try:
            val = MlflowClient().get_run(version.run_id).data.tags.get("feedback_iteration")
        except Exception:  # noqa: BLE001 - the run may have been deleted
            val = None
    return str(val) if val not in (None, "") else "0"


def find_packaged_folder(root: Path) -> Path | None:
    """The first folder under ``root`` (itself included) holding a packaged scorer
    (``config.json`` and ``classifier.skops``), shallowest first."""
    cands = sorted((p.parent for p in root.rglob("classifier.skops") if (p.parent / "config.json").is_file()),
                   key=lambda p: (len(p.parts), str(p)))
    return cands[0] if cands else None


def download_scorer(version: Any, dst: Path | None = None) -> Path:
    """Download a model version's artifacts and return its packaged scorer folder.

    Tries the version's ``source`` (``models:/...`` or a run artifact URI), then the registry URI
    ``models:/<name>/<version>``, then the source run's artifacts.

    Raises:
        FileNotFoundError: no packaged scorer folder (config.json + classifier.skops) was found.
    """
    import mlflow

    dst = dst or Path(tempfile.mkdtemp(prefix="ctxscore-model-"))
    uris = [getattr(version, "source", None), f"models:/{version.name}/{version.version}"]
    tried = []
    for uri in [u for u in uris if u]:
        try:
            local = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(dst / f"u{len(tried)}")))
        except Exception as exc:  # noqa: BLE001 - try the next location
            tried.append(f"{uri}: {exc}")
            continue
        found = find_packaged_folder(local)
        if found:
            return found
        tried.append(f"{uri}: no config.json + classifier.skops inside")
    if getattr(version, "run_id", None):
        try:
            local = Path(mlflow.artifacts.download_artifacts(run_id=version.run_id, dst_path=str(dst / "run")))
            found = find_packaged_folder(local)
            if found:
                return found
            tried.append(f"run {version.run_id}: no packaged scorer in its artifacts")
        except Exception as exc:  # noqa: BLE001
            tried.append(f"run {version.run_id}: {exc}")
    raise FileNotFoundError(
        f"model {version.name} version {version.version}: no packaged scorer folder found; tried " + "; ".join(tried)
    )


def logged_model_id(version: Any) -> str | None:
    """The MLflow 3 LoggedModel id of a model version: its ``model_id``, else parsed from a
    ``models:/m-...`` source (what ``mlflow.register_model(info.model_uri, ...)`` records)."""
    mid = getattr(version, "model_id", None)
    if mid:
        return str(mid)
    src = str(getattr(version, "source", "") or "")
    if src.startswith("models:/m-"):
        return src[len("models:/"):].split("/", 1)[0]
    return None


def version_info(version: Any, alias: str | None) -> dict[str, Any]:
    """Description of a model version for params, tags and the report."""
    return {
        "name": version.name,
        "version": str(version.version),
        "alias": alias,
        "run_id": getattr(version, "run_id", None),
        "model_id": logged_model_id(version),
        "source": getattr(version, "source", None),
        "feedback_iteration": feedback_iteration_of(version),
    }


def find_eval_figures(version: str, sessions_hash: str, budget_key: str, probe_every: int, pagein: str,
                      min_budget: int, experiment: str = EXPERIMENT, code: str | None = None) -> dict[str, Any] | None:
    """Figures of the learned policy from the latest finished eval run of ``version`` on the same
    sessions and settings — and, when ``code`` is given, made by the same code (tag ``code_hash``) —
    so promotion need not replay them again; or ``None``.

    Returns:
        ``{"recall", "recall_pagein", "token_ratio", "token_reduction", "util_peak", "reused_run_id"}``.
    """
    import mlflow

    exp = mlflow.get_experiment_by_name(experiment)
    if exp is None:
        return None
    flt = (f"tags.`ctxscore.run_type` = 'eval' and tags.model_name = '{MODEL_NAME}' and "
           f"tags.model_version = '{version}' and tags.sessions_hash = '{sessions_hash}' and "
           f"params.probe_every = '{probe_every}' and params.pagein = '{pagein}' and "
           f"params.min_budget = '{min_budget}' and attributes.status = 'FINISHED'"
           + (f" and tags.code_hash = '{code}'" if code else ""))
    runs = mlflow.search_runs([exp.experiment_id], filter_string=flt, order_by=["attributes.start_time DESC"],
                              output_format="list")
    for run in runs:
        m = run.data.metrics
        keys = {k: f"learned/{budget_key}/{k}" for k in ("recall", "recall_pagein", "token_ratio", "token_reduction",
                                                         "util_peak")}
        if keys["recall_pagein"] in m and keys["token_reduction"] in m:
            return {**{k: m.get(v) for k, v in keys.items()}, "reused_run_id": run.info.run_id}
    return None


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


def log_results(mlflow: Any, summary: dict[str, Any], out_dir: Path, *, params: dict[str, Any],
                reference_budget_key: str = "f0.25") -> None:
    """Log params, flattened metrics and the output folder to the active run; link the model."""
    mlflow.log_params({k: (str(v)[:500] if v is not None else "") for k, v in params.items()})
    mlflow.log_metrics(flat_metrics(summary))
    model = summary["run"].get("model") or {}
    model_id = model.get("model_id")
    if model_id:
        try:
            from mlflow.entities import LoggedModelInput

            mlflow.log_input(model=LoggedModelInput(model_id))
            ref = {f"eval_{m}": float(r[m]) for r in summary["results"]
                   if r["policy"] == "learned" and r["budget"]["key"] == reference_budget_key
                   for m in ("recall", "recall_pagein", "token_ratio", "util_peak") if r.get(m) is not None}
            if ref:
                mlflow.log_metrics(ref, model_id=model_id)
        except Exception as exc:  # noqa: BLE001 - the link is informative; the run stands without it
            log.warning("could not link the evaluation run to logged model %s: %s", model_id, exc)
    mlflow.log_artifacts(str(out_dir))
