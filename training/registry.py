"""MLflow for ctxscore: the tracking store, runs, the model registry, export. The only module of
``ctxscore``, ``training`` and ``eval`` that imports ``mlflow``; training (:mod:`training.train`)
and evaluation (:mod:`eval.cli`, :mod:`eval.models`) go through the functions below.

Store: ``MLFLOW_TRACKING_URI`` when set, else ``sqlite:///<repo>/mlruns/mlflow.db`` with artifacts
under ``<repo>/mlruns/artifacts`` (MLflow 3 refuses the plain file store without an opt-out; the
SQLite store keeps everything in ``mlruns/``, which is git-ignored).

Registered model ``ctxscore-scorer``. Each version's model is a pyfunc (:class:`ScorerModel`)
whose artifact ``scorer`` is a packaged scorer folder, so :func:`download_scorer` gives a folder
that :meth:`ctxscore.scoring.learned.LearnedScorer.from_pretrained` loads. Aliases:

- ``candidate``: the version training registered last (:func:`register_candidate`);
- ``champion``: moved only by the promotion gate (``python -m eval promote``, which promotes a
  candidate only when it beats the champion on the held-out sessions). A store without a champion
  gets the shipped scorer (``ctxscore/models/default``) registered as the baseline champion first
  (:func:`ensure_champion`; version tag ``baseline=shipped``), so a fresh store never promotes a
  candidate unopposed.

Command line::

    python -m training.registry export --alias champion --out out/scorer   # what `make run` does
    python -m training.registry export --alias champion --out ctxscore/models/default   # `make ship`
    python -m training.registry show
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ctxscore.errors import ModelLoadError
from ctxscore.scoring.package import (
    CLASSIFIER_FILE,
    CONFIG_FILE,
    DEFAULT_MODEL_DIR,
    OPTIONAL_FILES,
    REEXPORT_HINT,
    REGRESSOR_FILE,
    RULES_FILE,
    sha256_file,
)

from .extra import require_train_extra
from .paths import MLRUNS_DIR, OUT_DIR

require_train_extra("training", "training.registry", ("mlflow",), __name__)

import mlflow  # noqa: E402  (after the check: without the extra, the install hint instead of a bare error)
from mlflow.exceptions import MlflowException  # noqa: E402
from mlflow.pyfunc import PythonModel  # noqa: E402

MODEL_NAME = "ctxscore-scorer"
#: Experiment of the training runs (and of the shipped baseline's run).
EXPERIMENT = "ctxscore-scorer"
#: Version tag of the shipped scorer registered as the baseline champion (value ``"shipped"``).
BASELINE_TAG = "baseline"
#: Where ``make run`` exports the champion (git-ignored); ``make ship`` exports into the package.
DEFAULT_EXPORT_DIR = OUT_DIR / "scorer"


# ------------------------------------------------------------------------------------------- store
def tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI`` or the project's SQLite store in ``mlruns/``."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{MLRUNS_DIR / 'mlflow.db'}"


def artifact_root() -> str:
    """Where new experiments keep artifacts: next to a SQLite store, else MLflow's default (``""``)."""
    uri = tracking_uri()
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):])
        return (db.parent / "artifacts").resolve().as_uri()
    return ""


def configure(experiment: str | None = EXPERIMENT) -> str:
    """Point MLflow at the project store and (optionally) select ``experiment``, creating it on
    first use with its artifacts beside a SQLite store; returns the tracking URI."""
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


# -------------------------------------------------------------------------------------------- runs
@contextmanager
def start_run(experiment: str = EXPERIMENT, *, run_name: str | None = None, tags: Mapping[str, str] | None = None,
              run_id: str | None = None) -> Iterator[str]:
    """Open an MLflow run in ``experiment`` (or resume ``run_id``) and yield its run id.

    The run is the active run inside the block (the ``log_*`` functions below write to it) and is
    ended on exit: ``FINISHED``, or ``FAILED`` when the block raises.
    """
    configure(experiment)
    with mlflow.start_run(run_id=run_id, run_name=run_name, tags=dict(tags or {})) as run:
        yield run.info.run_id


