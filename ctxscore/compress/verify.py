"""The shared verifier: every compressor's output is checked the same way before it enters a window.

A compressed form passes when (1) every key span of the original occurs in it, byte-exact after
collapsing whitespace, and not only inside a longer Latin word or number where the original has it
standing alone ("$5" is not kept by "$50", nor "May 2" by "May 20"), (2) every negation of the original (:func:`negation_spans`: "not allowed",
"never book", "don't want", "no garage", 不要, 没有 ...) occurs in it as a whole phrase, case aside,
(3) it invents no entity (every entity the rule patterns find in the output occurs in the original)
and no negation (a form that negates where the original negates nothing, in that language), and
(4) it is shorter than the original. A form that fails is never shown;
the caller falls back to a gentler tier (see :func:`ctxscore.compress.base.compress_verified`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from ..scoring.rules import SPAN_CACHE_CHARS, RuleConfig, casefold_text, default_config, entity_spans
from ..scoring.spans import registered as registered_spans

_WS = re.compile(r"\s+")
_QUOTES = "\"'`“”「」《》‘’"


def _norm(text: str) -> str:
    return _WS.sub(" ", text)


# A negation cue and the word after it (English), or a Chinese negation character and the one after
# it. Pleasantries and fillers ("no problem", "no worries", "nothing else") and transitions
# ("not only", 不过, 不但 ...) are not negations; 非常 / 无论 are not either.
_EN_NEG = re.compile(
    r"(?<![\w'’])(?!no (?:problem|problems|worries)\b|not only\b|nothing else\b)"
    r"(?P<cue>not|never|no|nor|none|nothing|nobody|neither|cannot|no longer"
    r"|(?:do|does|did|is|are|was|were|have|has|had|would|should|could|must|need)n[’']t|can[’']t|won[’']t)"
    r"(?![\w'’])(?:[ \t]+[A-Za-z0-9][\w-]*)?", re.IGNORECASE)
_ZH_NEG = re.compile(r"(?P<cue>不|没|别|勿|未|无|禁止)(?!过|但|仅|断|久|少|错|管|论|同|然|客气)[\u4e00-\u9fff]")


# _EN_NEG without IGNORECASE, run on the case-folded text (rules.casefold_text: same length, the
# same matches): about three times as fast. extractive._holding searches sentences joined by NUL with
# it: neither pattern may match across a NUL (no ".", "\W", "[^...]", "^" or "$" in them).
_EN_NEG_FOLDED = re.compile(_EN_NEG.pattern)


def negation_matches(text: str) -> tuple[tuple[int, int], ...]:
    """Character spans of the negations in ``text`` (:func:`negation_spans`): the English ones, then
    the Chinese ones, each in order. Memoised for texts up to
    :data:`ctxscore.scoring.rules.SPAN_CACHE_CHARS` characters (LRU of 512): a compaction reads the
    same original several times."""
    return _cached_negations(text) if len(text) <= SPAN_CACHE_CHARS else scan_negations(text)


def scan_negations(text: str) -> tuple[tuple[int, int], ...]:
    """:func:`negation_matches` without the memo (for a text read once)."""
    en = _EN_NEG_FOLDED.finditer(casefold_text(text))
    return tuple(m.span() for it in (en, _ZH_NEG.finditer(text)) for m in it)


_cached_negations = lru_cache(maxsize=512)(scan_negations)


def negation_spans(text: str) -> list[str]:
    """The negations of ``text`` a compressed form must keep: an English negation cue with the word
    after it ("not allowed", "never book", "don't want", "No" before a comma), or a Chinese negation
    character with the character after it (不要, 没有, 别用); distinct, in order of appearance."""
    out: dict[str, None] = {}
    for a, b in negation_matches(text):
        out.setdefault(_norm(text[a:b]), None)
    return list(out)


def _negated(text: str) -> set[str]:
    """The languages (``"en"``, ``"zh"``) in which ``text`` negates anything."""
    en = _EN_NEG_FOLDED.search(casefold_text(text))
    return {lang for lang, m in (("en", en), ("zh", _ZH_NEG.search(text))) if m}


_CONTRACTIONS = ((re.compile(r"\bcan(?:'t|not)\b"), "can not"), (re.compile(r"\bwon't\b"), "will not"),
                 (re.compile(r"(?<=\w)n't\b"), " not"))


def _neg_norm(text: str) -> str:
    """Lower case, one space, contractions spelled out ("don't" -> "do not", "cannot" -> "can not")."""
    t = _norm(text).lower().replace("’", "'")
    for rx, sub in _CONTRACTIONS:
        t = rx.sub(sub, t)
    return t


def _has_phrase(phrase: str, text: str, neg_text: str | None = None) -> bool:
    """``phrase`` occurs in ``text``: English as whole words, case, whitespace and contractions aside
    ("don't book" matches "do not book"); Chinese as is. ``neg_text``: ``_neg_norm(text)`` when the
    caller checks several phrases against one text (normalised once, not once per phrase)."""
    if _ZH_NEG.match(phrase):
        return phrase in text
    neg = _neg_norm(text) if neg_text is None else neg_text
    p = _neg_norm(phrase)
    if not p:  # what the regex below finds for an empty phrase: a position between two non-words
        return re.search(r"(?<![\w'])(?![\w'])", neg) is not None
    # an occurrence not inside a longer word: what (?<![\w'])phrase(?![\w']) finds, without compiling
    # a regex for every phrase (the engine's \w is str.isalnum() or "_")
    i = neg.find(p)
    while i >= 0:
        j = i + len(p)
        if not (i and _wordish(neg[i - 1])) and not (j < len(neg) and _wordish(neg[j])):
            return True
        i = neg.find(p, i + 1)
    return False


def _wordish(c: str) -> bool:
    return c.isalnum() or c in "_'"


def _ascii_alnum(c: str) -> bool:
    return c.isascii() and c.isalnum()


def _inside_token(text: str, i: int, j: int) -> bool:
    """``text[i:j]`` continues a longer Latin word or number on either side: a letter or digit
    touching its first or last letter or digit ("May 2" in "May 20", "10:1" in "10:15"), or a
    number going on past a decimal point or separator ("$5" in "$5.50" or "$5,000"). Chinese
    characters next to a value continue nothing."""
    if i > 0:
        a, b = text[i - 1], text[i]
        if _ascii_alnum(a) and _ascii_alnum(b) or b.isdigit() and a in ".,:" and i > 1 and text[i - 2].isdigit():
            return True
    if j < len(text):
        a, b = text[j - 1], text[j]
        if _ascii_alnum(a) and _ascii_alnum(b) or a.isdigit() and b in ".,:" and j + 1 < len(text) and text[j + 1].isdigit():
            return True
    return False


def _standalone(span: str, text: str) -> bool | None:
    """Whether some occurrence of ``span`` in ``text`` stands alone (:func:`_inside_token`); ``None``
    when it does not occur at all."""
    i = text.find(span)
    if i < 0:
        return None
    while i >= 0:
        if not _inside_token(text, i, i + len(span)):
            return True
        i = text.find(span, i + 1)
    return False


def _kept(span: str, form: str, original: str) -> bool:
    """``span`` (whitespace collapsed) is kept in ``form``: it occurs there, and standing alone
    wherever it stands alone in ``original``. "$5" is not kept by "$50", nor "May 2" by "May 20",
    when the original has both; a span that the original has only inside a longer token may be
    inside one in the form too."""
    found = _standalone(span, form)
    if found is None:
        return False
    return found or not _standalone(span, original)


def key_spans(text: str, config: RuleConfig | None = None, *, learned: bool = True,
              extractor: Callable[[str], Sequence[str]] | None = None) -> list[str]:
    """The spans of ``text`` a compressed form must keep: its entities (IDs, numbers with units,
    dates, times, names, paths ...; :func:`ctxscore.scoring.rules.entity_spans`), distinct, in order,
    surrounding quotes removed; then the spans of a learned key-span extractor: ``extractor``
    (``text -> spans``, e.g. :meth:`ctxscore.scoring.spans.SpanExtractor.key_spans`; what the
    context manager passes when its scorer has one) or else the registered one
    (:func:`ctxscore.scoring.spans.register`; none by default, and the rules alone decide); spans
    that do not occur in ``text`` are ignored. ``learned=False`` gives the entities alone (what the
    check for invented entities reads)."""
    out: dict[str, None] = {}
    for a, b in entity_spans(text, config or default_config()):
        span = text[a:b].strip()
        span = span.strip(_QUOTES) or span
        if span:
            out.setdefault(span, None)
    extractor = (extractor or registered_spans()) if learned else None
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
        missing: key spans and negations (:func:`negation_spans`) of the original absent from the form.
        invented: entities of the form that the original does not contain, and negations of the form
            where the original negates nothing (in that language).
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
    missing = tuple(s for s in want if not _kept(_norm(s), norm_form, norm_orig))
    negations = [s for s in negation_spans(original) if s not in missing]
    if negations:
        neg_form = _neg_norm(norm_form)
        missing += tuple(s for s in negations if not _has_phrase(s, norm_form, neg_form))
    # a line that is a substring of the original cannot hold an invented entity: scan only the others
    # (line by line: an entity never runs across a line break of a form, "price=11\npassengers: ..." is no "11 passengers")
    novel = [line for line in form.split("\n") if line.strip() and _norm(line).strip() not in norm_orig]
    invented: tuple[str, ...] = ()
    if novel:
        found = dict.fromkeys(s for line in novel for s in key_spans(line, cfg, learned=False))
        invented = tuple(s for s in found if _norm(s) not in norm_orig)
        invented += tuple(s for s in negation_spans("\n".join(novel)) if (_ZH_NEG.match(s) and "zh" or "en") not in _negated(original))
    longer = len(form) >= len(original)
    return Verdict(ok=bool(form.strip()) and not missing and not invented and not longer,
                   missing=missing, invented=invented, longer=longer)


def occurrences(text: str, spans: Sequence[str]) -> list[tuple[int, int]]:
    """Character spans ``(start, end)`` of every occurrence of each span in ``text``, overlapping
    ones included, in the order found (empty spans ignored)."""
    out = []
    for s in spans:
        if not s:
            continue
        start = text.find(s)
        while start >= 0:
            out.append((start, start + len(s)))
            start = text.find(s, start + 1)
    return out
