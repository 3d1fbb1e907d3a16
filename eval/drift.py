"""The drift cases: sessions with the verifier findings they must produce (and clean sessions that must
produce none), in English and Chinese; their precision and recall.

Case files (``data/drift/cases_en.json``, ``cases_zh.json``) hold a JSON array of cases::

    {"case_id": "en-goal-drift-destination", "language": "en", "description": "...", "budget": 4000,
     "profile": false,                      # run a ProfileLayer too (conflicting profile items)
     "tamper": [{"replace": [old, new]}],   # a faulty summariser: text of the window rewritten
     "messages": [...],                     # OpenAI-style messages; ids are m0, m1 ... by position
     "expected": [{"kind": "goal_drift", "id": "m3"}]}

:func:`run_case` replays a case message by message with the rule scorer, the fact ledger and the
verifier (a build before every assistant message and at the end, then the verifier's full pass);
a ``tamper`` rewrites the window in a post-build hook, before the verifier reads it (what an LLM
summary that lost a negation or a sentence would show). A finding counts once per
``(kind, offending message)``; it is a true positive when the case expects that pair.

    python -m eval.drift [--cases data/drift] [--out out/drift/report.md] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxscore import ContextManager
from ctxscore.memory.ledger import FactLedger
from ctxscore.memory.profile import ProfileLayer
from ctxscore.verify import ContextVerifier, Finding

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CASES = REPO / "data" / "drift"


@dataclass
class CaseResult:
    """One case's outcome: the expected ``(kind, id)`` pairs, the findings and their matching."""

    case_id: str
    language: str
    expected: set[tuple[str, str]]
    findings: list[Finding] = field(default_factory=list)

    @property
    def found(self) -> set[tuple[str, str]]:
        """``(kind, offending id)`` of every finding."""
        return {f.key for f in self.findings}

    @property
    def tp(self) -> set[tuple[str, str]]:
        """Findings the case expects."""
        return self.found & self.expected

    @property
    def fp(self) -> set[tuple[str, str]]:
        """Findings the case does not expect."""
        return self.found - self.expected

    @property
    def fn(self) -> set[tuple[str, str]]:
        """Expected findings that did not come."""
        return self.expected - self.found


def load_cases(folder: str | Path = DEFAULT_CASES) -> list[dict[str, Any]]:
    """Every case of ``folder/cases_*.json``, in file order.

    Raises:
        ValueError: a file that is not a JSON array of cases with messages and expected findings.
    """
    out = []
    for path in sorted(Path(folder).glob("cases_*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a JSON array of cases")
        for c in data:
            if not {"case_id", "messages", "expected"} <= set(c):
                raise ValueError(f"{path}: case {c.get('case_id')!r} needs case_id, messages and expected")
            out.append(c)
    return out


def _tamper_hook(rules: Sequence[dict[str, Any]]) -> Any:
    def hook(window: Any, view: Any) -> None:
        for m in window.messages:
            if isinstance(m.get("content"), str):
                for r in rules:
                    old, new = r["replace"]
                    m["content"] = m["content"].replace(old, new)
    return hook


def run_case(case: dict[str, Any], scorer: Any = "rules") -> CaseResult:
    """Replay one case (module docstring) and collect its findings."""
    ledger = FactLedger()
    profile = ProfileLayer(f"drift:{case['case_id']}", clock=lambda: 1.7e9) if case.get("profile") else None
    verifier = ContextVerifier(ledger=ledger, profile=profile)
    layers: list[Any] = [ledger, *([profile] if profile else []), verifier]
    hooks = [_tamper_hook(case["tamper"])] if case.get("tamper") else []
    cm = ContextManager(budget=int(case.get("budget", 4000)), scorer=scorer, layers=layers, hooks=hooks,
                        session_id=case["case_id"])
    seen: dict[tuple[str, str], Finding] = {}
    for m in case["messages"]:
        if m["role"] == "assistant":
            for f in cm.build().findings:
                seen.setdefault(f.key, f)
        cm.add(m)
    for f in [*cm.build().findings, *verifier.check(cm)]:
        seen.setdefault(f.key, f)
    cm.close()
    expected = {(e["kind"], e["id"]) for e in case["expected"]}
    return CaseResult(case["case_id"], case.get("language", "?"), expected, list(seen.values()))


def score(results: Sequence[CaseResult]) -> dict[str, Any]:
    """Precision and recall overall, per language and per kind, and the clean cases with findings."""
    def pr(rs: Sequence[CaseResult], kind: str | None = None) -> dict[str, Any]:
        def sel(s: set[tuple[str, str]]) -> set[tuple[str, str]]:
            return {x for x in s if kind is None or x[0] == kind}

        tp = sum(len(sel(r.tp)) for r in rs)
        fp = sum(len(sel(r.fp)) for r in rs)
        fn = sum(len(sel(r.fn)) for r in rs)
        return {"tp": tp, "fp": fp, "fn": fn, "precision": tp / (tp + fp) if tp + fp else 1.0,
                "recall": tp / (tp + fn) if tp + fn else 1.0}
    kinds = sorted({k for r in results for k, _ in r.expected | r.found})
    langs = sorted({r.language for r in results})
    return {
        "cases": len(results), "clean_cases": sum(1 for r in results if not r.expected),
        "clean_with_findings": [r.case_id for r in results if not r.expected and r.findings],
        "overall": pr(results), "languages": {lang: pr([r for r in results if r.language == lang]) for lang in langs},
        "kinds": {k: pr(results, k) for k in kinds},
    }


def report(results: Sequence[CaseResult], figures: dict[str, Any]) -> str:
    """The markdown report: the summary tables, then every case with its findings."""
    lines = ["# Verifier findings on the drift cases", "",
             f"{figures['cases']} cases ({figures['clean_cases']} clean); a finding counts once per (kind, message).", "",
             "| set | TP | FP | FN | precision | recall |", "|---|---|---|---|---|---|"]
    rows = [("all", figures["overall"]), *((f"language {k}", v) for k, v in figures["languages"].items()),
            *((f"kind {k}", v) for k, v in figures["kinds"].items())]
    lines += [f"| {n} | {v['tp']} | {v['fp']} | {v['fn']} | {v['precision']:.3f} | {v['recall']:.3f} |" for n, v in rows]
    lines += ["", "## Cases", ""]
    for r in results:
        mark = "ok" if not r.fp and not r.fn else f"FP {sorted(r.fp)} FN {sorted(r.fn)}"
        lines.append(f"- `{r.case_id}`: expected {sorted(r.expected) or 'none'}; {mark}")
        lines += [f"  - {f}" for f in r.findings]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m eval.drift``: run the cases, print the summary, write the report."""
    p = argparse.ArgumentParser(prog="python -m eval.drift", description=__doc__.split("\n")[0])
    p.add_argument("--cases", default=str(DEFAULT_CASES), help="folder of cases_*.json (default data/drift)")
    p.add_argument("--out", default=str(REPO / "out" / "drift" / "report.md"), help="markdown report to write")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args(argv)
    results = [run_case(c) for c in load_cases(args.cases)]
    figures = score(results)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report(results, figures), encoding="utf-8")
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        counts = Counter(r.language for r in results)
        o = figures["overall"]
        print(f"{len(results)} cases ({dict(counts)}): precision {o['precision']:.3f}, recall {o['recall']:.3f}; "
              f"clean cases with findings: {figures['clean_with_findings'] or 'none'}; report: {out}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
