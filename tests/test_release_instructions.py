"""A budget too tight for every instruction of the active task: the older ones become goal records."""

from __future__ import annotations

from ctxscore import ContextManager
from ctxscore.scoring.base import Prediction
from ctxscore.tokens import REPLY_PRIMING_TOKENS
from ctxscore.window.result import WarningKind


def _requests(n: int = 6) -> list[dict]:
    msgs = [{"role": "system", "content": "You are a travel agent."}]
    for i in range(n):
        msgs += [
            {"role": "user", "content": f"Please book hotel number {i} in Paris for the conference. It must cost at most "
                                        f"{100 + i} euros a night. I would love a room with a desk, good wifi, a quiet view "
                                        "over the garden, a comfortable chair and a kettle, since I will be working late "
                                        "most evenings and like to have tea while I read."},
            {"role": "assistant", "content": f"Noted hotel {i}."},
        ]
    return msgs


def test_older_instructions_are_summarised_with_their_constraints_when_pins_do_not_fit():
    msgs = _requests()
    roomy = ContextManager(scorer="rules", budget=100_000)
    roomy.extend(msgs)
    assert roomy.history.pinned_tokens + REPLY_PRIMING_TOKENS > 250  # every request pinned: more than 250 tokens
    cm = ContextManager(scorer="rules", budget=250)
    cm.extend(msgs)
    win = cm.build()
    assert not any(w.kind == WarningKind.PINNED_OVER_BUDGET for w in win.warnings)
    assert cm.history.pinned_tokens + REPLY_PRIMING_TOKENS <= 250
    d = {x.turn: x for x in win.decisions}
    assert d[11].pinned and d[11].tier == "verbatim"  # the newest request stays pinned
    assert not d[1].pinned and d[1].tier == "structured"  # the oldest is a goal record ...
    text = "\n".join(m["content"] for m in win.messages)
    for i in range(6):  # ... whose hard constraint stays byte-exact
        assert f"It must cost at most {100 + i} euros a night." in text
    assert "kettle" not in text.split("hotel number 1 ")[0]  # the prose of the oldest is gone


def test_nothing_is_released_when_the_pins_fit():
    cm = ContextManager(scorer="rules", budget=100_000)
    cm.extend(_requests())
    cm.build()
    assert all(e.pinned for e in cm.history.entries if e.msg.role == "user")
    assert cm.history.release_instructions(10**9) == []


def test_the_newest_instruction_is_never_released():
    cm = ContextManager(scorer="rules", budget=100_000)
    cm.extend(_requests(3))
    released = cm.history.release_instructions(0)
    assert released == [1, 3]
    assert cm.history.entries[5].pinned


def test_a_task_statement_handed_to_an_agent_is_never_released():
    # mini-SWE-agent at 2,000 tokens: a window over the budget released the task's <pr_description>
    # (the oldest instruction) for the harness's format reminder, and the task went on without it
    statement = ("<pr_description>\nConsider the following PR description:\nUsernameValidator allows trailing "
                 "newline in usernames. ASCIIUsernameValidator and UnicodeUsernameValidator use the regex "
                 "r'^[\\w.@+-]+$', and $ matches before a trailing newline. Use \\A and \\Z instead.\n"
                 "</pr_description>\n" + "Make changes to non-test files in the current directory. " * 20)
    reminder = ("Please always provide EXACTLY ONE action in triple backticks, found 2 actions.\n\n"
                "Please format your action in triple backticks as shown in <response_example>.")
    msgs = [{"role": "system", "content": "You are a helpful assistant that can interact with a computer shell."},
            {"role": "user", "content": statement}]
    for i in range(3):
        msgs += [{"role": "assistant", "content": f"THOUGHT: step {i}.\n\n```bash\nls\n```\n\n```bash\npwd\n```"},
                 {"role": "user", "content": reminder}]
    cm = ContextManager(scorer="rules", budget=100_000)
    cm.extend(msgs)
    h = cm.history
    assert [i for i in (1, 3, 5, 7) if h.entries[i].pinned] == [1, 3, 5, 7]  # the reminders are instructions too
    assert h.releasable_tokens() == h.entries[3].cur_tokens + h.entries[5].cur_tokens
    assert h.release_instructions(0) == [3, 5]  # the older reminders give way ...
    assert h.entries[1].pinned and h.entries[7].pinned  # ... the statement and the newest instruction stay
    assert h.release_instructions(0) == []


def test_a_new_task_statement_starts_a_task_and_releases_the_old_one():
    cm = ContextManager(scorer="rules", budget=100_000)
    cm.extend([{"role": "system", "content": "You are a coding agent."},
               {"role": "user", "content": "<pr_description>\nFix the parser crash on empty input.\n</pr_description>"},
               {"role": "assistant", "content": "THOUGHT: done.\n\n```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"},
               {"role": "user", "content": "<pr_description>\nAdd a --verbose flag to the CLI.\n</pr_description>"}])
    h = cm.history
    assert not h.entries[1].pinned and h.entries[3].pinned  # the finished task's statement is a goal record
    assert h.statements == {3}



class EverythingAnInstruction:
    """A scorer that calls every message an instruction (as a learned scorer may call a plan or an output)."""

    def predict(self, messages):
        return [Prediction("instruction", {"instruction": 0.9, "key_state": 0.05, "reasoning": 0.03, "failure": 0.02},
                           value=0.8, source="learned") for _ in messages]


def test_only_a_user_message_is_a_task_statement():
    # a markdown plan the assistant writes and a file the agent prints can hold "## Task" too: pinned as
    # instructions, they are no statement the task was handed, and give way like any other instruction
    cm = ContextManager(scorer=EverythingAnInstruction(), budget=100_000)
    cm.extend([{"role": "system", "content": "You are a coding agent."},
               {"role": "user", "content": "<pr_description>\nFix the parser crash on empty input.\n</pr_description>"},
               {"role": "assistant", "content": "## Task plan\nYour task is to fix the parser, then run the tests."},
               {"role": "user", "content": "<returncode>0</returncode>\n<output>\n## Task checklist\n- run the tests\n</output>"},
               {"role": "user", "content": "Please always run the full test suite before you submit."}])
    h = cm.history
    assert h.active_pins == [1, 2, 3, 4]  # every message of the task is a pinned instruction here
    assert h.statements == {1}
    assert h.release_instructions(0) == [2, 3]  # the plan and the output give way ...
    assert h.entries[1].pinned and h.entries[4].pinned  # ... the statement and the newest instruction stay