def log_run(*, params: Mapping[str, Any] | None = None, metrics: Mapping[str, float] | None = None,
            tags: Mapping[str, str] | None = None, files: Sequence[tuple[Path, str | None]] = (),
            texts: Mapping[str, str] | None = None, folder: Path | None = None) -> None:
    """Log to the active run (see :func:`start_run`).

    Args:
        params: name -> value (values are logged as strings, cut to 500 characters).
        metrics: name -> float (non-finite values are MLflow's to refuse; callers filter them).
        tags: name -> string.
        files: ``(path, artifact folder or None)`` pairs logged as artifacts.
        texts: artifact file name -> text.
        folder: a folder whose whole content is logged as artifacts.

    Raises:
        RuntimeError: no active run.
    """
    if mlflow.active_run() is None:
        raise RuntimeError("log_run() needs an active run: call it inside `with registry.start_run(...)`")
    if params:
        mlflow.log_params({k: (str(v)[:500] if v is not None else "") for k, v in params.items()})
    if metrics:
        mlflow.log_metrics(dict(metrics))
    if tags:
        mlflow.set_tags(dict(tags))
    for path, where in files:
        mlflow.log_artifact(str(path), artifact_path=where)
    for name, text in (texts or {}).items():
        mlflow.log_text(text, name)
    if folder is not None:
        mlflow.log_artifacts(str(folder))


def link_model(model_id: str, metrics: Mapping[str, float]) -> None:
    """Declare the MLflow 3 LoggedModel ``model_id`` as an input of the active run and log
    ``metrics`` against it (the evaluation of a version links to the model it evaluated)."""
    from mlflow.entities import LoggedModelInput

    mlflow.log_input(model=LoggedModelInput(model_id))
    if metrics:
        mlflow.log_metrics(dict(metrics), model_id=model_id)


def find_eval_figures(experiment: str, version: str, sessions_hash: str, params: Mapping[str, Any],
                      budget_key: str, code: str | None = None) -> dict[str, Any] | None:
    """Figures of the learned policy from the latest finished eval run of ``version`` on the same
    sessions and settings (and, when ``code`` is given, made by the same code: tag ``code_hash``),
    so promotion need not replay them again; or ``None``.

    Args:
        experiment: the evaluation experiment.
        version: the registered version.
        sessions_hash: tag ``sessions_hash`` of the run.
        params: run params that must match (``probe_every``, ``pagein``, ``min_budget``).
        budget_key: the reference budget (e.g. ``"f0.25"``).
        code: tag ``code_hash`` that must match, or ``None``.

    Returns:
        ``{"recall", "recall_pagein", "token_ratio", "token_reduction", "util_peak", "reused_run_id"}``.
    """
    configure(None)
    exp = mlflow.get_experiment_by_name(experiment)
    if exp is None:
        return None
    flt = " and ".join([
        "tags.`ctxscore.run_type` = 'eval'", f"tags.model_name = '{MODEL_NAME}'", f"tags.model_version = '{version}'",
        f"tags.sessions_hash = '{sessions_hash}'", "attributes.status = 'FINISHED'",
        *(f"params.{k} = '{v}'" for k, v in params.items()), *([f"tags.code_hash = '{code}'"] if code else []),
    ])
    runs = mlflow.search_runs([exp.experiment_id], filter_string=flt, order_by=["attributes.start_time DESC"],
                              output_format="list")
    names = ("recall", "recall_pagein", "token_ratio", "token_reduction", "util_peak")
    for run in runs:
        m = run.data.metrics
        keys = {k: f"learned/{budget_key}/{k}" for k in names}
        if keys["recall_pagein"] in m and keys["token_reduction"] in m:
            return {**{k: m.get(v) for k, v in keys.items()}, "reused_run_id": run.info.run_id}
    return None


