"""Task boundaries: where a finished task ends and a new one begins.

Instructions are pinned only while their task is active (``../shared/DESIGN.md``). A new task
starts at a message that:

- is a system message after the first messages (a new agent episode), or
- is a task statement handed to an agent (``<pr_description>``, "your task is" ...), or
- is a user request or greeting (the rule file's ``request`` / ``greeting`` keywords, or a question)
  right after a closing exchange: one of the two previous messages holds a ``closing`` keyword
  ("that's all", "have a good day", "bye", "###STOP###", 再见, 不客气 ...).

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


def starts_task(history: History, msg: Message, config: RuleConfig) -> bool:
    """True when ``msg`` (about to be appended) opens a new task (see the module docstring)."""
    n = len(history)
    if n == 0:
        return False
    if msg.role == Role.SYSTEM:
        return history.entries[-1].msg.role != Role.SYSTEM
    if msg.role != Role.USER or _OBSERVATION.search(msg.content[:200]):
        return False
    if _TASK_STATEMENT.search(msg.content[:2000]):
        return True
    kw = config.keyword_regexes
    closing = kw.get("closing")
    if closing is None or not any(closing.search(e.msg.content[-600:]) for e in history.entries[-CLOSING_WINDOW:]):
        return False
    head = msg.content[:300]
    return any(g in kw and kw[g].search(head) for g in ("request", "greeting")) or "?" in head or "？" in head
