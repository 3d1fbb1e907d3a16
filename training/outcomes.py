"""Value learned from outcomes: which messages later probes need, and the value head that uses it.

The annotated importance says how much the agent would lose without a message; the long sessions
say which messages a later question actually needs. For every message of the train-split long
sessions (``train_sessions.jsonl``, :mod:`training.data.chain`) the outcome target is 1 when it is
the source of a key fact that is probed later (:func:`outcome_labels`), else 0; recall-failure
records of a feedback iteration add their source messages as positives.

The value head (:func:`fit_value_head`) is a ``VotingRegressor`` of two fitted regressors:
``importance`` (the variant's regressor on the importance / 3 targets of the labelled rows, as
before) and ``outcome`` (a ridge regression on the outcome targets), averaged with weights
``1 - w`` and ``w`` (``Variant.outcome_weight``); ``w = 0`` keeps the importance regressor alone.

Metrics (:func:`value_auc`): ROC-AUC of a value for "is the source of a key fact" over the messages
of the dev and held-out evaluation sessions, for the learned value, the rule value (base weight x
entity density x token cost, :mod:`ctxscore.window.value`) and their runtime blend.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ctxscore.messages import Message
from ctxscore.scoring.features import FeatureSpec, feature_rows
from ctxscore.scoring.rules import RuleClassifier, extract_entities, scan_text
from ctxscore.tokens import TokenCounter

from .ranker import session_messages


def outcome_labels(session: dict[str, Any]) -> np.ndarray:
    """Per message of an evaluation-format session: 1.0 when it is the source of a key fact, else 0.0
    -> ``(n_messages,)``."""
    y = np.zeros(len(session["messages"]))
    for f in session["key_facts"]:
        i = int(f["source_index"])
        if 0 <= i < len(y):
            y[i] = 1.0
    return y


class SessionSet:
    """The messages of a session file with their feature rows under one spec (computed once).

    Attributes:
        sessions: the sessions (evaluation format).
        messages: per session, its messages (``turn`` = index).
        X: per session, ``(n_messages, spec.n_features)`` feature rows.
    """

    def __init__(self, sessions: Sequence[dict[str, Any]], spec: FeatureSpec, embedder: Any, rules: RuleClassifier) -> None:
        self.sessions = list(sessions)
        self.messages = [session_messages(s) for s in self.sessions]
        self.embeddings = [embedder.embed([m.text() for m in msgs]) for msgs in self.messages]
        self.X = [feature_rows(msgs, spec, E, rules.signals) for msgs, E in zip(self.messages, self.embeddings, strict=True)]

    def ids(self) -> list[str]:
        return [s["session_id"] for s in self.sessions]

    def stacked(self) -> tuple[np.ndarray, np.ndarray]:
        """``(X, outcome targets)`` of every message of every session."""
        if not self.sessions:
            return np.zeros((0, 0), np.float32), np.zeros(0)
        return np.vstack(self.X), np.concatenate([outcome_labels(s) for s in self.sessions])


def rule_values(messages: Sequence[Message], rules: RuleClassifier, counter: TokenCounter | None = None) -> np.ndarray:
    """The rule path's intrinsic value of each message (base weight of the rule category x entity
    density x token cost; no confirmation, recency or references) -> ``(n,)``."""
    counter = counter or TokenCounter()
    cfg, f = rules.config, rules.config.factors
    out = np.zeros(len(messages))
    for i, m in enumerate(messages):
        ents = extract_entities(scan_text(m.text()), cfg)
        tok = counter.count_message(m)
        dens = 1.0 + f.entity_density_step * min(2.0, 50.0 * len(ents) / max(1, tok))
        cost = 1.0 / (1.0 + f.token_cost_slope * math.log2(tok / f.token_cost_pivot)) if tok > f.token_cost_pivot else 1.0
        out[i] = cfg.base_weights[rules.predict_one(m, ents).category] * dens * cost
    return out


def fit_value_head(importance_head: Any, X_out: np.ndarray, y_out: np.ndarray, weight: float,
                   sample_weight: np.ndarray | None = None) -> Any:
    """The value head: ``importance_head`` (fitted) alone when ``weight`` is 0 or there are no
    outcome rows, else a ``VotingRegressor`` of it and a ridge regression fitted on the outcome
    rows, weights ``(1 - weight, weight)``.

    Raises:
        ValueError: ``weight`` outside [0, 1].
    """
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"outcome weight must be in [0, 1], got {weight}")
    if weight == 0.0 or not len(y_out) or len(set(y_out.tolist())) < 2:
        return importance_head
    from sklearn.ensemble import VotingRegressor
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    outcome = Pipeline([("scale", StandardScaler()), ("ridge", Ridge(alpha=30.0))])
    outcome.fit(X_out, y_out, ridge__sample_weight=sample_weight)
    vote = VotingRegressor([("importance", importance_head), ("outcome", outcome)], weights=[1.0 - weight, weight])
    # both members are fitted on their own targets; VotingRegressor.predict averages their predictions
    vote.estimators_ = [importance_head, outcome]
    return vote


def value_auc(values: np.ndarray, rule: np.ndarray, y: np.ndarray, blend: float = 0.5) -> dict[str, float]:
    """ROC-AUC for "is the source of a key fact" of the learned value, the rule value and the runtime
    blend ``blend x learned + (1 - blend) x rule`` (NaN when ``y`` has one class)."""
    from sklearn.metrics import roc_auc_score

    if len(set(y.tolist())) < 2:
        return {"learned": float("nan"), "rules": float("nan"), "blend": float("nan")}
    return {"learned": float(roc_auc_score(y, values)), "rules": float(roc_auc_score(y, rule)),
            "blend": float(roc_auc_score(y, blend * values + (1 - blend) * rule))}
