"""MLflow "models from code" definition of the scorer pyfunc (logged by :mod:`training.registry`).

Input: a pandas DataFrame with ``role``, ``content`` and optional ``turn`` (one row per message, in
conversation order). Output: a DataFrame with ``category``, ``p_<category>`` for the four
categories and ``value`` in [0, 1]. The artifact ``scorer`` is the packaged scorer folder, loaded
with :meth:`ctxscore.learned.LearnedScorer.from_pretrained` (sha256 and type checks included).
"""

from __future__ import annotations

import mlflow
from mlflow.pyfunc import PythonModel


def predict_frame(scorer, frame):
    """Score a DataFrame of messages (``role``, ``content``, optional ``turn``) -> DataFrame."""
    import pandas as pd

    from ctxscore.messages import CATEGORIES, Message

    msgs = []
    for i, row in enumerate(frame.to_dict(orient="records")):
        turn = row.get("turn")
        msgs.append(Message(role=str(row["role"]), content=str(row["content"]),
                            turn=int(turn) if turn is not None and turn == turn else i))
    preds = scorer.predict(msgs)
    return pd.DataFrame([{"category": p.category, **{f"p_{c}": float(p.probs[c]) for c in CATEGORIES},
                          "value": float(p.value)} for p in preds])


class ScorerModel(PythonModel):
    """pyfunc wrapper around a packaged ctxscore scorer folder."""

    def load_context(self, context):
        from ctxscore.scoring.learned import LearnedScorer

        self.scorer = LearnedScorer.from_pretrained(context.artifacts["scorer"])

    def predict(self, context, model_input, params=None):
        return predict_frame(self.scorer, model_input)


mlflow.models.set_model(ScorerModel())
