"""Reading profile statements out of user messages (the rules of the user-profile memory).

:func:`statements` finds, sentence by sentence, what a user message says about the user:

- ``preference``: likes and dislikes ("I prefer window seats", "don't recommend Apple", 我不吃辣), with
  the attribute they are about (:data:`ATTRIBUTES`: brand, seat, cabin, food, music ...), the subject
  (``apple``, ``window seat``) and a polarity (+1 likes, -1 avoids); the user's allergies, avoidances
  of attribute ``allergy`` held in general ("I have a severe peanut allergy", 我对花生过敏); and what the
  user rules out booking by name ("Never book Ryanair for us", 也不要订东方航空; not "don't book it yet");
- ``basic`` (age, city, occupation, membership), ``ability`` ("I'm new to Python"), ``goal`` (a goal of
  the user's life, not of the task: "I'm trying to lose weight"), ``decision`` (a decision style: "I
  always pick the cheapest"), ``relationship`` (who a person is to the user: "my wife Anna");

each with the scope cues of the sentence: temporary ("for now", 这次 -> the current task), general
("always", 平时 -> beyond the session) and change ("I've switched to", 不再 -> a changed preference).
:func:`scene_of` names the kind of situation a task is (travel, dining, shopping ...), for the
cross-scene term of the stability score.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..scoring.rules import sentences
from . import lexicon as lx

#: Attributes a preference can be about: attribute -> (exclusive, terms). Exclusive attributes hold one
#: value at a time (a window and an aisle seat conflict; Italian and Thai food do not).
ATTRIBUTES: dict[str, tuple[bool, tuple[str, ...]]] = {
    "brand": (False, ("apple", "iphone", "ios", "ipad", "macbook", "mac", "samsung", "galaxy", "android", "google",
                      "pixel", "huawei", "xiaomi", "oneplus", "sony", "dell", "lenovo", "hp", "asus", "nike", "adidas",
                      "puma", "苹果", "华为", "小米", "三星", "安卓", "索尼", "联想", "耐克", "阿迪")),
    "seat": (True, ("window seat", "window", "aisle seat", "aisle", "middle seat", "front row", "靠窗", "过道", "靠走廊")),
    "cabin": (True, ("basic economy", "premium economy", "economy", "business class", "business", "first class",
                     "经济舱", "商务舱", "头等舱")),
    "diet": (True, ("vegetarian", "vegan", "halal", "kosher", "gluten-free", "gluten free", "pescatarian", "素食", "清真")),
    "food": (False, ("spicy food", "spicy", "seafood", "italian", "chinese", "thai", "indian", "mexican", "japanese",
                     "sushi", "pizza", "burgers", "steak", "korean", "french", "辣", "海鲜", "川菜", "粤菜", "火锅",
                     "日料", "西餐", "烧烤", "香菜", "甜食")),
    "music": (False, ("pop", "rock", "jazz", "classical", "hip hop", "hip-hop", "country", "metal", "concert",
                      "concerts", "流行", "摇滚", "爵士", "古典")),
    "payment": (True, ("credit card", "debit card", "paypal", "gift card", "cash", "apple pay", "微信支付", "支付宝",
                       "信用卡", "现金", "余额", "优惠券")),
    "transport": (False, ("red-eye", "red eye", "nonstop", "non-stop", "direct flight", "layover", "layovers", "train",
                          "bus", "taxi", "high-speed rail", "高铁", "直飞", "转机", "红眼", "地铁", "打车")),
    "lodging": (False, ("hostel", "airbnb", "motel", "resort", "hotel", "民宿", "酒店", "青旅")),
}
#: Brand aliases: the products name their maker (an avoided Apple covers the iPhone and iOS).
ALIASES: dict[str, str] = {"iphone": "apple", "ios": "apple", "ipad": "apple", "macbook": "apple", "mac": "apple",
                           "galaxy": "samsung", "pixel": "google", "苹果": "apple", "华为": "huawei", "小米": "xiaomi",
                           "三星": "samsung", "window": "window seat", "aisle": "aisle seat", "靠窗": "window seat",
                           "过道": "aisle seat", "靠走廊": "aisle seat", "business": "business class", "vegan": "vegan",
                           "non-stop": "nonstop", "direct flight": "nonstop", "red eye": "red-eye", "红眼": "red-eye",
                           "直飞": "nonstop", "素食": "vegetarian", "耐克": "nike", "gluten free": "gluten-free",
                           "concerts": "concert", "hip-hop": "hip hop", "layovers": "layover"}
_TERMS = sorted(((t, a) for a, (_, ts) in ATTRIBUTES.items() for t in ts), key=lambda x: -len(x[0]))
_TERM_RX = re.compile("|".join(
    (re.escape(t) if re.search(r"[\u4e00-\u9fff]", t) else r"\b" + re.escape(t) + r"s?\b") for t, _ in _TERMS), re.I)
_TERM_ATTR = {t: a for t, a in _TERMS}
_STOP = re.compile(r"[,.;!?，。；！？]|\b(?:and|but|because|so|since|as|if|when|for now|this time|anymore|please)\b|"
                   r"但是|因为|所以|了|吧|啊|呢|这次|最近")
_WANT = re.compile(r"\b(?:i (?:want|need|would like|'d like)|give me|book me|我要|我想要|给我)\s*", re.I)
_OTHER_PERSON = re.compile(r"老婆|老公|妻子|丈夫|孩子|儿子|女儿|妈|爸|朋友|同事|同学|室友|老板|领导|客户|爱人|家人|他|她|觉得|说|希望|不")
_TRAILING = frozenset("the a an of in on at to for with from by".split())
#: Phrases that point at an offer instead of naming a taste ("I don't want those tickets": a rejection).
_DEICTIC = re.compile(r"^(?:those|that|this|these|it|them|one|any of|either|the one|the sound of|sound of|now|yet|"
                      r"(?:to )?(?:reserve|book|buy|order|cancel|change|do|go|make|get)\b|这个|那个|这些|那些)\b|"
                      r"^[\u4e00-\u9fff]?的$", re.I)
#: A goal phrase about the conversation itself ("what I'm trying to accomplish with the command below").
_META_GOAL = re.compile(r"(?i)\b(?:command|code|script|error|output|below|above|this message)\b")
_ARTICLE = re.compile(r"^(?:the|a|an|some|any|my|to|with|of|about|using|use|recommend|suggest|offer|show|give)\s+", re.I)

#: Kinds of situation, by the words of a task's first user message and its tool names.
SCENES: dict[str, tuple[str, ...]] = {
    "travel": ("flight", "fly", "hotel", "train", "airline", "trip", "travel", "booking", "reservation", "taxi", "bus",
               "car rental", "rental car", "window seat", "aisle seat", "return flight", "boarding", "luggage",
               "机票", "航班", "酒店", "火车", "高铁", "旅行", "出行", "打车", "景点", "靠窗", "座位"),
    "dining": ("restaurant", "food", "table", "dinner", "lunch", "eat", "cafe", "餐厅", "餐馆", "吃", "饭"),
    "shopping": ("order", "buy", "purchase", "phone", "laptop", "return", "refund", "exchange", "product", "delivery",
                 "订单", "买", "购买", "退货", "退款", "换货", "手机", "快递", "商品"),
    "entertainment": ("movie", "music", "song", "concert", "event", "show", "play", "game", "电影", "音乐", "演出", "歌"),
    "coding": ("repo", "bug", "test", "function", "code", "issue", "commit", "pr_description", "python", "代码", "测试"),
    "operations": ("server", "deploy", "incident", "disk", "latency", "service", "cluster", "服务器", "部署", "告警"),
    "data": ("query", "sql", "report", "dashboard", "dataset", "table", "csv", "数据", "报表", "查询"),
    "health": ("doctor", "dentist", "appointment", "clinic", "medical", "医生", "挂号", "医院"),
    "finance": ("bank", "transfer", "account balance", "payment", "银行", "转账"),
}
_SCENE_RX = {k: re.compile("|".join(re.escape(w) if re.search(r"[\u4e00-\u9fff]", w) else r"\b" + re.escape(w) for w in ws), re.I)
             for k, ws in SCENES.items()}


@dataclass(frozen=True, slots=True)
class Statement:
    """One thing a user sentence says about the user.

    Attributes:
        profile_type: ``basic`` | ``goal`` | ``ability`` | ``preference`` | ``decision`` | ``relationship``.
        attribute: what it is about (``brand``, ``seat``, ``age``, ``wife`` ...; ``general`` when unknown).
        subject: the normalised value (``apple``, ``window seat``, ``34``, ``anna``).
        polarity: +1 likes or is, -1 avoids or is not, 0 neutral.
        quote: the sentence, byte-exact (at most 240 characters).
        temporary: the sentence scopes it to now or this time.
        general: the sentence says it holds in general.
        change: the sentence says it changed.
        name: for a relationship, the person's name when given.
    """

    profile_type: str
    attribute: str
    subject: str
    polarity: int
    quote: str
    temporary: bool = False
    general: bool = False
    change: bool = False
    name: str = ""

    @property
    def key(self) -> str:
        """The profile item this statement is about: ``type:attribute:subject`` (``type:attribute:-subject``
        for an avoidance, so liking and avoiding one thing are two items that conflict)."""
        return f"{self.profile_type}:{self.attribute}:{'-' if self.polarity < 0 else ''}{self.subject}"

    @property
    def family(self) -> str:
        """Statements of one family can conflict: ``type:attribute``."""
        return f"{self.profile_type}:{self.attribute}"


def normalise(subject: str) -> str:
    """A subject's canonical form: lower case, trimmed, aliases resolved (``iOS`` -> ``apple``)."""
    s = " ".join(subject.lower().strip(" '\"“”").split())
    s = ALIASES.get(s, s)
    if s.endswith("s") and s[:-1] in _TERM_ATTR and not s.endswith("ss"):
        s = ALIASES.get(s[:-1], s[:-1])
    return s


