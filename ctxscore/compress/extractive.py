"""Extractive compressors (no LLM): structured summary, aggressive compression, archive stub.

- :func:`structured_summary` (tier ``structured``, for ``key_state``): JSON tool output becomes compact
  ``key=value`` lines (a number, a boolean or a lowercase status word keeps its JSON pair as written,
  ``"amount": 209``, ``"insurance": "yes"``: a bare ``209`` or ``yes`` says nothing); prose keeps only
  the sentences that carry an entity (ID, number with unit, date, time, name, address, path ...), a
  decision / confirmation / constraint word, a negation or one of the key spans it is given.
- :func:`aggressive_compress` (tier ``compressed``, for ``reasoning``): keeps the first sentence
  (the goal), the sentences with a conclusion marker, the sentences holding a given key span or a
  negation, and the last sentence; drops exploration.
- :func:`archive_stub` (tier ``archived``): ``[archived <id>: <first words> …]``.

Code (:func:`code_like`) and unified diffs get whole lines in both forms, byte-exact with their
indentation and ``…`` where lines were left out (code its sentences instead when the lines cost much
more, :data:`CODE_FORM_SHARE`); a diff keeps its file and hunk headers, and a change whose removed
line it keeps keeps the added lines that replace it, so the form never reads as another patch.

The first two take the key spans the verifier will ask for (``keep``; :class:`ExtractiveCompressor`
passes them, see :func:`~ctxscore.compress.base.compress_verified`) and keep each byte-exact: a
sentence that holds (part of) a key span is kept whole, and leading filler is removed only where it
holds none.

Values are kept byte-exact: JSON numbers keep their original spelling (``12.50``, ``1e3``),
literals keep JSON's (``true``, ``false``), and filler is removed only as whole words ("Okay, ..."
but never "Okayama"). :class:`ExtractiveCompressor` is the default :class:`~ctxscore.compress.base.Compressor`;
:func:`compress` is its verified form (:func:`~ctxscore.compress.base.compress_verified`).
"""

from __future__ import annotations

import bisect
import itertools
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from ..messages import Tier
from ..scoring.rules import RuleConfig, default_config, entity_spans
from .base import CompressionResult, compress_verified
from .blocks import diff_lines
from .verify import key_spans, negation_matches, occurrences, scan_negations

_SENT_SPLIT = re.compile(r"(?<=[.!?。！？；;])\s+|(?<=[。！？；])|\n+")
# Filler words at the start of a sentence, removed only as whole words: an ASCII word must not be
# followed by a letter or digit ("Okayama", "Thanksgiving" stay whole), a Chinese one must be
# followed by punctuation or a space.
_LEAD_FILLER = re.compile(
    r"^(?:(?:(?:sure|great|okay|ok|alright|certainly|of course|absolutely|perfect|thanks|thank you|got it)"
    r"(?![\w])|(?:好的|好|嗯|收到)(?=[,!.，！。\s]|$))[,!.，！。\s]*)+",
    re.IGNORECASE,
)
#: JSON nested deeper than this is summarised as text, not flattened.
MAX_JSON_DEPTH = 32
_WS = re.compile(r"[ \t]+")


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENT_SPLIT.split(text) if s and s.strip()]


#: A JSON string value that is a status word (``yes``, ``available``, ``basic_economy``): kept with its key.
_STATUS = re.compile(r"[a-z][a-z_ ]{0,23}")


def _keep_intervals(text: str, keep: Sequence[str] | None) -> list[tuple[int, int]]:
    """Character spans of every occurrence of each ``keep`` string and of every negation in ``text``."""
    out = list(negation_matches(text))
    return sorted(out + occurrences(text, list(dict.fromkeys(keep or ()))))


class _Raw(str):
    """A JSON number kept as the text it was written as (``12.50`` stays ``12.50``)."""


class _TooDeep(Exception):
    pass


