"""The learned relevance ranker of page-in and ``search``: it re-orders the store's fused hits.

The store's hybrid search (:mod:`ctxscore.store.retrieval`) fuses ranked lists by reciprocal rank;
it does not know that the answer to "what date did the user settle on for the train?" is the short
user message after the assistant asked for a date, inside the task that names the train. The ranker
reads, for each candidate message of the fused pool, features of the (query, message) pair and of
the message's neighbours, and a scikit-learn classifier (trained on probes of the train-split long
sessions, ``training/ranker.py``) gives the probability that the message holds what the query asks
for; hits are returned in that order, ``Hit.score`` set to it.

Features (:data:`FEATURE_NAMES`, one row per candidate, float32):

- fusion: the fused score / the pool's best, ``ln(1 + fused rank)``, one flag per ranked list
  (keyword, stem, short, vector; the ``exact`` list of a rare code has none, its weight is in the
  fused score and the code in the bm25 and anchor features);
- embeddings: cosine of query and message, of query and the previous / next message, the best over
  the two messages either side, ``ln(1 + rank)`` of the cosine in the pool;
- lexical: BM25 of the message (and of the previous / next one) for the query terms over the
  session (words with a light suffix stripping, Chinese character bigrams), normalised by the pool's
  best, its rank; idf-weighted share of the query terms in the message, the previous message and
  the five messages around it;
- anchors: the query's rare terms (in at most 10% of the session's messages) locate its task: the
  distance in turns to the nearest message holding one, an idf-weighted proximity score, and
  whether the message holds one itself;
- slot type: the query asks for a date, time, amount, count, id, name, place or phone number and
  the message (or the previous one) holds an entity of that type (the rule file's entity patterns);
- replaced: a later user message within :data:`~ctxscore.scoring.rules.RESTATE_LOOKAHEAD` messages
  restates this one (a correction or alternative cue, or another value of a kind it holds: the rows'
  version of :attr:`ctxscore.window.history.Entry.successor` without task boundaries and without the
  kind filter of a correction that names a value, under the packaged scorer's rule file, which the
  ranker was trained with), how many
  messages later, and whether that message holds an asked type; ``ln(1 + messages)`` among the next
  :data:`~ctxscore.scoring.rules.RESTATE_LOOKAHEAD` that hold an asked type; the distance to the
  nearest anchor before the message and after it (the answer usually follows the task's naming);
- the message: recency (``ln(1 + age)``, age / session length), role, tool calls, question, the
  stored category probabilities and value, ``ln(1 + characters)``, ``ln(1 + entities)``.

A query made of identifiers alone ("ZX0004", "#W2378156": letters and digits mixed, or 5+ digits,
with no other term) asks for the messages that hold them: those go first, in the model's order
(:func:`exact_first`). The model alone put the message after the one holding "ZX0004" first (its
probes name a task's identifier to ask for another value, whose answer follows the naming), and the
embeddings do not tell ZX0004 from ZX0005. A query with other words ("the booking reference for
train TR1234") keeps the model's order.

Everything is numpy and the standard library at run time; the classifier ships in the packaged
scorer folder (``ranker.skops``, :mod:`ctxscore.scoring.package`). :class:`SessionRows` keeps the
rows a session's search needs (text, role, turn, embedding, stored prediction, term statistics),
read incrementally from the store, for the :data:`RANKER_SESSIONS` sessions of each store used last.
"""

from __future__ import annotations

import math
import re
import threading
import weakref
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..messages import CATEGORIES
from ..store.retrieval import Hit
from .rules import (
    RESTATE_LOOKAHEAD,
    RuleConfig,
    asks_to_replace,
    default_config,
    restates,
    scan_text,
    typed_entity_spans,
    values_of,
)

