"""Page-in plans its room as the window counts it, so what it plans is what the window shows."""

import json

import pytest

from ctxscore import ContextManager, Policy


def office_chat(turns: int) -> list[dict]:
    """Short turns: acknowledgements, and answers naming an office and a date (every eighth one a
    locker's code instead)."""
    out = [{"role": "system", "content": "You are a concise assistant."}]
    for t in range(turns):
        out.append({"role": "user", "content": "ok" if t % 2 else "Great, thanks!"})
        if t % 8 == 3:
            out.append({"role": "assistant", "content": f"Locker {100 + t} opens with code {7000 + t}."})
        else:
            day = f"2024-03-{1 + t % 28:02d}"
            out.append({"role": "assistant", "content": f"No update from Harbor Street on {day}, round {t}."})
    return out


def test_a_page_in_plan_counts_archive_stubs_as_the_window_does(monkeypatch):
    # ~300 archived answers: their stubs pass the cap and collapse into one line, so paging one in
    # adds its whole size; a plan that counted each stub as freed planned 12 page-ins and kept 8
    import ctxscore.window.session as session

    plans = []
    plan_page_in = session.plan_page_in
    monkeypatch.setattr(session, "plan_page_in", lambda *a, **k: plans.append(plan_page_in(*a, **k)) or plans[-1])
    cm = ContextManager(scorer="rules", budget=300, policy=Policy(page_in_k=12))
    cm.extend(office_chat(160))
    cm.build()
    assert sum(e.tier == "archived" for e in cm.history.entries) > 250
    win = cm.build(query="which locker code")
    planned = set(plans[-1].shown.values())
    lockers = [line for m in win.messages for line in str(m.get("content")).splitlines() if "Locker" in line]
    assert win.tokens <= 300
    assert planned <= set(win.paged_in), (sorted(planned), win.paged_in)  # nothing planned was undone
    assert len(lockers) >= 4  # each with its question; the note's header takes 26 of the 300 tokens


def test_the_relevance_floor_admits_what_the_ranker_is_sure_of():
    from ctxscore.store.retrieval import Hit
    from ctxscore.window.pagein import above_floor

    pol = Policy()
    hits = [
        Hit("lexical", 1, 0.9, "", frozenset({"keyword"}), similarity=0.05),
        Hit("similar", 2, 0.8, "", frozenset({"vector"}), similarity=pol.page_in_floor),
        # "为您推荐团城演武厅。" for "用户最终选定的景点叫什么名字？": no query term, cosine 0.12, ranker 0.91
        Hit("ranked", 3, 0.7, "", frozenset({"vector"}), similarity=0.12, learned=0.91),
        Hit("unsure", 4, 0.6, "", frozenset({"vector"}), similarity=0.12, learned=pol.page_in_rank_floor / 2),
        Hit("unranked", 5, 0.5, "", frozenset({"vector"}), similarity=0.12),
    ]
    assert [h.id for h in above_floor(hits, pol)] == ["lexical", "similar", "ranked"]
    assert [h.id for h in above_floor(hits, Policy(page_in_rank_floor=1.0))] == ["lexical", "similar"]
    # a query that resembles nothing in the session, the ranker sure of nothing: a query term and the
    # ranker's support, both
    unlike = [Hit("ranked", 1, 0.9, "", frozenset({"vector"}), similarity=0.2, learned=0.6),
              Hit("term, ranked", 2, 0.8, "", frozenset({"keyword", "vector"}), similarity=0.1, learned=0.5),
              Hit("term, unsure", 3, 0.7, "", frozenset({"keyword"}), similarity=0.1, learned=0.1),
              Hit("term, unranked", 4, 0.6, "", frozenset({"stem"}), similarity=0.05)]
    assert [h.id for h in above_floor(unlike, pol)] == ["term, ranked", "term, unranked"]
    assert [h.id for h in above_floor(unlike, Policy(page_in_query_floor=0.15))] == ["ranked", "term, ranked",
                                                                                    "term, unsure", "term, unranked"]
    sure = [Hit("ranked", 1, 0.9, "", frozenset({"vector"}), similarity=0.2, learned=0.91), *unlike[1:]]
    assert [h.id for h in above_floor(sure, pol)] == ["ranked", "term, ranked", "term, unsure", "term, unranked"]


