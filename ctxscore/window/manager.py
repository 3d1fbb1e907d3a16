"""The context manager: add messages, build a window that fits the token budget.

Flow per turn (``../shared/DESIGN.md``)::

    add(message) / sync(messages) -> validate -> classify + score (once per message)
                 -> token count (once) -> store (durable; turn and id allocated there) -> history
    build(query) -> occupancy vs thresholds -> tier decisions by value -> compress (verified) / archive
                 -> page-in for the query -> assemble sections in order -> post-build hooks -> ContextWindow

The concerns live in :mod:`.history`, :mod:`.value`, :mod:`.tiers`, :mod:`.pagein`, :mod:`.assemble`,
:mod:`.ingest` and :mod:`.sync`; this facade wires them to the seams.

Thread-safe: every public method holds one lock. Several managers or processes may append to one
session of one store: the store allocates turns and ids atomically, and each manager reads what the
others appended before it adds or builds.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..compress.base import Compressor
from ..compress.extractive import ExtractiveCompressor
from ..config import Policy, check_budget, check_unicode
from ..errors import ConfigError, InputError, StoreError
from ..messages import Message
from ..scoring.base import Prediction, Scorer
from ..scoring.learned import resolve_scorer
from ..scoring.rules import RuleClassifier, RuleConfig
from ..scoring.spans import extractor_of
from ..store import open_store
from ..store.base import Store, check_id
from ..store.retrieval import Hit
from ..tokens import REPLY_PRIMING_TOKENS, TokenCounter
from . import ingest, tiers
from .assemble import DEFAULT_SECTIONS, PostBuildHook, Section
from .history import History
from .layers import Layer, check_layers, free_layers
from .pagein import SEARCH_HITS, names_anything, search
from .result import ContextWindow, WindowWarning
from .session import SessionState
from .sync import SyncResult, is_append, plan_sync, prefix_history

log = logging.getLogger("ctxscore")


def _check_seams(rules: Any, compressor: Any, counter: Any, sections: Any,
                 hooks: Any) -> tuple[list[Section], list[PostBuildHook]]:
    """The manager's seams checked when it is made (a wrong one failed later, at an add or at every
    build, with a bare ``AttributeError`` or ``TypeError``): ``sections`` and ``hooks`` as lists.

    Raises:
        ConfigError: naming the argument, what it got and what it takes.
    """
    if rules is not None and not isinstance(rules, RuleConfig | str | Path):
        raise ConfigError(f"rules must be a RuleConfig, a rule-file path or None, got {type(rules).__name__}")
    if compressor is not None and not callable(getattr(compressor, "compress", None)):
        raise ConfigError(f"compressor must be an object with compress(text, tier), got {type(compressor).__name__}")
    if counter is not None and not isinstance(counter, TokenCounter):
        raise ConfigError(f"counter must be a ctxscore.TokenCounter (or a subclass), got {type(counter).__name__}; "
                          "for an encoding pass encoding=")
    out = []
    for what, seq in (("sections", sections), ("hooks", hooks)):
        if isinstance(seq, str | bytes) or not isinstance(seq, Iterable):
            kind = "sections" if what == "sections" else "callables"
            raise ConfigError(f"{what} must be a list of {kind}, got {type(seq).__name__}")
        out.append(list(seq))
    for i, sec in enumerate(out[0]):
        if not all(hasattr(sec, a) for a in ("name", "position")) or not callable(getattr(sec, "render", None)):
            raise ConfigError(f"sections[{i}] ({type(sec).__name__}) is not a section: it needs name, position and "
                              "render(view) (ctxscore.window.assemble.Section)")
    for i, hook in enumerate(out[1]):
        if not callable(hook):
            raise ConfigError(f"hooks[{i}] ({type(hook).__name__}) is not callable: a hook is called with each "
                              "window and its build view, hook(window, view)")
    return out[0], out[1]


class ContextManager:
    """Keeps a long conversation inside a token budget, message by message.

    Args:
        budget: default token budget for :meth:`build` (tokens, > 0).
        scorer: ``"auto"`` (default: the packaged learned scorer when its embedder package is
            installed, else the rules with one warning), ``"rules"``, a packaged scorer folder, or
            any :class:`~ctxscore.scoring.base.Scorer`.
        rules: a :class:`~ctxscore.scoring.rules.RuleConfig`, a rule-file path, or ``None`` (default).
        encoding: tiktoken encoding, ``"cl100k_base"`` or ``"o200k_base"`` (ignored with ``counter``).
        policy: a :class:`~ctxscore.config.Policy` (defaults as in the design).
        store: a :class:`~ctxscore.store.base.Store`, a SQLite path or ``sqlite:///`` URL, or ``None``
            for a private in-memory store (:func:`ctxscore.store.open_store`).
        archive_path: a SQLite file to store every original message in (same as ``store=path``).
        session_id: the session within the store; an existing session is resumed.
        compressor: proposes compressed forms (default: extractive); verified by the shared verifier.
        counter: token counter (default: ``TokenCounter(encoding)``).
        sections: extra window sections, placed by their ``position``.
        hooks: post-build hooks, called in order with each window and its build view.
        layers: :class:`~ctxscore.window.layers.Layer` s: the fact ledger
            (:class:`~ctxscore.memory.ledger.FactLedger`), a user profile, a verifier ...; each holds
            one session's state: give every manager its own instances.

    Raises:
        ConfigError: bad budget, session id (empty, holding NUL, longer than 512 characters or 1,024
            bytes), policy, rule file, scorer, store argument, a seam of the wrong kind (a compressor
            without ``compress``, a counter that is no :class:`TokenCounter`, a section without
            ``name``, ``position`` and ``render``, a hook that is not callable) or layers (not
            layers, given twice, or serving another manager's session).
        StoreError: the store cannot be opened or read.
    """

    def __init__(self, budget: int = 8000, *, scorer: Scorer | str | Path | None = "auto",
                 rules: RuleConfig | str | Path | None = None, encoding: str = "cl100k_base",
                 policy: Policy | None = None, store: Store | str | Path | None = None,
                 archive_path: str | Path | None = None, session_id: str = "default",
                 compressor: Compressor | None = None, counter: TokenCounter | None = None,
                 sections: Sequence[Section] = (), hooks: Sequence[PostBuildHook] = (),
                 layers: Sequence[Layer] = ()) -> None:
        self.budget = check_budget(budget)
        if not isinstance(session_id, str) or not session_id.strip():
            raise ConfigError(f"session_id must be a non-empty string, got {session_id!r}")
        check_unicode(session_id, "session_id")
        try:  # the ids every store accepts (PostgreSQL cannot hold NUL; index entries are bounded)
            check_id(session_id, "session_id")
        except InputError as exc:
            raise ConfigError(str(exc)) from None
        if store is not None and archive_path is not None:
            raise ConfigError("pass either store= or archive_path=, not both")
        layers = check_layers(layers)
        sections, hooks = _check_seams(rules, compressor, counter, sections, hooks)
        self.policy = policy or Policy()
        if not isinstance(self.policy, Policy):
            raise ConfigError(f"policy must be a ctxscore.Policy, got {type(self.policy).__name__}")
        self.rules = RuleClassifier(rules)
        self.config = self.rules.config
        self.counter = counter or TokenCounter(encoding)
        self.scorer = resolve_scorer(scorer, self.rules)
        self.session_id = session_id
        self.store = open_store(store if store is not None else archive_path)
        self.compressor = compressor or ExtractiveCompressor(self.config)
        forms = tiers.Forms(self.counter, self.compressor, self.config, self.policy.max_compress_chars,
                            extractor=extractor_of(self.scorer))  # the learned key spans, when the scorer has them
        self.state = SessionState(self.store, session_id, self.scorer, self.rules, self.counter, self.policy, forms,
                                  [*DEFAULT_SECTIONS, *sections], hooks, layers)
        self._lock = threading.RLock()
        self.state.catch_up()

    @property
    def history(self) -> History:
        """The session history (read it; the manager changes it)."""
        return self.state.history

    def add(self, message: Message | dict[str, Any]) -> Message:
        """Add one message (a :class:`Message` or an OpenAI-style dict) and score it.

        Returns the stored :class:`Message` with ``id`` (``m{turn}`` when none was given) and ``turn``
        set. Raises what :meth:`extend` raises; nothing is stored then.
        """
        return self.extend([message])[0]

    def extend(self, messages: Iterable[Message | dict[str, Any]]) -> list[Message]:
        """Add many messages: all are validated before any is stored, scored in one batch and stored
        in one transaction (all or nothing).

        Raises:
            InputError: ``messages`` is not an iterable of messages (``None``, a string, one message
                dict), the first invalid message (see :meth:`Message.from_dict`), an id already used,
                or a tool message answering no earlier call, named by its position; nothing is stored.
            StoreError: the store cannot be written; nothing is stored.
        """
        if isinstance(messages, str | bytes | dict) or not isinstance(messages, Iterable):
            raise InputError(f"extend takes a list of messages (message dicts or Message objects), got "
                             f"{type(messages).__name__}; for one message use add()")
        with self._lock:
            self.state.catch_up()
            msgs = ingest.validate(messages, self.history, len(self.history))
            return self.state.add(msgs) if msgs else []

    def sync(self, messages: Sequence[Message | dict[str, Any]], *, verified: int = 0) -> SyncResult:
        """Bring the history in line with a client's full message list (OpenAI-style clients resend the
        whole history on every call): add only what is new, or rebase on the client's edit, keeping
        every replaced message in the store (modes: :mod:`ctxscore.window.sync`).

        Args:
            messages: the client's whole list, OpenAI-style dicts or :class:`Message` objects.
            verified: the caller vouches that ``messages[:verified]`` are the history's first
                ``verified`` messages (the proxy compares a resent list with the dicts it was made
                from): they are neither validated nor compared again, so a request costs what is new
                in it, not the length of the conversation. When the rest is not an append, the whole
                list is compared as without it.

        Raises:
            InputError: ``messages`` is not a list, or an invalid message in it; nothing is changed.
            ConfigError: ``verified`` is not an integer in ``[0, min(len(history), len(messages))]``.
        """
        if isinstance(messages, str | bytes | dict) or not isinstance(messages, Sequence):
            raise InputError(f"sync takes the client's whole message list (a list of message dicts), got "
                             f"{type(messages).__name__}; for one message use add()")
        with self._lock:
            self.state.catch_up()
            if isinstance(verified, bool) or not isinstance(verified, int) or not (
                    0 <= verified <= min(len(self.history), len(messages))):
                raise ConfigError(f"verified must be an integer in [0, {min(len(self.history), len(messages))}] "
                                  f"(messages already in the history), got {verified!r}")
            if verified:
                tail = [Message.from_dict(m, where=f"message {verified + i}") for i, m in enumerate(messages[verified:])]
                if is_append([e.msg for e in self.history.entries[verified:]], tail):
                    kept = len(self.history)
                    return SyncResult(self.extend(tail[kept - verified:]), "append", kept)
                incoming = [*(Message.from_dict(m, where=f"message {i}") for i, m in enumerate(messages[:verified])), *tail]
            else:
                incoming = [Message.from_dict(m, where=f"message {i}") for i, m in enumerate(messages)]
            plan = plan_sync([e.msg for e in self.history.entries], incoming)
            if plan.mode != "rebased":
                return SyncResult(self.extend(incoming[plan.start:]), plan.mode, plan.kept)
            ingest.validate(incoming[plan.start:], prefix_history(self.history, plan.start), plan.start)
            detached = self.store.detach(self.session_id, plan.start)  # nothing is deleted
            self.state.reset()
            self.state.catch_up()
            return SyncResult(self.extend(incoming[plan.start:]), "rebased", plan.kept, detached)

    def truncate(self, turn: int) -> str | None:
        """Keep the first ``turn`` messages: the rest moves to a detached session in the store (nothing is
        deleted; the new session's id is returned, ``None`` when nothing followed) and the history and
        the layers are rebuilt from what stays, with the tiers the store records (an event log's rollback).

        Raises:
            ConfigError: ``turn`` is not an integer in ``[0, len(self)]``.
        """
        with self._lock:
            self.state.catch_up()
            if isinstance(turn, bool) or not isinstance(turn, int) or not 0 <= turn <= len(self.history):
                raise ConfigError(f"truncate takes a turn in [0, {len(self.history)}], got {turn!r}")
            detached = self.store.detach(self.session_id, turn) if turn < len(self.history) else None
            self.state.reset()
            self.state.catch_up()
            return detached

    def build(self, query: str | None = None, budget: int | None = None) -> ContextWindow:
        """Assemble the context window for the next LLM call.

        Args:
            query: the current user request or probe; archived messages relevant to it are paged back
                in (within ``policy.page_in_limit`` of the budget) and relevance raises message values.
                The same query as the last build's, at the same budget, with only new messages since
                and no compaction (an agent's tool loop under one request), keeps the last build's
                page-in and neither searches nor plans again: the window keeps its prefix for a
                provider's prompt cache, and the new messages may take the room of the last page-ins
                (undone from the lowest-ranked; when even the best one would go, it plans afresh); a
                compaction, a new query or another budget plans afresh.
            budget: token budget for this call (default: the manager's ``budget``).

        Returns a :class:`~ctxscore.window.result.ContextWindow`: OpenAI-style messages (fresh
        copies), token figures, sections, warnings and one decision per message.

        Raises:
            ConfigError: ``budget`` is not a positive integer or ``query`` is not a string.
            BudgetError: the window cannot get within the budget (pinned content, or pinned content
                and the last turn, exceed it) and ``policy.on_overflow`` is ``"raise"``.
        """
        B = self.budget if budget is None else check_budget(budget)
        if query is not None and not isinstance(query, str):
            raise ConfigError(f"query must be a string or None, got {type(query).__name__}")
        with self._lock:
            warns: list[WindowWarning] = []

            def find() -> list[Hit]:
                try:
                    return (search(self.store, self.session_id, self.scorer, query, SEARCH_HITS)
                            if query and self._may_page(B) and names_anything(query) else [])
                except StoreError as exc:  # build from memory
                    warns.append(tiers.store_unavailable("be read", exc))
                    return []

            try:
                self.state.catch_up()
            except StoreError as exc:  # build from memory
                warns.append(tiers.store_unavailable("be read", exc))
                return self.state.build(query, B, [], warns)
            kept = self.state.kept_hits(query, B)  # a tool loop's next step under the same request
            if kept is not None:
                return self.state.build(query, B, kept, warns, refresh=find)
            return self.state.build(query, B, find(), warns)

    def _may_page(self, B: int) -> bool:
        """Whether a query can change this build: something is compacted, or compaction is due."""
        h = self.history
        occ = tiers.occupancy(h.msg_tokens - tiers.last_excess(h, B, self.state.forms), h.stub_tokens, self.policy, B)
        return bool(h.n_compacted) or occ >= self.policy.t_archive * B

    @property
    def messages(self) -> list[Message]:
        """All messages added so far (originals, immutable), in order."""
        return [e.msg for e in self.history.entries]

    def predictions(self) -> list[Prediction]:
        """The scorer's prediction for every message, in order (computed once, when it was added)."""
        return [e.pred for e in self.history.entries]

    @property
    def total_tokens(self) -> int:
        """Tokens of the full history sent verbatim (the full-context cost), including reply priming."""
        return self.history.total_tokens + REPLY_PRIMING_TOKENS

    def __len__(self) -> int:
        return len(self.history)

    def search(self, query: str, k: int = 5) -> list[dict[str, Any]]:
        """Search the session's stored originals; hits with id, turn, fused score and the original message.

        Raises:
            ConfigError: ``query`` is not a string or ``k`` not a positive integer.
        """
        if not isinstance(query, str) or isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(f"search takes a string query and a positive integer k, got {query!r}, {k!r}")
        with self._lock:
            self.state.catch_up()
            ids = self.history.ids
            return [{"id": x.id, "turn": x.turn, "score": x.score, "message": self.history.entries[ids[x.id]].msg.to_openai()}
                    for x in search(self.store, self.session_id, self.scorer, query, k) if x.id in ids]

    def close(self) -> None:
        """Close the store (a file-backed session can be resumed with the same arguments) and free
        the layers (another manager may take them over)."""
        free_layers(self.state.layers, self.state)
        self.store.close()

    def __enter__(self) -> ContextManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

