"""The learned page-in ranker, the key-span extractor, the outcome value head and the hard-constraint
rule, on the bundled labelled set (real sessions, built into a temporary folder) with the tiny
``hashing-64`` embedder: mining, fitting, packaging, loading, and the runtime paths that use them."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import numpy as np
import pytest

from ctxscore import ContextManager
from ctxscore.compress.verify import key_spans
from ctxscore.errors import ModelLoadError
from ctxscore.messages import CATEGORIES, Message
from ctxscore.scoring import spans as spans_mod
from ctxscore.scoring.learned import HARD_CONSTRAINT_PROB, LearnedScorer
from ctxscore.scoring.ranker import FEATURE_NAMES, RERANK_POOL, Ranker, SessionRows, pair_features, terms
from ctxscore.scoring.spans import SpanExtractor, runs_of, tokenize
from ctxscore.window.pagein import search

REPO = Path(__file__).resolve().parents[1]
BUNDLED = REPO / "data" / "bundled" / "sessions.jsonl"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A scorer trained on the bundled set (hashing-64) with its ranker and span extractor, exported."""
    if not BUNDLED.is_file():
        pytest.skip("data/bundled/sessions.jsonl is absent")
    from training import train
    from training.data import build

    root = tmp_path_factory.mktemp("ranker")
    data = root / "processed"
    build(out=data, use_corpora=False, progress=False)
    out = root / "scorer"
    rc = train.main(["--embedder", "hashing-64", "--lexical-dim", "64", "--no-mlflow", "--latency-n", "0",
                     "--data", str(data), "--cache-dir", str(root / "cache"), "--feedback", str(root / "none.jsonl"),
                     "--export", str(out)])
    assert rc == 0
    return data, out


def test_train_sessions_are_built_from_the_train_split(trained):
    data, _ = trained
    lines = (data / "train_sessions.jsonl").read_text(encoding="utf-8").splitlines()
    sessions = [json.loads(x) for x in lines]
    assert sessions and all(s["split"] == "train" and s["session_id"].startswith("train/") for s in sessions)
    held = {g for f in ("dev_sessions.jsonl", "eval_sessions.jsonl")
            for x in (data / f).read_text(encoding="utf-8").splitlines() for g in json.loads(x)["groups"]}
    assert not held & {g for s in sessions for g in s["groups"]}  # never a held-out group
    manifest = json.loads((data / "manifest.json").read_text())
    assert manifest["eval_files"]["train_sessions.jsonl"]["sessions"] == len(sessions)


def test_exported_scorer_has_a_ranker_and_span_extractor(trained):
    _, out = trained
    cfg = json.loads((out / "config.json").read_text())
    assert {"ranker.skops", "spans.skops"} <= set(cfg["files"])
    assert cfg["ranker"]["features"] == list(FEATURE_NAMES)
    extras = cfg["metrics"]["extras"]
    # the learned order beats the fused one on the held-out bundled sessions
    assert extras["ranker_eval_learned_src_mrr"] > extras["ranker_eval_fused_src_mrr"]
    assert extras["spans_test_learned_char_f1"] > extras["spans_test_rules_char_f1"]
    scorer = LearnedScorer.from_pretrained(out)
    assert isinstance(scorer.ranker, Ranker) and isinstance(scorer.spans, SpanExtractor)
    assert scorer.key_spans("My member number is HY74579789, no flights before 8am.")
    total = sum(p.stat().st_size for p in out.iterdir())
    assert total < 2_000_000


def test_a_folder_without_the_optional_heads_still_loads(trained, tmp_path):
    _, out = trained
    scorer = LearnedScorer.from_pretrained(out)
    scorer.ranker = scorer.spans = None
    folder = scorer.save_pretrained(tmp_path / "plain")
    assert not (folder / "ranker.skops").exists() and not (folder / "spans.skops").exists()
    plain = LearnedScorer.from_pretrained(folder)
    assert plain.ranker is None and plain.spans is None and plain.key_spans("ABC123 on May 3") == []


