"""The evaluation session format: loading, validation and LoCoMo input.

Format (JSONL, one session per line; the contract in ``docs/contracts.md``)::

    {"session_id": str,
     "messages": [OpenAI-style messages, optionally with an "id"],
     "key_facts": [{"fact_id": str, "value": str, "source_index": int, "probe": str, "kind": str,
                    "superseded": str (optional)}]}

``value`` is an exact substring of ``messages[source_index].content`` (for an assistant message that
carries ``tool_calls``, the rendered call text ``name(arguments)`` is accepted too, since tool-call
arguments are where agent trajectories keep their key state). ``superseded``, when present, is an
older value that the source message replaced; it must occur in an earlier message.

LoCoMo files (snap-research/locomo, one JSON document holding a list of conversations) are
accepted as well: :func:`training.data.locomo.load_locomo` turns them into the same sessions
(evidence turns as key facts, questions as probes).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxscore.errors import InputError
from ctxscore.io import iter_jsonl
from ctxscore.messages import Message

from .textnorm import message_search_text, normalize

FACT_FIELDS: tuple[str, ...] = ("fact_id", "value", "source_index", "probe", "kind")
MAX_ERRORS_SHOWN = 50


class SessionFormatError(InputError):
    """A session file that does not follow the evaluation session format.

    Attributes:
        errors: one human-readable line per problem, each naming the file line, the session, the
            fact (when the problem is in a fact) and the reason.
    """

    def __init__(self, path: str | Path, errors: list[str]):
        self.path = str(path)
        self.errors = list(errors)
        shown = "\n  ".join(self.errors[:MAX_ERRORS_SHOWN])
        more = len(self.errors) - MAX_ERRORS_SHOWN
        tail = f"\n  ... and {more} more" if more > 0 else ""
        super().__init__(
            f"{self.path}: {len(self.errors)} problem(s) in the evaluation session file "
            f"(format: docs/contracts.md, 'Evaluation session file'):\n  {shown}{tail}"
        )


@dataclass(slots=True)
class KeyFact:
    """One fact that must stay recoverable after its source message.

    Attributes:
        fact_id: unique within the session.
        value: exact substring of the source message; checked by normalised text presence.
        source_index: 0-based index of the message that introduces the fact; the fact is checked at
            every probe point strictly after it.
        probe: the question an agent would ask to need the fact (the page-in query).
        kind: free label (``slot``, ``tool_arg``, ``evidence``, ...), reported per kind.
        superseded: an older value this fact replaced, or ``None``.
    """

    fact_id: str
    value: str
    source_index: int
    probe: str
    kind: str
    superseded: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (``superseded`` omitted when absent)."""
        out: dict[str, Any] = {
            "fact_id": self.fact_id,
            "value": self.value,
            "source_index": self.source_index,
            "probe": self.probe,
            "kind": self.kind,
        }
        if self.superseded is not None:
            out["superseded"] = self.superseded
        return out


