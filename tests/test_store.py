"""SQLiteStore: WAL + FTS5 trigram, Chinese matching, safe queries, hybrid ranking, resume, atomic
allocation of turns and ids, and every backend failure as StoreError."""

from __future__ import annotations

import sqlite3
import threading
import time

import numpy as np
import pytest

from ctxscore.errors import InputError, StoreError
from ctxscore.messages import Message, Tier
from ctxscore.store import NewRecord, open_store
from ctxscore.store.retrieval import query_terms
from ctxscore.store.sqlite import SQLiteStore

TEXTS = [
    ("m0", "user", "Please book a hotel in Cambridge for 3 nights, budget under $200."),
    ("m1", "assistant", "The Acorn Guest House has rooms; reference number is 7GAWK763."),
    ("m2", "user", "我想在北京找一家评分4.5分以上的餐馆，人均消费50-100元。"),
    ("m3", "assistant", "推荐芥末墩儿，地址是东城区鼓楼东大街。"),
    ("m4", "user", 'Error: "payment" OR NEAR(amount) does not add up'),
]


def rec(mid, role, text, embedding=None):
    return NewRecord(Message(role=role, content=text, id=mid), text, embedding=embedding)


def fill(s: SQLiteStore, sid: str = "s1") -> None:
    s.add(sid, [rec(*t) for t in TEXTS])


def test_wal_mode_and_whole_originals(tmp_path):
    s = SQLiteStore(tmp_path / "a.db")
    fill(s)
    assert s._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    got = s.get("s1", "m1")
    assert got.message.to_openai() == {"role": "assistant", "content": TEXTS[1][2]} and got.turn == 1
    s.close()


def test_keyword_search_english_and_chinese():
    s = SQLiteStore()
    fill(s)
    assert s.search("s1", "what was the reference number?")[0].id == "m1"
    assert s.search("s1", "芥末墩儿")[0].id == "m3"  # 4 characters: trigram FTS
    assert s.search("s1", "地址")[0].id == "m3"  # 2 characters: LIKE path
    assert s.search("s1", "餐馆的评分是多少")[0].id == "m2"  # split at function words


def test_fts_syntax_in_user_text_is_inert():
    s = SQLiteStore()
    fill(s)
    for q in ['"payment" OR NEAR(amount)', 'a" OR "1"="1', "*", ")", "NOT", "amount AND", "%", "_", "'; DROP TABLE messages; --"]:
        s.search("s1", q)  # must not raise
    assert s.count("s1") == 5
    hits = s.search("s1", '"payment" OR NEAR(amount)')
    assert hits and hits[0].id == "m4"
    assert [h.id for h in s.search("s1", "NEAR")] == ["m4"]  # an operator word matches as a plain word


def test_query_terms():
    fts, short = query_terms("What is the booking reference for the hotel? 酒店的地址")
    assert "booking" in fts and "reference" in fts and "the" not in fts
    assert "酒店" in short and "地址" in short


def test_vector_results_are_fused():
    s = SQLiteStore()
    vecs = {"m0": [1, 0, 0], "m1": [0, 1, 0], "m2": [0, 0, 1]}
    s.add("s", [rec(mid, "user", f"text number {i}", np.array(v, dtype=np.float32)) for i, (mid, v) in enumerate(vecs.items())])
    hits = s.search("s", "zzz unrelated", query_embedding=np.array([0, 0.9, 0.1], dtype=np.float32))
    assert hits[0].id == "m1"


def test_resume_from_file(tmp_path):
    path = tmp_path / "s.db"
    s = SQLiteStore(path)
    fill(s)
    s.set_tiers("s1", [("m4", Tier.ARCHIVED)])
    s.close()
    b = SQLiteStore(path)
    rows = b.load("s1")
    assert [r.id for r in rows] == ["m0", "m1", "m2", "m3", "m4"] and [r.turn for r in rows] == list(range(5))
    assert rows[4].tier == Tier.ARCHIVED
    assert [r.id for r in b.load("s1", after_turn=2)] == ["m3", "m4"]
    assert b.search("s1", "7GAWK763")[0].id == "m1"
    b.close()


