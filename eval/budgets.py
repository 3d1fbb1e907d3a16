"""Token budgets: a fraction of the full context at each turn, a fraction of the session's final
length fixed for the whole replay, or an absolute token count.

==================  =========  ================  ==========================================================
kind                key        label             budget at turn ``t`` (tokens)
==================  =========  ================  ==========================================================
``fraction``        ``f0.25``  ``25%``           ``max(min_tokens, floor(0.25 * full[t]))``
``final_fraction``  ``e0.25``  ``25% of end``    ``max(min_tokens, floor(0.25 * full[-1]))``, every turn
``tokens``          ``t4000``  ``4k``            ``4000``
==================  =========  ================  ==========================================================

``full[t]`` is the full-context tokens after message ``t`` (every message verbatim plus the reply
priming) and ``full[-1]`` the session's final full-context tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Absolute budgets of the issue (tokens).
DEFAULT_TOKEN_BUDGETS: tuple[int, ...] = (2000, 4000, 8000, 16000, 128000)
#: Fraction budgets run by default.
DEFAULT_FRACTIONS: tuple[float, ...] = (0.25, 0.5)
#: Fractions of the session's final length run by default.
DEFAULT_FINAL_FRACTIONS: tuple[float, ...] = (0.25,)
#: The budget kinds, in report order.
KINDS: tuple[str, ...] = ("fraction", "final_fraction", "tokens")
#: Smallest budget a fraction gives at an early turn (tokens), so the first turns are not starved.
DEFAULT_MIN_BUDGET = 256


@dataclass(frozen=True, slots=True)
class Budget:
    """A budget rule.

    Attributes:
        kind: ``"fraction"`` (of the full-context tokens at each turn), ``"final_fraction"`` (of the
            session's final full-context tokens, fixed for the whole replay) or ``"tokens"`` (fixed).
        value: the fraction in (0, 1] or the token count (> 0).
        min_tokens: floor of both fraction budgets (tokens).

    Raises:
        ValueError: an unknown kind, a fraction outside (0, 1] or a token count that is not a
            positive integer.
    """

    kind: str
    value: float
    min_tokens: int = DEFAULT_MIN_BUDGET

    def __post_init__(self) -> None:
        if self.kind in ("fraction", "final_fraction"):
            if not 0 < self.value <= 1:
                raise ValueError(f"a fraction budget must be in (0, 1], got {self.value}")
        elif self.kind == "tokens":
            if self.value <= 0 or self.value != int(self.value):
                raise ValueError(f"a token budget must be a positive integer, got {self.value}")
        else:
            raise ValueError(f"budget kind must be one of {', '.join(KINDS)}, got {self.kind!r}")

    @property
    def label(self) -> str:
        """Short label: ``"25%"`` for a fraction, ``"25% of end"`` for a fraction of the final
        length, ``"4k"`` / ``"2500"`` for tokens."""
        if self.kind == "fraction":
            return f"{self.value * 100:g}%"
        if self.kind == "final_fraction":
            return f"{self.value * 100:g}% of end"
        v = int(self.value)
        return f"{v // 1000}k" if v % 1000 == 0 else str(v)

    @property
    def key(self) -> str:
        """Label safe for MLflow metric names and JSON keys: ``"f0.25"``, ``"e0.25"`` or ``"t4000"``."""
        if self.kind == "fraction":
            return f"f{self.value:g}"
        if self.kind == "final_fraction":
            return f"e{self.value:g}"
        return f"t{int(self.value)}"

    def tokens_at(self, full_tokens: int, final_tokens: int | None = None) -> int:
        """Budget in tokens at a turn whose full context needs ``full_tokens`` tokens, in a session
        whose full context ends at ``final_tokens`` tokens.

        Raises:
            ValueError: a ``final_fraction`` budget without ``final_tokens``.
        """
        if self.kind == "tokens":
            return int(self.value)
        if self.kind == "final_fraction":
            if final_tokens is None:
                raise ValueError(f"budget {self.key} is a fraction of the session's final length: pass final_tokens")
            return max(self.min_tokens, math.floor(self.value * final_tokens))
        return max(self.min_tokens, math.floor(self.value * full_tokens))


def parse_budgets(fractions: list[float] | None, tokens: list[int] | None, min_tokens: int = DEFAULT_MIN_BUDGET,
                  finals: list[float] | None = None) -> list[Budget]:
    """Budgets from CLI values (``--budget``, ``--budget-tokens``, ``--budget-final``), in the order
    fractions, fractions of the final length, tokens, each without repeats; the defaults
    (:data:`DEFAULT_FRACTIONS`, :data:`DEFAULT_FINAL_FRACTIONS`, :data:`DEFAULT_TOKEN_BUDGETS`) when
    all three are ``None``.

    Raises:
        ValueError: a fraction outside (0, 1], a non-positive token budget, or no budget at all
            (empty lists).
    """
    if fractions is None and tokens is None and finals is None:
        fractions, finals, tokens = list(DEFAULT_FRACTIONS), list(DEFAULT_FINAL_FRACTIONS), list(DEFAULT_TOKEN_BUDGETS)
    out = [Budget("fraction", float(f), min_tokens) for f in dict.fromkeys(fractions or [])]
    out += [Budget("final_fraction", float(f), min_tokens) for f in dict.fromkeys(finals or [])]
    out += [Budget("tokens", int(t), min_tokens) for t in dict.fromkeys(tokens or [])]
    if not out:
        raise ValueError("no budget given; pass --budget FRACTION, --budget-final FRACTION and/or --budget-tokens N")
    return out
