"""Command line: ``ctxscore compress | score | inspect | serve | profile | verify``.

Input files: JSONL with one OpenAI-style message per line (``role``, ``content``, optional ``id``,
``name``, ``tool_calls``, ``tool_call_id``), a JSON array of messages, or (``score``) the evaluation's
session JSONL with one ``{"session_id", "messages", ...}`` per line; ``-`` reads standard input (a pipe
is read once, whole). Errors go to stderr with exit status 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .config import Policy
from .errors import CtxScoreError, InputError
from .io import Conversation, read_sessions
from .scoring.rules import RuleConfig
from .window.manager import ContextManager

_BIG_BUDGET = 10_000_000


def _scorer_arg(value: str) -> Any:
    """``--model``: 'rules', 'auto' or a packaged scorer folder (loaded once)."""
    if value in ("rules", "auto"):
        return value
    from .scoring.learned import LearnedScorer  # noqa: PLC0415

    return LearnedScorer.from_pretrained(value)


def _manager(args: argparse.Namespace, scorer: Any, budget: int, session_id: str = "cli") -> ContextManager:
    policy = Policy(recent_turns=args.recent_turns) if getattr(args, "recent_turns", None) is not None else None
    return ContextManager(
        budget=budget, scorer=scorer, rules=args.rules, encoding=args.encoding, policy=policy, session_id=session_id
    )


def _single(sessions: list[Conversation], path: str) -> Conversation:
    if len(sessions) != 1:
        raise CtxScoreError(f"{path}: holds {len(sessions)} sessions; this command takes one conversation")
    return sessions[0]


def _check_out(out: str | None, source: str | None = None) -> Path | None:
    """The ``--out`` path, checked before any work: its folder exists, it is not itself a folder, and it
    is not the input file ``source`` (writing it would overwrite the conversation)."""
    if out is None:
        return None
    p = Path(out)
    if p.is_dir():
        raise InputError(f"--out {out}: is a folder; give a file path such as {p / 'window.json'}")
    if not p.parent.is_dir():
        raise InputError(f"--out {out}: the folder {p.parent} does not exist; create it first (mkdir -p {p.parent})")
    if source is not None and _same_file(source, p):
        raise InputError(f"--out {out}: is the input file {source}; writing the window there would overwrite the "
                         f"conversation; give another path such as {p.with_name(p.stem + '.window.json')}")
    return p


def _same_file(a: str, b: Path) -> bool:
    """Whether the paths ``a`` and ``b`` name one existing file (a link or another spelling included)."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):  # one of them does not exist (or is "-")
        return False


