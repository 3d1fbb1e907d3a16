"""Retention of annotated key spans by the runtime compressors.

For every message of the evaluated sessions that has annotated key spans (the distilled labels in
``<corpora>/labels/distilled.jsonl``, joined by message id, or inline ``label`` objects as in
``data/bundled/sessions.jsonl``), each compressor of :mod:`ctxscore.compress` is run on the message
content, and a span counts as retained when its normalised text (:func:`eval.textnorm.normalize`)
occurs in the normalised output. Only spans that occur in the content are counted (the labels were
made on the rendered text, which for tool messages and tool calls adds a prefix or the call).

Compressors measured:

- ``structured_summary`` and ``aggressive_compress``: the raw extractive compressors.
- ``compress:structured`` and ``compress:compressed``: :func:`ctxscore.compress.compress`, which
  verifies entities and falls back to a gentler tier (the runtime path); ``fallback`` is the
  fraction of messages that came back verbatim.
- ``runtime``: what the manager would apply by the labelled category (``key_state`` -> structured,
  ``reasoning`` -> compressed; other categories are never compressed and are left out).

With ``extractor`` (the learned key-span extractor of the evaluated scorer, ``LearnedScorer.key_spans``:
what a context manager with that scorer asks its compressed forms to keep), the verified rows keep
its spans besides the entities, as the runtime does; without, the rules alone (``span_source``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ctxscore.compress import aggressive_compress, compress, structured_summary
from ctxscore.tokens import TokenCounter

from .sessions import EvalSession
from .textnorm import normalize

COMPRESSORS = ("structured_summary", "aggressive_compress", "compress:structured", "compress:compressed", "runtime")


def load_labels(path: str | Path | None) -> dict[str, dict[str, Any]]:
    """Distilled labels by message id: ``{id: {"category", "importance", "key_spans"}}``
    (:func:`training.data.labels.load_distilled`, which validates every line).

    Returns an empty dict when ``path`` is ``None`` or absent (the corpora are optional).

    Raises:
        training.data.labels.LabelFormatError: a line that is not a valid label (names the line).
    """
    if path is None or not Path(path).is_file():
        return {}
    from training.data.labels import load_distilled

    return load_distilled(Path(path))


def labelled_messages(sessions: Iterable[EvalSession], labels: dict[str, dict[str, Any]]) -> list[tuple[str, str, str, list[str]]]:
    """(message id, category, content, key spans) for every message with spans (inline label first)."""
    rows = []
    for s in sessions:
        for i, m in enumerate(s.messages):
            mid = s.message_id(i)
            lab = m.get("label") if isinstance(m.get("label"), dict) else labels.get(mid)
            if not lab or not lab.get("key_spans"):
                continue
            content = m.get("content") or ""
            if not isinstance(content, str) or not content.strip():
                continue
            spans = [sp for sp in lab["key_spans"] if isinstance(sp, str) and sp and sp in content]
            if spans:
                rows.append((mid, str(lab.get("category", "")), content, spans))
    return rows


def key_span_retention(sessions: Iterable[EvalSession], labels: dict[str, dict[str, Any]],
                       counter: TokenCounter | None = None,
                       extractor: Callable[[str], Sequence[str]] | None = None) -> dict[str, Any]:
    """Retention of key spans per compressor (see the module docstring).

    Args:
        sessions: the evaluated sessions.
        labels: distilled labels by message id (:func:`load_labels`).
        counter: token counter (default: ``TokenCounter()``).
        extractor: the learned key-span extractor the runtime uses (``text -> spans``), or ``None``.

    Returns:
        ``{"messages": n, "spans": n, "span_source": "learned" | "rules", "by_compressor": {name: {"messages", "spans", "retained",
        "token_ratio", "fallback", "by_category": {cat: {"spans", "retained"}}}}}``; ``retained`` and
        ``token_ratio`` (output tokens / input tokens, summed) are fractions.
    """
    counter = counter or TokenCounter()
    rows = labelled_messages(sessions, labels)
    stats: dict[str, dict[str, Any]] = {}
    for name in COMPRESSORS:
        stats[name] = {"messages": 0, "spans": 0, "kept": 0, "tok_in": 0, "tok_out": 0, "fallback": 0,
                       "by_category": defaultdict(lambda: [0, 0])}
    for _mid, cat, content, spans in rows:
        tok_in = counter.count(content)
        outs: dict[str, tuple[str, bool]] = {
            "structured_summary": (structured_summary(content), False),
            "aggressive_compress": (aggressive_compress(content), False),
        }
        for tier in ("structured", "compressed"):
            res = compress(content, tier, extractor=extractor)
            outs[f"compress:{tier}"] = (res.text, res.tier == "verbatim")
        if cat == "key_state":
            outs["runtime"] = outs["compress:structured"]
        elif cat == "reasoning":
            outs["runtime"] = outs["compress:compressed"]
        for name, (out, fell_back) in outs.items():
            st = stats[name]
            norm_out = normalize(out)
            kept = sum(1 for sp in spans if normalize(sp) in norm_out)
            st["messages"] += 1
            st["spans"] += len(spans)
            st["kept"] += kept
            st["tok_in"] += tok_in
            st["tok_out"] += counter.count(out)
            st["fallback"] += fell_back
            st["by_category"][cat][0] += len(spans)
            st["by_category"][cat][1] += kept
    result: dict[str, Any] = {"messages": len(rows), "spans": sum(len(r[3]) for r in rows),
                              "span_source": "rules" if extractor is None else "learned", "by_compressor": {}}
    for name, st in stats.items():
        result["by_compressor"][name] = {
            "messages": st["messages"],
            "spans": st["spans"],
            "retained": round(st["kept"] / st["spans"], 4) if st["spans"] else None,
            "token_ratio": round(st["tok_out"] / st["tok_in"], 4) if st["tok_in"] else None,
            "fallback": round(st["fallback"] / st["messages"], 4) if st["messages"] else None,
            "by_category": {c: {"spans": v[0], "retained": round(v[1] / v[0], 4) if v[0] else None}
                            for c, v in sorted(st["by_category"].items())},
        }
    return result