def test_turns_and_automatic_ids_are_allocated_by_the_store():
    s = SQLiteStore()
    got = s.add("s", [rec(None, "user", "first"), rec("m1", "user", "explicit m1")])
    assert [(r.id, r.turn) for r in got] == [("m0", 0), ("m1", 1)]
    got = s.add("s", [rec(None, "user", "third")])
    assert [(r.id, r.turn) for r in got] == [("m2", 2)]
    s.add("s", [rec("m4", "user", "explicit m4, ahead of its turn")])
    got = s.add("s", [rec(None, "user", "takes turn 4, whose automatic id m4 is used")])
    assert got[0].turn == 4 and got[0].id == "m4-1"


def test_duplicate_id_stores_nothing_of_the_batch():
    s = SQLiteStore()
    fill(s)
    with pytest.raises(InputError, match="already exists"):
        s.add("s1", [rec("new", "user", "fine"), rec("m1", "user", "clashes")])
    assert s.count("s1") == 5 and s.get("s1", "new") is None
    assert s.get("s1", "m1").message.content.startswith("The Acorn")


def test_two_connections_append_to_one_session(tmp_path):
    a, b = SQLiteStore(tmp_path / "x.db"), SQLiteStore(tmp_path / "x.db")
    for k in range(20):
        (a if k % 2 else b).add("s", [rec(None, "user", f"message {k}")])
    rows = a.load("s")
    assert [r.turn for r in rows] == list(range(20)) and len({r.id for r in rows}) == 20
    a.close()
    b.close()


def test_detach_keeps_the_replaced_messages():
    s = SQLiteStore()
    fill(s)
    target = s.detach("s1", 3)
    assert [r.id for r in s.load("s1")] == ["m0", "m1", "m2"]
    assert [r.id for r in s.load(target)] == ["m3", "m4"] and target == "s1~detached~1"
    assert s.detach("s1", 2) == "s1~detached~2"


def test_not_a_database(tmp_path):
    p = tmp_path / "x.db"
    p.write_bytes(b"this is not sqlite" * 100)
    before = p.read_bytes()
    with pytest.raises(StoreError, match="not modified"):
        SQLiteStore(p)
    assert p.read_bytes() == before


def test_folder_as_path(tmp_path):
    with pytest.raises(StoreError, match="folder"):
        SQLiteStore(tmp_path)


def test_damaged_row_names_the_row(tmp_path):
    s = SQLiteStore(tmp_path / "d.db")
    fill(s)
    s._db.execute("UPDATE messages SET message='{not json' WHERE id='m2'")
    with pytest.raises(StoreError, match="'m2'.*damaged"):
        s.load("s1")


def test_full_disk_is_a_store_error_and_stores_nothing(tmp_path):
    s = SQLiteStore(tmp_path / "f.db")
    fill(s)
    (pages,) = s._db.execute("PRAGMA page_count").fetchone()
    s._db.execute(f"PRAGMA max_page_count={pages}")
    with pytest.raises(StoreError, match="full"):
        s.add("s1", [rec(None, "user", "x" * 200_000)])
    assert s.count("s1") == 5
    assert isinstance(s._db, sqlite3.Connection)


def test_open_store_arguments(tmp_path):
    assert open_store(None).path is None
    assert open_store(f"sqlite:///{tmp_path / 'u.db'}").path == tmp_path / "u.db"
    with pytest.raises(Exception, match="unsupported store URL"):
        open_store("mysql://localhost/x")


def test_stemmed_search_finds_other_word_forms():
    s = SQLiteStore()
    s.add("s", [rec("m0", "user", "My favourite car is the Ferrari from my uncle."),
                rec("m1", "user", "The booking was made yesterday for two people."),
                rec("m2", "user", "Unrelated small talk about the weather.")])
    assert s.search("s", "which Ferraris did I mention?")[0].id == "m0"
    hit = s.search("s", "when was it booked?")[0]
    assert hit.id == "m1" and "stem" in hit.lists and hit.lexical


def test_hits_carry_their_lists_and_similarity():
    s = SQLiteStore()
    s.add("s", [rec("m0", "user", "alpha beta", np.array([1, 0], dtype=np.float32)),
                rec("m1", "user", "gamma delta", np.array([0, 1], dtype=np.float32))])
    hits = {h.id: h for h in s.search("s", "alpha", query_embedding=np.array([0.0, 1.0], dtype=np.float32))}
    assert hits["m0"].lexical and not hits["m1"].lexical
    assert hits["m1"].lists == {"vector"} and hits["m1"].similarity == pytest.approx(1.0)


