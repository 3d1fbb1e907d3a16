"""A session's search index in memory: the ranked lists of every store, computed in Python.

A store keeps many sessions but searches one at a time. :class:`SessionIndex` holds what ranking
one session needs -- per message its case-folded indexed text and context, its stems, its
embedding -- and computes the ranked lists that SQLite's FTS5 indexes computed (the same float
operations in the same order as FTS5's ``bm25()``; ``tests/test_store.py`` compares them), so every
store (:class:`~ctxscore.store.sqlite.SQLiteStore`, :class:`~ctxscore.store.postgres.PostgresStore`)
returns the same hits:

- ``keyword``: terms of 3+ characters as case-folded substrings (FTS5's trigram tokenizer; a
  query with no such term has its two-character Chinese words instead,
  :func:`~ctxscore.store.retrieval.keyword_terms`), ranked by FTS5's bm25
  (:data:`~ctxscore.store.retrieval.BM25_K1`, ``BM25_B``): per term the
  occurrences in the text (overlapping) count 1 and those in the context
  :data:`~ctxscore.store.retrieval.CONTEXT_WEIGHT`, document length = trigrams of text + context;
- ``stem``: the Porter stems of the query's words in the stems of the text and context
  (:mod:`ctxscore.store.stemming`), the same bm25 with the token count as length;
- ``short``: each two-character term as an ASCII-case-insensitive substring of the full text
  (SQLite's ``LIKE``), newest first;
- ``exact``: the messages whose text holds a rare code of the query (a keyword term holding a
  digit, in the text of at most :data:`~ctxscore.store.retrieval.EXACT_MAX_ROWS` messages), ranked
  by the keyword list's bm25 over those codes;
- ``vector``: dot products with the query embedding (:func:`~ctxscore.store.retrieval.vector_ranking`).

The bm25 statistics (rows, average length, rows holding a term) are the session's, so other
sessions of a file or database never change a session's ranking (``tests/test_store_contract.py``).
The index grows by :meth:`SessionIndex.extend` (rows in insertion order); a store rebuilds it when
messages leave the session (detach).
"""

from __future__ import annotations

import bisect
import math
import threading
from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .retrieval import (
    BM25_B,
    BM25_K1,
    CONTEXT_WEIGHT,
    EXACT_MAX_ROWS,
    RankedList,
    code_terms,
    keyword_terms,
    trigram_tokens,
    vector_ranking,
)
from .stemming import stem_index

#: Keyword terms whose row counts a :class:`SessionIndex` keeps (least recently used dropped first),
#: and the rows they may hold in all (a common term of a long session holds most of its rows).
TERMS_CACHED = 2048
TERM_ROWS_CACHED = 50_000
# A cached term behind by more rows than this has the rows added since counted in one scan of the
# joined texts (from the first of them); fewer are counted one row at a time.
_RESCAN_ROWS = 32

_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


@dataclass(slots=True)
class IndexedMessage:
    """One message of a :class:`SessionIndex`.

    Attributes:
        id, turn: the message id and turn.
        snippet: the first 120 characters of its text.
        text_folded: the part of its text the keyword list counts a term in, lower-cased (``keyword_text``).
        context_folded: its index context, lower-cased.
        ntok: document length of the keyword list (trigrams of indexed text + context).
        ascii_text: its whole text with ASCII letters lower-cased (the short-term list), or ``None``
            for a store that answers two-character terms itself (SQLite's ``LIKE``).
        stems, stems_ctx: counts of the stems of text and context that a query can match;
            :meth:`SessionIndex.extend` moves them into its postings and leaves ``None``.
        stem_ntok: document length of the stem list (tokens of text + context).
        embedding: its ``(dim,)`` float32 embedding, or ``None``.
    """

    id: str
    turn: int
    snippet: str
    text_folded: str
    context_folded: str
    ntok: int
    ascii_text: str | None
    stems: Counter[str] | None
    stems_ctx: Counter[str] | None
    stem_ntok: int
    embedding: np.ndarray | None


def index_fields(indexed: str, context: str) -> tuple[int, list[str], list[str], int]:
    """What ranking needs of a message, from its indexed text and its context: ``(keyword document
    length (trigrams), stems of the text, stems of the context, stem document length (tokens))``;
    every store derives it here (PostgreSQL when it writes a row, SQLite when it reads one)."""
    stems, n_text = stem_index(indexed)
    stems_ctx, n_ctx = stem_index(context)
    return trigram_tokens(indexed) + trigram_tokens(context), stems, stems_ctx, n_text + n_ctx