def test_a_named_but_missing_ranker_is_refused(trained, tmp_path):
    import shutil

    _, out = trained
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    (bad / "ranker.skops").unlink()
    with pytest.raises(ModelLoadError, match="ranker.skops is missing"):
        LearnedScorer.from_pretrained(bad)
    (bad / "ranker.skops").write_bytes((out / "spans.skops").read_bytes())
    with pytest.raises(ModelLoadError, match="corrupt or was modified"):
        LearnedScorer.from_pretrained(bad)


def test_a_ranker_of_other_features_is_left_out_with_a_warning(trained, tmp_path, caplog):
    import shutil

    _, out = trained
    old = tmp_path / "old"
    shutil.copytree(out, old)
    cfg = json.loads((old / "config.json").read_text(encoding="utf-8"))
    cfg["ranker"]["features"] = cfg["ranker"]["features"][:40]  # an export from before the six replaced/anchor features
    (old / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    with caplog.at_level("WARNING", logger="ctxscore"):
        scorer = LearnedScorer.from_pretrained(old)
    assert scorer.ranker is None and scorer.spans is not None
    assert "page-in ranker is not used" in caplog.text and "re-export" in caplog.text
    assert scorer.predict([Message(role="user", content="Book a table for 2 at 19:00.")])[0].category


def _session(data: Path) -> dict:
    return json.loads((data / "eval_sessions.jsonl").read_text(encoding="utf-8").splitlines()[0])


def test_page_in_search_uses_the_ranker(trained, monkeypatch):
    data, out = trained
    scorer = LearnedScorer.from_pretrained(out)
    sess = _session(data)
    cm = ContextManager(budget=4000, scorer=scorer)
    keys = ("role", "content", "name", "tool_calls", "tool_call_id", "id")
    cm.extend([{k: m[k] for k in keys if m.get(k) is not None} for m in sess["messages"]])
    fact = sess["key_facts"][0]
    hits = search(cm.store, cm.session_id, scorer, fact["probe"], 10)
    fused = cm.store.search(cm.session_id, fact["probe"], k=RERANK_POOL,
                            query_embedding=scorer.embed_texts([fact["probe"]])[0])
    assert 0 < len(hits) <= 10
    assert all(0.0 <= h.score <= 1.0 for h in hits)  # the ranker's probabilities
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert all(h.learned == h.score for h in hits)  # what the page-in floor reads (Policy.page_in_rank_floor)
    assert all(h.learned is None for h in fused)
    assert {h.id for h in hits} <= {h.id for h in fused}
    assert cm.build(query=fact["probe"]).tokens > 0

    def broken(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(scorer, "rerank", broken)
    plain = search(cm.store, cm.session_id, scorer, fact["probe"], 10)
    assert [h.id for h in plain] == [h.id for h in fused[:10]]  # the fused order when re-ranking fails


def test_pair_features_shape_and_neutral_unknown_turns(trained):
    rows = SessionRows()
    texts = ["I need a train to Cambridge on Saturday.", "What time would you like to leave?", "After 10:00 please."]
    for i, t in enumerate(texts):
        rows.add(i, "user" if i != 1 else "assistant", t, None, {"probs": {"instruction": 1.0}, "value": 0.5})
    from ctxscore.store.retrieval import Hit

    hits = [Hit(id=f"m{i}", turn=i, score=1.0 / (i + 1), snippet="", lists=frozenset({"keyword"})) for i in range(3)]
    hits.append(Hit(id="gone", turn=99, score=0.1, snippet=""))
    X = pair_features("What time did the user want to leave for the train?", None, hits, rows, [0, 1, 2, -1])
    assert X.shape == (4, len(FEATURE_NAMES)) and X.dtype == np.float32 and np.isfinite(X).all()
    col = {n: i for i, n in enumerate(FEATURE_NAMES)}
    assert X[2, col["type_match"]] == 1.0  # asks for a time, the message holds one
    assert X[2, col["cover_prev"]] > 0  # the question before it names the time
    assert X[3, col["role_user"]] == 0.0 and X[3, col["bm25"]] == 0.0
    assert terms("Trains leaving") == ["train", "leav"]


def test_pair_features_mark_a_replaced_value_and_the_side_of_the_anchor():
    rows = SessionRows()
    texts = [("user", "Find me a therapist in Los Gatos please."),                # 0: the city, replaced at 2
             ("assistant", "Dr. Lee is a therapist in Los Gatos. Shall I book?"),
             ("user", "Do you have any other alternatives? Find someone in San Rafael."),  # 2: the current city
             ("assistant", "Dr. Kim works in San Rafael."),
             ("user", "Great, thanks.")]
    texts += [("user" if i % 2 else "assistant", f"Museum {i} shows paintings.") for i in range(15)]  # 20 rows
    for i, (role, t) in enumerate(texts):
        rows.add(i, role, t, None, None)
    assert rows.rows[0].successor == 2 and rows.rows[1].successor == 2  # another place restates both
    assert rows.rows[2].successor == -1 and rows.rows[3].successor == -1
    from ctxscore.store.retrieval import Hit

    hits = [Hit(id=f"m{i}", turn=i, score=1.0, snippet="") for i in range(5)]
    X = pair_features("Which city did the user settle on, San Rafael?", None, hits, rows, list(range(5)))
    col = {n: i for i, n in enumerate(FEATURE_NAMES)}
    assert X[0, col["replaced"]] == 1.0 and X[2, col["replaced"]] == 0.0
    assert X[0, col["replaced_gap_log"]] == np.float32(np.log1p(2))
    assert X[0, col["replaced_by_asked"]] == 1.0  # the message that replaced it names a place, which is asked
    # "rafael" is a rare query term (2 of 20 messages): messages 2 and 3 hold it; 4 comes after it, 0 before
    assert X[4, col["anchor_before_log"]] == np.float32(np.log1p(1)) and X[4, col["anchor_after_log"]] == np.float32(np.log1p(20))
    assert X[0, col["anchor_after_log"]] == np.float32(np.log1p(2)) and X[0, col["anchor_before_log"]] == np.float32(np.log1p(20))
    assert X[0, col["later_type_log"]] > 0  # later messages hold a place too


def test_rows_link_a_value_that_is_no_entity_through_the_alternative_cue():
    from ctxscore.scoring.rules import RuleConfig, default_config

    texts = [("user", "I'm looking for some traditional food in the centre."),
             ("assistant", "There are no traditional restaurants in the centre."),
             ("user", "Ok, how about lebanese food?"),
             ("assistant", "Ali Baba serves lebanese food.")]
    rows = SessionRows()
    for i, (role, t) in enumerate(texts):
        rows.add(i, role, t, None, None)
    assert [r.successor for r in rows.rows] == [2, 2, -1, -1]  # "how about": the cuisine was replaced
    cfg = default_config()
    older = RuleConfig.from_dict({**cfg.raw, "keywords": {k: v for k, v in cfg.keywords.items() if k != "alternative"}})
    rows = SessionRows(config=older)  # a rule file without the group: no cue, and the cuisine is no entity
    for i, (role, t) in enumerate(texts):
        rows.add(i, role, t, None, None)
    assert [r.successor for r in rows.rows] == [-1, -1, -1, -1]


def test_span_runs_merge_joining_punctuation():
    text = "Call 010-69771665 or visit 33 - 34 Saint Andrews Street."
    toks = tokenize(text)
    keep = np.array([text[a:b] not in ("Call", "or", "visit") for a, b in toks])
    runs = runs_of(text, toks, keep, keep.astype(float))
    assert [text[a:b] for a, b in runs] == ["010-69771665", "33 - 34 Saint Andrews Street"]


def test_registered_extractor_adds_spans_to_the_verifier(trained):
    _, out = trained
    scorer = LearnedScorer.from_pretrained(out)
    text = "The easiest place to fly out of is Washington and I will be flying to London."
    base = key_spans(text)
    try:
        spans_mod.register(lambda t: ["fly out of is Washington", "not in the text"])
        assert key_spans(text) == [*base, "fly out of is Washington"]
        spans_mod.register(scorer.spans.spans)
        assert set(base) <= set(key_spans(text))
    finally:
        spans_mod.register(None)
    assert key_spans(text) == base and spans_mod.registered() is None
    facts = scorer.spans.facts("Your reference number is LYIENP77.")
    assert all(slot == "key span" and v in "Your reference number is LYIENP77." for slot, v in facts)


def test_hard_constraints_are_instructions(trained):
    _, out = trained
    scorer = LearnedScorer.from_pretrained(out)
    msgs = [Message(role="user", content="Never touch the production database; staging only.", turn=7),
            Message(role="user", content="<returncode>0</returncode>\n<output>\nfields must be unique\n</output>", turn=8),
            Message(role="user", content="不要动生产数据库，只能用测试环境。", turn=9)]
    preds = scorer.predict(msgs)
    assert preds[0].category == "instruction" and preds[0].probs["instruction"] >= HARD_CONSTRAINT_PROB
    assert preds[2].category == "instruction"
    assert abs(sum(preds[0].probs.values()) - 1.0) < 1e-9
    assert list(scorer.hard_constraint_rows(msgs, scorer.features(msgs))) == [0, 2]  # not the tool observation


def test_outcome_value_head_and_auc():
    from sklearn.linear_model import Ridge

    from training.outcomes import fit_value_head, outcome_labels, value_auc

    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 6))
    imp = Ridge().fit(X, X[:, 0])
    y = (X[:, 1] > 0).astype(float)
    head = fit_value_head(imp, X, y, 0.3)
    np.testing.assert_allclose(head.predict(X[:5]), 0.7 * imp.predict(X[:5]) + 0.3 * head.estimators_[1].predict(X[:5]))
    assert fit_value_head(imp, X, y, 0.0) is imp
    with pytest.raises(ValueError):
        fit_value_head(imp, X, y, 1.5)
    auc = value_auc(head.predict(X), X[:, 0], y)
    assert auc["learned"] > auc["rules"]
    sess = {"messages": [{}] * 4, "key_facts": [{"source_index": 1}, {"source_index": 3}]}
    assert outcome_labels(sess).tolist() == [0.0, 1.0, 0.0, 1.0]


