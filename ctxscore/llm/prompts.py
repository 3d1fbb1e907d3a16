"""The prompts of the LLM path and the parser of their JSON answers.

:data:`COMPRESSOR_RULES` are the compressor rules of the second design note
(``../shared/seeds/001_baad8d8721c91673.txt``, "你是 Agent 上下文压缩器 ..."), in English and in the
original Chinese, with the verifier's requirements spelled out (entities, numbers and negations
copied character for character). :data:`CLASSIFIER_RULES` condense the annotation guide of the
distilled labels (``../shared/datasets/labels/README.md``). :data:`QUERY_RULES` ask for recall
queries, as the note asks for detail recall ("至少也要大模型来撰写召回细节的关键字").

This module imports nothing optional.
"""

from __future__ import annotations

import json
import re
from typing import Any

#: The original rules of the design note (its commas and colons restored).
COMPRESSOR_RULES_ZH = (
    "你是 Agent 上下文压缩器。请将输入内容压缩成给后续大模型使用的高密度上下文，而不是给用户看的自然语言摘要。\n"
    "要求：\n"
    "1. 删除礼貌表达、转场句、口语填充词、重复解释、情绪价值表达。\n"
    "2. 保留目标、实体、关键事实、硬约束、软偏好、用户确认、用户否认、数字、时间、决策、理由、风险、缺失信息、证据来源。\n"
    "3. 可以使用短句、列表、键值对，不要求自然语言流畅。\n"
    "4. 不得改变原意。\n"
    "5. 不得把不确定信息改成确定事实。\n"
    "6. 不得把建议改成已执行决策。\n"
    "7. 不得把 Assistant 推测改成用户确认事实。\n"
    "8. 硬约束和用户否认内容必须显式保留。"
)

COMPRESSOR_RULES = (
    "You are an agent-context compressor. Compress each input into high-density context for a later LLM "
    "to read, not a natural-language summary for the user.\n"
    "Rules:\n"
    "1. Delete politeness, transitions, verbal fillers, repeated explanations and emotional talk.\n"
    "2. Keep goals, entities, key facts, hard constraints, soft preferences, user confirmations, user "
    "denials, numbers, times, decisions, reasons, risks, missing information and evidence sources.\n"
    "3. Short lines, lists and key: value pairs are fine; fluent prose is not required.\n"
    "4. Never change the meaning.\n"
    "5. Never turn uncertain information into a certain fact (keep maybe / might / probably / 可能 as written).\n"
    "6. Never turn a suggestion into an executed decision.\n"
    "7. Never turn an assistant's guess into a fact the user confirmed.\n"
    "8. Keep hard constraints and the user's denials explicitly.\n"
    "Copy character for character: every ID, name, number with its unit, amount, date, time, address, "
    "path, code identifier and quoted string, every negation with the word after it (\"not allowed\", "
    "\"never book\", \"don't want\", \"no garage\", 不要, 没有), and every hard-constraint sentence of a user "
    "or system message (never / must / at most / budget / deadline / 必须 / 不超过 ...) whole. Add nothing that is not in the input: no new "
    "names, numbers or dates, no \"confirmed\" or \"done\" the input does not say. Write in the language of "
    "the input. Each form must be shorter than its input.\n\n"
    "Original rules (Chinese):\n" + COMPRESSOR_RULES_ZH
)

#: What each tier asks of the compressor.
TIER_INSTRUCTIONS = {
    "structured": "structured: every fact as short key: value lines (one per line); drop connective prose.",
    "compressed": "compressed: only the conclusions, decisions and decisive steps; drop exploration and "
                  "examples, but still keep every entity, number and negation.",
}

COMPRESSOR_FORMAT = (
    "Input: a JSON object {\"items\": [{\"id\", \"role\", \"tier\", \"text\"}]}. Tiers:\n"
    + "\n".join(f"- {v}" for v in TIER_INSTRUCTIONS.values())
    + "\nAnswer with one JSON object only: {\"items\": [{\"id\": <the item's id>, \"form\": <the compressed text>}]}, "
    "one entry per input item."
)

CLASSIFIER_RULES = (
    "You label messages of a long conversation between a user (or an operator's system prompt), an "
    "assistant/agent and tools. Imagine the context window is full and history must be summarised or "
    "dropped. For each message give:\n"
    "category (exactly one):\n"
    "- instruction: what the user or operator wants and the rules the agent must obey: goals, requests, "
    "tasks, hard constraints (must / never / budget / deadline / format / scope), preferences that act as "
    "requirements, a correction that restates a requirement.\n"
    "- key_state: facts the task depends on: entities, IDs, names, numbers, dates, times, addresses, prices; "
    "tool results with data that is or may be used; final conclusions, decisions, confirmations, adopted "
    "plans, completed actions; a user supplying a value the agent asked for.\n"
    "- reasoning: process: thinking, step-by-step analysis, exploration, explanations, options offered but "
    "not chosen, clarifying questions, exploratory tool output.\n"
    "- failure: noise and dead ends: errors, failed tool calls, wrong or rejected answers, retries, "
    "superseded requests, off-topic talk, pleasantries with no content.\n"
    "Tie-breaks: a user message that asks for something or sets a condition is instruction; one that only "
    "answers with a value is key_state. An assistant message that confirms what was done or decided is "
    "key_state; one that reasons toward it is reasoning. A failed tool result is failure.\n"
    "importance (integer 0-3): if the message were deleted from the history at the end of the conversation, "
    "how much would the agent lose? 3: the task would fail or a requirement be violated; 2: noticeably "
    "worse; 1: minor; 0: nothing.\n"
    "Input: a JSON object {\"items\": [{\"id\", \"role\", \"text\", \"before\"?}]} (\"before\": the previous "
    "message, for context). Answer with one JSON object only: "
    "{\"items\": [{\"id\": <id>, \"category\": \"instruction|key_state|reasoning|failure\", \"importance\": 0-3}]}."
)

QUERY_RULES = (
    "You write search queries that find earlier messages of a long conversation in an archive (keyword "
    "search with bm25 and vector search). Given the current request (and optionally recent context), give "
    "keyword queries (the distinctive words, names, IDs, numbers and their likely synonyms; no stop words) "
    "and paraphrases (the request restated as the earlier message would have said it). Keep every ID, "
    "name and number of the request as written; invent none. Write in the language of the request.\n"
    "Answer with one JSON object only: {\"keywords\": [\"...\"], \"paraphrases\": [\"...\"]}."
)

_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL | re.IGNORECASE)


def parse_json_object(text: str) -> dict[str, Any]:
    """The JSON object of an LLM answer: the whole text, a fenced ```json block, or the outermost
    ``{...}`` in it.

    Raises:
        ValueError: no JSON object can be read (the message says what was found).
    """
    t = text.strip()
    m = _FENCE.match(t)
    if m:
        t = m.group(1)
    for candidate in (t, t[t.find("{"): t.rfind("}") + 1] if "{" in t and "}" in t else ""):
        if not candidate:
            continue
        try:
            obj = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(obj, dict):
            return obj
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    raise ValueError(f"no JSON object in the answer (starts {t[:60]!r})")


def items_by_id(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``obj["items"]`` as ``{str(id): item}``; items without an id, or not objects, are skipped.

    Raises:
        ValueError: ``items`` is missing or not a list.
    """
    items = obj.get("items")
    if not isinstance(items, list):
        raise ValueError("the answer has no \"items\" list")
    return {str(it["id"]): it for it in items if isinstance(it, dict) and it.get("id") is not None}
