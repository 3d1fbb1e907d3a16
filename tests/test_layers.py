"""Layered context (issue 14): context types, the user-profile memory, the verifier and the event log,
on real bundled sessions and hand-made text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctxscore import ContextManager
from ctxscore.cli import main as cli_main
from ctxscore.errors import ConfigError, StoreError
from ctxscore.events import EventLog, rebuild, snapshots, verify_chain
from ctxscore.memory.context_types import ContextType, RuleTypeClassifier
from ctxscore.memory.ledger import FactLedger
from ctxscore.memory.profile import ProfileLayer
from ctxscore.memory.typed_sections import ContextTypes, GoalSection
from ctxscore.messages import Message
from ctxscore.store.sqlite import SQLiteStore

REPO = Path(__file__).resolve().parents[1]
BUNDLED = REPO / "data" / "bundled" / "sessions.jsonl"


def _bundled(prefix: str) -> dict:
    for line in BUNDLED.read_text(encoding="utf-8").splitlines():
        s = json.loads(line)
        if s["session_id"].startswith(prefix):
            return s
    raise LookupError(prefix)


def _profile(store: SQLiteStore, user: str, sid: str, msgs: list[dict], end: bool = True) -> ProfileLayer:
    p = ProfileLayer(user, clock=lambda: 1.7e9)
    cm = ContextManager(budget=4000, scorer="rules", store=store, session_id=sid, layers=[p])
    for m in msgs:
        cm.add(m)
    if end:
        p.end_session()
    return p


# -- context types --------------------------------------------------------------------------------
def test_rule_types_on_real_session():
    s = _bundled("bundled/travel-booking-en-01")
    ct = ContextTypes(head=None)
    cm = ContextManager(budget=1500, scorer="rules", layers=[ct])
    for m in s["messages"]:
        cm.add(m)
    types = {e.msg.id: ct.type_of(e.msg.id).type for e in cm.history.entries}
    roles = {e.msg.id: str(e.msg.role) for e in cm.history.entries}
    assert all(types[i] == ContextType.INSTRUCTION for i, r in roles.items() if r == "system")
    assert all(types[i] == ContextType.TOOL for i, r in roles.items() if r == "tool")
    first_user = next(i for i, r in roles.items() if r == "user")
    assert types[first_user] == ContextType.GOAL
    assert set(ct.counts()) >= {"instruction", "tool", "goal", "task"}
    w = cm.build()
    assert w.tokens <= 1500


@pytest.mark.parametrize(("text", "want"), [
    ("Please never book red-eye flights and never exceed $500.", ContextType.CONSTRAINT),
    ("I'm vegetarian and I love Italian food.", ContextType.USER),
    ("I need a flight from Boston to Denver next Friday.", ContextType.GOAL),
    ("不要推荐苹果的手机，绝对不能超过三千元。", ContextType.CONSTRAINT),
    ("我比较喜欢靠窗的座位。", ContextType.USER),
])
def test_rule_types_handmade(text, want):
    first = want == ContextType.GOAL
    from ctxscore.scoring.rules import hard_constraints  # noqa: PLC0415

    got = RuleTypeClassifier().classify(Message(role="user", content=text), hard_constraints(text), first_user=first)
    assert got.type == want, (text, got)


TRIP = ("We're planning a family trip to Barcelona in June; my wife loves architecture and the kids want the beach. "
        "We'd also love a hotel near the Gothic quarter with breakfast included, ideally with a pool for the kids.")


def _hotel_pages(cm: ContextManager, rounds: int, user: str = "Next page please.") -> None:
    """``rounds`` rounds of a hotel search call, its result, the assistant's note and the user's ``user``."""
    for i in range(rounds):
        cm.extend([{"role": "assistant", "content": "", "tool_calls": [{"id": f"c{i}", "type": "function", "function": {
                       "name": "search_hotels", "arguments": json.dumps({"city": "Barcelona", "page": i + 1})}}]},
                   {"role": "tool", "tool_call_id": f"c{i}", "name": "search_hotels",
                    "content": json.dumps([{"hotel_id": f"HT-{10000 + i * 10 + j}", "price": 100 + j} for j in range(6)])},
                   {"role": "assistant", "content": f"Page {i + 1} of hotels shown."},
                   {"role": "user", "content": user}])


def _goal_lines(cm: ContextManager, ct: ContextTypes) -> list[str]:
    """The goal section's lines as if no message were verbatim."""
    from types import SimpleNamespace  # noqa: PLC0415

    return ct.sections[1].lines(SimpleNamespace(history=cm.history, codes=[1] * len(cm.history)))


