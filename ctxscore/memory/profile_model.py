"""The data of the user-profile memory: items, evidence, people, and the stability score.

See :mod:`ctxscore.memory.profile` for what the fields mean and how items move between levels.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import ConfigError

PROFILE_TYPES = ("basic", "goal", "ability", "preference", "decision", "relationship")
LEVELS = ("current_task", "session", "mid", "long")
SOURCES = ("explicit_statement", "inferred", "behaviour")
#: Confirmation term per kind of evidence.
CONFIRMATION = {"confirmed": 1.0, "explicit_statement": 0.6, "behaviour": 0.4, "inferred": 0.2}
_DAY = 86400.0


@dataclass(frozen=True)
class StabilityPolicy:
    """Weights, normalisations and promotion thresholds of the stability score (module docstring).

    Raises:
        ConfigError: a negative weight, a normalisation below its minimum, or ``mid > long``.
    """

    w_occurrences: float = 1.0
    w_duration: float = 1.0
    w_cross_scene: float = 1.0
    w_confirmation: float = 1.0
    occurrences_norm: int = 3
    duration_days: float = 30.0
    scenes_norm: int = 3
    mid: float = 1.5
    long: float = 2.5
    min_occurrences_mid: int = 2
    #: Sessions with evidence an item needs to reach ``mid`` / ``long``: a preference said and confirmed
    #: in one conversation is not yet a stable one, however often it was said there.
    min_sessions_mid: int = 2
    min_sessions_long: int = 3

    def __post_init__(self) -> None:
        if min(self.w_occurrences, self.w_duration, self.w_cross_scene, self.w_confirmation) < 0:
            raise ConfigError("stability weights must be >= 0")
        if self.occurrences_norm < 1 or self.scenes_norm < 2 or self.duration_days <= 0:
            raise ConfigError("occurrences_norm must be >= 1, scenes_norm >= 2 and duration_days > 0")
        if self.mid > self.long:
            raise ConfigError(f"the mid threshold {self.mid} is above the long one {self.long}")


@dataclass
class Evidence:
    """One message that supports a profile item.

    Attributes:
        session: the session id; message: the message id; turn: its position; task: its task number.
        scene: the kind of situation of its task (:func:`~ctxscore.memory.profile_extract.scene_of`).
        time: when it was read, seconds since the Unix epoch.
        quote: the sentence, byte-exact (at most 240 characters).
        kind: ``explicit_statement``, ``behaviour``, ``inferred`` or ``confirmed``.
    """

    session: str
    message: str
    turn: int
    task: int
    scene: str
    time: float
    quote: str = ""
    kind: str = "explicit_statement"


@dataclass
class ProfileItem:
    """One item of a user's profile (see the module docstring for the fields' meaning).

    ``key`` is ``type:attribute:subject`` (decisions: ``decision:<session>:<message>``); ``polarity``
    +1 likes / is, -1 avoids / is not, 0 neutral; ``status`` ``active``, ``needs_clarification``,
    ``superseded``, ``expired`` or ``retracted``; ``conflict`` names the other item and the evidence
    read again; ``compromise`` marks a decision made after turning options down.
    """

    key: str
    profile_type: str
    attribute: str
    value: str
    polarity: int = 0
    scope: str = "general"
    time_level: str = "session"
    source: str = "explicit_statement"
    evidence: list[Evidence] = field(default_factory=list)
    status: str = "active"
    conflict: dict[str, Any] | None = None
    compromise: bool = False
    stability: float = 0.0
    terms: dict[str, float] = field(default_factory=dict)
    promoted_at: str = ""  # the consolidation (``session#count``) that last changed its level

    @property
    def family(self) -> str:
        """``type:attribute`` (items of one family can conflict)."""
        return f"{self.profile_type}:{self.attribute}"

    @property
    def occurrences(self) -> int:
        """Distinct messages that support it."""
        return len({(e.session, e.message) for e in self.evidence})

    @property
    def scenes(self) -> list[str]:
        """Distinct scenes it was seen in (``general``, a text with no scene words, is none: a
        preference first said with no context and repeated in a trip was not two scenes)."""
        return sorted({e.scene for e in self.evidence} - {"general"})

    @property
    def sessions(self) -> int:
        """Distinct sessions that support it."""
        return len({e.session for e in self.evidence})

    @property
    def first_seen(self) -> float:
        """Seconds since the epoch of its first evidence (0 without evidence)."""
        return min((e.time for e in self.evidence), default=0.0)

    @property
    def last_seen(self) -> float:
        """Seconds since the epoch of its latest evidence."""
        return max((e.time for e in self.evidence), default=0.0)

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (what the store keeps), with the derived figures."""
        d = asdict(self)
        d.update(occurrences=self.occurrences, scenes=self.scenes, first_seen=self.first_seen, last_seen=self.last_seen)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ProfileItem:
        """The item of :meth:`to_dict` (derived figures are recomputed)."""
        keep = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        keep["evidence"] = [Evidence(**e) for e in d.get("evidence", [])]
        return cls(**keep)

    def describe(self) -> str:
        """``preference/seat: avoid window seat`` (polarity spelled out)."""
        sign = {1: "", -1: "avoid ", 0: ""}[self.polarity]
        return f"{self.profile_type}/{self.attribute}: {sign}{self.value}"


@dataclass
class Person:
    """Who a person is in the user's world: ``name`` (may be empty), ``relation`` (wife, boss, 老婆 ...),
    ``notes`` (what the user said about them, verbatim) and the evidence."""

    key: str
    name: str
    relation: str
    notes: list[str] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Person:
        """The person of :meth:`to_dict`."""
        return cls(d["key"], d.get("name", ""), d.get("relation", ""), list(d.get("notes", [])),
                   [Evidence(**e) for e in d.get("evidence", [])])


def stability(item: ProfileItem, policy: StabilityPolicy) -> tuple[float, dict[str, float]]:
    """The stability score of an item and its four terms, each in [0, 1] (module docstring)."""
    ev = item.evidence
    terms = {
        "occurrences": min(1.0, item.occurrences / policy.occurrences_norm),
        "duration": min(1.0, max(0.0, item.last_seen - item.first_seen) / (policy.duration_days * _DAY)),
        "cross_scene": min(1.0, max(0, len(item.scenes) - 1) / (policy.scenes_norm - 1)),
        "confirmation": max((CONFIRMATION.get(e.kind, 0.2) for e in ev), default=0.0),
    }
    score = (policy.w_occurrences * terms["occurrences"] + policy.w_duration * terms["duration"]
             + policy.w_cross_scene * terms["cross_scene"] + policy.w_confirmation * terms["confirmation"])
    return score, terms