def indexed_message(mid: str, turn: int, text: str, indexed: str, context: str, ntok: int, stems: Sequence[str],
                    stems_ctx: Sequence[str], stem_ntok: int, embedding: np.ndarray | None, *,
                    short_terms: bool = True) -> IndexedMessage:
    """An :class:`IndexedMessage` from a stored row (``indexed``: the part of the text the keyword
    list counts terms in, up to 64 KB of it; ``ntok`` and the stems come from the head and tail of a
    long one); ``short_terms=False`` keeps no other copy of the text (the store answers two-character
    terms)."""
    return IndexedMessage(mid, turn, text[:120], indexed.lower(), context.lower(), ntok,
                          text.translate(_ASCII_LOWER) if short_terms else None,
                          Counter(stems), Counter(stems_ctx), stem_ntok, embedding)


def _starts(parts: Sequence[str]) -> list[int]:
    """Start offset of each part in ``"\\x00".join(parts)``."""
    out, pos = [], 0
    for p in parts:
        out.append(pos)
        pos += len(p) + 1
    return out


def _self_overlapping(term: str) -> bool:
    """True when two occurrences of ``term`` can overlap (a proper prefix equals a suffix)."""
    return any(term[:k] == term[-k:] for k in range(1, len(term)))


def _row_counts(joined: str, starts: list[int], parts: Sequence[str], term: str, first: int = 0) -> dict[int, int]:
    """Overlapping occurrences of ``term`` per row of ``joined`` (``parts`` joined by NUL), in the rows
    from ``first`` on (a row of ``starts``): one scan from row to row, each row holding the term counted at C speed."""
    counts: dict[int, int] = {}
    overlap = _self_overlapping(term)
    find, n_rows, i = joined.find, len(starts), joined.find(term, starts[first])
    while i >= 0:
        r = bisect.bisect_right(starts, i) - 1
        counts[r] = _count(parts[r], term, overlap)
        if r + 1 >= n_rows:
            break
        i = find(term, starts[r + 1])
    return counts


def _count(text: str, term: str, overlap: bool) -> int:
    """Occurrences of ``term`` in ``text``, overlapping ones included when ``overlap`` (the term's
    :func:`_self_overlapping`; what :func:`_row_counts` counts)."""
    if not overlap:
        return text.count(term)
    n, j = 0, text.find(term)
    while j >= 0:
        n += 1
        j = text.find(term, j + 1)
    return n


def _freq(in_text: int, in_context: int) -> float:
    """FTS5's phrase frequency: 1.0 per instance in the text, then the context weight per instance
    in the context, added one instance at a time (the order FTS5 adds them in)."""
    f = 0.0
    for _ in range(in_text):
        f += 1.0
    for _ in range(in_context):
        f += CONTEXT_WEIGHT
    return f


def bm25(freqs: Sequence[dict[int, float]], lengths: Sequence[int], turns: Sequence[int], limit: int) -> list[int]:
    """FTS5's bm25 ranking: indexes of the rows with a term, best first (ties: the earlier turn).

    The same float operations as FTS5's ``bm25()``, in the same order (the terms' contributions
    added one term after another, in query order), vectorised over the rows.

    Args:
        freqs: per term (phrase) of the query, in query order, the frequency in each row holding it
            (row index -> frequency > 0).
        lengths: per row of the session, its document length.
        turns: per row, its turn (the tie-break).
        limit: rows returned (at most).
    """
    n_rows = len(lengths)
    if not n_rows or not any(freqs):
        return []
    avgdl = float(sum(lengths)) / float(n_rows)
    norm = BM25_K1 * (1 - BM25_B + BM25_B * np.asarray(lengths, dtype=np.float64) / avgdl)
    score = np.zeros(n_rows, dtype=np.float64)
    hit = np.zeros(n_rows, dtype=bool)
    for f in freqs:
        if not f:
            continue
        v = math.log((n_rows - len(f) + 0.5) / (len(f) + 0.5))
        idf = v if v > 0.0 else 1e-6
        rows = np.fromiter(f.keys(), dtype=np.int64, count=len(f))
        x = np.fromiter(f.values(), dtype=np.float64, count=len(f))
        score[rows] += idf * ((x * (BM25_K1 + 1.0)) / (x + norm[rows]))
        hit[rows] = True
    rows = np.flatnonzero(hit)
    order = np.lexsort((np.asarray(turns, dtype=np.int64)[rows], -score[rows]))
    return rows[order[:limit]].tolist()


