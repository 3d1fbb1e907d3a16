"""mini-SWE-agent trajectories on SWE-bench Verified (gruckion/mini-swe-agent, MIT).

Files: ``swe_mini/trajs/{instance_id}.traj.json.gz`` (``{instance_id, info: {exit_status,
submission}, messages}``), streamed with :mod:`gzip`. Message ids:
``swe_mini/{instance_id}#{index in messages}`` (system 0, task 1, later ``user`` messages are tool
observations ``<returncode>N</returncode><output>...``; the last one is the submitted patch).

Weak labels come from the return codes, the format-error / timeout templates, the test output,
THOUGHT text and whether a command edits a file of the final patch; key facts from the task
statement and the files and functions of the final patch (``info.submission``).
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..facts import find_value, make_fact
from ..schema import CorpusSession, make_message, make_session, spans_in_text
from ..weak import WeakLabel

SOURCE = "swe_mini"
LANGUAGE = "en"
RETURNCODE = re.compile(r"^\s*<returncode>(-?\d+)</returncode>")
TESTS_PASSED = re.compile(r"\b\d+ passed\b|^OK\b|\bRan \d+ tests?\b.*\n+OK|Successfully|\ball tests? passed\b",
                          re.I | re.M)
PY_ERROR = re.compile(r"Traceback \(most recent call last\)|^\w*(?:Error|Exception):", re.M)
BASH_BLOCK = re.compile(r"```(?:bash|sh)?\n(.*?)```", re.S)
EDIT_CMD = re.compile(r"sed -i|cat\s*<<|cat\s*>|>\s*\S+\.py|python3? - <<|\bpatch\b|\bapply\b|\.write\(|tee ")
DIFF_FILE = re.compile(r"^diff --git a/(\S+) b/(\S+)", re.M)
HUNK = re.compile(r"^@@ [^@]* @@ ?(.*)$", re.M)
DEF_NAME = re.compile(r"\b(?:def|class)\s+([A-Za-z_]\w*)")
ADDED_DEF = re.compile(r"^\+\s*(?:async\s+)?(?:def|class)\s+([A-Za-z_]\w*)", re.M)


def input_files(root: Path) -> list[Path]:
    """The trajectory files present, sorted by name."""
    return sorted((root / "swe_mini" / "trajs").glob("*.traj.json.gz"))


def patch_files(patch: str) -> list[str]:
    """Paths changed by a unified git diff, in order (``b/`` side)."""
    out: list[str] = []
    for _, b in DIFF_FILE.findall(patch or ""):
        if b not in out:
            out.append(b)
    return out


def patch_functions(patch: str) -> list[tuple[str, str]]:
    """``(file, function or class name)`` pairs a diff changes: names in hunk headers and added
    ``def`` / ``class`` lines, in order, without repeats."""
    out: list[tuple[str, str]] = []
    for block in re.split(r"(?=^diff --git )", patch or "", flags=re.M):
        files = patch_files(block)
        if not files:
            continue
        names = [m for h in HUNK.findall(block) for m in DEF_NAME.findall(h)] + ADDED_DEF.findall(block)
        for n in names:
            if (files[0], n) not in out:
                out.append((files[0], n))
    return out


def task_title(task_message: str) -> str | None:
    """First non-empty line of the PR description in the task message (at most 150 characters,
    cut at a word boundary), or ``None``."""
    m = re.search(r"Consider the following PR description:\s*\n(.*?)(?:</pr_description>|$)", task_message, re.S)
    body = m.group(1) if m else task_message
    for line in body.splitlines():
        line = line.strip()
        if len(line) >= 8 and not line.startswith("<!--"):
            if len(line) > 150:
                line = line[:150].rsplit(" ", 1)[0]
            return line
    return None


def _command(content: str) -> str:
    m = BASH_BLOCK.search(content)
    return m.group(1) if m else ""


def weak_label(i: int, messages: list[dict[str, Any]], files: list[str]) -> WeakLabel:
    """Weak label of ``messages[i]``; first match wins.

    system -> instruction 3; task (index 1) -> instruction 3; the final submitted patch ->
    key_state 3; format-error template -> failure 0; timeout template -> failure 1; observation
    with non-zero return code -> failure 1; with a Python traceback -> failure 1; with passing
    tests / "Successfully" -> key_state 2; empty or "too long" output -> reasoning 0; other
    output -> reasoning 1. assistant: submit command -> key_state 2; a command that edits a file
    of the final patch -> key_state 2; else (THOUGHT + exploration) -> reasoning 1.
    """
    m = messages[i]
    content = m.get("content") or ""
    role = m["role"]
    if role == "system":
        return WeakLabel("instruction", 3, 0.95, "swe:system")
    if i == 1:
        return WeakLabel("instruction", 3, 0.95, "swe:task")
    if role == "user":
        if i == len(messages) - 1 and content.startswith("diff --git"):
            return WeakLabel("key_state", 3, 0.9, "swe:final_patch")
        if content.startswith("Please always provide EXACTLY ONE action"):
            return WeakLabel("failure", 0, 0.95, "swe:format_error")
        if content.startswith("The last command") and "timed out" in content[:400]:
            return WeakLabel("failure", 1, 0.85, "swe:timeout")
        rc = RETURNCODE.match(content)
        if rc and rc.group(1) != "0":
            return WeakLabel("failure", 1, 0.75, "swe:returncode_nonzero")
        body = content[rc.end():] if rc else content
        if PY_ERROR.search(body[:900]) or PY_ERROR.search(body[-900:]):
            return WeakLabel("failure", 1, 0.4, "swe:traceback")
        if TESTS_PASSED.search(body[:900]) or TESTS_PASSED.search(body[-900:]):
            return WeakLabel("key_state", 2, 0.6, "swe:tests_passed")
        if re.fullmatch(r"\s*<output>\s*</output>\s*", body) or "<warning>\nThe output of your last command was too long" in body:
            return WeakLabel("reasoning", 0, 0.6, "swe:empty_or_long_output")
        return WeakLabel("reasoning", 1, 0.55, "swe:observation")
    cmd = _command(content)
    if "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in cmd:
        return WeakLabel("key_state", 2, 0.8, "swe:submit")
    if EDIT_CMD.search(cmd) and any(f in cmd for f in files):
        return WeakLabel("key_state", 2, 0.45, "swe:edit_patch_file")
    return WeakLabel("reasoning", 1, 0.8, "swe:thought")


def key_facts(session_id: str, instance_id: str, patch: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Key facts of one trajectory, each sourced at the earliest message (before the final patch
    message) whose content contains it; facts only found in the final message are dropped.

    - ``task``: the PR title (:func:`task_title`) in the task message.
    - ``patch_file``: each file of the final patch.
    - ``patch_function``: up to 4 functions / classes the final patch changes (whole words).
    """
    facts: list[dict[str, Any]] = []
    last = len(messages) - 1
    title = task_title(messages[1]["content"]) if len(messages) > 1 else None
    repo = instance_id.split("__")[0]
    if title and title in messages[1]["content"]:
        facts.append(make_fact(f"{session_id}:task", title, 1, f"What issue in {repo} is the agent asked to fix?", "task"))
    short = (title or instance_id)[:60]
    for path in patch_files(patch):
        hit = find_value(messages, path, start=1, stop=last, ignore_case=False)
        if hit:
            facts.append(make_fact(f"{session_id}:file:{path}", hit[1], hit[0],
                                   f"Which file was changed to fix \"{short}\"?", "patch_file"))
    n = 0
    for path, name in patch_functions(patch):
        if n >= 4 or len(name) < 3:
            continue
        hit = find_value(messages, name, start=1, stop=last, ignore_case=False)
        if hit and not any(f["value"] == name for f in facts):
            facts.append(make_fact(f"{session_id}:func:{path}:{name}", hit[1], hit[0],
                                   f"Which function or class in {path} does the fix change?", "patch_function"))
            n += 1
    return facts


