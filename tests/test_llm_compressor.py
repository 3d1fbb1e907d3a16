"""The LLM compressor against a fake OpenAI-compatible server: the compressor rules in the prompt,
batches every N turns (immediate / deferred), build never waiting, verified forms, and the
extractive fallback for rejected, malformed and failed answers."""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("openai")

from fake_openai import FakeOpenAI  # noqa: E402

from ctxscore import ContextManager, Tier  # noqa: E402
from ctxscore.compress import ExtractiveCompressor, key_spans  # noqa: E402
from ctxscore.compress.verify import negation_spans, verify  # noqa: E402
from ctxscore.errors import ConfigError  # noqa: E402
from ctxscore.llm import LLMClient, LLMCompressor, meaning_problems  # noqa: E402
from ctxscore.llm.prompts import COMPRESSOR_RULES  # noqa: E402

FACT = ("The order ORD-{n} shipped on May {d} and costs ${p}.50. The courier is DHL and the parcel weighs {d}.5 kg, "
        "so it will arrive on Friday. Thanks for waiting so patiently, we really appreciate it!")
THINK = ("Let me think about the options for parcel {n}. I could check the depot in Leeds first, then the hub in "
         "York; the depot has a backlog of 300 parcels so the hub is more likely. I will check the hub.")


def facts(text: str) -> str:
    """What a faithful LLM writes: every entity and negation, the hedge kept, as one key: value line."""
    hedge = " (more likely)" if "more likely" in text else ""
    return "facts: " + "; ".join(key_spans(text) + negation_spans(text)) + hedge


def answering(form_fn):
    """A responder that answers the compressor's batch: one form per item, made by ``form_fn(text)``."""

    def responder(body):
        items = json.loads(body["messages"][-1]["content"])["items"]
        return json.dumps({"items": [{"id": it["id"], "form": form_fn(it["text"])} for it in items]})

    return responder


@pytest.fixture
def fake():
    with FakeOpenAI(answering(facts)) as f:
        yield f


def make(fake: FakeOpenAI, **kw) -> LLMCompressor:
    kw.setdefault("miss_delay", 0.05)
    client = LLMClient(base_url=fake.url, model="fake-model", backoff=0.01, timeout=5.0, max_retries=kw.pop("retries", 2))
    return LLMCompressor(client, **kw)


def turn(cm: ContextManager, i: int) -> None:
    """One agent turn: the user asks, the agent reasons and calls a tool, the tool answers, the agent replies."""
    cm.add({"role": "user", "content": f"Any news on parcel {i}?"})
    cm.add({"role": "assistant", "content": THINK.format(n=i), "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": "track", "arguments": f'{{"parcel": {i}}}'}}]})
    cm.add({"role": "tool", "tool_call_id": f"c{i}", "content": FACT.format(n=1000 + i, d=i + 1, p=40 + i)})
    cm.add({"role": "assistant", "content": f"Parcel {i} arrives on Friday."})


def test_the_prompt_carries_the_compressor_rules(fake):
    comp = make(fake)
    comp.submit([(FACT.format(n=1, d=2, p=3), Tier.STRUCTURED, "assistant")])
    assert comp.wait(10)
    system = fake.chat_requests()[0]["messages"][0]["content"]
    for rule in ("Delete politeness, transitions, verbal fillers, repeated explanations and emotional talk",
                 "user confirmations, user denials, numbers, times, decisions, reasons, risks, missing information "
                 "and evidence sources", "key: value pairs are fine", "Never change the meaning",
                 "Never turn uncertain information into a certain fact", "Never turn a suggestion into an executed decision",
                 "Never turn an assistant's guess into a fact the user confirmed",
                 "Keep hard constraints and the user's denials explicitly",
                 "你是 Agent 上下文压缩器", "硬约束和用户否认内容必须显式保留"):
        assert rule in system, rule
    assert system.startswith(COMPRESSOR_RULES)
    item = json.loads(fake.chat_requests()[0]["messages"][1]["content"])["items"][0]
    assert item == {"id": "0", "role": "assistant", "tier": "structured", "text": FACT.format(n=1, d=2, p=3)}


