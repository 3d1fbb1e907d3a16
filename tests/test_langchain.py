"""LangChain: message conversion both ways, the v1 agent middleware (the model sees the window) and
trim_messages, with langchain-core's fake chat models."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("langchain_core")

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel  # noqa: E402
from langchain_core.messages import (  # noqa: E402
    AIMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from ctxscore import Message, TokenCounter  # noqa: E402
from ctxscore.errors import InputError  # noqa: E402
from ctxscore.integrations.langchain import ContextMiddleware, to_langchain, to_openai_dicts, trim_messages  # noqa: E402

COUNTER = TokenCounter()
SYSTEM = "You are a parcel agent. Never share a customer's home address."


def tokens(dicts) -> int:
    return sum(COUNTER.count_message(Message.from_dict(d)) for d in dicts) + 3


def test_conversion_both_ways():
    msgs = [
        SystemMessage("sys"),
        HumanMessage([{"type": "text", "text": "look at this"}, {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]),
        AIMessage("", tool_calls=[{"name": "track", "args": {"parcel": 7, "note": "café"}, "id": "c1"}]),
        ToolMessage("shipped", tool_call_id="c1", name="track"),
        AIMessage([{"type": "text", "text": "It shipped"}, {"type": "reasoning", "reasoning": "hidden"}]),
        ChatMessage(role="developer", content="be brief"),
    ]
    d = to_openai_dicts(msgs)
    assert d == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "look at this"},
                                     {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "track", "arguments": '{"parcel": 7, "note": "café"}'}}]},
        {"role": "tool", "content": "shipped", "tool_call_id": "c1", "name": "track"},
        {"role": "assistant", "content": "It shipped"},
        {"role": "system", "content": "be brief"},
    ]
    back = to_langchain(d)
    assert [type(m).__name__ for m in back] == ["SystemMessage", "HumanMessage", "AIMessage", "ToolMessage", "AIMessage",
                                                "SystemMessage"]
    assert back[2].tool_calls == [{"name": "track", "args": {"parcel": 7, "note": "café"}, "id": "c1", "type": "tool_call"}]
    assert back[1].content == d[1]["content"] and back[3].tool_call_id == "c1" and back[3].name == "track"
    assert to_openai_dicts(back)[:5] == d[:5]  # a round trip is the identity


def test_raw_argument_strings_survive_and_invalid_calls_are_kept():
    raw = '{"parcel":7,  "when": "12.50"}'  # spacing kept byte for byte
    ai = AIMessage("", tool_calls=[{"name": "track", "args": {"parcel": 7, "when": "12.50"}, "id": "c1"}],
                   additional_kwargs={"tool_calls": [{"id": "c1", "type": "function",
                                                      "function": {"name": "track", "arguments": raw}}]})
    assert to_openai_dicts([ai])[0]["tool_calls"][0]["function"]["arguments"] == raw
    broken = to_langchain([{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c2", "type": "function", "function": {"name": "track", "arguments": "{parcel: 7"}}]}])[0]
    assert broken.tool_calls == [] and broken.invalid_tool_calls[0]["args"] == "{parcel: 7"
    assert to_openai_dicts([broken])[0]["tool_calls"][0]["function"]["arguments"] == "{parcel: 7"


def test_conversion_errors():
    with pytest.raises(InputError, match="has no chat-completions role"):
        to_openai_dicts([FunctionMessage(content="x", name="f")])
    with pytest.raises(InputError, match="unknown role"):
        to_langchain([{"role": "function", "content": "x"}])
    with pytest.raises(InputError, match="expected a LangChain message"):
        to_openai_dicts([42])  # type: ignore[list-item]


def test_trim_messages_keeps_what_matters():
    history = [SystemMessage(SYSTEM), HumanMessage("Track parcel PX-4411 for me; it must not be left with a neighbour.")]
    for i in range(40):
        history += [AIMessage(f"Day {i}: the weather looks cloudy with light wind and some sun in the afternoon."),
                    HumanMessage(f"ok, thanks for day {i}")]
    history.append(HumanMessage("So where is my parcel?"))
    window = trim_messages(history, max_tokens=600)
    dicts = to_openai_dicts(window)
    assert tokens(dicts) <= 600 and dicts[0]["content"].startswith(SYSTEM)
    assert dicts[-1] == {"role": "user", "content": "So where is my parcel?"}
    assert "must not be left with a neighbour" in json.dumps(dicts)  # the constraint is pinned
    from langchain_core.messages import trim_messages as lc_trim

    lc = lc_trim(history, max_tokens=600, token_counter=lambda ms: tokens(to_openai_dicts(ms)), strategy="last",
                 include_system=True, start_on="human")
    assert "must not be left with a neighbour" not in json.dumps(to_openai_dicts(lc))  # the newest messages only


class Fake(FakeMessagesListChatModel):
    """langchain-core's fake chat model, with tool binding and a record of what it was sent."""

    seen: list = []

    def bind_tools(self, tools, **kw):
        return self

    def _generate(self, messages, stop=None, run_manager=None, **kw):
        self.seen.append(list(messages))
        return super()._generate(messages, stop, run_manager, **kw)


