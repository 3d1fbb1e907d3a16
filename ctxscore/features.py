"""Feature rows of the learned scorer: embedding + role + position + length + rule signals.

One row per message, in this order (:meth:`FeatureSpec.names` gives every column's name):

1. ``emb_0 .. emb_{d-1}``: the message text's embedding (:mod:`ctxscore.embedders`, L2-normalised).
2. ``role=system|user|assistant|tool``: one-hot role.
3. ``prev_role=system|user|assistant|tool|none``: one-hot role of the previous message in the
   conversation (``none`` for the first message). Computable online: the manager knows the
   messages before the one it scores; it never needs the session length.
4. ``has_tool_calls``: 1 when an assistant message carries tool calls.
5. ``log_turn`` = ``ln(1 + turn)``; ``is_first`` = ``turn == 0``; ``early`` = ``turn <= 2``
   (``turn`` is the 0-based position in the conversation).
6. ``log_chars`` = ``ln(1 + characters of Message.text())``, ``log_lines`` = ``ln(1 + newlines)``.
7. ``sig_<name>``: the rule signals of :meth:`ctxscore.rules.RuleClassifier.signals`, in the fixed
   order of ``RuleClassifier.signal_names`` as recorded in the packaged config.

Position features deliberately avoid ``index / n_messages``: at run time the session length is
unknown when a message arrives.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .errors import ConfigError
from .types import ROLES, Message

#: Version of the feature layout; bump when :func:`tabular_features` changes.
FEATURE_VERSION = 1

_PREV_ROLES = (*ROLES, "none")

#: Names of the tabular (non-embedding, non-signal) columns, in order.
TABULAR_NAMES: tuple[str, ...] = (
    *(f"role={r}" for r in ROLES),
    *(f"prev_role={r}" for r in _PREV_ROLES),
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
    max_chars: int = 1000
    head_chars: int = 700
    version: int = FEATURE_VERSION
    tabular_names: tuple[str, ...] = field(default=TABULAR_NAMES)

    @property
    def n_features(self) -> int:
        """Total columns: embedding + tabular + signals."""
        return self.embed_dim + len(self.tabular_names) + len(self.signal_names)

    def names(self) -> list[str]:
        """Every column's name, in order."""
        return [
            *(f"emb_{i}" for i in range(self.embed_dim)),
            *self.tabular_names,
            *(f"sig_{s}" for s in self.signal_names),
        ]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (plus a human-readable description of the layout)."""
        d = asdict(self)
        d["signal_names"] = list(self.signal_names)
        d["tabular_names"] = list(self.tabular_names)
        d["description"] = (
            "row = [embedding(embed_dim) | tabular_names | sig_<signal_names>]; "
            "embedding of Message.text() truncated to max_chars (head_chars from the start, the rest "
            "from the end); prev_role = role of the previous message (none for the first); "
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
                max_chars=int(data.get("max_chars", 1000)),
                head_chars=int(data.get("head_chars", 700)),
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


def tabular_features(messages: Sequence[Message], prev_roles: Sequence[str | None]) -> np.ndarray:
    """The tabular block for ``messages`` -> ``(n, len(TABULAR_NAMES))`` float32.

    Args:
        messages: the messages; ``turn`` ``None`` counts as 0.
        prev_roles: for each message, the role of the message before it (``None`` when first).
    """
    if len(prev_roles) != len(messages):
        raise ValueError(f"prev_roles has {len(prev_roles)} items for {len(messages)} messages")
    out = np.zeros((len(messages), len(TABULAR_NAMES)), dtype=np.float32)
    n_roles = len(ROLES)
    base = n_roles + len(_PREV_ROLES)
    for i, (m, pr) in enumerate(zip(messages, prev_roles, strict=True)):
        if m.role in ROLES:
            out[i, ROLES.index(m.role)] = 1.0
        out[i, n_roles + _PREV_ROLES.index(pr if pr in ROLES else "none")] = 1.0
        turn = m.turn if isinstance(m.turn, int) and m.turn >= 0 else 0
        text = m.text()
        out[i, base + 0] = 1.0 if m.tool_calls else 0.0
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


def build_matrix(embeddings: np.ndarray, tabular: np.ndarray, signals: np.ndarray) -> np.ndarray:
    """``[embeddings | tabular | signals]`` -> ``(n, d + t + s)`` float32."""
    return np.hstack([np.asarray(embeddings, dtype=np.float32), tabular, signals]).astype(np.float32, copy=False)


def prev_roles_of(messages: Sequence[Message], context: Sequence[Sequence[Message]] | None = None) -> list[str | None]:
    """Role of the message before each one.

    With ``context`` (for each message, the messages before it, oldest first) the last context
    message is used; without it, ``messages`` are taken as one contiguous run of a conversation
    (``messages[i-1]`` precedes ``messages[i]``) that starts the conversation when the first
    message's ``turn`` is 0 or ``None``.
    """
    if context is not None:
        if len(context) != len(messages):
            raise ValueError(f"context has {len(context)} items for {len(messages)} messages")
        return [c[-1].role if len(c) else None for c in context]
    return [None if i == 0 else messages[i - 1].role for i in range(len(messages))]