#: Fused hits the ranker re-orders per query (the page-in planner reads the best of them). On the
#: held-out sessions 100 hold the probe's source for 0.87 of the probes (60: 0.85) and raise the
#: learned source MRR from 0.498 to 0.510; re-ranking 100 costs about 3 ms (features and the model).
RERANK_POOL = 100
#: Sessions per store whose :class:`SessionRows` a :class:`Ranker` keeps (least recently used first
#: out; a session left out is read again whole at its next query). A store shared by many sessions
#: (PostgreSQL behind a proxy) would otherwise keep every session it ever ranked.
RANKER_SESSIONS = 64
#: A query term found in at most this share of the session's messages is an anchor.
ANCHOR_SHARE = 0.10
#: Characters of a message read for its terms and entity types (head and tail, see :func:`scan_text`).
_BM25_K1, _BM25_B = 1.2, 0.75

_STOP = frozenset(
    """a an the of for to in on at by from with and or but is are was were be been being do does did what which
    who whom whose when where why how i me my mine you your yours we our us it its this that these those there
    here please tell remind again can could would should will shall may might must have has had about any some
    all just also than then so as if not no yes ok okay user users agent did settle settled want wanted
    request requested use used does action find whats""".split())
_WORD = re.compile(r"[a-z0-9]+")
_CJK_RUN = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]+")
_ZH_STOP = frozenset("的是了吗呢吧我你您请问在和与把被有这那个什么哪用户对要求")

#: Slot types a query may ask for: (name, query pattern, entity kinds of the rule file that answer it).
SLOT_TYPES: tuple[tuple[str, re.Pattern[str], frozenset[str]], ...] = (
    ("date", re.compile(r"(?i)\b(?:date|day|when|weekday)\b|日期|哪天|几号|星期|哪一天"),
     frozenset({"date_words", "date_slash", "datetime_iso", "weekday", "date_zh"})),
    ("time", re.compile(r"(?i)\b(?:time|hour|leave ?at|arrive ?by|departure|arrival)\b|时间|几点"),
     frozenset({"time", "time_zh", "datetime_iso"})),
    ("money", re.compile(r"(?i)\b(?:price|cost|fare|budget|amount|pay|paid|rent|balance)\b|价格|费用|多少钱|人均|门票"),
     frozenset({"money"})),
    ("count", re.compile(r"(?i)\b(?:how many|number of|people|persons?|guests?|tickets?|seats?|stay|nights?|rooms?)\b|几个|人数|几晚|几位"),
     frozenset({"number_unit", "long_number"})),
    ("id", re.compile(r"(?i)\b(?:id|reference|reservation|code|confirmation|booking number|ticket number|user id)\b|编号|订单"),
     frozenset({"id_mixed", "code3", "long_number"})),
    ("name", re.compile(r"(?i)\b(?:name|which|called|title|file|function|class)\b|名字|叫什么|名称"),
     frozenset({"proper_name", "quoted", "filename", "path", "snake_case", "camel_case", "dotted_call"})),
    ("phone", re.compile(r"(?i)\b(?:phone|telephone|number)\b|电话"), frozenset({"long_number"})),
    ("place", re.compile(r"(?i)\b(?:city|area|place|address|where|destination|origin|location|from|to)\b|地址|地点|区域|城市|哪里"),
     frozenset({"proper_name", "code3"})),
)

FEATURE_NAMES: tuple[str, ...] = (
    "fused_score", "fused_rank_log", "in_keyword", "in_stem", "in_short", "in_vector",
    "cos", "cos_prev", "cos_next", "cos_nb_max", "cos_rank_log",
    "bm25", "bm25_prev", "bm25_next", "bm25_rank_log", "cover", "cover_prev", "cover_ctx",
    "anchor_dist_log", "anchor_prox", "anchor_in_msg", "has_anchor",
    "type_match", "type_match_prev", "type_asked",
    "age_log", "age_frac", "role_system", "role_user", "role_assistant", "role_tool", "tool_calls", "question",
    *(f"cat_{c}" for c in CATEGORIES), "value", "log_chars", "log_entities",
    "replaced", "replaced_gap_log", "replaced_by_asked", "later_type_log", "anchor_before_log", "anchor_after_log",
)