def cmd_compress(args: argparse.Namespace) -> int:
    out = _check_out(args.out, args.file)
    sess = _single(read_sessions(args.file), args.file)
    cm = _manager(args, _scorer_arg(args.model), args.budget)
    cm.extend(sess.messages)
    win = cm.build(query=args.query)
    for w in win.warnings:
        print(f"warning: {w}", file=sys.stderr)
    text = win.to_json(indent=2)
    if out is not None:
        out.write_text(text + "\n", encoding="utf-8")
        print(
            f"wrote {args.out}: {len(win.messages)} messages, {win.tokens} tokens of {win.budget} "
            f"({win.utilization:.0%}); full context {cm.total_tokens} tokens",
            file=sys.stderr,
        )
    else:
        print(text)
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    sessions = read_sessions(args.file)
    scorer = _scorer_arg(args.model)  # loaded once for all sessions
    out = sys.stdout
    for n, sess in enumerate(sessions):
        cm = _manager(args, scorer, _BIG_BUDGET, session_id=sess.session_id or f"s{n}")
        cm.extend(sess.messages)
        win = cm.build(query=args.query)
        preds = dict(zip((m.id for m in cm.messages), cm.predictions(), strict=True))
        for d in win.decisions:
            row: dict[str, Any] = {}
            if sess.session_id is not None:
                row["session_id"] = sess.session_id
                row["index"] = d.turn
            pred = preds[d.id]
            row.update(
                id=d.id, role=d.role, category=d.category,
                probs={k: round(v, 4) for k, v in pred.probs.items()},
                value=round(d.value, 4), source=pred.source,
                factors={k: round(v, 4) for k, v in d.factors.items()},
            )
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
        cm.close()
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    sess = _single(read_sessions(args.file), args.file)
    cm = _manager(args, _scorer_arg(args.model), args.budget)
    cm.extend(sess.messages)
    win = cm.build(query=args.query)
    print(
        f"budget {win.budget} tokens | window {win.tokens} tokens ({win.utilization:.0%}) | "
        f"full context {cm.total_tokens} tokens | {len(win.messages)} of {len(cm)} messages sent"
    )
    head = f"{'turn':>4}  {'id':<14} {'role':<9} {'category':<11} {'value':>5}  {'tier':<10} {'tokens':>13}  text"
    print(head)
    print("-" * len(head))
    for d, msg in zip(win.decisions, cm.messages, strict=True):
        flags = ("P" if d.pinned else " ") + ("↑" if d.paged_in else " ")
        snippet = " ".join(msg.text().split())[:60]
        print(
            f"{d.turn:>4}  {d.id[:14]:<14} {d.role:<9} {d.category:<11} {d.value:>5.2f}  {d.tier:<10} "
            f"{d.tokens_before:>6}->{d.tokens_after:<6}{flags} {snippet}"
        )
    print("P = pinned, ↑ = paged in for the query")
    for w in win.warnings:
        print(f"warning: {w}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """``ctxscore serve``: the OpenAI-compatible proxy (extra ``serve``; see :mod:`ctxscore.serve.app`)."""
    import gc  # noqa: PLC0415

    try:
        from .serve import create_app, run  # noqa: PLC0415
    except ImportError as exc:
        raise CtxScoreError(str(exc)) from None
    key = os.environ.get(args.upstream_key_env) if args.upstream_key_env else None
    if args.upstream_key_env and not key:
        raise CtxScoreError(f"--upstream-key-env {args.upstream_key_env}: the variable is not set")
    if args.query_writer and not args.llm_model:
        raise CtxScoreError("--query-writer needs --llm-model (the model that writes the queries)")
    comp = writer = None
    if args.llm_model:
        try:
            from .llm import LLMClient, LLMCompressor, LLMQueryWriter  # noqa: PLC0415
        except ImportError as exc:
            raise CtxScoreError(str(exc)) from None
        # on the upstream, the proxy's own upstream key unless the LLM has its own (a client's key is never used)
        llm_key = None if args.llm_base_url else os.environ.get("CTXSCORE_LLM_API_KEY") or key
        client = LLMClient(base_url=args.llm_base_url or args.upstream, model=args.llm_model, api_key=llm_key)
        comp = LLMCompressor(client, every=args.summary_every, timing=args.summary_timing)
        writer = LLMQueryWriter(client) if args.query_writer else None
    policy = Policy(recent_turns=args.recent_turns) if args.recent_turns is not None else None
    scorer = _scorer_arg(args.model)  # loaded once for every session
    rules = RuleConfig.load(args.rules) if args.rules else None

    # each session gets its own summary layer (a layer holds one session's state)
    options = {"rules": rules, "compressor": comp, "layers": (lambda: [comp.layer()]) if comp is not None else None}
    app = create_app(args.upstream, args.budget, scorer=scorer, store=args.store, redis=args.redis, policy=policy,
                     encoding=args.encoding, manager_options=options, upstream_api_key=key, timeout=args.timeout,
                     max_sessions=args.max_sessions, query_writer=writer,
                     in_order={"auto": None, "on": True, "off": False}[args.in_order])
    # What the process holds once warmed up (modules, the scorer and its models, tokenizers, the jieba
    # dictionary) lives as long as the server: moved out of the collector's generations, a full
    # collection no longer scans it (rules: 74,000 objects; the longest pause 50 -> 14 ms). See
    # https://docs.python.org/3/library/gc.html#gc.freeze
    gc.freeze()
    logging.getLogger("ctxscore").setLevel(logging.WARNING)
    print(f"ctxscore proxy on http://{args.host}:{args.port}/v1 -> {args.upstream} (budget {args.budget} tokens)",
          file=sys.stderr, flush=True)
    try:
        run(app, host=args.host, port=args.port, log_level=args.log_level)
    finally:
        if comp is not None:  # batches not sent yet are dropped; one in flight does not hold the exit
            comp.close(wait=False)
    return 0


def _profile_users(sessions: list[Conversation], user: str | None) -> dict[str, list[tuple[str, list[dict[str, Any]]]]]:
    """User -> (session id, messages): ``--user`` takes every conversation as a session of that user; else a
    plain message file is user ``default`` and each session of a session file is its own user."""
    out: dict[str, list[tuple[str, list[dict[str, Any]]]]] = {}
    for n, sess in enumerate(sessions):
        sid = sess.session_id or f"s{n}"
        out.setdefault(user or sess.extra.get("user") or sess.session_id or "default", []).append((sid, sess.messages))
    return out


def _print_profile(rep: Any) -> None:
    items = sorted(rep.layer.items.values(), key=lambda it: (it.status != "needs_clarification", it.profile_type, it.key))
    print(f"user {rep.user}: {len(rep.sessions)} session(s), {len(items)} item(s), {len(rep.layer.people)} person(s), "
          f"{len(rep.promotions)} promotion(s)")
    if items:
        print(f"  {'type/attribute':<24} {'value':<28} {'level':<12} {'status':<19} {'stab':>5}  "
              f"{'occ':>3} {'dur':>4} {'scn':>4} {'conf':>4}  evidence")
    for it in items:
        t = it.terms
        sign = "-" if it.polarity < 0 else ("+" if it.polarity > 0 else " ")
        tag = " compromise" if it.compromise else ""
        print(f"  {(it.profile_type + '/' + it.attribute)[:24]:<24} {sign}{it.value[:27]:<27} {it.time_level:<12} "
              f"{(it.status + tag)[:19]:<19} {it.stability:>5.2f}  {t.get('occurrences', 0):>3.1f} "
              f"{t.get('duration', 0):>4.2f} {t.get('cross_scene', 0):>4.2f} {t.get('confirmation', 0):>4.2f}  "
              f"{_evidence_ids(it.evidence, len(rep.sessions) > 1)}")
    for p in rep.layer.people.values():
        print(f"  person: {p.name or p.key} ({p.relation}): {' | '.join(p.notes[:2])[:100]}")
    for pr in rep.promotions:
        print(f"  promoted {pr['key']}: {pr['from']} -> {pr['to']} (stability {pr['stability']}, session {pr['session']})")


def _evidence_ids(evidence: list[Any], sessions: bool, most: int = 4) -> str:
    """``m0, m2`` or, over several sessions, ``alice-1:m0, alice-2:m2`` (the first ``most``, deduplicated)."""
    ids = list(dict.fromkeys(f"{e.session}:{e.message}" if sessions else e.message for e in evidence))
    return ", ".join(ids[:most]) + (f" (+{len(ids) - most})" if len(ids) > most else "")


def cmd_profile(args: argparse.Namespace) -> int:
    """``ctxscore profile``: the user profiles a file's sessions give, with stability scores and levels."""
    from .replay import replay_profile  # noqa: PLC0415

    users = _profile_users(read_sessions(args.file), args.user)
    scorer = _scorer_arg(args.model)
    reps = [replay_profile(u, ss, scorer=scorer, rules=args.rules, days_between=args.days_between)
            for u, ss in users.items()]
    if args.json:
        print(json.dumps([r.to_dict() for r in reps], ensure_ascii=False, indent=2))
        return 0
    for r in reps:
        _print_profile(r)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """``ctxscore verify``: replay a file and print the verifier's findings of each build, with message ids."""
    from .replay import replay_verify  # noqa: PLC0415

    sessions = read_sessions(args.file)
    scorer = _scorer_arg(args.model)
    policy = Policy(recent_turns=args.recent_turns) if args.recent_turns is not None else None
    for n, sess in enumerate(sessions):
        sid = sess.session_id or f"s{n}"
        builds, full, cm = replay_verify(sess.messages, args.budget, scorer=scorer, rules=args.rules,
                                         encoding=args.encoding, policy=policy, session_id=sid)
        if args.json:
            for b in builds:
                print(json.dumps({"session": sid, "build": b.build, "before": b.before, "tokens": b.tokens,
                                  "findings": [f.to_dict() for f in b.findings]}, ensure_ascii=False))
            print(json.dumps({"session": sid, "check": [f.to_dict() for f in full]}, ensure_ascii=False))
            continue
        _print_verify(sid, builds, full, len(cm), args.budget)
        cm.close()
    return 0


def _print_verify(sid: str, builds: list[Any], full: list[Any], n: int, budget: int) -> None:
    print(f"session {sid}: {n} messages, {len(builds)} builds at {budget} tokens")
    seen: set[tuple[str, str]] = set()
    for b in builds:
        new = [f for f in b.findings if f.key not in seen]
        seen |= {f.key for f in b.findings}
        if new:
            where = f"before {b.before}" if b.before else "at the end"
            print(f"build {b.build} ({where}, {b.tokens} tokens): {len(new)} new, {len(b.findings) - len(new)} still open")
            for f in new:
                print(f"  {f}")
    extra = [f for f in full if f.key not in seen]
    print(f"full check: {len(full)} finding(s), {len(extra)} not seen in a build" + (":" if extra else ""))
    for f in extra:
        print(f"  {f}")


def _int(s: str, what: str) -> int:
    """``s`` as an int, or the argparse error "expected <what>, got ..."."""
    try:
        return int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}") from None


