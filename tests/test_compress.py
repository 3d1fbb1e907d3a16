"""Compressors: structured summary, aggressive compression, stubs, verification and fallback."""

from __future__ import annotations

import json

import pytest

from ctxscore.compress import (
    aggressive_compress,
    archive_stub,
    compress,
    compress_verified,
    structured_summary,
)
from ctxscore.scoring.rules import extract_entities


def test_structured_summary_keeps_every_entity_and_drops_prose():
    text = (
        "Sure, I can help with that! I really appreciate your patience while I looked into it. "
        "Your reservation ZFA04Y is confirmed for 2024-05-20 at 10:30am. "
        "It was a pleasure to look this up for you. "
        "The total is $305.50, charged to card ending 7447."
    )
    out = structured_summary(text)
    for e in extract_entities(text):
        assert e.strip("'\"") in out
    assert "pleasure" not in out and "patience" not in out
    assert len(out) < len(text)


def test_structured_summary_of_json_is_key_value_lines():
    data = {"reservation_id": "HATHAT", "user_id": "mia_li_3668", "insurance": None, "flights": [{"flight_number": "HAT136", "date": "2024-05-20"}]}
    out = structured_summary(json.dumps(data, indent=2))
    assert "reservation_id=HATHAT" in out and "flight_number=HAT136" in out and "date=2024-05-20" in out
    assert "insurance" not in out  # nulls dropped


def test_aggressive_keeps_goal_and_conclusion():
    text = (
        "I need to find why the parser fails on empty input. "
        "Maybe it is the tokenizer, maybe the reader. "
        "I looked at several files without much luck. "
        "Therefore the bug is in the reader loop. "
        "Let me write the fix now."
    )
    out = aggressive_compress(text)
    assert out.splitlines() == [
        "I need to find why the parser fails on empty input.",
        "Therefore the bug is in the reader loop.",
        "Let me write the fix now.",
    ]


def test_compress_falls_back_when_an_entity_would_be_lost():
    # the ID sits in an exploratory middle sentence that a compressor blind to the key spans drops
    text = (
        "First I check the order. "
        "The order id is ORD-99812 and it shipped. "
        "Nothing else looks odd here. "
        "So I will answer the user."
    )

    class Blind:  # the extractive forms, without the key spans (what an LLM compressor may do)
        def compress(self, text, tier):
            return aggressive_compress(text) if tier == "compressed" else structured_summary(text)

    res = compress_verified(Blind(), text, "compressed")
    assert res.tier == "structured"
    assert "ORD-99812" in res.text and "ORD-99812" in res.missing
    # the extractive compressor is given the key spans: its compressed form keeps the ID's sentence
    kept = compress(text, "compressed")
    assert kept.tier == "compressed" and "The order id is ORD-99812 and it shipped." in kept.text
    assert "Nothing else looks odd here." not in kept.text
    # nothing can be dropped without losing an entity: stays verbatim
    tight = "Booked HAT136 for 2024-05-20."
    assert compress(tight, "structured").tier == "verbatim"


def test_archive_stub_format():
    assert archive_stub("m12", "Please book the flight to Seattle on May 20th for me thanks") == \
        "[archived m12: Please book the flight to Seattle on May …]"
    zh = archive_stub("m3", "请你帮我订一间酒店要求价格不超过五百元不要靠近机场谢谢你")
    assert zh.startswith("[archived m3: 请你帮我订") and zh.endswith(" …]")


@pytest.mark.parametrize(("text", "want"), [
    ("Refund issued: amount $1,250.00 on card ending 4417 for order 99812345 today",
     "[archived m4: Refund issued: amount …]"),  # was "$1": another amount
    ("message 4973: order ID-4417-XYZ-99 shipped to warehouse number twelve in the north",
     "[archived m4: message 4973: order …]"),  # was "ID-4": another order
    ("https://example.com/a/very/long/url/that/keeps/going/and/going/on",
     "[archived m4: https://example.com/a/ve…]"),  # one long word: cut, and it reads as cut
    ("请你帮我订一间酒店要求价格不超过五百元不要靠近机场谢谢你请你帮我订一间酒店要求价格不超过五百元不要靠近机场谢谢你",
     "[archived m4: 请你帮我订一间酒店要求价格不超过五百元不要靠近机 …]"),  # Chinese: cut by characters, as before
])
def test_an_archive_stub_never_splits_a_value(text, want):
    """A 5,000-message file showed 20 stubs reading "order ID-4 …", a different real order (a new
    user's report): the stub's cut fell inside a value."""
    assert archive_stub("m4", text) == want


