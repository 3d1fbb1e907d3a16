"""Batch evaluation and embedding on Ray (extra ``scale``): the same figures and vectors as the
local engine, from the library, ``python -m eval run --engine ray`` and ``training.embed_cache``.
A local two-worker Ray cluster is started once for the module."""

from __future__ import annotations

import functools
import json
import os
import weakref
from pathlib import Path

import numpy as np
import pytest
from _servers import in_ci

from ctxscore.errors import ConfigError
from eval.budgets import parse_budgets
from eval.cli import main
from eval.models import resolve_learned
from eval.runner import EvalConfig, run_eval
from eval.sessions import load_sessions
from training.engine import LocalEngine, make_engine

FIX = Path(__file__).parent / "fixtures"
MINI = FIX / "eval_sessions_mini.jsonl"
BUNDLED = Path(__file__).resolve().parents[1] / "data" / "bundled" / "sessions.jsonl"
#: Result keys that are timings (they differ between any two runs, on any engine).
TIMING = ("ms", "runtime")


def _figures(results: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not any(t in k for t in TIMING)} for r in results]


@pytest.fixture(scope="module")
def ray_engine():
    try:
        import ray  # noqa: F401
    except ImportError:
        if in_ci():
            pytest.fail("Ray is not installed (pip install '.[scale]'); CI=true needs it", pytrace=False)
        pytest.skip("Ray is not installed (pip install '.[scale]')")
    import sys

    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test module
    engine = make_engine("ray", workers=2)
    yield engine
    engine.close()


def test_engine_arguments():
    with pytest.raises(ConfigError, match="unknown engine"):
        make_engine("spark")
    with pytest.raises(ConfigError, match="--address needs --engine ray"):
        make_engine("local", address="ray://x:10001")
    assert LocalEngine().map(lambda state, x: (state, x * 2), [1, 2, 3], setup=lambda: "s") == [("s", 2), ("s", 4), ("s", 6)]


def _square(state: int, x: int) -> int:
    return state + x * x


def _offset() -> int:
    return 1000


def test_ray_map_keeps_order_and_makes_state_once_per_worker(ray_engine):
    assert ray_engine.workers == 2
    assert ray_engine.map(_square, list(range(50)), setup=_offset) == [1000 + x * x for x in range(50)]
    assert ray_engine.map(_square, [], setup=_offset) == []


class _Held:
    """A worker's state whose finalizer marks the folder ``marks`` (as a registered scorer's removes
    its download folder)."""


def _held(marks: str) -> _Held:
    state = _Held()
    weakref.finalize(state, (Path(marks) / str(os.getpid())).touch)
    return state


def _pid(state: _Held, x: int) -> int:
    return os.getpid()


def test_release_lets_each_worker_drop_its_state(ray_engine, tmp_path):
    """ray.kill runs no finalizer, so the workers drop their state first: a registered scorer's
    download folder (``eval.models.load_version``) went with it only then."""
    pids = set(ray_engine.map(_pid, list(range(8)), setup=functools.partial(_held, str(tmp_path))))
    assert len(pids) == 2 and not any(tmp_path.iterdir())
    ray_engine.release()
    assert {p.name for p in tmp_path.iterdir()} == {str(p) for p in pids}


def test_evaluation_on_ray_gives_the_local_figures(ray_engine):
    sessions = load_sessions(BUNDLED, 4)
    scorer, model, _ = resolve_learned("default", use_mlflow=False)
    if scorer is None:
        pytest.skip("the packaged scorer's embedder package is not installed")
    cfg = EvalConfig(budgets=parse_budgets([0.25], [2000], 400), probe_every=8, learned_scorer=scorer, model=model)
    local = run_eval(sessions, cfg)
    ray = run_eval(sessions, cfg, engine=ray_engine)
    assert ray.summary["run"]["engine"] == "ray, 2 workers" and local.summary["run"]["engine"] == "local, 1 worker"
    assert {r["policy"] for r in ray.summary["results"]} == {"full", "sliding_turns", "trim_messages", "rules", "learned"}
    assert _figures(ray.summary["results"]) == _figures(local.summary["results"])
    assert ray.misses == local.misses and ray.summary["retention"] == local.summary["retention"]
    assert ray.summary["run"]["learned_scoring_ms"] > 0


def test_eval_cli_with_ray(ray_engine, tmp_path, capsys):
    ray_engine.release()  # the command starts workers of its own on the running cluster
    outs = {}
    for engine in ("local", "ray"):
        out = tmp_path / engine
        extra = ["--engine", "ray", "--workers", "2"] if engine == "ray" else []
        assert main(["run", "--sessions", str(MINI), "--budget", "0.25", "--budget-tokens", "400", "--policies",
                     "full,trim_messages,rules", "--probe-every", "4", "--out", str(out), "--no-mlflow",
                     "--no-feedback", "--quiet", *extra]) == 0
        outs[engine] = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    assert _figures(outs["ray"]["results"]) == _figures(outs["local"]["results"])
    assert main(["run", "--sessions", str(MINI), "--address", "x:1", "--no-mlflow", "--out", str(tmp_path / "e")]) == 2
    assert "--address needs --engine ray" in capsys.readouterr().err


def test_embeddings_on_ray_are_the_local_vectors(ray_engine, tmp_path):
    from ctxscore.scoring.embedders import embedder_available, get_embedder
    from training.embed_cache import EngineEmbedder

    model_id = "use" if embedder_available("use") else "hashing-64"
    texts = [f"message {i}: book a table for {i % 7 + 1} at {i % 12 + 1}pm, 订单号 {i:05d}" for i in range(300)]
    local = get_embedder(model_id, shared=False).embed(texts)
    remote = EngineEmbedder(model_id, ray_engine, chunk_batches=1).embed(texts)
    assert remote.shape == local.shape and remote.dtype == np.float32
    assert np.array_equal(remote, local)
