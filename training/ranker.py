"""Training data, fitting and metrics of the page-in ranker (:mod:`ctxscore.scoring.ranker`).

Pairs come from replaying long sessions the way the runtime sees them: each session's messages are
added one by one to an in-memory :class:`~ctxscore.store.sqlite.SQLiteStore` (text, context of the
previous messages, the scorer's prediction and embedding, as :func:`ctxscore.window.ingest.record`
stores them); at a probe turn the fact's ``probe`` is searched (the store's fused hybrid search,
:data:`~ctxscore.scoring.ranker.RERANK_POOL` hits) over the messages added so far. Every hit of the
pool is a candidate (hard negatives: same session, the top keyword and vector hits, other tasks with
the same slots); it is positive when it is the fact's source message or holds the fact's value
(normalised text presence, the recall check of the evaluation), which is what page-in must bring back.

Off-topic queries (:func:`offtopic_asks`) teach the ranker what a question about something else
looks like: at each probe turn of a train session, a probe question of a session of another domain
(:data:`DOMAINS`: coding-agent sessions against dialogue ones) is searched the same way and every
candidate of its pool is a negative. Without them the ranker, trained only on questions about their
session, put some message at 0.5-0.9 for any question, and page-in brought unrelated messages back.

Probe turns follow the evaluation (:func:`probe_turns`: every 10 messages and the last); per fact
:func:`choose_turns` keeps the first probe after its source, the last one and one drawn in between.
Recall failures of a feedback iteration add their own (session, fact, probe turn) queries.

Metrics (:func:`rank_metrics`): MRR of the source message and its top-1/4/10 share, the same for
"a message holding the value" (what recall with page-in needs), for the learned order and for the
fused order of the same pool; a source outside the pool counts as rank infinity for both.
"""

from __future__ import annotations

import logging
import random
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ctxscore.messages import Message
from ctxscore.scoring.ranker import FEATURE_NAMES, RERANK_POOL, SessionRows, pair_features
from ctxscore.store.base import NewRecord
from ctxscore.store.sqlite import SQLiteStore

log = logging.getLogger("training.ranker")

#: The runtime's search context: the start of the previous messages (ctxscore.window.ingest).
CONTEXT_CHARS, CONTEXT_MESSAGES = 200, 3
PROBE_EVERY = 10
_MSG_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id", "id")