def _object(rest: str) -> str:
    """The object phrase after a cue: up to punctuation or a conjunction, at most 5 words or 10 characters."""
    rest = _STOP.split(rest, maxsplit=1)[0].strip()
    for _ in range(3):
        rest = _ARTICLE.sub("", rest).strip()
    if re.search(r"[\u4e00-\u9fff]", rest[:2]):
        return rest[:10]
    words = rest.split()[:6]
    while words and words[-1].lower() in _TRAILING:
        words.pop()
    return " ".join(words)


def _attribute(phrase: str) -> tuple[str, str]:
    """(attribute, subject) of a preference phrase: for a brand or an exclusive attribute the known
    term (``window seat``, ``apple``), for another known attribute the whole phrase (``4 star hotel in
    the north``), else (``general``, the phrase)."""
    m = _TERM_RX.search(phrase)
    if m:
        term = m.group(0).lower()
        term = term if term in _TERM_ATTR else term[:-1]
        attr = _TERM_ATTR.get(term, "general")
        if attr == "brand" or exclusive(attr):
            return attr, normalise(term)
        return attr, normalise(phrase)
    return "general", normalise(phrase)


#: Where a list of allergens ends ("allergic to peanuts, so no peanuts in any meal").
_ALLERGENS_END = re.compile(r"(?i)\b(?:so|because|but|since|which|that|please|if|when|though|although|except|in|on|at|"
                            r"for|with|from|too|as well|now)\b|[，。；：,]\s*(?:so|but|and|i|we|please)\b")
