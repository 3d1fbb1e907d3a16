"""Hard constraints read as rules the verifier can test actions against.

:func:`parse` turns one hard-constraint sentence into :class:`Rule` s:

=========  ============================================================  ==========================
kind       sentence                                                      an action breaks it when
=========  ============================================================  ==========================
confirm    "never book without explicit confirmation", 执行前必须先确认      a write tool call follows
                                                                         no user confirmation
prohibit   "don't recommend Apple", "no red-eye flights", 不要退成余额      it names a prohibited term
max / min  "at most $600", "budget $600", 不超过500元, "at least 2 bags"   a money value above / below
before /   "must arrive before 6pm", "no later than 18:00", 6点之前到        a time after / before the
after                                                                    bound (the anchored one)
=========  ============================================================  ==========================

:func:`broken` tests a rule against the text or tool call of one assistant action and says why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..memory.profile_extract import ALIASES, terms_in
from . import values as vals

_CONFIRM = re.compile(r"(?i)without (?:\w+ ){0,3}confirm|confirm\w* (?:\w+ ){0,4}before|(?:obtain|get|ask for) (?:\w+ ){0,3}"
                      r"confirm|before (?:\w+ ){0,6}(?:confirm|approv)|确认|同意之前|未经.{0,4}同意")
_PROHIBIT = re.compile(r"(?i)\b(?:don'?t|do not|never|must not|mustn'?t|should not|shouldn'?t|cannot|can'?t|not allowed to|"
                       r"avoid|no)\b\s+(?:ever\s+)?|不要|别|禁止|不得|千万别|绝对不要?|不能|不许|不准|不想要?|不考虑")
_MAX = re.compile(r"(?i)\b(?:at most|no more than|not more than|under|below|maximum|max|up to|cannot exceed|can'?t exceed|"
                  r"not exceed|budget(?: is| of)?|less than|cheaper than)\b|不超过|最多|以内|以下|预算|低于|不能超过|别超过")
_MIN = re.compile(r"(?i)\b(?:at least|no less than|not less than|minimum|more than)\b|至少|不低于|以上")
_BEFORE = re.compile(r"(?i)\b(?:before|no later than|by|until)\b|之前|以前|前到")
_AFTER = re.compile(r"(?i)\b(?:after|no earlier than|later than)\b|之后|以后")
_NEGATED = re.compile(r"(?i)\b(?:no|not|never|don'?t|avoid)\b|不行|不要|不能|别|不可以|不得")
_FIXED = re.compile(r"(?i)no later than|no earlier than|not later than|not earlier than")
_ANCHOR = re.compile(r"(?i)\b(?:arriv\w*|land\w*|depart\w*|leav\w*|return\w*|check.?in|check.?out|pick.?up|deliver\w*)\b|"
                     r"到达|抵达|到|出发|起飞|离开|送达|取件")
#: A bound per unit ("$800 per person", "每晚300元"): only values given per the same unit are compared.
_PER = re.compile(r"(?i)\b(?:per|a|an) (?:person|night|ticket|head|day|room|item|passenger)\b|\beach\b|/(?:night|person|day)|"
                  r"人均|每人|每晚|一晚|每张|每间|每天|每件|/[晚人位天间张件]")
_PER_KIND = {"人均": "per person", "每人": "per person", "每晚": "per night", "一晚": "per night", "每张": "per ticket",
             "每间": "per room", "每天": "per day", "每件": "per item", "/night": "per night", "/person": "per person",
             "/day": "per day", "per head": "per person", "per passenger": "per person", "/晚": "per night",
             "/人": "per person", "/位": "per person", "/天": "per day", "/间": "per room", "/张": "per ticket",
             "/件": "per item"}
_WITH = re.compile(r"(?i)\b(?:anything|something|nothing|dishes|food|meals?|items?|products?)\s+(?:with|containing|"
                   r"that contains?|made with)\s+([a-z]{3,})")
_STOPWORDS = frozenset("""a an the any me us my our your it them this that these those to for of in on at with by from and or be
ever recommend suggest offer show give book use buy choose pick select include add send get make put change do modify
please just again more anything something any one ones option options""".split())
_ZH_VERBS = re.compile(r"^(?:给我|帮我|为我|再|推荐|介绍|退成|退到|退回|用|选|订|买|发|改成|换成|安排|使用|提供|要|重启|切换|删除|修改|"
                       r"更改|透露|发送|分享|泄露|动|碰|关闭|停止|执行|带有|带|含有|含|加)+")
_ZH_SPLIT = re.compile(r"或者|或|和|与|、|，|,|以及|及")
#: Brand aliases by maker ("apple" -> iPhone, iOS ...): a prohibited maker covers its products.
_PRODUCTS: dict[str, list[str]] = {}
for _alias, _maker in ALIASES.items():
    _PRODUCTS.setdefault(_maker, []).append(_alias)


@dataclass(frozen=True, slots=True)
class Rule:
    """One testable reading of a hard-constraint sentence.

    Attributes:
        kind: ``confirm`` | ``prohibit`` | ``max`` | ``min`` | ``before`` | ``after``.
        sentence: the constraint sentence, byte-exact.
        source: the id of the message it comes from.
        terms: prohibited terms, lower case (``prohibit``).
        bound: the number (``max`` / ``min``: money or a count) or the minutes after midnight (``before`` / ``after``).
        group: ``money`` | ``people`` | ``time`` for a bound.
        anchor: the word a time bound is about (``arrive``, ``depart`` ...), or empty.
    """

    kind: str
    sentence: str
    source: str
    terms: tuple[str, ...] = ()
    bound: float | None = None
    group: str = ""
    anchor: str = ""
    per: str = ""


def _terms(phrase: str) -> tuple[str, ...]:
    """The prohibited terms of a phrase: its capitalised names (``Apple``, ``Marriott``), else the known
    attribute terms in it (``red-eye``, ``vegan`` ...), else its Chinese objects (``优惠券``, ``余额``); plain English
    words alone are not tested (``the tests`` would match every mention)."""
    out = [w.lower() for w in re.findall(r"\b(?-i:[A-Z][A-Za-z]+)", phrase) if w.lower() not in _STOPWORDS]
    if not out:
        out = [subj for attr, subj in terms_in(phrase) if attr != "lodging"]
    if not out:  # "anything with peanuts", "dishes containing pork": the named ingredient
        m = _WITH.search(phrase)
        if m and m.group(1).lower() not in _STOPWORDS:
            w = m.group(1).lower()
            out = [w[:-1] if w.endswith("s") and not w.endswith("ss") and len(w) > 4 else w]
    if not out and re.search(r"[\u4e00-\u9fff]", phrase[:3]):
        for chunk in _ZH_SPLIT.split(phrase):
            chunk = _ZH_VERBS.sub("", chunk.strip())
            chunk = re.split(r"[了的吧啊呢。！!？?]", chunk)[0]
            if len(chunk) >= 2:
                out.append(chunk[:8])
    for t in list(out):
        maker = ALIASES.get(t, t)
        out += [x for x in (maker, *_PRODUCTS.get(maker, [])) if x not in out]
    return tuple(out)


def _minutes(norm: str) -> int:
    h, m = norm.split(":")
    return int(h) * 60 + int(m)


def _per_kind(text: str) -> str:
    """The unit of a per-unit match, spelled one way ("a night", "/night", 每晚 -> "per night")."""
    t = re.sub(r"^(?:a|an) ", "per ", text.lower())
    return _PER_KIND.get(t, t)


def _bounds(sentence: str, source: str) -> list[Rule]:
    out = []
    found = vals.values_in(sentence)
    for v in found:
        if v.group in ("money", "people"):
            clause = next((c for c in re.split(r"[,;，；]", sentence) if v.text in c), sentence)
            if re.search(r"\d\s*[-~到至]\s*" + re.escape(v.text), clause):
                continue  # the top of a range ("50-100元"): neither bound is tested
            cue = _MAX.search(clause) and "max" or (_MIN.search(clause) and "min")
            per = _PER.search(sentence)
            if cue:
                out.append(Rule(cue, sentence, source, bound=float(v.norm), group=v.group,
                                per=_per_kind(per.group(0)) if per else ""))
        elif v.group == "time":
            clause = next((c for c in re.split(r"[,;，；]|\band\b", sentence) if v.text in c), sentence)
            kind = "before" if _BEFORE.search(clause) else ("after" if _AFTER.search(clause) else "")
            if kind and _NEGATED.search(_FIXED.sub(" ", clause)):  # "no flights before 8am", 4点以后也不行
                kind = "after" if kind == "before" else "before"
            if kind:
                a = _ANCHOR.search(sentence)
                out.append(Rule(kind, sentence, source, bound=_minutes(v.norm), group="time",
                                anchor=a.group(0).lower()[:5] if a else ""))
    return out


def parse(sentence: str, source: str) -> list[Rule]:
    """The rules of one hard-constraint sentence (module docstring); empty when none can be tested."""
    if _CONFIRM.search(sentence) and re.search(r"(?i)never|must|only|without|always|必须|先|不得|之前|不要", sentence):
        return [Rule("confirm", sentence, source)]
    out = _bounds(sentence, source)
    if out:
        return out
    terms: list[str] = []
    for m in _PROHIBIT.finditer(sentence):  # each clause ("No smoking rooms, and never book the Ritz.")
        phrase = re.split(r"[,.;!?，。；！？、]" if not re.search(r"[\u4e00-\u9fff]", sentence[m.end():m.end() + 2])
                          else r"[,.;!?，。；！？]", sentence[m.end():])[0][:60]
        terms += [t for t in _terms(phrase) if t not in terms]
    if terms:
        out.append(Rule("prohibit", sentence, source, terms=tuple(terms)))
    return out


#: A Chinese prohibited term of three or more characters also matches its modifier followed, within
#: this many characters of its clause, by its head noun (无窗房 in 无窗大床房), or in brackets right
#: after the head (大床房（无窗））.
ZH_TERM_SPREAD = 6
_ZH_CLAUSE_END = re.compile(r"[，。；！？,;!?、\n]")
_ZH_NOT = "无不非禁"


def _has_term(text: str, term: str) -> bool:
    """Whether ``text`` names ``term``: an English word (or its plural) on word boundaries; a Chinese
    term as a substring or, for three or more characters, as its modifier (all but the last
    character) and head noun (the last one) in one clause (:data:`ZH_TERM_SPREAD`). A Chinese match
    right after 无, 不, 非 or 禁 is its negation (非吸烟房 names no 吸烟房) unless the term starts so."""
    if re.search(r"[\u4e00-\u9fff]", term):
        negates = term[0] in _ZH_NOT

        def named(at: int) -> bool:
            return negates or at == 0 or text[at - 1] not in _ZH_NOT

        if any(named(m.start()) for m in re.finditer(re.escape(term), text)):
            return True
        if len(term) < 3:
            return False
        mod, head = term[:-1], term[-1]
        for m in re.finditer(re.escape(mod), text):
            end = _ZH_CLAUSE_END.search(text, m.end())
            after = text[m.end(): min(m.end() + ZH_TERM_SPREAD, end.start() if end else len(text))]
            if named(m.start()) and (head in after or re.search(re.escape(head) + r"[（(]$", text[:m.start()])):
                return True
        return False
    return re.search(rf"(?i)\b{re.escape(term)}s?\b", text) is not None


def broken(rule: Rule, text: str, values: list[vals.Value]) -> str | None:
    """Why an action (its ``text`` and ``values``) breaks ``rule``, or ``None`` (``confirm`` rules are
    tested by the verifier against the conversation, not here)."""
    if rule.kind == "prohibit":
        hit = next((t for t in rule.terms if _has_term(text, t)), None)
        return f"names {hit!r}" if hit else None
    if rule.kind in ("max", "min") and rule.bound is not None:
        for v in values:
            if v.group == rule.group and (not rule.per or _per_unit(text, v.text, rule.per) or _per_key(v.key, rule.per)):
                x = float(v.norm)
                if (rule.kind == "max" and x > rule.bound) or (rule.kind == "min" and x < rule.bound):
                    return f"{v.text} is {'above' if rule.kind == 'max' else 'below'} the bound {rule.bound:g}"
        return None
    if rule.kind in ("before", "after") and rule.bound is not None:
        for v in _anchored_times(rule, text, values):
            # a time without am / pm breaks the bound only in both readings; after an evening bound, an
            # early-morning time is the next day ("only after 22:00" -> 00:30 is fine)
            xs = [_minutes(n) + (1440 if rule.kind == "after" and rule.bound >= 1080 and _minutes(n) < 360 else 0)
                  for n in v.norms]
            if all((rule.kind == "before" and x > rule.bound) or (rule.kind == "after" and x < rule.bound) for x in xs):
                return f"{v.text} is {'after' if rule.kind == 'before' else 'before'} the bound"
    return None


def _per_unit(text: str, value_text: str, per: str) -> bool:
    """``value_text`` is given per the rule's unit in ``text``: the English unit words right after it
    ("$547 per person"), the Chinese ones right before it (人均250元)."""
    i = text.find(value_text)
    if i < 0:
        return False
    after = text[i + len(value_text): i + len(value_text) + 16]
    before = text[max(0, i - 6): i]
    for m in (*_PER.finditer(after), *(x for x in _PER.finditer(before) if re.match(r"[\u4e00-\u9fff]", x.group(0)))):
        if m.start() <= 3 or re.match(r"[\u4e00-\u9fff]", m.group(0)):
            return _per_kind(m.group(0)) == per
    return False


def _per_key(key: str, per: str) -> bool:
    """A tool-call argument named per the rule's unit (``price_per_night``, ``nightly_rate``,
    ``cost_per_person``) holds a value per that unit."""
    words = re.sub(r"[_\W]+", " ", key).lower()
    words = re.sub(r"\bnightly\b", "per night", re.sub(r"\bdaily\b", "per day", words))
    return any(_per_kind(m.group(0)) == per for m in _PER.finditer(words))


def _anchored_times(rule: Rule, text: str, values: list[vals.Value]) -> list[vals.Value]:
    """The times of an action a time rule is about: the ones right after the rule's anchor word when it has one."""
    times = [v for v in values if v.group == "time"]
    if not rule.anchor:
        return times
    out = []
    for m in re.finditer(re.escape(rule.anchor), text, re.IGNORECASE):
        window = text[m.end(): m.end() + 30]
        out += [v for v in times if v.text in window]
    return out