@dataclass(slots=True)
class EvalSession:
    """A validated session: OpenAI-style messages (each with an ``id``) and its key facts.

    ``notes`` holds non-fatal remarks of the validator (e.g. a superseded value that never occurs in
    the text before its replacement, which therefore cannot leak).
    """

    session_id: str
    messages: list[dict[str, Any]]
    key_facts: list[KeyFact] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def message_id(self, index: int) -> str:
        """The id of message ``index`` (its ``id`` field, else ``{session_id}#{index}``)."""
        mid = self.messages[index].get("id")
        return str(mid) if mid is not None else f"{self.session_id}#{index}"

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form in the session file format."""
        return {
            "session_id": self.session_id,
            "messages": self.messages,
            "key_facts": [f.to_dict() for f in self.key_facts],
        }


def _field_errors(f: dict[str, Any], flabel: str, n_messages: int) -> list[str]:
    """Problems with the fields of one key fact (types, ``source_index`` range), ``[]`` when none."""
    errors = []
    for key in ("fact_id", "value", "probe", "kind"):
        if not isinstance(f[key], str) or not f[key].strip():
            errors.append(f"{flabel}: {key!r} must be a non-empty string, got {f[key]!r}")
    si = f["source_index"]
    if isinstance(si, bool) or not isinstance(si, int):
        errors.append(f"{flabel}: 'source_index' must be an integer, got {si!r}")
    elif not 0 <= si < n_messages:
        errors.append(
            f"{flabel}: source_index {si} is out of range (the session has {n_messages} messages, "
            f"valid indices 0..{n_messages - 1})"
        )
    sup = f.get("superseded")
    if sup is not None and (not isinstance(sup, str) or not sup.strip()):
        errors.append(f"{flabel}: 'superseded' must be a non-empty string when present, got {sup!r}")
    return errors


def _validate_fact(f: Any, j: int, label: str, msgs: list[dict[str, Any]], texts: list[str], fact_ids: set[str],
                   errors: list[str], notes: list[str]) -> KeyFact | None:
    """Validate key fact ``j`` of a session against its messages; problems go to ``errors``,
    remarks to ``notes``; returns the fact or ``None``."""
    if not isinstance(f, dict):
        errors.append(f"{label} fact #{j}: expected an object, got {type(f).__name__}")
        return None
    fid = f.get("fact_id")
    flabel = f"{label} fact {fid!r}" if isinstance(fid, str) and fid else f"{label} fact #{j}"
    missing = [k for k in FACT_FIELDS if k not in f]
    if missing:
        errors.append(f"{flabel}: missing field(s) {', '.join(missing)}")
        return None
    bad = _field_errors(f, flabel, len(msgs))
    if bad:
        errors.extend(bad)
        return None
    if fid in fact_ids:
        errors.append(f"{flabel}: duplicate fact_id within the session")
        return None
    fact_ids.add(fid)
    value, si, sup = f["value"], f["source_index"], f.get("superseded")
    if msgs[si] and value not in texts[si]:
        preview = texts[si][:120].replace("\n", " ")
        errors.append(
            f"{flabel}: value {value!r} is not an exact substring of messages[{si}].content "
            f"(starts {preview!r}); fix the value or the source_index"
        )
        return None
    if sup is not None:
        if sup == value:
            errors.append(f"{flabel}: 'superseded' equals 'value'; drop it or give the older value")
            return None
        nsup = normalize(sup)
        if not any(nsup in normalize(t) for t in texts[:si]):
            notes.append(
                f"{flabel}: superseded value {sup!r} does not occur in any message before "
                f"source_index {si}, so it can never leak (leakage is measured on the others)"
            )
    return KeyFact(fact_id=fid, value=value, source_index=si, probe=f["probe"], kind=f["kind"], superseded=sup)


def _validate_messages(obj: dict[str, Any], label: str, errors: list[str]) -> list[dict[str, Any]]:
    """The session's messages as dicts (``{}`` in place of an invalid one, whose problem goes to ``errors``)."""
    messages = obj.get("messages")
    if not isinstance(messages, list) or not messages:
        errors.append(f"{label}: 'messages' is missing or not a non-empty list of OpenAI-style messages")
        messages = []
    msgs: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        try:
            Message.from_dict(m, where=f"{label} message {i}")
        except InputError as exc:
            errors.append(str(exc))
            msgs.append({})
            continue
        msgs.append(dict(m))
    return msgs


def _validate_record(obj: Any, where: str, seen_ids: set[str]) -> tuple[EvalSession | None, list[str]]:
    """Validate one decoded session object; return the session (or None) and the problems found."""
    errors: list[str] = []
    notes: list[str] = []
    if not isinstance(obj, dict):
        return None, [f"{where}: expected a JSON object with session_id, messages, key_facts; got {type(obj).__name__}"]
    sid = obj.get("session_id")
    if not isinstance(sid, str) or not sid.strip():
        errors.append(f"{where}: 'session_id' is missing or not a non-empty string")
        sid = "?"
    elif sid in seen_ids:
        errors.append(f"{where} session {sid!r}: duplicate session_id (each session must be unique in the file)")
    label = f"{where} session {sid!r}"
    msgs = _validate_messages(obj, label, errors)
    facts_raw = obj.get("key_facts")
    if facts_raw is None:
        errors.append(f"{label}: 'key_facts' is missing (use [] for a session without facts)")
        facts_raw = []
    elif not isinstance(facts_raw, list):
        errors.append(f"{label}: 'key_facts' must be a list, got {type(facts_raw).__name__}")
        facts_raw = []
    texts = [message_search_text(m) if m else "" for m in msgs]
    fact_ids: set[str] = set()
    facts = [kf for j, f in enumerate(facts_raw)
             if (kf := _validate_fact(f, j, label, msgs, texts, fact_ids, errors, notes)) is not None]
    if errors:
        return None, errors
    for i, m in enumerate(msgs):
        m.setdefault("id", f"{sid}#{i}")
    return EvalSession(session_id=sid, messages=msgs, key_facts=facts, notes=notes), []


