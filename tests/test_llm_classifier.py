"""The LLM classifier as the second path: uncertain messages go to it in batches, answers are
parsed to category and importance, malformed answers keep the first path's prediction."""

from __future__ import annotations

import json
import logging

import pytest

pytest.importorskip("openai")

from fake_openai import FakeOpenAI  # noqa: E402

from ctxscore import ContextManager, Message, RuleClassifier  # noqa: E402
from ctxscore.errors import ConfigError  # noqa: E402
from ctxscore.llm import DualPathScorer, LLMClassifier, LLMClient  # noqa: E402
from ctxscore.llm.prompts import CLASSIFIER_RULES  # noqa: E402
from ctxscore.scoring.base import Prediction, one_hot  # noqa: E402

SURE, UNSURE = "Your booking ZX-1 is confirmed.", "hmm, ok then maybe"


class Stub:
    """A first path with known confidences: 0.95 for SURE, 0.4 for anything else."""

    def predict(self, messages):
        return [Prediction("key_state" if m.content == SURE else "reasoning",
                           one_hot("key_state" if m.content == SURE else "reasoning", 0.95 if m.content == SURE else 0.4),
                           value=0.5, source="learned", signals={"s": 1.0}, embedding=[0.1, 0.2])
                for m in messages]

    def embed_texts(self, texts):
        return [[0.1, 0.2] for _ in texts]


def labels(answer_for):
    """A responder answering each item with ``answer_for(item) -> dict | None`` (None: item left out)."""

    def responder(body):
        items = json.loads(body["messages"][-1]["content"])["items"]
        out = []
        for it in items:
            a = answer_for(it)
            if a is not None:
                out.append({"id": it["id"], **a})
        return json.dumps({"items": out})

    return responder


@pytest.fixture
def fake():
    with FakeOpenAI(labels(lambda it: {"category": "failure", "importance": 0})) as f:
        yield f


def scorer(fake, threshold=0.6, batch_size=16):
    client = LLMClient(base_url=fake.url, model="fake-model", backoff=0.01, max_retries=1, timeout=5.0)
    return DualPathScorer(Stub(), LLMClassifier(client, batch_size=batch_size), threshold=threshold)


def msgs(*texts):
    return [Message(role="user", content=t, turn=i) for i, t in enumerate(texts)]


def test_only_uncertain_messages_go_to_the_llm_in_batches(fake):
    s = scorer(fake, batch_size=2)
    preds = s.predict(msgs(SURE, UNSURE, UNSURE + "!", SURE, UNSURE + "?"))
    assert [p.source for p in preds] == ["learned", "llm", "llm", "learned", "llm"]
    assert [p.category for p in preds] == ["key_state", "failure", "failure", "key_state", "failure"]
    assert preds[1].value == 0.0 and preds[1].embedding == [0.1, 0.2]  # the first path's embedding is kept
    assert preds[1].signals["first_path_confidence"] == pytest.approx(0.4) and preds[1].signals["s"] == 1.0
    reqs = fake.chat_requests()
    assert len(reqs) == 2  # 3 uncertain messages, batches of 2
    assert reqs[0]["messages"][0]["content"] == CLASSIFIER_RULES
    sent = [it["text"] for r in reqs for it in json.loads(r["messages"][1]["content"])["items"]]
    assert sent == [UNSURE, UNSURE + "!", UNSURE + "?"]
    first = json.loads(reqs[0]["messages"][1]["content"])["items"][0]
    assert first["before"] == {"role": "user", "text": SURE}  # the previous message, for context


def test_importance_maps_to_value_and_confidence_is_used(fake):
    fake.responder = labels(lambda it: {"category": "instruction", "importance": 3, "confidence": 0.7})
    (p,) = scorer(fake).predict(msgs(UNSURE))
    assert p.category == "instruction" and p.value == 1.0 and p.probs["instruction"] == pytest.approx(0.7)
    assert sum(p.probs.values()) == pytest.approx(1.0)


@pytest.mark.parametrize("answer, why", [
    ({"category": "important", "importance": 2}, "unknown category 'important'"),
    ({"category": "key_state", "importance": 5}, "importance 5 is not an integer 0-3"),
    ({"category": "key_state", "importance": 1.5}, "importance 1.5 is not an integer 0-3"),
    ({"category": "key_state"}, "importance None"),
    (None, "no answer for it"),
])
def test_a_malformed_item_keeps_the_learned_prediction_and_logs(fake, caplog, answer, why):
    fake.responder = labels(lambda it: answer if it["id"] == "0" else {"category": "failure", "importance": 0})
    with caplog.at_level(logging.WARNING, logger="ctxscore"):
        preds = scorer(fake).predict(msgs(UNSURE, UNSURE + "!"))
    assert preds[0].source == "learned" and preds[0].category == "reasoning"
    assert preds[1].source == "llm" and preds[1].category == "failure"
    lines = [r.getMessage() for r in caplog.records if "llm classifier" in r.getMessage()]
    assert len(lines) == 1 and why in lines[0] and "kept the first-path prediction" in lines[0]


def test_an_unreadable_answer_or_a_dead_endpoint_keeps_every_prediction(fake, caplog):
    fake.push({"reply": "I think the first one is key_state."})
    with caplog.at_level(logging.WARNING, logger="ctxscore"):
        preds = scorer(fake).predict(msgs(UNSURE, UNSURE + "!"))
    assert [p.source for p in preds] == ["learned", "learned"]
    fake.push({"status": 503}, {"status": 503})
    with caplog.at_level(logging.WARNING, logger="ctxscore"):
        preds = scorer(fake).predict(msgs(UNSURE))
    assert preds[0].source == "learned"
    text = caplog.text
    assert "malformed answer for 2 messages" in text and "request for 1 messages failed" in text


def test_dual_path_in_a_context_manager_with_the_rules_first(fake):
    fake.responder = labels(lambda it: {"category": "instruction", "importance": 3})
    rules = RuleClassifier()
    s = scorer(fake, threshold=1.0)  # every message goes to the LLM
    s.scorer = rules
    cm = ContextManager(budget=2000, scorer=s)
    cm.extend([{"role": "user", "content": "hmm"}, {"role": "assistant", "content": "ok."}])
    preds = cm.predictions()
    assert [p.source for p in preds] == ["llm", "llm"] and all(p.category == "instruction" for p in preds)
    assert all(d.pinned for d in cm.build().decisions)  # the LLM's category decides pinning
    assert len(fake.chat_requests()) == 1  # one batch per extend


def test_as_fallback_for_the_learned_scorer(fake):
    fake.responder = labels(lambda it: {"category": "key_state", "importance": 2})
    client = LLMClient(base_url=fake.url, model="m", backoff=0.01)
    fb = LLMClassifier(client).as_fallback()
    p = fb(Message(role="user", content=UNSURE), Stub().predict(msgs(UNSURE))[0])
    assert p.category == "key_state" and p.value == pytest.approx(2 / 3)


def test_bad_settings_are_refused(fake):
    client = LLMClient(base_url=fake.url, model="m")
    with pytest.raises(ConfigError):
        DualPathScorer(Stub(), LLMClassifier(client), threshold=1.5)
    with pytest.raises(ConfigError):
        DualPathScorer(object(), LLMClassifier(client))
    with pytest.raises(ConfigError):
        LLMClassifier(client, batch_size=0)
