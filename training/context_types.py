"""Train the learned context-type head on weak labels from the corpora.

Weak labels (:func:`weak_type`), from what each corpus annotates plus two text rules, in this order:

=========================================================  ===========  ==========
evidence                                                   type         confidence
=========================================================  ===========  ==========
system message                                             instruction  0.95
tool message, assistant tool call, agent observation       tool         0.95
  (``swe:observation``, ``swe:returncode_nonzero`` ...)
user message whose hard-constraint sentences (the runtime  constraint   0.75
  rule file) are at least half its text
profile statement (:mod:`ctxscore.memory.profile_extract`) user         0.75
task statement / intent acts: ``swe:task``,                goal         0.85
  ``tau:user_first``, ``sgd:user_intent[_with_values]``
the first user message of a MultiWOZ / CrossWOZ dialogue   goal         0.7
user requests for information (``*:user_request``)         goal         0.6
user decisions: ``sgd:user_select``, ``sgd:user_affirm``,  user         0.6
  ``sgd:user_negate_intent``, ``tau:user_gives_id``
slot values the user gives (``*:user_inform``)             constraint   0.55
assistant acts (inform, request, offer, notify, booked,    task         0.6
  ``swe:thought``, ``swe:submit``, ``tau:assistant_*``)
pleasantries and everything else                           (no label)
=========================================================  ===========  ==========

The head (:class:`ctxscore.memory.context_types.TypeHead`): logistic regression over
:func:`~ctxscore.memory.context_types.head_features` (hashed character n-grams, role, rule signals),
sample weight = the label's confidence, C chosen on the dev split. Reported: accuracy and macro-F1
against the weak labels of the test split and the hand-made gold set
(``data/context_types/handmade.jsonl``), for the rules, the head and their blend.

    python -m training.context_types [--out out/context_types] [--ship]

``--ship`` writes the head to ``ctxscore/models/context_types`` (a tracked folder: review the diff).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ctxscore.io import iter_jsonl
from ctxscore.memory.context_types import (
    CONTEXT_TYPES,
    DEFAULT_HEAD_DIR,
    HeadSpec,
    RuleTypeClassifier,
    TypeHead,
    blend,
    head_features,
    type_signals,
)
from ctxscore.memory.profile_extract import statements
from ctxscore.messages import Message, Role
from ctxscore.scoring.rules import hard_constraints

from .paths import DEFAULT_OUT, OUT_DIR, REPO_ROOT

HANDMADE = REPO_ROOT / "data" / "context_types" / "handmade.jsonl"
_TOOL_RULES = ("swe:observation", "swe:returncode_nonzero", "swe:tests_passed", "swe:traceback", "swe:timeout",
               "swe:empty_or_long_output", "swe:format_error", "swe:final_patch", "generic:tool_call",
               "generic:tool_output", "tau:call_", "tau:tool_")
_GOAL_RULES = {"swe:task": 0.85, "tau:user_first": 0.85, "sgd:user_intent": 0.85, "sgd:user_intent_with_values": 0.85}
_USER_RULES = ("sgd:user_select", "sgd:user_affirm", "sgd:user_negate_intent", "tau:user_gives_id")
_TASK_RULES = ("sgd:system_", "multiwoz:system_", "crosswoz:system_", "swe:thought", "swe:edit_patch_file",
               "swe:submit", "tau:assistant_", "generic:assistant", "generic:question")
_NO_LABEL = ("pleasantry", "_general", "_noact", "tau:assistant_pleasantry", "sgd:system_pleasantry")
C_GRID = (0.3, 1.0, 3.0)


def weak_type(rule: str, msg: Message, constraints: Sequence[str], first_user: bool) -> tuple[str, float] | None:
    """The weak context type of one corpus message and its confidence, or ``None`` (module docstring)."""
    if msg.role == Role.SYSTEM:
        return "instruction", 0.95
    if msg.role == Role.TOOL or msg.tool_calls or any(rule.startswith(r) for r in _TOOL_RULES):
        return "tool", 0.95
    if any(x in rule for x in _NO_LABEL):
        return None
    if msg.role == Role.USER:
        text = msg.content
        if constraints and sum(len(s) for s in constraints) >= 0.5 * max(1, len(text.strip())):
            return "constraint", 0.75
        if rule in _GOAL_RULES:
            return "goal", _GOAL_RULES[rule]
        if statements(text):
            return "user", 0.75
        if first_user and rule.split(":")[0] in ("multiwoz", "crosswoz"):
            return "goal", 0.7
        if rule.endswith("user_request"):
            return "goal", 0.6
        if rule in _USER_RULES:
            return "user", 0.6
        if rule.endswith("user_inform"):
            return "constraint", 0.55
        return None
    if any(rule.startswith(r) for r in _TASK_RULES):
        return "task", 0.6
    return None


def load_examples(data_dir: Path = DEFAULT_OUT) -> dict[str, list[dict[str, Any]]]:
    """Weakly labelled examples by split: ``{"message", "signals", "type", "confidence", "source"}``.

    Messages come from ``sessions.jsonl.gz`` (exact tool calls), splits and corpus rules from the dataset.

    Raises:
        FileNotFoundError: the dataset was not built (``python -m training.data build``).
    """
    from .data import load_dataset_dict  # noqa: PLC0415 - needs the train extra

    ds = load_dataset_dict(data_dir)
    meta = {}
    for split in ("train", "dev", "test"):
        for rid, rule, src in zip(ds[split]["id"], ds[split]["weak_rule"], ds[split]["source"], strict=True):
            meta[rid] = (split, rule or "", src)
    out: dict[str, list[dict[str, Any]]] = {"train": [], "dev": [], "test": []}
    for _, sess in iter_jsonl(data_dir / "sessions.jsonl.gz"):
        first_seen = False
        for m in sess["messages"]:
            msg = Message(role=m["role"], content=m.get("content") or "", id=m["id"], turn=m["index"],
                          name=m.get("name"), tool_call_id=m.get("tool_call_id"), tool_calls=m.get("tool_calls") or None)
            first = msg.role == Role.USER and not first_seen
            first_seen = first_seen or msg.role == Role.USER
            if m["id"] not in meta:
                continue
            split, rule, src = meta[m["id"]]
            cons = hard_constraints(msg.content) if msg.role in (Role.USER, Role.SYSTEM) and len(msg.content) <= 4000 else ()
            label = weak_type(rule, msg, cons, first)
            if label is not None:
                out[split].append({"message": msg, "signals": type_signals(msg, cons, first), "type": label[0],
                                   "confidence": label[1], "source": src})
    return out


def load_handmade(path: Path = HANDMADE) -> list[dict[str, Any]]:
    """The hand-made gold set: messages with their context type (``data/context_types/handmade.jsonl``)."""
    out = []
    for _, d in iter_jsonl(path):
        msg = Message.from_dict({k: d[k] for k in ("role", "content", "tool_calls", "tool_call_id") if k in d})
        cons = hard_constraints(msg.content) if msg.role in (Role.USER, Role.SYSTEM) else ()
        out.append({"message": msg, "signals": type_signals(msg, cons, bool(d.get("first_user"))), "type": d["type"],
                    "confidence": 1.0, "source": d.get("language", "?")})
    return out


def _scores(gold: Sequence[str], pred: Sequence[str]) -> dict[str, float]:
    from sklearn.metrics import accuracy_score, f1_score  # noqa: PLC0415

    labels = [str(t) for t in CONTEXT_TYPES if str(t) in set(gold)]  # macro over the types the data holds
    per = f1_score(gold, pred, labels=labels, average=None, zero_division=0)
    return {"accuracy": float(accuracy_score(gold, pred)),
            "macro_f1": float(f1_score(gold, pred, labels=labels, average="macro", zero_division=0)), "n": len(gold),
            "f1": {t: round(float(f), 4) for t, f in zip(labels, per, strict=True)}}


def evaluate(head: TypeHead | None, examples: Sequence[dict[str, Any]], weight: float = 0.5) -> dict[str, Any]:
    """Accuracy and macro-F1 of the rules, the head and the blend on labelled examples."""
    rules = RuleTypeClassifier()
    gold = [e["type"] for e in examples]
    rp = [rules.classify(e["message"], signals=e["signals"]) for e in examples]
    out: dict[str, Any] = {"rules": _scores(gold, [str(p.type) for p in rp])}
    if head is not None:
        probs = head.predict_proba([e["message"] for e in examples], [e["signals"] for e in examples])
        out["head"] = _scores(gold, [max(p, key=lambda t: p[t]) for p in probs])
        out["blend"] = _scores(gold, [str(blend(r, p, weight).type) for r, p in zip(rp, probs, strict=True)])
    return out


def train(examples: dict[str, list[dict[str, Any]]], spec: HeadSpec | None = None) -> tuple[TypeHead, dict[str, Any]]:
    """Fit the head on the train split (C chosen by dev macro-F1); returns it with the dev figures per C."""
    from sklearn.linear_model import LogisticRegression  # noqa: PLC0415

    spec = spec or HeadSpec()
    tr = examples["train"]
    X = head_features([e["message"] for e in tr], [e["signals"] for e in tr], spec)
    y = np.array([e["type"] for e in tr])
    w = np.array([e["confidence"] for e in tr])
    best: tuple[float, TypeHead] | None = None
    grid = {}
    for c in C_GRID:
        est = LogisticRegression(C=c, max_iter=2000, class_weight="balanced").fit(X, y, sample_weight=w)
        head = TypeHead(est, spec)
        f1 = evaluate(head, examples["dev"])["head"]["macro_f1"]
        grid[str(c)] = round(f1, 4)
        if best is None or f1 > best[0]:
            best = (f1, head)
    assert best is not None
    return best[1], {"dev_macro_f1_by_C": grid}


WEIGHT_GRID = (0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5)


def choose_weight(head: TypeHead, dev: Sequence[dict[str, Any]], grid: Sequence[float] = WEIGHT_GRID) -> tuple[float, dict[str, Any]]:
    """The head's weight in the blend, chosen on the dev split: the weight with the best dev macro-F1
    among those whose blend is not below the rules on the dev split as a whole and on its bundled
    sessions (the project's own sessions, whose labels are closest to the runtime's conventions).
    Returns ``(weight, {weight: [dev blend, dev bundled blend]})``; 0.0 when no weight qualifies."""
    bundled = [e for e in dev if e["source"] == "bundled"] or list(dev)
    base, base_b = evaluate(None, dev)["rules"]["macro_f1"], evaluate(None, bundled)["rules"]["macro_f1"]
    best, table = (0.0, base), {}
    for w in grid:
        a, b = evaluate(head, dev, w)["blend"]["macro_f1"], evaluate(head, bundled, w)["blend"]["macro_f1"]
        table[str(w)] = [round(a, 4), round(b, 4)]
        if a >= base and b >= base_b - 1e-9 and a > best[1]:
            best = (w, a)
    return best[0], {"rules": [round(base, 4), round(base_b, 4)], "blend": table}


def report(figures: dict[str, Any], counts: dict[str, dict[str, int]]) -> str:
    """The markdown report of a training run."""
    types = [str(t) for t in CONTEXT_TYPES]
    lines = ["# Context-type head", "", "| data | classifier | accuracy | macro-F1 | n | " + " | ".join(types) + " |",
             "|---|---|---|---|---|" + "---|" * len(types)]
    rows = [("test", figures["test"]), ("handmade", figures["handmade"]),
            *((f"test/{src}", v) for src, v in sorted(figures.get("sources", {}).items()))]
    for data, fig in rows:
        for name, v in fig.items():
            per = " | ".join(f"{v['f1'][t]:.2f}" if t in v["f1"] else "-" for t in types)
            lines.append(f"| {data} | {name} | {v['accuracy']:.3f} | {v['macro_f1']:.3f} | {v['n']} | {per} |")
    lines += ["", "Weak labels per split and type: " + json.dumps(counts, ensure_ascii=False), "",
              f"C by dev macro-F1: {figures['grid']}", "",
              f"Blend weight (head share) chosen on dev: {figures['weight']} (dev macro-F1 [all, bundled] per weight: "
              f"{figures['weights']})"]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m training.context_types``: weak labels, training, evaluation, the packaged head."""
    p = argparse.ArgumentParser(prog="python -m training.context_types", description=__doc__.split("\n")[0])
    p.add_argument("--data", default=str(DEFAULT_OUT), help="processed data folder (default data/processed)")
    p.add_argument("--out", default=str(OUT_DIR / "context_types"), help="folder of the head and its report")
    p.add_argument("--ship", action="store_true", help=f"also write the head to {DEFAULT_HEAD_DIR}")
    args = p.parse_args(argv)
    examples = load_examples(Path(args.data))
    counts = {s: dict(Counter(e["type"] for e in xs)) for s, xs in examples.items()}
    head, info = train(examples)
    w, weights = choose_weight(head, examples["dev"])
    head.config["weight"] = w
    figures = {"test": evaluate(head, examples["test"], w), "handmade": evaluate(head, load_handmade(), w),
               "grid": info["dev_macro_f1_by_C"], "weight": w, "weights": weights,
               "sources": {src: evaluate(head, [e for e in examples["test"] if e["source"] == src], w)
                           for src in sorted({e["source"] for e in examples["test"]})}}
    metrics = {"weight": w, "weights_dev": weights, "test": figures["test"], "handmade": figures["handmade"],
               "sources": figures["sources"], "weak_labels": counts}
    for folder in [args.out, *([DEFAULT_HEAD_DIR] if args.ship else [])]:
        head.save(folder, metrics=metrics)
    Path(args.out, "report.md").write_text(report(figures, counts), encoding="utf-8")
    print(report(figures, counts))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
