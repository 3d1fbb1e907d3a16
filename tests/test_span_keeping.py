"""Key spans in compressed forms: every compressor keeps the spans it is given byte-exact, and the
runtime (the structured / compressed tiers and the fact ledger) uses the packaged scorer's learned
span extractor when the package has one, the rules alone when it has none.

The labelled messages are real ones of the held-out evaluation sessions with their distilled key
spans (SGD, MultiWOZ, tau-bench), written out here so the tests need no corpora."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ctxscore import ContextManager
from ctxscore.compress import ExtractiveCompressor, compress, compress_verified, structured_summary, verify
from ctxscore.compress.blocks import blocked_form, key_blocks, split_blocks
from ctxscore.compress.extractive import aggressive_compress
from ctxscore.compress.verify import key_spans
from ctxscore.errors import ModelLoadError
from ctxscore.memory.ledger import FactLedger
from ctxscore.messages import Tier
from ctxscore.scoring.learned import LearnedScorer
from ctxscore.scoring.spans import extractor_of, facts_of, useful

REPO = Path(__file__).resolve().parents[1]
DEFAULT = REPO / "ctxscore" / "models" / "default"

# (content, tier the manager uses for its labelled category, the distilled key spans)
LABELLED = [
    ("Of course, I would like to start traveling on Wednesday next week. The easiest place for my to fly out of "
     "is Washington and I will be flying to London.", "structured", ["Wednesday next week", "Washington", "London"]),
    ("Unfortunately, the system does not allow for the removal of checked bags once they have been added to a "
     "reservation. You can only add additional bags if needed. \n\nWould you like to proceed with changing your "
     "flight to Flight Number HAT266? If so, please provide a payment method for the price difference of $146 for "
     "the new flight.", "structured", ["does not allow for the removal of checked bags", "HAT266", "$146"]),
    ("Ok, there are 3 hotels located in the centre of town. They range from moderate to expensive. Do you have a "
     "price preference?", "compressed", ["3 hotels located in the centre"]),
    ('{"reservation_id": "FQ8APE", "user_id": "omar_rossi_1241", "origin": "EWR", "destination": "ORD", '
     '"flight_type": "one_way", "cabin": "basic_economy", "flights": [{"flight_number": "HAT056", "date": '
     '"2024-05-25", "price": 155, "origin": "EWR", "destination": "IAH"}, {"flight_number": "HAT138", "date": '
     '"2024-05-25", "price": 185, "origin": "IAH", "destination": "ORD"}], "passengers": [{"first_name": "Ivan", '
     '"last_name": "Garcia", "dob": "1960-12-01"}], "payment_history": [{"payment_id": "gift_card_8190333", '
     '"amount": 161}, {"payment_id": "credit_card_7407366", "amount": 209}], "created_at": "2024-05-01T16:18:10", '
     '"total_baggages": 0, "nonfree_baggages": 0, "insurance": "yes"}', "structured",
     ["FQ8APE", "HAT056", "HAT138", "credit_card_7407366", '"amount": 209']),
]


def _ws(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("content,tier,spans", LABELLED)
def test_each_compressor_keeps_its_given_spans_byte_exact(content, tier, spans):
    """structured_summary, aggressive_compress and the verified path keep every given span, and cut."""
    tier_form = ExtractiveCompressor().compress(content, Tier(tier), spans=spans)
    assert tier_form is not None and len(tier_form) < len(content)
    for form in (structured_summary(content, keep=spans), aggressive_compress(content, keep=spans), tier_form):
        if form is not tier_form and content.startswith("{") and form is not None and "=" not in form:
            continue  # JSON has no compressed form of its own (the verifier falls back to structured)
        for sp in spans:
            assert _ws(sp) in _ws(form), (sp, form)
    res = compress_verified(ExtractiveCompressor(), content, tier, spans=[*key_spans(content), *spans])
    assert res.tier != Tier.VERBATIM and all(_ws(sp) in _ws(res.text) for sp in spans)


def test_a_span_across_two_sentences_keeps_both_and_filler_holding_a_span_stays():
    text = "Sure thing. Okay, the room is booked. It was fun. Call me at noon."
    out = structured_summary(text, keep=["booked. It was fun", "Okay, the room"])
    assert "Okay, the room is booked." in out and "It was fun." in out and "Sure thing" not in out
    assert structured_summary("Okay, the room is booked for 2 nights.") == "the room is booked for 2 nights."


def test_json_keeps_numbers_and_status_words_as_their_pairs_and_dedupes_repeats():
    leg = '{"flight_number": "HAT047", "status": "available", "prices": {"economy": 165, "business": 202}}'
    text = f'[{leg}, {leg.replace("HAT047", "HAT048")}, {leg}]'
    out = structured_summary(text)
    assert '"business": 202' in out and '"status": "available"' in out and "flight_number=HAT047" in out
    assert "1: flight_number=HAT048" in out  # a record with its own values stays
    assert "1.prices: same as 0.prices" in out and "2: same as 0" in out and out.count('"business": 202') == 1
    assert verify(text, out).ok


def test_the_verifier_reads_no_entity_across_the_lines_of_a_form():
    text = '{"legs": [{"price": 11}], "passengers": [{"name": "Ann", "bags": 0}]}'
    form = structured_summary(text)
    assert '"price": 11\npassengers' in form  # "11\npassengers" is no "11 passengers"
    assert verify(text, form).ok


def test_key_blocks_keep_the_blocks_holding_a_given_span():
    paras = [f"Paragraph {i}: " + "filler words here " * 25 for i in range(8)]
    paras[4] = paras[4].replace("filler words here", "the rollback owner is Maria", 1)
    text = "\n\n".join(paras)
    blocks = split_blocks(text)
    plain = blocked_form(text, blocks, key_blocks(text, blocks, share=0.45), "m9")
    kept = blocked_form(text, blocks, key_blocks(text, blocks, share=0.45, spans=["rollback owner is Maria"]), "m9")
    assert "rollback owner is Maria" not in plain  # no key-like token: archived in place without the span
    assert "rollback owner is Maria" in kept and "archived" in kept and len(kept) < len(text)


def test_key_blocks_count_file_names_joined_by_a_hyphen_each():
    """``a.py-b.md`` holds two file names: the block of six such pairs (12 names) is denser than the
    block of ten single names and is the one kept when the budget holds one."""
    filler = "plain words here " * 20
    names = ["alpha", "beta", "gamma", "delta", "omega", "kappa", "sigma", "theta", "iota", "zeta"]
    paras = ["Intro " + filler, "Singles: " + " ".join(f"{n}.py" for n in names) + " " + filler,
             "Pairs: " + " ".join(f"{n}.py-{n}.md" for n in names[:6]) + " " + filler, "Outro " + filler]
    text = "\n\n".join(paras)
    blocks = split_blocks(text)
    assert len(blocks) == 4
    share = (blocks[0].end - blocks[0].start + blocks[3].end - blocks[3].start + blocks[2].end - blocks[2].start + 5) / len(text)
    assert key_blocks(text, blocks, share=share) == {0, 2, 3}


def _git_diff(paths: list[str], every: int = 37, also: str | None = None) -> str:
    """A unified diff (``git diff`` layout) of repository files with one line in ``every`` changed,
    and each line holding ``also`` (so a test's hunk exists whatever the files' lengths become)."""
    import difflib

    out = ""
    for rel in paths:
        a = (REPO / rel).read_text(encoding="utf-8").split("\n")
        b = [line + "  # patched" if j % every == 5 or (also is not None and also in line) else line
             for j, line in enumerate(a)]
        out += f"diff --git a/{rel} b/{rel}\n" + "\n".join(difflib.unified_diff(a, b, f"a/{rel}", f"b/{rel}", lineterm="")) + "\n"
    return out


def test_a_diff_hunk_is_one_block_with_its_header():
    # an empty context line of a hunk is " ", a blank line to the paragraph cut: hunks of real code
    # were cut there, and a cut diff showed hunk bodies without their @@ line numbers
    diff = _git_diff(["ctxscore/window/history.py", "ctxscore/compress/blocks.py"])
    blocks = split_blocks(diff, max_chars=100_000)
    assert "".join(diff[b.start:b.end] for b in blocks) == diff
    hunks = [diff[b.start:b.end] for b in blocks if diff[b.start:b.end].startswith("@@ ")]
    assert len(hunks) == diff.count("\n@@ ") > 10
    assert all(b.kind == "diff" for b in blocks)  # file headers and hunks; no hunk cut into paragraphs
    assert any("\n \n" in h for h in hunks)  # hunks with empty context lines stayed whole


def test_a_hunk_ends_where_its_line_counts_say():
    # a list after a diff ("- I also renamed the helper") was read as removed lines of the last hunk
    text = ("Here is the change:\n@@ -1,3 +1,3 @@\n def f():\n-    return 1\n+    return 2\n     # done\n\n"
            "- I also renamed the helper\n- and updated the docs\n\nLet me know.")
    blocks = [(b.kind, text[b.start:b.end]) for b in split_blocks(text)]
    assert ("diff", "@@ -1,3 +1,3 @@\n def f():\n-    return 1\n+    return 2\n     # done\n") in blocks
    assert not any(kind == "diff" and "renamed" in t for kind, t in blocks)


def test_a_cut_diff_shows_the_hunk_the_query_names_with_its_header():
    diff = _git_diff(["ctxscore/window/history.py", "ctxscore/window/pagein.py", "ctxscore/window/session.py"],
                     also="def release_instructions")
    cm = ContextManager(budget=1500, scorer="rules")
    cm.extend([{"role": "user", "content": "Show me what the patch changes in release_instructions."},
               {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "bash", "arguments": json.dumps({"command": "git diff"})}}]},
               {"role": "tool", "tool_call_id": "c1", "content": diff}])
    shown = cm.build(query="the hunk of release_instructions").messages[-1]["content"]
    assert len(shown) < len(diff) / 3
    at = shown.index("def release_instructions")
    header = shown.rfind("\n@@ ", 0, at)
    assert header != -1 and "archived" not in shown[header:at]  # its hunk is shown from its @@ line on


def test_trivial_predicted_spans_are_not_required():
    assert not any(useful(s) for s in ("the", "That", "1", "周", "is a", "`"))
    assert all(useful(s) for s in ("centre", "$146", "北京饭店", "a museum"))


# ------------------------------------------------------------------------------ runtime wiring
@pytest.fixture(scope="module")
def shipped():
    """The shipped scorer (its span extractor included), or skip when its embedder cannot load."""
    try:
        scorer = LearnedScorer.from_pretrained(DEFAULT)
        scorer.embed_texts(["probe"])
    except (ModelLoadError, ImportError, OSError) as exc:
        pytest.skip(f"the shipped scorer does not load here: {exc}")
    if scorer.spans is None:
        pytest.skip("the shipped package has no span extractor")
    return scorer


@pytest.fixture(scope="module")
def plain(shipped, tmp_path_factory):
    """The shipped package without spans.skops (a package from before the extractor)."""
    folder = tmp_path_factory.mktemp("plain") / "default"
    shutil.copytree(DEFAULT, folder)
    (folder / "spans.skops").unlink()
    cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    cfg.pop("spans", None)
    cfg["files"].pop("spans.skops", None)
    (folder / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    scorer = LearnedScorer.from_pretrained(folder)
    assert scorer.spans is None
    return scorer


def _state_message(cm: ContextManager, text: str):
    cm.add({"role": "user", "content": "Find me a flight."})
    m = cm.add({"role": "user", "content": text})
    return next(e for e in cm.history.entries if e.msg.id == m.id)


def test_the_runtime_uses_the_packaged_extractor_when_present(shipped):
    text = LABELLED[0][0]
    assert "Washington" not in key_spans(text)  # the rules find no city here
    with ContextManager(budget=4000, scorer=shipped) as cm:
        assert cm.state.forms.extractor == shipped.key_spans
        e = _state_message(cm, text)
        assert {"Washington", "London"} <= set(cm.state.forms.key_spans(e))
        form = cm.state.forms.get(e, Tier.STRUCTURED)
        assert form.tier == Tier.STRUCTURED and "Washington" in form.text and "London" in form.text


def test_the_runtime_falls_back_to_the_rules_without_an_extractor(plain):
    text = LABELLED[0][0]
    assert extractor_of(plain) is None and facts_of(plain) is None
    for scorer in (plain, "rules"):
        with ContextManager(budget=4000, scorer=scorer) as cm:
            assert cm.state.forms.extractor is None
            e = _state_message(cm, text)
            assert cm.state.forms.key_spans(e) == key_spans(text, learned=False)


def test_the_fact_ledger_uses_the_scorer_extractor_when_present(shipped, plain):
    text = LABELLED[0][0]
    ledger = FactLedger()
    with ContextManager(budget=4000, scorer=shipped, layers=[ledger]) as cm:
        cm.add({"role": "user", "content": text})
        values = {f.value for f in ledger.facts if f.origin == "extractor"}
        assert {"Washington", "London"} <= values
        assert not any(v in r or r in v for v in values for r in (f.value for f in ledger.facts if f.origin == "text"))
    rules_ledger = FactLedger()
    with ContextManager(budget=4000, scorer=plain, layers=[rules_ledger]) as cm:
        cm.add({"role": "user", "content": text})
        assert rules_ledger.fctx.extractor is None
        assert not any(f.origin == "extractor" for f in rules_ledger.facts)


def test_the_verified_path_keeps_the_extractor_spans(shipped):
    for content, tier, spans in LABELLED:
        res = compress(content, tier, extractor=shipped.key_spans)
        assert all(_ws(sp) in _ws(res.text) for sp in spans), (content, res)
        assert all(_ws(sp) in _ws(res.text) for sp in shipped.key_spans(content))