def _plan_two_hits(cm: ContextManager, budget: int, policy: Policy):
    """Plan a page-in of two archived answers, the second worth less than every evictable message."""
    import numpy as np

    from ctxscore.store.retrieval import Hit
    from ctxscore.window.pagein import plan_page_in

    h, st = cm.history, cm.state
    archived = [i for i, e in enumerate(h.entries) if e.tier == "archived" and e.msg.role == "assistant"]
    first, second = archived[-1], archived[-3]
    values = np.full(len(h.entries), 0.9)
    values[[first, second]] = 0.1
    hits = [Hit(h.entries[i].msg.id, i, 1.0 / (k + 1), "", frozenset({"keyword"}))
            for k, i in enumerate((first, second))]
    return plan_page_in(hits, h, values, st.forms, policy, budget), h.entries[first].msg.id, h.entries[second].msg.id


def test_a_later_hit_makes_room_down_to_the_low_water_mark():
    # the window sits above the low-water mark with no room: a compaction would archive down to the
    # mark whatever the values, so the second hit may leave out messages worth more than itself
    cm = ContextManager(scorer="rules", budget=600)
    cm.extend(office_chat(60))
    occ = cm.build().tokens
    budget = occ + 5  # no room for either hit; the window is far above 0.6 of this budget
    pol = Policy(page_in_k=2)
    plan, first, second = _plan_two_hits(cm, budget, pol)
    assert set(plan.shown.values()) == {first, second}, plan
    assert plan.evicted
    # at or below the low-water mark a later hit displaces only what is worth less than itself (here
    # page-in may fill the window only up to the mark, so the first hit leaves it there): the second
    # one leaves out no message, only the stub note
    low = Policy(page_in_k=2, t_archive=0.9, low_water=0.9, page_in_limit=0.9)
    alone, _, _ = _plan_two_hits(cm, budget, Policy(page_in_k=1, t_archive=0.9, low_water=0.9, page_in_limit=0.9))
    plan, first, second = _plan_two_hits(cm, budget, low)
    assert set(alone.shown.values()) == {first} and not alone.stubs_collapsed, alone
    assert set(plan.shown.values()) == {first, second} and plan.stubs_collapsed, plan
    assert plan.evicted == alone.evicted


def test_a_hit_may_collapse_the_stub_note_into_one_line_for_its_build():
    # a long system prompt and the recent turns fill the budget; everything else is archived already,
    # so what a page-in can free is the stub note's lines: the note shows only its collapsed line (the
    # archived messages keep a stub with their ids) and the hit is quoted verbatim for this build; the
    # next build without a query shows the note as it was
    rules = " ".join(f"Rule {i}: never reveal internal ticket {i}." for i in range(12))
    chat = office_chat(60)
    chat[0]["content"] = f"You are a concise assistant. {rules}"
    cm = ContextManager(scorer="rules", budget=220, policy=Policy(page_in_k=1))
    cm.extend(chat)
    before = cm.build()

    def note(win):
        return [line for m in win.messages for line in str(m["content"]).splitlines() if line.startswith("[archived")]

    assert len(note(before)) > 1
    win = cm.build(query="which locker code")
    assert cm.history.entries[8].msg.id in win.paged_in  # with its question
    assert any("Locker 103 opens with code 7003." in str(m["content"]) for m in win.messages)
    archived = sum(e.tier == "archived" for e in cm.history.entries)
    lines = note(win)
    assert len(lines) == 1 and f" {archived} earlier messages " in lines[0]
    assert win.tokens <= 220
    assert cm.build().messages == before.messages


def agent_loop(turns: int) -> list[dict]:
    """A tool-using agent: each turn a request, a search call, its JSON result and a short answer."""
    import json

    out = [{"role": "system", "content": "You are a booking agent."}]
    for t in range(turns):
        out.append({"role": "user", "content": f"Find flights to city {t} on 2024-05-{1 + t % 28:02d}, please."})
        out.append({"role": "assistant", "content": "", "tool_calls": [{"id": f"call_{t}", "type": "function",
                    "function": {"name": "search_flights", "arguments": json.dumps({"city": f"city {t}"})}}]})
        out.append({"role": "tool", "tool_call_id": f"call_{t}", "content": json.dumps(
            [{"flight": f"XY{t}{k:02d}", "price": 100 + 7 * k + t, "seats": k % 5} for k in range(12)])})
        out.append({"role": "assistant", "content": f"Flight XY{t}00 to city {t} costs ${100 + t}."})
    return out


