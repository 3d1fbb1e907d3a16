"""Schema-Guided Dialogue (SGD, google-research-datasets/dstc8-schema-guided-dialogue, CC BY-SA 4.0).

Files: ``sgd/{train,dev,test}/dialogues_NNN.json.gz`` (each a JSON list of dialogues), streamed
with :mod:`gzip`. Message ids: ``sgd/{dialogue_id}#{turn}`` for the test split (the one the
distilled labels use); train and dev dialogues reuse the same ``dialogue_id`` values, so their
session ids carry the split: ``sgd/train/{dialogue_id}``, ``sgd/dev/{dialogue_id}``.

Weak labels come from the dialogue acts of each turn (all frames); key facts from the final
dialogue state (``slot_values``) and the service-call parameters.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..facts import find_value, humanize, make_fact, overlaps, usable_value
from ..schema import CorpusSession, make_message, make_session, spans_in_text
from ..weak import WeakLabel

SOURCE = "sgd"
LANGUAGE = "en"
SPLITS = ("train", "dev", "test")
ROLE = {"USER": "user", "SYSTEM": "assistant"}

#: Slots preferred as the anchor that tells chained dialogues apart in a probe.
ANCHOR_SLOTS = ("restaurant_name", "city", "location", "destination", "movie_name", "event_name",
                "hotel_name", "place_name", "property_name", "stylist_name", "doctor_name",
                "dentist_name", "title", "song_name", "artist", "date")


def input_files(root: Path, splits: tuple[str, ...] = SPLITS) -> list[Path]:
    """The dialogue files present, ``train`` then ``dev`` then ``test``, sorted by name."""
    out: list[Path] = []
    for split in splits:
        out.extend(sorted((root / "sgd" / split).glob("dialogues_*.json.gz")))
    return out


def session_id_for(dialogue_id: str, split: str) -> str:
    """README id of a dialogue: ``sgd/{dialogue_id}`` (test) or ``sgd/{split}/{dialogue_id}``."""
    return f"sgd/{dialogue_id}" if split == "test" else f"sgd/{split}/{dialogue_id}"


def weak_label(speaker: str, turn: dict[str, Any]) -> WeakLabel:
    """Weak label of one SGD turn from its dialogue acts (all frames); first match wins.

    USER: INFORM_INTENT / AFFIRM_INTENT / REQUEST_ALTS -> instruction (3 with values, else 2);
    REQUEST -> instruction 1; INFORM / SELECT (without GOODBYE) -> key_state; AFFIRM -> key_state 1;
    NEGATE_INTENT -> instruction 1; only THANK_YOU / GOODBYE / NEGATE -> failure 0.
    SYSTEM: NOTIFY_FAILURE -> failure 1; NOTIFY_SUCCESS -> key_state 3; CONFIRM / OFFER / INFORM /
    INFORM_COUNT -> key_state 2; OFFER_INTENT -> reasoning 0; REQUEST -> reasoning 1; only
    REQ_MORE / GOODBYE -> failure 0.
    """
    acts = {a["act"] for fr in turn.get("frames", []) for a in fr.get("actions", [])}
    values = [v for fr in turn.get("frames", []) for a in fr.get("actions", []) for v in a.get("values", [])
              if a.get("slot") != "intent"]
    if speaker == "USER":
        if acts & {"INFORM_INTENT", "AFFIRM_INTENT", "REQUEST_ALTS"}:
            if "INFORM" in acts or "SELECT" in acts:
                return WeakLabel("instruction", 3, 0.9, "sgd:user_intent_with_values")
            return WeakLabel("instruction", 2, 0.85, "sgd:user_intent")
        if "REQUEST" in acts:
            return WeakLabel("instruction", 1, 0.85, "sgd:user_request")
        if "INFORM" in acts:
            return WeakLabel("key_state", 3, 0.7, "sgd:user_inform")
        if "SELECT" in acts and "GOODBYE" not in acts:
            return WeakLabel("key_state", 2, 0.75, "sgd:user_select")
        if "AFFIRM" in acts:
            return WeakLabel("key_state", 1, 0.5, "sgd:user_affirm")
        if "NEGATE_INTENT" in acts:
            return WeakLabel("instruction", 1, 0.4, "sgd:user_negate_intent")
        return WeakLabel("failure", 0, 0.85, "sgd:user_pleasantry")
    if "NOTIFY_FAILURE" in acts:
        return WeakLabel("failure", 1, 0.6, "sgd:system_notify_failure")
    if "NOTIFY_SUCCESS" in acts:
        return WeakLabel("key_state", 3, 0.85, "sgd:system_notify_success")
    if acts & {"CONFIRM", "OFFER", "INFORM", "INFORM_COUNT"} and values:
        return WeakLabel("key_state", 2, 0.75, "sgd:system_inform")
    if "OFFER_INTENT" in acts:
        return WeakLabel("reasoning", 0, 0.8, "sgd:system_offer_intent")
    if "REQUEST" in acts:
        return WeakLabel("reasoning", 1, 0.85, "sgd:system_request")
    if acts & {"CONFIRM", "OFFER", "INFORM", "INFORM_COUNT"}:
        return WeakLabel("key_state", 1, 0.5, "sgd:system_inform_novalue")
    return WeakLabel("failure", 0, 0.9, "sgd:system_pleasantry")


def _anchor(slot_values: dict[str, list[str]], exclude: str) -> str | None:
    for slot in ANCHOR_SLOTS:
        if slot != exclude and slot_values.get(slot):
            v = usable_value(slot_values[slot][0])
            if v:
                return f"{humanize(slot)} {v}"
    return None


def _annotations(turns: list[dict[str, Any]]) -> tuple[dict[str, tuple[str, dict[str, list[str]]]],
                                                         dict[tuple[str, str], list[str]], dict[str, set[str]]]:
    """``(final state per service: (active intent, slot values), values the user informed per
    (service, slot), surface strings per canonical value)`` of a dialogue's turns."""
    final_state: dict[str, tuple[str, dict[str, list[str]]]] = {}
    informed: dict[tuple[str, str], list[str]] = {}
    surface: dict[str, set[str]] = {}
    for t in turns:
        for fr in t["frames"]:
            for a in fr.get("actions", []):
                for v, c in zip(a.get("values", []), a.get("canonical_values", []), strict=False):
                    surface.setdefault(c, set()).add(v)
                if t["speaker"] == "USER" and a["act"] == "INFORM":
                    for v in a.get("values", []):
                        informed.setdefault((fr["service"], a["slot"]), []).append(v)
            st = fr.get("state")
            if t["speaker"] == "USER" and st is not None:
                final_state[fr["service"]] = (st.get("active_intent", "NONE"), st.get("slot_values", {}))
    return final_state, informed, surface