@pytest.mark.parametrize("head", ["default", None])
def test_the_goal_is_the_tasks_opening_request_not_a_navigation_request(head):
    """A trip statement that also names the family's tastes opens the task: it is the goal (with user as
    a secondary type), and the "Next page please." after every page of results is no goal (it was the
    goal line); a greeting before the request is no goal either, and a goal message restating the
    request becomes the goal."""
    ct = ContextTypes(head=head)
    cm = ContextManager(budget=900, scorer="rules", layers=[ct, FactLedger()])
    cm.extend([{"role": "system", "content": "You are a travel booking assistant."}, {"role": "user", "content": TRIP},
               {"role": "assistant", "content": "Sounds lovely! I'll search."}])
    _hotel_pages(cm, 12)
    assert ct.type_of("m1").type == ContextType.GOAL and ContextType.USER in ct.type_of("m1").also
    pages = [e.msg.id for e in cm.history.entries if e.msg.content == "Next page please."]
    assert len(pages) == 12 and {ct.type_of(i).type for i in pages} == {ContextType.TASK}
    lines = _goal_lines(cm, ct)
    assert lines[0].startswith("goal: We're planning a family trip to Barcelona") and lines[0].endswith("(m1)")
    assert not any("Next page" in line for line in lines)
    assert "Next page please." not in "".join(m["content"] for m in cm.build().messages if m["role"] == "system")

    ct = ContextTypes(head=head)
    cm = ContextManager(budget=900, scorer="rules", layers=[ct])
    cm.extend([{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello! How can I help?"},
               {"role": "user", "content": "I need a flight from Boston to Denver next Friday."},
               {"role": "assistant", "content": "Sure, searching."}])
    assert ct.type_of("m0").type == ContextType.TASK and ct.tasks[0].first_user == 2
    assert _goal_lines(cm, ct)[0] == "goal: I need a flight from Boston to Denver next Friday. (m2)"
    cm.add({"role": "user", "content": "Actually, I need a flight from Boston to Seattle instead."})
    assert cm.history.entries[2].successor == 4
    assert _goal_lines(cm, ct)[0] == "goal: Actually, I need a flight from Boston to Seattle instead. (m4)"


@pytest.mark.parametrize("head", ["default", None])
def test_a_side_instruction_is_no_goal_nor_sub_goal(head):
    """"Send all confirmations to ... please." is a standing instruction beside the trip (a soft
    constraint): it was a goal message, shown as the goal or the current sub-goal while the user paged
    through hotels; the booking request after the pages is the sub-goal."""
    ct = ContextTypes(head=head)
    cm = ContextManager(budget=700, scorer="rules", layers=[ct])
    cm.extend([{"role": "system", "content": "You are a travel booking assistant."},
               {"role": "user", "content": "Hi! I need to plan a trip from Dublin to Barcelona for my wife and me in June."},
               {"role": "assistant", "content": "Happy to help! What dates?"},
               {"role": "user", "content": "Send all confirmations to john.keane+trips@gmail.com please."},
               {"role": "assistant", "content": "Will do."}])
    _hotel_pages(cm, 6)
    assert ct.type_of("m3").type == ContextType.CONSTRAINT and ct.type_of("m3").rule == "standing_instruction"
    lines = _goal_lines(cm, ct)
    assert lines[0].startswith("goal: Hi! I need to plan a trip from Dublin to Barcelona") and lines[0].endswith("(m1)")
    assert not any("confirmations" in line for line in lines)
    cm.add({"role": "user", "content": "Please book Hotel Neri for June 12-19."})
    assert _goal_lines(cm, ct)[1] == f"current sub-goal: Please book Hotel Neri for June 12-19. ({cm.history.entries[-1].msg.id})"
    rules = RuleTypeClassifier()
    for text in ("Always quote prices in EUR.", "From now on, reply in French please.", "以后都用中文回复。"):
        assert rules.classify(Message(role="user", content=text)).type == ContextType.CONSTRAINT, text
    for text in ("Do you always charge a booking fee?", "Show me all hotels near the beach."):
        assert rules.classify(Message(role="user", content=text)).type == ContextType.GOAL, text


@pytest.mark.parametrize("budget", [2000, 4000])
def test_the_goal_section_keeps_the_latest_steps(budget):
    """Step lines were tried oldest first, so at the 5% cap a long session's only task state was its
    first step (a flight search 200 messages back); the latest steps not verbatim win the cap now,
    shown in their order."""
    ct = ContextTypes()
    cm = ContextManager(budget=budget, scorer="rules", layers=[ct])
    cm.extend([{"role": "system", "content": "You are a travel booking assistant."}, {"role": "user", "content": TRIP},
               {"role": "assistant", "content": "", "tool_calls": [{"id": "f0", "type": "function", "function": {
                   "name": "search_flights", "arguments": json.dumps({"to": "BCN"})}}]},
               {"role": "tool", "tool_call_id": "f0", "name": "search_flights", "content": '[{"flight": "IB3101", "price": 210}]'},
               {"role": "assistant", "content": "Found IB3101 at 210 EUR."}])
    _hotel_pages(cm, 50)
    w = cm.build()
    note = next(m["content"] for m in w.messages if m["role"] == "system" and m["content"].startswith(GoalSection.HEADER))
    shown = [line.rsplit("(", 1)[1].rstrip(")") for line in note.splitlines()[1:] if line.startswith("step: ")]
    tiers = {d.id: d.tier for d in w.decisions}
    hidden = [e.msg.id for e in cm.history.entries if e.msg.tool_calls and tiers[e.msg.id] != "verbatim"]
    assert shown and "search_flights" not in note and shown == hidden[-len(shown):], (shown, hidden)
    assert len(shown) >= budget // 2000  # two steps or more at 4,000 tokens, in their order
    assert next(s.tokens for s in w.sections if s.name == "goal") <= budget * 0.05


def test_a_one_off_request_on_all_the_items_is_a_goal_not_a_standing_instruction():
    """"all the X" / "all my X" name an existing set (a one-off request, a goal); a standing instruction
    needs a time-scope cue or "all"/"every" + the kind of item with no article (a stream of future
    items). The four requests below were typed constraint/standing_instruction."""
    rules = RuleTypeClassifier()
    for text in ("Can you summarize all the emails from yesterday?", "Please forward all the invoices to accounting.",
                 "Could you translate all the messages into English?", "Find me all the tickets under $300 for Friday.",
                 "Find me all tickets under $300 for Friday."):
        p = rules.classify(Message(role="user", content=text))
        assert (p.type, p.rule) == (ContextType.GOAL, "request"), text
    for text in ("Send all confirmations to john@x.com please.", "Send every receipt to my work address.",
                 "Whenever you find a flight, check the baggage fee.", "In future, quote prices in EUR.",
                 "每次都用人民币报价。"):
        p = rules.classify(Message(role="user", content=text))
        assert (p.type, p.rule) == (ContextType.CONSTRAINT, "standing_instruction"), text


# -- profile --------------------------------------------------------------------------------------
PHONE = [
    {"role": "user", "content": "I need a new phone under $800. Don't recommend Apple, I'm done with iOS for now."},
    {"role": "assistant", "content": "How about the Pixel 8 or the Galaxy S23?"},
    {"role": "user", "content": "Not the Galaxy, too big. And no Pixel, the battery is bad."},
    {"role": "assistant", "content": "Would you like the OnePlus 12 then?"},
    {"role": "user", "content": "Fine, I guess I'll take the OnePlus."},
    {"role": "user", "content": "My wife Anna is a doctor and she hates phone calls after 9pm."},
]


def test_profile_brand_scoped_to_task_compromise_and_people():
    p = _profile(SQLiteStore(":memory:"), "alice", "alice-1", PHONE, end=False)
    apple = p.items["preference:brand:-apple"]
    assert apple.polarity == -1 and apple.time_level == "current_task" and apple.scope.startswith("task 0")
    assert apple.source == "explicit_statement" and [e.message for e in apple.evidence] == ["m0"]
    decision = next(it for it in p.items.values() if it.profile_type == "decision")
    assert decision.compromise and "OnePlus" in decision.value
    assert not any(it.profile_type == "preference" and "oneplus" in it.value.lower() for it in p.items.values())
    anna = p.people["anna"]
    assert anna.relation == "wife" and anna.name == "Anna" and "doctor" in anna.notes[0]


def test_profile_chinese_brand_preference():
    p = _profile(SQLiteStore(":memory:"), "eve", "eve-1",
                 [{"role": "user", "content": "别给我推荐苹果，最近不想用iOS了，帮我挑个手机。"}], end=False)
    apple = p.items["preference:brand:-apple"]
    assert apple.time_level == "current_task"


@pytest.mark.parametrize(("first", "second"), [
    ("I always prefer a window seat on long flights.", "I prefer an aisle seat."),
    ("我一般喜欢靠窗的座位。", "我喜欢靠过道的座位。"),
])
def test_profile_conflict_needs_clarification(first, second):
    store = SQLiteStore(":memory:")
    _profile(store, "carol", "carol-1", [{"role": "user", "content": first}])
    p = _profile(store, "carol", "carol-2", [{"role": "user", "content": second}])
    flagged = [it for it in p.items.values() if it.status == "needs_clarification"]
    assert len(flagged) == 2  # both kept, neither overwritten
    old = next(it for it in flagged if it.evidence[0].session == "carol-1")
    assert old.conflict["evidence"][0]["text"] == first  # the old evidence was paged in


def test_profile_stability_and_promotion_across_sessions():
    store = SQLiteStore(":memory:")
    promos = []
    for k in range(3):
        p = ProfileLayer("fay", clock=lambda k=k: 1.7e9 + k * 20 * 86400)
        cm = ContextManager(budget=4000, scorer="rules", store=store, session_id=f"fay-{k}", layers=[p])
        cm.add({"role": "user", "content": "I always prefer a window seat."})
        promos += p.end_session()
    it = p.items["preference:seat:window seat"]
    assert it.occurrences == 3 and it.terms["occurrences"] == 1.0 and it.terms["duration"] == 1.0  # 40 days over the 30-day norm
    assert it.stability == pytest.approx(sum(it.terms.values()))
    assert [(x["from"], x["to"]) for x in promos] == [("session", "mid"), ("mid", "long")]
    assert it.time_level == "long"


def _profiled(*texts: str) -> ProfileLayer:
    """The profile layer of a rules session whose messages are ``texts``, user and assistant in turn."""
    p = ProfileLayer("wang")
    cm = ContextManager(budget=4000, scorer="rules", layers=[p])
    cm.extend([{"role": ("user", "assistant")[k % 2], "content": t} for k, t in enumerate(texts)])
    return p


@pytest.mark.parametrize(("said", "offer", "yes"), [
    ("I like window seats.", "G1 at 8:00, first class window seat, shall I book it?", "Yes"),
    ("我喜欢靠窗的座位。", "G1次 8:00 一等座靠窗，要预订吗？", "好的"),
])
def test_an_accepted_offer_naming_a_preference_confirms_it_in_either_language(said, offer, yes):
    # the Chinese offer names the window seat as 靠窗 and the item's value is "window seat": it was
    # never confirmed, so the preference said twice stayed lower than the English one
    p = _profiled(said, "OK.", said, offer, yes)
    it = p.items["preference:seat:window seat"]
    assert "confirmed" in [ev.kind for ev in it.evidence] and it.terms["confirmation"] == 1.0
    p.end_session()
    assert it.stability >= p.policy.mid  # but one conversation is not two sessions: it stays a session's
    assert it.time_level == "session"


@pytest.mark.parametrize(("said", "offer", "yes"), [
    ("我坐飞机喜欢靠窗的座位。", "靠窗的位置都满了，给您安排过道座位可以吗？", "好的"),
    ("I like window seats.", "Window seats are full, would an aisle seat do?", "OK"),
])
def test_accepting_another_value_confirms_no_preference(said, offer, yes):
    p = _profiled(said, offer, yes)
    assert "confirmed" not in [ev.kind for ev in p.items["preference:seat:window seat"].evidence]


def test_profile_never_visible_to_another_user():
    store = SQLiteStore(":memory:")
    _profile(store, "alice", "alice-1", PHONE)
    bob = _profile(store, "bob", "bob-1", [{"role": "user", "content": "Hi, I need a laptop."}])
    assert bob.items == {} or all("apple" not in k for k in bob.items)
    assert bob.people == {}
    cm = ContextManager(budget=4000, scorer="rules", store=store, session_id="bob-2",
                        layers=[ProfileLayer("bob", clock=lambda: 1.7e9)])
    cm.add({"role": "user", "content": "What do you know about me?"})
    blob = json.dumps(cm.build().messages, ensure_ascii=False)
    assert "Apple" not in blob and "Anna" not in blob and "OnePlus" not in blob
    again = _profile(store, "alice", "alice-2", [{"role": "user", "content": "Hello again."}], end=False)
    assert "anna" in again.people


# -- verifier and drift cases -----------------------------------------------------------------------
def test_drift_cases_precision_recall():
    from eval.drift import load_cases, run_case, score  # noqa: PLC0415

    cases = load_cases()
    assert {c.get("language") for c in cases} == {"en", "zh"}
    figures = score([run_case(c) for c in cases])
    assert figures["clean_cases"] >= 4 and not figures["clean_with_findings"]
    for lang in ("en", "zh"):
        assert figures["languages"][lang]["precision"] >= 0.9 and figures["languages"][lang]["recall"] >= 0.9


def test_verifier_on_real_session_has_typed_findings():
    from ctxscore.replay import replay_verify  # noqa: PLC0415

    s = _bundled("bundled/ecommerce-support-zh-01")
    builds, full, cm = replay_verify(s["messages"], 1500, scorer="rules")
    ids = {e.msg.id for e in cm.history.entries}
    found = [f for b in builds for f in b.findings] + full
    assert found
    for f in found:
        d = f.to_dict()
        assert d["kind"] and d["severity"] and d["action"]
        assert d["ids"] and set(d["ids"]) <= ids
    cm.close()


# -- event log ------------------------------------------------------------------------------------
@pytest.mark.parametrize("prefix", ["bundled/travel-booking-en-01", "bundled/ecommerce-support-zh-02",
                                    "bundled/coding-agent-en-01"])
def test_event_log_rebuild_equals_live_and_rollback(prefix):
    s = _bundled(prefix)
    store = SQLiteStore(":memory:")
    led, prof = FactLedger(), ProfileLayer("u1", clock=lambda: 1.7e9)
    log = EventLog(ledger=led, profile=prof, every=25)
    cm = ContextManager(budget=1500, scorer="rules", store=store, session_id="x", layers=[led, prof, log])
    for m in s["messages"]:
        cm.add(m)
        if m["role"] == "assistant":
            cm.build()
        assert rebuild(store, "x") == log.live_state()
    snaps = snapshots(store, "x")
    assert len(snaps) >= 2 and verify_chain(store, "x") == len(snaps)
    assert rebuild(store, "x", snapshot=None) == log.live_state()  # from the events alone
    mid = snaps[len(snaps) // 2]
    assert log.rollback(cm, mid.key).key == mid.key
    assert len(cm) == len(mid.state["messages"]) and log.live_state() == mid.state
    with pytest.raises(StoreError):
        log.rollback(cm, "no-such-snapshot")


# -- CLI ------------------------------------------------------------------------------------------
def test_cli_profile_and_verify(tmp_path, capsys):
    f = tmp_path / "phone.jsonl"
    f.write_text("\n".join(json.dumps(m) for m in PHONE), encoding="utf-8")
    assert cli_main(["profile", str(f), "--user", "alice"]) == 0
    out = capsys.readouterr().out
    assert "user alice" in out and "apple" in out and "compromise" in out and "person: Anna (wife)" in out
    assert cli_main(["profile", str(f), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data[0]["items"] and data[0]["people"][0]["relation"] == "wife"
    s = tmp_path / "s.jsonl"
    s.write_text(json.dumps(_bundled("bundled/ecommerce-support-zh-01"), ensure_ascii=False), encoding="utf-8")
    assert cli_main(["verify", str(s), "--budget", "1500", "--model", "rules"]) == 0
    out = capsys.readouterr().out
    assert "constraint_contradicted" in out and "full check" in out
    assert cli_main(["verify", str(s), "--budget", "1500", "--model", "rules", "--json"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert "check" in lines[-1] and all("findings" in x for x in lines[:-1])


@pytest.mark.parametrize("text", [
    # real user turns of the eval sessions that once gave wrong items
    "清楚了，吃完我最爱吃的，下一顿去跟着我爱人去吃他喜欢吃的，帮我们找个人均消费是50-100元的餐馆。",
    "好的呢，那这个餐馆的附近有可以溜达的景点吗，我同学特别热爱中国，更热爱中国的文化。",
    "能不能给我们换成靠窗的连座？",
    "I like the sound of that one.",
    "No, I don't want to reserve it just yet.",
    "and what I'm trying to accomplish with the command below.",
    # no allergy and no booking ruled out for good: a step of the task, a negation, someone else's
    "Never mind.", "I never got the email.", "不要紧。", "Don't book it yet.", "Don't book anything before Friday.",
    "先别订，我再想想。", "不要订太贵的。", "I'm not allergic to anything.", "I have no allergies.", "我不过敏。",
    "My son is allergic to peanuts.", "Is it safe if you're allergic to nuts?",
])
def test_profile_extraction_skips_non_statements(text):
    from ctxscore.memory.profile_extract import statements  # noqa: PLC0415

    assert not [s for s in statements(text) if s.profile_type in ("preference", "goal")]


@pytest.mark.parametrize(("text", "key"), [
    ("我们都喜欢吃辣的", ("preference", "food", "吃辣的", 1)),
    ("I'm vegetarian and I love Italian food.", ("preference", "diet", "vegetarian", 1)),
    ("不能超过三千元，不要靠窗的座位。", ("preference", "seat", "window seat", -1)),
    ("I'm allergic to peanuts, shellfish and eggs.", ("preference", "allergy", "egg", -1)),
    ("我对花生和虾过敏。", ("preference", "allergy", "虾", -1)),
    ("Please don't ever book the Hilton again.", ("preference", "general", "hilton", -1)),
])
def test_profile_extraction_keeps_statements(text, key):
    from ctxscore.memory.profile_extract import statements  # noqa: PLC0415

    assert key in [(s.profile_type, s.attribute, s.subject, s.polarity) for s in statements(text)]


def test_allergies_and_ruled_out_bookings_are_profile_items():
    """A severe peanut allergy, "Never book Ryanair for us" and 也不要订东方航空 gave no item, only the
    vegetarian diet, the aisle seat and 不吃辣 did (a new user's report): an allergy was read only as
    "allergic to", and an airline is no known attribute, so "never book" it was left as a bare prohibition."""
    p = _profiled("Never book Ryanair for us, I had a terrible experience with them last year.", "Understood.",
                  "I have a severe peanut allergy, so no peanuts in any meal.", "Noted.",
                  "I'm vegetarian.", "Noted.", "我不吃辣，也不要订东方航空。", "好的。")
    assert set(p.items) == {"preference:general:-ryanair", "preference:allergy:-peanut", "preference:diet:vegetarian",
                            "preference:food:-辣", "preference:general:-东方航空"}
    peanut = p.items["preference:allergy:-peanut"]
    assert peanut.describe() == "preference/allergy: avoid peanut" and peanut.scope == "general"
    assert p.items["preference:general:-ryanair"].scope == "general"  # "never": beyond this session


def test_context_type_weak_labels_and_rules_on_handmade_gold():
    pytest.importorskip("sklearn")
    from training.context_types import evaluate, load_handmade, weak_type  # noqa: PLC0415

    assert weak_type("", Message(role="system", content="Be brief."), (), False) == ("instruction", 0.95)
    assert weak_type("swe:observation", Message(role="user", content="<returncode>0</returncode>"), (), False)[0] == "tool"
    assert weak_type("sgd:user_intent", Message(role="user", content="Find me a cheap hotel."), (), True)[0] == "goal"
    assert weak_type("sgd:user_inform", Message(role="user", content="In San Jose."), (), False)[0] == "constraint"
    assert weak_type("sgd:system_offer", Message(role="assistant", content="How about Hotel Nia?"), (), False)[0] == "task"
    gold = load_handmade()
    assert {e["source"] for e in gold} == {"en", "zh"} and len({e["type"] for e in gold}) == 6
    rules = evaluate(None, gold)["rules"]
    assert rules["macro_f1"] >= 0.9 and set(rules["f1"]) == {e["type"] for e in gold}


# -- real corpus sessions (data/processed, built by `python -m training.data build`; skipped without it) ---
EVAL_SESSIONS = REPO / "data" / "processed" / "eval_sessions.jsonl"


def _eval_session(sid: str, most: int = 120) -> dict:
    if not EVAL_SESSIONS.is_file():
        pytest.skip(f"{EVAL_SESSIONS} not built (python -m training.data build)")
    for line in EVAL_SESSIONS.open(encoding="utf-8"):
        s = json.loads(line)
        if s["session_id"] == sid:
            return {**s, "messages": s["messages"][:most]}
    pytest.skip(f"{sid} not in {EVAL_SESSIONS}")


def _replay_events(messages: list[dict], rng, store: SQLiteStore, sid: str):
    led, prof = FactLedger(), ProfileLayer("u1", clock=lambda: 1.7e9)
    log = EventLog(ledger=led, profile=prof, every=rng.randint(5, 40))
    cm = ContextManager(budget=rng.choice([600, 1500, 4000]), scorer="rules", store=store, session_id=sid,
                        layers=[led, prof, log])
    for m in messages:
        cm.add(m)
        if rng.random() < 0.3:
            cm.build()
        if rng.random() < 0.05:
            log.checkpoint("manual")
        assert rebuild(store, sid) == log.live_state()
    return cm, log


@pytest.mark.parametrize(("sid", "seed"), [("bundled/it-ops-en-02", 1), ("bundled/data-analysis-zh-03", 2),
                                           ("test/tau_airline/000", 3), ("test/crosswoz/004", 4),
                                           ("test/swe_mini/001", 5)])
def test_event_log_property_random_builds_checkpoints_rollback(sid, seed):
    """Random build points, snapshot intervals and manual checkpoints: the rebuilt state equals the live
    one after every message; a rollback to a random snapshot restores its state, and replaying the
    detached messages afterwards gives a log that still rebuilds to the live state."""
    import random  # noqa: PLC0415

    rng = random.Random(seed)
    s = _bundled(sid) if sid.startswith("bundled/") else _eval_session(sid)
    store = SQLiteStore(":memory:")
    cm, log = _replay_events(s["messages"], rng, store, "p")
    snaps = snapshots(store, "p")
    assert snaps and verify_chain(store, "p") == len(snaps)
    snap = rng.choice(snaps)
    log.rollback(cm, snap.key)
    assert log.live_state() == snap.state and rebuild(store, "p") == snap.state
    for m in s["messages"][len(snap.state["messages"]):]:
        cm.add(m)
    assert rebuild(store, "p") == log.live_state() and len(cm) == len(s["messages"])


def test_profile_on_real_tau_session():
    s = _eval_session("test/tau_airline/000", most=10_000)
    from ctxscore.replay import replay_profile  # noqa: PLC0415

    rep = replay_profile("tau", [(s["session_id"], s["messages"])])
    people = {p.relation: p for p in rep.layer.people.values()}
    assert "friend" in people and people["friend"].name == "Ivan"
    assert rep.layer.items["relationship:friend:ivan"].time_level == "session"  # in two tasks of the session
    assert not any(pr["to"] in ("mid", "long") for pr in rep.promotions)  # one session makes nothing stable
    assert all(it.evidence and it.evidence[0].session == s["session_id"] for it in rep.layer.items.values())


def test_packaged_context_type_head_blends_no_worse_than_rules():
    pytest.importorskip("sklearn")
    from ctxscore.memory.context_types import DEFAULT_HEAD_DIR, load_default_head  # noqa: PLC0415
    from training.context_types import evaluate, load_handmade  # noqa: PLC0415

    head = load_default_head()
    if head is None:
        pytest.skip(f"no packaged head in {DEFAULT_HEAD_DIR}")
    w = head.config["weight"]
    assert 0 < w <= 0.5 and ContextTypes().head_weight == w
    assert (DEFAULT_HEAD_DIR / "head.skops").stat().st_size < 200_000
    fig = evaluate(head, load_handmade(), w)
    assert fig["blend"]["macro_f1"] >= fig["rules"]["macro_f1"]
    s = _bundled("bundled/coding-agent-zh-01")
    ct = ContextTypes()
    cm = ContextManager(budget=1500, scorer="rules", layers=[ct])
    for m in s["messages"]:
        cm.add(m)
    for e in cm.history.entries:
        if str(e.msg.role) in ("system", "tool"):
            assert ct.type_of(e.msg.id).type == (ContextType.INSTRUCTION if str(e.msg.role) == "system" else ContextType.TOOL)


def test_heldout_drift_cases_no_false_alarms():
    """The held-out cases (README): recall is reported, not asserted; a clean case gives no finding."""
    from eval.drift import REPO as DRIFT_REPO  # noqa: PLC0415
    from eval.drift import load_cases, run_case, score

    figures = score([run_case(c) for c in load_cases(DRIFT_REPO / "data" / "drift" / "heldout")])
    assert figures["cases"] == 20 and figures["clean_cases"] == 4 and not figures["clean_with_findings"]
    assert figures["overall"]["precision"] >= 0.9 and figures["overall"]["recall"] >= 0.3


def test_verifier_rule_readings():
    from ctxscore.verify import constraints as cons  # noqa: PLC0415
    from ctxscore.verify.analysis import tool_ok  # noqa: PLC0415

    assert cons.parse("Please don't suggest anything with peanuts, my son is allergic.", "m1")[0].terms == ("peanut",)
    assert cons.parse("千万别推荐带花生的菜，我儿子花生过敏。", "m1")[0].terms == ("花生",)
    r = cons.parse("Keep it under $300 a night.", "m1")[0]
    assert (r.kind, r.bound, r.per) == ("max", 300.0, "per night")
    assert not tool_ok(Message(role="tool", content="Job for nginx.service failed because the control process exited."))
    assert tool_ok(Message(role="tool", content='{"status": "ok", "restarted": true}'))
    assert tool_ok(Message(role="tool", content="<returncode>0</returncode>\n<output>\n8 passed, 0 failed\n</output>"))


def _verified(*turns: tuple[str, str]):
    """``(manager, verifier)`` of a rules session holding ``turns`` (role, content) and a ContextVerifier."""
    from ctxscore.verify import ContextVerifier  # noqa: PLC0415

    ver = ContextVerifier()
    cm = ContextManager(budget=4000, scorer="rules", layers=[ver])
    cm.extend([{"role": role, "content": text} for role, text in turns])
    return cm, ver


@pytest.mark.parametrize("change", ["Actually, change the hotel budget to €240 per night, I want something nicer.",
                                    "Actually, make it €240."])
def test_a_bound_the_user_raised_no_longer_holds_the_agent(change):
    # the ledger showed "hotel budget: €240 (m3; was €210)", yet every build warned that the €240
    # offer broke the €210 budget and asked to re-pin it
    cm, ver = _verified(("system", "You are a travel booking assistant."),
                        ("user", "Find me a hotel in Lisbon, my hotel budget is €210 per night."),
                        ("assistant", "Hotel Lumen is €205 per night. Shall I hold it?"), ("user", change),
                        ("assistant", "With €240 per night, Memmo Príncipe Real (€238) is the best option. Shall I hold it?"))
    assert cm.build().findings == [] and ver.check(cm) == []
    cm.add({"role": "assistant", "content": "Or the Bairro Alto Hotel at €265 per night. Shall I hold it?"})
    found = [f for f in ver.check(cm) if f.kind == "constraint_contradicted"]
    assert found and "above the bound 240" in str(found[0])  # the raised budget holds instead


@pytest.mark.parametrize(("rule", "offer"), [
    ("不要吸烟房。", "为您找到一间无烟房，吸烟区在一楼大堂外，每晚680元，要预订吗？"),  # 吸烟 and 房 in two clauses
    ("不要吸烟房。", "为您推荐一间非吸烟房，每晚680元，要预订吗？"),  # the negation of the term
    ("千万不要订无窗房。", "这间大床房有窗，无窗的已经订满了，每晚650元，要预订吗？"),
])
def test_chinese_offers_that_keep_a_constraint_are_not_flagged(rule, offer):
    cm, ver = _verified(("user", "帮我在上海订一家酒店。" + rule), ("assistant", offer))
    assert [f.kind for f in ver.check(cm) if f.kind == "constraint_contradicted"] == []


def test_a_correction_replaces_only_the_bound_it_restates():
    # the first version replaced every earlier bound of the kind ("$60 for the dinner" by "$500 for the
    # flight") and moved every corrected number's bound to the new one (the tour's $100 became $240)
    def broken(*turns: tuple[str, str]) -> list[str]:
        cm, ver = _verified(*turns)
        return [f.details["why"] for f in ver.check(cm) if f.kind == "constraint_contradicted"]

    assert broken(("user", "Book dinner in New York, no more than $60 for the dinner."), ("assistant", "Sure."),
                  ("user", "Yes. Also find me a flight to Boston, at most $500 for the flight."),
                  ("assistant", "I'll book the dinner at Le Bernardin for $180 now.")) == ["$180 is above the bound 60"]
    assert broken(("user", "My hotel budget is at most $210 per night."), ("assistant", "OK."),
                  ("user", "The tour must cost no more than $100 per night too."), ("assistant", "OK."),
                  ("user", "Actually, make the hotel $240."),
                  ("assistant", "I'll book the night tour for $230 per night.")) == ["$230 is above the bound 100"]


@pytest.mark.parametrize(("rule", "offer"), [
    ("预算每晚不超过800元。", "为您推荐外滩茂悦大酒店，980元/晚，要帮您预订吗？"),  # 元/晚: the usual way to write it
    ("预算每晚不超过800元。", "为您推荐外滩茂悦大酒店，价格：980元/晚，要帮您预订吗？"),
    ("千万不要订无窗房。", "为您推荐浦江之星的无窗大床房，650元一晚，要预订吗？"),  # the room type's usual name
    ("千万不要订无窗房。", "浦江之星还有一间大床房（无窗），650元一晚，要预订吗？"),
])
def test_chinese_offers_against_a_constraint_are_found(rule, offer):
    # each gave no finding: 980元/晚 was read as a path, /晚 as no unit, 无窗大床房 did not name 无窗房,
    # and 要预订吗 / 还有一间 were no offer
    cm, ver = _verified(("user", "帮我在上海订一家酒店。" + rule), ("assistant", offer))
    assert [f.kind for f in ver.check(cm)] == ["constraint_contradicted"]


def test_profile_choices_among_offers_do_not_conflict():
    store = SQLiteStore(":memory:")
    for k, cabin in enumerate(("economy class", "business class")):
        p = _profile(store, "gil", f"gil-{k}", [
            {"role": "user", "content": "I need a flight from Denver to Austin next Monday."},
            {"role": "assistant", "content": f"SK{k}12 has a seat in {cabin} for $300. Shall I book it?"},
            {"role": "user", "content": "Yes, book it."}])
    cabins = [it for it in p.items.values() if it.attribute == "cabin"]
    assert cabins and all(it.source == "behaviour" and it.status == "active" for it in cabins)


def test_ledger_chinese_change_verb_supersedes():
    led = FactLedger()
    cm = ContextManager(budget=4000, scorer="rules", layers=[led])
    for m in ({"role": "user", "content": "帮我订明天晚上6点莲花餐厅四个人的位子。"}, {"role": "assistant", "content": "好的"},
              {"role": "user", "content": "时间改成晚上8点吧，我们会晚到。"}):
        cm.add(m)
    assert led.current[(0, "time")].value == "晚上8点" and led.was[(0, "time")] == ["晚上6点"]
    assert "时间: 晚上8点 (m2; was 晚上6点)" in led.lines()


def test_ledger_links_a_slot_across_languages():
    # before: "flight: May 20" stayed current beside "航班: 5月22日", and the assistant's echo of the
    # new date made it an offer (not shown); "出发时间是" was a slot name, "noted flight" another
    led = FactLedger()
    cm = ContextManager(budget=4000, scorer="rules", layers=[led])
    for role, text in [("user", "My flight is on May 20 and the hotel budget is $200 per night."),
                       ("assistant", "Noted: flight on May 20, hotel budget $200."),
                       ("user", "航班改到5月22日，酒店预算改成300美元。"),
                       ("assistant", "好的，航班改到5月22日。"),
                       ("user", "出发时间是早上8点。"),
                       ("user", "Actually the departure time is 9 am.")]:
        cm.add({"role": role, "content": text})
    assert led.lines() == ["航班: 5月22日 (m2; was May 20)", "酒店预算: 300美元 (m2; was $200)",
                           "departure time: 9 am (m5; was 早上8点)"]


def test_a_layer_serves_one_session_at_a_time():
    """One ledger given to two managers moved to the second session: the first user's window then
    showed the second user's facts (a new user's report, through ContextMiddleware(layers=...))."""
    ledger = FactLedger()
    alice = ContextManager(budget=2000, scorer="rules", session_id="alice", layers=[ledger])
    alice.add({"role": "user", "content": "My booking reference number is ALC42QZ."})
    with pytest.raises(ConfigError, match="already serves session 'alice'"):
        ContextManager(budget=2000, scorer="rules", session_id="bob", layers=[ledger])
    assert any("ALC42QZ" in line for line in ledger.lines())  # alice's ledger is untouched
    alice.close()  # a closed manager hands its layers over
    bob = ContextManager(budget=2000, scorer="rules", session_id="bob", layers=[ledger])
    bob.add({"role": "user", "content": "My booking reference number is BOB77XQ."})
    assert any("BOB77XQ" in line for line in ledger.lines()) and not any("ALC42QZ" in line for line in ledger.lines())
    alice.close()  # closing the old manager again frees nothing that bob holds now
    with pytest.raises(ConfigError, match="already serves session 'bob'"):
        ContextManager(budget=2000, scorer="rules", session_id="carol", layers=[ledger])


@pytest.mark.parametrize(("layers", "match"), [
    ("ledger", "must be a list of layers"),
    ([FactLedger], "is the class FactLedger, not a layer: pass an instance"),
    ([object()], r"\(object\) is not a layer: it has no sections"),
])
def test_layers_that_are_not_layers_are_a_clear_error(layers, match):
    with pytest.raises(ConfigError, match=match):
        ContextManager(budget=2000, scorer="rules", layers=layers)
    ledger = FactLedger()
    with pytest.raises(ConfigError, match="given twice"):
        ContextManager(budget=2000, scorer="rules", layers=[ledger, ledger])


def test_a_verifier_outside_any_manager_says_so():
    from ctxscore.verify import ContextVerifier

    with pytest.raises(ConfigError, match="no layer of a ContextManager"):
        ContextVerifier().check()


@pytest.mark.parametrize(("first", "then", "call"), [
    ("I need a hotel in Cambridge from Tuesday for 3 nights.", "Sorry, I meant Wednesday, not Tuesday.", "Tuesday"),
    ("帮我订周二晚上7点的餐厅，4个人。", "不对，是周三不是周二。", "周二"),
])
def test_a_booking_on_the_day_the_user_corrected_away_is_goal_drift(first, then, call):
    """The denied day was read as one more day the user gave, and weekdays were never checked
    (a new user's report); the corrected day itself is no finding."""
    from ctxscore.verify import ContextVerifier

    for day, drift in ((call, True), ("Wednesday" if call == "Tuesday" else "周三", False)):
        cm = ContextManager(budget=3000, scorer="rules", layers=[ContextVerifier()])
        cm.extend([{"role": "user", "content": first}, {"role": "user", "content": then},
                   {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
                       "name": "book", "arguments": json.dumps({"day": day}, ensure_ascii=False)}}]},
                   {"role": "tool", "tool_call_id": "c1", "content": '{"ok": true}'}])
        found = [f for f in cm.build().findings if f.kind == "goal_drift"]
        assert bool(found) == drift, day
        assert all("rel:" not in f.message for f in found)  # the user's days as they said them


@pytest.mark.parametrize(("first", "change"), [
    ("Book me a hotel in Chengdu, check in June 12, check out June 16.", "Actually change the check-in to June 14."),
    ("帮我订成都的酒店，6月12日入住，住到6月16日。", "入住日期改成6月14日，我们先在重庆玩两天。"),
])
def test_a_corrected_check_in_leaves_the_check_out_the_user_still_holds(first, change):
    """The new check-in replaced every date the user had given: booking June 14 to June 16 after
    "change the check-in to June 14" was goal drift on the check-out, "a value the user corrected
    since" (a new user's report); the June 12 the user replaced still is."""
    from ctxscore.verify import ContextVerifier

    for checkin, drift in (("2025-06-14", []), ("2025-06-12", ["06-12"])):
        cm = ContextManager(budget=4000, scorer="rules", layers=[ContextVerifier()])
        cm.extend([{"role": "user", "content": first}, {"role": "assistant", "content": "OK."},
                   {"role": "user", "content": change}, {"role": "assistant", "content": "Done."},
                   {"role": "user", "content": "Yes, please confirm the booking."},
                   {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
                       "name": "book_hotel", "arguments": json.dumps({"checkin": checkin, "checkout": "2025-06-16"})}}]},
                   {"role": "tool", "tool_call_id": "c1", "content": '{"ok": true}'}])
        found = [f.details["norm"] for f in cm.build().findings if f.kind == "goal_drift"]
        assert found == drift, checkin


