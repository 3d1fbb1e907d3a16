"""Replay and metrics on a small hand-made session whose answers are worked out by hand below."""

from __future__ import annotations

from pathlib import Path

import pytest

from eval.budgets import Budget, parse_budgets
from eval.metrics import aggregate
from eval.policies import Window, WindowStrategy
from eval.replay import probe_turns, replay
from eval.sessions import load_sessions
from eval.textnorm import normalize, present, window_text

FIXTURE = Path(__file__).parent / "fixtures" / "eval_sessions_mini.jsonl"


class LastFour(WindowStrategy):
    """Stub policy: the last 4 messages, 10 tokens each + 3; a query pages in messages from an oracle map."""

    name = "stub"
    uses_query = True

    def __init__(self, oracle: dict[str, int] | None = None) -> None:
        self.msgs: list[dict] = []
        self.oracle = oracle or {}
        self.queries: list[str] = []

    def add(self, message: dict) -> None:
        self.msgs.append(message)

    def build(self, budget: int, query: str | None = None) -> Window:
        idx = list(range(max(0, len(self.msgs) - 4), len(self.msgs)))
        if query is not None:
            self.queries.append(query)
            extra = self.oracle.get(query)
            if extra is not None and extra not in idx:
                idx = sorted([extra, *idx])
        msgs = [self.msgs[i] for i in idx]
        return Window(tokens=10 * len(idx) + 3, budget=budget, messages_fn=lambda: msgs)


@pytest.fixture(scope="module")
def booking():
    return load_sessions(FIXTURE)[0]


def test_textnorm():
    assert normalize("  Ｌｕｉｇｉ'S \n\t Place ") == "luigi's place"
    text = window_text([{"role": "assistant", "content": "",
                         "tool_calls": [{"function": {"name": "f", "arguments": "{\"city\": \"\\u5317\\u4eac\"}"}}]}])
    assert present("北京", text)  # JSON-escaped tool arguments are decoded
    assert not present("", text)
    # a value must not match across two messages
    assert not present("a b", window_text([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]))


def test_probe_turns():
    assert probe_turns(12, 4) == [3, 7, 11]
    assert probe_turns(10, 4) == [3, 7, 9]
    assert probe_turns(3, 10) == [2]
    with pytest.raises(ValueError):
        probe_turns(5, 0)


def test_hand_made_session_metrics(booking):
    # Windows hold messages t-3..t; probes after messages 3, 7, 11 (probe_every=4).
    # t=3  window 0..3 : restaurant@1 present                                  -> 1/1
    # t=7  window 4..7 : restaurant (lower-case in the tool args of #4) present,
    #                    phone@3 missing, time@4 present, table@5 present       -> 3/4
    # t=11 window 8..11: restaurant, phone, time missing; table in #9 args present;
    #                    party "6 people" missing while "4 people" is in #11 (leak); ref@10 present -> 2/6
    # recall 6/11; at the end 2/6. Page-in: the phone probe brings #3 back at t=7 and t=11 -> 8/11.
    oracle = {"What is the phone number?": 3}
    full = [10 * (t + 1) + 3 for t in range(12)]
    pol = LastFour(oracle)
    tr = replay(booking, pol, Budget("tokens", 40), full, probe_every=4, record_misses=True)
    m = aggregate([tr])
    assert m["checks"] == 11
    assert m["recall"] == round(6 / 11, 4)
    assert m["recall_end"] == round(2 / 6, 4)
    assert m["recall_pagein"] == round(8 / 11, 4)
    assert m["recall_end_pagein"] == round(3 / 6, 4)
    assert m["superseded_checks"] == 1 and m["leakage"] == 1.0 and m["leakage_pagein"] == 1.0
    # tokens: window 10*min(t+1, 4)+3 -> 456 in all; full 10*(t+1)+3 -> 816
    assert m["cum_tokens"] == 456 and m["cum_full_tokens"] == 816
    assert m["token_ratio"] == round(456 / 816, 4)
    assert m["token_reduction"] == round(1 - 456 / 816, 4)
    assert m["util_peak"] == round(43 / 40, 4)
    assert m["util_mean"] == round(456 / 480, 4)
    assert m["over_budget_turns"] == 0.75
    assert m["longest_fit_128k"] == 12 and m["sessions_fit_128k"] == 1
    # slot facts: restaurant (checked at 3, 7, 11; present at 3, 7), phone (7, 11; page-in only), party (11)
    assert m["recall_by_kind"]["slot"] == {"checks": 6, "recall": round(2 / 6, 4), "recall_pagein": round(4 / 6, 4)}
    # page-in builds only for the missing facts, one per distinct probe per probe point: 1 at t=7, 4 at t=11
    assert len(tr.pagein_ms) == 5
    # one feedback record per missing fact (phone missed twice -> one record)
    assert sorted(r["fact"]["fact_id"] for r in tr.misses) == ["party", "phone", "restaurant", "time"]
    phone = next(r for r in tr.misses if r["fact"]["fact_id"] == "phone")
    assert phone["message_id"] == "mini/booking#3" and phone["recovered_by_pagein"] is True
    assert phone["text"] == "Under the name Okafor, phone 555-0142." and phone["probe_turn"] == 7


def test_pagein_modes(booking):
    full = [10 * (t + 1) + 3 for t in range(12)]
    none = aggregate([replay(booking, LastFour({"What is the phone number?": 3}), Budget("tokens", 40), full,
                             probe_every=4, pagein="none")])
    assert none["recall_pagein"] == none["recall"] == round(6 / 11, 4)
    pol = LastFour()
    tr = replay(booking, pol, Budget("tokens", 40), full, probe_every=4, pagein="all")
    # every due fact's probe is built at every probe point: 1 + 4 + 6 distinct probes
    assert len(tr.pagein_ms) == 11
    with pytest.raises(ValueError):
        replay(booking, LastFour(), Budget("tokens", 40), full, pagein="sometimes")


def test_fraction_budget_per_turn(booking):
    full = [1000 * (t + 1) for t in range(12)]
    tr = replay(booking, LastFour(), Budget("fraction", 0.25, min_tokens=600), full, probe_every=4)
    assert tr.budget == [600, 600, 750, 1000, 1250, 1500, 1750, 2000, 2250, 2500, 2750, 3000]


def test_budgets_parse_and_labels():
    bs = parse_budgets([0.25], [4000, 2500])
    assert [b.label for b in bs] == ["25%", "4k", "2500"]
    assert [b.key for b in bs] == ["f0.25", "t4000", "t2500"]
    assert [b.label for b in parse_budgets(None, None)] == ["25%", "50%", "2k", "4k", "8k", "16k", "128k"]
    with pytest.raises(ValueError):
        Budget("fraction", 1.5)
    with pytest.raises(ValueError):
        Budget("tokens", 0)


def test_feedback_text_is_cut_like_the_labels():
    from eval.replay import _cut

    text = "a" * 1000 + "b" * 1000
    cut = _cut(text)
    assert cut == "a" * 900 + " … " + "b" * 900
    assert _cut("short") == "short"


def test_feasible_peak_leaves_out_turns_the_policy_cannot_fit():
    from eval.metrics import aggregate
    from eval.replay import Trace

    tr = Trace("s", "rules", "t100", 3, tokens=[50, 300, 60], full=[50, 400, 500], budget=[100, 100, 100],
               infeasible=[False, True, False])
    m = aggregate([tr])
    assert m["util_peak"] == 3.0
    assert m["util_peak_feasible"] == 0.6
    assert m["infeasible_turns"] == round(1 / 3, 4)
    assert m["over_budget_turns"] == round(1 / 3, 4)
