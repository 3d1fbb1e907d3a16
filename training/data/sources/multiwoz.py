"""MultiWOZ 2.1 in ConvLab-2's annotated form (from thu-coai/CrossWOZ, MIT).

Files: ``multiwoz21/{val,test}.json.zip`` (one JSON object keyed by dialogue id), read through
:mod:`zipfile` without unpacking. Message ids: ``multiwoz/{dialogue key}#{log index}``; even log
positions are user turns, odd ones system turns whose ``metadata`` holds the belief state.

Weak labels come from ``dialog_act`` (``Domain-Intent`` keys); key facts from the final belief
state (``semi`` and ``book`` slots) and the booking references in ``book.booked``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..facts import find_value, humanize, make_fact, overlaps, usable_value
from ..schema import CorpusSession, make_message, make_session, read_zipped_json, spans_in_text
from ..weak import WeakLabel, is_pleasantry

SOURCE = "multiwoz"
LANGUAGE = "en"
FILES = ("val", "test")
#: Belief-state values that mean "nothing there yet".
#: Readable names of belief-state slots used in probes.
SLOT_NAMES = {"leaveAt": "departure time", "arriveBy": "arrival time", "pricerange": "price range",
              "people": "number of people", "stay": "number of nights", "departure": "departure place",
              "destination": "destination", "food": "cuisine"}
EMPTY = {"", "not mentioned", "none", "dontcare", "don't care", "dont care", "do n't care", "?"}


def input_files(root: Path) -> list[Path]:
    """``val.json.zip`` and ``test.json.zip`` where present."""
    return [p for p in (root / "multiwoz21" / f"{n}.json.zip" for n in FILES) if p.is_file()]


def weak_label(is_user: bool, text: str, dialog_act: dict[str, list]) -> WeakLabel:
    """Weak label of one MultiWOZ turn from its dialogue acts; first match wins.

    User: Inform -> instruction 3; Request -> instruction 1; only general-* acts or a pleasantry
    text -> failure 0; no acts -> instruction 1. System: Book / OfferBooked -> key_state 3;
    NoBook / NoOffer -> failure 1; Request -> reasoning 1; Select / Recommend without Inform ->
    reasoning 1; Inform / OfferBook -> key_state 2; only general-* -> failure 0.
    """
    intents = {k.split("-", 1)[1] for k in dialog_act if not k.startswith("general-")}
    general = {k for k in dialog_act if k.startswith("general-")}
    if is_user:
        if "Inform" in intents:
            return WeakLabel("instruction", 3, 0.8, "multiwoz:user_inform")
        if "Request" in intents:
            return WeakLabel("instruction", 1, 0.85, "multiwoz:user_request")
        if general or is_pleasantry(text):
            return WeakLabel("failure", 0, 0.85, "multiwoz:user_general")
        return WeakLabel("instruction", 1, 0.4, "multiwoz:user_noact")
    if intents & {"Book", "OfferBooked"}:
        return WeakLabel("key_state", 3, 0.9, "multiwoz:system_booked")
    if intents & {"NoBook", "NoOffer"}:
        return WeakLabel("failure", 1, 0.6, "multiwoz:system_nooffer")
    if "Request" in intents:
        return WeakLabel("reasoning", 1, 0.75, "multiwoz:system_request")
    if intents & {"Select", "Recommend"} and "Inform" not in intents:
        return WeakLabel("reasoning", 1, 0.6, "multiwoz:system_select")
    if intents & {"Inform", "OfferBook", "Recommend", "Select"}:
        return WeakLabel("key_state", 2, 0.75, "multiwoz:system_inform")
    return WeakLabel("failure", 0, 0.85, "multiwoz:system_general")


def _belief(metadata: dict[str, Any]) -> dict[tuple[str, str, str], str]:
    out: dict[tuple[str, str, str], str] = {}
    for domain, parts in (metadata or {}).items():
        for part in ("semi", "book"):
            for slot, value in (parts.get(part) or {}).items():
                if slot == "booked" or not isinstance(value, str) or value.strip().lower() in EMPTY:
                    continue
                out[(domain, part, slot)] = value.strip()
    return out


def key_facts(session_id: str, log: list[dict[str, Any]], messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Key facts of one MultiWOZ dialogue from the final belief state.

    - ``belief_state``: every filled ``semi`` / ``book`` slot of the last system turn's metadata,
      sourced at the earliest message that mentions the value (case-insensitive whole words; the
      fact's value keeps the text's casing). ``superseded``: the last earlier value of that slot
      that differs from the final one and appears in the text.
    - ``booking_reference``: each ``reference`` in ``book.booked``.
    """
    states = [t.get("metadata") for i, t in enumerate(log) if i % 2 == 1 and t.get("metadata")]
    if not states:
        return []
    final = _belief(states[-1])
    history: dict[tuple[str, str, str], list[str]] = {}
    for st in states:
        for k, v in _belief(st).items():
            h = history.setdefault(k, [])
            if not h or h[-1] != v:
                h.append(v)
    facts: list[dict[str, Any]] = []
    seen: set[tuple[int, str]] = set()
    for (domain, part, slot), value in sorted(final.items()):
        v = usable_value(value)
        if not v:
            continue
        hit = find_value(messages, v)
        if hit is None or overlaps(seen, hit):
            continue
        seen.add(hit)
        name = final.get((domain, "semi", "name"))
        anchor = f" ({name})" if name and slot != "name" else ""
        slot_name = SLOT_NAMES.get(slot, humanize(slot))
        if part == "book":
            probe = f"For the {domain} booking{anchor}, what {slot_name} was requested?"
        elif slot == "name":
            probe = f"Which {domain} did the user settle on?"
        else:
            probe = f"What {slot_name} did the user want for the {domain}{anchor}?"
        superseded = None
        for old in reversed(history.get((domain, part, slot), [])[:-1]):
            o = usable_value(old)
            if o and o.casefold() not in v.casefold() and v.casefold() not in o.casefold():
                found = find_value(messages, o)
                if found:
                    superseded = found[1]
                    break
        facts.append(make_fact(f"{session_id}:belief:{domain}:{part}:{slot}", hit[1], hit[0], probe,
                               "belief_state", superseded=superseded))
    for domain, parts in sorted(states[-1].items()):
        for k, booked in enumerate((parts.get("book") or {}).get("booked") or []):
            ref = usable_value(booked.get("reference")) if isinstance(booked, dict) else None
            if not ref:
                continue
            hit = find_value(messages, ref)
            if hit is None or overlaps(seen, hit):
                continue
            seen.add(hit)
            what = booked.get("name") or booked.get("trainID")
            anchor = f" ({what})" if isinstance(what, str) and what else ""
            facts.append(make_fact(f"{session_id}:ref:{domain}:{k}", hit[1], hit[0],
                                   f"What is the booking reference for the {domain}{anchor}?",
                                   "booking_reference"))
    return facts


def session_from_dialogue(key: str, dialogue: dict[str, Any], split: str) -> CorpusSession:
    """One MultiWOZ dialogue as a session record with weak labels and key facts."""
    sid = f"{SOURCE}/{key}"
    messages = []
    for i, t in enumerate(dialogue["log"]):
        m = make_message(sid, i, "user" if i % 2 == 0 else "assistant", t["text"])
        acts = t.get("dialog_act") or {}
        wl = weak_label(i % 2 == 0, t["text"], acts)
        cands = [sv[1] for pairs in acts.values() for sv in pairs if len(sv) > 1 and sv[1] not in ("?", "none")]
        m["weak"] = wl.with_spans(spans_in_text(m["text"], cands, ignore_case=True)).to_dict()
        messages.append(m)
    return make_session(sid, SOURCE, sid, LANGUAGE, split, messages,
                        key_facts=key_facts(sid, dialogue["log"], messages))


def iter_sessions(root: Path) -> Iterator[CorpusSession]:
    """Every dialogue of ``val`` then ``test``, in the files' key order."""
    for path in input_files(root):
        split = path.name.split(".")[0]
        for key, dialogue in read_zipped_json(path).items():
            yield session_from_dialogue(key, dialogue, split)
