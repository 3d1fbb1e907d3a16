"""Task boundaries: where a finished task ends and a new one begins.

Instructions are pinned only while their task is active (``../shared/DESIGN.md``). A new task
starts at a message that:

- is a system message after the first messages (a new agent episode), or, when it is not the first
  user message after the system messages that opened the current task,
- is a task statement handed to an agent (``<pr_description>``, "your task is" ...), or
- comes right after a closing exchange -- one of the two previous messages holds a ``closing``
  keyword ("that's all", "have a good day", "bye", "###STOP###", "Transfer successful", 再见,
  不客气 ...) and, for an assistant message, does not go on to ask about the task (:func:`_closes`)
  -- and is not the user's own farewell ("Thank you, that is all I need." closes, it
  opens nothing; :func:`_farewell`), and either is a user request or greeting (the rule file's
  ``request`` / ``greeting`` keywords, or a question), or follows a closing the user took part in
  (the last user message asked nothing, ended on a closing or pleasantry keyword and held no
  request keyword unless it held a closing one: "No, thanks."
  -> "Have a lovely day." -> "Set an alarm titled Cleaning for half past 3."; :func:`_user_closed`)
  and holds no ``pleasantry`` keyword in at least :data:`MIN_OPENING_CHARS` characters.

The keywords and rules were extended from the missed and false boundaries of the chained train
sessions (never the dev or evaluation sessions): on them precision / recall went 0.907 / 0.855 ->
0.911 / 0.958.

Measured against the real boundaries of the chained evaluation sessions (each member dialogue or
trajectory is a task; ``python -m eval boundaries``): see the README.
"""

from __future__ import annotations

import re

from ..messages import Message, Role
from ..scoring.rules import RuleConfig, sentences
from .history import History, is_observation, is_task_statement

_WORD = re.compile(r"\w")
#: How many previous messages may hold the closing words.
CLOSING_WINDOW = 2
#: After a closing exchange the user took part in, a user message of at least this many characters
#: that is no pleasantry opens a task even without a request word.
MIN_OPENING_CHARS = 16


def starts_task(history: History, msg: Message, config: RuleConfig) -> bool:
    """True when ``msg`` (about to be appended) opens a new task (see the module docstring)."""
    n = len(history)
    if n == 0:
        return False
    if msg.role == Role.SYSTEM:
        return history.entries[-1].msg.role != Role.SYSTEM
    if msg.role != Role.USER or is_observation(msg):
        return False
    if all(e.msg.role == Role.SYSTEM for e in history.entries[history.task_starts[-1]:]):
        return False  # the task opened by the system messages right before this one
    if is_task_statement(msg):
        return True
    kw = config.keyword_regexes
    closing = kw.get("closing")
    if closing is None or not any(_closes(e.msg, closing) for e in history.entries[-CLOSING_WINDOW:]):
        return False
    head = msg.content[:300]
    if _farewell(head, kw):
        return False  # the user's own farewell ("Thank you, that is all I need.")
    if any(g in kw and kw[g].search(head) for g in ("request", "greeting")) or _asks(head):
        return True
    pleasantry = kw.get("pleasantry")
    return (_user_closed(history, kw) and len(head.strip()) >= MIN_OPENING_CHARS
            and (pleasantry is None or not pleasantry.search(head)))


#: A last question that still closes: it offers more help ("Anything else?", 还有其他需要吗？).
_OFFERS_MORE = re.compile(r"(?i)\belse\b|\bmore\b|\banything\b|其他|别的|还有|还需要")


def _closes(msg: Message, closing: re.Pattern[str]) -> bool:
    """Whether a message closes its task: its end holds a ``closing`` keyword, and an assistant
    message does not go on to ask about the task ("Happy to help! What dates are you thinking of?"
    opened the conversation; "You're welcome! Anything else?" closes it)."""
    end = msg.content[-600:]
    if not closing.search(end):
        return False
    if msg.role != Role.ASSISTANT or not _asks(end):
        return True
    last = next((x for x in reversed(sentences(end)) if _WORD.search(x)), "")
    return not _asks(last) or _OFFERS_MORE.search(last) is not None


def _asks(text: str) -> bool:
    """Whether ``text`` holds a question mark (ASCII or full-width)."""
    return "?" in text or "？" in text


def _ends_on_thanks(text: str, kw: dict[str, re.Pattern[str]]) -> bool:
    """Whether the last sentence of ``text`` with a word in it (:func:`~ctxscore.scoring.rules.sentences`;
    "Thanks, bye!! 😊" ends on "Thanks, bye!!") holds a ``closing`` or ``pleasantry`` keyword."""
    last = next((x for x in reversed(sentences(text)) if _WORD.search(x)), "")
    return any(g in kw and kw[g].search(last) for g in ("closing", "pleasantry"))


def _farewell(text: str, kw: dict[str, re.Pattern[str]]) -> bool:
    """Whether a user message is the user's own farewell rather than a new request: it holds a
    ``closing`` keyword, its last sentence holds a ``closing`` or ``pleasantry`` one, it asks
    nothing and it does not open with a greeting unless thanks follow it ("Thank you, that is all I
    need.", "Hey thanks, you too! That's all I need.", "好的，谢谢你了。"; not "Hi, all I need now is
    a taxi to the airport at 5pm." nor "Thanks, that's all for the hotel. Now I need a taxi.")."""
    closing, pleasantry, greeting = (kw.get(g) for g in ("closing", "pleasantry", "greeting"))
    if closing is None or _asks(text) or not closing.search(text):
        return False
    text = text.lstrip()
    g = greeting.match(text) if greeting is not None else None
    if g is not None and not (pleasantry is not None and pleasantry.search(text[g.end():])):
        return False  # a greeting, then no thanks: a new conversation ("Hi, all I need now is a taxi")
    return _ends_on_thanks(text, kw)


def _user_closed(history: History, kw: dict[str, re.Pattern[str]]) -> bool:
    """Whether the user took part in the closing exchange: the last user message among the previous
    :data:`CLOSING_WINDOW` asks nothing, its last sentence holds a ``closing`` or ``pleasantry``
    keyword, and it holds no ``request`` keyword unless it holds a ``closing`` one ("No, thanks.",
    "That will be all. Thank you!", "谢谢你了"; not "OK. What's the address?", "Great, book it for 3
    people." nor "谢谢，再帮我查一下天气"). A tool observation sent as a user message (mini-SWE-agent's
    ``<returncode>``) is not the user speaking."""
    for e in reversed(history.entries[-CLOSING_WINDOW:]):
        if e.msg.role != Role.USER:
            continue
        text = e.msg.content[-300:]
        if is_observation(e.msg) or _asks(text) or not _ends_on_thanks(text, kw):
            return False
        closing, request = kw.get("closing"), kw.get("request")
        return request is None or not request.search(text) or (closing is not None and closing.search(text) is not None)
    return False