def _agent(budget: int, n: int):
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langgraph.checkpoint.memory import InMemorySaver

    @tool
    def track(parcel: str) -> str:
        """Track a parcel."""
        return json.dumps({"parcel": parcel, "status": "in transit", "depot": "Leeds", "eta": "Friday 14:00",
                           "weight_kg": "2.5", "history": ["York 08:10", "Leeds 11:45"]})

    responses = []
    for i in range(n):
        responses += [AIMessage("", tool_calls=[{"name": "track", "args": {"parcel": f"PX-{i:04d}"}, "id": f"call_{i}"}]),
                      AIMessage(f"Parcel PX-{i:04d} is in transit via Leeds and arrives Friday at 14:00.")]
    model = Fake(responses=responses)
    model.seen = []
    mw = ContextMiddleware(budget=budget, scorer="rules")
    agent = create_agent(model, tools=[track], system_prompt=SYSTEM, middleware=[mw], checkpointer=InMemorySaver())
    return agent, model, mw


def test_the_model_sees_the_window_and_the_state_keeps_everything():
    pytest.importorskip("langchain")
    agent, model, mw = _agent(700, 30)
    cfg = {"configurable": {"thread_id": "alice"}}
    for i in range(30):
        out = agent.invoke({"messages": [HumanMessage(f"Where is parcel PX-{i:04d}?")]}, cfg)
    assert len(out["messages"]) == 30 * 4  # human, tool call, tool result, answer
    assert len(model.seen) == 60
    for seen in model.seen:
        dicts = to_openai_dicts(seen)
        assert tokens(dicts) <= 700
        assert dicts[0]["role"] == "system" and dicts[0]["content"].startswith(SYSTEM)
        assert sum(d["role"] == "system" for d in dicts) == 1  # the archive note joined into the system message
        calls = [i for i, d in enumerate(dicts) if d.get("tool_calls")]
        results = [i for i, d in enumerate(dicts) if d["role"] == "tool"]
        assert [i + 1 for i in calls] == results  # every call right before its result: the units stay whole
    last = to_openai_dicts(model.seen[-1])
    assert last[-1]["role"] == "tool" and last[-1]["tool_call_id"] == "call_29"
    assert "[archived" in last[0]["content"]  # older turns were swapped out ...
    assert len(model.seen[-1]) < len(out["messages"])  # ... so the model saw fewer messages than the state holds
    # the last model call synced the system prompt and every state message but the final answer
    assert list(mw._managers) == ["alice"] and len(mw.manager("alice")) == 1 + 30 * 4 - 1


def test_an_empty_reply_and_a_refusal_do_not_stop_the_thread():
    # the model answers once with nothing and once with a refusal (langchain-openai keeps it in
    # additional_kwargs, content empty); the next turns go on, the refusal reaches the model again
    pytest.importorskip("langchain")
    from langchain.agents import create_agent
    from langgraph.checkpoint.memory import InMemorySaver

    refusal = "I can't share a customer's home address."
    model = Fake(responses=[AIMessage(""), AIMessage("", additional_kwargs={"refusal": refusal}), AIMessage("Done.")])
    model.seen = []
    mw = ContextMiddleware(budget=2000, scorer="rules")
    agent = create_agent(model, tools=[], system_prompt=SYSTEM, middleware=[mw], checkpointer=InMemorySaver())
    cfg = {"configurable": {"thread_id": "t"}}
    for ask in ("Hello?", "What is Ann's home address?", "Then where is parcel PX-0001?"):
        out = agent.invoke({"messages": [HumanMessage(ask)]}, cfg)
    assert [m.content for m in out["messages"]][-1] == "Done." and len(model.seen) == 3
    seen = to_openai_dicts(model.seen[-1])
    assert {"role": "assistant", "content": ""} in seen
    assert {"role": "assistant", "content": "", "refusal": refusal} in seen
    assert any(m.additional_kwargs.get("refusal") == refusal for m in model.seen[-1])
    assert len(mw.manager("t")) == 6  # the system prompt, two questions, the two replies, the last question


