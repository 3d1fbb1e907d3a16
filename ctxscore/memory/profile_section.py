"""The profile section of the window (position 30): what the agent knows about the user, by layer.

Lines, most important first, within ``share`` of the budget:

1. items that need clarification, with the evidence read again: ``needs clarification (ask the user): ...``;
2. the current task's and the session's items as the user's own words (``said (m12): "..." -> ...``);
3. mid- and long-term items as structured conclusions with their stability
   (``preference/seat: window seat (long-term, stability 2.70: 4 times, 3 scenes, confirmed)``);
4. people (``person: Anna, wife (m3)``) and the session's latest decisions, compromises marked.

An item whose every evidence message is verbatim in this build is left out (the window shows it).
"""

from __future__ import annotations

from typing import Any

from .profile_model import ProfileItem
from .typed_sections import capped_note

HEADER = ("User profile (stability = occurrences + duration + cross-scene + confirmation, each 0-1; "
          "quotes are the user's own words):")
#: Decisions of the session shown (the latest).
MAX_DECISIONS = 3
_LEVEL_NAME = {"current_task": "this task", "session": "this session", "mid": "mid-term", "long": "long-term"}


def item_line(it: ProfileItem) -> str:
    """One item as a line (module docstring)."""
    ev = it.evidence[-1] if it.evidence else None
    where = f"; for this task only, an exception to {', '.join(it.conflict['exception_to'])}" if (
        it.conflict and "exception_to" in it.conflict) else ""
    if it.time_level in ("mid", "long"):
        t = it.terms
        parts = [f"{it.occurrences} times", f"{len(it.scenes)} scenes"]
        if t.get("confirmation", 0) >= 1.0:
            parts.append("confirmed")
        return f"{it.describe()} ({_LEVEL_NAME[it.time_level]}, stability {it.stability:.2f}: {', '.join(parts)}){where}"
    if it.source == "behaviour":
        return f"inferred from choices: {it.describe()} ({_LEVEL_NAME.get(it.time_level, it.time_level)}){where}"
    quote = f'said ({ev.message}): "{ev.quote}" -> ' if ev is not None and ev.quote else ""
    return f"{quote}{it.describe()} ({_LEVEL_NAME.get(it.time_level, it.time_level)}){where}"


def clarify_line(it: ProfileItem) -> str:
    """An item in conflict: both sides with the evidence read again, and the question to ask."""
    c = it.conflict or {}
    ev = "; ".join(f'{x["message"]}: "{x["text"][:100]}"' for x in c.get("evidence", [])[:2])
    other = c.get("with")
    other = ", ".join(other) if isinstance(other, list) else (other or "")
    return f"needs clarification (ask the user): {it.describe()} [{ev}] vs {other}"


class ProfileSection:
    """The profile note (module docstring); ``layer`` is the :class:`~ctxscore.memory.profile.ProfileLayer`."""

    name = "profile"
    position = 30

    def __init__(self, layer: Any) -> None:
        self.layer = layer

    def _shown_verbatim(self, it: ProfileItem, view: Any) -> bool:
        hist = view.history
        sid = self.layer.session_id
        for ev in it.evidence:
            i = hist.ids.get(ev.message) if ev.session == sid else None
            if i is None or i >= len(view.codes) or int(view.codes[i]) != 0:
                return False
        return bool(it.evidence)

    def _current(self, it: ProfileItem, view: Any) -> bool:
        """A current-task item belongs to the active task of this session."""
        if it.time_level != "current_task":
            return True
        return any(e.session == self.layer.session_id and e.task == view.history.task_no for e in it.evidence)

    def lines(self, view: Any) -> list[str]:
        """The section's lines for this build, in priority order."""
        items = self.layer.active()
        out = [clarify_line(it) for it in items if it.status == "needs_clarification"]
        for it in items:
            if it.status != "active" or it.profile_type in ("decision", "relationship") or not self._current(it, view):
                continue
            if not self._shown_verbatim(it, view):
                out.append(item_line(it))
        for p in self.layer.people.values():
            if p.evidence:
                out.append(f"person: {p.name or p.key}, {p.relation} ({p.evidence[-1].message})")
        sid = self.layer.session_id
        decisions = [it for it in items if it.profile_type == "decision" and it.evidence
                     and it.evidence[-1].session == sid][-MAX_DECISIONS:]
        for it in decisions:
            rejected = len((it.conflict or {}).get("rejected", []))
            plural = "option" if rejected == 1 else "options"
            how = f" after turning down {rejected} {plural} (a compromise, not a preference)" if it.compromise and rejected \
                else (" (a compromise, not a preference)" if it.compromise else "")
            out.append(f"decision ({it.evidence[-1].message}): chose {it.value}{how}")
        return out

    def render(self, view: Any) -> tuple[list[dict[str, Any]], int]:
        """The profile note (empty when there is nothing to show)."""
        lines = self.lines(view)
        return capped_note(view, HEADER, lines, view.layer_cap(self.layer.share)) if lines else ([], 0)
