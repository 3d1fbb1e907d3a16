"""LoCoMo (snap-research/locomo) loader: long multi-session conversations with question probes.

LoCoMo is not redistributed (its repository states no licence); this reads a copy the user
supplies, by format. One object per conversation (a JSON list of them, or one object), with
``speaker_a``, ``speaker_b``, ``session_N`` (lists of ``{"speaker", "dia_id", "text"}``, optional
``blip_caption`` for shared images) and ``session_N_date_time``, either at the top level or under
a ``conversation`` key, plus ``qa``: ``{"question", "answer", "evidence": ["D1:3"], "category"}``
(answers may be numbers; category 5 items are adversarial and carry ``adversarial_answer``).

Output: evaluation sessions (``docs/contracts.md``), one per conversation:

- messages in session order; ``speaker_a`` -> ``user``, ``speaker_b`` -> ``assistant``; content
  ``"{speaker}: {text}"`` (plus ``" [image: {blip_caption}]"`` when present); the first turn of
  each session is prefixed with ``"[{session date_time}] "`` so temporal questions stay answerable.
  Each message carries ``id`` ``locomo/{sample_id}#{i}`` and ``dia_id``; a conversation without
  ``sample_id`` takes the file's name (``stem``, or ``stem-N`` for the N-th of a list).
- one key fact per question (category 5 skipped): ``probe`` is the question; ``source_index`` is
  an evidence turn; ``value`` is chosen by this rule, first that applies:
  1. the answer text (numbers as written, e.g. ``2022``) occurs in an evidence turn's content
     (exact, then case-insensitive; the value keeps the content's casing): that turn, earliest
     evidence first;
  2. else the best key span: over every evidence turn, the contiguous run of words of the turn's
     text with the highest token F1 against the answer (lower-cased word tokens, stop words kept),
     at most ``len(answer words) + 3`` words; ties go to the shorter run, then the earlier
     evidence turn. The run must share at least one non-stop-word token with the answer,
     otherwise the question is skipped (counted in ``skipped``).
  Every fact records ``evidence_indices`` (all evidence turns found), ``answer`` (the original
  answer) and ``match`` (``"exact"`` | ``"casefold"`` | ``"best_span"``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

LOCOMO_CATEGORIES = {1: "multi_hop", 2: "temporal", 3: "open_domain", 4: "single_hop", 5: "adversarial"}
DIA_ID = re.compile(r"D(\d+):(\d+)")
WORD = re.compile(r"\w+(?:[-'’.:/]\w+)*", re.UNICODE)
STOP = frozenset("a an the of in on at to for and or is was were be by with from as it its this that".split())


class LocomoFormatError(ValueError):
    """The file does not look like LoCoMo (the message says what was missing)."""


def _session_keys(conv: dict[str, Any]) -> list[tuple[int, str]]:
    keys = []
    for k, v in conv.items():
        m = re.fullmatch(r"session_(\d+)", k)
        if m and isinstance(v, list):
            keys.append((int(m.group(1)), k))
    return sorted(keys)


def _best_span(text: str, answer: str) -> tuple[float, str] | None:
    words = list(WORD.finditer(text))
    ans = [w.lower() for w in WORD.findall(answer)]
    if not words or not ans:
        return None
    ans_set = set(ans)
    content_ans = ans_set - STOP
    best: tuple[float, int, str] | None = None
    max_len = len(ans) + 3
    for i in range(len(words)):
        for j in range(i, min(len(words), i + max_len)):
            toks = [w.group(0).lower() for w in words[i : j + 1]]
            common = sum(min(toks.count(t), ans.count(t)) for t in set(toks) & ans_set)
            if not common or not (set(toks) & content_ans):
                continue
            prec, rec = common / len(toks), common / len(ans)
            f1 = 2 * prec * rec / (prec + rec)
            span = text[words[i].start() : words[j].end()]
            cand = (f1, -len(toks), span)
            if best is None or cand[:2] > best[:2]:
                best = cand
    return (best[0], best[2]) if best else None


def _conversations(data: Any, where: str, stem: str) -> list[dict[str, Any]]:
    """The conversations of a file; one without ``sample_id`` is named after the file (``stem``, or
    ``stem-N`` in a list), so a folder of the public distribution's files gives distinct sessions."""
    items = data if isinstance(data, list) else [data]
    out = []
    for n, item in enumerate(items):
        if not isinstance(item, dict):
            raise LocomoFormatError(f"{where}: item {n} is not an object")
        conv = item.get("conversation") if isinstance(item.get("conversation"), dict) else item
        if "speaker_a" not in conv or "speaker_b" not in conv or not _session_keys(conv):
            raise LocomoFormatError(
                f"{where}: item {n} lacks speaker_a / speaker_b / session_N lists (at the top level or "
                "under 'conversation'); is this a LoCoMo file?"
            )
        sample = item.get("sample_id") or (stem if len(items) == 1 else f"{stem}-{n}")
        out.append({"sample_id": str(sample), "conv": conv, "qa": item.get("qa") or []})
    return out


