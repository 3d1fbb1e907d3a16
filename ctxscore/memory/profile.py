"""User-profile memory: what the agent knows about a user, per user across sessions, with stability scores.

``ContextManager(layers=[ProfileLayer(user_id="42")])``. The profile lives in the store's records under
the scope ``user:<id>`` (kinds ``profile`` and ``people``), so a session of another user never sees
it, and a later session of the same user (same store) starts with it.

**Items** (:class:`ProfileItem`): ``profile_type`` (basic, goal, ability, preference, decision,
relationship), ``value``, ``scope``, ``time_level`` (current_task, session, mid, long), ``source``
(explicit_statement, inferred, behaviour), the evidence (message ids with session, task, scene and
time), first and last seen, occurrences and scenes.

**Extraction in real time**: after each user message, :func:`ctxscore.memory.profile_extract.statements`
reads what it says about the user ("don't recommend Apple, I'm done with iOS for now" -> a brand
preference, avoid ``apple``, scoped to the current task because of "for now"). A short affirmation
right after an assistant's offer is a decision; made after the user turned options down (or with
resignation: "fine, I guess") it is recorded as a **compromise**, and a compromise never becomes a
preference. An affirmation of an assistant message that restates an item confirms it.

**Consolidation** at the end of each task and of the session (:meth:`ProfileLayer.end_session`):

``stability_score = w0*occurrences + w1*duration + w2*cross_scene + w3*confirmation``, each term in
[0, 1] (:class:`StabilityPolicy`): occurrences ``min(1, n / occurrences_norm)``; duration
``min(1, (last_seen - first_seen) / duration_days)``; cross_scene ``min(1, (scenes - 1) /
(scenes_norm - 1))``; confirmation 1.0 confirmed by the user, 0.6 explicit statement, 0.4
behaviour, 0.2 inferred. Promotion, one level per consolidation: a current-task item seen in two
tasks -> session (else it expires with its task); session -> mid at ``mid`` (with at least
``min_occurrences_mid`` occurrences in at least ``min_sessions_mid`` sessions, 2); mid -> long at
``long`` (in at least ``min_sessions_long`` sessions, 3): one conversation, however often it says a
preference, does not make it a stable one. Scenes count those with scene words (not ``general``).

**Conflicts**: a statement that contradicts an active item (the opposite polarity, or another value of
an exclusive attribute such as the seat) pages the item's evidence in from the store and reads it
again. A stated change ("I've switched to aisle seats") supersedes the item (kept, marked); a
one-time exception ("this time an aisle seat") is kept for the current task beside the item; an item
that held only for an earlier task gives way; otherwise both are flagged ``needs_clarification`` and
the profile section asks the user. Nothing is silently overwritten.

**People** (:class:`Person`): who a person is in the user's world ("my wife Anna" -> Anna, wife), with
what the user said about them.
"""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config import check_unicode
from ..errors import ConfigError
from ..messages import Role
from ..scoring.rules import extract_entities
from ..store.base import MAX_NAME_CHARS, RecordStore
from ..window.history import Entry
from ..window.layers import Layer, LayerContext, check_share
from . import lexicon as lx
from .profile_conflicts import annotate, conflicting, resolve
from .profile_extract import Statement, scene_of, statements, terms_in
from .profile_model import LEVELS, Evidence, Person, ProfileItem, StabilityPolicy, stability
from .profile_section import ProfileSection

DEFAULT_SHARE = 0.05
#: An affirmation that hands over information ("Sure, it's noah_fischer_5705") is no decision.
_INFO = re.compile(r"(?i)\b(?:it'?s|my|is)\b.{0,30}(?:\d{3,}|@|_)|\d{5,}")
#: Attributes a free choice is evidence for (what one chooses the same way again).
_BEHAVIOUR_ATTRIBUTES = frozenset({"seat", "cabin", "brand", "diet"})

@dataclass
class _Turn:
    """What the layer remembers of the running conversation (offers, rejections, the task)."""

    task: int = -1
    scene: str = "general"
    goal: str = ""
    offer: Entry | None = None
    rejections: list[str] = field(default_factory=list)
    tasks_seen: list[int] = field(default_factory=list)


