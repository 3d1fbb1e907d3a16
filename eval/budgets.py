"""Token budgets: fractions of the full context at each turn, or absolute token counts."""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Absolute budgets of the issue (tokens).
DEFAULT_TOKEN_BUDGETS: tuple[int, ...] = (2000, 4000, 8000, 16000, 128000)
#: Fraction budgets run by default.
DEFAULT_FRACTIONS: tuple[float, ...] = (0.25, 0.5)
#: Smallest budget a fraction gives at an early turn (tokens), so the first turns are not starved.
DEFAULT_MIN_BUDGET = 256


@dataclass(frozen=True, slots=True)
class Budget:
    """A budget rule.

    Attributes:
        kind: ``"fraction"`` (of the full-context tokens at each turn) or ``"tokens"`` (fixed).
        value: the fraction in (0, 1] or the token count (> 0).
        min_tokens: floor of a fraction budget (tokens).
    """

    kind: str
    value: float
    min_tokens: int = DEFAULT_MIN_BUDGET

    def __post_init__(self) -> None:
        if self.kind == "fraction":
            if not 0 < self.value <= 1:
                raise ValueError(f"a fraction budget must be in (0, 1], got {self.value}")
        elif self.kind == "tokens":
            if self.value <= 0 or self.value != int(self.value):
                raise ValueError(f"a token budget must be a positive integer, got {self.value}")
        else:
            raise ValueError(f"budget kind must be 'fraction' or 'tokens', got {self.kind!r}")

    @property
    def label(self) -> str:
        """Short label: ``"25%"`` for a fraction, ``"4k"`` / ``"2500"`` for tokens."""
        if self.kind == "fraction":
            return f"{self.value * 100:g}%"
        v = int(self.value)
        return f"{v // 1000}k" if v % 1000 == 0 else str(v)

    @property
    def key(self) -> str:
        """Label safe for MLflow metric names and JSON keys: ``"f0.25"`` or ``"t4000"``."""
        return f"f{self.value:g}" if self.kind == "fraction" else f"t{int(self.value)}"

    def tokens_at(self, full_tokens: int) -> int:
        """Budget in tokens at a turn whose full context needs ``full_tokens`` tokens."""
        if self.kind == "tokens":
            return int(self.value)
        return max(self.min_tokens, math.floor(self.value * full_tokens))


def parse_budgets(fractions: list[float] | None, tokens: list[int] | None, min_tokens: int = DEFAULT_MIN_BUDGET) -> list[Budget]:
    """Budgets from CLI values; defaults (:data:`DEFAULT_FRACTIONS` and :data:`DEFAULT_TOKEN_BUDGETS`)
    when both are ``None``.

    Raises:
        ValueError: a fraction outside (0, 1] or a non-positive token budget.
    """
    if fractions is None and tokens is None:
        fractions, tokens = list(DEFAULT_FRACTIONS), list(DEFAULT_TOKEN_BUDGETS)
    out = [Budget("fraction", float(f), min_tokens) for f in dict.fromkeys(fractions or [])]
    out += [Budget("tokens", int(t), min_tokens) for t in dict.fromkeys(tokens or [])]
    if not out:
        raise ValueError("no budget given; pass --budget FRACTION and/or --budget-tokens N")
    return out
