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
from ctxscore.tokens import TokenCounter, ensure_offline_encoding

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
    assert tc.count_message(m) == 3 + tc.count("assistant") + tc.count('get_user({"user_id": "mia_li_3668"})')
