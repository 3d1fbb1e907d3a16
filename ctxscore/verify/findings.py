"""What the context verifier reports: typed findings with the message ids and a suggested action."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class FindingKind(StrEnum):
    """What a :class:`Finding` is about."""

    GOAL_DRIFT = "goal_drift"  #: the assistant acts on a goal value no user turn gave (or one the user changed)
    CONSTRAINT_MISSING = "constraint_missing"  #: a hard constraint in force is not in the window
    CONSTRAINT_WEAKENED = "constraint_weakened"  #: a constraint is in the window without its negation or number
    CONSTRAINT_CONTRADICTED = "constraint_contradicted"  #: an action taken or proposed breaks a hard constraint
    TASK_STATE_INCONSISTENT = "task_state_inconsistent"  #: the assistant reports a state the tool results deny
    UNSUPPORTED_CONCLUSION = "unsupported_conclusion"  #: a conclusion's values have no evidence in the window
    STALE_FACT = "stale_fact"  #: a superseded value is shown while the current one is missing
    DUPLICATE_FACT = "duplicate_fact"  #: the same content is shown twice
    CONFLICTING_FACT = "conflicting_fact"  #: two values conflict (a profile item needs clarification)
    UNCONFIRMED_AS_CONFIRMED = "unconfirmed_as_confirmed"  #: a guess or an observation presented as the user's word


class Severity(StrEnum):
    """How bad a finding is."""

    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class Action(StrEnum):
    """What to do about a finding."""

    PAGE_IN = "page_in"  #: bring the named messages back into the window
    RE_PIN = "re_pin"  #: put the constraint back verbatim (pin it)
    ASK_USER = "ask_user"  #: ask the user before going on
    RECHECK = "recheck"  #: run the tool again / verify the state before reporting it
    DROP = "drop"  #: drop the repeated content


@dataclass(frozen=True, slots=True)
class Finding:
    """One finding of the verifier.

    Attributes:
        kind: the :class:`FindingKind`.
        severity: the :class:`Severity`.
        message: what is wrong and where, for people.
        ids: message ids: the offending message first, then the messages it is measured against.
        action: the suggested :class:`Action`.
        stage: ``"build"`` (the cheap checks of every build) or ``"check"`` (the fuller pass).
        details: the figures and values by name (values compared, the constraint sentence ...).
    """

    kind: FindingKind
    severity: Severity
    message: str
    ids: tuple[str, ...]
    action: Action
    stage: str = "build"
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str]:
        """``(kind, offending message id)``: the identity used to deduplicate and to score findings."""
        return str(self.kind), self.ids[0] if self.ids else ""

    def __str__(self) -> str:
        return f"[{self.severity}] {self.kind} ({', '.join(self.ids)}): {self.message} -> {self.action}"

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return {"kind": str(self.kind), "severity": str(self.severity), "message": self.message, "ids": list(self.ids),
                "action": str(self.action), "stage": self.stage, "details": dict(self.details)}