def test_a_unit_left_out_for_one_hit_comes_back_whole_for_a_later_hit():
    # the best hit makes room by leaving out the lowest-value unit, a search call with its result;
    # the second hit is that result: shown, it brings its call back (a tool result without its call
    # is a request the OpenAI API refuses)
    import numpy as np

    from ctxscore.store.retrieval import Hit
    from ctxscore.window.pagein import plan_page_in

    cm = ContextManager(scorer="rules", budget=4000)
    cm.extend(agent_loop(30))
    cm.build()
    h, st = cm.history, cm.state
    call = next(i for i, e in enumerate(h.entries) if e.msg.tool_calls and e.tier == "archived")
    result = call + 1
    assert h.units[h.entries[call].unit] == [call, result]
    for i in (call, result):  # in the conversation, compacted: a unit page-in may leave out
        st.forms.set_tier(h, i, "structured")
    answer = max(i for i, e in enumerate(h.entries) if e.tier == "archived" and e.msg.role == "assistant"
                 and not e.msg.tool_calls)
    values = np.full(len(h.entries), 0.9)
    values[[call, result]] = 0.05  # the first unit the best hit's room leaves out
    values[answer] = 0.8
    hits = [Hit(h.entries[i].msg.id, i, 1.0 / (k + 1), "", frozenset({"keyword"})) for k, i in enumerate((answer, result))]
    plan = plan_page_in(hits, h, values, st.forms, Policy(), h.msg_tokens + 60)
    assert answer in plan.shown and result in plan.shown  # both placed; the first made room
    assert plan.evicted, "the best hit was meant to leave a unit out"
    assert call not in plan.evicted and result not in plan.evicted
    for i in plan.evicted:  # whatever is left out is left out whole
        assert set(h.units[h.entries[i].unit]) <= plan.evicted


def unpaired_results(messages: list[dict]) -> list[str]:
    """Call ids of the tool results in ``messages`` that do not follow their call (or the other
    results of the same call)."""
    calls: set[str] = set()
    bad = []
    for m in messages:
        if m["role"] == "tool":
            if m["tool_call_id"] not in calls:
                bad.append(m["tool_call_id"])
        else:
            calls = {c["id"] for c in m.get("tool_calls") or ()}
    return bad


def test_page_in_with_the_learned_scorer_never_sends_a_tool_result_without_its_call():
    # an agent loop built with the last request as the query at every turn (as the proxy does), with
    # the packaged scorer's ranker ordering the hits; before the fix turn 21 sent call_8's result alone
    import json
    import random

    rng = random.Random(7)
    cm = ContextManager(budget=8000, scorer="auto")
    big = "\n".join(f"line {i}: value={i * i} path=/srv/app/mod_{i}.py status={'ERROR' if i % 50 == 0 else 'ok'}"
                    for i in range(1500))
    msgs: list[dict] = [{"role": "system", "content": "You are a coding agent. You must never delete files under /etc."}]
    paged = 0
    for t in range(60):
        ask = (f"Run the tests again for module mod_{t}. The secret token is TK-{t:04d}." if rng.random() < 0.5
               else f"Turn {t}: what's the status?")
        msgs.append({"role": "user", "content": ask})
        if rng.random() < 0.3:
            msgs.append({"role": "assistant", "content": None, "tool_calls": [{"id": f"call_{t}", "type": "function",
                         "function": {"name": "run", "arguments": json.dumps({"cmd": f"pytest tests/test_{t}.py"})}}]})
            msgs.append({"role": "tool", "tool_call_id": f"call_{t}",
                         "content": big if t % 10 == 0 else json.dumps({"passed": t, "failed": t % 3})})
        cm.sync(msgs)
        win = cm.build(query=ask)
        paged += bool(win.paged_in)
        assert not unpaired_results(win.messages), (t, unpaired_results(win.messages))
        msgs.append({"role": "assistant", "content": f"ok {t}"})
    assert paged >= 10  # the loop pages in: what it checks happened