def _negated(text: str, term: str) -> bool:
    """``term`` appears in ``text`` only right after a negation ("not the window seat", 不辣)."""
    low = text.lower()
    i = low.find(term)
    return i < 0 or bool(lx.NEGATION.search(low[max(0, i - 8): i]))


def _spans(text: str, most: int = 5) -> list[str]:
    """The entities of an offer, in order, without one that starts inside another ("08:15" then "15 has ...")."""
    out: list[str] = []
    end = -1
    for s in extract_entities(text):
        i = text.find(s)
        if len(s) >= 40 or i < 0:
            continue
        if i < end:
            continue
        out.append(s)
        end = i + len(s)
        if len(out) == most:
            break
    return out


#: Longest user id (characters): the profile's store scope ``user:<id>`` stays within the store's
#: :data:`~ctxscore.store.base.MAX_NAME_CHARS`.
MAX_USER_ID_CHARS = MAX_NAME_CHARS - len("user:")


def _user_scope(user_id: str) -> str:
    """The store scope of a user's profile, ``user:<id>``.

    Raises:
        ConfigError: the id holds NUL or is longer than :data:`MAX_USER_ID_CHARS` (every store refuses
            the scope; said here, naming ``user_id``, rather than when the layer is attached).
    """
    if "\x00" in user_id:
        raise ConfigError(f"ProfileLayer user_id {user_id!r} holds a NUL character, which no store can keep; remove it")
    if len(user_id) > MAX_USER_ID_CHARS:
        raise ConfigError(f"ProfileLayer user_id has {len(user_id):,} characters; at most {MAX_USER_ID_CHARS} are "
                          f"allowed (the profile is stored under the scope 'user:<user_id>', at most {MAX_NAME_CHARS})")
    return f"user:{user_id}"


