"""Task boundaries: where a finished task ends and a new one begins.

Instructions are pinned only while their task is active (``../shared/DESIGN.md``). A new task
starts at a message that:

- is a system message after the first messages (a new agent episode), or, when it is not the first
  user message after the system messages that opened the current task,
- is a task statement handed to an agent (``<pr_description>``, "your task is" ...), or
- comes right after a closing exchange -- one of the two previous messages holds a ``closing``
  keyword ("that's all", "have a good day", "bye", "###STOP###", "Transfer successful", 再见,
  不客气 ...) -- and is not itself a farewell (no ``closing`` keyword: "Thank you, that is all I
  need." closes, it opens nothing), and either is a user request or greeting (the rule file's
  ``request`` / ``greeting`` keywords, or a question), or follows a closing the user took part in
  (the last user message held a ``closing`` or ``pleasantry`` keyword: "No, thanks." -> "Have a
  lovely day." -> "Set an alarm titled Cleaning for half past 3.") and holds no ``pleasantry``
  keyword in at least :data:`MIN_OPENING_CHARS` characters.

The keywords were extended from the missed boundaries of the chained train sessions (never the dev
or evaluation sessions): on them precision / recall went 0.909 / 0.854 -> 0.905 / 0.956.

Measured against the real boundaries of the chained evaluation sessions (each member dialogue or
trajectory is a task; ``python -m eval boundaries``): see the README.
"""

from __future__ import annotations

import re

from ..messages import Message, Role
from ..scoring.rules import RuleConfig
from .history import History

_TASK_STATEMENT = re.compile(r"<pr_description>|<issue>|(?i:please solve this issue|your task is|## task)")
_OBSERVATION = re.compile(r"<returncode>|^\s*<output")
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
    if msg.role != Role.USER or _OBSERVATION.search(msg.content[:200]):
        return False
    if all(e.msg.role == Role.SYSTEM for e in history.entries[history.task_starts[-1]:]):
        return False  # the task opened by the system messages right before this one
    if _TASK_STATEMENT.search(msg.content[:2000]):
        return True
    kw = config.keyword_regexes
    closing = kw.get("closing")
    if closing is None or not any(closing.search(e.msg.content[-600:]) for e in history.entries[-CLOSING_WINDOW:]):
        return False
    head = msg.content[:300]
    if closing.search(head):
        return False  # the user's own farewell ("Thank you, that is all I need.")
    if any(g in kw and kw[g].search(head) for g in ("request", "greeting")) or "?" in head or "？" in head:
        return True
    pleasantry = kw.get("pleasantry")
    return (_user_closed(history, kw) and len(head.strip()) >= MIN_OPENING_CHARS
            and (pleasantry is None or not pleasantry.search(head)))


def _user_closed(history: History, kw: dict[str, re.Pattern[str]]) -> bool:
    """Whether the user took part in the closing exchange: the last user message among the previous
    :data:`CLOSING_WINDOW` holds a closing or pleasantry keyword ("No, thanks.", "谢谢你了"); a tool
    observation sent as a user message (mini-SWE-agent's ``<returncode>``) is not the user speaking."""
    for e in reversed(history.entries[-CLOSING_WINDOW:]):
        if e.msg.role == Role.USER:
            return not _OBSERVATION.search(e.msg.content[:200]) and any(g in kw and kw[g].search(e.msg.content[-300:]) for g in ("closing", "pleasantry"))
    return False
