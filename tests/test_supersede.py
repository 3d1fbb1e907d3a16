"""Supersession links and page-in: a window that pages in an old value also shows what replaced it."""

from __future__ import annotations

import pytest

from ctxscore import ContextManager
from ctxscore.window.supersede import LOOKAHEAD, restates


def _booking(filler: int = 30) -> list[dict]:
    """A restaurant booking whose time is replaced a turn later (no correction keyword: the new
    value is not pinned), then a long unrelated stretch that pushes both out of the window."""
    msgs = [
        {"role": "system", "content": "You book restaurants."},
        {"role": "user", "content": "I need a restaurant in the centre of town."},
        {"role": "assistant", "content": "Ali Baba fits. Would you like me to book a table?"},
        {"role": "user", "content": "Yes, please book me a table for 2 people at 12:00 on wednesday."},
        {"role": "assistant", "content": "I'm sorry, that time is not available. Is there another time?"},
        {"role": "user", "content": "Then 11:30 would work for us."},
        {"role": "assistant", "content": "Done, your table is reserved, reference Q1XUDH9Y."},
        {"role": "user", "content": "Great, that's all for the restaurant."},
        {"role": "assistant", "content": "You're welcome, have a good day!"},
    ]  # a closing exchange: the booking task ends, its request is no longer pinned
    for i in range(filler):
        msgs += [{"role": "user", "content": f"Can you tell me about museum number {i} and its exhibits?"},
                 {"role": "assistant", "content": f"Museum {i} shows paintings and sculptures of many periods. " * 3}]
    return msgs


def test_a_later_value_of_the_same_kind_links_the_earlier_message_to_it():
    cm = ContextManager(scorer="rules", budget=100_000)
    cm.extend(_booking(0))
    e = cm.history.entries
    assert ("time", "12:00") in e[3].values
    assert e[3].successor == 5  # 11:30 restates the time of the booking request
    assert e[4].successor is None  # the reply in between holds no value: nothing of it is restated
    assert e[5].successor is None and e[6].successor is None


def test_asking_for_an_alternative_links_the_messages_it_replaces():
    # MultiWOZ: the cuisine is no entity, so only the alternative cue ("how about") says it was replaced
    cm = ContextManager(scorer="rules", budget=100_000)
    cm.extend([{"role": "user", "content": "Somewhere in the centre. I'm looking for some traditional food."},
               {"role": "assistant", "content": "I'm sorry, there aren't any traditional restaurants in the centre."},
               {"role": "user", "content": "Ok, how about lebanese food?"},
               {"role": "assistant", "content": "Ali Baba serves lebanese food in the centre."},
               {"role": "user", "content": "That sounds good, thank you."}])
    e = cm.history.entries
    assert e[0].successor == 2 and e[1].successor == 2
    assert e[2].successor is None and e[3].successor is None  # nothing after it asks for another one


def test_a_second_identifier_is_no_restatement_without_a_correction_cue():
    # two IDs name two things: tagging the first "restated in" the second told the model the booking
    # reference had been replaced by the frequent-flyer number
    opening = [{"role": "system", "content": "You are an airline support agent."},
               {"role": "user", "content": "I need help with my flight."},  # the task's opener (pinned)
               {"role": "assistant", "content": "Sure, what are your details?"},
               {"role": "user", "content": "My booking reference is QX7PLM."}, {"role": "assistant", "content": "Thanks."},
               {"role": "user", "content": "My frequent flyer number is FF88213."}, {"role": "assistant", "content": "Got it."}]
    cm = ContextManager(scorer="rules", budget=500)
    cm.extend(opening)
    cm.extend([m for i in range(12) for m in ({"role": "user", "content": f"Tell me lounge rule number {i}, please."},
                                              {"role": "assistant", "content": f"Lounge rule {i}: keep quiet in lounge {i}."})])
    e = cm.history.entries
    assert ("id_mixed", "qx7plm") in e[3].values and ("id_mixed", "ff88213") in e[5].values
    assert e[3].successor is None
    win = cm.build(query="What was my booking reference?")
    note = next(m["content"] for m in win.messages if m["content"].startswith("Earlier messages paged back in"))
    assert "[#3 user] My booking reference is QX7PLM." in note.splitlines()

    corrected = ContextManager(scorer="rules", budget=500)
    corrected.extend([*opening, {"role": "user", "content": "Sorry, the booking reference is actually QX7PLN."}])
    assert corrected.history.entries[3].successor == 7  # a correction cue still links it


