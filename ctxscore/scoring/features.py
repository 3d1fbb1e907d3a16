"""Feature rows of the learned scorer: embedding + role + position + length + rule signals.

One row per message, in this order (:meth:`FeatureSpec.names` gives every column's name):

1. ``emb_0 .. emb_{d-1}``: the message text's embedding (:mod:`ctxscore.embedders`, L2-normalised).
1b. ``lex_0 .. lex_{k-1}`` (only when ``lexical_dim`` k > 0): character 1-3-gram counts of the same
   truncated text hashed into k buckets, L2-normalised (scikit-learn ``HashingVectorizer``,
   stateless: nothing is fitted or stored). It gives the heads the surface cues an averaged sentence
   embedding blurs (``<returncode>1``, ``Error:``, ``TOOL_CALL``, ``THOUGHT:``, ``谢谢``).
2. ``role=system|user|assistant|tool``: one-hot role.
3. ``has_tool_calls``: 1 when the rendered text carries a ``TOOL_CALL`` line (an assistant message
   with tool calls, see :meth:`ctxscore.types.Message.text`).
4. ``log_turn`` = ``ln(1 + turn)``; ``is_first`` = ``turn == 0``; ``early`` = ``turn <= 2``
   (``turn`` is the 0-based position in the conversation; the caller must set ``Message.turn``).
5. ``log_chars`` = ``ln(1 + characters of Message.text())``, ``log_lines`` = ``ln(1 + newlines)``.
6. ``sig_<name>``: the rule signals of :meth:`ctxscore.rules.RuleClassifier.signals`, in the fixed
   order of ``RuleClassifier.signal_names`` as recorded in the packaged config.

:func:`feature_rows` builds the whole row; it is the one featurizer: :meth:`LearnedScorer.features
<ctxscore.scoring.learned.LearnedScorer.features>` at run time and ``training.train.featurize``
(with cached embeddings) at training time both call it, so the columns cannot drift apart.

Every feature is computable when a message arrives: position features avoid ``index / n_messages``
(the session length is unknown at run time). A one-hot role of the previous message was tried and
dropped: it did not change dev macro-F1 (0.919 with, 0.923 without, logistic head, USE embedder)
and would have made the scorer depend on the conversation around each message.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..messages import ROLES, Message
from .embedders import truncate_text

#: Version of the feature layout; bump when :func:`tabular_features` changes.
FEATURE_VERSION = 1

#: Names of the tabular (non-embedding, non-signal) columns, in order.
TABULAR_NAMES: tuple[str, ...] = (
    *(f"role={r}" for r in ROLES),
    "has_tool_calls",
    "log_turn",
    "is_first",
    "early",
    "log_chars",
    "log_lines",
)

SignalFn = Callable[[Message], Mapping[str, float]]


@dataclass(frozen=True)
class FeatureSpec:
    """The layout of a feature row, stored in the packaged scorer's ``config.json``.

    Attributes:
        embedder_id: model id of the embedder (:func:`ctxscore.embedders.get_embedder`).
        embed_dim: embedding dimension.
        signal_names: the rule signal names, in column order.
        max_chars / head_chars: truncation applied before embedding (:func:`~ctxscore.embedders.truncate_text`).
        version: :data:`FEATURE_VERSION` the scorer was trained with.
    """

    embedder_id: str
    embed_dim: int
    signal_names: tuple[str, ...] = ()
    max_chars: int = 600
    head_chars: int = 400
    lexical_dim: int = 0
    version: int = FEATURE_VERSION
    tabular_names: tuple[str, ...] = field(default=TABULAR_NAMES)

    @property
    def n_features(self) -> int:
        """Total columns: embedding + lexical + tabular + signals."""
        return self.embed_dim + self.lexical_dim + len(self.tabular_names) + len(self.signal_names)

    @property
    def signal_start(self) -> int:
        """Index of the first signal column."""
        return self.embed_dim + self.lexical_dim + len(self.tabular_names)

    def names(self) -> list[str]:
        """Every column's name, in order."""
        return [
            *(f"emb_{i}" for i in range(self.embed_dim)),
            *(f"lex_{i}" for i in range(self.lexical_dim)),
            *self.tabular_names,
            *(f"sig_{s}" for s in self.signal_names),
        ]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (plus a human-readable description of the layout)."""
        d = asdict(self)
        d["signal_names"] = list(self.signal_names)
        d["tabular_names"] = list(self.tabular_names)
        d["description"] = (
            "row = [embedding(embed_dim) | lexical(lexical_dim) | tabular_names | sig_<signal_names>]; "
            "embedding of Message.text() truncated to max_chars (head_chars from the start, the rest "
            "from the end); lexical = char 1-3-gram counts of the same truncated text hashed into "
            "lexical_dim buckets (sklearn HashingVectorizer, analyzer=char_wb, alternate_sign=False, "
            "norm=l2); has_tool_calls = a TOOL_CALL line in the rendered text; "
            "log_turn = ln(1+turn); log_chars = ln(1+len(text)); log_lines = ln(1+newlines); "
            "signals from ctxscore.rules.RuleClassifier.signals with the packaged rules.toml"
        )
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FeatureSpec:
        """Inverse of :meth:`to_dict`.

        Raises:
            ConfigError: missing keys, or a feature version this ctxscore does not know.
        """
        try:
            spec = cls(
                embedder_id=str(data["embedder_id"]),
                embed_dim=int(data["embed_dim"]),
                signal_names=tuple(data.get("signal_names", ())),
                max_chars=int(data.get("max_chars", 600)),
                head_chars=int(data.get("head_chars", 400)),
                lexical_dim=int(data.get("lexical_dim", 0)),
                version=int(data.get("version", FEATURE_VERSION)),
                tabular_names=tuple(data.get("tabular_names", TABULAR_NAMES)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"feature spec is incomplete or malformed ({exc}); re-export the scorer") from exc
        if spec.version != FEATURE_VERSION or spec.tabular_names != TABULAR_NAMES:
            raise ConfigError(
                f"feature spec version {spec.version} does not match this ctxscore's feature layout "
                f"(version {FEATURE_VERSION}); re-train and re-export the scorer with "
                "`python -m training.train --export DIR`"
            )
        return spec


def tabular_features(messages: Sequence[Message]) -> np.ndarray:
    """The tabular block for ``messages`` -> ``(n, len(TABULAR_NAMES))`` float32.

    ``turn`` ``None`` counts as 0 (set ``Message.turn`` before scoring).
    """
    out = np.zeros((len(messages), len(TABULAR_NAMES)), dtype=np.float32)
    base = len(ROLES)
    for i, m in enumerate(messages):
        if m.role in ROLES:
            out[i, ROLES.index(m.role)] = 1.0
        turn = m.turn if isinstance(m.turn, int) and m.turn >= 0 else 0
        text = m.text()
        out[i, base + 0] = 1.0 if (text.startswith("TOOL_CALL ") or "\nTOOL_CALL " in text) else 0.0
        out[i, base + 1] = math.log1p(turn)
        out[i, base + 2] = 1.0 if turn == 0 else 0.0
        out[i, base + 3] = 1.0 if turn <= 2 else 0.0
        out[i, base + 4] = math.log1p(len(text))
        out[i, base + 5] = math.log1p(text.count("\n"))
    return out


def signal_features(messages: Sequence[Message], signal_fn: SignalFn | None,
                    signal_names: Sequence[str]) -> np.ndarray:
    """The rule-signal block -> ``(n, len(signal_names))`` float32.

    Raises:
        ConfigError: ``signal_fn`` returns a dict without one of ``signal_names`` (the rule module
            and the packaged scorer disagree; re-export the scorer).
    """
    out = np.zeros((len(messages), len(signal_names)), dtype=np.float32)
    if not signal_names:
        return out
    if signal_fn is None:
        raise ConfigError("the scorer was trained with rule signals but no signal function was given")
    for i, m in enumerate(messages):
        sig = signal_fn(m)
        try:
            out[i] = [float(sig[name]) for name in signal_names]
        except KeyError as exc:
            raise ConfigError(
                f"rule signal {exc.args[0]!r} expected by the scorer is missing from RuleClassifier.signals(); "
                "the rule module changed since the scorer was trained: re-export it with "
                "`python -m training.train --export DIR`"
            ) from exc
    return out


def lexical_features(texts: Sequence[str], dim: int) -> np.ndarray:
    """Hashed character 1-3-gram block -> ``(n, dim)`` float32, rows L2-normalised.

    ``texts`` should already be truncated like the embedder's input. ``dim`` 0 gives ``(n, 0)``.
    """
    if dim <= 0:
        return np.zeros((len(texts), 0), dtype=np.float32)
    from sklearn.feature_extraction.text import HashingVectorizer

    hv = HashingVectorizer(analyzer="char_wb", ngram_range=(1, 3), n_features=dim, alternate_sign=False, norm="l2")
    return hv.transform(list(texts)).toarray().astype(np.float32)


def feature_rows(messages: Sequence[Message], spec: FeatureSpec, embeddings: np.ndarray,
                 signal_fn: SignalFn | None) -> np.ndarray:
    """The feature rows of ``messages`` in the layout of ``spec`` -> ``(n, spec.n_features)`` float32.

    Args:
        messages: n messages; ``Message.turn`` feeds the position features (``None`` counts as 0).
        spec: the layout (embedding size, lexical block size and truncation, signal names).
        embeddings: ``(n, spec.embed_dim)``, the embeddings of ``Message.text()`` by the spec's
            embedder (the runtime embeds on the fly, training passes cached vectors).
        signal_fn: ``message -> {signal name: value}`` (``RuleClassifier.signals``); may be
            ``None`` only when ``spec.signal_names`` is empty.

    Raises:
        ConfigError: ``embeddings`` does not have one ``spec.embed_dim`` row per message, or the
            signals do not match ``spec.signal_names`` (see :func:`signal_features`).
    """
    emb = np.asarray(embeddings, dtype=np.float32)
    if emb.shape != (len(messages), spec.embed_dim):
        raise ConfigError(
            f"embeddings have shape {emb.shape}, expected ({len(messages)}, {spec.embed_dim}): one row of the "
            f"embedder {spec.embedder_id!r} per message"
        )
    lexical = None
    if spec.lexical_dim:
        texts = [truncate_text(m.text(), spec.max_chars, spec.head_chars) for m in messages]
        lexical = lexical_features(texts, spec.lexical_dim)
    return build_matrix(emb, tabular_features(messages), signal_features(messages, signal_fn, spec.signal_names),
                        lexical)


def build_matrix(embeddings: np.ndarray, tabular: np.ndarray, signals: np.ndarray,
                 lexical: np.ndarray | None = None) -> np.ndarray:
    """``[embeddings | lexical | tabular | signals]`` -> ``(n, d + k + t + s)`` float32."""
    blocks = [np.asarray(embeddings, dtype=np.float32)]
    if lexical is not None and lexical.shape[1]:
        blocks.append(lexical)
    blocks += [tabular, signals]
    return np.hstack(blocks).astype(np.float32, copy=False)
