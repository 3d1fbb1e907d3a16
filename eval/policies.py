"""Context policies compared by the evaluation, behind one interface.

Every policy is fed the session message by message (:meth:`WindowStrategy.add`) and asked for a
window at a token budget (:meth:`WindowStrategy.build`). Token figures come from the same
:class:`ctxscore.tokens.TokenCounter` for all policies (cl100k_base, OpenAI cookbook chat overhead:
3 tokens per message, 1 per name, 3 of reply priming).

Policies:

- ``full``: every message verbatim (the cost baseline; ignores the budget).
- ``sliding_turns``: the system message plus the last N messages, N chosen per build as the number of
  messages of average size that fit the budget: ``N = max(2, floor((budget - system - priming) /
  mean tokens of the non-system messages so far))``. This is the turn count a developer would set from
  the typical message size; long recent messages push the window over budget, which utilization
  shows. A leading tool result whose call fell out of the window is dropped (a dangling tool result is
  an API error).
- ``trim_messages``: langchain-core ``trim_messages(strategy="last", include_system=True,
  start_on="human", token_counter=<the same counter>)``, the sliding window by tokens.
- ``rules``: :class:`ctxscore.ContextManager` with the rule classifier only.
- ``learned``: :class:`ctxscore.ContextManager` with a :class:`ctxscore.learned.LearnedScorer`.
- ``rules_ledger`` / ``learned_ledger`` (``--ledger``): the same managers with the fact ledger layer,
  ``ContextManager(layers=[FactLedger()])`` (see :mod:`eval.ledger`).
"""

from __future__ import annotations

import abc
import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ctxscore.messages import Message
from ctxscore.scoring.base import Prediction, share_parts
from ctxscore.tokens import REPLY_PRIMING_TOKENS, TokenCounter
from ctxscore.window.result import Decision
from training.extra import require_train_extra

BASELINES: tuple[str, ...] = ("full", "sliding_turns", "trim_messages")
MANAGED: tuple[str, ...] = ("rules", "learned")
ALL_POLICIES: tuple[str, ...] = BASELINES + MANAGED
#: Suffix of a managed policy run with the fact ledger layer.
LEDGER_SUFFIX = "_ledger"
LEDGER_POLICIES: tuple[str, ...] = tuple(p + LEDGER_SUFFIX for p in MANAGED)
#: Every policy name the evaluation accepts (the default run is :data:`ALL_POLICIES`).
KNOWN_POLICIES: tuple[str, ...] = ALL_POLICIES + LEDGER_POLICIES


def base_policy(name: str) -> str:
    """The policy without the ledger: ``"rules_ledger"`` -> ``"rules"``; other names unchanged."""
    return name.removesuffix(LEDGER_SUFFIX)


def with_ledger(policies: Sequence[str]) -> list[str]:
    """``policies`` with the ledger variant of each plain managed policy right after it (what ``--ledger``
    runs): ``["full", "rules", "learned"]`` -> ``["full", "rules", "rules_ledger", "learned", "learned_ledger"]``."""
    out: list[str] = []
    for p in policies:
        out.append(p)
        if p in MANAGED:
            out.append(p + LEDGER_SUFFIX)
    return list(dict.fromkeys(out))


def is_managed(name: str) -> bool:
    """Whether ``name`` is a context-manager policy (``rules``, ``learned`` or a ledger variant)."""
    return base_policy(name) in MANAGED

#: Keys of an OpenAI-style message passed on to the policies (extra fields such as ``index`` or
#: ``text`` in the session files are dropped).
_MSG_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id", "id")


def clean_message(message: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI-style part of a session message (role, content, name, tool_calls, tool_call_id, id)."""
    return {k: message[k] for k in _MSG_KEYS if message.get(k) is not None}


@dataclass(slots=True)
class Window:
    """One assembled window.

    Attributes:
        tokens: tokens of the window including chat overhead and reply priming.
        budget: the budget it was built for (tokens).
        messages_fn: returns the window's OpenAI-style messages (materialised only when needed,
            e.g. at probe points; the cheap baselines keep index ranges until then).
        decisions_fn: returns the context manager's per-message decisions (managed policies; they
            are built only when read, e.g. for a feedback record).
        paged_in: ids of messages paged back in for the query.
        warnings: the manager's warnings for this build.
        ledger_tokens: tokens of the fact ledger's section (0 without a ledger or when it is empty).
        ledger_text: the ledger note's content (header and lines), or ``None`` when none is shown.
    """

    tokens: int
    budget: int
    messages_fn: Callable[[], list[dict[str, Any]]]
    decisions_fn: Callable[[], list[Decision]] | None = None
    paged_in: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    ledger_tokens: int = 0
    ledger_text: str | None = None

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The window's messages (computed on each access)."""
        return self.messages_fn()

    @property
    def decisions(self) -> dict[str, Decision] | None:
        """Decisions by message id, or ``None`` for policies without them."""
        return None if self.decisions_fn is None else {d.id: d for d in self.decisions_fn()}


