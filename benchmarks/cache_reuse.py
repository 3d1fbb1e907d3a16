"""Benchmark of prompt-cache reuse as a proxy or an agent loop sees it: a query build every turn.

The evaluation's ``cache reuse`` (``python -m eval run``) compares the windows built without a query,
one per message. The OpenAI-compatible proxy and the LangChain middleware build every window with
the last user message as the query, so page-in changes the window from turn to turn as well. This
script replays sessions both ways and prints, per policy, budget and source, the share of window
tokens that repeat the previous window's identical message prefix (``eval.cache.PrefixReuse``, what
a provider's prompt cache reuses) beside ``trim_messages`` (which ignores the query), with the mean
window tokens a build and its effective cost (uncached tokens + :data:`CACHED_PRICE` x cached ones):
a window that uses more of its budget has a lower reuse share at the same cached prefix.

``--at request`` builds only where a client sends a request (before each assistant message: a
dialogue's user turns, each step of an agent's tool loop), as the proxy does; the default builds
after every message, as the evaluation counts.

Usage: ``python benchmarks/cache_reuse.py [--sessions data/processed/dev_sessions.jsonl]
[--budget-tokens 2000 4000] [--policies rules,trim_messages] [--limit N] [--at message|request]`` (``learned`` loads the
packaged scorer; the processed sessions come from ``python -m training.data build``).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: import the checkout's packages

from ctxscore.messages import last_user_text  # noqa: E402
from ctxscore.tokens import TokenCounter  # noqa: E402
from eval.cache import PrefixReuse  # noqa: E402
from eval.policies import Managed, TrimMessages  # noqa: E402
from eval.sessions import load_sessions_file  # noqa: E402


def make(name: str, session_id: str, counter: TokenCounter):
    """A fresh policy: ``trim_messages``, ``rules`` or ``learned`` (the packaged scorer)."""
    if name == "trim_messages":
        return TrimMessages(counter)
    if name in ("rules", "learned"):
        return Managed(name, "rules" if name == "rules" else "auto", session_id)
    raise SystemExit(f"unknown policy {name!r}: use trim_messages, rules or learned")


#: What a provider bills a cached prompt token, as a fraction of an uncached one (the issue's figure;
#: OpenAI bills cached input at 0.1-0.5 of the price depending on the model).
CACHED_PRICE = 0.1


def builds_at(session, at: str) -> list[bool]:
    """Per message of ``session``: whether a window is built once it is added: after every message
    (``message``, the evaluation's count), or only where a client sends a request (``request``: the
    next message is the assistant's; a dialogue's user turns, an agent's steps), as the proxy builds."""
    msgs = session.messages
    if at == "message":
        return [True] * len(msgs)
    return [i + 1 < len(msgs) and msgs[i + 1].get("role") == "assistant" for i in range(len(msgs))]


def replay(session, name: str, budget: int, with_query: bool, counter: TokenCounter,
           at: str = "message") -> tuple[int, int]:
    """(window tokens, reused prefix tokens) summed over the builds of one replay (:func:`builds_at`)."""
    pol = make(name, session.session_id, counter)
    reuse = PrefixReuse(counter)
    tokens = cached = 0
    query = None
    users: list[dict] = []
    try:
        for m, build in zip(session.messages, builds_at(session, at), strict=True):
            pol.add(m)
            if with_query and m.get("role") == "user":
                users.append(m)
                query = last_user_text(users)  # the proxy's query: the last user message that is no tool observation
            if not build:
                continue
            win = pol.build(budget, query)
            tokens += win.tokens
            cached += min(reuse.update(win.messages), win.tokens)
    finally:
        pol.close()
    return tokens, cached


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", default="data/processed/dev_sessions.jsonl")
    ap.add_argument("--budget-tokens", type=int, nargs="+", default=[2000, 4000])
    ap.add_argument("--policies", default="rules,trim_messages")
    ap.add_argument("--limit", type=int, default=None, help="replay only the first N sessions")
    ap.add_argument("--at", choices=("message", "request"), default="message",
                    help="build after every message (default) or only before each assistant message, as a client asks")
    args = ap.parse_args()
    logging.disable(logging.WARNING)  # pinned-overflow warnings of tight budgets are expected here
    sessions = load_sessions_file(args.sessions)[: args.limit]
    counter = TokenCounter()
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    builds = sum(sum(builds_at(s, args.at)) for s in sessions) or 1
    print(f"prompt-cache reuse, {len(sessions)} sessions of {args.sessions}, a build a {args.at} ({builds} builds); "
          "query: the last user message or none")
    print(f"{'policy':<14} {'budget':>6} {'query':>6} {'reuse':>6} {'tokens':>7} {'cost':>7}  by source  "
          f"(tokens: mean window tokens a build; cost: its uncached tokens + {CACHED_PRICE} x its cached ones)")
    for b in args.budget_tokens:
        for name in policies:
            for with_query in ((False,) if name == "trim_messages" else (False, True)):
                t0 = time.perf_counter()
                per: dict[str, list[int]] = defaultdict(lambda: [0, 0])
                for s in sessions:
                    tok, hit = replay(s, name, b, with_query, counter, args.at)
                    per[s.source][0] += tok
                    per[s.source][1] += hit
                tok = sum(v[0] for v in per.values())
                hit = sum(v[1] for v in per.values())
                cost = (tok - hit + CACHED_PRICE * hit) / builds
                by = "  ".join(f"{k} {v[1] / v[0]:.3f}" for k, v in sorted(per.items()) if v[0])
                print(f"{name:<14} {b:>6} {'last' if with_query else 'none':>6} {hit / tok if tok else 0:>6.3f} "
                      f"{tok / builds:>7.0f} {cost:>7.0f}  {by}  ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