class SessionIndex:
    """The search index of one session, in memory (see the module docstring).

    Attributes:
        messages: the indexed messages, in insertion order.
        lock: held by a store while it extends the index or ranks with it (threads share stores;
            the SQLite store holds its own lock instead, around every operation).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Empty the index (the store reads the session again)."""
        #: The store's marks: the epoch of the session it was read at and the last row read.
        self.epoch: int | None = None
        self.seen = 0
        self.messages: list[IndexedMessage] = []
        self._textless = False  # a message without its whole text (no short-term list)
        self._matrix: np.ndarray | None = None
        self._matrix_ids: list[str] = []
        self._by_id: dict[str, IndexedMessage] = {}
        self._postings: dict[str, dict[int, float]] = {}  # stem -> row -> frequency
        self._ntok: list[int] = []
        self._stem_ntok: list[int] = []
        self._turns: list[int] = []
        self._joined_cache: tuple[str, list[int], str, list[int]] | None = None
        self._texts: list[str] = []
        self._ctxs: list[str] = []
        # keyword term -> (rows counted, row -> phrase frequency): a term of an earlier query is
        # counted again only in the rows added since (the session's queries repeat their words)
        self._term_freqs: OrderedDict[str, tuple[int, dict[int, float]]] = OrderedDict()
        self._term_rows = 0  # rows held by the cached terms

    def extend(self, messages: Iterable[IndexedMessage]) -> None:
        """Add messages (in insertion order). Their stems move into the index's postings (the
        messages keep ``None``), so a message joins one index only.

        Raises:
            ValueError: a message was already added to an index (build a new one per index).
        """
        for m in messages:
            if m.stems is None or m.stems_ctx is None:
                raise ValueError(f"message {m.id!r} is already in an index; build a new IndexedMessage for this one")
            r = len(self.messages)
            self.messages.append(m)
            self._ntok.append(m.ntok)
            self._stem_ntok.append(m.stem_ntok)
            self._turns.append(m.turn)
            self._textless |= m.ascii_text is None
            stems, ctx = m.stems, m.stems_ctx
            for stem in stems.keys() | ctx.keys():
                self._postings.setdefault(stem, {})[r] = _freq(stems.get(stem, 0), ctx.get(stem, 0))
            m.stems = m.stems_ctx = None  # in the postings now
        self._matrix = None
        self._joined_cache = None

    def _joined(self) -> tuple[str, list[int], str, list[int]]:
        """The session's folded texts and contexts joined by NUL (no term holds one) with each
        row's start offset, so a term is found in all rows by one C-level scan."""
        if self._joined_cache is None:
            texts = self._texts = [m.text_folded for m in self.messages]
            ctxs = self._ctxs = [m.context_folded for m in self.messages]
            self._joined_cache = ("\x00".join(texts), _starts(texts), "\x00".join(ctxs), _starts(ctxs))
        return self._joined_cache

    def lexical(self, fts_terms: Sequence[str], stems: Sequence[str], short_terms: Sequence[str],
                limit: int, *, short_lists: bool = True) -> list[RankedList]:
        """The lexical ranked lists of a query, in the order every store fuses them: ``keyword``
        (over :func:`~ctxscore.store.retrieval.keyword_terms` of the FTS and two-character terms),
        ``exact`` (when a code among the FTS terms is rare, :meth:`exact`), ``stem`` (when ``stems``,
        already Porter-stemmed) and, unless ``short_lists`` is False (a store that answers them
        itself, SQLite's ``LIKE``), one ``short`` list per two-character term; each holds at most
        ``limit`` rows."""
        lists: list[RankedList] = []
        keyword = keyword_terms(fts_terms, short_terms)
        if keyword:
            lists.append(self.keyword(keyword, limit))
        if fts_terms:
            exact = self.exact(fts_terms, limit)
            if exact[1]:
                lists.append(exact)
        if stems:
            lists.append(self.stem(stems, limit))
        for term in short_terms if short_lists else ():
            lists.append(self.short(term, limit))
        self._joined_cache = None  # the joined copies of the texts are built again for the next query's new terms
        return lists

    def keyword(self, terms: Sequence[str], limit: int) -> RankedList:
        """The keyword list for lower-cased terms (3+ characters, or a query's two-character Chinese
        words, :func:`~ctxscore.store.retrieval.keyword_terms`)."""
        ranked = bm25([self._term_freq(t) for t in terms], self._ntok, self._turns, limit)
        return "keyword", [self._row(self.messages[r]) for r in ranked]

    def exact(self, terms: Sequence[str], limit: int) -> RankedList:
        """The ``exact`` list for FTS terms: the messages whose own text holds a rare code of the query
        (:func:`~ctxscore.store.retrieval.code_terms` held by the text of at most
        :data:`~ctxscore.store.retrieval.EXACT_MAX_ROWS` messages), ranked by bm25 over those codes."""
        freqs = []
        for t in code_terms(terms):
            held: dict[int, float] = {}
            for r, x in self._term_freq(t).items():  # rows holding it in the text or the context
                if t in self.messages[r].text_folded:
                    held[r] = x
                    if len(held) > EXACT_MAX_ROWS:
                        break
            if len(held) <= EXACT_MAX_ROWS:
                freqs.append(held)
        ranked = bm25(freqs, self._ntok, self._turns, limit) if freqs else []
        return "exact", [self._row(self.messages[r]) for r in ranked]

    def _term_freq(self, term: str) -> dict[int, float]:
        """Row -> phrase frequency of ``term`` over the whole session (cached; see :data:`TERMS_CACHED`
        and :data:`TERM_ROWS_CACHED`)."""
        n = len(self.messages)
        seen, freq = self._term_freqs.pop(term, (0, None))
        self._term_rows -= len(freq) if freq is not None else 0
        if freq is None or seen > n:
            seen, freq = 0, {}
        if n - seen > _RESCAN_ROWS:  # the rows not counted yet (all of them for a new term) in one scan
            text, t_starts, ctx, c_starts = self._joined()
            in_text = _row_counts(text, t_starts, self._texts, term, seen)
            in_ctx = _row_counts(ctx, c_starts, self._ctxs, term, seen)
            freq.update((r, _freq(in_text.get(r, 0), in_ctx.get(r, 0))) for r in sorted(in_text.keys() | in_ctx.keys()))
        elif seen < n:
            overlap = _self_overlapping(term)
            for r in range(seen, n):
                m = self.messages[r]
                a, b = _count(m.text_folded, term, overlap), _count(m.context_folded, term, overlap)
                if a or b:
                    freq[r] = _freq(a, b)
        self._term_freqs[term] = (n, freq)
        self._term_rows += len(freq)
        while len(self._term_freqs) > 1 and (len(self._term_freqs) > TERMS_CACHED or self._term_rows > TERM_ROWS_CACHED):
            _, (_, old) = self._term_freqs.popitem(last=False)
            self._term_rows -= len(old)
        return freq

    def stem(self, stems: Sequence[str], limit: int) -> RankedList:
        """The stem list for the Porter stems of the query's words."""
        ranked = bm25([self._postings.get(s, {}) for s in stems], self._stem_ntok, self._turns, limit)
        return "stem", [self._row(self.messages[r]) for r in ranked]

    def short(self, term: str, limit: int) -> RankedList:
        """The list of one two-character term: messages whose text holds it, newest first."""
        if self._textless:
            raise ValueError("this index keeps no whole texts (indexed_message(short_terms=False)); its store "
                             "answers two-character terms itself")
        hits = [m for m in self.messages if term in m.ascii_text]
        hits.sort(key=lambda m: -m.turn)
        return "short", [self._row(m) for m in hits[:limit]]

    def vector(self, query_embedding: np.ndarray, limit: int) -> tuple[RankedList, dict[str, float]]:
        """The vector list and each listed message's similarity to the query."""
        dim = np.shape(query_embedding)
        if self._matrix is None or self._matrix.shape[1:] != dim:
            # only the embeddings of the query's size (an embedder changed mid-session leaves others)
            with_vec = [m for m in self.messages if m.embedding is not None and m.embedding.shape == dim]
            self._matrix_ids = [m.id for m in with_vec]
            self._matrix = np.stack([m.embedding for m in with_vec]) if with_vec else np.zeros((0, *dim), np.float32)
            self._by_id = {m.id: m for m in with_vec}
        if not self._matrix_ids:
            return ("vector", []), {}
        ranked = vector_ranking(self._matrix_ids, self._matrix, query_embedding, limit)
        return ("vector", [self._row(self._by_id[i]) for i, _ in ranked]), dict(ranked)

    @staticmethod
    def _row(m: IndexedMessage) -> tuple[str, int, str]:
        return m.id, m.turn, m.snippet
