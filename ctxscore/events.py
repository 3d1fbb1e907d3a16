"""Event sourcing with trusted snapshots: every state change of a session is an event, and checkpoints
take snapshots with a content hash that a rebuild or a rollback can trust.

``ContextManager(layers=[ledger, profile, EventLog(ledger=ledger, profile=profile)])`` (after the
layers it watches). Events go to the store's append-only log (:class:`~ctxscore.store.base.RecordStore`,
scope ``events:<session>``), one transaction per batch of messages:

===============  ==================================================  ================================
type             when                                                what it carries
===============  ==================================================  ================================
message_added    a message is stored                                 id, role, task, sha256 of it
tier_changed     a build moves a message to another tier             id, tier
fact             a ledger fact is added, superseded, confirmed,      key (``task|slot``), the fact
                 denied (``change``) or removed                      (or none when removed)
profile_item     a profile item is added, gains evidence, is         key, the whole item
                 promoted, flagged, superseded, expired
person           the people table changes                            key, the person
checkpoint       a snapshot is taken                                 reason, snapshot key, hash
reset            the history was rebuilt (a client's edit, a         the whole state after it
                 rollback, a resumed session whose state differs)
rollback         :meth:`EventLog.rollback`                           the snapshot, the detached session
===============  ==================================================  ================================

**Snapshots** are taken at checkpoints: when a task ends (before the first message of the next one),
before a high-risk tool call (a write call such as ``book_*``, ``cancel_*``, ``update_*``, or a
destructive shell command), every ``every`` events, and on :meth:`EventLog.checkpoint`. A snapshot
is a record (kind ``snapshot``, key the zero-padded sequence number it covers) holding the state
(:func:`canonical` JSON), its sha256, the previous snapshot's hash and the sha256 of the events
since that snapshot, so the chain can be verified (:func:`verify_chain`).

**State** (:meth:`EventLog.live_state`): the messages (id, role, task, digest), the tiers that are not
verbatim, the ledger's current facts with their superseded values, and the profile's items and
people. :func:`rebuild` = a snapshot + the later events; it equals the live state (tests check this
on real sessions). :meth:`EventLog.rollback` detaches the messages after a snapshot's turn
(``ContextManager.truncate``), restores the snapshot's tiers and verifies that the rebuilt state is the
snapshot's.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError, StoreError
from .memory import lexicon as lx
from .messages import Message, Role, Tier
from .store.base import RecordStore
from .window.history import Entry
from .window.layers import Layer, LayerContext

#: Events between two automatic snapshots.
DEFAULT_EVERY = 200
SNAPSHOT_KIND = "snapshot"
_NON_WRITE = re.compile(r"(?i)human|think|calculat|search|^get|find|list|lookup|check|verify|read")


def canonical(value: Any) -> str:
    """The canonical JSON of a value: sorted keys, no spaces, UTF-8 text (what hashes are taken over)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def sha256(value: Any) -> str:
    """Hex sha256 of :func:`canonical` ``value``."""
    return hashlib.sha256(canonical(value).encode("utf-8")).hexdigest()


def message_digest(msg: Message) -> str:
    """The first 16 hex digits of the sha256 of a stored message (its OpenAI form and id)."""
    return sha256([msg.id, msg.to_openai()])[:16]


def empty_state(session_id: str) -> dict[str, Any]:
    """The state of a session with no message."""
    return {"session": session_id, "messages": [], "tiers": {}, "facts": {}, "profile": {}, "people": {}, "task": 0}


