"""The measurements beside recall: budgets of the final length, prompt-cache reuse, source ranks,
the fact ledger's cost and precision, task boundaries. Every expected value is worked out by hand
in the comments."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctxscore.memory.facts import Fact
from ctxscore.memory.ledger import FactLedger
from ctxscore.tokens import REPLY_PRIMING_TOKENS, TokenCounter
from eval.boundaries import (
    boundaries_from_tasks,
    boundary_figures,
    detect_tasks,
    match,
    member,
    real_boundaries,
    session_row,
)
from eval.budgets import Budget, parse_budgets
from eval.cache import PrefixReuse, cache_figures
from eval.ledger import LedgerAudit, slot_words
from eval.metrics import aggregate
from eval.policies import FullContext, Managed, Window, WindowStrategy, with_ledger
from eval.ranks import rank_figures, source_ranks
from eval.replay import Trace, full_context_tokens, replay
from eval.sessions import load_sessions, validate_records

FIXTURE = Path(__file__).parent / "fixtures" / "eval_sessions_mini.jsonl"


class TenEach:
    """A counter stand-in: every message is 10 tokens."""

    def count_message(self, message: dict) -> int:
        return 10


class LastFour(WindowStrategy):
    """Stub policy: the last 4 messages, 10 tokens each + 3 of reply priming."""

    name = "stub"

    def __init__(self) -> None:
        self.msgs: list[dict] = []

    def add(self, message: dict) -> None:
        self.msgs.append(message)

    def build(self, budget: int, query: str | None = None) -> Window:
        msgs = self.msgs[-4:]
        return Window(tokens=10 * len(msgs) + 3, budget=budget, messages_fn=lambda: list(msgs))


def _session(messages: list[dict], facts: list[dict] | None = None, sid: str = "t/s", **extra) -> object:
    return validate_records([("line 1", {"session_id": sid, "messages": messages, "key_facts": facts or [], **extra})])[0]


@pytest.fixture(scope="module")
def booking():
    return load_sessions(FIXTURE)[0]


# --- budgets: a fraction of the session's final length -------------------------------------------


def test_final_fraction_budget():
    b = Budget("final_fraction", 0.25, min_tokens=100)
    assert (b.key, b.label) == ("e0.25", "25% of end")
    assert b.tokens_at(50, 2000) == 500  # floor(0.25 * 2000), whatever the turn's own length
    assert b.tokens_at(1999, 2000) == 500
    assert b.tokens_at(50, 300) == 100  # floor(75) is under the floor of 100
    with pytest.raises(ValueError, match="final length"):
        b.tokens_at(50)
    for bad in (0, 1.5):
        with pytest.raises(ValueError):
            Budget("final_fraction", bad)
    with pytest.raises(ValueError, match="budget kind"):
        Budget("final", 0.25)
    got = parse_budgets([0.5], [4000], finals=[0.25, 0.25, 0.1])
    assert [b.key for b in got] == ["f0.5", "e0.25", "e0.1", "t4000"]
    assert [b.key for b in parse_budgets(None, None, finals=[0.3])] == ["e0.3"]  # one kind given: no defaults
    with pytest.raises(ValueError, match="no budget"):
        parse_budgets([], [], finals=[])


def test_final_budget_is_fixed_for_the_replay(booking):
    full = [1000 * (t + 1) for t in range(12)]  # final length 12,000
    tr = replay(booking, LastFour(), Budget("final_fraction", 0.25, min_tokens=600), full, probe_every=4)
    assert tr.budget == [3000] * 12  # floor(0.25 * 12000) at every turn
    # a budget-independent policy's trace moved to this budget gets the same figures
    moved = replay(booking, LastFour(), Budget("tokens", 40), full, probe_every=4).with_budget(
        Budget("final_fraction", 0.5, min_tokens=600))
    assert moved.budget == [6000] * 12 and moved.budget_key == "e0.5"


# --- prompt-cache reuse ----------------------------------------------------------------------------


def test_prefix_reuse_by_hand():
    a = {"role": "user", "content": "a"}
    b = {"role": "assistant", "content": "b"}
    c = {"role": "user", "content": "c"}
    x = {"role": "system", "content": "x"}
    reuse = PrefixReuse(TenEach())
    assert reuse.update([a, b]) == 0  # the first window reuses nothing
    assert reuse.update([a, b, c]) == 20  # a, b repeat
    assert reuse.update([dict(a), c]) == 10  # an equal copy of a repeats; c now stands where b was
    assert reuse.update([x, a, c]) == 0  # a new first message: nothing repeats
    assert reuse.update([x, a, c]) == 30


def test_cache_figures_by_hand():
    # tokens 100, 200; cached 0, 150; full 400, 600
    # reuse 150 / 300 = 0.5; effective (300 - 150 + 0.1 * 150) / 1000 = 0.165
    assert cache_figures([100, 200], [0, 150], [400, 600]) == {"cache_reuse": 0.5, "effective_token_ratio": 0.165}
    assert cache_figures([], [], []) == {"cache_reuse": None, "effective_token_ratio": None}
    with pytest.raises(ValueError, match="one entry per turn"):
        cache_figures([1, 2], [0], [1, 2])
    with pytest.raises(ValueError, match="more cached"):
        cache_figures([10], [11], [20])
    with pytest.raises(ValueError, match="price"):
        cache_figures([10], [0], [20], price=1.5)


def test_replay_cache_reuse_of_a_sliding_window(booking):
    # LastFour windows: t=0 [m0], t=1 [m0 m1], t=2 [m0..m2], t=3 [m0..m3], then [m1..m4], [m2..m5] ...
    # cached: 0, 10, 20, 30, then 0 at every later turn (the first message changes) -> 60 in all;
    # tokens 13, 23, 33, 43 and 43 x 8 -> 456; full 10 * (t + 1) + 3 -> 816
    full = [10 * (t + 1) + 3 for t in range(12)]
    tr = replay(booking, LastFour(), Budget("tokens", 40), full, probe_every=4, counter=TenEach())
    assert tr.cached == [0, 10, 20, 30] + [0] * 8
    m = aggregate([tr])
    assert m["cache_reuse"] == round(60 / 456, 4)
    assert m["effective_token_ratio"] == round((456 - 60 + 0.1 * 60) / 816, 4)
    # without a counter nothing is recorded
    assert aggregate([replay(booking, LastFour(), Budget("tokens", 40), full, probe_every=4)])["cache_reuse"] is None


def test_full_context_reuses_every_earlier_message(booking):
    # the full window at turn t repeats all of window t-1: its messages are the full context of turn
    # t-1 less the reply priming
    counter = TokenCounter()
    full = full_context_tokens(booking, counter)
    tr = replay(booking, FullContext(counter), Budget("tokens", 4000), full, counter=counter)
    assert tr.cached == [0] + [f - REPLY_PRIMING_TOKENS for f in full[:-1]]


def test_managed_window_tokens_match_the_counter(booking):
    # the reuse figures count window messages with the evaluation's counter; for the managed policy
    # they must add up to the window's own tokens (so nothing is clamped)
    counter = TokenCounter()
    pol = Managed("rules_ledger", "rules", booking.session_id, ledger=True)
    full = full_context_tokens(booking, counter)
    try:
        for t, m in enumerate(booking.messages):
            pol.add(m)
            win = pol.build(max(256, full[t] // 4))
            assert sum(counter.count_message(x) for x in win.messages) + REPLY_PRIMING_TOKENS == win.tokens
    finally:
        pol.close()


# --- source rank -----------------------------------------------------------------------------------


def _rank_session():
    msgs = [{"role": "user", "content": f"message {i}", "id": f"src/a#{i}"} for i in range(6)]
    msgs[0]["content"] = "message 0 (as Message  3 said)"  # holds f2's value, normalised
    facts = [{"fact_id": "f1", "value": "message 1", "source_index": 1, "probe": "p1", "kind": "slot"},
             {"fact_id": "f2", "value": "message 3", "source_index": 3, "probe": "p2", "kind": "slot"},
             {"fact_id": "f3", "value": "message 5", "source_index": 5, "probe": "p3", "kind": "ref"},
             {"fact_id": "f4", "value": "message 4", "source_index": 4, "probe": "p1", "kind": "ref"}]
    return _session(msgs, facts, source="demo")


def test_source_ranks_by_hand():
    sess = _rank_session()
    hits = {"p1": ["src/a#1", "src/a#0", "src/a#2", "src/a#4"], "p2": ["src/a#0", "src/a#1"], "p3": ["src/a#5"]}
    calls = []

    def search(q, k):
        calls.append((q, k))
        return hits[q]

    recs = source_ranks(sess, search, k=40)
    # f1: #1 first for p1 -> 1; f2: #3 not among p2's hits -> None; f3: 1; f4: #4 fourth for p1 -> 4
    assert [r["rank"] for r in recs] == [1, None, 1, 4]
    assert calls == [("p1", 40), ("p2", 40), ("p3", 40)]  # one search per distinct probe
    assert {r["source"] for r in recs} == {"demo"}
    fig = rank_figures(recs)
    # top1: f1, f3 -> 2/4; top4 (and 10, 40): f1, f3, f4 -> 3/4; mrr (1 + 0 + 1 + 1/4) / 4 = 0.5625
    assert (fig["facts"], fig["top1"], fig["top4"], fig["top10"], fig["top40"]) == (4, 0.5, 0.75, 0.75, 0.75)
    assert fig["not_found"] == 0.25 and fig["mrr"] == 0.5625
    # slot: f1 (1), f2 (None) -> top1 1/2, mrr 0.5; ref: f3 (1), f4 (4) -> top1 1/2, top4 1, mrr 0.625
    assert fig["by_kind"]["slot"]["top1"] == 0.5 and fig["by_kind"]["slot"]["mrr"] == 0.5
    assert fig["by_kind"]["ref"]["top4"] == 1.0 and fig["by_kind"]["ref"]["mrr"] == 0.625
    assert fig["by_source"]["demo"]["facts"] == 4
    # the first hit holding the value: f2's value is in #0, p2's first hit; the others as their source
    assert [r["value_rank"] for r in recs] == [1, 1, 1, 4]
    assert (fig["value"]["top1"], fig["value"]["top4"], fig["value"]["mrr"]) == (0.75, 1.0, 0.8125)
    # f1 and f4 share p1: one hit list for both, so at most one of them can rank first
    assert [r["same_probe"] for r in recs] == [2, 1, 1, 2]
    assert fig["ceiling"] == {"top1": 0.75, "top4": 1.0, "top10": 1.0}
    assert (fig["distinct"]["facts"], fig["distinct"]["top1"]) == (2, 0.5)  # f2 (None), f3 (1)
    assert fig["by_kind"]["slot"]["ceiling"]["top1"] == 1.0  # f1 and f2: different probes
    # k cuts the hit list: at k=2, #4 (fourth for p1) is out of reach
    assert [r["rank"] for r in source_ranks(sess, lambda q, k: hits[q], k=2)] == [1, None, 1, None]
    with pytest.raises(ValueError):
        source_ranks(sess, search, k=0)
    assert rank_figures([])["top1"] is None


def test_source_rank_uses_the_manager_search(booking):
    # the rank is the position of the fact's source id in ContextManager.search(probe, k=40)
    pol = Managed("rules", "rules", booking.session_id)
    try:
        for m in booking.messages:
            pol.add(m)
        recs = source_ranks(booking, pol.search_ids)
        for f, r in zip(booking.key_facts, recs, strict=True):
            ids = [h["id"] for h in pol.cm.search(f.probe, k=40)]
            mid = booking.message_id(f.source_index)
            assert r["rank"] == (ids.index(mid) + 1 if mid in ids else None)
        phone = next(r for r in recs if r["fact_id"] == "phone")
        assert phone["message_id"] == "mini/booking#3" and phone["rank"] is not None
    finally:
        pol.close()


# --- the fact ledger -------------------------------------------------------------------------------

_HEADER = "Facts so far (slot: value (source message); superseded values after 'was'):"


def _ledger_session():
    return _session([
        {"role": "user", "content": "What hotel budget do we have?", "id": "x/a#0"},
        {"role": "user", "content": "The cap is €240 per night.", "id": "x/a#1"},
        {"role": "assistant", "content": "", "id": "x/a#2", "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "book_reservation", "arguments": "{\"user_id\": \"mia_li_3668\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "{\"flights\": [{\"flight_number\": \"HAT136\"}]}", "id": "x/a#3"},
    ])


def test_slot_words():
    assert slot_words("book_reservation.user_id") == ["book", "reservation", "user", "id"]
    assert slot_words("flights.1.flight_number") == ["flights", "flight", "number"]
    assert slot_words("Hotel nightly cap") == ["hotel", "nightly", "cap"]
    assert slot_words("日期") == ["日期"]
    assert slot_words("0.1") == []


def test_ledger_fact_checks_by_hand():
    audit = LedgerAudit(_ledger_session())
    # value in the tool call's rendered arguments; book, reservation, user, id in "book_reservation({"user_id"...
    assert audit.check_fact("book_reservation.user_id", "mia_li_3668", "x/a#2") == (True, True)
    # "hotel" is in the message before, "cap" in the source; "nightly" nowhere
    assert audit.check_fact("hotel cap", "€240", "x/a#1") == (True, True)
    assert audit.check_fact("hotel nightly cap", "€240", "x/a#1") == (True, False)
    assert audit.check_fact("hotel cap", "€250", "x/a#1") == (False, True)  # the value is not in the source
    assert audit.check_fact("cap", "€240", "x/a#0") == (False, False)  # cites the wrong message
    assert audit.check_fact("flights.0.flight_number", "HAT136", "x/a#3") == (True, True)
    assert audit.check_fact("hotel cap", "€240", "x/a#9") == (False, False)  # an id the session lacks
    assert audit.check_fact("Cap", "€240", "x/a#1") == (True, True)  # slot words are case-folded
    assert audit.check_fact("cap", "€ 240", "x/a#1") == (False, True)  # values are byte-exact


def test_ledger_window_counts_by_hand():
    audit = LedgerAudit(_ledger_session())
    f1 = Fact(slot="book_reservation.user_id", value="mia_li_3668", source="x/a#2", turn=2)
    f2 = Fact(slot="hotel nightly cap", value="€240", source="x/a#1", turn=1)
    f3 = Fact(slot="note", value="two\nlines", source="x/a#1", turn=1)  # a value with a line break
    facts = {f.line(): f for f in (f1, f2, f3)}
    content = "\n".join([_HEADER, f1.line(), f2.line(), "stale: value (x/a#0)", f3.line()])
    calls = []

    def get():
        calls.append(1)
        return facts

    c = audit.check_window(content, get)
    # 4 lines: f1 precise; f2 value only; the stale line matches no fact; f3 (joined over its line
    # break) has a value absent from the source but "note"... is absent too -> neither
    assert (c.lines, c.precise, c.value_ok, c.slot_ok, c.unmatched) == (4, 1, 2, 1, 1)
    assert audit.check_window(content, get) is c and len(calls) == 1  # the same note: counted once
    assert audit.check_window(None, get).lines == 0


class ScriptedLedger(WindowStrategy):
    """Stub policy with a ledger whose note is scripted per turn (10 tokens a message, 7 per note)."""

    name = "stub_ledger"

    def __init__(self, notes: list[str | None], facts: dict[str, Fact]) -> None:
        self.msgs: list[dict] = []
        self.notes, self.facts = notes, facts

    @property
    def has_ledger(self) -> bool:
        return True

    def ledger_facts(self):
        return self.facts

    def add(self, message: dict) -> None:
        self.msgs.append(message)

    def build(self, budget: int, query: str | None = None) -> Window:
        note = self.notes[len(self.msgs) - 1]
        msgs = self.msgs[-2:]
        extra = 7 if note else 0
        return Window(tokens=10 * len(msgs) + 3 + extra, budget=budget, messages_fn=lambda: list(msgs),
                      ledger_tokens=extra, ledger_text=note)


def test_replay_ledger_figures_by_hand():
    sess = _ledger_session()
    f1 = Fact(slot="book_reservation.user_id", value="mia_li_3668", source="x/a#2", turn=2)
    f2 = Fact(slot="hotel nightly cap", value="€240", source="x/a#1", turn=1)
    one = "\n".join([_HEADER, f1.line()])
    two = "\n".join([_HEADER, f1.line(), f2.line()])
    pol = ScriptedLedger([None, one, two, two], {f.line(): f for f in (f1, f2)})
    full = [100, 200, 300, 400]
    tr = replay(sess, pol, Budget("tokens", 1000), full, probe_every=10)
    # ledger tokens per turn 0, 7, 7, 7 -> mean 5.25; window tokens 13, 30, 30, 30 -> share 21/103
    # lines: 0 + 1 + 2 + 2 = 5; precise: f1 at turns 1, 2, 3 -> 3; value ok 5; slot ok 3
    assert tr.ledger_tokens == [0, 7, 7, 7]
    m = aggregate([tr])
    assert m["ledger_tokens_mean"] == 5.25 and m["ledger_share"] == round(21 / 103, 4)
    assert (m["ledger_lines"], m["ledger_precision"], m["ledger_value_ok"], m["ledger_slot_ok"]) == (5, 0.6, 1.0, 0.6)
    assert m["ledger_unmatched"] == 0
    # a policy without a ledger has no ledger figures
    assert aggregate([replay(sess, LastFour(), Budget("tokens", 1000), full)])["ledger_precision"] is None


def test_managed_ledger_section_is_read_from_the_window():
    # at 400 tokens the 940-token trip session is compacted; facts of compacted messages show in the note
    trip = load_sessions(FIXTURE)[1]
    pol = Managed("rules_ledger", "rules", trip.session_id, ledger=True)
    assert isinstance(pol.ledger, FactLedger) and pol.has_ledger
    seen = 0
    try:
        for m in trip.messages:
            pol.add(m)
            win = pol.build(400)
            direct = pol.cm.build(budget=400)
            sec = next(s for s in direct.sections if s.name == "ledger")
            assert win.ledger_tokens == sec.tokens
            notes = [x["content"] for x in direct.messages if x.get("content", "").startswith("Facts so far")]
            assert win.ledger_text == (notes[0] if notes else None)
            if win.ledger_text:
                seen += 1
                lines = win.ledger_text.split("\n")[1:]
                assert set(lines) <= set(pol.ledger_facts())  # every shown line is a current fact's line
    finally:
        pol.close()
    assert seen > 0
    plain = Managed("rules", "rules", trip.session_id)
    assert not plain.has_ledger and plain.ledger_facts() == {}
    plain.close()


def test_with_ledger():
    assert with_ledger(["full", "rules", "learned"]) == ["full", "rules", "rules_ledger", "learned", "learned_ledger"]
    assert with_ledger(["rules", "rules_ledger"]) == ["rules", "rules_ledger"]


# --- task boundaries -------------------------------------------------------------------------------


def _task_session():
    members = ["t/a"] * 4 + ["t/b"] * 4 + ["t/c"] * 2  # real boundaries at 4 and 8
    texts = [("system", "You are a travel agent."), ("user", "I need a hotel in Paris."),
             ("assistant", "Booked the Hotel Lumiere. Anything else?"), ("user", "No, that's all. Thanks, bye!"),
             ("assistant", "Have a good day!"), ("user", "Hi, I need a taxi to the airport."),
             ("assistant", "Sure, when?"), ("user", "At 5pm."),
             ("system", "New episode: you are an airline agent."), ("user", "Hello")]
    msgs = [{"role": r, "content": c, "id": f"{members[i]}#{i}"} for i, (r, c) in enumerate(texts)]
    return _session(msgs, sid="test/t/000")


def test_boundaries_by_hand():
    assert member("sgd/18_00003#4") == "sgd/18_00003" and member("plain") == "plain"
    sess = _task_session()
    assert sess.source == "t"  # no source field: the first message id's part before "/"
    assert real_boundaries(sess) == [4, 8]
    assert boundaries_from_tasks([0, 0, 1, 1, 1, 2]) == [2, 5]
    # the runtime: #5 is a request right after closing words (#3 "that's all", "bye"; #4 "have a good")
    # -> a new task; #8 is a system message after a user message -> a new task; nothing else
    tasks = detect_tasks(sess)
    assert boundaries_from_tasks(tasks) == [5, 8]
    assert match([4, 8], [5, 8]) == 1
    assert match([4, 8], [5, 8], tolerance=1) == 2
    assert match([4, 5], [5], tolerance=1) == 1  # one detected boundary matches one real one
    assert match([4, 6], [5, 6], tolerance=1) == 2  # 4 takes 5, 6 takes 6
    with pytest.raises(ValueError):
        match([1], [1], tolerance=-1)
    row = session_row(sess, tasks)
    assert row == {"session_id": "test/t/000", "source": "t", "real": 2, "detected": 2, "tp": 1}
    with pytest.raises(ValueError, match="task numbers"):
        session_row(sess, tasks[:-1])
    other = {"session_id": "o", "source": "u", "real": 3, "detected": 0, "tp": 0}
    fig = boundary_figures([row, other])
    # overall: tp 1, detected 2, real 5 -> precision 0.5, recall 0.2, f1 2*0.1/0.7
    assert fig["overall"] == {"sessions": 2, "real": 5, "detected": 2, "tp": 1, "precision": 0.5, "recall": 0.2,
                              "f1": round(2 * 0.5 * 0.2 / 0.7, 4)}
    assert fig["by_source"]["t"]["precision"] == 0.5 and fig["by_source"]["t"]["recall"] == 0.5
    assert fig["by_source"]["u"]["precision"] is None and fig["by_source"]["u"]["recall"] == 0.0


def test_replayed_manager_gives_the_same_tasks():
    # the evaluation reads Entry.task from the managed policy it replayed message by message
    sess = _task_session()
    pol = Managed("rules", "rules", sess.session_id)
    try:
        for m in sess.messages:
            pol.add(m)
            pol.build(64)
        assert pol.task_numbers() == detect_tasks(sess)
    finally:
        pol.close()


def test_session_source_rules():
    assert _session([{"role": "user", "content": "x"}], sid="a/b", source="sgd").source == "sgd"
    assert _session([{"role": "user", "content": "x", "id": "multiwoz/SNG1#0"}], sid="test/multiwoz/0").source == "multiwoz"
    assert _session([{"role": "user", "content": "x"}], sid="mini/booking").source == "mini"
    assert _session([{"role": "user", "content": "x"}], sid="solo").source == "solo"
    # the source is metadata: not part of the session file form
    assert "source" not in _session([{"role": "user", "content": "x"}], source="sgd").to_dict()



def test_recall_by_source_and_kind_pools_checks():
    from eval.replay import ProbeResult

    # source a: x present at t=5, missing at the end (back with page-in); source b: y missing at the end
    a = Trace("s1", "p", "t1", 2, source="a", probes=[
        ProbeResult(5, "x", "slot", True, True), ProbeResult(9, "x", "slot", False, True, is_end=True)])
    b = Trace("s2", "p", "t1", 2, source="b", probes=[ProbeResult(9, "y", "ref", False, False, is_end=True)])
    m = aggregate([a, b])
    assert m["recall_by_source"]["a"] == {"checks": 2, "recall": 0.5, "recall_pagein": 1.0, "end_checks": 1,
                                          "recall_end": 0.0, "recall_end_pagein": 1.0}
    assert m["recall_by_source"]["b"] == {"checks": 1, "recall": 0.0, "recall_pagein": 0.0, "end_checks": 1,
                                          "recall_end": 0.0, "recall_end_pagein": 0.0}
    assert m["recall_by_kind"]["slot"] == m["recall_by_source"]["a"]
    # overall: 3 checks, 1 / 2 present; at the end 0 / 1 of 2
    assert (m["recall"], m["recall_pagein"], m["recall_end"], m["recall_end_pagein"]) == (
        round(1 / 3, 4), round(2 / 3, 4), 0.0, 0.5)
