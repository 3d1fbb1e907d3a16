"""Data layer on the real corpora (../shared/datasets; skipped with a reason when absent)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import pytest

from training.data import BuildConfig, build, load_dataset_dict, load_distilled, load_eval_sessions, split_of
from training.data.facts import check_facts
from training.data.schema import span_visible
from training.data.sources import crosswoz, multiwoz, sgd, swe_mini, tau

pytestmark = pytest.mark.corpora


def test_tau_loader_counts_ids_and_rendering(corpora):
    sessions = list(tau.iter_sessions(corpora))
    # README: 200 trajectories (50 tasks x 4 trials), 5,308 messages
    assert len(sessions) == 200
    assert sum(len(s["messages"]) for s in sessions) == 5308
    assert len({s["group"] for s in sessions}) == 50
    s = next(x for x in sessions if x["session_id"] == "tau_airline/airline-t0-r0")
    assert s["messages"][0]["role"] == "system" and s["messages"][0]["id"] == "tau_airline/airline-t0-r0#0"
    tool = next(m for m in s["messages"] if m["role"] == "tool")
    assert tool["text"] == f"[{tool['name']}] {tool['content']}"
    call = next(m for m in s["messages"] if m["tool_calls"])
    assert call["text"].startswith("TOOL_CALL " if not call["content"] else call["content"] + "\nTOOL_CALL ")
    errors = [m for x in sessions for m in x["messages"] if m["role"] == "tool" and m["content"].startswith("Error")]
    assert errors and all(m["weak"]["category"] == "failure" for m in errors)


def test_swe_loader_counts_and_patch_facts(corpora):
    n_sessions = n_messages = 0
    for s in swe_mini.iter_sessions(corpora):
        n_sessions += 1
        n_messages += len(s["messages"])
        assert s["messages"][1]["id"] == f"{s['session_id']}#1"
        assert check_facts(s["messages"], s["key_facts"]) == []
    # README: 500 trajectories, 41k messages
    assert n_sessions == 500 and 41_000 <= n_messages < 42_000


def test_dialogue_loaders_on_one_file_each(corpora):
    first = next(sgd.iter_sessions(corpora, splits=("test",)))
    assert first["session_id"] == "sgd/1_00000" and first["messages"][0]["id"] == "sgd/1_00000#0"
    assert {m["role"] for m in first["messages"]} == {"user", "assistant"}
    mw = list(multiwoz.iter_sessions(corpora))
    cw = list(crosswoz.iter_sessions(corpora))
    # README: about 1,000 MultiWOZ dialogues per file, 500 CrossWOZ dialogues per file
    assert sum(s["upstream_split"] == "test" for s in mw) == 1000
    assert sum(s["upstream_split"] == "test" for s in cw) == 500 and len(cw) == 1000
    assert all(s["language"] == "zh" for s in cw)
    for s in mw + cw:
        assert check_facts(s["messages"], s["key_facts"]) == []
    assert any("superseded" in f for s in mw for f in s["key_facts"])


def test_every_distilled_label_resolves_with_its_key_spans(corpora):
    labels = load_distilled(corpora / "labels" / "distilled.jsonl")
    texts: dict[str, str] = {}
    for it in (sgd.iter_sessions(corpora, splits=("test",)), multiwoz.iter_sessions(corpora),
               crosswoz.iter_sessions(corpora), tau.iter_sessions(corpora), swe_mini.iter_sessions(corpora)):
        for s in it:
            for m in s["messages"]:
                if m["id"] in labels:
                    texts[m["id"]] = m["text"]
    missing = sorted(set(labels) - set(texts))
    assert not missing, f"{len(missing)} label ids resolve to no message, e.g. {missing[:5]}"
    bad = [(i, sp) for i, lab in labels.items() for sp in lab["key_spans"] if not span_visible(texts[i], sp)]
    assert not bad, f"{len(bad)} key spans not in the annotators' view of their message, e.g. {bad[:5]}"


@pytest.fixture(scope="module")
def small_build(corpora, tmp_path_factory):
    """A build restricted to three sources (seconds, not the full corpora)."""
    out = tmp_path_factory.mktemp("processed")
    cfg = BuildConfig(sources=("crosswoz", "tau_airline", "swe_mini"), weak_caps={"crosswoz": 20, "swe_mini": 5, "tau_airline": 200},
                      eval_counts={"crosswoz": 2, "tau_airline": 2, "swe_mini": 2},
                      dev_counts={"crosswoz": 1, "tau_airline": 1, "swe_mini": 1})
    manifest = build(corpora, out, bundled_path=out / "no-bundled.jsonl", config=cfg, progress=False)
    return out, manifest


def test_no_session_group_in_two_splits(small_build):
    out, manifest = small_build
    dd = load_dataset_dict(out)
    where: dict[str, set[str]] = defaultdict(set)
    for sp in dd:
        for g in set(dd[sp]["group"]):
            where[g].add(sp)
    assert where and all(len(v) == 1 for v in where.values())
    tau_groups = {g for g in where if g.startswith("tau_airline/")}
    assert len(tau_groups) == 50  # by task across its trials (README: 50 tasks x 4 trials)
    per_split = Counter(next(iter(where[g])) for g in tau_groups)
    assert per_split["dev"] >= 5 and per_split["test"] >= 5
    assert manifest["mode"] == "partial"


def test_distilled_rows_carry_gold_labels(small_build, corpora):
    out, _ = small_build
    labels = load_distilled(corpora / "labels" / "distilled.jsonl")
    dd = load_dataset_dict(out)
    n = 0
    for sp in dd:
        for r in dd[sp].select_columns(["id", "category", "importance", "value", "key_spans", "label_source"]):
            if r["id"] in labels:
                n += 1
                lab = labels[r["id"]]
                assert r["label_source"] == "distilled" and r["category"] == lab["category"]
                assert r["importance"] == lab["importance"] and r["key_spans"] == lab["key_spans"]
                assert r["value"] == pytest.approx(lab["importance"] / 3)
            else:
                assert r["label_source"] == "weak"
    expected = sum(1 for i in labels if i.split("/")[0] in ("crosswoz", "tau_airline", "swe_mini"))
    assert n == expected


def test_eval_sessions_hold_the_contract(small_build):
    out, manifest = small_build
    dd = load_dataset_dict(out)
    test_groups = set(dd["test"]["group"])
    train_groups = set(dd["train"]["group"])
    for which in ("eval", "dev"):
        sessions = load_eval_sessions(out, which)
        assert sessions
        for s in sessions:
            assert 50 <= len(s["messages"]) <= 600
            assert check_facts(s["messages"], s["key_facts"]) == []
            assert s["key_facts"], f"{s['session_id']} has no key facts"
            assert {"source", "language", "session_id"} <= set(s)
            assert all("id" in m and m["role"] in ("system", "user", "assistant", "tool") for m in s["messages"])
            # held-out: every member group is in the file's split, none is a training group
            want = "test" if which == "eval" else "dev"
            for g in s["groups"]:
                assert manifest["split_assignments"].get(g.split("/")[0], {}).get(g, split_of(g)) == want
            assert not set(s["groups"]) & train_groups
    line = (out / "eval_sessions.jsonl").read_text(encoding="utf-8").splitlines()[0]
    assert json.loads(line)["split"] == "test"
    assert test_groups
    assert set(manifest["inputs"]) >= {"corpora:labels/distilled.jsonl"}