def test_ranker_queries_round_trip_and_refill(trained, tmp_path):
    from training import ranker as R

    data, _ = trained
    sess = _session(data)
    n = len(sess["messages"])
    emb = np.zeros((n, 8), dtype=np.float32)
    queries = R.mine_set([sess], [emb], lambda texts: np.zeros((len(texts), 8), dtype=np.float32))
    assert queries and all(q.X.shape == (len(q.turns), len(FEATURE_NAMES)) for q in queries)
    assert any(q.label.any() for q in queries)
    R.save_queries(queries, tmp_path / "q.npz")
    back = R.load_queries(tmp_path / "q.npz")
    assert [q.fact_id for q in back] == [q.fact_id for q in queries]
    np.testing.assert_array_equal(back[0].X, queries[0].X)
    preds = {sess["session_id"]: np.tile(np.array([0.1, 0.2, 0.3, 0.4, 0.9], np.float32), (n, 1))}
    R.refill(back, preds)
    assert (back[0].X[:, R.PRED_COLUMNS] == preds[sess["session_id"]][0]).all()
    m = R.rank_metrics(back, None)
    assert 0 <= m["src_mrr"] <= 1 and m["n"] == len(back)


def test_off_topic_queries_ask_another_domain_and_have_only_negatives(trained):
    from training import ranker as R

    data, _ = trained
    sess = {**_session(data), "source": "multiwoz"}  # a dialogue source (the bundled set mixes domains)
    n = len(sess["messages"])
    code = R.DOMAINS["swe_mini"]
    pool = {"dialogue": ["What time is the table booked for?"], code: ["Which file did the patch change?",
                                                                       "What does the failing test assert?"]}
    asks = R.offtopic_asks(sess, pool, random.Random(0))
    assert sorted(asks) == R.probe_turns(n)
    assert {f["probe"] for fs in asks.values() for f in fs} <= set(pool[code])  # never its own domain's question
    queries = R.mine_set([sess], [np.zeros((n, 8), dtype=np.float32)],
                         lambda texts: np.zeros((len(texts), 8), dtype=np.float32), offtopic=pool, weight=R.OFFTOPIC_WEIGHT)
    assert queries and not any(q.label.any() for q in queries)
    X, y, w, _ = R.stack(queries)
    assert len(y) == sum(len(q.turns) for q in queries) and not y.any() and (w > 0).all()
    assert R.offtopic_asks(sess, {"dialogue": ["What time is the table booked for?"]}, random.Random(0)) == {}
    # the bundled sessions chain shop support, IT operations and coding: no domain, so no off-topic question
    mixed = _session(data)
    assert mixed["source"] == "bundled" and R.offtopic_asks(mixed, pool, random.Random(0)) == {}
    assert R.offtopic_pool([mixed]) == {}


