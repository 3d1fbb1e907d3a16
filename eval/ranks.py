"""Source rank: where the message that holds a fact ranks when the fact's probe is searched.

Page-in can only bring back what the search finds. For every key fact of a session, at the
session's end, the managed policy's manager searches its store with the fact's probe
(``ContextManager.search(probe, k=RANK_K)``: the same hybrid search page-in uses, over every stored
original whatever the budget or the tiers), and the fact's **source rank** is the 1-based position
of the fact's source message id among the hits, or ``None`` ("not in the top 40"). The rank depends
on the scorer (its embeddings), not on the budget or the layers, so it is computed once per session
and managed scorer (``rules``, ``learned``).

Figures (:func:`rank_figures`), over facts: ``top1`` / ``top4`` / ``top10`` / ``top40`` = share of
facts whose source ranks at or above 1 / 4 / 10 / 40 (page-in shows up to ``Policy.page_in_k`` = 20 units),
``not_found`` = 1 - ``top40``, ``mrr`` = mean of 1 / rank (0 when not found); the same per session
source and per fact kind. Beside them, three readings of the same search:

- ``value``: the same shares for the first hit whose text holds the fact's value (normalised
  presence, the recall check): what page-in needs, since any message holding the value answers.
- ``distinct``: the figures over the facts whose probe text no other fact of the session shares.
- ``ceiling``: the highest ``top1`` / ``top4`` / ``top10`` any search could reach. Facts that share
  one probe text (a chained session's ten "Which hotel did the user settle on?") get one hit list,
  so of a group of ``n`` at most ``min(n, k)`` have their source in the top ``k``; the ceiling is
  the sum of ``min(n, k)`` over the groups, over the facts.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from .sessions import EvalSession
from .textnorm import message_search_text, normalize, present

#: Hits searched per probe (the page-in search depth, ``ctxscore.window.pagein.SEARCH_HITS``).
RANK_K = 40
#: The cut-offs reported.
TOPS: tuple[int, ...] = (1, 4, 10, 40)


def source_ranks(session: EvalSession, search: Callable[[str, int], list[str]], k: int = RANK_K) -> list[dict[str, Any]]:
    """The source rank of every key fact of ``session``.

    Args:
        session: the replayed session.
        search: ``(query, k) -> message ids, best first`` (e.g. :meth:`eval.policies.Managed.search_ids`),
            called once per distinct probe.
        k: hits searched per probe (> 0).

    Returns:
        One ``{"session_id", "fact_id", "kind", "source", "probe", "message_id", "rank", "value_rank",
        "same_probe"}`` per fact in the session's order; ``rank`` is the source's 1-based position, or
        ``None`` when the source is not among the ``k`` hits; ``value_rank`` the same for the first
        hit holding the fact's value; ``same_probe`` the number of the session's facts (this one
        included) whose probe text is this one's.

    Raises:
        ValueError: ``k`` < 1.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    hits: dict[str, list[str]] = {}
    same = Counter(f.probe for f in session.key_facts)
    texts: dict[str, str] = {}
    index = {session.message_id(i): i for i in range(len(session.messages))}

    def text(mid: str) -> str:
        if mid not in texts:
            texts[mid] = normalize(message_search_text(session.messages[index[mid]])) if mid in index else ""
        return texts[mid]

    out = []
    for f in session.key_facts:
        if f.probe not in hits:
            hits[f.probe] = list(search(f.probe, k))[:k]
        mid = session.message_id(f.source_index)
        ids = hits[f.probe]
        value_rank = next((i + 1 for i, h in enumerate(ids) if present(f.value, text(h))), None)
        out.append({"session_id": session.session_id, "fact_id": f.fact_id, "kind": f.kind, "source": session.source,
                    "probe": f.probe, "message_id": mid, "rank": ids.index(mid) + 1 if mid in ids else None,
                    "value_rank": value_rank, "same_probe": same[f.probe]})
    return out


def _block(ranks: list[int | None]) -> dict[str, Any]:
    n = len(ranks)
    out: dict[str, Any] = {"facts": n}
    for t in TOPS:
        out[f"top{t}"] = round(sum(1 for r in ranks if r is not None and r <= t) / n, 4) if n else None
    out["not_found"] = round(sum(1 for r in ranks if r is None) / n, 4) if n else None
    out["mrr"] = round(sum(1 / r for r in ranks if r is not None) / n, 4) if n else None
    return out


def _ceiling(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The highest top-k shares a search could reach, given facts that share one probe text."""
    groups = Counter((r["session_id"], r["probe"]) for r in records)
    n = len(records)
    return {f"top{t}": round(sum(min(c, t) for c in groups.values()) / n, 4) if n else None for t in TOPS[:3]}


def rank_figures(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Figures of source-rank records (see the module docstring).

    Returns:
        ``{"facts", "top1", "top4", "top10", "top40", "not_found", "mrr", "value": {...},
        "distinct": {...}, "ceiling": {"top1", "top4", "top10"}, "by_source": {source: {...}},
        "by_kind": {kind: {...}}}``; ``value`` and ``distinct`` are blocks like the whole (``value``
        with the value rank in place of the source rank); the shares are ``None`` when there is no fact.
    """
    records = list(records)
    by_source: dict[str, list[dict[str, Any]]] = defaultdict(list)
    by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_source[r["source"]].append(r)
        by_kind[r["kind"]].append(r)
    return {**_group(records),
            "by_source": {s: _group(v) for s, v in sorted(by_source.items())},
            "by_kind": {k: _group(v) for k, v in sorted(by_kind.items())}}


def _group(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of one group of records: the source-rank block, ``value``, ``distinct`` and ``ceiling``."""
    return {**_block([r["rank"] for r in records]),
            "value": _block([r["value_rank"] for r in records]),
            "distinct": _block([r["rank"] for r in records if r["same_probe"] == 1]),
            "ceiling": _ceiling(records)}