def _scalar(v: Any) -> str:
    """A JSON scalar as JSON spells it: numbers as written, ``true`` / ``false``, strings as they are."""
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _pair(key: str, v: Any, text: str, wanted: frozenset[str]) -> str | None:
    """The member ``"key": value`` as ``text`` writes it, when it is to be kept as a pair: the value
    is a number, a boolean or a status word (:data:`_STATUS`), or the pair is a wanted key span."""
    if isinstance(v, bool):
        enc = "true" if v else "false"
    elif isinstance(v, _Raw):
        enc = str(v)
    elif isinstance(v, str):
        enc = json.dumps(v, ensure_ascii=False)
    else:
        return None
    ambiguous = not isinstance(v, str) or isinstance(v, _Raw) or _STATUS.fullmatch(v) is not None
    k = json.dumps(str(key), ensure_ascii=False)
    for cand in (f"{k}: {enc}", f"{k}:{enc}"):
        if (ambiguous or cand in wanted) and cand in text:
            return cand
    return None


def _flatten_json(obj: object, prefix: str = "", depth: int = 0, text: str = "",
                  wanted: frozenset[str] = frozenset()) -> list[str]:
    """``key=value`` lines for the scalar leaves of a JSON value; nulls and empty values dropped. With
    the original ``text``, a leaf that :func:`_pair` keeps is written as its JSON pair instead.

    Raises:
        _TooDeep: nesting deeper than :data:`MAX_JSON_DEPTH`.
    """
    if depth > MAX_JSON_DEPTH:
        raise _TooDeep
    out: list[str] = []
    head = prefix.rstrip(".") + ": " if prefix else ""
    if isinstance(obj, dict):
        scalars = []
        for k, v in obj.items():
            if v is None or v == "" or v == [] or v == {}:
                continue
            if isinstance(v, dict | list):
                out.extend(_flatten_json(v, f"{prefix}{k}.", depth + 1, text, wanted))
            else:
                scalars.append((_pair(k, v, text, wanted) if text else None) or f"{k}={_scalar(v)}")
        if scalars:
            out.insert(0, head + "; ".join(scalars))
    elif isinstance(obj, list):
        if all(not isinstance(v, dict | list) for v in obj):
            vals = [_scalar(v) for v in obj if v is not None and v != ""]
            if vals:
                out.append(head + ", ".join(vals))
        else:
            for i, v in enumerate(obj):
                out.extend(_flatten_json(v, f"{prefix}{i}.", depth + 1, text, wanted))
    elif obj is not None and obj != "":
        out.append(head + _scalar(obj))
    return out


#: A flattened JSON line repeating an earlier one's values is written as a reference when they are this long.
DEDUPE_MIN_CHARS = 24


def _dedupe(lines: list[str]) -> list[str]:
    """``path: values`` lines whose values repeat an earlier line's (a search result listing the same
    leg twice) written as ``path: same as <earlier path>``."""
    first: dict[str, str] = {}
    out = []
    for line in lines:
        head, sep, body = line.partition(": ")
        if sep and len(body) >= DEDUPE_MIN_CHARS and " " not in head and not head.startswith('"'):
            if body in first:
                out.append(f"{head}: same as {first[body]}")
                continue
            first[body] = head
        out.append(line)
    return out


def _parse_json(text: str) -> object | None:
    """The JSON value of ``text`` with numbers kept as written, or ``None`` (not JSON, or too deep to parse)."""
    t = text.strip()
    if not t or t[0] not in "[{":
        return None
    try:
        return json.loads(t, parse_float=_Raw, parse_int=_Raw, parse_constant=_Raw)
    except (ValueError, RecursionError):
        return None


