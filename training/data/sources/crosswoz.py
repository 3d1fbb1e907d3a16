"""CrossWOZ (thu-coai/CrossWOZ, Apache-2.0): Chinese task-oriented dialogue.

Files: ``crosswoz/{val,test}.json.zip`` (one JSON object keyed by dialogue id), read through
:mod:`zipfile`. Message ids: ``crosswoz/{dialogue key}#{index in messages}``. Roles ``usr`` ->
``user``, ``sys`` -> ``assistant``.

Weak labels come from ``dialog_act`` (``[intent, domain, slot, value]``); key facts from
``final_goal`` (the user's goal at the end of the dialogue), compared with the initial ``goal``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..facts import find_value, make_fact, overlaps, usable_value
from ..schema import CorpusSession, make_message, make_session, read_zipped_json, spans_in_text
from ..weak import WeakLabel, is_pleasantry

SOURCE = "crosswoz"
LANGUAGE = "zh"
FILES = ("val", "test")
#: Phrases that say nothing was found (a failure under the annotation guide).
NOTHING = ("没有", "抱歉", "不好意思", "无法", "找不到")


def input_files(root: Path) -> list[Path]:
    """``val.json.zip`` and ``test.json.zip`` where present."""
    return [p for p in (root / "crosswoz" / f"{n}.json.zip" for n in FILES) if p.is_file()]


def weak_label(is_user: bool, text: str, acts: list[list[str]]) -> WeakLabel:
    """Weak label of one CrossWOZ turn from its dialogue acts; first match wins.

    User: Inform or Select -> instruction 3; Request -> instruction 1; only General or a
    pleasantry -> failure 0; no acts -> instruction 1. System: NoOffer without Inform -> failure 1;
    Inform whose values are all "无" / empty, or whose text says nothing was found -> failure 1;
    Inform / Recommend -> key_state 2; only General or a pleasantry -> failure 0; else key_state 1.
    """
    intents = {a[0] for a in acts}
    if is_user:
        if intents & {"Inform", "Select"}:
            return WeakLabel("instruction", 3, 0.8, "crosswoz:user_inform")
        if "Request" in intents:
            return WeakLabel("instruction", 1, 0.8, "crosswoz:user_request")
        if intents == {"General"} or is_pleasantry(text, "zh"):
            return WeakLabel("failure", 0, 0.85, "crosswoz:user_general")
        return WeakLabel("instruction", 1, 0.4, "crosswoz:user_noact")
    if "NoOffer" in intents and "Inform" not in intents:
        return WeakLabel("failure", 1, 0.6, "crosswoz:system_nooffer")
    informs = [a for a in acts if a[0] == "Inform"]
    if informs and (all(str(a[3]).strip() in ("", "无") for a in informs)
                    or (len(text) < 40 and any(p in text for p in NOTHING))):
        return WeakLabel("failure", 1, 0.6, "crosswoz:system_nothing_found")
    if intents & {"Inform", "Recommend"}:
        return WeakLabel("key_state", 2, 0.8, "crosswoz:system_inform")
    if intents <= {"General"} and (intents or is_pleasantry(text, "zh")):
        return WeakLabel("failure", 0, 0.85, "crosswoz:system_general")
    if not intents and is_pleasantry(text, "zh"):
        return WeakLabel("failure", 0, 0.7, "crosswoz:system_pleasantry")
    return WeakLabel("key_state", 1, 0.4, "crosswoz:system_other")


def _goal_values(value: Any) -> list[str]:
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return [value] if isinstance(value, str) else []


def key_facts(session_id: str, dialogue: dict[str, Any], messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Key facts of one CrossWOZ dialogue from ``final_goal``.

    Each filled slot of the final goal (lists: the first item found in the text) is sourced
    at the earliest message containing it verbatim. ``goal_constraint`` when the initial goal
    already set the slot (the user's requirement), else ``goal_value`` (filled during the
    dialogue). ``superseded``: the initial constraint when the final value differs from it and
    the old value appears in the text before the new one.
    """
    goal = {tuple(g[:3]): g[3] for g in dialogue.get("goal", [])}
    names = {g[0]: g[3] for g in dialogue.get("final_goal", []) if g[2] == "名称" and isinstance(g[3], str) and g[3]}
    facts: list[dict[str, Any]] = []
    seen: set[tuple[int, str]] = set()
    for sub, domain, slot, value, *_ in dialogue.get("final_goal", []):
        initial = goal.get((sub, domain, slot))
        init_vals = [v for v in _goal_values(initial) if v and not v.startswith("出现在")]
        kind = "goal_constraint" if init_vals else "goal_value"
        for k, item in enumerate(_goal_values(value)):
            v = usable_value(item, LANGUAGE)
            if not v:
                continue
            hit = find_value(messages, v, language=LANGUAGE)
            if hit is None or overlaps(seen, hit):
                continue
            seen.add(hit)
            name = names.get(sub)
            if slot == "名称":
                probe = f"用户最终选定的{domain}叫什么名字？"
            elif kind == "goal_constraint":
                probe = f"用户对{domain}" + (f"（{name}）" if name else "") + f"的{slot}有什么要求？"
            else:
                probe = f"{name or domain}的{slot}是什么？"
            superseded = None
            if init_vals and v not in init_vals:
                old = usable_value(init_vals[0], LANGUAGE)
                found = find_value(messages, old, language=LANGUAGE, stop=hit[0] + 1) if old else None
                if found and old not in v and v not in old:
                    superseded = old
            facts.append(make_fact(f"{session_id}:goal:{sub}:{domain}:{slot}:{k}", hit[1], hit[0], probe, kind,
                                   superseded=superseded))
            break  # one fact per slot
    return facts


def session_from_dialogue(key: str, dialogue: dict[str, Any], split: str) -> CorpusSession:
    """One CrossWOZ dialogue as a session record with weak labels and key facts."""
    sid = f"{SOURCE}/{key}"
    messages = []
    for i, t in enumerate(dialogue["messages"]):
        is_user = t["role"] == "usr"
        m = make_message(sid, i, "user" if is_user else "assistant", t["content"])
        acts = t.get("dialog_act") or []
        wl = weak_label(is_user, t["content"], acts)
        cands = [str(a[3]) for a in acts if len(a) > 3 and a[3] not in ("", "无", "none")]
        m["weak"] = wl.with_spans(spans_in_text(m["text"], cands)).to_dict()
        messages.append(m)
    return make_session(sid, SOURCE, sid, LANGUAGE, split, messages,
                        key_facts=key_facts(sid, dialogue, messages), meta={"type": dialogue.get("type")})


def iter_sessions(root: Path) -> Iterator[CorpusSession]:
    """Every dialogue of ``val`` then ``test``, in the files' key order."""
    for path in input_files(root):
        split = path.name.split(".")[0]
        for key, dialogue in read_zipped_json(path).items():
            yield session_from_dialogue(key, dialogue, split)
