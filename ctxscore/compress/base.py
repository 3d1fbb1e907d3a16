"""The Compressor protocol and :func:`compress_verified`, the one way a compressed form is made.

A compressor proposes a form of a message's text for a tier (``structured`` or ``compressed``);
:func:`compress_verified` checks it with the shared verifier (:mod:`ctxscore.compress.verify`) and
falls back to the next gentler tier when it fails (compressed -> structured -> verbatim). Any
compressor -- the extractive one here, an LLM one (``ctxscore.llm``) -- goes through it, so every
form in a window passed the same checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from ..messages import Tier
from ..scoring.rules import RuleConfig, default_config
from .verify import key_spans, verify

#: The tiers a compressor produces, strongest first.
COMPRESSING_TIERS: tuple[Tier, ...] = (Tier.COMPRESSED, Tier.STRUCTURED)


@runtime_checkable
class Compressor(Protocol):
    """Proposes compressed forms of a message's text.

    ``compress(text, tier)`` returns the form of ``text`` for ``tier`` (``Tier.STRUCTURED`` or
    ``Tier.COMPRESSED``), or ``None`` when it has none (an LLM compressor whose summary is not
    ready yet). It must not raise on any text; the form is verified by the caller.

    A compressor whose class sets ``keeps_spans = True`` is called as ``compress(text, tier,
    spans=...)`` with the key spans the verifier will ask for, so that it can keep them
    (:class:`~ctxscore.compress.extractive.ExtractiveCompressor` keeps the sentences holding them).
    """

    def compress(self, text: str, tier: Tier) -> str | None: ...


@dataclass(frozen=True, slots=True)
class CompressionResult:
    """Outcome of :func:`compress_verified`.

    Attributes:
        tier: the tier actually reached (may be gentler than requested).
        text: the content to place in the window (the original when ``tier`` is verbatim).
        missing: key spans of the original absent from the rejected stronger form(s).
        invented: entities the rejected form(s) made up.
        pending: the compressor had no form yet for any tier (an asynchronous compressor); ask again later.
    """

    tier: Tier
    text: str
    missing: tuple[str, ...] = field(default=())
    invented: tuple[str, ...] = field(default=())
    pending: bool = False


def compress_verified(compressor: Compressor, text: str, tier: Tier | str, *,
                      spans: Sequence[str] | None = None, config: RuleConfig | None = None) -> CompressionResult:
    """The verified form of ``text`` for ``tier``, or the gentlest tier that passes.

    Args:
        compressor: proposes the forms.
        text: the original content.
        tier: ``"structured"`` or ``"compressed"``.
        spans: key spans to keep (default: the original's entities, :func:`~ctxscore.compress.verify.key_spans`);
            given to the compressor too when it keeps spans (``keeps_spans``).
        config: rule file (default: packaged).

    Raises:
        ValueError: ``tier`` is not one of the two compressing tiers.
    """
    tier = Tier(tier)
    if tier not in COMPRESSING_TIERS:
        raise ValueError(f"compress_verified() takes tier 'structured' or 'compressed', got {tier!r}")
    cfg = config or default_config()
    want = key_spans(text, cfg) if spans is None else list(spans)
    missing: list[str] = []
    invented: list[str] = []
    proposed = False
    keeps = bool(getattr(compressor, "keeps_spans", False))
    for t in COMPRESSING_TIERS[COMPRESSING_TIERS.index(tier):]:
        form = compressor.compress(text, t, spans=want) if keeps else compressor.compress(text, t)
        if form is None:
            continue
        proposed = True
        verdict = verify(text, form, want, cfg)
        if verdict.ok:
            return CompressionResult(t, form, tuple(missing), tuple(invented))
        missing += [m for m in verdict.missing if m not in missing]
        invented += [m for m in verdict.invented if m not in invented]
    return CompressionResult(Tier.VERBATIM, text, tuple(missing), tuple(invented), pending=not proposed)