def apply(state: dict[str, Any], event: dict[str, Any]) -> None:
    """Apply one event to a state in place (see the module docstring's table).

    Raises:
        ValueError: an event of an unknown type.
    """
    kind = event.get("type")
    if kind == "message_added":
        state["messages"].append([event["id"], event["role"], event["task"], event["digest"]])
        state["task"] = event["task"]
    elif kind == "tier_changed":
        if event["tier"] == Tier.VERBATIM:
            state["tiers"].pop(event["id"], None)
        else:
            state["tiers"][event["id"]] = event["tier"]
    elif kind == "fact":
        if event.get("fact") is None:
            state["facts"].pop(event["key"], None)
        else:
            state["facts"][event["key"]] = event["fact"]
    elif kind == "profile_item":
        state["profile"][event["key"]] = event["item"]
    elif kind == "person":
        state["people"][event["key"]] = event["person"]
    elif kind == "reset":
        state.clear()
        state.update(copy.deepcopy(event["state"]))
    elif kind not in ("checkpoint", "rollback"):
        raise ValueError(f"unknown event type {kind!r}")


@dataclass(frozen=True)
class Snapshot:
    """One trusted snapshot.

    Attributes:
        key: its record key (the zero-padded sequence number of the last event it covers).
        seq: the last event it covers.
        reason: ``task_end`` | ``risky_tool`` | ``every`` | ``manual`` | ``reset``.
        state: the state (see the module docstring).
        hash: sha256 of the canonical state.
        prev_hash: the previous snapshot's hash (empty for the first).
        events_hash: sha256 of the events between the previous snapshot and this one.
    """

    key: str
    seq: int
    reason: str
    state: dict[str, Any]
    hash: str
    prev_hash: str
    events_hash: str

    def verify(self) -> None:
        """Raise :class:`StoreError` when the state does not match its hash (a damaged or edited snapshot)."""
        got = sha256(self.state)
        if got != self.hash:
            raise StoreError(f"snapshot {self.key} is not trustworthy: its state hashes to {got[:16]}…, "
                             f"the snapshot says {self.hash[:16]}…; do not rebuild or roll back from it")


def _scope(session_id: str) -> str:
    return f"events:{session_id}"


def snapshots(store: RecordStore, session_id: str) -> list[Snapshot]:
    """Every snapshot of a session, oldest first."""
    recs = store.records(_scope(session_id), SNAPSHOT_KIND)
    return [Snapshot(k, int(r.value["seq"]), r.value["reason"], r.value["state"], r.value["hash"],
                     r.value.get("prev_hash", ""), r.value.get("events_hash", "")) for k, r in sorted(recs.items())]


def rebuild(store: RecordStore, session_id: str, snapshot: str | None = "latest", upto: int | None = None) -> dict[str, Any]:
    """The state of a session rebuilt from a snapshot and the events after it.

    Args:
        store: the store holding the log.
        session_id: the session.
        snapshot: a snapshot key, ``"latest"`` (the newest, default) or ``None`` (replay every event).
        upto: replay only events with ``seq <= upto`` (default: all).

    Raises:
        StoreError: the snapshot does not match its hash, or the key is unknown.
    """
    state, after = empty_state(session_id), 0
    if snapshot is not None:
        snaps = snapshots(store, session_id)
        if upto is not None:
            snaps = [s for s in snaps if s.seq <= upto]
        chosen = snaps[-1] if snapshot == "latest" and snaps else next((s for s in snaps if s.key == snapshot), None)
        if chosen is None and snapshot != "latest":
            raise StoreError(f"session {session_id!r} has no snapshot {snapshot!r}")
        if chosen is not None:
            chosen.verify()
            state, after = copy.deepcopy(chosen.state), chosen.seq
    for ev in store.events(_scope(session_id), after=after):
        if upto is not None and ev.seq > upto:
            break
        apply(state, ev.data)
    return state


def verify_chain(store: RecordStore, session_id: str) -> int:
    """Check every snapshot of a session: its state's hash, its link to the previous one and the hash of
    the events between them. Returns the number of snapshots checked.

    Raises:
        StoreError: the first snapshot or stretch of events that does not match.
    """
    prev, after = "", 0
    snaps = snapshots(store, session_id)
    events = {ev.seq: ev.data for ev in store.events(_scope(session_id))}
    for s in snaps:
        s.verify()
        if s.prev_hash != prev:
            raise StoreError(f"snapshot {s.key} does not follow the previous snapshot (its prev_hash differs)")
        h = hashlib.sha256()
        for seq in range(after + 1, s.seq + 1):
            h.update(canonical([seq, events.get(seq)]).encode("utf-8"))
        if h.hexdigest() != s.events_hash:
            raise StoreError(f"the events {after + 1}..{s.seq} before snapshot {s.key} were changed or lost")
        prev, after = s.hash, s.seq
    return len(snaps)


