"""The packaged-scorer folder: its layout, writing it, and reading it safely.

Layout (written by :func:`write_package`, read by :func:`read_package`)::

    config.json          format version, ctxscore version, embedder id, label names, feature spec,
                         head descriptions, metrics summary, sha256 of every other file
    classifier.skops     the category head (skops format: loading never runs code from the file)
    regressor.skops      the value head
    rules.toml           the rule file whose signals the heads were trained on
    ranker.skops         optional: the page-in relevance ranker (:mod:`ctxscore.scoring.ranker`)
    spans.skops          optional: the key-span extractor (:mod:`ctxscore.scoring.spans`)

The optional heads keep the format at version 1: a folder without them (every folder written
before they existed) loads as before, with no ranker and no span extractor; a folder whose
``config.json`` names one checks its hash like the required files.

Reading verifies every file's sha256 against ``config.json`` and accepts only the scikit-learn and
numpy types skops trusts by default plus :data:`ALLOWED_TYPES`; anything else raises
:class:`~ctxscore.errors.ModelLoadError` before a single object is built. No Python code is ever
imported from the folder. :class:`ctxscore.scoring.learned.LearnedScorer` builds a scorer from what
:func:`read_package` returns.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ModelLoadError
from ..messages import CATEGORIES
from .features import FeatureSpec

#: Version of the packaged-folder layout this ctxscore reads and writes.
FORMAT_VERSION = 1
#: Folder of the default scorer shipped inside the package.
DEFAULT_MODEL_DIR = Path(__file__).resolve().parents[1] / "models" / "default"
CONFIG_FILE = "config.json"
CLASSIFIER_FILE = "classifier.skops"
REGRESSOR_FILE = "regressor.skops"
RULES_FILE = "rules.toml"
RANKER_FILE = "ranker.skops"
SPANS_FILE = "spans.skops"
_FILES = (CLASSIFIER_FILE, REGRESSOR_FILE, RULES_FILE)
#: Optional heads: present in a folder only when the scorer has them.
OPTIONAL_FILES = (RANKER_FILE, SPANS_FILE)

#: Types allowed in the skops files beyond those skops trusts by default (scikit-learn estimators,
#: numpy arrays and builtins). These are the private helper classes of the heads we train.
ALLOWED_TYPES: frozenset[str] = frozenset({
    "sklearn.calibration._CalibratedClassifier",
    "sklearn.calibration._SigmoidCalibration",
    "sklearn.ensemble._hist_gradient_boosting.predictor.TreePredictor",
    "sklearn.ensemble._hist_gradient_boosting.binning._BinMapper",
    "sklearn.neural_network._stochastic_optimizers.AdamOptimizer",
    "sklearn.neural_network._stochastic_optimizers.SGDOptimizer",
    "sklearn._loss.link.Interval",
    "sklearn._loss.loss.HalfMultinomialLoss",
    "sklearn._loss.loss.HalfSquaredError",
    "sklearn._loss.loss.HalfBinomialLoss",
    "sklearn._loss.link.IdentityLink",
    "sklearn._loss.link.MultinomialLogit",
    "sklearn._loss.link.LogitLink",
})

REEXPORT_HINT = (
    "re-export it with `python -m training.registry export --alias champion --out DIR` "
    "(or reinstall ctxscore for the default scorer)"
)


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def ctxscore_version() -> str:
    """The installed ctxscore version (from package metadata, else ``pyproject.toml``'s ``0.1.0``)."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("ctxscore")
    except (ImportError, PackageNotFoundError):
        return "0.1.0"


def describe(est: Any) -> str:
    """Short description of a (possibly nested) scikit-learn estimator, e.g. ``Pipeline(StandardScaler, Ridge)``."""
    steps = getattr(est, "steps", None)
    if steps:
        return f"Pipeline({', '.join(describe(s) for _, s in steps)})"
    inner = getattr(est, "estimator", None)
    if inner is not None and type(est).__name__.startswith("Calibrated"):
        return f"{type(est).__name__}({describe(inner)})"
    return type(est).__name__


def load_skops(path: Path) -> Any:
    """Load a skops file after checking its types against the allowlist.

    Raises:
        ModelLoadError: unreadable file, or a type that is neither skops-trusted nor in :data:`ALLOWED_TYPES`.
    """
    import skops.io as sio

    try:
        untrusted = sio.get_untrusted_types(file=path)
    except Exception as exc:
        raise ModelLoadError(f"{path} is not a readable skops file ({type(exc).__name__}: {exc}); {REEXPORT_HINT}") from exc
    refused = sorted(set(untrusted) - ALLOWED_TYPES)
    if refused:
        raise ModelLoadError(
            f"{path} contains types outside the allowlist, refusing to load it (nothing was executed): "
            f"{', '.join(refused)}. Only scikit-learn heads are accepted; {REEXPORT_HINT}"
        )
    try:
        return sio.load(path, trusted=list(untrusted))
    except Exception as exc:
        raise ModelLoadError(f"{path} could not be loaded ({type(exc).__name__}: {exc}); {REEXPORT_HINT}") from exc


@dataclass(frozen=True)
class Package:
    """What a packaged folder holds, verified.

    Attributes:
        folder: where it was read from.
        config: the parsed ``config.json``.
        spec: the feature layout.
        classifier: the category head (``predict_proba``, ``classes_``).
        regressor: the value head (``predict``).
        rules_path: the packaged rule file.
        ranker: the page-in ranker's fitted model, or ``None``.
        spans: the key-span extractor's fitted model, or ``None``.
    """

    folder: Path
    config: dict[str, Any]
    spec: FeatureSpec
    classifier: Any
    regressor: Any
    rules_path: Path
    ranker: Any = None
    spans: Any = None


def write_package(out: str | Path, *, classifier: Any, regressor: Any, spec: FeatureSpec, rules_src: Path,
                  config: dict[str, Any], uncertainty_threshold: float = 0.0, ranker: Any = None,
                  spans: Any = None) -> dict[str, Any]:
    """Write a packaged folder and return the config written to ``config.json``.

    ``config`` holds extra keys (metrics, run id, the optional heads' descriptions ...); the layout
    keys are set here. ``ranker`` / ``spans`` (fitted models) are written when given and an older
    file of that name is removed when not. Existing files of the same names are replaced;
    ``config.json`` is written last, atomically.
    """
    import skops.io as sio

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    zipped = {"compression": zipfile.ZIP_DEFLATED, "compresslevel": 9}  # the scorer ships in the wheel
    sio.dump(classifier, folder / CLASSIFIER_FILE, **zipped)
    sio.dump(regressor, folder / REGRESSOR_FILE, **zipped)
    optional = {RANKER_FILE: ranker, SPANS_FILE: spans}
    for name, model in optional.items():
        if model is not None:
            sio.dump(model, folder / name, **zipped)
        elif (folder / name).exists():
            (folder / name).unlink()
    if Path(rules_src).resolve() != (folder / RULES_FILE).resolve():
        shutil.copyfile(rules_src, folder / RULES_FILE)
    config = dict(config)
    config.update({
        "format_version": FORMAT_VERSION,
        "ctxscore_version": ctxscore_version(),
        "embedder": {"model_id": spec.embedder_id, "dim": spec.embed_dim, "lexical_dim": spec.lexical_dim,
                     "max_chars": spec.max_chars, "head_chars": spec.head_chars},
        "labels": list(CATEGORIES),
        "feature_spec": spec.to_dict(),
        "classifier": {"file": CLASSIFIER_FILE, "type": describe(classifier)},
        "regressor": {"file": REGRESSOR_FILE, "type": describe(regressor),
                      "target": "value in [0, 1] (importance / 3 for distilled labels), clipped"},
        "rules": {"file": RULES_FILE},
        "uncertainty_threshold": uncertainty_threshold,
        "files": {name: sha256_file(folder / name)
                  for name in (*_FILES, *(n for n, m in optional.items() if m is not None))},
    })
    for name, key in ((RANKER_FILE, "ranker"), (SPANS_FILE, "spans")):
        if optional[name] is None:
            config.pop(key, None)
        else:
            config[key] = {**dict(config.get(key) or {}), "file": name, "type": describe(optional[name])}
    tmp = folder / (CONFIG_FILE + ".tmp")
    tmp.write_text(json.dumps(config, indent=2, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(folder / CONFIG_FILE)
    return config


def read_config(folder: Path) -> dict[str, Any]:
    """The verified ``config.json`` of a packaged folder (format version and file hashes checked).

    Raises:
        ModelLoadError: missing folder or file, invalid JSON, unknown format version, or a file whose
            sha256 differs from the config (corrupt or tampered).
    """
    cfg_path = folder / CONFIG_FILE
    if folder.exists() and not folder.is_dir():
        raise ModelLoadError(f"no packaged scorer at {folder}: it is a file, not a folder; pass the folder that holds "
                             f"{CONFIG_FILE} and the .skops files (or 'rules' / 'auto')")
    if not folder.is_dir():
        raise ModelLoadError(f"no packaged scorer at {folder}: the folder does not exist; {REEXPORT_HINT}")
    if not cfg_path.is_file():
        raise ModelLoadError(f"no packaged scorer at {folder}: {CONFIG_FILE} is missing; {REEXPORT_HINT}")
    try:
        config = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{cfg_path} is not valid JSON ({exc}); {REEXPORT_HINT}") from exc
    if not isinstance(config, dict):
        raise ModelLoadError(f"{cfg_path} must hold a JSON object; {REEXPORT_HINT}")
    if config.get("format_version") != FORMAT_VERSION:
        raise ModelLoadError(
            f"{cfg_path}: format_version {config.get('format_version')!r} is not supported by this ctxscore "
            f"(expected {FORMAT_VERSION}); {REEXPORT_HINT}"
        )
    files = config.get("files")
    if not isinstance(files, dict) or any(n not in files for n in _FILES):
        raise ModelLoadError(f"{cfg_path}: the 'files' table with sha256 of each file is missing or incomplete; {REEXPORT_HINT}")
    for name in (*_FILES, *(n for n in OPTIONAL_FILES if n in files)):
        f = folder / name
        if not f.is_file():
            raise ModelLoadError(f"{folder}: {name} is missing; {REEXPORT_HINT}")
        digest = sha256_file(f)
        if digest != files[name]:
            raise ModelLoadError(
                f"{f} is corrupt or was modified: sha256 {digest[:16]}… differs from the {files[name][:16]}… "
                f"recorded in {CONFIG_FILE}; refusing to load it. {REEXPORT_HINT}"
            )
    if list(config.get("labels", [])) != list(CATEGORIES):
        raise ModelLoadError(f"{cfg_path}: labels {config.get('labels')} differ from {list(CATEGORIES)}; {REEXPORT_HINT}")
    return config


def read_package(path: str | Path) -> Package:
    """Read and verify a packaged folder (see the module docstring).

    Raises:
        ModelLoadError: as :func:`read_config`; a bad feature spec; a skops file with types outside
            the allowlist; heads without ``predict_proba`` / ``predict`` or whose input width differs
            from the feature spec. Every message says how to fix it.
    """
    folder = Path(path)
    config = read_config(folder)
    try:
        spec = FeatureSpec.from_dict(config["feature_spec"])
    except (KeyError, TypeError, ConfigError) as exc:
        raise ModelLoadError(f"{folder / CONFIG_FILE}: bad feature_spec ({exc}); {REEXPORT_HINT}") from exc
    classifier = load_skops(folder / CLASSIFIER_FILE)
    regressor = load_skops(folder / REGRESSOR_FILE)
    files = config["files"]
    ranker = load_skops(folder / RANKER_FILE) if RANKER_FILE in files else None
    spans = load_skops(folder / SPANS_FILE) if SPANS_FILE in files else None
    for name, head in (("ranker", ranker), ("spans", spans)):
        if head is not None and not hasattr(head, "predict_proba"):
            raise ModelLoadError(f"{folder}: the {name} head ({type(head).__name__}) has no predict_proba(); {REEXPORT_HINT}")
    for name, head, needs in (("classifier", classifier, "predict_proba"), ("regressor", regressor, "predict")):
        if not hasattr(head, needs):
            raise ModelLoadError(f"{folder}: the {name} ({type(head).__name__}) has no {needs}(); {REEXPORT_HINT}")
        n_in = getattr(head, "n_features_in_", spec.n_features)
        if n_in != spec.n_features:
            raise ModelLoadError(
                f"{folder}: the {name} expects {n_in} features but the feature spec gives {spec.n_features}; {REEXPORT_HINT}"
            )
    return Package(folder=folder, config=config, spec=spec, classifier=classifier, regressor=regressor,
                   rules_path=folder / RULES_FILE, ranker=ranker, spans=spans)
