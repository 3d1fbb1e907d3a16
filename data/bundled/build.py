"""Build the bundled project-written labelled set: ``data/bundled/sessions.jsonl``.

Standard library only and deterministic: ``python data/bundled/build.py`` rewrites the file
byte-identically; ``--out PATH`` writes elsewhere (the tests use it to check reproducibility).

Every session comes from a hand-written scenario template (``scenarios_en.py``, ``scenarios_zh.py``)
filled with slots drawn from a generator seeded by the session slug, so adding a template does not
change the other sessions. The format and the labelling conventions are described in
``data/README.md`` ("Bundled project-written set").
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import zlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # imported from elsewhere (python -m, tests): find the sibling modules
    sys.path.insert(0, str(HERE))

import scenarios_en  # noqa: E402
import scenarios_zh  # noqa: E402
from builder import Session  # noqa: E402

DEFAULT_OUT = HERE / "sessions.jsonl"
VARIANTS = 4  # sessions per (scenario family, language)

#: (scenario family, language, template). Each template is called with variants 0..VARIANTS-1.
TEMPLATES: list[tuple[str, str, Callable[[Session, random.Random, int], None]]] = [
    ("travel_booking", "en", scenarios_en.travel),
    ("ecommerce_support", "en", scenarios_en.ecommerce),
    ("coding_agent", "en", scenarios_en.coding),
    ("data_analysis", "en", scenarios_en.analysis),
    ("it_ops", "en", scenarios_en.itops),
    ("restaurant_scheduling", "en", scenarios_en.restaurant),
    ("travel_booking", "zh", scenarios_zh.travel),
    ("ecommerce_support", "zh", scenarios_zh.ecommerce),
    ("coding_agent", "zh", scenarios_zh.coding),
    ("data_analysis", "zh", scenarios_zh.analysis),
    ("it_ops", "zh", scenarios_zh.itops),
    ("restaurant_scheduling", "zh", scenarios_zh.restaurant),
]


def build_sessions() -> list[dict]:
    """All sessions, in a fixed order (family, language, variant)."""
    sessions = []
    for family, lang, template in TEMPLATES:
        for v in range(VARIANTS):
            slug = f"{family.replace('_', '-')}-{lang}-{v + 1:02d}"
            rng = random.Random(zlib.crc32(slug.encode("utf-8")))
            s = Session(slug, lang, family, rng)
            template(s, rng, v)
            sessions.append(s.finish())
    return sessions


def write(sessions: list[dict], out: Path) -> None:
    """Write one JSON object per line (UTF-8, non-ASCII kept, ``\\n`` line ends)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8", newline="\n") as fh:
        for sess in sessions:
            fh.write(json.dumps(sess, ensure_ascii=False) + "\n")


def summary(sessions: list[dict]) -> str:
    """Counts per language, category and importance, for the data card."""
    n_msg = sum(len(s["messages"]) for s in sessions)
    by_lang = Counter(s["language"] for s in sessions)
    cat = Counter((s["language"], m["label"]["category"]) for s in sessions for m in s["messages"])
    imp = Counter((m["label"]["category"], m["label"]["importance"]) for s in sessions for m in s["messages"])
    facts = sum(len(s["key_facts"]) for s in sessions)
    sup = sum(1 for s in sessions for f in s["key_facts"] if "superseded" in f)
    lines = [f"sessions {len(sessions)} ({dict(by_lang)}), messages {n_msg}, key facts {facts} ({sup} superseded)"]
    for lang in sorted(by_lang):
        msgs = sum(len(s["messages"]) for s in sessions if s["language"] == lang)
        lines.append(f"  {lang}: {msgs} messages; " + ", ".join(
            f"{c} {cat[(lang, c)]}" for c in ("instruction", "key_state", "reasoning", "failure")))
    for c in ("instruction", "key_state", "reasoning", "failure"):
        lines.append(f"  {c}: " + ", ".join(f"imp{i} {imp[(c, i)]}" for i in range(4)))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output JSONL (default {DEFAULT_OUT})")
    ap.add_argument("--summary", action="store_true", help="print counts per language/category/importance")
    args = ap.parse_args(argv)
    sessions = build_sessions()
    write(sessions, args.out)
    if args.summary:
        print(summary(sessions))
    print(f"wrote {len(sessions)} sessions to {args.out} ({args.out.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
