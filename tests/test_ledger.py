"""The fact ledger: extraction, naming, supersession, confirmations and denials, relative dates, the
capped section, and goal-scoped pinning with task boundaries."""

from __future__ import annotations

import json
from datetime import date

import pytest

from ctxscore import ContextManager
from ctxscore.memory.facts import FactContext, extract_facts, resolve_date
from ctxscore.memory.ledger import FactLedger
from ctxscore.messages import Message
from ctxscore.scoring.rules import default_config, typed_entity_spans
from ctxscore.scoring.spans import UNNAMED_SLOT


def facts_of(msg: dict, today: date | None = None):
    cfg = default_config()
    m = Message.from_dict(msg | {"id": "m7"})
    return extract_facts(m, 0, FactContext(cfg, today=today, spans=lambda t: typed_entity_spans(t, cfg)))


def test_text_facts_name_their_values():
    fs = {f.slot: f.value for f in facts_of({"role": "assistant", "content":
          "Done. Your reference number is Q1XUDH9Y and the total is $305.50 for 4 people."})}
    assert fs["reference number"] == "Q1XUDH9Y"
    assert fs["total"] == "$305.50"
    assert "4 people" in fs.values()


def test_json_and_tool_call_facts_keep_values_as_written():
    call = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "book_reservation", "arguments": json.dumps({"user_id": "mia_li_3668", "cabin": "economy"})}}]}
    fs = {f.slot: f for f in facts_of(call)}
    assert fs["book_reservation.user_id"].value == "mia_li_3668" and fs["book_reservation.cabin"].origin == "call"
    tool = {"role": "tool", "tool_call_id": "c1", "name": "get_user", "content": '{"price": 12.50, "reservations": ["M05KNL", "UHDAHF"]}'}
    fs = {f.slot: f.value for f in facts_of(tool)}
    assert fs["get_user.price"] == "12.50" and fs["get_user.reservations.0"] == "M05KNL"


def test_tool_call_argument_numbers_keep_their_spelling():
    """Call arguments were parsed as floats: ``"amount": 49.90`` gave the ledger line
    ``pay.amount: 49.9`` (a value the model never wrote) and ``"limit": 1e3`` no fact at all."""
    call = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "pay", "arguments": '{"amount": 49.90, "rate": 1.10, "limit": 1e3, "nights": 3}'}}]}
    fs = {f.slot: f.value for f in facts_of(call)}
    assert fs == {"pay.amount": "49.90", "pay.rate": "1.10", "pay.limit": "1e3", "pay.nights": "3"}
    ledger = FactLedger()
    cm = ContextManager(budget=4000, scorer="rules", layers=[ledger])
    cm.extend([{"role": "user", "content": "Pay the hotel please."}, call])
    assert "pay.amount: 49.90 (m1, proposed)" in ledger.lines()


def test_relative_dates_are_resolved_when_the_session_gives_a_date():
    today = date(2024, 5, 15)  # a Wednesday
    assert resolve_date("tomorrow", today) == "2024-05-16"
    assert resolve_date("Friday", today) == "2024-05-17"
    assert resolve_date("next Friday", today) == "2024-05-24"
    assert resolve_date("明天", today) == "2024-05-16"
    assert resolve_date("Tuesday next week", today) == "2024-05-21"
    assert resolve_date("Monday this week", today) == "2024-05-13"
    assert resolve_date("Sunday next week", today) == "2024-05-26"
    assert resolve_date("Tuesday next week", date(2024, 5, 19)) == "2024-05-21"  # from a Sunday: the next day's week
    assert resolve_date("Monday this week", date(2024, 5, 19)) == "2024-05-13"  # may lie in the past
    assert resolve_date("tomorrow", None) is None
    (f,) = [f for f in facts_of({"role": "user", "content": "Please book it for tomorrow."}, today) if f.value == "tomorrow"]
    assert f.resolved == "2024-05-16" and "(= 2024-05-16)" in f.line()


def test_chinese_weekdays_keep_their_week_and_are_resolved():
    # 下周五 (Friday of next week) was read as 周五 (this Friday) and resolved to nothing
    today = date(2024, 5, 15)  # a Wednesday
    assert resolve_date("下周五", today) == resolve_date("下星期五", today) == "2024-05-24"
    assert resolve_date("周五", today) == resolve_date("这周五", today) == "2024-05-17"
    assert resolve_date("本周一", today) == "2024-05-13" and resolve_date("上周五", today) == "2024-05-10"
    assert resolve_date("礼拜天", today) == "2024-05-19"
    (f,) = [f for f in facts_of({"role": "user", "content": "入住改到下周五。"}, today) if f.value == "下周五"]
    assert f.resolved == "2024-05-24" and f.slot == "入住"


