"""Hot per-session state in Redis, shared by the workers that serve one set of sessions.

The durable store (PostgreSQL) keeps every message with its prediction and tier; Redis keeps what
a worker needs to continue a session it did not serve last, cheaply and consistently (extra
``redis``: ``pip install 'ctxscore[redis]'``):

- a per-session **version**, bumped by every write (messages added, tiers changed, a rebase), so a
  worker knows whether the manager it keeps for a session is current, and a count of the session's
  rebases (:meth:`HotStore.detach`), so a worker whose manager holds a replaced branch reads the
  session again instead of appending to it;
- the session's **tiers** (message id -> tier), so a worker whose manager is behind applies the
  other workers' compaction without reading the session again;
- **token counts** of the texts counted in the session (messages and compressed forms, per
  encoding), so a worker that never saw the session builds its history without re-tokenising, and
  a log of the counts each turn published, so a worker that is behind reads only the new ones;
- a per-session **lock** (redis-py ``Lock``, with a timeout so a dead worker cannot hold it) around
  one turn, so two workers never interleave one session's turns (``renew_s``: renewed while a long
  turn runs, e.g. a proxy waiting for the model). Taking it also reads the session's state and
  what other workers logged since (one script, one round trip), and releasing it publishes the
  turn's token counts (another): a turn costs two round trips besides one per write. A turn that
  never ended -- its worker died, perhaps between a durable write and the version bump that
  records it, or lost its lock -- leaves a mark the next turn finds: that one drops the hot state
  and reads the session from the durable store (:meth:`RedisHotState.turn`). A turn one of whose
  durable writes Redis did not record (Redis briefly away) drops the hot state when it ends, or,
  Redis still away then, leaves its mark.

Predictions are not duplicated in Redis: they are stored with each message, so a worker that never
saw a session reads them with the messages and never re-scores (``tests/test_redis_state.py``
asserts the scorer is not called). Every key has a TTL (``ttl_s``, refreshed at every write); when
the hot state of a session has expired or was never written, a worker rebuilds it from the durable
store. Redis is a cache here: losing it loses nothing, it only costs a re-read.

:class:`RedisHotState` is the Redis side; :class:`HotStore` wraps a durable store and keeps the
hot state current on every write (``open_store("postgresql://...", redis="redis://...")``);
:class:`SharedSessions` is what a proxy worker uses (``SharedSessions(store, ContextManager, budget=...)``;
``with sessions.turn(session_id) as cm:``
holds the session's lock, brings the worker's manager up to date, and publishes what it counted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from ..errors import ConfigError, StoreError
from ..messages import Tier
from ..tokens import DEFAULT_ENCODING, TokenCounter
from .base import Event, NewRecord, Record, Store, StoredMessage

if TYPE_CHECKING:
    from .retrieval import Hit

#: A context manager (``ctxscore.ContextManager``; not imported here: the store sits below the window).
Manager = Any

try:  # the extra `redis`
    import redis as _redis
except ImportError:  # pragma: no cover - exercised without the extra
    _redis = None  # type: ignore[assignment]

log = logging.getLogger("ctxscore")

#: Default lifetime of a session's hot state after its last write (seconds).
DEFAULT_TTL_S = 24 * 3600


class SessionBusy(StoreError):
    """A turn that does not wait (``turn(..., wait=False)``) found the session's lock held by another
    worker; nothing of the turn has run."""


def text_key(text: str) -> str:
    """The 16-hex-digit key of a text in the token-count hash (BLAKE2b, 64 bits)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def _check_db(url: str, where: str) -> None:
    """Refuse a ``redis://`` URL whose database (the path, or ``?db=``) is not a whole number:
    redis-py reads ``/1a`` or ``/abc`` as database 0, so a worker with a typo would take its session
    locks where the other workers do not look, and two workers could interleave one session's turns.

    Raises:
        ConfigError: naming the database as written.
    """
    try:
        parts = urlsplit(url)
    except ValueError:  # redis-py's own parse says what is wrong
        return
    if parts.scheme not in ("redis", "rediss"):
        return
    dbs = [parts.path.strip("/")] if parts.path.strip("/") else []
    dbs += parse_qs(parts.query).get("db", [])
    for db in dbs:
        if not db.isascii() or not db.isdigit():
            raise ConfigError(f"bad Redis URL {where!r}: the database {db!r} is not a number; expected "
                              "redis://[:password@]host:port/N with N a database number such as 0")


