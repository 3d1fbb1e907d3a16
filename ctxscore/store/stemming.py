"""The words of FTS5's stemmed index, computed in Python: what every store's ``stem`` list ranks.

SQLite's FTS5 ``porter unicode61 remove_diacritics 2`` tokenizer (the stemmed index of SQLite
stores up to schema 4; every store now ranks in Python with :mod:`ctxscore.store.session_index`):
``unicode61`` splits text into tokens of letters, digits and private-use characters (Unicode
categories L*, N*, Co; everything else separates), folds case and removes diacritics, and
``porter`` reduces each token of 3 to 64 bytes to its stem with Martin Porter's 1980 algorithm, in
FTS5's variant (``ext/fts5/fts5_tokenize.c``: rules grouped by the next-to-last letter, the first
matching suffix of a group decides). :func:`stem_tokens` reproduces that pipeline, so the stores'
``stem`` lists rank as FTS5 did (``tests/test_stemming.py`` compares the two on the bundled
sessions, token by token).

Only the stems that can match a query matter for ranking (queries stem ASCII words of letters,
:func:`~ctxscore.store.retrieval.stem_terms`), plus the number of tokens of each document (its
bm25 length): :func:`stem_index` returns exactly those.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

#: Tokens longer than this many bytes are not stemmed (FTS5_PORTER_MAX_TOKEN).
PORTER_MAX_TOKEN = 64

_VOWELS = frozenset("aeiou")


def _is_vowel(c: str, y_is_vowel: bool) -> bool:
    return c in _VOWELS or (y_is_vowel and c == "y")


def _gobble_vc(w: str, start: int, end: int, prev_cons: bool) -> int:
    """Past one vowel-then-consonant sequence of ``w[start:end]``: the offset after it (from
    ``start``), or 0 when there is none."""
    cons = prev_cons
    i = 0
    n = end - start
    while i < n:
        cons = not _is_vowel(w[start + i], cons)
        if not cons:
            break
        i += 1
    i += 1
    while i < n:
        cons = not _is_vowel(w[start + i], cons)
        if cons:
            return i + 1
        i += 1
    return 0


def _m_gt0(w: str, n: int) -> bool:
    return _gobble_vc(w, 0, n, False) != 0


def _m_gt1(w: str, n: int) -> bool:
    k = _gobble_vc(w, 0, n, False)
    return bool(k) and _gobble_vc(w, k, n, True) != 0


def _m_eq1(w: str, n: int) -> bool:
    k = _gobble_vc(w, 0, n, False)
    return bool(k) and _gobble_vc(w, k, n, True) == 0


def _ostar(w: str, n: int) -> bool:
    if w[n - 1] in "wxy":
        return False
    mask, cons = 0, False
    for i in range(n):
        cons = not _is_vowel(w[i], cons)
        mask = (mask << 1) + cons
    return (mask & 7) == 5


def _m_gt1_s_or_t(w: str, n: int) -> bool:
    return w[n - 1] in "st" and _m_gt1(w, n)


def _has_vowel(w: str, n: int) -> bool:
    return any(_is_vowel(w[i], i > 0) for i in range(n))


# (suffix, condition, replacement, returns-true) per step, grouped by the suffix's next-to-last
# letter in rule order: the first suffix of the word's group that matches decides.
_STEPS: dict[str, list[tuple[str, object, str, bool]]] = {
    "1b": [("eed", _m_gt0, "ee", False), ("ed", _has_vowel, "", True), ("ing", _has_vowel, "", True)],
    "1b2": [("at", None, "ate", True), ("bl", None, "ble", True), ("iz", None, "ize", True)],
    "2": [("ational", _m_gt0, "ate", False), ("tional", _m_gt0, "tion", False), ("enci", _m_gt0, "ence", False),
          ("anci", _m_gt0, "ance", False), ("izer", _m_gt0, "ize", False), ("logi", _m_gt0, "log", False),
          ("bli", _m_gt0, "ble", False), ("alli", _m_gt0, "al", False), ("entli", _m_gt0, "ent", False),
          ("eli", _m_gt0, "e", False), ("ousli", _m_gt0, "ous", False), ("ization", _m_gt0, "ize", False),
          ("ation", _m_gt0, "ate", False), ("ator", _m_gt0, "ate", False), ("alism", _m_gt0, "al", False),
          ("iveness", _m_gt0, "ive", False), ("fulness", _m_gt0, "ful", False), ("ousness", _m_gt0, "ous", False),
          ("aliti", _m_gt0, "al", False), ("iviti", _m_gt0, "ive", False), ("biliti", _m_gt0, "ble", False)],
    "3": [("icate", _m_gt0, "ic", False), ("ative", _m_gt0, "", False), ("alize", _m_gt0, "al", False),
          ("iciti", _m_gt0, "ic", False), ("ical", _m_gt0, "ic", False), ("ful", _m_gt0, "", False),
          ("ness", _m_gt0, "", False)],
    "4": [("al", _m_gt1, "", False), ("ance", _m_gt1, "", False), ("ence", _m_gt1, "", False), ("er", _m_gt1, "", False),
          ("ic", _m_gt1, "", False), ("able", _m_gt1, "", False), ("ible", _m_gt1, "", False), ("ant", _m_gt1, "", False),
          ("ement", _m_gt1, "", False), ("ment", _m_gt1, "", False), ("ent", _m_gt1, "", False),
          ("ion", _m_gt1_s_or_t, "", False), ("ou", _m_gt1, "", False), ("ism", _m_gt1, "", False),
          ("ate", _m_gt1, "", False), ("iti", _m_gt1, "", False), ("ous", _m_gt1, "", False), ("ive", _m_gt1, "", False),
          ("ize", _m_gt1, "", False)],
}
_GROUPS: dict[str, dict[str, list[tuple[str, object, str, bool]]]] = {}
for _step, _rules in _STEPS.items():
    _by: dict[str, list[tuple[str, object, str, bool]]] = {}
    for _r in _rules:
        _by.setdefault(_r[0][-2], []).append(_r)
    _GROUPS[_step] = _by


def _step(w: str, step: str) -> tuple[str, bool]:
    """One generated step of FTS5's stemmer on ``w``: (the word after it, whether a rule returned true)."""
    n = len(w)
    if n < 2:
        return w, False
    for suffix, cond, rep, ret in _GROUPS[step].get(w[-2], ()):
        k = len(suffix)
        if n > k and w.endswith(suffix):
            if cond is None or cond(w, n - k):  # type: ignore[operator]
                return w[: n - k] + rep, ret
            return w, False
    return w, False


