"""The window's seams: sections in order with their own tokens, layers, hooks, compressors, sync,
and the tier planner as a pure function of the history."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_manager import agent_session

from ctxscore import ContextManager, Policy
from ctxscore.compress.base import compress_verified
from ctxscore.compress.verify import verify
from ctxscore.errors import ConfigError
from ctxscore.messages import Tier
from ctxscore.window.layers import Layer
from ctxscore.window.tiers import plan_compaction


def test_the_recalled_note_counts_as_its_section_wherever_it_stands():
    # the note of a page-in stands before the last unit, inside the conversation; the sections still
    # say what it holds (before, the recent section counted it and the recalled one showed 0)
    cm = ContextManager(scorer="rules", budget=800)
    cm.extend([{"role": "system", "content": "You are a concierge."},
               {"role": "user", "content": "My booking reference is Q1XUDH9Y at the Riverside Inn."},
               {"role": "assistant", "content": "Got it, Q1XUDH9Y."}])
    for t in range(60):
        cm.add({"role": "assistant", "content": f"Status update {t}: district {t} is mild; museum {t} opens at nine."})
        cm.add({"role": "user", "content": f"ok {t}"})
    win = cm.build(query="what is my booking reference?")
    at = next(i for i, m in enumerate(win.messages) if str(m["content"]).startswith("Earlier messages paged back in"))
    assert at < len(win.messages) - 1  # in place, not last
    recalled = next(s for s in win.sections if s.name == "recalled")
    assert recalled.messages == 1 and recalled.tokens == cm.counter.count_message(win.messages[at])
    assert sum(s.tokens for s in win.sections) + 3 == win.tokens
    assert sum(s.messages for s in win.sections) == len(win.messages)


def test_sections_are_in_the_documented_order_and_add_up():
    cm = ContextManager(scorer="rules", budget=1500)
    cm.extend(agent_session(10))
    win = cm.build()
    names = [s.name for s in win.sections]
    assert names == ["system", "archive_stubs", "history", "recent", "recalled"]
    assert sum(s.tokens for s in win.sections) + 3 == win.tokens  # + reply priming
    assert sum(s.messages for s in win.sections) == len(win.messages)
    system = win.sections[0].messages  # the system prompt and the pinned request that follows it
    assert [m["role"] for m in win.messages[:system]] == ["system", "user"]
    assert win.messages[1]["content"] == agent_session(10)[1]["content"]
    assert win.messages[system]["content"].startswith("[archived")  # the stub note follows the system section
    stubs = next(s for s in win.sections if s.name == "archive_stubs")
    assert stubs.messages == 1 and any(d.tier == "archived" for d in win.decisions)


class Notes(Layer):
    """A layer with its own section: one line per user message seen."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.tier_changes = 0
        self.builds = 0
        me = self

        class _Section:
            name, position = "ledger", 40

            def render(self, view):
                if not me.seen:
                    return [], 0
                msg = {"role": "system", "content": "Notes:\n" + "\n".join(me.seen)}
                return [msg], view.counter.count_message(msg)

        self.sections = (_Section(),)

    def on_add(self, entries):
        self.seen += [e.msg.content[:40] for e in entries if e.msg.role == "user"]

    def on_tiers(self, entries):
        self.tier_changes += len(entries)

    def on_reset(self):
        self.seen = []

    def after_build(self, window, view):
        self.builds += 1


def test_a_layer_adds_a_section_counted_against_the_budget():
    notes = Notes()
    cm = ContextManager(scorer="rules", budget=3000, layers=[notes])
    cm.extend(agent_session(30))
    win = cm.build()
    names = [s.name for s in win.sections]
    assert names.index("ledger") == names.index("system") + 1  # position 40: after system, before the stubs
    ledger = next(s for s in win.sections if s.name == "ledger")
    assert ledger.tokens > 0 and win.tokens <= 3000
    assert len(notes.seen) == sum(m["role"] == "user" for m in agent_session(30))
    assert notes.tier_changes > 0 and notes.builds == 1
    plain = ContextManager(scorer="rules", budget=3000)
    plain.extend(agent_session(30))
    # the layer's tokens are reserved: the history gets less room than without it
    assert sum(d.tokens_after for d in win.decisions) < sum(d.tokens_after for d in plain.build().decisions)


def test_hooks_see_every_window():
    seen = []
    cm = ContextManager(scorer="rules", budget=800, hooks=[lambda w, v: seen.append((w.tokens, v.budget))])
    cm.extend(agent_session(3))
    w = cm.build()
    cm.build(budget=600)
    assert seen[0] == (w.tokens, 800) and seen[-1][1] == 600


class Upper:
    """A compressor that invents nothing but drops an ID: the shared verifier must refuse it."""

    def compress(self, text, tier):
        return text.split(".")[0] + "." if tier == Tier.STRUCTURED else None


