"""The last message alone larger than the budget (an agent's tool printed a whole diff or log): the
window shows it cut to the room the budget leaves, the blocks a query names first, every kept block
byte-exact, a tool result still right after its call, the original whole in the store; before, the
window was forwarded with the whole message, many times the budget (a request the model refuses)."""

from __future__ import annotations

import gzip
import json
import re

import pytest

from ctxscore import ContextManager
from ctxscore.window.result import WarningKind

MARKER = re.compile(r"\n?\[… \d+ blocks? of (m\d+) archived: [^\n]*? …\]\n?")


def kept_pieces(shown: str, message_id: str) -> list[str]:
    """The text a fitted form keeps between its markers; every marker names ``message_id``."""
    assert set(MARKER.findall(shown)) == {message_id}
    return [p for p in MARKER.split(shown)[::2] if p]


def numbered_log(lines: int, worker: str | None = None) -> str:
    """A worker log of ``lines`` lines (``worker`` names every line's worker; default worker-0 .. worker-6)."""
    return "\n".join(f"[{k:05d}] {worker or f'worker-{k % 7}'} processed batch {k * 37 % 1009} in {k % 97 + 3} ms"
                     for k in range(lines))


@pytest.mark.corpora
def test_a_real_150k_character_diff_last_is_cut_to_the_budget(corpora):
    with gzip.open(corpora / "swe_mini" / "trajs" / "django__django-15629.traj.json.gz", "rt", encoding="utf-8") as f:
        messages = json.load(f)["messages"][:104]
    diff = messages[-1]["content"]
    assert len(diff) > 150_000  # the output of `git diff --cached` after a broad edit
    cm = ContextManager(budget=12000, scorer="rules")
    cm.extend([{"role": m["role"], "content": m["content"]} for m in messages])
    win = cm.build()
    assert win.tokens <= 12000
    fitted = [w for w in win.warnings if w.kind == WarningKind.LAST_MESSAGE_FITTED]
    assert fitted and fitted[0].figures["tokens_before"] > 30000 >= fitted[0].figures["tokens_after"]
    last = cm.messages[-1]
    shown = win.messages[-1]["content"]
    assert win.messages[-1]["role"] == "user" and len(shown) < len(diff) / 3
    pieces = kept_pieces(shown, last.id)
    assert all(p.strip("\n") in diff for p in pieces)  # byte-exact blocks
    assert shown.startswith(diff[:100]) and diff.endswith(pieces[-1])  # its head and its tail
    assert cm.store.get(cm.session_id, last.id).message.content == diff  # the original, whole
    decision = win.decisions[-1]
    assert decision.tier == "compressed" and decision.tokens_after < decision.tokens_before

    # a question about a hunk in the middle of the diff shows that hunk
    hunk = next(h for h in re.findall(r"^@@ [^\n]+", diff, re.M)[5:] if diff.index(h) > len(diff) / 3)
    line = diff[diff.index(hunk):].split("\n")[1].strip()
    word = max(re.findall(r"[A-Za-z_]{6,}", line), key=lambda w: (diff.count(w) == 1, -diff.count(w), len(w)))
    asked = cm.build(query=f"what does the diff change around {word}?")
    assert asked.tokens <= 12000
    assert word in asked.messages[-1]["content"]