class WindowStrategy(abc.ABC):
    """Base class of the evaluated context policies: fed message by message, asked for windows at a budget.

    (Named apart from :class:`ctxscore.Policy`, the runtime's tier thresholds; ``name`` is the
    policy name the metrics and reports use: ``full``, ``sliding_turns``, ``trim_messages``,
    ``rules``, ``learned``.) Subclasses implement :meth:`add` and :meth:`build`. ``budget_independent`` policies produce the
    same window at every budget (the replay runs them once and reuses the result).
    """

    name: str = "policy"
    budget_independent: bool = False
    #: Whether a query changes the window (page-in); the replay skips page-in builds otherwise.
    uses_query: bool = False

    @abc.abstractmethod
    def add(self, message: dict[str, Any]) -> None:
        """Append one OpenAI-style message (already validated)."""

    @abc.abstractmethod
    def build(self, budget: int, query: str | None = None) -> Window:
        """The window for the next LLM call at ``budget`` tokens; ``query`` enables page-in."""

    def predictions(self) -> dict[str, tuple[str, float | None]]:
        """Message id -> (predicted category, predicted intrinsic value), for feedback records."""
        return {}

    @property
    def has_ledger(self) -> bool:
        """Whether the windows carry a fact ledger section (:attr:`Window.ledger_text`)."""
        return False

    def ledger_facts(self) -> dict[str, Any]:
        """The ledger's current facts by rendered line (policies with a ledger); ``{}`` otherwise."""
        return {}

    def close(self) -> None:  # noqa: B027 - optional hook: most policies hold nothing to release
        """Release resources (archives)."""


class _Counted(WindowStrategy):
    """Shared state of the baselines: messages, per-message token counts and their prefix sums."""

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self.msgs: list[dict[str, Any]] = []
        self.counts: list[int] = []
        self.prefix: list[int] = [0]  # prefix[i] = sum(counts[:i])
        self.system: int | None = None  # index of the leading system message

    def add(self, message: dict[str, Any]) -> None:
        m = clean_message(message)
        n = self.counter.count_message(m)
        if not self.msgs and m["role"] == "system":
            self.system = 0
        self.msgs.append(m)
        self.counts.append(n)
        self.prefix.append(self.prefix[-1] + n)

    def _window(self, start: int, budget: int) -> Window:
        """System message (if any) plus messages ``start..end``."""
        end = len(self.msgs)
        sys_idx = self.system
        head = [sys_idx] if sys_idx is not None and start > sys_idx else []
        tokens = self.prefix[end] - self.prefix[start] + sum(self.counts[i] for i in head) + REPLY_PRIMING_TOKENS
        msgs = self.msgs

        def materialise(head=head, start=start, end=end) -> list[dict[str, Any]]:
            return [msgs[i] for i in head] + msgs[start:end]

        return Window(tokens=tokens, budget=budget, messages_fn=materialise)


class FullContext(_Counted):
    """Every message verbatim: the cost baseline (budget ignored)."""

    name = "full"
    budget_independent = True

    def build(self, budget: int, query: str | None = None) -> Window:
        return self._window(0, budget)


class SlidingTurns(_Counted):
    """System message plus the last N messages, N from the budget and the mean message size.

    ``N = max(min_messages, floor((budget - system tokens - priming) / mean non-system message
    tokens so far))``; a leading tool result without its call is dropped.
    """

    name = "sliding_turns"

    def __init__(self, counter: TokenCounter, min_messages: int = 2) -> None:
        super().__init__(counter)
        self.min_messages = min_messages

    def build(self, budget: int, query: str | None = None) -> Window:
        total = len(self.msgs)
        first = 0 if self.system is None else 1
        body = total - first
        sys_tokens = self.counts[0] if self.system is not None else 0
        if body <= 0:
            return self._window(0, budget)
        mean = (self.prefix[total] - self.prefix[first]) / body
        room = budget - sys_tokens - REPLY_PRIMING_TOKENS
        n = max(self.min_messages, math.floor(room / mean) if room > 0 else 0)
        start = max(first, total - n)
        while start < total - 1 and self.msgs[start]["role"] == "tool":
            start += 1
        return self._window(start, budget)


