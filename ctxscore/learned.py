"""The learned scorer: an embedding-based calibrated classifier and value regressor.

:class:`LearnedScorer` implements :class:`ctxscore.scorer.Scorer`. For each message it builds the
feature row of :mod:`ctxscore.features` (embedding + role + position + length + rule signals),
predicts the four category probabilities with a calibrated scikit-learn classifier and an intrinsic
value in [0, 1] with a scikit-learn regressor. Messages whose top probability is below
``uncertainty_threshold`` can be routed to a user-supplied ``fallback`` callback (for example an
LLM classifier), see :class:`LearnedScorer`.

Packaged scorer folder (written by :meth:`LearnedScorer.save_pretrained`, read by
:meth:`LearnedScorer.from_pretrained`)::

    config.json          format version, ctxscore version, embedder id, label names, feature spec,
                         head descriptions, metrics summary, sha256 of every other file
    classifier.skops     the category head (skops format: loading never runs code from the file)
    regressor.skops      the value head
    rules.toml           the rule file whose signals the heads were trained on

Loading verifies every file's sha256 against ``config.json`` and accepts only the scikit-learn and
numpy types skops trusts by default plus :data:`ALLOWED_TYPES`; anything else raises
:class:`~ctxscore.errors.ModelLoadError` before a single object is built. No Python code is ever
imported from the folder.

The default scorer ships in ``ctxscore/models/default``; :func:`load_default_scorer` returns it
when its embedder package is installed, else warns once and returns ``None`` (the context manager
then uses the rules alone).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .embedders import Embedder, embedder_available, get_embedder, truncate_text
from .errors import ConfigError, InputError, ModelLoadError
from .features import (
    FeatureSpec,
    build_matrix,
    lexical_features,
    signal_features,
    tabular_features,
)
from .scorer import Prediction
from .types import CATEGORIES, Message

#: Version of the packaged-folder layout this ctxscore reads and writes.
FORMAT_VERSION = 1
#: Folder of the default scorer shipped inside the package.
DEFAULT_MODEL_DIR = Path(__file__).resolve().parent / "models" / "default"
CONFIG_FILE = "config.json"
CLASSIFIER_FILE = "classifier.skops"
REGRESSOR_FILE = "regressor.skops"
RULES_FILE = "rules.toml"

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

#: Callback for uncertain messages: ``(message, learned_prediction) -> Prediction | None``.
Fallback = Callable[[Message, Prediction], "Prediction | None"]

_REEXPORT = "re-export it with `python -m training.train --export DIR` (or reinstall ctxscore for the default scorer)"
_warned_default = False


def _sha256(path: Path) -> str:
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


def _load_skops(path: Path) -> Any:
    """Load a skops file after checking its types against the allowlist.

    Raises:
        ModelLoadError: unreadable file, or a type that is neither skops-trusted nor in :data:`ALLOWED_TYPES`.
    """
    try:
        import skops.io as sio
    except ImportError as exc:  # pragma: no cover - skops is a runtime dependency
        raise ModelLoadError("loading a packaged scorer needs skops; install it with `pip install skops`") from exc
    try:
        untrusted = sio.get_untrusted_types(file=path)
    except Exception as exc:
        raise ModelLoadError(f"{path} is not a readable skops file ({type(exc).__name__}: {exc}); {_REEXPORT}") from exc
    refused = sorted(set(untrusted) - ALLOWED_TYPES)
    if refused:
        raise ModelLoadError(
            f"{path} contains types outside the allowlist, refusing to load it (nothing was executed): "
            f"{', '.join(refused)}. Only scikit-learn heads are accepted; {_REEXPORT}"
        )
    try:
        return sio.load(path, trusted=list(untrusted))
    except Exception as exc:
        raise ModelLoadError(f"{path} could not be loaded ({type(exc).__name__}: {exc}); {_REEXPORT}") from exc


def _make_rules(rules_path: Path | None) -> tuple[Any, tuple[str, ...]]:
    """The rule classifier for ``rules_path`` and its signal names, or ``(None, ())`` without the rule module."""
    try:
        from .rules import RuleClassifier, RuleConfig
    except ImportError:  # the rule module is not there yet (development): no signal features
        return None, ()
    config = RuleConfig.load(rules_path) if rules_path is not None else RuleConfig.load()
    clf = RuleClassifier(config)
    return clf, tuple(getattr(clf, "signal_names", getattr(RuleClassifier, "signal_names", ())))


def default_rules_path() -> Path | None:
    """The rule file the runtime uses by default (``ctxscore/rules/default.toml``), if present."""
    p = Path(__file__).resolve().parent / "rules" / "default.toml"
    return p if p.is_file() else None


def _as_message(m: Message | Mapping[str, Any], i: int) -> Message:
    if isinstance(m, Message):
        return m
    if isinstance(m, Mapping):
        return Message.from_dict(dict(m), where=f"message {i}")
    raise InputError(f"message {i}: expected a ctxscore.Message or an OpenAI-style dict, got {type(m).__name__}")


class LearnedScorer:
    """Embedding-based category classifier and value regressor (a :class:`~ctxscore.scorer.Scorer`).

    Args:
        classifier: fitted scikit-learn classifier with ``predict_proba`` and ``classes_`` (category names).
        regressor: fitted scikit-learn regressor predicting value (clipped to [0, 1]).
        spec: the feature layout the heads were trained on.
        rules: a :class:`ctxscore.rules.RuleClassifier` providing ``signals(message)``, or ``None``
            when ``spec.signal_names`` is empty.
        embedder: the embedder; default ``get_embedder(spec.embedder_id, ...)`` (shared instance).
        uncertainty_threshold: a message whose top class probability is below this (a fraction,
            0 disables) is passed to ``fallback``.
        fallback: ``fallback(message, prediction) -> Prediction | None``, the hook for an external
            classifier (the LLM path). Its result replaces the learned prediction (``source`` is
            set to ``"callback"`` and a missing ``value`` is taken from the learned one); ``None``
            keeps the learned prediction. Exceptions raised by the callback propagate.
        config: the packaged config (metadata; kept for :meth:`save_pretrained`).
    """

    def __init__(self, classifier: Any, regressor: Any, spec: FeatureSpec, *, rules: Any = None,
                 rules_path: str | os.PathLike[str] | None = None, embedder: Embedder | None = None,
                 uncertainty_threshold: float = 0.0, fallback: Fallback | None = None,
                 config: Mapping[str, Any] | None = None) -> None:
        if not 0.0 <= uncertainty_threshold <= 1.0:
            raise ConfigError(f"uncertainty_threshold must be a fraction in [0, 1], got {uncertainty_threshold}")
        self.classifier = classifier
        self.regressor = regressor
        self.spec = spec
        self.rules = rules
        self.rules_path = Path(rules_path) if rules_path is not None else None
        self.embedder = embedder if embedder is not None else get_embedder(
            spec.embedder_id, max_chars=spec.max_chars, head_chars=spec.head_chars)
        self.uncertainty_threshold = uncertainty_threshold
        self.fallback = fallback
        self.config = dict(config or {})
        self._warned_turn = False
        self._class_index: list[int] | None = None
        if hasattr(classifier, "classes_"):
            self._class_index = self._classes()
        if spec.signal_names and rules is None:
            raise ConfigError("the feature spec lists rule signals but no rule classifier was given")

    def _classes(self) -> list[int]:
        """Column of each category in ``predict_proba`` (-1 when the classifier never saw it)."""
        classes = [str(c) for c in getattr(self.classifier, "classes_", [])]
        unknown = [c for c in classes if c not in CATEGORIES]
        if unknown or not classes:
            raise ConfigError(f"classifier classes {classes} must be a non-empty subset of {list(CATEGORIES)}")
        return [classes.index(c) if c in classes else -1 for c in CATEGORIES]

    # ------------------------------------------------------------------ features and prediction
    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings of ``texts`` with the scorer's embedder -> ``(n, dim)`` float32, L2-normalised.

        The archive's vector search embeds queries with this, so queries and stored messages share
        one embedding space.
        """
        return self.embedder.embed(list(texts))

    def features(self, messages: Sequence[Message], embeddings: np.ndarray | None = None) -> np.ndarray:
        """Feature rows for ``messages`` -> ``(n, spec.n_features)`` float32.

        ``embeddings`` (``(n, embed_dim)``) skips the embedder (training passes cached vectors).
        """
        texts = [m.text() for m in messages]
        if embeddings is None:
            embeddings = self.embedder.embed(texts)
        lex = None
        if self.spec.lexical_dim:
            lex = lexical_features([truncate_text(t, self.spec.max_chars, self.spec.head_chars) for t in texts],
                                   self.spec.lexical_dim)
        tab = tabular_features(messages)
        sig_fn = self.rules.signals if self.rules is not None else None
        sig = signal_features(messages, sig_fn, self.spec.signal_names)
        return build_matrix(embeddings, tab, sig, lex)

    def predict_arrays(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Heads on feature rows: ``(probs (n, 4) in CATEGORIES order, values (n,) in [0, 1])``."""
        if self._class_index is None:
            self._class_index = self._classes()
        from sklearn import config_context

        with config_context(assume_finite=True):  # features are finite by construction; skips a scan per call
            raw = np.asarray(self.classifier.predict_proba(X), dtype=np.float64)
            reg_out = np.asarray(self.regressor.predict(X), dtype=np.float64).reshape(-1)
        probs = np.zeros((X.shape[0], len(CATEGORIES)), dtype=np.float64)
        for j, k in enumerate(self._class_index):
            if k >= 0:
                probs[:, j] = raw[:, k]
        probs /= np.clip(probs.sum(axis=1, keepdims=True), 1e-12, None)
        values = np.clip(reg_out, 0.0, 1.0)
        return probs, values

    def predict(self, messages: Sequence[Message]) -> list[Prediction]:
        """Predict category, class probabilities and value for each message.

        Args:
            messages: N messages (``Message`` or OpenAI-style dicts), each scored on its own;
                ``Message.turn`` (0-based position in the conversation) feeds the position
                features, so set it before scoring (``None`` counts as 0).

        Returns:
            N :class:`~ctxscore.scorer.Prediction` with ``source="learned"`` (or ``"callback"``),
            ``probs`` over all four categories, ``value`` in [0, 1] and ``embedding`` (the
            message's ``(dim,)`` vector, for the archive); ``signals`` holds the rule signals and
            ``learned_value``.
        """
        msgs = [_as_message(m, i) for i, m in enumerate(messages)]
        if not msgs:
            return []
        if not self._warned_turn and any(m.turn is None for m in msgs):
            self._warned_turn = True
            warnings.warn(
                "LearnedScorer.predict: message(s) without Message.turn; the position features then assume "
                "turn 0, which costs accuracy (dev macro-F1 0.922 -> 0.897 for the default scorer). "
                "Set turn (the 0-based position in the conversation) before scoring.",
                UserWarning, stacklevel=2,
            )
        emb = self.embedder.embed([m.text() for m in msgs])
        X = self.features(msgs, embeddings=emb)
        probs, values = self.predict_arrays(X)
        sig_start = self.spec.signal_start
        out: list[Prediction] = []
        for i, m in enumerate(msgs):
            p = {c: float(probs[i, j]) for j, c in enumerate(CATEGORIES)}
            signals = {name: float(X[i, sig_start + k]) for k, name in enumerate(self.spec.signal_names)}
            signals["learned_value"] = float(values[i])
            pred = Prediction(category=CATEGORIES[int(np.argmax(probs[i]))], probs=p, value=float(values[i]),
                              source="learned", signals=signals, embedding=emb[i])
            if self.fallback is not None and pred.confidence < self.uncertainty_threshold:
                alt = self.fallback(m, pred)
                if alt is not None:
                    if alt.category not in CATEGORIES:
                        raise InputError(f"fallback returned unknown category {alt.category!r}; use one of {CATEGORIES}")
                    if alt.value is None:
                        alt.value = pred.value
                    if alt.embedding is None:
                        alt.embedding = pred.embedding
                    alt.source = "callback"
                    pred = alt
            out.append(pred)
        return out

    # ------------------------------------------------------------------ persistence
    def save_pretrained(self, path: str | os.PathLike[str], *, metrics: Mapping[str, Any] | None = None,
                        extra: Mapping[str, Any] | None = None) -> Path:
        """Write the packaged folder (see the module docstring) and return its path.

        ``metrics`` (a small JSON-ready summary) and ``extra`` (more config keys, for example the
        MLflow run id) go into ``config.json``. Existing files of the same names are replaced.
        """
        import skops.io as sio

        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        sio.dump(self.classifier, out / CLASSIFIER_FILE)
        sio.dump(self.regressor, out / REGRESSOR_FILE)
        rules_src = self.rules_path or default_rules_path()
        if rules_src is None:
            raise ConfigError("no rule file to package: pass rules_path or install ctxscore's default rules")
        if Path(rules_src).resolve() != (out / RULES_FILE).resolve():
            shutil.copyfile(rules_src, out / RULES_FILE)
        config = dict(self.config)
        config.update(extra or {})
        config.update({
            "format_version": FORMAT_VERSION,
            "ctxscore_version": ctxscore_version(),
            "embedder": {"model_id": self.spec.embedder_id, "dim": self.spec.embed_dim,
                         "lexical_dim": self.spec.lexical_dim,
                         "max_chars": self.spec.max_chars, "head_chars": self.spec.head_chars},
            "labels": list(CATEGORIES),
            "feature_spec": self.spec.to_dict(),
            "classifier": {"file": CLASSIFIER_FILE, "type": _describe(self.classifier)},
            "regressor": {"file": REGRESSOR_FILE, "type": _describe(self.regressor),
                          "target": "value in [0, 1] (importance / 3 for distilled labels), clipped"},
            "rules": {"file": RULES_FILE},
            "uncertainty_threshold": self.uncertainty_threshold,
            "files": {name: _sha256(out / name) for name in (CLASSIFIER_FILE, REGRESSOR_FILE, RULES_FILE)},
        })
        if metrics is not None:
            config["metrics"] = dict(metrics)
        tmp = out / (CONFIG_FILE + ".tmp")
        tmp.write_text(json.dumps(config, indent=2, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")
        tmp.replace(out / CONFIG_FILE)
        self.config = config
        return out

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike[str], *, embedder: Embedder | None = None,
                        uncertainty_threshold: float | None = None, fallback: Fallback | None = None) -> LearnedScorer:
        """Load a packaged folder written by :meth:`save_pretrained`.

        Args:
            path: the folder.
            embedder: use this embedder instead of the one named in the config (it must have the
                same ``model_id`` and ``dim``; tests pass a cached or fake one).
            uncertainty_threshold: overrides the packaged value.
            fallback: the callback for uncertain messages.

        Raises:
            ModelLoadError: missing folder or file, unreadable or inconsistent config, a file whose
                sha256 differs from the config (corrupt or tampered), a skops file with types
                outside the allowlist, heads that do not match the feature spec, or an embedder
                whose package is not installed. Every message says how to fix it.
        """
        folder = Path(path)
        cfg_path = folder / CONFIG_FILE
        if not folder.is_dir():
            raise ModelLoadError(f"no packaged scorer at {folder}: the folder does not exist; {_REEXPORT}")
        if not cfg_path.is_file():
            raise ModelLoadError(f"no packaged scorer at {folder}: {CONFIG_FILE} is missing; {_REEXPORT}")
        try:
            config = json.loads(cfg_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ModelLoadError(f"{cfg_path} is not valid JSON ({exc}); {_REEXPORT}") from exc
        if not isinstance(config, dict):
            raise ModelLoadError(f"{cfg_path} must hold a JSON object; {_REEXPORT}")
        if config.get("format_version") != FORMAT_VERSION:
            raise ModelLoadError(
                f"{cfg_path}: format_version {config.get('format_version')!r} is not supported by this ctxscore "
                f"(expected {FORMAT_VERSION}); {_REEXPORT}"
            )
        files = config.get("files")
        if not isinstance(files, dict) or any(n not in files for n in (CLASSIFIER_FILE, REGRESSOR_FILE, RULES_FILE)):
            raise ModelLoadError(f"{cfg_path}: the 'files' table with sha256 of each file is missing or incomplete; {_REEXPORT}")
        for name in (CLASSIFIER_FILE, REGRESSOR_FILE, RULES_FILE):
            f = folder / name
            if not f.is_file():
                raise ModelLoadError(f"{folder}: {name} is missing; {_REEXPORT}")
            digest = _sha256(f)
            if digest != files[name]:
                raise ModelLoadError(
                    f"{f} is corrupt or was modified: sha256 {digest[:16]}… differs from the {files[name][:16]}… "
                    f"recorded in {CONFIG_FILE}; refusing to load it. {_REEXPORT}"
                )
        try:
            spec = FeatureSpec.from_dict(config["feature_spec"])
        except (KeyError, TypeError, ConfigError) as exc:
            raise ModelLoadError(f"{cfg_path}: bad feature_spec ({exc}); {_REEXPORT}") from exc
        if list(config.get("labels", [])) != list(CATEGORIES):
            raise ModelLoadError(f"{cfg_path}: labels {config.get('labels')} differ from {list(CATEGORIES)}; {_REEXPORT}")
        classifier = _load_skops(folder / CLASSIFIER_FILE)
        regressor = _load_skops(folder / REGRESSOR_FILE)
        for name, head, needs in (("classifier", classifier, "predict_proba"), ("regressor", regressor, "predict")):
            if not hasattr(head, needs):
                raise ModelLoadError(f"{folder}: the {name} ({type(head).__name__}) has no {needs}(); {_REEXPORT}")
            n_in = getattr(head, "n_features_in_", spec.n_features)
            if n_in != spec.n_features:
                raise ModelLoadError(
                    f"{folder}: the {name} expects {n_in} features but the feature spec gives {spec.n_features}; {_REEXPORT}"
                )
        rules, names = _make_rules(folder / RULES_FILE)
        if spec.signal_names and tuple(names) != tuple(spec.signal_names):
            raise ModelLoadError(
                f"{folder}: the scorer was trained on rule signals {list(spec.signal_names)} but this ctxscore's "
                f"rule module gives {list(names)}; {_REEXPORT}"
            )
        if embedder is None:
            try:
                available = embedder_available(spec.embedder_id)
            except ConfigError as exc:
                raise ModelLoadError(f"{cfg_path}: {exc}; {_REEXPORT}") from exc
            if not available:
                raise ModelLoadError(
                    f"the scorer at {folder} needs the embedder {spec.embedder_id!r}, whose package is not installed; "
                    f"install it (for the default: `pip install '.[embed]' in a ctxscore checkout`) or use the rules-only scorer"
                )
        elif embedder.model_id != spec.embedder_id or embedder.dim != spec.embed_dim:
            raise ModelLoadError(
                f"embedder {embedder.model_id!r} (dim {embedder.dim}) does not match the scorer's "
                f"{spec.embedder_id!r} (dim {spec.embed_dim})"
            )
        threshold = config.get("uncertainty_threshold", 0.0) if uncertainty_threshold is None else uncertainty_threshold
        try:
            return cls(classifier, regressor, spec, rules=rules, rules_path=folder / RULES_FILE, embedder=embedder,
                       uncertainty_threshold=float(threshold), fallback=fallback, config=config)
        except ConfigError as exc:
            raise ModelLoadError(f"{folder}: {exc}; {_REEXPORT}") from exc

    def __repr__(self) -> str:
        return (f"LearnedScorer(embedder={self.spec.embedder_id!r}, classifier={_describe(self.classifier)}, "
                f"regressor={_describe(self.regressor)})")


def _describe(est: Any) -> str:
    """Short description of a (possibly nested) scikit-learn estimator, e.g. ``Pipeline(StandardScaler, Ridge)``."""
    steps = getattr(est, "steps", None)
    if steps:
        return f"Pipeline({', '.join(_describe(s) for _, s in steps)})"
    inner = getattr(est, "estimator", None)
    if inner is not None and type(est).__name__.startswith("Calibrated"):
        return f"{type(est).__name__}({_describe(inner)})"
    return type(est).__name__


def load_default_scorer(warn: bool = True, **kwargs: Any) -> LearnedScorer | None:
    """The default scorer shipped in ``ctxscore/models/default``, or ``None`` (then use the rules).

    Returns ``None`` with one :class:`UserWarning` per process (when ``warn``) if the folder is not
    there or its embedder package is not installed; keyword arguments go to
    :meth:`LearnedScorer.from_pretrained`.

    Raises:
        ModelLoadError: the shipped folder is present but corrupt (a broken install must not be
            silently replaced by the rules).
    """
    global _warned_default
    cfg = DEFAULT_MODEL_DIR / CONFIG_FILE
    reason = None
    if not cfg.is_file():
        reason = f"no default learned scorer is installed ({DEFAULT_MODEL_DIR} has no {CONFIG_FILE})"
    else:
        try:
            model_id = json.loads(cfg.read_text(encoding="utf-8"))["embedder"]["model_id"]
            ok = embedder_available(model_id)
        except (KeyError, TypeError, ValueError, ConfigError) as exc:
            raise ModelLoadError(f"{cfg} is malformed ({exc}); reinstall ctxscore") from exc
        if not ok:
            reason = (f"the default learned scorer needs the embedder {model_id!r}, whose package is not installed "
                      "(`pip install '.[embed]' in a ctxscore checkout`)")
    if reason is not None:
        if warn and not _warned_default:
            warnings.warn(f"{reason}; ctxscore falls back to the rules-only scorer.", UserWarning, stacklevel=2)
            _warned_default = True
        return None
    return LearnedScorer.from_pretrained(DEFAULT_MODEL_DIR, **kwargs)


# ---------------------------------------------------------------------- scoring files
def _read_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    try:
        fh = open(path, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}; pass an existing JSONL file") from exc
    with fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield n, json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{path} line {n}: not valid JSON ({exc.msg}); write one JSON object per line") from exc
            except UnicodeDecodeError as exc:  # pragma: no cover - depends on the file
                raise InputError(f"{path} line {n}: not UTF-8 ({exc.reason}); re-encode the file as UTF-8") from exc


def _pred_row(pred: Prediction, msg: Message, index: int) -> dict[str, Any]:
    return {
        "index": index,
        "id": msg.id,
        "role": msg.role,
        "category": pred.category,
        "probs": {k: round(v, 4) for k, v in pred.probs.items()},
        "value": None if pred.value is None else round(pred.value, 4),
        "source": pred.source,
    }


def score_file(path: str | os.PathLike[str], model_dir: str | os.PathLike[str] | None = None, *,
               scorer: Any = None) -> Iterator[dict[str, Any]]:
    """Score a JSONL file with a packaged scorer, one output dict per message.

    Two input formats, detected from the first non-empty line:

    - a single session: one OpenAI-style message per line (``{"role", "content", ...}``);
      outputs carry ``index`` (0-based line among messages), ``id``, ``role``, ``category``,
      ``probs``, ``value`` and ``source``;
    - the evaluation's session file: one session per line (``{"session_id", "messages": [...]}``);
      each output additionally carries ``session_id`` (``index`` is the message's index in its session).

    The scorer (``scorer``, else ``LearnedScorer.from_pretrained(model_dir)``, else the default
    scorer) is loaded once for the whole file; each session is scored as one batch.

    Raises:
        InputError: unreadable file, a line that is not JSON, a malformed message or session.
        ModelLoadError: the model folder cannot be loaded.
    """
    src = Path(path)
    if scorer is None:
        if model_dir is not None:
            scorer = LearnedScorer.from_pretrained(model_dir)
        else:
            scorer = load_default_scorer(warn=False)
            if scorer is None:
                raise ModelLoadError(
                    "no learned scorer available: pass --model DIR, or install the default's embedder "
                    "(`pip install '.[embed]' in a ctxscore checkout`)"
                )
    rows = _read_jsonl(src)
    first = next(rows, None)
    if first is None:
        return
    n0, obj0 = first
    if isinstance(obj0, dict) and "messages" in obj0:
        for n, obj in _chain(first, rows):
            if not isinstance(obj, dict) or not isinstance(obj.get("messages"), list):
                raise InputError(f"{src} line {n}: expected a session object with a 'messages' list (the evaluation format)")
            sid = obj.get("session_id", f"line{n}")
            msgs = []
            for i, d in enumerate(obj["messages"]):
                m = Message.from_dict(d, where=f"{src} line {n} (session {sid!r}) message {i}")
                m.turn = i
                msgs.append(m)
            for i, (m, p) in enumerate(zip(msgs, scorer.predict(msgs), strict=True)):
                row = _pred_row(p, m, i)
                yield {"session_id": sid, **row}
        return
    msgs = []
    for i, (n, obj) in enumerate(_chain(first, rows)):
        m = Message.from_dict(obj, where=f"{src} line {n}")
        m.turn = i
        msgs.append(m)
    for i, (m, p) in enumerate(zip(msgs, scorer.predict(msgs), strict=True)):
        yield _pred_row(p, m, i)


def _chain(first: tuple[int, Any], rest: Iterator[tuple[int, Any]]) -> Iterator[tuple[int, Any]]:
    yield first
    yield from rest