def test_the_learned_scorer_pages_nothing_in_for_a_question_about_something_else(corpora):
    # six MultiWOZ dialogues chained, at 1,000 tokens, the packaged scorer: its ranker puts some
    # message at 0.3 or more for any question, and those messages came back for questions the chat
    # never touched ("How do I reverse a linked list in Python?": 8 restaurant and hotel messages)
    import itertools

    from training.data.sources import multiwoz

    cm = ContextManager(budget=1000, scorer="auto")
    for s in itertools.islice(multiwoz.iter_sessions(corpora), 6):
        cm.extend([{k: m[k] for k in ("role", "content")} for m in s["messages"]])
    cm.build()
    for query in ("Who won the 2018 World Cup?", "How do I reverse a linked list in Python?",
                  "Summarize the plot of Hamlet.", "Give me a recipe for pancakes."):
        assert cm.build(query=query).paged_in == [], query
    archived = [e.msg.text() for e in cm.history.entries if e.tier == "archived"]
    assert any("LZLUDTVI" in t for t in archived)  # the restaurant booking's reference is archived
    win = cm.build(query="What was the reference number for the table at the restaurant?")
    assert "LZLUDTVI" in str(win.messages)  # and a question about it still brings it back


def test_the_planner_counts_the_collapsed_stub_note_as_the_build_shows_it():
    # the planner counted the collapsed note at a 40-token allowance; shown, it was 26: at 600 tokens
    # the best hit of a travel chat (33 tokens) was left out with page_in_skipped
    from ctxscore.window.pagein import PageInPlan, _Planner

    for ids in ("m", "conversation-7f3c9a2e-turn-"):  # short ids (the line is under the allowance) and long ones (over it)
        cm = ContextManager(budget=600, scorer="rules")
        for k in range(40):
            cm.add({"id": f"{ids}{2 * k}", "role": "user", "content": f"Question {k}: what about hotel {k} in Lisbon?"})
            cm.add({"id": f"{ids}{2 * k + 1}", "role": "assistant", "content": f"Hotel {k} costs €{100 + k} a night."})
        cm.build()
        st, h = cm.state, cm.history
        assert sum(e.tier == "archived" for e in h.entries) > 20
        vals, rel = st.values.values(h, {})
        win = st._assemble(None, 600, PageInPlan(stubs_collapsed=True), vals, rel, [])
        note = next(sec.tokens for sec in win.sections if sec.name == "archive_stubs")
        planner = _Planner(h, vals, st.forms, cm.policy, 600, 0, [], "quote")
        assert planner.collapsed_tokens == note, ids


def test_a_query_build_never_sends_more_than_the_whole_history_when_it_fits():
    # proxy-style builds (the query is the last user message) at 1,500 tokens: once compaction had
    # run, the page-in note quoted the archived messages back and the window (1,461 tokens at turn 6)
    # was larger than the whole history (1,263), which fits the budget
    cm = ContextManager(budget=1500, scorer="rules")
    for i in range(9):
        q = f"question {i}: hotel code H{i}{i}{i} in Reno. " + "words " * 80
        cm.add({"role": "user", "content": q})
        win = cm.build(query=q)
        full = ContextManager(budget=100_000, scorer="rules")
        full.extend([m.to_openai() for m in cm.messages])
        whole = full.build().tokens
        assert win.tokens <= min(whole, 1500), (i, win.tokens, whole)
        cm.add({"role": "assistant", "content": "echo: " + q})


def test_a_one_letter_query_pages_nothing_in():
    # "x" (or the x of "'; DROP TABLE x; --") matched every archived message with an x in it, as
    # a substring: 25 of them came back in place
    cm = ContextManager(budget=600, scorer="rules")
    for k in range(30):
        cm.add({"role": "user", "content": f"Book room {k} for me, please."})
        cm.add({"role": "assistant", "content": f"Booked. Your reference is GX{705 + k}Q."})
        cm.build()
    plain = cm.build()
    for query in ("x", "'; DROP TABLE x; --", "s"):
        asked = cm.build(query=query)
        assert asked.paged_in == [] and asked.tokens == plain.tokens, query
    assert cm.build(query="What is the reference of room 3?").paged_in  # a real question still pages in