def session(cm: ContextManager) -> FactLedger:
    return next(layer for layer in cm.state.layers if isinstance(layer, FactLedger))


def test_a_new_value_supersedes_the_old_one_within_a_task():
    cm = ContextManager(budget=4000, scorer="rules", layers=[FactLedger()])
    cm.extend([
        {"role": "system", "content": "You book restaurants."},
        {"role": "user", "content": "Please book a table for 4 people at 7pm."},
        {"role": "assistant", "content": "Checking tables for 4 people at 7pm."},
        {"role": "user", "content": "Actually, make it 6 people."},
    ])
    led = session(cm)
    people = [f for f in led.current.values() if f.value.endswith("people")]
    assert [f.value for f in people] == ["6 people"]
    assert any("6 people" in line and "was 4 people" in line for line in led.lines())


def test_a_user_reply_confirms_or_denies_a_proposal():
    cm = ContextManager(budget=4000, scorer="rules", layers=[FactLedger()])
    cm.extend([
        {"role": "user", "content": "Find me a flight to Boston on May 3."},
        {"role": "assistant", "content": "Flight HAT136 leaves at 9:15am for $220. Shall I book it?"},
        {"role": "user", "content": "No, not that one."},
        {"role": "assistant", "content": "Flight HAT205 leaves at 1:05pm for $240. Shall I book it?"},
        {"role": "user", "content": "Yes please."},
    ])
    by_value = {f.value: f for f in session(cm).current.values()}
    assert "HAT136" not in by_value  # denied
    assert by_value["HAT205"].status == "confirmed"


def test_extractor_values_supersede_only_what_they_replace():
    """A pluggable extractor's values: an unnamed one (the learned extractor's ``key span``) is recorded
    but is no slot's value, so it neither supersedes nor is shown; named ones of one slot from two
    messages both stay current unless the later one corrects the earlier (before, any two values of
    an extractor in a task read as a state update: "riverside" was shown as superseded by "quiet")."""
    spans = {"I'd like dinner on the riverside with my sister.": [(UNNAMED_SLOT, "riverside"), (UNNAMED_SLOT, "sister")],
             "Somewhere quiet, Thai food please.": [(UNNAMED_SLOT, "quiet"), ("cuisine", "Thai")],
             "Also lunch tomorrow, Italian food.": [("cuisine", "Italian")],
             "Actually, make the lunch Greek food.": [("cuisine", "Greek")]}
    ledger = FactLedger(extractor=lambda text: spans.get(text, []))
    cm = ContextManager(budget=4000, scorer="rules", layers=[ledger])
    for text in spans:
        cm.add({"role": "user", "content": text})
        cm.add({"role": "assistant", "content": "Noted."})
    recorded = {f.value for f in ledger.facts if f.slot == UNNAMED_SLOT}
    assert recorded == {"riverside", "sister", "quiet"}  # kept in the record ...
    assert not any(f.slot == UNNAMED_SLOT for f in ledger.current.values())  # ... but no slot's value
    assert not any("riverside" in olds or "sister" in olds for olds in ledger.was.values())
    assert not any(line.startswith(UNNAMED_SLOT) for line in ledger.lines())
    cuisine = sorted(f.value for f in ledger.current.values() if f.slot == "cuisine")
    assert cuisine == ["Greek", "Thai"]  # Thai and Italian both stated; the correction replaced Italian
    assert ledger.was[(0, "cuisine")] == ["Italian"]


def test_a_value_kept_beside_a_newer_one_names_only_what_it_replaced():
    # "people: 4 people (m0; was 6 people)": 6 came after 4 (a second table) and was corrected to 8
    ledger = FactLedger()
    cm = ContextManager(budget=4000, scorer="rules", layers=[ledger])
    for text in ("Book a table for 4 people at Tasca do Chico.", "And a second table for 6 people at Cervejaria Ramiro.",
                 "Actually, make the second one 8 people."):
        cm.add({"role": "user", "content": text})
        cm.add({"role": "assistant", "content": "Done."})
    people = [line for line in ledger.lines() if line.startswith("people:")]
    assert people == ["people: 4 people (m0)", "people: 8 people (m4; was 6 people)"]
    assert [f["was"] for f in ledger.state()["facts"] if f["slot"] == "people"] == [[], ["6 people"]]
    cm.add({"role": "user", "content": "Oh, and a third table for 3 people."})  # 8 stays current, with its history
    assert [line for line in ledger.lines() if line.startswith("people:")] == [
        "people: 4 people (m0)", "people: 8 people (m4; was 6 people)", "people: 3 people (m6)"]