_ALLERGEN_SPLIT = re.compile(r"(?i)\s*(?:,|\band\b|\bor\b|&|、|和|及|跟)\s*")
#: Words before "allergy" and Chinese phrases before 过敏 that name no allergen ("I have no allergies",
#: "I have food allergies", 我是过敏体质, 我有些过敏).
_NO_ALLERGEN = re.compile(r"(?i)^(?:no|any|some|many|several|few|food|seasonal|multiple|other|bad|mild|severe|a few|"
                          r"the|an?)$|^(?:是|也|都|会|还|就|容易|没|点|些|一点|有些)")


def _singular(phrase: str) -> str:
    """``peanuts`` -> ``peanut``, ``strawberries`` -> ``strawberry`` (the last word); ``shellfish``,
    ``citrus`` and Chinese stay."""
    if re.search(r"[^a-z]", phrase[-1:]) or re.search(r"(?:ss|us|is)$", phrase):
        return phrase
    return re.sub(r"ies$", "y", phrase) if phrase.endswith("ies") and len(phrase) > 4 else phrase.removesuffix("s")


def _allergies(sent: str) -> list[Statement]:
    """The user's allergies (:data:`lexicon.ALLERGY <ctxscore.memory.lexicon.ALLERGY>`): one avoidance
    per allergen, attribute ``allergy``, held in general (an allergy is no passing taste)."""
    out: list[Statement] = []
    for m in lx.ALLERGY.finditer(sent):
        said = m.group("what") or m.group("thing") or m.group("zwhat") or ""
        if m.group("zwhat") and _OTHER_PERSON.search(said):
            continue  # 我不过敏, 我老婆对花生过敏: no allergy of the user's
        for part in _ALLERGEN_SPLIT.split(_ALLERGENS_END.split(said, maxsplit=1)[0]):
            part = _ARTICLE.sub("", part.strip(" -")).strip()
            if not part or len(part.split()) > 3 or _NO_ALLERGEN.search(part):
                continue
            subj = _singular(normalise(part))
            if not any(s.subject == subj for s in out):
                out.append(Statement("preference", "allergy", subj, -1, sent[:240], general=True))
    return out