# ------------------------------------------------------------------------------------------- model
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


def predict_frame(scorer: Any, frame: Any) -> Any:
    """Score a DataFrame of messages (``role``, ``content``, optional ``turn``; one row per message in
    conversation order) -> DataFrame with ``category``, ``p_<category>`` (four columns) and ``value``."""
    import pandas as pd

    from ctxscore.messages import CATEGORIES, Message

    msgs = []
    for i, row in enumerate(frame.to_dict(orient="records")):
        turn = row.get("turn")
        msgs.append(Message(role=str(row["role"]), content=str(row["content"]),
                            turn=int(turn) if turn is not None and turn == turn else i))
    preds = scorer.predict(msgs)
    return pd.DataFrame([{"category": p.category, **{f"p_{c}": float(p.probs[c]) for c in CATEGORIES},
                          "value": float(p.value)} for p in preds])


class ScorerModel(PythonModel):
    """The pyfunc of a registered version: the packaged scorer folder (artifact ``scorer``), loaded
    with :meth:`LearnedScorer.from_pretrained` (hashes and the skops type allowlist are checked).

    Input and output: see :func:`predict_frame`. Logged "from code" (:data:`MODEL_CODE`, no
    pickle), so loading the pyfunc imports ``training.registry``.
    """

    def load_context(self, context):
        from ctxscore.scoring.learned import LearnedScorer

        self.scorer = LearnedScorer.from_pretrained(context.artifacts["scorer"])

    def predict(self, context, model_input, params=None):
        return predict_frame(self.scorer, model_input)


#: The MLflow "models from code" file of :func:`log_scorer_model` (MLflow copies it into the logged
#: model and runs it to load the pyfunc).
MODEL_CODE = '''"""ctxscore scorer pyfunc, MLflow models from code (written by training.registry.log_scorer_model)."""

from mlflow.models import set_model

from training.registry import ScorerModel

set_model(ScorerModel())
'''


def _requirements(embedder_id: str) -> list[str]:
    from ctxscore.scoring.embedders import EMBEDDERS

    reqs = ["numpy", "scikit-learn", "skops", "tiktoken", "pandas"]
    dist = getattr(EMBEDDERS.get(embedder_id), "distribution", "")
    return reqs + [d for d in dist.split() if d]


def log_scorer_model(folder: Path) -> str:
    """Log the packaged scorer ``folder`` as the active run's pyfunc model (name ``scorer_model``,
    signature from :func:`input_example`, pip requirements of its embedder); returns the model URI.

    Raises:
        ctxscore.errors.ModelLoadError: the folder does not load.
        RuntimeError: no active run.
    """
    from mlflow.models import infer_signature

    from ctxscore.scoring.learned import LearnedScorer

    if mlflow.active_run() is None:
        raise RuntimeError("log_scorer_model() needs an active run: call it inside `with registry.start_run(...)`")
    scorer = LearnedScorer.from_pretrained(folder)
    example = input_example()
    with tempfile.TemporaryDirectory(prefix="ctxscore-pyfunc-") as tmp:
        code = Path(tmp) / "scorer_model.py"
        code.write_text(MODEL_CODE, encoding="utf-8")
        info = mlflow.pyfunc.log_model(
            name="scorer_model", python_model=str(code), artifacts={"scorer": str(folder)},
            signature=infer_signature(example, predict_frame(scorer, example)), input_example=example,
            pip_requirements=_requirements(scorer.spec.embedder_id),
        )
    return info.model_uri


# ---------------------------------------------------------------------------------------- registry
def _client() -> Any:
    configure(None)
    return mlflow.MlflowClient()


def get_version(ref: str, name: str = MODEL_NAME) -> Any | None:
    """The registered model version for an alias (``candidate``/``champion``) or a version number,
    or ``None`` when the model, alias or version does not exist."""
    client = _client()
    try:
        if ref.isdigit():
            return client.get_model_version(name, ref)
        return client.get_model_version_by_alias(name, ref)
    except MlflowException:
        return None


