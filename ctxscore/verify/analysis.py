"""The verifier's reading of the conversation as it grows: one pass per new message, O(message).

:class:`Tracker` keeps, per task, what the user stated (values by group, values the user later
corrected, offers the user accepted), the hard constraints as :mod:`rules <ctxscore.verify.constraints>`,
and the tool results since the last user turn; each assistant message is checked against them when
it arrives:

- **goal drift**: an action (a tool call, or "I'll book / I have booked ..." in text) uses a date,
  time, place or party size that no user turn of the task gave while the user gave another one (or
  that the user corrected since: a correction replaces the user's one value of its group, or, of
  several, the one it names, "change the check-in to June 14" beside a check-out date);
- **constraint contradicted**: an action or a proposal breaks a hard constraint of the system or of the
  task (a prohibited term, a money or count bound, a time bound; a write tool call without a user
  confirmation when a constraint requires one);
- **task state inconsistent**: the assistant reports success while the tool results since the user's
  last turn are errors (or the tests failed), or reports a change no tool call made (in a tool-using
  session);
- **unconfirmed as confirmed**: "as you said / you confirmed ..." followed by values no user turn gave.

A drift finding is withdrawn when a later user turn of the task states the value (the user changed
the goal after all).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from ..memory import lexicon as lx
from ..memory.facts import negated
from ..messages import Message, Role
from ..scoring.rules import RuleConfig, default_config, sentences
from ..store.stemming import porter_stem
from ..window.history import Entry
from . import constraints as cons
from .findings import Action, Finding, FindingKind, Severity
from .values import BOUND_KEY, Value, call_values, num, values_in

DRIFT_GROUPS = ("date", "time", "place", "people")
_COMPOUND = re.compile(r"\d+(?:-|st|nd|rd|th)?[a-z]*(?:-[a-z]+)*")  # 30-day, 2nd, 4-star: not identifiers
_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
_OBSERVATION = re.compile(r"<returncode>|^\s*<output", re.MULTILINE)
_RETURNCODE = re.compile(r"<returncode>\s*(-?\d+)\s*</returncode>")
_TESTS_PASS = re.compile(r"(?i)\b(?:all )?tests? (?:now )?pass(?:es|ed)?\b|\bpassing\b|测试(?:全部)?通过")
_ERROR_JSON = re.compile(r'^\s*\{[^{}]{0,200}"(?:error|status)"\s*:\s*"(?:[^"]*(?:fail|error|denied|invalid)[^"]*)"', re.I)
_PAST_ACTION = re.compile(r"(?i)\b(?:i'?ve|i have|has been|have been|is now|are now|was successfully)\s+(?:\w+\s+)?"
                          r"(?:booked|reserved|cancell?ed|updated|changed|modified|refunded|processed|submitted|sent|"
                          r"upgraded|added|removed|returned|exchanged)\b|已(?:经)?(?:为您|帮您)?(?:预订|取消|修改|更新|退款|提交|改好)")
_CORRECTION = re.compile(r"(?i)\b(?:actually|instead|change (?:it |that )?to|make it|i meant|rather|correction|"
                         r"switch to|not anymore)\b|改成|改为|改到|换成|更正|其实|不对|改一下|提高到|放宽到|调整为|调到")
_OFFER = lx.OFFER
_CONFIRM_WORD = re.compile(r"(?i)\b(?:yes|yeah|yep|sure|ok(?:ay)?|confirm\w*|go ahead|proceed|please do|do it|correct|"
                           r"that'?s right|sounds good)\b|是的|确认|可以|好的|对|行|没问题|改吧|订吧|办吧")
_NOT_ACTION = re.compile(r"(?i)^(?:think|calculat\w*|transfer_to_human\w*|final_answer)$")
_ACK_FAILURE = re.compile(r"(?i)\bfail\w*|didn'?t go through|couldn'?t|could not|unable to|\berrors?\b|失败|未能|没能|无法|报错")
_CONDITIONAL = re.compile(r"(?i)\b(?:if|unless|once|after (?:you|we|the)|approval|approved|permission)\b|如果|假如|除非|"
                          r"等.{0,6}(?:同意|批准|确认)|获得.{0,6}(?:同意|批准)|经.{0,4}(?:同意|批准)|之后再")
_ACKNOWLEDGED = re.compile(r"(?i)budget|exceed|over|above|超出|超过|预算|排除|不符合")
_IMPERATIVE = re.compile(r"(?i)^\s*(?:please|go ahead|let'?s|can you|could you|i want you to)\b|吧[。！!]?\s*$|^(?:请|帮我|麻烦|你)")
_NON_WRITE = re.compile(r"(?i)human|agent|think|calculat|search|get_|find|list|lookup|check|verify|read")


def _writes(name: str) -> bool:
    """Whether a tool of this name changes something (books, cancels, pays), not one that only reads."""
    return bool(lx.WRITE_TOOL.search(name)) and not _NON_WRITE.search(name)
_CONCLUSION = re.compile(r"(?i)\b(?:your|the) (?:reference|confirmation|reservation|booking|order|ticket|refund|total|"
                         r"balance|tracking|return|exchange)\b|单号|订单号|总共|合计|退款|金额|共计")


def _constraint_sentences(e: Entry) -> list[str]:
    """The hard constraints of a user or system message the rules are read from: the ones the window
    pins (:attr:`Entry.constraints`), sentences with a prohibition cue it does not ("don't recommend
    Apple"), and a user's sentences with a bound on an amount ("Keep it under $300 a night")."""
    out = list(e.constraints)
    if len(e.msg.content) <= 4000:
        out += [s for s in sentences(e.msg.content) if s not in out and len(s) <= 300 and (
            _TELLS_NOT.search(s) or (e.msg.role == Role.USER and _BOUND.search(s)))]
    return out


#: A bound on an amount in a user's sentence ("under $300", "no more than 500元", 每晚不超过500元).
_BOUND = re.compile(r"(?i)\b(?:under|below|at most|no more than|not more than|less than|max(?:imum)?|up to)\s+"
                    r"(?:[$€£¥]\s?\d|\d[\d,.]*\s?(?:dollars|euros|pounds|usd|eur|gbp|元|块))|(?:不超过|最多|以内|低于|别超过|"
                    r"不能超过)\s*\d|\d+\s*(?:元|块)(?:以内|以下)")


#: A prohibition addressed to the agent ("Please don't recommend Apple", "No red-eye flights", 别推荐苹果),
#: not a statement about the user ("I don't remember the ID", "No, it would be the 5th").
_TELLS_NOT = re.compile(r"(?i)^\W*(?:please,? )?(?:don'?t|do not|never|avoid)\b|^\W*no\b(?!,|\s+(?:it|i|thanks|thank|that|"
                        r"this|problem|worries|need|we|you|he|she|they|one|not|more|longer)\b)|\b(?:please|you must|you "
                        r"should|make sure (?:to|you)) (?:not|don'?t|do not|never|avoid)\b|(?:^|[，,。；;])\s*(?:请|千万|一定)?"
                        r"(?:不要|别|禁止|不许|不准|千万别)")


def _short_args(arguments: str) -> str:
    """The arguments of a call as the prohibited-term check reads them: its short string values (a
    note or a message body that mentions a term is not an action on it)."""
    import json  # noqa: PLC0415

    try:
        args = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return arguments[:200]
    if not isinstance(args, dict):
        return ""
    return " ".join(str(v) for v in args.values() if isinstance(v, str | int | float) and len(str(v)) <= 60
                    and not lx.NEGATION.search(str(v)))


def is_observation(msg: Message) -> bool:
    """An agent's observation delivered as a user message (mini-SWE-agent: ``<returncode>``)."""
    return msg.role == Role.USER and bool(_OBSERVATION.search(msg.content[:300]))


#: A tool output that reports a failure in its own words ("Job for nginx.service failed because ...").
_FAILED_OUTPUT = re.compile(r"(?i)\b(?:failed because|failed to|exited with (?:an )?error|error code|permission denied|"
                            r"connection refused|command not found|no such file or directory|unable to)\b")


def tool_ok(msg: Message) -> bool:
    """A tool result (or an observation) that reports no error."""
    text = msg.content.strip()
    m = _RETURNCODE.search(text[:300])
    if m:
        return m.group(1) == "0"  # the command's own verdict
    head = text[:200]
    return not (head.lower().startswith("error") or _ERROR_JSON.search(head) or re.search(
        r"(?i)^\s*(?:failed|exception|traceback)|失败|错误", head) or _FAILED_OUTPUT.search(head))


@dataclass
class TaskTrack:
    """What one task has shown so far (module docstring)."""

    user: dict[str, dict[str, str]] = field(default_factory=dict)  # group -> norm -> id of the user message
    superseded: dict[str, set[str]] = field(default_factory=dict)  # group -> norms the user corrected
    # group -> norm -> (user message, value text, the words naming it: _value_names): the value a norm reads
    held: dict[str, dict[str, tuple[str, str, frozenset[str]]]] = field(default_factory=dict)
    endorsed: dict[str, dict[str, str]] = field(default_factory=dict)  # offers the user accepted
    user_texts: list[str] = field(default_factory=list)
    rules: list[cons.Rule] = field(default_factory=list)
    results: list[tuple[str, bool, str]] = field(default_factory=list)  # since the last user turn: (id, ok, call)
    calls: list[str] = field(default_factory=list)  # tool calls since the last user turn (names)
    last_user: Message | None = None
    offer: tuple[str, list[Value]] | None = None
    goal: str = ""


@dataclass
class Tracker:
    """The verifier's running state (module docstring). ``findings`` holds the open add-time findings by
    task; ``values`` each message's values (its evidence) and ``sources`` the first message giving
    each value."""

    config: RuleConfig = field(default_factory=default_config)
    tasks: dict[int, TaskTrack] = field(default_factory=dict)
    system_rules: list[cons.Rule] = field(default_factory=list)
    session_user: dict[tuple[str, str], str] = field(default_factory=dict)
    sources: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    values: dict[str, frozenset[tuple[str, str]]] = field(default_factory=dict)
    findings: dict[int, list[Finding]] = field(default_factory=dict)
    uses_tools: bool = False
    uses_calls: bool = False
    roles: dict[str, str] = field(default_factory=dict)
    conclusions: dict[str, list[Value]] = field(default_factory=dict)  # assistant id -> values of its result sentences
    constraints: dict[int, list[tuple[int, str]]] = field(default_factory=dict)  # task -> (entry, sentence); -1: system
    order: dict[str, int] = field(default_factory=dict)  # message id -> its position
    call_names: dict[str, str] = field(default_factory=dict)  # tool call id -> function name
    numbers: dict[str, frozenset[str]] = field(default_factory=dict)  # non-assistant id -> its numbers, normalised
    number_sources: dict[str, list[str]] = field(default_factory=dict)  # number -> non-assistant ids giving it

    def add(self, e: Entry) -> list[Finding]:
        """Read one new message; returns the findings it raises (also kept in :attr:`findings`)."""
        t = self.tasks.setdefault(e.task, TaskTrack())
        msg, mid = e.msg, e.msg.id or ""
        vals = values_in(msg.content[:6000], self.config)
        for call in msg.tool_calls:
            self.uses_calls = True
            self.call_names[call.id] = call.name
            vals += [v for v in call_values(call, self.config) if v not in vals]
        self.values[mid] = frozenset((v.group, v.norm) for v in vals)
        if msg.role != Role.ASSISTANT:
            self.numbers[mid] = frozenset(num(x) for x in _NUMBER.findall(msg.content[:20000]))
            for n in self.numbers[mid]:
                self.number_sources.setdefault(n, []).append(mid)
        self.roles[mid] = "tool" if is_observation(msg) else str(msg.role)
        for v in vals:
            self.sources.setdefault((v.group, v.norm), []).append(mid)
        self.order[mid] = msg.turn or 0
        if e.constraints and msg.role in (Role.USER, Role.SYSTEM) and not is_observation(msg):
            key = -1 if msg.role == Role.SYSTEM else e.task
            self.constraints.setdefault(key, []).extend((msg.turn or 0, s) for s in e.constraints)
        found: list[Finding] = []
        if msg.role == Role.SYSTEM:
            self.system_rules += [r for s in _constraint_sentences(e) for r in cons.parse(s, mid)]
        elif msg.role == Role.TOOL or is_observation(msg):
            self.uses_tools = True
            t.results.append((mid, tool_ok(msg), msg.name or self.call_names.get(msg.tool_call_id or "", "")))
        elif msg.role == Role.USER:
            self._user(e, t, vals)
        else:
            found = self._assistant(e, t, vals)
        self.findings.setdefault(e.task, []).extend(found)
        return found

    # -- user turns ---------------------------------------------------------------------------------
    def _user(self, e: Entry, t: TaskTrack, vals: list[Value]) -> None:
        mid, text = e.msg.id or "", e.msg.content
        denied = [v for v in vals if v.group != "place" and negated(text, v.text)]
        for v in denied:  # "I meant Wednesday, not Tuesday": Tuesday is corrected away, not stated
            t.superseded.setdefault(v.group, set()).update(v.norms)
        vals = [v for v in vals if v not in denied]
        if _CORRECTION.search(text[:300]):  # "actually, make it 3 people": one new value replaces the one it restates
            for g in {v.group for v in vals} - {"place"}:  # a place has many roles (origin, destination)
                new = [v for v in vals if v.group == g]
                if len(new) == 1:
                    t.superseded.setdefault(g, set()).update(_replaced(t, g, new[0], text))
        names = _value_names(text, vals)
        for v in vals:
            for n in v.norms:
                self.session_user.setdefault((v.group, n), mid)
                if v.group == "time" and _bound_clause(text, v.text):
                    continue  # "leave after 18:00" bounds the time (a constraint), it does not name one
                t.user.setdefault(v.group, {})[n] = mid
                t.held.setdefault(v.group, {})[n] = (mid, v.text, names[v])
                t.superseded.get(v.group, set()).discard(n)
        t.user_texts.append(text.lower()[:2000])
        if t.offer is not None and len(text) < 200 and lx.AFFIRM.search(text):
            for v in t.offer[1]:
                for n in v.norms:
                    t.endorsed.setdefault(v.group, {})[n] = t.offer[0]
                    self.session_user.setdefault((v.group, n), t.offer[0])
        t.offer = None
        new_rules = [r for s in _constraint_sentences(e) for r in cons.parse(s, mid)]
        t.rules = (_restated_rules(t.rules, new_rules, vals, text, mid) if _CORRECTION.search(text[:300])
                   else t.rules + new_rules)
        t.goal = t.goal or mid
        t.last_user, t.results, t.calls = e.msg, [], []
        stated = {(v.group, n) for v in vals for n in v.norms}
        open_ = self.findings.get(e.task, [])
        self.findings[e.task] = [f for f in open_ if not (f.kind == FindingKind.GOAL_DRIFT
                                                           and (f.details.get("group"), f.details.get("norm")) in stated)]

    # -- assistant turns ----------------------------------------------------------------------------
    def _assistant(self, e: Entry, t: TaskTrack, vals: list[Value]) -> list[Finding]:
        msg, mid = e.msg, e.msg.id or ""
        out: list[Finding] = []
        for call in msg.tool_calls:
            if _NOT_ACTION.search(call.name):
                continue  # thinking, calculating, handing over: no action on the task
            cv = call_values(call, self.config)
            text = f"{call.name}({_short_args(call.arguments)})"
            out += self._drift(t, mid, cv, tool=True)
            if not _NON_WRITE.search(call.name):  # a search naming the Ritz, or a max_price, does not book it
                out += self._contradicts(t, mid, text, cv, severity=Severity.ERROR, what=f"the tool call {call.name}")
            out += self._unconfirmed_write(t, mid, call.name)
            t.calls.append(call.name)
        proposal = bool(lx.PROPOSE.search(msg.content) or _OFFER.search(msg.content))
        sents = sentences(msg.content[:4000])
        # a message that acts (a call that writes, "I'll book it now"; not a search) acts on what its other
        # sentences describe: "Hotel Roma has a room for $420 a night ... I'll book it now" books the $420
        acting = any(_writes(c.name) for c in msg.tool_calls) or any(
            lx.ACTION.search(x) and not lx.NEGATION.search(x) and not _CONDITIONAL.search(x) for x in sents)
        for sent in sents:
            if lx.NEGATION.search(sent) or _CONDITIONAL.search(sent):
                continue
            if lx.ACTION.search(sent):
                sv = values_in(sent, self.config)
                out += self._drift(t, mid, sv, tool=False)
                out += self._contradicts(t, mid, sent, sv, severity=Severity.ERROR, what="the action")
            elif (proposal or acting) and not _ACKNOWLEDGED.search(sent) and (
                    lx.PROPOSE.search(sent) or _OFFER.search(sent) or values_in(sent, self.config)):
                out += self._contradicts(t, mid, sent, values_in(sent, self.config),
                                         severity=Severity.ERROR if acting else Severity.WARNING,
                                         what="what the action books" if acting else "the proposal")
        concl = [v for sent in conclusion_sentences(msg.content) for v in values_in(sent, self.config)
                 if v.group == "money" or (v.group == "id" and not _COMPOUND.fullmatch(v.norm)
                                           and (re.search(r"[a-z@]", v.norm) or len(v.norm) >= 8))]
        if concl:
            self.conclusions[mid] = concl
        out += self._task_state(t, mid, msg.content)
        out += self._attribution(t, mid, msg.content)
        if proposal or "?" in msg.content or "？" in msg.content:
            t.offer = (mid, vals)
        return _dedupe(out)

    def _drift(self, t: TaskTrack, mid: str, vals: list[Value], tool: bool) -> list[Finding]:
        out = []
        for v in vals:
            g = v.group
            stated = t.user.get(g)
            if g not in DRIFT_GROUPS or not stated or BOUND_KEY.search(v.key):
                continue
            superseded = all(n in t.superseded.get(g, set()) for n in v.norms)
            if not superseded and (v.norm.startswith("rel:") or (g == "date" and any(n.startswith("rel:") for n in stated))):
                continue  # a relative date the verifier cannot resolve (unless it is one the user corrected away)
            if not superseded and any(n in stated or n in t.endorsed.get(g, {}) or self._from_tool(g, n) for n in v.norms):
                continue  # the user's value, an offer the user took, or the state a tool reported
            if g == "place" and not superseded and _place_known(v.norm, stated, t.user_texts):
                continue
            src = list(stated.values())[-1]
            how = "a value the user corrected since" if superseded else "a value no user turn gave"
            out.append(Finding(
                FindingKind.GOAL_DRIFT, Severity.ERROR if tool else Severity.WARNING,
                f"{'tool call' if tool else 'stated action'} uses {g} {v.text!r}, {how} (the user said "
                f"{', '.join(sorted(n.removeprefix('rel:') for n in stated))})", (mid, src), Action.ASK_USER,
                details={"group": g, "value": v.text, "norm": v.norm, "user_values": sorted(stated)}))
        return out

    def _from_tool(self, group: str, norm: str) -> bool:
        """A tool result (or an observation) of the session gave the value."""
        return any(self.roles.get(x) == "tool" for x in self.sources.get((group, norm), ()))

    def _contradicts(self, t: TaskTrack, mid: str, text: str, vals: list[Value], severity: Severity,
                     what: str) -> list[Finding]:
        out = []
        for rule in (*self.system_rules, *t.rules):
            if rule.kind == "confirm":
                continue
            why = cons.broken(rule, text, vals)
            if why:
                out.append(Finding(
                    FindingKind.CONSTRAINT_CONTRADICTED, severity,
                    f"{what} {why}, against the constraint {rule.sentence!r}", (mid, rule.source),
                    Action.ASK_USER if severity == Severity.ERROR else Action.RE_PIN,
                    details={"constraint": rule.sentence, "rule": rule.kind, "why": why}))
        return out

    def _unconfirmed_write(self, t: TaskTrack, mid: str, name: str) -> list[Finding]:
        rules = [r for r in (*self.system_rules, *t.rules) if r.kind == "confirm"]
        if not rules or not _writes(name):
            return []
        last = t.last_user
        if last is not None and len(last.content) <= 400 and (_CONFIRM_WORD.search(last.content)
                                                              or _IMPERATIVE.search(last.content)):
            return []  # a confirmation, or the user's own instruction to do it
        return [Finding(FindingKind.CONSTRAINT_CONTRADICTED, Severity.ERROR,
                        f"the write call {name} follows no user confirmation, against {rules[0].sentence!r}",
                        (mid, rules[0].source), Action.ASK_USER,
                        details={"constraint": rules[0].sentence, "rule": "confirm", "call": name})]

    def _task_state(self, t: TaskTrack, mid: str, text: str) -> list[Finding]:
        claims = [s for s in sentences(text[:4000])
                  if (lx.SUCCESS.search(s) or _TESTS_PASS.search(s)) and not lx.FAILED.search(s) and "?" not in s]
        if not claims:
            return []
        if _ACK_FAILURE.search(text[:4000]):
            return []  # the message reports the failure too ("one test fails; the others pass")
        claim = " ".join(claims)
        bad = [r for r in t.results if not r[1]]
        if t.results and not t.results[-1][1]:
            call_words = {w[:4] for w in re.findall(r"[a-z]{4,}", t.results[-1][2].lower())} - {"user", "deta", "orde", "item"}
            claim_words = {w[:4] for w in re.findall(r"[a-z]{4,}", claim.lower())}
            if all(not ok for _, ok, _ in t.results) or call_words & claim_words or _TESTS_PASS.search(claim):
                return [Finding(FindingKind.TASK_STATE_INCONSISTENT, Severity.ERROR,
                                f"reports {claims[0][:80]!r} but the last tool result ({t.results[-1][0]}) is an error",
                                (mid, t.results[-1][0]), Action.RECHECK, details={"claim": claims[0][:200]})]
        if self.uses_calls and not t.calls and not bad and _PAST_ACTION.search(claim) and t.last_user is not None:
            return [Finding(FindingKind.TASK_STATE_INCONSISTENT, Severity.WARNING,
                            f"reports {claims[0][:80]!r} but no tool call was made since the user's last turn",
                            (mid, t.last_user.id or ""), Action.RECHECK, details={"claim": claims[0][:200]})]
        return []

    def _attribution(self, t: TaskTrack, mid: str, text: str) -> list[Finding]:
        out = []
        for m in lx.ATTRIBUTION.finditer(text[:4000]):
            end = re.search(r"[.!?。！？]", text[m.end():])
            if end is not None and text[m.end() + end.start()] in "?？":
                continue  # a question asks for the confirmation, it does not claim it
            rest = text[m.end(): m.end() + (end.start() if end is not None else 200)]
            for v in values_in(rest, self.config):
                if v.group == "id":
                    continue  # a reference the assistant reports is no claim about what the user said
                key = (v.group, v.norm)
                if key in self.session_user or v.norm in t.endorsed.get(v.group, {}):
                    continue
                src = [s for s in self.sources.get(key, []) if s != mid][:1]
                origin = f"it comes from {src[0]} ({self.roles.get(src[0], '?')})" if src else "no message gave it"
                out.append(Finding(FindingKind.UNCONFIRMED_AS_CONFIRMED, Severity.WARNING,
                                   f"presents {v.text!r} as the user's word, but no user turn gave it; {origin}",
                                   (mid, *src), Action.ASK_USER, details={"value": v.text, "group": v.group}))
        return out

    def open_findings(self, task: int) -> list[Finding]:
        """The add-time findings of a task still open."""
        return list(self.findings.get(task, []))


_BOUND_WORDS = re.compile(r"(?i)\b(?:after|before|by|no later than|no earlier than|later than|earlier than|until|"
                          r"not after|not before)\b|以后|之后|之前|以前|前")


def _bound_clause(text: str, value_text: str) -> bool:
    """The value stands in a clause that bounds it ("after 18:00", "6点之前")."""
    i = text.find(value_text)
    return i >= 0 and bool(_BOUND_WORDS.search(text[max(0, i - 20): i + len(value_text) + 4]))


#: Words that name no value: articles, pronouns, prepositions, fillers, change and correction words
#: ("actually, change the check-in to June 14" names the check-in, nothing else).
_UNNAMING = frozenset("""a an the it its my our your me us i we you this that these those please and or but to from on
at in into for of by with as is are be was were will would can could want need like make change changed move switch
set update actually instead rather meant mean sorry correction wait no not yes ok okay so just also then now""".split())
_PARTICLE = re.compile(r"\b(check|pick|drop|sign|log|take)[\s-]+(in|out|up|off)\b")  # check-in: one word, checkin
_CLAUSE_END = re.compile(r"[,;:.!?，。；：！？、\n]")
_NAME_BEFORE, _NAME_AFTER = 20, 8  # characters of a value's clause read for its name, before and after it


def _name_words(text: str) -> frozenset[str]:
    """The words of ``text`` that can name a value: the stems of its English words less
    :data:`_UNNAMING` (``check in`` and ``check-in`` read as one word, ``checkin``), and the character
    pairs of its Chinese runs (入住, 退房)."""
    low = _PARTICLE.sub(r"\1\2", text.lower())
    words = {porter_stem(w) for w in re.findall(r"[a-z]+", low) if w not in _UNNAMING}
    for run in re.findall(r"[\u4e00-\u9fff]+", low):
        words |= {run[i:i + 2] for i in range(len(run) - 1)}
    return frozenset(words)


def _value_names(text: str, vals: list[Value]) -> dict[Value, frozenset[str]]:
    """The words naming each value of ``vals`` in ``text`` (:func:`_name_words`): those of its clause
    before it, after the value before it ("check in June 12, check out June 16": ``checkin``, then
    ``checkout``; "住到6月16日"), and after it when no other value follows in the clause
    ("6月12日入住")."""
    spots = sorted(((text.find(v.text), v) for v in vals if v.text and v.text in text), key=lambda x: x[0])
    out = dict.fromkeys(vals, frozenset())
    for i, (at, v) in enumerate(spots):
        end = at + len(v.text)
        start = spots[i - 1][0] + len(spots[i - 1][1].text) if i else 0
        before = _CLAUSE_END.split(text[start:at])[-1]
        if len(before) > _NAME_BEFORE:  # the last characters, from a word's start
            before = re.sub(r"^[A-Za-z]+", "", before[-_NAME_BEFORE:])
        stop = _CLAUSE_END.search(text, end)  # the clause's end, not a split of all the rest per value
        after = text[end:stop.start() if stop else len(text)]
        if i + 1 < len(spots) and end + len(after) > spots[i + 1][0]:
            after = ""  # the words before the next value name that one
        out[v] = _name_words(before) | _name_words(after[:_NAME_AFTER])
    return out


def _replaced(t: TaskTrack, group: str, new: Value, text: str) -> set[str]:
    """The norms of ``group`` that the correction ``text``, giving ``new``, replaces: the user's one
    current value of the group; of several (a check-in and a check-out date), the one whose name
    (:func:`_value_names`) the correction's clause shares the most words with ("change the check-in
    to June 14"), and none when no name, or more than one, does best (a value the user still holds is
    not corrected away)."""
    gone = t.superseded.get(group, set())
    held: dict[tuple[str, str, frozenset[str]], set[str]] = {}
    for n, key in t.held.get(group, {}).items():
        if n not in gone and n not in new.norms:
            held.setdefault(key, set()).add(n)
    if len(held) <= 1:
        return set().union(*held.values())
    clause = next((c for c in _CLAUSE_END.split(text) if new.text in c), text)
    words = _name_words(clause)
    shared = {key: len(key[2] & words) for key in held}
    best = max(shared.values())
    top = [key for key, k in shared.items() if k == best]
    return held[top[0]] if best and len(top) == 1 else set()


def _place_known(place: str, stated: dict[str, str], texts: list[str]) -> bool:
    """A place the user named, allowing for longer or shorter forms (``广州南站`` for 广州, ``Seattle, WA``)."""
    head = place[:2] if re.match(r"[\u4e00-\u9fff]", place) else place.split()[0]
    return any(place in x or x in place for x in stated) or any(place in x or head in x for x in texts)


def _dedupe(findings: list[Finding]) -> list[Finding]:
    seen: set[tuple[str, str, str]] = set()
    out = []
    for f in findings:
        k = (*f.key, f.details.get("norm", f.details.get("constraint", "")))
        if k not in seen:
            seen.add(k)
            out.append(f)
    return out


def conclusion_sentences(text: str) -> list[str]:
    """The sentences of an assistant message that state a result (a success report, a reference, a total)."""
    return [s for s in sentences(text[:4000]) if (lx.SUCCESS.search(s) or _CONCLUSION.search(s)) and "?" not in s]


def _restated_rules(rules: list[cons.Rule], new: list[cons.Rule], vals: list[Value], text: str,
                    mid: str) -> list[cons.Rule]:
    """The task's user rules after the correction ``mid`` (``text``, its values ``vals``, its rules
    ``new``): a bound the correction restates is replaced, so the verifier holds the agent to the
    limit the user set last, not to one the user lifted. A new bound replaces the earlier bound of its
    kind, group and unit that it restates ("my hotel budget is €210 per night", then "actually, change
    the hotel budget to €240 per night"); without a new bound, the one number of a group the turn
    names ("actually, make it €240") becomes the bound of the earlier rule it restates, with the
    turn's sentence that holds it. A correction restates a rule when it is the only candidate and the
    two share a content word or the correction has none ("make it €240", 预算改成每晚700元以内), or when it shares the most
    content words with it; another limit ("at most $60 for the dinner" beside "$500 for the flight")
    stays as it was."""
    out = list(rules)
    for r in new:
        if r.bound is not None:
            old = _restated(out, r.sentence, r.group, r.kind, r.per)
            if old is not None:
                out.remove(old)
    if not any(r.bound is not None for r in new):
        for g in ("money", "people"):
            now = [v for v in vals if v.group == g]
            if len(now) != 1:
                continue
            sent = next((x for x in sentences(text) if now[0].text in x), text)
            old = _restated(out, sent, g)
            if old is not None:
                out[out.index(old)] = replace(old, sentence=sent, source=mid, bound=float(now[0].norm))
    return out + new


#: Words that say nothing of what a bound limits: units, bound words, change verbs.
_LIMIT_WORDS = frozenset("""actually make change changed instead rather please the and for per with each night nights
person people day days room rooms ticket tickets most least more less than under over budget limit maximum minimum max
min total cost costs price that this it its is are be to of at no not only""".split())
_ZH_LIMIT_WORDS = frozenset(["每晚", "每人", "每天", "不超", "超过", "改成", "改为", "最多", "至少", "人均", "其实", "预算"])
#: Chinese words a bound's correction is made of besides the bound (change verbs, fillers, limit and
#: unit words), taken out of a run before its character pairs are read: "不对，预算改成每晚700元以内"
#: names nothing the bound limits, so it restates the one bound of its kind.
_ZH_FILLER = re.compile("|".join(sorted(
    "不对 其实 预算 改成 改为 改到 改一下 一下 可以 提高到 提高 放宽到 放宽 调整为 调整 调到 以内 以下 每晚 每人 每天 "
    "不超过 不能超过 别超过 超过 最多 至少 人均 元 块 吧 呢 啊 了 的 到 再".split(), key=len, reverse=True)))


def _content_words(sentence: str) -> set[str]:
    """Lower-cased English words of three letters or more and Chinese character pairs of ``sentence``,
    less :data:`_LIMIT_WORDS` (a hotel budget and a tour budget share "budget", not what they limit)."""
    low = sentence.lower()
    words = {w for w in re.findall(r"[a-z]{3,}", low) if w not in _LIMIT_WORDS}
    for run in re.findall(r"[\u4e00-\u9fff]+", sentence):
        for part in _ZH_FILLER.split(run):
            words |= {part[i:i + 2] for i in range(len(part) - 1)} - _ZH_LIMIT_WORDS
    return words


def _restated(rules: list[cons.Rule], sentence: str, group: str, kind: str | None = None,
              per: str | None = None) -> cons.Rule | None:
    """The bound of ``rules`` (of ``group``, and of ``kind`` and unit ``per`` when given) that
    ``sentence`` restates (see :func:`_restated_rules`), or ``None``."""
    cands = [r for r in rules if r.bound is not None and r.group == group and (kind is None or r.kind == kind)
             and (per is None or r.per == per)]
    if not cands:
        return None
    words = _content_words(sentence)
    shared = [len(words & _content_words(r.sentence)) for r in cands]
    best = max(shared)
    if len(cands) == 1:
        return cands[0] if best or not words else None
    return cands[shared.index(best)] if best and shared.count(best) == 1 else None