@pytest.mark.parametrize("scorer", ["rules", "auto"])
def test_an_identifier_deep_in_a_long_log_is_paged_in(scorer):
    """A 22 KB log holding the asked transaction id on its 150th of 300 lines: search saw only the
    log's head and tail, and the packaged scorer's ranker (which reads the first and last 1,200
    characters) put the log at 0.01, under the relevance floor (a new user's report)."""
    cm = ContextManager(budget=3000, scorer=scorer)
    cm.add({"role": "user", "content": "Fetch the checkout logs."})
    lines = [f"2024-06-01T10:00:{i % 60:02d}Z INFO request id=req-{10**7 + i} path=/api/cart status=200" for i in range(300)]
    lines[150] = "2024-06-01T10:02:37Z ERROR payment gateway timeout txn=TX-88412-ZQ upstream=pg-eu-2"
    cm.add({"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                                                                "function": {"name": "fetch_logs", "arguments": "{}"}}]})
    cm.add({"role": "tool", "tool_call_id": "c1", "content": "\n".join(lines)})
    for i in range(30):
        cm.add({"role": "user", "content": f"ok, check node-{i} next"})
        cm.add({"role": "assistant", "content": f"node-{i}: cpu 20%, memory fine."})
    assert cm.build().tokens <= 3000 and "TX-88412-ZQ" not in str(cm.build().messages)  # archived
    win = cm.build(query="What happened with transaction TX-88412-ZQ?")
    assert "TX-88412-ZQ" in str(win.messages) and win.tokens <= 3000
    assert cm.build(query="What happened with transaction TX-99999-QQ?").paged_in == []  # no such id: nothing


def test_which_query_words_name_an_identifier():
    from ctxscore.window.pagein import identifier_terms

    words = ["happened", "tx-88412-zq", "ord-1039", "jd701813", "13912345678", "hat136", "2024-06-01", "12345",
             "python3", "utf-8", "gpt-4o", "epoch3"]
    assert identifier_terms(words) == ["tx-88412-zq", "ord-1039", "jd701813", "13912345678", "hat136"]


def _repeating_agent(scorer: str) -> ContextManager:
    """A coding agent that says the same sentence after each of 20 failing test runs."""
    cm = ContextManager(budget=1500, scorer=scorer)
    cm.extend([{"role": "system", "content": "You are a coding agent."},
               {"role": "user", "content": "Fix the ISO week parsing bug."}])
    for k in range(20):
        cm.extend([{"role": "assistant", "content": "", "tool_calls": [{"id": f"c{k}", "type": "function", "function": {
                       "name": "bash", "arguments": json.dumps({"command": "pytest -q"})}}]},
                   {"role": "tool", "tool_call_id": f"c{k}", "name": "bash",
                    "content": f"FAILED tests/test_iso.py::test_week[{k}] - AssertionError\n" + "E  assert 1 == 2\n" * 30},
                   {"role": "assistant", "content": "Still failing; the week-to-date conversion is off by one around "
                                                    "year boundaries. Week 1 is the week with the first Thursday."}])
    return cm


def test_identical_messages_are_paged_in_once():
    """Twelve identical "Still failing; ..." quotes filled a page-in (a new user's report): a hit that
    repeats a better hit's text, or a message verbatim in the window, takes no slot."""
    cm = _repeating_agent("rules")
    w = cm.build(query="why was the week conversion failing?")
    assert w.paged_in  # something still comes back ...
    shown = json.dumps(w.messages)
    assert shown.count("Still failing; the week-to-date") == 1  # ... but the sentence once: the recent copy
    texts = [cm.history.entries[cm.history.ids[i]].msg.content for i in w.paged_in]
    assert len(texts) == len(set(texts))


def test_a_query_that_names_nothing_pages_in_nothing():
    """The proxy asks with the last user message: "Yes please." paged in 10 restaurant searches by
    embedding similarity alone (a new user's report, the packaged scorer)."""
    cm = ContextManager(budget=1200, scorer="auto")
    cm.extend([{"role": "system", "content": "You are a travel assistant."},
               {"role": "user", "content": "My wife is vegetarian and I have a peanut allergy, so no peanuts in any meal."},
               {"role": "assistant", "content": "Noted: vegetarian meals and no peanuts."}])
    for i in range(25):
        cm.extend([{"role": "assistant", "content": "", "tool_calls": [{"id": f"c{i}", "type": "function", "function": {
                       "name": "search_restaurants", "arguments": json.dumps({"city": "Barcelona", "page": i})}}]},
                   {"role": "tool", "tool_call_id": f"c{i}", "name": "search_restaurants",
                    "content": json.dumps([{"name": f"Bar Mut {j}", "cuisine": "tapas", "rating": 4.1} for j in range(8)])},
                   {"role": "assistant", "content": "Here are 8 places in that area."},
                   {"role": "user", "content": ["Hmm, keep looking.", "Next area.", "Does any have a terrace?"][i % 3]}])
    for query in ("Yes please.", "ok", "What is it?"):
        assert cm.build(query=query).paged_in == []
    assert cm.build(query="Which meals must avoid peanuts?").paged_in  # a question that names something still pages in


@pytest.mark.parametrize("budget", [250, 280, 300])
def test_a_page_in_never_leaves_out_a_better_hit_the_window_shows(budget):
    """The message answering "what is my booking ref?" was verbatim in the window and the best hit; the
    page-in of a lower-ranked tool result left it out to make room, with no stub and no warning (a new
    user's report)."""
    cm = ContextManager(budget=budget, scorer="rules")
    for m in [{"role": "system", "content": "You are an agent."},
              {"role": "user", "content": "My booking ref is ABC123 and I want a window seat."},
              {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
                  "name": "lookup", "arguments": '{"city": "SEA"}'}}]},
              {"role": "tool", "tool_call_id": "c1", "name": "lookup", "content": '{"price": 12.50, "ok": false}'},
              *({"role": "user", "content": f"filler message {i} about the weather"} for i in range(20))]:
        cm.add(m)
    w = cm.build(query="what is my booking ref?")
    assert "ABC123" in json.dumps(w.messages)