def set_alias(alias: str, version: str | int, name: str = MODEL_NAME) -> None:
    """Point ``alias`` of the registered model at ``version`` (promotion uses this for ``champion``)."""
    _client().set_registered_model_alias(name, alias, str(version))


def find_version(fingerprint: str, name: str = MODEL_NAME) -> str | None:
    """The newest registered version whose ``fingerprint`` tag equals ``fingerprint``, or ``None``."""
    try:
        versions = _client().search_model_versions(f"name='{name}'")
    except MlflowException:
        return None
    hits = [int(mv.version) for mv in versions if (mv.tags or {}).get("fingerprint") == fingerprint]
    return str(max(hits)) if hits else None


def register_candidate(model_uri: str, tags: Mapping[str, str], alias: str = "candidate") -> str:
    """Register a logged model as a new version of ``ctxscore-scorer`` with ``tags`` and point
    ``alias`` at it; returns the version. A store without a champion first gets the shipped baseline
    (:func:`ensure_champion`), so the candidate has a champion to beat."""
    ensure_champion()
    mv = mlflow.register_model(model_uri, MODEL_NAME, tags=dict(tags))
    set_alias(alias, mv.version)
    return str(mv.version)


def ensure_champion(baseline_dir: str | os.PathLike[str] = DEFAULT_MODEL_DIR, name: str = MODEL_NAME) -> str:
    """The ``champion`` version; in a store without one, the shipped scorer becomes it.

    The packaged folder ``baseline_dir`` (default: the scorer shipped in ``ctxscore/models/default``)
    is logged as a pyfunc in a run named ``shipped-baseline`` of :data:`EXPERIMENT` and registered
    with the version tags ``baseline=shipped``, ``shipped_sha256`` (sha256 of its ``config.json``,
    which holds the hashes of the other files) and ``feedback_iteration=shipped``; alias ``champion``
    points at it. A version with the same ``shipped_sha256`` that is already registered is reused.

    Raises:
        ctxscore.errors.ModelLoadError: ``baseline_dir`` is not a loadable packaged scorer.
    """
    champion = get_version("champion", name)
    if champion is not None:
        return str(champion.version)
    folder = Path(baseline_dir)
    digest = sha256_file(folder / CONFIG_FILE)
    try:
        versions = _client().search_model_versions(f"name='{name}'")
    except MlflowException:
        versions = []
    same = [int(mv.version) for mv in versions if (mv.tags or {}).get("shipped_sha256") == digest]
    if same:
        version = str(max(same))
    else:
        tags = {BASELINE_TAG: "shipped", "shipped_sha256": digest, "feedback_iteration": "shipped"}
        with start_run(EXPERIMENT, run_name="shipped-baseline", tags=tags):
            log_run(params={"source": str(folder)})
            uri = log_scorer_model(folder)
        version = str(mlflow.register_model(uri, name, tags=tags).version)
    set_alias("champion", version, name)
    return version


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


def feedback_iteration_of(version: Any) -> str:
    """The ``feedback_iteration`` tag of a model version, else of its source run, else ``"0"``.

    Training tags each run with ``"<feedback records>-<sha256[:12]>"`` of the feedback it read
    (:func:`training.train.feedback_tag`); the shipped baseline is ``"shipped"``.
    """
    tags = dict(getattr(version, "tags", None) or {})
    val = tags.get("feedback_iteration")
    if val is None and getattr(version, "run_id", None):
        try:
            val = _client().get_run(version.run_id).data.tags.get("feedback_iteration")
        except MlflowException:  # the run may have been deleted
            val = None
    return str(val) if val not in (None, "") else "0"