def _source_turn(turns: list[dict[str, Any]], messages: list[dict[str, Any]], service: str, slot: str,
                 values: list[str], stop: int | None = None) -> tuple[int, str] | None:
    """``(turn, value)`` of the earliest turn whose span or act annotation of ``slot`` carries one of
    ``values`` found in its text; else the first plain-text hit of a value; else ``None``."""
    for i, t in enumerate(turns[:stop]):
        for fr in t["frames"]:
            if fr["service"] != service:
                continue
            cands = [t["utterance"][s["start"]:s["exclusive_end"]] for s in fr.get("slots", []) if s["slot"] == slot]
            cands += [v for a in fr.get("actions", []) if a.get("slot") == slot for v in a.get("values", [])]
            for v in cands:
                if v in values and usable_value(v) and v in t["utterance"]:
                    return i, v
    # no annotation pointed at it: plain text search
    for v in values:
        if usable_value(v):
            hit = find_value(messages, v, stop=stop)
            if hit:
                return hit
    return None


def _slot_facts(session_id: str, turns: list[dict[str, Any]], messages: list[dict[str, Any]],
                final_state: dict[str, tuple[str, dict[str, list[str]]]], informed: dict[tuple[str, str], list[str]],
                seen: set[tuple[int, str]]) -> list[dict[str, Any]]:
    """The ``slot_value`` facts (see :func:`key_facts`); adds their sources to ``seen``."""
    facts = []
    for service, (intent, slot_values) in sorted(final_state.items()):
        for slot, values in sorted(slot_values.items()):
            hit = _source_turn(turns, messages, service, slot, values)
            if hit is None or overlaps(seen, hit):
                continue
            seen.add(hit)
            old = [v for v in informed.get((service, slot), []) if v not in values and usable_value(v)]
            anchor = _anchor(slot_values, slot)
            what = humanize(intent) if intent and intent != "NONE" else humanize(service)
            probe = f"For the {what} request" + (f" ({anchor})" if anchor else "") + \
                f", what {humanize(slot)} did the user settle on?"
            facts.append(make_fact(f"{session_id}:slot:{service}:{slot}", hit[1], hit[0], probe, "slot_value",
                                   superseded=old[-1] if old else None))
    return facts


