"""On-disk embedding cache for training and evaluation (``data/cache/embeddings/``, git-ignored).

Wraps :func:`ctxscore.embedders.get_embedder` in :class:`ctxscore.embedders.CachedEmbedder`: one
SQLite file, rows keyed by ``(model id + truncation, sha256 of the text)``, so re-runs embed only
texts they have not seen. Also a small command line to fill the cache ahead of a sweep::

    python -m training.embed_cache --embedder use --embedder minilm   # texts of data/processed/dataset
    python -m training.embed_cache --engine ray --workers 2           # the same vectors, embedded on Ray
"""

from __future__ import annotations

import argparse
import functools
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ctxscore.scoring.embedders import CachedEmbedder, get_embedder, resolve_model_id

from .engine import Engine, make_engine
from .paths import CACHE_DIR as DEFAULT_CACHE_DIR

#: Environment variable overriding the cache folder.
CACHE_ENV = "CTXSCORE_EMBED_CACHE"


def cache_path(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The SQLite cache file: ``cache_dir`` or ``$CTXSCORE_EMBED_CACHE`` or ``data/cache/embeddings``."""
    d = Path(cache_dir or os.environ.get(CACHE_ENV) or DEFAULT_CACHE_DIR)
    return d / "embeddings.sqlite"


def cached_embedder(model_id: str, cache_dir: str | os.PathLike[str] | None = None, **kwargs) -> CachedEmbedder:
    """The embedder for ``model_id`` (or alias ``use``/``minilm``/``e5``) behind the on-disk cache.

    Keyword arguments go to :func:`ctxscore.embedders.get_embedder` (for example ``max_chars``).
    """
    return CachedEmbedder(get_embedder(resolve_model_id(model_id), **kwargs), cache_path(cache_dir))


class EngineEmbedder:
    """An embedder whose texts are embedded on an engine's workers (:mod:`training.engine`), each
    worker loading the model once; the vectors are those of the model itself (chunks are whole
    batches of ``batch_size``, so every batch the model sees is the one it sees locally).

    Args:
        model_id: model id or alias.
        engine: the engine (``make_engine("ray", workers=2)``).
        chunk_batches: batches per chunk sent to a worker.
        kwargs: keyword arguments of :func:`ctxscore.scoring.embedders.get_embedder`.
    """

    def __init__(self, model_id: str, engine: Engine, *, chunk_batches: int = 4, **kwargs: Any) -> None:
        self.local = get_embedder(resolve_model_id(model_id), shared=False, **kwargs)  # not loaded: ids and sizes
        self.model_id, self.dim, self.prepare = self.local.model_id, self.local.dim, self.local.prepare
        self.engine = engine
        self.chunk = max(1, chunk_batches) * self.local.batch_size
        self._setup = functools.partial(_worker_embedder, self.model_id, tuple(sorted(kwargs.items())))

    def embed(self, texts: Sequence[str], *, progress: bool = False) -> np.ndarray:
        """``(len(texts), dim)`` float32, rows L2-normalised, in the order of ``texts``."""
        items = list(texts)
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        chunks = [items[s:s + self.chunk] for s in range(0, len(items), self.chunk)]
        return np.concatenate(self.engine.map(_embed_chunk, chunks, self._setup)).astype(np.float32, copy=False)


def _worker_embedder(model_id: str, kwargs: tuple[tuple[str, Any], ...]) -> Any:
    return get_embedder(model_id, shared=False, memo_size=0, **dict(kwargs))


def _embed_chunk(embedder: Any, texts: list[str]) -> np.ndarray:
    return embedder.embed(texts)


def main(argv: Sequence[str] | None = None) -> int:
    """Fill the cache for the dataset's texts with one or more embedders."""
    ap = argparse.ArgumentParser(prog="python -m training.embed_cache", description=__doc__.split("\n\n")[0])
    ap.add_argument("--embedder", action="append", default=None, help="model id or alias (repeatable; default: use)")
    ap.add_argument("--dataset", default=None, help="dataset folder (default: data/processed/dataset)")
    ap.add_argument("--cache-dir", default=None, help="cache folder (default: data/cache/embeddings)")
    ap.add_argument("--engine", choices=("local", "ray"), default="local",
                    help="embed in this process (default) or on Ray (extra scale); the vectors are the same")
    ap.add_argument("--address", default=None, help="Ray cluster address for --engine ray (default: a local cluster)")
    ap.add_argument("--workers", type=int, default=None, help="Ray workers for --engine ray (default: the CPUs)")
    args = ap.parse_args(argv)
    from .data import load_dataset_dict  # local import: needs the train extra (datasets)

    ds = load_dataset_dict(args.dataset)
    texts = sorted({t for split in ds.values() for t in split["text"]})
    with make_engine(args.engine, args.address, args.workers) as engine:
        for model_id in args.embedder or ["use"]:
            if args.engine == "local":
                emb = cached_embedder(model_id, args.cache_dir)
            else:
                emb = CachedEmbedder(EngineEmbedder(model_id, engine), cache_path(args.cache_dir), chunk_size=4096)
            t0 = time.perf_counter()
            emb.embed(texts, progress=True)
            print(f"{emb.model_id}: {len(texts)} texts, {emb.misses} embedded, {emb.hits} cached, "
                  f"{time.perf_counter() - t0:.1f} s ({engine.describe()}) -> {emb.path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