def test_the_structured_summary_of_code_keeps_whole_lines_with_their_indentation():
    # a 2,333-character read of django/forms/fields.py was summarised as sentences: comments cut into
    # pieces without their '#', indentation stripped ("if self.localize:\nwidget.is_localized = True")
    from pathlib import Path

    from ctxscore.compress import verify
    from ctxscore.compress.extractive import code_like

    src = (Path(__file__).resolve().parents[1] / "ctxscore" / "window" / "history.py").read_text(encoding="utf-8")
    start = src.index("    def release_instructions")
    text = src[start:start + 2400]
    assert code_like(text)
    form = structured_summary(text)
    assert form and len(form) < len(text)
    lines = [line for line in form.split("\n") if line != "…"]
    indent = "    "  # the indentation every kept line of the method shares is left out, the rest kept
    assert all(indent + line in text.split("\n") for line in lines)  # whole lines, byte-exact
    assert lines[0].startswith("def release_instructions") and any(line.startswith("        ") for line in lines)
    assert verify(text, form).ok
    prose = "The booking is confirmed for May 20. Your reference is QX7P2L. Let me know if you need anything else."
    assert not code_like(prose) and structured_summary(prose) == "The booking is confirmed for May 20.\nYour reference is QX7P2L."


def test_prose_with_a_fenced_command_is_summarised_as_prose_and_code_as_whole_lines():
    from ctxscore.compress.extractive import code_like

    reply = ("Great news, everything is sorted out and your booking reference is QX7P2L for the flight on May 20. "
             "Run this to check it:\n```\nbooking status QX7P2L\n```\nLet me know if you need anything else.")
    assert not code_like(reply)
    form = structured_summary(reply)
    assert "QX7P2L" in form and "Great news" not in form
    dense = "def load_config(path):\n    data = json.loads(path.read_text())\n    data['db_url'] = os.environ['DB_URL']\n    return Config(**data)"
    assert code_like(dense)
    form = structured_summary(dense)
    assert form.split("\n") == dense.split("\n")[:3]  # whole lines with their indentation, not sentences


# A patch that replaces one line by three: the removed line holds key spans ("1:3"), the last added
# line none. Both forms kept the removed line and dropped the added one, so the form read as a patch
# that deletes the line; the compressed form also stripped the indentation of the context lines.
ISO_DIFF = '''diff --git a/src/dlite/parser/iso.py b/src/dlite/parser/iso.py
index 3e1f0a2..8c44d91 100644
--- a/src/dlite/parser/iso.py
+++ b/src/dlite/parser/iso.py
@@ -138,7 +138,9 @@ class IsoParser:
     def _parse_week(self, token):
-        week = int(token[1:3])
+        if token.startswith("W"):
+            token = token[1:]
+        week = int(token[:2])
         if not 1 <= week <= 53:
             raise ValueError(f"invalid ISO week: {week}")
         return week

Applied patch OK.'''

# The output of `git diff` in a mini-SWE-agent trajectory (django__django-14915): two files, one hunk
# adding a method, one adding a test.
DJANGO_DIFF = '''<returncode>0</returncode>
<output>
diff --git a/django/forms/models.py b/django/forms/models.py
index 5dcf923c12..7effb202e3 100644
--- a/django/forms/models.py
+++ b/django/forms/models.py
@@ -1166,6 +1166,9 @@ class ModelChoiceIteratorValue:
     def __str__(self):
         return str(self.value)
\x20
+    def __hash__(self):
+        return hash(self.value)
+
     def __eq__(self, other):
         if isinstance(other, ModelChoiceIteratorValue):
             other = other.value
diff --git a/tests/model_forms/test_modelchoicefield.py b/tests/model_forms/test_modelchoicefield.py
index 2a0c05d803..f6d82a8132 100644
--- a/tests/model_forms/test_modelchoicefield.py
+++ b/tests/model_forms/test_modelchoicefield.py
@@ -373,3 +373,13 @@ class ModelChoiceFieldTests(TestCase):
         )
         with self.assertNumQueries(2):
             template.render(Context({'form': CategoriesForm()}))
+
+    def test_model_choice_iterator_value_hashable(self):
+        field = forms.ModelChoiceField(Category.objects.all())
+        iterator = iter(field.choices)
+        next(iterator)  # Skip empty label
+        value, label = next(iterator)
+        # Ensure it can be used as a dict key
+        d = {value: 'test'}
+        self.assertEqual(d[value], 'test')
+        self.assertEqual(d[value.value], 'test')
</output>'''