def test_the_section_shows_only_facts_not_verbatim_and_fits_its_cap():
    cm = ContextManager(budget=1200, scorer="rules", layers=[FactLedger()])
    cm.add({"role": "system", "content": "You are a travel agent."})
    for i in range(30):
        cm.add({"role": "user", "content": f"Hi, please book trip number {i} to Springfield for me."})
        cm.add({"role": "assistant", "content": f"Booked: your reference number is REF{1000 + i}. " + "Filler words here. " * 10})
        cm.add({"role": "user", "content": "Thanks, that's all."})
        cm.add({"role": "assistant", "content": "You're welcome, have a nice day!"})
    win = cm.build()
    ledger = next(s for s in win.sections if s.name == "ledger")
    assert 0 < ledger.tokens <= 0.1 * 1200 + 1
    note = next(m["content"] for m in win.messages if m["content"].startswith("Facts so far"))
    verbatim = {d.id for d in win.decisions if d.tier == "verbatim"}
    shown = [line for line in note.splitlines()[1:]]
    assert shown and all(line.startswith("reference number: REF") for line in shown)
    for line in shown:  # a fact visible in its message is not repeated
        assert line.split("(")[1].split(",")[0].split(";")[0].rstrip(")") not in verbatim, line
    assert len(shown) < 30  # capped: the rest is left to the store


def test_finished_tasks_are_no_longer_pinned():
    cm = ContextManager(budget=100_000, scorer="rules")
    cm.extend([
        {"role": "user", "content": "Please book a table for two at Sushi Ran at 7pm."},
        {"role": "assistant", "content": "Booked: Sushi Ran, 7pm, two people, reference SR-1."},
        {"role": "user", "content": "Thanks, that's all."},
        {"role": "assistant", "content": "You're welcome, have a nice day!"},
        {"role": "user", "content": "Hi, I need a taxi to the airport tomorrow at 6am."},
    ])
    h = cm.history
    assert [e.task for e in h.entries] == [0, 0, 0, 0, 1]
    assert not h.entries[0].pinned and h.entries[0].tier_category == "key_state"
    assert h.entries[4].pinned and h.entries[4].pin == "instruction"


def test_hard_constraints_are_kept_and_never_archived():
    cm = ContextManager(budget=500, scorer="rules")
    cm.add({"role": "user", "content": "Help me migrate the service. Never touch the production database; staging only."})
    cm.add({"role": "assistant", "content": "Understood, I will work on staging."})
    cm.add({"role": "user", "content": "Thanks, that's all for that."})
    cm.add({"role": "assistant", "content": "Goodbye!"})
    for i in range(12):
        cm.add({"role": "user", "content": f"Hi, new question {i}: how do I list the pods in namespace n{i}?"})
        cm.add({"role": "assistant", "content": f"Run kubectl get pods -n n{i}. " + "It prints a table of pods. " * 6})
    win = cm.build()
    d0 = win.decisions[0]
    assert not d0.pinned and d0.tier != "archived"
    assert "Never touch the production database;" in json.dumps(win.messages)


def test_slot_names_keep_accented_letters():
    # "caf order number: ORD-5512": the slot's words were read as ASCII letters only
    ledger = FactLedger()
    cm = ContextManager(budget=4000, scorer="rules", layers=[ledger])
    cm.add({"role": "user", "content": "My café order number is ORD-5512."})
    assert ledger.lines() == ["café order number: ORD-5512 (m0)"]


def _lines(*texts: str) -> list[str]:
    ledger = FactLedger()
    cm = ContextManager(budget=4000, scorer="rules", layers=[ledger])
    for k, text in enumerate(texts):
        cm.add({"role": "user", "content": text})
        if k < len(texts) - 1:
            cm.add({"role": "assistant", "content": "好的。"})
    return ledger.lines()


def test_chinese_slot_names_leave_out_owner_bound_and_change_verb():
    # "我的航班: 5月20日" beside "航班: 5月22日", "算每晚不超过: 800元" beside "预算改成每晚: 1000元":
    # fragments as slot names, so the correction replaced nothing; the phone and member number had no line
    assert _lines("我的航班是5月20日。", "航班改到5月22日。") == ["航班: 5月22日 (m2; was 5月20日)"]
    assert _lines("我的预算每晚不超过800元。", "其实预算改成每晚1000元。") == ["预算: 1000元 (m2; was 800元)"]
    assert _lines("我的手机号是13912345678。") == ["手机号: 13912345678 (m0)"]
    assert _lines("入住日期能改到下周五吗？") == ["入住日期: 下周五 (m0)"]
    assert _lines("My budget is no more than $800 a night.", "Actually, make the budget $1000 a night.") == [
        "budget: $1000 (m2; was $800)"]


