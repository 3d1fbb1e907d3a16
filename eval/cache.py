"""Prompt-cache stability: how much of each window repeats the previous window's prefix.

Provider prompt caches (OpenAI, Anthropic, ...) bill the part of a request that repeats the start of
an earlier request at a fraction of the normal price. A context policy keeps that part large by
changing the window only at its end. Per turn ``t`` of a replay (the no-query windows, one per
message; page-in builds at probes are not part of the sequence):

- ``cached[t]``: the tokens of the longest common prefix, message by message, of window ``t`` and
  window ``t - 1`` (two messages are the same when their OpenAI-style dicts are equal), each message
  counted with the evaluation's :class:`ctxscore.tokens.TokenCounter` (``count_message``: content,
  tool calls, ids and chat overhead; the reply priming is not part of any message). ``cached[0] = 0``.
- ``cache_reuse`` = ``sum(cached) / sum(window tokens)``: the per-turn share of reused tokens
  averaged over turns weighted by window tokens.
- ``effective_token_ratio`` = ``sum(window tokens - cached + CACHED_PRICE * cached) / sum(full-context
  tokens)``: the cost relative to sending the full context uncached, with cached tokens priced at
  :data:`CACHED_PRICE` of uncached ones (``token_ratio`` is the same sum with every token at full
  price).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ctxscore.tokens import TokenCounter

#: Price of a cached prompt token relative to an uncached one.
CACHED_PRICE = 0.1


class PrefixReuse:
    """Tracks consecutive windows of one replay and gives the reused prefix tokens of each.

    Work per window is proportional to its common prefix (compared message by message) plus the
    messages after it (counted); the previous window's per-message counts are kept.

    Args:
        counter: the token counter (the same one every policy's figures use).
    """

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self._prev: Sequence[dict[str, Any]] = ()
        self._cum: list[int] = [0]  # _cum[i] = tokens of the previous window's first i messages

    def update(self, messages: Sequence[dict[str, Any]]) -> int:
        """Record the next window's messages; return the tokens of its longest common message prefix
        with the previous window (0 for the first window).

        Raises:
            InputError: a message that is not a valid OpenAI-style message (from the counter).
        """
        prev = self._prev
        n = min(len(prev), len(messages))
        same = 0
        while same < n and (messages[same] is prev[same] or messages[same] == prev[same]):
            same += 1
        reused = self._cum[same]
        cum = self._cum[: same + 1]
        total = reused
        for m in messages[same:]:
            total += self.counter.count_message(m)
            cum.append(total)
        self._prev, self._cum = list(messages), cum
        return reused


def cache_figures(tokens: Sequence[int], cached: Sequence[int], full: Sequence[int],
                  price: float = CACHED_PRICE) -> dict[str, float | None]:
    """``cache_reuse`` and ``effective_token_ratio`` of pooled turns (see the module docstring).

    Args:
        tokens: window tokens per turn.
        cached: reused prefix tokens per turn (same length as ``tokens``).
        full: full-context tokens per turn (same length).
        price: price of a cached token relative to an uncached one, in [0, 1].

    Returns:
        ``{"cache_reuse", "effective_token_ratio"}``, rounded to 4 decimals; ``None`` where the
        denominator is 0.

    Raises:
        ValueError: lists of different lengths, a turn with more cached than window tokens, or a
            price outside [0, 1].
    """
    if not len(tokens) == len(cached) == len(full):
        raise ValueError(f"tokens, cached and full need one entry per turn, got {len(tokens)}, {len(cached)}, {len(full)}")
    if not 0 <= price <= 1:
        raise ValueError(f"the cached-token price must be in [0, 1], got {price}")
    if any(c > t for c, t in zip(cached, tokens, strict=True)):
        raise ValueError("a turn has more cached tokens than window tokens")
    tok, hit, ful = sum(tokens), sum(cached), sum(full)
    return {"cache_reuse": round(hit / tok, 4) if tok else None,
            "effective_token_ratio": round((tok - hit + price * hit) / ful, 4) if ful else None}
