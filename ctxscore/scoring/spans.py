"""The learned key-span extractor: keep or drop each token of a message (LLMLingua-2 at dialogue level).

A message is cut into tokens (ASCII words with inner ``.-_'/:`` kept together, single CJK
characters, single punctuation marks); each token gets hashed string features (the word, its
shape, prefix and suffix, the words and shapes around it, CJK character bigrams, the rule file's
entity kind it lies in, the keyword groups of its sentence: constraint, hard constraint, decision,
confirmation; whether it is inside quotes or a JSON value, the message role) and a scikit-learn
linear classifier (``predict_proba``; trained in ``training/spans.py`` on the slot spans of SGD,
MultiWOZ and CrossWOZ and on the distilled key spans) gives its probability of lying in a key span.
Runs of kept tokens (whitespace and single joining punctuation between them allowed) are the
spans; trailing punctuation is trimmed, the ends of a run in Chinese text are moved to the word
boundaries of jieba's segmentation (a Chinese token is one character, so the classifier's runs
often began or ended inside a word: ``汕砂锅粥`` for ``潮汕砂锅粥``; see :func:`runs_of`), at most
:data:`MAX_SPANS` (the most probable) are kept, in text order. Like the annotators, it reads at most
the first and last :data:`HEAD_TAIL` characters.

Uses:

- :func:`ctxscore.compress.verify.key_spans` adds the spans of the registered extractor
  (:func:`register`, :func:`registered`) to the entities every compressed form must keep; with
  none registered (the default), the rules alone decide;
- :meth:`SpanExtractor.key_spans` is what the runtime asks a compressed form to keep: the spans
  less the trivial ones (:func:`useful`: a lone function word or a single character) and none for
  JSON content (whose structured form keeps every leaf); the context manager uses it for the
  structured and compressed tiers when its scorer has an extractor (``LearnedScorer.spans``);
- :meth:`SpanExtractor.facts` is a fact-ledger extractor (``FactContext.extractor``:
  ``text -> [(slot, value)]``; the fact ledger uses it when the session's scorer has an extractor);
- :meth:`SpanExtractor.keep_positions` gives character spans a compressor can select sentences by.
"""

from __future__ import annotations

import bisect
import functools
import json
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .rules import RuleConfig, default_config, sentences, typed_entity_spans

#: Hashed feature space of the token classifier.
N_FEATURES = 2 ** 15
#: At most this many spans per message (the annotation guide's limit).
MAX_SPANS = 8
#: Characters read from the start and from the end of a long text.
HEAD_TAIL = 900
#: Keep threshold on a token's probability.
THRESHOLD = 0.5
#: Threshold on a token's probability for the spans a compressed form must keep
#: (:meth:`SpanExtractor.key_spans`): a form is held to a span only when the extractor is sure of it.
REQUIRE_THRESHOLD = 0.7

_TOKEN = re.compile(r"[A-Za-z0-9_]+(?:[.\-_'’/:@][A-Za-z0-9_]+)*|[\u3400-\u9fff\uf900-\ufaff]|[^\s]")
_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
_JOIN = frozenset("-/:.,'’&()（）·")
_TRIM = ".,;:!?。，；：！？、)）]}\"'“”"
#: The slot of a value an extractor found without naming it (:meth:`SpanExtractor.facts`).
UNNAMED_SLOT = "key span"
#: Words that alone are never a key span (a run of the classifier on a lone function word).
STOP_WORDS = frozenset(
    "a an the of to for in on at by with from and or but is are was were be been it its this that these those "
    "i you he she we they me my your our their so as if then ok okay sure yes any some other also just there "
    "here what which who how".split())
_KW_GROUPS = ("constraint", "hard_constraint", "decision", "confirmation", "request", "failure")


def tokenize(text: str) -> list[tuple[int, int]]:
    """Character spans ``(start, end)`` of the tokens of ``text``, in order."""
    return [m.span() for m in _TOKEN.finditer(text)]


def _shape(tok: str) -> str:
    if _CJK.match(tok):
        return "Z"
    if tok.isdigit():
        return "d" if len(tok) < 3 else "D"
    if tok.isalpha():
        return "x" if tok.islower() else ("X" if tok.isupper() else "Xx")
    if any(c.isdigit() for c in tok) and any(c.isalpha() for c in tok):
        return "ad"
    if tok[0].isalnum():
        return "w"
    return "p" + tok[0]