def test_a_chinese_train_number_is_one_value_under_its_slot():
    # G1次 was the count "1次" under the slot 次: the train's letter lost, and D2315次 was two values
    assert _lines("乘G1次列车，下周五出发。") == ["车次: G1次 (m0)", "日期: 下周五 (m0)"]
    assert _lines("我坐G1次。", "其实改成D2315次列车吧。") == ["车次: D2315次 (m2; was G1次)"]
    assert _lines("每天3次。") == ["次: 3次 (m0)"]


def test_the_stale_check_names_the_value_that_replaced_the_one_shown():
    # "6 people" corrected to 4, then a second table for 2: the check said the current value was 2
    # (the newer slot value), and once the 4 was kept under its own key it found nothing
    from ctxscore.verify import ContextVerifier
    from ctxscore.verify.window_checks import stale_checks

    led = FactLedger()
    cm = ContextManager(budget=4000, scorer="rules", layers=[led, ContextVerifier(ledger=led)])
    for text in ("Book a table for 6 people at Nopa tonight.", "Actually, make it 4 people.",
                 "And a second table for 2 people at Zuni tomorrow."):
        cm.add({"role": "user", "content": text})
        cm.add({"role": "assistant", "content": "Done."})
    cm.build()
    found = stale_checks(led, cm.state.view, "Book a table for 6 people at Nopa tonight.")
    assert [(f.details["shown"], f.details["current"]) for f in found] == [("6 people", "4 people")]


def test_slot_name_stripping_keeps_words_whole():
    # the first version stripped 约 off 预约 and "up" off "pick up time"
    from ctxscore.memory.facts import _slot_name

    assert [_slot_name(b) for b in ("我的预约是", "功能是", "The pick up time is ", "我的预算每晚不超过")] == [
        "预约", "功能", "pick up time", "预算"]


def test_the_ledger_gives_way_before_the_latest_message_is_cut():
    """A 1,340-token system prompt at a 1,500-token budget: the ledger's note (its 10% share) pushed
    the window over the budget and the user's question was cut away (a new user's report). The note
    now takes only the room the pinned messages and the last message leave it."""
    rules = " ".join(f"Rule {i}: the agent must verify the user id before changing reservation number R{i:04d}."
                     for i in range(70))
    msgs = [{"role": "system", "content": "You are an airline agent. " + rules}]
    for i in range(4):
        msgs += [{"role": "user", "content": f"My reservation number is ABC{i}23 and my user id is user_{i}_smith; "
                                             f"the flight is HAT{100 + i} on May {i + 3} for {i + 2} passengers."},
                 {"role": "assistant", "content": f"I found reservation ABC{i}23: flight HAT{100 + i}, departing 09:40 "
                                                  f"on May {i + 3}, {i + 2} passengers, total $1{i}4.50."}]
    ask = "Neither of those options works for me as I don't want to fly before 11 AM EST. Do you have any later flights?"
    msgs.append({"role": "user", "content": ask})
    cm = ContextManager(budget=1500, scorer="rules", layers=[FactLedger()])
    cm.extend(msgs)
    w = cm.build()
    sections = {s.name: s.tokens for s in w.sections}
    assert w.tokens <= 1500 and w.messages[-1]["content"] == ask
    assert 0 < sections["ledger"] < 150  # shown, smaller than its share
    assert not any(x.kind in ("over_budget", "last_message_fitted") for x in w.warnings)


def test_values_of_one_message_do_not_supersede_one_another():
    """Two flights offered in one message read "date: May 22 (m2; was May 20)": the ledger told the
    model that the first flight was replaced (a new user's report); the ends of a range too. Each
    value of one message stays current, and the user's "yes" confirms them all."""
    led = FactLedger()
    cm = ContextManager(budget=4000, scorer="rules", layers=[led])
    cm.add({"role": "user", "content": "I need to get to Seattle and back."})
    cm.add({"role": "assistant", "content": "I found HAT136 departing 09:40 on May 20 and HAT039 departing 14:10 on "
                                            "May 22. The office is open 10:00-18:00. Shall I book both?"})
    cm.add({"role": "user", "content": "Yes, book both."})
    lines = led.lines()
    assert not any("was" in line for line in lines), lines
    for value in ("May 20", "May 22", "09:40", "14:10", "10:00", "18:00"):
        assert any(f": {value} (m1)" in line for line in lines), (value, lines)  # current and confirmed
    cm.add({"role": "user", "content": "Actually, make it May 23 for the return."})
    assert any("May 23 (m3; was" in line for line in led.lines())  # a correction still replaces


