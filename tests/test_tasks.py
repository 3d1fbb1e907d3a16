"""Task boundaries on exchanges taken from the corpora's train splits (SGD, CrossWOZ, tau-bench):
where a finished dialogue ends and the next one begins, and where it does not."""

from __future__ import annotations

import pytest

from ctxscore import ContextManager


def _tasks(turns: list[tuple[str, str]]) -> list[int]:
    cm = ContextManager(budget=100_000, scorer="rules")
    msgs = []
    for i, (role, text) in enumerate(turns):
        if role == "call":
            msgs.append({"role": "assistant", "content": "", "tool_calls": [{"id": f"c{i}", "type": "function",
                         "function": {"name": text, "arguments": "{}"}}]})
        elif role == "tool":
            msgs.append({"role": "tool", "tool_call_id": f"c{i - 1}", "content": text})
        else:
            msgs.append({"role": role, "content": text})
    cm.extend(msgs)
    return [e.task for e in cm.history.entries]


@pytest.mark.parametrize("closing, opening", [
    # the user declined more help, the assistant said goodbye; the next request has no request word
    ([("user", "No, thanks."), ("assistant", "Have a great day.")],
     ("user", "I am in need of finding a place that I can live at.")),
    ([("user", "no thank you."), ("assistant", "Have a lovely day.")],
     ("user", "Set an alarm titled Cleaning for half past 3 in the afternoon.")),
    # farewells the rule file did not know
    ([("user", "Thank you for the assistance. I don't need anything else."), ("assistant", "Have a pleasant day.")],
     ("user", "Find me for 1 people a house to stay with laundry service and rating minimum 4.1.")),
    ([("user", "清楚了，真的太谢谢你了。"), ("assistant", "很开心为您服务。")],
     ("user", "你好，最近要组织个同学聚会，需要订一个餐馆，帮我推荐一个人均消费在50到100元之间的餐馆吧。")),
    ([("user", "非常感谢，有问题我再问你哈。"), ("assistant", "好的，随时欢迎咨询。")],
     ("user", "麻烦你帮我找一个400到500元，提供会议室，并且评分为5分的酒店，谢谢。")),
    # an airline agent hands the user over to a human: the episode is over
    ([("call", "transfer_to_human_agents"), ("tool", "Transfer successful")],
     ("user", "Hi, I need to cancel a flight that I booked, please.")),
    # a new request that holds a closing phrase ("all I need") is not a farewell
    ([("user", "No, thanks."), ("assistant", "Have a great day.")],
     ("user", "Hi, all I need now is a taxi to the airport at 5pm.")),
    ([("user", "没有了，谢谢。"), ("assistant", "再见。")],
     ("user", "你好，帮我找一个随时可以入住的酒店。")),
    # farewells ending on repeated punctuation or an emoji, and a negated 需要
    ([("user", "Thanks, bye!!"), ("assistant", "Goodbye!")],
     ("user", "My sister and I are visiting Rome next week and want a quiet hotel.")),
    ([("user", "没有了，谢谢！😊"), ("assistant", "不客气，祝您旅途愉快！")],
     ("user", "周末我们一家三口打算去颐和园附近逛逛吃点东西。")),
    ([("user", "不需要了，谢谢。"), ("assistant", "好的，再见。")],
     ("user", "我和朋友下周六打算去八达岭长城爬山游玩一天。")),
    # a thank-you whose last sentence is the farewell, then a request without a request word
    ([("user", "That sounds nice to me. That will be all. Thank you!"), ("assistant", "I am glad I could help.")],
     ("user", "Me and my boyfriend are hoping you can recommend a four star hotel.")),
])
def test_a_request_after_a_closing_exchange_opens_a_task(closing, opening):
    first = [("user", "Please book a table for two at Sushi Ran at 7pm."),
             ("assistant", "Booked: Sushi Ran, 7pm, two people, reference SR-1.")]
    tasks = _tasks([*first, *closing, opening])
    assert tasks[-1] == tasks[0] + 1, tasks
    assert len(set(tasks[:-1])) == 1


