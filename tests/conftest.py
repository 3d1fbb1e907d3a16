"""Shared test fixtures: corpora location, a fast offline MLflow store, tiny fake encoders, and the
PostgreSQL and Redis servers of the backend tests (``tests/_servers.py``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from _servers import pg_dsn, pg_url, redis_prefix, redis_server_url  # noqa: F401 - fixtures of the backend tests

REPO = Path(__file__).resolve().parents[1]


def corpora_root() -> Path:
    """The corpora folder: ``CTXSCORE_CORPORA`` or ``../shared/datasets`` next to the repository."""
    env = os.environ.get("CTXSCORE_CORPORA")
    return Path(env) if env else (REPO.parent / "shared" / "datasets").resolve()


@pytest.fixture(scope="session")
def corpora() -> Path:
    """Path to ../shared/datasets; skips the test with a reason when it is absent."""
    root = corpora_root()
    if not (root / "labels" / "distilled.jsonl").is_file():
        pytest.skip(f"corpora not found at {root} (set CTXSCORE_CORPORA to the datasets folder)")
    return root


@pytest.fixture(autouse=True)
def _isolated_mlflow(tmp_path_factory, monkeypatch):
    """Every test gets its own MLflow file store, never the repository's mlruns/."""
    store = tmp_path_factory.mktemp("mlruns")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store / 'mlflow.db'}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
