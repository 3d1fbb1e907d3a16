"""Typed configuration, validated once: the tier :class:`Policy` and the :class:`ValueFactors`.

Every figure that is a share of the token budget is a fraction in (0, 1]; turn counts are
conversational turns (a turn starts at each user message). Bad values raise
:class:`~ctxscore.errors.ConfigError` naming the field, the value and the accepted range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any

from .errors import ConfigError


class OnOverflow(StrEnum):
    """What :meth:`ContextManager.build` does when the window cannot get within the budget (pinned
    content alone exceeds it, or pinned content and the last turn, which are never archived)."""

    WARN = "warn"  #: return the window with a ``pinned_over_budget`` / ``over_budget`` warning that gives the figures
    RAISE = "raise"  #: raise :class:`~ctxscore.errors.BudgetError` (the build's tier changes are kept)


@dataclass(frozen=True, slots=True)
class Policy:
    """Tier policy parameters (fractions are of the token budget).

    Attributes:
        t_compact: occupancy at which failures are archived and reasoning compressed (0.6).
        t_structure: occupancy at which key_state is summarised and reasoning archived (0.7).
        t_archive: occupancy at which units are archived by ascending value (0.8, the high-water mark).
        low_water: occupancy that a value-ordered archive pass brings the window down to (0.6).
        recent_turns: the last K turns stay verbatim (3); 0 protects only the newest message.
        blend: weight of the learned value against the rule value, in [0, 1] (0.5).
        page_in_k: at most this many archived units are paged back in for a query (20; within the
            budget, so fewer when they do not fit); 0 turns page-in off. 20 is the smallest depth
            within 0.001 of the best recall with page-in on the dev sessions at 25% of the full
            context, over all probes and at the session's end (learned: 12: 0.9345 / 0.946, 16:
            0.9372 / 0.951, 20: 0.9388 / 0.957, 28: 0.9390 / 0.957; rules, 12 -> 20: 0.848 / 0.887 ->
            0.859 / 0.906, at 2k tokens 0.913 -> 0.926, at 4k 0.963 -> 0.972; superseded-value
            leakage 0.053 -> 0.050 learned, 0.067 -> 0.048 rules). At the end one question often
            asks for many facts ("Which hotel did the user settle on?" in a session of ten bookings),
            and 12 units could not hold their answers. The cost, with a query at every build (a proxy):
            the quotes follow the last message, so no prompt cache holds them, and more of them means
            fewer reused tokens (dev, rules, ``benchmarks/cache_reuse.py``: 2k 0.539 -> 0.500, an
            effective cost of 833 -> 904 tokens a build; 4k 0.684 -> 0.673, 1,040 -> 1,083); set 12
            where the prompt cache matters more. (12 was chosen before the digest and the learned
            ranker, on recall 0.873.)
        page_in_limit: paged-in originals may fill the window up to this fraction of the budget (1.0);
            to make room, the lowest-value evictable units are shown as stubs for that build only.
        page_in_digest: once the best hit is placed, the later quotes leave this fraction of the
            budget (0.1) to the digest: one line per further hit that is not quoted (up to
            ``page_in_k``), its key values only (:func:`~ctxscore.window.pagein.digest_line`), in the
            recalled note; 0 turns it off. On the dev sessions at 25% of the full context (learned)
            recall with page-in 0.924 -> 0.933 and at the session's end 0.931 -> 0.944,
            superseded-value leakage 0.050 -> 0.055 (at 0.05: 0.929 and 0.931). The cost: with a
            query at every build (the proxy), the later quotes have to leave units out or show them
            in place more often, so fewer window tokens repeat the previous window's prefix
            (held-out, rules: 2k 0.603 -> 0.518, 4k 0.743 -> 0.714; effective cost a build 8-16%
            higher; ``benchmarks/cache_reuse.py``); set 0 where the prompt cache matters more.
        page_in_floor: the relevance floor: a hit with no query term in it is paged in only when its
            embedding's cosine similarity to the query's is at least this (0.35), so nothing unrelated
            comes back; a hit under the floor comes only beside a placed hit, in the room left
            (within :data:`~ctxscore.window.pagein.CONTEXT_SPAN` messages of it, same task).
        page_in_rank_floor: with a learned page-in ranker, a hit under the similarity floor is paged
            in when the ranker's probability that it holds what the query asks for is at least this
            (0.3). The ranker reads the message's neighbours and task, which the cosine of the two
            texts does not ("为您推荐团城演武厅。" for "用户最终选定的景点叫什么名字？": cosine 0.12,
            ranker 0.91). 0.3 is the highest floor within 0.005 of the best recall with page-in on
            the dev sessions at 25% of the full context (none: 0.873, 0.5: 0.878, 0.3: 0.882,
            0.15: 0.884, 0.05: 0.886). 0 admits every hit the ranker ordered (the search's best
            :data:`~ctxscore.window.pagein.SEARCH_HITS`); without a ranker only the similarity floor
            and the query's terms decide.
        page_in_query_floor: a query that resembles nothing in the session (no search hit's cosine
            similarity reaches this, 0.3: "How do I bake sourdough bread?" in a restaurant-booking
            chat), and of whose hits a learned ranker is not sure (none at
            :data:`~ctxscore.window.pagein.QUERY_RANK_SURE`, 0.7), pages in only messages that hold
            one of its terms and that the ranker, when there is one, also puts at
            ``page_in_rank_floor`` or more. The ranker trained only on questions about their session
            put some message at 0.5-0.9 for any question: on the held-out sessions
            (``benchmarks/offtopic.py``, learned scorer, each session's end at a quarter of its
            context) the floor made an off-topic question page in 4.35 messages instead of 8.82 (any
            at all: 0.450 of them instead of 0.844); recall with page-in (held-out, learned) at 25%
            0.9355 -> 0.9339, 2k 0.9543 -> 0.9532 (without the ranker's say: 0.9319 and 0.9522, 3.34
            messages). The ranker shipped since 2026-12-07 also learned off-topic questions: 2.77
            messages (0.306 any; 7.52 without the floor).
            Ignored when the search had no query embedding.
        stub_fraction: archive stubs may use at most this fraction of the budget; older stubs are
            collapsed into one line (0.1; at most ``low_water``).
        max_compress_chars: longer messages (tool dumps, file listings) are not compressed, only
            archived when space is needed: extractive compression of such dumps rarely keeps every
            entity and its cost grows with the length (8,000 characters).
        on_overflow: :class:`OnOverflow` (``"warn"`` or ``"raise"``) when pinned content exceeds
            the budget.

    Raises:
        ConfigError: a value outside its range (the message names the field and the range).
    """

    t_compact: float = 0.6
    t_structure: float = 0.7
    t_archive: float = 0.8
    low_water: float = 0.6
    recent_turns: int = 3
    blend: float = 0.5
    page_in_k: int = 20
    page_in_limit: float = 1.0
    page_in_digest: float = 0.1
    page_in_floor: float = 0.35
    page_in_rank_floor: float = 0.3
    page_in_query_floor: float = 0.3
    max_compress_chars: int = 8000
    stub_fraction: float = 0.1
    on_overflow: OnOverflow = OnOverflow.WARN

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            want = {"int": int, "float": (int, float)}.get(str(f.type))
            if want is not None and (isinstance(v, bool) or not isinstance(v, want)):
                raise ConfigError(f"Policy.{f.name} must be a number ({f.type}), got {v!r}")
        if not 0 < self.t_compact <= self.t_structure <= self.t_archive <= 1:
            raise ConfigError(
                f"thresholds must satisfy 0 < t_compact <= t_structure <= t_archive <= 1, got "
                f"{self.t_compact}, {self.t_structure}, {self.t_archive}"
            )
        if not 0 < self.low_water <= self.t_archive:
            raise ConfigError(f"Policy.low_water must be in (0, t_archive={self.t_archive}], got {self.low_water}")
        if self.recent_turns < 0:
            raise ConfigError(f"Policy.recent_turns must be 0 or more, got {self.recent_turns}")
        if self.page_in_k < 0:
            raise ConfigError(f"Policy.page_in_k must be 0 (page-in off) or more, got {self.page_in_k}")
        if not self.low_water <= self.page_in_limit <= 1:
            raise ConfigError(f"Policy.page_in_limit must be in [low_water={self.low_water}, 1], got {self.page_in_limit}")
        if not 0 <= self.page_in_digest <= 0.5:
            raise ConfigError(f"Policy.page_in_digest must be a fraction of the budget in [0, 0.5] (0: no digest), got "
                              f"{self.page_in_digest}")
        if not -1 <= self.page_in_floor <= 1:
            raise ConfigError(f"Policy.page_in_floor must be a cosine similarity in [-1, 1], got {self.page_in_floor}")
        if not -1 <= self.page_in_query_floor <= 1:
            raise ConfigError(f"Policy.page_in_query_floor must be a cosine similarity in [-1, 1], got "
                              f"{self.page_in_query_floor}")
        if not 0 <= self.page_in_rank_floor <= 1:
            raise ConfigError(f"Policy.page_in_rank_floor must be a probability in [0, 1], got {self.page_in_rank_floor}")
        if not 0 <= self.blend <= 1:
            raise ConfigError(f"Policy.blend must be in [0, 1], got {self.blend}")
        if not 0 <= self.stub_fraction <= self.low_water:
            # above it, the stubs of what compaction archives keep the window over the low-water mark:
            # every build compacts again and the recent turns go too (1.0: 109 tokens of 1,500 used)
            raise ConfigError(f"Policy.stub_fraction must be in [0, low_water={self.low_water}], got "
                              f"{self.stub_fraction}: archive stubs above the low-water mark leave compaction no room "
                              "(with a low low_water, lower stub_fraction too; its default is 0.1)")
        if self.max_compress_chars < 1:
            raise ConfigError(f"Policy.max_compress_chars must be positive, got {self.max_compress_chars}")
        try:
            object.__setattr__(self, "on_overflow", OnOverflow(self.on_overflow))
        except ValueError:
            raise ConfigError(
                f"Policy.on_overflow must be one of {', '.join(o.value for o in OnOverflow)}, got {self.on_overflow!r}"
            ) from None


@dataclass(frozen=True, slots=True)
class ValueFactors:
    """Parameters of the value factors (the rule file's ``[factors]`` table).

    ``value = clip(intrinsic x recency x references x relevance, 0, 1)`` with
    ``intrinsic = blend x learned_value + (1 - blend) x base x entity_density x confirmation x token_cost``
    (see :mod:`ctxscore.window.value`).

    Attributes:
        recency_half_life_turns: turns after which the decaying part of recency halves (30).
        recency_floor: the share of value an old message keeps (0.6).
        recency_boost: scale of recency, so the newest message gets x1.0 (1.0).
        reference_step: ``references = 1 + step x min(later references, cap)`` (0.15) ...
        reference_cap: ... capped at this many references (4).
        entity_density_step: ``entity_density = 1 + step x min(entities per 50 tokens, 2)`` (0.25).
        confirmation_boost: factor of a message the user confirmed right after (1.3).
        token_cost_pivot: tokens above which ``token_cost = 1 / (1 + slope x log2(tokens / pivot))`` (400) ...
        token_cost_slope: ... with this slope (0.15).
        relevance_boost: ``relevance = 1 + (boost - 1) x normalised search score`` for the query (1.8).
    """

    recency_half_life_turns: float = 30.0
    recency_floor: float = 0.6
    recency_boost: float = 1.0
    reference_step: float = 0.15
    reference_cap: float = 4
    entity_density_step: float = 0.25
    confirmation_boost: float = 1.3
    token_cost_pivot: float = 400
    token_cost_slope: float = 0.15
    relevance_boost: float = 1.8

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                raise ConfigError(f"factors.{f.name} must be a finite non-negative number, got {v!r}"
                                  + ("; nan and inf are not values" if isinstance(v, float) and not math.isfinite(v) else ""))
        if self.recency_half_life_turns <= 0 or self.token_cost_pivot <= 0:
            raise ConfigError("factors.recency_half_life_turns and factors.token_cost_pivot must be positive")
        if self.recency_floor > 1:
            raise ConfigError(f"factors.recency_floor must be in [0, 1], got {self.recency_floor}")

    @classmethod
    def from_table(cls, table: dict[str, Any], where: str = "rule file") -> ValueFactors:
        """Validate a ``[factors]`` table; keys not set keep their defaults.

        Raises:
            ConfigError: an unknown key (a typo would otherwise silently keep the default) or a
                value out of range.
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(table) - known)
        if unknown:
            raise ConfigError(
                f"{where}: unknown key(s) in [factors]: {', '.join(unknown)}; known keys: {', '.join(sorted(known))}"
            )
        return cls(**{k: float(v) if isinstance(v, int | float) and not isinstance(v, bool) else v for k, v in table.items()})


def check_unicode(value: str, what: str) -> None:
    """Refuse an id holding a lone UTF-16 surrogate (it cannot be stored, logged or encoded).

    Raises:
        ConfigError: naming ``what``, the character and its position.
    """
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(f"{what} holds a lone surrogate {value[exc.start]!r} at character {exc.start}, which is not "
                          "valid Unicode text; remove the character") from None


def check_budget(budget: Any) -> int:
    """``budget`` if it is a positive whole number of tokens.

    Raises:
        ConfigError: anything else (booleans, floats, zero, negatives, strings).
    """
    if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
        raise ConfigError(f"budget must be a positive whole number of tokens, got {budget!r}")
    return budget
