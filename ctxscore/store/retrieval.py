"""Retrieval shared by every store: query terms, ranked lists and their fusion.

A store produces ranked lists of ``(message id, turn, snippet)`` for a query -- a keyword list
(full-text search over character trigrams, bm25), a stemmed keyword list (English words reduced to
their stems by the Porter stemmer, so "Ferraris" finds "Ferrari" and "booked" finds "booking"), one
list per two-character term (Chinese words a trigram index cannot match; newest first; a query of
such words alone has them ranked by the keyword list too, :func:`keyword_terms`), an ``exact`` list (the
messages whose text holds a rare code of the query, below) and a vector list (cosine similarity to
the query embedding) -- and :func:`fuse` merges them by weighted reciprocal rank fusion, score = sum
over lists of w / (k + rank), k = 60 (Cormack, Clarke and Buettcher, "Reciprocal rank fusion
outperforms Condorcet and individual rank learning methods", SIGIR 2009).

Reciprocal rank keeps a list's order, not its bm25 scores: for "what was the reference ZX0004?" over
40 booking confirmations, the keyword list put the one message holding ZX0004 first, but by 1/61
against 1/62 for the next (its bm25 was ~4 against ~0: "reference" is in every reply), and the
stem list, which ranks "reference" alone (codes are not stems), put the oldest reply first, so
"ZX0000" led and "ZX0004" came third. A code of the query (a term holding a digit: an identifier, a
number; :func:`code_terms`) that the text of at most :data:`EXACT_MAX_ROWS` messages of the session
holds is rare -- the case bm25's idf is for -- and those messages form the ``exact`` list, ranked by
bm25 over the rare codes and weighted as the keyword list, so they lead the messages that match the
query's common words only. User text never reaches a query language as syntax: the keyword
and stem lists rank in Python (:mod:`ctxscore.store.session_index`), and ``LIKE`` patterns escape
``%`` and ``_`` (:func:`like_pattern`).
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

RRF_K = 60
#: bm25 weight of the ``context`` column relative to the message text (1.0).
CONTEXT_WEIGHT = 0.4
#: Weight of each ranked list in the fusion (score = sum of weight / (RRF_K + rank)): the keyword
#: list (bm25 over trigram substrings), the stem list, each two-character term's LIKE list (ordered by recency, not relevance) and
#: the vector list. Measured on the dev sessions' probes (rank of the key fact's source message):
#: equal weights give recall@4 0.219 and recall@12 0.438; these 0.256 and 0.459 (held-out sessions:
#: 0.200 -> 0.246 and 0.397 -> 0.428).
#: The ``exact`` list (:func:`code_terms`, :data:`EXACT_MAX_ROWS`) weighs as much as the keyword list:
#: a message holding a rare code of the query gains what a first place in the keyword list gives.
#: On the dev sessions (42 of 945 probes name a rare code, mostly a task's train or address while
#: asking for another value) the source ranks moved by one fact either way (MRR rules 0.191 -> 0.190,
#: learned 0.459 -> 0.460) and page-in recall at 25% by at most 0.0005.
RRF_WEIGHTS = {"keyword": 1.0, "stem": 0.5, "short": 0.25, "vector": 0.25, "exact": 1.0}
#: Lists that are lexical evidence (a term of the query occurs in the message).
LEXICAL_LISTS = frozenset({"keyword", "stem", "short", "exact"})
#: A code of the query (:func:`code_terms`) held by the text of at most this many messages of the
#: session is rare: those messages form the ``exact`` list.
EXACT_MAX_ROWS = 3
#: Okapi BM25 constants of the keyword list, SQLite FTS5's (``bm25()``): every store ranks with
#: score = sum over terms of idf * f * (k1 + 1) / (f + k1 * (1 - b + b * D / avgdl)), idf =
#: ln((N - n + 0.5) / (n + 0.5)) floored at 1e-6, f = occurrences of the term in the text plus
#: :data:`CONTEXT_WEIGHT` x occurrences in the context (overlapping, case-folded), D = trigrams of text
#: plus context (characters - 2 each), N and n the rows searched and those holding the term.
BM25_K1 = 1.2
BM25_B = 0.75

_EN_STOP = frozenset(
    """a an the of for to in on at by from with and or but is are was were be been being do does did
    what which who whom whose when where why how i me my mine you your yours we our us it its this that
    these those there here please tell remind again can could would should will shall may might must
    have has had about any some all again just also than then so as if not no yes ok okay""".split()
)
# Chinese function words removed from query runs before matching (they split a run into pieces).
_ZH_STOP = ("什么", "哪个", "哪些", "哪里", "多少", "怎么", "是否", "请问", "的", "是", "吗", "了", "呢", "吧", "我", "你", "您", "请", "问", "在", "和", "与", "把", "被", "几", "哪", "有", "这", "那", "个")
_ZH_STOP_RX = re.compile("|".join(map(re.escape, _ZH_STOP)))
_CJK_RUN = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]+")
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@/+:-]*[A-Za-z0-9]|[A-Za-z0-9]")


@dataclass(slots=True)
class Hit:
    """One search result.

    Attributes:
        id: message id.
        turn: 0-based position of the message in its session.
        score: fused reciprocal-rank score (higher is better).
        snippet: the first 120 characters of the message text.
        lists: the ranked lists it came from (``keyword``, ``stem``, ``short``, ``exact``, ``vector``).
        similarity: its cosine similarity to the query embedding, when a vector list was used.
        learned: the learned ranker's probability that the message holds what the query asks for,
            when a ranker re-ordered the hits (:mod:`ctxscore.scoring.ranker`); ``None`` otherwise.
    """

    id: str
    turn: int
    score: float
    snippet: str
    lists: frozenset[str] = frozenset()
    similarity: float | None = None
    learned: float | None = None

    @property
    def lexical(self) -> bool:
        """A term of the query occurs in the message or in its index context, the start of the messages
        before it (keyword, stem, short-term or exact list)."""
        return bool(self.lists & LEXICAL_LISTS)


def _zh_words(run: str) -> list[str]:
    """The words of a Chinese run: jieba's segmentation when installed, else pieces between function words."""
    try:
        import jieba  # noqa: PLC0415 - optional (the embed extra installs it)
    except ImportError:
        return [p for p in _ZH_STOP_RX.split(run) if p]
    _quiet_jieba(jieba)
    return [w for w in jieba.lcut(run) if w and not _ZH_STOP_RX.fullmatch(w)]


