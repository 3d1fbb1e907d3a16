"""The value of a message: one formula, one recency function, and the explanation of both.

``value = clip(intrinsic x recency x references x relevance, 0, 1)`` where

- ``intrinsic = blend x learned_value + (1 - blend) x rule_value`` (the learned term only when the
  scorer predicts a value), ``rule_value = base x entity_density x confirmation x token_cost``;
- ``base``: the category's base weight (instruction 0.4, key_state 0.3, reasoning 0.2, failure 0.1);
- ``entity_density = 1 + step x min(2, 50 x entities / tokens)``;
- ``confirmation``: ``confirmation_boost`` when the user confirmed the message right after, else 1;
- ``token_cost = 1 / (1 + slope x log2(tokens / pivot))`` above ``pivot`` tokens, else 1;
- ``recency = boost x (floor + (1 - floor) x 0.5 ** (age_in_turns / half_life))``;
- ``references = 1 + step x min(later messages that mention its entities, cap)``;
- ``relevance = 1 + (boost - 1) x`` the message's search score for the query / the best score.

Parameters: :class:`ctxscore.config.ValueFactors` (the rule file's ``[factors]``). Every factor is
reported per decision (:meth:`ValueModel.explain`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..config import ValueFactors
from ..messages import Role
from .history import Entry, History

#: A user message of at most this many characters can confirm the previous answer.
CONFIRM_SHORT = 80
#: A new mention credits at most this many earlier messages naming the same entity.
REFERENCE_WINDOW = 8


def _entity_key(e: str) -> str | None:
    k = e.strip("\"'`“”「」《》‘’").lower()
    return k if len(k) >= 3 else None


class ValueModel:
    """Computes and explains values for one session's :class:`~ctxscore.window.history.History`.

    Args:
        factors: the factor parameters.
        base_weights: category -> base weight in [0, 1].
        blend: weight of the learned value, in [0, 1].
    """

    def __init__(self, factors: ValueFactors, base_weights: dict[str, float], blend: float) -> None:
        self.f = factors
        self.base_weights = base_weights
        self.blend = blend
        self._postings: dict[str, list[int]] = {}

    def recency(self, age: Any) -> Any:
        """Recency factor of messages ``age`` turns old (a number or an array)."""
        f = self.f
        return f.recency_boost * (f.recency_floor + (1.0 - f.recency_floor) * np.power(0.5, age / f.recency_half_life_turns))

    def references(self, refs: Any) -> Any:
        """References factor for ``refs`` later mentions (a number or an array)."""
        return 1.0 + self.f.reference_step * np.minimum(refs, self.f.reference_cap)

    def relevance(self, rel: Any) -> Any:
        """Relevance factor for a normalised search score in [0, 1] (a number or an array)."""
        return 1.0 + (self.f.relevance_boost - 1.0) * rel

    def static(self, e: Entry) -> tuple[dict[str, float], float]:
        """The factors of ``e`` that do not change with time, and its intrinsic value."""
        f = self.f
        base = self.base_weights[e.category]
        density = 1.0 + f.entity_density_step * min(2.0, 50.0 * len(e.entities) / max(1, e.tokens))
        confirmation = f.confirmation_boost if e.confirmed else 1.0
        token_cost = (1.0 / (1.0 + f.token_cost_slope * math.log2(e.tokens / f.token_cost_pivot))
                      if e.tokens > f.token_cost_pivot else 1.0)
        static = {"base": base, "entity_density": density, "confirmation": confirmation, "token_cost": token_cost}
        rule_value = base * density * confirmation * token_cost
        if e.pred.value is None:
            return static, rule_value
        static["learned_value"] = float(e.pred.value)
        static["blend"] = self.blend
        return static, self.blend * float(e.pred.value) + (1.0 - self.blend) * rule_value

    def added(self, history: History, idx: int, confirms: bool) -> None:
        """Update values after entry ``idx`` was appended: its intrinsic value, the later-reference
        counts of earlier messages that share its entities, and (when ``confirms``: a user message
        of at most :data:`CONFIRM_SHORT` characters with a confirmation keyword, as
        :func:`ctxscore.window.ingest.append` decides) the confirmation of the assistant message it answers."""
        e = history.entries[idx]
        e.static, intr = self.static(e)
        history.intr.a[idx] = intr
        refs = history.refs.a
        for ent in e.entities:
            key = _entity_key(ent)
            if key is None:
                continue
            post = self._postings.setdefault(key, [])
            for j in post[-REFERENCE_WINDOW:]:
                refs[j] += 1
            if not post or post[-1] != idx:
                post.append(idx)
        if confirms:
            for j in range(idx - 1, -1, -1):
                prev = history.entries[j]
                if prev.msg.role == Role.ASSISTANT:
                    prev.confirmed = True
                    prev.static, history.intr.a[j] = self.static(prev)
                    break
                if prev.msg.role == Role.USER:
                    break

    def values(self, history: History, relevance: dict[str, float]) -> tuple[np.ndarray, np.ndarray]:
        """Value of every entry, vectorised: ``(values (n,), normalised relevance (n,))``.

        ``relevance`` maps message ids to their search score / the best score for the query.
        """
        n = len(history)
        rel = np.zeros(n)
        for mid, score in relevance.items():
            i = history.ids.get(mid)
            if i is not None:
                rel[i] = score
        age = (history.turn_no - history.turn.a[:n]).astype(np.float64)
        val = history.intr.a[:n] * self.recency(age) * self.references(history.refs.a[:n]) * self.relevance(rel)
        return np.clip(val, 0.0, 1.0), rel

    def explain(self, e: Entry, turn_no: int, refs: int, rel: float) -> dict[str, float]:
        """Every factor of ``e`` as it was at a build (turn number ``turn_no``), for its decision."""
        out = dict(e.static)
        out["recency"] = float(self.recency(float(turn_no - e.turn_no)))
        out["references"] = float(self.references(refs))
        out["relevance"] = float(self.relevance(rel))
        return out
