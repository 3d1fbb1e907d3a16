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