def _call_facts(session_id: str, turns: list[dict[str, Any]], messages: list[dict[str, Any]],
                surface: dict[str, set[str]], seen: set[tuple[int, str]]) -> list[dict[str, Any]]:
    """The ``service_call`` facts (see :func:`key_facts`); adds their sources to ``seen``."""
    last_call: dict[str, tuple[int, dict[str, str]]] = {}
    for i, t in enumerate(turns):
        for fr in t["frames"]:
            call = fr.get("service_call")
            if call:
                last_call[f"{fr['service']}:{call['method']}"] = (i, call.get("parameters", {}))
    facts = []
    for key, (turn_idx, params) in sorted(last_call.items()):
        _, method = key.split(":", 1)
        for slot, canonical in sorted(params.items()):
            cands = [canonical] + sorted(surface.get(canonical, ()), key=len, reverse=True)
            hit = None
            for v in cands:
                if usable_value(v):
                    hit = find_value(messages, v, stop=turn_idx + 1)
                    if hit:
                        break
            if hit is None or overlaps(seen, hit):
                continue
            seen.add(hit)
            probe = f"Which {humanize(slot)} was used when calling {method}?"
            facts.append(make_fact(f"{session_id}:call:{method}:{slot}", hit[1], hit[0], probe, "service_call"))
    return facts


def key_facts(session_id: str, dialogue: dict[str, Any], messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Key facts of one SGD dialogue.

    - ``slot_value``: for each service, the slot values of the dialogue state at the service's last
      user frame; the source is the earliest turn whose act or span annotation carries that value
      and whose text contains it. ``superseded``: an earlier value the user informed for the same
      slot that is not among the final values (the user changed their mind).
    - ``service_call``: parameters of the last call of each method; canonical values are mapped to
      the surface strings the acts pair them with, then searched in the text up to the call turn.

    A value that contains, or is contained in, a value already used from the same message is skipped
    (:func:`training.data.facts.overlaps`; slot values come first).
    """
    turns = dialogue["turns"]
    final_state, informed, surface = _annotations(turns)
    seen: set[tuple[int, str]] = set()
    facts = _slot_facts(session_id, turns, messages, final_state, informed, seen)
    return facts + _call_facts(session_id, turns, messages, surface, seen)


def session_from_dialogue(dialogue: dict[str, Any], split: str) -> CorpusSession:
    """One SGD dialogue as a session record with weak labels and key facts."""
    sid = session_id_for(dialogue["dialogue_id"], split)
    messages = []
    for i, t in enumerate(dialogue["turns"]):
        m = make_message(sid, i, ROLE[t["speaker"]], t["utterance"])
        wl = weak_label(t["speaker"], t)
        cands = [t["utterance"][s["start"]:s["exclusive_end"]] for fr in t["frames"] for s in fr.get("slots", [])]
        cands += [v for fr in t["frames"] for a in fr.get("actions", []) if a.get("slot") != "intent"
                  for v in a.get("values", [])]
        m["weak"] = wl.with_spans(spans_in_text(m["text"], cands)).to_dict()
        messages.append(m)
    return make_session(sid, SOURCE, sid, LANGUAGE, split, messages,
                        key_facts=key_facts(sid, dialogue, messages),
                        meta={"services": dialogue.get("services", [])})


def iter_sessions(root: Path, splits: tuple[str, ...] = SPLITS) -> Iterator[CorpusSession]:
    """Every dialogue of the given upstream splits, streamed file by file from the gzip files."""
    for path in input_files(root, splits):
        split = path.parent.name
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            dialogues = json.load(fh)
        for d in dialogues:
            yield session_from_dialogue(d, split)