class RedisHotState:
    """The Redis side of the hot state (see the module docstring).

    Args:
        client: a Redis URL (``redis://host:6379/0``) or a ``redis.Redis`` client.
        prefix: prefix of every key (``{prefix}:{ns}:{{session}}:meta`` ...; ``ns`` names the durable
            store, see :meth:`bind`; the session is a Redis Cluster hash tag, so one session's keys
            live on one node).
        ttl_s: seconds a session's hot state lives after its last write.
        lock_timeout_s: seconds after which a lock held by a dead worker expires.
        lock_wait_s: seconds :meth:`lock` waits for another worker's turn before :class:`StoreError`.
        renew_s: when set, the locks this object holds are renewed (every ``lock_timeout_s / 3``)
            for up to this many seconds, so a turn that legitimately lasts longer than
            ``lock_timeout_s`` (a proxy waiting for the model) keeps its lock, while a dead process
            still loses it after ``lock_timeout_s``; ``None`` (default): no renewal.
        lock_poll_s: seconds between two tries of a worker waiting for the lock (redis-py's ``Lock``
            polls; its default, 0.1 s, made a waiter start up to 100 ms after the holder released).
            The proxy's waiting requests start with this pause and back off from it
            (``ctxscore.serve.app.SharedProxySessions.take``).

    Raises:
        ConfigError: redis-py is not installed, or a bad argument (a URL it cannot read or whose
            database is not a number, a time that is not positive and finite, included).
            Nothing is sent to Redis here: :meth:`ping` checks that it answers.
    """

    def __init__(self, client: Any, *, prefix: str = "ctxscore", ttl_s: float = DEFAULT_TTL_S,
                 lock_timeout_s: float = 60.0, lock_wait_s: float = 30.0, renew_s: float | None = None,
                 lock_poll_s: float = 0.005) -> None:
        if _redis is None:
            raise ConfigError("the Redis hot state needs redis-py; install it with `pip install 'ctxscore[redis]'` "
                              "(or `pip install redis`)")
        if isinstance(client, str):
            self.where = client.split("@")[-1]  # never the password
            _check_db(client, self.where)
            try:
                self.client = _redis.Redis.from_url(client, socket_connect_timeout=5, socket_timeout=10)
            except ValueError as exc:  # a scheme, port or host redis-py cannot read
                raise ConfigError(f"bad Redis URL {self.where!r}: {exc}; expected redis://[:password@]host:port/db, "
                                  "rediss://... or unix:///path") from None
            self._own = True
        elif isinstance(client, _redis.Redis):
            self.client, self.where, self._own = client, "redis client", False
        else:
            raise ConfigError(f"redis must be a URL or a redis.Redis client, got {type(client).__name__}")
        if not prefix or any(c in prefix for c in "{}"):
            raise ConfigError(f"prefix must be a non-empty string without braces, got {prefix!r}")
        for name, v in (("ttl_s", ttl_s), ("lock_timeout_s", lock_timeout_s), ("lock_wait_s", lock_wait_s),
                        ("lock_poll_s", lock_poll_s)):
            if not 0 < v < math.inf:  # inf: int(ttl_s * 1000) raises
                raise ConfigError(f"{name} must be positive, finite seconds, got {v}")
        self.prefix = prefix
        #: The store's namespace in the keys (:meth:`bind`); ``None``: not bound, ``{prefix}:{{session}}:...``.
        self.namespace: str | None = None
        self.ttl_ms = int(ttl_s * 1000)
        self.lock_timeout_s, self.lock_wait_s, self.lock_poll_s = lock_timeout_s, lock_wait_s, lock_poll_s
        if renew_s is not None and not 0 < renew_s < math.inf:
            raise ConfigError(f"renew_s must be positive, finite seconds or None, got {renew_s}")
        self.renew_s = renew_s
        self._held: dict[Any, float] = {}  # lock -> renew until (monotonic)
        self._turns: dict[str, Any] = {}  # session -> the lock this object holds on it (see unrecorded)
        self._held_lock = threading.Lock()
        self._renewer: threading.Thread | None = None
        self._closing = threading.Event()

    def ping(self) -> None:
        """Check that Redis answers (a server starting up calls this, not to fail at its first request).

        Raises:
            StoreError: Redis cannot be reached.
        """
        with self._guard("answer PING"):
            self.client.ping()

    # -- keys -----------------------------------------------------------------------------------
    def _key(self, session_id: str, part: str) -> str:
        if self.namespace is not None:
            return f"{self.prefix}:{self.namespace}:{{{session_id}}}:{part}"
        return f"{self.prefix}:{{{session_id}}}:{part}"

    def bind(self, identity: str) -> None:
        """Namespace every key by the durable store this hot state caches: ``{prefix}:{ns}:{{session}}:...``,
        ``ns`` the first 12 hex digits of the BLAKE2b hash of ``identity`` (a store's
        :attr:`~ctxscore.store.postgres.PostgresStore.identity`: the server's system identifier, or
        the store's own id where it is not readable, the database and the schema; no host, nothing
        secret). Two deployments on other databases or schemas that share one Redis URL (and prefix)
        then never share a session's keys, and workers of one deployment share them however they
        spell the host. :class:`HotStore` calls this.

        Raises:
            ConfigError: this object is already bound to another store (one hot state per store).
        """
        ns = hashlib.blake2b(identity.encode("utf-8", "surrogatepass"), digest_size=6).hexdigest()
        if self.namespace is not None and self.namespace != ns:
            raise ConfigError("this RedisHotState already caches another store; make one per store")
        self.namespace = ns

    def keys(self, session_id: str, encoding: str = DEFAULT_ENCODING) -> list[str]:
        """The session's keys: meta (version, message count), tiers, the log of tier changes, token
        counts of ``encoding`` and the log of the counts each turn published."""
        return [self._key(session_id, "meta"), self._key(session_id, "tiers"), self._key(session_id, "tierlog"),
                self._key(session_id, f"tok:{encoding}"), self._key(session_id, f"toklog:{encoding}")]

    @contextmanager
    def _guard(self, what: str, key: str | None = None) -> Iterator[None]:
        """Redis failures -> :class:`StoreError`; with ``key``, a value read from it that ctxscore
        cannot read (not a number, not a tier, not JSON) too, naming the key."""
        try:
            yield
        except _redis.RedisError as exc:
            raise StoreError(f"hot state at {self.where}: cannot {what}: {exc}; check that Redis is up") from None
        except (ValueError, TypeError, AttributeError) as exc:  # AttributeError: a JSON entry not an object
            if key is None:
                raise
            raise StoreError(f"hot state at {self.where}: cannot {what}: key {key} holds a value ctxscore cannot "
                             f"read ({exc}); delete that key (the session's hot state is rebuilt from the "
                             "durable store)") from None

    # -- state ----------------------------------------------------------------------------------
    def version(self, session_id: str) -> int | None:
        """The session's version, or ``None`` when it has no hot state (expired or never written)."""
        key = self._key(session_id, "meta")
        with self._guard("read the session version", key):
            v = self.client.hget(key, "version")
            return None if v is None else int(v)

    def state(self, session_id: str) -> tuple[int | None, int | None, int, str | None]:
        """(version, message count, detaches, generation) of the session in one round trip: ``detaches``
        counts the rebases (:meth:`HotStore.detach`) since the hot state was written, so a worker whose
        manager saw fewer reads the session again instead of appending to a replaced history;
        ``generation`` is a random id written when the hot state is created, so a worker whose manager
        saw another one (the hot state was dropped or expired, and its version and counts started again)
        reads the session again too."""
        key = self._key(session_id, "meta")
        with self._guard("read the session version", key):
            v, n, d, g = self.client.hmget(key, ["version", "messages", "detached", "gen"])
            return ((None if v is None else int(v)), (None if n is None else int(n)), (0 if d is None else int(d)),
                    (None if g is None else g.decode()))

    def detached(self, session_id: str, messages: int) -> None:
        """Record a rebase: the session now holds ``messages`` messages (the rest moved away); bumps
        the version and the detach count, so every other worker reopens the session."""
        meta = self._key(session_id, "meta")
        with self._guard("record a rebase"):
            p = self.client.pipeline(transaction=True)
            p.hincrby(meta, "version", 1)
            p.hsetnx(meta, "gen", uuid.uuid4().hex)
            p.hincrby(meta, "detached", 1)
            p.hset(meta, "messages", messages)
            p.pexpire(meta, self.ttl_ms)
            p.execute()

    def messages(self, session_id: str) -> int | None:
        """The session's message count as the last write recorded it, or ``None`` when unknown."""
        key = self._key(session_id, "meta")
        with self._guard("read the message count", key):
            v = self.client.hget(key, "messages")
            return None if v is None else int(v)

    def tiers(self, session_id: str) -> dict[str, Tier]:
        """The tiers recorded for the session (message id -> tier; ids not listed are verbatim)."""
        key = self._key(session_id, "tiers")
        with self._guard("read tiers", key):
            raw = self.client.hgetall(key)
            return {k.decode(): Tier(v.decode()) for k, v in raw.items()}

    def token_counts(self, session_id: str, encoding: str) -> dict[str, int]:
        """Token counts of the session's texts under ``encoding`` (:func:`text_key` -> tokens)."""
        key = self._key(session_id, f"tok:{encoding}")
        with self._guard("read token counts", key):
            raw = self.client.hgetall(key)
            return {k.decode(): int(v) for k, v in raw.items()}

    def bump(self, session_id: str, *, tiers: Mapping[str, Tier] | None = None, messages: int | None = None,
             encoding: str = DEFAULT_ENCODING) -> int:
        """Record a write: bump the version (returned), store ``tiers`` (in the tiers hash and as one
        entry of the tier log) and the message count, and refresh the TTL of the session's keys (one
        round trip).

        The count is only ever raised here (a script sets it when it is above the recorded one): the
        bumps of two writers that committed one after the other may reach Redis in the other order,
        and a count set back would make readers skip committed rows (:meth:`HotStore.load`). Only a
        rebase (:meth:`detached`) lowers it."""
        meta, tk, log_key, tok, toklog = self.keys(session_id, encoding)
        with self._guard("record a write"):
            p = self.client.pipeline(transaction=True)
            p.hincrby(meta, "version", 1)
            p.hsetnx(meta, "gen", uuid.uuid4().hex)  # a new hot state gets a new generation
            if messages is not None:  # only raised: two writers' bumps may arrive out of commit order
                self._raise_count(keys=[meta], args=[int(messages)], client=p)
            if tiers:
                changes = {i: str(Tier(t)) for i, t in tiers.items()}
                p.hset(tk, mapping=changes)
                p.rpush(log_key, json.dumps(changes))
            for k in (meta, tk, log_key, tok, toklog):
                p.pexpire(k, self.ttl_ms)
            return int(p.execute()[0])

    def tier_log_length(self, session_id: str) -> int:
        """Entries in the session's tier log."""
        with self._guard("read tier changes"):
            return int(self.client.llen(self._key(session_id, "tierlog")))

    def tier_log(self, session_id: str, start: int = 0) -> tuple[list[dict[str, Tier]], int]:
        """The tier changes recorded from entry ``start`` on, in order, and the log's length."""
        key = self._key(session_id, "tierlog")
        with self._guard("read tier changes", key):
            raw = self.client.lrange(key, start, -1)
            return [{i: Tier(t) for i, t in json.loads(r).items()} for r in raw], start + len(raw)

    def add_token_counts(self, session_id: str, encoding: str, counts: Mapping[str, int]) -> tuple[int | None, int]:
        """Store token counts (:func:`text_key` -> tokens) and refresh their TTL; returns the
        session's version and the length of its tier log (one round trip)."""
        k, klog = self._key(session_id, f"tok:{encoding}"), self._key(session_id, f"toklog:{encoding}")
        with self._guard("store token counts"):
            p = self.client.pipeline(transaction=False)
            if counts:
                p.hset(k, mapping=dict(counts))
                p.rpush(klog, json.dumps(dict(counts)))
                for key in (k, klog):
                    p.pexpire(key, self.ttl_ms)
            p.hget(self._key(session_id, "meta"), "version")
            p.llen(self._key(session_id, "tierlog"))
            *_, v, n = p.execute()
        return (None if v is None else int(v)), int(n)

    def forget(self, session_id: str) -> None:
        """Drop the session's hot state (workers then rebuild it from the durable store).

        The token counts and their log stay until their TTL: a count is keyed by its text
        (:func:`text_key`), so it stays true, and workers keep reading the log from where they were."""
        keys = [self._key(session_id, "meta"), self._key(session_id, "tiers"), self._key(session_id, "tierlog")]
        with self._guard("drop the hot state"):
            self.client.delete(*keys)

    def ttl_s(self, session_id: str) -> float | None:
        """Seconds the session's hot state has left, or ``None`` when it has none."""
        with self._guard("read the TTL"):
            ms = self.client.pttl(self._key(session_id, "meta"))
        return None if ms < 0 else ms / 1000

    @contextmanager
    def turn(self, session_id: str, *, tier_from: int = -1, tok_from: int = -1,
             encoding: str = DEFAULT_ENCODING, wait: bool = True) -> Iterator[TurnState]:
        """Hold the session's lock for one turn, as :meth:`lock`, with the turn's reads and writes in
        the lock's own round trips: taking the lock reads the session's state, the tier changes from
        entry ``tier_from`` on and the published token counts from entry ``tok_from`` on (``-1``:
        none); releasing it publishes :attr:`TurnState.publish` (token counts made in the turn) and
        reads the version and log lengths back into :attr:`TurnState.after`. Two round trips where
        :meth:`lock`, :meth:`state`, :meth:`tier_log`, :meth:`add_token_counts` and the release take
        five.

        Taking the lock also sets the session's turn mark (its token), which the release deletes. A
        turn that finds another token's mark follows one that never ended: its worker died (perhaps
        after committing a write to the durable store and before recording it here) or lost the
        lock. The hot state (version, count, tiers) may then be behind the store, so it is dropped
        and the turn starts with no version: the manager is read from the durable store
        (:meth:`lock` sets no mark). A turn one of whose durable writes went unrecorded here
        (:meth:`unrecorded`: the version bump failed, Redis away) drops the hot state when it ends
        (:attr:`TurnState.after` then holds no version), and, when Redis is still away then, its
        mark stays for the next turn to find.

        With ``wait=False`` the lock is tried once: a session held by another worker raises
        :class:`SessionBusy` at once (a caller that waits elsewhere -- the proxy, in its event loop --
        tries again; :meth:`busy` is the error to raise when it gives up).

        Raises:
            StoreError: as :meth:`lock`, or a key of the session holds another kind of value than
                ctxscore keeps there (the message names it; no lock is taken); nothing of the turn
                has run then.
            SessionBusy: with ``wait=False``, the session is held by another worker.
        """
        keys = self.keys(session_id, encoding)
        lk = _TurnLock(self, session_id, keys, tier_from, tok_from)
        self._take(lk, session_id, wait)
        ts = lk.start
        try:
            yield ts
        finally:
            stale = self._let_go(lk, session_id)
            if stale:
                log.warning("a write of session %r to the durable store went unrecorded in the hot state (Redis "
                            "was away); the turn's end drops the hot state", session_id)
            counts = ts.publish or {}
            args: list[Any] = [lk.local.token, self.ttl_ms, int(stale), json.dumps(counts) if counts else ""]
            for k, v in counts.items():
                args += [k, v]
            try:
                version, tierlog, toklog, released = self._end_script(
                    keys=[lk.name, keys[3], keys[4], keys[0], keys[2], lk.mark, keys[1]], args=args)
                lk.local.token = None
                ts.after = (None if version is None else int(version)), int(tierlog), int(toklog)
            except _redis.RedisError as exc:
                log.warning("cannot publish the turn of session %r or release its lock (%s); the lock expires in "
                            "%s s", session_id, exc, self.lock_timeout_s)
                released = 1
            if not released:
                log.warning("the lock of session %r expired during a turn (longer than %s s); its hot state is "
                            "dropped so every worker reads the session again", session_id, self.lock_timeout_s)
                ts.after = None
                self.forget(session_id)

    def _take(self, lk: Any, session_id: str, wait: bool = True) -> None:
        """Acquire ``lk`` (waiting up to ``lock_wait_s``; ``wait=False``: one try) and keep it renewed
        when ``renew_s`` is set.

        Raises:
            StoreError: the session stayed busy, or Redis is unreachable.
            SessionBusy: ``wait=False`` and the session is held.
        """
        with self._guard("take the session lock"):
            got = lk.acquire(blocking=wait)
        if not got:
            if not wait:
                raise SessionBusy(f"session {session_id!r} is held by another worker")
            raise self.busy(session_id)
        with self._held_lock:
            self._turns[session_id] = lk
        if self.renew_s is not None:
            self._keep(lk)

    def _let_go(self, lk: Any, session_id: str) -> bool:
        """Stop renewing ``lk`` and forget it as the session's holder; whether a write of its turn went
        unrecorded (:meth:`unrecorded`)."""
        with self._held_lock:
            self._held.pop(lk, None)
            if self._turns.get(session_id) is lk:
                del self._turns[session_id]
        return bool(getattr(lk, "stale", False))

    def unrecorded(self, session_id: str) -> bool:
        """Note that a write of the turn this object holds on ``session_id`` reached the durable store
        but not Redis (:meth:`bump` failed): the hot state may be behind the store even when dropping
        it (:meth:`forget`) failed too, Redis being away, so the turn's end drops it (:meth:`turn`,
        :meth:`lock`); if Redis is still away then, the turn mark stays and the next turn drops it.
        :class:`HotStore` calls this. Returns whether this object holds the session (``False``: a
        write outside any turn, nothing noted)."""
        with self._held_lock:
            lk = self._turns.get(session_id)
            if lk is not None:
                lk.stale = True
        return lk is not None

    def busy(self, session_id: str) -> StoreError:
        """The error of a turn that waited ``lock_wait_s`` for the session in vain."""
        return StoreError(f"session {session_id!r} is busy: another worker held it for more than "
                          f"{self.lock_wait_s} s; retry")

    @cached_property
    def _start_script(self) -> Any:
        return self.client.register_script(_START_TURN)

    @cached_property
    def _end_script(self) -> Any:
        return self.client.register_script(_END_TURN)

    @cached_property
    def _raise_count(self) -> Any:
        return self.client.register_script(_RAISE_COUNT)

    @contextmanager
    def lock(self, session_id: str) -> Iterator[None]:
        """Hold the session's lock for one turn (blocks up to ``lock_wait_s``).

        Raises:
            StoreError: another worker held the session longer than ``lock_wait_s``, or Redis is
                unreachable; nothing of the turn has run then.
        """
        lk = self.client.lock(self._key(session_id, "lock"), timeout=self.lock_timeout_s,
                              blocking_timeout=self.lock_wait_s, sleep=self.lock_poll_s, thread_local=False)
        self._take(lk, session_id)
        try:
            yield
        finally:
            if self._let_go(lk, session_id):  # a write went unrecorded (unrecorded): drop the hot state
                try:
                    self.forget(session_id)
                except StoreError as exc:
                    log.warning("%s; the hot state of session %r may be behind the durable store until it "
                                "expires", exc, session_id)
            try:
                lk.release()
            except _redis.exceptions.LockError:
                # held past lock_timeout_s: another worker may have run a turn meanwhile
                log.warning("the lock of session %r expired during a turn (longer than %s s); its hot state is "
                            "dropped so every worker reads the session again", session_id, self.lock_timeout_s)
                self.forget(session_id)
            except _redis.RedisError as exc:
                log.warning("cannot release the lock of session %r (%s); it expires in %s s", session_id, exc,
                            self.lock_timeout_s)

    def _keep(self, lk: Any) -> None:
        """Renew ``lk`` until it is released (or for ``renew_s``); starts the renewing thread."""
        with self._held_lock:
            self._held[lk] = time.monotonic() + float(self.renew_s or 0)
            if self._renewer is None or not self._renewer.is_alive():
                self._renewer = threading.Thread(target=self._renew, name="ctxscore-lock-renewer", daemon=True)
                self._renewer.start()

    def _renew(self) -> None:
        """The renewing thread: every ``lock_timeout_s / 3`` resets the timeout of the locks held."""
        while not self._closing.wait(self.lock_timeout_s / 3):
            now = time.monotonic()
            with self._held_lock:
                held = [lk for lk, until in self._held.items() if until > now]
            for lk in held:
                try:
                    lk.reacquire()
                except (_redis.exceptions.LockError, _redis.RedisError):
                    pass  # released meanwhile, or Redis away: the lock then expires as without renewal

    def close(self) -> None:
        """Stop renewing locks; close the client when this object made it from a URL."""
        self._closing.set()
        if self._own:
            self.client.close()


