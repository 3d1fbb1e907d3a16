"""Long evaluation sessions: held-out sessions chained into 50-600 message sessions.

Task-oriented dialogues (SGD, MultiWOZ, CrossWOZ) are chained the way one user works through many
tasks in one conversation; tau-bench trajectories are chained the way one agent serves customers
one after another (sorted by trial, then user, then task: a session holds different tasks, one
customer's tasks stay adjacent, and a task's other trials come in later sessions); mini-SWE-agent
trajectories are kept whole
(short ones chained); bundled sessions are chained per language. When a chained unit starts with
the same system message as the chain, that repeated system message is dropped, and so is a message
the runtime would refuse (empty text that is neither a tool result nor a tool call).

Each output line is the evaluation session format of ``docs/contracts.md``: ``session_id``,
``source``, ``language``, ``split``, ``members`` (the original session ids), ``groups`` (their
split groups), ``messages``
(OpenAI-style, each with the README ``id``) and ``key_facts`` whose ``source_index`` points into
the chained messages and whose ``value`` is an exact substring of that message's ``content``;
fact ids are prefixed with their member's session id when they do not start with it already.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from .facts import check_facts
from .schema import CorpusSession
from .splits import unit_hash

#: Length bounds of an evaluation session, in messages.
MIN_MESSAGES = 50
MAX_MESSAGES = 600

#: Per-source target length range (messages) drawn uniformly for each chained session.
TARGETS: dict[str, tuple[int, int]] = {
    "sgd": (120, 480),
    "multiwoz": (100, 360),
    "crosswoz": (100, 360),
    "tau_airline": (60, 220),
    "swe_mini": (MIN_MESSAGES, MIN_MESSAGES),
    "bundled": (MIN_MESSAGES, 200),
}

#: Default number of sessions per source for the held-out (eval) and dev files.
EVAL_COUNTS: dict[str, int] = {"sgd": 8, "multiwoz": 5, "crosswoz": 5, "tau_airline": 4, "swe_mini": 10, "bundled": 6}
DEV_COUNTS: dict[str, int] = {"sgd": 3, "multiwoz": 2, "crosswoz": 2, "tau_airline": 2, "swe_mini": 4, "bundled": 3}
#: Default number of long sessions per source chained from the train split (``train_sessions.jsonl``): the
#: material of the outcome labels (which messages later probes need) and of the page-in ranker's pairs.
#: Half these sessions (about 13,000 messages) gave the ranker a held-out source MRR of 0.492; these
#: (about 25,000 messages) 0.498 with a pool of 60 hits.
TRAIN_COUNTS: dict[str, int] = {"sgd": 32, "multiwoz": 20, "crosswoz": 20, "tau_airline": 14, "swe_mini": 32,
                                "bundled": 8}


def eval_message(m: dict[str, Any]) -> dict[str, Any]:
    """OpenAI-style message with the README ``id`` (no ``null`` optional fields)."""
    out: dict[str, Any] = {"id": m["id"], "role": m["role"], "content": m["content"] or ""}
    if m.get("name"):
        out["name"] = m["name"]
    if m.get("tool_calls"):
        out["tool_calls"] = m["tool_calls"]
    if m.get("tool_call_id"):
        out["tool_call_id"] = m["tool_call_id"]
    return out


def chain(units: Sequence[CorpusSession], session_id: str, split: str) -> dict[str, Any]:
    """One evaluation session made of ``units`` in order (see the module docstring).

    Raises:
        ValueError: ``units`` is empty or a shifted key fact no longer holds (a bug).
    """
    if not units:
        raise ValueError("cannot chain zero sessions")
    messages: list[dict[str, Any]] = []
    facts: list[dict[str, Any]] = []
    first_system = None
    for u in units:
        msgs = u["messages"]
        skip = 0
        if msgs and msgs[0]["role"] == "system":
            if first_system is None and not messages:
                first_system = msgs[0]["content"]
            elif msgs[0]["content"] == first_system:
                skip = 1
        where: dict[int, int] = {}  # the unit's message index -> the chained session's
        for i, m in enumerate(msgs[skip:], start=skip):
            if not (m["content"] or "").strip() and not m.get("tool_calls") and m["role"] != "tool":
                continue  # an empty turn of the corpus (SGD has a few empty assistant turns): nothing to keep
            where[i] = len(messages)
            messages.append(eval_message(m))
        for f in u.get("key_facts") or []:
            if f["source_index"] not in where:
                continue
            fid = f["fact_id"] if f["fact_id"].startswith(u["session_id"]) else f"{u['session_id']}:{f['fact_id']}"
            facts.append({**f, "fact_id": fid, "source_index": where[f["source_index"]]})
    languages = sorted({u["language"] for u in units})
    out = {
        "session_id": session_id,
        "source": units[0]["source"],
        "language": languages[0] if len(languages) == 1 else "mixed",
        "split": split,
        "members": [u["session_id"] for u in units],
        "groups": list(dict.fromkeys(u["group"] for u in units)),
        "n_messages": len(messages),
        "messages": messages,
        "key_facts": facts,
    }
    problems = check_facts(messages, facts)
    if problems:
        raise ValueError(f"{session_id}: key facts broken by chaining: {problems[:3]}")
    return out


def _order(source: str, pool: list[CorpusSession], seed: int) -> list[CorpusSession]:
    if source == "tau_airline":
        return sorted(pool, key=lambda s: (s["meta"]["trial"], s["meta"].get("user_id") or "", s["meta"]["task_id"]))
    if source == "bundled":
        return sorted(pool, key=lambda s: (s["language"], unit_hash(s["session_id"], f"chain{seed}")))
    # upstream test first, then a seeded shuffle
    return sorted(pool, key=lambda s: (s.get("upstream_split") != "test", unit_hash(s["session_id"], f"chain{seed}")))


def _pack(units: list[CorpusSession], n: int, rng: random.Random, lo: int, hi: int,
          min_messages: int, max_messages: int) -> list[list[CorpusSession]]:
    """Greedy packing of ``units`` (in order) into at most ``n`` groups of target length."""
    made: list[list[CorpusSession]] = []
    cur: list[CorpusSession] = []
    length = 0
    target = rng.randint(lo, hi)
    for u in units:
        if len(made) >= n:
            break
        size = len(u["messages"])
        if size > max_messages:
            continue
        if cur and length + size > max_messages:
            if length >= min_messages:
                made.append(cur)
            cur, length, target = [], 0, rng.randint(lo, hi)
            if len(made) >= n:
                break
        cur.append(u)
        length += size
        if length >= target:
            made.append(cur)
            cur, length, target = [], 0, rng.randint(lo, hi)
    if len(made) < n and cur and (length >= min_messages or not made):
        made.append(cur)  # leftovers, or a pool too small for one full-length session
    return made


def build_eval_sessions(
    pools: dict[str, list[CorpusSession]],
    split: str,
    counts: dict[str, int],
    *,
    seed: int = 0,
    min_messages: int = MIN_MESSAGES,
    max_messages: int = MAX_MESSAGES,
) -> list[dict[str, Any]]:
    """Chained evaluation sessions for ``split`` from per-source pools of held-out sessions.

    For each source (in ``counts`` order) units are taken in a deterministic order and appended
    to the current session until it reaches a target length drawn from :data:`TARGETS` (seeded
    by ``seed``, ``split`` and source); a unit that would push it past ``max_messages`` closes
    it. At most ``counts[source]`` sessions per source. Sessions shorter than ``min_messages`` are
    dropped, except that a pool too small for one full-length session yields one session with
    everything (so a tiny bundled set still gives an evaluation session). Bundled sessions are
    chained per language (the count is per language).
    """
    out: list[dict[str, Any]] = []
    for source, n in counts.items():
        pool = pools.get(source) or []
        if n <= 0 or not pool:
            continue
        lo, hi = TARGETS.get(source, (MIN_MESSAGES, 300))
        units = _order(source, pool, seed)
        by_lang = {"": units}
        if source == "bundled":
            by_lang = {}
            for u in units:
                by_lang.setdefault(u["language"], []).append(u)
        for lang, group in by_lang.items():
            rng = random.Random(f"{seed}:{split}:{source}:{lang}")
            tag = f"{source}-{lang}" if lang else source
            for k, members in enumerate(_pack(group, n, rng, lo, hi, min_messages, max_messages)):
                out.append(chain(members, f"{split}/{tag}/{k:03d}", split))
    return out