def _window(text: str) -> str:
    """The part of ``text`` the extractor reads (see :data:`HEAD_TAIL`): positions keep their offsets
    because the middle is replaced by spaces."""
    if len(text) <= 2 * HEAD_TAIL:
        return text
    return text[:HEAD_TAIL] + " " * (len(text) - 2 * HEAD_TAIL) + text[-HEAD_TAIL:]


def _sentence_groups(text: str, config: RuleConfig) -> list[tuple[int, int, tuple[str, ...]]]:
    """``(start, end, keyword groups present)`` of each sentence of ``text``."""
    out, pos = [], 0
    kw = config.keyword_regexes
    for s in sentences(text):
        start = text.find(s, pos)
        if start < 0:
            continue
        pos = start + len(s)
        out.append((start, pos, tuple(g for g in _KW_GROUPS if g in kw and kw[g].search(s))))
    return out


def token_features(text: str, toks: Sequence[tuple[int, int]], role: str = "", config: RuleConfig | None = None) -> list[list[str]]:
    """Feature strings of each token (see the module docstring)."""
    cfg = config or default_config()
    words = [text[a:b] for a, b in toks]
    low = [w.lower() for w in words]
    shapes = [_shape(w) for w in words]
    ents = typed_entity_spans(text, cfg)
    sents = _sentence_groups(text, cfg)
    ent_of = [""] * len(toks)
    ent_start = [False] * len(toks)
    e = 0
    for i, (a, _) in enumerate(toks):
        while e < len(ents) and ents[e][1] <= a:
            e += 1
        if e < len(ents) and ents[e][0] <= a < ents[e][1]:
            ent_of[i], ent_start[i] = ents[e][2], ents[e][0] == a
    groups: list[tuple[str, ...]] = [()] * len(toks)
    s = 0
    for i, (a, _) in enumerate(toks):
        while s < len(sents) and sents[s][1] <= a:
            s += 1
        if s < len(sents) and sents[s][0] <= a:
            groups[i] = sents[s][2]
    quote = 0
    out = []
    n = len(toks)
    for i in range(n):
        w = low[i]
        if words[i] in "\"“”「」《》`":
            quote ^= 1
        f = [f"w={w}", f"sh={shapes[i]}", f"p3={w[:3]}", f"s3={w[-3:]}", f"r={role}", f"rsh={role}{shapes[i]}",
             f"ent={ent_of[i]}", f"entb={ent_start[i]}", f"q={quote}"]
        for d in (-2, -1, 1, 2):
            j = i + d
            f.append(f"w{d}={low[j] if 0 <= j < n else '<s>'}")
            f.append(f"sh{d}={shapes[j] if 0 <= j < n else '<s>'}")
        f.append(f"b-={low[i - 1] if i else '<s>'}|{w}")
        f.append(f"b+={w}|{low[i + 1] if i + 1 < n else '</s>'}")
        f.append(f"e-={ent_of[i - 1] if i else ''}|{ent_of[i]}")
        f += [f"g={g}" for g in groups[i]] or ["g=none"]
        f += [f"gs={g}{shapes[i]}" for g in groups[i]]
        if i and toks[i - 1][1] < toks[i][0] and "\n" in text[toks[i - 1][1]:toks[i][0]]:
            f.append("line_start")
        out.append(f)
    return out


#: Feature strings whose hashed column :class:`SpanExtractor` keeps (about 7 MB; a call that finds
#: more starts the memo over). Threads share the memo without a lock: each entry is set whole and
#: always to the same value, and nothing iterates over it.
_MAX_COLS = 50_000


def _logistic_parts(model: Any) -> tuple[np.ndarray, float] | None:
    """``(coef (N_FEATURES,), intercept)`` of a fitted binary log-loss ``SGDClassifier`` with dense
    coefficients, whose ``predict_proba(X)[:, 1]`` is ``expit(X @ coef + intercept)``; ``None`` for
    any other model. A copy taken when the extractor is built: a model refitted later is not seen."""
    from scipy.sparse import issparse
    from sklearn.linear_model import SGDClassifier

    coef = getattr(model, "coef_", None)
    if (type(model) is SGDClassifier and model.loss == "log_loss" and len(getattr(model, "classes_", ())) == 2
            and coef is not None and not issparse(coef) and coef.shape == (1, N_FEATURES)):
        return np.asarray(coef[0], dtype=np.float64), float(model.intercept_[0])
    return None