@pytest.mark.parametrize("turns", [
    # a farewell after a confirmation, then the user's own thanks: still the same task
    [("assistant", "Your reservation is confirmed. Have fun!"), ("user", "Thank you, that is all I need.")],
    # a short acknowledgement after a closing exchange opens nothing
    [("user", "No, thanks."), ("assistant", "Have a great day."), ("user", "Great, thanks!")],
    # the user never closed: a farewell wish is not the end of the task
    [("user", "Book it for 3 people."), ("assistant", "Done. Have a nice time there."),
     ("user", "The rating of the place matters to me.")],
    # the user thanks or says "OK" in passing and asks on: replies that mention help are not closings
    [("user", "OK. What's the address?"), ("assistant", "It's at 12 Main St. Let us know if you need directions."),
     ("user", "And the phone number as well.")],
    [("user", "Thanks! Is there parking?"), ("assistant", "Yes, you can park there anytime."),
     ("user", "Could you also book a taxi?")],
    [("user", "Great, book it for 3 people."), ("assistant", "Done. Have a nice time there."),
     ("user", "The rating of the place matters to me.")],
    [("user", "Is the elevator working?"), ("assistant", "The elevator is out of service today."),
     ("user", "Then book a room on the ground floor please.")],
    [("user", "谢谢你，再帮我查一下明天北京的天气"), ("assistant", "明天北京晴，25度。"), ("user", "那后天呢？")],
    [("user", "这家有停车场吗？"), ("assistant", "很乐意为您查询：有免费停车场。"), ("user", "帮我看看附近的地铁站")],
    # a greeting followed by thanks and a farewell is the user's own farewell, not a new request
    [("user", "No thanks."), ("assistant", "Have a great day!"), ("user", "Hey thanks, you too! That's all I need.")],
    [("user", "还有别的推荐吗"), ("assistant", "为您推荐故宫。"), ("user", "没有别的了，谢谢你帮我安排得这么周到。"),
     ("assistant", "不客气！")],
    # mini-SWE-agent submits: its observations are sent as user messages but are not the user closing
    [("user", "<returncode>0</returncode>\n<output>\nRan 12 tests: OK\n</output>"),
     ("assistant", "THOUGHT: done.\n```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git add -A && git diff --cached\n```"),
     ("user", "diff --git a/django/db/models/aggregates.py b/django/db/models/aggregates.py\nindex 8c4eae7..1f2b3c4 100644")],
])
def test_no_task_starts_without_a_closing_the_user_took_part_in(turns):
    first = [("user", "Please book a table for two at Sushi Ran at 7pm."),
             ("assistant", "Booked: Sushi Ran, 7pm, two people, reference SR-1.")]
    assert set(_tasks([*first, *turns])) == {0}


def test_the_message_that_opens_the_active_task_is_pinned_whatever_its_category():
    """The packaged scorer reads "I want to book a table for four ..." as ``key_state``, so the new
    task's statement was archived under its tool calls and the window no longer said what the agent
    was doing (a new user's report). The first user message of the active task is pinned."""
    import json

    from ctxscore import ContextManager

    cm = ContextManager(budget=1500, scorer="auto")
    cm.extend([{"role": "system", "content": "You are a concierge agent with search and booking tools."},
               {"role": "user", "content": "Find me a dentist near Market Street for next Monday."}])
    for k in range(6):
        cm.extend([{"role": "assistant", "content": "", "tool_calls": [{"id": f"a{k}", "type": "function", "function": {
                       "name": "search", "arguments": json.dumps({"q": f"dentist {k}"})}}]},
                   {"role": "tool", "tool_call_id": f"a{k}", "content": json.dumps(
                       [{"name": f"Dr. Lee {k}{j}", "slot": f"Mon 0{j}:30"} for j in range(8)])}])
    cm.extend([{"role": "assistant", "content": "Booked Dr. Lee 03 for Monday 03:30."},
               {"role": "user", "content": "Great, thanks! That's all for that."},
               {"role": "assistant", "content": "You're welcome!"}])
    opener = cm.add({"role": "user", "content": "I want to book a table for four at an Italian place near Union Square tonight."})
    for k in range(6, 30):
        cm.extend([{"role": "assistant", "content": "", "tool_calls": [{"id": f"a{k}", "type": "function", "function": {
                       "name": "search", "arguments": json.dumps({"q": f"italian {k}"})}}]},
                   {"role": "tool", "tool_call_id": f"a{k}", "content": json.dumps(
                       [{"name": f"Trattoria {k}{j}", "time": f"19:{j}0", "seats": 4} for j in range(8)])}])
    w = cm.build()
    decision = next(d for d in w.decisions if d.id == opener.id)
    assert decision.category == "key_state" and decision.pinned  # not an instruction to the scorer, pinned all the same
    assert opener.content in [m["content"] for m in w.messages]
    assert cm.history.task_starts[-1] == cm.history.ids[opener.id]
    assert not w.decisions[1].pinned  # the finished task's opener is a goal record now


