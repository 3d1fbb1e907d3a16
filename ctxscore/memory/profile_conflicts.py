"""Conflicts in the user profile: a new statement against the stored items it contradicts.

:func:`conflicting` finds the items a statement contradicts; :func:`resolve` pages their evidence in
(the original messages, from the history or from the store for earlier sessions), reads it again and
decides, in this order:

1. ``none``: the evidence, read again, no longer supports the item (it is retracted): no conflict.
2. ``superseded``: the statement says the preference changed ("I've switched to", "no longer", 不再):
   the old item is kept, marked superseded by the new one.
3. ``exception``: the statement is for now only ("this time", 这次) and the item holds beyond the task:
   the new item is scoped to the current task, the old one stays.
4. ``scene``: every old item held only for an earlier task (its own scope): both stay, each in its scope.
5. ``clarify``: otherwise both are flagged ``needs_clarification`` with the evidence read; the profile
   section asks the user. Nothing is overwritten.
"""

from __future__ import annotations

from typing import Any

from .profile_extract import Statement, exclusive, statements
from .profile_model import Evidence, ProfileItem

#: Attributes of basic facts that hold one value at a time.
_SINGLE_BASIC = frozenset({"age", "city"})


def conflicting(layer: Any, st: Statement) -> list[ProfileItem]:
    """The live items of ``layer`` (a ProfileLayer) that ``st`` contradicts: the same subject with the
    opposite polarity, another liked value of an exclusive attribute (seat, cabin, diet ...), or
    another age or city."""
    out = []
    for it in layer.items.values():
        if it.status not in ("active", "needs_clarification") or it.family != st.family or it.key == st.key:
            continue
        if it.profile_type in ("decision", "relationship"):
            continue
        if it.value == st.subject and it.polarity * st.polarity < 0:
            out.append(it)
        elif it.value != st.subject and it.polarity == st.polarity == 1 and (
                exclusive(st.attribute) or (st.profile_type == "basic" and st.attribute in _SINGLE_BASIC)):
            out.append(it)
    return out


def page_in(layer: Any, item: ProfileItem) -> list[tuple[Evidence, str]]:
    """(evidence, original text) of an item: from the session's history, else the store, else the quote."""
    out = []
    hist = layer.ctx.history
    for ev in item.evidence:
        text = None
        if ev.session == layer.session_id and ev.message in hist.ids:
            text = hist.entries[hist.ids[ev.message]].msg.content
        else:
            try:
                row = layer.ctx.store.get(ev.session, ev.message)
                text = row.text if row is not None else None
            except Exception:  # noqa: BLE001 - a store that cannot be read leaves the quote as evidence
                text = None
        out.append((ev, text if text is not None else ev.quote))
    return out


def resolve(layer: Any, items: list[ProfileItem], st: Statement, ev: Evidence) -> tuple[str, list[ProfileItem]]:
    """Decide a conflict (module docstring); returns ``(verdict, the items still in conflict)`` and marks
    the old items (retracted, superseded or needs_clarification) through ``layer._changed``."""
    live = []
    for it in items:
        pairs = page_in(layer, it)
        support = [(e, t) for e, t in pairs if any(s.key == it.key for s in statements(t))]
        if not support:
            it.status = "retracted"
            layer._changed(it, "retracted")
            continue
        it.conflict = {"with": st.key, "message": ev.message, "session": ev.session, "statement": ev.quote,
                       "evidence": [{"session": e.session, "message": e.message, "text": t[:240]} for e, t in support]}
        live.append(it)
    if not live:
        return "none", []
    if st.change:
        for it in live:
            it.status = "superseded"
            layer._changed(it, "superseded")
        return "superseded", live
    if st.temporary and not st.general and all(it.time_level != "current_task" for it in live):
        return "exception", live
    if all(it.time_level == "current_task" and all(e.task != ev.task or e.session != ev.session for e in it.evidence)
           for it in live):
        return "scene", live
    for it in live:
        it.status = "needs_clarification"
        layer._changed(it, "needs_clarification")
    return "clarify", live


def annotate(item: ProfileItem, verdict: str, others: list[ProfileItem], ev: Evidence) -> None:
    """Mark the new statement's item after :func:`resolve`: the items it supersedes, is an exception
    to, or conflicts with (then it needs clarification too)."""
    keys = [o.key for o in others]
    if verdict == "superseded":
        item.conflict = {"supersedes": keys}
    elif verdict == "exception":
        item.conflict = {"exception_to": keys}
    elif verdict == "clarify":
        item.status = "needs_clarification"
        item.conflict = {"with": keys, "evidence": [x for o in others for x in (o.conflict or {}).get("evidence", [])]}

