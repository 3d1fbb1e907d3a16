"""Pinned content over the budget: the newest instruction is shown condensed, its hard constraint
byte-exact, and verbatim again once the budget allows."""

from __future__ import annotations

from ctxscore import ContextManager
from ctxscore.tokens import REPLY_PRIMING_TOKENS
from ctxscore.window.result import WarningKind

PROSE = ("I would love a room with a desk, good wifi, a quiet view over the garden, a comfortable chair and a "
         "kettle, since I will be working late most evenings and like to have tea while I read. ") * 3
CONSTRAINT = "It must cost at most 120 euros a night."
REQUEST = "Please book a hotel in Paris for the conference. " + PROSE + CONSTRAINT + " " + PROSE


def _messages() -> list[dict]:
    return [{"role": "system", "content": "You are a travel agent."}, {"role": "user", "content": REQUEST}]


def _pinned_shown(cm: ContextManager) -> int:
    return sum(e.cur_tokens for e in cm.history.entries if e.pinned)


def test_a_long_newest_instruction_is_condensed_to_its_constraint_and_restored_when_it_fits():
    cm = ContextManager(scorer="rules", budget=100_000)
    cm.extend(_messages())
    full = cm.build()
    assert full.messages[-1]["content"] == REQUEST
    verbatim = cm.history.pinned_tokens + REPLY_PRIMING_TOKENS
    budget = verbatim // 2  # the instruction alone is above the budget
    tight = cm.build(budget=budget)
    assert tight.tokens <= budget
    assert not any(w.kind == WarningKind.PINNED_OVER_BUDGET for w in tight.warnings)
    assert cm.history.pinned_tokens == _pinned_shown(cm)  # the real quantity moved, not only the warning
    assert cm.history.pinned_tokens + REPLY_PRIMING_TOKENS <= budget
    last = tight.decisions[-1]
    assert last.pinned and last.tier != "verbatim" and last.tokens_after < last.tokens_before
    text = tight.messages[-1]["content"]
    assert CONSTRAINT in text and "kettle" not in text  # the constraint byte-exact, the prose gone
    assert tight.messages[0]["content"] == "You are a travel agent."  # system messages stay verbatim
    again = cm.build(budget=100_000)
    assert again.messages[-1]["content"] == REQUEST and again.decisions[-1].tier == "verbatim"
    assert cm.history.pinned_tokens + REPLY_PRIMING_TOKENS == verbatim
    assert not cm.history.condensed