@pytest.mark.parametrize("change", ["不对，预算改成每晚700元以内。", "其实预算可以提高到每晚700元。", "改一下，每晚不超过700元。"])
def test_a_chinese_budget_the_user_raised_no_longer_holds_the_agent(change):
    """Three of four phrasings of a raised bound left the agent held to the old one: a 680元 offer was
    'above the bound 500' (a new user's report); without the change it still is."""
    from ctxscore.verify import ContextVerifier

    for said, flagged in ((change, False), ("好的，谢谢。", True)):
        cm = ContextManager(budget=3000, scorer="rules", layers=[ContextVerifier()])
        cm.extend([{"role": "user", "content": "帮我找杭州的酒店，每晚不超过500元。"}, {"role": "assistant", "content": "好的。"},
                   {"role": "user", "content": said}, {"role": "assistant", "content": "为您找到西湖酒店，每晚680元，要预订吗？"}])
        assert any(f.kind == "constraint_contradicted" for f in cm.build().findings) == flagged, said


def test_what_an_acting_message_books_is_checked_against_the_users_bounds():
    """"Hotel Roma has a room for $420 a night with a shared bathroom. I'll book it now." with the
    booking call: only the missing confirmation was found, not the $420 against "under $300 a night"
    nor the shared bathroom the user ruled out (a new user's report); as a plain offer both were."""
    from ctxscore.verify import ContextVerifier

    cm = ContextManager(budget=3000, scorer="rules", layers=[ContextVerifier()])
    cm.extend([
        {"role": "system", "content": "You are a travel agent. Never book without explicit user confirmation."},
        {"role": "user", "content": "Find me a hotel in Rome under $300 a night. Don't book anything with shared bathrooms."},
        {"role": "assistant", "content": "Hotel Roma has a room for $420 a night with a shared bathroom. I'll book it now.",
         "tool_calls": [{"id": "b1", "type": "function",
                         "function": {"name": "book_hotel", "arguments": '{"hotel": "Hotel Roma", "price": 420}'}}]}])
    found = [f.message for f in cm.build().findings if f.kind == "constraint_contradicted"]
    assert any("$420 is above the bound 300" in m for m in found), found
    assert any("'shared'" in m for m in found), found
    assert any("no user confirmation" in m for m in found), found