#: An identifier in a query: a token of letters and digits (``_`` and ``-`` inside) holding both,
#: of 4+ characters, or a number of 5+ digits (``#`` before it allowed).
_IDENT = re.compile(r"(?<![A-Za-z0-9_-])(?:(?=[A-Za-z0-9_-]*\d)(?=[A-Za-z0-9_-]*[A-Za-z])[A-Za-z0-9][A-Za-z0-9_-]{2,}"
                    r"[A-Za-z0-9]|\d{5,})(?![A-Za-z0-9_-])")


def _stem(w: str) -> str:
    """A light English suffix stripping (plural, -ing, -ed), enough to match "trains" with "train"."""
    if len(w) > 4 and w.endswith("ies"):
        return w[:-3] + "y"
    if len(w) > 3 and w.endswith("s") and not w.endswith("ss"):
        w = w[:-1]
    if len(w) > 5 and w.endswith("ing"):
        return w[:-3]
    if len(w) > 4 and w.endswith("ed"):
        return w[:-2]
    return w


def terms(text: str) -> list[str]:
    """The terms of a text: lower-cased words of 2+ characters without stop words, lightly stemmed,
    and the character bigrams of its Chinese runs (function characters dropped)."""
    low = text.lower()
    out = [_stem(w) for w in _WORD.findall(low) if len(w) >= 2 and w not in _STOP]
    for run in _CJK_RUN.findall(text):
        chars = [c for c in run if c not in _ZH_STOP]
        out += ["".join(chars[i:i + 2]) for i in range(len(chars) - 1)]
    return out


def entity_types(text: str, config: RuleConfig) -> frozenset[str]:
    """The slot types (:data:`SLOT_TYPES` names) whose entity kinds occur in ``text``."""
    kinds = {k for _, _, k in typed_entity_spans(text, config)}
    return frozenset(name for name, _, answer in SLOT_TYPES if kinds & answer)


def asked_types(query: str) -> frozenset[str]:
    """The slot types a query asks for."""
    return frozenset(name for name, rx, _ in SLOT_TYPES if rx.search(query))


@dataclass
class Row:
    """What the ranker reads about one stored message."""

    turn: int
    role: str
    text: str
    embedding: np.ndarray | None
    probs: dict[str, float]
    value: float
    tool_calls: bool
    tf: Counter[str]
    length: int
    types: frozenset[str]
    n_entities: int
    values: frozenset[tuple[str, str]] = frozenset()
    successor: int = -1  # turn of the later user message that restates this one (-1: none)


@dataclass
class SessionRows:
    """The rows of one session in turn order, with document frequencies and postings of their terms.

    :meth:`add` appends rows (any turn order is refused: a gap or a repeat resets the rows, which the
    caller then reloads).
    """

    config: RuleConfig = field(default_factory=default_config)
    rows: list[Row] = field(default_factory=list)
    ids: list[str | None] = field(default_factory=list)
    df: Counter[str] = field(default_factory=Counter)
    postings: dict[str, list[int]] = field(default_factory=dict)
    total_len: int = 0

    def add(self, turn: int, role: str, text: str, embedding: np.ndarray | None, prediction: dict[str, Any] | None,
            tool_calls: bool = False, message_id: str | None = None) -> None:
        """Append the message at ``turn`` (must be ``len(rows)``; ``message_id``: its id, kept in :attr:`ids`).

        Raises:
            ValueError: ``turn`` is not the next turn.
        """
        if turn != len(self.rows):
            raise ValueError(f"row for turn {turn} added after {len(self.rows)} rows")
        scan = scan_text(text)
        tf = Counter(terms(scan))
        spans = typed_entity_spans(scan, self.config)
        kinds = {k for _, _, k in spans}
        types = frozenset(name for name, _, answer in SLOT_TYPES if kinds & answer)
        p = prediction or {}
        probs = {c: float((p.get("probs") or {}).get(c, 0.0)) for c in CATEGORIES}
        value = p.get("value")
        emb = None if embedding is None else np.asarray(embedding, dtype=np.float32)
        values = values_of(scan, spans) if role != "system" else frozenset()  # rules.typed_values of the text
        if role == "user":  # link the earlier rows this one restates (see the module docstring)
            cue = asks_to_replace(text, self.config)
            for k in range(max(0, turn - RESTATE_LOOKAHEAD), turn):
                old = self.rows[k]
                if old.successor < 0 and old.role != "system" and (cue or restates(old.values, values)):
                    old.successor = turn
        self.rows.append(Row(turn, role, text, emb, probs, float(value) if value is not None else 0.0, tool_calls,
                             tf, sum(tf.values()), types, len(spans), values))
        self.ids.append(message_id)
        for t in tf:
            self.df[t] += 1
            self.postings.setdefault(t, []).append(turn)
        self.total_len += sum(tf.values())


