"""The scorer interface the context manager uses, and the rules-only scorer.

A scorer turns messages into a :class:`Prediction` (category, class probabilities and an intrinsic
value in [0, 1]). It is called once per message (the manager caches the result); the context-dependent
value factors (recency, later references, query relevance) are applied by the manager on top
(see :mod:`ctxscore.value`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..messages import CATEGORIES, Message


@dataclass(slots=True)
class Prediction:
    """A scorer's output for one message.

    Attributes:
        category: the predicted category (one of :data:`ctxscore.types.CATEGORIES`).
        probs: class probabilities, category -> probability, summing to 1.
        value: intrinsic value in [0, 1], or ``None`` when the scorer predicts no value (the rule
            value is then used alone).
        source: ``"rules"``, ``"learned"`` or ``"callback"`` (who decided the category).
        signals: the rule signals behind the decision (name -> value), for explanations.
        embedding: the message embedding when the scorer computed one (reused by the archive's
            vector search), shape (dim,), float32, L2-normalised.
    """

    category: str
    probs: dict[str, float]
    value: float | None = None
    source: str = "rules"
    signals: dict[str, float] = field(default_factory=dict)
    embedding: Any = None

    @property
    def confidence(self) -> float:
        """Probability of the predicted category, in [0, 1]."""
        return self.probs.get(self.category, 0.0)


@runtime_checkable
class Scorer(Protocol):
    """Anything that predicts categories (and optionally values) for a batch of messages.

    ``predict(messages)`` takes a sequence of N :class:`~ctxscore.types.Message` and returns N
    :class:`Prediction` in the same order. A scorer that can embed text for the archive's vector
    search also offers ``embed_texts(texts) -> np.ndarray`` of shape (N, dim), L2-normalised.
    """

    def predict(self, messages: Sequence[Message]) -> list[Prediction]: ...


def one_hot(category: str, confidence: float = 1.0) -> dict[str, float]:
    """Probabilities with ``confidence`` on ``category`` and the rest spread evenly over the others."""
    rest = (1.0 - confidence) / (len(CATEGORIES) - 1)
    return {c: (confidence if c == category else rest) for c in CATEGORIES}
