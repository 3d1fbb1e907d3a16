"""Prompt-cache stability of the window: the pinned task statement stays ahead of the archive note,
whose text changes at every compaction, so the prefix a provider's prompt cache reuses holds it."""

from __future__ import annotations

import json

import pytest

from ctxscore import ContextManager, Policy

SYSTEM = "You are a coding agent working in a shell. Run one command per turn."
TASK = ("<pr_description>\nThe CSV exporter drops the header row when the file is empty. Fix "
        "export_csv in reports/export.py so an empty table still writes its header.\n"
        + "".join(f"Steps to reproduce, case {i}: call export_csv(rows=[], columns=['id', 'name', 'total_{i}']) "
                  f"and open the file; it is empty, where the header id,name,total_{i} was expected.\n" for i in range(12))
        + "</pr_description>")


def steps(k: int, start: int = 0) -> list[dict]:
    """``k`` agent steps: a command and its long output (as a user observation, mini-SWE style)."""
    out = []
    for i in range(start, start + k):
        out += [{"role": "assistant", "content": f"THOUGHT: look at part {i} of the module.\n\n```bash\nsed -n {i}p reports/export.py\n```"},
                {"role": "user", "content": "<returncode>0</returncode>\n<output>\n"
                 + "\n".join(f"line {i}.{r}: value_{r} = compute({r}, {i})" for r in range(30)) + "\n</output>"}]
    return out


def windows(cm: ContextManager, msgs: list[dict], budget: int) -> list:
    out = []
    for m in msgs:
        cm.add(m)
        out.append(cm.build(budget=budget))
    return out


def test_the_task_statement_comes_before_the_archive_note_on_every_compaction_turn():
    cm = ContextManager(scorer="rules")
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}, *steps(12)]
    wins = windows(cm, msgs, 900)
    archived = [w for w in wins if any(d.tier == "archived" for d in w.decisions)]
    assert len(archived) >= 10  # the budget forces compaction nearly every turn
    for w in archived:
        assert [m["content"] for m in w.messages[:2]] == [SYSTEM, TASK]
        assert w.sections[0].name == "system" and w.sections[0].messages == 2
        assert w.messages[2]["role"] == "system" and w.messages[2]["content"].startswith("[archived")
    notes = [w.messages[2]["content"] for w in archived]
    assert len(set(notes)) > len(notes) // 2  # the note changed at most compactions; the prefix did not


def test_without_a_system_message_the_pinned_request_leads():
    cm = ContextManager(scorer="rules")
    w = windows(cm, [{"role": "user", "content": TASK}, *steps(8)], 900)[-1]
    assert w.messages[0] == {"role": "user", "content": TASK}
    assert w.sections[0].messages == 1 and w.messages[1]["content"].startswith("[archived")


def test_the_active_tasks_statement_moves_ahead_of_the_archived_earlier_task():
    cm = ContextManager(scorer="rules")
    second = TASK.replace("CSV exporter", "JSON exporter").replace("export_csv", "export_json")
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}, *steps(6),
            {"role": "user", "content": second}, *steps(8, start=6)]
    w = windows(cm, msgs, 900)[-1]
    entries = cm.history.entries
    k = 2 + 12  # system, first task, 6 steps of two messages
    assert entries[k].msg.content == second and entries[k].task == entries[-1].task > entries[1].task  # a second task
    contents = [m["content"] for m in w.messages]
    assert contents[0] == SYSTEM and second in contents
    note = next(i for i, c in enumerate(contents) if c.startswith("[archived"))
    assert contents.index(second) < note  # the statement is in the system section, the note after it
    assert contents.index(second) < w.sections[0].messages