_CONTROLLER: list[Any] = []  # threadpoolctl's controller, made once (it scans the loaded libraries)


def _one_openmp_thread() -> Any:
    """A context in which OpenMP runs one thread: the gradient-boosted ranker scores 100 hits in about
    1 ms on one thread, while its default thread pool spins for tens of ms when other processes hold
    the cores (measured: 26 ms a call in an evaluation on a loaded 2-core machine, 1.2 ms with this)."""
    if not _CONTROLLER:
        from threadpoolctl import ThreadpoolController  # a scikit-learn dependency

        _CONTROLLER.append(ThreadpoolController())
    return _CONTROLLER[0].limit(limits=1, user_api="openmp")


def _stale(view: SessionRows, hits: Sequence[Hit]) -> bool:
    """True when a hit names a turn ``view`` holds with another message (another id, or a text that does
    not begin with the hit's snippet): the session was detached and re-grown since it was read."""
    for h in hits:
        if 0 <= h.turn < len(view.rows):
            kept = view.ids[h.turn]
            if (kept is not None and kept != h.id) or not view.rows[h.turn].text.startswith(h.snippet):
                return True
    return False


def _bm25_row(r: Row, qterms: dict[str, float], avg: float) -> float:
    """BM25 of one row for the query terms (``term -> idf``)."""
    norm = _BM25_K1 * (1 - _BM25_B + _BM25_B * r.length / max(avg, 1e-9))
    out = 0.0
    for t, idf in qterms.items():
        f = r.tf.get(t, 0)
        if f:
            out += idf * f * (_BM25_K1 + 1) / (f + norm)
    return out


def _rank_log(x: np.ndarray) -> np.ndarray:
    """``ln(1 + rank)`` of each value (rank 0 = largest)."""
    order = np.argsort(-x, kind="stable")
    rank = np.empty(len(x))
    rank[order] = np.arange(len(x))
    return np.log1p(rank)


def _query_terms(query: str, rows: SessionRows) -> tuple[dict[str, float], list[tuple[str, float]]]:
    """(query term -> idf over the session, anchors: rare terms present in the session with their idf)."""
    n = max(1, len(rows.rows))
    qt: dict[str, float] = {}
    for t in terms(query):
        df = rows.df.get(t, 0)
        qt[t] = math.log(1 + (n - df + 0.5) / (df + 0.5))
    anchors = [(t, idf) for t, idf in qt.items() if 0 < rows.df.get(t, 0) <= max(1.0, ANCHOR_SHARE * n)]
    return qt, anchors


