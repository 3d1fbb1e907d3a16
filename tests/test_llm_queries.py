"""The LLM query writer for page-in: keyword and paraphrase queries, the fallback to the request."""

from __future__ import annotations

import json
import logging

import pytest

pytest.importorskip("openai")

from fake_openai import FakeOpenAI  # noqa: E402

from ctxscore import ContextManager  # noqa: E402
from ctxscore.errors import ConfigError  # noqa: E402
from ctxscore.llm import LLMClient, LLMQueryWriter, Queries  # noqa: E402
from ctxscore.llm.prompts import QUERY_RULES  # noqa: E402

REQUEST = "which plane did we settle on?"
ANSWER = {"keywords": ["flight", "booked", "Seattle", "flight"], "paraphrases": ["the flight I booked to Seattle"]}


@pytest.fixture
def fake():
    with FakeOpenAI(lambda body: json.dumps(ANSWER)) as f:
        yield f


def writer(fake, **kw):
    return LLMQueryWriter(LLMClient(base_url=fake.url, model="m", backoff=0.01, max_retries=0), **kw)


def test_keywords_and_paraphrases(fake):
    q = writer(fake).write(REQUEST, context=["We talked about a trip."])
    assert q == Queries(REQUEST, ("flight", "booked", "Seattle"), ("the flight I booked to Seattle",), ok=True)
    assert q.combined() == "\n".join([REQUEST, "flight", "booked", "Seattle", "the flight I booked to Seattle"])
    req = fake.chat_requests()[-1]
    assert req["messages"][0]["content"] == QUERY_RULES
    assert json.loads(req["messages"][1]["content"]) == {"request": REQUEST, "context": ["We talked about a trip."]}
    assert writer(fake, max_keywords=1, max_paraphrases=0).write(REQUEST).keywords == ("flight",)


def test_expanded_queries_page_in_what_the_request_alone_misses(fake):
    def conversation():
        cm = ContextManager(budget=260, scorer="rules")
        cm.add({"role": "user", "content": "I need to get to Seattle next week."})
        cm.add({"role": "assistant", "content": "Booked flight HAT136 to Seattle, departing 9:40 on May 20."})
        for i in range(14):
            cm.add({"role": "user", "content": f"Also note reminder number {i}: water the garden plants."})
            cm.add({"role": "assistant", "content": f"Noted reminder {i} about the garden."})
        return cm

    cm = conversation()
    plain = cm.build(query=REQUEST)
    booking = next(d for d in plain.decisions if d.id == cm.messages[1].id)
    assert booking.tier == "archived" and not booking.paged_in
    cm2 = conversation()
    w = cm2.build(query=writer(fake).expand(REQUEST))
    booking = next(d for d in w.decisions if d.id == cm2.messages[1].id)
    assert booking.paged_in
    assert any("HAT136" in (m["content"] or "") for m in w.messages)


@pytest.mark.parametrize("fault", [{"reply": "flight, booked"}, {"reply": json.dumps({"keywords": "flight"})},
                                   {"status": 500}])
def test_failures_fall_back_to_the_request(fake, fault, caplog):
    fake.push(fault)
    w = writer(fake)
    with caplog.at_level(logging.WARNING, logger="ctxscore"):  # another test may have raised the level
        q = w.write(REQUEST)
    assert q == Queries(REQUEST) and w.expand(REQUEST) != "" and w.failures == 1
    assert "searching with the request alone" in caplog.text


def test_empty_request_and_bad_arguments(fake):
    assert writer(fake).write("  ") == Queries("  ") and fake.chat_requests() == []
    with pytest.raises(ConfigError):
        writer(fake).write(None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        writer(fake, max_keywords=-1)