def test_restates_needs_a_shared_kind_with_another_value():
    old = frozenset({("time", "12:00"), ("weekday", "wednesday")})
    assert restates(old, frozenset({("time", "11:30")}))
    assert not restates(old, frozenset({("time", "12:00")}))  # the same value again
    assert not restates(old, frozenset({("money", "$20")}))  # another kind
    assert not restates(frozenset(), frozenset({("time", "11:30")}))


def test_links_stay_within_the_lookahead_and_the_task():
    msgs = [{"role": "user", "content": "Book a table at 12:00 please."}]
    msgs += [{"role": "assistant" if i % 2 == 0 else "user", "content": f"An unrelated remark, item {i}."}
             for i in range(LOOKAHEAD)]
    msgs.append({"role": "user", "content": "Make it 13:00."})  # too far after the first message
    cm = ContextManager(scorer="rules", budget=100_000)
    cm.extend(msgs)
    assert cm.history.entries[0].successor is None
    # a new task (after a closing exchange) never links back to the old one
    cm2 = ContextManager(scorer="rules", budget=100_000)
    cm2.extend([{"role": "user", "content": "Book a table at 12:00 please."},
                {"role": "assistant", "content": "Booked. Have a good day!"},
                {"role": "user", "content": "Can you find me a taxi at 18:00?"}])
    e = cm2.history.entries
    assert e[2].task != e[0].task
    assert e[0].successor is None


def test_page_in_of_an_old_value_shows_the_value_that_replaced_it():
    msgs = _booking(30)
    cm = ContextManager(scorer="rules", budget=1000)
    cm.extend(msgs)
    plain = cm.build()
    tiers = {d.turn: d.tier for d in plain.decisions}
    assert tiers[3] != "verbatim" and tiers[5] != "verbatim"  # both out of the plain window
    win = cm.build(query="For the restaurant booking for 2 people on wednesday, what time was booked?")
    text = "\n".join(str(m.get("content")) for m in win.messages)
    assert "12:00" in text  # the booking request the query names is paged in ...
    assert "11:30" in text  # ... with the message that replaced its time
    assert text.index("12:00") < text.index("11:30")  # in conversation order: the current value last
    assert win.tokens <= win.budget
    d = {x.turn: x for x in win.decisions}
    assert d[3].paged_in and d[5].paged_in


def test_a_verbatim_hit_brings_back_what_replaced_it():
    msgs = _booking(30)
    msgs[3] = {"role": "user", "content": "Yes, please book me a table for 2 people at 12:00 on wednesday. "
                                          "It must be a quiet table, never near the kitchen."}  # a hard constraint
    cm = ContextManager(scorer="rules", budget=1000)
    cm.extend(msgs)
    plain = {d.turn: d.tier for d in cm.build().decisions}
    assert plain[3] == "verbatim" and plain[5] == "archived"  # the old value stays, the new one is out
    win = cm.build(query="what time is the restaurant table for 2 people on wednesday?")
    text = "\n".join(str(m.get("content")) for m in win.messages)
    assert "12:00" in text and "11:30" in text
    assert {x.turn: x for x in win.decisions}[5].paged_in


def _plan(cm: ContextManager, turns: list[int], budget: int):
    """The page-in plan for hits on ``turns`` (best first), as a build at ``budget`` would make it."""
    from ctxscore.store.retrieval import Hit
    from ctxscore.window.pagein import plan_page_in

    h, st = cm.history, cm.state
    hits = [Hit(id=h.entries[t].msg.id, turn=t, score=1.0 / (k + 1), snippet="", lists=frozenset({"keyword"}))
            for k, t in enumerate(turns)]
    vals, _ = st.values.values(h, {})
    return plan_page_in(hits, h, vals, st.forms, cm.policy, budget)


def test_a_message_shown_with_an_earlier_hit_takes_no_second_slot():
    from ctxscore import Policy

    cm = ContextManager(scorer="rules", budget=1000, policy=Policy(page_in_k=2))
    cm.extend(_booking(30))
    cm.build()
    e = cm.history.entries
    museum = next(i for i in range(12, len(e)) if e[i].tier != "verbatim")
    assert e[3].tier != "verbatim" and e[5].tier != "verbatim" and e[3].successor == 5
    plan = _plan(cm, [3, 5, museum], 1000)  # 5 is shown with 3 (what replaced it): the second slot is the museum's
    assert {3, 5, museum} <= set(plan.shown)