def test_off_topic_queries_are_cached_apart_with_their_weight(trained, tmp_path):
    from training import ranker as R

    data, _ = trained
    sess = {**_session(data), "source": "sgd"}
    n = len(sess["messages"])
    emb, zeros = [np.zeros((n, 8), dtype=np.float32)], (lambda texts: np.zeros((len(texts), 8), dtype=np.float32))
    pool = {"code": ["Which file did the patch change?"]}
    mined = R.cached_mine("train", [sess], emb, zeros, "k", tmp_path, REPO)
    off = R.cached_mine("train-offtopic", [sess], emb, zeros, "k", tmp_path, REPO, offtopic=pool)
    assert len(list(tmp_path.glob("*.npz"))) == 2 and any(q.label.any() for q in mined)
    back = R.cached_mine("train-offtopic", [sess], emb, zeros, "k", tmp_path, REPO, offtopic=pool)  # from the cache
    assert [q.probe for q in back] == [q.probe for q in off] == ["Which file did the patch change?"] * len(off)
    assert all(q.weight == R.OFFTOPIC_WEIGHT and not q.label.any() for q in back)
    other = R.cached_mine("train-offtopic", [sess], emb, zeros, "k", tmp_path, REPO, offtopic={"code": ["Why?"]})
    assert {q.probe for q in other} == {"Why?"} and len(list(tmp_path.glob("*.npz"))) == 3  # the pool is in the key


