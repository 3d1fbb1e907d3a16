"""End to end on real trajectories from ../shared/datasets at a tight budget (issue 2, item 13)."""

from __future__ import annotations

import gzip
import json
import re

import pytest

from ctxscore import ContextManager
from ctxscore.window.result import WarningKind

pytestmark = pytest.mark.corpora


def tau_trajectory(corpora, index: int = 0) -> list[dict]:
    data = json.loads((corpora / "tau_bench" / "historical_trajectories" / "gpt-4o-airline.json").read_text())
    return data[index]["traj"]


def swe_trajectory(corpora, name: str = "astropy__astropy-12907") -> list[dict]:
    with gzip.open(corpora / "swe_mini" / "trajs" / f"{name}.traj.json.gz", "rt", encoding="utf-8") as f:
        return json.load(f)["messages"]


def distinctive_phrase(text: str, others: list[str]) -> str | None:
    """A word of ``text`` (5+ characters) that no other message contains, case-insensitively; else
    three consecutive distinct words that never occur together in another message."""
    low_others = [o.lower() for o in others]
    words = [w.lower() for w in re.findall(r"[A-Za-z0-9_]{5,}", text)]
    for w in words:
        if not any(w in o for o in low_others):
            return w
    for i in range(len(words) - 2):
        trio = words[i : i + 3]
        if len(set(trio)) == 3 and not any(all(w in o for w in trio) for o in low_others):
            return " ".join(trio)
    return None


def assert_calls_paired(messages: list[dict]) -> None:
    """No tool result without its call right before it (or after other results of the same call)."""
    calls: set[str] = set()
    for out in messages:
        if out["role"] == "tool":
            assert out["tool_call_id"] in calls, "tool result separated from its call"
        else:
            calls = {c["id"] for c in out.get("tool_calls") or ()}


def check_session(messages: list[dict], budget: int) -> None:
    cm = ContextManager(budget=budget, scorer="rules")
    for m in messages:
        cm.add(m)
        win = cm.build()
        assert win.utilization <= 0.8 + 1e-9, (len(cm), win.tokens, win.warnings)
        by_id = {d.id: d for d in win.decisions}
        for d in win.decisions:
            if d.category == "instruction" or d.role == "system":
                assert d.tier == "verbatim"
        sent = [m for m in win.messages if m["role"] != "system" or not m["content"].startswith("[archived")]
        assert all(any(s.get("content") == o.content for s in sent) for d, o in zip(win.decisions, cm.messages, strict=True)
                   if d.pinned)
        assert_calls_paired(win.messages)
        assert len(by_id) == len(cm)
    win = cm.build()
    archived = [d for d in win.decisions if d.tier == "archived"]
    assert len(archived) >= 5, "the budget was meant to force archiving"
    texts = [m.text() for m in cm.messages]
    checked = 0
    for d in archived:
        others = [t for j, t in enumerate(texts) if j != d.turn]
        phrase = distinctive_phrase(texts[d.turn], others)
        if phrase is None:
            continue  # nothing distinctive in it (for example an empty tool result)
        paged = cm.build(query=phrase)
        assert_calls_paired(paged.messages)
        assert cm.search(phrase, k=12) and d.id in [h["id"] for h in cm.search(phrase, k=12)], (d.id, phrase)
        if d.id in paged.paged_in:
            checked += 1
        else:  # no room even for its unit's structured form: the window must say so
            assert any(w.kind == WarningKind.PAGE_IN_SKIPPED for w in paged.warnings), (d.id, phrase)
    assert checked >= 3


def test_tau_bench_trajectory_tight_budget(corpora):
    check_session(tau_trajectory(corpora, 0), budget=4000)


def test_mini_swe_agent_trajectory_tight_budget(corpora):
    check_session(swe_trajectory(corpora), budget=12000)