# KEYS: meta; ARGV: a message count. Sets the session's count when it is above the recorded one (or none is).
_RAISE_COUNT = """
local n = tonumber(redis.call('hget', KEYS[1], 'messages'))
if n == nil or n < tonumber(ARGV[1]) then redis.call('hset', KEYS[1], 'messages', ARGV[1]) end
return 0
"""

# KEYS: lock, meta, tierlog, toklog, tiers, turn mark, token counts; ARGV: token, lock ms, tier log start,
# token-count log start (-1: none), turn mark ms. First checks that no key holds another kind of value than
# ctxscore keeps there ({'foreign', key, its type, the expected type}: a script stopped by WRONGTYPE after
# the SET would keep the lock until it expires). Takes the lock (as redis-py's Lock does: SET NX PX) and,
# only then, reads the state. The turn mark names the token of the turn in progress and is deleted when the turn
# ends (_END_TURN): found with another token, the previous holder never ended its turn (it died, or lost
# its lock), and may have written the durable store without recording it here: the hot state is
# dropped (meta, tiers, tier log), so the turn reads the session from the store.
_START_TURN = """
local kinds = {'string', 'hash', 'list', 'list', 'hash', 'string', 'hash'}
for i, kind in ipairs(kinds) do
  local t = redis.call('type', KEYS[i]).ok
  if t ~= 'none' and t ~= kind then return {'foreign', KEYS[i], t, kind} end
end
if not redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) and redis.call('get', KEYS[1]) ~= ARGV[1] then return false end
local prev, dropped = redis.call('get', KEYS[6]), 0
if prev and prev ~= ARGV[1] then
  redis.call('del', KEYS[2], KEYS[5], KEYS[3])
  dropped = 1
end
redis.call('set', KEYS[6], ARGV[1], 'PX', ARGV[5])
local tiers, toks = {}, {}
if tonumber(ARGV[3]) >= 0 then tiers = redis.call('lrange', KEYS[3], ARGV[3], -1) end
if tonumber(ARGV[4]) >= 0 then toks = redis.call('lrange', KEYS[4], ARGV[4], -1) end
return {redis.call('hmget', KEYS[2], 'version', 'messages', 'detached', 'gen'), tiers, toks,
        redis.call('llen', KEYS[3]), redis.call('llen', KEYS[4]), dropped}
"""

