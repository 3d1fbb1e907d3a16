"""The LLM compressor: forms written by an LLM that follows the design note's compressor rules,
made in batches ahead of need, verified, with the extractive compressor as the fallback.

Use it through the Compressor seam, with its layer, which schedules the batches::

    comp = LLMCompressor(LLMClient(), every=3, timing="immediate")
    cm = ContextManager(budget=8000, compressor=comp, layers=[comp.layer()])

How it works:

- **Batches every N turns** (``every``): the layer collects the messages that will be compressed
  when they leave the recent turns (not pinned; ``key_state`` -> tier ``structured``,
  ``reasoning`` -> ``compressed``) and sends them in one batch either at turn K x N, as soon as that
  turn's final assistant answer arrives (``timing="immediate"``, 即时生成), or when turn K x N + 1
  begins (``timing="deferred"``, 延迟生成). A batch is split into requests of at most ``batch_size``
  items and ``max_batch_chars`` characters, run on a background executor.
- **Off the build path**: :meth:`LLMCompressor.compress` never touches the network. A form not ready
  yet answers ``None``: the window shows the message verbatim and asks again at the next build (a
  text never seen is queued and sent with the next batch, or after ``miss_delay`` seconds).
- **Verified**: every LLM form goes through the shared verifier (:func:`ctxscore.compress.verify.verify`:
  every entity, number and negation of the original present, and the hard-constraint sentences of
  user and system messages byte-exact, no entity or negation invented, shorter) and two checks of the rules' meaning clauses (:func:`meaning_problems`: uncertainty kept,
  no "confirmed" / "booked" / "done" the original does not say). A rejected, missing or malformed
  form, or a batch whose request failed, falls back to the extractive compressor's form for that
  tier (which the window verifies again, falling back to gentler tiers as for any compressor).

Thread-safe; one compressor may serve many sessions (forms are cached by text and tier).
"""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import re
import threading
from collections import OrderedDict, deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from ..compress.base import Compressor
from ..compress.extractive import ExtractiveCompressor
from ..compress.verify import key_spans, verify
from ..errors import ConfigError
from ..messages import Category, Role, Tier
from ..scoring.rules import RuleConfig, default_config, hard_constraints
from ..window.history import Entry
from ..window.layers import Layer, LayerContext
from .client import LLMClient, LLMError
from .prompts import COMPRESSOR_FORMAT, COMPRESSOR_RULES, items_by_id, parse_json_object

log = logging.getLogger("ctxscore")

#: The tier a message of each category is compressed to when it leaves the recent turns.
TIER_OF = {Category.KEY_STATE: Tier.STRUCTURED, Category.REASONING: Tier.COMPRESSED}
TIMINGS = ("immediate", "deferred")
#: User and system messages up to this many characters have their hard-constraint sentences kept
#: byte-exact in every form (the window's rule, :mod:`ctxscore.window.ingest`); a text of unknown
#: role is held to it too.
CONSTRAINT_MAX_CHARS = 4000

_HEDGES = re.compile(
    r"(?<![\w'])(?:maybe|might|perhaps|probably|possibly|likely|unlikely|not sure|unsure|uncertain|unclear|"
    r"seems?|i think|i guess|i believe|could be|tentative(?:ly)?)(?![\w'])|可能|也许|大概|或许|不确定|似乎|好像|估计|待定",
    re.IGNORECASE)
_CERTAIN = re.compile(
    r"(?<![\w'])(?:confirmed|confirms?|booked|reserved|done|completed|executed|applied|decided|approved|"
    r"agreed|paid|cancell?ed|purchased|scheduled|verified|guaranteed)(?![\w'])|"
    r"已确认|确认|已执行|已完成|完成|已预订|预订成功|已决定|决定|已支付|已取消|已安排", re.IGNORECASE)


