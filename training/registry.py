"""MLflow tracking and the model registry for the learned scorer.

Store: ``MLFLOW_TRACKING_URI`` when set, else ``sqlite:///<repo>/mlruns/mlflow.db`` with artifacts
under ``<repo>/mlruns/artifacts`` (MLflow 3 refuses the plain file store without an opt-out; the
SQLite store keeps everything in ``mlruns/``, which is git-ignored). Evaluation and promotion use
:func:`configure` too, so every part reads the same store.

Registered model ``ctxscore-scorer``: each registered version gets alias ``candidate``; only the
evaluation's promotion step moves ``champion`` (:func:`set_alias`). The model is logged as an MLflow
pyfunc ("models from code", :mod:`training.pyfunc_model`) whose artifact ``scorer`` is the packaged
scorer folder, so :func:`download_scorer` gives a folder that
:meth:`ctxscore.learned.LearnedScorer.from_pretrained` loads.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from .paths import MLRUNS_DIR, REPO_ROOT

if TYPE_CHECKING:  # pragma: no cover
    from .train import Context, Result

MODEL_NAME = "ctxscore-scorer"
EXPERIMENT = "ctxscore-scorer"
PYFUNC_CODE = Path(__file__).resolve().parent / "pyfunc_model.py"


def tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI`` or the project's SQLite store in ``mlruns/``."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{MLRUNS_DIR / 'mlflow.db'}"


def artifact_root() -> str:
    """Where new experiments keep artifacts: next to a SQLite store, else MLflow's default."""
    uri = tracking_uri()
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):])
        return (db.parent / "artifacts").resolve().as_uri()
    return ""


def configure(experiment: str | None = EXPERIMENT) -> str:
    """Point MLflow at the project store and (optionally) select/create ``experiment``; returns the URI."""
    import mlflow

    uri = tracking_uri()
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    if experiment:
        client = mlflow.MlflowClient()
        if client.get_experiment_by_name(experiment) is None:
            root = artifact_root()
            client.create_experiment(experiment, artifact_location=f"{root}/{experiment}" if root else None)
        mlflow.set_experiment(experiment)
    return uri


def input_example():
    """A few messages as the pyfunc input (a DataFrame with ``role``, ``content``, ``turn``; ``turn``
    is a float column so that a missing turn (NaN) still matches the signature)."""
    import pandas as pd

    return pd.DataFrame([
        {"role": "system", "content": "You are an airline agent. Never book without the user's explicit confirmation.", "turn": 0.0},
        {"role": "user", "content": "I want to change my flight to May 20, my reservation is ZFA04Y.", "turn": 1.0},
        {"role": "assistant", "content": "Let me check the available flights for that date.", "turn": 2.0},
        {"role": "tool", "content": "Error: flight HAT030 not available on date 2024-05-20", "turn": 3.0},
    ])


class Tracker:
    """Logs each variant as an MLflow run and registers the chosen one."""

    def __init__(self, experiment: str = EXPERIMENT) -> None:
        self.uri = configure(experiment)
        self.experiment = experiment

    def log_result(self, r: Result, ctx: Context) -> None:
        """One run: params, data manifest, metrics, confusion matrix, report, model (pyfunc)."""
        import mlflow
        import numpy as np
        from mlflow.models import infer_signature

        from .pyfunc_model import predict_frame
        from .train import ANNOTATOR_AGREEMENT, confusion_png, feedback_tag, metrics_summary

        v = r.variant
        with mlflow.start_run(run_name=v.name) as run, tempfile.TemporaryDirectory() as tmp:
            tmpd = Path(tmp)
            params = {k: getattr(v, k) for k in v.__dataclass_fields__}
            params.update({
                "calibration_folds": v.calibration_folds,
                "embedder_dim": r.scorer.spec.embed_dim,
                "n_features": r.scorer.spec.n_features,
                "n_train": int(r.dev["metrics"].get("n_train", 0)),
                "data_manifest_sha256": ctx.manifest_sha,
                "rules_file": ctx.rules_path.name,
                "signal_names": ",".join(ctx.signal_names),
            })
            mlflow.log_params(params)
            mlflow.set_tags({"feedback_iteration": feedback_tag(ctx.feedback),
                             "feedback_applied": str(ctx.feedback_stats.get("applied", 0)),
                             "annotator_agreement": str(ANNOTATOR_AGREEMENT)})
            metrics = {f"dev_{k}": float(x) for k, x in r.dev["metrics"].items() if np.isfinite(x)}
            metrics.update({f"test_{k}": float(x) for k, x in r.test["metrics"].items() if np.isfinite(x)})
            metrics.update({f"dev_bundled_{k}": float(x) for k, x in r.dev.get("bundled", {}).items() if np.isfinite(x)})
            metrics.update({f"latency_{k}": float(x) for k, x in r.latency.items()})
            mlflow.log_metrics({k.replace("+", "_"): x for k, x in metrics.items()})
            if ctx.manifest_path is not None:
                mlflow.log_artifact(str(ctx.manifest_path), artifact_path="data")
            (tmpd / "feedback_stats.json").write_text(json.dumps(ctx.feedback_stats, indent=2))
            mlflow.log_artifact(str(tmpd / "feedback_stats.json"), artifact_path="data")
            png = confusion_png(r.dev["confusion"], tmpd / "confusion_matrix.png",
                                f"{v.name} — dev (distilled), macro-F1 {r.dev['metrics']['macro_f1']:.3f}")
            mlflow.log_artifact(str(png))
            (tmpd / "classification_report.txt").write_text(
                f"dev (distilled labels)\n{r.dev['report']}\n\ntest (distilled labels)\n{r.test['report']}\n")
            mlflow.log_artifact(str(tmpd / "classification_report.txt"))
            folder = r.scorer.save_pretrained(tmpd / "scorer", metrics=metrics_summary(r),
                                              extra={"training": {"mlflow_run_id": run.info.run_id}})
            example = input_example()
            output = predict_frame(r.scorer, example)
            info = mlflow.pyfunc.log_model(
                name="scorer_model", python_model=str(PYFUNC_CODE), artifacts={"scorer": str(folder)},
                signature=infer_signature(example, output), input_example=example,
                pip_requirements=_requirements(v.embedder),
            )
            r.run_id = run.info.run_id
            r.model_uri = info.model_uri

    def log_comparison(self, r: Result, table: str) -> None:
        """Attach the comparison table of the whole invocation to the chosen variant's run."""
        import mlflow

        if r.run_id is not None:
            mlflow.MlflowClient().log_text(r.run_id, table + "\n", "comparison.md")
            mlflow.MlflowClient().set_tag(r.run_id, "chosen", "true")

    def register(self, r: Result, alias: str = "candidate", fingerprint: str = "") -> str:
        """Register the result's logged model as ``ctxscore-scorer`` and point ``alias`` at it.

        ``fingerprint`` (see :func:`training.train.fingerprint`) is stored as a version tag so that an
        unchanged re-run can reuse the version (:func:`find_version`)."""
        import mlflow

        if r.model_uri is None:
            raise RuntimeError("log the result with log_result() before registering it")
        mv = mlflow.register_model(r.model_uri, MODEL_NAME, tags={"variant": r.variant.name, "run_id": r.run_id or "",
                                                                  "fingerprint": fingerprint})
        set_alias(alias, mv.version)
        return str(mv.version)


