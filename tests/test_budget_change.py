"""A build at a smaller budget than the session's (``build(budget=...)``, or a proxy request whose
tools take most of the budget) compacts for that budget; the builds after it, at the session's
budget, show the conversation again instead of keeping it archived for good."""

from __future__ import annotations

from ctxscore import ContextManager
from ctxscore.window.result import WarningKind


def support_chat(turns: int) -> list[dict]:
    """A support chat of ``turns`` questions about orders, each answered with its status."""
    out: list[dict] = [{"role": "system", "content": "You are a support agent for an online shop."}]
    for k in range(turns):
        out.append({"role": "user", "content": f"Where is my order ORD-{1000 + k}? I paid ${20 + k}.50 for it on May {k % 28 + 1}."})
        out.append({"role": "assistant", "content": f"Order ORD-{1000 + k} shipped with DHL on May {k % 28 + 2}; "
                                                      f"tracking number JD{700000 + k * 37}, arriving in {k % 5 + 2} days."})
    return out


def test_a_small_budget_for_one_build_does_not_archive_the_session_for_good():
    cm = ContextManager(budget=4000, scorer="rules")
    for m in support_chat(50):
        cm.add(m)
    whole = cm.build()
    # between the marks: not compacted, and not so small that the whole history is restored anyway
    assert all(d.tier == "verbatim" for d in whole.decisions) and 0.6 * 4000 < whole.tokens < 0.8 * 4000
    small = cm.build(budget=300)
    assert small.tokens < 0.2 * whole.tokens
    # before: 4,000 again showed what the 300-token build left (a window of a few hundred tokens)
    # and warned that the recent turns were compacted "to fit the budget of 4000 tokens"
    again = cm.build()
    assert again.tokens > 0.8 * whole.tokens
    assert not any(w.kind == WarningKind.RECENCY_RELAXED for w in again.warnings)
    tiers = [d.tier for d in again.decisions]
    assert tiers[-20:] == ["verbatim"] * 20  # the newest come back first
    cm.add({"role": "user", "content": "Thanks. And ORD-1039?"})
    after = cm.build()
    assert after.tokens > 0.8 * whole.tokens and "JD701813" in "".join(m["content"] for m in after.messages)


def test_compacted_messages_stay_compacted_while_the_window_is_above_the_restore_mark():
    # at the session's own budget compaction leaves the window near the low-water mark: nothing
    # comes back (the window's prefix stays what the provider's prompt cache holds)
    cm = ContextManager(budget=1500, scorer="rules")
    for m in support_chat(60):
        cm.add(m)
        cm.build()
    before = {d.id: d.tier for d in cm.build().decisions}
    assert "archived" in before.values()
    cm.add({"role": "user", "content": "Thanks, that is all."})
    after = {d.id: d.tier for d in cm.build().decisions}
    assert all(after[i] == t for i, t in before.items() if t == "archived")


def test_a_recent_tool_result_larger_than_the_low_water_mark_comes_back_too():
    """The newest unit, a test run's output of about 1,000 tokens, is more than the low-water mark
    of a 2,000-token budget can take back after a 1,000-token build: the restore stopped at it, and
    every later build at 2,000 sent about 200 tokens, warning that the recent turns were compacted
    "to fit the budget of 2000 tokens" (a new user's report). Recent units now come back up to the
    high-water mark, as a build that never saw the smaller budget keeps them."""
    def agent() -> ContextManager:
        cm = ContextManager(budget=2000, scorer="rules")
        cm.add({"role": "system", "content": "You are a coding agent. Never push to main."})
        cm.add({"role": "user", "content": "Fix the failing test in utils/parse.py; the CI id is CI-99812."})
        for i in range(12):
            cm.add({"role": "assistant", "content": f"Running test_{i}.", "tool_calls": [{"id": f"c{i}", "type": "function",
                    "function": {"name": "bash", "arguments": f'{{"cmd": "pytest -k test_{i}"}}'}}]})
            cm.add({"role": "tool", "tool_call_id": f"c{i}",
                    "content": f"FAILED test_{i} - AssertionError: expected 3 got 4\n" * (10 + 5 * i)})
            cm.add({"role": "user", "content": "continue"})
        return cm

    fresh = agent().build()
    cm = agent()
    cm.build()
    assert cm.build(budget=1000).tokens < 0.25 * fresh.tokens
    again = cm.build()
    assert again.tokens >= 0.9 * fresh.tokens and again.tokens <= 0.8 * 2000
    assert [d.tier for d in again.decisions][-3:] == ["verbatim"] * 3  # the last test run and its call
    assert "FAILED test_11" in "".join(m["content"] or "" for m in again.messages)


def test_a_resumed_session_left_small_by_a_smaller_budget_comes_back(tmp_path):
    """The budget of the last compaction lives in memory: a session resumed from its store (or
    rebased by the proxy, when a client resends the same history) kept the small window's tiers for
    good (the proxy: 316 tokens after one request with large tools, where a fresh session sends 1,173)."""
    db = str(tmp_path / "s.db")
    cm = ContextManager(budget=4000, scorer="rules", store=db, session_id="s")
    for m in support_chat(50):
        cm.add(m)
    whole = cm.build()
    assert cm.build(budget=300).tokens < 0.2 * whole.tokens
    cm.close()
    again = ContextManager(budget=4000, scorer="rules", store=db, session_id="s")
    assert again.build().tokens > 0.8 * whole.tokens
    again.close()