def test_any_compressor_is_verified_the_same_way():
    text = "Your booking is confirmed. The reference is QX-7781 for 2 people."
    res = compress_verified(Upper(), text, "structured")
    assert res.tier == Tier.VERBATIM and "QX-7781" in res.missing
    cm = ContextManager(scorer="rules", budget=700, compressor=Upper())
    cm.extend(agent_session(8))
    win = cm.build()
    shown = [e for e in cm.history.entries if e.tier == Tier.STRUCTURED]
    for e in shown:  # every structured form that reached the window passed the verifier
        assert verify(e.msg.content, e.forms[Tier.STRUCTURED].text).ok
    assert any(e.forms.get(Tier.STRUCTURED) and e.forms[Tier.STRUCTURED].tier == Tier.VERBATIM for e in cm.history.entries)
    assert "HAT" in json.dumps(win.messages)


def test_sync_appends_only_the_new_suffix():
    msgs = agent_session(3)
    cm = ContextManager(scorer="rules", budget=4000)
    r1 = cm.sync(msgs[:5])
    r2 = cm.sync(msgs)
    assert (r1.mode, len(r1.added)) == ("append", 5) and (r2.mode, len(r2.added), r2.kept) == ("append", len(msgs) - 5, 5)
    assert cm.sync(msgs).added == [] and len(cm) == len(msgs)


def test_sync_accepts_a_client_that_trims_its_own_copy():
    msgs = agent_session(4)
    cm = ContextManager(scorer="rules", budget=4000)
    cm.sync(msgs)
    new = {"role": "user", "content": "And the return flight?"}
    trimmed = [msgs[0], *msgs[-4:], new]
    res = cm.sync(trimmed)
    assert res.mode == "trimmed" and [m.content for m in res.added] == [new["content"]]
    assert len(cm) == len(msgs) + 1


def test_sync_rebases_on_an_edit_and_keeps_the_replaced_messages(tmp_path):
    msgs = agent_session(3)
    cm = ContextManager(scorer="rules", budget=4000, store=tmp_path / "s.db", session_id="s")
    cm.sync(msgs)
    edited = [*msgs[:3], {"role": "user", "content": "Actually, cancel everything."}]
    res = cm.sync(edited)
    assert res.mode == "rebased" and res.kept == 3 and len(res.added) == 1
    assert [m.content for m in cm.messages] == [m["content"] for m in edited]
    assert len(cm.store.load(res.detached)) == len(msgs) - 3
    again = ContextManager(scorer="rules", budget=4000, store=tmp_path / "s.db", session_id="s")
    assert [m.content for m in again.messages] == [m["content"] for m in edited]


def test_sync_with_a_verified_prefix_reads_only_the_rest():
    msgs = agent_session(4)
    cm = ContextManager(scorer="rules", budget=4000)
    cm.sync(msgs[:6])
    # the caller vouches for the first 6: they are not read again (these would not even validate)
    res = cm.sync([{"role": "robot"}] * 6 + msgs[6:], verified=6)
    assert (res.mode, res.kept, len(res.added)) == ("append", 6, len(msgs) - 6)
    assert [m.content for m in cm.messages] == [m["content"] for m in msgs]
    # a rest that is not an append is compared whole, as without verified=: here a rebase
    edited = [*msgs[:7], {"role": "user", "content": "Actually, cancel everything."}]
    res = cm.sync(edited, verified=6)
    assert (res.mode, res.kept) == ("rebased", 7) and cm.messages[-1].content == "Actually, cancel everything."
    for bad in (-1, len(cm) + 1, True, "3"):
        with pytest.raises(ConfigError, match="verified must be an integer"):
            cm.sync(edited, verified=bad)
    assert len(cm) == 8  # nothing changed by the refused calls


def test_the_tier_planner_changes_nothing_itself():
    cm = ContextManager(scorer="rules", budget=100_000)
    cm.extend(agent_session(12))
    h = cm.history
    before = (h.codes().tolist(), h.msg_tokens, h.stub_tokens, [e.tier for e in h.entries])
    vals, _ = cm.state.values.values(h, {})
    plan = plan_compaction(h, vals, cm.state.forms, Policy(), 1000)
    assert plan.changes and any(t == Tier.ARCHIVED for t in plan.changes.values())
    assert (h.codes().tolist(), h.msg_tokens, h.stub_tokens, [e.tier for e in h.entries]) == before
    assert np.all(np.asarray(list(plan.changes)) >= 0)