def test_langchain_gets_one_system_message_and_the_task_first():
    pytest.importorskip("langchain_core")
    from ctxscore.integrations.langchain import _split_system

    cm = ContextManager(scorer="rules")
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}, *steps(8)]
    w = windows(cm, msgs, 900)[-1]
    assert w.messages[1]["content"] == TASK and w.messages[2]["content"].startswith("[archived")
    system, rest = _split_system(w)
    assert system is not None and system.startswith(SYSTEM) and "[archived" in system  # note joined into it
    assert rest[0] == {"role": "user", "content": TASK}
    assert all(m["role"] != "system" for m in rest)
    assert json.dumps(rest[1:]) == json.dumps(w.messages[3:])  # the conversation after the note, unchanged


def test_trim_messages_gives_one_system_message_first():
    pytest.importorskip("langchain_core")
    from ctxscore.integrations.langchain import trim_messages

    out = trim_messages([{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}, *steps(8)],
                        max_tokens=900)
    assert [m.type for m in out[:2]] == ["system", "human"] and all(m.type != "system" for m in out[1:])
    assert out[0].content.startswith(SYSTEM) and "[archived" in out[0].content and out[1].content == TASK


def _note(window) -> int | None:
    """The index of the window's recalled note (the quotes of its page-ins), if any."""
    from ctxscore.window.pagein import RECALLED_HEADER

    return next((k for k, m in enumerate(window.messages)
                 if m["role"] == "system" and str(m["content"]).startswith(RECALLED_HEADER)), None)


def test_a_page_in_is_quoted_before_the_last_message_and_leaves_the_window_around_it_as_it_was():
    # without the digest: its share of the budget makes the later quotes leave units out (or collapse
    # the stub note) more often, which this test counts against the quotes (Policy.page_in_digest)
    cm = ContextManager(scorer="rules", policy=Policy(page_in_digest=0))
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}, *steps(14)]
    quoted = untouched = whole = 0
    for m in msgs:
        cm.add(m)
        plain = cm.build(budget=2500)
        asked = cm.build(query="what was the value of line 2.17 in part 2?", budget=2500)
        assert asked.tokens <= 2500
        if asked.paged_in and len(asked.messages) == len(cm.messages) and not _note(asked):
            # the quoted window would be larger than the whole history, which fits: the history verbatim
            assert [x["content"] for x in asked.messages] == [x["content"] for x in msgs[: len(cm.messages)]]
            whole += 1
            continue
        if not asked.paged_in:
            assert asked.messages == plain.messages
            continue
        d = {x.id: x for x in asked.decisions}
        in_place = [i for i in asked.paged_in if "quoted" not in d[i].reason]  # quoting would have shown less
        k = _note(asked)
        assert (k is None) == (len(in_place) == len(asked.paged_in))
        if k is None:
            continue
        assert k == len(asked.messages) - 2  # before the last message (an observation, a unit of its own)
        note = asked.messages.pop(k)["content"]
        for i in asked.paged_in:
            original = msgs[cm.history.ids[i]]["content"]
            assert (f"[#{cm.history.ids[i]} " in note and original in note) != (i in in_place)  # quoted byte-exact
        if not in_place:
            # nothing is rewritten: low-value units may be left out for the build, and the stub note
            # may show only its collapsed line
            rest = iter(m for m in plain.messages if not str(m["content"]).startswith("[archived"))
            assert all(any(x == y for y in rest) for x in asked.messages if not str(x["content"]).startswith("[archived"))
            quoted += 1
            untouched += asked.messages == plain.messages  # the prefix a prompt cache reuses
    # (from the eighth page-in on, a long hit ranked above most others fits once the stub note is
    # collapsed, and is shown in place: quoted, fewer hits would fit)
    assert quoted >= 7 and untouched >= 5, (quoted, untouched, whole)


