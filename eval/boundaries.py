"""Task-boundary detection against the real boundaries of the chained evaluation sessions.

The held-out sessions chain several member dialogues or agent trajectories of one simulated user.
Message ids are ``SOURCE/SESSION#TURN``: the part before ``#`` names the member. A **real boundary**
is a message index ``i > 0`` whose member differs from message ``i - 1``'s. A **detected boundary**
is an index ``i > 0`` where the runtime started a new task: ``Entry.task`` of message ``i`` differs
from message ``i - 1``'s after the session is fed to a :class:`ctxscore.ContextManager` (the
decision of :func:`ctxscore.window.tasks.starts_task`, made as each message is appended; it depends
on the messages and the rule file only, not on the scorer or the budget).

A detected boundary is a true positive when it matches a real one at most ``tolerance`` messages
away (each real boundary matches at most one detected boundary, nearest first; ``tolerance=0``:
the same index). Per session source and overall: ``precision = tp / detected``, ``recall = tp / real``
(``None`` when the denominator is 0), ``f1`` their harmonic mean.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from .policies import clean_message
from .sessions import EvalSession


def member(message_id: str) -> str:
    """The member dialogue or trajectory of a message id: the part before ``#`` (``"sgd/18_00003#4"`` -> ``"sgd/18_00003"``)."""
    return message_id.split("#", 1)[0]


def real_boundaries(session: EvalSession) -> list[int]:
    """Indices ``i > 0`` where the member of message ``i`` differs from message ``i - 1``'s, ascending."""
    members = [member(session.message_id(i)) for i in range(len(session.messages))]
    return [i for i in range(1, len(members)) if members[i] != members[i - 1]]


def boundaries_from_tasks(tasks: Sequence[int]) -> list[int]:
    """Indices ``i > 0`` where the task number changes (``tasks[i] != tasks[i - 1]``), ascending."""
    return [i for i in range(1, len(tasks)) if tasks[i] != tasks[i - 1]]


def detect_tasks(session: EvalSession) -> list[int]:
    """The runtime's task number of every message: the session fed to a fresh rules-only
    ``ContextManager`` (one ``extend``, which appends the messages in order exactly as ``add`` does)."""
    from ctxscore import ContextManager

    with ContextManager(scorer="rules", session_id=session.session_id) as cm:
        cm.extend([clean_message(m) for m in session.messages])
        return [e.task for e in cm.history.entries]


def match(real: Sequence[int], detected: Sequence[int], tolerance: int = 0) -> int:
    """True positives: detected boundaries matched one to one to real ones at most ``tolerance``
    messages away (for each real boundary in order, the nearest unmatched detected one; ties go to
    the earlier).

    Raises:
        ValueError: ``tolerance`` < 0.
    """
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    free = sorted(set(detected))
    tp = 0
    for r in sorted(set(real)):
        near = [d for d in free if abs(d - r) <= tolerance]
        if near:
            free.remove(min(near, key=lambda d: (abs(d - r), d)))
            tp += 1
    return tp


def session_row(session: EvalSession, tasks: Sequence[int], tolerance: int = 0) -> dict[str, Any]:
    """``{"session_id", "source", "real", "detected", "tp"}`` of one session given its task numbers
    (one per message, e.g. from :func:`detect_tasks` or a replayed manager)."""
    if len(tasks) != len(session.messages):
        raise ValueError(f"{session.session_id}: {len(tasks)} task numbers for {len(session.messages)} messages")
    real, det = real_boundaries(session), boundaries_from_tasks(tasks)
    return {"session_id": session.session_id, "source": session.source, "real": len(real), "detected": len(det),
            "tp": match(real, det, tolerance)}


def _block(rows: list[dict[str, Any]]) -> dict[str, Any]:
    real, det, tp = (sum(r[k] for r in rows) for k in ("real", "detected", "tp"))
    p = round(tp / det, 4) if det else None
    r = round(tp / real, 4) if real else None
    f1 = round(2 * p * r / (p + r), 4) if p and r else (0.0 if p is not None and r is not None else None)
    return {"sessions": len(rows), "real": real, "detected": det, "tp": tp, "precision": p, "recall": r, "f1": f1}


def boundary_figures(rows: Iterable[dict[str, Any]], tolerance: int = 0) -> dict[str, Any]:
    """Pooled figures of :func:`session_row` rows, overall and per source:
    ``{"tolerance", "overall": {...}, "by_source": {source: {...}}}`` with ``sessions``, ``real``,
    ``detected``, ``tp``, ``precision``, ``recall``, ``f1``."""
    rows = list(rows)
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by[r["source"]].append(r)
    return {"tolerance": tolerance, "overall": _block(rows), "by_source": {s: _block(v) for s, v in sorted(by.items())}}


def boundary_table(fig: dict[str, Any]) -> list[str]:
    """Markdown table of :func:`boundary_figures`: one row per source, then the overall row."""
    def fmt(v: Any) -> str:
        return "–" if v is None else f"{v:.3f}"

    lines = ["| source | sessions | real | detected | matched | precision | recall | F1 |", "|---|---|---|---|---|---|---|---|"]
    for name, b in [*fig["by_source"].items(), ("**all**", fig["overall"])]:
        lines.append(f"| {name} | {b['sessions']} | {b['real']} | {b['detected']} | {b['tp']} | {fmt(b['precision'])} | "
                     f"{fmt(b['recall'])} | {fmt(b['f1'])} |")
    return lines
