"""ContextManager: tier policy, pinning, tool units, recency, batching, page-in, bad input, resume."""

from __future__ import annotations

import json

import pytest

from ctxscore import BudgetError, ConfigError, ContextManager, InputError, Policy
from ctxscore.window.result import WarningKind


def agent_session(cycles: int = 12) -> list[dict]:
    """A synthetic support session: a policy, a goal with a constraint, then tool cycles."""
    msgs = [
        {"role": "system", "content": "You are an airline agent. Never book without explicit confirmation."},
        {"role": "user", "content": "Please book me a flight to Seattle on May 20, it must arrive before 6pm."},
    ]
    for c in range(cycles):
        call_id = f"call_{c}"
        msgs += [
            {"role": "assistant", "content": f"Let me check the options, I think I should look at step {c} first and then maybe compare.",
             "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "search_flights", "arguments": json.dumps({"page": c})}}]},
            {"role": "tool", "tool_call_id": call_id, "name": "search_flights",
             "content": json.dumps([{"flight_number": f"HAT{100 + c * 7}", "price": 120 + c, "seats": 3 + c, "note": " ".join(f"row{r} seat{r}A" for r in range(40))}])},
            {"role": "assistant", "content": f"Flight HAT{100 + c * 7} costs ${120 + c} and arrives at 5:{10 + c}pm. Would you like it? " + "Some filler prose about the options that does not matter much. " * 4},
            {"role": "user", "content": "Hmm, let me think." if c % 3 else
             "Error: my app crashed again and the screen went blank, sorry, that attempt failed completely and "
             "nothing was saved at all."},
        ]
    return msgs


def test_everything_verbatim_below_first_threshold():
    msgs = agent_session(2)
    cm = ContextManager(scorer="rules", budget=100_000)
    cm.extend(msgs)
    win = cm.build()
    assert all(d.tier == "verbatim" for d in win.decisions)
    assert len(win.messages) == len(msgs)
    assert win.tokens == cm.total_tokens


def test_tight_budget_respects_invariants():
    msgs = agent_session(12)
    cm = ContextManager(scorer="rules", budget=1000)
    for m in msgs:
        cm.add(m)
        win = cm.build()
        assert win.utilization <= 0.8 + 1e-9
        # instructions survive verbatim
        for d in win.decisions:
            if d.category == "instruction" or d.role == "system":
                assert d.tier == "verbatim" and d.pinned
        # every tool result in the window follows its call, and every call has its results
        open_calls: set[str] = set()
        for out in win.messages:
            if out["role"] == "tool":
                assert out["tool_call_id"] in open_calls
            elif out.get("tool_calls"):
                open_calls = {c["id"] for c in out["tool_calls"]}
            else:
                assert not (open_calls - seen_results(win.messages, open_calls))
    assert cm.total_tokens > 4 * 1000  # the test really compacted
    tiers = {d.tier for d in win.decisions}
    assert "archived" in tiers


def seen_results(messages: list[dict], calls: set[str]) -> set[str]:
    return {m["tool_call_id"] for m in messages if m["role"] == "tool" and m["tool_call_id"] in calls}


def test_recent_turns_stay_verbatim():
    msgs = agent_session(10)
    cm = ContextManager(scorer="rules", budget=2500, policy=Policy(recent_turns=2))
    cm.extend(msgs)
    win = cm.build()
    # the last two user turns start at the last two user messages
    user_idx = [i for i, m in enumerate(msgs) if m["role"] == "user"]
    start = user_idx[-2]
    assert all(d.tier == "verbatim" for d in win.decisions[start:])
    assert any(d.tier != "verbatim" for d in win.decisions[:start])


def test_compaction_is_batched_and_prefix_stable():
    msgs = agent_session(14)
    cm = ContextManager(scorer="rules", budget=3000)
    changes = 0
    prev = None
    for m in msgs:
        cm.add(m)
        tiers = [d.tier for d in cm.build().decisions]
        if prev is not None and tiers[: len(prev)] != prev:
            changes += 1
        prev = tiers
    # compaction happens in a few batches, not on every turn
    assert 0 < changes < len(msgs) // 4


def test_failures_archived_first_and_values_explained():
    cm = ContextManager(scorer="rules", budget=2000)
    cm.extend(agent_session(8))
    win = cm.build()
    fails = [d for d in win.decisions if d.category == "failure" and d.turn < len(win.decisions) - 12]
    big = [d for d in fails if d.tokens_before > 20]  # a stub (about 15 tokens) would not shrink the others
    assert big and all(d.tier == "archived" for d in big)
    assert all(d.tier == "verbatim" for d in fails if d.tokens_before <= 12)
    d = win.decisions[5]
    assert 0.0 <= d.value <= 1.0
    assert {"base", "recency", "references", "entity_density", "confirmation", "token_cost", "relevance"} <= set(d.factors)


def test_a_short_user_confirmation_raises_the_proposal_it_answers():
    proposal = {"role": "assistant", "content": "I can book flight UA 889 on May 3 for $412. Shall I book it?"}
    cm = ContextManager(scorer="rules", budget=4000)
    cm.extend([{"role": "user", "content": "Find me a flight to Denver."}, proposal,
               {"role": "user", "content": "Yes, please book it."}])
    # a long user message is not a confirmation, even when it says yes
    cm.extend([dict(proposal, content=proposal["content"].replace("UA 889", "UA 412")),
               {"role": "user", "content": "Yes, but first tell me the baggage rules, the seat map and whether "
                                          "the fare is refundable if I cancel before May 1."}])
    d = cm.build().decisions
    assert d[1].factors["confirmation"] == 1.3  # confirmation_boost of the default rule file
    assert d[3].factors["confirmation"] == 1.0


def test_page_in_brings_back_archived_original():
    msgs = agent_session(12)
    # four units at most: every search result matches the query's words, and with all twelve the
    # later ones would collapse the stub note and be shown in place (test_cache_prefix covers that)
    # (without the digest, whose share of the budget has the later quotes collapse the stub note here)
    cm = ContextManager(scorer="rules", budget=2500, policy=Policy(page_in_k=4, page_in_digest=0))
    cm.extend(msgs)
    win = cm.build()
    archived = [d for d in win.decisions if d.tier == "archived" and d.role == "tool"]
    assert archived
    target = archived[0]
    original = msgs[target.turn]
    flight = json.loads(original["content"])[0]["flight_number"]
    paged = cm.build(query=f"search results with {flight}")
    assert target.id in paged.paged_in
    # quoted byte-exact in one note before the last message; the window around it is the plain one
    from ctxscore.window.pagein import RECALLED_HEADER

    k = next(i for i, m in enumerate(paged.messages) if str(m.get("content")).startswith(RECALLED_HEADER))
    note = paged.messages.pop(k)
    assert note["role"] == "system" and paged.messages[k:] == win.messages[-1:] == [msgs[-1]]
    assert note["content"].count(f"[#{target.turn} tool search_flights ") == 1 and original["content"] in note["content"]
    rest = iter(win.messages)  # nothing before the note is rewritten: units may only be left out for the build
    assert all(any(m == p for p in rest) for m in paged.messages)
    assert paged.tokens <= paged.budget  # page-in may use the headroom above the high-water mark
    # the call that produced it comes back with it
    call_idx = target.turn - 1
    assert paged.decisions[call_idx].paged_in
    assert note["content"].index(msgs[call_idx]["tool_calls"][0]["function"]["arguments"]) < note["content"].index(
        original["content"])


def test_pinned_overflow_is_reported_with_figures():
    big = {"role": "system", "content": "Never do anything unsafe. " * 200}
    cm = ContextManager(scorer="rules", budget=300)
    cm.add(big)
    win = cm.build()
    assert any(w.kind == WarningKind.PINNED_OVER_BUDGET and "300" in str(w) for w in win.warnings)
    assert win.messages[0]["content"] == big["content"]  # never dropped
    strict = ContextManager(scorer="rules", budget=300, policy=Policy(on_overflow="raise"))
    strict.add(big)
    with pytest.raises(BudgetError, match=r"needs \d+ tokens, above the budget of 300"):
        strict.build()


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"role": "robot", "content": "hi"}, "unknown role 'robot'"),
        ({"content": "hi"}, "missing 'role'"),
        ({"role": "user", "content": "   "}, "empty content"),
        ({"role": "user", "content": 42}, "'content' must be a string"),
        ({"role": "user"}, "empty content"),
        ({"role": "system", "content": ""}, "empty content"),
        ({"role": "user", "content": "hi", "refusal": "no"}, "'refusal' must be a string on an assistant message"),
        ({"role": "assistant", "content": None, "refusal": 42}, "'refusal' must be a string"),
        ("just text", "expected a JSON object"),
    ],
)
def test_bad_messages_are_rejected_and_nothing_is_lost(bad, match):
    cm = ContextManager(scorer="rules", budget=1000)
    cm.add({"role": "user", "content": "Please keep this."})
    with pytest.raises(InputError, match=match):
        cm.add(bad)
    with pytest.raises(InputError):
        cm.extend([{"role": "user", "content": "fine"}, bad])
    assert [m.content for m in cm.messages] == ["Please keep this."]
    assert cm.store.count(cm.session_id) == 1