def test_a_finished_tasks_corrections_are_pinned_no_longer():
    """Corrections stayed pinned after their task ended: 90 bookings each corrected once ("Actually make
    it 8pm instead, table 12.") took a 1,200-token window to 1,514 tokens with a pinned-over-budget
    warning (a new user's report)."""
    cm = ContextManager(budget=1200, scorer="rules")
    cm.add({"role": "system", "content": "You are a booking assistant."})
    for t in range(90):
        cm.extend([{"role": "user", "content": f"Book a table for 2 at restaurant number {t} on Friday at 7pm."},
                   {"role": "assistant", "content": f"Booked restaurant {t} for 2 on Friday at 19:00, reference R-{1000 + t}."},
                   {"role": "user", "content": f"Actually make it 8pm instead, table {t}."},
                   {"role": "assistant", "content": f"Changed restaurant {t} to 20:00."},
                   {"role": "user", "content": "Thanks, that's all."},
                   {"role": "assistant", "content": "You're welcome, have a great day!"}])
    w = cm.build()
    assert w.tokens <= 1200 and not w.warnings
    pinned = [e.msg.content for e in cm.history.entries if e.pinned]
    assert pinned == ["You are a booking assistant.", "Book a table for 2 at restaurant number 89 on Friday at 7pm.",
                      "Actually make it 8pm instead, table 89."]  # the active task's request and correction


def test_a_welcome_that_asks_about_the_task_closes_nothing():
    """ "Happy to help! What dates are you thinking of?" read as a closing, so the next user message
    opened a new task and unpinned the trip's request (a new user's report)."""
    cm = ContextManager(budget=4000, scorer="rules")
    cm.extend([{"role": "system", "content": "You are a travel agent."},
               {"role": "user", "content": "Hi! I need to plan a trip from Dublin to Barcelona for my wife and me in June."},
               {"role": "assistant", "content": "Happy to help! What dates are you thinking of?"},
               {"role": "user", "content": "Outbound June 12, back June 19. Important: never book Ryanair for us, "
                                           "I had a terrible experience with them last year."}])
    assert cm.history.task_starts == [0] and cm.history.entries[1].pinned
    cm.extend([{"role": "assistant", "content": "Booked. You're welcome! Anything else I can do?"},
               {"role": "user", "content": "Can you also find me a dentist in Dublin?"}])
    assert cm.history.task_starts == [0, 5]  # an offer of more help still closes


def test_the_opener_after_a_greeting_is_pinned_and_a_pasted_log_is_not():
    """Review: the first user message was pinned whatever it was, so "Hi there!" took the pin from the
    request after it, and a 400-line build log pasted first was pinned whole (a 2,000-token window
    grew to 2,929 tokens with a pinned-over-budget warning)."""
    cm = ContextManager(budget=2000, scorer="auto")
    cm.extend([{"role": "user", "content": "Hi there!"},
               {"role": "assistant", "content": "Hello! What can I do for you?"},
               {"role": "user", "content": "Let's plan the team offsite in Lisbon for the week of March 3."}])
    request = cm.history.entries[2]
    assert request.pinned and request.category == "key_state"  # pinned as the opener, not for its category
    log = "\n".join(f"[{i:03d}] gcc -O2 -c src/module_{i}.c -o build/module_{i}.o  ok" for i in range(400))
    cm = ContextManager(budget=2000, scorer="rules")
    cm.extend([{"role": "user", "content": "Here is the build log:\n" + log}])
    for i in range(6):
        cm.extend([{"role": "assistant", "content": f"Checked part {i} of the log."}, {"role": "user", "content": f"And part {i + 1}?"}])
    w = cm.build()
    assert not cm.history.entries[0].pinned and w.tokens <= 2000
    assert not any(x.kind == "pinned_over_budget" for x in w.warnings)