def test_a_tool_result_last_stays_after_its_call_and_a_query_picks_its_blocks():
    log = numbered_log(6000)
    cm = ContextManager(budget=3000, scorer="rules")
    cm.extend([
        {"role": "system", "content": "You are an operations agent."},
        {"role": "user", "content": "Why was batch processing slow last night? Check the worker log."},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
                                                             "function": {"name": "read_log", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": log},
    ])
    win = cm.build()
    assert win.tokens <= 3000
    roles = [m["role"] for m in win.messages]
    assert roles[-2:] == ["assistant", "tool"] and win.messages[-2]["tool_calls"][0]["id"] == "call_1"
    tool = win.messages[-1]["content"]
    pieces = kept_pieces(tool, cm.messages[-1].id)
    assert all(p.strip("\n") in log for p in pieces)
    assert "[04321]" not in tool
    asked = cm.build(query="what happened in [04321]?")
    assert asked.tokens <= 3000 and "[04321] worker-2 processed batch" in asked.messages[-1]["content"]
    assert cm.store.get(cm.session_id, cm.messages[-1].id).message.content == log

    # once the conversation moves on, the log is compacted like any message and the window fits
    cm.add({"role": "assistant", "content": "Batch 4321 took the longest; worker-2 was overloaded."})
    cm.add({"role": "user", "content": "Thanks. Restart worker-2."})
    after = cm.build()
    assert after.tokens <= 3000
    assert not any(w.kind == WarningKind.LAST_MESSAGE_FITTED for w in after.warnings)


def test_pinned_content_over_the_budget_cuts_nothing():
    cm = ContextManager(budget=200, scorer="rules")
    rules = "Never deploy on Fridays. " * 40  # a pinned instruction larger than the budget
    cm.extend([{"role": "system", "content": "You are a release agent."}, {"role": "user", "content": rules}])
    win = cm.build()
    assert not any(w.kind == WarningKind.LAST_MESSAGE_FITTED for w in win.warnings)
    assert any(w.kind == WarningKind.PINNED_OVER_BUDGET for w in win.warnings)


def test_parallel_tool_results_too_large_together_are_cut_to_fit():
    # three results of 2,800 Chinese characters (about 2,000 tokens each), each under the size at
    # which a message is split into blocks, at a budget of 3,000 tokens: before, 6,034 tokens went out
    def result(k: int) -> str:
        return "".join(f"订单ORD{k}{i:04d}状态已发货，金额{i % 97}元，仓库杭州{i % 5}号。" for i in range(90))[:2800]

    cm = ContextManager(budget=3000, scorer="rules")
    cm.extend([{"role": "system", "content": "你是订单助手。"}, {"role": "user", "content": "查一下三个店铺的订单状态。"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": f"call_{k}", "type": "function", "function": {"name": "orders", "arguments": f'{{"shop": {k}}}'}}
                   for k in range(3)]}])
    cm.extend([{"role": "tool", "tool_call_id": f"call_{k}", "content": result(k)} for k in (2, 0, 1)])
    plain = cm.build().messages[-1]["content"]
    asked_id = next(f"ORD1{i:04d}" for i in range(30, 90) if f"ORD1{i:04d}状态" not in plain)  # cut without a query
    win = cm.build(query=f"{asked_id} 的状态？")
    assert win.tokens <= 3000
    assert [m.get("tool_call_id") for m in win.messages[-3:]] == ["call_2", "call_0", "call_1"]
    assert win.messages[-4]["tool_calls"][0]["id"] == "call_0"
    for m, k in zip(win.messages[-3:], (2, 0, 1), strict=True):
        original = result(k)
        pieces = kept_pieces(m["content"], cm.messages[[x.tool_call_id for x in cm.messages].index(f"call_{k}")].id)
        assert all(p.strip("\n") in original for p in pieces) and m["content"].startswith(original[:50])
        assert len(m["content"]) < len(original)
    assert f"{asked_id}状态已发货" in win.messages[-1]["content"]  # the block the query names
    fitted = next(w for w in win.warnings if w.kind == WarningKind.LAST_MESSAGE_FITTED)
    assert fitted.figures["tokens_before"] > 5000 and "do not fit" in str(fitted)


def test_a_short_result_beside_a_long_one_takes_its_compressed_form():
    short = '{"order": "ORD-5521", "status": "shipped", "carrier": "DHL", "eta": "2026-12-09", "total": "$412.50"}'
    cm = ContextManager(budget=1500, scorer="rules")
    cm.extend([{"role": "system", "content": "You are an operations agent."},
               {"role": "user", "content": "Where is order ORD-5521 and why was the batch slow?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "c_log", "type": "function", "function": {"name": "read_log", "arguments": "{}"}},
                   {"id": "c_order", "type": "function", "function": {"name": "order", "arguments": "{}"}}]},
               {"role": "tool", "tool_call_id": "c_log", "content": numbered_log(3000)},
               {"role": "tool", "tool_call_id": "c_order", "content": short}])
    win = cm.build()
    assert win.tokens <= 1500
    shown = win.messages[-1]["content"]
    assert win.messages[-1]["tool_call_id"] == "c_order" and shown != short and len(shown) < len(short)
    for value in ("ORD-5521", "shipped", "DHL", "2026-12-09", "$412.50"):
        assert value in shown  # every value byte-exact in the compressed form
    assert {d.id: d.tier for d in win.decisions}[cm.messages[-1].id] != "verbatim"


def test_a_replaced_last_output_is_never_shown_from_an_earlier_cut():
    # a client that resends the conversation with the last tool output replaced (rebased): the ids
    # are reused, and the cut of the replaced output must not be served for the new one
    head = [{"role": "system", "content": "You are an operations agent."}, {"role": "user", "content": "Check the worker log."},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
                                                                 "function": {"name": "read_log", "arguments": "{}"}}]}]
    cm = ContextManager(budget=3000, scorer="rules")
    cm.sync([*head, {"role": "tool", "tool_call_id": "call_1", "content": numbered_log(3000, "worker-alpha")}])
    assert "worker-alpha" in cm.build().messages[-1]["content"]
    assert cm.sync([*head, {"role": "tool", "tool_call_id": "call_1", "content": numbered_log(3000, "worker-omega")}]).mode == "rebased"
    shown = cm.build().messages[-1]["content"]
    assert "worker-omega" in shown and "worker-alpha" not in shown


