"""Weak labels: a category, an importance and a confidence per message, derived from what each
corpus annotates (dialogue acts, tool results, return codes, ...).

Each source module (``training.data.sources.*``) owns its rules; this module holds the shared
record type, the shared text patterns and the fallback labeller used for sources without
annotations (the bundled set, LoCoMo). The rule tables are written out in ``data/README.md``.

Confidences are fixed per rule (how unambiguous the annotation is under the annotation guide in
``../shared/datasets/labels/README.md``), not fitted probabilities; importance follows the guide's
0-3 scale.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

CATEGORIES: tuple[str, ...] = ("instruction", "key_state", "reasoning", "failure")


@dataclass(frozen=True, slots=True)
class WeakLabel:
    """One weak label.

    Attributes:
        category: one of :data:`CATEGORIES`.
        importance: 0-3 on the annotation guide's scale.
        confidence: fraction in [0, 1]; how unambiguous the rule that fired is.
        rule: short name of the rule that fired (the rule tables in ``data/README.md`` use it).
        spans: annotation values found verbatim in the message text (weak key spans, at most 8).
    """

    category: str
    importance: int
    confidence: float
    rule: str
    spans: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.category not in CATEGORIES:
            raise ValueError(f"weak label category {self.category!r} is not one of {CATEGORIES}")
        if not 0 <= self.importance <= 3:
            raise ValueError(f"weak label importance {self.importance} is outside 0..3")

    def with_spans(self, spans: list[str] | tuple[str, ...]) -> WeakLabel:
        """A copy carrying ``spans``."""
        return WeakLabel(self.category, self.importance, self.confidence, self.rule, tuple(spans))

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (``spans`` as a list)."""
        d = asdict(self)
        d["spans"] = list(self.spans)
        return d


# --- shared patterns ---------------------------------------------------------------------------

#: Pleasantries with no content (guide: greetings, thanks, bye, "anything else?").
PLEASANTRY_EN = re.compile(
    r"^\W*(?:hi|hello|hey|thanks?(?: you)?(?: so much| very much| a lot| alot)?|thank you|ok(?:ay)?|great|"
    r"perfect|bye|goodbye|good ?bye|have a (?:great|good|nice) (?:day|one|trip)[^.!?]*|you'?re welcome|"
    r"no,? that'?s (?:all|it)[^.!?]*|that'?s (?:all|it)[^.!?]*|no(?:pe)?|sure|cool|awesome|"
    r"(?:is there )?anything else(?: i can (?:help|do)[^?]*)?|can i help (?:you )?with anything else|"
    r"not (?:right )?now|take care|cheers|###stop###)(?:[\s,.!?]+(?:hi|hello|thanks?|thank you|"
    r"bye|goodbye|ok(?:ay)?|great|perfect|that'?s (?:all|it)[^.!?]*|have a (?:great|good|nice) "
    r"(?:day|one|trip)[^.!?]*|take care|cheers|###stop###|for (?:your|the) help|again|so much|"
    r"a lot|very much))*\W*$",
    re.IGNORECASE,
)
PLEASANTRY_ZH = re.compile(
    r"^[\s，。！？!?,.~～]*(?:您好|你好|谢谢|多谢|感谢|非常感谢|收到|好的|好|嗯|不客气|再见|拜拜|没有了|没事了|"
    r"祝[^，。！？]{0,12}(?:愉快|开心|顺利)|很高兴为您服务|客气了|太感谢了|谢啦|OK|ok)"
    r"(?:[\s，。！？!?,.~～]*(?:您好|你好|谢谢|多谢|感谢|非常感谢|收到|好的|好|嗯|不客气|再见|拜拜|"
    r"没有了|没事了|你|您|啦|了|呢|哦|呀|真是|太|的|帮助|祝[^，。！？]{0,12}(?:愉快|开心|顺利)|"
    r"很高兴为您服务|客气了|太感谢了|谢啦|OK|ok))*[\s，。！？!?,.~～]*$"
)
#: Text that reports a failure (English and Chinese).
ERROR_TEXT = re.compile(
    r"(?:^Error\b|Traceback \(most recent call last\)|\bException\b|\berror:|not available|"
    r"could not be|couldn'?t|unable to|failed|失败|错误|抱歉|没有找到|找不到)",
    re.IGNORECASE,
)
#: Request or constraint wording (guide: request verbs, must / never / budget / deadline).
REQUEST_TEXT = re.compile(
    r"(?:\b(?:please|i want|i'?d like|i would like|i need|i'?m looking|i am looking|can you|could you|"
    r"would you|find|book|reserve|cancel|change|upgrade|modify|fix|implement|must|never|don'?t|do not|"
    r"should|only|budget|deadline|no later than|before|after|at least|at most)\b|"
    r"请|帮我|我想|我要|需要|要求|必须|不要|实现|找一?个|推荐)",
    re.IGNORECASE,
)


def is_pleasantry(text: str, language: str = "en") -> bool:
    """True when ``text`` is only a greeting / thanks / goodbye / "anything else" formula."""
    t = text.strip()
    if not t:
        return True
    if language == "zh":
        return bool(PLEASANTRY_ZH.match(t))
    return len(t) <= 160 and bool(PLEASANTRY_EN.match(t))


#: Short greeting / closing openers ("You're welcome, Hannah. Have a great trip!").
GREETING_OPENER = re.compile(
    r"^\W*(?:hi|hello|hey|good (?:morning|afternoon|evening)|you'?re (?:very )?welcome|no problem|"
    r"thanks?(?: you)?|have a (?:great|good|nice)|您好|你好|不客气|谢谢)\b", re.IGNORECASE)
NONZERO_RETURNCODE = re.compile(r"<returncode>(?!0<)-?\d+</returncode>")


def generic_weak_label(role: str, text: str, language: str = "en", *, position: int = 0) -> WeakLabel:
    """Fallback weak label from role and wording only, for sources without annotations.

    Rules, first match wins: system -> instruction 3; pleasantry, or a short (< 80 characters)
    message opening with a greeting / thanks -> failure 0; a non-zero ``<returncode>`` or error
    wording -> failure 1; first user message or user request wording -> instruction 2; other
    user text -> key_state 2; assistant tool call (``TOOL_CALL``) -> reasoning 1; tool output ->
    key_state 1; assistant text ending in a question -> reasoning 1; other assistant text ->
    key_state 1.
    """
    if role == "system":
        return WeakLabel("instruction", 3, 0.8, "generic:system")
    if is_pleasantry(text, language) or (len(text) < 80 and GREETING_OPENER.match(text)):
        return WeakLabel("failure", 0, 0.7, "generic:pleasantry")
    if NONZERO_RETURNCODE.search(text[:300]) or ERROR_TEXT.search(text[:400]):
        return WeakLabel("failure", 1, 0.5, "generic:error_text")
    if role == "user":
        if position <= 1 or REQUEST_TEXT.search(text):
            return WeakLabel("instruction", 2, 0.5, "generic:user_request")
        return WeakLabel("key_state", 2, 0.4, "generic:user_value")
    if role == "assistant" and (text.startswith("TOOL_CALL ") or "\nTOOL_CALL " in text):
        return WeakLabel("reasoning", 1, 0.5, "generic:tool_call")
    if role == "tool":
        return WeakLabel("key_state", 1, 0.4, "generic:tool_output")
    if text.rstrip().endswith(("?", "？")):
        return WeakLabel("reasoning", 1, 0.4, "generic:question")
    return WeakLabel("key_state", 1, 0.3, "generic:assistant")