#: A name a booking avoidance is about: capitalised words ("Ryanair", "British Airways", "the Hilton"),
#: or a Chinese name of an airline or a hotel (东方航空, 国航, 如家酒店).
_NAMED = re.compile(r"^[A-Z][\w'&.-]*(?:\s+[A-Z][\w'&.-]*)*|^(?![这那哪此该])[\u4e00-\u9fff]{1,8}?"
                    r"(?:航空公司|航空|航|酒店|宾馆|饭店|旅馆|民宿|客栈)(?=的|$)")
_NOT_NAMED = re.compile(r"(?i)^(?:i|anything|anyone|anywhere|something|everything|nothing|yet|now|today|tomorrow|"
                        r"monday|tuesday|wednesday|thursday|friday|saturday|sunday|january|february|march|april|may|"
                        r"june|july|august|september|october|november|december)\b")


def _avoided_bookings(sent: str, cues: dict[str, bool]) -> list[Statement]:
    """What the user rules out booking (:data:`lexicon.AVOID_BOOKING
    <ctxscore.memory.lexicon.AVOID_BOOKING>`) when the sentence names it ("Never book Ryanair for us",
    也不要订东方航空): an avoidance of its attribute (``brand``, ``lodging`` ...; ``general`` for a
    name of no known attribute, an airline or "the Hilton", as "I never fly Ryanair" is). An object
    that names nothing ("don't book it yet", "don't book anything before Friday", 先别订, 不要订太贵的)
    is a step of the task, not the user's."""
    out = []
    for m in lx.AVOID_BOOKING.finditer(sent):
        phrase = _object(sent[m.end():])
        name = None if _DEICTIC.match(phrase) else _NAMED.match(phrase)
        if name is None or _NOT_NAMED.match(name.group(0)):
            continue
        attr, subj = _attribute(name.group(0))
        out.append(Statement("preference", attr, subj, -1, sent[:240], **cues))
    return out


