"""The context manager: add messages, build a window that fits the token budget.

Flow per turn (see ``../shared/DESIGN.md``)::

    add(message) -> classify + score (once per message) -> token count (once, running total)
    build(query) -> occupancy vs thresholds -> tier decisions by value -> compress / archive
                 -> page-in from the archive for the query -> order + assemble -> ContextWindow

Tier policy (defaults in :class:`Policy`): tiers are sticky between builds, so the window prefix
stays stable and provider prompt caches stay warm. When occupancy (window tokens / budget) reaches
the high-water mark ``t_archive`` (0.8), one compaction pass runs in stages, on messages outside the
last ``recent_turns`` turns that are not pinned:

=============================  ==================================================================
stage                          action
=============================  ==================================================================
1 (occupancy >= ``t_compact``)   ``failure`` units -> archived; ``reasoning`` -> compressed
2 (still >= ``t_structure``)     ``key_state`` -> structured; ``reasoning`` units -> archived
3 (still > ``low_water``)        units archived by ascending value until occupancy <= ``low_water``
=============================  ==================================================================

When the full history fits below ``t_compact`` (0.6) every message is verbatim again.

``instruction`` messages, system messages and short user corrections are pinned (never compressed or
archived). An assistant message with tool calls and its tool results form one unit: archived
together, never split. When pinned content and the recent turns stay above the high-water mark,
recency protection is relaxed turn by turn down to the last message alone (with a warning); a window
still over budget is returned with a warning that gives the figures (or
:class:`~ctxscore.errors.BudgetError` with ``on_overflow="raise"`` when pinned content alone exceeds
the budget).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..compress.extractive import archive_stub, compress
from ..config import OnOverflow, Policy
from ..errors import BudgetError, ConfigError, InputError
from ..messages import CATEGORIES, Category, Message, Tier
from ..scoring.base import Prediction, Scorer
from ..scoring.rules import RuleClassifier, RuleConfig, _scan_text, extract_entities
from ..store.retrieval import Hit
from ..store.sqlite import Archive
from ..tokens import REPLY_PRIMING_TOKENS, TokenCounter
from .result import ContextWindow, Decision

log = logging.getLogger("ctxscore")

_default_scorer: Any = None  # the packaged learned scorer (False: unavailable), loaded on first use

_CAT_RANK = {Category.FAILURE: 0, Category.REASONING: 1, Category.KEY_STATE: 2, Category.INSTRUCTION: 3}
_CONFIRM_SHORT = 80  # a user message of at most this many characters can confirm the previous answer
# The start (200 characters) of each of the 3 previous messages is indexed as the archive search
# context of a message (a booking reply is found by a question naming the venue asked for earlier).
_CONTEXT_CHARS = 200
_CONTEXT_MESSAGES = 3


_TIERS = (Tier.VERBATIM, Tier.STRUCTURED, Tier.COMPRESSED, Tier.ARCHIVED)
_CODE = {t: i for i, t in enumerate(_TIERS)}
_ARCH = _CODE[Tier.ARCHIVED]


@dataclass(slots=True)
class _Entry:
    msg: Message
    text: str
    tokens: int
    pred: Prediction
    entities: list[str]
    unit: int  # index of the unit's first entry
    turn_no: int  # number of the conversational turn (a turn starts at each user message)
    pinned: bool
    static: dict[str, float]  # value factors that do not change with time (base, density, ...)
    confirmed: bool = False
    tier: str = Tier.VERBATIM
    cur_tokens: int = 0  # tokens in the current tier (stub tokens when archived)
    forms: dict[str, tuple[str, int, str]] = field(default_factory=dict)  # tier -> (text, tokens, tier reached)
    no_compress: bool = False  # compression fell back to verbatim: do not retry

    @property
    def category(self) -> str:
        return self.pred.category


def _entity_key(e: str) -> str | None:
    k = e.strip("\"'`“”「」《》‘’").lower()
    return k if len(k) >= 3 else None


class _Grow:
    """A numpy array that grows by doubling (amortised O(1) append)."""

    def __init__(self, dtype: Any) -> None:
        self.a = np.zeros(64, dtype=dtype)

    def set(self, i: int, v: Any) -> None:
        if i >= len(self.a):
            self.a = np.concatenate([self.a, np.zeros_like(self.a)])
        self.a[i] = v


class ContextManager:
    """Keeps a long conversation inside a token budget, message by message.

    Args:
        budget: default token budget for :meth:`build` (tokens, > 0).
        scorer: ``"auto"`` (default: the packaged learned scorer when its embedder package is
            installed, else the rule classifier with one warning), ``"rules"`` (rule classifier only),
            a :class:`~ctxscore.scorer.Scorer`, or a path to a packaged scorer folder.
        rules: a :class:`~ctxscore.rules.RuleConfig`, a rule-file path, or ``None`` for the default.
        encoding: tiktoken encoding, ``"cl100k_base"`` or ``"o200k_base"``.
        policy: a :class:`Policy` (defaults as in the design).
        archive_path: SQLite file that stores every original message (and lets a session be resumed);
            ``None`` keeps the archive in memory.
        session_id: the session within the archive file. An existing session is resumed.

    Per-turn cost: ``add`` scores and counts one message; ``build`` does vectorised O(n) work over
    small arrays plus Python work proportional to the assembled window. Decisions are materialised
    lazily, when :attr:`ContextWindow.decisions` is first read.

    Raises:
        ConfigError: bad budget, policy, rule file or scorer argument.
        ArchiveError: the archive file cannot be opened.
    """

    def __init__(
        self,
        budget: int = 8000,
        *,
        scorer: Scorer | str | Path | None = "auto",
        rules: RuleConfig | str | Path | None = None,
        encoding: str = "cl100k_base",
        policy: Policy | None = None,
        archive_path: str | Path | None = None,
        session_id: str = "default",
    ) -> None:
        if not isinstance(budget, int) or budget <= 0:
            raise ConfigError(f"budget must be a positive number of tokens, got {budget!r}")
        self.budget = budget
        self.policy = policy or Policy()
        self.rules = RuleClassifier(rules)
        self.config = self.rules.config
        self.counter = TokenCounter(encoding)
        self.scorer = self._resolve_scorer(scorer)
        self.session_id = session_id
        self.archive = Archive(archive_path)
        self._entries: list[_Entry] = []
        self._ids: dict[str, int] = {}
        self._units: dict[int, list[int]] = {}
        self._postings: dict[str, list[int]] = {}
        self._call_owner: dict[str, int] = {}  # tool_call_id -> index of the assistant message
        self._turn_no = 0
        self._total_tokens = 0  # sum of verbatim tokens
        self._pinned_tokens = 0
        self._occ_msg_tokens = 0  # sum of cur_tokens of non-archived entries
        self._stub_tokens = 0  # sum of stub tokens of archived entries
        self._n_compacted = 0  # entries not verbatim
        self._prepared = 0  # entries before this index have their compressed forms computed
        self._budget_now = budget
        self._stuck: tuple[int, int] | None = None  # (messages, budget) at which compaction could do no more
        # per-entry arrays for vectorised values
        self._intr = _Grow(np.float64)  # intrinsic value (category base x static factors, blended)
        self._turn = _Grow(np.int64)
        self._refs = _Grow(np.int64)
        self._code = _Grow(np.int8)  # tier code
        self._stub = _Grow(np.int64)  # stub tokens
        self._val = np.zeros(0)
        self._rel = np.zeros(0)
        self._f = self._factor_params()
        self._resume()

    # -- set-up ---------------------------------------------------------------------------------
    def _resolve_scorer(self, scorer: Scorer | str | Path | None) -> Scorer:
        if scorer is None or scorer == "rules":
            return self.rules
        if scorer == "auto":
            global _default_scorer
            if _default_scorer is None:  # loaded once per process, shared by every manager
                from ..scoring.learned import load_default_scorer  # noqa: PLC0415

                _default_scorer = load_default_scorer(warn=True) or False
            return _default_scorer or self.rules
        if isinstance(scorer, str | Path):
            from ..scoring.learned import LearnedScorer  # noqa: PLC0415

            return LearnedScorer.from_pretrained(scorer)
        if not hasattr(scorer, "predict"):
            raise ConfigError(f"scorer must be 'rules', 'auto', a path or an object with predict(messages); got {scorer!r}")
        return scorer

    def _factor_params(self) -> dict[str, float]:
        f = self.config.factors
        return {
            "hl": f.recency_half_life_turns, "floor": f.recency_floor, "rboost": f.recency_boost,
            "rstep": f.reference_step, "rcap": f.reference_cap, "dstep": f.entity_density_step,
            "cboost": f.confirmation_boost, "pivot": f.token_cost_pivot, "slope": f.token_cost_slope,
            "qboost": f.relevance_boost,
        }

    def _resume(self) -> None:
        stored = self.archive.messages(self.session_id)
        if not stored:
            return
        for row in stored:
            msg = Message.from_dict(row["message"], where=f"archived message {row['id']}")
            msg.id, msg.turn = row["id"], row["turn"]
            p = row["prediction"] or {}
            pred = Prediction(
                category=p.get("category", Category.REASONING), probs=p.get("probs", {}), value=p.get("value"),
                source=p.get("source", "rules"), signals=p.get("signals", {}), embedding=row["embedding"],
            )
            self._append(msg, pred, store=False)
            if row["tier"] != Tier.VERBATIM:
                self._set_tier(len(self._entries) - 1, row["tier"])
        log.info("resumed session %s with %d messages", self.session_id, len(self._entries))

    # -- adding ---------------------------------------------------------------------------------
    def _validate(self, message: Message | dict[str, Any], where: str) -> Message:
        if isinstance(message, Message):
            msg = Message.from_dict(message.to_openai() | ({"id": message.id} if message.id else {}), where=where)
        else:
            msg = Message.from_dict(message, where=where)
        if msg.id is not None and msg.id in self._ids:
            raise InputError(f"{where}: message id {msg.id!r} was already added; ids must be unique within a session")
        return msg

    def add(self, message: Message | dict[str, Any]) -> Message:
        """Add one message (a :class:`Message` or an OpenAI-style dict) and score it.

        Returns:
            The stored :class:`Message` with ``id`` (``m{turn}`` when none was given) and ``turn`` set.

        Raises:
            InputError: invalid message (unknown role, empty or oversized content, duplicate id);
                nothing is stored in that case.
        """
        msg = self._validate(message, where=f"message {len(self._entries)}")
        ((pred, ents),) = self._predict([msg])
        return self._append(msg, pred, ents)

    def extend(self, messages: Iterable[Message | dict[str, Any]]) -> list[Message]:
        """Add many messages; all are validated before any is stored, and scored in one batch.

        Raises:
            InputError: the first invalid message (named by its position); nothing is stored.
        """
        msgs: list[Message] = []
        seen: set[str] = set()
        for i, m in enumerate(messages):
            msg = self._validate(m, where=f"message {len(self._entries) + i}")
            if msg.id is not None:
                if msg.id in seen:
                    raise InputError(f"message {len(self._entries) + i}: duplicate id {msg.id!r} in the batch")
                seen.add(msg.id)
            msgs.append(msg)
        scored = self._predict(msgs) if msgs else []
        return [self._append(m, p, ents) for m, (p, ents) in zip(msgs, scored, strict=True)]

    def _predict(self, msgs: list[Message]) -> list[tuple[Prediction, list[str]]]:
        """Predictions and entities (of the scan text: head and tail of long texts) per message."""
        ents = [extract_entities(_scan_text(m.text()), self.config) for m in msgs]
        for i, m in enumerate(msgs):  # the learned scorer's position features read turn (set again in _append)
            m.turn = len(self._entries) + i
        if self.scorer is self.rules:  # the rule signals reuse the entity scan
            preds = [self.rules.predict_one(m, e) for m, e in zip(msgs, ents, strict=True)]
        else:
            preds = self.scorer.predict(msgs)
        return list(zip(preds, ents, strict=True))

    def _static_factors(self, e: _Entry) -> tuple[dict[str, float], float]:
        """Static value factors of an entry and its intrinsic value (rule value blended with learned)."""
        f = self._f
        base = self.config.base_weights[e.category]
        density = 1.0 + f["dstep"] * min(2.0, 50.0 * len(e.entities) / max(1, e.tokens))
        confirmation = f["cboost"] if e.confirmed else 1.0
        token_cost = 1.0 / (1.0 + f["slope"] * math.log2(e.tokens / f["pivot"])) if e.tokens > f["pivot"] else 1.0
        static = {"base": base, "entity_density": density, "confirmation": confirmation, "token_cost": token_cost}
        rule_value = base * density * confirmation * token_cost
        if e.pred.value is None:
            return static, rule_value
        blend = self.policy.blend
        static["learned_value"] = float(e.pred.value)
        static["blend"] = blend
        return static, blend * float(e.pred.value) + (1.0 - blend) * rule_value

    def _append(self, msg: Message, pred: Prediction, entities: list[str] | None = None, store: bool = True) -> Message:
        idx = len(self._entries)
        msg.turn = idx
        if msg.id is None:
            msg.id = f"m{idx}"
        if pred.category not in CATEGORIES:
            raise ConfigError(f"scorer returned unknown category {pred.category!r}; expected one of {CATEGORIES}")
        text = msg.text()
        tokens = self.counter.count_message(msg)
        if entities is None:
            entities = extract_entities(_scan_text(text), self.config)
        unit = idx  # a tool result joins the assistant message that called it
        if msg.role == "tool" and msg.tool_call_id in self._call_owner:
            unit = self._entries[self._call_owner[msg.tool_call_id]].unit
        pinned = msg.role == "system" or pred.category == Category.INSTRUCTION or self._is_correction(msg, entities)
        if store:
            self.archive.add(
                self.session_id, msg.id, idx, msg.role, text, msg.to_openai(),
                prediction={"category": pred.category, "probs": pred.probs, "value": pred.value,
                            "source": pred.source, "signals": pred.signals},
                embedding=pred.embedding,
                context="\n".join(e.text[:_CONTEXT_CHARS] for e in self._entries[-_CONTEXT_MESSAGES:]),
            )
        if msg.role == "user":
            self._turn_no += 1
        entry = _Entry(msg=msg, text=text, tokens=tokens, pred=pred, entities=entities, unit=unit,
                       turn_no=self._turn_no, pinned=pinned, static={}, cur_tokens=tokens)
        entry.static, intr = self._static_factors(entry)
        self._entries.append(entry)
        self._ids[msg.id] = idx
        self._units.setdefault(unit, []).append(idx)
        for call in msg.tool_calls or ():
            if isinstance(call.get("id"), str):
                self._call_owner[call["id"]] = idx
        self._total_tokens += tokens
        self._occ_msg_tokens += tokens
        if pinned:
            self._pinned_tokens += tokens
        self._intr.set(idx, intr)
        self._turn.set(idx, entry.turn_no)
        self._refs.set(idx, 0)
        self._code.set(idx, 0)
        self._stub.set(idx, 0)
        refs = self._refs.a
        # later references: this message's entities credit earlier messages that mention them
        for ent in entities:
            key = _entity_key(ent)
            if key is None:
                continue
            post = self._postings.setdefault(key, [])
            for j in post[-8:]:
                refs[j] += 1
            if not post or post[-1] != idx:
                post.append(idx)
        # user confirmation of the previous assistant answer
        if msg.role == "user" and len(msg.content) <= _CONFIRM_SHORT and self.config.keyword_regexes["confirmation"].search(msg.content):
            for j in range(idx - 1, -1, -1):
                prev = self._entries[j]
                if prev.msg.role == "assistant":
                    prev.confirmed = True
                    prev.static, intr_j = self._static_factors(prev)
                    self._intr.a[j] = intr_j
                    break
                if prev.msg.role == "user":
                    break
        return msg

    def _is_correction(self, msg: Message, entities: list[str]) -> bool:
        """A short user message with a value and a correction marker (rule file ``correction``
        keywords): it restates a requirement, so it is pinned like an instruction."""
        if msg.role != "user" or not entities or len(msg.content) > 400 or "correction" not in self.config.keywords:
            return False
        return self.config.keyword_counts(msg.content).get("correction", 0) > 0

    # -- tiers ----------------------------------------------------------------------------------
    def _form(self, e: _Entry, tier: str) -> tuple[str, int, str]:
        """(content, tokens, tier reached) of an entry in a tier; compressed forms are computed once.

        Compression may fall back to a gentler tier (see :func:`ctxscore.compress.compress`).
        """
        if tier == Tier.VERBATIM:
            return e.msg.content, e.tokens, Tier.VERBATIM
        got = e.forms.get(tier)
        if got is None:
            if tier == Tier.ARCHIVED:
                stub = archive_stub(e.msg.id, e.text)
                got = (stub, self.counter.count(stub) + 1, Tier.ARCHIVED)
            elif not e.msg.content.strip() or len(e.msg.content) > self.policy.max_compress_chars:
                got = (e.msg.content, e.tokens, Tier.VERBATIM)  # nothing to compress / archive it instead
            else:
                res = compress(e.msg.content, tier, self.config)
                got = (res.text, self.counter.count_message(e.msg, content=res.text), res.tier)
            e.forms[tier] = got
        return got

    def _set_tier(self, i: int, tier: str) -> bool:
        """Move entry ``i`` to ``tier`` (or the gentler tier its compression reached); True if it changed."""
        e = self._entries[i]
        if tier in (Tier.STRUCTURED, Tier.COMPRESSED):
            tier = self._form(e, tier)[2]
            if tier == Tier.VERBATIM:
                e.no_compress = True
        if tier == e.tier:
            return False
        if e.tier == Tier.ARCHIVED:
            self._stub_tokens -= e.cur_tokens
        else:
            self._occ_msg_tokens -= e.cur_tokens
        self._n_compacted += (tier != Tier.VERBATIM) - (e.tier != Tier.VERBATIM)
        e.tier = tier
        e.cur_tokens = self._form(e, tier)[1]
        if tier == Tier.ARCHIVED:
            self._stub_tokens += e.cur_tokens
            self._stub.a[i] = e.cur_tokens
        else:
            self._occ_msg_tokens += e.cur_tokens
        self._code.a[i] = _CODE[tier]
        return True

    def _occupancy_tokens(self) -> int:
        stub_cap = int(self.policy.stub_fraction * self._budget_now)
        stubs = min(self._stub_tokens, stub_cap + 40) if self._stub_tokens else 0
        return self._occ_msg_tokens + stubs + REPLY_PRIMING_TOKENS

    # -- values ---------------------------------------------------------------------------------
    def _recency(self, turns: np.ndarray) -> np.ndarray:
        f = self._f
        age = (self._turn_no - turns).astype(np.float64)
        return f["rboost"] * (f["floor"] + (1.0 - f["floor"]) * np.power(0.5, age / f["hl"]))

    def _compute_values(self, relevance: dict[str, float]) -> None:
        """Value of every entry, vectorised (see the rule file's ``[factors]``):
        ``clip(intrinsic x recency x references x relevance, 0, 1)``."""
        n = len(self._entries)
        f = self._f
        rel = np.zeros(n)
        for mid, score in relevance.items():
            i = self._ids.get(mid)
            if i is not None:
                rel[i] = score
        references = 1.0 + f["rstep"] * np.minimum(self._refs.a[:n], f["rcap"])
        val = self._intr.a[:n] * self._recency(self._turn.a[:n]) * references * (1.0 + (f["qboost"] - 1.0) * rel)
        self._val = np.clip(val, 0.0, 1.0)
        self._rel = rel

    def _factors(self, i: int, turn_no: int, refs: int, rel: float) -> dict[str, float]:
        """All value factors of entry ``i`` as they were at a build (for decisions)."""
        f = self._f
        age = turn_no - self._entries[i].turn_no
        out = dict(self._entries[i].static)
        out["recency"] = f["rboost"] * (f["floor"] + (1.0 - f["floor"]) * 0.5 ** (age / f["hl"]))
        out["references"] = 1.0 + f["rstep"] * min(refs, f["rcap"])
        out["relevance"] = 1.0 + (f["qboost"] - 1.0) * rel
        return out

    # -- build ----------------------------------------------------------------------------------
    def build(self, query: str | None = None, budget: int | None = None) -> ContextWindow:
        """Assemble the context window for the next LLM call.

        Args:
            query: the current user request or probe; archived messages relevant to it are paged back
                in (within ``policy.page_in_limit`` of the budget) and relevance raises message values.
            budget: token budget for this call (default: the manager's ``budget``).

        Returns:
            A :class:`~ctxscore.types.ContextWindow` with OpenAI-style messages, token figures and
            one decision per message.

        Raises:
            ConfigError: ``budget`` is not a positive integer.
            BudgetError: pinned content exceeds the budget and ``policy.on_overflow == "raise"``.
        """
        B = self.budget if budget is None else budget
        if not isinstance(B, int) or B <= 0:
            raise ConfigError(f"budget must be a positive number of tokens, got {B!r}")
        self._budget_now = B
        pol = self.policy
        warns: list[str] = []
        relevance: dict[str, float] = {}
        hits: list[Hit] = []
        if query:  # one search serves both the relevance factor and page-in
            hits = self.archive.search(self.session_id, query, k=40, query_embedding=self._embed_query(query))
            if hits:
                top = hits[0].score
                relevance = {h.id: h.score / top for h in hits[:20]}
        self._compute_values(relevance)
        changed: list[int] = []
        if self._occupancy_tokens() >= pol.t_compact * B:
            self._prepare_forms()
        if self._total_tokens + REPLY_PRIMING_TOKENS <= pol.t_compact * B:
            if self._n_compacted:  # the full history fits below the first threshold: all verbatim
                for i in np.flatnonzero(self._code.a[: len(self._entries)]):
                    if self._set_tier(int(i), Tier.VERBATIM):
                        changed.append(int(i))
        elif self._occupancy_tokens() >= pol.t_archive * B and self._stuck != (len(self._entries), B):
            changed += self._compact_batch(B, warns)
        pinned_tokens = self._pinned_tokens + REPLY_PRIMING_TOKENS
        if pinned_tokens > B:
            msg = (
                f"pinned content (instructions and system messages) needs {pinned_tokens} tokens, above the "
                f"budget of {B}; raise the budget to at least {pinned_tokens} or shorten the instructions"
            )
            if pol.on_overflow == OnOverflow.RAISE:
                raise BudgetError(msg)
            warns.append(msg)
        paged = self._page_in(hits, B) if hits else {}
        window = self._assemble(B, paged, warns)
        if (not paged and window.tokens >= pol.t_archive * B and not changed
                and self._stuck != (len(self._entries), B)):
            # the occupancy estimate (stub notes) was under the high-water mark but the assembled
            # window is not: compact on the exact figure
            changed += self._compact_batch(B, warns)
            if changed:
                window = self._assemble(B, paged, warns)
        if changed:
            entries = self._entries
            self.archive.set_tiers(self.session_id, [(entries[i].msg.id, entries[i].tier) for i in changed])
        if paged and window.tokens > pol.page_in_limit * B:
            window = self._fit_page_in(B, paged, warns)
        if window.tokens > B and pinned_tokens <= B:
            warns.append(
                f"window needs {window.tokens} tokens, above the budget of {B}: the last "
                f"{pol.recent_turns} turn(s) and pinned messages cannot be compacted further"
            )
        for w in warns:
            (log.warning if "pinned content" in w else log.info)(w)
        return window

    def _compact_batch(self, B: int, warns: list[str]) -> list[int]:
        """One batch of compaction at the high-water mark, relaxing recency protection turn by turn
        (with a warning each) while occupancy stays above it; returns the changed entry indices."""
        pol = self.policy
        changed: list[int] = []
        k = pol.recent_turns
        while True:
            changed += self._compact(B, k)
            if self._occupancy_tokens() <= pol.t_archive * B or k <= 0:
                break
            k -= 1
            warns.append(
                f"recency protection relaxed to the last {k} turn(s) to fit the budget of {B} tokens"
                if k else f"recency protection relaxed to the last message to fit the budget of {B} tokens"
            )
        if not changed:
            self._stuck = (len(self._entries), B)  # nothing left to compact until the history changes
        return changed

    def _prepare_forms(self) -> None:
        """Compute the compressed form of messages that have left the recent turns, a few per build.

        Spreads the cost of compression over the turns between compactions (amortised about one
        message per turn), so a compaction pass mostly switches tiers.
        """
        cutoff = self._turn_no - self.policy.recent_turns
        entries = self._entries
        i = self._prepared
        while i < len(entries) and entries[i].turn_no <= cutoff:
            e = entries[i]
            if not e.pinned:
                if e.category == Category.REASONING:
                    self._form(e, Tier.COMPRESSED)
                elif e.category == Category.KEY_STATE:
                    self._form(e, Tier.STRUCTURED)
            i += 1
        self._prepared = i

    def _embed_query(self, query: str):
        embed = getattr(self.scorer, "embed_texts", None)
        if embed is None:
            return None
        try:
            return embed([query])[0]
        except Exception as exc:  # noqa: BLE001 - vector search is optional; keyword search still runs
            log.warning("query embedding failed (%s); using keyword search only", exc)
            return None

    def _eligible_units(self, k: int) -> dict[int, list[int]]:
        """Units (first index -> member indices) outside the last ``k`` turns with no pinned member.

        ``k = 0`` protects only the unit of the last message (the relaxation of last resort).
        """
        cutoff = self._turn_no - k  # turns with number > cutoff are recent
        entries = self._entries
        last_unit = entries[-1].unit if entries else -1
        return {
            u: members
            for u, members in self._units.items()
            if u != last_unit and all(not entries[i].pinned and entries[i].turn_no <= cutoff for i in members)
        }

    def _unit_category(self, members: list[int]) -> str:
        return max((self._entries[i].category for i in members), key=lambda c: _CAT_RANK[Category(c)])

    def _unit_value(self, members: list[int]) -> float:
        return float(max(self._val[i] for i in members))

    def _compact(self, B: int, k: int) -> list[int]:
        """One compaction pass (run when occupancy reaches the high-water mark), in batches.

        Stage 1, if occupancy >= ``t_compact``: every failure unit archived, every reasoning message
        compressed. Stage 2, if still >= ``t_structure``: key_state summarised (structured), reasoning
        units archived. Stage 3, if still > ``low_water``: units archived by ascending value until
        occupancy <= ``low_water``. Only units outside the last ``k`` turns with no pinned member are
        touched; a message whose compression would lose an entity stays as it was.
        """
        pol = self.policy
        entries = self._entries
        changed: list[int] = []
        units = self._eligible_units(k)
        stub_cap = int(pol.stub_fraction * B)

        def occ() -> float:
            return self._occupancy_tokens() / B

        def setn(i: int, tier: str) -> None:
            if self._set_tier(i, tier):
                changed.append(i)

        def compress_all(category: str, tier: str) -> None:
            for members in units.values():
                for i in members:
                    e = entries[i]
                    if e.category == category and e.tier == Tier.VERBATIM and not e.no_compress:
                        setn(i, tier)

        def archive_units(unit_ids: list[int], until: float | None) -> None:
            for u in sorted(unit_ids, key=lambda u: (self._unit_value(units[u]), u)):
                if until is not None and occ() <= until:
                    return
                members = units[u]
                stub = sum(self._form(entries[i], Tier.ARCHIVED)[1] for i in members)
                if self._stub_tokens + stub <= stub_cap and sum(entries[i].cur_tokens for i in members) <= stub:
                    continue  # its stub would be shown and would not be smaller than the message itself
                for i in members:
                    setn(i, Tier.ARCHIVED)

        def live() -> list[int]:
            return [u for u, m in units.items() if any(entries[i].tier != Tier.ARCHIVED for i in m)]

        if occ() >= pol.t_compact:
            archive_units([u for u in live() if self._unit_category(units[u]) == Category.FAILURE], None)
            compress_all(Category.REASONING, Tier.COMPRESSED)
        if occ() >= pol.t_structure:
            compress_all(Category.KEY_STATE, Tier.STRUCTURED)
            archive_units([u for u in live() if self._unit_category(units[u]) == Category.REASONING], None)
        if occ() > pol.low_water:
            archive_units(live(), pol.low_water)
        return changed

    def _page_in(self, ranked: list[Hit], B: int) -> dict[int, str]:
        """Entries shown verbatim for this build only (index -> hit id), and entries shown as stubs to
        make room for them (index -> ``"evicted"``). ``ranked`` is the query's archive search, best
        first; the first ``3 x page_in_k`` hits that are not verbatim are candidates."""
        pol = self.policy
        entries = self._entries
        limit = pol.page_in_limit * B
        hits = [h for h in ranked if h.id in self._ids and entries[self._ids[h.id]].tier != Tier.VERBATIM]
        hits = hits[: pol.page_in_k * 3]
        paged: dict[int, str] = {}
        occ = self._occupancy_tokens()
        evicted: set[int] = set()
        units_done: set[int] = set()
        evictable: dict[int, list[int]] | None = None  # computed once, when room is first needed
        for h in hits:
            if len(units_done) >= pol.page_in_k:
                break
            hit = self._ids[h.id]
            u = entries[hit].unit
            if u in units_done:
                continue
            members = self._units[u]
            delta = sum(entries[i].tokens - entries[i].cur_tokens for i in members)
            if occ + delta > limit:
                # make room for this build only: lowest-value evictable units (not pinned, not recent)
                if evictable is None:
                    evictable = self._eligible_units(pol.recent_turns)
                cands = sorted(
                    (m for uu, m in evictable.items()
                     if uu != u and uu not in units_done and not evicted.intersection(m)
                     and any(entries[i].tier != Tier.ARCHIVED for i in m)),
                    key=self._unit_value,
                )
                for m in cands:
                    if occ + delta <= limit:
                        break
                    # the best hit may displace anything evictable; later hits only less valuable units
                    if units_done and self._unit_value(m) >= self._val[hit]:
                        break
                    occ -= sum(entries[i].cur_tokens - self._form(entries[i], Tier.ARCHIVED)[1]
                               for i in m if entries[i].tier != Tier.ARCHIVED)
                    evicted.update(m)
                if occ + delta > limit:
                    continue
            for i in members:
                paged[i] = h.id
            occ += delta
            units_done.add(u)
        for i in evicted:
            if i not in paged:
                paged[i] = "evicted"
                self._form(entries[i], Tier.ARCHIVED)
        return paged

    def _fit_page_in(self, B: int, paged: dict[int, str], warns: list[str]) -> ContextWindow:
        """Undo page-ins, the lowest-ranked first, until the assembled window fits the page-in limit
        (the planning in :meth:`_page_in` uses per-message estimates; stub notes can differ)."""
        limit = self.policy.page_in_limit * self._budget_now
        order = list(dict.fromkeys(h for h in paged.values() if h != "evicted"))  # hit ids, best first
        while order:
            drop = order.pop()
            paged = {i: h for i, h in paged.items() if h != drop}
            window = self._assemble(B, paged, warns)
            if window.tokens <= limit:
                return window
        return self._assemble(B, {}, warns)

    def _assemble(self, B: int, paged: dict[int, str], warns: list[str]) -> ContextWindow:
        """Messages in conversation order: originals or compressed forms, archived runs merged into
        one system note of stubs (the newest stubs within ``stub_fraction`` of the budget; older
        ones collapsed into a single line). Python work is proportional to the window."""
        entries = self._entries
        n = len(entries)
        codes = self._code.a[:n].copy()
        stubs = self._stub.a[:n].copy()
        for i, how in paged.items():
            if how == "evicted":
                codes[i] = _ARCH
                stubs[i] = self._form(entries[i], Tier.ARCHIVED)[1]
            else:
                codes[i] = 0
        arch = np.flatnonzero(codes == _ARCH)
        cap = int(self.policy.stub_fraction * B)
        if len(arch):
            cum = np.cumsum(stubs[arch][::-1])
            keep = int(np.searchsorted(cum, cap, side="right"))
        else:
            keep = 0
        shown_stub = arch[len(arch) - keep :]
        collapsed = arch[: len(arch) - keep]
        order = np.union1d(np.flatnonzero(codes != _ARCH), shown_stub)
        if len(collapsed):
            order = np.union1d(order, collapsed[:1])
        out: list[dict[str, Any]] = []
        tokens = REPLY_PRIMING_TOKENS
        run: list[str] = []
        first_collapsed = int(collapsed[0]) if len(collapsed) else -1
        for i in order.tolist():
            e = entries[i]
            c = codes[i]
            if c == _ARCH:
                if i == first_collapsed:
                    run.append(
                        f"[archived {len(collapsed)} earlier messages {e.msg.id} … "
                        f"{entries[int(collapsed[-1])].msg.id}; ask about them to page them back in]"
                    )
                else:
                    run.append(self._form(e, Tier.ARCHIVED)[0])
                continue
            if run:
                note = {"role": "system", "content": "\n".join(run)}
                out.append(note)
                tokens += self.counter.count_message(note)
                run = []
            content, after, _ = self._form(e, _TIERS[c])
            out.append(e.msg.to_openai(content=content))
            tokens += after
        if run:
            note = {"role": "system", "content": "\n".join(run)}
            out.append(note)
            tokens += self.counter.count_message(note)
        paged_ids = [entries[i].msg.id for i, how in sorted(paged.items()) if how != "evicted"]
        snapshot = (codes, stubs, set(shown_stub.tolist()), self._val.copy(), self._rel.copy(),
                    self._refs.a[:n].copy(), self._turn_no, dict(paged))
        return ContextWindow(
            messages=out, tokens=tokens, budget=B, paged_in=paged_ids, warnings=warns,
            decide=lambda: self._decisions(snapshot),
        )

    def _decisions(self, snapshot: tuple) -> list[Decision]:
        codes, stubs, shown_stub, val, rel, refs, turn_no, paged = snapshot
        out = []
        for i in range(len(codes)):
            e = self._entries[i]
            tier = _TIERS[codes[i]]
            if codes[i] == _ARCH:
                after = int(stubs[i]) if i in shown_stub else 0
            else:
                after = self._form(e, tier)[1]
            is_paged = paged.get(i) not in (None, "evicted")
            out.append(Decision(
                id=e.msg.id, turn=i, role=e.msg.role, category=e.category, value=float(val[i]), tier=tier,
                tokens_before=e.tokens, tokens_after=after, pinned=e.pinned, paged_in=is_paged,
                factors=self._factors(i, turn_no, int(refs[i]), float(rel[i])),
                reason="paged in for the query" if is_paged else ("pinned" if e.pinned else ""),
            ))
        return out

    # -- misc -----------------------------------------------------------------------------------
    @property
    def messages(self) -> list[Message]:
        """All messages added so far (originals), in order."""
        return [e.msg for e in self._entries]

    def predictions(self) -> list[Prediction]:
        """The scorer's prediction for every message, in order (computed once at ``add``)."""
        return [e.pred for e in self._entries]

    @property
    def total_tokens(self) -> int:
        """Tokens of the full history sent verbatim (the full-context cost), including reply priming."""
        return self._total_tokens + REPLY_PRIMING_TOKENS

    def __len__(self) -> int:
        return len(self._entries)

    def search(self, query: str, k: int = 5) -> list[dict[str, Any]]:
        """Search the session's archive (all original messages); returns hits with the original message."""
        hits = self.archive.search(self.session_id, query, k=k, query_embedding=self._embed_query(query))
        return [
            {"id": h.id, "turn": h.turn, "score": h.score, "message": self._entries[self._ids[h.id]].msg.to_openai()}
            for h in hits if h.id in self._ids
        ]

    def close(self) -> None:
        """Close the archive (a file-backed session can be resumed with the same arguments)."""
        self.archive.close()

    def __enter__(self) -> ContextManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
