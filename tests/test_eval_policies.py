"""The compared policies: full context, the two sliding windows, and the context manager."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from langchain_core.messages import convert_to_messages, trim_messages

from ctxscore.scoring.base import Prediction, one_hot
from ctxscore.tokens import TokenCounter
from eval.budgets import Budget
from eval.metrics import aggregate
from eval.policies import CachedScorer, FullContext, Managed, SlidingTurns, TrimMessages, clean_message
from eval.replay import full_context_tokens, replay
from eval.sessions import load_sessions

FIX = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def counter():
    return TokenCounter()


@pytest.fixture(scope="module")
def sessions():
    return load_sessions(FIX / "eval_sessions_mini.jsonl")


def _tool_session():
    """A bundled session with tool calls (the repository's own labelled set)."""
    path = REPO / "data" / "bundled" / "sessions.jsonl"
    if not path.is_file():
        pytest.skip("data/bundled/sessions.jsonl is absent")
    for s in load_sessions(path):
        if any(m.get("tool_calls") for m in s.messages):
            return s
    pytest.skip("no bundled session with tool calls")


def test_full_context_tokens(sessions, counter):
    s = sessions[1]
    pol = FullContext(counter)
    for m in s.messages:
        pol.add(m)
    win = pol.build(100)
    assert win.messages == [clean_message(m) for m in s.messages]
    assert win.tokens == counter.count_messages([clean_message(m) for m in s.messages])
    assert full_context_tokens(s, counter)[-1] == win.tokens


def test_sliding_turns_rule_by_hand(sessions, counter):
    s = sessions[1]  # system + 24 messages, no tools
    msgs = [clean_message(m) for m in s.messages]
    counts = [counter.count_message(m) for m in msgs]
    pol = SlidingTurns(counter)
    for m in msgs:
        pol.add(m)
    budget = 400
    mean = sum(counts[1:]) / (len(msgs) - 1)
    n = max(2, math.floor((budget - counts[0] - 3) / mean))
    win = pol.build(budget)
    assert win.messages == [msgs[0]] + msgs[-n:]
    assert win.tokens == counts[0] + sum(counts[-n:]) + 3
    assert pol.build(1).messages == [msgs[0]] + msgs[-2:]  # at least two messages


def test_sliding_turns_drops_dangling_tool_result(counter):
    pol = SlidingTurns(counter, min_messages=2)
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    for m in ({"role": "user", "content": "go " * 50}, {"role": "assistant", "content": "", "tool_calls": [call]},
              {"role": "tool", "tool_call_id": "c1", "content": "ok"}, {"role": "assistant", "content": "done"}):
        pol.add(m)
    assert [m["role"] for m in pol.build(1).messages] == ["assistant"]


def test_trim_messages_matches_langchain_on_the_whole_history(counter):
    s = _tool_session()
    msgs = [clean_message(m) for m in s.messages]
    counts = [counter.count_message(m) for m in msgs]
    pol = TrimMessages(counter)
    lc_all = []
    for i, m in enumerate(msgs):
        pol.add(m)
        lc = convert_to_messages([{k: v for k, v in m.items() if k != "id"}])[0]
        lc.id = str(i)
        lc_all.append(lc)
        if i % 5:
            continue
        for budget in (60, 300, 900, 5000):
            ref = trim_messages(lc_all, max_tokens=budget - 3, token_counter=lambda ms: sum(counts[int(x.id)] for x in ms),
                                strategy="last", include_system=True, start_on="human")
            win = pol.build(budget)
            assert [m["id"] for m in win.messages] == [msgs[int(x.id)]["id"] for x in ref], (i, budget)
            assert win.tokens == sum(counts[int(x.id)] for x in ref) + 3
            assert win.tokens <= max(budget, counts[0] + 3)


class CountingScorer:
    """Fake scorer: every message is key_state with value 0.5; counts batches."""

    def __init__(self):
        self.batches = []
        self.embedded = []

    def predict(self, messages):
        self.batches.append(len(messages))
        return [Prediction("key_state", one_hot("key_state", 0.9), 0.5, "learned") for _ in messages]

    def embed_texts(self, texts):
        self.embedded.extend(texts)
        return np.array([[float(len(t)), 1.0] for t in texts])


def test_cached_scorer_scores_each_message_once(sessions):
    s = sessions[0]
    inner = CountingScorer()
    cached = CachedScorer(inner)
    cached.warm(s.messages)
    assert inner.batches == [len(s.messages)]
    vecs = cached.embed_texts(["abc", "de", "abc"])
    assert vecs.shape == (3, 2) and vecs[0, 0] == 3.0 and inner.embedded == ["abc", "de"]
    cached.embed_texts(["de"])
    assert inner.embedded == ["abc", "de"]  # served from the cache
    full = full_context_tokens(s, TokenCounter())
    for b in (Budget("tokens", 120), Budget("fraction", 0.5)):
        replay(s, Managed("learned", cached, s.session_id), b, full, probe_every=4)
    assert inner.batches == [len(s.messages)]  # the replays were served from the cache


def test_rules_policy_end_to_end(sessions, counter):
    s = sessions[1]
    full = full_context_tokens(s, counter)
    roomy = aggregate([replay(s, Managed("rules", "rules", s.session_id), Budget("tokens", 128000), full, probe_every=5)])
    assert roomy["recall"] == 1.0 and roomy["token_ratio"] == 1.0 and roomy["leakage"] is None
    tight_tr = replay(s, Managed("rules", "rules", s.session_id), Budget("fraction", 0.3), full, probe_every=5,
                      record_misses=True)
    tight = aggregate([tight_tr])
    assert tight["token_ratio"] < 0.6
    assert tight["recall_pagein"] >= tight["recall"]
    assert tight["build_ms_p95"] is not None and tight["build_ms_p95"] > 0
    for r in tight_tr.misses:
        assert r["predicted_category"] in ("instruction", "key_state", "reasoning", "failure")
        assert r["tier"] in ("structured", "compressed", "archived")
        assert json.dumps(r)