@lru_cache(maxsize=65_536)
def porter_stem(token: str) -> str:
    """FTS5's Porter stem of a folded token (tokens under 3 or over 64 bytes are returned as is).

    Like FTS5 it works on the UTF-8 bytes: a non-ASCII byte counts as a consonant."""
    raw = token.encode("utf-8")
    if not 3 <= len(raw) <= PORTER_MAX_TOKEN:
        return token
    if not token.isascii():
        return _porter(raw.decode("latin-1")).encode("latin-1").decode("utf-8", "replace")
    return _porter(token)


def _porter(w: str) -> str:
    if w[-1] == "s":  # step 1a
        if w[-2] == "e":
            if (len(w) > 4 and w[-4] == "s" and w[-3] == "s") or (len(w) > 3 and w[-3] == "i"):
                w = w[:-2]
            else:
                w = w[:-1]
        elif w[-2] != "s":
            w = w[:-1]
    w, went = _step(w, "1b")
    if went:
        w, ok = _step(w, "1b2")
        if not ok:
            c = w[-1]
            if not _is_vowel(c, False) and c not in "lsz" and len(w) > 1 and c == w[-2]:
                w = w[:-1]
            elif _m_eq1(w, len(w)) and _ostar(w, len(w)):
                w += "e"
    if w[-1] == "y" and _has_vowel(w, len(w) - 1):  # step 1c
        w = w[:-1] + "i"
    for step in ("2", "3", "4"):
        w, _ = _step(w, step)
    if w[-1] == "e" and (_m_gt1(w, len(w) - 1) or (_m_eq1(w, len(w) - 1) and not _ostar(w, len(w) - 1))):
        w = w[:-1]  # step 5a
    if len(w) > 1 and w[-1] == "l" and w[-2] == "l" and _m_gt1(w, len(w) - 1):
        w = w[:-1]  # step 5b
    return w


def _token_char(c: str) -> bool:
    cat = unicodedata.category(c)
    return cat[0] in "LN" or cat == "Co"


@lru_cache(maxsize=4096)
def _fold_char(c: str) -> str:
    """unicode61's folding of one character: lower case, diacritics removed (remove_diacritics 2)."""
    low = c.lower()
    if len(low) != 1:
        low = c
    if ord(low) < 128:
        return low
    base = "".join(ch for ch in unicodedata.normalize("NFD", low) if not unicodedata.combining(ch))
    return base if len(base) == 1 else low


#: Runs of letters and digits (Unicode categories L* and N*: Python's word characters minus "_").
_TOKEN_RUN = re.compile(r"[^\W_]+")
#: Private-use characters (category Co), token characters for unicode61 but not for the regex.
_PRIVATE_USE = re.compile("[\ue000-\uf8ff\U000f0000-\U000ffffd\U00100000-\U0010fffd]")


def fts5_tokens(text: str) -> list[str]:
    """The folded tokens of ``text`` under FTS5's ``unicode61 remove_diacritics 2``."""
    if _PRIVATE_USE.search(text):
        return _fts5_tokens_slow(text)
    return [t.lower() if t.isascii() else "".join(map(_fold_char, t)) for t in _TOKEN_RUN.findall(text)]


def _fts5_tokens_slow(text: str) -> list[str]:
    out: list[str] = []
    cur: list[str] = []
    for c in text:
        if _token_char(c):
            cur.append(_fold_char(c))
        elif cur:
            out.append("".join(cur))
            cur = []
    if cur:
        out.append("".join(cur))
    return out


def stem_tokens(text: str) -> list[str]:
    """Every token of ``text`` as SQLite's stemmed index holds it (folded, then stemmed)."""
    return [porter_stem(t) for t in fts5_tokens(text)]


def stem_index(text: str) -> tuple[list[str], int]:
    """(the stems of ``text`` that a query can match -- ASCII letters only --, its number of tokens)."""
    toks = fts5_tokens(text)
    return [s for s in (porter_stem(t) for t in toks if t.isascii() and t.isalpha())], len(toks)