def _anchors(rows: SessionRows, turns: Sequence[int], anchors: list[tuple[str, float]]) -> np.ndarray:
    """Per turn: (ln(1 + distance in turns to the nearest anchor message), idf-weighted proximity,
    anchor in the message, ln(1 + distance to the nearest anchor message at or before it: 0 when the
    message holds one), ln(1 + distance to the nearest one strictly after it)) -> ``(len(turns), 5)``;
    a side without an anchor reads ``ln(1 + session length)``."""
    out = np.zeros((len(turns), 5))
    if not anchors or not len(turns):
        return out
    t = np.asarray(turns, dtype=np.float64)
    best = np.full(len(t), np.inf)
    before, after = np.full(len(t), np.inf), np.full(len(t), np.inf)
    prox = np.zeros(len(t))
    for term, idf in anchors:
        post = np.asarray(rows.postings.get(term, ()), dtype=np.float64)
        if not len(post):
            continue
        k = np.searchsorted(post, t)
        left = np.abs(t - post[np.clip(k - 1, 0, len(post) - 1)])
        right = np.abs(post[np.clip(k, 0, len(post) - 1)] - t)
        d = np.minimum(left, right)
        at = np.searchsorted(post, t, side="right")  # anchors at or before t: post[:at]
        before = np.minimum(before, np.where(at > 0, t - post[np.clip(at - 1, 0, len(post) - 1)], np.inf))
        after = np.minimum(after, np.where(at < len(post), post[np.clip(at, 0, len(post) - 1)] - t, np.inf))
        best = np.minimum(best, d)
        prox += idf * np.exp(-d / 6.0)
    out[:, 0] = np.log1p(np.where(np.isfinite(best), best, len(rows.rows)))
    out[:, 1] = prox / sum(idf for _, idf in anchors)
    out[:, 2] = best == 0
    out[:, 3] = np.log1p(np.where(np.isfinite(before), before, len(rows.rows)))
    out[:, 4] = np.log1p(np.where(np.isfinite(after), after, len(rows.rows)))
    return out


class _Pool:
    """Per-query memo of the row quantities the features of a pool share (cosines, BM25, term sets)."""

    def __init__(self, rows: SessionRows, q: np.ndarray | None, qt: dict[str, float], turns: Sequence[int]) -> None:
        self.rows, self.qt = rows, qt
        n = len(rows.rows)
        need = sorted({t + d for t in turns if t >= 0 for d in range(-2, 3) if 0 <= t + d < n})
        self.cos: dict[int, float] = {}
        if q is not None and need:
            dim = q.shape[0]
            have = [i for i in need if rows.rows[i].embedding is not None and rows.rows[i].embedding.shape == (dim,)]
            if have:
                sims = np.stack([rows.rows[i].embedding for i in have]) @ q
                self.cos = dict(zip(have, sims.tolist(), strict=True))
        avg = rows.total_len / max(1, n)
        self.bm = {i: _bm25_row(rows.rows[i], qt, avg) for i in need}
        self.has = {i: frozenset(t for t in qt if t in rows.rows[i].tf) for i in need}
        self.total = sum(qt.values())

    def cover(self, idx: Sequence[int]) -> float:
        if self.total <= 0:
            return 0.0
        have: set[str] = set()
        for i in idx:
            have |= self.has.get(i, frozenset())
        return sum(self.qt[t] for t in have) / self.total