def test_search_log_line_when_reranking_fails(trained, caplog, monkeypatch):
    data, out = trained
    scorer = LearnedScorer.from_pretrained(out)
    cm = ContextManager(budget=2000, scorer=scorer)
    cm.add({"role": "user", "content": "Book the 8:15 train to Cambridge."})
    monkeypatch.setattr(scorer.ranker, "rerank", lambda *a, **k: (_ for _ in ()).throw(ValueError("bad")))
    with caplog.at_level(logging.WARNING, logger="ctxscore"):
        assert search(cm.store, cm.session_id, scorer, "which train?", 5)
    assert "re-ranking failed" in caplog.text
    assert set(CATEGORIES) >= {p.category for p in cm.predictions()}


def _toy_ranker() -> Ranker:
    """A ranker whose model is fitted on random features: the row-keeping tests do not need a trained one."""
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    return Ranker(LogisticRegression().fit(rng.normal(size=(20, len(FEATURE_NAMES))), [0, 1] * 10))


def _chat(cm: ContextManager, n: int, text: str) -> None:
    """``n`` alternating user / assistant messages ``text.format(i)`` added to ``cm``."""
    cm.extend([{"role": "user" if i % 2 == 0 else "assistant", "content": text.format(i)} for i in range(n)])


def test_ranker_rows_follow_a_truncated_session():
    """After ContextManager.truncate (an event log's rollback, a sync rebase) the turns are reused by new
    messages: the ranker must read them, not serve the detached ones at those turns."""
    from ctxscore.store.retrieval import Hit

    ranker = _toy_ranker()
    cm = ContextManager(budget=2000, scorer="rules", session_id="s")
    _chat(cm, 6, "old message {} about the hotel")
    assert [r.text for r in ranker.session_rows(cm.store, "s").rows][3] == "old message 3 about the hotel"
    cm.truncate(3)
    cm.add({"role": "assistant", "content": "NEW train to cambridge at 09:15"})
    new = cm.store.load("s")[3]
    hit = Hit(id=new.id, turn=3, score=0.0, snippet=new.text[:120])
    rows = ranker.session_rows(cm.store, "s", [hit])
    assert [r.text for r in rows.rows] == [m.text for m in cm.store.load("s")]
    assert rows.rows[3].text == "NEW train to cambridge at 09:15"
    ranked = ranker.rerank("train to cambridge", None, [hit], cm.store, "s")
    assert [h.id for h in ranked] == [new.id]
    cm.close()


