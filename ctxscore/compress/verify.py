"""The shared verifier: every compressor's output is checked the same way before it enters a window.

A compressed form passes when (1) every key span of the original occurs in it, byte-exact after
collapsing whitespace, (2) it invents no entity: every entity the rule patterns find in the output
occurs in the original, and (3) it is shorter than the original. A form that fails is never shown;
the caller falls back to a gentler tier (see :func:`ctxscore.compress.base.compress_verified`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..scoring.rules import RuleConfig, default_config, entity_spans
from ..scoring.spans import registered as registered_spans

_WS = re.compile(r"\s+")
_QUOTES = "\"'`“”「」《》‘’"


def _norm(text: str) -> str:
    return _WS.sub(" ", text)


def key_spans(text: str, config: RuleConfig | None = None, *, learned: bool = True) -> list[str]:
    """The spans of ``text`` a compressed form must keep: its entities (IDs, numbers with units,
    dates, times, names, paths ...; :func:`ctxscore.scoring.rules.entity_spans`), distinct, in order,
    surrounding quotes removed; then the spans of the registered learned key-span extractor
    (:func:`ctxscore.scoring.spans.register`; none by default, and the rules alone decide);
    ``learned=False`` gives the entities alone (what the check for invented entities reads)."""
    out: dict[str, None] = {}
    for a, b in entity_spans(text, config or default_config()):
        span = text[a:b].strip()
        span = span.strip(_QUOTES) or span
        if span:
            out.setdefault(span, None)
    extractor = registered_spans() if learned else None
    if extractor is not None:
        for span in extractor(text):
            if span and span.strip() and span in text:
                out.setdefault(span, None)
    return list(out)


@dataclass(frozen=True, slots=True)
class Verdict:
    """Outcome of :func:`verify`.

    Attributes:
        ok: the form may be shown.
        missing: key spans of the original absent from the form.
        invented: entities of the form that the original does not contain.
        longer: the form is not shorter than the original.
    """

    ok: bool
    missing: tuple[str, ...] = field(default=())
    invented: tuple[str, ...] = field(default=())
    longer: bool = False


def verify(original: str, form: str, spans: Sequence[str] | None = None,
           config: RuleConfig | None = None) -> Verdict:
    """Check a compressed ``form`` of ``original`` (see the module docstring).

    Args:
        original: the original text.
        form: the compressor's output.
        spans: the key spans to keep (default: :func:`key_spans` of the original).
        config: the rule file whose entity patterns detect invented entities (default: packaged).
    """
    cfg = config or default_config()
    want = key_spans(original, cfg) if spans is None else list(spans)
    norm_form, norm_orig = _norm(form), _norm(original)
    missing = tuple(s for s in want if _norm(s) not in norm_form)
    # a line that is a substring of the original cannot hold an invented entity: scan only the others
    novel = [line for line in form.split("\n") if line.strip() and _norm(line).strip() not in norm_orig]
    invented = tuple(s for s in key_spans("\n".join(novel), cfg, learned=False) if _norm(s) not in norm_orig) if novel else ()
    longer = len(form) >= len(original)
    return Verdict(ok=bool(form.strip()) and not missing and not invented and not longer,
                   missing=missing, invented=invented, longer=longer)
