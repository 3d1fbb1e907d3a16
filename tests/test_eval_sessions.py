"""The evaluation session format: validator errors and LoCoMo input."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from eval.sessions import SessionFormatError, load_sessions, load_sessions_file

FIX = Path(__file__).parent / "fixtures"
MINI = FIX / "eval_sessions_mini.jsonl"


def _rows() -> list[dict]:
    return [json.loads(line) for line in MINI.read_text(encoding="utf-8").splitlines()]


def _write(tmp_path: Path, rows: list, raw_lines: list[str] = ()) -> Path:
    p = tmp_path / "s.jsonl"
    lines = [json.dumps(r, ensure_ascii=False) for r in rows] + list(raw_lines)
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def _errors(path: Path) -> list[str]:
    with pytest.raises(SessionFormatError) as ei:
        load_sessions_file(path)
    return ei.value.errors


def test_valid_fixture_loads_with_ids():
    ss = load_sessions(MINI)
    assert [s.session_id for s in ss] == ["mini/booking", "mini/trip"]
    b = ss[0]
    assert len(b.messages) == 12 and len(b.key_facts) == 6
    assert b.messages[3]["id"] == "mini/booking#3"
    # a value found only in tool-call arguments is accepted ("19:00" is in #4's arguments)
    assert next(f for f in b.key_facts if f.fact_id == "time").source_index == 4
    assert load_sessions(MINI, max_sessions=1)[0].session_id == "mini/booking"


def test_bad_source_index_and_value(tmp_path):
    rows = _rows()
    rows[0]["key_facts"][1]["source_index"] = 40
    rows[0]["key_facts"][2]["value"] = "20:30"
    errs = _errors(_write(tmp_path, rows))
    assert len(errs) == 2
    assert "line 1" in errs[0] and "'mini/booking'" in errs[0] and "'phone'" in errs[0]
    assert "source_index 40 is out of range" in errs[0] and "12 messages" in errs[0]
    assert "'time'" in errs[1] and "'20:30' is not an exact substring of messages[4]" in errs[1]


def test_missing_fields_and_types(tmp_path):
    rows = _rows()
    del rows[0]["key_facts"][0]["probe"]
    del rows[0]["key_facts"][3]["kind"]
    rows[0]["key_facts"][4]["source_index"] = "7"
    rows[1].pop("key_facts")
    errs = _errors(_write(tmp_path, rows))
    joined = "\n".join(errs)
    assert "fact 'restaurant': missing field(s) probe" in joined
    assert "fact 'table': missing field(s) kind" in joined
    assert "fact 'party': 'source_index' must be an integer" in joined
    assert "line 2 session 'mini/trip': 'key_facts' is missing" in joined


def test_bad_json_line_and_duplicates(tmp_path):
    rows = _rows()
    dup = copy.deepcopy(rows[1])
    rows[0]["key_facts"].append(dict(rows[0]["key_facts"][0]))
    p = _write(tmp_path, [rows[0], dup, dup], raw_lines=['{"session_id": "broken", "messages": ['])
    errs = _errors(p)
    joined = "\n".join(errs)
    assert "line 4: invalid JSON" in joined
    assert "fact 'restaurant': duplicate fact_id" in joined
    assert "line 3 session 'mini/trip': duplicate session_id" in joined
    # errors are listed in file order
    assert errs[-1].startswith("line 4")


def test_bad_messages_named(tmp_path):
    rows = _rows()
    rows[0]["messages"][2]["role"] = "robot"
    rows[1]["messages"] = []
    joined = "\n".join(_errors(_write(tmp_path, rows)))
    assert "session 'mini/booking' message 2: unknown role 'robot'" in joined
    assert "session 'mini/trip': 'messages' is missing or not a non-empty list" in joined


def test_superseded_rules(tmp_path):
    rows = _rows()
    rows[0]["key_facts"][4]["superseded"] = "6 people"  # equal to the value
    assert "'superseded' equals 'value'" in "\n".join(_errors(_write(tmp_path, rows)))
    rows = _rows()
    rows[0]["key_facts"][4]["superseded"] = "5 people"  # never stated earlier: a note, not an error
    (s, _) = load_sessions_file(_write(tmp_path, rows))
    assert len(s.notes) == 1 and "'5 people' does not occur" in s.notes[0]


def test_error_message_readable(tmp_path):
    rows = _rows()
    rows[0]["key_facts"][1]["source_index"] = -1
    with pytest.raises(SessionFormatError) as ei:
        load_sessions(_write(tmp_path, rows))
    msg = str(ei.value)
    assert "1 problem(s)" in msg and "docs/contracts.md" in msg and "'phone'" in msg


def test_missing_path_and_empty_dir(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_sessions(tmp_path / "nope.jsonl")
    with pytest.raises(FileNotFoundError, match="no .jsonl or .json"):
        load_sessions(tmp_path)


def test_folder_and_duplicate_across_files(tmp_path):
    (tmp_path / "a.jsonl").write_text(MINI.read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "b.json").write_text((FIX / "eval_locomo_toplevel.json").read_text(encoding="utf-8"), encoding="utf-8")
    ss = load_sessions(tmp_path)
    assert [s.session_id for s in ss] == ["mini/booking", "mini/trip", "locomo/conv-top"]
    (tmp_path / "c.jsonl").write_text(MINI.read_text(encoding="utf-8"), encoding="utf-8")
    with pytest.raises(SessionFormatError, match="already defined"):
        load_sessions(tmp_path)


def test_locomo_top_level_format():
    (s,) = load_sessions(FIX / "eval_locomo_toplevel.json")
    assert s.session_id == "locomo/conv-top" and len(s.messages) == 6
    # the adversarial (category 5) question is skipped; each value is in its evidence turn
    facts = {f.probe: f for f in s.key_facts}
    assert set(facts) == {"What is the name of Ana's dog?", "Where does Ana's sister live?",
                          "How far did Ana hike on Sunday?"}
    assert facts["Where does Ana's sister live?"].value == "Porto"
    assert facts["Where does Ana's sister live?"].source_index == 2
    assert facts["How far did Ana hike on Sunday?"].source_index == 4
    assert s.messages[0]["role"] == "user" and s.messages[1]["role"] == "assistant"


def test_locomo_conversation_key_format():
    path = FIX / "locomo_mini.json"
    if not path.is_file():
        pytest.skip("tests/fixtures/locomo_mini.json (the data helper's fixture) is absent")
    ss = load_sessions(path)
    assert ss and all(s.session_id.startswith("locomo/") for s in ss)
    for s in ss:
        for f in s.key_facts:
            assert f.value in s.messages[f.source_index]["content"]