def version_info(version: Any, alias: str | None) -> dict[str, Any]:
    """Description of a model version for params, tags and reports: ``name``, ``version``,
    ``alias``, ``run_id``, ``model_id``, ``source``, ``feedback_iteration``, ``baseline`` and
    ``uri`` (``models:/<name>/<version>``)."""
    return {
        "name": version.name,
        "version": str(version.version),
        "alias": alias,
        "run_id": getattr(version, "run_id", None),
        "model_id": logged_model_id(version),
        "source": getattr(version, "source", None),
        "feedback_iteration": feedback_iteration_of(version),
        "baseline": (getattr(version, "tags", None) or {}).get(BASELINE_TAG),
        "uri": f"models:/{version.name}/{version.version}",
    }


def _packaged_folder(root: Path) -> Path | None:
    """The shallowest folder under ``root`` (itself included) holding ``config.json`` and ``classifier.skops``."""
    cands = sorted((p.parent for p in root.rglob("classifier.skops") if (p.parent / CONFIG_FILE).is_file()),
                   key=lambda p: (len(p.parts), str(p)))
    return cands[0] if cands else None


def download_scorer(ref: str | Any = "candidate", dst: str | os.PathLike[str] | None = None) -> Path:
    """Download the packaged scorer folder of a registered version; returns the folder.

    Args:
        ref: an alias, a version number (strings) or a model version object (:func:`get_version`).
        dst: download folder (default: a new temporary folder).

    Tries the version's ``source`` (``models:/...`` or a run artifact URI), then
    ``models:/<name>/<version>``, then the source run's artifacts.

    Raises:
        LookupError: no such alias or version.
        FileNotFoundError: no packaged scorer folder (config.json + classifier.skops) was found.
    """
    version = get_version(ref) if isinstance(ref, str) else ref
    if version is None:
        raise LookupError(f"registered model {MODEL_NAME!r} has no alias or version {ref!r}")
    dst = Path(dst) if dst is not None else Path(tempfile.mkdtemp(prefix="ctxscore-model-"))
    tried = []
    for i, uri in enumerate(u for u in (getattr(version, "source", None), f"models:/{version.name}/{version.version}") if u):
        try:
            local = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(dst / f"u{i}")))
        except (MlflowException, OSError) as exc:  # try the next location
            tried.append(f"{uri}: {exc}")
            continue
        found = _packaged_folder(local)
        if found:
            return found
        tried.append(f"{uri}: no config.json + classifier.skops inside")
    if getattr(version, "run_id", None):
        try:
            found = _packaged_folder(Path(mlflow.artifacts.download_artifacts(run_id=version.run_id,
                                                                              dst_path=str(dst / "run"))))
            if found:
                return found
            tried.append(f"run {version.run_id}: no packaged scorer in its artifacts")
        except (MlflowException, OSError) as exc:
            tried.append(f"run {version.run_id}: {exc}")
    raise FileNotFoundError(
        f"model {version.name} version {version.version}: no packaged scorer folder found; tried " + "; ".join(tried)
    )


#: The files of an exported scorer folder (and ``config.json``'s temporary name while it is written).
EXPORT_FILES = frozenset({CONFIG_FILE, CONFIG_FILE + ".tmp", CLASSIFIER_FILE, REGRESSOR_FILE, RULES_FILE,
                          *OPTIONAL_FILES})


def check_export_target(out: Path) -> None:
    """Refuse to replace ``out`` unless it is absent, an empty folder, or a previous export (only the
    files :data:`EXPORT_FILES` names, ``config.json`` among them): an export replaces the whole folder.

    Raises:
        FileExistsError: ``out`` is a file, or a folder holding anything else; nothing is changed.
    """
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir() or out.is_symlink():
        raise FileExistsError(f"--out {out}: is a file, not a folder; give the folder to export the scorer into")
    entries = list(out.iterdir())
    other = sorted(p.name for p in entries if p.name not in EXPORT_FILES or not p.is_file() or p.is_symlink())
    if other or (entries and not (out / CONFIG_FILE).is_file()):
        shown = ", ".join(other[:5]) + (f" and {len(other) - 5} more" if len(other) > 5 else "")
        raise FileExistsError(
            f"--out {out}: is a folder that is not an exported scorer (it holds {shown or 'no config.json'}); "
            "the export replaces the whole folder, so it writes only into a new or empty folder or over an "
            "earlier export; give another --out, or move those files away first")