def test_messages_with_media_are_never_copies_of_each_other():
    """Review: the copy check compared text only, so a second screenshot sent with the same caption
    counted as a copy of the first and was never paged in."""
    from ctxscore.window.pagein import _copies

    def shot(n: int) -> dict:
        return {"role": "user", "content": [{"type": "text", "text": "Here is the error screen."},
                                            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,iVBORw0KGgo{n}="}}]}

    cm = ContextManager(budget=4000, scorer="rules")
    cm.extend([shot(1), {"role": "assistant", "content": "I see."}, shot(2), {"role": "assistant", "content": "I see."}])
    copy = _copies(cm.history)
    assert [copy(i) for i in range(4)] == [False, True, False, False]  # the earlier text reply copies the shown one


def _digest_lines(win) -> list[str]:
    from ctxscore.window.pagein import DIGEST_HEADER

    for m in win.messages:
        lines = str(m.get("content")).splitlines()
        if DIGEST_HEADER in lines:
            return lines[lines.index(DIGEST_HEADER) + 1:]
    return []


def test_the_digest_shows_the_key_values_of_hits_the_quotes_had_no_room_for():
    """At 600 tokens page-in quotes 6 of the 20 lockers' answers; the digest lists further ones by
    their key values (byte-exact, each from the message its tag names, none of them quoted), so the
    window holds more of the asked codes at the same budget."""
    import re

    chat = office_chat(160)
    wins = {}
    for share in (0.0, Policy().page_in_digest):
        cm = ContextManager(scorer="rules", budget=600, policy=Policy(page_in_k=12, page_in_digest=share))
        cm.extend(chat)
        cm.build()
        wins[share] = cm.build(query="which locker code"), cm
    (off, _), (on, cm) = wins[0.0], wins[Policy().page_in_digest]
    assert _digest_lines(off) == []
    lines = _digest_lines(on)
    assert lines and on.tokens <= 600
    for line in lines:
        at, role, values = re.fullmatch(r"\[#(\d+) (\w+)\] (.+)", line).groups()
        msg = cm.history.entries[int(at)].msg
        assert role == msg.role and msg.id not in on.paged_in
        assert all(v in msg.content for v in values.split(" | ")), (line, msg.content)

    def codes(win):
        return set(re.findall(r"\b7\d{3}\b", "\n".join(str(m["content"]) for m in win.messages)))

    assert len(codes(on)) > len(codes(off)), (sorted(codes(on)), sorted(codes(off)))


def test_the_digest_goes_first_when_a_page_in_plan_is_cut_and_never_names_a_replaced_value():
    from ctxscore.window.pagein import PageInPlan

    plan = PageInPlan(shown={3: "m3", 4: "m3"}, digest={9: "[#9 assistant] code 7011"})
    assert plan.without_last().digest == {} and plan.without_last().shown == plan.shown
    assert plan.without_last().without_last().shown == {}
    # a hit whose value a later user message replaced is quoted with that message, never digested
    # (the one quote goes to the new value; "[#5 assistant, restated in #6] 12:00" was digested)
    cm = ContextManager(scorer="rules", budget=400, policy=Policy(page_in_k=1))
    chat = office_chat(60)
    chat[4:4] = [{"role": "user", "content": "Book the lab for 12:00 please."},
                 {"role": "assistant", "content": "Lab booked for 12:00."},
                 {"role": "user", "content": "How about 11:00 instead for the lab?"},
                 {"role": "assistant", "content": "Lab moved to 11:00."}]
    cm.extend(chat)
    cm.build()
    win = cm.build(query="what time is the lab")
    assert win.paged_in == ["m7"] and "11:00" in "\n".join(str(m["content"]) for m in win.messages)
    assert not any("12:00" in line for line in _digest_lines(win))


def test_page_in_digest_is_a_share_of_the_budget():
    from ctxscore.errors import ConfigError

    with pytest.raises(ConfigError, match=r"Policy.page_in_digest must be a fraction of the budget in \[0, 0.5\]"):
        Policy(page_in_digest=0.8)


def _archived_answers(cm: ContextManager) -> list[int]:
    return [i for i, e in enumerate(cm.history.entries) if e.tier == "archived" and e.msg.role == "assistant"]


def _plan(cm: ContextManager, hits, budget: int, policy: Policy):
    import numpy as np

    from ctxscore.window.pagein import plan_page_in

    values = np.full(len(cm.history.entries), 0.5)
    return plan_page_in(hits, cm.history, values, cm.state.forms, policy, budget)


def test_a_hit_below_the_floor_is_shown_beside_a_placed_hit_in_the_room_left():
    # the query names the office of one answer; the answers two and four messages on share no word
    # with it (under the floor) but are the rest of that exchange: shown in the room left, quoted
    # like the placed hit. One as weakly similar twenty messages away is not, nor is anything under
    # the floor without a placed hit or for a query that resembles nothing in the session.
    from ctxscore.store.retrieval import Hit
    from ctxscore.window.pagein import CONTEXT_SPAN

    cm = ContextManager(scorer="rules", budget=600)
    cm.extend(office_chat(60))
    budget = cm.build().tokens + 200
    h = cm.history
    archived = _archived_answers(cm)
    best = archived[-12]
    near = [i for i in archived if 0 < i - best <= CONTEXT_SPAN]
    far = next(i for i in archived if i - best > 5 * CONTEXT_SPAN)
    assert len(near) == 2
    weak = dict(similarity=0.1, learned=0.05)
    assert weak["similarity"] < Policy().page_in_floor and weak["learned"] < Policy().page_in_rank_floor

    def hit(i: int, score: float, **kw) -> Hit:
        return Hit(h.entries[i].msg.id, i, score, "", frozenset(kw.pop("by", {"vector"})), **kw)

    hits = [hit(best, 1.0, by={"keyword", "vector"}, similarity=0.6), hit(far, 0.6, **weak),
            hit(near[0], 0.5, **weak), hit(near[1], 0.4, **weak)]
    plan = _plan(cm, hits, budget, Policy())
    assert best in plan.shown and set(near) <= plan.shown.keys() and far not in plan.shown, plan
    assert plan.context == {h.entries[i].msg.id for i in near} and not plan.in_place  # quoted: the prefix stays
    alone = _plan(cm, hits[:1], budget, Policy())
    assert plan.evicted == alone.evicted and not set(near) & alone.shown.keys()
    # they are undone first when the window is over, before the digest and the placed hit
    assert plan.without_last().shown.keys() == plan.shown.keys() - {near[1]}
    # without the placed hit, the hits under the floor bring nothing
    assert not _plan(cm, hits[1:], budget, Policy()).shown
    # nor for a query that resembles nothing (every similarity under the query floor, no sure ranker)
    unlike = [hit(best, 1.0, by={"keyword", "vector"}, similarity=0.2), *hits[1:]]
    got = _plan(cm, unlike, budget, Policy())
    assert best in got.shown and not set(near) & got.shown.keys(), got
    # page_in_k counts them: two units in all show the placed hit (with its question) and the nearer one
    two = _plan(cm, hits, budget, Policy(page_in_k=2))
    assert best in two.shown and near[0] in two.shown and near[1] not in two.shown, two