def ledger_of(turns: list[str]) -> FactLedger:
    """The ledger of a rules session of user ``turns``, each answered "OK."."""
    led = FactLedger()
    cm = ContextManager(budget=4000, scorer="rules", layers=[led])
    for t in turns:
        cm.extend([{"role": "user", "content": t}, {"role": "assistant", "content": "OK."}])
    return led


@pytest.mark.parametrize(("first", "then", "want"), [
    ("I need a hotel in Cambridge from Tuesday for 3 nights.", "Sorry, I meant Wednesday, not Tuesday.",
     ": Wednesday (m2; was Tuesday)"),
    ("帮我订周二晚上7点的餐厅，4个人。", "不对，是周三不是周二。", ": 周三 (m2; was 周二)"),
    ("帮我订周二晚上7点的餐厅，4个人。", "不对，改成周三。", ": 周三 (m2; was 周二)"),
    ("Check-out on March 5.", "Change the check-out to March 7, not March 5.", "check-out: March 7 (m2; was March 5)"),
    ("The meeting is at 3pm on Friday.", "Sorry, change the meeting to 4:30pm.", "meeting: 4:30pm (m2; was 3pm)"),
    ("My email is alice@example.com.", "Actually use alice.w@work.example.org as my email.",
     "email: alice.w@work.example.org (m2; was alice@example.com)"),
    ("入住时间是6月1日。", "入住改到6月3日吧。", "入住时间: 6月3日 (m2; was 6月1日)"),
    ("帮我订一家上海的酒店，6月1日入住，住两晚。", "入住改到6月3日吧", ": 6月3日 (m2; was 6月1日)"),
    ("Schedule the meeting on Tuesday at 3pm.", "Sorry, change the meeting to 4:30pm.", "time: 4:30pm (m2; was 3pm)"),
    ("帮我订周二的会议室，周二下午。", "不对，是周三不是周二", ": 周三 (m2; was 周二)"),
])
def test_a_correction_replaces_the_value_it_names_or_denies(first, then, want):
    """Corrections a new user tried: the negated value ("not Tuesday") stayed a current fact and
    the new one stood beside the old under another slot name, with no 'was'."""
    led = FactLedger()
    cm = ContextManager(budget=4000, scorer="rules", layers=[led])
    cm.extend([{"role": "user", "content": first}, {"role": "assistant", "content": "OK."},
               {"role": "user", "content": then}])
    lines = led.lines()
    assert any(line.endswith(want) for line in lines), lines
    old = want.rsplit("was ", 1)[1].rstrip(")")
    assert not any(old in line.split(" (")[0] for line in lines), lines  # the old value is no current value


@pytest.mark.parametrize(("turns", "current"), [
    # "set ... to" and "use ... for" are no corrections, and a count does not replace another count
    (["Book a table for 4 people on Friday.", "Also, set the reminder to 3 days before."], {"4 people", "Friday", "3 days"}),
    (["The booking is for 2 adults.", "Use 3 rooms for the group."], {"2 adults", "3 rooms"}),
    # a question denies nothing
    (["The meeting is on Tuesday.", "Why not Tuesday and Thursday both?"], {"Tuesday", "Thursday"}),
    # the denied value kept beside a newer one of its slot: the other stays, the replacement takes its place
    (["My flight is on Tuesday.", "My flight is on Friday.", "Sorry, I meant Wednesday, not Tuesday."], {"Friday", "Wednesday"}),
    # the value replacing a denied one is of its kind
    (["Dinner on Tuesday at 6pm.", "Wednesday at 7pm works, not Tuesday."], {"Wednesday", "7pm"}),
])
def test_what_is_no_correction_leaves_the_values_current(turns, current):
    """A reviewer's cases: each of these replaced or lost a value ("people: 3 days (m2; was 4 people)",
    Friday gone, "dinner: 7pm (m2; was Tuesday)")."""
    led = ledger_of(turns)
    shown = {f.value for f in led.current.values()}
    assert current <= shown, led.lines()
    if "Tuesday" not in current:
        assert "Tuesday" not in shown, led.lines()  # denied: no current value