def validate_records(records: Iterable[tuple[str, Any]], path: str | Path = "<memory>") -> list[EvalSession]:
    """Validate decoded session objects, each given with a location label (e.g. ``"line 3"``).

    Returns:
        The sessions, in input order.

    Raises:
        SessionFormatError: listing every problem found (not just the first).
    """
    sessions: list[EvalSession] = []
    errors: list[str] = []
    seen: set[str] = set()
    for where, obj in records:
        sess, errs = _validate_record(obj, where, seen)
        errors.extend(errs)
        if sess is not None:
            seen.add(sess.session_id)
            sessions.append(sess)
        elif isinstance(obj, dict) and isinstance(obj.get("session_id"), str):
            seen.add(obj["session_id"])
    if errors:
        raise SessionFormatError(path, errors)
    return sessions


def _jsonl_records(path: Path) -> tuple[list[tuple[str, Any]], list[str]]:
    """``([("line N", decoded object), ...], errors)`` of a JSONL session file.

    Read with :func:`ctxscore.io.iter_jsonl`; a line that is not valid JSON (or not UTF-8) ends the
    reading: its error (``"line N: invalid JSON ..."``) is returned beside the lines before it.
    """
    records: list[tuple[str, Any]] = []
    try:
        for n, obj in iter_jsonl(path):
            records.append((f"line {n}", obj))
    except InputError as exc:
        return records, [str(exc).removeprefix(f"{path}: ") + "; each line must hold one complete session object"]
    return records, []


def is_locomo(obj: Any) -> bool:
    """Whether a decoded JSON document looks like LoCoMo (conversations with ``qa`` probes)."""
    items = obj if isinstance(obj, list) else [obj]
    return bool(items) and all(
        isinstance(o, dict) and "qa" in o and ("conversation" in o or any(k.startswith("session_") for k in o))
        for o in items
    )


def load_sessions_file(path: str | Path) -> list[EvalSession]:
    """Load and validate one session file: JSONL in the session format, or a LoCoMo JSON document.

    Raises:
        FileNotFoundError: the file does not exist.
        SessionFormatError: any problem in the file (every problem is listed; a line that is not
            valid JSON ends the reading, so only the lines before it are checked).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such session file (pass a .jsonl session file, a LoCoMo .json, or a folder)")
    if path.suffix == ".json":
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise SessionFormatError(path, [f"invalid JSON document ({exc.msg} at line {exc.lineno})"]) from exc
        if is_locomo(doc):
            from training.data.locomo import load_locomo  # eval -> training is an allowed import

            raw = load_locomo(path)
            return validate_records(((f"conversation {i}", s) for i, s in enumerate(raw)), path)
        items = doc if isinstance(doc, list) else [doc]
        return validate_records(((f"item {i}", s) for i, s in enumerate(items)), path)
    good, errors = _jsonl_records(path)
    try:
        sessions = validate_records(good, path)
    except SessionFormatError as exc:
        errors.extend(exc.errors)
        sessions = []
    if errors:
        errors.sort(key=_line_key)
        raise SessionFormatError(path, errors)
    return sessions


def _line_key(err: str) -> int:
    head = err.split(":", 1)[0].split()
    if len(head) >= 2 and head[0] == "line" and head[1].isdigit():
        return int(head[1])
    return 0


def load_sessions(path: str | Path, max_sessions: int | None = None) -> list[EvalSession]:
    """Load sessions from a file or from every ``*.jsonl`` / ``*.json`` file of a folder (sorted).

    Args:
        path: a session JSONL file, a LoCoMo JSON file or a folder of them.
        max_sessions: keep only the first N sessions (for reduced runs), or all when ``None``.

    Raises:
        FileNotFoundError: missing path or an empty folder.
        SessionFormatError: a malformed file, or the same session id in two files.
    """
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".jsonl", ".json") and p.is_file())
        if not files:
            raise FileNotFoundError(f"{path}: folder holds no .jsonl or .json session files")
    else:
        files = [path]
    sessions: list[EvalSession] = []
    seen: dict[str, Path] = {}
    for f in files:
        for s in load_sessions_file(f):
            if s.session_id in seen:
                raise SessionFormatError(f, [f"session {s.session_id!r}: already defined in {seen[s.session_id]}"])
            seen[s.session_id] = f
            sessions.append(s)
            if max_sessions is not None and len(sessions) >= max_sessions:
                return sessions
    return sessions


def sessions_hash(sessions: Iterable[EvalSession]) -> str:
    """SHA-256 (hex, first 16 chars) of the sessions' canonical JSON, for run provenance."""
    h = hashlib.sha256()
    for s in sessions:
        h.update(json.dumps(s.to_dict(), sort_keys=True, ensure_ascii=False).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()[:16]
