"""ctxscore.store.stemming reproduces SQLite's ``porter unicode61 remove_diacritics 2`` index token by
token (what lets the PostgreSQL store rank the stem list like SQLite)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from ctxscore.store.stemming import porter_stem, stem_index, stem_tokens

BUNDLED = Path(__file__).resolve().parents[1] / "data" / "bundled" / "sessions.jsonl"
AWKWARD = [
    "Ünïcode naïve café Ærøskøbing straße ﬁne ½ ٣ x_y a-b 'quoted' 日本語テキスト 中文 emoji😀test",
    "caresses ponies ties caress cats feed agreed plastered bled motoring sing conflated troubled sized hopping",
    "tanned falling hissing fizzed failing filing happy sky relational conditional rational valenci hesitanci",
    "digitizer conformabli radicalli differentli vileli analogousli vietnamization predication operator feudalism",
    "decisiveness hopefulness callousness formaliti sensitiviti sensibiliti triplicate formative formalize",
    "electriciti electrical hopeful goodness revival allowance inference airliner gyroscopic adjustable defensible",
    "irritant replacement adjustment dependent adoption homologou communism activate angulariti homologous",
    "effective bowdlerize probate rate cease controll roll generalizations oscillators REF7GAWK763 booking2 x" * 2,
]


def sqlite_tokens(texts: list[str]) -> list[list[str]]:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE f USING fts5(t, tokenize='porter unicode61 remove_diacritics 2')")
    db.execute("CREATE VIRTUAL TABLE v USING fts5vocab(f, 'instance')")
    db.executemany("INSERT INTO f(rowid, t) VALUES(?, ?)", [(i + 1, t) for i, t in enumerate(texts)])
    rows: dict[int, list[tuple[int, str]]] = {}
    for term, doc, _col, off in db.execute("SELECT term, doc, col, offset FROM v"):
        rows.setdefault(doc, []).append((off, term))
    return [[t for _, t in sorted(rows.get(i + 1, []))] for i in range(len(texts))]


def test_tokens_and_stems_match_sqlite():
    texts = [m["content"] for line in BUNDLED.read_text(encoding="utf-8").splitlines()
             for m in json.loads(line)["messages"] if m.get("content")] + AWKWARD
    want = sqlite_tokens(texts)
    got = [stem_tokens(t) for t in texts]
    bad = [(t[:60], g[:8], w[:8]) for t, g, w in zip(texts, got, want, strict=True) if g != w]
    assert len(texts) > 1500 and not bad, bad[:3]


def test_stem_index_keeps_what_a_query_can_match():
    stems, n = stem_index("The Bookings were BOOKED for 2 nights at Café Ünïcode, ref 7GAWK763; 中文")
    assert stems == ["the", "book", "were", "book", "for", "night", "at", "cafe", "unicod", "ref"]
    assert n == 13  # the digits, the id and the Chinese run are tokens too (bm25 document length)
    assert porter_stem("ferraris") == "ferrari" and porter_stem("generalizations") == "gener"