def test_ranker_rows_read_only_the_new_turns():
    """A proxy adds two messages between queries (the reply and the next user message): the ranker's
    view of the session is extended by those rows, not read again from the first turn, and holds
    what a fresh read holds."""
    ranker = _toy_ranker()
    cm = ContextManager(budget=2000, scorer="rules", session_id="s")
    _chat(cm, 6, "message {} about the hotel")
    view = ranker.session_rows(cm.store, "s")
    cm.extend([{"role": "assistant", "content": "the Grand at 120 a night"},
               {"role": "user", "content": "and the train?"}])
    loads: list[int] = []
    real_load = cm.store.load
    cm.store.load = lambda sid, after_turn=-1: loads.append(after_turn) or real_load(sid, after_turn)
    again = ranker.session_rows(cm.store, "s")
    cm.store.load = real_load
    assert again is view and loads == [4]  # the last row read (turn 5, unchanged) and the two new ones
    fresh = Ranker(ranker.model).session_rows(cm.store, "s")
    assert [(r.turn, r.text, r.tf, r.successor) for r in again.rows] == \
        [(r.turn, r.text, r.tf, r.successor) for r in fresh.rows]
    assert again.df == fresh.df and again.postings == fresh.postings and again.total_len == fresh.total_len
    cm.close()


@pytest.mark.parametrize("regrow", [0, 4, 6])
def test_ranker_rows_follow_a_rebase_no_hit_points_at(regrow):
    """A session truncated (an edited history resent to the proxy) and grown again by other messages,
    shorter, as long or longer than before: the ranker's rows are those of a fresh read even when no
    hit names a changed turn."""
    ranker = _toy_ranker()
    cm = ContextManager(budget=2000, scorer="rules", session_id="s")
    _chat(cm, 6, "old message {} about the hotel")
    ranker.session_rows(cm.store, "s")
    cm.truncate(2)
    _chat(cm, regrow, "new message {} about a train")
    rows = ranker.session_rows(cm.store, "s")
    fresh = Ranker(ranker.model).session_rows(cm.store, "s")
    assert [r.text for r in rows.rows] == [r.text for r in fresh.rows] == [m.text for m in cm.store.load("s")]
    assert rows.df == fresh.df and rows.total_len == fresh.total_len
    cm.close()