def normalize(text: str) -> str:
    """NFKC + casefold + collapsed whitespace (the evaluation's presence check, eval.textnorm)."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def session_messages(session: dict[str, Any]) -> list[Message]:
    """The messages of an evaluation-format session, ``turn`` = index. A message the runtime would
    refuse as empty (an upstream turn with no text) reads ``(empty)``, so the indices of the key facts
    stay valid."""
    out = []
    for i, m in enumerate(session["messages"]):
        d = {k: m[k] for k in _MSG_KEYS if m.get(k) is not None}
        if not str(d.get("content") or "").strip() and d["role"] in ("system", "user", "assistant") and not d.get("tool_calls"):
            d["content"] = "(empty)"
        out.append(replace(Message.from_dict(d, where=f"{session['session_id']} message {i}"), turn=i))
    return out


def probe_turns(n: int, every: int = PROBE_EVERY) -> list[int]:
    """Probe turns of the evaluation: ``every - 1, 2 * every - 1, ...`` and the last turn."""
    turns = list(range(every - 1, n, every))
    if n and (not turns or turns[-1] != n - 1):
        turns.append(n - 1)
    return turns


def choose_turns(source: int, probes: Sequence[int], rng: random.Random) -> list[int]:
    """The probe turns a fact is asked at for training: the first after its source, the last, one between."""
    due = [t for t in probes if t > source]
    if not due:
        return []
    pick = {due[0], due[-1]}
    if len(due) > 2:
        pick.add(rng.choice(due[1:-1]))
    return sorted(pick)


@dataclass
class Query:
    """One probe of one fact at one turn, with its candidate pool.

    Attributes:
        session_id, fact_id, probe, turn: what was asked when.
        source: the fact's source turn; ``value`` its value.
        X: ``(pool, len(FEATURE_NAMES))`` features; ``turns`` the candidates' turns (fused order).
        is_source / has_value: labels per candidate.
        weight: the query's weight in training (feedback queries weigh more).
    """

    session_id: str
    fact_id: str
    probe: str
    turn: int
    source: int
    value: str
    X: np.ndarray
    turns: np.ndarray
    is_source: np.ndarray
    has_value: np.ndarray
    weight: float = 1.0

    @property
    def label(self) -> np.ndarray:
        """Positive: the source message or a message holding the value."""
        return self.is_source | self.has_value


#: ``(messages) -> (predictions as stored dicts, embeddings (n, dim))``.
PredictFn = Callable[[Sequence[Message]], tuple[list[dict[str, Any]], np.ndarray]]


def _record(m: Message, text: str, pred: dict[str, Any], emb: np.ndarray, prev: Sequence[str]) -> NewRecord:
    context = "\n".join(t[:CONTEXT_CHARS] for t in prev[-CONTEXT_MESSAGES:])
    return NewRecord(message=m, text=text, prediction=pred, embedding=emb, context=context)


def mine_session(session: dict[str, Any], predict: PredictFn, embed_queries: Callable[[list[str]], np.ndarray],
                 asks: dict[int, list[dict[str, Any]]], weight: float = 1.0) -> list[Query]:
    """Replay one session and collect the queries ``asks`` (probe turn -> facts asked then).

    Args:
        session: an evaluation-format session (``messages``, ``key_facts``).
        predict: the scorer's predictions and embeddings for its messages.
        embed_queries: embeds probe texts (the scorer's embedder).
        asks: probe turn -> the key facts probed at that turn.
        weight: :attr:`Query.weight` of every query.
    """
    msgs = session_messages(session)
    if not asks:
        return []
    preds, embs = predict(msgs)
    texts = [m.text() for m in msgs]
    norm = [normalize(t) for t in texts]
    probes = sorted({f["probe"] for fs in asks.values() for f in fs})
    qemb = dict(zip(probes, embed_queries(probes), strict=True))
    store, rows, out = SQLiteStore(), SessionRows(), []
    sid = "s"
    last = max(asks)
    for t, m in enumerate(msgs):
        if t > last:
            break
        store.add(sid, [_record(m, texts[t], preds[t], embs[t], texts[:t])])
        rows.add(t, m.role, texts[t], embs[t], preds[t], bool(m.tool_calls))
        for f in asks.get(t, ()):
            hits = store.search(sid, f["probe"], k=RERANK_POOL, query_embedding=qemb[f["probe"]])
            if not hits:
                continue
            turns = np.array([h.turn for h in hits])
            X = pair_features(f["probe"], qemb[f["probe"]], hits, rows, turns.tolist())
            nv = normalize(f["value"])
            out.append(Query(session["session_id"], f["fact_id"], f["probe"], t, int(f["source_index"]), f["value"], X,
                             turns, turns == f["source_index"], np.array([bool(nv) and nv in norm[k] for k in turns]),
                             weight))
    store.close()
    return out


def session_asks(session: dict[str, Any], rng: random.Random) -> dict[int, list[dict[str, Any]]]:
    """Probe turn -> facts, with :func:`choose_turns` per fact."""
    probes = probe_turns(len(session["messages"]))
    asks: dict[int, list[dict[str, Any]]] = {}
    for f in session["key_facts"]:
        for t in choose_turns(int(f["source_index"]), probes, rng):
            asks.setdefault(t, []).append(f)
    return asks


#: Domain of each session source: an off-topic question comes from a session of another domain (a
#: flight question is not off-topic in a travel chat, a question about a patch is). ``None``: the
#: source's chained sessions mix domains (the bundled set: shop support, IT operations, coding and data
#: analysis in one session), so they neither ask nor get off-topic questions.
DOMAINS: dict[str, str | None] = {"swe_mini": "code", "bundled": None}
#: Off-topic questions asked per probe turn of a train session, and their weight (a normal probe 1).
OFFTOPIC_PER_TURN, OFFTOPIC_WEIGHT = 1, 1.0


def domain(session: dict[str, Any]) -> str | None:
    """The session's domain (:data:`DOMAINS`; every other dialogue source is ``"dialogue"``)."""
    return DOMAINS.get(str(session.get("source", "")), "dialogue")


def offtopic_pool(sessions: Iterable[dict[str, Any]]) -> dict[str, list[str]]:
    """Domain -> the distinct probe questions of its sessions' key facts, in a fixed order."""
    out: dict[str, dict[str, None]] = {}
    for s in sessions:
        d = domain(s)
        if d is None:
            continue
        for f in s["key_facts"]:
            if f.get("probe"):
                out.setdefault(d, {})[f["probe"]] = None
    return {d: list(ps) for d, ps in out.items()}


def offtopic_asks(session: dict[str, Any], pool: dict[str, list[str]], rng: random.Random,
                  per_turn: int = OFFTOPIC_PER_TURN) -> dict[int, list[dict[str, Any]]]:
    """Probe turn -> off-topic pseudo-facts: ``per_turn`` probe questions drawn from the ``pool`` of the
    other domains, with no source (``source_index`` -1) and no value, so that every candidate of their
    pools is a negative. Empty when no other domain has a question or the session has no domain."""
    own = domain(session)
    others = [q for d, qs in sorted(pool.items()) if d != own for q in qs]
    if own is None or not others:
        return {}
    out: dict[int, list[dict[str, Any]]] = {}
    for t in probe_turns(len(session["messages"])):
        for k in range(per_turn):
            out.setdefault(t, []).append({"fact_id": f"offtopic-{t}-{k}", "probe": rng.choice(others),
                                          "value": "", "source_index": -1})
    return out


def mine(sessions: Iterable[dict[str, Any]], predict: PredictFn, embed_queries: Callable[[list[str]], np.ndarray],
         seed: int = 0) -> list[Query]:
    """Queries of every session (see the module docstring), deterministic for a ``seed``."""
    out: list[Query] = []
    for s in sessions:
        rng = random.Random(f"{seed}:{s['session_id']}")
        out += mine_session(s, predict, embed_queries, session_asks(s, rng))
    return out


def feedback_asks(records: Iterable[dict[str, Any]], sessions: dict[str, dict[str, Any]]) -> dict[str, dict[int, list]]:
    """Session id -> probe turn -> facts, from the recall-failure records that page-in did not recover
    (``recovered_by_pagein`` false) and that name a session of ``sessions`` (their ``probe_turn`` and
    ``fact``; the fact is taken from the session so it has its source)."""
    out: dict[str, dict[int, list]] = {}
    seen: set[tuple[str, str, int]] = set()
    for r in records:
        s = sessions.get(str(r.get("session_id")))
        fact = r.get("fact") or {}
        turn = r.get("probe_turn")
        if s is None or not isinstance(turn, int) or not fact.get("fact_id") or r.get("recovered_by_pagein"):
            continue
        key = (s["session_id"], fact["fact_id"], turn)
        full = next((f for f in s["key_facts"] if f["fact_id"] == fact["fact_id"]), None)
        if key in seen or full is None or turn >= len(s["messages"]):
            continue
        seen.add(key)
        out.setdefault(s["session_id"], {}).setdefault(turn, []).append(full)
    return out


def stack(queries: Sequence[Query]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(X, y, sample weight, query index)`` of all candidates; each query's weight is spread so a
    query counts the same whatever its pool size, positives and negatives weighted apart."""
    X = np.vstack([q.X for q in queries]) if queries else np.zeros((0, len(FEATURE_NAMES)), np.float32)
    y = np.concatenate([q.label for q in queries]).astype(int) if queries else np.zeros(0, int)
    w, g = [], []
    for i, q in enumerate(queries):
        lab = q.label
        npos, nneg = max(1, int(lab.sum())), max(1, int((~lab).sum()))
        w.append(np.where(lab, q.weight / npos, q.weight * 4.0 / nneg))
        g.append(np.full(len(lab), i))
    return X, y, (np.concatenate(w) if w else np.zeros(0)), (np.concatenate(g) if g else np.zeros(0, int))


def fit(queries: Sequence[Query], seed: int = 0, max_iter: int = 300) -> Any:
    """A fitted ``HistGradientBoostingClassifier`` on the candidates of ``queries`` (early stopping on
    a tenth of them, scikit-learn's default above 10,000 rows). Learning rate 0.1 and up to 300 trees
    beat 0.06 and 100 trees on the dev sessions (source top-4 0.679 vs 0.656; held-out 0.666 vs 0.651).

    Raises:
        ValueError: no positive or no negative candidate.
    """
    from sklearn.ensemble import HistGradientBoostingClassifier

    X, y, w, _ = stack(queries)
    if not len(y) or y.min() == y.max():
        raise ValueError("ranker training needs positive and negative candidates; no probes matched a message")
    model = HistGradientBoostingClassifier(learning_rate=0.1, max_iter=max_iter, max_leaf_nodes=31,
                                           min_samples_leaf=40, l2_regularization=1.0, random_state=seed)
    return model.fit(X, y, sample_weight=w)


def _ranks(hit: np.ndarray) -> float:
    """1-based rank of the first True in ``hit`` (inf when none)."""
    idx = np.flatnonzero(hit)
    return float(idx[0] + 1) if len(idx) else float("inf")


def rank_metrics(queries: Sequence[Query], scores: Callable[[np.ndarray], np.ndarray] | None) -> dict[str, float]:
    """MRR and top-1/4/10 shares of the source and of the first value-holding message.

    ``scores`` = the ranker's probabilities for a feature matrix; ``None`` = the fused order.
    Returns ``{"n", "src_mrr", "src_top1", "src_top4", "src_top10", "val_mrr", "val_top1", "val_top4",
    "val_top10", "pool_src", "pool_val"}`` (fractions; ``pool_*`` = in the pool at all).
    """
    acc: dict[str, list[float]] = {k: [] for k in ("src", "val")}
    for q in queries:
        order = np.arange(len(q.turns)) if scores is None else np.lexsort((np.arange(len(q.turns)), -scores(q.X)))
        acc["src"].append(_ranks(q.is_source[order]))
        acc["val"].append(_ranks(q.label[order]))
    out: dict[str, float] = {"n": float(len(queries))}
    for k, ranks in acc.items():
        r = np.array(ranks) if ranks else np.array([np.inf])
        out[f"{k}_mrr"] = float(np.mean(1.0 / r))
        for top in (1, 4, 10):
            out[f"{k}_top{top}"] = float(np.mean(r <= top))
        out[f"pool_{k}"] = float(np.mean(np.isfinite(r)))
    return out


def sure_share(queries: Sequence[Query], scores: Callable[[np.ndarray], np.ndarray], at: float) -> float:
    """Share of ``queries`` whose pool has a candidate the ranker puts at ``at`` or more (what lets a
    query that resembles nothing in the session page in: :data:`ctxscore.window.pagein.QUERY_RANK_SURE`);
    ``nan`` without queries."""
    if not queries:
        return float("nan")
    return float(np.mean([float(np.max(scores(q.X))) >= at for q in queries]))


def by_source(queries: Sequence[Query]) -> dict[str, list[Query]]:
    """Queries grouped by the session's source (``dev/sgd/000`` -> ``sgd``)."""
    out: dict[str, list[Query]] = {}
    for q in queries:
        parts = q.session_id.split("/")
        src = parts[1].split("-")[0] if len(parts) > 1 else parts[0]
        out.setdefault(src, []).append(q)
    return out


# -------------------------------------------------------------------------------- caching, refilling
#: Columns of the ranker's features that come from the scorer's predictions (category probabilities,
#: value): mining fills them with zeros and :func:`refill` puts the trained scorer's in, so the
#: (slow) replay is cached while the classifier changes.
PRED_COLUMNS = np.array([i for i, n in enumerate(FEATURE_NAMES) if n.startswith("cat_") or n == "value"])


def blank_predictions(msgs: Sequence[Message]) -> list[dict[str, Any]]:
    """Predictions without category or value (mining fills :data:`PRED_COLUMNS` later)."""
    return [{"category": "reasoning", "probs": {}, "value": None, "source": "none"} for _ in msgs]


def refill(queries: Sequence[Query], preds: dict[str, np.ndarray]) -> None:
    """Put a scorer's predictions into :data:`PRED_COLUMNS` of every query's candidates.

    Args:
        queries: mined queries (changed in place).
        preds: session id -> ``(n_messages, 5)``: the four category probabilities (CATEGORIES order)
            and the value of each message.
    """
    for q in queries:
        p = preds.get(q.session_id)
        if p is None:
            continue
        ok = (q.turns >= 0) & (q.turns < len(p))
        block = np.zeros((len(q.turns), len(PRED_COLUMNS)), dtype=np.float32)
        block[ok] = p[q.turns[ok]]
        q.X[:, PRED_COLUMNS] = block


def save_queries(queries: Sequence[Query], path: Any) -> None:
    """Write mined queries to one ``.npz`` file (arrays plus a JSON list of the query fields)."""
    import json

    meta = [{"session_id": q.session_id, "fact_id": q.fact_id, "probe": q.probe, "turn": q.turn, "source": q.source,
             "value": q.value, "weight": q.weight, "n": len(q.turns)} for q in queries]

    def cat(xs: list[np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
        return np.concatenate(xs) if xs else np.zeros(shape)

    np.savez_compressed(path, X=cat([q.X for q in queries], (0, len(FEATURE_NAMES))).astype(np.float32),
                        turns=cat([q.turns for q in queries], (0,)).astype(np.int32),
                        is_source=cat([q.is_source for q in queries], (0,)).astype(bool),
                        has_value=cat([q.has_value for q in queries], (0,)).astype(bool),
                        meta=np.array(json.dumps(meta, ensure_ascii=False)))


def load_queries(path: Any) -> list[Query]:
    """Read queries written by :func:`save_queries`."""
    import json

    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["meta"]))
        X, turns, src, val = z["X"], z["turns"], z["is_source"], z["has_value"]
    out, k = [], 0
    for m in meta:
        n = m.pop("n")
        sl = slice(k, k + n)
        out.append(Query(X=X[sl].copy(), turns=turns[sl].astype(np.int64), is_source=src[sl], has_value=val[sl], **m))
        k += n
    return out


# ----------------------------------------------------------------------------------------- training
#: Weight of a query mined from a recall failure (against 1 for a train-session probe).
FEEDBACK_WEIGHT = 2.0
#: Source files whose content decides the mined pools (part of the cache key).
MINING_CODE = ("ctxscore/scoring/ranker.py", "training/ranker.py", "ctxscore/store/retrieval.py",
               "ctxscore/store/sqlite.py", "ctxscore/scoring/rules.py", "ctxscore/scoring/default_rules.toml")


def cache_key(sessions: Sequence[dict[str, Any]], embedder_key: str, seed: int, root: Any) -> str:
    """sha256 of what a mining run depends on: the sessions, the embedder, the seed, the pool size
    and the code in :data:`MINING_CODE` (``root``: the repository root)."""
    import hashlib
    import json
    from pathlib import Path

    h = hashlib.sha256(json.dumps([embedder_key, seed, RERANK_POOL], sort_keys=True).encode())
    for s in sessions:
        h.update(json.dumps(s, sort_keys=True, ensure_ascii=False).encode())
    for rel in MINING_CODE:
        p = Path(root) / rel
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def mine_set(sessions: Sequence[dict[str, Any]], embeddings: Sequence[np.ndarray],
             embed_queries: Callable[[list[str]], np.ndarray], seed: int = 0,
             asks: dict[str, dict[int, list[dict[str, Any]]]] | None = None, weight: float = 1.0,
             offtopic: dict[str, list[str]] | None = None) -> list[Query]:
    """Mine the queries of ``sessions`` whose message embeddings are ``embeddings`` (one array per
    session), the prediction columns blank (:func:`refill` fills them).

    ``asks`` (session id -> probe turn -> facts) replaces the default :func:`session_asks`; sessions
    it does not name are skipped. ``offtopic`` (an :func:`offtopic_pool`) mines the off-topic queries
    of :func:`offtopic_asks` instead.
    """
    out: list[Query] = []
    for s, E in zip(sessions, embeddings, strict=True):
        if offtopic is not None:
            a = offtopic_asks(s, offtopic, random.Random(f"{seed}:offtopic:{s['session_id']}"))
        elif asks is not None:
            a = asks.get(s["session_id"])
            if not a:
                continue
        else:
            a = session_asks(s, random.Random(f"{seed}:{s['session_id']}"))
        out += mine_session(s, lambda msgs, E=E: (blank_predictions(msgs), E), embed_queries, a, weight)
    return out


def cached_mine(name: str, sessions: Sequence[dict[str, Any]], embeddings: Sequence[np.ndarray],
                embed_queries: Callable[[list[str]], np.ndarray], embedder_key: str, cache_dir: Any,
                root: Any, seed: int = 0, offtopic: dict[str, list[str]] | None = None) -> list[Query]:
    """:func:`mine_set` behind an on-disk cache (``<cache_dir>/<name>-<key[:16]>.npz``; the key
    covers ``offtopic`` too)."""
    import hashlib
    import json
    from pathlib import Path

    key = cache_key(sessions, embedder_key, seed, root)
    if offtopic is not None:
        key = hashlib.sha256((key + json.dumps(offtopic, sort_keys=True, ensure_ascii=False)).encode()).hexdigest()
    path = Path(cache_dir) / f"{name}-{key[:16]}.npz"
    if path.is_file():
        try:
            return load_queries(path)
        except (OSError, ValueError, KeyError) as exc:
            log.warning("ranker cache %s unreadable (%s); mining again", path, exc)
    queries = mine_set(sessions, embeddings, embed_queries, seed, offtopic=offtopic,
                       weight=OFFTOPIC_WEIGHT if offtopic is not None else 1.0)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    save_queries(queries, tmp)
    tmp.replace(path)
    return queries


def metrics_table(results: dict[str, dict[str, dict[str, float]]]) -> str:
    """Markdown table of :func:`rank_metrics` for the fused and the learned order per evaluated set."""
    cols = ("src_mrr", "src_top1", "src_top4", "src_top10", "val_mrr", "val_top4", "pool_src")
    lines = ["| sessions | order | queries | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 3)]
    for name, by in results.items():
        for order in ("fused", "learned"):
            m = by[order]
            lines.append(f"| {name} | {order} | {int(m['n'])} | " + " | ".join(f"{m[c]:.3f}" for c in cols) + " |")
    return "\n".join(lines)
