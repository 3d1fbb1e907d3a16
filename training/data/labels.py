"""Distilled labels (``labels/distilled.jsonl``), the value target and weak-label accuracy.

Distilled label line: ``{"id", "category", "importance": 0..3, "key_spans": [...]}`` (see
``../shared/datasets/labels/README.md``).

Value target: ``value = importance / 3``. The annotation guide defines importance as how much the
agent loses if the message is deleted at the end of the conversation, on an ordinal 0-3 scale (0
nothing, 1 minor, 2 noticeably worse, 3 task fails). The runtime's value is the same notion on
[0, 1] (it ranks messages for archiving), so the four levels are mapped linearly onto 0, 1/3,
2/3, 1: monotone, keeps the guide's equal steps, and leaves the regressor's error in importance
units (MAE 0.33 = one importance step). No per-category offset is added: the category already
enters the runtime value through its base weight.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sklearn.metrics import accuracy_score, f1_score

from ctxscore.errors import InputError
from ctxscore.io import iter_jsonl

from .weak import CATEGORIES

#: Importance levels of the annotation guide.
MAX_IMPORTANCE = 3


class LabelFormatError(ValueError):
    """A malformed line in a label file (the message names the file and line)."""


def importance_to_value(importance: int | float) -> float:
    """Value target in [0, 1] from a 0-3 importance: ``importance / 3`` (clipped)."""
    return float(min(max(importance, 0), MAX_IMPORTANCE)) / MAX_IMPORTANCE


def validate_label(obj: Any, where: str) -> dict[str, Any]:
    """Check one label record and return it normalised.

    Raises:
        LabelFormatError: missing id, unknown category, importance outside 0-3 or key_spans not
            a list of strings.
    """
    if not isinstance(obj, dict) or not isinstance(obj.get("id"), str):
        raise LabelFormatError(f"{where}: expected an object with a string 'id'")
    cat = obj.get("category")
    if cat not in CATEGORIES:
        raise LabelFormatError(f"{where}: category {cat!r} is not one of {', '.join(CATEGORIES)}")
    imp = obj.get("importance")
    if not isinstance(imp, int) or isinstance(imp, bool) or not 0 <= imp <= MAX_IMPORTANCE:
        raise LabelFormatError(f"{where}: importance {imp!r} must be an integer 0-3")
    spans = obj.get("key_spans") or []
    if not isinstance(spans, list) or not all(isinstance(s, str) for s in spans):
        raise LabelFormatError(f"{where}: key_spans must be a list of strings")
    return {"id": obj["id"], "category": cat, "importance": imp, "key_spans": spans}


def load_distilled(path: Path) -> dict[str, dict[str, Any]]:
    """Distilled labels by message id.

    Raises:
        FileNotFoundError: ``path`` is missing.
        LabelFormatError: a line is not valid JSON or not a valid label; a duplicate id.
    """
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: distilled label file not found")
    out: dict[str, dict[str, Any]] = {}
    try:
        for n, obj in iter_jsonl(path):
            where = f"{path}:{n}"
            rec = validate_label(obj, where)
            if rec["id"] in out:
                raise LabelFormatError(f"{where}: duplicate label id {rec['id']}")
            out[rec["id"]] = rec
    except InputError as exc:  # not UTF-8 / not JSON, with the file and line
        raise LabelFormatError(str(exc)) from None
    return out


def weak_label_accuracy(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Agreement of weak labels with gold labels, per source and overall.

    ``rows`` carry ``source``, ``category`` (gold), ``weak_category``, ``importance`` (gold),
    ``weak_importance``, ``split`` and optionally ``label_source`` (``"distilled"`` when absent).
    Returns ``{source: {n, accuracy, macro_f1, importance_mae, importance_exact, accuracy_test,
    n_test, per_category: {cat: {n, recall}}}}`` plus an ``"all distilled"`` entry over the rows
    whose gold label is distilled (the bundled set's own labels are reported as their own row
    only); accuracies are fractions. ``accuracy_test`` is measured on the test split only. Both
    are in-sample for the rules: they were written from the annotation guide after looking at how
    the annotated acts / tool results of all labelled messages map to the distilled categories.
    """
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by[r["source"]].append(r)
        if r.get("label_source", "distilled") == "distilled":
            by["all distilled"].append(r)
    out: dict[str, dict[str, Any]] = {}
    for src, rs in sorted(by.items(), key=lambda kv: (kv[0] == "all distilled", kv[0] == "bundled", kv[0])):
        y = [r["category"] for r in rs]
        p = [r["weak_category"] for r in rs]
        test = [r for r in rs if r.get("split") == "test"]
        per: dict[str, dict[str, Any]] = {}
        counts = Counter(y)
        for c in CATEGORIES:
            if counts[c]:
                hit = sum(1 for a, b in zip(y, p, strict=True) if a == c and b == c)
                per[c] = {"n": counts[c], "recall": round(hit / counts[c], 4)}
        out[src] = {
            "n": len(rs),
            "accuracy": round(accuracy_score(y, p), 4),
            "macro_f1": round(f1_score(y, p, labels=[c for c in CATEGORIES if counts[c]], average="macro",
                                       zero_division=0), 4),
            "importance_mae": round(sum(abs(r["importance"] - r["weak_importance"]) for r in rs) / len(rs), 4),
            "importance_exact": round(sum(r["importance"] == r["weak_importance"] for r in rs) / len(rs), 4),
            "n_test": len(test),
            "accuracy_test": round(accuracy_score([r["category"] for r in test], [r["weak_category"] for r in test]), 4)
            if test else None,
            "per_category": per,
        }
    return out


def accuracy_table_markdown(acc: dict[str, dict[str, Any]]) -> str:
    """The weak-label accuracy as a markdown table (the data card's table)."""
    lines = [
        "| source | labelled messages | accuracy | macro-F1 | accuracy (test split) | importance exact | importance MAE | recall per category |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for src, a in acc.items():
        per = ", ".join(f"{c} {v['recall']:.2f} (n={v['n']})" for c, v in a["per_category"].items())
        at = f"{a['accuracy_test']:.3f} (n={a['n_test']})" if a["accuracy_test"] is not None else "-"
        lines.append(f"| {src} | {a['n']} | {a['accuracy']:.3f} | {a['macro_f1']:.3f} | {at} | "
                     f"{a['importance_exact']:.3f} | {a['importance_mae']:.3f} | {per} |")
    return "\n".join(lines)