#: The full-text indexes of schema versions 2-4 (2 had only the first), as those versions created them.
OLD_FTS = {
    "messages_fts": "CREATE VIRTUAL TABLE messages_fts USING fts5(text, context, content='messages', "
                    "content_rowid='rowid', tokenize='trigram')",
    "messages_stem": "CREATE VIRTUAL TABLE messages_stem USING fts5(text, context, content='messages', "
                     "content_rowid='rowid', tokenize='porter unicode61 remove_diacritics 2')",
}


@pytest.mark.parametrize("old", ["2", "3", "4"])
def test_older_files_are_upgraded_in_place(tmp_path, old):
    """Schema 4 added the layer records and events, 5 dropped the FTS5 indexes (search ranks in
    memory): a version 2, 3 or 4 file keeps its messages, gains what it lacks, loses the indexes and
    is searched as before."""
    path = tmp_path / f"v{old}.db"
    s = SQLiteStore(path)
    fill(s)
    for table in ("messages_fts",) if old == "2" else OLD_FTS:
        s._db.execute(OLD_FTS[table])
        s._db.execute(f"INSERT INTO {table}({table}) VALUES('rebuild')")
    if old != "4":
        s._db.execute("DROP TABLE records")
        s._db.execute("DROP TABLE events")
    s._db.execute("UPDATE meta SET value=? WHERE key='schema_version'", (old,))
    s.close()
    b = SQLiteStore(path)
    assert b._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == "5"
    assert not b._db.execute("SELECT name FROM sqlite_master WHERE name LIKE 'messages_%' AND type='table'").fetchall()
    assert b.search("s1", "bookings")[0].id == "m0" and "stem" in b.search("s1", "bookings")[0].lists
    assert [r.id for r in b.load("s1")] == ["m0", "m1", "m2", "m3", "m4"]
    assert b.put_records("s1", "ledger", {"ref": "7GAWK763"}) == {"ref": 1}
    assert b.append_events("s1", [{"type": "resumed"}]) == [1]
    b.close()
    p = tmp_path / "v9.db"
    c = SQLiteStore(p)
    c._db.execute("UPDATE meta SET value='9' WHERE key='schema_version'")
    c.close()
    with pytest.raises(StoreError, match="schema version 9"):
        SQLiteStore(p)


def test_search_ranks_as_fts5_bm25_did():
    """The in-memory ranking (schema 5) returns the keyword, stem and two-character lists that the
    FTS5 indexes of schema 4 returned, ids in order, for real English and Chinese sessions (the
    bundled sessions replayed by a manager: rendered text and index context as stored); the
    ``exact`` list of a rare code, which FTS5 had no counterpart of, is left out."""
    import json
    from pathlib import Path

    from ctxscore import ContextManager
    from ctxscore.store.retrieval import like_pattern, stem_terms
    from ctxscore.store.sqlite import index_text
    from ctxscore.store.stemming import porter_stem

    def fts_match_expression(terms):  # schema 4's MATCH expression: the terms ORed as quoted strings
        return " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)

    lines = (Path(__file__).resolve().parents[1] / "data" / "bundled" / "sessions.jsonl").read_text("utf-8").splitlines()
    checked = 0
    for line in lines[:6]:
        session = json.loads(line)
        cm = ContextManager(budget=4000, scorer="rules")
        for m in session["messages"]:
            cm.add({k: v for k, v in m.items() if k != "label"})
        store, sid = cm.store, cm.session_id
        ref = sqlite3.connect(":memory:")
        ref.execute("CREATE TABLE m(rowid INTEGER PRIMARY KEY, id TEXT, turn INT, text TEXT, context TEXT)")
        for table, tok in (("f", "trigram"), ("s", "porter unicode61 remove_diacritics 2")):
            ref.execute(f"CREATE VIRTUAL TABLE {table} USING fts5(text, context, content='m', content_rowid='rowid', "
                        f"tokenize='{tok}')")
        rows = store._db.execute("SELECT rowid, id, turn, text, context FROM messages WHERE session_id=?", (sid,))
        for rowid, mid, turn, text, context in rows.fetchall():
            ref.execute("INSERT INTO m VALUES(?,?,?,?,?)", (rowid, mid, turn, text, context))
            for table in ("f", "s"):
                ref.execute(f"INSERT INTO {table}(rowid, text, context) VALUES(?,?,?)", (rowid, index_text(text), context))
        queries = [m["content"] for m in session["messages"] if m["role"] == "user" and m.get("content")]
        queries += [p["question"] for p in session.get("probes", [])]
        with store._guard("test") as db:
            index = store._session_index(db, sid)
        for q in queries:
            fts, short = query_terms(q)
            stems = stem_terms(q)
            want = []
            if fts:
                want.append(("keyword", [r[0] for r in ref.execute(
                    "SELECT m.id FROM f JOIN m ON m.rowid = f.rowid WHERE f MATCH ? ORDER BY bm25(f, 1.0, 0.4), m.turn "
                    "LIMIT 100", (fts_match_expression(fts),))]))
            if stems:
                want.append(("stem", [r[0] for r in ref.execute(
                    "SELECT m.id FROM s JOIN m ON m.rowid = s.rowid WHERE s MATCH ? ORDER BY bm25(s, 1.0, 0.4), m.turn "
                    "LIMIT 100", (fts_match_expression(stems),))]))
            for term in short:
                want.append(("short", [r[0] for r in ref.execute(
                    "SELECT id FROM m WHERE text LIKE ? ESCAPE '\\' ORDER BY turn DESC LIMIT 100", (like_pattern(term),))]))
            with store._guard("test") as db:
                lists = store._lexical(db, sid, index, fts, [porter_stem(w) for w in stem_terms(q)], short, 100)
            got = [(name, [r[0] for r in rows]) for name, rows in lists if name != "exact"]  # no FTS5 counterpart
            assert got == want, q
            checked += sum(len(ids) for _, ids in want)
        ref.close()
    assert checked > 1000  # the lists compared are not empty