class TrimMessages(_Counted):
    """langchain-core ``trim_messages`` with ``strategy="last"`` and our token counter.

    Called as ``trim_messages(msgs, max_tokens=budget - 3, token_counter=<sum of our per-message
    counts>, strategy="last", include_system=True, start_on="human")`` (the 3 tokens are the reply
    priming, which langchain does not count). To keep each call proportional to the window rather than
    the session, only the system message and a suffix that is known to exceed the budget are passed:
    ``trim_messages`` keeps the longest fitting suffix, so the result is identical.
    """

    name = "trim_messages"

    def __init__(self, counter: TokenCounter) -> None:
        super().__init__(counter)
        require_train_extra("eval", "the trim_messages policy", ("langchain_core",))
        from langchain_core.messages import trim_messages

        self._trim = trim_messages
        self.lc: list[Any] = []

    def add(self, message: dict[str, Any]) -> None:
        super().add(message)
        self.lc.append(_to_langchain(self.msgs[-1], len(self.msgs) - 1))

    def _count(self, messages: Sequence[Any]) -> int:
        return sum(self.counts[int(m.id)] for m in messages)

    def build(self, budget: int, query: str | None = None) -> Window:
        total = len(self.msgs)
        if total == 0:
            return self._window(0, budget)
        limit = budget - REPLY_PRIMING_TOKENS
        first = 0 if self.system is None else 1
        # smallest start whose suffix sum still exceeds the limit (or the first body message)
        target = self.prefix[total] - limit
        cut = bisect.bisect_right(self.prefix, target) - 2
        start = max(first, cut)
        head = self.lc[:first]
        kept = self._trim(
            head + self.lc[start:], max_tokens=max(0, limit), token_counter=self._count,
            strategy="last", include_system=True, start_on="human",
        )
        idx = [int(m.id) for m in kept]
        tokens = sum(self.counts[i] for i in idx) + REPLY_PRIMING_TOKENS
        msgs = self.msgs
        return Window(tokens=tokens, budget=budget, messages_fn=lambda idx=idx: [msgs[i] for i in idx])


def _to_langchain(m: dict[str, Any], index: int) -> Any:
    """One OpenAI-style dict as a langchain message whose ``id`` is its index in the session."""
    from langchain_core.messages import (
        AIMessage,
        HumanMessage,
        SystemMessage,
        ToolMessage,
        convert_to_messages,
    )

    role, content = m["role"], m.get("content") or ""
    if role == "tool":
        return ToolMessage(content=content, tool_call_id=m.get("tool_call_id") or f"unknown-{index}",
                           name=m.get("name"), id=str(index))
    if role == "assistant" and m.get("tool_calls"):
        try:
            (msg,) = convert_to_messages([{k: v for k, v in m.items() if k != "id"}])
            msg.id = str(index)
            return msg
        except (ValueError, TypeError, KeyError):
            return AIMessage(content=content, id=str(index))
    cls = {"system": SystemMessage, "user": HumanMessage, "assistant": AIMessage}[role]
    return cls(content=content, id=str(index))


def _ledger_section(win: Any) -> tuple[int, str | None]:
    """``(tokens, note content or None)`` of the ``"ledger"`` section of a ``ContextWindow`` (its
    messages are the sections' messages in order)."""
    at = 0
    for sec in win.sections:
        if sec.name == "ledger":
            return sec.tokens, (win.messages[at].get("content") if sec.messages else None)
        at += sec.messages
    return 0, None