def _positive_int(s: str) -> int:
    v = _int(s, "a whole number of tokens")
    if v <= 0:
        raise argparse.ArgumentTypeError(f"budget must be positive, got {v}")
    return v


def _count(s: str) -> int:
    v = _int(s, "a whole number")
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {v}")
    return v


def _non_negative_float(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {s!r}") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number 0 or more, got {s}")
    return v


def _positive_float(s: str) -> float:
    v = _non_negative_float(s)
    if v == 0:
        raise argparse.ArgumentTypeError(f"expected a number above 0, got {s}")
    return v


def _port(s: str) -> int:
    v = _int(s, "a port number")
    if not 1 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 1 to 65535, got {v}")
    return v


def build_parser() -> argparse.ArgumentParser:
    """The ``ctxscore`` argument parser."""
    p = argparse.ArgumentParser(prog="ctxscore", description="Scored, tiered context windows for long LLM-agent conversations.")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("file", help="JSONL (one message per line), JSON array of messages, or session JSONL; - for standard input")
        sp.add_argument("--model", default="auto", help="'auto' (packaged learned scorer if usable, else rules), 'rules', or a packaged scorer folder")
        sp.add_argument("--rules", default=None, help="rule file (TOML); default: the packaged one")
        sp.add_argument("--encoding", default="cl100k_base", choices=["cl100k_base", "o200k_base"])
        sp.add_argument("--query", default=None, help="current request: relevant archived messages are paged back in")
        sp.add_argument("--recent-turns", type=_count, default=None, help="last K turns kept verbatim (default 3; 0: only the newest message)")

    c = sub.add_parser("compress", help="write the assembled window as JSON")
    common(c)
    c.add_argument("--budget", type=_positive_int, required=True, help="token budget")
    c.add_argument("--out", default=None, help="output file (default: stdout)")
    c.set_defaults(func=cmd_compress)

    s = sub.add_parser("score", help="one JSON line per message: category, probabilities, value, factors")
    common(s)
    s.set_defaults(func=cmd_score)

    i = sub.add_parser("inspect", help="readable table of the decisions at a budget")
    common(i)
    i.add_argument("--budget", type=_positive_int, required=True, help="token budget")
    i.set_defaults(func=cmd_inspect)

    pr = sub.add_parser("profile", help="the user profile a file gives: items, stability scores, levels, people")
    pr.add_argument("file", help="JSONL (one message per line), JSON array of messages, or session JSONL; - for standard input")
    pr.add_argument("--user", default=None, help="every conversation of the file is a session of this user "
                    "(default: each session of a session file is its own user)")
    pr.add_argument("--json", action="store_true", help="print the profiles as JSON")
    pr.add_argument("--model", default="rules", help="scorer: 'rules' (default), 'auto' or a packaged scorer folder")
    pr.add_argument("--rules", default=None, help="rule file (TOML); default: the packaged one")
    pr.add_argument("--days-between", type=_non_negative_float, default=1.0,
                    help="days between a user's sessions on the replay clock (files carry no timestamps; default 1)")
    pr.set_defaults(func=cmd_profile)

    vf = sub.add_parser("verify", help="replay a file and print the context verifier's findings of each build")
    common(vf)
    vf.add_argument("--budget", type=_positive_int, required=True, help="token budget of each build")
    vf.add_argument("--json", action="store_true", help="one JSON line per build, then the full check")
    vf.set_defaults(func=cmd_verify)

    v = sub.add_parser("serve", help="OpenAI-compatible proxy: clients send their full history, the upstream gets the window")
    v.add_argument("--upstream", required=True, help="upstream API base including /v1, e.g. https://api.openai.com/v1")
    v.add_argument("--budget", type=_positive_int, required=True, help="token budget of each forwarded window")
    v.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    v.add_argument("--port", type=_port, default=8000, help="port to listen on (default 8000)")
    v.add_argument("--model", default="auto", help="scorer: 'auto', 'rules' or a packaged scorer folder")
    v.add_argument("--rules", default=None, help="rule file (TOML); default: the packaged one")
    v.add_argument("--encoding", default="cl100k_base", choices=["cl100k_base", "o200k_base"])
    v.add_argument("--recent-turns", type=_count, default=None, help="last K turns kept verbatim (default 3)")
    v.add_argument("--store", default=None,
                   help="SQLite file keeping every session (one process), or a postgresql:// URL or libpq "
                        "'host=... dbname=...' string (extra 'postgres'); default: in memory")
    v.add_argument("--redis", default=None,
                   help="Redis URL (extra 'redis') with a postgresql:// --store: sessions shared by every proxy "
                        "process started with the same two URLs (a per-session lock, no re-scoring)")
    v.add_argument("--upstream-key-env", default=None,
                   help="environment variable holding the upstream key (default: forward the client's Authorization)")
    v.add_argument("--timeout", type=_positive_float, default=600.0, help="seconds to wait for the upstream (default 600)")
    v.add_argument("--max-sessions", type=_positive_int, default=1000, help="sessions kept in memory (default 1000)")
    v.add_argument("--llm-model", default=None, help="summarise with this model (the LLM compressor; extra 'llm')")
    v.add_argument("--llm-base-url", default=None, help="endpoint of --llm-model (default: the upstream)")
    v.add_argument("--summary-every", type=_positive_int, default=3, help="turns between summary batches (default 3)")
    v.add_argument("--summary-timing", default="immediate", choices=["immediate", "deferred"],
                   help="batch at turn KxN (immediate) or when turn KxN+1 begins (deferred)")
    v.add_argument("--query-writer", action="store_true", help="let --llm-model write the page-in queries")
    v.add_argument("--in-order", default="auto", choices=["auto", "on", "off"],
                   help="run the sessions' work one request at a time, in arrival order (on), or many at once (off); "
                        "auto (default): in order when it is all local CPU work (no --redis, --llm-model or "
                        "postgresql:// --store)")
    v.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    v.set_defaults(func=cmd_serve)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ctxscore`` command; returns the exit status: 2 for a ctxscore error (bad input,
    a JSON input nested too deeply included: the reader names it) or a failed write, with the message;
    any other exception (a bug, a ``RecursionError`` after reading) is raised, not reported as bad input."""
    args = build_parser().parse_args(argv)
    logging.getLogger("ctxscore").setLevel(logging.ERROR)  # window warnings are printed by the commands
    try:
        return args.func(args)
    except CtxScoreError as exc:
        print(f"ctxscore: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # pragma: no cover - e.g. piped into head
        return 0
    except OSError as exc:  # writing the output (a full disk, a vanished folder)
        print(f"ctxscore: error: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
