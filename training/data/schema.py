"""The session / message record shared by every loader (see ``docs/contracts.md``).

A session is a plain dict (JSON-serialisable)::

    {"session_id": "tau_airline/airline-t3-r0", "source": "tau_airline", "group": "tau_airline/t3",
     "language": "en", "upstream_split": "test",
     "messages": [{"id": "tau_airline/airline-t3-r0#0", "index": 0, "role": "system",
                   "content": "...", "name": None, "tool_calls": None, "tool_call_id": None,
                   "text": "...", "weak": {...}}],
     "key_facts": [{"fact_id", "value", "source_index", "probe", "kind", "superseded"?}]}

``text`` is the rendering the annotators saw (``ctxscore.types.Message.text``). ``weak`` is the
weak label (:class:`training.data.weak.WeakLabel` as a dict) and ``key_facts`` the facts the
evaluation probes; both are filled by the source loaders from the corpus annotations.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ctxscore.messages import Message

#: Texts longer than this were shown to the annotators cut in the middle (labels README).
CUT_LIMIT = 1800
#: Characters kept at each end of a cut text.
CUT_KEEP = 900

#: A session record of the corpora, as above (a plain dict; not the runtime's or the evaluation's session types).
CorpusSession = dict[str, Any]
#: One message record of a :data:`CorpusSession`.
MessageRecord = dict[str, Any]


def render_text(role: str, content: str, name: str | None = None, tool_calls: list | None = None) -> str:
    """The text the distilled-label annotators saw for one message.

    Reuses :meth:`ctxscore.types.Message.text`: tool messages with a name as ``[name] content``;
    assistant tool calls as ``TOOL_CALL name(arguments)`` joined with ``"; "`` after the content and
    a newline; everything else the raw content.
    """
    return Message(role=role, content=content, name=name, tool_calls=tool_calls or None).text()


def make_message(
    session_id: str,
    index: int,
    role: str,
    content: str | None,
    *,
    name: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    tool_call_id: str | None = None,
) -> MessageRecord:
    """One message record with its README id ``{session_id}#{index}`` and rendered ``text``.

    ``content`` ``None`` becomes ``""`` (OpenAI assistant messages that only carry tool calls).
    """
    content = "" if content is None else content
    return {
        "id": f"{session_id}#{index}",
        "index": index,
        "role": role,
        "content": content,
        "name": name,
        "tool_calls": tool_calls or None,
        "tool_call_id": tool_call_id,
        "text": render_text(role, content, name, tool_calls),
    }


def make_session(
    session_id: str,
    source: str,
    group: str,
    language: str,
    upstream_split: str,
    messages: list[MessageRecord],
    **extra: Any,
) -> CorpusSession:
    """A session record; ``extra`` keys (for example ``key_facts``, ``meta``) are kept as given."""
    out: CorpusSession = {
        "session_id": session_id,
        "source": source,
        "group": group,
        "language": language,
        "upstream_split": upstream_split,
        "messages": messages,
    }
    out.setdefault("key_facts", [])
    out.update(extra)
    return out


def visible_parts(text: str) -> tuple[str, str]:
    """The parts of ``text`` the annotators saw: the whole text and ``""`` when it is at most
    :data:`CUT_LIMIT` characters, else the first and the last :data:`CUT_KEEP` characters."""
    if len(text) <= CUT_LIMIT:
        return text, ""
    return text[:CUT_KEEP], text[-CUT_KEEP:]


def span_visible(text: str, span: str) -> bool:
    """True when ``span`` lies in a part of ``text`` the annotators saw (see :func:`visible_parts`)."""
    head, tail = visible_parts(text)
    return span in head or (bool(tail) and span in tail)


def find_in_messages(
    messages: Iterable[MessageRecord],
    value: str,
    *,
    ignore_case: bool = False,
    roles: tuple[str, ...] | None = None,
    start: int = 0,
    stop: int | None = None,
) -> tuple[int, str] | None:
    """Earliest message whose ``content`` contains ``value``.

    Returns ``(position in messages, exact substring of that content)`` or ``None``. With
    ``ignore_case`` the returned substring keeps the content's own casing, so it is always an exact
    substring of ``content`` (the eval contract). ``start``/``stop`` bound the positions searched.
    """
    if not value:
        return None
    needle = value.casefold() if ignore_case else value
    for pos, msg in enumerate(messages):
        if pos < start:
            continue
        if stop is not None and pos >= stop:
            break
        if roles is not None and msg["role"] not in roles:
            continue
        content = msg["content"] or ""
        if not ignore_case:
            if value in content:
                return pos, value
            continue
        hay = content.casefold()
        at = hay.find(needle)
        # casefold can change lengths (e.g. German sharp s); only accept a length-preserving match
        if at >= 0 and len(hay) == len(content):
            found = content[at : at + len(value)]
            if found.casefold() == needle:
                return pos, found
    return None


def spans_in_text(text: str, candidates: Iterable[str], limit: int = 8, *, ignore_case: bool = False) -> list[str]:
    """Distinct candidates (in order) that are substrings of ``text`` and visible to annotators,
    at most ``limit`` of them; used for weak key spans from annotation values. With
    ``ignore_case`` a candidate is matched case-insensitively and returned in the text's casing."""
    out: list[str] = []
    folded = text.casefold() if ignore_case and len(text.casefold()) == len(text) else None
    for c in candidates:
        c = (c or "").strip()
        if len(c) < 2:
            continue
        if folded is not None and c not in text:
            at = folded.find(c.casefold())
            if at < 0:
                continue
            c = text[at : at + len(c)]
        if c in out or not span_visible(text, c):
            continue
        out.append(c)
        if len(out) >= limit:
            break
    return out


def read_zipped_json(path: Path) -> Any:
    """The JSON document inside a zip archive (the first ``*.json`` member), read without unpacking
    to disk (MultiWOZ and CrossWOZ ship ``val.json.zip`` / ``test.json.zip``)."""
    import zipfile

    with zipfile.ZipFile(path) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".json"))
        with zf.open(name) as fh:
            return json.load(fh)
