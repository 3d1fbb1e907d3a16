"""Deterministic train / dev / test assignment by session group.

A group is the unit that must not straddle splits: a tau-bench task across its trials, a
dialogue, a SWE-bench instance, a bundled session. The split is a pure function of the group name
(SHA-1 of ``"ctxscore-split:" + group``, first 8 hex digits read as a fraction of 2**32), so it
does not depend on what else is in the build, on the order of loading or on the machine.
"""

from __future__ import annotations

import hashlib

SPLITS: tuple[str, ...] = ("train", "dev", "test")
#: Default fractions of groups in train / dev / test.
DEFAULT_FRACTIONS: tuple[float, float, float] = (0.70, 0.15, 0.15)


def unit_hash(key: str, salt: str = "ctxscore-split") -> float:
    """A stable number in [0, 1) for ``key`` (SHA-1 based)."""
    digest = hashlib.sha1(f"{salt}:{key}".encode()).hexdigest()
    return int(digest[:8], 16) / 2**32


def split_of(group: str, fractions: tuple[float, float, float] = DEFAULT_FRACTIONS) -> str:
    """``"train"``, ``"dev"`` or ``"test"`` for a group name.

    Raises:
        ValueError: fractions that are negative or do not sum to 1.
    """
    if any(f < 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-9:
        raise ValueError(f"split fractions must be non-negative and sum to 1, got {fractions}")
    h = unit_hash(group)
    if h < fractions[0]:
        return "train"
    if h < fractions[0] + fractions[1]:
        return "dev"
    return "test"


def assign_few(groups: list[str], fractions: tuple[float, float, float] = DEFAULT_FRACTIONS) -> dict[str, str]:
    """Split assignment for a source with few groups (the bundled set: a handful of scenario
    families), where hashing alone can leave dev or test empty.

    Groups are ordered by :func:`unit_hash`; with three or more groups the first
    ``max(1, round(test_fraction * n))`` go to test, the next ``max(1, round(dev_fraction * n))``
    to dev and the rest to train; with fewer, all go to train. Deterministic for a given set of
    groups (adding a group can move others).
    """
    ordered = sorted(set(groups), key=lambda g: (unit_hash(g), g))
    n = len(ordered)
    n_test = max(1, round(fractions[2] * n)) if n >= 3 else 0
    n_dev = max(1, round(fractions[1] * n)) if n >= 3 else 0
    out = {}
    for i, g in enumerate(ordered):
        out[g] = "test" if i < n_test else "dev" if i < n_test + n_dev else "train"
    return out