def structured_summary(text: str, config: RuleConfig | None = None, spans: list[tuple[int, int]] | None = None,
                       keep: Sequence[str] | None = None) -> str:
    """Structured summary of a ``key_state`` message.

    Args:
        text: the message content.
        config: rule file for entity patterns and keywords (default: the packaged one).
        spans: the text's entity spans if already computed (:func:`ctxscore.rules.entity_spans`).
        keep: key spans (substrings of ``text``) the summary must hold byte-exact (the sentences, or
            lines of code, holding them are kept whole); spans that do not occur in ``text`` are ignored.

    Returns:
        For JSON content, ``key=value`` lines of its non-empty leaves (nested keys joined with ``.``;
        numbers, booleans and status words as their JSON pair, ``"amount": 209``; a line repeating
        an earlier line's values as ``path: same as <earlier path>``); otherwise the
        sentences that carry an entity, a decision / confirmation / constraint word, a negation or a
        ``keep`` span, one per line with leading filler ("Sure, ...", "好的，") removed where it
        holds no key span; for a unified diff, and for code (:func:`code_like`) while it costs at
        most :data:`CODE_FORM_SHARE` times the sentences, the lines that hold them instead, whole
        (:func:`_code_lines`). Empty if nothing qualifies.
    """
    cfg = config or default_config()
    data = _parse_json(text)
    if data is not None:
        try:
            wanted = frozenset(k for k in keep or () if k.startswith('"'))
            return "\n".join(_dedupe(_flatten_json(data, text=text, wanted=wanted)))
        except _TooDeep:
            pass  # summarised as text below
    kw = cfg.keyword_regexes
    keep_rx = [kw[g] for g in ("decision", "confirmation", "constraint", "hard_constraint") if g in kw]
    starts = [s for s, _ in (entity_spans(text, cfg) if spans is None else spans)]
    held = _keep_intervals(text, keep)  # sorted by start
    kinds = diff_lines(text)
    if _mostly_diff(text, kinds):  # a diff's sentences are no summary of it: whole lines, hunks kept whole
        return _code_lines(text, starts, held, keep_rx, kinds)
    prose = _sentence_lines(text, starts, held, keep_rx)
    if kinds or code_like(text):  # whole lines, unless they cost much more than the sentences (or the
        form = _code_lines(text, starts, held, keep_rx, kinds)  # sentences keep a removed line of a
        if len(form) <= CODE_FORM_SHARE * len(prose) or _keeps_removed(prose, text, kinds):  # patch
            return form  # without the added lines that replace it)
    return prose


def _sentence_lines(text: str, starts: Sequence[int], held: Sequence[tuple[int, int]],
                    keep_rx: Sequence[re.Pattern[str]]) -> str:
    """The sentences of ``text`` that hold an entity (``starts``), a held span or a kept keyword, one
    per line, leading filler removed where it holds no held span (:func:`structured_summary`)."""
    lines = []
    pos = 0
    j = k = 0
    active: list[tuple[int, int]] = []  # the held intervals begun before this sentence's end, in order
    for m in _SENT_SPLIT.finditer(text + "\n"):
        lo, hi = pos, m.start()
        pos = m.end()
        sent = text[lo:hi].strip()
        if not sent:
            continue
        while j < len(starts) and starts[j] < lo:
            j += 1
        has_entity = j < len(starts) and starts[j] < hi
        while k < len(held) and held[k][0] < hi:
            active.append(held[k])
            k += 1
        active = [(a, b) for a, b in active if b > lo]  # sentences only move on: an ended one stays out
        holds = [text[a:b] for a, b in active]
        if has_entity or holds or any(rx.search(sent) for rx in keep_rx):
            bare = _LEAD_FILLER.sub("", sent).strip()
            if bare and all(h in bare for h in holds if h in sent):
                sent = bare
            lines.append(_WS.sub(" ", sent))
    return "\n".join(lines)


