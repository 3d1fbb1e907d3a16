"""Replaying conversation files through the layers (what ``ctxscore profile`` and ``ctxscore verify`` run).

:func:`replay_profile` feeds the sessions of one user, in order, to a :class:`~ctxscore.memory.profile.ProfileLayer`
on one store and consolidates at the end of each session. Files carry no timestamps, so the replay
clock puts session *k* of a user ``days_between * k`` days after the first and one minute between
messages (the duration term of the stability score reads it).

:func:`replay_verify` feeds one conversation message by message to a manager with the fact ledger,
a profile and the :class:`~ctxscore.verify.ContextVerifier`, builds a window before every assistant
message (the call that produced it) and once at the end, and returns every build's findings and the
verifier's full pass.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .config import Policy
from .errors import ConfigError
from .memory.ledger import FactLedger
from .memory.profile import ProfileLayer
from .store.sqlite import SQLiteStore
from .verify import ContextVerifier, Finding
from .window.manager import ContextManager

_DAY = 86400.0
_START = 1.7e9  # the replay clock's first instant (2023-11-14), seconds since the epoch


class ReplayClock:
    """A clock for replays: ``day`` days after the start, plus one minute per reading."""

    def __init__(self) -> None:
        self.day = 0
        self.ticks = 0

    def __call__(self) -> float:
        self.ticks += 1
        return _START + self.day * _DAY + 60.0 * self.ticks


@dataclass
class ProfileReplay:
    """The profile of one user after a replay: the layer (items, people) and the promotions made."""

    user: str
    sessions: list[str]
    layer: ProfileLayer
    promotions: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form: items (with stability terms and evidence), people, promotions."""
        state = self.layer.state()
        return {"user": self.user, "sessions": self.sessions, "items": list(state["items"].values()),
                "people": list(state["people"].values()), "promotions": self.promotions}


def replay_profile(user: str, sessions: Sequence[tuple[str, Sequence[dict[str, Any]]]], *, scorer: Any = "rules",
                   rules: Any = None, days_between: float = 1.0) -> ProfileReplay:
    """Replay ``(session id, messages)`` pairs of one user (module docstring) and return the profile.

    Args:
        user: the user id (the store scope ``user:<id>``).
        sessions: ``(session id, OpenAI-style messages)`` in the order the user had them.
        scorer, rules: as for :class:`~ctxscore.window.manager.ContextManager`.
        days_between: days between two sessions on the replay clock (the duration term reads it).

    Raises:
        ctxscore.errors.InputError: a malformed message (the manager's own check).
        ctxscore.errors.ConfigError: ``days_between`` is not a finite number 0 or more.
    """
    if isinstance(days_between, bool) or not isinstance(days_between, int | float) \
            or not math.isfinite(days_between) or days_between < 0:
        raise ConfigError(f"days_between must be a finite number of days, 0 or more, got {days_between!r}")
    store = SQLiteStore(":memory:")
    clock = ReplayClock()
    out = ProfileReplay(user, [s for s, _ in sessions], ProfileLayer(user, clock=clock))
    for k, (sid, messages) in enumerate(sessions):
        clock.day, clock.ticks = int(k * days_between), 0
        layer = ProfileLayer(user, clock=clock)
        cm = ContextManager(budget=1_000_000, scorer=scorer, rules=rules, store=store, session_id=sid, layers=[layer])
        for m in messages:
            cm.add(m)
        layer.end_session()
        out.promotions += layer.promotions  # at every task end of the session and at its end
        out.layer = layer
    return out


@dataclass
class BuildFindings:
    """The findings of one build: its number, the message it came before (``None`` at the end), the
    window's tokens and the findings."""

    build: int
    before: str | None
    tokens: int
    findings: list[Finding]


def replay_verify(messages: Sequence[dict[str, Any]], budget: int, *, scorer: Any = "auto", rules: Any = None,
                  encoding: str = "cl100k_base", policy: Policy | None = None, user: str = "default",
                  session_id: str = "verify") -> tuple[list[BuildFindings], list[Finding], ContextManager]:
    """Replay one conversation (module docstring).

    Args:
        messages: OpenAI-style messages; budget: tokens of each build (> 0); the rest as for
            :class:`~ctxscore.window.manager.ContextManager` (``user``: the profile's user id).

    Returns:
        ``(builds, full, manager)``: one :class:`BuildFindings` per build (before each assistant
        message, then one at the end), the verifier's full pass after the last message, and the
        manager (close it when done).
    """
    ledger = FactLedger()
    profile = ProfileLayer(user)
    verifier = ContextVerifier(ledger=ledger, profile=profile)
    cm = ContextManager(budget=budget, scorer=scorer, rules=rules, encoding=encoding, policy=policy,
                        session_id=session_id, layers=[ledger, profile, verifier])
    builds: list[BuildFindings] = []
    for m in _with_builds(messages):
        if m is None or m.get("role") == "assistant":
            w = cm.build()
            nxt = None if m is None else str(m.get("id") or f"m{len(cm)}")
            builds.append(BuildFindings(len(builds) + 1, nxt, w.tokens, list(w.findings)))
        if m is not None:
            cm.add(m)
    return builds, verifier.check(cm), cm


def _with_builds(messages: Sequence[dict[str, Any]]) -> Iterator[dict[str, Any] | None]:
    yield from messages
    yield None