def test_empty_replies_and_refusals_are_kept_as_the_model_gave_them():
    # a model's reply can be empty, or a refusal (content null, `refusal` set); a client sends them
    # back in its next request, so they are taken, and the window gives them back
    cm = ContextManager(scorer="rules", budget=1000)
    cm.add({"role": "user", "content": "Say nothing."})
    cm.add({"role": "assistant", "content": ""})
    cm.add({"role": "user", "content": "Now refuse."})
    cm.add({"role": "assistant", "content": None, "refusal": "I can't help with that."})
    cm.add({"role": "assistant", "content": "Partly:", "refusal": "the rest I can't do."})
    sent = cm.build().messages
    assert sent[1] == {"role": "assistant", "content": ""}
    assert sent[3] == {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't help with that."}]}
    assert sent[4] == {"role": "assistant", "content": [{"type": "text", "text": "Partly:"},
                                                        {"type": "refusal", "refusal": "the rest I can't do."}]}
    resumed = ContextManager(scorer="rules", budget=1000, store=cm.store, session_id=cm.session_id)
    assert resumed.build().messages == sent
    assert cm.messages[3].text() == "I can't help with that." and cm.messages[4].text() == "Partly:\nthe rest I can't do."
    assert cm.messages[3].id in [h["id"] for h in cm.search("help with that", k=3)]  # searchable like any text


def test_duplicate_ids_and_bad_budget():
    cm = ContextManager(scorer="rules", budget=1000)
    cm.add({"role": "user", "content": "a", "id": "x"})
    with pytest.raises(InputError, match="already added"):
        cm.add({"role": "user", "content": "b", "id": "x"})
    with pytest.raises(ConfigError, match="positive"):
        cm.build(budget=0)
    with pytest.raises(ConfigError, match="positive"):
        ContextManager(scorer="rules", budget=-5)


def test_one_megabyte_message_is_handled():
    cm = ContextManager(scorer="rules", budget=4000)
    cm.add({"role": "user", "content": "Please summarise the log below."})
    cm.add({"role": "assistant", "content": "", "tool_calls": [{"id": "t", "type": "function",
            "function": {"name": "read_log", "arguments": "{}"}}]})
    cm.add({"role": "tool", "content": ("line of log output 12345 ok\n" * 40_000)[:1_000_000], "tool_call_id": "t"})
    for i in range(4):
        cm.add({"role": "user", "content": f"next question {i}?"})
        cm.add({"role": "assistant", "content": f"answer {i}"})
    win = cm.build()
    assert win.tokens <= 4000
    assert win.decisions[2].tier == "archived"
    assert cm.store.get(cm.session_id, "m2").message.content.startswith("line of log output")


def test_resume_session_from_database(tmp_path):
    path = tmp_path / "session.db"
    msgs = agent_session(8)
    cm = ContextManager(scorer="rules", budget=1500, archive_path=path, session_id="s1")
    cm.extend(msgs[:20])
    first = cm.build()
    cm.close()
    cm2 = ContextManager(scorer="rules", budget=1500, archive_path=path, session_id="s1")
    assert len(cm2) == 20
    again = cm2.build()
    assert again.messages == first.messages and [d.tier for d in again.decisions] == [d.tier for d in first.decisions]
    cm2.extend(msgs[20:])
    assert len(cm2.build().decisions) == len(msgs)
    cm2.close()


def test_bad_policy():
    with pytest.raises(ConfigError, match="thresholds"):
        Policy(t_compact=0.9, t_structure=0.7)
    with pytest.raises(ConfigError, match="recent_turns"):
        Policy(recent_turns=-1)
    with pytest.raises(ConfigError, match="page_in_k"):
        Policy(page_in_k=-1)
    with pytest.raises(ConfigError, match="on_overflow"):
        Policy(on_overflow="ignore")
    with pytest.raises(ConfigError, match="recent_turns"):
        Policy(recent_turns="3")
    assert Policy(recent_turns=0).recent_turns == 0


def test_user_correction_is_pinned_so_the_new_value_survives():
    msgs = [
        {"role": "system", "content": "You book restaurants."},
        {"role": "user", "content": "Please book a table for 2 people at Sushi Ran at 7pm."},
        {"role": "assistant", "content": "Sure, checking availability for 2 people at 7pm."},
        {"role": "user", "content": "Actually, make it 4 people."},
    ]
    for i in range(30):
        msgs += [{"role": "assistant", "content": f"Looking at option {i} with some long explanation " * 6},
                 {"role": "user", "content": f"ok {i}"}]
    cm = ContextManager(scorer="rules", budget=700)
    cm.extend(msgs)
    win = cm.build()
    d = win.decisions[3]
    assert d.pinned and d.tier == "verbatim"
    assert any("4 people" in m["content"] for m in win.messages)
    assert any(x.tier == "archived" for x in win.decisions)


def test_page_in_never_pushes_the_window_over_budget():
    msgs = agent_session(12)
    for budget in range(500, 3001, 250):
        cm = ContextManager(scorer="rules", budget=budget)
        cm.extend(msgs)
        plain = cm.build()
        for query in ("search_flights results HAT100 HAT107 HAT114", "price seats arrives flight", "crashed retry"):
            win = cm.build(query=query)
            if plain.tokens <= budget:
                assert win.tokens <= budget, (budget, query, win.tokens, win.paged_in)


def test_extend_and_a_loop_of_add_index_alike():
    """Each message of an ``extend`` batch was indexed with the history before the batch as its
    context (none in a new session), so search and query windows differed from a loop of ``add``, as
    the CLI (which extends) differed from a live agent (a new user's report)."""
    msgs = [{"role": "system", "content": "You are an agent."},
            {"role": "user", "content": "My booking ref is ABC123 and I want a window seat."},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
                "name": "lookup", "arguments": '{"city": "SEA"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "name": "lookup", "content": '{"price": 12.50, "ok": false}'},
            {"role": "user", "content": "Today is 2024-05-02. Which day is my flight?"},
            *({"role": "user", "content": f"filler message {i} about the weather"} for i in range(20))]
    batch = ContextManager(budget=300, scorer="rules")
    batch.extend(msgs)
    one = ContextManager(budget=300, scorer="rules")
    for m in msgs:
        one.add(m)
    for q in ("what is my booking ref?", "the lookup for SEA", "what happened on 2024-05-02?"):
        assert [h["id"] for h in batch.search(q)] == [h["id"] for h in one.search(q)]
        assert batch.build(query=q).messages == one.build(query=q).messages


def test_extend_of_something_that_is_not_a_list_says_so():
    """``extend(None)`` was a bare ``TypeError: 'NoneType' object is not iterable`` from inside the
    validation, ``extend({...})`` (one message) "message 0: expected a JSON object ..., got str" (it
    iterated the dict's keys) and ``extend("hi")`` read each character as a message."""
    cm = ContextManager(budget=500, scorer="rules")
    cm.add({"role": "user", "content": "first"})
    for bad in (None, {"role": "user", "content": "hi"}, "hi", b"hi", 5):
        with pytest.raises(InputError, match=rf"extend takes a list of messages .*got {type(bad).__name__}; "
                                             r"for one message use add\(\)"):
            cm.extend(bad)
    assert [m.content for m in cm.messages] == ["first"]
    assert [m.content for m in cm.extend(iter([{"role": "user", "content": "a"}]))] == ["a"]  # any iterable


@pytest.mark.parametrize(("kw", "says"), [
    ({"compressor": 5}, r"compressor must be an object with compress\(text, tier\), got int"),
    ({"counter": "cl100k_base"}, r"counter must be a ctxscore.TokenCounter.*got str; for an encoding pass encoding="),
    ({"sections": [5]}, r"sections\[0\] \(int\) is not a section: it needs name, position and render\(view\)"),
    ({"sections": 5}, r"sections must be a list of sections, got int"),
    ({"hooks": [5]}, r"hooks\[0\] \(int\) is not callable"),
    ({"hooks": None}, r"hooks must be a list of callables, got NoneType"),
    ({"rules": 5}, r"rules must be a RuleConfig, a rule-file path or None, got int"),
])
def test_a_seam_given_the_wrong_object_is_refused_when_the_manager_is_made(kw, says):
    """These were accepted and failed later, at an add or at every build, with a bare AttributeError
    or TypeError from deep inside (``'int' object has no attribute 'compress'``, ``'int' object is
    not callable``)."""
    with pytest.raises(ConfigError, match=says):
        ContextManager(budget=200, scorer="rules", **kw)


@pytest.mark.parametrize(("every", "ask"), [(4, "And another?"), (1, "Please book option {i}.")])
def test_a_rare_code_of_the_query_leads_the_search_over_its_common_words(every, ask):
    """Over 40 booking confirmations ("... reference ZX0004, for 5 guests."), "what was the reference
    ZX0004?" ranked ZX0000 first and ZX0004 third (rules scorer): the fusion counts ranks, and the
    words beside the code ("reference", "guests"), in every reply, outweighed its first place in the
    keyword list. A code held by few messages now lifts them (the ``exact`` list)."""
    cm = ContextManager(budget=4000, scorer="rules")
    for i in range(40):
        if i % every == 0:
            cm.add({"role": "user", "content": ask.format(i=i)})
        cm.add({"role": "assistant", "content": f"Your booking is confirmed, reference ZX{i:04d}, for {i % 5 + 1} guests."})
    for query, want in (("what was the reference ZX0004?", "ZX0004"), ("ZX0004的订单是什么？", "ZX0004"),
                        ("reference ZX0017 guests", "ZX0017"), ("how many guests for ZX0023?", "ZX0023"),
                        ("reference zx0031", "ZX0031")):
        hits = cm.search(query, k=4)
        assert want in hits[0]["message"]["content"], (query, [h["message"]["content"] for h in hits])
    top = [h["message"]["content"] for h in cm.search("what was the reference?", k=4)]
    assert all("reference ZX" in t for t in top)  # no code in the query: the common words rank as before