#: Text whose non-empty lines start with a space or a tab at least this often is code (or a listing):
#: its summary keeps whole lines, indentation included, instead of sentences.
CODE_INDENTED_SHARE = 0.25
#: The whole-line summary of code is used when it is at most this many times as long as the sentence
#: summary (which strips indentation and keeps only the sentences of a comment that hold a value);
#: else the sentences, as for prose (a diff keeps whole lines at any cost: its sentences read as
#: another patch). The compressed form of code (:func:`aggressive_compress`) is chosen the same way.
#: The cost, measured: on the held-out mini-SWE-agent sessions at 2,000 tokens (rules scorer, a build
#: per message), 30 of 1,375 windows over the budget against 24 with sentence summaries (the
#: compacted recent turns are larger; at 1.0, 24, but a 2,333-character read of
#: django/forms/fields.py is shown cut into sentences again); the compressed forms as whole lines
#: too, 67 against 64 before them (a later run, on later code).
CODE_FORM_SHARE = 1.5


def code_like(text: str) -> bool:
    """Whether ``text`` reads as code or a listing: four or more non-empty lines, at least
    :data:`CODE_INDENTED_SHARE` of them indented (a reply with one fenced command in its prose is
    prose)."""
    lines = [line for line in text.split("\n") if line.strip()]
    return len(lines) >= 4 and sum(line[:1] in " \t" for line in lines) >= CODE_INDENTED_SHARE * len(lines)


def _code_lines(text: str, starts: Sequence[int], held: Sequence[tuple[int, int]],
                keep_rx: Sequence[re.Pattern[str]], kinds: dict[int, str], ends: bool = False) -> str:
    """The whole-line form of code (:func:`code_like`) or of a diff (``kinds``: its lines,
    :func:`~ctxscore.compress.blocks.diff_lines`): the lines that hold an entity, a held span or a
    kept keyword (and, with ``ends``, the first and the last line), byte-exact with their indentation
    less the indentation they all share (a comment keeps its ``#``), and ``…`` where lines were left
    out between them. A diff keeps its file and hunk headers, and the added lines of a change whose
    removed line it keeps (:func:`_close_changes`). A sentence split read such text as prose: it cut
    comments into pieces and stripped the indentation, so the summary read as other code (and a
    patch that replaces a line as one that deletes it)."""
    lines = text.split("\n")
    offsets = list(itertools.accumulate((len(line) + 1 for line in lines[:-1]), initial=0))
    picks = [False] * len(lines)
    for a, b in held:  # the lines each held span reaches (one bisect a span, not a scan of the spans a line)
        n = bisect.bisect_right(offsets, a) - 1
        n += a >= offsets[n] + len(lines[n])  # a span that starts at a line break begins on the next line
        while n < len(lines) and offsets[n] < b:
            picks[n] = True
            n += 1
    for n, line in enumerate(lines):
        lo = offsets[n]
        i = bisect.bisect_left(starts, lo)
        picks[n] = bool(line.strip()) and (picks[n] or (i < len(starts) and starts[i] < lo + len(line))
                                           or any(rx.search(line) for rx in keep_rx))
    if ends:
        full = [n for n, line in enumerate(lines) if line.strip()]
        for n in full[:1] + full[-1:]:
            picks[n] = True
    if kinds:
        _close_changes(lines, picks, kinds)
    out: list[str] = []
    skipped = False
    for line, keep in zip(lines, picks, strict=True):
        if keep:
            if skipped and out:
                out.append("…")
            out.append(line)
            skipped = False
        else:
            skipped = skipped or bool(line.strip())
    indent = min((len(x) - len(x.lstrip(" \t")) for x in out if x != "…"), default=0)
    return "\n".join(x[indent:] if x != "…" else x for x in out)  # relative indentation kept


def _close_changes(lines: list[str], picks: list[bool], kinds: dict[int, str]) -> None:
    """Marks in ``picks`` the file and hunk header lines of a diff (``kinds`` by line offset), and
    every added line of a change (a run of removed and added lines) one of whose removed lines is
    marked: a removed line shown without the lines that replace it reads as a deletion."""
    change: list[int] = []
    removed = False
    pos = 0
    for n, line in enumerate(lines + [""]):  # the sentinel ends the last change
        kind = kinds.get(pos, "")
        pos += len(line) + 1
        if kind in ("-", "+", "\\"):
            change.append(n)
            removed = removed or (kind == "-" and picks[n])
            continue
        if removed:
            for c in change:
                picks[c] = picks[c] or lines[c][:1] == "+"
        change, removed = [], False
        if kind in ("F", "@"):
            picks[n] = True