def _change_groups(diff: str) -> list[list[str]]:
    """The runs of removed and added lines of a hunk (``---`` / ``+++`` file lines left out)."""
    groups: list[list[str]] = [[]]
    for line in diff.split("\n"):
        if line[:1] in ("-", "+") and not line.startswith(("--- ", "+++ ")):
            groups[-1].append(line)
        elif groups[-1]:
            groups.append([])
    return [g for g in groups if g]


def _assert_keeps_the_hunks(diff: str, form: str) -> None:
    """Whole lines of ``diff``, byte-exact, ``…`` between them where lines were left out; the file
    and hunk headers; and no removed line without the added lines that replace it."""
    original = diff.split("\n")
    lines = form.split("\n")
    kept = [line for line in lines if line != "…"]
    assert all(line in original for line in kept)  # indentation and all
    at = [original.index(line) for line in kept]
    assert at == sorted(at)
    for a, b in zip(lines, lines[1:], strict=False):
        if a != "…" and b != "…":  # adjacent in the form: adjacent in the diff, blank lines aside
            gap = original[original.index(a) + 1:original.index(b)]
            assert not any(g.strip() for g in gap), (a, b)
    heads = [line for line in original if line.startswith(("diff --git ", "--- ", "+++ ", "@@ "))]
    assert all(h in kept for h in heads)
    for group in _change_groups(diff):
        if any(line in kept for line in group if line[0] == "-"):
            assert all(line in kept for line in group if line[0] == "+"), group


def test_a_diff_keeps_the_added_lines_that_replace_a_kept_removed_line():
    for tier in ("structured", "compressed"):
        res = compress(ISO_DIFF, tier)
        assert res.tier == tier, res
        _assert_keeps_the_hunks(ISO_DIFF, res.text)
        assert "-        week = int(token[1:3])\n+        if token" in res.text
        assert "+        week = int(token[:2])\n         if not 1 <= week <= 53:" in res.text
        assert "…" in res.text  # the method's def line was left out


def test_the_forms_of_a_git_diff_output_keep_whole_lines_and_mark_gaps():
    for tier in ("compressed", "structured"):
        res = compress(DJANGO_DIFF, tier)
        assert res.tier == tier and len(res.text) < len(DJANGO_DIFF), res
        _assert_keeps_the_hunks(DJANGO_DIFF, res.text)
        assert "+        return hash(self.value)" in res.text  # not "+ return hash(self.value)"
    for form in (structured_summary(DJANGO_DIFF), aggressive_compress(DJANGO_DIFF)):  # the raw forms too
        _assert_keeps_the_hunks(DJANGO_DIFF, form)


def test_the_compressed_form_of_code_keeps_whole_lines_with_their_indentation():
    from pathlib import Path

    src = (Path(__file__).resolve().parents[1] / "ctxscore" / "window" / "history.py").read_text(encoding="utf-8")
    start = src.index("    def release_instructions")
    text = src[start:start + 2400]
    res = compress(text, "compressed")
    assert res.tier == "compressed", res
    original = text.split("\n")
    lines = [line for line in res.text.split("\n") if line != "…"]
    indent = "    "  # the indentation the kept lines share is left out, as in the structured form
    assert all(indent + line in original for line in lines)
    assert any(line.startswith("        ") for line in lines) and "…" in res.text


def test_a_short_patch_inside_prose_keeps_the_forms_short_and_its_change_whole():
    """Review: a diff anywhere in a message switched it to the whole-line form at any cost, so 3.3 KB
    of prose around a 5-line hunk was kept whole in every tier."""
    from ctxscore.compress.extractive import aggressive_compress, structured_summary

    prose = " ".join("The parser reads the token and then it checks the week handling in some detail, "
                     "which takes a while." for _ in range(18))
    patch = ("@@ -138,7 +138,9 @@ class IsoParser:\n     def _parse_week(self, token):\n"
             "-        week = int(token[1:3])\n+        week = int(token[:2])\n         return week")
    text = prose + "\n\n" + patch + "\n\n" + prose
    structured, compressed = structured_summary(text), aggressive_compress(text)
    assert len(structured) < len(text) / 4 and len(compressed) < len(text) / 4
    assert "-        week = int(token[1:3])\n+        week = int(token[:2])" in structured  # not the removal alone