def test_layer_notes_fit_beside_a_last_message_cut_to_the_budget():
    """The last message (1,357 tokens at 800) is cut to the room left, but no cut goes below its
    first and last blocks: the goal and ledger notes then pushed the window to 861 tokens."""
    from ctxscore.memory.profile import ProfileLayer
    from ctxscore.memory.typed_sections import ContextTypes
    from ctxscore.verify import ContextVerifier

    last = "Please consider: " + " ".join(f"point {i} about the trip itinerary details." for i in range(150))
    led, prof = FactLedger(), ProfileLayer("u1")
    cm = ContextManager(budget=800, scorer="rules",
                        layers=[led, prof, ContextTypes(), ContextVerifier(ledger=led, profile=prof)])
    cm.extend([{"role": "system", "content": "You are a travel agent."},
               {"role": "user", "content": "Book a hotel in Paris for 2 nights from June 1, budget under €200 a night. "
                                           "Never book without asking me."},
               {"role": "assistant", "content": "Sure. Hotel Lumiere is €180 a night for June 1-3."},
               {"role": "user", "content": "Actually make it 3 nights, not 2. My email is a@b.com."},
               {"role": "user", "content": last}])
    w = cm.build()
    assert w.tokens <= 800 and not any(x.kind == "over_budget" for x in w.warnings)