def test_long_messages_are_split_into_blocks_kept_and_paged_in_separately():
    from ctxscore.compress.blocks import blocked_form, split_blocks

    log = "\n\n".join(f"section {i}: " + ("ok " * 60) + (f"ERROR in module_{i}.py line {i}" if i == 7 else "")
                      for i in range(40))
    blocks = split_blocks(log)
    assert "".join(log[b.start:b.end] for b in blocks) == log and len(blocks) >= 20
    form = blocked_form(log, blocks, {0, len(blocks) - 1}, "m5")
    assert form.startswith(log[: blocks[0].end]) and "archived" in form and len(form) < len(log) / 5
    cm = ContextManager(scorer="rules", budget=1500)
    cm.add({"role": "user", "content": "Run the test suite and tell me what failed."})
    cm.add({"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "run_tests", "arguments": "{}"}}]})
    cm.add({"role": "tool", "tool_call_id": "c1", "name": "run_tests", "content": log})
    for i in range(8):
        cm.add({"role": "user", "content": f"Next question {i}: what about the docs build?"})
        cm.add({"role": "assistant", "content": f"The docs build {i} is fine. " + "Details. " * 30})
    win = cm.build()
    e = cm.history.entries[2]
    form = cm.state.forms.get(e, Tier.COMPRESSED)  # the log kept as its key blocks
    assert form.tier == Tier.COMPRESSED and form.tokens < e.tokens / 3
    assert "ERROR in module_7.py" in form.text and "section 0" in form.text and "archived" in form.text
    assert win.decisions[2].tier in ("compressed", "archived") and "section 23:" not in json.dumps(win.messages)
    paged = cm.build(query="what does section 23 say?")
    note = paged.messages[-2]["content"]  # the recalled note, before the last message
    assert note.startswith("Earlier messages paged back in") and "[#2 tool run_tests c1" in note
    shown = note[note.index("[#2 tool run_tests c1"):]
    assert "section 23:" in shown and len(shown) < len(log) / 2  # only the blocks the query names


def test_archiving_never_makes_the_window_larger_than_the_history():
    # at a budget of a few dozen tokens the line that collapses the archive stubs (about 26 tokens)
    # costs more than the short messages it stands for: before, 32 of 240 random short chats at
    # 60-75 tokens got a window larger than their whole history (70 tokens for a history of 55)
    rng = np.random.default_rng(3)
    words = "alpha beta gamma delta order ship pay refund ticket hotel train flight seat".split()
    larger = []
    for _ in range(240):
        budget = int(rng.integers(60, 76))
        chat = [{"role": ("user", "assistant")[k % 2], "content": " ".join(rng.choice(words, int(rng.integers(1, 9))))}
                for k in range(int(rng.integers(2, 9)))]
        tight, whole = ContextManager(budget=budget, scorer="rules"), ContextManager(budget=100_000, scorer="rules")
        tight.extend(chat)
        whole.extend(chat)
        if tight.build().tokens > whole.build().tokens:
            larger.append((budget, chat))
    assert not larger, larger[:2]


def test_stub_lines_may_not_take_more_than_the_low_water_mark():
    # stub_fraction=1.0 was accepted and left a window of 109 tokens of 1,500 with the newest user
    # message archived (the stubs of what compaction archived kept it over the low-water mark)
    with pytest.raises(ConfigError, match=r"stub_fraction must be in \[0, low_water=0.6\], got 1.0"):
        Policy(stub_fraction=1.0)
    assert Policy(stub_fraction=0.6).stub_fraction == 0.6
    assert Policy(stub_fraction=0.7, low_water=0.7, t_archive=0.8).stub_fraction == 0.7


def test_a_huge_recent_turns_setting_is_all_the_turns():
    """``Policy(recent_turns=10**12)`` at a tight budget relaxed recency one turn at a time and never
    finished (a new user's report): more turns than the session has are all of them."""
    from ctxscore import ContextManager, Policy

    msgs = [{"role": "system", "content": "Be brief."}]
    for i in range(6):
        msgs += [{"role": "user", "content": f"Question {i} about the weather in city number {i}?"},
                 {"role": "assistant", "content": f"Answer {i}: it is sunny and 2{i} degrees in city number {i}."}]
    huge = ContextManager(budget=60, scorer="rules", policy=Policy(recent_turns=10**12))
    huge.extend(msgs)
    w = huge.build()  # before the fix: never returned
    some = ContextManager(budget=60, scorer="rules", policy=Policy(recent_turns=6))
    some.extend(msgs)
    assert w.messages == some.build().messages


def test_the_recent_turns_clamp_keeps_the_messages_before_the_first_user_message_recent():
    """The clamp to the session's turns left turn 0 (the messages before any user message) without
    recency protection: an agent run of 40 tool calls and no user message lost 10 more messages."""
    import json

    from ctxscore import ContextManager, Policy

    msgs = [{"role": "system", "content": "You are an autonomous build agent."}]
    for i in range(40):
        msgs += [{"role": "assistant", "content": "", "tool_calls": [{"id": f"c{i}", "type": "function", "function": {
                     "name": "bash", "arguments": json.dumps({"command": f"make step{i}"})}}]},
                 {"role": "tool", "tool_call_id": f"c{i}", "content": f"step {i}: " + "compiled module ok. " * 12}]
    windows = []
    for k in (0, 1, 10**6):
        cm = ContextManager(budget=3000, scorer="rules", policy=Policy(recent_turns=k))
        cm.extend(msgs)
        windows.append(cm.build())
    # with no user message every message is in the last turn: any recency protects them as one turn
    assert windows[1].messages == windows[2].messages and windows[1].tokens > windows[0].tokens
