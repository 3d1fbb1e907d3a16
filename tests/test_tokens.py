"""Token counting: offline encodings from bpe-openai, chat overhead, existing caches."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import os
from pathlib import Path

import pytest

from ctxscore.errors import ConfigError
from ctxscore.messages import Message
from ctxscore.tokens import TOKENS_PER_TOOL_CALL, TokenCounter, ensure_offline_encoding, image_tokens

URL = "https://openaipublic.blob.core.windows.net/encodings/{}.tiktoken"


def test_encoding_is_placed_under_tiktoken_cache_name(tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    folder = ensure_offline_encoding("o200k_base")
    key = hashlib.sha1(URL.format("o200k_base").encode()).hexdigest()
    placed = tmp_path / key
    assert folder == tmp_path and placed.is_file()
    bundled = Path(list(importlib.util.find_spec("bpe_openai").submodule_search_locations)[0]) / "data" / "o200k_base.tiktoken.gz"
    assert placed.read_bytes() == gzip.decompress(bundled.read_bytes())
    assert os.environ["TIKTOKEN_CACHE_DIR"] == str(tmp_path)


def test_existing_cache_file_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    key = hashlib.sha1(URL.format("cl100k_base").encode()).hexdigest()
    existing = tmp_path / key
    existing.write_bytes(b"sentinel")
    ensure_offline_encoding("cl100k_base")
    assert existing.read_bytes() == b"sentinel"


def test_unknown_encoding_is_a_clear_error():
    with pytest.raises(ConfigError, match="cl100k_base, o200k_base"):
        ensure_offline_encoding("p50k_base")


def test_counts_match_known_tokenisations():
    tc = TokenCounter()
    # "hello world" is two tokens in cl100k_base ("hello", " world")
    assert tc.count("hello world") == 2
    assert tc.count("") == 0
    o = TokenCounter("o200k_base")
    assert o.count("hello world") == 2
    # Chinese text costs more tokens per character in cl100k than o200k
    zh = "我想预订明天下午三点的会议室，不要超过两个小时。"
    assert tc.count(zh) > o.count(zh) > 0


def test_chat_overhead_follows_the_cookbook():
    tc = TokenCounter()
    plain = tc.count_message({"role": "user", "content": "hello world"})
    assert plain == 3 + tc.count("user") + 2
    named = tc.count_message({"role": "user", "content": "hello world", "name": "bob"})
    assert named == plain + 1 + tc.count("bob")
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"}]
    assert tc.count_messages(msgs) == sum(tc.count_message(m) for m in msgs) + 3


def test_tool_calls_are_counted():
    tc = TokenCounter()
    m = Message.from_dict({
        "role": "assistant", "content": "",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_user", "arguments": '{"user_id": "mia_li_3668"}'}}],
    })
    assert tc.count_message(m) == (3 + tc.count("assistant") + TOKENS_PER_TOOL_CALL + tc.count("c1") + tc.count("get_user")
                                   + tc.count('{"user_id": "mia_li_3668"}'))


def test_tool_call_ids_are_counted():
    """A 36-character call id is about 26 tokens; long agent sessions must not be undercounted."""
    tc = TokenCounter()
    cid = "call_9b1deb4d-3b7d-4bad-9bdd-2b0d7b3dcb6d"
    short = Message.from_dict({"role": "tool", "tool_call_id": "c", "content": "ok"})
    long = Message.from_dict({"role": "tool", "tool_call_id": cid, "content": "ok"})
    assert tc.count_message(long) - tc.count_message(short) == tc.count(cid) - tc.count("c") > 15


def test_image_parts_are_counted_by_the_vision_rule():
    tc = TokenCounter()
    low = Message.from_dict({"role": "user", "content": [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "low"}}]})
    high = Message.from_dict({"role": "user", "content": [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]})
    base = 3 + tc.count("user") + tc.count("What is in this picture?")
    assert tc.count_message(low) == base + 85
    assert tc.count_message(high) == base + 765  # unknown size: 1024 x 1024 -> 768 x 768 -> 4 tiles
    # OpenAI's documented examples: 1024 x 1024 high -> 765; 2048 x 4096 high -> 1105
    assert image_tokens("", "high", (1024, 1024)) == 765 and image_tokens("", "high", (2048, 4096)) == 1105


@pytest.mark.parametrize("part", [
    {"type": "image", "url": "https://example.com/a.png"},  # LangChain's standard block (langchain-core 1.x)
    {"type": "image", "source_type": "url", "url": "https://example.com/a.png"},  # langchain-core 0.3
    {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},  # Anthropic's
])
def test_standard_image_blocks_are_counted_as_images(part):
    # a LangChain agent's image block was counted as the ~30 tokens of its JSON: 745 tokens under
    tc = TokenCounter()
    msg = Message.from_dict({"role": "user", "content": [{"type": "text", "text": "What gate is this?"}, part]})
    assert tc.count_message(msg) == 3 + tc.count("user") + tc.count("What gate is this?") + 765


def test_a_base64_image_block_is_counted_by_its_size():
    pil = pytest.importorskip("PIL.Image")
    import base64
    import io

    buf = io.BytesIO()
    pil.new("RGB", (2048, 4096)).save(buf, format="PNG")
    data = base64.b64encode(buf.getvalue()).decode()
    tc = TokenCounter()
    for part in ({"type": "image", "base64": data, "mime_type": "image/png"},
                 {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}):
        msg = Message.from_dict({"role": "user", "content": [part]})
        assert tc.count_message(msg) == 3 + tc.count("user") + 1105  # OpenAI's 2048 x 4096 example