# KEYS: lock, token counts, token-count log, meta, tierlog, turn mark, tiers; ARGV: token, TTL ms, stale (1:
# a write of the turn went unrecorded, RedisHotState.unrecorded), the counts as one JSON object ('' when
# none), then key, count, key, count ... A stale turn drops the hot state (meta, tiers, tier log: the
# durable store may be ahead of it). Publishes the counts, deletes the turn mark and releases the lock
# when they are still this token's (the lock: redis-py's release script), reads the version and the logs'
# lengths. When this script cannot run (Redis away), the mark stays: the next turn drops the hot state.
_END_TURN = """
if ARGV[3] == '1' then redis.call('del', KEYS[4], KEYS[7], KEYS[5]) end
if redis.call('get', KEYS[6]) == ARGV[1] then redis.call('del', KEYS[6]) end
if ARGV[4] ~= '' then
  for i = 5, #ARGV, 2 do redis.call('hset', KEYS[2], ARGV[i], ARGV[i + 1]) end
  redis.call('pexpire', KEYS[2], ARGV[2])
  redis.call('rpush', KEYS[3], ARGV[4])
  redis.call('pexpire', KEYS[3], ARGV[2])
end
local released = 0
if redis.call('get', KEYS[1]) == ARGV[1] then
  redis.call('del', KEYS[1])
  released = 1
end
return {redis.call('hget', KEYS[4], 'version'), redis.call('llen', KEYS[5]), redis.call('llen', KEYS[3]), released}
"""


