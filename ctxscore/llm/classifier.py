"""The LLM classifier: the second path of the dual-path classification (rules / learned first, an
LLM for the messages the first path is unsure of).

:class:`DualPathScorer` wraps any scorer (the learned one, or the rules): it predicts every message
with it, sends the messages whose confidence (top class probability) is below ``threshold`` to the
:class:`LLMClassifier` in batches, and replaces their category and value with the LLM's answer
(importance 0-3 -> value ``importance / 3``, the mapping of the distilled labels). An answer that
cannot be read (not JSON, a missing item, an unknown category, an importance outside 0-3) keeps the
first path's prediction and logs one line; so does a request that fails.

This path runs when messages are added (``add`` / ``extend`` / ``sync``), not in ``build``: the
manager scores each message once, before it is stored. It costs one request per ``batch_size``
uncertain messages of an ``extend``.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from typing import Any

from ..errors import ConfigError
from ..messages import CATEGORIES, Message
from ..scoring.base import Prediction, Scorer, one_hot, share_parts
from .client import LLMClient, LLMError
from .prompts import CLASSIFIER_RULES, items_by_id, parse_json_object

log = logging.getLogger("ctxscore")

#: Characters of a message sent to the classifier (longer texts keep their head and tail).
MAX_CHARS = 2000
#: Probability given to the LLM's category when it reports no confidence.
LLM_CONFIDENCE = 0.9


def _clip(text: str, n: int) -> str:
    if len(text) <= n:
        return text
    half = n // 2
    return f"{text[:half]} …[{len(text) - 2 * half} chars cut]… {text[-half:]}"


class LLMClassifier:
    """Category and importance of messages from an LLM, following the annotation guide.

    Args:
        client: the :class:`~ctxscore.llm.client.LLMClient`.
        batch_size: messages per request (>= 1).
        max_chars: characters of each message sent (head and tail kept).

    Raises:
        ConfigError: a bad batch size.
    """

    def __init__(self, client: LLMClient, *, batch_size: int = 16, max_chars: int = MAX_CHARS) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.client, self.batch_size, self.max_chars = client, batch_size, max_chars
        self.stats = {"requests": 0, "items": 0, "answered": 0, "malformed": 0, "failed": 0}
        self._lock = threading.Lock()

    def _count(self, **kw: int) -> None:
        with self._lock:
            for k, v in kw.items():
                self.stats[k] += v

    def classify(self, messages: Sequence[Message], before: Sequence[Message | None] | None = None) -> list[Prediction | None]:
        """One prediction per message (``None`` where the answer could not be read; logged).

        Args:
            messages: the messages, N.
            before: the message before each (context), N entries or ``None``.

        Returns:
            N entries: a :class:`Prediction` with ``source="llm"``, ``probs`` one-hot-like (the LLM's
            ``confidence`` if it gave one in [0, 1], else 0.9), ``value = importance / 3`` and
            ``signals={"llm_importance": importance}``; or ``None``.
        """
        out: list[Prediction | None] = [None] * len(messages)
        prev = list(before) if before is not None else [None] * len(messages)
        for lo in range(0, len(messages), self.batch_size):
            idx = list(range(lo, min(lo + self.batch_size, len(messages))))
            for i, p in zip(idx, self._batch([messages[i] for i in idx], [prev[i] for i in idx]), strict=True):
                out[i] = p
        return out

    def _batch(self, msgs: list[Message], prev: list[Message | None]) -> list[Prediction | None]:
        items: list[dict[str, Any]] = []
        for i, (m, b) in enumerate(zip(msgs, prev, strict=True)):
            it: dict[str, Any] = {"id": str(i), "role": str(m.role), "text": _clip(m.text(), self.max_chars)}
            if b is not None:
                it["before"] = {"role": str(b.role), "text": _clip(b.text(), self.max_chars // 4)}
            items.append(it)
        self._count(requests=1, items=len(msgs))
        try:
            answer = self.client.complete_text(CLASSIFIER_RULES, json.dumps({"items": items}, ensure_ascii=False))
            got = items_by_id(parse_json_object(answer.text))
        except LLMError as exc:
            self._count(failed=len(msgs))
            log.warning("llm classifier: request for %d messages failed (%s); kept the first-path predictions", len(msgs), exc)
            return [None] * len(msgs)
        except ValueError as exc:
            self._count(malformed=len(msgs))
            log.warning("llm classifier: malformed answer for %d messages (%s); kept the first-path predictions", len(msgs), exc)
            return [None] * len(msgs)
        except Exception:  # noqa: BLE001 - the second path must never break adding messages
            self._count(failed=len(msgs))
            log.exception("llm classifier: unexpected error for %d messages; kept the first-path predictions", len(msgs))
            return [None] * len(msgs)
        out: list[Prediction | None] = []
        for i in range(len(msgs)):
            pred, why = _parse_item(got.get(str(i)))
            if pred is None:
                self._count(malformed=1)
                log.warning("llm classifier: item %d (%s message): %s; kept the first-path prediction", i, msgs[i].role, why)
            else:
                self._count(answered=1)
            out.append(pred)
        return out

    def as_fallback(self) -> Any:
        """A per-message callback for :class:`~ctxscore.scoring.learned.LearnedScorer` ``fallback=``
        (one request per uncertain message; :class:`DualPathScorer` batches them instead)."""

        def fallback(message: Message, learned: Prediction) -> Prediction | None:
            return self.classify([message])[0]

        return fallback


def _parse_item(it: Any) -> tuple[Prediction | None, str]:
    """The prediction of one answer item, or ``(None, why)``."""
    if not isinstance(it, dict):
        return None, "no answer for it"
    cat = it.get("category")
    if cat not in CATEGORIES:
        return None, f"unknown category {cat!r} (expected one of {', '.join(CATEGORIES)})"
    imp = it.get("importance")
    if isinstance(imp, str) and imp.strip().isdigit():
        imp = int(imp.strip())
    if isinstance(imp, bool) or not isinstance(imp, int | float) or not 0 <= imp <= 3 or int(imp) != imp:
        return None, f"importance {imp!r} is not an integer 0-3"
    conf = it.get("confidence")
    conf = float(conf) if isinstance(conf, int | float) and not isinstance(conf, bool) and 0 < conf <= 1 else LLM_CONFIDENCE
    return Prediction(category=cat, probs=one_hot(cat, conf), value=int(imp) / 3.0, source="llm",
                      signals={"llm_importance": float(imp)}), ""


class DualPathScorer:
    """A :class:`~ctxscore.scoring.base.Scorer`: ``scorer`` first, the LLM for its uncertain messages.

    Args:
        scorer: the first path (a :class:`~ctxscore.scoring.learned.LearnedScorer`, the
            :class:`~ctxscore.scoring.rules.RuleClassifier`, or any scorer).
        classifier: the :class:`LLMClassifier`.
        threshold: a message whose first-path confidence is below this fraction goes to the LLM
            (0 sends none, 1 sends all).

    The first path's embedding (vector search) and rule signals are kept on an LLM prediction; its
    ``signals`` gain ``first_path_confidence``. ``embed_texts``, the page-in ranker and the key-span
    extractor are the first path's, when it has them (:func:`~ctxscore.scoring.base.share_parts`).

    Raises:
        ConfigError: ``threshold`` outside [0, 1], or a first path without ``predict``.
    """

    def __init__(self, scorer: Scorer, classifier: LLMClassifier, threshold: float = 0.6) -> None:
        if not callable(getattr(scorer, "predict", None)):
            raise ConfigError(f"scorer must have predict(messages), got {scorer!r}")
        if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0.0 <= threshold <= 1.0:
            raise ConfigError(f"threshold must be a fraction in [0, 1], got {threshold!r}")
        self.scorer, self.classifier, self.threshold = scorer, classifier, float(threshold)
        if callable(getattr(scorer, "embed_texts", None)):
            self.embed_texts = scorer.embed_texts  # type: ignore[attr-defined]
        share_parts(self, scorer)  # the first path's page-in ranker and key-span extractor

    def predict(self, messages: Sequence[Message]) -> list[Prediction]:
        """Predictions for ``messages`` (N in, N out, in order); see the class docstring."""
        msgs = list(messages)
        preds = list(self.scorer.predict(msgs))
        unsure = [i for i, p in enumerate(preds) if p.confidence < self.threshold]
        if not unsure:
            return preds
        answers = self.classifier.classify([msgs[i] for i in unsure], [msgs[i - 1] if i > 0 else None for i in unsure])
        for i, alt in zip(unsure, answers, strict=True):
            if alt is None:
                continue
            first = preds[i]
            alt.embedding = first.embedding
            alt.signals = {**first.signals, **alt.signals, "first_path_confidence": first.confidence}
            preds[i] = alt
        return preds