def test_one_conversation_does_not_make_a_stable_preference():
    """A window seat said, confirmed and said again in one conversation went to mid at its end, and to
    long at the end of the next session, which never mentioned it (a new user's report)."""
    store = SQLiteStore(":memory:")
    levels = []
    for sid, turns in (("s1", ["I prefer a window seat.", "Shall I book you a window seat on flight UA12 at 9am?",
                               "Yes please.", "Done.", "And on the return I prefer a window seat too."]),
                       ("s2", ["What's the weather in York?", "Sunny."])):
        p = ProfileLayer("carl")
        cm = ContextManager(budget=4000, scorer="rules", store=store, session_id=sid, layers=[p])
        cm.extend([{"role": ("user", "assistant")[k % 2], "content": t} for k, t in enumerate(turns)])
        p.end_session()
        it = p.items["preference:seat:window seat"]
        levels.append(it.time_level)
    assert levels == ["session", "session"] and it.terms["cross_scene"] == 0.0  # "return" made it look like shopping


@pytest.mark.parametrize("make", [lambda: FactLedger(share="0.1"), lambda: ProfileLayer("u", share=None),
                                  lambda: ContextTypes(share=float("nan")), lambda: FactLedger(share=True)])
def test_a_share_that_is_not_a_fraction_is_a_clear_error(make):
    with pytest.raises(ConfigError, match=r"share must be a number in \(0, 1\]"):
        make()


