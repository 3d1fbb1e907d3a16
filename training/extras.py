"""The parts of a training run beyond the category head: outcome value rows and metrics, the page-in
ranker and the key-span extractor of the chosen scorer (:mod:`training.train` calls these).

- :func:`session_sets`: the long sessions of the build (``train_sessions.jsonl``,
  ``dev_sessions.jsonl``, ``eval_sessions.jsonl``) featurised once per feature spec.
- :func:`outcome_rows`: the outcome head's rows (train-session messages, target "source of a key
  fact"; plus the messages recall failures named, target 1).
- :func:`value_metrics`: ROC-AUC of the value for "source of a key fact" on the dev and held-out
  sessions, learned vs rules vs their blend (:func:`training.outcomes.value_auc`).
- :func:`train_ranker`: pairs mined from the train sessions (cached), the recall failures' queries,
  the fitted ranker, and its MRR / top-k against the fused order on the dev and held-out sessions.
- :func:`train_spans`: the fitted span extractor, its threshold chosen on dev, and span metrics.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from ctxscore.io import iter_jsonl
from ctxscore.scoring.ranker import Ranker
from ctxscore.scoring.spans import THRESHOLD as SPAN_THRESHOLD
from ctxscore.scoring.spans import SpanExtractor
from ctxscore.window.pagein import QUERY_RANK_SURE

from . import outcomes, ranker, spans
from .embed_cache import cached_embedder
from .paths import CACHE_DIR, REPO_ROOT

log = logging.getLogger("training.train")

#: The long-session files of a build, by name.
SESSION_FILES = {"train": "train_sessions.jsonl", "dev": "dev_sessions.jsonl", "eval": "eval_sessions.jsonl"}
#: Thresholds tried for the span extractor (the best dev character F1 is kept).
SPAN_THRESHOLDS = (0.2, 0.25, 0.3, 0.35, 0.4, 0.5)


def load_sessions(data_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """The long sessions of a build folder by name (``{}`` for a file that is absent)."""
    out = {}
    for name, fname in SESSION_FILES.items():
        p = Path(data_dir) / fname
        out[name] = [obj for _, obj in iter_jsonl(p)] if p.is_file() else []
    return out


def _embedder(spec: Any, cache_dir: str | None) -> Any:
    return cached_embedder(spec.embedder_id, cache_dir, max_chars=spec.max_chars, head_chars=spec.head_chars)


def session_sets(ctx: Any, spec: Any, cache_dir: str | None = None) -> dict[str, outcomes.SessionSet]:
    """The build's long sessions featurised under ``spec`` (memoised on ``ctx.session_sets``)."""
    key = (spec.embedder_id, spec.lexical_dim, spec.max_chars, spec.head_chars)
    got = ctx.session_sets.get(key)
    if got is None:
        emb = _embedder(spec, cache_dir)
        got = {name: outcomes.SessionSet(ss, spec, emb, ctx.rules) for name, ss in ctx.sessions.items()}
        ctx.session_sets[key] = got
    return got


