"""The project-written labelled set, ``data/bundled/sessions.jsonl`` (source ``bundled``).

One session per line::

    {"session_id": "bundled/...", "language": "en"|"zh", "scenario": str,
     "messages": [{"role", "content", "name"?, "tool_calls"?, "tool_call_id"?,
                   "label": {"category", "importance", "key_spans"}}],
     "key_facts": [{"fact_id", "value", "source_index", "probe", "kind", "superseded"?}]}

Message ids are ``{session_id}#{i}``. The gold label is the
message's ``label`` (``label_source`` ``bundled``). The group is the scenario family
(``bundled/{scenario}``): the sessions of a family are variants of one template, in both
languages, so a family must not straddle splits. The weak label comes from
:func:`training.data.weak.generic_weak_label` so the weak-label table covers this source too.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ctxscore.errors import InputError
from ctxscore.io import iter_jsonl

from ..facts import check_facts
from ..labels import LabelFormatError, validate_label
from ..schema import CorpusSession, make_message, make_session
from ..weak import generic_weak_label

SOURCE = "bundled"
ROLES = ("system", "user", "assistant", "tool")


class BundledFormatError(ValueError):
    """A malformed line of the bundled set (the message names the file, line and field)."""


def _session(obj: Any, where: str) -> CorpusSession:
    if not isinstance(obj, dict):
        raise BundledFormatError(f"{where}: expected a JSON object per line")
    sid = obj.get("session_id")
    if not isinstance(sid, str) or not sid.startswith(f"{SOURCE}/"):
        raise BundledFormatError(f"{where}: session_id must be a string starting with 'bundled/', got {sid!r}")
    lang = obj.get("language", "en")
    if lang not in ("en", "zh"):
        raise BundledFormatError(f"{where}: language must be 'en' or 'zh', got {lang!r}")
    raw = obj.get("messages")
    if not isinstance(raw, list) or not raw:
        raise BundledFormatError(f"{where}: 'messages' must be a non-empty list")
    messages = []
    for i, r in enumerate(raw):
        mw = f"{where} message {i}"
        if not isinstance(r, dict) or r.get("role") not in ROLES:
            raise BundledFormatError(f"{mw}: role must be one of {', '.join(ROLES)}")
        content = r.get("content")
        if content is not None and not isinstance(content, str):
            raise BundledFormatError(f"{mw}: content must be a string")
        m = make_message(sid, i, r["role"], content, name=r.get("name"), tool_calls=r.get("tool_calls"),
                         tool_call_id=r.get("tool_call_id"))
        if not m["content"] and not m["tool_calls"]:
            raise BundledFormatError(f"{mw}: empty content without tool_calls")
        m["weak"] = generic_weak_label(m["role"], m["text"], lang, position=i).to_dict()
        label = r.get("label")
        if label is not None:
            try:
                rec = validate_label({"id": m["id"], **label}, mw)
            except (LabelFormatError, TypeError) as exc:
                raise BundledFormatError(str(exc)) from exc
            missing = [s for s in rec["key_spans"] if s not in m["text"]]
            if missing:
                raise BundledFormatError(f"{mw}: key_spans not found in the message text: {missing}")
            m["gold"] = rec
        messages.append(m)
    facts = obj.get("key_facts") or []
    if not isinstance(facts, list) or not all(isinstance(f, dict) for f in facts):
        raise BundledFormatError(f"{where}: key_facts must be a list of objects")
    for f in facts:
        lacking = [k for k in ("fact_id", "value", "source_index", "probe", "kind") if k not in f]
        if lacking:
            raise BundledFormatError(f"{where}: key fact {f.get('fact_id')!r} lacks {', '.join(lacking)}")
    problems = check_facts(messages, facts)
    if problems:
        raise BundledFormatError(f"{where}: bad key_facts: {'; '.join(problems[:3])}")
    scenario = obj.get("scenario")
    group = f"{SOURCE}/{scenario}" if isinstance(scenario, str) and scenario else sid
    return make_session(sid, SOURCE, group, lang, SOURCE, messages, key_facts=facts,
                        meta={"scenario": scenario})


def load_bundled(path: Path) -> list[CorpusSession]:
    """Sessions of the bundled set at ``path`` (validated).

    Raises:
        FileNotFoundError: ``path`` is missing.
        BundledFormatError: a line is not valid JSON, a field is malformed, a key span is not in
            its message text, a key fact does not hold, or a session id repeats.
    """
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: bundled set not found")
    out: list[CorpusSession] = []
    seen: set[str] = set()
    try:
        for n, obj in iter_jsonl(path):
            where = f"{path}:{n}"
            s = _session(obj, where)
            if s["session_id"] in seen:
                raise BundledFormatError(f"{where}: duplicate session_id {s['session_id']}")
            seen.add(s["session_id"])
            out.append(s)
    except InputError as exc:  # not UTF-8 / not JSON, with the file and line
        raise BundledFormatError(str(exc)) from None
    return out


def iter_sessions(path: Path) -> Iterator[CorpusSession]:
    """Sessions of the bundled set (see :func:`load_bundled`)."""
    yield from load_bundled(path)