@pytest.mark.parametrize(("user_id", "match"), [
    ("u" * 600, "ProfileLayer user_id has 600 characters; at most 507 are allowed"),
    ("u" * 508, "ProfileLayer user_id has 508 characters; at most 507"),
    ("a\x00b", r"ProfileLayer user_id 'a\\x00b' holds a NUL character"),
])
def test_a_user_id_no_store_can_keep_is_refused_naming_user_id(user_id, match):
    """They were taken, and ContextManager(layers=[...]) then said "scope has 605 characters" or
    "scope 'user:a\\x00b' holds a NUL character", naming no user_id."""
    with pytest.raises(ConfigError, match=match):
        ProfileLayer(user_id)
    ContextManager(budget=2000, scorer="rules", layers=[ProfileLayer("u" * 507)]).close()


@pytest.mark.parametrize(("user", "call", "args", "flagged"), [
    ("Find me a hotel in Paris for June 1-3, under €200 a night.", "book_hotel", {"hotel": "Ritz", "price_per_night": "€450"}, True),
    ("Find me a hotel in Paris for June 1-3, under €200 a night.", "book_hotel", {"hotel": "Ritz", "nightly_rate": 450}, True),
    ("Find me a hotel in Paris for June 1-3, under €200 a night.", "book_hotel", {"hotel": "Lumiere", "price_per_night": "€150"}, False),
    ("Find me a hotel in Paris. No smoking rooms, and never book the Ritz.", "book_hotel", {"hotel": "Ritz"}, True),
    ("Find me a hotel in Paris under €200 a night. Never book the Ritz.", "search_hotels",
     {"city": "Paris", "max_price": "€450", "name": "Ritz"}, False),  # a search books nothing
])
def test_what_a_call_books_is_checked_against_the_users_rules(user, call, args, flagged):
    """A new user's reports: a booking call's nightly price above the bound and a prohibition in a
    sentence's second clause gave no finding; a search naming the prohibited hotel gave one."""
    from ctxscore.verify import ContextVerifier

    cm = ContextManager(budget=4000, scorer="rules", layers=[ContextVerifier()])
    cm.extend([{"role": "system", "content": "You are a hotel booking agent."}, {"role": "user", "content": user},
               {"role": "assistant", "content": "", "tool_calls": [{"id": "c2", "type": "function", "function": {
                   "name": call, "arguments": json.dumps(args)}}]}])
    assert any(f.kind == "constraint_contradicted" for f in cm.build().findings) == flagged
