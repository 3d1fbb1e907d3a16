"""Throughput of batch evaluation and embedding on the local engine and on Ray with 1 and 2 workers,
and the check that every engine gives the same results.

- evaluation: ``eval.runner.run_eval`` on the first ``--sessions`` held-out sessions
  (``data/processed/eval_sessions.jsonl``, else the bundled sessions) with every policy (the
  learned one with the shipped scorer) at two budgets; sessions per second, CPU seconds per session,
  and the figures compared with the local engine's (timings aside);
- embedding: ``training.embed_cache.EngineEmbedder`` over ``--texts`` distinct dataset texts with the
  default embedder; texts per second, vectors compared bit for bit.

Ray's start-up (a local cluster) is reported apart and not counted in the throughput.

Usage: ``python benchmarks/engines.py [--sessions 8] [--texts 2000] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: import the checkout's packages

import numpy as np  # noqa: E402

from eval.budgets import parse_budgets  # noqa: E402
from eval.models import resolve_learned  # noqa: E402
from eval.runner import EvalConfig, _worker_setup, replay_session, run_eval  # noqa: E402
from eval.sessions import load_sessions  # noqa: E402
from training.engine import Engine, LocalEngine, make_engine  # noqa: E402
from training.paths import DEFAULT_BUNDLED, DEFAULT_OUT  # noqa: E402

TIMING = ("ms", "runtime")


def figures(results: list[dict]) -> list[dict]:
    """Result entries without their timing keys."""
    return [{k: v for k, v in r.items() if not any(t in k for t in TIMING)} for r in results]


def rss_mb(_state: Any, _item: Any) -> float:
    """Peak resident memory of the process that runs it (MB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def time_eval(sessions: list, cfg: EvalConfig, engine: Engine) -> tuple[float, dict[str, Any]]:
    """Run the evaluation on ``engine``; returns (wall seconds, the run summary)."""
    t0 = time.perf_counter()
    res = run_eval(sessions, cfg, engine=engine)
    return time.perf_counter() - t0, res.summary


def warm_rate(sessions: list, cfg: EvalConfig, engine: Engine) -> float:
    """Sessions per second of the replay alone on workers already started (each has loaded the
    scorer and replayed one session before the timing), without run_eval's aggregation."""
    policies = [p for p in cfg.policies if p != "learned" or cfg.learned_scorer is not None]
    setup = _worker_setup(cfg, policies, engine)
    list(engine.imap(replay_session, sessions[: engine.workers], setup))  # start the workers
    t0 = time.perf_counter()
    list(engine.imap(replay_session, sessions, setup))
    return len(sessions) / (time.perf_counter() - t0)


def eval_part(args: argparse.Namespace) -> dict[str, Any]:
    """Evaluation throughput on the local engine and on Ray with 1 and 2 workers, and the identity check."""
    path = DEFAULT_OUT / "eval_sessions.jsonl"
    sessions = load_sessions(path if path.is_file() else DEFAULT_BUNDLED, args.sessions)
    scorer, model, skip = resolve_learned("default", use_mlflow=False)
    cfg = EvalConfig(budgets=parse_budgets([0.25], [4000], 1000), probe_every=10, learned_scorer=scorer, model=model,
                     learned_skip_reason=skip)
    c0 = time.process_time()
    local_s, local = time_eval(sessions, cfg, LocalEngine())
    cpu = time.process_time() - c0
    out: dict[str, Any] = {"sessions": len(sessions), "messages": sum(len(s.messages) for s in sessions),
                           "policies": local["run"]["policies"], "local_s": round(local_s, 1),
                           "local_sessions_per_s": round(len(sessions) / local_s, 3),
                           "cpu_s_per_session": round(cpu / len(sessions), 2)}
    for w in (1, 2):
        t0 = time.perf_counter()
        engine = make_engine("ray", workers=w)
        out[f"ray{w}_startup_s"] = round(time.perf_counter() - t0, 1)
        wall, got = time_eval(sessions, cfg, engine)
        out[f"ray{w}_s"] = round(wall, 1)
        out[f"ray{w}_sessions_per_s"] = round(len(sessions) / wall, 3)
        out[f"ray{w}_identical"] = figures(got["results"]) == figures(local["results"])
        out[f"ray{w}_warm_sessions_per_s"] = round(warm_rate(sessions, cfg, engine), 3)
        out[f"ray{w}_worker_rss_mb"] = round(max(engine.map(rss_mb, [0] * w)), 0) if w else None
        engine.close()
    return out


def embed_part(args: argparse.Namespace) -> dict[str, Any]:
    """Embedding throughput on the local engine and on Ray with 1 and 2 workers, vectors compared bit for bit."""
    from ctxscore.scoring.embedders import embedder_available, get_embedder
    from training.data import load_dataset_dict
    from training.embed_cache import EngineEmbedder

    model_id = "use" if embedder_available("use") else "hashing-256"
    try:
        ds = load_dataset_dict()
        texts = sorted({t for split in ds.values() for t in split["text"]})[: args.texts]
    except FileNotFoundError:
        texts = [m["content"] for line in DEFAULT_BUNDLED.read_text(encoding="utf-8").splitlines()
                 for m in json.loads(line)["messages"] if m.get("content")][: args.texts]
    local = get_embedder(model_id, shared=False, memo_size=0)  # a memo would change the batches the model sees
    local.embed(texts[:8])  # load the model before timing
    t0 = time.perf_counter()
    want = local.embed(texts)
    local_s = time.perf_counter() - t0
    out: dict[str, Any] = {"model": local.model_id, "texts": len(texts), "local_texts_per_s": round(len(texts) / local_s, 1)}
    for w in (1, 2):
        engine = make_engine("ray", workers=w)
        emb = EngineEmbedder(model_id, engine)
        emb.embed(texts[: emb.chunk * w])  # start the workers and load the model in each
        t0 = time.perf_counter()
        got = emb.embed(texts)
        out[f"ray{w}_texts_per_s"] = round(len(texts) / (time.perf_counter() - t0), 1)
        out[f"ray{w}_identical"] = bool(np.array_equal(got, want))
        engine.close()
    return out


def main() -> int:
    """Run both parts and print the figures (JSON); exit status 1 when an engine gave other results."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=8, help="evaluation sessions (default 8)")
    ap.add_argument("--texts", type=int, default=2000, help="texts to embed (default 2000)")
    ap.add_argument("--skip-embed", action="store_true", help="only the evaluation")
    ap.add_argument("--skip-eval", action="store_true", help="only the embedding")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    out: dict[str, Any] = {"cores": os.cpu_count(), "load_average": round(os.getloadavg()[0], 2)}
    if not args.skip_eval:
        out["eval"] = eval_part(args)
    if not args.skip_embed:
        out["embed"] = embed_part(args)
    out["load_average_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    return 0 if all(v for part in ("eval", "embed") for k, v in out.get(part, {}).items() if k.endswith("identical")) else 1


if __name__ == "__main__":
    sys.exit(main())