def test_in_a_tool_loop_under_one_request_the_recalled_note_stays_where_it_was():
    cm = ContextManager(scorer="rules")
    cm.extend([{"role": "system", "content": SYSTEM},
               {"role": "user", "content": "My staging database password is PLUM-4471; keep it for later."},
               {"role": "assistant", "content": "Noted: the staging password is PLUM-4471."}, *steps(10)])
    query = "What was the staging database password I gave you?"
    cm.add({"role": "user", "content": query})
    first = cm.build(query=query, budget=3000)
    k = _note(first)
    assert k == len(first.messages) - 2 and "PLUM-4471" in first.messages[k]["content"]  # before the request
    for i in range(3):  # the agent calls a tool and reads its result; the request stays the last user message
        cm.add({"role": "assistant", "content": "", "tool_calls": [
            {"id": f"t{i}", "type": "function", "function": {"name": "psql", "arguments": f'{{"step": {i}}}'}}]})
        cm.add({"role": "tool", "tool_call_id": f"t{i}", "name": "psql", "content": f"connected, step {i} ok"})
        w = cm.build(query=query, budget=3000)
        assert _note(w) == k and w.messages[: len(first.messages)] == first.messages  # the prefix holds the note
        assert [m.get("tool_call_id") for m in w.messages[k + 1:] if m["role"] == "tool"] == [f"t{j}" for j in range(i + 1)]
    cm.add({"role": "user", "content": "Thanks. Now list the tables."})
    moved = cm.build(query="Thanks. Now list the tables.", budget=3000)
    assert _note(moved) in (None, len(moved.messages) - 2)  # a new request: quotes (if any) go before it


def test_langchain_joins_the_recalled_note_into_the_system_message():
    pytest.importorskip("langchain_core")
    from ctxscore.integrations.langchain import _split_system

    cm = ContextManager(scorer="rules")
    cm.extend([{"role": "system", "content": SYSTEM},
               {"role": "user", "content": "My staging database password is PLUM-4471; keep it for later."},
               {"role": "assistant", "content": "Noted: the staging password is PLUM-4471."}, *steps(10)])
    query = "What was the staging database password I gave you?"
    cm.add({"role": "user", "content": query})
    cm.build(query=query, budget=3000)
    cm.add({"role": "assistant", "content": "Checking.", "tool_calls": [
        {"id": "t0", "type": "function", "function": {"name": "psql", "arguments": "{}"}}]})
    cm.add({"role": "tool", "tool_call_id": "t0", "name": "psql", "content": "connected"})
    w = cm.build(query=query, budget=3000)
    k = _note(w)
    assert k is not None and k < len(w.messages) - 1  # kept inside the conversation
    system, rest = _split_system(w)
    assert system is not None and system.startswith(SYSTEM) and system.endswith(w.messages[k]["content"])
    assert all(m["role"] != "system" for m in rest) and rest[-1]["tool_call_id"] == "t0"


def test_in_a_tool_loop_page_in_keeps_its_plan_until_a_compaction():
    # the bundled sessions chained as a proxy sees them: one request before each assistant message,
    # the query its last user message; within a tool loop the query stays while tool results arrive.
    # Planned afresh at every step, page-in made room for other messages (the room and the ranks move
    # with each message) and rewrote the window from the first change on (5 and 15 such steps here
    # at 2,000 and 3,000 tokens)
    from benchmarks.load import bundled_trajectories, request_points, session_messages
    from ctxscore.messages import last_user_text

    msgs = session_messages(bundled_trajectories(), 0, 150)
    for budget in (2000, 3000):
        cm = ContextManager(scorer="rules", budget=budget)
        last, kept, done = None, 0, 0
        for j in request_points(msgs):
            cm.extend(msgs[done:j])
            done = j
            query = last_user_text(msgs[:j])
            w = cm.build(query=query)
            tiers = [e.tier for e in cm.history.entries]
            if last is not None and last[0] == query and last[1].paged_in and tiers[: len(last[2])] == last[2]:
                # the same request, no compaction since: no new page-in (the new messages may take the
                # room of the last ones), and with the same page-ins the window up to the recalled note
                # (or its last message) is the last window's
                assert set(w.paged_in) <= set(last[1].paged_in), j
                if w.paged_in == last[1].paged_in:
                    k = _note(last[1])
                    k = len(last[1].messages) - 1 if k is None else k
                    assert w.messages[:k] == last[1].messages[:k], j
                    kept += 1
            last = (query, w, tiers)
        assert kept >= 10, (budget, kept)