def _messages(conv: dict[str, Any], sid: str) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The conversation's turns as messages (see the module docstring) and ``dia_id`` -> message index."""
    role = {conv["speaker_a"]: "user", conv["speaker_b"]: "assistant"}
    messages: list[dict[str, Any]] = []
    where: dict[str, int] = {}
    for num, key in _session_keys(conv):
        date = conv.get(f"{key}_date_time")
        for t, turn in enumerate(conv[key]):
            text = str(turn.get("text", ""))
            speaker = str(turn.get("speaker", ""))
            content = f"{speaker}: {text}"
            if turn.get("blip_caption"):
                content += f" [image: {turn['blip_caption']}]"
            if t == 0 and date:
                content = f"[{date}] {content}"
            i = len(messages)
            dia = str(turn.get("dia_id") or f"D{num}:{t + 1}")
            where[dia] = i
            messages.append({"id": f"{sid}#{i}", "dia_id": dia, "role": role.get(speaker, "user"),
                             "content": content})
    return messages, where


def _choose_value(answer: str, evidence: list[int], messages: list[dict[str, Any]]) -> tuple[int, str, str] | None:
    """``(source index, value, match)`` for an answer by the rules of the module docstring, or ``None``."""
    for i in evidence:
        if answer and answer in messages[i]["content"]:
            return i, answer, "exact"
    if answer:
        for i in evidence:
            c = messages[i]["content"]
            at = c.casefold().find(answer.casefold())
            if at >= 0 and len(c.casefold()) == len(c):
                return i, c[at : at + len(answer)], "casefold"
    best: tuple[float, int, str] | None = None
    for i in evidence:
        r = _best_span(messages[i]["content"], answer)
        if r and (best is None or (r[0], -len(r[1])) > (best[0], -len(best[2]))):
            best = (r[0], i, r[1])
    return (best[1], best[2], "best_span") if best else None


def _facts(qa_items: list[dict[str, Any]], sid: str, messages: list[dict[str, Any]],
           where: dict[str, int]) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """One key fact per usable question, and the counts of the skipped ones."""
    facts: list[dict[str, Any]] = []
    skipped = {"adversarial": 0, "no_evidence": 0, "no_match": 0}
    for q_idx, qa in enumerate(qa_items):
        cat = qa.get("category")
        if cat == 5 or "answer" not in qa:
            skipped["adversarial"] += 1
            continue
        ev_raw = qa.get("evidence") or []
        ev_raw = [ev_raw] if isinstance(ev_raw, str) else ev_raw
        ev = [where[f"D{a}:{b}"] for e in ev_raw for a, b in DIA_ID.findall(str(e)) if f"D{a}:{b}" in where]
        ev = list(dict.fromkeys(ev))
        if not ev:
            skipped["no_evidence"] += 1
            continue
        answer = str(qa["answer"]).strip()
        chosen = _choose_value(answer, ev, messages)
        if chosen is None:
            skipped["no_match"] += 1
            continue
        facts.append({
            "fact_id": f"{sid}:q{q_idx}", "value": chosen[1], "source_index": chosen[0],
            "probe": str(qa.get("question", "")), "kind": f"locomo_{LOCOMO_CATEGORIES.get(cat, cat)}",
            "evidence_indices": ev, "answer": answer, "match": chosen[2],
        })
    return facts, skipped


def load_locomo(path: str | Path) -> list[dict[str, Any]]:
    """Evaluation sessions from a LoCoMo JSON file (see the module docstring for the rules).

    Returns one dict per conversation: ``{"session_id": "locomo/{sample_id}", "source": "locomo",
    "language": "en", "messages": [...], "key_facts": [...], "skipped": {"adversarial", "no_evidence",
    "no_match"}}``.

    Raises:
        FileNotFoundError: ``path`` is missing.
        LocomoFormatError: invalid JSON or no LoCoMo structure.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise LocomoFormatError(f"{path}: not valid JSON ({exc.msg})") from exc
    sessions = []
    for item in _conversations(data, str(path), path.stem):
        sid = f"locomo/{item['sample_id']}"
        messages, where = _messages(item["conv"], sid)
        facts, skipped = _facts(item["qa"], sid, messages, where)
        sessions.append({"session_id": sid, "source": "locomo", "language": "en", "messages": messages,
                         "key_facts": facts, "skipped": skipped})
    return sessions