@pytest.mark.parametrize("budget", [700, 1000, 1200])
def test_the_ledger_gives_way_to_recent_turns_beside_a_cut_tool_output(budget):
    """A 14-row search result cut to fit, after short turns that are all recent: the ledger's note took
    its share beside them and the window went over the budget (738 at 700, 1,264 at 1,200; a new
    user's report). The note now shrinks or goes when a rendering is over the budget."""
    rows = [{"flight": f"EI{500 + i}", "airline": "Aer Lingus", "from": "DUB", "to": "BCN", "date": "2025-06-12",
             "depart": f"{6 + i:02d}:05", "fare_eur": 100 + 17 * i, "baggage": "1 checked bag 23kg"} for i in range(14)]
    msgs = [{"role": "system", "content": "You are a travel booking assistant."},
            {"role": "user", "content": "Plan a trip from Dublin to Barcelona, June 12 to June 19, for 2 people."},
            {"role": "assistant", "content": "Sure."},
            {"role": "user", "content": "I'm a Gold member, my member number is WC-88213-GLD."},
            {"role": "assistant", "content": "Thanks, noted Gold membership WC-88213-GLD; the 10% Gold discount applies to hotels."},
            {"role": "user", "content": "Send all confirmations to john.keane+trips@gmail.com please."},
            {"role": "assistant", "content": "Will do, confirmations go to john.keane+trips@gmail.com."},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
                "name": "search_flights", "arguments": '{"to": "BCN"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "name": "search_flights", "content": json.dumps(rows, indent=1)}]
    plain = ContextManager(budget=budget, scorer="rules")
    plain.extend(msgs)
    cm = ContextManager(budget=budget, scorer="rules", layers=[FactLedger()])
    cm.extend(msgs)
    w = cm.build()
    assert w.tokens <= budget and not any(x.kind == "over_budget" for x in w.warnings)
    assert w.messages[-1] == plain.build().messages[-1]  # the output is cut no shorter than without the ledger


def test_going_back_and_saying_a_correction_again():
    """Back to an earlier value (还是周二吧) left two days current; the same correction said again
    added a second slot `meant: June 2` (a new user's report)."""
    for turns, want in (
        (["帮我订周二的会议室。", "不对，改成周三。", "不对，改成周四。", "不对，还是周二吧。"], ["帮我订: 周二 (m6; was 周三, 周四)"]),
        (["Check in on June 1.", "Sorry, I meant June 2, not June 1.", "Sorry, I meant June 2, not June 1."],
         ["date: June 2 (m2; was June 1)"]),
    ):
        assert ledger_of(turns).lines() == want


TRIP = [
    {"role": "system", "content": "You are a travel booking assistant."},
    {"role": "user", "content": "Send all confirmations to john.keane+trips@gmail.com please."},
    {"role": "assistant", "content": "Will do."},
    {"role": "user", "content": "I'm a Gold member, my member number is WC-88213-GLD."},
    {"role": "assistant", "content": "Thanks, I have noted Gold membership WC-88213-GLD; the 10% Gold discount applies to hotels."},
    {"role": "user", "content": "Let's take Aer Lingus EI564 out at 07:05 and EI565 back at 18:40."},
    {"role": "assistant", "content": "I found 12 options. Excluding Ryanair, the cheapest are listed first. EI564 and EI565 are €437 per person."},
    {"role": "user", "content": "Also please change the confirmation email to john.keane@work-mail.ie instead."},
    {"role": "assistant", "content": "Booked: Hotel Neri family room, €1,426.50 total."},
]


def test_values_under_a_slot_nothing_names_do_not_supersede_one_another():
    """`id: EI564 (m5; was WC-88213-GLD)`, `name: Hotel Neri (m8; was Excluding Ryanair)`: under a slot
    only the kind's label names (id, name, amount, date), a flight "replaced" a member number and a
    hotel a phrase of another sentence, since the old value was an assistant's (proposed); in a longer
    session a return date was an old value of the outbound (a new user's report)."""
    led = FactLedger()
    cm = ContextManager(budget=8000, scorer="rules", layers=[led])
    cm.extend(TRIP)
    lines = led.lines()
    assert "id: EI564 (m5)" in lines and "name: Hotel Neri (m8)" in lines, lines
    assert not any("was WC-88213-GLD" in line or "was Excluding" in line for line in lines), lines
    cm = ContextManager(budget=4000, scorer="rules", layers=[dates := FactLedger()])
    cm.extend([{"role": "user", "content": "Find flights out and back."},
               {"role": "assistant", "content": "I found 12 options on 2025-06-12. Morning or afternoon?"},
               {"role": "user", "content": "Morning."},
               {"role": "assistant", "content": "I found 9 options on 2025-06-19. Morning or afternoon?"},
               {"role": "user", "content": "Afternoon."},
               {"role": "assistant", "content": "EI564 and EI565 are €437 per person."},
               {"role": "assistant", "content": "Hotel Neri: €1,083.60."}])
    lines = [line for line in dates.lines() if line.startswith(("date:", "amount:"))]
    assert lines == ["date: 2025-06-12 (m1, proposed)", "date: 2025-06-19 (m3, proposed)", "amount: €437 (m5, proposed)",
                     "amount: €1,083.60 (m6, proposed)"], lines
    # a correction of a date still replaces the one it corrects (README: "make it May 23")
    cm.add({"role": "user", "content": "Actually, make it 2025-06-20."})
    assert any(line.startswith("date: 2025-06-20 (m7; was 2025-06-19") for line in dates.lines()), dates.lines()


def test_a_current_value_is_not_listed_as_its_own_old_value():
    """`date: 2025-06-12 (m24; was 2025-06-12, 2025-06-19)`, `allergens_menu: no (m209; was no, yes)`:
    a value that came back, or was said again, was shown as an old value of itself (a new user's report)."""
    turns = ["The meeting is at 3pm.", "Actually, make the meeting 4pm.", "Actually, make the meeting 3pm."]
    assert ledger_of(turns).lines() == ["meeting: 3pm (m4; was 4pm)"]
    assert ledger_of([*turns, "The meeting is at 3pm."]).lines() == ["meeting: 3pm (m6; was 4pm)"]
    led = ledger_of([*turns, "Actually, make the meeting 5pm."])
    assert led.lines() == ["meeting: 5pm (m6; was 4pm, 3pm)"] and led.state()["facts"][0]["was"] == ["4pm", "3pm"]


def test_rows_of_later_tool_results_are_new_data_not_corrections():
    """`search_hotels.0.price_per_night_eur: 281 (m82; was 183, 168)`: the rows of 14 result pages were
    chained as corrections of one another, and those lines took most of the ledger's share at 8k
    while the member number and the hold's booking reference lost their room (a new user's report).
    A later page's row is current with no 'was', and a result's rows rank after the other facts."""
    led = FactLedger()
    cm = ContextManager(budget=8000, scorer="rules", layers=[led])
    cm.extend([{"role": "user", "content": "I'm a Gold member, my member number is WC-88213-GLD."},
               {"role": "assistant", "content": "", "tool_calls": [{"id": "h", "type": "function", "function": {
                   "name": "hold_flight", "arguments": '{"flight": "EI564"}'}}]},
               {"role": "tool", "tool_call_id": "h", "name": "hold_flight",
                "content": json.dumps({"status": "held", "booking_reference": "K7QX2M"})}])
    for page, prices in enumerate([(183, 168), (281, 190), (150, 205)]):
        cm.extend([{"role": "assistant", "content": "", "tool_calls": [{"id": f"c{page}", "type": "function", "function": {
                       "name": "search_hotels", "arguments": json.dumps({"page": page + 1})}}]},
                   {"role": "tool", "tool_call_id": f"c{page}", "name": "search_hotels",
                    "content": json.dumps([{"name": f"Hotel {page}{i}", "price_per_night_eur": p} for i, p in enumerate(prices)])}])
    rows = [line for line in led.lines() if line.startswith("search_hotels.") and ".page" not in line]
    assert rows == ["search_hotels.0.name: Hotel 20 (m8)", "search_hotels.0.price_per_night_eur: 150 (m8)",
                    "search_hotels.1.name: Hotel 21 (m8)", "search_hotels.1.price_per_night_eur: 205 (m8)"], rows
    assert "search_hotels.page: 3 (m7, proposed; was 1, 2)" in led.lines()  # a call's argument is a state
    order = [f.slot for f in led.ordered()]
    assert max(order.index(s) for s in ("member number", "hold_flight.booking_reference")) < min(
        i for i, s in enumerate(order) if s.startswith("search_hotels.0.")), order
    for c, status in (("x", "held"), ("y", "cancelled")):
        cm.extend([{"role": "assistant", "content": "", "tool_calls": [{"id": c, "type": "function", "function": {
                       "name": "get_booking", "arguments": "{}"}}]},
                   {"role": "tool", "tool_call_id": c, "name": "get_booking", "content": json.dumps({"status": status})}])
    assert "get_booking.status: cancelled (m12; was held)" in led.lines()  # a result's field outside rows: a state


@pytest.mark.parametrize(("turns", "want", "current"), [
    (["酒店预算每晚不超过800元。", "等一下，其实预算改成每晚1000元吧。"], ["酒店预算: 1000元 (m2; was 800元)"], {"1000元"}),
    (["My hotel budget is €180 per night.", "Actually, make the budget €200."], ["hotel budget: €200 (m2; was €180)"], {"€200"}),
    # another slot that only shares a word, or two slots it could name: both stay
    (["My hotel budget is €180 per night.", "Actually, make the flight budget €520."], None, {"€180", "€520"}),
    (["My hotel budget is €180 per night.", "The flight budget is €450.", "Actually, make the budget €200."], None,
     {"€180", "€450", "€200"}),
])
def test_a_correction_under_a_shorter_or_longer_slot_name_replaces_an_amount(turns, want, current):
    """`酒店预算: 800元 (m3)` and `预算: 1000元 (m75)` were both current: a correction under a shorter
    or longer name of a slot replaced only dates, times and emails (a new user's report)."""
    led = ledger_of(turns)
    if want is not None:
        assert led.lines() == want
    assert {f.value for f in led.current.values()} == current, led.lines()


def test_a_correction_under_a_slot_sharing_a_noun_replaces_the_tasks_one_email():
    """`send all confirmations: john.keane+trips@gmail.com (m1)` and `confirmation email:
    john.keane@work-mail.ie (m7)` were both current after "change the confirmation email to ...
    instead" (a new user's report): the slots share "confirmation", and the task holds one email."""
    led = FactLedger()
    cm = ContextManager(budget=8000, scorer="rules", layers=[led])
    cm.extend(TRIP[:2] + [{"role": "assistant", "content": "Will do, confirmations go to john.keane+trips@gmail.com."}]
              + TRIP[3:])
    emails = [line for line in led.lines() if "@" in line]
    assert emails == ["send all confirmations: john.keane@work-mail.ie (m7; was john.keane+trips@gmail.com)"], emails
    # two emails in the task, or slots sharing only the kind's name: no guess
    led = ledger_of(["Send all confirmations to a@x.com, and invoices to b@x.com.",
                     "Also please change the confirmation email to c@x.com instead."])
    assert {f.value for f in led.current.values()} == {"a@x.com", "b@x.com", "c@x.com"}, led.lines()
    led = ledger_of(["The hotel date is June 3.", "Also please change the flight date to June 5."])
    assert {f.value for f in led.current.values()} == {"June 3", "June 5"}, led.lines()


def test_a_noun_sharing_correction_leaves_the_same_email_given_for_another_thing():
    """The user gave one address for two things: "change the confirmation email to ..." replaced the
    confirmations' address and deleted `billing email: john@gmail.com` with it (every entry holding the
    old value left, not only the assistant's echoes)."""
    turns = ["Send all confirmations to john@gmail.com please.", "My billing email is john@gmail.com as well."]
    assert ledger_of(turns).lines() == ["send all confirmations: john@gmail.com (m0)", "billing email: john@gmail.com (m2)"]
    led = ledger_of([*turns, "Also please change the confirmation email to john@work.ie instead."])
    assert sorted(led.lines()) == ["billing email: john@gmail.com (m2)",
                                   "send all confirmations: john@work.ie (m4; was john@gmail.com)"], led.lines()
    # an assistant's echo of the replaced value leaves; the billing email stays
    led = FactLedger()
    cm = ContextManager(budget=4000, scorer="rules", layers=[led])
    cm.extend([{"role": "user", "content": turns[0]},
               {"role": "assistant", "content": "Will do, confirmations go to john@gmail.com."},
               {"role": "user", "content": turns[1]}, {"role": "assistant", "content": "OK."},
               {"role": "user", "content": "Also please change the confirmation email to john@work.ie instead."}])
    assert sorted(line for line in led.lines() if "@" in line) == [
        "billing email: john@gmail.com (m2)", "send all confirmations: john@work.ie (m4; was john@gmail.com)"], led.lines()