def test_verified_llm_forms_reach_the_window(fake):
    comp = make(fake, every=2)
    cm = ContextManager(budget=600, scorer="rules", compressor=comp, layers=[comp.layer()])
    tiers_seen = set()
    for i in range(8):
        turn(cm, i)
        assert comp.wait(10)
        w = cm.build()  # the agent's next call
        assert w.tokens <= 600
        shown = [m["content"] for m in w.messages]
        for d in w.decisions:
            if d.tier in (Tier.STRUCTURED, Tier.COMPRESSED) and len(cm.messages[d.turn].content) >= comp.min_chars:
                tiers_seen.add(d.tier)
                assert facts(cm.messages[d.turn].content) in shown  # the LLM's form, not the extractive one
    assert tiers_seen == {Tier.STRUCTURED, Tier.COMPRESSED}
    assert comp.stats["accepted"] == comp.stats["items"] > 0 and comp.stats["rejected"] == 0


def test_build_never_waits_on_the_network(fake):
    def slow(body):
        time.sleep(1.5)
        return answering(facts)(body)

    fake.responder = slow
    comp = make(fake, every=1)
    cm = ContextManager(budget=700, scorer="rules", compressor=comp, layers=[comp.layer()])
    for i in range(4):
        turn(cm, i)
    t0 = time.perf_counter()
    w = cm.build()
    took = time.perf_counter() - t0
    assert took < 0.5, took  # the batches are still in flight: pending forms are shown verbatim (or archived)
    assert not any(m["content"].startswith("facts: ") for m in w.messages)
    assert w.tokens <= 700
    assert comp.wait(20)
    for i in range(4, 6):
        turn(cm, i)
    w2 = cm.build()
    assert sum(m["content"].startswith("facts: ") for m in w2.messages) >= 2  # ready ahead of need this time
    assert w2.tokens <= 700


@pytest.mark.parametrize("bad, why", [
    (lambda t: facts(t).replace("ORD-1007", "ORD-100"), "missing"),                  # an entity dropped
    (lambda t: facts(t) + "; refund RF-77812 issued", "invented"),                  # an entity invented
    (lambda t: "facts: courier DHL; not insured; " + "; ".join(key_spans(t)), "invented"),  # a negation invented
])
def test_a_form_that_drops_or_invents_is_rejected_for_the_extractive_one(fake, bad, why):
    fake.responder = answering(bad)
    comp = make(fake)
    text = FACT.format(n=1007, d=8, p=47)
    comp.submit([(text, Tier.STRUCTURED, "assistant")])
    assert comp.wait(10)
    assert comp.compress(text, Tier.STRUCTURED) == ExtractiveCompressor().compress(text, Tier.STRUCTURED)
    assert comp.stats["rejected"] == 1 and comp.stats["accepted"] == 0
    rej = comp.rejections[-1]
    assert rej[why], rej
    if why == "missing":
        assert "ORD-1007" in rej["missing"]
    else:
        assert rej["invented"] in (["RF-77812"], ["not insured"])


@pytest.mark.parametrize("text, bad, good, lost", [
    ("The refund of $5 was issued on May 2, and the fee of $50 stays as it is; order ORD-1007 is closed now.",
     "refund: $50, May 2; fee: $50 stays; ORD-1007 closed", "refund: $5, May 2; fee: $50 stays; ORD-1007 closed", "$5"),
    ("I leave on May 2 and come back on May 20; the fare is $120 and we check in 12 bags in total, thanks.",
     "leave: May 20; back: May 20; fare: $120; 12 bags", "leave: May 2; back: May 20; fare: $120; 12 bags", "May 2"),
    ("Call me at 10:1 or at 10:15 tomorrow, whichever suits the courier DHL better, and thanks for the help.",
     "call: 10:15 or 10:15 tomorrow; courier DHL", "call: 10:1 or 10:15 tomorrow; courier DHL", "10:1"),
])
def test_a_form_that_turns_a_value_into_a_longer_one_of_the_original_is_rejected(fake, text, bad, good, lost):
    # "$5" -> "$50", "May 2" -> "May 20": the longer value is in the original too, and the shorter one
    # is a substring of it; the form lost a value and is not shown (the faithful form is)
    assert verify(text, good).ok and not verify(text, bad).ok
    fake.responder = answering(lambda t: bad)
    comp = make(fake)
    comp.submit([(text, Tier.STRUCTURED, "assistant")])
    assert comp.wait(10)
    assert comp.stats["rejected"] == 1 and comp.stats["accepted"] == 0
    assert lost in comp.rejections[-1]["missing"]
    assert comp.compress(text, Tier.STRUCTURED) != bad