@dataclass
class TurnState:
    """What :meth:`RedisHotState.turn` read when it took the lock, and what the turn publishes.

    Attributes:
        version, messages, detached, gen: as :meth:`RedisHotState.state`.
        tier_changes: the tier log's entries from the asked start on (message id -> tier each).
        tierlog: the tier log's length.
        counts: the token counts published by turns since the asked start (:func:`text_key` -> tokens).
        toklog: the token-count log's length.
        publish: set by the turn: the token counts it made, published when the lock is released.
        after: set on release: (version, tier log length, token-count log length); ``None`` when
            the release failed or the lock had expired.
    """

    version: int | None
    messages: int | None
    detached: int
    gen: str | None
    tier_changes: list[dict[str, Tier]]
    tierlog: int
    counts: dict[str, int]
    toklog: int
    publish: dict[str, int] | None = None
    after: tuple[int | None, int, int] | None = None


if _redis is not None:
    from redis.lock import Lock as _Lock

    class _TurnLock(_Lock):
        """redis-py's ``Lock`` whose acquisition also reads the session's state (one round trip)."""

        def __init__(self, hot: RedisHotState, session_id: str, keys: list[str], tier_from: int, tok_from: int) -> None:
            super().__init__(hot.client, hot._key(session_id, "lock"), timeout=hot.lock_timeout_s,
                             blocking_timeout=hot.lock_wait_s, sleep=hot.lock_poll_s, thread_local=False)
            self.hot, self.hot_keys, self.tier_from, self.tok_from = hot, keys, tier_from, tok_from
            self.session_id, self.mark = session_id, hot._key(session_id, "turn")  # its turn mark: see _START_TURN
            self.start: TurnState | None = None

        def do_acquire(self, token: str) -> bool:
            meta, tiers, tierlog, tok, toklog = self.hot_keys
            hot = self.hot
            mark_ms = hot.ttl_ms + int(1000 * (hot.lock_timeout_s + (hot.renew_s or 0)))  # outlives the meta
            got = hot._start_script(keys=[self.name, meta, tierlog, toklog, tiers, self.mark, tok],
                                    args=[token, int(self.timeout * 1000), self.tier_from, self.tok_from, mark_ms])
            if not got:
                return False
            if got[0] == b"foreign":  # nothing taken
                key, kind, want = (x.decode(errors="replace") for x in got[1:])
                raise StoreError(
                    f"hot state at {hot.where}: key {key} holds a Redis {kind}, not the {want} ctxscore keeps there "
                    f"(another application writing under the prefix {hot.prefix!r}?); nothing of the turn has run. "
                    "Delete that key (the session's hot state is rebuilt from the durable store), or give the "
                    "other application or ctxscore (RedisHotState(prefix=...)) a prefix of its own")
            if got[5]:
                log.warning("the previous turn of session %r never ended (its worker died or lost the lock): the hot "
                            "state is dropped and the session read again from the durable store", self.session_id)
            try:
                self.start = self._parse(got)
            except (ValueError, TypeError) as exc:  # the lock is ours: give it back before failing
                self.lua_release(keys=[self.name], args=[token], client=self.redis)
                raise StoreError(f"hot state at {self.hot.where}: unreadable session state ({exc}); drop it "
                                 "with RedisHotState.forget(session_id)") from None
            return True

        @staticmethod
        def _parse(got: Any) -> TurnState:
            (v, n, d, g), tiers, toks, n_tiers, n_toks, _ = got
            return TurnState(
                version=None if v is None else int(v), messages=None if n is None else int(n),
                detached=0 if d is None else int(d), gen=None if g is None else g.decode(),
                tier_changes=[{i: Tier(t) for i, t in json.loads(r).items()} for r in tiers], tierlog=int(n_tiers),
                counts={k: int(c) for r in toks for k, c in json.loads(r).items()}, toklog=int(n_toks))