class SpanExtractor:
    """Key spans of a text from a fitted token classifier (see the module docstring).

    Args:
        model: fitted binary classifier with ``predict_proba`` over :data:`N_FEATURES` hashed features.
        threshold: keep probability (what :meth:`spans` and :meth:`keep_positions` use).
        config: rule file for entity kinds and keyword groups (default: packaged).
        require_threshold: keep probability of :meth:`key_spans`, the spans a compressed form must
            hold (at least ``threshold``).

    Raises:
        ValueError: ``threshold`` or ``require_threshold`` outside (0, 1).
    """

    def __init__(self, model: Any, threshold: float = THRESHOLD, config: RuleConfig | None = None,
                 require_threshold: float = REQUIRE_THRESHOLD) -> None:
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"threshold must be in (0, 1), got {threshold}")
        if not 0.0 < require_threshold < 1.0:
            raise ValueError(f"require_threshold must be in (0, 1), got {require_threshold}")
        self.model = model
        self.threshold = threshold
        self.require_threshold = require_threshold
        self.config = config or default_config()
        self._cols: dict[str, int] = {}  # feature string -> hashed column (see _hash)
        self._linear = _logistic_parts(model)
        self._lock = threading.Lock()
        self._memo: dict[tuple[str, str, float], list[tuple[int, int]]] = {}
        self._key_memo: dict[tuple[str, str], list[str]] = {}  # (role, text) -> key_spans (a form, its blocks, the ledger ask)

    def _hash(self, feats: list[list[str]]) -> Any:
        """The feature rows hashed as ``FeatureHasher(n_features=N_FEATURES, input_type="string",
        alternate_sign=False).transform(feats)`` does it in training (``training/spans.py``): a CSR
        matrix ``(len(feats), N_FEATURES)`` of counts, each string's column its signed 32-bit
        MurmurHash3 (seed 0, UTF-8) taken absolute, modulo :data:`N_FEATURES`. The column of each
        string is memoised, which makes this several times cheaper than the hasher's ``transform``
        (most strings recur: words, shapes, entity kinds)."""
        from scipy.sparse import csr_matrix
        from sklearn.utils import murmurhash3_32

        cols = self._cols
        if len(cols) > _MAX_COLS:
            cols.clear()
        flat = [f for row in feats for f in row]
        get = cols.get
        indices = [get(f, -1) for f in flat]
        for i, j in enumerate(indices):
            if j < 0:
                h = murmurhash3_32(flat[i], seed=0)
                indices[i] = cols[flat[i]] = ((2147483647 - (N_FEATURES - 1)) % N_FEATURES if h == -2147483648
                                              else abs(h) % N_FEATURES)
        indptr = np.zeros(len(feats) + 1, dtype=np.int32)
        np.cumsum([len(row) for row in feats], out=indptr[1:])
        X = csr_matrix((np.ones(len(indices)), np.asarray(indices, dtype=np.int32), indptr), shape=(len(feats), N_FEATURES))
        X.sum_duplicates()
        return X

    def token_probs(self, text: str, role: str = "") -> tuple[list[tuple[int, int]], np.ndarray]:
        """``(tokens, keep probability per token)`` of the part of ``text`` the extractor reads.

        For the shipped model (a binary ``SGDClassifier`` with the log loss) the probability is the
        logistic function of its decision value, ``expit(X @ coef_ + intercept_)``, which is what its
        ``predict_proba`` returns without the input validation that costs most of a short message's
        time; any other model is asked through ``predict_proba``."""
        win = _window(text)
        toks = tokenize(win)
        if not toks:
            return [], np.zeros(0)
        X = self._hash(token_features(win, toks, role, self.config))
        if self._linear is not None:
            from scipy.special import expit  # noqa: PLC0415 - scikit-learn's dependency, loaded with the model

            coef, intercept = self._linear
            return toks, expit(np.asarray(X @ coef, dtype=np.float64) + intercept)
        return toks, np.asarray(self.model.predict_proba(X), dtype=np.float64)[:, 1]

    def keep_positions(self, text: str, role: str = "", threshold: float | None = None) -> list[tuple[int, int]]:
        """Character spans ``(start, end)`` of the key spans of ``text`` (at most :data:`MAX_SPANS`),
        tokens kept at probability ``threshold`` (default: the extractor's)."""
        thr = self.threshold if threshold is None else threshold
        key = (role, text, thr)
        with self._lock:
            got = self._memo.get(key)
        if got is not None:
            return list(got)
        toks, p = self.token_probs(text, role)
        runs = runs_of(text, toks, p >= thr, p)
        with self._lock:
            if len(self._memo) > 4096:
                self._memo.clear()
            self._memo[key] = runs
        return list(runs)

    def spans(self, text: str, role: str = "") -> list[str]:
        """The key spans of ``text`` as substrings, distinct, in text order."""
        return list(dict.fromkeys(text[a:b] for a, b in self.keep_positions(text, role)))

    def key_spans(self, text: str, role: str = "") -> list[str]:
        """The spans a compressed form of ``text`` must keep: the key spans at probability
        ``require_threshold`` less the trivial ones (:func:`useful`), and ``[]`` for JSON content (its structured form keeps every leaf, and the
        classifier's runs there are bits of syntax). Substrings of ``text``, distinct, in text order."""
        key = (role, text)
        with self._lock:
            got = self._key_memo.get(key)
        if got is not None:
            return list(got)
        if is_json(text):
            out: list[str] = []
        else:
            thr = max(self.threshold, self.require_threshold)
            out = [s for s in dict.fromkeys(text[a:b] for a, b in self.keep_positions(text, role, thr)) if useful(s)]
        with self._lock:
            if len(self._key_memo) > 4096:
                self._key_memo.clear()
            self._key_memo[key] = out
        return list(out)

    def facts(self, text: str) -> list[tuple[str, str]]:
        """A fact-ledger extractor: ``[(UNNAMED_SLOT, span)]`` for each of :meth:`key_spans` of ``text``
        (the extractor finds values, not their names: the ledger records them without showing them,
        :mod:`ctxscore.memory.ledger`)."""
        return [(UNNAMED_SLOT, s) for s in self.key_spans(text)]


