"""The ctxscore command line: compress, score, inspect, and its errors."""

from __future__ import annotations

import json

from ctxscore.cli import main

SESSION = [
    {"role": "system", "content": "You are a travel agent. Never book without confirmation."},
    {"role": "user", "content": "Please find a hotel in Cambridge for 3 nights under $200 a night."},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "find_hotel", "arguments": "{\"city\": \"Cambridge\"}"}}]},
    {"role": "tool", "tool_call_id": "c1", "name": "find_hotel", "content": "{\"name\": \"Acorn Guest House\", \"price\": 150, \"ref\": \"7GAWK763\"}"},
    {"role": "assistant", "content": "The Acorn Guest House costs $150 a night. Shall I book it?"},
    {"role": "user", "content": "Yes, book it."},
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def test_compress_writes_window(tmp_path, capsys):
    src, out = tmp_path / "s.jsonl", tmp_path / "w.json"
    write_jsonl(src, SESSION)
    assert main(["compress", str(src), "--budget", "4000", "--model", "rules", "--out", str(out)]) == 0
    win = json.loads(out.read_text(encoding="utf-8"))
    assert win["budget"] == 4000 and len(win["decisions"]) == len(SESSION)
    assert win["messages"][0]["content"] == SESSION[0]["content"]
    assert win["tokens"] <= 4000
    assert "wrote" in capsys.readouterr().err


def test_json_array_input_and_score(tmp_path, capsys):
    src = tmp_path / "s.json"
    src.write_text(json.dumps(SESSION), encoding="utf-8")
    assert main(["score", str(src), "--model", "rules"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["id"] for r in rows] == [f"m{i}" for i in range(len(SESSION))]
    assert rows[0]["category"] == "instruction"
    assert all(0 <= r["value"] <= 1 and abs(sum(r["probs"].values()) - 1) < 1e-3 for r in rows)
    assert "recency" in rows[1]["factors"]


def test_score_session_jsonl_carries_session_and_index(tmp_path, capsys):
    src = tmp_path / "sessions.jsonl"
    write_jsonl(src, [{"session_id": "a", "messages": SESSION, "key_facts": []}, {"session_id": "b", "messages": SESSION[:2]}])
    assert main(["score", str(src), "--model", "rules"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["session_id"], r["index"]) for r in rows] == [("a", i) for i in range(6)] + [("b", 0), ("b", 1)]


def test_inspect_prints_table(tmp_path, capsys):
    src = tmp_path / "s.jsonl"
    write_jsonl(src, SESSION)
    assert main(["inspect", str(src), "--budget", "4000", "--model", "rules"]) == 0
    out = capsys.readouterr().out
    assert "category" in out and "instruction" in out and "verbatim" in out


def test_errors_exit_2_with_line_numbers(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"role": "user", "content": "hi"}\n{"role": "user", "content": \n', encoding="utf-8")
    assert main(["compress", str(bad), "--budget", "100", "--model", "rules"]) == 2
    assert "line 2: invalid JSON" in capsys.readouterr().err
    bad.write_text('{"role": "user", "content": "hi"}\n{"role": "wizard", "content": "x"}\n', encoding="utf-8")
    assert main(["score", str(bad), "--model", "rules"]) == 2
    assert "line 2: unknown role 'wizard'" in capsys.readouterr().err
    # a tool message without its call was named by its position alone ("message 1")
    bad.write_text('{"role": "user", "content": "hi"}\n\n{"role": "tool", "tool_call_id": "zz", "content": "x"}\n',
                   encoding="utf-8")
    assert main(["inspect", str(bad), "--budget", "100"]) == 2
    assert "bad.jsonl: line 3: tool message answers tool_call_id 'zz'" in capsys.readouterr().err
    bad.write_text('{"role": "user", "content": "hi", "id": "a"}\n{"role": "user", "content": "again", "id": "a"}\n',
                   encoding="utf-8")
    assert main(["score", str(bad), "--model", "rules"]) == 2
    assert "line 2: message id 'a' was already added" in capsys.readouterr().err
    bad.write_bytes(b'{"role": "user", "content": "hi"}\n{"role": "user", "content": "caf\xe9"}\n')
    assert main(["score", str(bad), "--model", "rules"]) == 2
    err = capsys.readouterr().err
    assert "line 2" in err and "not valid UTF-8" in err
    assert main(["score", str(tmp_path / "missing.jsonl"), "--model", "rules"]) == 2
    assert "file not found" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n", encoding="utf-8")
    assert main(["score", str(empty), "--model", "rules"]) == 2
    assert "empty" in capsys.readouterr().err
    rules = tmp_path / "r.toml"
    rules.write_text("not = [valid", encoding="utf-8")
    src = tmp_path / "ok.jsonl"
    write_jsonl(src, SESSION)
    assert main(["score", str(src), "--model", "rules", "--rules", str(rules)]) == 2
    assert "not valid TOML" in capsys.readouterr().err


def test_a_recursion_error_is_reported_as_too_deep_only_when_reading(tmp_path, capsys, monkeypatch):
    """main() turned any RecursionError into "the input nests too deeply": a bug in a command (here the
    window build) was misreported as bad input. Only reading the input turns it into an error naming
    the file (and line); a tool call whose arguments string nests 990 levels (read, but too deep for
    the ledger's JSON reader) was "too deeply" too: it is processed, its call gives no facts."""
    import pytest  # noqa: PLC0415

    from ctxscore.window import ingest  # noqa: PLC0415
    from ctxscore.window.manager import ContextManager  # noqa: PLC0415

    src = tmp_path / "s.jsonl"
    deep = "[" * 990 + "]" * 990
    write_jsonl(src, [*SESSION[:2], {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c9", "type": "function", "function": {"name": "find_hotel", "arguments": deep}}]},
        {"role": "tool", "tool_call_id": "c9", "content": "none"}])
    for cmd in (["compress", str(src), "--budget", "4000"], ["score", str(src)]):
        assert main([*cmd, "--model", "rules"]) == 0, capsys.readouterr().err
    capsys.readouterr()

    def bug(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded")

    with monkeypatch.context() as m:
        m.setattr(ContextManager, "build", bug)
        with pytest.raises(RecursionError):
            main(["compress", str(src), "--budget", "4000", "--model", "rules"])
    with monkeypatch.context() as m:
        m.setattr(ingest, "validate", bug)
        assert main(["score", str(src), "--model", "rules"]) == 2
        assert f"{src}: the JSON nests arrays and objects too deeply to be read" in capsys.readouterr().err
