"""Semantic blocks of long messages (the first design note's 语义分块).

A long message -- a multi-KB tool output, a long reasoning message -- is split into blocks that can
be kept or archived one by one (:func:`split_blocks`): the records of a JSON array or the members of
a JSON object, fenced code blocks, diff hunks, paragraphs, and, for anything still longer than
``max_chars``, groups of whole lines (log sections). Blocks cover the text exactly, in order.

:func:`blocked_form` shows a message with some blocks kept byte-exact and each run of the others
replaced by one marker ``[… 3 blocks of m12 archived: first words …]``: the blocks are archived in
place (the original stays whole in the store and comes back on page-in), so a 20 KB tool dump can
stay in the window as its head, its errors and its tail, and a page-in can bring back only the
blocks a question names (:func:`query_blocks`).
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..scoring.rules import SCAN_WHOLE_CHARS, casefold_text
from ..scoring.spans import is_json
from .verify import occurrences

#: Messages longer than this (characters) are handled block by block; shorter ones are compressed as
#: a whole and read whole by the scorer (:data:`ctxscore.scoring.rules.SCAN_WHOLE_CHARS`).
BLOCK_MIN_CHARS = SCAN_WHOLE_CHARS
#: A block is cut into line groups when longer than this (characters).
BLOCK_MAX_CHARS = 1200

_FENCE = re.compile(r"^```.*?^```[^\n]*$", re.S | re.M)
_HUNK = re.compile(r"^(?:diff --git |@@ )", re.M)
_PARA = re.compile(r"\n[ \t]*\n")
#: Error words, searched in the case-folded text (:func:`casefold_text`: the same matches as under
#: IGNORECASE in the text; Python's regex engine scans a case-sensitive alternation about five times
#: as fast).
_ERROR_LOWER = re.compile(r"traceback|error|exception|failed|failure|<returncode>[1-9]|assert|fatal|denied|not found")


@dataclass(frozen=True, slots=True)
class Block:
    """One block: ``text[start:end]`` and its kind (``json``, ``code``, ``diff``, ``paragraph``, ``lines``)."""

    start: int
    end: int
    kind: str


def _json_blocks(text: str) -> list[tuple[int, int]] | None:
    """Cuts between the top-level elements of a JSON array or object, by bracket depth (strings skipped)."""
    if not is_json(text):
        return None
    cuts, depth, in_str, esc = [], 0, False, False
    for i, ch in enumerate(text):
        if in_str:
            esc = (ch == "\\") and not esc
            if ch == '"' and not esc:
                in_str = False
            continue
        if ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 1:
            cuts.append(i + 1)
    bounds = [0, *cuts, len(text)]
    return [(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


def _spans(text: str) -> Iterable[tuple[int, int, str]]:
    """Code fences and diff hunks as whole spans, the rest cut into paragraphs."""
    pos = 0
    for m in _FENCE.finditer(text):
        yield from _paragraphs(text, pos, m.start())
        yield m.start(), m.end(), "code"
        pos = m.end()
    yield from _paragraphs(text, pos, len(text))


#: A hunk's header with its line counts (a count left out is 1).
_HUNK_HEAD = re.compile(r"@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
#: The lines of a file's header in a unified diff.
_FILE_HEAD = re.compile(r"diff |index |--- |\+\+\+ |new file|deleted file|similarity |rename |old mode|new mode|Binary files")


def _diff_ends(part: str, heads: Sequence[int], kinds: dict[int, str] | None = None) -> list[tuple[int, int]]:
    """``(start, end)`` of each run of unified diff in ``part``, from one of its ``diff --git`` or
    ``@@`` lines (``heads``, their offsets in order):
    file headers, then hunks, each as long as its header's line counts say (context and removed lines
    count against the old file, context and added lines against the new; an empty line is a context
    line whose space a tool stripped). A line that fits neither ends the run, and so does a line
    after a hunk's last one that starts no header or hunk (prose or a list after the diff).
    ``kinds``, when given, gets the kind of each line of the runs by its offset (:func:`diff_lines`)."""
    out: list[tuple[int, int]] = []
    for start in heads:
        if out and start < out[-1][1]:
            continue
        i, old, new = start, None, None  # None: in a file's header
        while i < len(part):
            j = part.find("\n", i)
            end = len(part) if j == -1 else j
            line = part[i:end]
            head = _HUNK_HEAD.match(line)
            if head:
                old, new = int(head.group(1) or 1), int(head.group(2) or 1)
            elif (old is None or (old <= 0 and new <= 0)) and _FILE_HEAD.match(line):
                old = new = None
            elif old is None or (old <= 0 and new <= 0):
                break
            elif line[:1] in (" ", ""):
                old, new = old - 1, new - 1  # type: ignore[operator]
            elif line[:1] == "-":
                old -= 1
            elif line[:1] == "+":
                new -= 1  # type: ignore[operator]
            elif line[:1] != "\\":  # "\ No newline at end of file" counts for neither
                break
            if kinds is not None:
                kinds[i] = "@" if head else "F" if old is None else line[:1] or " "
            i = end + 1
        out.append((start, min(i, len(part))))
    return out


def diff_lines(text: str) -> dict[int, str]:
    """The lines of unified diff in ``text`` (the runs :func:`split_blocks` keeps whole), by the
    offset where each starts: ``F`` a file header line (``diff --git``, ``index``, ``---``, ``+++``,
    ``new file mode`` ...), ``@`` a hunk header, then by their first character ``" "`` (context, an
    empty line too), ``-``, ``+`` and ``\\``. Empty for text with no ``@@ `` (one substring search)."""
    if "@@ " not in text:
        return {}
    kinds: dict[int, str] = {}
    _diff_ends(text, [m.start() for m in _HUNK.finditer(text)], kinds)
    return kinds


def _paragraphs(text: str, lo: int, hi: int) -> Iterable[tuple[int, int, str]]:
    """Cuts at diff hunks and at blank lines, none inside a hunk (its empty context lines, ``" "``,
    are blank lines too: a hunk cut there loses its ``@@`` line numbers)."""
    part = text[lo:hi]
    heads = [m.start() for m in _HUNK.finditer(part)]
    diffs = _diff_ends(part, heads)
    starts = [a for a, _ in diffs]

    def in_diff(x: int) -> bool:
        k = bisect.bisect_left(starts, x) - 1
        return k >= 0 and x < diffs[k][1]

    paras = [m.end() for m in _PARA.finditer(part) if not in_diff(m.end())]
    cuts = sorted({0, len(part), *heads, *(b for _, b in diffs), *paras})
    for a, b in zip(cuts, cuts[1:], strict=False):
        if b > a:
            yield lo + a, lo + b, "diff" if _HUNK.match(part, a) else "paragraph"


def _line_groups(text: str, a: int, b: int, max_chars: int) -> Iterable[tuple[int, int]]:
    start = a
    while b - start > max_chars:
        cut = text.rfind("\n", start, start + max_chars)
        cut = start + max_chars if cut <= start else cut + 1
        yield start, cut
        start = cut
    yield start, b


def split_blocks(text: str, max_chars: int = BLOCK_MAX_CHARS) -> list[Block]:
    """The blocks of ``text`` (see the module docstring); their spans cover ``text`` exactly, in order."""
    js = _json_blocks(text)
    raw = [(a, b, "json") for a, b in js] if js is not None else list(_spans(text))
    out: list[Block] = []
    for a, b, kind in raw:
        for x, y in (_line_groups(text, a, b, max_chars) if b - a > max_chars else [(a, b)]):
            out.append(Block(x, y, kind if y - x == b - a else "lines"))
    return out


def _marker(message_id: str, blocks: Sequence[Block], text: str) -> str:
    head = " ".join(text[blocks[0].start:blocks[-1].end].split()[:6])[:60]
    n = len(blocks)
    return f"[… {n} block{'s' if n > 1 else ''} of {message_id} archived: {head} …]"


def blocked_form(text: str, blocks: Sequence[Block], keep: Iterable[int], message_id: str) -> str:
    """``text`` with the blocks whose index is in ``keep`` byte-exact and each run of the others
    replaced by one marker that names the message (its original stays in the store)."""
    keep = set(keep)
    out: list[str] = []
    run: list[Block] = []
    for i, blk in enumerate(blocks):
        if i in keep:
            if run:
                out.append(("\n" if out and not out[-1].endswith("\n") else "") + _marker(message_id, run, text) + "\n")
                run = []
            out.append(text[blk.start:blk.end])
        else:
            run.append(blk)
    if run:
        out.append(("\n" if out and not out[-1].endswith("\n") else "") + _marker(message_id, run, text))
    return "".join(out)


# IDs and numbers, CONSTANT_names, file names. A file name is tried only where a run of word
# characters and hyphens begins, or at a hyphen (where the previous match may have ended): the same
# matches as trying it at every position, without rescanning each word from each of its letters.
_KEYLIKE = re.compile(r"\b(?=[\w./-]*\d)[\w./-]{3,}|\b[A-Z][A-Za-z0-9]*_[\w]+"
                      r"|(?<![\w-])[\w-]+\.(?:py|js|ts|json|ya?ml|md|txt|cfg|toml)\b"
                      r"|-[\w-]*\.(?:py|js|ts|json|ya?ml|md|txt|cfg|toml)\b")


def key_blocks(text: str, blocks: Sequence[Block], share: float = 0.3, spans: Sequence[str] = ()) -> set[int]:
    """The blocks a compacted long message keeps: the first and the last, then the blocks with
    errors or a given key span (``spans``: substrings of ``text``, e.g. the learned extractor's and
    the hard constraints; a block holding one comes first) and the densest in key-like tokens (IDs,
    numbers, paths, file names), up to ``share`` of the characters (a fraction of ``len(text)``).
    One regex pass per block: the cost stays linear in the text."""
    n = len(blocks)
    keep = {0, n - 1} if n else set()
    budget = share * len(text)
    used = sum(blocks[i].end - blocks[i].start for i in keep)
    held: set[int] = set()
    starts = [b.start for b in blocks]
    for a, e in occurrences(text, list(dict.fromkeys(spans))):
        i = max(0, bisect.bisect_right(starts, a) - 1)  # the block holding position a, then those the span reaches
        while i < n and blocks[i].start < e:
            if blocks[i].end > a:
                held.add(i)
            i += 1

    low = casefold_text(text)  # same length: block positions hold in it

    def score(i: int) -> float:
        b = blocks[i]
        keys = len(_KEYLIKE.findall(text, b.start, b.end))
        return ((3.0 if _ERROR_LOWER.search(low, b.start, b.end) else 0.0) + (4.0 if i in held else 0.0)
                + keys / max(1.0, (b.end - b.start) / 200))

    scores = {i: score(i) for i in range(1, n - 1)}
    for i in sorted(scores, key=lambda i: (-scores[i], i)):
        size = blocks[i].end - blocks[i].start
        if scores[i] <= 0 or used + size > budget:
            continue
        keep.add(i)
        used += size
    return keep


def query_blocks(text: str, blocks: Sequence[Block], terms: Sequence[str], limit_chars: int,
                 ranked: Sequence[int] | None = None) -> set[int]:
    """The blocks a page-in shows for a query: the first block and the blocks holding the most query
    terms (case-insensitive), within ``limit_chars`` characters. ``ranked`` is
    :func:`rank_query_blocks` of the same arguments, when the caller keeps it."""
    keep = {0} if blocks else set()
    used = blocks[0].end - blocks[0].start if blocks else 0
    for i in rank_query_blocks(text, blocks, terms) if ranked is None else ranked:
        size = blocks[i].end - blocks[i].start
        if used + size > limit_chars:
            continue
        keep.add(i)
        used += size
    return keep


def rank_query_blocks(text: str, blocks: Sequence[Block], terms: Sequence[str]) -> list[int]:
    """The blocks after the first that hold a query term, best first (ties in order): a block scores
    ``sum(idf(t) * log(1 + count(t)))`` over the terms it holds (case-folded), with
    ``idf(t) = log(1 + n / df(t))`` over the message's ``n`` blocks, so a term in one block (a line
    number, an ID) outweighs one in every block repeated many times (the saturating term frequency and
    inverse block frequency of BM25: Robertson and Zaragoza, "The Probabilistic Relevance Framework:
    BM25 and Beyond", 2009)."""
    low = casefold_text(text)  # same length: block positions hold in it
    terms = list(dict.fromkeys(casefold_text(t) for t in terms if t))
    rest = range(1, len(blocks))
    counts = [{i: c for i in rest if (c := low.count(t, blocks[i].start, blocks[i].end))} for t in terms]
    n = max(1, len(blocks) - 1)
    score: dict[int, float] = {}
    for by_block in counts:
        idf = math.log1p(n / len(by_block)) if by_block else 0.0
        for i, c in by_block.items():
            score[i] = score.get(i, 0.0) + idf * math.log1p(c)
    return sorted(score, key=lambda i: (-score[i], i))