def test_another_session_in_the_file_never_changes_a_sessions_ranking(tmp_path):
    texts = [f"the booking reference of trip {i} is REF{i:03d}" for i in range(6)] + ["hotel hotel booking"] * 2
    s = SQLiteStore(tmp_path / "two.db")
    s.add("a", [rec(None, "user", t) for t in texts])
    before = [(h.id, h.score, h.lists) for h in s.search("a", "booking hotel reference")]
    s.add("b", [rec(None, "user", "booking " * 50) for _ in range(40)])
    assert [(h.id, h.score, h.lists) for h in s.search("a", "booking hotel reference")] == before
    s.close()


def test_a_damaged_embedding_is_a_store_error_naming_the_row_and_leaves_the_index_whole(tmp_path):
    s = SQLiteStore(tmp_path / "d.db")
    s.add("s", [rec(None, "user", "alpha hotel"), rec(None, "user", "beta hotel"), rec(None, "user", "gamma hotel")])
    s._db.execute("UPDATE messages SET embedding=x'010203' WHERE id='m1'")
    for _ in range(2):
        with pytest.raises(StoreError, match="'m1'.*damaged embedding"):
            s.search("s", "hotel")
    with pytest.raises(StoreError, match="'m1'.*damaged embedding"):
        s.load("s")
    assert [m.id for m in s._indexes["s"].messages] == []  # all or none: no row of the failed reads
    s._db.execute("UPDATE messages SET embedding=NULL WHERE id='m1'")
    assert sorted(h.id for h in s.search("s", "hotel")) == ["m0", "m1", "m2"]
    assert [m.id for m in s._indexes["s"].messages] == ["m0", "m1", "m2"]
    s.close()


def test_a_manager_adding_after_another_rebased_the_session_reads_it_again(tmp_path):
    """Two managers on one session file; B syncs an edited history (a rebase), then A adds: A's add
    returned an old detached message ('Booked HA1 ...') and A's history kept the detached turns (a new
    user's report)."""
    from ctxscore import ContextManager

    store = str(tmp_path / "s.db")
    base = [{"role": "system", "content": "sys"}, {"role": "user", "content": "Book flight HA1 to Oslo"},
            {"role": "assistant", "content": "Booked HA1 to Oslo, ref ABC"}, {"role": "user", "content": "thanks"}]
    a = ContextManager(budget=3000, scorer="rules", store=store, session_id="s")
    a.sync(base)
    b = ContextManager(budget=3000, scorer="rules", store=store, session_id="s")
    assert b.sync(base[:1] + [{"role": "user", "content": "Actually book HA2 to Rome"}]).mode == "rebased"
    got = a.add({"role": "assistant", "content": "Anything else?"})
    assert got.content == "Anything else?" and got.turn == 2
    want = ["sys", "Actually book HA2 to Rome", "Anything else?"]
    assert [m.content for m in a.messages] == want
    assert [m.content for m in ContextManager(budget=3000, scorer="rules", store=store, session_id="s").messages] == want
    assert "HA1" not in str(a.build().messages)
    a.close(), b.close()


