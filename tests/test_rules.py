"""Rule classifier, signals, entity patterns and the rule file."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

import pytest

from ctxscore.errors import ConfigError
from ctxscore.messages import Message
from ctxscore.scoring.rules import (
    DEFAULT_RULES_PATH,
    SIGNAL_NAMES,
    RuleClassifier,
    RuleConfig,
    _caseless_body,
    _scan_typed,
    casefold_text,
    default_config,
    extract_entities,
    typed_entity_spans,
)


def cls(role: str, content: str, **kw) -> str:
    return RuleClassifier().predict_one(Message(role=role, content=content, **kw)).category


# Labels below follow the annotation guide (../shared/datasets/labels/README.md).
@pytest.mark.parametrize(
    ("role", "content", "expected"),
    [
        ("system", "You are a support agent. Never reveal internal notes.", "instruction"),
        ("user", "Please book a table for 4 people at 7pm, and it must be vegetarian.", "instruction"),
        ("user", "请你帮我订一间酒店，要求价格不超过500元，不要靠近机场。", "instruction"),
        ("user", "Thanks, bye!", "failure"),
        ("user", "谢谢，再见！", "failure"),
        ("tool", "Error: reservation ZFA04Y not found", "failure"),
        ("user", "<returncode>1</returncode>\n<output>Traceback (most recent call last):\n  File \"a.py\", line 3\nValueError: bad</output>", "failure"),
        ("assistant", "THOUGHT: Let me first check how the parser handles this case, then I will look at the tests.\n\n```bash\ngrep -rn parse src/\n```", "reasoning"),
        ("user", "My user ID is mia_li_3668.", "key_state"),
    ],
)
def test_rule_categories(role, content, expected):
    assert cls(role, content) == expected


def test_signals_have_fixed_names_and_bounds():
    rc = RuleClassifier()
    sig = rc.signals(Message.from_dict({"role": "user", "content": "Please fix bug #123 in src/app.py before Friday."}))
    assert tuple(sig) == SIGNAL_NAMES == rc.signal_names
    assert sig["request"] >= 1 and sig["constraint"] >= 1 and sig["role_user"] == 1.0
    assert all(0.0 <= v <= 3.0 for v in sig.values())


def test_probabilities_are_a_distribution():
    p = RuleClassifier().predict_one(Message.from_dict({"role": "assistant", "content": "Booked: confirmation HAT123."}))
    assert abs(sum(p.probs.values()) - 1.0) < 1e-9
    assert p.category == max(p.probs, key=p.probs.get)


def test_entities_english():
    text = (
        "Booked flight HAT136 on 2024-05-20 at 10:30am for $305.50; email mia.li@example.com, "
        "see https://example.com/r/1 and src/pkg/module.py; 3 bags, reservation 'ZFA04Y'."
    )
    ents = extract_entities(text)
    for expected in ["HAT136", "2024-05-20", "10:30am", "$305.50", "mia.li@example.com", "https://example.com/r/1",
                     "src/pkg/module.py", "3 bags"]:
        assert any(expected in e for e in ents), (expected, ents)


@pytest.mark.parametrize(
    ("text", "entity", "kind"),
    [  # the spoken times and dates of SGD's dialogues: whole, so that a compressed form keeps them whole
        ("It will be for half past 11 in the morning.", "half past 11 in the morning", "time"),
        ("Book it for the 6th at quarter to 6 in the evening.", "quarter to 6 in the evening", "time"),
        ("Book it for the 6th at quarter to 6 in the evening.", "the 6th", "date_words"),
        ("I leave at 5:15 in the evening.", "5:15 in the evening", "time"),
        ("Two in the afternoon would be a good time.", "Two in the afternoon", "time"),
        ("What will it be like on the 14th of this month?", "the 14th of this month", "date_words"),
        ("I plan to fly on the 9th of March.", "the 9th of March", "date_words"),
        ("Let's go Tuesday next week.", "Tuesday next week", "weekday"),
    ],
)
def test_spoken_times_and_dates_are_one_entity(text, entity, kind):
    assert (entity, kind) in [(text[a:b], k) for a, b, k in typed_entity_spans(text)]


@pytest.mark.parametrize(
    "text",
    [  # counts, ordinals and versions that only look like spoken times and dates
        "Click the 2nd button, then the 3rd option.",
        "This is the 4th time it failed.",
        "It will be the 5th time.",
        "Revenue grew from last quarter to 150 units.",
        "We sold 40 in the morning and 25 in the afternoon.",
        "Take one in the morning and one at night.",
        "Python 3.10 in the morning",
        "Meet me at the 3rd Street Cinema.",
    ],
)
def test_look_alikes_are_no_time_or_date(text):
    got = [(text[a:b], k) for a, b, k in typed_entity_spans(text) if k in ("time", "date_words", "weekday")]
    assert got == []


def test_entities_chinese():
    ents = extract_entities("请在2024年5月20日下午3点前预订，预算500元，3人，住2晚。")
    for expected in ["2024年5月20日", "下午3点", "500元", "3人", "2晚"]:
        assert any(expected in e for e in ents), (expected, ents)


def test_custom_rule_file_changes_behaviour(tmp_path):
    text = DEFAULT_RULES_PATH.read_text(encoding="utf-8")
    custom = tmp_path / "rules.toml"
    custom.write_text(text.replace("failure = 0.1", "failure = 0.05").replace('  "hi", "hello",', '  "hi", "hello", "ahoy",'), encoding="utf-8")
    cfg = RuleConfig.load(custom)
    assert cfg.base_weights["failure"] == 0.05
    assert RuleClassifier(cfg).signals(Message.from_dict({"role": "user", "content": "ahoy"}))["pleasantry"] == 1.0
    assert RuleClassifier().signals(Message.from_dict({"role": "user", "content": "ahoy"}))["pleasantry"] == 0.0


def test_pattern_prefilters_never_change_the_entities():
    """A prefilter only skips a pattern on texts where it cannot match: on every bundled message the
    typed entities are those of a scan without the prefilters."""
    cfg = default_config()
    assert {"weekday", "money", "status"} <= set(cfg.requires) and cfg.requires["weekday"] == ("day", "tonight", "tomorrow")
    bare = dataclasses.replace(cfg, requires={})
    path = Path(__file__).resolve().parents[1] / "data" / "bundled" / "sessions.jsonl"
    texts = [m["content"] for line in path.read_text(encoding="utf-8").splitlines()
             for m in json.loads(line)["messages"] if m.get("content")]
    texts += ["Monday 9am, $40 or 300 USD; gold member, 2024-05-01, 5/6, #tag, a.py, my_var, x.y(), 'q', 下午3点, 50元",
              "MONDAY at NOON costs 40 DOLLARS for a GOLD MEMBER", "明天下午3点，500人民币", "See you tomorrow night",
              # letters the regex engine matches case-insensitively to ASCII ones that str.lower does not lower to them
              "See you TONİGHT", "see you tonıght", "a first claſs seat", "40 uſd", "business cabİn"]
    assert len(texts) > 1000
    skipped = 0
    for t in texts:
        assert _scan_typed(t, cfg) == _scan_typed(t, bare), t[:80]
        skipped += not any(n in t.lower() for n in cfg.requires["weekday"])
    assert skipped > len(texts) // 2  # the weekday pattern is skipped on most messages


def test_case_insensitive_patterns_run_on_the_folded_text_find_the_same_spans():
    """The (?i) patterns run case-sensitively on the case-folded text: on every bundled message and on
    the letters IGNORECASE matches to ASCII ones that str.lower does not lower to them (ſ, ı, İ, the
    Kelvin sign), the typed entities are those of the IGNORECASE regexes on the text itself."""
    cfg = default_config()
    folded = {name for name, (_, on) in zip(cfg.patterns, cfg.scan_regexes, strict=True) if on}
    assert {"date_words", "time", "weekday", "count_noun", "number_unit", "status"} <= folded
    assert not folded & {"money", "proper_name", "code3"}  # scoped (?i:...) or upper-case letters: run as written
    plain = dataclasses.replace(cfg)
    plain.__dict__["scan_regexes"] = [(rx, False) for rx in cfg.entity_regexes]
    path = Path(__file__).resolve().parents[1] / "data" / "bundled" / "sessions.jsonl"
    texts = [m["content"] for line in path.read_text(encoding="utf-8").splitlines()
             for m in json.loads(line)["messages"] if m.get("content")]
    texts += [t.upper() for t in texts[:200]]
    texts += ["MONDAY at 9 AM, THE 14TH OF THIS MONTH, 2 FREE CHECKED BAGS, 30 MINUTES", "half paſt 11 in the morning",
              "Tueſday next week", "on the 3rd of Aprıl", "see you tonİght", "2 checked bagſ, 5 \u212aG", "FIRST CLAſS"]
    for t in texts:
        assert _scan_typed(t, cfg) == _scan_typed(t, plain), t[:80]
    assert ("half paſt 11 in the morning", "time") in [("half paſt 11 in the morning"[a:b], k)
                                                      for a, b, k in _scan_typed("half paſt 11 in the morning", cfg)]


def test_a_case_insensitive_pattern_naming_an_upper_case_letter_runs_as_written(tmp_path):
    text = DEFAULT_RULES_PATH.read_text(encoding="utf-8")
    text = re.sub(r"(?m)^code3 = '", "code3 = '(?i)", text)
    custom = tmp_path / "rules.toml"
    custom.write_text(text, encoding="utf-8")
    cfg = RuleConfig.load(custom)
    assert cfg.patterns["code3"].startswith("(?i)")
    on = dict(zip(cfg.patterns, (f for _, f in cfg.scan_regexes), strict=True))
    assert on["code3"] is False and on["time"] is True
    assert ("abc", "code3") in [("go abc now"[a:b], k) for a, b, k in _scan_typed("go abc now", cfg)]


# Texts holding what IGNORECASE and lower-casing treat differently: letters and the punctuation between
# the two ASCII alphabets, final sigma, micro sign, title-case digraphs, ſ, ı, İ, the Kelvin sign.
_CASE_TEXTS = ["A a Z z @ [ ^ _ ` { Aa aA AA", "ΣΑΣ σας ς µ μ Μ", "ǅ ǆ Ǆ", "paſt Aprıl tonİght 5 \u212aG",
               "失败 错误 not found NOT FOUND Not Found", "x1 X1 abc-DEF_ghi"]


def _folded_spans(body: str, text: str) -> list[tuple[int, int]]:
    return [m.span() for m in re.finditer(body, casefold_text(text))]


@pytest.mark.parametrize("pattern", [r"(?i)[a-z0-9_-]+", r"(?i)\bnot found\b|失败|错误", r"(?i)[!-/]\d|x\.?1",
                                     r"(?i)(?:abc)(?=-)(?<!x)[^a-z ]", r"(?i)[一-龥]+|\w+_\w+"])
def test_an_accepted_case_insensitive_pattern_finds_the_same_spans_on_the_folded_text(pattern):
    body = _caseless_body(pattern)
    assert body == pattern[4:]
    for t in _CASE_TEXTS:
        assert _folded_spans(body, t) == [m.span() for m in re.finditer(pattern, t)], t


# Run naively (without the flag) on the folded text, each finds other spans than under IGNORECASE.
_FOLD_DIFFERS = [r"(?i)[@-_]", r"(?i)[0-_]", r"(?i)\x41", r"(?i)\101", r"(?i)a(?-i:a)", "(?i)σ", "(?i)µ", "(?i)A"]


@pytest.mark.parametrize("pattern", _FOLD_DIFFERS + [r"(?i)(a)\1", r"(?i)(?P<n>a)(?P=n)", r"(?i)\N{LATIN SMALL LETTER A}", "(?i)ǆ"])
def test_a_case_insensitive_pattern_the_folded_text_may_read_differently_runs_as_written(pattern):
    """Refused: escapes naming a character or a group, ranges across the letters, inline flags, cased
    non-ASCII characters (the last four are refused although they would read the same)."""
    assert _caseless_body(pattern) is None
    if pattern in _FOLD_DIFFERS:
        assert any(_folded_spans(pattern[4:], t) != [m.span() for m in re.finditer(pattern, t)] for t in _CASE_TEXTS)


def test_the_folded_text_keeps_every_position():
    assert all(len(casefold_text(chr(c))) == 1 for c in range(sys.maxunicode + 1))
    assert casefold_text("paſt İstanbul ıK") == "past istanbul ik"


def test_a_prefilter_given_in_code_as_one_string_is_a_list_of_one():
    cfg = dataclasses.replace(default_config(), requires={"date_zh": "cjk", "url": "://", "weekday": "DAY"})
    assert cfg.requires == {"date_zh": ("cjk",), "url": ("://",), "weekday": ("day",)}
    assert ("明天", "date_zh") in [("明天下午"[a:b], k) for a, b, k in typed_entity_spans("明天下午", cfg)]


@pytest.mark.parametrize("value", ["[]", '[""]', "[1]", '""', "3", '["cjk", 3]'])
def test_a_bad_pattern_prefilter_is_refused(tmp_path, value):
    text = DEFAULT_RULES_PATH.read_text(encoding="utf-8").replace('weekday = ["day", "tonight", "tomorrow"]', f"weekday = {value}")
    bad = tmp_path / "rules.toml"
    bad.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=r"\[pattern_requires\] maps pattern names .* a non-empty string or a list"):
        RuleConfig.load(bad)


def test_missing_rule_file(tmp_path):
    with pytest.raises(ConfigError, match="rule file not found"):
        RuleConfig.load(tmp_path / "nope.toml")


def test_corrupt_rule_files(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[base_weights\ninstruction = ", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid TOML"):
        RuleConfig.load(bad)
    bad.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="not UTF-8"):
        RuleConfig.load(bad)
    text = DEFAULT_RULES_PATH.read_text(encoding="utf-8")
    bad.write_text(text.replace("instruction = 0.4", "instruction = 4.0"), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"base_weights.instruction must be a number in \[0, 1\]"):
        RuleConfig.load(bad)
    bad.write_text(text.replace("hash_tag = '#[A-Za-z0-9_]+'", "hash_tag = '#[A-Z'"), encoding="utf-8")
    with pytest.raises(ConfigError, match="patterns.hash_tag is not a valid regex"):
        RuleConfig.load(bad)
    bad.write_text(text.replace("code = -1.0", "kode = -1.0", 1), encoding="utf-8")
    with pytest.raises(ConfigError, match="is not a signal"):
        RuleConfig.load(bad)


@pytest.mark.parametrize(("text", "want"), [
    ("您的订单号是SH2025052301，客服电话是4008201234。", {("id_mixed", "sh2025052301"), ("long_number", "4008201234")}),
    ("我的手机号是13912345678。", {("long_number", "13912345678")}),
    ("会员号是GM8827361", {("id_mixed", "gm8827361")}),
    ("金卡会员价882元/晚", {("money", "882元")}),  # an amount per night, not a path
    ("我的邮箱是wangli@example.com", {("email", "wangli@example.com")}),
    ("日期是2025-05-20入住", {("datetime_iso", "2025-05-20")}),
    ("从PEK出发", {("code3", "pek")}),
    ("路径是src/app/main.py", {("path", "src/app/main.py")}),
    ("乘G1次列车，共2人", {("id_mixed", "g1次"), ("number_unit", "2人")}),  # a train number, not the count 1次
    ("D2315次列车", {("id_mixed", "d2315次")}),
    ("纪念讲堂北侧B1层", {("id_mixed", "b1层")}),  # a basement level, not "1层"
    ("KTV唱2小时，大床房x2间，AB3间", {("code3", "ktv"), ("number_unit", "2小时"), ("number_unit", "2间"), ("number_unit", "3间")}),
    ("müller@firma.de or info@bücher.de", {("email", "müller@firma.de"), ("email", "info@bücher.de")}),  # accented: as before
])
def test_values_written_right_after_chinese_characters_are_found(text, want):
    # Python's \b finds no edge between a Chinese character and a letter or digit (both are \w):
    # the order number and the phone were no key span, and compressed forms dropped them
    from ctxscore.scoring.rules import typed_values

    assert typed_values(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("The cost will be 16.6 GBP and your reference number is QQ53PXEI .", {("money", "16.6 gbp"), ("id_mixed", "qq53pxei")}),
    ("The total cost will be 120.16GBP .", {("money", "120.16gbp")}),  # was the id 16GBP and the amount lost
    ("A room is 95 GBP a night, 30 euros for breakfast.", {("money", "95 gbp"), ("money", "30 euros")}),
    ("The checked bag limit is 50 pounds.", {("count_noun", "50 pounds")}),  # a weight with its noun, not money
    ("订周五晚上7点4个人的位子。", {("date_zh", "周五"), ("time_zh", "晚上7点"), ("number_unit", "4个")}),  # was 晚上7点4
    ("Actually Wednesday.", {("weekday", "wednesday")}),  # was the name "Actually Wednesday"
    ("On Thursday we fly with United Airlines.", {("weekday", "thursday"), ("proper_name", "united airlines")}),
    ("That is 5000 yen or 40 yuan.", {("money", "5000 yen"), ("money", "40 yuan")}),
])
def test_amounts_in_more_currencies(text, want):
    # MultiWOZ states prices as "16.6 GBP": no entity held the amount, so a summary could drop it;
    # a time's minutes are not the count after them, and a sentence's first word and a weekday are no name
    from ctxscore.scoring.rules import typed_values

    assert typed_values(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("Don't touch src/legacy/ at all.", ("Don't touch src/legacy/ at all.",)),
    ("Fix the parser. Don't use match statements, we target 3.9.", ("Don't use match statements, we target 3.9.",)),
    ("Keep every changelog line under 80 characters.", ("Keep every changelog line under 80 characters.",)),
    ("Avoid Ryanair, please.", ("Avoid Ryanair, please.",)),
    ("Please, don't add any insurance.", ("Please, don't add any insurance.",)),
    ("I don't know yet.", ()),
    ("Don't worry about it.", ()),
    ("The cat sleeps under the table.", ()),
])
def test_imperative_prohibitions_and_number_bounds_are_hard_constraints(text, want):
    """ "Do not touch src/legacy/" was pinned and "Don't touch src/legacy/" archived (a new user's report)."""
    from ctxscore.scoring.rules import hard_constraints

    assert hard_constraints(text) == want


def test_a_dont_rule_stays_in_the_window():
    from ctxscore import ContextManager

    cm = ContextManager(budget=1000, scorer="rules")
    cm.extend([{"role": "system", "content": "You are a coding agent."},
               {"role": "user", "content": "Fix the failing date parser tests."},
               {"role": "user", "content": "Don't touch src/legacy/ at all."}])
    for i in range(8):
        cm.extend([{"role": "assistant", "content": "", "tool_calls": [{"id": f"c{i}", "type": "function", "function": {
                       "name": "bash", "arguments": '{"command": "pytest -q"}'}}]},
                   {"role": "tool", "tool_call_id": f"c{i}", "content": f"run {i}: " + "E   AssertionError: week 1 != 2\n" * 20},
                   {"role": "user", "content": f"Go on with attempt {i + 1}."}])
    assert "Don't touch src/legacy/ at all." in [m["content"] for m in cm.build().messages]