def server_chat(turns: int) -> list[dict]:
    """A chat of ``turns`` short questions and answers about servers (each answer states an uptime)."""
    out: list[dict] = []
    for k in range(turns):
        out.append({"role": "user", "content": f"What is the status of server srv-{k:03d} in rack R{k}?"})
        out.append({"role": "assistant", "content": f"Server srv-{k:03d} in rack R{k} is healthy; uptime {k + 3} days, load {k * 7 % 90}%."})
    return out


def log_call(lines: int) -> list[dict]:
    """A request to read the worker log, the call and its result of ``lines`` lines."""
    return [{"role": "user", "content": "Why was batch processing slow last night? Check the worker log."},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
                                                                 "function": {"name": "read_log", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": numbered_log(lines)}]


def test_a_huge_last_output_leaves_the_earlier_turns_whole_and_goes_first_the_turn_after():
    # a 6,000-line log (about 120,000 tokens) after 25 short messages (about 700 tokens) at 6,000:
    # before, compaction counted the log whole and archived all 24 earlier messages for good
    cm = ContextManager(budget=6000, scorer="rules")
    cm.extend([{"role": "system", "content": "You are an operations agent."}, *server_chat(12), *log_call(6000)])
    win = cm.build()
    assert win.tokens <= 6000
    tiers = {d.id: d.tier for d in win.decisions}
    assert all(tiers[m.id] == "verbatim" for m in cm.messages[:-1])
    assert any(w.kind == WarningKind.LAST_MESSAGE_FITTED for w in win.warnings)
    assert win.decisions[-1].tokens_after > 0.9 * (6000 - sum(d.tokens_after for d in win.decisions[:-1]))  # the room they leave

    # the turn after, the log is the unit archived (it alone keeps the recent turns over the
    # high-water mark); before, the older units went first and the log after them
    cm.add({"role": "assistant", "content": "worker-3 was slow on batches 100 to 200."})
    after = cm.build()
    tiers = {d.id: d.tier for d in after.decisions}
    assert after.tokens <= 6000
    assert tiers[cm.messages[-2].id] == "archived" and tiers[cm.messages[-3].id] == "archived"  # the call and its result
    assert all(tiers[m.id] == "verbatim" for m in cm.messages[:-3])
    assert "uptime 7 days" in "".join(m["content"] or "" for m in after.messages)


def test_a_huge_last_output_leaves_room_for_a_query_page_in():
    # 40 questions at 1,500 tokens (most of them archived), then the log: a question about an
    # archived answer pages it in beside the cut log; before, the log counted whole left no room
    cm = ContextManager(budget=1500, scorer="rules")
    cm.add({"role": "system", "content": "You are an operations agent."})
    for m in server_chat(40):
        cm.add(m)
        cm.build()
    assert {d.tier for d in cm.build().decisions[:12]} == {"archived", "verbatim"}
    cm.extend(log_call(6000))
    win = cm.build(query="What was the uptime of srv-004 in rack R4?")
    assert win.tokens <= 1500
    assert "uptime 7 days" in "".join(m["content"] or "" for m in win.messages)
    assert not any(w.kind == WarningKind.PAGE_IN_SKIPPED for w in win.warnings)
    assert win.messages[-1]["role"] == "tool" and "[00000]" in win.messages[-1]["content"]


def test_a_screenshot_beside_a_huge_page_text_keeps_the_image_and_cuts_the_text():
    # a browsing agent's last message: a screenshot and the page's text (about 100,000 tokens) at
    # 3,000: before, a message with media parts was never cut and went out whole
    page = "\n".join(f'<div id="row-{k}" class="item">Product {k}: price ${k * 3 % 500}.99, stock {k % 40}</div>'
                     for k in range(4000))
    image = {"type": "image_url", "image_url": {"url": "https://example.com/screen.png", "detail": "high"}}
    cm = ContextManager(budget=3000, scorer="rules")
    cm.extend([{"role": "system", "content": "You are a browsing agent."},
               {"role": "user", "content": "Find the price of Product 2345 on this page."},
               {"role": "user", "content": [{"type": "text", "text": "Page text:"}, image, {"type": "text", "text": page}]}])
    win = cm.build(query="price of Product 2345")
    assert win.tokens <= 3000
    assert any(w.kind == WarningKind.LAST_MESSAGE_FITTED for w in win.warnings)
    parts = win.messages[-1]["content"]
    assert [p["type"] for p in parts] == ["text", "image_url"] and parts[1] == image  # the image, as sent
    pieces = kept_pieces(parts[0]["text"], cm.messages[-1].id)
    assert all(p.strip("\n") in "Page text:\n" + page for p in pieces)
    assert parts[0]["text"].startswith("Page text:\n<div") and "Product 2345: price $35.99" in parts[0]["text"]
    assert cm.store.get(cm.session_id, cm.messages[-1].id).message.parts == cm.messages[-1].parts  # the original