def pair_features(query: str, query_embedding: np.ndarray | None, hits: Sequence[Hit], rows: SessionRows,
                  turns: Sequence[int]) -> np.ndarray:
    """Feature rows of the candidates -> ``(len(hits), len(FEATURE_NAMES))`` float32.

    Args:
        query: the query text.
        query_embedding: its ``(dim,)`` embedding (same embedder as the stored rows), or ``None``.
        hits: the fused pool, best first.
        rows: the session's rows (every turn up to the newest).
        turns: the turn of each hit in ``rows`` (``-1``: unknown; its features stay neutral).
    """
    n, q = len(rows.rows), None if query_embedding is None else np.asarray(query_embedding, dtype=np.float32)
    qt, anchors = _query_terms(query, rows)
    asked = asked_types(query)
    pool = _Pool(rows, q, qt, turns)
    best_fused = max((h.score for h in hits), default=1.0) or 1.0
    X = np.zeros((len(hits), len(FEATURE_NAMES)), dtype=np.float64)
    cos = np.array([pool.cos.get(t, 0.0) for t in turns])
    bm = np.array([pool.bm.get(t, 0.0) for t in turns])
    top_bm = max(float(bm.max()) if len(bm) else 0.0, 1e-9)
    X[:, 10], X[:, 14] = _rank_log(cos), _rank_log(bm)
    known = [t for t in turns if 0 <= t < n]
    anc = np.zeros((len(turns), 5))
    if known:
        anc[[j for j, t in enumerate(turns) if 0 <= t < n]] = _anchors(rows, known, anchors)
    X[:, 18:21] = anc[:, :3]
    X[:, 44:46] = anc[:, 3:]
    X[:, 21] = float(bool(anchors))
    for j, (h, t) in enumerate(zip(hits, turns, strict=True)):
        r = rows.rows[t] if 0 <= t < n else None
        prev = rows.rows[t - 1] if 1 <= t <= n else None
        nb = [pool.cos.get(k, 0.0) for k in (t - 2, t - 1, t + 1, t + 2)]
        X[j, :10] = [h.score / best_fused, math.log1p(j), "keyword" in h.lists, "stem" in h.lists, "short" in h.lists,
                     "vector" in h.lists, cos[j], nb[1], nb[2], max(nb)]
        X[j, 11:14] = [bm[j] / top_bm, pool.bm.get(t - 1, 0.0) / top_bm, pool.bm.get(t + 1, 0.0) / top_bm]
        X[j, 15:18] = [pool.cover([t]), pool.cover([t - 1]), pool.cover(range(t - 2, t + 3))]
        X[j, 22:25] = [float(bool(r is not None and asked & r.types)), float(bool(prev is not None and asked & prev.types)),
                       float(bool(asked))]
        if r is None:
            continue
        age = max(0, n - 1 - t)
        X[j, 25:33] = [math.log1p(age), age / max(1, n), r.role == "system", r.role == "user", r.role == "assistant",
                       r.role == "tool", r.tool_calls, r.text.rstrip().endswith(("?", "？"))]
        X[j, 33:37] = [r.probs[c] for c in CATEGORIES]
        X[j, 37:40] = [r.value, math.log1p(len(r.text)), math.log1p(r.n_entities)]
        if r.successor >= 0:
            X[j, 40:43] = [1.0, math.log1p(r.successor - t), float(bool(asked & rows.rows[r.successor].types))]
        if asked:
            X[j, 43] = math.log1p(sum(1 for k in range(t + 1, min(n, t + 1 + RESTATE_LOOKAHEAD))
                                      if asked & rows.rows[k].types))
    return X.astype(np.float32)


def query_identifiers(query: str) -> list[str]:
    """The identifiers of a query that holds nothing else (every term of it is part of one), else ``[]``."""
    found = list(dict.fromkeys(m.group() for m in _IDENT.finditer(query)))
    own = set(terms(" ".join(found)))
    return found if found and set(terms(query)) <= own else []


def exact_first(query: str, order: Sequence[int], rows: SessionRows, turns: Sequence[int]) -> list[int]:
    """``order`` (positions of candidates, best first) with the candidates whose text holds every
    identifier of an identifiers-only query (:func:`query_identifiers`; whole tokens, any case, in
    the head and tail of the text the ranker reads, :func:`scan_text`) moved first, each group in its
    order; ``order`` unchanged for any other query."""
    idents = query_identifiers(query)
    if not idents:
        return list(order)
    need = set(terms(" ".join(idents)))
    pats = [re.compile(rf"(?<![A-Za-z0-9_-]){re.escape(x)}(?![A-Za-z0-9_-])", re.IGNORECASE) for x in idents]

    def holds(j: int) -> bool:
        r = rows.rows[turns[j]] if 0 <= turns[j] < len(rows.rows) else None
        return r is not None and need <= r.tf.keys() and all(p.search(r.text) for p in pats)

    exact = [j for j in order if holds(j)]
    taken = set(exact)
    return exact + [j for j in order if j not in taken]