def test_negations_hedges_and_certainty_are_checked(fake):
    text = ("The hotel is not refundable and the guest does not want a late checkout. Maybe the spa reopens on "
            "June 3; shall I book the 7pm table at Nopa for 2?")
    good = "hotel: not refundable; guest: does not want late checkout; spa: maybe reopens June 3; suggest: book 7pm table Nopa for 2?"
    dropped_negation = "hotel: refundable; guest: does not want late checkout; spa: maybe reopens June 3; 7pm table Nopa, 2"
    dropped_hedge = "hotel: not refundable; guest: does not want late checkout; spa reopens June 3; 7pm table Nopa, 2"
    made_decision = "hotel: not refundable; guest: does not want late checkout; spa: maybe June 3; booked 7pm table Nopa for 2"
    forms = {good: "ok", dropped_negation: "not refundable", dropped_hedge: "uncertainty dropped",
             made_decision: "certainty invented"}
    for form, expect in forms.items():
        fake.responder = answering(lambda t, f=form: f)
        comp = make(fake)
        comp.submit([(text, Tier.STRUCTURED, "assistant")])
        assert comp.wait(10)
        got = comp.compress(text, Tier.STRUCTURED)
        if expect == "ok":
            assert got == good and comp.stats["accepted"] == 1
        else:
            assert got != form and comp.stats["rejected"] == 1
            rej = comp.rejections[-1]
            assert expect in json.dumps(rej), (expect, rej)
    assert meaning_problems("It might rain.", "rain") and not meaning_problems("It might rain.", "rain: might")


def test_malformed_answers_and_missing_items_fall_back(fake):
    a, b = FACT.format(n=1, d=1, p=1), FACT.format(n=2, d=2, p=2)
    fake.push({"reply": "Sure! Here are the summaries: facts, facts"})  # not JSON
    comp = make(fake)
    comp.submit([(a, Tier.STRUCTURED, "assistant"), (b, Tier.STRUCTURED, "assistant")])
    assert comp.wait(10)
    ext = ExtractiveCompressor()
    assert comp.compress(a, Tier.STRUCTURED) == ext.compress(a, Tier.STRUCTURED)
    assert comp.stats["malformed"] == 2
    c, d = FACT.format(n=3, d=3, p=3), FACT.format(n=4, d=4, p=4)
    fake.push({"reply": json.dumps({"items": [{"id": "0", "form": facts(c)}]})})  # item 1 missing
    comp.submit([(c, Tier.STRUCTURED, "assistant"), (d, Tier.STRUCTURED, "assistant")])
    assert comp.wait(10)
    assert comp.compress(c, Tier.STRUCTURED) == facts(c)
    assert comp.compress(d, Tier.STRUCTURED) == ext.compress(d, Tier.STRUCTURED)
    assert comp.stats["malformed"] == 3 and comp.stats["accepted"] == 1


def test_server_errors_are_retried_and_a_dead_endpoint_falls_back(fake):
    a, b = FACT.format(n=5, d=5, p=5), FACT.format(n=6, d=6, p=6)
    fake.push({"status": 500}, {"status": 429})
    comp = make(fake, retries=2)
    comp.submit([(a, Tier.STRUCTURED, "assistant")])
    assert comp.wait(10)
    assert comp.compress(a, Tier.STRUCTURED) == facts(a)  # accepted after two retries
    fake.push({"status": 500}, {"status": 500}, {"status": 500})
    comp.submit([(b, Tier.STRUCTURED, "assistant")])
    assert comp.wait(10)
    assert comp.compress(b, Tier.STRUCTURED) == ExtractiveCompressor().compress(b, Tier.STRUCTURED)
    assert comp.stats["failed"] == 1 and comp.client.usage.retries == 4


def test_a_timed_out_batch_falls_back():
    with FakeOpenAI(answering(facts)) as f:
        f.push({"delay": 1.0}, {"delay": 1.0})
        client = LLMClient(base_url=f.url, model="m", timeout=0.3, max_retries=1, backoff=0.01)
        comp = LLMCompressor(client)
        text = FACT.format(n=9, d=9, p=9)
        comp.submit([(text, Tier.STRUCTURED, "assistant")])
        assert comp.wait(10)
        assert comp.compress(text, Tier.STRUCTURED) == ExtractiveCompressor().compress(text, Tier.STRUCTURED)
        assert comp.stats["failed"] == 1


def _requests_after_each_message(timing: str) -> list[tuple[str, int, int]]:
    with FakeOpenAI(answering(facts)) as f:
        comp = make(f, every=2, timing=timing)
        cm = ContextManager(budget=100_000, scorer="rules", compressor=comp, layers=[comp.layer()])
        seen = []
        for i in range(1, 6):  # turns 1..5
            for m in ({"role": "user", "content": f"Any news on parcel {i}?"},
                      {"role": "assistant", "content": FACT.format(n=1000 + i, d=i, p=i)}):
                cm.add(m)
                assert comp.wait(10)
                seen.append((m["role"], i, len(f.chat_requests())))
        return seen