def useful(span: str) -> bool:
    """Whether a predicted span is worth keeping: not a single character (``"1"``, ``"周"``) and not
    made only of :data:`STOP_WORDS` and punctuation (``"the"``, ``"That"``, ``"is a"``)."""
    core = span.strip().strip(_TRIM)
    if len(core) < 2:
        return False
    words = [w.lower() for w in re.findall(r"[A-Za-z0-9_]+|[^\x00-\x7f]", core)]
    return bool(words) and not all(w in STOP_WORDS for w in words)


def is_json(text: str) -> bool:
    """``text`` is a JSON object or array (surrounding whitespace allowed)."""
    t = text.strip()
    if not t or t[0] not in "[{":
        return False
    try:
        json.loads(t)
    except (ValueError, RecursionError):
        return False
    return True


def runs_of(text: str, toks: Sequence[tuple[int, int]], keep: np.ndarray, p: np.ndarray,
            snap: bool = True) -> list[tuple[int, int]]:
    """Maximal runs of kept tokens as character spans: a gap of whitespace, or one joining punctuation
    token between two kept tokens, does not break a run; trailing punctuation is trimmed; with
    ``snap`` (the default) the ends of a run in Chinese text are moved to word boundaries
    (:func:`_snap`: the tokens are single characters, so the classifier's runs often start or end
    inside a word, ``汕砂锅粥`` for ``潮汕砂锅粥``), and runs that then overlap or touch are merged; the
    :data:`MAX_SPANS` runs of highest mean probability are returned in text order."""
    runs: list[tuple[int, int, float, int]] = []  # (start, end, sum of token probabilities, tokens)
    i, n = 0, len(toks)
    while i < n:
        if not keep[i]:
            i += 1
            continue
        j, probs = i, [p[i]]
        while True:
            if j + 1 < n and keep[j + 1] and "\n" not in text[toks[j][1]:toks[j + 1][0]]:
                j += 1
            elif (j + 2 < n and keep[j + 2] and text[toks[j + 1][0]:toks[j + 1][1]] in _JOIN
                  and "\n" not in text[toks[j][1]:toks[j + 2][0]]):
                j += 2
            else:
                break
            probs.append(p[j])
        a, b = toks[i][0], toks[j][1]
        while b > a and text[b - 1] in _TRIM and not (text[b - 1] in ")）" and ("(" in text[a:b] or "（" in text[a:b])):
            b -= 1
        if snap and b > a:
            a, b = _snap(text, toks, a, b)
        if b > a and text[a:b].strip():
            runs.append((a, b, float(np.sum(probs)), len(probs)))
        i = j + 1
    if snap:
        runs = _merge(runs)
    best = sorted(runs, key=lambda r: -r[2] / r[3])[:MAX_SPANS]
    return sorted((a, b) for a, b, _, _ in best)