class HotStore:
    """A durable store whose writes also keep the Redis hot state current (:class:`RedisHotState`).

    Implements :class:`~ctxscore.store.base.Store` (and :class:`~ctxscore.store.base.RecordStore`
    when the wrapped store does) by delegation: :meth:`add` and :meth:`set_tiers` write the durable
    store first and then bump the session's version (tiers and message count included);
    :meth:`load` skips the durable store when the count says there is nothing new; :meth:`detach`
    drops the hot state. Every writer of a session shared this way must write through a HotStore.
    A Redis failure after a durable write is logged, not raised: the write is acknowledged (it is
    durable); the session's hot state is dropped at once and, when the write ran in a turn this
    process holds, again when the turn ends (:meth:`RedisHotState.unrecorded`; Redis still away
    then, the turn's mark makes the next turn drop it), and the next worker that finds it missing
    rebuilds it from the durable store.

    Args:
        store: the durable store (usually :class:`~ctxscore.store.postgres.PostgresStore`).
        hot: the Redis side; bound to the store (:meth:`RedisHotState.bind`) when the store has an
            ``identity`` (a PostgreSQL store does: its server, database and schema), so its keys
            are the store's own. Other stores (SQLite, your own without ``identity``) use the
            prefix alone: give each deployment its own prefix.

    Raises:
        ConfigError: ``store`` is not a store, or ``hot`` is already bound to another store.
    """

    def __init__(self, store: Store, hot: RedisHotState) -> None:
        if not isinstance(store, Store):
            raise ConfigError(f"store must implement ctxscore.store.Store, got {type(store).__name__}")
        identity = getattr(store, "identity", None)
        if isinstance(identity, str):  # a PostgreSQL store: keys namespaced by its server, database, schema
            hot.bind(identity)
        self.store, self.hot = store, hot
        #: Message counts of the sessions whose lock this process holds (no other writer can add).
        self.held: dict[str, int | None] = {}
        #: Rebases (:meth:`detach`) of the sessions held, during the current turn.
        self.rebases: dict[str, int] = {}

    def _after_write(self, session_id: str, **kw: Any) -> None:
        try:
            self.hot.bump(session_id, **kw)
        except StoreError as exc:
            log.warning("%s; the write is durable, the session's hot state is rebuilt when Redis is back", exc)
            self._unrecorded(session_id)

    def _unrecorded(self, session_id: str) -> None:
        """A durable write Redis did not record: drop the hot state now, and again when the turn ends
        (:meth:`RedisHotState.unrecorded`: dropping it now may fail too, and a later write of the turn
        may write a hot state without this one)."""
        self.hot.unrecorded(session_id)
        try:
            self.hot.forget(session_id)
        except StoreError:
            pass

    def add(self, session_id: str, records: Sequence[NewRecord]) -> list[StoredMessage]:
        """:meth:`Store.add`, then bump the session's version."""
        rows = self.store.add(session_id, records)
        if rows:
            if session_id in self.held:
                self.held[session_id] = rows[-1].turn + 1
            self._after_write(session_id, messages=rows[-1].turn + 1)
        return rows

    def set_tiers(self, session_id: str, tiers: Iterable[tuple[str, Tier]]) -> None:
        """:meth:`Store.set_tiers`, then record the tiers in Redis and bump the version."""
        pairs = list(tiers)
        self.store.set_tiers(session_id, pairs)
        if pairs:
            self._after_write(session_id, tiers=dict(pairs))

    def detach(self, session_id: str, from_turn: int) -> str:
        """:meth:`Store.detach`, then record the rebase in the hot state (every other worker's
        manager of the session is then reopened from the store; the hot state is dropped when Redis
        cannot record it)."""
        target = self.store.detach(session_id, from_turn)
        if session_id in self.held:
            self.held[session_id] = from_turn
            self.rebases[session_id] = self.rebases.get(session_id, 0) + 1
        try:
            self.hot.detached(session_id, from_turn)
        except StoreError as exc:
            log.warning("%s", exc)
            self._unrecorded(session_id)
        return target

    def get(self, session_id: str, message_id: str) -> StoredMessage | None:
        """:meth:`Store.get` of the durable store."""
        return self.store.get(session_id, message_id)

    def load(self, session_id: str, after_turn: int = -1) -> list[StoredMessage]:
        """:meth:`Store.load` of the durable store, skipped (``[]``) when the hot state says nothing
        was added after ``after_turn`` -- a manager asks before every add and build, and every writer
        of a shared session writes through a :class:`HotStore`, which records the count."""
        if session_id in self.held:
            n = self.held[session_id]
        else:
            try:
                n = self.hot.messages(session_id)
            except StoreError:
                n = None
        if n is not None and after_turn >= n - 1:
            return []
        return self.store.load(session_id, after_turn)

    def search(self, session_id: str, query: str, k: int = 10, **kw: Any) -> list[Hit]:
        """:meth:`Store.search` of the durable store."""
        return self.store.search(session_id, query, k, **kw)

    def count(self, session_id: str) -> int:
        """Messages stored in the session."""
        return self.store.count(session_id)  # type: ignore[attr-defined]

    # RecordStore, when the durable store is one
    def put_records(self, scope: str, kind: str, records: Mapping[str, Any]) -> dict[str, int]:
        """:meth:`RecordStore.put_records` of the durable store."""
        return self.store.put_records(scope, kind, records)  # type: ignore[attr-defined]

    def records(self, scope: str, kind: str) -> dict[str, Record]:
        """:meth:`RecordStore.records` of the durable store."""
        return self.store.records(scope, kind)  # type: ignore[attr-defined]

    def delete_records(self, scope: str, kind: str, keys: Iterable[str]) -> int:
        """:meth:`RecordStore.delete_records` of the durable store."""
        return self.store.delete_records(scope, kind, keys)  # type: ignore[attr-defined]

    def append_events(self, scope: str, events: Sequence[Any]) -> list[int]:
        """:meth:`RecordStore.append_events` of the durable store."""
        return self.store.append_events(scope, events)  # type: ignore[attr-defined]

    def events(self, scope: str, after: int = 0, limit: int | None = None) -> list[Event]:
        """:meth:`RecordStore.events` of the durable store."""
        return self.store.events(scope, after, limit)  # type: ignore[attr-defined]

    def close(self) -> None:
        """Close the durable store and the Redis client this object's state made."""
        self.store.close()
        self.hot.close()


