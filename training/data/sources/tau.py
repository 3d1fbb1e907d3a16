"""tau-bench airline trajectories (sierra-research/tau-bench, MIT).

File: ``tau_bench/historical_trajectories/gpt-4o-airline.json``: a list of
``{task_id, trial, reward, info: {task: {user_id, instruction, actions}}, traj}``. Message ids:
``tau_airline/airline-t{task_id}-r{trial}#{index in traj}`` (the system policy is index 0).
Sessions are grouped by task across its trials (``tau_airline/t{task_id}``).

Weak labels come from the tool results (name, ``Error:``), the tool calls (read vs. write
functions, match with a ground-truth action, failed result) and the user turn's position and
wording; key facts from the ground-truth action arguments that appear verbatim in a user message
or a tool result.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..facts import find_value, humanize, make_fact, usable_value
from ..schema import CorpusSession, make_message, make_session, spans_in_text
from ..weak import WeakLabel, is_pleasantry

SOURCE = "tau_airline"
LANGUAGE = "en"
RELPATH = "tau_bench/historical_trajectories/gpt-4o-airline.json"

#: Functions that change the booking database (or hand the user over): their calls are actions.
WRITE_TOOLS = frozenset({
    "book_reservation", "cancel_reservation", "update_reservation_flights",
    "update_reservation_baggages", "update_reservation_passengers", "send_certificate",
    "transfer_to_human_agents",
})
#: Read functions whose results hold the user's / reservation's data.
PROFILE_TOOLS = frozenset({"get_user_details", "get_reservation_details"})
#: IDs a user supplies: user ids (``mia_li_3668``), 6-character reservation codes, card digits.
ID_TEXT = re.compile(r"\b[a-z]+_[a-z]+_\d{3,}\b|\b(?=[A-Z0-9]*\d)(?=[A-Z0-9]*[A-Z])[A-Z0-9]{6}\b|\bending in \d{4}\b")
STRONG_REQUEST = re.compile(r"\b(?:want|like|need|change|cancel|book|upgrade|modify|add|remove|switch)\b", re.I)
DONE_TEXT = re.compile(r"\b(?:has been|have been|successfully|confirmed|is now|total (?:cost|price|amount)|"
                       r"refund|\$\d)", re.I)
PROBLEM_TEXT = re.compile(r"\b(?:not available|unavailable|unable|cannot|can't|issue|no (?:direct |one-stop )?"
                          r"flights?|not possible|not eligible|unfortunately)\b", re.I)


def input_files(root: Path) -> list[Path]:
    """The trajectory file, when present."""
    p = root / RELPATH
    return [p] if p.is_file() else []


def _call_names(msg: dict[str, Any]) -> list[str]:
    return [(c.get("function") or {}).get("name", "") for c in msg.get("tool_calls") or []]


def _matches_gt(msg: dict[str, Any], actions: list[dict[str, Any]]) -> bool:
    for c in msg.get("tool_calls") or []:
        fn = c.get("function") or {}
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except json.JSONDecodeError:
            continue
        if any(a.get("name") == fn.get("name") and a.get("kwargs") == args for a in actions):
            return True
    return False


def weak_label(i: int, traj: list[dict[str, Any]], actions: list[dict[str, Any]], first_user: int) -> WeakLabel:
    """Weak label of ``traj[i]``; first match wins.

    system -> instruction 3. user: first user turn -> instruction 3; pleasantry / ``###STOP###``
    -> failure 0; an ID (user id, reservation code, card digits) without a request verb ->
    key_state 3; else instruction 2. tool: ``Error`` -> failure 1; ``think`` -> reasoning 0;
    write function -> key_state 3; profile / reservation lookup -> key_state 2; search,
    calculate, listings -> key_state 1 (the chosen option is usually among them). assistant tool call: its
    result is an error -> failure 0; equals a ground-truth action -> key_state 3; other write
    call -> key_state 2; read call -> reasoning 1. assistant text: pleasantry -> failure 0;
    completed action / totals -> key_state 2; a stated limit ("cannot", "not available",
    "unfortunately": a policy or availability conclusion) -> key_state 2; else reasoning 1.
    """
    m = traj[i]
    role = m["role"]
    content = m.get("content") or ""
    if role == "system":
        return WeakLabel("instruction", 3, 0.95, "tau:system_policy")
    if role == "user":
        if i == first_user:
            return WeakLabel("instruction", 3, 0.9, "tau:user_first")
        stripped = content.replace("###STOP###", "").strip()
        if "###STOP###" in content and len(stripped) < 160 or is_pleasantry(stripped):
            return WeakLabel("failure", 0, 0.85, "tau:user_pleasantry")
        if ID_TEXT.search(content) and not STRONG_REQUEST.search(content):
            return WeakLabel("key_state", 3, 0.7, "tau:user_gives_id")
        return WeakLabel("instruction", 2, 0.65, "tau:user_request")
    if role == "tool":
        name = m.get("name") or ""
        if content.startswith("Error"):
            return WeakLabel("failure", 1, 0.9, "tau:tool_error")
        if name == "think":
            return WeakLabel("reasoning", 0, 0.85, "tau:tool_think")
        if name in WRITE_TOOLS:
            return WeakLabel("key_state", 3, 0.85, "tau:tool_write_result")
        if name in PROFILE_TOOLS:
            return WeakLabel("key_state", 2, 0.6, "tau:tool_profile")
        return WeakLabel("key_state", 1, 0.45, "tau:tool_search")
    # assistant
    if m.get("tool_calls"):
        ids = {c.get("id") for c in m["tool_calls"]}
        results = [t for t in traj[i + 1 : i + 1 + len(ids)] if t.get("role") == "tool" and t.get("tool_call_id") in ids]
        names = set(_call_names(m))
        if any((r.get("content") or "").startswith("Error") for r in results):
            return WeakLabel("failure", 0, 0.6, "tau:call_failed")
        if names & WRITE_TOOLS and _matches_gt(m, actions):
            return WeakLabel("key_state", 3, 0.8, "tau:call_gt_action")
        if names & WRITE_TOOLS:
            return WeakLabel("key_state", 2, 0.65, "tau:call_write")
        return WeakLabel("reasoning", 1, 0.85, "tau:call_read")
    if is_pleasantry(content) or re.match(r"^\W*you'?re (?:very )?welcome", content, re.I):
        return WeakLabel("failure", 0, 0.8, "tau:assistant_pleasantry")
    if DONE_TEXT.search(content):
        return WeakLabel("key_state", 2, 0.55, "tau:assistant_done")
    if PROBLEM_TEXT.search(content[:200]):
        return WeakLabel("key_state", 2, 0.4, "tau:assistant_constraint")
    return WeakLabel("reasoning", 1, 0.55, "tau:assistant_text")


def _leaves(obj: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, k)
    elif isinstance(obj, list):
        for v in obj:
            yield from _leaves(v, key)
    else:
        yield key, obj


def key_facts(session_id: str, task: dict[str, Any], messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ground-truth action arguments that appear verbatim (case-sensitive, whole words) in the
    content of a user message or a tool result; sourced at the earliest such message. Each value
    is kept once per session (``action_argument``)."""
    facts: list[dict[str, Any]] = []
    done: set[str] = set()
    user_id = task.get("user_id") or ""
    for a_idx, action in enumerate(task.get("actions") or []):
        for key, raw in _leaves(action.get("kwargs") or {}):
            v = usable_value(raw)
            if not v or v in done:
                continue
            hit = find_value(messages, v, roles=("user", "tool"), ignore_case=False)
            if hit is None:
                continue
            done.add(v)
            who = f" for {user_id}" if user_id and key != "user_id" else ""
            probe = f"Which {humanize(key)} does the {humanize(action.get('name', 'action'))} action use{who}?"
            facts.append(make_fact(f"{session_id}:action{a_idx}:{key}:{v}", hit[1], hit[0], probe, "action_argument"))
    return facts