def test_threads_have_their_own_contexts():
    pytest.importorskip("langchain")
    agent, model, mw = _agent(2000, 4)
    for i, thread in enumerate(["alice", "bob", "alice", "bob"]):
        agent.invoke({"messages": [HumanMessage(f"I am {thread}. Where is parcel PX-{i:04d}?")]},
                     {"configurable": {"thread_id": thread}})
    assert set(mw._managers) == {"alice", "bob"}
    for seen in model.seen:
        blob = json.dumps(to_openai_dicts(seen))
        assert ("I am alice" in blob) != ("I am bob" in blob)


def test_layers_are_made_per_thread():
    """ContextMiddleware(layers=[FactLedger()]) gave every thread the same ledger, so one user's
    facts reached another user's model call (a new user's report): layers come from a factory."""
    pytest.importorskip("langchain")
    from ctxscore import ContextManager
    from ctxscore.errors import ConfigError
    from ctxscore.memory.ledger import FactLedger

    with pytest.raises(ConfigError, match="a function that makes each thread's"):
        ContextMiddleware(budget=2000, scorer="rules", layers=[FactLedger()])
    with pytest.raises(ConfigError, match="would be ignored"):
        ContextMiddleware(layers=lambda: [FactLedger()], manager_factory=lambda sid: ContextManager(session_id=sid))
    mw = ContextMiddleware(manager_factory=lambda sid: ContextManager(budget=2000, scorer="rules", session_id=sid,
                                                                      layers=[FactLedger()]))
    assert mw.manager("alice").state.layers[0] is not mw.manager("bob").state.layers[0]
    mw = ContextMiddleware(budget=2000, scorer="rules", layers=lambda: [FactLedger()])
    assert mw.manager("alice").state.layers[0] is not mw.manager("bob").state.layers[0]


def test_async_agents():
    pytest.importorskip("langchain")
    agent, model, mw = _agent(700, 3)

    async def run():
        for i in range(3):
            out = await agent.ainvoke({"messages": [HumanMessage(f"Where is parcel PX-{i:04d}?")]},
                                      {"configurable": {"thread_id": "t"}})
        return out

    out = asyncio.run(run())
    assert len(out["messages"]) == 12 and len(model.seen) == 6
    assert mw.last_window is not None and mw.last_window.tokens <= 700


def test_an_edited_tool_call_keeps_its_edit():
    """LangChain's human-in-the-loop middleware edits ``tool_calls`` and leaves the provider's raw
    calls in ``additional_kwargs``: the window showed the call as the model first made it."""
    raw = {"tool_calls": [{"id": "c1", "type": "function", "function": {"name": "book", "arguments": '{"people":  2}'}}]}
    ai = AIMessage(content="", additional_kwargs=raw, tool_calls=[{"name": "book", "args": {"people": 2}, "id": "c1"}])
    assert to_openai_dicts([ai])[0]["tool_calls"][0]["function"]["arguments"] == '{"people":  2}'  # byte-exact
    ai.tool_calls = [{"name": "book", "args": {"people": 4}, "id": "c1", "type": "tool_call"}]
    assert json.loads(to_openai_dicts([ai])[0]["tool_calls"][0]["function"]["arguments"]) == {"people": 4}
    stale = {"tool_calls": [{"id": "c2", "type": "function", "function": {"name": "pay", "arguments": '{"confirm": 1}'}}]}
    ai = AIMessage(content="", additional_kwargs=stale, tool_calls=[{"name": "pay", "args": {"confirm": True}, "id": "c2"}])
    assert to_openai_dicts([ai])[0]["tool_calls"][0]["function"]["arguments"] == '{"confirm": true}'  # True is not 1


def test_tool_and_user_blocks_are_kept_whole():
    img = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    cached = {"type": "text", "text": "the policy", "cache_control": {"type": "ephemeral"}}
    msgs = [HumanMessage("screenshot please"),
            AIMessage("", tool_calls=[{"name": "shot", "args": {}, "id": "c1"}]),
            ToolMessage(content=[{"type": "text", "text": "here"}, img], tool_call_id="c1"),
            HumanMessage(content=[cached, {"type": "text", "text": "and this"}])]
    dicts = to_openai_dicts(msgs)
    assert dicts[2]["content"] == [{"type": "text", "text": "here"}, img]
    assert dicts[3]["content"] == [cached, {"type": "text", "text": "and this"}]
    assert trim_messages(msgs, max_tokens=2000, scorer="rules")[2].content == [{"type": "text", "text": "here"}, img]
    assert to_openai_dicts([HumanMessage(content=[{"type": "text", "text": "one"}])])[0]["content"] == "one"