class SharedTokenCounter(TokenCounter):
    """A :class:`~ctxscore.tokens.TokenCounter` that first looks a text up in counts shared through
    Redis, and remembers what it counted itself (``fresh``) for :class:`SharedSessions` to publish.

    Args:
        encoding: the tiktoken encoding.
        known: counts already known (:func:`text_key` -> tokens), e.g. from
            :meth:`RedisHotState.token_counts`.
    """

    def __init__(self, encoding: str = DEFAULT_ENCODING, known: Mapping[str, int] | None = None) -> None:
        super().__init__(encoding)
        self.known: dict[str, int] = dict(known or {})
        self.fresh: dict[str, int] = {}
        self.hits = 0
        self._memo: OrderedDict[str, int] = OrderedDict()
        self._mlock = threading.Lock()

    def count(self, text: str) -> int:
        """Tokens in ``text`` (shared count, else tiktoken)."""
        if not text:
            return 0
        with self._mlock:
            n = self._memo.get(text)
            if n is not None:
                self._memo.move_to_end(text)
                return n
        key = text_key(text)
        n = self.known.get(key)
        if n is None:
            n = super().count(text)
            self.known[key] = self.fresh[key] = n
        else:
            self.hits += 1
        with self._mlock:
            self._memo[text] = n
            if len(self._memo) > 65_536:
                self._memo.popitem(last=False)
        return n

    def take_fresh(self) -> dict[str, int]:
        """The counts made since the last call (and forget them)."""
        out, self.fresh = self.fresh, {}
        return out


@dataclass
class _Kept:
    cm: Manager
    counter: SharedTokenCounter
    version: int | None
    tierlog: int = 0  # entries of the session's tier log already applied
    toklog: int = 0  # entries of the session's token-count log already read
    detached: int = 0  # rebases of the session this manager has seen
    gen: str | None = None  # the generation of the hot state this manager follows
    how: str = "opened"  # how the current turn's manager was brought up to date