def _merge(runs: list[tuple[int, int, float, int]]) -> list[tuple[int, int, float, int]]:
    """Runs (in text order) that overlap or touch after :func:`_snap` merged into one (their token
    probabilities pooled)."""
    out: list[tuple[int, int, float, int]] = []
    for r in sorted(runs):
        if out and r[0] <= out[-1][1]:
            a, b, s, k = out[-1]
            out[-1] = (a, max(b, r[1]), s + r[2], k + r[3])
        else:
            out.append(r)
    return out


#: Single-character words that do not begin or end a key span when the segmentation makes them a word
#: of their own: structural particles and aspect markers (的 了 着 过) and sentence-final particles.
_ZH_EDGE_WORDS = frozenset("的了着过吧吗呢啊呀嘛哦啦")
#: A number the extractor's tokenizer keeps as one token (``8``, ``4.5``, ``150-500``, ``12:30``).
_NUMBER = re.compile(r"[0-9]+(?:[.,:/\-][0-9]+)*")


def _snap(text: str, toks: Sequence[tuple[int, int]], a: int, b: int) -> tuple[int, int]:
    """The run ``text[a:b]`` with its Chinese ends on word boundaries.

    The segmentation is jieba's (:func:`_zh_words_around`, the default mode with its HMM for unknown
    words, which :mod:`ctxscore.store.retrieval` already uses for Chinese queries): a run whose first
    (last) character is CJK starts (ends) where the word holding that character does, so ``家人家``
    becomes ``客家人家`` and ``午有事`` ``下午有事``, unless the new end would cut one of the
    extractor's tokens (jieba has ``T恤`` after ``AB`` in ``ABT恤``; the run keeps its end). A
    single-character word of :data:`_ZH_EDGE_WORDS` at either end is then dropped (``的周边餐馆`` ->
    ``周边餐馆``; ``好`` of ``最好`` is not a word of its own and stays); and a number written against
    the run's first character (the ``8`` of ``8月``, which jieba cuts apart) is taken in. Without
    jieba installed the ends are not moved (only the number rule applies). Returns ``(a, b)``, with
    ``a >= b`` when nothing but an edge word was left."""
    if _CJK.match(text[a]):
        words = _zh_words_around(text, a)
        k = next((k for k, w in enumerate(words) if w[0] <= a < w[1]), None)
        if k is not None and _token_start(toks, words[k][0]):
            a = words[k][0]
        while k is not None and k < len(words) and _edge_word(text, words[k]) and words[k][1] <= b:
            a, k = words[k][1], k + 1
        while a < b and text[a].isspace():
            a += 1
    if b > a and _CJK.match(text[b - 1]):
        words = _zh_words_around(text, b - 1)
        k = next((k for k, w in enumerate(words) if w[0] < b <= w[1]), None)
        if k is not None and _token_end(toks, words[k][1]):
            b = words[k][1]
        while k is not None and k >= 0 and _edge_word(text, words[k]) and words[k][0] >= a:
            b, k = words[k][0], k - 1
        while b > a and text[b - 1].isspace():
            b -= 1
    if b > a and _CJK.match(text[a]):
        k = _token_ending_at(toks, a)
        if k is not None and _NUMBER.fullmatch(text[toks[k][0]:toks[k][1]]):
            a = toks[k][0]
    return a, b


