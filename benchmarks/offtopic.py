"""Benchmark of page-in precision: what comes back for a question about something else.

A proxy or an agent loop builds every window with the last user message as the query, and users ask
about things the session never mentioned ("How do I bake sourdough bread?" in a restaurant-booking
chat). Nothing should be paged in for them; a question about the session should still bring its
answer back. This script replays each session whole, builds its window at a quarter of the full
context (fixed), then asks:

- each off-topic question of a fixed list (English or Chinese, by the session's language; written
  for this script, none of them used to choose ``Policy.page_in_query_floor``) and counts the
  messages paged in (``ContextWindow.paged_in``);
- up to ``--probes`` of the session's probe questions whose value the window without a query lacks,
  and counts those whose value the window with the query shows (the evaluation's recall with
  page-in at the session's end, on a sample).

It does so for the rules and the learned scorer, with the default policy and, as the baseline of
the same run, with the query-level floor off (``Policy(page_in_query_floor=-1)``, the behaviour
before it).

Usage: ``python benchmarks/offtopic.py [--sessions data/processed/eval_sessions.jsonl]
[--max-sessions N] [--probes 20] [--scorers rules,learned] [--candidate FOLDER]`` (the processed sessions come from
``python -m training.data build``).
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: import the checkout's packages

from ctxscore import ContextManager, Policy  # noqa: E402
from ctxscore.tokens import TokenCounter  # noqa: E402
from eval.sessions import load_sessions_file  # noqa: E402
from eval.textnorm import normalize, present, window_text  # noqa: E402

OFF_TOPIC_EN = [
    "What is the tallest mountain in Africa?", "How do I make a cold brew coffee at home?",
    "Write a short poem about the sea.", "What is 48 divided by 6?", "Who wrote Pride and Prejudice?",
    "How does photosynthesis work?", "What is the speed of light in a vacuum?",
    "How do I sort a dictionary by value in Python?", "Which planet has the most moons?",
    "What causes the northern lights?", "Give me three tips for a job interview.",
    "How many bones are in the human body?", "What is the difference between a virus and a bacterium?",
    "Explain what inflation means in economics.", "What's a good name for a golden retriever puppy?",
    "How do I remove a red wine stain from a carpet?", "What language is spoken in Brazil?",
    "Summarize the theory of evolution in two sentences.", "How long should I boil an egg?",
    "What is the chemical symbol for gold?",
]
OFF_TOPIC_ZH = [
    "非洲最高的山是哪座？", "怎么在家做冷萃咖啡？", "写一首关于大海的短诗。", "48除以6等于几？", "《傲慢与偏见》的作者是谁？",
    "光合作用是怎么回事？", "哪颗行星的卫星最多？", "极光是怎么形成的？", "给我三条面试的建议。", "人体有多少块骨头？",
]


def run(session, scorer: str, policy: Policy, counter: TokenCounter, probes: int, seed: int) -> dict[str, float]:
    """Replay ``session`` into a manager, then ask the off-topic questions and a sample of probes at
    the end, at a quarter of the full context (tokens)."""
    budget = max(256, counter.count_messages(session.messages) // 4)
    cm = ContextManager(budget=budget, scorer=scorer, policy=policy)
    for m in session.messages:
        cm.add(m)
    plain = cm.build()
    shown = normalize(window_text(plain.messages))
    off = OFF_TOPIC_ZH if any("\u4e00" <= c <= "\u9fff" for m in session.messages[:20] for c in str(m.get("content"))) else OFF_TOPIC_EN
    paged = [len(cm.build(query=q).paged_in) for q in off]
    missed = [f for f in session.key_facts if not present(f.value, shown)]
    sample = random.Random(f"{seed}:{session.session_id}").sample(missed, min(probes, len(missed)))
    found = sum(present(f.value, normalize(window_text(cm.build(query=f.probe).messages))) for f in sample)
    cm.close()
    return {"questions": len(off), "paged": sum(paged), "any": sum(p > 0 for p in paged),
            "probes": len(sample), "found": found}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", default="data/processed/eval_sessions.jsonl")
    ap.add_argument("--max-sessions", type=int, default=None)
    ap.add_argument("--probes", type=int, default=20, help="probe questions asked per session (default 20)")
    ap.add_argument("--scorers", default="rules,learned", help="comma-separated: rules, learned (the packaged scorer)")
    ap.add_argument("--candidate", default=None, metavar="FOLDER",
                    help="also run a packaged scorer folder (a trained candidate, e.g. out/scorer) as 'candidate'")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    logging.disable(logging.WARNING)  # pinned-overflow warnings of chained sessions are expected here
    sessions = load_sessions_file(args.sessions)[: args.max_sessions]
    counter = TokenCounter()
    variants = {"query floor on (default)": Policy(), "query floor off (before)": Policy(page_in_query_floor=-1.0)}
    print(f"{len(sessions)} sessions from {args.sessions}; budget a quarter of each session's full context")
    print(f"{'scorer':<8} {'policy':<26} {'off-topic questions':>19} {'messages paged in each':>23} "
          f"{'with any page-in':>17} {'probes':>7} {'answer shown':>13} {'s':>6}")
    scorers = {name.strip(): {"rules": "rules", "learned": "auto"}[name.strip()] for name in args.scorers.split(",")}
    if args.candidate:
        scorers["candidate"] = args.candidate
    for name, scorer in scorers.items():
        for label, policy in variants.items():
            t0 = time.perf_counter()
            tot: dict[str, float] = {}
            for s in sessions:
                for k, v in run(s, scorer, policy, counter, args.probes, args.seed).items():
                    tot[k] = tot.get(k, 0) + v
            print(f"{name:<8} {label:<26} {int(tot['questions']):>19} {tot['paged'] / tot['questions']:>23.2f} "
                  f"{tot['any'] / tot['questions']:>17.3f} {int(tot['probes']):>7} "
                  f"{tot['found'] / max(1, tot['probes']):>13.3f} {time.perf_counter() - t0:>6.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