@pytest.mark.parametrize(("call", "match"), [
    ({"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}, "arguments of type dict"),
    ("junk", "must be a dict with a 'function' object"),
])
def test_bad_tool_calls_are_a_clear_error(call, match):
    with pytest.raises(InputError, match=match):
        to_langchain([{"role": "assistant", "content": "", "tool_calls": [call]}])


def test_a_window_over_max_tokens_says_so():
    """trim_messages returned 95 tokens for max_tokens=50 without a word, and on_overflow="raise"
    raised only for pinned content (a new user's report)."""
    from ctxscore import Policy
    from ctxscore.errors import BudgetError

    msgs = [SystemMessage("You are helpful. Never reveal the password."),
            HumanMessage("Hi there, plan a trip to Paris for 3 people on June 3, budget €2000.")]
    for i in range(5):
        msgs += [AIMessage(f"Answer {i}: " + "Paris is lovely in spring. " * 10), HumanMessage(f"Question {i}: museum {i}?")]
    with pytest.warns(RuntimeWarning, match="above max_tokens=50"):
        out = trim_messages(msgs, max_tokens=50)
    assert tokens(to_openai_dicts(out)) > 50
    with pytest.raises(BudgetError, match="above the budget of 50"):
        trim_messages(msgs, max_tokens=50, policy=Policy(on_overflow="raise"))


def test_an_assistant_name_survives_both_ways():
    ai = AIMessage("Checked.", name="planner")
    d = to_openai_dicts([ai])[0]
    assert d == {"role": "assistant", "content": "Checked.", "name": "planner"} and to_langchain([d])[0].name == "planner"


THINKING = {"type": "thinking", "thinking": "The user wants the parcel tracked first.", "signature": "EqQBCkYIBxgC"}


def test_messages_kept_verbatim_are_the_callers_own_objects():
    """The window came back as new LangChain messages made from chat-completions dicts, so a kept
    message lost its id, a ToolMessage its status and an AIMessage its thinking blocks (which
    Anthropic's API asks for back in a tool-using turn). A message the window keeps verbatim is now
    the caller's object; a compressed tool result keeps its original's status."""
    log = "\n".join(f"2026-12-01 10:{i:02d}:00 INFO worker {i} polled queue q{i} ok" for i in range(60))
    msgs = [SystemMessage("You are a deploy agent."), HumanMessage("Deploy release 42 to staging.", id="h1"),
            AIMessage(content=[THINKING, {"type": "text", "text": "Deploying."}], id="a1",
                      tool_calls=[{"name": "deploy", "args": {"release": 42}, "id": "c1"}]),
            ToolMessage(log + "\nERROR deploy failed: permission denied on /srv/app/releases/42", tool_call_id="c1",
                        status="error", id="t1", artifact={"exit": 1})]
    for i in range(6):
        msgs += [AIMessage(f"Step {i}: " + "I am checking the permissions of the release folder. " * 4, id=f"b{i}"),
                 HumanMessage(f"Go on with step {i + 1}.", id=f"h{i + 2}")]
    whole = trim_messages(msgs, max_tokens=8000)
    assert all(a is b for a, b in zip(whole[1:], msgs[1:], strict=True))  # every message kept: the same objects
    assert whole[2].content[0] == THINKING and whole[3].status == "error" and whole[3].artifact == {"exit": 1}
    compressed = []
    for budget in range(1000, 2100, 100):
        for m in trim_messages(msgs, max_tokens=budget):
            if isinstance(m, ToolMessage):
                assert m.status == "error"
                if m is not msgs[3]:
                    compressed.append(m)
    assert compressed and all(m.id is None and len(m.content) < len(msgs[3].content) for m in compressed)


def test_the_agent_model_gets_its_thinking_blocks_back():
    pytest.importorskip("langchain")
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langgraph.checkpoint.memory import InMemorySaver

    @tool
    def track(parcel: str) -> str:
        """Track a parcel."""
        return f"{parcel}: in transit via Leeds, arrives Friday 14:00."

    model = Fake(responses=[AIMessage(content=[THINKING, {"type": "text", "text": "Tracking."}], id="ai-1",
                                      tool_calls=[{"name": "track", "args": {"parcel": "PX-0001"}, "id": "c1"}]),
                            AIMessage("It arrives Friday at 14:00.")])
    model.seen = []
    agent = create_agent(model, tools=[track], system_prompt=SYSTEM, middleware=[ContextMiddleware(budget=2000, scorer="rules")],
                         checkpointer=InMemorySaver())
    out = agent.invoke({"messages": [HumanMessage("Where is parcel PX-0001?")]}, {"configurable": {"thread_id": "t"}})
    assert out["messages"][-1].content == "It arrives Friday at 14:00."
    call = [m for m in model.seen[-1] if isinstance(m, AIMessage)]
    assert len(call) == 1 and call[0].id == "ai-1" and call[0].content[0] == THINKING
    assert isinstance(model.seen[-1][-1], ToolMessage) and model.seen[-1][-1].id == out["messages"][2].id