def _quiet_jieba(jieba: object) -> None:
    """Silence jieba and keep its cache in the per-user cache folder (not a temp folder shared by users)."""
    if getattr(jieba, "_ctxscore_ready", False):
        return
    import logging
    import os
    from pathlib import Path

    jieba.setLogLevel(logging.WARNING)  # type: ignore[attr-defined]
    folder = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ctxscore"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        jieba.dt.tmp_dir = str(folder)  # type: ignore[attr-defined]
    except OSError:
        pass
    jieba._ctxscore_ready = True  # type: ignore[attr-defined]


def query_terms(query: str) -> tuple[list[str], list[str]]:
    """Split a free-text query into FTS terms (3+ characters) and short terms (2 characters).

    English words are lower-cased and stop words dropped; Chinese runs are segmented into words
    (jieba when installed, else split at function words 的, 是, 什么 ...); words of three or more
    characters are also cut into overlapping trigrams.

    Returns:
        (fts_terms, short_terms), each de-duplicated in order of appearance.
    """
    fts: list[str] = []
    short: list[str] = []
    for w in _WORD.findall(query):
        lw = w.lower()
        if lw in _EN_STOP or (len(lw) < 2 and not lw.isdigit()):  # one letter ("x", the "s" of "user's") is in most messages
            continue
        (fts if len(lw) >= 3 else short).append(lw)
    for run in _CJK_RUN.findall(query):
        for piece in _zh_words(run):
            if len(piece) >= 3:
                fts.append(piece)
                fts.extend(piece[i : i + 3] for i in range(len(piece) - 2))
            elif len(piece) == 2:
                short.append(piece)
    return list(dict.fromkeys(fts)), list(dict.fromkeys(short))


def keyword_terms(fts_terms: Sequence[str], short_terms: Sequence[str]) -> list[str]:
    """The terms the keyword list ranks by bm25: the FTS terms (3+ characters) of the query, or, when
    it has none, its two-character Chinese words.

    A trigram index could not match a two-character term, so such a term had only its ``short``
    list, newest first. Most Chinese words have two characters: a question made of them alone
    ("用户最终选定的景点叫什么名字？") had no keyword list, no relevance ranking and no use of the
    context column (the start of the messages before), and the answer "为您推荐日坛公园。", which holds
    no word of the question but follows the request that names 景点, was found by no list. The
    in-memory index (:meth:`ctxscore.store.session_index.SessionIndex.lexical`, every store's) counts
    a term of any length, so those words form the keyword list (bm25 over text and context) and
    keep their ``short`` lists.

    The words come from :func:`query_terms`, so from jieba's segmentation: without jieba (an
    install without the ``embed`` or ``train`` extra) a Chinese run is cut at function words only,
    into pieces that are mostly 3+ characters long, and those are FTS terms already.

    A query with a longer term keeps its keyword list as it was: adding its two-character words as
    well measured worse on the dev sessions at 25% (rules: source top-4 0.250 against 0.259, recall
    with page-in 0.8467 against 0.8475; learned 0.9342 against 0.9345). Two-character ASCII terms
    ("la", "id", "10") never join: as substrings they occur inside most words and numbers.
    """
    if fts_terms:
        return list(fts_terms)
    return [t for t in short_terms if _CJK_RUN.fullmatch(t)]