def _edge_word(text: str, w: tuple[int, int]) -> bool:
    """Whether the word ``text[w[0]:w[1]]`` is a single character of :data:`_ZH_EDGE_WORDS`."""
    return w[1] - w[0] == 1 and text[w[0]] in _ZH_EDGE_WORDS


def _token_start(toks: Sequence[tuple[int, int]], pos: int) -> bool:
    k = bisect.bisect_left(toks, (pos, -1))
    return k < len(toks) and toks[k][0] == pos


def _token_end(toks: Sequence[tuple[int, int]], pos: int) -> bool:
    k = bisect.bisect_left(toks, (pos, -1)) - 1
    return 0 <= k and toks[k][1] == pos


def _token_ending_at(toks: Sequence[tuple[int, int]], pos: int) -> int | None:
    """The index of the token that ends at ``pos`` (nothing between it and ``pos``), or ``None``."""
    k = bisect.bisect_left(toks, (pos, -1)) - 1
    return k if 0 <= k and toks[k][1] == pos else None


#: The characters jieba segments together (its ``re_han_default``): a block of them is cut alone.
_ZH_BLOCK_CHAR = re.compile(r"[\u4e00-\u9fd5a-zA-Z0-9+#&._%\-]")


def _zh_words_around(text: str, pos: int) -> list[tuple[int, int]]:
    """``(start, end)`` in ``text`` of the words of jieba's segmentation of the block of characters
    jieba cuts together (:data:`_ZH_BLOCK_CHAR`) around ``pos``: jieba cuts each such block on its
    own, so these are the words of the whole text there. ``[]`` without jieba."""
    lo = hi = pos
    while lo > 0 and _ZH_BLOCK_CHAR.match(text[lo - 1]):
        lo -= 1
    while hi < len(text) and _ZH_BLOCK_CHAR.match(text[hi]):
        hi += 1
    return [(lo + a, lo + b) for a, b in _segment(text[lo:hi])]


@functools.lru_cache(maxsize=4096)
def _segment(block: str) -> tuple[tuple[int, int], ...]:
    """Word offsets of jieba's segmentation of ``block`` (memoised: the blocks of one message are asked
    for at each run end, and dialogue repeats them); ``()`` when jieba is not installed."""
    try:
        import jieba  # noqa: PLC0415 - optional (the embed extra installs it), loaded on the first Chinese run
    except ImportError:
        return ()
    from ..store.retrieval import _quiet_jieba  # noqa: PLC0415 - only with jieba

    _quiet_jieba(jieba)
    return tuple((a, b) for _, a, b in jieba.tokenize(block))


# ---------------------------------------------------------------------------------------- registry
_registered: Callable[[str], Sequence[str]] | None = None


def register(extractor: Callable[[str], Sequence[str]] | None) -> None:
    """Make ``extractor`` (``text -> spans``, e.g. :meth:`SpanExtractor.spans`) the one that
    :func:`ctxscore.compress.verify.key_spans` consults (process-wide); ``None`` restores the rules alone."""
    global _registered
    _registered = extractor


def registered() -> Callable[[str], Sequence[str]] | None:
    """The registered extractor, or ``None`` (the default: rules only)."""
    return _registered


def extractor_of(scorer: Any) -> Callable[[str], list[str]] | None:
    """The runtime's key-span function of a scorer: ``scorer.key_spans`` (``text -> spans``) when the
    scorer carries a span extractor (a :class:`~ctxscore.scoring.learned.LearnedScorer` whose package
    has ``spans.skops``), else ``None`` (the rules alone decide)."""
    if getattr(scorer, "spans", None) is None or not callable(getattr(scorer, "key_spans", None)):
        return None
    return scorer.key_spans  # type: ignore[no-any-return]


def facts_of(scorer: Any) -> Callable[[str], list[tuple[str, str]]] | None:
    """The fact-ledger extractor of a scorer (:meth:`SpanExtractor.facts`) when it carries a span
    extractor, else ``None``."""
    ext = getattr(scorer, "spans", None)
    return ext.facts if isinstance(ext, SpanExtractor) else None