def _requirements(embedder_id: str) -> list[str]:
    from ctxscore.scoring.embedders import EMBEDDERS

    reqs = ["numpy", "scikit-learn", "skops", "tiktoken", "pandas"]
    dist = getattr(EMBEDDERS.get(embedder_id), "distribution", "")
    return reqs + [d for d in dist.split() if d]


def find_version(fingerprint: str, name: str = MODEL_NAME) -> str | None:
    """The newest registered version whose ``fingerprint`` tag equals ``fingerprint``, or ``None``."""
    import mlflow

    configure(None)
    try:
        versions = mlflow.MlflowClient().search_model_versions(f"name='{name}'")
    except mlflow.exceptions.MlflowException:
        return None
    hits = [int(mv.version) for mv in versions if (mv.tags or {}).get("fingerprint") == fingerprint]
    return str(max(hits)) if hits else None


def set_alias(alias: str, version: str | int, name: str = MODEL_NAME) -> None:
    """Point ``alias`` of the registered model at ``version`` (promotion uses this for ``champion``)."""
    import mlflow

    configure(None)
    mlflow.MlflowClient().set_registered_model_alias(name, alias, str(version))


def download_scorer(alias: str = "candidate", dst: str | os.PathLike[str] | None = None, name: str = MODEL_NAME) -> Path:
    """Download the packaged scorer folder of ``models:/<name>@<alias>``; returns the folder.

    Raises:
        mlflow.exceptions.MlflowException: no such model or alias in the store.
    """
    import mlflow

    configure(None)
    dst = Path(dst) if dst is not None else Path(tempfile.mkdtemp(prefix=f"ctxscore-{alias}-"))
    local = mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{name}@{alias}", dst_path=str(dst))
    folder = Path(local) / "artifacts" / "scorer"
    if not (folder / "config.json").is_file():
        hits = list(Path(local).rglob("config.json"))
        folder = next((h.parent for h in hits if (h.parent / "classifier.skops").is_file()), folder)
    return folder


def export_alias(alias: str, out: str | os.PathLike[str], name: str = MODEL_NAME) -> Path:
    """Copy the packaged scorer of ``models:/<name>@<alias>`` into ``out`` (replacing it), after
    checking that it loads (:meth:`ctxscore.learned.LearnedScorer.from_pretrained` verifies hashes
    and the skops type allowlist). Returns ``out``.

    Raises:
        mlflow.exceptions.MlflowException: no such model or alias.
        ctxscore.errors.ModelLoadError: the downloaded folder does not load.
    """
    import shutil

    from ctxscore.scoring.learned import LearnedScorer

    with tempfile.TemporaryDirectory(prefix="ctxscore-export-") as tmp:
        folder = download_scorer(alias, tmp, name)
        LearnedScorer.from_pretrained(folder)  # refuse to ship a folder that does not load
        out = Path(out)
        staging = out.with_name(out.name + ".new")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(folder, staging)
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m training.registry export --alias champion --out ctxscore/models/default``."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m training.registry", description="ctxscore model registry")
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("export", help="copy the packaged scorer of an alias into a folder (the runtime default)")
    ex.add_argument("--alias", default="champion")
    ex.add_argument("--out", default=str(REPO_ROOT / "ctxscore" / "models" / "default"))
    sh = sub.add_parser("show", help="print the registered versions and aliases")
    sh.add_argument("--name", default=MODEL_NAME)
    args = ap.parse_args(argv)
    if args.cmd == "export":
        out = export_alias(args.alias, args.out)
        print(f"exported {MODEL_NAME}@{args.alias} to {out}")
        return 0
    import mlflow

    configure(None)
    client = mlflow.MlflowClient()
    rm = client.get_registered_model(args.name)
    print(f"{rm.name}: aliases {dict(rm.aliases)}")
    for mv in client.search_model_versions(f"name='{args.name}'"):
        print(f"  version {mv.version}: run {mv.run_id} tags {dict(mv.tags)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
