"""On-disk embedding cache for training and evaluation (``data/cache/embeddings/``, git-ignored).

Wraps :func:`ctxscore.embedders.get_embedder` in :class:`ctxscore.embedders.CachedEmbedder`: one
SQLite file, rows keyed by ``(model id + truncation, sha256 of the text)``, so re-runs embed only
texts they have not seen. Also a small command line to fill the cache ahead of a sweep::

    python -m training.embed_cache --embedder use --embedder minilm   # texts of data/processed/dataset
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from pathlib import Path

from ctxscore.scoring.embedders import CachedEmbedder, get_embedder, resolve_model_id

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


def main(argv: Sequence[str] | None = None) -> int:
    """Fill the cache for the dataset's texts with one or more embedders."""
    ap = argparse.ArgumentParser(prog="python -m training.embed_cache", description=__doc__.split("\n\n")[0])
    ap.add_argument("--embedder", action="append", default=None, help="model id or alias (repeatable; default: use)")
    ap.add_argument("--dataset", default=None, help="dataset folder (default: data/processed/dataset)")
    ap.add_argument("--cache-dir", default=None, help="cache folder (default: data/cache/embeddings)")
    args = ap.parse_args(argv)
    from .data import load_dataset_dict  # local import: needs the train extra (datasets)

    ds = load_dataset_dict(args.dataset)
    texts = sorted({t for split in ds.values() for t in split["text"]})
    for model_id in args.embedder or ["use"]:
        emb = cached_embedder(model_id, args.cache_dir)
        t0 = time.perf_counter()
        emb.embed(texts, progress=True)
        print(f"{emb.model_id}: {len(texts)} texts, {emb.misses} embedded, {emb.hits} cached, "
              f"{time.perf_counter() - t0:.1f} s -> {emb.path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