def test_a_correction_that_names_a_value_restates_only_messages_with_a_value_of_its_kind():
    # "Actually, change the hotel budget to €240" marked the flight date given between them as
    # "restated in #5", and the page-in note told the model a newer message overrides it
    cm = ContextManager(scorer="rules", budget=100_000)
    cm.extend([
        {"role": "user", "content": "Find me a hotel in Lisbon, my hotel budget is €210 per night."},
        {"role": "assistant", "content": "Noted, a hotel in Lisbon."},
        {"role": "user", "content": "My outbound flight date is June 14, 2025, from Berlin."},
        {"role": "assistant", "content": "Got it."},
        {"role": "user", "content": "Also, I'd like something quiet."},
        {"role": "user", "content": "Actually, change the hotel budget to €240 per night, I want something nicer."},
        {"role": "user", "content": "Actually, make the flight the 16th of June."},
        {"role": "user", "content": "Actually, forget what I just said."},
    ])
    e = cm.history.entries
    assert e[0].successor == 5  # the budget, by the budget correction
    assert e[2].successor == 6  # the flight date, by the date correction (a date in another spelling)
    # neither claimed the messages without an amount or a date; a correction naming no value restates
    # every message before it in the lookahead, as it did
    assert e[1].successor == e[3].successor == e[4].successor == e[5].successor == 7


def test_a_correction_whose_kinds_no_earlier_message_holds_restates_as_before():
    # the kind filter left the French restaurant request without a successor: the correction names a
    # count and a time, which no earlier message holds
    cm = ContextManager(scorer="rules", budget=100_000)
    cm.extend([{"role": "user", "content": "Book me a table at a French restaurant near Union Square."},
               {"role": "assistant", "content": "Sure, how many people?"},
               {"role": "user", "content": "Actually, I'd rather have Italian food, for 2 people at 7pm."}])
    assert [e.successor for e in cm.history.entries] == [2, 2, None]


def test_a_value_whose_slot_is_named_restates_only_messages_naming_that_slot():
    """ "And actually make the flight budget €520 per person" tagged the hotel's "€172 per night" as
    restated by it, under the note's "a newer message overrides them" (a new user's report)."""
    cm = ContextManager(scorer="rules", budget=100_000)
    cm.extend([{"role": "user", "content": "Let's go with Hotel Neri, the deluxe double, HT-40417."},
               {"role": "assistant", "content": "Great, Hotel Neri deluxe double HT-40417 at €172 per night."},
               {"role": "user", "content": "My flight budget is €480 per person."},
               {"role": "assistant", "content": "Noted."},
               {"role": "user", "content": "And actually make the flight budget €520 per person, prices went up."}])
    assert [e.successor for e in cm.history.entries] == [None, None, 4, None, None]
    cm.extend([{"role": "user", "content": "The meeting is on Tuesday at 3pm in room 4."},
               {"role": "user", "content": "Change the meeting to 4:30pm."}])
    assert cm.history.entries[5].successor == 6  # the slot it names is there (meeting)


@pytest.mark.parametrize("correction", [
    "Actually, change the time to 8pm.", "Actually make the reservation 8pm instead.", "Sorry, change the day to Saturday.",
    "Let's try 8pm instead.", "Please book 8pm instead.", "Actually, reserve 8pm instead."])
def test_a_correction_naming_a_kind_word_or_a_verb_still_restates(correction):
    """Review: the first slot-name filter read "time", "day", "book" and "reservation" as slot names
    that the request never said, and left the 7pm booking without its successor."""
    cm = ContextManager(scorer="rules", budget=100_000)
    cm.extend([{"role": "user", "content": "I need a table for 4 at 7pm on Friday, please."},
               {"role": "assistant", "content": "Sure, 7pm Friday works."}, {"role": "user", "content": correction}])
    assert [e.successor for e in cm.history.entries] == [2, 2, None]


@pytest.mark.parametrize(("said", "correction"), [
    ("Please arrange a delivery on Thursday.", "Actually change the delivery to Friday."),  # stems, not substrings
    ("Check in June 12, check out June 16.", "Actually change the check-in to June 14.")])
def test_a_named_slot_is_found_by_its_stem(said, correction):
    cm = ContextManager(scorer="rules", budget=100_000)
    cm.extend([{"role": "user", "content": said}, {"role": "assistant", "content": "OK."},
               {"role": "user", "content": correction}])
    assert cm.history.entries[0].successor == 2