def session_from_traj(data: dict[str, Any]) -> CorpusSession:
    """One trajectory as a session record with weak labels and key facts."""
    iid = data["instance_id"]
    sid = f"{SOURCE}/{iid}"
    raw = data["messages"]
    patch = (data.get("info") or {}).get("submission") or ""
    files = patch_files(patch)
    span_cands = files + [n for _, n in patch_functions(patch)]
    messages = []
    for i, r in enumerate(raw):
        content = r.get("content")
        if isinstance(content, list):  # content parts: keep the text parts
            content = "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
        m = make_message(sid, i, r["role"], content)
        wl = weak_label(i, raw, files)
        m["weak"] = wl.with_spans(spans_in_text(m["text"], span_cands) if i > 1 else []).to_dict()
        messages.append(m)
    return make_session(sid, SOURCE, sid, LANGUAGE, "test", messages,
                        key_facts=key_facts(sid, iid, patch, messages),
                        meta={"exit_status": (data.get("info") or {}).get("exit_status"), "patch_files": files})


def iter_sessions(root: Path) -> Iterator[CorpusSession]:
    """Every trajectory, in file-name order."""
    for path in input_files(root):
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            data = json.load(fh)
        data.setdefault("instance_id", path.name.removesuffix(".traj.json.gz"))
        yield session_from_traj(data)