def test_batches_every_n_turns_immediate_and_deferred():
    # every=2: immediate sends at the end of turns 2 and 4 (their final answers) ...
    immediate = _requests_after_each_message("immediate")
    assert [(r, t) for (r, t, n), (_, _, before) in zip(immediate, [("", 0, 0), *immediate], strict=False)
            if n > before] == [("assistant", 2), ("assistant", 4)]
    # ... deferred when turns 3 and 5 begin (their user messages)
    deferred = _requests_after_each_message("deferred")
    assert [(r, t) for (r, t, n), (_, _, before) in zip(deferred, [("", 0, 0), *deferred], strict=False)
            if n > before] == [("user", 3), ("user", 5)]


def test_batches_cover_the_turns_so_far_and_skip_pinned(fake):
    comp = make(fake, every=2)
    cm = ContextManager(budget=100_000, scorer="rules", compressor=comp, layers=[comp.layer()])
    cm.add({"role": "system", "content": "You are a parcel agent. Never share a customer's address."})
    for i in range(2):
        turn(cm, i)
    assert comp.wait(10)
    (req,) = fake.chat_requests()
    items = json.loads(req["messages"][1]["content"])["items"]
    # the reasoning with its tool call and the tool's result of both turns; the system message and the
    # user requests are pinned, the short final answers compressed locally: not sent
    assert [(it["role"], it["tier"]) for it in items] == [("assistant", "compressed"), ("tool", "structured")] * 2
    assert all("Never share" not in it["text"] and "Any news" not in it["text"] for it in items)


def test_a_text_asked_for_outside_a_batch_is_sent_soon(fake):
    comp = make(fake, miss_delay=0.05)  # no layer: only the misses path
    text = FACT.format(n=77, d=7, p=7)
    assert comp.compress(text, Tier.STRUCTURED) is None  # not ready: the window shows it verbatim
    deadline = time.monotonic() + 10
    while not comp.ready(text, Tier.STRUCTURED) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert comp.compress(text, Tier.STRUCTURED) == facts(text)
    # the gentler tier of a text already processed is answered at once, extractively
    assert comp.compress(text, Tier.COMPRESSED) == ExtractiveCompressor().compress(text, Tier.COMPRESSED)
    assert comp.stats["misses"] == 1 and len(fake.chat_requests()) == 1


def test_short_texts_and_shared_texts_cost_no_extra_request(fake):
    comp = make(fake)
    short = "Order ORD-1 shipped."
    assert comp.compress(short, Tier.STRUCTURED) == ExtractiveCompressor().compress(short, Tier.STRUCTURED)
    text = FACT.format(n=5, d=5, p=5)
    comp.submit([(text, Tier.STRUCTURED, "assistant")])
    comp.submit([(text, Tier.STRUCTURED, "assistant")])  # in flight or ready: skipped
    assert comp.wait(10)
    a = ContextManager(budget=1000, scorer="rules", compressor=comp, session_id="a")
    b = ContextManager(budget=1000, scorer="rules", compressor=comp, session_id="b")
    assert comp.compress(text, Tier.STRUCTURED) == facts(text)
    assert a.compressor is b.compressor and len(fake.chat_requests()) == 1


def test_bad_settings_are_refused(fake):
    for kw in ({"every": 0}, {"timing": "later"}, {"batch_size": 0}, {"miss_delay": 0}):
        with pytest.raises(ConfigError):
            make(fake, **kw)


def test_hard_constraint_sentences_of_users_are_kept_whole(fake):
    text = ("Hi again! So about the trip, I was thinking a lot. I want flight options to Seattle on May 20. "
            "It must arrive before 6pm because of a dinner. Thanks so much, you are great.")
    kept = "goal: flights to Seattle, May 20\nIt must arrive before 6pm because of a dinner."
    paraphrased = "goal: flights to Seattle, May 20; constraint: must arrive before 6pm (dinner)"
    for form, ok in ((kept, True), (paraphrased, False)):
        fake.responder = answering(lambda t, f=form: f)
        comp = make(fake)
        comp.submit([(text, Tier.STRUCTURED, "user")])
        assert comp.wait(10)
        assert (comp.compress(text, Tier.STRUCTURED) == form) is ok
    assert "It must arrive before 6pm because of a dinner." in comp.rejections[-1]["missing"]