def test_system_messages_are_never_condensed_and_overflow_is_still_reported():
    cm = ContextManager(scorer="rules", budget=100_000)
    cm.extend([{"role": "system", "content": "Follow the policy. " + PROSE * 4}, {"role": "user", "content": REQUEST}])
    system = cm.history.entries[0].tokens
    win = cm.build(budget=system // 2)
    assert win.messages[0]["content"].startswith("Follow the policy. ")
    assert win.decisions[0].tier == "verbatim"
    assert any(w.kind == WarningKind.PINNED_OVER_BUDGET for w in win.warnings)
    assert CONSTRAINT in win.messages[-1]["content"]  # the instruction is condensed, its constraint kept
    assert cm.history.pinned_tokens == _pinned_shown(cm)


def test_a_condensed_instruction_of_a_finished_task_leaves_the_pinned_total():
    cm = ContextManager(scorer="rules", budget=100_000)
    cm.extend(_messages())
    cm.build(budget=(cm.history.pinned_tokens + REPLY_PRIMING_TOKENS) // 2)
    assert cm.history.condensed
    cm.history.start_task()
    assert cm.history.pinned_tokens == _pinned_shown(cm)
    assert not cm.history.condensed


def test_a_build_that_raises_on_overflow_keeps_memory_and_store_in_step(tmp_path):
    from ctxscore import Policy
    from ctxscore.errors import BudgetError
    from ctxscore.messages import Tier

    big_system = {"role": "system", "content": "Never share a passenger's data with anyone. " * 60}
    db = tmp_path / "s.db"
    cm = ContextManager(scorer="rules", budget=100_000, store=db, session_id="s", policy=Policy(on_overflow="raise"))
    cm.extend([big_system, {"role": "user", "content": REQUEST}])
    try:
        cm.build(budget=200)  # the system message alone is over: the build raises after condensing the request
    except BudgetError:
        pass
    else:
        raise AssertionError("a system message over the budget must raise with on_overflow='raise'")
    shown = {e.msg.id: e.tier for e in cm.history.entries}
    assert shown[cm.history.entries[1].msg.id] != Tier.VERBATIM
    assert {r.message.id: r.tier for r in cm.store.load("s")} == shown  # the store holds what memory shows


def test_a_page_in_that_finds_no_room_shows_the_instructions_condensed_for_that_build_only():
    cm = ContextManager(scorer="rules", budget=100_000)
    cm.extend(_messages())
    cm.add({"role": "assistant", "content": "Noted. Your conference badge code is ZX-4412, keep it for the check-in."})
    for i in range(12):
        cm.add({"role": "user", "content": f"Tell me about museum number {i} near the venue."})
        cm.add({"role": "assistant", "content": f"Museum {i} shows paintings and sculptures of many periods. " * 2})
    pinned = cm.history.pinned_tokens + REPLY_PRIMING_TOKENS
    def stubs(win):
        return [line for m in win.messages for line in str(m["content"]).splitlines() if line.startswith("[archived")]

    roomier = pinned + 90  # the stub note collapsed into its one line makes room: the instruction stays verbatim
    asked = cm.build(query="What is my conference badge code?", budget=roomier)
    assert "ZX-4412" in str(asked.messages) and REQUEST in str(asked.messages) and asked.tokens <= roomier
    assert len(stubs(asked)) == 1
    plain = cm.build(budget=roomier)  # without a query the note does not fit whole either: its one line too
    assert len(stubs(plain)) == 1 and plain.tokens <= roomier
    assert len(stubs(cm.build(budget=roomier + 200))) > 1  # collapsed for those builds only
    budget = pinned + 60  # the instruction leaves no room for the message that holds the code, even with the note collapsed
    plain = cm.build(budget=budget)
    assert "ZX-4412" not in str(plain.messages) and REQUEST in str(plain.messages)
    asked = cm.build(query="What is my conference badge code?", budget=budget)
    text = str(asked.messages)
    assert "ZX-4412" in text and asked.tokens <= budget
    assert CONSTRAINT in text and REQUEST not in text  # condensed for this build, its constraint byte-exact
    assert asked.messages[0]["content"] == "You are a travel agent."  # the system message stays verbatim
    request = next(d for d in asked.decisions if d.pinned and d.role == "user")
    assert request.tier != "verbatim" and request.tokens_after < request.tokens_before
    again = cm.build(budget=budget)  # tiers did not change: the next build without a query is the same
    assert again.messages == plain.messages
    assert cm.history.entries[1].tier == "verbatim" and not cm.history.condensed


def questions_chat(turns: int, seed: int = 5) -> list[dict]:
    """A long chat of separate questions with short answers: no task ever ends, so every question
    stays an instruction of the active task."""
    import random

    rng = random.Random(seed)
    asks = ["What's the weather going to be like in {c} tomorrow?", "Can you find me a cheap restaurant in {c}?",
            "How do I get from the airport to downtown {c}?", "Is the museum in {c} open on Mondays?"]
    cities = ["Paris", "Lisbon", "Kyoto", "Denver", "Oslo", "Cairo"]
    answers = ["It depends on the season.", "Prices vary a lot.", "Booking ahead is wise.", "Public transport is reliable."]
    out = [{"role": "system", "content": "You are a helpful travel assistant."}]
    for _ in range(turns):
        out.append({"role": "user", "content": rng.choice(asks).format(c=rng.choice(cities))})
        out.append({"role": "assistant", "content": "Here is what I found: " + " ".join(rng.choice(answers) for _ in range(3))})
    return out


def test_instructions_that_pile_up_give_way_to_the_recent_turns_and_the_window_fits():
    # 150 questions of one never-ending task: before, the pins filled the budget, the recent turns
    # and the stub note went on top, and 170 of 300 windows were over the budget
    cm = ContextManager(scorer="rules", budget=1000)
    for m in questions_chat(150):
        cm.add(m)
        win = cm.build()
        assert win.tokens <= 1000, (len(cm), win.tokens, [str(w) for w in win.warnings])
    h = cm.history
    asked = [i for i, e in enumerate(h.entries) if e.msg.role == "user"]
    assert h.entries[asked[-1]].pinned  # the newest question stays pinned
    released = [i for i in asked if not h.entries[i].pinned]
    assert len(released) > 50 and released[:10] == asked[:10]  # the oldest ones gave way
    assert h.pinned_tokens + h.recent_tokens(3) <= 1000
    assert "[archived" in win.messages[1]["content"]  # the archived questions keep their note


def test_instructions_give_way_by_what_the_window_is_over_when_corrections_and_constraints_stay():
    # a trip's hard rule and budget correction, which stay verbatim, then 14 restaurant questions of
    # one task at 400 tokens: the release counted only pins against the room and released nothing,
    # and the window was 423 tokens, over the budget with ten releasable questions still pinned
    cm = ContextManager(scorer="rules", budget=400)
    cm.extend([
        {"role": "system", "content": "You are a travel booking assistant for Acme Travel."},
        {"role": "user", "content": "Find me a hotel near Baixa in Lisbon, my hotel budget is €210 per night."},
        {"role": "assistant", "content": "I found Hotel Lumen (€205), Casa Alfama (€199) and Baixa Grand (€209)."},
        {"role": "user", "content": "Important rule: never book basic economy for me, under any circumstances."},
        {"role": "assistant", "content": "Understood, I will never book basic economy fares for you."},
        {"role": "user", "content": "Actually, change the hotel budget to €240 per night, I want something nicer."},
        {"role": "assistant", "content": "With €240 per night, Memmo Principe Real (€238) is the best option."},
    ])
    for i in range(14):
        cm.add({"role": "user", "content": f"Can you suggest a restaurant for day {i + 1} in Lisbon? Something with seafood near the river maybe."})
        cm.add({"role": "assistant", "content": f"For day {i + 1}, try Restaurante Mar {i}: grilled sardines, octopus rice and a "
                "view of the Tagus. It is usually busy around 8pm so go early or reserve; the staff speak English."})
        win = cm.build()
        assert win.tokens <= 400, (i, win.tokens, [str(w) for w in win.warnings])
    text = str(win.messages)
    assert "never book basic economy" in text and "€240 per night" in text


def test_a_large_output_in_the_recent_turns_releases_no_instruction():
    # the window is over the budget because of a tool output in the last turn, not because of the
    # pins: releasing every older instruction would not make it fit, so none is released (a release
    # is for good, and the output soon leaves the recent turns); the output is shown cut to fit instead
    cm = ContextManager(scorer="rules", budget=1000)
    cm.add({"role": "system", "content": "You are a careful coding agent."})
    for ask in ("Refactor the billing module. Keep every public function name unchanged and write tests for it.",
                "Also, use type hints everywhere and prefer dataclasses over dicts for the records you introduce.",
                "And log every change to CHANGELOG.md with the date."):
        cm.add({"role": "user", "content": ask})
        cm.add({"role": "assistant", "content": "Will do."})
    cm.add({"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "read", "arguments": '{"path": "billing.py"}'}}]})
    cm.add({"role": "tool", "tool_call_id": "c1",
            "content": "\n".join(f"def f{i}(x): return x * {i}  # billing helper number {i}" for i in range(60))})
    pinned = [i for i, e in enumerate(cm.history.entries) if e.pinned]
    win = cm.build()
    assert cm.history.entries[-1].tokens > 1000  # the output alone is over the budget
    assert win.tokens <= 1000 and [w.kind for w in win.warnings] == [WarningKind.LAST_MESSAGE_FITTED]
    assert [i for i, e in enumerate(cm.history.entries) if e.pinned] == pinned == [0, 1, 3, 5]
