"""Promotion of the ``candidate`` scorer to ``champion``.

Both registered versions are evaluated with the ``learned`` policy on the same held-out sessions at
the reference budget; the ``champion`` alias moves to the candidate only if the candidate beats the
champion: better on recall with page-in or on token reduction, and worse on neither by more than
the allowed drops (both 0.0 by default: not worse at all). A tie keeps the champion. In a fresh
MLflow store the champion is the shipped scorer (:func:`training.registry.ensure_champion`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(slots=True)
class PromotionDecision:
    """Outcome of a comparison.

    Attributes:
        promote: whether the champion alias should move to the candidate.
        reason: one sentence with the figures.
        candidate, champion: ``{"version", "recall_pagein", "token_reduction", ...}`` (champion ``None``
            when there is none).
        thresholds: the allowed drops.
    """

    promote: bool
    reason: str
    candidate: dict[str, Any]
    champion: dict[str, Any] | None
    thresholds: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return asdict(self)


def decide(candidate: dict[str, Any], champion: dict[str, Any] | None, *, max_recall_drop: float = 0.0,
           max_reduction_drop: float = 0.0) -> PromotionDecision:
    """Compare evaluation figures (``recall_pagein``, ``token_reduction``, fractions) of two versions.

    Promote when there is no champion, or when the candidate beats it:
    ``cand.recall_pagein >= champ.recall_pagein - max_recall_drop`` and
    ``cand.token_reduction >= champ.token_reduction - max_reduction_drop``, and the candidate is
    strictly better on at least one of the two (equal figures keep the champion).

    Raises:
        ValueError: a negative threshold or a missing figure.
    """
    if max_recall_drop < 0 or max_reduction_drop < 0:
        raise ValueError("the allowed drops must be >= 0 (fractions, e.g. 0.01 for one point)")
    th = {"max_recall_drop": max_recall_drop, "max_reduction_drop": max_reduction_drop}
    for who, d in (("candidate", candidate), ("champion", champion)):
        if d is not None and (d.get("recall_pagein") is None or d.get("token_reduction") is None):
            raise ValueError(f"{who} has no recall_pagein / token_reduction figure (were there key facts to check?)")
    if champion is None:
        return PromotionDecision(True, "no champion yet: the candidate becomes champion", candidate, None, th)
    if str(champion.get("version")) == str(candidate.get("version")):
        return PromotionDecision(False, f"candidate and champion are the same version ({candidate.get('version')})",
                        candidate, champion, th)
    cr, hr = candidate["recall_pagein"], champion["recall_pagein"]
    cx, hx = candidate["token_reduction"], champion["token_reduction"]
    recall_ok = cr >= hr - max_recall_drop
    red_ok = cx >= hx - max_reduction_drop
    figures = (f"recall with page-in {cr:.4f} vs {hr:.4f} (allowed drop {max_recall_drop}), "
               f"token reduction {cx:.4f} vs {hx:.4f} (allowed drop {max_reduction_drop})")
    better = cr > hr or cx > hx
    if recall_ok and red_ok and better:
        return PromotionDecision(True, f"candidate beats the champion: {figures}", candidate, champion, th)
    if recall_ok and red_ok:
        return PromotionDecision(False, f"candidate does not beat the champion (no figure is better): {figures}",
                                 candidate, champion, th)
    worse = [n for n, ok in (("recall", recall_ok), ("token reduction", red_ok)) if not ok]
    return PromotionDecision(False, f"candidate worse on {' and '.join(worse)}: {figures}", candidate, champion, th)


def write_decision(decision: PromotionDecision, out_dir: Path, reference_budget: str) -> Path:
    """Write ``promotion.json`` and ``promotion.md`` to ``out_dir``; return the markdown path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "promotion.json").write_text(json.dumps(decision.to_dict(), indent=1) + "\n", encoding="utf-8")
    rows = ["| version | role | recall page-in | recall | token reduction | util peak |", "|---|---|---|---|---|---|"]
    for role, d in (("candidate", decision.candidate), ("champion", decision.champion)):
        if d:
            role = f"{role} (shipped baseline)" if d.get("baseline") == "shipped" else role
            rows.append(f"| {d.get('version')} | {role} | {d.get('recall_pagein')} | {d.get('recall')} | "
                        f"{d.get('token_reduction')} | {d.get('util_peak')} |")
    md = "\n".join([
        "# Promotion decision", "",
        f"**{'Promoted' if decision.promote else 'Not promoted'}**: {decision.reason}.", "",
        f"Reference budget {reference_budget}; thresholds {decision.thresholds}.", "", *rows, "",
    ])
    path = out_dir / "promotion.md"
    path.write_text(md, encoding="utf-8")
    return path
