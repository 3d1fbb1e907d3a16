"""Store size per session, measured from real sessions stored in SQLite and in PostgreSQL.

Each of the first ``--sessions`` held-out sessions (``data/processed/eval_sessions.jsonl``, else
the bundled sessions) is stored through ``ContextManager(store=...).sync(messages)`` with the given
scorer (``rules``: no embeddings; ``learned``: the shipped scorer, whose embeddings are stored per
message), in a fresh SQLite file and in a fresh PostgreSQL schema. Figures: bytes per session and
per message in each store (SQLite: the database file after a WAL checkpoint and VACUUM;
PostgreSQL: ``pg_total_relation_size`` of every table of the schema, indexes and TOAST included),
the messages and text characters per session, and the CPU seconds a session's ingest took.

Usage::

    CTXSCORE_PG_DSN=postgresql://... python benchmarks/store_size.py [--sessions 12] [--scorer rules|learned]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sqlite3
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: import the checkout's packages

from training.paths import DEFAULT_BUNDLED, DEFAULT_OUT  # noqa: E402

OPENAI_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id")


def real_sessions(n: int) -> tuple[str, list[tuple[str, list[dict]]]]:
    """The first ``n`` held-out sessions (else bundled ones) as (source, [(id, OpenAI-style messages)])."""
    path = DEFAULT_OUT / "eval_sessions.jsonl"
    src = path if path.is_file() else DEFAULT_BUNDLED
    out = []
    for k, line in enumerate(src.read_text(encoding="utf-8").splitlines()[:n]):
        doc = json.loads(line)
        msgs = [{key: m[key] for key in OPENAI_KEYS if key in m} for m in doc["messages"]]
        out.append((doc.get("session_id", f"s{k}"), msgs))
    return src.name, out


def make_scorer(name: str) -> Any:
    """``"rules"`` or the shipped learned scorer (warmed up)."""
    if name == "rules":
        return "rules"
    from ctxscore.messages import Message
    from ctxscore.scoring.learned import LearnedScorer
    from ctxscore.scoring.package import DEFAULT_MODEL_DIR

    scorer = LearnedScorer.from_pretrained(DEFAULT_MODEL_DIR)
    scorer.predict([Message(role="user", content="warm up the embedder", turn=0)])
    return scorer


def ingest(store: str, sessions: list[tuple[str, list[dict]]], scorer: Any) -> float:
    """Store every session through a ContextManager; returns the CPU seconds taken."""
    from ctxscore import ContextManager

    c0 = time.process_time()
    for sid, msgs in sessions:
        cm = ContextManager(budget=16000, scorer=scorer, store=store, session_id=sid)
        cm.sync(msgs)
        cm.close()
    return time.process_time() - c0


def sqlite_bytes(path: Path) -> int:
    """The SQLite file's size after a checkpoint and VACUUM (no WAL left beside it)."""
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("VACUUM")
    return path.stat().st_size


def postgres_bytes(pg: str, schema: str) -> int:
    """Total size of the schema's tables (indexes and TOAST included); the schema is dropped."""
    import psycopg

    from ctxscore.store.postgres import split_url

    with psycopg.connect(split_url(pg)[0], autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        size = conn.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind = 'r'",
            (schema,)).fetchone()[0]
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    return int(size)


def main() -> int:
    """Store the sessions in both stores and print the figures (JSON)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=12, help="sessions to store (default 12)")
    ap.add_argument("--scorer", choices=("rules", "learned"), default="rules")
    ap.add_argument("--pg", default=os.environ.get("CTXSCORE_PG_DSN"), help="PostgreSQL URL (default $CTXSCORE_PG_DSN)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    source, sessions = real_sessions(args.sessions)
    scorer = make_scorer(args.scorer)
    n, msgs = len(sessions), sum(len(m) for _, m in sessions)
    chars = sum(len(str(x.get("content") or "")) for _, m in sessions for x in m)
    out: dict[str, Any] = {"source": source, "scorer": args.scorer, "sessions": n,
                           "messages_per_session": round(msgs / n, 1), "content_chars_per_session": round(chars / n)}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "size.db"
        cpu = ingest(str(path), sessions, scorer)
        size = sqlite_bytes(path)
        out["sqlite"] = {"bytes_per_session": round(size / n), "bytes_per_message": round(size / msgs),
                         "ingest_cpu_s_per_session": round(cpu / n, 3)}
    if args.pg:
        schema = f"size_{uuid.uuid4().hex[:8]}"
        url = f"{args.pg}{'&' if '?' in args.pg else '?'}schema={schema}"
        cpu = ingest(url, sessions, scorer)
        size = postgres_bytes(args.pg, schema)
        out["postgres"] = {"bytes_per_session": round(size / n), "bytes_per_message": round(size / msgs),
                           "ingest_cpu_s_per_session": round(cpu / n, 3)}
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
