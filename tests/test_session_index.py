"""The server stores' in-memory keyword ranking: the per-term row counts it keeps between searches
give exactly the ranking of a fresh count, as the session grows and when the cache drops terms."""

from __future__ import annotations

import pytest
from test_manager import agent_session

from ctxscore.messages import Message
from ctxscore.store import session_index
from ctxscore.store.retrieval import query_terms, stem_terms, trigram_tokens
from ctxscore.store.session_index import SessionIndex, indexed_message
from ctxscore.store.sqlite import index_text
from ctxscore.store.stemming import porter_stem, stem_index


def _indexed(turn: int, m: dict):
    text = Message.from_dict(m).text()
    indexed = index_text(text)
    stems, n = stem_index(indexed)
    return indexed_message(f"m{turn}", turn, text, indexed, "", trigram_tokens(indexed), stems, [], n, None)


QUERIES = ["which flight and seat did we book?", "the hotel price per night", "flight seat total price booked"]


# the session grows between searches by fewer rows than a cached term counts one by one, and by more
# (the rows added since are then counted in one scan of the joined texts from the first of them)
@pytest.mark.parametrize("step", [7, session_index._RESCAN_ROWS + 5])
@pytest.mark.parametrize("rows_cached", [session_index.TERM_ROWS_CACHED, 5])
def test_cached_term_counts_rank_as_a_fresh_count(monkeypatch, rows_cached, step):
    monkeypatch.setattr(session_index, "TERM_ROWS_CACHED", rows_cached)
    session = agent_session(40)
    msgs = [_indexed(i, m) for i, m in enumerate(session)]
    growing = SessionIndex()
    for start in range(0, len(msgs), step):
        growing.extend(msgs[start:start + step])
        fresh = SessionIndex()
        fresh.extend([_indexed(i, m) for i, m in enumerate(session[:start + step])])  # a message joins one index
        for q in QUERIES:
            terms = query_terms(q)[0]
            assert growing.keyword(terms, 100) == fresh.keyword(terms, 100)
            assert [growing._term_freq(t) for t in terms] == [fresh._term_freq(t) for t in terms]
            stems = [porter_stem(w) for w in stem_terms(q)]
            assert growing.stem(stems, 100) == fresh.stem(stems, 100) and growing.stem(stems, 100)[1]
    assert growing._term_rows == sum(len(f) for _, f in growing._term_freqs.values())
    if rows_cached == 5:
        assert growing._term_rows <= 5 or len(growing._term_freqs) == 1  # the cap holds


def test_a_message_joins_one_index_and_a_textless_index_refuses_short_terms():
    m = _indexed(0, {"role": "user", "content": "Book the hotel in Cambridge."})
    SessionIndex().extend([m])
    with pytest.raises(ValueError, match="already in an index"):
        SessionIndex().extend([m])
    lean = SessionIndex()
    text = "Book it"
    lean.extend([indexed_message("m0", 0, text, text, "", trigram_tokens(text), [], [], 2, None, short_terms=False)])
    with pytest.raises(ValueError, match="keeps no whole texts"):
        lean.short("bo", 10)