class ProfileLayer(Layer):
    """The user-profile layer (see the module docstring).

    Args:
        user_id: the user; the profile is kept under the store scope ``user:<id>``.
        policy: the :class:`StabilityPolicy`.
        clock: seconds since the epoch (default :func:`time.time`; tests and replays pass their own).
        share: the fraction of the budget the profile section may use, in (0, 1].

    Raises:
        ConfigError: a user id that is empty, holds NUL or a lone surrogate, or is longer than
            :data:`MAX_USER_ID_CHARS` characters (the store's scope limit less ``user:``); ``share``
            out of range.
    """

    position = 30

    def __init__(self, user_id: str, policy: StabilityPolicy | None = None, clock: Callable[[], float] = time.time,
                 share: float = DEFAULT_SHARE) -> None:
        if not isinstance(user_id, str) or not user_id.strip():
            raise ConfigError(f"ProfileLayer needs a non-empty user_id string, got {user_id!r}")
        check_unicode(user_id, "ProfileLayer user_id")
        self.user_id, self.scope = user_id, _user_scope(user_id)
        self.policy = policy or StabilityPolicy()
        self.clock, self.share = clock, check_share("ProfileLayer", share)
        self.items: dict[str, ProfileItem] = {}
        self.people: dict[str, Person] = {}
        self.store: RecordStore | None = None
        self.consolidations = 0
        self.promotions: list[dict[str, Any]] = []
        self._outbox: list[dict[str, Any]] = []
        self._dirty: set[str] = set()
        self._deleted: set[str] = set()
        self._seen: dict[tuple[str, str, str], float] = {}  # (message, quote, kind) -> first time read
        self._baseline: tuple[dict[str, ProfileItem], dict[str, Person], int] | None = None
        self.session_id = ""
        self._turn = _Turn()
        self.sections = (ProfileSection(self),)

    # -- lifecycle ------------------------------------------------------------------------------
    def attach(self, ctx: LayerContext) -> None:
        """Load the user's profile from the store (a store without records keeps it in memory). The first
        attach keeps the profile as it stands without this session's evidence (the baseline a rebuilt
        history starts from); this session's messages then come again through :meth:`on_add`, and
        the evidence they give keeps its first time."""
        self.ctx = ctx
        self.store = ctx.store if isinstance(ctx.store, RecordStore) else None
        if self._baseline is not None:
            return
        self.session_id = ctx.session_id
        if self.store is not None:
            self.items = {k: ProfileItem.from_dict(r.value) for k, r in self.store.records(self.scope, "profile").items()}
            self.people = {k: Person.from_dict(r.value) for k, r in self.store.records(self.scope, "people").items()}
        self._forget_session()
        self._baseline = (copy.deepcopy(self.items), copy.deepcopy(self.people), self.consolidations)

    def _forget_session(self) -> None:
        """Drop this session's evidence (remembering its times) and the items left without evidence."""
        sid = self.session_id
        for key, it in list(self.items.items()):
            mine = [e for e in it.evidence if e.session == sid]
            for e in mine:
                self._seen.setdefault((e.message, e.quote, e.kind), e.time)
            if mine:
                it.evidence = [e for e in it.evidence if e.session != sid]
                self._dirty.add(key)
                if not it.evidence:
                    del self.items[key]
                    self._deleted.add(key)
        for key, p in list(self.people.items()):
            p.evidence = [e for e in p.evidence if e.session != sid]
            if not p.evidence:
                del self.people[key]
                self._deleted.add(f"person:{key}")

    def on_reset(self) -> None:
        """The session's history is being rebuilt: start again from the baseline (the kept messages come
        again through :meth:`on_add`, their evidence keeping its time)."""
        if self._baseline is None:
            return
        self._forget_session()
        items, people, self.consolidations = self._baseline
        self._deleted |= (set(self.items) - set(items)) | {f"person:{k}" for k in set(self.people) - set(people)}
        self._dirty |= set(self.items) | set(items) | {f"person:{k}" for k in people}
        self.items, self.people = copy.deepcopy(items), copy.deepcopy(people)
        self._turn = _Turn()

    def on_add(self, entries: Sequence[Entry]) -> None:
        """Read each new message: task boundaries consolidate, user messages give statements, decisions
        and confirmations, assistant messages are remembered as offers; changes are written at the end."""
        for e in entries:
            if e.task != self._turn.task:
                self._new_task(e)
            if e.msg.role == Role.USER:
                self._user(e)
            elif e.msg.role == Role.ASSISTANT and e.msg.content.strip():
                offer = lx.OFFER.search(e.msg.content) or lx.PROPOSE.search(e.msg.content)
                self._turn.offer = e if offer else None
        self.flush()

    def end_session(self) -> list[dict[str, Any]]:
        """Consolidate at the end of the session (every task of it ends); returns the promotions made."""
        done = self.consolidate(final=True)
        self.flush()
        return done

    # -- reading user messages --------------------------------------------------------------------
    def _new_task(self, e: Entry) -> None:
        if self._turn.task >= 0:
            self.consolidate()
        self._turn = _Turn(task=e.task, tasks_seen=[*self._turn.tasks_seen, e.task])

    def _evidence(self, e: Entry, quote: str, kind: str = "explicit_statement") -> Evidence:
        mid, quote = e.msg.id or "", quote[:240]
        when = self._seen.setdefault((mid, quote, kind), float(self.clock()))
        return Evidence(self.session_id, mid, e.msg.turn or 0, e.task, self._turn.scene, when, quote, kind)

    def _user(self, e: Entry) -> None:
        text = e.msg.content
        if not self._turn.goal:  # the task's first user message names its goal
            self._turn.goal = " ".join(text.split())[:60]
        if self._turn.scene == "general":  # and the first one with scene words its scene
            self._turn.scene = scene_of(text)
        if self._turn.offer is not None and len(text) < 200 and lx.REJECT.search(text):
            self._turn.rejections.append(e.msg.id or "")
        elif self._turn.offer is not None and len(text) < 160 and lx.AFFIRM.search(text) and not _INFO.search(text) \
                and not lx.CLOSING.search(text):
            self._decision(e)
        for st in statements(text):
            if st.profile_type == "relationship":
                self._person(st, e)
            self._statement(st, e)
        if lx.AFFIRM.search(text[:80]):
            self._turn.offer = None

    def _scope(self, st: Statement) -> tuple[str, str]:
        """(scope, time_level) of a new statement."""
        if st.temporary and not st.general:
            return f"task {self._turn.task}: {self._turn.goal}", "current_task"
        return ("general", "session") if st.general or st.profile_type != "preference" else (f"session {self.session_id}", "session")

    def _statement(self, st: Statement, e: Entry, kind: str = "explicit_statement") -> None:
        """Add a statement: as evidence of its item, or as a new item, after the conflict check."""
        ev = self._evidence(e, st.quote, kind)
        # choices among offers are no stated taste: economy on one trip and business on another do not
        # conflict; only statements are checked, against items some statement supports
        found = [] if kind == "behaviour" else [it for it in conflicting(self, st)
                                                 if any(x.kind != "behaviour" for x in it.evidence)]
        verdict, others = resolve(self, found, st, ev)
        item = self.items.get(st.key)
        change = "evidence"
        if item is None or item.status not in ("active", "needs_clarification"):
            scope, level = self._scope(st)
            if verdict == "exception":
                scope, level = f"task {self._turn.task}: {self._turn.goal}", "current_task"
            item = ProfileItem(st.key, st.profile_type, st.attribute, st.subject, st.polarity, scope, level,
                               "behaviour" if kind == "behaviour" else "explicit_statement")
            self.items[item.key] = item
            change = "added"
        item.evidence.append(ev)
        annotate(item, verdict, others, ev)
        self._changed(item, change if verdict in ("none", "scene") else verdict)

    def _decision(self, e: Entry) -> None:
        """The user took the assistant's last offer: a decision (a compromise after rejections)."""
        offer = self._turn.offer
        if offer is None:
            return
        spans = _spans(offer.msg.content[:1200])
        value = ", ".join(spans) or " ".join(offer.msg.content.split())[:80]
        rejected = list(self._turn.rejections)
        compromise = bool(rejected) or bool(lx.RESIGN.search(e.msg.content))
        key = f"decision:{self.session_id}:{e.msg.id}"
        ev = self._evidence(e, e.msg.content, "explicit_statement")
        item = ProfileItem(key, "decision", "compromise" if compromise else "choice", value, 1,
                           f"task {self._turn.task}: {self._turn.goal}", "session", "explicit_statement", [ev],
                           compromise=compromise)
        item.conflict = {"offer": offer.msg.id, "rejected": rejected} if rejected else None
        self.items[key] = item
        self._changed(item, "added")
        self._turn.rejections = []
        self._confirm(offer, e)
        if not compromise:  # a free choice is behaviour evidence for what it is about; a compromise is not
            for attr, subj in terms_in(offer.msg.content):
                if attr in _BEHAVIOUR_ATTRIBUTES and not _negated(offer.msg.content, subj):
                    self._statement(Statement("preference", attr, subj, 1, offer.msg.content[:240]), e, "behaviour")

    def _confirm(self, offer: Entry, e: Entry) -> None:
        """An affirmation of an assistant message restating an item confirms the item: the offer names
        its value, in any of its spellings (靠窗 is the window seat), and no other value of its
        attribute (accepting the aisle seat offered for a window seat confirms no window seat)."""
        low = offer.msg.content.lower()
        terms = terms_in(offer.msg.content)
        named = {subject for _, subject in terms}
        for it in self.items.values():
            if it.profile_type == "decision" or it.status != "active" or not it.value or (
                    it.value not in low and it.value not in named):
                continue
            if any(attr == it.attribute and subject != it.value for attr, subject in terms):
                continue  # the offer names another value of it ("window seats are full; an aisle seat?")
            if it.evidence and it.evidence[-1].kind != "confirmed":
                it.evidence.append(self._evidence(e, e.msg.content, "confirmed"))
                self._changed(it, "confirmed")

    def _person(self, st: Statement, e: Entry) -> None:
        key = st.subject
        p = self.people.get(key) or Person(key, st.name, st.attribute)
        if st.quote not in p.notes:
            p.notes.append(st.quote)
        p.evidence.append(self._evidence(e, st.quote))
        self.people[key] = p
        self._dirty.add(f"person:{key}")
        self._outbox.append({"type": "person", "person": p.to_dict()})

    def _changed(self, item: ProfileItem, change: str) -> None:
        item.stability, item.terms = stability(item, self.policy)
        self._dirty.add(item.key)
        self._outbox.append({"type": "profile_item", "change": change, "item": item.to_dict()})

    # -- consolidation ------------------------------------------------------------------------------
    def consolidate(self, final: bool = False) -> list[dict[str, Any]]:
        """Score every active item and promote or expire it (module docstring); returns the promotions."""
        self.consolidations += 1
        done = []
        finished = set(self._turn.tasks_seen) if final else set(self._turn.tasks_seen[:-1]) | {self._turn.task}
        for it in self.items.values():
            if it.status not in ("active",):
                continue
            before = it.time_level
            it.stability, it.terms = stability(it, self.policy)
            after = self._next_level(it, finished)
            if after == before:
                continue
            if after == "expired":
                it.status = "expired"
                self._changed(it, "expired")
                continue
            it.time_level, it.promoted_at = after, self._token()
            rec = {"key": it.key, "from": before, "to": after, "stability": round(it.stability, 3),
                   "session": getattr(self, "session_id", ""), "consolidation": self.consolidations}
            done.append(rec)
            self.promotions.append(rec)
            self._changed(it, "promoted")
        return done

    def _next_level(self, it: ProfileItem, finished: set[int]) -> str:
        if it.profile_type == "decision":
            return it.time_level
        if it.time_level == "current_task":
            tasks = {(e.session, e.task) for e in it.evidence}
            if len(tasks) >= 2:
                return "session"
            mine = all(e.session == getattr(self, "session_id", "") and e.task in finished for e in it.evidence)
            return "expired" if mine else it.time_level
        if it.promoted_at == self._token():
            return it.time_level  # one level per consolidation
        pol = self.policy
        if (it.time_level == "session" and it.stability >= pol.mid and it.occurrences >= pol.min_occurrences_mid
                and it.sessions >= pol.min_sessions_mid):
            return "mid"
        if it.time_level == "mid" and it.stability >= pol.long and it.sessions >= pol.min_sessions_long:
            return "long"
        return it.time_level

    def _token(self) -> str:
        """The current consolidation, ``session#count``."""
        return f"{self.session_id}#{self.consolidations}"

    # -- storage and views ------------------------------------------------------------------------
    def flush(self) -> None:
        """Write the changed items and people to the store (one transaction each kind).

        Raises:
            StoreError: the store cannot be written (the changes stay pending and are written next time).
        """
        if self.store is None:
            self._dirty.clear()
            self._deleted.clear()
            return
        gone = self._deleted - set(self.items) - {f"person:{k}" for k in self.people}
        if any(not k.startswith("person:") for k in gone):
            self.store.delete_records(self.scope, "profile", sorted(k for k in gone if not k.startswith("person:")))
        if any(k.startswith("person:") for k in gone):
            self.store.delete_records(self.scope, "people", sorted(k[7:] for k in gone if k.startswith("person:")))
        self._deleted.clear()
        if not self._dirty:
            return
        items = {k: self.items[k].to_dict() for k in self._dirty if k in self.items}
        people = {k[7:]: self.people[k[7:]].to_dict() for k in self._dirty if k.startswith("person:") and k[7:] in self.people}
        if items:
            self.store.put_records(self.scope, "profile", items)
        if people:
            self.store.put_records(self.scope, "people", people)
        self._dirty.clear()

    def drain_events(self) -> list[dict[str, Any]]:
        """The profile changes since the last call (for the event log), oldest first."""
        out, self._outbox = self._outbox, []
        return out

    def active(self) -> list[ProfileItem]:
        """Items that are active or need clarification, most stable first."""
        live = [it for it in self.items.values() if it.status in ("active", "needs_clarification")]
        return sorted(live, key=lambda it: (-LEVELS.index(it.time_level) if it.time_level in LEVELS else 0, -it.stability))

    def state(self) -> dict[str, Any]:
        """The profile: items and people (JSON-ready, sorted by key)."""
        return {"user": self.user_id, "items": {k: self.items[k].to_dict() for k in sorted(self.items)},
                "people": {k: self.people[k].to_dict() for k in sorted(self.people)}}

    def conflicts_with(self, st: Statement) -> list[ProfileItem]:
        """Active items a statement contradicts (see :func:`ctxscore.memory.profile_conflicts.conflicting`)."""
        return conflicting(self, st)