class SharedSessions:
    """The managers of one worker over sessions shared with other workers (a proxy worker's view).

    ``with sessions.turn(session_id) as cm:`` takes the session's Redis lock, returns this worker's
    :class:`~ctxscore.window.manager.ContextManager` for the session brought up to date -- opened
    from the durable store when the worker never saw the session (stored predictions: no
    re-scoring; shared token counts: no re-tokenising), or, when another worker wrote since, the
    new messages read and the other workers' tiers applied -- and, when the block ends, publishes
    the token counts it made and releases the lock.

    Args:
        store: a :class:`HotStore` (e.g. ``open_store("postgresql://...", redis="redis://...")``).
        manager: the manager class, :class:`ctxscore.ContextManager` (or a factory taking its keyword
            arguments).
        max_sessions: managers kept by this worker (least recently used first out).
        encoding: tiktoken encoding of every manager.
        manager_kwargs: the other ``ContextManager`` arguments (``budget``, ``scorer``, ``policy`` ...).

    Raises:
        ConfigError: ``store`` is not a :class:`HotStore`.
    """

    def __init__(self, store: HotStore, manager: Callable[..., Manager], *, max_sessions: int = 1024,
                 encoding: str = DEFAULT_ENCODING, **manager_kwargs: Any) -> None:
        if not isinstance(store, HotStore):
            raise ConfigError("SharedSessions needs a HotStore (open_store(url, redis=...))")
        for k in ("store", "archive_path", "session_id", "counter", "encoding"):
            if k in manager_kwargs:
                raise ConfigError(f"SharedSessions sets {k!r} itself")
        self.store, self.hot, self.manager = store, store.hot, manager
        self.encoding = encoding
        self.max_sessions = max_sessions
        self.manager_kwargs = manager_kwargs
        self._kept: OrderedDict[str, _Kept] = OrderedDict()
        self._lock = threading.Lock()
        #: Figures of this worker: managers opened, refreshed (another worker wrote), reused as is.
        self.stats = {"opened": 0, "refreshed": 0, "current": 0}

    @contextmanager
    def turn(self, session_id: str, *, wait: bool = True) -> Iterator[Manager]:
        """Hold the session for one turn and yield its up-to-date manager (see the class docstring).

        The lock is waited for up to the hot state's ``lock_wait_s``, blocking the calling thread;
        with ``wait=False`` it is tried once and a held session raises :class:`SessionBusy` (the proxy
        waits in its event loop instead, holding no worker thread: ``SharedProxySessions.take``).

        Raises:
            StoreError: the lock cannot be taken (busy session, Redis down) or the durable store
                fails; nothing of the turn has run then.
            SessionBusy: with ``wait=False``, another worker holds the session.
        """
        with self._lock:
            seen = self._kept.get(session_id)
        logs = (seen.tierlog, seen.toklog) if seen is not None else (-1, -1)
        with self.hot.turn(session_id, tier_from=logs[0], tok_from=logs[1], encoding=self.encoding,
                           wait=wait) as ts:
            self.store.held[session_id] = ts.messages
            try:
                kept = self._current(session_id, ts, seen)
                yield kept.cm
                kept.detached += self.store.rebases.pop(session_id, 0)  # this worker's own rebases
                ts.publish = kept.counter.take_fresh()
            finally:
                self.store.held.pop(session_id, None)
                self.store.rebases.pop(session_id, None)
        if ts.after is None:  # not published: the next turn reads the session's state again
            kept.version = None
        else:
            kept.version, kept.tierlog, kept.toklog = ts.after

    def _current(self, session_id: str, ts: TurnState, seen: _Kept | None) -> _Kept:
        """This worker's manager of the session brought up to date with what the lock read (``ts``;
        its logs were read from the entries after those of ``seen``, the manager kept before the
        lock was taken)."""
        with self._lock:
            kept = self._kept.get(session_id)
        version = ts.version
        if kept is not None and (kept.detached != ts.detached or kept.gen != ts.gen):
            kept = None  # another worker rebased, or the hot state was dropped since: read it again
        if kept is not None and kept is seen:  # the other workers' token counts: no re-tokenising
            kept.counter.known.update(ts.counts)
            kept.toklog = ts.toklog
        if kept is not None and version is not None and kept.version == version:
            self.stats["current"] += 1
            kept.how = "current"
            return kept
        if kept is not None and version is not None:  # another worker wrote: catch up
            kept.cm.state.catch_up()  # first: when it fails, the next turn reads the same tier changes again
            if kept is seen:
                changes, tierlog = ts.tier_changes, ts.tierlog
            else:  # made by another thread of this worker while this one waited for the lock
                changes, tierlog = self.hot.tier_log(session_id, kept.tierlog)
            for change in changes:
                apply_tiers(kept.cm, change, partial=True)
            kept.tierlog = tierlog
            kept.version = version
            self.stats["refreshed"] += 1
            kept.how = "refreshed"
            return kept
        counter = SharedTokenCounter(self.encoding, self.hot.token_counts(session_id, self.encoding))
        cm = self.manager(store=self.store, session_id=session_id, counter=counter, **self.manager_kwargs)
        detached, gen, tierlog = ts.detached, ts.gen, ts.tierlog
        if version is None:  # no hot state (expired, or never written): publish this manager's
            tiers = {e.msg.id: e.tier for e in cm.history.entries if e.tier != Tier.VERBATIM}
            version = self.hot.bump(session_id, tiers=tiers, messages=len(cm), encoding=self.encoding)
            self.store.held[session_id] = len(cm)
            _, _, detached, gen = self.hot.state(session_id)
            tierlog = self.hot.tier_log_length(session_id)
        else:
            apply_tiers(cm, self.hot.tiers(session_id))
        kept = _Kept(cm, counter, version, tierlog, toklog=ts.toklog, detached=detached, gen=gen)
        self.stats["opened"] += 1
        with self._lock:
            self._kept[session_id] = kept
            self._kept.move_to_end(session_id)
            while len(self._kept) > self.max_sessions:
                self._kept.popitem(last=False)  # the store is shared: not closed
        return kept

    def brought(self, session_id: str) -> str | None:
        """How this worker's manager of ``session_id`` was brought up to date by its last turn:
        ``"current"`` (nothing written elsewhere), ``"refreshed"`` (another worker's messages and
        tiers applied), ``"opened"`` (read from the store), or ``None`` (not kept)."""
        with self._lock:
            kept = self._kept.get(session_id)
        return None if kept is None else kept.how

    def close(self) -> None:
        """Forget every manager and close the store."""
        with self._lock:
            self._kept.clear()
        self.store.close()


def apply_tiers(cm: Manager, tiers: Mapping[str, Tier], partial: bool = False) -> int:
    """Give the messages of ``cm`` the tiers another worker recorded; returns how many changed.

    ``tiers`` is the whole map (ids not in it are verbatim) or, with ``partial``, changes (only the
    ids in it change). The forms come from ``cm``'s own compressor and verifier, which reach the
    same tier the other worker reached."""
    h, changed = cm.history, 0
    if partial:
        pairs = [(h.ids[i], t) for i, t in tiers.items() if i in h.ids]
    else:
        pairs = [(i, tiers.get(e.msg.id, Tier.VERBATIM)) for i, e in enumerate(h.entries)]  # type: ignore[arg-type]
    for i, want in pairs:
        if h.entries[i].tier != want and cm.state.forms.set_tier(h, i, want):
            changed += 1
    return changed


def wait_for_redis(url: str, timeout: float = 30.0) -> None:
    """Block until the Redis at ``url`` answers PING.

    Raises:
        StoreError: no answer within ``timeout`` seconds.
    """
    if _redis is None:
        raise ConfigError("redis-py is not installed (pip install 'ctxscore[redis]')")
    end = time.monotonic() + timeout
    while True:
        try:
            _redis.Redis.from_url(url, socket_connect_timeout=2).ping()
            return
        except _redis.RedisError as exc:
            if time.monotonic() > end:
                raise StoreError(f"no Redis at {url} after {timeout} s: {exc}") from None
            time.sleep(0.1)