class Ranker:
    """A fitted scikit-learn binary classifier over :data:`FEATURE_NAMES` that re-orders hits.

    Args:
        model: fitted estimator with ``predict_proba`` (class 1 = the message holds the answer).
        feature_names: the columns it was trained on (must equal :data:`FEATURE_NAMES`).

    Raises:
        ValueError: ``feature_names`` differ from this ctxscore's :data:`FEATURE_NAMES`.
    """

    def __init__(self, model: Any, feature_names: Sequence[str] = FEATURE_NAMES) -> None:
        if tuple(feature_names) != FEATURE_NAMES:
            raise ValueError("the ranker was trained on other features than this ctxscore computes; "
                             "retrain it (python -m training.train)")
        self.model = model
        self._views: weakref.WeakKeyDictionary[Any, OrderedDict[str, SessionRows]] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def scores(self, X: np.ndarray) -> np.ndarray:
        """Probability that each candidate holds the answer -> ``(n,)`` in [0, 1]."""
        if not len(X):
            return np.zeros(0)
        from sklearn import config_context

        with config_context(assume_finite=True, skip_parameter_validation=True), _one_openmp_thread():
            return np.asarray(self.model.predict_proba(X), dtype=np.float64)[:, 1]

    def order(self, query: str, query_embedding: np.ndarray | None, hits: Sequence[Hit], rows: SessionRows,
              turns: Sequence[int]) -> list[Hit]:
        """``hits`` re-ordered by the model (ties keep the fused order), the hits holding every
        identifier of an identifiers-only query first (:func:`exact_first`); ``Hit.score`` and
        ``Hit.learned`` = the probability."""
        if not hits:
            return []
        p = self.scores(pair_features(query, query_embedding, hits, rows, turns))
        order = exact_first(query, sorted(range(len(hits)), key=lambda j: (-p[j], j)), rows, turns)
        return [replace(hits[j], score=float(p[j]), learned=float(p[j])) for j in order]

    def session_rows(self, store: Any, session_id: str, hits: Sequence[Hit] = ()) -> SessionRows:
        """The rows of a session, read from ``store`` (only the turns not read before; the rows of the
        :data:`RANKER_SESSIONS` sessions of ``store`` used last are kept).

        The rows read before are read again from the start when the session was rebased or truncated
        since (``store.detach``: by this manager, another one or another process): the last row read
        is gone or holds another message (it is read again with the new rows to tell), or one of
        ``hits`` has another id or text than the row kept at its turn.
        """
        with self._lock:
            per_store = self._views.setdefault(store, OrderedDict())
            view = per_store.get(session_id)
            new: list[Any] = []
            if view is not None and view.rows and not _stale(view, hits):
                last = len(view.rows) - 1
                new = store.load(session_id, after_turn=last - 1)  # the last row read, then the new ones
                if new and new[0].turn == last and view.ids[last] in (None, new[0].id) \
                        and view.rows[last].text == new[0].text:
                    new = new[1:]
                else:
                    view = None  # the session shrank, or was rebased and grew again
            else:
                view = None
            if view is None:
                view = per_store[session_id] = SessionRows()
                new = store.load(session_id, after_turn=-1)
            per_store.move_to_end(session_id)
            while len(per_store) > RANKER_SESSIONS:
                per_store.popitem(last=False)
            for row in new:
                view.add(row.turn, row.message.role, row.text, row.embedding, row.prediction,
                         bool(row.message.tool_calls), row.id)
            return view

    def rerank(self, query: str, query_embedding: np.ndarray | None, hits: Sequence[Hit], store: Any,
               session_id: str) -> list[Hit]:
        """Re-order the store's hits for ``query`` (see the module docstring)."""
        if not hits:
            return []
        rows = self.session_rows(store, session_id, hits)
        by_turn = {h.id: h.turn if 0 <= h.turn < len(rows.rows) else -1 for h in hits}
        return self.order(query, query_embedding, hits, rows, [by_turn[h.id] for h in hits])
