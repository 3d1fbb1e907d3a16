"""Ingestion: validate new messages against the history, score them once, and turn stored rows into
history entries (new messages, resumed sessions and other writers' appends take the same path)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import date
from typing import Any

from ..errors import ConfigError, InputError
from ..memory.context_types import small_talk
from ..memory.facts import FactContext, extract_facts, session_date
from ..messages import CATEGORIES, Category, Message, Role
from ..scoring.base import Prediction, Scorer
from ..scoring.rules import RuleClassifier, extract_entities, hard_constraints, scan_text, typed_entity_spans
from ..store.base import NewRecord, StoredMessage
from ..tokens import TokenCounter
from . import supersede
from .history import History, Pin
from .tasks import starts_task
from .tiers import pin_reason
from .value import CONFIRM_SHORT, ValueModel

#: The start (characters) of each of the previous messages indexed as the search context of a
#: message (a booking reply is found by a question naming the venue asked for earlier) ...
CONTEXT_CHARS = 200
#: ... and how many previous messages.
CONTEXT_MESSAGES = 3
#: Tool output sent as a user message (mini-SWE-agent observations): no hard constraints are read in it.
_OBSERVATION = re.compile(r"\s*(?:<returncode>|<output)")
#: At most this many of a message's facts are indexed with it.
CONTEXT_FACTS = 12


@dataclass(frozen=True, slots=True)
class Scored:
    """A validated new message with its prediction and entities (not yet stored)."""

    msg: Message
    pred: Prediction
    entities: tuple[str, ...]


def validate(messages: Iterable[Any], history: History, start: int,
             where: Sequence[str] | None = None) -> list[Message]:
    """Validate new messages against the history: each is a valid message (:meth:`Message.from_dict`),
    explicit ids are unused, the tool calls of a message have distinct ids (a tool message answering
    a repeated id could belong to either call), and every tool message answers a call made before it.

    Args:
        messages: the new messages (dicts or :class:`Message`).
        history: the session so far.
        start: the position of the first new message (for error messages).
        where: how error messages name each new message (``"chat.jsonl: line 2"``); default
            ``"message N"`` by position.

    Raises:
        InputError: the first invalid message, named by its position; nothing is stored.
    """
    out: list[Message] = []
    seen: set[str] = set()
    calls: set[str] = set()
    for k, m in enumerate(messages):
        at = where[k] if where is not None else f"message {start + k}"
        msg = Message.from_dict(m, where=at)
        if msg.id is not None:
            if msg.id in history.ids or msg.id in seen:
                raise InputError(f"{at}: message id {msg.id!r} was already added; ids must be unique within a session")
            seen.add(msg.id)
        if msg.role == Role.TOOL and msg.tool_call_id not in history.call_owner and msg.tool_call_id not in calls:
            raise InputError(
                f"{at}: tool message answers tool_call_id {msg.tool_call_id!r}, but no earlier assistant message "
                "made that call; add the assistant message with its tool_calls first (chat.completions rejects "
                "a tool message without its call)"
            )
        _distinct_call_ids(msg, at)
        calls.update(c.id for c in msg.tool_calls)
        out.append(msg)
    return out


def _distinct_call_ids(msg: Message, at: str) -> None:
    """Refuse a message with two tool calls of one id, naming both calls."""
    first: dict[str, int] = {}
    for i, c in enumerate(msg.tool_calls):
        if c.id in first:
            raise InputError(f"{at}: tool_calls[{i}] repeats the id {c.id!r} of tool_calls[{first[c.id]}]; give every "
                             "call of a message its own id (a tool message's tool_call_id names one call)")
        first[c.id] = i


def score(scorer: Scorer, rules: RuleClassifier, msgs: Sequence[Message], start: int) -> list[Scored]:
    """Predict (one batch) and find the entities of new messages; ``start`` is the turn of the first.

    Raises:
        ConfigError: the scorer returned another number of predictions or an unknown category.
    """
    msgs = [replace(m, turn=start + i) for i, m in enumerate(msgs)]  # position features read the turn
    ents = [tuple(extract_entities(scan_text(m.text()), rules.config)) for m in msgs]
    if scorer is rules:  # the rule signals reuse the entity scan
        preds = [rules.predict_one(m, e) for m, e in zip(msgs, ents, strict=True)]
    else:
        preds = list(scorer.predict(msgs))
    if len(preds) != len(msgs):
        raise ConfigError(f"the scorer returned {len(preds)} predictions for {len(msgs)} messages; "
                          "Scorer.predict must return one Prediction per message, in order")
    for p in preds:
        if getattr(p, "category", None) not in CATEGORIES:
            raise ConfigError(f"the scorer returned category {getattr(p, 'category', p)!r}; expected one of {CATEGORIES}")
    return [Scored(m, p, e) for m, p, e in zip(msgs, preds, ents, strict=True)]


def records(scored: Sequence[Scored], history: History, rules: RuleClassifier) -> list[NewRecord]:
    """The store records of a batch of scored messages that follow ``history``, each with the index
    context it gets when added alone (the messages before it in the batch count as its previous
    messages and give it their date): ``extend`` and a loop of ``add`` index alike."""
    prev = [e.text for e in history.entries[-CONTEXT_MESSAGES:]]
    today = history.today
    out = []
    for s in scored:
        out.append(record(s, history, rules, prev[-CONTEXT_MESSAGES:], today))
        prev.append(s.msg.text())
        today = session_date(s.msg) or today
    return out


def record(s: Scored, history: History, rules: RuleClassifier, prev: Sequence[str], today: date | None) -> NewRecord:
    """The store record of a scored message. Its index context (searched with a lower weight than the
    text): the start of the previous messages (``prev``: the question it answers), its facts named
    by their slots (``pickup time 17:00``) and the session's date when one is known (the message's
    own, else ``today``)."""
    p = s.pred
    cfg = rules.config
    msg = replace(s.msg, turn=None)
    today = session_date(msg) or today
    facts = extract_facts(msg, history.task_no, FactContext(cfg, today=today, spans=lambda t: typed_entity_spans(t, cfg)))
    context = "\n".join([*(t[:CONTEXT_CHARS] for t in prev),
                         "; ".join(f"{f.slot} {f.value}" for f in facts[:CONTEXT_FACTS]),
                         f"date {today.isoformat()}" if today else ""]).strip()
    return NewRecord(message=msg, text=s.msg.text(),
                     prediction={"category": p.category, "probs": p.probs, "value": p.value, "source": p.source,
                                 "signals": p.signals},
                     embedding=p.embedding, context=context)


def stored_prediction(row: StoredMessage) -> Prediction:
    """The prediction stored with a row (a row without one counts as ``reasoning``)."""
    p = row.prediction or {}
    return Prediction(category=p.get("category", Category.REASONING), probs=p.get("probs", {}), value=p.get("value"),
                      source=p.get("source", "rules"), signals=p.get("signals", {}), embedding=row.embedding)


#: The opening user message of a task is pinned up to this many characters (the hard-constraint
#: sentences' cap): a 400-line build log pasted first was pinned whole and pushed a 2,000-token window to 2,929.
OPENER_MAX_CHARS = 4000


def append(history: History, values: ValueModel, rules: RuleClassifier, counter: TokenCounter,
           msg: Message, pred: Prediction, entities: tuple[str, ...] | None = None) -> None:
    """Append a stored message (``id`` and ``turn`` set) to the history and update the values."""
    if msg.turn != len(history):
        raise InputError(f"message {msg.id!r} has turn {msg.turn}, but the history has {len(history)} messages")
    if entities is None:
        entities = tuple(extract_entities(scan_text(msg.text()), rules.config))
    cfg = rules.config
    if starts_task(history, msg, cfg):
        history.start_task()
    day = session_date(msg)
    if day is not None:  # the date this message gives governs the messages after it
        history.today, history.date_source = day, len(history)
    observation = msg.role == Role.USER and _OBSERVATION.match(msg.content) is not None  # tool output in a user turn
    constraints = (hard_constraints(msg.content, cfg) if msg.role in (Role.USER, Role.SYSTEM) and not observation
                   and len(msg.content) <= 4000 else ())
    pin = pin_reason(msg, pred, entities, cfg)
    if msg.role == Role.USER and not observation and not history.task_opened and not small_talk(msg.content):
        history.task_opened = True  # the active task's opener states it: pinned whatever its category, when
        if pin is None and len(msg.content) <= OPENER_MAX_CHARS:  # short enough (a pasted log is no statement
            pin = Pin.INSTRUCTION  # to keep whole for the task); a greeting before it opens nothing
    e = history.append(msg, msg.text(), counter.count_message(msg), pred, entities, pin, constraints)
    e.values = supersede.typed_values(msg, cfg)
    supersede.link(history, cfg)  # the earlier messages this one restates get it as their successor
    # only a short user message confirms; a long one is not searched (0.8 ms on a 10 KB tool output)
    confirms = (msg.role == Role.USER and len(msg.content) <= CONFIRM_SHORT
                and rules.config.keyword_regexes["confirmation"].search(msg.content) is not None)
    values.added(history, len(history) - 1, confirms)