def _preferences(sent: str) -> list[Statement]:
    cues = dict(temporary=bool(lx.TEMPORARY.search(sent)), general=bool(lx.GENERAL.search(sent)),
                change=bool(lx.CHANGE.search(sent)))
    out = _allergies(sent)
    allergies = [m.span() for m in lx.ALLERGY.finditer(sent)]
    for rx, pol in ((lx.PREF_NEG, -1), (lx.PREF_POS, 1)):
        for m in rx.finditer(sent):
            if _OTHER_PERSON.search(m.groupdict().get("gap") or ""):
                continue  # 我老婆喜欢 ...: someone else's taste
            if any(a <= m.start() < b for a, b in allergies):
                continue  # "I'm allergic to", 我对 ... 过敏: an allergy, read by _allergies
            phrase = _object(sent[m.end():])
            if not phrase or _DEICTIC.match(phrase) or (len(phrase) < 2 and not re.match(r"[\u4e00-\u9fff]", phrase)):
                continue
            attr, subj = _attribute(phrase)
            if attr == "general" and len(subj.split()) > 4:
                continue
            if not any(s.subject == subj for s in out):
                out.append(Statement("preference", attr, subj, pol, sent[:240], **cues))
    for m in _WANT.finditer(sent):  # "I want an aisle seat": a choice for this task when it names an exclusive attribute
        attr, subj = _attribute(_object(sent[m.end():]))
        if exclusive(attr) and not any(s.subject == subj for s in out):
            out.append(Statement("preference", attr, subj, 1, sent[:240], temporary=not cues["general"],
                                 general=cues["general"], change=cues["change"]))
    out += [s for s in _avoided_bookings(sent, cues) if not any(o.subject == s.subject for o in out)]
    if not out:  # a bare term with an avoidance ("No red-eye flights, please") is a preference too
        for m in lx.PROHIBITION.finditer(sent):
            phrase = _object(sent[m.end():])
            attr, subj = _attribute(phrase) if phrase else ("general", "")
            if attr != "general":
                out.append(Statement("preference", attr, subj, -1, sent[:240], **cues))
                break
    return out


def _others(sent: str) -> list[Statement]:
    out = []
    cues = dict(temporary=bool(lx.TEMPORARY.search(sent)), general=bool(lx.GENERAL.search(sent)))
    for m in lx.RELATION.finditer(sent):
        rel = (m.group("rel") or m.group("zrel") or "").lower()
        name = m.group("name") or m.group("zname") or ""
        out.append(Statement("relationship", rel, normalise(name or rel), 0, sent[:240], name=name))
    for m in lx.BASIC.finditer(sent):
        attr, v = next((a, v) for a, v in m.groupdict().items() if v)
        out.append(Statement("basic", attr.removeprefix("z"), normalise(v), 1, sent[:240], **cues))
    for rx, ptype in ((lx.ABILITY, "ability"), (lx.LIFE_GOAL, "goal")):
        m = rx.search(sent)
        if m:
            phrase = _object(sent[m.end():]) or m.group(0)
            if ptype == "goal" and _META_GOAL.search(sent[m.end(): m.end() + 80]):
                continue  # a goal of the request at hand, not of the user's life
            out.append(Statement(ptype, "general", normalise(f"{m.group(0).strip()} {phrase}".strip()), 1, sent[:240], **cues))
    m = lx.DECISION_STYLE.search(sent)
    if m:
        what = m.group("what") or m.group("zwhat") or "price"
        out.append(Statement("decision", "style", normalise(what), 1, sent[:240], general=True))
    return out


def statements(text: str) -> list[Statement]:
    """Every profile statement of a user message, sentence by sentence (see the module docstring)."""
    out: list[Statement] = []
    for sent in sentences(text[:4000]):
        if len(sent) > 400:
            continue
        others = _others(sent)
        if any(s.profile_type in ("decision", "relationship") for s in others):
            out += others  # "I always pick the cheapest" is a decision style; "my wife likes" is not the user's taste
            continue
        out += _preferences(sent)
        out += others
    return out


def terms_in(text: str) -> list[tuple[str, str]]:
    """``(attribute, subject)`` of every attribute term in ``text`` (what an offer the user chose is about)."""
    seen: dict[tuple[str, str], None] = {}
    for m in _TERM_RX.finditer(text):
        term = m.group(0).lower()
        term = term if term in _TERM_ATTR else term[:-1]
        if term in _TERM_ATTR:
            seen.setdefault((_TERM_ATTR[term], normalise(term)), None)
    return list(seen)


def scene_of(text: str) -> str:
    """The kind of situation a text is about (:data:`SCENES`), or ``"general"``."""
    best, hits = "general", 0
    for scene, rx in _SCENE_RX.items():
        n = len(rx.findall(text[:2000]))
        if n > hits:
            best, hits = scene, n
    return best


def exclusive(attribute: str) -> bool:
    """Whether an attribute holds one value at a time (:data:`ATTRIBUTES`)."""
    return ATTRIBUTES.get(attribute, (False, ()))[0]