def aggressive_compress(text: str, config: RuleConfig | None = None, max_sentences: int = 6,
                        keep: Sequence[str] | None = None) -> str:
    """Aggressive extractive compression of a ``reasoning`` message.

    Keeps the first sentence, sentences with a conclusion marker (the rule file's ``conclusion``
    keywords: "so", "therefore", "the issue is", 所以, 因此 ...) and the last sentence, at most
    ``max_sentences`` in all (the earliest conclusions are dropped first), and beyond that cap every
    sentence holding a ``keep`` span (key spans to keep byte-exact) or a negation; code blocks are dropped.
    Code (:func:`code_like`) and diffs keep whole lines instead, as in :func:`structured_summary`: the
    first and the last line and those with a conclusion marker, a ``keep`` span or a negation, with
    their indentation and ``…`` between them; a diff its headers and the added lines of a change
    whose removed line it keeps; code its sentences when the lines cost more than
    :data:`CODE_FORM_SHARE` times as much.
    """
    cfg = config or default_config()
    body = re.sub(r"```.*?```", " ", text, flags=re.DOTALL)
    concl = cfg.keyword_regexes.get("conclusion")
    kinds = diff_lines(body)
    form = None
    if kinds or code_like(body):
        form = _code_lines(body, (), _keep_intervals(body, keep), [concl] if concl else [], kinds, ends=True)
        if _mostly_diff(body, kinds):
            return form
    sents = _sentences(body)
    if len(sents) <= 2:
        prose = "\n".join(sents)
    else:
        middle = [i for i in range(1, len(sents) - 1) if concl is not None and concl.search(sents[i])]
        budget = max(0, max_sentences - 2)
        chosen = set(middle[-budget:] if budget else [])
        wanted = [k for k in dict.fromkeys(keep or ()) if k]
        chosen |= {i for i in _holding(sents, wanted) if 0 < i < len(sents) - 1}
        prose = "\n".join([sents[0], *(sents[i] for i in sorted(chosen)), sents[-1]])
    return form if form is not None and len(form) <= CODE_FORM_SHARE * len(prose) else prose


def _holding(sents: list[str], wanted: Sequence[str]) -> set[int]:
    """Indices of the sentences that hold a negation or one of ``wanted`` (substrings): one search
    of the sentences joined by NUL, which no negation match and no span without a NUL runs across,
    instead of one search per sentence and span."""
    joined = "\x00".join(sents)
    starts = [0]
    for sent in sents[:-1]:
        starts.append(starts[-1] + len(sent) + 1)

    def at(pos: int) -> int:
        return bisect.bisect_right(starts, pos) - 1

    out = {at(a) for a, _ in scan_negations(joined)}  # the joined text is read once
    for k in wanted:
        if "\x00" in k:
            out.update(i for i, sent in enumerate(sents) if k in sent)
            continue
        p = joined.find(k)
        while p >= 0:
            i = at(p)
            out.add(i)
            p = joined.find(k, starts[i + 1]) if i + 1 < len(starts) else -1
    return out


def _keeps_removed(form: str, text: str, kinds: dict[int, str]) -> bool:
    """Whether ``form`` holds a removed line of a diff in ``text`` (``kinds``), which read alone says
    the line was deleted rather than replaced."""
    for at, kind in kinds.items():
        if kind == "-":
            end = text.find("\n", at)
            line = text[at + 1: len(text) if end < 0 else end].strip()
            if line and line in form:
                return True
    return False