def test_the_query_of_an_agent_step_is_the_request_not_the_tool_observation():
    # mini-SWE-agent sends each command's output as a user message: the request it serves (the task
    # statement) stays the proxy's query, as the user's request does while an agent reads tool messages
    from ctxscore.messages import last_user_text

    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}, *steps(3)]
    assert msgs[-1]["role"] == "user" and msgs[-1]["content"].startswith("<returncode>")
    assert last_user_text(msgs) == TASK
    assert last_user_text(msgs[2:]) is None  # observations alone: no query
    asked = [*msgs, {"role": "user", "content": [{"type": "text", "text": "Also keep the old header?"}]}]
    assert last_user_text(asked) == "Also keep the old header?"
    assert last_user_text([*msgs, {"role": "user", "content": ""}]) is None  # an empty request asks nothing


def test_a_tool_loop_step_that_compacts_searches_afresh(monkeypatch):
    # the last search's hits are reused only with the plan: a step whose build changes tiers (here a
    # compaction that the ledger's section sets off) plans afresh from a new search, which finds the
    # messages added since
    import ctxscore.window.manager as manager
    from benchmarks.load import bundled_trajectories, request_points, session_messages
    from ctxscore.memory.ledger import FactLedger
    from ctxscore.messages import last_user_text

    searched = []
    search = manager.search
    monkeypatch.setattr(manager, "search", lambda *a, **k: searched.append(a[3]) or search(*a, **k))
    msgs = session_messages(bundled_trajectories(), 0, 150)
    cm = ContextManager(scorer="rules", budget=2000, layers=[FactLedger()])
    last, done, reused, fresh = None, 0, 0, 0
    for j in request_points(msgs):
        cm.extend(msgs[done:j])
        done = j
        query = last_user_text(msgs[:j])
        before = [e.tier for e in cm.history.entries]
        searched.clear()
        w = cm.build(query=query)
        tiers = [e.tier for e in cm.history.entries]
        if last is not None and last[0] == query and last[1].paged_in:
            if tiers != before:  # this build changed tiers: planned afresh, from a search of its own
                assert searched == [query], j
                fresh += 1
            elif not searched:
                reused += 1
        last = (query, w)
    assert fresh >= 5 and reused >= 5, (fresh, reused)


def test_a_kept_plan_is_planned_afresh_once_a_message_it_shows_is_replaced(monkeypatch):
    # the same query, only new messages, no tier changed: the plan is kept, until a newer user
    # message restates one it shows (a fresh plan brings what replaced it, and lists no digest line of it)
    import ctxscore.window.session as session
    from test_pagein_room import office_chat

    planned = []
    plan_page_in = session.plan_page_in
    monkeypatch.setattr(session, "plan_page_in", lambda *a, **k: planned.append(1) or plan_page_in(*a, **k))
    cm = ContextManager(scorer="rules", budget=300)
    cm.extend([*office_chat(40), {"role": "user", "content": "Book the meeting room for 3 people on Friday."},
               {"role": "assistant", "content": "Booked the meeting room for 3 people on Friday."},
               *office_chat(4)[1:]])
    query = "how many people is the meeting room booked for?"
    first = cm.build(query=query)
    booked = cm.history.ids["m82"]
    assert "m82" in first.paged_in and cm.history.entries[booked].tier == "archived" and planned
    tiers = [e.tier for e in cm.history.entries]
    planned.clear()
    cm.add({"role": "assistant", "content": "Anything else?"})
    assert cm.build(query=query).paged_in == first.paged_in and not planned  # kept
    cm.add({"role": "user", "content": "Actually, make it 4 people for the meeting room."})
    assert cm.history.entries[booked].successor is not None
    w = cm.build(query=query)
    assert [e.tier for e in cm.history.entries][: len(tiers)] == tiers  # no compaction: the successor decided
    assert planned and "4 people" in w.messages[-1]["content"]