def session_from_entry(entry: dict[str, Any]) -> CorpusSession:
    """One trajectory as a session record with weak labels and key facts."""
    sid = f"{SOURCE}/airline-t{entry['task_id']}-r{entry['trial']}"
    task = (entry.get("info") or {}).get("task") or {}
    actions = task.get("actions") or []
    traj = entry["traj"]
    first_user = next((i for i, m in enumerate(traj) if m["role"] == "user"), -1)
    gt_values = [str(v) for _, v in _leaves([a.get("kwargs") for a in actions]) if isinstance(v, str | int | float)]
    messages = []
    for i, raw in enumerate(traj):
        m = make_message(sid, i, raw["role"], raw.get("content"), name=raw.get("name"),
                         tool_calls=raw.get("tool_calls"), tool_call_id=raw.get("tool_call_id"))
        wl = weak_label(i, traj, actions, first_user)
        spans = spans_in_text(m["text"], gt_values) if raw["role"] != "system" else []
        m["weak"] = wl.with_spans(spans).to_dict()
        messages.append(m)
    return make_session(
        sid, SOURCE, f"{SOURCE}/t{entry['task_id']}", LANGUAGE, "test", messages,
        key_facts=key_facts(sid, task, messages),
        meta={"task_id": entry["task_id"], "trial": entry["trial"], "reward": entry.get("reward"),
              "user_id": task.get("user_id")},
    )


def iter_sessions(root: Path) -> Iterator[CorpusSession]:
    """Every trajectory, in file order."""
    for path in input_files(root):
        with path.open(encoding="utf-8") as fh:
            data = json.load(fh)
        for entry in data:
            yield session_from_entry(entry)