def _mostly_diff(text: str, kinds: dict[int, str]) -> bool:
    """Whether a diff (``kinds``: :func:`~ctxscore.compress.blocks.diff_lines`, line offsets) makes at
    least half of the text's characters: then its whole-line form is used at any size. A short patch
    inside prose takes the code path, whose whole lines must not cost much more than the sentences
    unless those keep a removed line alone (3.3 KB of prose around a 5-line hunk was kept whole in
    every tier)."""
    if not kinds:
        return False
    chars = 0
    for at in kinds:
        end = text.find("\n", at)
        chars += (len(text) if end < 0 else end) - at
    return 2 * chars >= len(text.strip())


def archive_stub(message_id: str, text: str, words: int = 8) -> str:
    """One-line stub for an archived message: ``[archived <id>: <first words> …]``.

    ``words`` counts whitespace-separated words; when they run past ``6 * words`` characters (long
    words, text without spaces such as Chinese) the first ``3 * words`` characters are used, cut
    before the word or number they would split (``$1,250.00`` never shows as ``$1``, ``ID-4417`` as
    ``ID-4``); a single word longer than that ends in ``…`` with no space, so it reads as cut.
    """
    flat = " ".join(text.split())
    parts = flat.split(" ")
    head = " ".join(parts[:words]) if len(parts) > 1 else flat
    if len(head) > 6 * words:
        n = 3 * words
        cut = head[:n]
        if _STUB_TOKEN.match(head, n - 1) and _STUB_TOKEN.match(head, n):  # a word or value split
            start = _STUB_TAIL.search(cut).start()  # type: ignore[union-attr]
            if start == 0:
                return f"[archived {message_id}: {cut}…]"
            cut = cut[:start]
        head = cut.rstrip()
    return f"[archived {message_id}: {head} …]"


#: A character of a word or value that a stub must not split (not a space, CJK text or CJK punctuation).
_STUB_TOKEN = re.compile(r"[^\s\u3000-\u303f\u3400-\u9fff\uf900-\ufaff\uff00-\uffef]")
_STUB_TAIL = re.compile(_STUB_TOKEN.pattern + "*$")


class ExtractiveCompressor:
    """The default compressor (no LLM): :func:`structured_summary` and :func:`aggressive_compress`.

    It keeps the key spans it is given (``keeps_spans``; see :func:`~ctxscore.compress.base.compress_verified`).

    Args:
        config: rule file for entity patterns and keywords (default: packaged).
    """

    keeps_spans = True

    def __init__(self, config: RuleConfig | None = None) -> None:
        self.config = config or default_config()

    def compress(self, text: str, tier: Tier, spans: Sequence[str] | None = None) -> str | None:
        """The unverified form of ``text`` for ``tier`` (see :class:`~ctxscore.compress.base.Compressor`),
        holding the key spans ``spans`` (substrings of ``text``) where it can; ``None`` for another tier."""
        if tier == Tier.STRUCTURED:
            return structured_summary(text, self.config, keep=spans)
        if tier == Tier.COMPRESSED:
            return aggressive_compress(text, self.config, keep=spans)
        return None


def compress(text: str, tier: str, config: RuleConfig | None = None,
             extractor: Callable[[str], Sequence[str]] | None = None) -> CompressionResult:
    """Verified extractive compression of ``text`` to ``tier`` (``structured`` or ``compressed``),
    falling back to a gentler tier when a form would lose a key span or invent one
    (:func:`~ctxscore.compress.base.compress_verified` with :class:`ExtractiveCompressor`).

    Args:
        text: the original content.
        tier: ``"structured"`` or ``"compressed"``.
        config: rule file (default: packaged).
        extractor: a learned key-span extractor (``text -> spans``, e.g.
            :meth:`ctxscore.scoring.spans.SpanExtractor.key_spans`) whose spans are kept besides the
            entities (default: the registered one, if any; :func:`~ctxscore.compress.verify.key_spans`).

    Raises:
        ValueError: ``tier`` is not one of the two compressing tiers.
    """
    spans = key_spans(text, config or default_config(), extractor=extractor) if extractor is not None else None
    return compress_verified(ExtractiveCompressor(config), text, tier, spans=spans, config=config)