def test_ranker_keeps_the_rows_of_the_sessions_used_last(monkeypatch):
    """One store shared by many sessions (PostgreSQL behind a proxy): the ranker keeps the rows of the
    RANKER_SESSIONS sessions used last, and reads a session it let go again whole."""
    from ctxscore.scoring import ranker as ranker_mod
    from ctxscore.store.sqlite import SQLiteStore

    monkeypatch.setattr(ranker_mod, "RANKER_SESSIONS", 2)
    ranker = _toy_ranker()
    store = SQLiteStore(":memory:")
    managers = {s: ContextManager(budget=2000, scorer="rules", session_id=s, store=store) for s in "abc"}
    for s, cm in managers.items():
        cm.extend([{"role": "user", "content": f"session {s} asks for the hotel"},
                   {"role": "assistant", "content": f"session {s} books the Grand"}])
    views = {s: ranker.session_rows(store, s) for s in "abc"}
    assert list(ranker._views[store]) == ["b", "c"]
    again = ranker.session_rows(store, "a")
    assert again is not views["a"] and [r.text for r in again.rows] == [r.text for r in views["a"].rows]
    assert list(ranker._views[store]) == ["c", "a"]
    assert ranker.session_rows(store, "c") is views["c"]
    for cm in managers.values():
        cm.close()
    store.close()


@pytest.mark.parametrize("wrap", ["eval cache", "LLM second path"])
def test_a_wrapped_learned_scorer_keeps_its_ranker_and_span_extractor(trained, wrap):
    """The evaluation's prediction cache and the LLM dual path hand the manager the wrapped scorer's
    page-in ranker and key-span extractor: without them the compressed tiers, the fact ledger and
    page-in would silently fall back to the rules."""
    from ctxscore.llm import DualPathScorer, LLMClassifier, LLMClient
    from ctxscore.memory.ledger import FactLedger
    from ctxscore.scoring.spans import extractor_of, facts_of
    from eval.policies import CachedScorer

    data, out = trained
    scorer = LearnedScorer.from_pretrained(out)
    if wrap == "eval cache":
        wrapped = CachedScorer(scorer)
    else:  # the LLM is never called: no message is below a threshold of 0
        wrapped = DualPathScorer(scorer, LLMClassifier(LLMClient(base_url="http://127.0.0.1:9", model="m")), threshold=0.0)
    text = "My member number is HY74579789, no flights before 8am."
    assert extractor_of(wrapped)(text) == scorer.key_spans(text) != []
    assert facts_of(wrapped)(text) == scorer.spans.facts(text)
    sess = _session(data)
    keys = ("role", "content", "name", "tool_calls", "tool_call_id", "id")
    msgs = [{k: m[k] for k in keys if m.get(k) is not None} for m in sess["messages"]]
    ledger = FactLedger()
    cm = ContextManager(budget=4000, scorer=wrapped, layers=[ledger])
    cm.extend(msgs)
    assert ledger.fctx.extractor is not None
    assert any(f.origin == "extractor" for f in ledger.facts)  # spans the rules missed reached the ledger
    probe = sess["key_facts"][0]["probe"]
    hits = search(cm.store, cm.session_id, wrapped, probe, 10)
    assert hits and all(h.learned is not None for h in hits)  # re-ranked by the learned ranker


def test_span_probabilities_are_the_models_own(trained):
    """The extractor hashes with memoised columns and takes the logistic of the linear decision; on the
    bundled messages that is exactly FeatureHasher + ``predict_proba``, and a model that is not a
    binary log-loss SGDClassifier is asked through ``predict_proba``."""
    import copy

    import scipy.sparse as sp
    from sklearn.feature_extraction import FeatureHasher
    from sklearn.linear_model import LogisticRegression

    from ctxscore.scoring.spans import N_FEATURES, _window, token_features

    data, out = trained
    ext = LearnedScorer.from_pretrained(out).spans
    assert ext._linear is not None  # the shipped kind of model takes the short path
    hasher = FeatureHasher(n_features=N_FEATURES, input_type="string", alternate_sign=False)
    texts = [m["content"] for line in BUNDLED.read_text(encoding="utf-8").splitlines()
             for m in json.loads(line)["messages"] if m.get("content")][:300]
    rows, probs = [], []
    for t in texts:
        win = _window(t)
        toks = tokenize(win)
        if not toks:
            continue
        feats = token_features(win, toks, "user", ext.config)
        X = hasher.transform(feats)
        assert (ext._hash(feats) != X).nnz == 0
        got = ext.token_probs(t, "user")[1]
        assert np.allclose(got, ext.model.predict_proba(X)[:, 1], rtol=0, atol=1e-12)
        rows.append(X)
        probs.append(got)
    X = sp.vstack(rows)
    y = (np.concatenate(probs) >= 0.5).astype(int)
    other = SpanExtractor(LogisticRegression(max_iter=200).fit(X, y))
    assert other._linear is None
    t = texts[0]
    win = _window(t)
    expected = other.model.predict_proba(hasher.transform(token_features(win, tokenize(win), "user", other.config)))[:, 1]
    assert np.array_equal(other.token_probs(t, "user")[1], expected)
    sparse = copy.deepcopy(ext.model).sparsify()  # sparse coefficients: asked through predict_proba
    ext2 = SpanExtractor(sparse, config=ext.config)
    assert ext2._linear is None
    X = hasher.transform(token_features(win, tokenize(win), "user", ext.config))
    assert np.allclose(ext2.token_probs(t, "user")[1], ext.token_probs(t, "user")[1], rtol=0, atol=1e-12)
    assert np.array_equal(ext2.token_probs(t, "user")[1], sparse.predict_proba(X)[:, 1])