def export_alias(alias: str, out: str | os.PathLike[str]) -> Path:
    """Copy the packaged scorer of ``models:/ctxscore-scorer@<alias>`` into ``out`` (replacing it),
    after checking that it loads (:meth:`LearnedScorer.from_pretrained` verifies hashes and the skops
    type allowlist). For ``champion``, a store without one first gets the shipped baseline
    (:func:`ensure_champion`). Returns ``out``. ``out`` (and its staging folder ``<out>.new``) must be
    absent, empty or an earlier export (:func:`check_export_target`): nothing else is ever deleted.

    Raises:
        LookupError: no such alias.
        FileExistsError: ``out`` or ``<out>.new`` holds something other than an exported scorer.
        FileNotFoundError: the version's artifacts hold no packaged scorer (deleted or moved).
        ctxscore.errors.ModelLoadError: the downloaded folder does not load (corrupt or modified).
    """
    from ctxscore.scoring.learned import LearnedScorer

    out = Path(out)
    staging = out.with_name(out.name + ".new")
    check_export_target(out)
    check_export_target(staging)
    if alias == "champion":
        ensure_champion()
    with tempfile.TemporaryDirectory(prefix="ctxscore-export-") as tmp:
        folder = download_scorer(alias, tmp)
        try:  # refuse to ship a folder that does not load
            LearnedScorer.from_pretrained(folder)
        except ModelLoadError as exc:  # the download is gone when this is read: name the version, not the folder
            why = str(exc).replace(REEXPORT_HINT, "").rstrip("; .")
            raise ModelLoadError(f"{MODEL_NAME}@{alias} does not load, so nothing was exported ({why}); point "
                                 f"{alias!r} at a version that loads or train a new one") from exc
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(folder, staging)
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m training.registry export [--alias champion] [--out out/scorer]`` or ``show``."""
    ap = argparse.ArgumentParser(prog="python -m training.registry", description="ctxscore model registry")
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("export", help="copy the packaged scorer of an alias into a folder")
    ex.add_argument("--alias", default="champion")
    ex.add_argument("--out", default=str(DEFAULT_EXPORT_DIR),
                    help=f"destination (default {DEFAULT_EXPORT_DIR}; `make ship` passes ctxscore/models/default)")
    sh = sub.add_parser("show", help="print the registered versions and aliases")
    sh.add_argument("--name", default=MODEL_NAME)
    args = ap.parse_args(argv)
    if args.cmd == "export":
        try:
            out = export_alias(args.alias, args.out)
        except LookupError as exc:
            print(f"error: {exc}; train one first (python -m training.train)", file=sys.stderr)
            return 2
        except (FileExistsError, FileNotFoundError, ModelLoadError) as exc:  # nothing was written to --out
            print(f"error: {exc}", file=sys.stderr)
            return 2
        version = get_version(args.alias)
        print(f"exported {MODEL_NAME}@{args.alias} (version {version.version}) to {out}")
        return 0
    client = _client()
    try:
        rm = client.get_registered_model(args.name)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        print(f"no model named {args.name!r} is registered in {tracking_uri()} yet; `python -m training.train` "
              f"registers {MODEL_NAME!r} (and `python -m training.registry export --alias champion` registers the "
              "shipped scorer as its champion)" + ("" if args.name == MODEL_NAME else f"; ctxscore's model is named "
                                                    f"{MODEL_NAME!r}, the default of --name"), file=sys.stderr)
        return 2
    print(f"{rm.name}: aliases {dict(rm.aliases)}")
    for mv in client.search_model_versions(f"name='{args.name}'"):
        print(f"  version {mv.version}: run {mv.run_id} tags {dict(mv.tags)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
