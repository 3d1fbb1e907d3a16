"""Archive: SQLite WAL + FTS5 trigram, Chinese matching, safe queries, hybrid ranking, resume."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from ctxscore.store.retrieval import query_terms
from ctxscore.store.sqlite import Archive, ArchiveError


def fill(a: Archive) -> None:
    texts = [
        ("m0", "user", "Please book a hotel in Cambridge for 3 nights, budget under $200."),
        ("m1", "assistant", "The Acorn Guest House has rooms; reference number is 7GAWK763."),
        ("m2", "user", "我想在北京找一家评分4.5分以上的餐馆，人均消费50-100元。"),
        ("m3", "assistant", "推荐芥末墩儿，地址是东城区鼓楼东大街。"),
        ("m4", "tool", 'Error: "payment" OR NEAR(amount) does not add up'),
    ]
    for i, (mid, role, text) in enumerate(texts):
        a.add("s1", mid, i, role, text, {"role": role, "content": text})


def test_wal_mode_and_whole_originals(tmp_path):
    a = Archive(tmp_path / "a.db")
    fill(a)
    assert a._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert a.get("s1", "m1") == {"role": "assistant", "content": "The Acorn Guest House has rooms; reference number is 7GAWK763."}
    a.close()


def test_keyword_search_english_and_chinese():
    a = Archive()
    fill(a)
    assert a.search("s1", "what was the reference number?")[0].id == "m1"
    assert a.search("s1", "芥末墩儿")[0].id == "m3"  # 4 characters: trigram FTS
    assert a.search("s1", "地址")[0].id == "m3"  # 2 characters: LIKE path
    assert a.search("s1", "餐馆的评分是多少")[0].id == "m2"  # split at function words


def test_fts_syntax_in_user_text_is_inert():
    a = Archive()
    fill(a)
    for q in ['"payment" OR NEAR(amount)', 'a" OR "1"="1', "*", ")", "NOT", "amount AND", "%", "_", "'; DROP TABLE messages; --"]:
        a.search("s1", q)  # must not raise
    assert a.count("s1") == 5
    hits = a.search("s1", '"payment" OR NEAR(amount)')
    assert hits and hits[0].id == "m4"
    # a bare operator word matches as a plain word, not as syntax
    assert [h.id for h in a.search("s1", "NEAR")] == ["m4"]


def test_query_terms():
    fts, short = query_terms("What is the booking reference for the hotel? 酒店的地址")
    assert "booking" in fts and "reference" in fts and "the" not in fts
    assert "酒店" in short and "地址" in short


def test_vector_results_are_fused():
    a = Archive()
    vecs = {"m0": [1, 0, 0], "m1": [0, 1, 0], "m2": [0, 0, 1]}
    for i, (mid, v) in enumerate(vecs.items()):
        a.add("s", mid, i, "user", f"text number {i}", {"role": "user", "content": f"text number {i}"},
              embedding=np.array(v, dtype=np.float32))
    hits = a.search("s", "zzz unrelated", query_embedding=np.array([0, 0.9, 0.1], dtype=np.float32))
    assert hits[0].id == "m1"


def test_resume_from_file(tmp_path):
    path = tmp_path / "s.db"
    a = Archive(path)
    fill(a)
    a.save_state("s1", {"turn": 5})
    a.set_tiers("s1", [("m4", "archived")])
    a.close()
    b = Archive(path)
    rows = b.messages("s1")
    assert [r["id"] for r in rows] == ["m0", "m1", "m2", "m3", "m4"]
    assert rows[4]["tier"] == "archived" and b.load_state("s1") == {"turn": 5}
    assert b.search("s1", "7GAWK763")[0].id == "m1"
    b.close()


def test_not_a_database(tmp_path):
    p = tmp_path / "x.db"
    p.write_bytes(b"this is not sqlite" * 100)
    before = p.read_bytes()
    with pytest.raises(ArchiveError, match="not modified"):
        Archive(p)
    assert p.read_bytes() == before


def test_duplicate_id_keeps_existing(tmp_path):
    a = Archive()
    fill(a)
    with pytest.raises(Exception, match="already exists"):
        a.add("s1", "m1", 9, "user", "other", {"role": "user", "content": "other"})
    assert a.get("s1", "m1")["content"].startswith("The Acorn")
    assert isinstance(a._db, sqlite3.Connection)
