"""Training data, fitting and metrics of the key-span extractor (:mod:`ctxscore.scoring.spans`).

Rows: the train split's messages with key spans, as the dataset holds them (``key_spans``): the
distilled labels' key spans (and the bundled set's gold ones; weight 1) and the weak spans of SGD, MultiWOZ and CrossWOZ, which are
the corpora's annotated slot values found verbatim in the text (weight :data:`WEAK_WEIGHT`). A
token is positive when it lies inside an occurrence of one of its message's spans (within the part
of the text the extractor reads, :func:`ctxscore.scoring.spans._window`).

The model is a logistic regression (``SGDClassifier(loss="log_loss")``) over the hashed token
features of :func:`ctxscore.scoring.spans.token_features`.

Metrics (:func:`span_metrics`) on the distilled labels of dev and test, per source: character F1
(non-space characters inside predicted vs gold spans), exact-span F1 (normalised text equality) and
gold-span coverage (share of gold spans lying entirely inside predicted spans, what a compressor
that keeps the predicted spans would retain); the same for the rule spans
(:func:`ctxscore.compress.verify.key_spans`, the entities) as the baseline.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ctxscore.compress.verify import key_spans as rule_key_spans
from ctxscore.compress.verify import occurrences
from ctxscore.messages import Message
from ctxscore.scoring.spans import N_FEATURES, SpanExtractor, _window, token_features, tokenize

log = logging.getLogger("training.spans")

#: Weight of a weak (slot-annotation) span row against a distilled one.
WEAK_WEIGHT = 0.3
#: Sources whose weak spans are slot annotations (the other sources' weak spans are rule guesses).
SLOT_SOURCES = frozenset({"sgd", "multiwoz", "crosswoz"})


def token_labels(text: str, toks: Sequence[tuple[int, int]], spans: Sequence[str]) -> np.ndarray:
    """1 for tokens inside an occurrence of a span, else 0 -> ``(len(toks),)``."""
    occ = occurrences(text, spans)
    y = np.zeros(len(toks), dtype=np.int8)
    for i, (a, b) in enumerate(toks):
        if any(s <= a and b <= e for s, e in occ):
            y[i] = 1
    return y


def training_rows(split: Any) -> list[tuple[Message, list[str], float]]:
    """``(message, spans, weight)`` of the rows a span extractor trains on (see the module docstring)."""
    out = []
    for m, ls, src, spans in zip(split.messages, split.label_source, split.source, split.key_spans, strict=True):
        if ls in ("distilled", "bundled"):
            out.append((m, list(spans), 1.0))
        elif ls == "weak" and src in SLOT_SOURCES and len(spans):
            out.append((m, list(spans), WEAK_WEIGHT))
    return out


def featurize(rows: Sequence[tuple[Message, list[str], float]], config: Any = None) -> tuple[Any, np.ndarray, np.ndarray]:
    """``(hashed features (n_tokens, N_FEATURES) sparse, labels, weights)`` of the rows' tokens."""
    from scipy.sparse import vstack
    from sklearn.feature_extraction import FeatureHasher

    hasher = FeatureHasher(n_features=N_FEATURES, input_type="string", alternate_sign=False)
    Xs, ys, ws = [], [], []
    for m, spans, w in rows:
        win = _window(m.text())
        toks = tokenize(win)
        if not toks:
            continue
        Xs.append(hasher.transform(token_features(win, toks, m.role, config)))
        ys.append(token_labels(win, toks, spans))
        ws.append(np.full(len(toks), w))
    if not Xs:
        return None, np.zeros(0, np.int8), np.zeros(0)
    return vstack(Xs).tocsr(), np.concatenate(ys), np.concatenate(ws)


