"""The negation check of the shared verifier (added for the LLM path; every compressor gets it)."""

from __future__ import annotations

import pytest

from ctxscore.compress import compress, verify
from ctxscore.compress.verify import negation_spans


def test_negation_spans():
    text = ("No, you cannot smoke here. There is no garage. Sure, no problem! I don't want an aisle seat, "
            "not only that: nothing else matters. 不要推荐苹果，没有预算。不过可以，非常好。")
    assert negation_spans(text) == ["No", "cannot smoke", "no garage", "don't want", "不要", "没有"]


@pytest.mark.parametrize("original, form, ok", [
    ("There is no garage. Phone 408-984-8888.", "phone: 408-984-8888\nNo garage", True),   # case aside
    ("There is no garage. Phone 408-984-8888.", "phone: 408-984-8888", False),            # the denial dropped
    ("Do not book before I confirm. Flight HAT136.", "HAT136; don't book before confirm", True),  # contraction
    ("I can't fly on May 3 with HAT136.", "HAT136: cannot fly May 3", True),
    ("The garage is free. Phone 408-984-8888.", "phone: 408-984-8888\ngarage: not free", False),  # invented
    ("用户不要推荐苹果手机，预算 3000 元以内。", "预算: 3000 元以内", False),
    ("用户不要推荐苹果手机，预算 3000 元以内。", "不要推荐苹果; 预算: 3000 元以内", True),
])
def test_negations_must_survive_and_not_be_invented(original, form, ok):
    v = verify(original, form)
    assert v.ok is ok, v
    if not ok:
        assert v.missing or v.invented


def test_a_form_that_drops_a_denial_falls_back_and_the_extractive_one_keeps_it():
    from ctxscore.compress import compress_verified

    text = ("The visit has been scheduled for May 3 at 10am. There is no garage. "
            "The phone number is 408-984-8888. Have a great day!")

    class EntitiesOnly:  # a form with only the entity sentences
        def compress(self, text, tier):
            return "The visit has been scheduled for May 3 at 10am.\nThe phone number is 408-984-8888."

    res = compress_verified(EntitiesOnly(), text, "structured")
    assert res.tier == "verbatim" and "no garage" in res.missing
    kept = compress(text, "structured")  # the structured summary keeps the sentences with a negation
    assert kept.tier == "structured" and "There is no garage." in kept.text and "great day" not in kept.text


def test_negations_found_on_the_folded_text_are_those_of_the_ignorecase_pattern():
    """The English negations are searched case-sensitively in the case-folded text: the same spans as
    the IGNORECASE pattern in the text itself, on the bundled messages and on the letters the regex
    engine's IGNORECASE matches to ASCII ones that str.lower does not lower to them."""
    import json
    from pathlib import Path

    from ctxscore.compress.verify import _EN_NEG, _ZH_NEG, _negated, negation_matches

    path = Path(__file__).resolve().parents[1] / "data" / "bundled" / "sessions.jsonl"
    texts = [m["content"] for line in path.read_text(encoding="utf-8").splitlines()
             for m in json.loads(line)["messages"] if m.get("content")]
    texts += [t.upper() for t in texts[:300]]
    texts += ["We do NOT allow pets; NEVER book after 9.", "I doeſn't care", "NEVER ſee it", "ıt is noT \u212aept", "NOTHING ELSE", "İ do NOT want it"]
    texts.append(" ".join(texts))  # longer than the memo's limit: scanned, not memoised
    found = 0
    for t in texts:
        want = tuple(m.span() for rx in (_EN_NEG, _ZH_NEG) for m in rx.finditer(t))
        assert negation_matches(t) == want, t[:80]
        assert _negated(t) == {lang for lang, rx in (("en", _EN_NEG), ("zh", _ZH_NEG)) if rx.search(t)}
        found += bool(want)
    assert found > 100
