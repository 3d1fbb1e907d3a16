"""Command line: ``python -m training.data build | info | locomo``.

- ``build``: build ``data/processed`` (idempotent; ``--force`` rebuilds). Counts take the form
  ``source=N,source=N`` and override the defaults for the sources named.
- ``info``: print the manifest summary and the weak-label accuracy table.
- ``locomo PATH``: convert a LoCoMo JSON file to evaluation-session JSONL.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from ..paths import CorporaMissingError
from .build import BuildConfig, build, load_manifest
from .labels import accuracy_table_markdown
from .locomo import LocomoFormatError, load_locomo


def _counts(text: str | None, base: dict[str, int]) -> dict[str, int]:
    out = dict(base)
    if not text:
        return out
    for part in text.split(","):
        name, _, num = part.partition("=")
        if not num.strip().isdigit():
            raise argparse.ArgumentTypeError(f"expected source=N pairs separated by commas, got {part!r}")
        out[name.strip()] = int(num)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m training.data", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build data/processed from the corpora and the bundled set")
    b.add_argument("--corpora", help="corpora folder (default $CTXSCORE_CORPORA or ../shared/datasets)")
    b.add_argument("--bundled", help="bundled set JSONL (default data/bundled/sessions.jsonl)")
    b.add_argument("--out", help="output folder (default data/processed)")
    b.add_argument("--force", action="store_true", help="rebuild even if the manifest says it is current")
    b.add_argument("--require-corpora", action="store_true", help="fail instead of building from the bundled set alone")
    b.add_argument("--bundled-only", action="store_true", help="build from the bundled set alone (ignore the corpora)")
    b.add_argument("--sources", help="corpus sources to load, comma-separated (default: all)")
    b.add_argument("--weak-caps", help="weak-only sessions per source, e.g. sgd=300,swe_mini=20")
    b.add_argument("--eval-counts", help="evaluation sessions per source in eval_sessions.jsonl, e.g. sgd=8")
    b.add_argument("--dev-counts", help="evaluation sessions per source in dev_sessions.jsonl")
    b.add_argument("--train-counts", help="long train-split sessions per source in train_sessions.jsonl")
    b.add_argument("--seed", type=int, default=0, help="chaining seed (default 0)")
    b.add_argument("--no-progress", action="store_true", help="no progress bars")
    i = sub.add_parser("info", help="print the manifest summary and the weak-label accuracy table")
    i.add_argument("--out", help="build folder (default data/processed)")
    lo = sub.add_parser("locomo", help="convert a LoCoMo JSON file to evaluation-session JSONL")
    lo.add_argument("path")
    lo.add_argument("--output", help="output JSONL (default: stdout)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    if args.cmd == "build":
        base = BuildConfig()
        try:
            cfg = BuildConfig(
                weak_caps=_counts(args.weak_caps, base.weak_caps),
                eval_counts=_counts(args.eval_counts, base.eval_counts),
                dev_counts=_counts(args.dev_counts, base.dev_counts),
                train_counts=_counts(args.train_counts, base.train_counts),
                seed=args.seed,
                sources=tuple(x.strip() for x in args.sources.split(",")) if args.sources else None,
            )
        except (argparse.ArgumentTypeError, ValueError) as exc:
            p.error(str(exc))
        try:
            m = build(args.corpora, args.out, args.bundled, config=cfg, force=args.force,
                      require_corpora=args.require_corpora, use_corpora=not args.bundled_only,
                      progress=not args.no_progress)
        except (CorporaMissingError, FileNotFoundError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(json.dumps({"skipped": m.get("skipped", False), "mode": m["mode"], "rows": m["counts"]["split"],
                          "build_seconds": m.get("build_seconds"), "peak_rss_mb": m.get("peak_rss_mb")}))
        return 0
    if args.cmd == "info":
        try:
            m = load_manifest(args.out)
        except FileNotFoundError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(json.dumps({k: m[k] for k in ("mode", "sources", "counts", "eval_files", "known_gaps",
                                            "dataset_fingerprint", "build_seconds", "peak_rss_mb")}, indent=2,
                         ensure_ascii=False))
        print(accuracy_table_markdown(m["weak_label_accuracy"]) if m.get("weak_label_accuracy") else "(no gold labels)")
        return 0
    if args.output and Path(args.output).exists() and Path(args.path).exists() \
            and Path(args.output).samefile(args.path):
        print(f"error: --output {args.output} is the LoCoMo file being converted; writing there would overwrite it; "
              f"give another path such as {Path(args.output).with_suffix('.sessions.jsonl')}", file=sys.stderr)
        return 2
    try:
        sessions = load_locomo(Path(args.path))
    except (FileNotFoundError, LocomoFormatError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    fh = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout  # noqa: SIM115
    try:
        for s in sessions:
            fh.write(json.dumps(s, ensure_ascii=False) + "\n")
    finally:
        if fh is not sys.stdout:
            fh.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