def fit(rows: Sequence[tuple[Message, list[str], float]], seed: int = 0, alpha: float = 2e-6) -> Any:
    """A fitted ``SGDClassifier(loss="log_loss")`` token classifier.

    Raises:
        ValueError: no row has a positive and a negative token.
    """
    from sklearn.linear_model import SGDClassifier

    X, y, w = featurize(rows)
    if X is None or y.min() == y.max():
        raise ValueError("span training needs tokens inside and outside key spans; no row has key spans")
    pos = max(1.0, float((y == 1).sum()))
    w = w * np.where(y == 1, len(y) / (2 * pos), len(y) / (2 * max(1.0, float((y == 0).sum()))))
    import warnings

    from sklearn.exceptions import ConvergenceWarning

    model = SGDClassifier(loss="log_loss", alpha=alpha, max_iter=40, tol=1e-4, random_state=seed)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=ConvergenceWarning)  # 40 epochs are enough: dev F1 is flat after 20
        return model.fit(X, y, sample_weight=w)


def _chars(text: str, spans: Sequence[tuple[int, int]]) -> set[int]:
    return {i for a, b in spans for i in range(a, b) if not text[i].isspace()}


def _norm(s: str) -> str:
    return " ".join(s.split()).casefold()


def span_metrics(rows: Sequence[tuple[Message, list[str], str]],
                 predict: Callable[[Message], list[tuple[int, int]]]) -> dict[str, float]:
    """Character F1, exact-span F1 and gold coverage of ``predict`` (message -> character spans)
    over ``rows`` of ``(message, gold spans, source)``; see the module docstring."""
    tp = fp = fn = 0
    ex_tp = ex_pred = ex_gold = 0
    covered = gold_n = 0
    for m, gold, _ in rows:
        text = _window(m.text())
        g_occ = [o for o in occurrences(text, gold)]
        pred = predict(m)
        pc, gc = _chars(text, pred), _chars(text, g_occ)
        tp, fp, fn = tp + len(pc & gc), fp + len(pc - gc), fn + len(gc - pc)
        ps = {_norm(text[a:b]) for a, b in pred}
        gs = {_norm(s) for s in gold if s in text}
        ex_tp, ex_pred, ex_gold = ex_tp + len(ps & gs), ex_pred + len(ps), ex_gold + len(gs)
        for s in gold:
            first = text.find(s)
            if first < 0:
                continue
            gold_n += 1
            covered += any(a <= first and first + len(s) <= b for a, b in pred)
    p = tp / max(1, tp + fp)
    r = tp / max(1, tp + fn)
    ep, er = ex_tp / max(1, ex_pred), ex_tp / max(1, ex_gold)
    return {"n": float(len(rows)), "char_p": p, "char_r": r, "char_f1": 2 * p * r / max(1e-12, p + r),
            "exact_f1": 2 * ep * er / max(1e-12, ep + er), "coverage": covered / max(1, gold_n)}


def rule_positions(m: Message) -> list[tuple[int, int]]:
    """The rule key spans (:func:`ctxscore.compress.verify.key_spans`) of a message as character spans."""
    text = _window(m.text())
    out = []
    for s in rule_key_spans(text):
        k = text.find(s)
        if k >= 0:
            out.append((k, k + len(s)))
    return out


def gold_rows(split: Any) -> list[tuple[Message, list[str], str]]:
    """``(message, gold spans, source)`` of the distilled rows of a split that have key spans (the
    bundled set's gold rows when the split has no distilled row: a build without the corpora)."""
    gold = "distilled" if (split.label_source == "distilled").any() else "bundled"
    return [(m, list(sp), src) for m, ls, src, sp in zip(split.messages, split.label_source, split.source,
                                                        split.key_spans, strict=True) if ls == gold and len(sp)]


def evaluate(extractor: SpanExtractor, split: Any) -> dict[str, float]:
    """Learned and rule metrics (:func:`span_metrics`) on a split's distilled rows, overall and per
    source: keys ``<learned|rules>_<metric>`` and ``<learned|rules>_<metric>_<source>``."""
    rows = gold_rows(split)
    out: dict[str, float] = {}
    for tag, fn in (("learned", lambda m: extractor.keep_positions(m.text(), m.role)), ("rules", rule_positions)):
        for k, v in span_metrics(rows, fn).items():
            out[f"{tag}_{k}"] = v
        for src in sorted({r[2] for r in rows}):
            part = [r for r in rows if r[2] == src]
            for k, v in span_metrics(part, fn).items():
                if k != "n":
                    out[f"{tag}_{k}_{src}"] = v
    return out