_REPLIES = {"en": ["Your booking is confirmed, reference ZX{i:04d}, for {g} guests.",
                   "Table reserved at {r}; your reference is ZX{i:04d}.",
                   "Train ticket issued, reference ZX{i:04d}, departing at {h}:15.",
                   "Hotel room booked for {g} nights, confirmation reference ZX{i:04d}."],
            "zh": ["您的预订已确认，订单号ZX{i:04d}，共{g}位客人。", "已为您预订{r}的座位，订单号是ZX{i:04d}。",
                   "火车票已出票，订单号ZX{i:04d}，{h}点15分发车。", "酒店已订好，住{g}晚，确认号ZX{i:04d}。"]}


@pytest.mark.parametrize(("lang", "ask"), [("en", "Please book option {i}."), ("zh", "请帮我订第{i}个选项。")])
def test_an_identifier_query_ranks_the_message_holding_it_first(lang, ask):
    """The packaged ranker put "... reference ZX0005." above "... reference ZX0004 ..." for the query
    "ZX0004" (its probes name a task's identifier to ask for another value, found after the naming;
    the embeddings do not tell the two apart); the rules scorer's search had it first."""
    cm = ContextManager(budget=4000, scorer="auto")
    venues = ["Pizza Hut", "Nando's", "The Ivy", "Wagamama"]
    for i in range(40):
        cm.add({"role": "user", "content": ask.format(i=i)})
        cm.add({"role": "assistant", "content": _REPLIES[lang][i % 4].format(i=i, g=2 + i % 5, r=venues[i % 4], h=8 + i % 10)})
    for query, want in (("ZX0004", "ZX0004"), ("what was ZX0004?", "ZX0004"), ("zx0031", "ZX0031")):
        top = cm.search(query, k=3)[0]["message"]["content"]
        assert want in top, (query, top)


def test_only_a_query_of_identifiers_alone_moves_exact_matches_first():
    from ctxscore.scoring.ranker import exact_first, query_identifiers

    assert query_identifiers("ZX0004") == ["ZX0004"] and query_identifiers("what was ZX0004?") == ["ZX0004"]
    assert query_identifiers("#W2378156 12345678") == ["W2378156", "12345678"]
    for other in ("What is the booking reference for the train (TR1234)?", "ZX0004的订单", "2024", "reference"):
        assert query_identifiers(other) == []  # a question naming a task's identifier asks for another value
    rows = SessionRows()
    for t, text in enumerate(["Booked, reference ZX0004.", "Booked, reference ZX0005.", "zx0004-b is another code"]):
        rows.add(t, "assistant", text, None, None)
    assert exact_first("ZX0004", [1, 2, 0], rows, [0, 1, 2]) == [0, 1, 2]
    assert exact_first("reference ZX0004", [1, 2, 0], rows, [0, 1, 2]) == [1, 2, 0]
