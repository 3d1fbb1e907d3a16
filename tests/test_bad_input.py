"""The bad-input catalogue (docs/bad-input.md): every kind tried, as a test.

Each test is registered under the catalogue id of the row it keeps true (``@case``); the last test
checks that the catalogue and the registered tests name the same ids with the same outcome
(``error``: a clear error and nothing stored is lost; ``handled``: the right result).
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ctxscore import ConfigError, ContextManager, InputError, Message, Policy
from ctxscore.cli import main
from ctxscore.compress import structured_summary
from ctxscore.errors import StoreError
from ctxscore.io import read_sessions
from ctxscore.scoring.base import Prediction
from ctxscore.scoring.rules import RuleConfig
from ctxscore.window.result import WarningKind

REPO = Path(__file__).resolve().parents[1]
CATALOGUE = REPO / "docs" / "bad-input.md"
REGISTERED: dict[str, str] = {}


def case(cid: str, outcome: str):
    """Register a test as the check of catalogue row ``cid`` with ``outcome`` (error | handled)."""
    assert outcome in ("error", "handled")

    def deco(fn):
        assert cid not in REGISTERED, cid
        REGISTERED[cid] = outcome
        return fn
    return deco


def rules_cm(budget: int = 4000, **kw) -> ContextManager:
    return ContextManager(budget=budget, scorer="rules", **kw)


def call(cid: str, name: str = "lookup", args: str = "{}") -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [{"id": cid, "type": "function",
                                                                 "function": {"name": name, "arguments": args}}]}


# -- data lost ----------------------------------------------------------------------------------
@case("D1", "handled")
def test_explicit_id_then_automatic_ids():
    cm = rules_cm()
    cm.add({"role": "user", "content": "first", "id": "m1"})
    got = [cm.add({"role": "user", "content": f"next {i}"}).id for i in range(3)]
    assert got == ["m1-1", "m2", "m3"] and len(cm) == 4


@case("D2", "handled")
def test_four_threads_on_one_manager():
    cm = rules_cm(budget=2000)
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for i in range(300):
                cm.add({"role": "user" if i % 2 else "assistant", "content": f"thread {t} message {i}"})
                if i % 50 == 0:
                    cm.build()
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    ids = [m.id for m in cm.messages]
    assert len(ids) == 1200 == len(set(ids)) and [m.turn for m in cm.messages] == list(range(1200))
    assert cm.store.count(cm.session_id) == 1200


@case("D3", "handled")
def test_two_managers_on_one_session(tmp_path):
    path = tmp_path / "shared.db"
    a = rules_cm(archive_path=path, session_id="s")
    b = rules_cm(archive_path=path, session_id="s")
    for i in range(40):
        (a if i % 2 else b).add({"role": "user", "content": f"message {i}"})
    assert len(a.build().decisions) == 40 and len(b.build().decisions) == 40
    assert [m.content for m in a.messages] == [m.content for m in b.messages] == [f"message {i}" for i in range(40)]
    a.close()
    b.close()


@case("D4", "handled")
def test_two_processes_append_to_one_session(tmp_path):
    path = tmp_path / "procs.db"
    code = (
        "import sys\nfrom ctxscore import ContextManager\n"
        "cm = ContextManager(budget=4000, scorer='rules', archive_path=sys.argv[1], session_id='s')\n"
        "for i in range(150):\n    cm.add({'role': 'user', 'content': f'{sys.argv[2]} {i}'})\ncm.close()\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path), name]) for name in ("left", "right")]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    cm = rules_cm(archive_path=path, session_id="s")
    texts = [m.content for m in cm.messages]
    assert len(texts) == 300 and len({m.id for m in cm.messages}) == 300
    assert sorted(texts) == sorted([f"left {i}" for i in range(150)] + [f"right {i}" for i in range(150)])


# -- crashes and misleading errors ---------------------------------------------------------------
@case("C1", "error")
def test_tool_call_function_as_string():
    cm = rules_cm()
    bad = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": "lookup"}]}
    with pytest.raises(InputError, match="'function' must be an object"):
        cm.add(bad)
    assert len(cm) == 0


@case("C2", "handled")
def test_deep_json_tool_result_does_not_break_builds():
    cm = rules_cm(budget=300)
    cm.add({"role": "user", "content": "Fetch the nested config please."})
    cm.add(call("c1"))
    deep = '{"a": ' * 3000 + '"ORD-99812"' + "}" * 3000
    cm.add({"role": "tool", "tool_call_id": "c1", "content": deep})
    for i in range(6):
        cm.add({"role": "user", "content": f"And what about item {i}?"})
        cm.add({"role": "assistant", "content": f"Item {i} is fine, nothing to change there at all."})
        assert cm.build().tokens > 0
    assert structured_summary(deep)  # summarised as text, not flattened


@case("C3", "error")
def test_lone_surrogate_is_refused_and_extend_stores_nothing(tmp_path, capsys):
    cm = rules_cm()
    with pytest.raises(InputError, match="lone surrogate"):
        cm.add({"role": "user", "content": "emoji half \ud83d here"})
    with pytest.raises(InputError, match="message 1: content holds a lone surrogate"):
        cm.extend([{"role": "user", "content": "fine"}, {"role": "user", "content": "bad \ud83d"}])
    assert len(cm) == 0 and cm.store.count(cm.session_id) == 0
    src = tmp_path / "s.jsonl"
    src.write_text('{"role": "user", "content": "bad \\ud83d"}\n', encoding="utf-8")
    assert main(["compress", str(src), "--budget", "100", "--model", "rules"]) == 2
    assert "lone surrogate" in capsys.readouterr().err


@case("C4", "error")
def test_query_of_the_wrong_type():
    cm = rules_cm()
    cm.add({"role": "user", "content": "hello there"})
    with pytest.raises(ConfigError, match="query must be a string"):
        cm.build(query=123)
    with pytest.raises(ConfigError, match="string query"):
        cm.search(123)


@case("C5", "error")
def test_scorer_returning_too_few_predictions():
    class Short:
        def predict(self, messages):
            return [Prediction("reasoning", {"reasoning": 1.0})][: len(messages) - 1]

    cm = ContextManager(budget=1000, scorer=Short())
    with pytest.raises(ConfigError, match="returned 1 predictions for 2 messages"):
        cm.extend([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    assert len(cm) == 0


@case("C6", "error")
def test_cli_folder_as_input(tmp_path, capsys):
    assert main(["compress", str(tmp_path), "--budget", "100", "--model", "rules"]) == 2
    assert "is a folder" in capsys.readouterr().err


@case("C7", "error")
def test_cli_out_in_a_missing_folder_or_a_folder(tmp_path, capsys):
    src = tmp_path / "s.jsonl"
    src.write_text('{"role": "user", "content": "Please book a table."}\n', encoding="utf-8")
    assert main(["compress", str(src), "--budget", "100", "--model", "rules", "--out", str(tmp_path / "no" / "w.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["compress", str(src), "--budget", "100", "--model", "rules", "--out", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err


@case("C8", "error")
def test_damaged_store_file(tmp_path):
    good = tmp_path / "good.db"
    cm = rules_cm(archive_path=good, session_id="s")
    cm.extend([{"role": "user", "content": f"message {i} " * 50} for i in range(30)])
    cm.close()
    raw = bytearray(good.read_bytes())
    raw[4096:8192] = os.urandom(4096)  # a damaged page
    bad = tmp_path / "bad.db"
    bad.write_bytes(bytes(raw))
    with pytest.raises(StoreError):
        rules_cm(archive_path=bad, session_id="s")
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database at all" * 50)
    with pytest.raises(StoreError, match="not modified"):
        rules_cm(archive_path=garbage)


@case("C9", "error")
def test_store_row_with_invalid_json(tmp_path):
    path = tmp_path / "row.db"
    cm = rules_cm(archive_path=path, session_id="s")
    cm.extend([{"role": "user", "content": "one"}, {"role": "user", "content": "two"}])
    cm.store._db.execute("UPDATE messages SET message='{oops' WHERE id='m1'")
    cm.close()
    with pytest.raises(StoreError, match="'m1' .*damaged"):
        rules_cm(archive_path=path, session_id="s")


@case("C10", "error")
def test_full_disk(tmp_path):
    cm = rules_cm(budget=400, archive_path=tmp_path / "full.db", session_id="s")
    for i in range(30):
        cm.add({"role": "user" if i % 2 else "assistant", "content": f"turn {i}: " + "details " * 20})
    (pages,) = cm.store._db.execute("PRAGMA page_count").fetchone()
    cm.store._db.execute(f"PRAGMA max_page_count={pages}")
    with pytest.raises(StoreError, match="full"):
        cm.add({"role": "user", "content": "x " * 100_000})
    assert len(cm) == 30  # nothing half-added
    cm.store._db.execute("UPDATE messages SET tier='verbatim'")  # fill the last free pages ...
    cm.store._db.execute("PRAGMA max_page_count=1")  # ... and refuse any write, as a full disk does
    win = cm.build(budget=200)
    assert win.tokens > 0 and len(win.decisions) == 30


@case("C11", "error")
def test_session_id_none():
    with pytest.raises(ConfigError, match="session_id must be a non-empty string"):
        ContextManager(budget=100, scorer="rules", session_id=None)


@case("C12", "handled")
def test_tiktoken_cache_files_are_readable_by_everyone(tmp_path, monkeypatch):
    from ctxscore.tokens import _cache_key, ensure_offline_encoding

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "shared"))
    d = ensure_offline_encoding("cl100k_base")
    mode = stat.S_IMODE((d / _cache_key("cl100k_base")).stat().st_mode)
    assert mode & 0o444 == 0o444, oct(mode)


# -- silent wrong results -------------------------------------------------------------------------
IMAGE = {"role": "user", "content": [
    {"type": "text", "text": "What does this receipt say?"},
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}}]}


@case("S1", "handled")
def test_image_parts_are_kept_in_window_and_store(tmp_path):
    cm = rules_cm(archive_path=tmp_path / "img.db", session_id="s")
    cm.add(IMAGE)
    assert cm.build().messages[0] == IMAGE
    assert cm.store.get("s", "m0").message.to_openai() == IMAGE
    assert cm.counter.count_message(cm.messages[0]) == 3 + cm.counter.count("user") + cm.counter.count(
        "What does this receipt say?") + 85


@case("S2", "error")
def test_non_string_name_and_other_parts():
    cm = rules_cm()
    with pytest.raises(InputError, match="'name' must be a string"):
        cm.add({"role": "user", "content": "hi", "name": 42})
    audio = {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}]}
    cm.add(audio)
    assert cm.build().messages[0] == audio


@case("S3", "error")
def test_tool_message_without_or_with_an_unknown_call():
    cm = rules_cm()
    with pytest.raises(InputError, match="needs 'tool_call_id'"):
        cm.add({"role": "tool", "content": "result"})
    with pytest.raises(InputError, match="no earlier assistant message made that call"):
        cm.add({"role": "tool", "tool_call_id": "nope", "content": "result"})
    cm.add(call("c1"))
    cm.add({"role": "tool", "tool_call_id": "c1", "content": "result"})
    assert len(cm) == 1 + 1


@case("S4", "handled")
def test_call_ids_are_counted():
    cm = rules_cm()
    long_id = "call_9b1deb4d-3b7d-4bad-9bdd-2b0d7b3dcb6d"
    a, b = Message.from_dict(call("c")), Message.from_dict(call(long_id))
    assert cm.counter.count_message(b) - cm.counter.count_message(a) == cm.counter.count(long_id) - cm.counter.count("c")


@case("S5", "handled")
def test_many_short_messages_collapse_into_stubs():
    cm = rules_cm(budget=300)
    for i in range(60):
        cm.add({"role": "assistant", "content": f"Noted item {i}."})
    win = cm.build()
    assert win.tokens <= 300
    assert sum(d.tier == "archived" for d in win.decisions) > 30
    assert not any(w.kind == WarningKind.OVER_BUDGET for w in win.warnings)


@case("S6", "handled")
def test_second_build_keeps_its_warnings():
    cm = rules_cm(budget=300)
    cm.add({"role": "system", "content": "Never do anything unsafe. " * 80})
    for i in range(10):
        cm.add({"role": "assistant", "content": f"Noted item {i}."})
    first, second = cm.build(), cm.build()
    assert [w.kind for w in first.warnings] == [w.kind for w in second.warnings]
    assert WarningKind.PINNED_OVER_BUDGET in [w.kind for w in second.warnings]


@case("S7", "handled")
def test_relaxing_recency_compacts_no_more_than_needed():
    cm = rules_cm(budget=400)
    cm.add({"role": "system", "content": "You book restaurants."})
    for i in range(4):
        cm.add({"role": "user", "content": f"Question {i}: what about the place number {i}?"})
        cm.add({"role": "assistant", "content": f"Place {i} has a terrace, seats {20 + i} people and opens at {i + 5}pm. "
                                                + "It is a nice place with good food and friendly staff. " * 9})
    cm.add({"role": "user", "content": "Book place 3 for tonight."})
    last = cm.add({"role": "assistant", "content": "Done: place 3 is booked for tonight, reference PL-3303."})
    win = cm.build()
    relaxed = [w for w in win.warnings if w.kind == WarningKind.RECENCY_RELAXED]
    assert len(relaxed) == 1
    assert win.tokens >= 0.6 * 400  # relaxation stops at the high-water mark, not below the low-water mark
    assert win.decisions[last.turn].tier == "verbatim" and "PL-3303" in json.dumps(win.messages)


@case("S8", "handled")
def test_structured_forms_keep_values_byte_exact_and_words_whole():
    out = structured_summary('{"total": 12.50, "refundable": false, "limit": 1e3, "count": 7.0}')
    # numbers and booleans keep their JSON pair as written: the spelling of each value stays
    assert '"total": 12.50' in out and '"refundable": false' in out and '"limit": 1e3' in out and '"count": 7.0' in out
    out = structured_summary('{"id": "ZX-4411", "paid": true, "price":12.50}')
    assert out == 'id=ZX-4411; "paid": true; "price":12.50'
    text = ("Okayama station at 9:15am is the meeting point. Thanksgiving is on 2024-11-28. Perfectly fine, the booking ZX-4411 holds. "
            "Okay, the total is $45.")
    out = structured_summary(text)
    assert "Okayama" in out and "Thanksgiving" in out and "Perfectly" in out and "the total is $45" in out


@case("S9", "handled")
def test_locomo_files_without_sample_id_are_named_after_the_file(tmp_path):
    from training.data.locomo import load_locomo

    conv = {"speaker_a": "Ann", "speaker_b": "Bob", "session_1_date_time": "1 May 2023",
            "session_1": [{"speaker": "Ann", "dia_id": "D1:1", "text": "I adopted a dog named Rex."},
                          {"speaker": "Bob", "dia_id": "D1:2", "text": "Lovely!"}]}
    names = []
    for stem in ("conv-26", "conv-30"):
        (tmp_path / f"{stem}.json").write_text(json.dumps({"conversation": conv, "qa": []}), encoding="utf-8")
        names += [s["session_id"] for s in load_locomo(tmp_path / f"{stem}.json")]
    assert names == ["locomo/conv-26", "locomo/conv-30"]


@case("S10", "handled")
def test_page_in_skipped_for_lack_of_room_is_warned():
    cm = rules_cm(budget=600)
    cm.add({"role": "system", "content": "Follow the rules. " * 100})
    cm.add({"role": "user", "content": "My booking reference is QX7-2231, remember it."})
    for i in range(12):
        cm.add({"role": "assistant", "content": f"Update {i}: the itinerary for day {i} is long. " + "Details. " * 20})
        cm.add({"role": "user", "content": f"ok {i}"})
    win = cm.build(query="what is my booking reference QX7-2231?")
    kinds = [w.kind for w in win.warnings]
    assert "QX7-2231" in json.dumps(win.messages) or WarningKind.PAGE_IN_SKIPPED in kinds


@case("S11", "error")
def test_recent_turns_zero_and_negative_page_in(tmp_path, capsys):
    with pytest.raises(ConfigError, match="page_in_k"):
        Policy(page_in_k=-1)
    src = tmp_path / "s.jsonl"
    turns = [{"role": "user", "content": f"And number {i}?"} if i % 2 == 0 else
             {"role": "assistant", "content": f"Here is the long answer number {i} with its details. " * 9} for i in range(12)]
    src.write_text("".join(json.dumps(m) + "\n" for m in turns), encoding="utf-8")
    verbatim = []
    for k in ("3", "0"):
        assert main(["inspect", str(src), "--budget", "600", "--model", "rules", "--recent-turns", k]) == 0
        verbatim.append(capsys.readouterr().out.count(" verbatim "))
    assert verbatim[1] < verbatim[0]  # with 0 recent turns only the newest message is protected


# -- more of the same classes ---------------------------------------------------------------------
@case("M1", "handled")
def test_window_and_caller_dicts_are_copies():
    cm = rules_cm()
    msg = call("c1", args='{"q": 1}')
    cm.add(msg)
    msg["tool_calls"][0]["function"]["arguments"] = "changed by the caller"
    w1 = cm.build()
    w1.messages[0]["tool_calls"][0]["id"] = "changed in the window"
    w2 = cm.build()
    assert w2.messages[0]["tool_calls"][0] == {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": 1}'}}


@case("M2", "error")
def test_message_is_immutable():
    m = Message.from_dict({"role": "user", "content": "hi"})
    with pytest.raises(AttributeError):
        m.content = "changed"  # type: ignore[misc]


@case("M3", "error")
def test_unknown_factor_in_the_rule_file(tmp_path):
    src = (REPO / "ctxscore" / "scoring" / "default_rules.toml").read_text(encoding="utf-8")
    bad = tmp_path / "rules.toml"
    bad.write_text(src.replace("recency_floor = 0.6", "recency_flor = 0.6"), encoding="utf-8")
    with pytest.raises(ConfigError, match="unknown key.*recency_flor"):
        RuleConfig.load(bad)


@case("M4", "error")
def test_budget_of_the_wrong_type():
    for bad in (1.5, True, "100", 0):
        with pytest.raises(ConfigError, match="positive whole number"):
            ContextManager(budget=bad, scorer="rules")


@case("M5", "error")
def test_tool_call_arguments_as_an_object():
    bad = call("c1")
    bad["tool_calls"][0]["function"]["arguments"] = {"q": 1}
    with pytest.raises(InputError, match="must be a JSON string"):
        rules_cm().add(bad)


@case("M6", "error")
def test_ids_of_the_wrong_type():
    cm = rules_cm()
    for bad in ([1], "  ", True):
        with pytest.raises(InputError, match="'id'"):
            cm.add({"role": "user", "content": "hi", "id": bad})


@case("M7", "handled")
def test_jsonl_with_a_byte_order_mark(tmp_path, capsys):
    src = tmp_path / "bom.jsonl"
    src.write_bytes(b"\xef\xbb\xbf" + json.dumps({"role": "user", "content": "Please book a table."}).encode() + b"\n")
    assert main(["score", str(src), "--model", "rules"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["role"] == "user"


@case("M8", "error")
def test_damaged_gzip_jsonl(tmp_path):
    from ctxscore.io import iter_jsonl

    p = tmp_path / "x.jsonl.gz"
    p.write_bytes(b"\x1f\x8b\x08\x00" + os.urandom(64))
    with pytest.raises(InputError, match="damaged"):
        list(iter_jsonl(p))


@case("M9", "error")
def test_store_path_is_a_folder(tmp_path):
    with pytest.raises(StoreError, match="folder"):
        rules_cm(archive_path=tmp_path)


@case("M10", "handled")
def test_sync_with_an_edited_history_keeps_the_originals():
    cm = rules_cm()
    hist = [{"role": "user", "content": "Book for 4 people."}, {"role": "assistant", "content": "Booked for 4."}]
    cm.sync(hist)
    res = cm.sync([hist[0] | {"content": "Book for 6 people."}])
    assert res.mode == "rebased" and res.kept == 0
    assert [m.content for m in cm.messages] == ["Book for 6 people."]
    assert [r.message.content for r in cm.store.load(res.detached)] == ["Book for 4 people.", "Booked for 4."]


@case("M11", "error")
def test_legacy_function_call_field():
    with pytest.raises(InputError, match="function_call"):
        rules_cm().add({"role": "assistant", "content": "", "function_call": {"name": "f", "arguments": "{}"}})


def test_a_reply_dumped_by_the_openai_sdk_is_accepted():
    # resp.choices[0].message.model_dump() always holds "function_call": None (and refusal, audio,
    # annotations as None): add() refused it as a legacy function call, the proxy accepted it
    openai = pytest.importorskip("openai")
    resp = openai.types.chat.ChatCompletion.model_validate({
        "id": "x", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": None,
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]}}]})
    dumped = resp.choices[0].message.model_dump()
    assert "function_call" in dumped and dumped["function_call"] is None
    cm = rules_cm()
    cm.add({"role": "user", "content": "List the files."})
    msg = cm.add(dumped)
    assert msg.tool_calls[0].id == "call_1" and cm.build().messages[-1]["tool_calls"][0]["function"]["name"] == "bash"


@case("M12", "error")
def test_duplicate_id_within_a_batch():
    cm = rules_cm()
    with pytest.raises(InputError, match="already added"):
        cm.extend([{"role": "user", "content": "a", "id": "x"}, {"role": "user", "content": "b", "id": "x"}])
    assert len(cm) == 0


@case("M13", "error")
def test_policy_of_the_wrong_type():
    with pytest.raises(ConfigError, match="Policy"):
        ContextManager(budget=100, scorer="rules", policy={"recent_turns": 2})
    with pytest.raises(ConfigError, match="recent_turns"):
        Policy(recent_turns=2.5)


@case("M14", "error")
def test_tool_calls_on_a_user_message():
    with pytest.raises(InputError, match="only assistant messages"):
        rules_cm().add(call("c1") | {"role": "user"})


@case("M15", "error")
def test_a_lone_surrogate_anywhere_in_a_proxy_request():
    pytest.importorskip("fastapi")
    from starlette.testclient import TestClient

    from ctxscore.serve import create_app

    bodies = {  # the proxy's JSON fallback reads them; each field was a bare 500 before
        "messages[0].content": b'{"model":"m","messages":[{"role":"user","content":"hi \\ud83d"}]}',  # no session id
        "tools[0].function.description": b'{"model":"m","messages":[{"role":"user","content":"hi"}],'
                                         b'"tools":[{"type":"function","function":{"name":"f","description":"x \\ud83d"}}]}',
        "user": b'{"model":"m","messages":[{"role":"user","content":"hi"}],"user":"\\ud83d"}',
    }
    with TestClient(create_app("http://127.0.0.1:9/v1", 1000, scorer="rules", warm=False)) as c:
        for where, body in bodies.items():
            r = c.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
            assert r.status_code == 400, (where, r.text)
            assert r.json()["error"]["message"].startswith(f"{where} holds a lone surrogate")


@case("M17", "error")
def test_a_proxy_request_nested_too_deeply():
    pytest.importorskip("fastapi")
    from starlette.testclient import TestClient

    from ctxscore.serve import create_app

    def nested(depth: int) -> bytes:  # a tool's JSON schema nested ``depth`` levels below the body
        return (b'{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":'
                b'{"name":"f","parameters":' + b'{"a":' * depth + b"1" + b"}" * depth + b"}}]}")

    # 990 levels: orjson reads it but cannot write it, the json module's fallback ran out of stack (a
    # bare 500); 5,000: neither reads it (a bare 500 too)
    with TestClient(create_app("http://127.0.0.1:9/v1", 1000, scorer="rules", warm=False)) as c:
        for depth in (990, 5000):
            for body in (nested(depth), nested(depth).replace(b'"hi"', b'"hi \\ud83d"')):  # orjson, then json
                r = c.post("/v1/chat/completions", content=body,
                           headers={"content-type": "application/json", "x-session-id": f"deep-{depth}"})
                assert r.status_code == 400, (depth, r.text[:200])
                assert "nests arrays and objects too deeply" in r.json()["error"]["message"]
        # 400 levels (orjson cannot write it; the json module does) is forwarded: the upstream is down
        deep = c.post("/v1/chat/completions", content=nested(400), headers={"content-type": "application/json"})
        assert deep.status_code == 502, deep.text[:200]
        for body, says in ((b"-1e999999", "too large for a JSON number"), (b"1e400", "too large for a JSON number"),
                           (b"1e300", "must be a JSON object")):  # bare numbers: no double, then not an object
            r = c.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
            assert r.status_code == 400 and says in r.json()["error"]["message"], r.text[:200]


@case("M16", "error")
def test_a_store_file_locked_by_another_connection(tmp_path, monkeypatch):
    import sqlite3

    import ctxscore.store.sqlite

    monkeypatch.setattr(ctxscore.store.sqlite, "BUSY_TIMEOUT_S", 1.0)  # the wait, shortened for the test
    path = tmp_path / "session.db"
    cm = rules_cm(store=str(path), session_id="s")
    cm.add({"role": "user", "content": "hello"})
    cm.close()
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")  # another process in the middle of a write
    try:
        with pytest.raises(StoreError, match="locked by another connection") as err:
            rules_cm(store=str(path), session_id="s")
        assert "not a ctxscore store" not in str(err.value)
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert [m.content for m in rules_cm(store=str(path), session_id="s").messages] == ["hello"]


@case("M18", "error")
def test_an_id_holding_nul_or_too_long():
    """On PostgreSQL a session id with NUL was a StoreError (an outage) when the manager was built,
    and a long random message id a StoreError "index row size exceeds btree maximum"; every store now
    refuses them up front, saying the limit (tests/test_store_contract.py runs both stores)."""
    with pytest.raises(ConfigError, match="NUL"):
        rules_cm(session_id="a\x00b")
    with pytest.raises(ConfigError, match="at most 512"):
        rules_cm(session_id="s" * 513)
    cm = rules_cm()
    with pytest.raises(InputError, match="at most 512"):
        cm.add({"role": "user", "content": "hi", "id": "i" * 3000})
    with pytest.raises(InputError, match="at most 1,024 bytes"):
        cm.add({"role": "user", "content": "hi", "id": "\U0001f600" * 300})
    assert len(cm) == 0
@case("M19", "handled")
def test_piped_input_is_read_once_whole(tmp_path, monkeypatch, capsys):
    """``cat f | ctxscore compress /dev/stdin`` kept 1 message of 86: the format sniff read 4,096 bytes
    of the pipe, then the reader opened it again; ``-`` was "file not found"."""
    import io

    rows = [{"role": "user" if i % 2 else "assistant", "content": f"Message {i} about the booking " + "x" * 80}
            for i in range(86)]
    body = "".join(json.dumps(r) + "\n" for r in rows).encode()
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "wb") as fh:
            fh.write(body)

    writer = threading.Thread(target=write)
    writer.start()
    assert main(["compress", str(fifo), "--budget", "50000", "--model", "rules"]) == 0
    writer.join(timeout=10)
    assert len(json.loads(capsys.readouterr().out)["messages"]) == 86
    for data in (body, json.dumps(rows).encode(), b'{"role": "user", "content": "hi"}\n'):  # JSONL, array, short
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
        assert main(["compress", "-", "--budget", "50000", "--model", "rules"]) == 0
        assert len(json.loads(capsys.readouterr().out)["messages"]) == (1 if len(data) < 100 else 86)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b'{"role": "user", "content": \n')))
    assert main(["score", "-", "--model", "rules"]) == 2
    assert "<stdin>: line 1: invalid JSON" in capsys.readouterr().err


@case("M20", "error")
def test_cli_out_that_is_the_input_file(tmp_path, capsys):
    """``compress conv.jsonl --out conv.jsonl`` replaced the conversation with the window."""
    src = tmp_path / "conv.jsonl"
    src.write_text('{"role": "user", "content": "Please book a table."}\n', encoding="utf-8")
    before = src.read_bytes()
    (tmp_path / "link.jsonl").symlink_to(src)
    for out in (src, tmp_path / "." / "conv.jsonl", tmp_path / "link.jsonl"):
        assert main(["compress", str(src), "--budget", "100", "--model", "rules", "--out", str(out)]) == 2
        assert "is the input file" in capsys.readouterr().err
    assert src.read_bytes() == before


@case("M21", "error")
def test_registry_export_into_a_folder_that_is_not_an_export(tmp_path, capsys):
    """``python -m training.registry export --out DIR`` deleted whatever DIR held (``shutil.rmtree``);
    the full check is tests/test_registry.py."""
    pytest.importorskip("mlflow")
    from training import registry

    (tmp_path / "notes.txt").write_text("keep me", encoding="utf-8")
    assert registry.main(["export", "--alias", "champion", "--out", str(tmp_path)]) == 2
    assert "is a folder that is not an exported scorer" in capsys.readouterr().err
    assert (tmp_path / "notes.txt").read_text(encoding="utf-8") == "keep me"


@case("M22", "error")
def test_a_sqlite_database_of_another_application(tmp_path):
    """Opening another application's database added ctxscore's tables and switched it to WAL; one
    with its own ``messages`` table said "the file was not modified" after both. A lone
    ``meta(key, value)`` of another application (its own rows) was adopted as a store (the schema
    version written into it); ``meta`` beside a ``messages`` table of other columns got ``sessions``
    and WAL, then "the file was not modified"."""
    import hashlib
    import sqlite3

    apps = [["CREATE TABLE users(id INTEGER, name TEXT)", "INSERT INTO users VALUES(1, 'a')"],
            ["CREATE TABLE messages(id, body)", "INSERT INTO messages VALUES(1, 'a')"],
            ["CREATE TABLE meta(key, value)", "INSERT INTO meta VALUES('app', 'wordpress')"],
            ["CREATE TABLE meta(key, value)", "CREATE TABLE messages(x)"],
            ["CREATE TABLE meta(x)"]]
    for n, schema in enumerate(apps):
        path = tmp_path / f"other_app{n}.db"
        db = sqlite3.connect(path)
        for sql in schema:
            db.execute(sql)
        db.commit()
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        db.close()
        before = hashlib.sha256(path.read_bytes()).hexdigest()
        with pytest.raises(StoreError, match="a SQLite database of another application .*the file was not modified"):
            rules_cm(store=str(path))
        assert hashlib.sha256(path.read_bytes()).hexdigest() == before, schema
        assert not (tmp_path / f"other_app{n}.db-wal").exists()
        db = sqlite3.connect(path)
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        assert {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")} == tables, schema
        db.close()
    empty = tmp_path / "empty.db"  # an empty file (touch) is a new store
    empty.write_bytes(b"")
    cm = rules_cm(store=str(empty))
    cm.add({"role": "user", "content": "hello"})
    cm.close()
    assert [m.content for m in rules_cm(store=str(empty)).messages] == ["hello"]
    half = tmp_path / "half.db"  # an earlier ctxscore creating the file: an empty meta first, then its tables
    db = sqlite3.connect(half)
    db.executescript("CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT);"
                     "CREATE TABLE sessions(session_id TEXT PRIMARY KEY, created REAL, state TEXT);")
    db.close()
    rules_cm(store=str(half)).close()


@case("M23", "error")
def test_nan_and_inf_in_the_rule_file(tmp_path):
    """``recency_floor = nan`` passed the range check (every comparison with NaN is false): every value
    was NaN and ``ctxscore compress`` wrote bare NaN into its JSON."""
    src = (REPO / "ctxscore" / "scoring" / "default_rules.toml").read_text(encoding="utf-8")
    bad = tmp_path / "rules.toml"
    for old, new, key in (("recency_floor = 0.6", "recency_floor = nan", "factors.recency_floor"),
                          ("relevance_boost = 1.8", "relevance_boost = inf", "factors.relevance_boost"),
                          ("role_system = 4.0", "role_system = -inf", "scores.instruction.role_system")):
        assert old in src
        bad.write_text(src.replace(old, new, 1), encoding="utf-8")
        with pytest.raises(ConfigError, match=rf"rule file {re.escape(str(bad))}: {re.escape(key)} must be a finite"):
            RuleConfig.load(bad)


@case("M24", "error")
def test_image_url_part_given_as_a_string_or_a_list(tmp_path, capsys):
    """``{"type": "image_url", "image_url": "http://x/a.png"}`` raised AttributeError in ``add`` and the CLI."""
    cm = rules_cm()
    for bad in ("http://x/a.png", ["http://x/a.png"]):
        with pytest.raises(InputError, match=rf"an image_url part needs .*got 'image_url' as a {type(bad).__name__}; "
                                             r"write the URL as \{'image_url': \{'url'"):
            cm.add({"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": bad}]})
    assert len(cm) == 0
    src = tmp_path / "img.jsonl"
    src.write_text(json.dumps({"role": "user", "content": [{"type": "image_url", "image_url": "http://x/a.png"}]}) + "\n",
                   encoding="utf-8")
    assert main(["compress", str(src), "--budget", "1000", "--model", "rules"]) == 2
    assert "line 1: content[0]: an image_url part needs" in capsys.readouterr().err


@case("M25", "error")
def test_an_input_file_nested_too_deeply(tmp_path, capsys):
    """A JSONL line or a .json file nested 1,000 levels or more was a RecursionError traceback."""
    line = tmp_path / "deep.jsonl"
    line.write_text('{"role": "user", "content": "hi"}\n{"role": "user", "content": "x", "meta": '
                    + "[" * 5000 + "]" * 5000 + "}\n", encoding="utf-8")
    array = tmp_path / "deep.json"
    array.write_text("[" * 1000 + "]" * 1000, encoding="utf-8")
    for src, where in ((line, "deep.jsonl: line 2: "), (array, "deep.json: ")):
        for cmd in (["compress", str(src), "--budget", "1000"], ["score", str(src)]):
            assert main([*cmd, "--model", "rules"]) == 2
            assert f"{where}the JSON nests arrays and objects too deeply to be read" in capsys.readouterr().err


@case("M26", "error")
def test_session_and_user_ids_that_are_not_strings_or_hold_a_lone_surrogate(tmp_path, capsys):
    """A lone surrogate in ``session_id`` or ``user`` was a UnicodeEncodeError; ``"session_id": {"a": 1}``
    became the session "{'a': 1}", ``1.5`` "1.5", ``true`` "True"; ``"user": {"id": 5}`` a TypeError.
    ``null`` is an absent field (the session ``line<n>``, the user its session id) and a whole number
    its decimal string (both were refused for a while)."""
    with pytest.raises(ConfigError, match="session_id holds a lone surrogate"):
        rules_cm(session_id="s\ud83d")
    src = tmp_path / "sessions.jsonl"
    msgs = [{"role": "user", "content": "I prefer window seats."}]
    for line, says in (({"session_id": "s\ud83d"}, "line 1: 'session_id' holds a lone surrogate"),
                       ({"session_id": {"a": 1}}, "line 1: 'session_id' must be a non-empty string (or a whole number), "
                                                  "got {\"a\": 1}"),
                       ({"session_id": 1.5}, "line 1: 'session_id' must be a non-empty string (or a whole number), got 1.5"),
                       ({"session_id": True}, "line 1: 'session_id' must be a non-empty string (or a whole number), got true"),
                       ({"session_id": ""}, "line 1: 'session_id' must be a non-empty string"),
                       ({"session_id": "s1", "user": "\ud83d"}, "line 1 (session s1): 'user' holds a lone surrogate"),
                       ({"session_id": "s1", "user": {"id": 5}}, "line 1 (session s1): 'user' must be a non-empty string"),
                       ({"session_id": "s1", "user": ["a"]}, "line 1 (session s1): 'user' must be a non-empty string")):
        src.write_text(json.dumps({**line, "messages": msgs}) + "\n", encoding="utf-8")
        for cmd in ("score", "profile"):
            assert main([cmd, str(src), "--model", "rules"]) == 2
            assert says in capsys.readouterr().err
    src.write_text("".join(json.dumps({**line, "messages": msgs}) + "\n" for line in (
        {"session_id": 17, "user": None}, {"session_id": None}, {"session_id": "s3", "user": 42})), encoding="utf-8")
    assert [s.session_id for s in read_sessions(src)] == ["17", "line2", "s3"]
    assert main(["score", str(src), "--model", "rules"]) == 0
    assert [json.loads(r)["session_id"] for r in capsys.readouterr().out.splitlines()] == ["17", "line2", "s3"]
    assert main(["profile", str(src), "--model", "rules"]) == 0
    assert [r.split(":")[0] for r in capsys.readouterr().out.splitlines() if r.startswith("user ")] == [
        "user 17", "user line2", "user 42"]


@case("M27", "error")
def test_out_of_range_command_line_numbers(tmp_path, capsys):
    """``profile --days-between nan`` crashed and -3 was taken; ``serve --port 99999`` bound port
    99999 mod 65536 while announcing 99999; ``serve --timeout nan`` or ``-5`` was taken."""
    from ctxscore.replay import replay_profile

    src = tmp_path / "s.jsonl"
    src.write_text('{"role": "user", "content": "I prefer window seats."}\n', encoding="utf-8")
    serve = ["serve", "--upstream", "http://127.0.0.1:9/v1", "--budget", "1000", "--model", "rules"]
    for argv, says in ((["profile", str(src), "--days-between", "nan"], "expected a finite number 0 or more, got nan"),
                       (["profile", str(src), "--days-between", "inf"], "expected a finite number 0 or more, got inf"),
                       (["profile", str(src), "--days-between", "-3"], "expected a finite number 0 or more, got -3"),
                       ([*serve, "--port", "99999"], "a port is 1 to 65535, got 99999"),
                       ([*serve, "--port", "0"], "a port is 1 to 65535, got 0"),
                       ([*serve, "--timeout", "nan"], "expected a finite number 0 or more, got nan"),
                       ([*serve, "--timeout", "-5"], "expected a finite number 0 or more, got -5"),
                       ([*serve, "--timeout", "0"], "expected a number above 0, got 0")):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2 and says in capsys.readouterr().err, argv
    with pytest.raises(ConfigError, match="days_between must be a finite number"):
        replay_profile("u", [("s", [{"role": "user", "content": "hi"}])], days_between=float("nan"))


@case("M28", "error")
def test_store_rows_with_a_damaged_prediction_or_turn(tmp_path):
    """A stored prediction that is not an object (``'5'``) was an AttributeError on resume; a duplicate
    or missing turn was "InputError: message 'm4' has turn 3, but the history has 4 messages"."""
    for n, damage, says in ((0, "UPDATE messages SET prediction='5' WHERE id='m1'", r"'m1' \(turn 1\) is damaged "
                             r"\(its prediction is a JSON int, not an object\)"),
                            (1, "UPDATE messages SET turn=1 WHERE id='m2'", "message 'm2' has turn 1 where turn 2 comes "
                             "next .*the stored data is damaged"),
                            (2, "UPDATE messages SET turn=5 WHERE id='m2'", "message 'm3' has turn 3 where turn 2 comes "
                             "next .*the stored data is damaged")):
        path = tmp_path / f"rows{n}.db"
        cm = rules_cm(archive_path=path, session_id="s")
        cm.extend([{"role": "user", "content": f"message {i}"} for i in range(4)])
        cm.store._db.execute(damage)
        cm.close()
        with pytest.raises(StoreError, match=rf"store {re.escape(str(path))}: session 's' .*{says}"):
            rules_cm(archive_path=path, session_id="s")


@case("M29", "error")
def test_misleading_errors_of_a_new_user(tmp_path, capsys):
    """``tool_call_id: 1`` said the message had none; ``sync(None)`` was a bare TypeError and ``sync({...})``
    "message 0: expected a JSON object ... got str"; ``--model FILE`` said "the folder does not exist"."""
    cm = rules_cm()
    cm.add(call("1"))
    with pytest.raises(InputError, match="'tool_call_id' must be a string .*got int 1; write it as \"1\""):
        cm.add({"role": "tool", "tool_call_id": 1, "content": "done"})
    for bad in (None, {"role": "user", "content": "hi"}, "hi"):
        with pytest.raises(InputError, match=rf"sync takes the client's whole message list .*got {type(bad).__name__}"):
            cm.sync(bad)
    assert len(cm) == 1
    src, model = tmp_path / "s.jsonl", tmp_path / "scorer.skops"
    src.write_text('{"role": "user", "content": "hi"}\n', encoding="utf-8")
    model.write_bytes(b"not a folder")
    assert main(["score", str(src), "--model", str(model)]) == 2
    assert "it is a file, not a folder" in capsys.readouterr().err


@case("M30", "error")
def test_two_tool_calls_with_one_id():
    """Two calls of one message with the id ``c5`` were stored: the tool message answering ``c5`` could
    belong to either."""
    cm = rules_cm()
    cm.add({"role": "user", "content": "Look both up."})
    twice = call("c5", "f") | {"tool_calls": [*call("c5", "f")["tool_calls"], *call("c5", "g")["tool_calls"]]}
    with pytest.raises(InputError, match=r"^message 1: tool_calls\[1\] repeats the id 'c5' of tool_calls\[0\]"):
        cm.add(twice)
    with pytest.raises(InputError, match=r"^message 2: tool_calls\[1\] repeats the id 'c5'"):
        cm.extend([call("c1"), twice])
    assert len(cm) == 1


@case("M31", "error")
def test_tool_call_arguments_over_the_content_limit():
    """5 MB of tool-call arguments were stored: the 4,000,000-character limit read the content only."""
    from ctxscore.messages import MAX_CONTENT_CHARS

    cm = rules_cm()
    with pytest.raises(InputError, match=r"^message 0: content and tool-call arguments have 5,000,000 characters, "
                                         r"above the limit of 4,000,000"):
        cm.add(call("c1", args="x" * 5_000_000))
    half = MAX_CONTENT_CHARS // 2 + 1  # each part under the limit, together above it
    with pytest.raises(InputError, match="content and tool-call arguments have 4,000,002 characters"):
        cm.extend([{"role": "user", "content": "hi"}, call("c1", args="x" * half) | {"content": "y" * half}])
    assert len(cm) == 0
    cm.add(call("c1", args="x" * (MAX_CONTENT_CHARS - 2)) | {"content": "ok"})
    assert len(cm) == 1


def test_catalogue_matches_the_tests():
    rows = {}
    for line in CATALOGUE.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 5 and cells[0][:1] in "DCSM" and cells[0][1:].isdigit():
            rows[cells[0]] = re.match(r"\*\*(\w+)\*\*", cells[-1]).group(1)
    assert rows == REGISTERED


def test_catalogue_totals_match_its_table():
    """The totals under the table and in the README were counted by hand and disagreed with the
    table and with each other (43 kinds, 24 error / 19 handled; 44 kinds, 25 / 19)."""
    outcomes = list(REGISTERED.values())
    kinds, errors, handled = len(outcomes), outcomes.count("error"), outcomes.count("handled")
    assert kinds == errors + handled
    doc = CATALOGUE.read_text(encoding="utf-8")
    assert f"Totals: {kinds} kinds — {errors} **error**, {handled} **handled**;" in doc
    readme = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    assert f"lists {kinds} kinds of bad and hostile input" in readme
    assert f"{errors} get a clear error" in readme and f"{handled} are handled correctly" in readme


def test_page_in_skipped_says_how_large_the_message_is():
    """'could not be paged in within the page-in limit of 3000 tokens: the window holds 1617 of 3000'
    read as if 1,383 free tokens were not enough for nothing in particular (a new user's report)."""
    cm = rules_cm(budget=700)
    cm.add({"role": "system", "content": "Follow the rules. " * 100})
    cm.add({"role": "user", "content": "I will send you a report."})  # the task's opener (pinned)
    cm.add({"role": "user", "content": "Here is the full report for ZEBRA-42: " + " ".join(
        f"Item {i} of ZEBRA-42 costs {i} dollars and ships on day {i}." for i in range(60))})
    for i in range(12):
        cm.add({"role": "assistant", "content": f"Update {i}: noted."})
        cm.add({"role": "user", "content": f"ok {i}"})
    win = cm.build(query="what did the ZEBRA-42 report say?")
    skipped = [w for w in win.warnings if w.kind == WarningKind.PAGE_IN_SKIPPED]
    assert skipped and skipped[0].figures["smallest"] == cm.history.entries[2].tokens > 1000
    assert f"the smallest of them holds {cm.history.entries[2].tokens} tokens" in str(skipped[0])


def test_a_closed_manager_says_its_store_is_closed(tmp_path):
    """add() after close() raised sqlite3.ProgrammingError (a new user's report)."""
    from ctxscore.errors import StoreError

    cm = rules_cm(budget=2000, store=str(tmp_path / "s.db"))
    cm.add({"role": "user", "content": "hi"})
    cm.close()
    cm.close()  # a second close does nothing
    with pytest.raises(StoreError, match="the store was closed"):
        cm.add({"role": "user", "content": "again"})


def test_a_number_too_long_to_read_says_what_to_do():
    from ctxscore.serve.app import _read_chat_body

    _, problem = _read_chat_body(b'{"model": "m", "n": ' + b"1" * 5001 + b', "messages": [{"role": "user", "content": "hi"}]}')
    assert problem.status_code == 400 and b"send it as a string" in problem.body and b"set_int_max_str_digits" not in problem.body