def meaning_problems(original: str, form: str) -> list[str]:
    """What a form does against the rules' meaning clauses (empty: none found).

    - rule 5, the uncertain made certain: the original hedges ("maybe", "probably", 可能 ...) and
      the form keeps no hedge;
    - rules 6 and 7, a suggestion made an executed decision or a guess a confirmed fact: the form
      says "confirmed", "booked", "done", 已确认 ... where the original does not.
    """
    out = []
    if _HEDGES.search(original) and not _HEDGES.search(form):
        out.append("uncertainty dropped: the input hedges (" + _HEDGES.search(original).group(0) + ") and the form does not")
    have = {m.group(0).lower() for m in _CERTAIN.finditer(original)}
    made = sorted({m.group(0).lower() for m in _CERTAIN.finditer(form)} - have)
    if made:
        out.append("certainty invented: the form says " + ", ".join(repr(w) for w in made) + " and the input does not")
    return out


@dataclass(frozen=True, slots=True)
class _Item:
    key: tuple[str, str]
    text: str
    tier: Tier
    role: str


def _key(text: str, tier: Tier) -> tuple[str, str]:
    return hashlib.sha1(text.encode("utf-8")).hexdigest(), str(tier)


class LLMCompressor:
    """A :class:`~ctxscore.compress.base.Compressor` whose forms an LLM writes in background batches.

    Args:
        client: the :class:`~ctxscore.llm.client.LLMClient`.
        every: N, turns between batches (>= 1); ``layer()`` schedules them.
        timing: ``"immediate"`` (at turn K x N, once its final answer arrives) or ``"deferred"``
            (when turn K x N + 1 begins).
        batch_size: items per request (>= 1).
        max_batch_chars: characters of message text per request (a longer message goes alone).
        min_chars: texts shorter than this are compressed extractively at once (no LLM call).
        miss_delay: seconds before texts asked for outside a batch are sent on their own (> 0).
        fallback: the compressor used when an LLM form is rejected (default: extractive).
        config: rule file of the verifier (default: packaged).
        cache_size: forms kept (the least recently used are dropped first).
        max_tokens: cap on each request's answer, tokens (``None``: the endpoint's default).

    Raises:
        ConfigError: a bad number or timing.
    """

    def __init__(self, client: LLMClient, *, every: int = 3, timing: str = "immediate", batch_size: int = 8,
                 max_batch_chars: int = 12_000, min_chars: int = 80, miss_delay: float = 1.0,
                 fallback: Compressor | None = None, config: RuleConfig | None = None, cache_size: int = 50_000,
                 max_tokens: int | None = None) -> None:
        for name, v in (("every", every), ("batch_size", batch_size), ("max_batch_chars", max_batch_chars),
                        ("cache_size", cache_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be a positive integer, got {v!r}")
        if timing not in TIMINGS:
            raise ConfigError(f"timing must be one of {TIMINGS}, got {timing!r}")
        if not isinstance(miss_delay, int | float) or miss_delay <= 0:
            raise ConfigError(f"miss_delay must be a positive number of seconds, got {miss_delay!r}")
        self.client = client
        self.every, self.timing = every, timing
        self.batch_size, self.max_batch_chars, self.min_chars = batch_size, max_batch_chars, min_chars
        self.miss_delay, self.max_tokens = float(miss_delay), max_tokens
        self.config = config or default_config()
        self.fallback = fallback or ExtractiveCompressor(self.config)
        self.cache_size = cache_size
        self._forms: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._seen: OrderedDict[str, None] = OrderedDict()  # texts that went through a batch
        self._inflight: set[tuple[str, str]] = set()
        self._misses: dict[tuple[str, str], _Item] = {}
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()
        self._futures: set[Future[None]] = set()
        self._executor = _Workers(client.max_concurrency, "ctxscore-llm")
        self._closed = False
        self.stats = {"batches": 0, "requests": 0, "items": 0, "accepted": 0, "rejected": 0, "malformed": 0,
                      "failed": 0, "misses": 0}
        #: The last rejected forms: ``{"tier", "text", "form", "missing", "invented", "problems"}``.
        self.rejections: deque[dict[str, Any]] = deque(maxlen=100)

    # ------------------------------------------------------------------ the Compressor seam
    def compress(self, text: str, tier: Tier) -> str | None:
        """The form of ``text`` for ``tier`` if ready, else ``None`` (ask again later); never blocks
        on the network. Short texts, and tiers asked of a text already processed (the fallback to a
        gentler tier), get the extractive form at once."""
        tier = Tier(tier)
        if tier not in (Tier.STRUCTURED, Tier.COMPRESSED):
            return None
        key = _key(text, tier)
        full = False
        with self._lock:
            form = self._forms.get(key)
            if form is not None:
                self._forms.move_to_end(key)
                return form
            if key in self._inflight or key in self._misses:
                return None
            local = len(text) < self.min_chars or key[0] in self._seen or self._closed
            if not local:
                self._misses[key] = _Item(key, text, tier, "")
                self.stats["misses"] += 1
                full = len(self._misses) >= self.batch_size
                if not full and self._timer is None:
                    self._timer = threading.Timer(self.miss_delay, self.flush_misses)
                    self._timer.daemon = True
                    self._timer.start()
        if local:
            return self.fallback.compress(text, tier)
        if full:
            self.flush_misses()
        return None

    # ------------------------------------------------------------------ scheduling
    def layer(self) -> SummaryLayer:
        """A new :class:`SummaryLayer` for one :class:`~ctxscore.ContextManager` (one per manager)."""
        return SummaryLayer(self)

    def submit(self, items: Sequence[tuple[str, Tier | str, str]]) -> list[Future[None]]:
        """Schedule forms of ``(text, tier, role)`` items now (those ready or in flight are skipped);
        returns the futures of the requests (one per chunk of ``batch_size`` items)."""
        todo: list[_Item] = []
        with self._lock:
            if self._closed:
                return []
            for text, tier, role in items:
                t = Tier(tier)
                key = _key(text, t)
                if key in self._forms or key in self._inflight:
                    continue
                self._misses.pop(key, None)
                self._inflight.add(key)
                todo.append(_Item(key, text, t, role))
            if todo:
                self.stats["batches"] += 1
        return [self._start(chunk) for chunk in self._chunks(todo)]

    def flush_misses(self) -> list[Future[None]]:
        """Send the texts asked for outside a batch now (the timer and full queues call this)."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = None
            items = [(it.text, it.tier, it.role) for it in self._misses.values()]
        return self.submit(items) if items else []

    def wait(self, timeout: float | None = None) -> bool:
        """Send the queued texts (:meth:`flush_misses`) and wait until every scheduled request is done;
        True if all finished within ``timeout`` seconds."""
        import concurrent.futures as cf  # noqa: PLC0415

        self.flush_misses()
        with self._lock:
            pending = list(self._futures)
        if not pending:
            return True
        done, not_done = cf.wait(pending, timeout=timeout)
        return not not_done

    def ready(self, text: str, tier: Tier | str) -> bool:
        """True when the form of ``text`` for ``tier`` is cached."""
        with self._lock:
            return _key(text, Tier(tier)) in self._forms

    def close(self, wait: bool = True) -> None:
        """Stop scheduling; finish the scheduled requests (``wait``), or cancel those not yet sent and
        leave the ones in flight to end on their own (the forms are a cache: at the process's exit
        they are dropped, and never hold it open: the workers are daemon threads)."""
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        self._executor.shutdown(wait=wait, cancel_futures=not wait)

    # ------------------------------------------------------------------ the batches
    def _chunks(self, items: list[_Item]) -> list[list[_Item]]:
        out: list[list[_Item]] = []
        cur: list[_Item] = []
        chars = 0
        for it in items:
            if cur and (len(cur) >= self.batch_size or chars + len(it.text) > self.max_batch_chars):
                out.append(cur)
                cur, chars = [], 0
            cur.append(it)
            chars += len(it.text)
        if cur:
            out.append(cur)
        return out

    def _start(self, chunk: list[_Item]) -> Future[None]:
        fut = self._executor.submit(self._run, chunk)
        with self._lock:
            self._futures.add(fut)
        fut.add_done_callback(lambda f: self._done(f, chunk))
        return fut

    def _done(self, fut: Future[None], chunk: list[_Item]) -> None:
        with self._lock:
            self._futures.discard(fut)
            if fut.cancelled():  # never sent (closed): its texts are no longer awaited
                self._inflight.difference_update(it.key for it in chunk)

    def _run(self, chunk: list[_Item]) -> None:
        """One request for ``chunk``; every item gets a form (the LLM's if it passes, else the fallback's)."""
        forms: dict[str, str] = {}
        outcome = "failed"
        try:
            payload = {"items": [{"id": str(i), "role": it.role or "unknown", "tier": str(it.tier), "text": it.text}
                                 for i, it in enumerate(chunk)]}
            user = json.dumps(payload, ensure_ascii=False)
            with self._lock:
                self.stats["requests"] += 1
            answer = self.client.complete_text(COMPRESSOR_RULES + "\n\n" + COMPRESSOR_FORMAT, user,
                                               max_tokens=self.max_tokens)
            outcome = "malformed"
            got = items_by_id(parse_json_object(answer.text))
            forms = {k: v["form"] for k, v in got.items() if isinstance(v.get("form"), str)}
            outcome = "answered"
        except LLMError as exc:
            log.warning("llm compressor: a batch of %d failed (%s); using the extractive forms", len(chunk), exc)
        except ValueError as exc:
            log.warning("llm compressor: malformed answer for a batch of %d (%s); using the extractive forms", len(chunk), exc)
        except Exception:  # noqa: BLE001 - a background job must never lose its items
            log.exception("llm compressor: unexpected error; using the extractive forms")
        for i, it in enumerate(chunk):
            form = forms.get(str(i))
            final = None
            if form is not None:
                final = self._accept(it, form)
                kind = "accepted" if final is not None else "rejected"
            else:
                kind = "failed" if outcome == "failed" else "malformed"
            if final is None:
                final = self._fallback(it)
            self._store(it, final, kind)

    def _accept(self, it: _Item, form: str) -> str | None:
        """``form`` if it passes the shared verifier and the meaning checks, else ``None`` (logged)."""
        form = form.strip()
        spans = key_spans(it.text, self.config)
        if it.role in ("user", "system", "") and len(it.text) <= CONSTRAINT_MAX_CHARS:
            spans += hard_constraints(it.text, self.config)  # what the window's verifier asks too (ingest)
        verdict = verify(it.text, form, spans, self.config)
        problems = meaning_problems(it.text, form)
        if verdict.ok and not problems:
            return form
        if verdict.longer:
            problems.insert(0, "not shorter than the input")
        if not form:
            problems.insert(0, "empty form")
        rec = {"tier": str(it.tier), "text": it.text[:200], "form": form[:200], "missing": list(verdict.missing),
               "invented": list(verdict.invented), "problems": problems}
        with self._lock:
            self.rejections.append(rec)
        log.info("llm compressor: rejected a %s form (missing %s, invented %s%s); using the extractive form",
                 it.tier, list(verdict.missing), list(verdict.invented), "; " + "; ".join(problems) if problems else "")
        return None

    def _fallback(self, it: _Item) -> str:
        try:
            form = self.fallback.compress(it.text, it.tier)
        except Exception:  # noqa: BLE001 - a compressor must not raise; the verbatim text then stands
            log.exception("llm compressor: the fallback compressor failed")
            form = None
        return it.text if form is None else form  # the verbatim text fails the verifier (not shorter): gentler tier

    def _store(self, it: _Item, form: str, kind: str) -> None:
        with self._lock:
            self._inflight.discard(it.key)
            self._forms[it.key] = form
            self._forms.move_to_end(it.key)
            self._seen[it.key[0]] = None
            while len(self._forms) > self.cache_size:
                self._forms.popitem(last=False)
            while len(self._seen) > self.cache_size:
                self._seen.popitem(last=False)
            self.stats["items"] += 1
            self.stats[kind] += 1


class _Workers:
    """A pool of daemon threads (``ThreadPoolExecutor``'s interface as the compressor uses it): the
    interpreter joins an executor's threads at exit, so a batch waiting on a stalled endpoint (a
    timeout, times the retries) held a stopped proxy open for minutes; a daemon thread does not."""

    def __init__(self, n: int, name: str) -> None:
        self._n, self._name = n, name
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Any, tuple[Any, ...]] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._shut = False

    def submit(self, fn: Any, *args: Any) -> Future[Any]:
        """Run ``fn(*args)`` on a worker; its future."""
        fut: Future[Any] = Future()
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._jobs.put((fut, fn, args))
            if len(self._threads) < self._n:
                t = threading.Thread(target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=True)
                self._threads.append(t)
                t.start()
        return fut

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            fut, fn, args = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - the future carries it
                fut.set_exception(exc)

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        """Take no more jobs; cancel the queued ones (``cancel_futures``); join the threads (``wait``)."""
        with self._lock:
            self._shut = True
            threads = list(self._threads)
        while cancel_futures:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job[0].cancel()
        for _ in threads:
            self._jobs.put(None)
        if wait:
            for t in threads:
                t.join()


class SummaryLayer(Layer):
    """Schedules the :class:`LLMCompressor`'s batches every N turns of one session (see its docstring).

    A turn starts at each user message. With ``timing="immediate"`` the batch for turns up to K x N
    goes out when an assistant message without tool calls (the turn's final answer) arrives in turn
    K x N or later; with ``"deferred"``, when the first message of a later turn arrives. A batch holds
    every message not yet scheduled up to that turn that may be compressed (not pinned, a category of
    :data:`TIER_OF`, no media, between the compressor's ``min_chars`` and ``policy.max_compress_chars``
    characters: shorter texts are compressed locally, longer ones are archived, never compressed).
    """

    def __init__(self, compressor: LLMCompressor) -> None:
        self.compressor = compressor
        self._pending: list[Entry] = []
        self._boundary = compressor.every
        self._max_chars = 8000
        #: Batches this layer scheduled (for inspection).
        self.batches = 0

    def attach(self, ctx: LayerContext) -> None:
        self._max_chars = ctx.policy.max_compress_chars

    def on_reset(self) -> None:
        self._pending = []
        self._boundary = self.compressor.every

    def on_add(self, entries: Sequence[Entry]) -> None:
        n = self.compressor.every
        for e in entries:
            if self.compressor.timing == "deferred" or e.msg.role == Role.USER:
                if e.turn_no > self._boundary:  # the turn after K x N began: turns up to K x N are done
                    self._flush(lambda x: x.turn_no <= self._boundary)
                    self._boundary = ((e.turn_no - 1) // n + 1) * n
            self._pending.append(e)
            final = e.msg.role == Role.ASSISTANT and not e.msg.tool_calls
            if self.compressor.timing == "immediate" and final and e.turn_no >= self._boundary:
                self._flush(lambda x: True)
                self._boundary = (e.turn_no // n + 1) * n

    def _flush(self, take: Any) -> None:
        batch = [e for e in self._pending if take(e)]
        self._pending = [e for e in self._pending if not take(e)]
        items = [(e.msg.content, TIER_OF[Category(e.category)], str(e.msg.role)) for e in batch if self._eligible(e)]
        if items:
            self.batches += 1
            self.compressor.submit(items)

    def _eligible(self, e: Entry) -> bool:
        return (not e.pinned and e.category in TIER_OF and not e.msg.has_media
                and self.compressor.min_chars <= len(e.msg.content) <= self._max_chars)

    def state(self) -> dict[str, Any]:
        return {"batches": self.batches, "pending": len(self._pending), "next_boundary": self._boundary}