def test_a_store_path_no_file_can_have_is_refused_and_a_non_utf8_name_opens(tmp_path):
    """A path holding NUL was a bare ``ValueError: embedded null byte`` and one holding a lone
    surrogate (``"\\ud83d"``) a bare ``UnicodeEncodeError``, both from ``sqlite3.connect``; a file
    name that is not UTF-8 (``os.listdir`` and ``sys.argv`` give its bytes as ``\\udc80``-``\\udcff``,
    ``caf\\udce9.db``) opens, as before."""
    import os

    from ctxscore import ContextManager

    path = os.path.join(os.fsdecode(bytes(tmp_path)), os.fsdecode(b"caf\xe9.db"))
    cm = ContextManager(budget=500, scorer="rules", store=path, session_id="s")
    cm.add({"role": "user", "content": "kept"})
    cm.close()
    assert os.path.isfile(os.fsencode(path)) and os.listdir(bytes(tmp_path)) == [b"caf\xe9.db"]
    assert [m.content for m in ContextManager(budget=500, scorer="rules", store=path, session_id="s").messages] == ["kept"]
    for bad, shown in (("a\x00b.db", r"'\\x00'"), ("\ud83d.db", r"'\\ud83d'")):
        with pytest.raises(StoreError, match=rf"cannot open store .*: the path holds {shown} at character \d+, which no "
                                             "file name can hold"):
            ContextManager(budget=500, scorer="rules", store=str(tmp_path / bad))


def test_opening_waits_for_a_lock_held_on_a_new_file(tmp_path):
    """A process creating the file holds it exclusively for a moment; another one opening it then
    waits and opens it, a WAL store like any other."""
    path = tmp_path / "new.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    released = threading.Event()

    def release():
        time.sleep(1.0)
        released.set()
        holder.execute("COMMIT")

    threading.Thread(target=release).start()
    s = SQLiteStore(path)
    assert released.is_set()
    fill(s)
    assert s._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal" and len(s.load("s1")) == len(TEXTS)
    s.close()
    holder.close()


def test_closing_does_not_wait_for_another_connections_reader(tmp_path):
    """Closing checkpoints the WAL without waiting: a TRUNCATE checkpoint waiting for a reader holds
    the write lock, so every other writer of the file would wait with it."""
    path = tmp_path / "shared.db"
    a, b = SQLiteStore(path), SQLiteStore(path)
    fill(a)
    reader = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    reader.execute("BEGIN")
    reader.execute("SELECT COUNT(*) FROM messages").fetchone()  # a read transaction on the current snapshot
    fill(b, "s2")  # a frame the reader does not see: a TRUNCATE checkpoint has to wait for it
    order = []

    def end_read():
        time.sleep(2.0)
        order.append("reader ended")
        reader.execute("COMMIT")

    t = threading.Thread(target=end_read)
    t.start()
    b.close()
    order.append("closed")
    a.add("s1", [rec(None, "user", "still writable")])  # the writer of another connection goes on
    t.join()
    assert order == ["closed", "reader ended"]
    assert a.load("s1")[-1].message.content == "still writable"
    a.close()
    reader.close()


def test_opening_retries_a_lock_reported_without_waiting(tmp_path, monkeypatch):
    """SQLite returns SQLITE_BUSY without its busy wait where waiting could deadlock (two connections
    promoting their read locks, as when both switch a new file to WAL): the opening tries again and
    opens the file."""
    real_connect = sqlite3.connect
    refused = []

    class SwitchRacedOnce:
        def __init__(self, db):
            self._db = db

        def execute(self, sql, *args):
            if sql == "PRAGMA journal_mode=WAL" and len(refused) < 2:
                refused.append(sql)
                exc = sqlite3.OperationalError("database is locked")
                exc.sqlite_errorcode = sqlite3.SQLITE_BUSY
                raise exc
            return self._db.execute(sql, *args)

        def __getattr__(self, name):
            return getattr(self._db, name)

    monkeypatch.setattr(sqlite3, "connect", lambda *a, **kw: SwitchRacedOnce(real_connect(*a, **kw)))
    s = SQLiteStore(tmp_path / "raced.db")
    monkeypatch.undo()
    assert len(refused) == 2
    fill(s)
    assert s._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal" and len(s.load("s1")) == len(TEXTS)
    s.close()
    assert len(SQLiteStore(tmp_path / "raced.db").load("s1")) == len(TEXTS)
