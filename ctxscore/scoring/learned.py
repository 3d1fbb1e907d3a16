"""The learned scorer: an embedding-based calibrated classifier and value regressor.

:class:`LearnedScorer` implements :class:`ctxscore.scoring.base.Scorer`. For each message it builds
the feature row of :mod:`ctxscore.scoring.features` (embedding + role + position + length + rule
signals), predicts the four category probabilities with a calibrated scikit-learn classifier and an
intrinsic value in [0, 1] with a scikit-learn regressor. Messages whose top probability is below
``uncertainty_threshold`` can be routed to a user-supplied ``fallback`` callback (for example an
LLM classifier), see :class:`LearnedScorer`.

The packaged folder format and its safe loading are in :mod:`ctxscore.scoring.package`. The default
scorer ships in ``ctxscore/models/default``; :func:`load_default_scorer` returns it when its
embedder package is installed, else warns once and returns ``None`` (the context manager then uses
the rules alone).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, InputError, ModelLoadError
from ..messages import CATEGORIES, Message
from .base import Prediction
from .embedders import Embedder, embedder_available, get_embedder
from .features import FeatureSpec, feature_rows
from .package import CONFIG_FILE, DEFAULT_MODEL_DIR, REEXPORT_HINT, describe, read_package, write_package
from .ranker import FEATURE_NAMES as RANKER_FEATURES
from .ranker import Ranker
from .rules import DEFAULT_RULES_PATH, RuleClassifier, RuleConfig, default_config, hard_constraints
from .spans import REQUIRE_THRESHOLD as SPAN_REQUIRE_THRESHOLD
from .spans import THRESHOLD as SPAN_THRESHOLD
from .spans import SpanExtractor

log = logging.getLogger("ctxscore")

#: Callback for uncertain messages: ``(message, learned_prediction) -> Prediction | None``.
Fallback = Callable[[Message, Prediction], "Prediction | None"]

_warned_default = False
#: The least instruction probability of a message that states a hard constraint (see
#: :meth:`LearnedScorer.hard_constraint_rows`): such a message is pinned, whatever the classifier says.
HARD_CONSTRAINT_PROB = 0.9


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
        ranker: the page-in relevance ranker (a fitted classifier over
            :data:`ctxscore.scoring.ranker.FEATURE_NAMES`, or a :class:`~ctxscore.scoring.ranker.Ranker`),
            or ``None``: :meth:`rerank` then keeps the store's order.
        spans: the key-span extractor (a fitted token classifier, or a
            :class:`~ctxscore.scoring.spans.SpanExtractor`), or ``None``.
    """

    def __init__(self, classifier: Any, regressor: Any, spec: FeatureSpec, *, rules: Any = None,
                 rules_path: str | os.PathLike[str] | None = None, embedder: Embedder | None = None,
                 uncertainty_threshold: float = 0.0, fallback: Fallback | None = None,
                 config: Mapping[str, Any] | None = None, ranker: Any = None, spans: Any = None) -> None:
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
        #: Label hard-constraint messages ``instruction`` (packaged ``hard_constraint_override``, default on).
        self.hard_constraint_override = bool(self.config.get("hard_constraint_override", True))
        self.ranker = ranker if ranker is None or isinstance(ranker, Ranker) else Ranker(ranker)
        self.spans = spans if spans is None or isinstance(spans, SpanExtractor) else SpanExtractor(spans)
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

    def rerank(self, query: str, query_embedding: np.ndarray | None, hits: Sequence[Any], store: Any,
               session_id: str) -> list[Any]:
        """The store's search ``hits`` for ``query`` re-ordered by the ranker (best first, ``score`` =
        its probability), or unchanged when the scorer has no ranker (see :mod:`ctxscore.scoring.ranker`)."""
        if self.ranker is None:
            return list(hits)
        return self.ranker.rerank(query, query_embedding, hits, store, session_id)

    def key_spans(self, text: str) -> list[str]:
        """The key spans the span extractor finds in ``text`` that a compressed form must keep
        (:meth:`~ctxscore.scoring.spans.SpanExtractor.key_spans`: substrings, in order, trivial ones
        left out), or ``[]`` without an extractor. The context manager uses this for its compressed
        tiers and the fact ledger for its facts."""
        return self.spans.key_spans(text) if self.spans is not None else []

    def features(self, messages: Sequence[Message], embeddings: np.ndarray | None = None) -> np.ndarray:
        """Feature rows for ``messages`` -> ``(n, spec.n_features)`` float32.

        ``embeddings`` (``(n, embed_dim)``) skips the embedder. The row layout is
        :func:`ctxscore.scoring.features.feature_rows` (shared with training).

        Raises:
            ConfigError: ``embeddings`` of the wrong shape, or rule signals that do not match the spec.
        """
        if embeddings is None:
            embeddings = self.embedder.embed([m.text() for m in messages])
        sig_fn = self.rules.signals if self.rules is not None else None
        return feature_rows(messages, self.spec, embeddings, sig_fn)

    def predict_arrays(self, X: np.ndarray, messages: Sequence[Message] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Heads on feature rows: ``(probs (n, 4) in CATEGORIES order, values (n,) in [0, 1])``.

        With ``messages`` (the n messages of the rows), a user or system message that states a hard
        constraint (:func:`ctxscore.scoring.rules.hard_constraints`; not a tool observation) is
        labelled ``instruction``: its instruction probability is raised to at least
        :data:`HARD_CONSTRAINT_PROB` (see :meth:`hard_constraint_rows`)."""
        if self._class_index is None:
            self._class_index = self._classes()
        from sklearn import config_context

        # the features are finite and well-formed by construction: skip sklearn's scan of them and its
        # parameter checks (together about 0.7 ms of the 4 ms the heads take on one message)
        with config_context(assume_finite=True, skip_parameter_validation=True):
            raw = np.asarray(self.classifier.predict_proba(X), dtype=np.float64)
            reg_out = np.asarray(self.regressor.predict(X), dtype=np.float64).reshape(-1)
        probs = np.zeros((X.shape[0], len(CATEGORIES)), dtype=np.float64)
        for j, k in enumerate(self._class_index):
            if k >= 0:
                probs[:, j] = raw[:, k]
        probs /= np.clip(probs.sum(axis=1, keepdims=True), 1e-12, None)
        values = np.clip(reg_out, 0.0, 1.0)
        if messages is not None and self.hard_constraint_override:
            rows = self.hard_constraint_rows(messages, X)
            if len(rows):
                j = CATEGORIES.index("instruction")
                p_ins = np.maximum(probs[rows, j], HARD_CONSTRAINT_PROB)
                rest = probs[rows].copy()
                rest[:, j] = 0.0
                rest *= ((1.0 - p_ins) / np.clip(rest.sum(axis=1), 1e-12, None))[:, None]
                rest[:, j] = p_ins
                probs[rows] = rest
        return probs, values

    def hard_constraint_rows(self, messages: Sequence[Message], X: np.ndarray) -> np.ndarray:
        """Indices of the messages that state a hard constraint: role user or system, not a tool
        observation (the ``observation`` rule signal), at most 4,000 characters, and at least one
        sentence :func:`~ctxscore.scoring.rules.hard_constraints` finds (never, must, only, at most,
        budget caps, deadlines; 不要, 必须, 禁止 ...)."""
        obs = self.spec.signal_start + self.spec.signal_names.index("observation") if "observation" in self.spec.signal_names else None
        cfg = self.rules.config if self.rules is not None else None
        if cfg is None or "hard_constraint" not in cfg.keywords:  # a rule file from before the group existed
            cfg = default_config()
        out = [i for i, m in enumerate(messages)
               if m.role in ("user", "system") and len(m.content) <= 4000 and (obs is None or X[i, obs] == 0.0)
               and hard_constraints(m.content, cfg)]
        return np.asarray(out, dtype=int)

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
        probs, values = self.predict_arrays(X, msgs)
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
        """Write the packaged folder (:mod:`ctxscore.scoring.package`) and return its path.

        ``metrics`` (a small JSON-ready summary) and ``extra`` (more config keys, for example the
        MLflow run id) go into ``config.json``. Existing files of the same names are replaced.
        """
        config = dict(self.config)
        config.update(extra or {})
        if metrics is not None:
            config["metrics"] = dict(metrics)
        if self.ranker is not None:
            config["ranker"] = {**dict(config.get("ranker") or {}), "features": list(RANKER_FEATURES)}
        if self.spans is not None:
            config["spans"] = {**dict(config.get("spans") or {}), "threshold": self.spans.threshold,
                               "require_threshold": self.spans.require_threshold}
        self.config = write_package(path, classifier=self.classifier, regressor=self.regressor, spec=self.spec,
                                    rules_src=self.rules_path or DEFAULT_RULES_PATH, config=config,
                                    uncertainty_threshold=self.uncertainty_threshold,
                                    ranker=self.ranker.model if self.ranker is not None else None,
                                    spans=self.spans.model if self.spans is not None else None)
        return Path(path)

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
            ModelLoadError: everything :func:`ctxscore.scoring.package.read_package` refuses, rule
                signals that differ from the ones the heads were trained on, or an embedder whose
                package is not installed. Every message says how to fix it. A page-in ranker trained
                on other features than this ctxscore computes (an older export) is not an error: the
                scorer loads without it, with a warning, and page-in uses the fused order.
        """
        pkg = read_package(path)
        spec, folder = pkg.spec, pkg.folder
        rules = RuleClassifier(RuleConfig.load(pkg.rules_path))
        if spec.signal_names and tuple(rules.signal_names) != tuple(spec.signal_names):
            raise ModelLoadError(
                f"{folder}: the scorer was trained on rule signals {list(spec.signal_names)} but this ctxscore's "
                f"rule module gives {list(rules.signal_names)}; {REEXPORT_HINT}"
            )
        if embedder is None:
            try:
                available = embedder_available(spec.embedder_id)
            except ConfigError as exc:
                raise ModelLoadError(f"{folder / CONFIG_FILE}: {exc}; {REEXPORT_HINT}") from exc
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
        config = pkg.config
        threshold = config.get("uncertainty_threshold", 0.0) if uncertainty_threshold is None else uncertainty_threshold
        ranker = None
        if pkg.ranker is not None:
            try:
                ranker = Ranker(pkg.ranker, (config.get("ranker") or {}).get("features", RANKER_FEATURES))
            except ValueError as exc:  # an older export: the heads still work, page-in uses the fused order
                log.warning("%s: the page-in ranker is not used: %s; %s", folder, exc, REEXPORT_HINT)
        span_cfg = config.get("spans") or {}
        try:
            spans = None if pkg.spans is None else SpanExtractor(
                pkg.spans, float(span_cfg.get("threshold", SPAN_THRESHOLD)),
                config=rules.config,  # the entity kinds it was trained with: the package's rule file
                require_threshold=float(span_cfg.get("require_threshold", SPAN_REQUIRE_THRESHOLD)))
            return cls(pkg.classifier, pkg.regressor, spec, rules=rules, rules_path=pkg.rules_path, embedder=embedder,
                       uncertainty_threshold=float(threshold), fallback=fallback, config=config,
                       ranker=ranker, spans=spans)
        except (ConfigError, ValueError) as exc:
            raise ModelLoadError(f"{folder}: {exc}; {REEXPORT_HINT}") from exc

    def __repr__(self) -> str:
        return (f"LearnedScorer(embedder={self.spec.embedder_id!r}, classifier={describe(self.classifier)}, "
                f"regressor={describe(self.regressor)})")


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


_default_scorer: Any = None  # the packaged learned scorer (False: unavailable), loaded on first use
_default_lock = threading.Lock()  # sessions opened at once in threads load it once, not once each


def resolve_scorer(scorer: Any, rules: RuleClassifier) -> Any:
    """The scorer a context manager uses.

    Args:
        scorer: ``"auto"`` (the packaged learned scorer, loaded once per process -- also when
            several threads open sessions at once -- when its embedder package is installed, else
            ``rules`` with one warning), ``"rules"`` or ``None`` (``rules``), a path to a packaged
            scorer folder, or any object with ``predict(messages)``.
        rules: the rule classifier.

    Raises:
        ConfigError: anything else.
        ModelLoadError: the folder cannot be loaded.
    """
    global _default_scorer
    if scorer is None or scorer == "rules":
        return rules
    if scorer == "auto":
        if _default_scorer is None:
            with _default_lock:
                if _default_scorer is None:
                    _default_scorer = load_default_scorer(warn=True) or False
        return _default_scorer or rules
    if isinstance(scorer, str | os.PathLike):
        return LearnedScorer.from_pretrained(scorer)
    if not callable(getattr(scorer, "predict", None)):
        raise ConfigError(f"scorer must be 'auto', 'rules', a packaged scorer folder or an object with "
                          f"predict(messages); got {scorer!r}")
    return scorer