def risky(msg: Message) -> bool:
    """A high-risk action: a write tool call, or a destructive shell command in an agent's message."""
    if msg.role != Role.ASSISTANT:
        return False
    if any(lx.WRITE_TOOL.search(c.name) and not _NON_WRITE.search(c.name) for c in msg.tool_calls):
        return True
    return any(lx.RISKY_COMMAND.search(c.arguments) for c in msg.tool_calls) or bool(lx.RISKY_COMMAND.search(msg.content[:4000]))


class EventLog(Layer):
    """The event log layer (see the module docstring).

    Args:
        ledger: the :class:`~ctxscore.memory.ledger.FactLedger` whose facts are recorded, optional.
        profile: the :class:`~ctxscore.memory.profile.ProfileLayer` whose items are recorded, optional.
        every: events between automatic snapshots (>= 1).

    Raises:
        ConfigError: ``every`` below 1, or (at attach) a store without records and events.
    """

    def __init__(self, ledger: Any = None, profile: Any = None, every: int = DEFAULT_EVERY) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ConfigError(f"EventLog every must be a positive integer, got {every!r}")
        self.ledger, self.profile, self.every = ledger, profile, every
        self.store: RecordStore | None = None
        self._resync = True
        self._pending: list[dict[str, Any]] = []

    # -- lifecycle ------------------------------------------------------------------------------
    def attach(self, ctx: LayerContext) -> None:
        """Read the session's log: the state it rebuilds to is the starting point (a resumed session)."""
        if not isinstance(ctx.store, RecordStore):
            raise ConfigError("EventLog needs a store with records and events (SQLiteStore, PostgresStore)")
        self.ctx, self.store, self.scope = ctx, ctx.store, _scope(ctx.session_id)
        self.shadow = rebuild(self.store, ctx.session_id)
        self._facts: dict[str, Any] = {}  # "task|slot" -> the Fact object last compared (identity diff)
        log = self.store.events(self.scope)
        self.seq = log[-1].seq if log else 0
        snaps = snapshots(self.store, ctx.session_id)
        self._last_snap = snaps[-1] if snaps else None
        self._hasher = hashlib.sha256()
        for ev in log:
            if self._last_snap is None or ev.seq > self._last_snap.seq:
                self._hasher.update(canonical([ev.seq, ev.data]).encode("utf-8"))
        self._resync = True

    def on_reset(self) -> None:
        """The history is being rebuilt: the next batch is compared with the recorded state as a whole."""
        self._resync = True

    def on_add(self, entries: Sequence[Entry]) -> None:
        """Record new messages, after a checkpoint when the batch starts a task or holds a high-risk call
        (the snapshot is the state before the batch), then the ledger's and the profile's changes."""
        if not hasattr(self, "shadow"):
            return
        if self._resync:
            self._resync = False
            entries = self._resync_prefix(entries)
            if entries is None:
                return
        if entries and self.shadow["messages"]:
            if any(risky(e.msg) for e in entries):
                self.checkpoint("risky_tool")
            elif any(e.task != self.shadow["task"] for e in entries):
                self.checkpoint("task_end")
        for e in entries:
            self._emit({"type": "message_added", "id": e.msg.id, "role": str(e.msg.role), "task": e.task,
                        "digest": message_digest(e.msg)})
        self._emit_facts()
        self._emit_profile()
        self._flush()
        if self.seq - (self._last_snap.seq if self._last_snap else 0) >= self.every:
            self.checkpoint("every")

    def on_tiers(self, entries: Sequence[Entry]) -> None:
        """Record tier changes."""
        for e in entries:
            self._emit({"type": "tier_changed", "id": e.msg.id, "tier": str(e.tier)})
        self._flush()

    def after_build(self, window: Any, view: Any) -> None:
        """Record what changed since the last batch (profile changes made by consolidation)."""
        self._emit_profile()
        self._flush()

    # -- recording ------------------------------------------------------------------------------
    def _emit(self, event: dict[str, Any]) -> None:
        apply(self.shadow, event)
        self._pending.append(event)

    def _flush(self) -> None:
        """Append the pending events in one transaction.

        Raises:
            StoreError: the store cannot be written (the events stay pending and go with the next batch).
        """
        if not self._pending or self.store is None:
            return
        seqs = self.store.append_events(self.scope, self._pending)
        for seq, ev in zip(seqs, self._pending, strict=True):
            self._hasher.update(canonical([seq, ev]).encode("utf-8"))
        self.seq = seqs[-1]
        self._pending = []

    def _fact_record(self, key: tuple[int, str], f: Any) -> dict[str, Any]:
        """The recorded form of a ledger fact under its ledger key, with the key's superseded values."""
        return {"slot": f.slot, "value": f.value, "source": f.source, "turn": f.turn, "task": f.task,
                "status": f.status, "origin": f.origin, "resolved": f.resolved,
                "was": list(self.ledger.was.get(key, []))}

    def _emit_facts(self) -> None:
        """Facts that changed since the last batch: an identity check per current fact (the ledger replaces
        a fact object whenever it changes it), then the recorded form compared."""
        if self.ledger is None:
            return
        live = self.ledger.current
        for lk, f in live.items():
            key = f"{lk[0]}|{lk[1]}"
            if self._facts.get(key) is f:
                continue
            self._facts[key] = f
            rec = self._fact_record(lk, f)
            old = self.shadow["facts"].get(key)
            if old == rec:
                continue
            change = "added" if old is None else ("superseded" if old["value"] != f.value else "status")
            self._emit({"type": "fact", "change": change, "key": key, "fact": rec})
        for key in [k for k in self.shadow["facts"] if _split_key(k) not in live]:  # a denied proposal leaves
            self._facts.pop(key, None)
            self._emit({"type": "fact", "change": "removed", "key": key, "fact": None})

    def _emit_profile(self) -> None:
        if self.profile is None:
            return
        for ev in self.profile.drain_events():
            if ev["type"] == "person":
                rec = ev["person"]
                if self.shadow["people"].get(rec["key"]) != rec:
                    self._emit({"type": "person", "key": rec["key"], "person": rec})
            else:
                rec = ev["item"]
                if self.shadow["profile"].get(rec["key"]) != rec:
                    self._emit({"type": "profile_item", "change": ev["change"], "key": rec["key"], "item": rec})

    def _resync_prefix(self, entries: Sequence[Entry]) -> list[Entry] | None:
        """After attach or a rebuilt history: when the recorded messages are a prefix of the history, the
        entries not recorded yet (tiers, facts and profile brought in line as events); otherwise one
        ``reset`` event with the whole live state, and ``None``."""
        live = self.live_state()
        rec = self.shadow["messages"]
        if live["messages"][: len(rec)] != rec:
            if self.profile is not None:
                self.profile.drain_events()
            self._emit({"type": "reset", "state": live})
            self._facts = {}
            self._flush()
            return None
        for mid in sorted(set(live["tiers"]) | set(self.shadow["tiers"])):
            if live["tiers"].get(mid) != self.shadow["tiers"].get(mid):
                self._emit({"type": "tier_changed", "id": mid, "tier": live["tiers"].get(mid, str(Tier.VERBATIM))})
        if self.profile is not None:
            self.profile.drain_events()
            for part, kind, field in (("profile", "profile_item", "item"), ("people", "person", "person")):
                for key in sorted(live[part]):
                    if live[part][key] != self.shadow[part].get(key):
                        self._emit({"type": kind, "change": "loaded", "key": key, field: live[part][key]})
        known = {m[0] for m in rec}
        return [e for e in entries if e.msg.id not in known]

    # -- state, snapshots, rollback ---------------------------------------------------------------
    def live_state(self) -> dict[str, Any]:
        """The session's state read from the live objects (history, tiers, ledger, profile)."""
        h = self.ctx.history
        state = empty_state(self.ctx.session_id)
        state["messages"] = [[e.msg.id, str(e.msg.role), e.task, message_digest(e.msg)] for e in h.entries]
        state["tiers"] = {e.msg.id: str(e.tier) for e in h.entries if e.tier != Tier.VERBATIM}
        state["task"] = h.entries[-1].task if h.entries else 0
        if self.ledger is not None:
            state["facts"] = {f"{k[0]}|{k[1]}": self._fact_record(k, f) for k, f in self.ledger.current.items()}
        if self.profile is not None:
            prof = self.profile.state()
            state["profile"], state["people"] = prof["items"], prof["people"]
        return json.loads(canonical(state))

    def checkpoint(self, reason: str = "manual") -> Snapshot:
        """Take a snapshot of the recorded state now (after writing pending events) and log a checkpoint event.

        Raises:
            StoreError: the store cannot be written.
        """
        self._flush()
        state = json.loads(canonical(self.shadow))
        key = f"{self.seq:012d}"
        snap = Snapshot(key, self.seq, reason, state, sha256(state), self._last_snap.hash if self._last_snap else "",
                        self._hasher.hexdigest())
        self.store.put_records(self.scope, SNAPSHOT_KIND, {key: {  # type: ignore[union-attr]
            "seq": snap.seq, "reason": reason, "state": state, "hash": snap.hash, "prev_hash": snap.prev_hash,
            "events_hash": snap.events_hash}})
        self._last_snap, self._hasher = snap, hashlib.sha256()
        self._emit({"type": "checkpoint", "reason": reason, "snapshot": key, "hash": snap.hash})
        self._flush()
        return snap

    def rollback(self, manager: Any, snapshot: str = "latest") -> Snapshot:
        """Roll the session back to a snapshot: the messages after its turn are detached (kept in the store,
        ``manager.truncate``), the kept messages get the snapshot's tiers, and the layers are rebuilt.

        Returns the snapshot. Raises:
            StoreError: the snapshot is unknown or untrustworthy, or the kept messages differ from the
                snapshot's (the history was rebased since), or the rebuilt state differs from it.
        """
        snaps = snapshots(self.store, self.ctx.session_id)  # type: ignore[arg-type]
        snap = snaps[-1] if snapshot == "latest" and snaps else next((s for s in snaps if s.key == snapshot), None)
        if snap is None:
            raise StoreError(f"no snapshot {snapshot!r} to roll back to in session {self.ctx.session_id!r}")
        snap.verify()
        n = len(snap.state["messages"])
        live = [[e.msg.id, str(e.msg.role), e.task, message_digest(e.msg)] for e in self.ctx.history.entries[:n]]
        if live != snap.state["messages"]:
            raise StoreError(f"snapshot {snap.key}'s messages differ from the session's first {n}; it cannot be restored")
        want = snap.state["tiers"]
        tiers = [(e.msg.id, Tier(want.get(e.msg.id, Tier.VERBATIM))) for e in self.ctx.history.entries[:n]
                 if str(e.tier) != want.get(e.msg.id, Tier.VERBATIM)]
        if tiers:
            self.ctx.store.set_tiers(self.ctx.session_id, tiers)
        detached = manager.truncate(n)
        self._emit({"type": "rollback", "to": snap.key, "detached": detached})
        self._flush()
        got = self.live_state()
        if got != snap.state:
            raise StoreError(f"after the rollback the state differs from snapshot {snap.key} (sha256 "
                             f"{sha256(got)[:16]}… vs {snap.hash[:16]}…)")
        return snap

    def state(self) -> dict[str, Any]:
        """Where the log stands: the last sequence number and the last snapshot."""
        last = self._last_snap if hasattr(self, "_last_snap") else None
        return {"seq": getattr(self, "seq", 0), "snapshot": last.key if last else None}


def _split_key(key: str) -> tuple[int, str]:
    task, _, slot = key.partition("|")
    return int(task), slot