def outcome_rows(ctx: Any, spec: Any, cache_dir: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(X, y)`` of the outcome head: every train-session message (y = source of a key fact) and the
    feedback rows (messages recall failures named, y = 1)."""
    X, y = session_sets(ctx, spec, cache_dir)["train"].stacked()
    fb = ctx.splits.get("feedback")
    if fb is not None and len(fb) and fb.X is not None:
        X = np.vstack([X, fb.X]) if len(X) else fb.X
        y = np.concatenate([y, np.ones(len(fb))])
    return X, y


def value_metrics(scorer: Any, ctx: Any, spec: Any, cache_dir: str | None = None) -> dict[str, dict[str, float]]:
    """``{"dev" | "eval": {"value_auc", "value_auc_rules", "value_auc_blend", "n_sources"}}`` for the
    sessions present (see :func:`training.outcomes.value_auc`)."""
    out = {}
    for name, sset in session_sets(ctx, spec, cache_dir).items():
        if name == "train" or not sset.sessions:
            continue
        if name not in ctx.rule_values:
            ctx.rule_values[name] = np.concatenate([outcomes.rule_values(m, ctx.rules) for m in sset.messages])
        X, y = sset.stacked()
        _, values = scorer.predict_arrays(X, [m for msgs in sset.messages for m in msgs])
        auc = outcomes.value_auc(values, ctx.rule_values[name], y)
        out[name] = {"value_auc": auc["learned"], "value_auc_rules": auc["rules"], "value_auc_blend": auc["blend"],
                     "n_sources": float(y.sum())}
    return out


def _predictions(scorer: Any, sset: outcomes.SessionSet) -> dict[str, np.ndarray]:
    """Session id -> ``(n, 5)``: category probabilities (CATEGORIES order) and value of each message."""
    out = {}
    for s, X, msgs in zip(sset.sessions, sset.X, sset.messages, strict=True):
        probs, values = scorer.predict_arrays(X, msgs)
        out[s["session_id"]] = np.hstack([probs, values[:, None]]).astype(np.float32)
    return out


def train_ranker(scorer: Any, ctx: Any, spec: Any, *, cache_dir: str | None = None, seed: int = 0,
                 max_iter: int = 300) -> tuple[Ranker | None, dict[str, float], str]:
    """Fit the page-in ranker for ``scorer`` (see :mod:`training.ranker`).

    Returns:
        ``(ranker or None when there are no train sessions, metrics, markdown table)``; metrics are
        ``ranker_<set>_<order>_<metric>`` for the dev and held-out (``eval``) sessions, ``set``
        ``fused`` or ``learned``, plus ``ranker_train_queries``, ``ranker_feedback_queries``,
        ``ranker_offtopic_queries`` and ``ranker_dev_offtopic_sure`` / ``ranker_dev_ontopic_sure`` (the
        share of dev off-topic / probe queries with a candidate at :data:`QUERY_RANK_SURE` or more).
    """
    sets = session_sets(ctx, spec, cache_dir)
    if not sets["train"].sessions:
        log.warning("no train_sessions.jsonl in the build: no ranker (rebuild with `python -m training.data build`)")
        return None, {}, ""
    emb = _embedder(spec, cache_dir)
    key = f"{spec.embedder_id}:{spec.max_chars}:{spec.head_chars}"
    folder = Path(cache_dir or CACHE_DIR).parent / "ranker"
    mined = {name: ranker.cached_mine(name, s.sessions, s.embeddings, emb.embed, key, folder, REPO_ROOT, seed)
             for name, s in sets.items() if s.sessions}
    offtopic = {name: ranker.cached_mine(f"{name}-offtopic", sets[name].sessions, sets[name].embeddings, emb.embed, key,
                                         folder, REPO_ROOT, seed, offtopic=ranker.offtopic_pool(sets[name].sessions))
                for name in ("train", "dev") if sets.get(name) and sets[name].sessions}
    by_id = {s["session_id"]: (name, i) for name, ss in sets.items() for i, s in enumerate(ss.sessions)}
    asks = ranker.feedback_asks(ctx.feedback, {sid: sets[n].sessions[i] for sid, (n, i) in by_id.items() if n != "eval"})
    fb_queries = []
    for name in ("train", "dev"):
        s = sets[name]
        fb_queries += ranker.mine_set(s.sessions, s.embeddings, emb.embed, seed, asks=asks,
                                      weight=ranker.FEEDBACK_WEIGHT)
    preds: dict[str, np.ndarray] = {}
    for s in sets.values():
        preds.update(_predictions(scorer, s))
    for qs in (*mined.values(), *offtopic.values(), fb_queries):
        ranker.refill(qs, preds)
    model = ranker.fit([*mined["train"], *offtopic.get("train", []), *fb_queries], seed=seed, max_iter=max_iter)
    rk = Ranker(model)
    results = {}
    metrics: dict[str, float] = {"ranker_train_queries": float(len(mined["train"])),
                                 "ranker_feedback_queries": float(len(fb_queries)),
                                 "ranker_offtopic_queries": float(len(offtopic.get("train", [])))}
    if offtopic.get("dev"):  # how often a question about something else has a candidate the ranker is sure of
        metrics["ranker_dev_offtopic_sure"] = ranker.sure_share(offtopic["dev"], rk.scores, QUERY_RANK_SURE)
        metrics["ranker_dev_ontopic_sure"] = ranker.sure_share(mined["dev"], rk.scores, QUERY_RANK_SURE)
    for name in ("dev", "eval"):
        if name not in mined:
            continue
        results[name] = {"fused": ranker.rank_metrics(mined[name], None), "learned": ranker.rank_metrics(mined[name], rk.scores)}
        for order, m in results[name].items():
            metrics.update({f"ranker_{name}_{order}_{k}": v for k, v in m.items()})
        for src, qs in sorted(ranker.by_source(mined[name]).items()):
            metrics[f"ranker_{name}_learned_src_mrr_{src}"] = ranker.rank_metrics(qs, rk.scores)["src_mrr"]
            metrics[f"ranker_{name}_fused_src_mrr_{src}"] = ranker.rank_metrics(qs, None)["src_mrr"]
    return rk, metrics, ranker.metrics_table(results)


def _span_f1(model: Any, rows: list, threshold: float) -> float:
    ex = SpanExtractor(model, threshold)
    return spans.span_metrics(rows, lambda m: ex.keep_positions(m.text(), m.role))["char_f1"]


def train_spans(ctx: Any, seed: int = 0) -> tuple[SpanExtractor | None, dict[str, float]]:
    """Fit the key-span extractor on the train split and pick its threshold by dev character F1.

    Returns ``(extractor or None when no row has key spans, metrics)``; metrics are
    ``spans_<dev|test>_<learned|rules>_<metric>[_<source>]`` and ``spans_threshold``.
    """
    rows = spans.training_rows(ctx.splits["train"])
    if not rows:
        return None, {}
    model = spans.fit(rows, seed=seed)
    dev_rows = spans.gold_rows(ctx.splits["dev"])
    best = SPAN_THRESHOLD if not dev_rows else max(SPAN_THRESHOLDS, key=lambda t: _span_f1(model, dev_rows, t))
    ex = SpanExtractor(model, threshold=best)
    metrics: dict[str, float] = {"spans_threshold": float(best), "spans_train_rows": float(len(rows))}
    for name in ("dev", "test"):
        metrics.update({f"spans_{name}_{k}": v for k, v in spans.evaluate(ex, ctx.splits[name]).items()})
    return ex, metrics