def code_terms(fts_terms: Sequence[str]) -> list[str]:
    """The codes among a query's FTS terms (:func:`query_terms`): identifiers and numbers ("zx0004",
    "tr1234", "2024"), terms holding a digit."""
    return [t for t in fts_terms if any(c.isdigit() for c in t)]


def stem_terms(query: str) -> list[str]:
    """The English words of a query (3+ letters, stop words dropped) for a Porter-stemmed index."""
    return list(dict.fromkeys(w.lower() for w in _WORD.findall(query)
                              if len(w) >= 3 and w.isascii() and w.isalpha() and w.lower() not in _EN_STOP))


def like_pattern(term: str) -> str:
    """A SQL ``LIKE`` pattern matching ``term`` anywhere, with ``\\``, ``%`` and ``_`` escaped (use ``ESCAPE '\\'``)."""
    return "%" + term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"




def trigram_tokens(text: str) -> int:
    """Document length of ``text`` in the keyword ranking: its trigrams (FTS5's trigram tokenizer)."""
    return max(len(text) - 2, 0)


def vector_ranking(ids: Sequence[str], matrix: np.ndarray, query_embedding: np.ndarray,
                   limit: int) -> list[tuple[str, float]]:
    """The ``limit`` (id, dot product) pairs with the highest dot product with the query, best first
    (ties: the earlier message first).

    Args:
        ids: message ids, in the order of ``matrix``'s rows (every store passes them in insertion
            order, so ties break the same way in every store).
        matrix: ``(len(ids), dim)`` float32 embeddings (L2-normalised: dot product = cosine).
        query_embedding: ``(dim,)`` query embedding.
        limit: number of ids returned (at most).
    """
    if not len(ids):
        return []
    sims = matrix @ np.asarray(query_embedding, dtype=np.float32)
    return [(ids[i], float(sims[i])) for i in np.argsort(-sims, kind="stable")[:limit]]


#: A ranked list: its kind (a key of :data:`RRF_WEIGHTS`) and its rows (message id, turn, snippet), best first.
RankedList = tuple[str, Sequence[tuple[str, int, str]]]


def fuse(lists: Iterable[RankedList], k: int = 10, only: Callable[[str], bool] | None = None,
         similarity: dict[str, float] | None = None) -> list[Hit]:
    """Weighted reciprocal rank fusion of ranked lists (see the module docstring).

    Args:
        lists: ranked lists, each ``(kind, rows)``; ``kind`` selects the weight in :data:`RRF_WEIGHTS`.
        k: number of hits to return.
        only: keep only message ids for which this returns True (ranks are counted after filtering).
        similarity: cosine similarity to the query per message id (from the vector list), recorded on the hits.

    Returns:
        Up to ``k`` hits, best first (ties broken by the later turn); each names its lists.
    """
    scores: dict[str, float] = {}
    meta: dict[str, tuple[int, str]] = {}  # id -> (turn, snippet) of its first row
    kinds: dict[str, set[str]] = {}
    for kind, rows in lists:
        w = RRF_WEIGHTS[kind]
        rank = 0
        for mid, turn, snippet in rows:
            if only is not None and not only(mid):
                continue
            rank += 1
            if mid in scores:
                scores[mid] += w / (RRF_K + rank)
                kinds[mid].add(kind)
            else:
                scores[mid] = 0.0 + w / (RRF_K + rank)
                meta[mid] = (turn, snippet)
                kinds[mid] = {kind}
    # only the best k become hits (heapq.nsmallest is sorted(...)[:k], ties in insertion order)
    best = heapq.nsmallest(k, scores, key=lambda m: (-scores[m], -meta[m][0]))
    sim = similarity or {}
    return [Hit(id=m, turn=meta[m][0], score=scores[m], snippet=meta[m][1], lists=frozenset(kinds[m]),
                similarity=sim.get(m)) for m in best]
