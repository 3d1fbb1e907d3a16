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


def share_parts(wrapper: Any, scorer: Any) -> None:
    """Give a scorer wrapper the parts of the wrapped ``scorer`` the runtime reads besides ``predict``.

    The page-in ranker (``ranker`` and ``rerank``, :func:`ctxscore.window.pagein.search`) and the
    key-span extractor (``spans`` and ``key_spans``: the compressed tiers,
    :func:`ctxscore.scoring.spans.extractor_of`, and the fact ledger,
    :func:`ctxscore.scoring.spans.facts_of`) are set on ``wrapper`` when ``scorer`` has them;
    ``ranker`` and ``spans`` are set to ``None`` otherwise. A wrapper that left them out would run
    without them, silently (a :class:`~ctxscore.llm.classifier.DualPathScorer` over a learned scorer,
    the evaluation's prediction cache). The parts are taken when the wrapper is built.

    Raises:
        AttributeError: ``scorer`` has a ``ranker`` without ``rerank``, or ``spans`` without ``key_spans``.
    """
    wrapper.ranker = getattr(scorer, "ranker", None)
    if wrapper.ranker is not None:
        wrapper.rerank = scorer.rerank
    wrapper.spans = getattr(scorer, "spans", None)
    if wrapper.spans is not None:
        wrapper.key_spans = scorer.key_spans


def one_hot(category: str, confidence: float = 1.0) -> dict[str, float]:
    """Probabilities with ``confidence`` on ``category`` and the rest spread evenly over the others."""
    rest = (1.0 - confidence) / (len(CATEGORIES) - 1)
    return {c: (confidence if c == category else rest) for c in CATEGORIES}
