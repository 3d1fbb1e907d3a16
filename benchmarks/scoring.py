"""Benchmark the learned scorer: single-message latency and batch throughput per embedder.

    python benchmarks/scoring.py                 # every installed embedder, 200 messages
    python benchmarks/scoring.py --embedder use --n 500 --json out/bench_scoring.json

Messages: the distilled-label messages of the processed data (``data/processed/sessions.jsonl.gz``
filtered to ``labels/distilled.jsonl``) when the corpora are there, else the bundled set
(``data/bundled/sessions.jsonl``). For each embedder the scorer is the packaged one that uses it
(``--model DIR``, or the shipped default) or, when none exists, heads fitted on the first half of
the messages (timing only depends on the feature layout, not on what the heads learned).

Figures: ``single p50 / p95`` is ``LearnedScorer.predict([message])`` wall time in ms including
the embedding (in-memory memo cleared before each call, so every call embeds); ``batch msg/s`` is
one ``predict(messages)`` call over all messages (memo cleared). Target on the 2-core machine:
p95 <= 20 ms for the default embedder.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: import the checkout's packages

from ctxscore.io import iter_jsonl  # noqa: E402
from ctxscore.messages import Message  # noqa: E402
from ctxscore.scoring.embedders import EMBEDDERS, embedder_available, get_embedder, resolve_model_id  # noqa: E402
from ctxscore.scoring.learned import LearnedScorer  # noqa: E402
from ctxscore.scoring.package import DEFAULT_MODEL_DIR  # noqa: E402
from training.paths import DEFAULT_BUNDLED, DEFAULT_OUT, corpora_root  # noqa: E402


def load_messages(limit: int) -> tuple[list[Message], list[str], str]:
    """(messages, gold categories, description of the sample)."""
    labels_file = corpora_root() / "labels" / "distilled.jsonl"
    sessions = DEFAULT_OUT / "sessions.jsonl.gz"
    rng = np.random.default_rng(0)
    if labels_file.is_file() and sessions.is_file():
        gold = {r["id"]: r["category"] for _, r in iter_jsonl(labels_file)}
        msgs, cats = [], []
        for _, s in iter_jsonl(sessions):
            for m in s["messages"]:
                if m["id"] in gold:
                    msgs.append(Message(role=m["role"], content=m.get("content") or "", id=m["id"], turn=m["index"],
                                        name=m.get("name"), tool_calls=m.get("tool_calls") or None))
                    cats.append(gold[m["id"]])
        where = "distilled-label messages (corpora)"
    else:
        msgs, cats = [], []
        for _, s in iter_jsonl(DEFAULT_BUNDLED):
            for i, m in enumerate(s["messages"]):
                label = m.get("label") or {}  # the bundled set's gold label (training/data/sources/bundled.py)
                if label.get("category"):
                    msgs.append(Message(role=m["role"], content=m.get("content") or "", turn=i, name=m.get("name"),
                                        tool_calls=m.get("tool_calls") or None))
                    cats.append(label["category"])
        where = "bundled set"
    idx = rng.permutation(len(msgs))[:limit]
    return [msgs[i] for i in idx], [cats[i] for i in idx], where


def scorer_for(model_id: str, models: list[Path], msgs: list[Message], cats: list[str]) -> tuple[LearnedScorer, str]:
    for folder in [*models, DEFAULT_MODEL_DIR]:
        cfg = folder / "config.json"
        if cfg.is_file() and json.loads(cfg.read_text())["embedder"]["model_id"] == model_id:
            return LearnedScorer.from_pretrained(folder), str(folder)
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from ctxscore.scoring.features import FeatureSpec
    from ctxscore.scoring.rules import RuleClassifier

    emb = get_embedder(model_id)
    spec = FeatureSpec(embedder_id=model_id, embed_dim=emb.dim, signal_names=RuleClassifier.signal_names,
                       max_chars=emb.max_chars, head_chars=emb.head_chars, lexical_dim=1024)
    clf = make_pipeline(StandardScaler(), LogisticRegression(C=0.01, max_iter=500))
    reg = make_pipeline(StandardScaler(), Ridge())
    s = LearnedScorer(clf, reg, spec, rules=RuleClassifier(), embedder=emb)
    half = len(msgs) // 2
    X = s.features(msgs[:half])
    clf.fit(X, cats[:half])
    reg.fit(X, np.linspace(0, 1, half))
    return s, "heads fitted on the sample (timing only)"


def bench(scorer: LearnedScorer, msgs: list[Message]) -> dict[str, float]:
    memo = getattr(scorer.embedder, "_memo", None)
    t0 = time.perf_counter()
    scorer.predict([Message(role="user", content="load the model", turn=0)])
    load_s = time.perf_counter() - t0
    times = []
    for m in msgs:
        if memo is not None:
            memo.clear()
        t = time.perf_counter()
        scorer.predict([m])
        times.append((time.perf_counter() - t) * 1000)
    if memo is not None:
        memo.clear()
    t = time.perf_counter()
    scorer.predict(msgs)
    batch_s = time.perf_counter() - t
    lengths = [len(m.text()) for m in msgs]
    return {"n": len(msgs), "load_s": load_s, "p50_ms": float(np.percentile(times, 50)),
            "p95_ms": float(np.percentile(times, 95)), "max_ms": float(np.max(times)),
            "batch_msgs_per_s": len(msgs) / batch_s, "median_chars": float(np.median(lengths))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--embedder", action="append", help="use | minilm | e5 (repeatable; default: all installed)")
    ap.add_argument("--model", action="append", default=[], help="packaged scorer folder(s) to benchmark")
    ap.add_argument("--n", type=int, default=200, help="messages to time")
    ap.add_argument("--json", default=None, help="also write the figures as JSON to this file")
    args = ap.parse_args(argv)
    ids = [resolve_model_id(e) for e in (args.embedder or list(EMBEDDERS))]
    msgs, cats, where = load_messages(args.n * 2)
    timed = msgs[:args.n]
    print(f"{len(timed)} messages from the {where}; {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs")
    rows = []
    for model_id in ids:
        if not embedder_available(model_id):
            print(f"skip {model_id}: its package is not installed")
            continue
        scorer, origin = scorer_for(model_id, [Path(m) for m in args.model], msgs, cats)
        r = {"embedder": model_id, "scorer": origin, **bench(scorer, timed)}
        rows.append(r)
        print(f"{model_id}: p50 {r['p50_ms']:.1f} ms, p95 {r['p95_ms']:.1f} ms, max {r['max_ms']:.0f} ms, "
              f"batch {r['batch_msgs_per_s']:.0f} msg/s, load {r['load_s']:.1f} s ({origin})", flush=True)
    print("\n| embedder | single p50 ms | single p95 ms | batch msg/s | model load s |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['embedder']} | {r['p50_ms']:.1f} | {r['p95_ms']:.1f} | {r['batch_msgs_per_s']:.0f} | {r['load_s']:.1f} |")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"sample": where, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