class CachedScorer:
    """Wraps a scorer with a per-message-id prediction cache filled in one batch per session.

    The evaluation replays each session once per budget; scoring every message once (in one batch,
    so a learned scorer sees the messages as one contiguous conversation) and serving the cached
    predictions keeps the learned policy's replay cost at the rule path's. ``embed_texts`` is
    forwarded for the archive's vector search, with a per-text cache; the ranker (``ranker``,
    ``rerank``) and the key-span extractor (``spans``, ``key_spans``: the compressed tiers and the
    fact ledger) are forwarded as they are, so the learned policy replays what the runtime runs.

    Args:
        scorer: any :class:`ctxscore.scorer.Scorer`.
    """

    def __init__(self, scorer: Any) -> None:
        self.scorer = scorer
        self.cache: dict[str, Prediction] = {}
        self.score_ms = 0.0
        self._embeds: dict[str, Any] = {}
        if hasattr(scorer, "embed_texts"):
            self.embed_texts = self._embed_texts
        share_parts(self, scorer)  # the page-in ranker and the key-span extractor

    def _embed_texts(self, texts: Sequence[str]) -> Any:
        """``scorer.embed_texts`` with a per-text cache (probe queries repeat at every probe point)."""
        import numpy as np

        todo = [t for t in dict.fromkeys(texts) if t not in self._embeds]
        if todo:
            for t, v in zip(todo, self.scorer.embed_texts(todo), strict=True):
                self._embeds[t] = v
        return np.stack([self._embeds[t] for t in texts])

    def warm(self, messages: Sequence[dict[str, Any]]) -> None:
        """Score the messages (OpenAI dicts with ``id``) in one batch and cache the predictions."""
        import time

        todo = [m for m in messages if m.get("id") not in self.cache]
        if not todo:
            return
        msgs = [replace(Message.from_dict(clean_message(m), where=f"message {m.get('id')}"), turn=i)
                for i, m in enumerate(todo)]
        t0 = time.perf_counter()
        preds = self.scorer.predict(msgs)
        self.score_ms += (time.perf_counter() - t0) * 1000
        for m, p in zip(todo, preds, strict=True):
            self.cache[str(m["id"])] = p

    def predict(self, messages: Sequence[Message]) -> list[Prediction]:
        """Cached predictions by message id; messages not cached are scored now."""
        missing = [m for m in messages if m.id is None or m.id not in self.cache]
        if missing:
            for m, p in zip(missing, self.scorer.predict(missing), strict=True):
                if m.id is not None:
                    self.cache[m.id] = p
                else:
                    return self.scorer.predict(messages)
        return [self.cache[m.id] for m in messages]  # type: ignore[index]


class Managed(WindowStrategy):
    """:class:`ctxscore.ContextManager` (rules or learned scorer) as a policy.

    Args:
        name: ``"rules"``, ``"learned"`` or a ledger variant (``"rules_ledger"``).
        scorer: ``"rules"`` or a scorer object (usually a :class:`CachedScorer`).
        session_id: the archive session.
        ledger: add a fresh :class:`ctxscore.memory.ledger.FactLedger` layer (after any ``layers``
            given in ``manager_kwargs``).
        manager_kwargs: extra keyword arguments for ``ContextManager`` (e.g. ``policy``).
    """

    uses_query = True

    def __init__(self, name: str, scorer: Any, session_id: str, *, ledger: bool = False, **manager_kwargs: Any) -> None:
        from ctxscore import ContextManager

        self.name = name
        self.ledger = None
        if ledger:
            from ctxscore.memory.ledger import FactLedger

            self.ledger = FactLedger()
            manager_kwargs["layers"] = [*manager_kwargs.get("layers", ()), self.ledger]
        self.cm = ContextManager(budget=8000, scorer=scorer, session_id=session_id, **manager_kwargs)

    def add(self, message: dict[str, Any]) -> None:
        self.cm.add(clean_message(message))

    def build(self, budget: int, query: str | None = None) -> Window:
        win = self.cm.build(query=query, budget=budget)
        msgs = win.messages
        ledger_tokens, ledger_text = _ledger_section(win)
        return Window(
            tokens=win.tokens, budget=win.budget, messages_fn=lambda: msgs,
            decisions_fn=lambda: win.decisions, paged_in=list(win.paged_in), warnings=list(win.warnings),
            ledger_tokens=ledger_tokens, ledger_text=ledger_text,
        )

    @property
    def has_ledger(self) -> bool:
        return self.ledger is not None

    def ledger_facts(self) -> dict[str, Any]:
        """The ledger's current facts by their rendered line (``{line: Fact}``); ``{}`` without a ledger."""
        led = self.ledger
        if led is None:
            return {}
        return {led.rendered(f, None)[0]: f for f in led.current.values()}

    def task_numbers(self) -> list[int]:
        """The task number the runtime gave each message so far (``Entry.task``), in order."""
        return [e.task for e in self.cm.history.entries]

    def search_ids(self, query: str, k: int) -> list[str]:
        """Ids of the best ``k`` stored messages for ``query`` (``ContextManager.search``, the hybrid
        search page-in uses), best first."""
        return [h["id"] for h in self.cm.search(query, k=k)]

    def predictions(self) -> dict[str, tuple[str, float | None]]:
        return {m.id: (p.category, p.value) for m, p in zip(self.cm.messages, self.cm.predictions(), strict=True)}

    def close(self) -> None:
        self.cm.close()
