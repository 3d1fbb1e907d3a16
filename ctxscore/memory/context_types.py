"""Context types (the second design note): what part of the agent's context a message or fact is.

Six types, beside the value category of the scorer:

===========  ====================================================================================
type         content
===========  ====================================================================================
instruction  system prompt, business spec, standards: how to think, what may and may not be done
goal         the user's final goal and the current sub-goal
user         the user's profile and past decisions (identity, preferences, choices)
task         the current task: steps done, steps to do, the assistant's plans and reports
tool         tool inputs (tool calls, an agent's commands) and tool outputs (results, observations)
constraint   hard constraints (never, must, at most, 不要, 必须 ...) and soft ones (slot values, budgets)
===========  ====================================================================================

:class:`RuleTypeClassifier` decides from the role and the cues of :mod:`ctxscore.memory.lexicon`
(probabilities over the six types, a primary type and the secondary types present, e.g. a goal
message holding a constraint sentence). :class:`TypeHead` is the learned head (trained by
``python -m training.context_types`` on weak labels from the corpora, packaged in its own folder
``ctxscore/models/context_types``); :func:`blend` mixes both for user and assistant messages (system
and tool messages keep the rule's answer). The window sections built on the types live in
:mod:`ctxscore.memory.typed_sections`.

Each type has its own compression rule in the window (:data:`COMPRESSION_RULES`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelLoadError
from ..messages import Message, Role
from . import lexicon as lx


class ContextType(StrEnum):
    """The six context types (see the module docstring)."""

    INSTRUCTION = "instruction"
    GOAL = "goal"
    USER = "user"
    TASK = "task"
    TOOL = "tool"
    CONSTRAINT = "constraint"


#: The types in a fixed order (the columns of probabilities and of the head's classes).
CONTEXT_TYPES: tuple[ContextType, ...] = tuple(ContextType)

#: How the window treats each type (what its section or tier keeps).
COMPRESSION_RULES: dict[ContextType, str] = {
    ContextType.INSTRUCTION: "verbatim: system messages and the active task's instructions are pinned",
    ContextType.CONSTRAINT: "verbatim: every hard-constraint sentence byte-exact (the constraints section, every "
                            "compressed form); the current budget is one of them",
    ContextType.GOAL: "verbatim: the original goal and the current sub-goal as their own sentences (goal section)",
    ContextType.USER: "structured conclusions: profile items with type, value, scope, level and stability; what the "
                      "user confirmed is quoted verbatim (profile section)",
    ContextType.TASK: "summaries: the tier policy's structured summary or compression; one line per step done "
                      "(goal section)",
    ContextType.TOOL: "key fields: JSON keys and values kept, prose dropped (structured tier); low relevance: an "
                      "index entry (archive stub) only",
}

#: Rule signals, in the fixed order the learned head reads them. A packaged head reads the signals named
#: in its config (:attr:`HeadSpec.signal_names`): signals added after it was trained (``navigation``,
#: ``small_talk``, ``standing``) are read by the rules only until the head is retrained.
SIGNAL_NAMES: tuple[str, ...] = (
    "role_system", "role_user", "role_assistant", "role_tool", "tool_calls", "observation", "task_statement",
    "first_user", "constraint_share", "constraint_any", "bound", "intent", "question", "preference", "profile",
    "affirm", "reject", "plan", "success", "failure", "short", "long", "values", "zh", "navigation", "small_talk",
    "standing",
)

_OBSERVATION = re.compile(r"<returncode>|^\s*<output|^\s*Observation:", re.MULTILINE)
_BOUND = re.compile(r"(?i)\b(?:at most|no more than|not more than|under|below|maximum|max|up to|at least|minimum|"
                    r"no later than|no earlier than|before|after|by|within|budget)\b[^.;\n]{0,20}\d|"
                    r"(?:不超过|最多|以内|至少|不低于|预算|之前|以前|之后|以后)[^，。；\n]{0,8}\d|\d[^，。；\n]{0,8}(?:以内|以下|以上|之前|以后)")
_QUESTION = re.compile(r"[?？]|吗[。！!]?\s*$")
_CJK = re.compile(r"[\u3400-\u9fff]")
#: A navigation cue: the next / previous page or batch of what is shown, more of it, go on.
_NAV_CORE = re.compile(r"(?i)\b(?:next|previous|prev|following|more)(?: (?:page|pages|few|batch|set|\d+))?\b|"
                       r"\b(?:continue|keep going|carry on|go on)\b|下一页|上一页|下一批|换一批|更多|继续|再来[一几]?[个些批页]")
#: Words a navigation request may hold beside its cue ("Could you show me the next page of hotels, please?").
_NAV_FILLER = re.compile(r"(?i)\b(?:please|pls|thanks|thank you|ok(?:ay)?|sure|yes|yeah|great|alright|and|now|then|can|"
                         r"could|would|will|you|show|give|get|load|go|to|on|me|us|let'?s|see|the|a|some|ones?|"
                         r"results?|options?|items?|of \w+)\b|[请吧呗给我看显示翻再的]")
#: Greetings and thanks, nothing else ("Hi!", "Hello there", "Thanks!", 你好).
_SMALL_TALK = re.compile(r"(?i)^\W*(?:(?:hi|hello|hey|hiya|howdy|good (?:morning|afternoon|evening)|greetings|there|all|"
                         r"everyone|again|thanks?|thank you|thx|cheers|你好|您好|嗨|哈喽|谢谢|早上好|下午好|晚上好|在吗)\W*)+$")
#: A standing instruction: how to handle a kind of thing from now on, beside the task. It needs either a
#: time-scope cue ("from now on", "always", "whenever", "going forward", "in future", "by default",
#: 以后都, 今后, 一律, 每次) or a stream of future items: "all"/"every"/"each" + the kind of item with no
#: article or possessive ("Send all confirmations to john@example.com", "every receipt"), or marked
#: future ("all future emails", "any further updates"). "All the emails", "all my invoices" name an
#: existing set (a one-off request: "Can you summarize all the emails from yesterday?"), and so does a
#: bare "all emails" scoped to a day or the past ("all tickets ... for Friday", "all emails from
#: yesterday").
_STANDING_ITEMS = (r"(?:confirmation|e-?mail|message|receipt|ticket|invoice|update|notification|document|"
                   r"itinerar(?:y|ie)|repl(?:y|ie)|answer|response|price|amount|quote)")
_ONE_OFF_SCOPE = (r"(?![^.;!?\n]{0,40}\b(?:yesterday|today|tonight|last \w+|this (?:morning|afternoon|evening|week|month)|"
                  r"so far|\w+ ago|earlier|(?:mon|tues|wednes|thurs|fri|satur|sun)day)\b)")
_STANDING = re.compile(
    r"(?im)\b(?:from now on|going forward|from here on|for the rest of (?:the|this|our)|by default|whenever|"
    r"in (?:the )?future|(?:every|each) time\b|"
    r"(?:all|every|each|any) (?:(?:my|our) )?(?:future|further|upcoming|incoming) (?:booking |travel |order )?"
    + _STANDING_ITEMS + r"s?\b|"
    r"all (?:booking |travel |order )?" + _STANDING_ITEMS + r"s\b" + _ONE_OFF_SCOPE + "|"
    r"(?:every|each) (?:booking |travel |order )?" + _STANDING_ITEMS + r"\b" + _ONE_OFF_SCOPE + ")|"
    r"(?:^\W*|[.!?;:,]\s*|\bplease\s+|\band\s+)always\b|"
    r"以后(?:都|每次|一律)|今后|往后|从现在起|从今以后|一律|每次都?(?:请|记得|用|发|按|抄送|转)|每当|统一(?:用|发|按|寄)|所有[^，。；！？\n]{0,8}都(?:发|寄|用|按|抄送|转)")
#: Longest navigation request, in characters.
_NAV_CHARS = 80


def navigation(text: str) -> bool:
    """Whether a message only asks to move through what is shown ("Next page please.", "Show me more.",
    "Continue", 下一页, 继续): a navigation cue and nothing but politeness and filler words around it,
    in at most :data:`_NAV_CHARS` characters ("Show me more hotels near the beach" is a request)."""
    text = text.strip()
    if not text or len(text) > _NAV_CHARS or not _NAV_CORE.search(text):
        return False
    return not re.search(r"\w", _NAV_FILLER.sub(" ", _NAV_CORE.sub(" ", text)))


def small_talk(text: str) -> bool:
    """Whether a message is a greeting or thanks and nothing else ("Hi!", "Hello there", 你好)."""
    return bool(_SMALL_TALK.match(text.strip()))
_VALUE = re.compile(r"\d|[A-Z][a-z]+|[$€£¥￥]")
_RULE_CONFIDENCE = 0.95


@dataclass(frozen=True, slots=True)
class TypePrediction:
    """The context type of one message.

    Attributes:
        type: the primary :class:`ContextType`.
        probs: probability per type (the six values of :data:`CONTEXT_TYPES`, summing to 1).
        source: ``"rules"``, ``"learned"`` or ``"blend"``.
        also: other types present in the message (a goal message holding a hard constraint ...).
        rule: the rule that decided (for explanations), e.g. ``"role:system"``.
    """

    type: ContextType
    probs: dict[str, float]
    source: str = "rules"
    also: tuple[ContextType, ...] = ()
    rule: str = ""

    @property
    def confidence(self) -> float:
        """The probability of the primary type."""
        return self.probs.get(self.type, 0.0)

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return {"type": str(self.type), "probs": {k: round(v, 4) for k, v in self.probs.items()},
                "source": self.source, "also": [str(t) for t in self.also], "rule": self.rule}


def type_signals(msg: Message, constraints: Sequence[str] = (), first_user: bool = False) -> dict[str, float]:
    """The rule signals of one message (see :data:`SIGNAL_NAMES`), each in [0, 1].

    Args:
        msg: the message.
        constraints: its hard-constraint sentences (:attr:`ctxscore.window.history.Entry.constraints`).
        first_user: it is the first user message of its task (:class:`~ctxscore.memory.typed_sections.ContextTypes`
            passes over greetings: the task's first user message that is no greeting).
    """
    text = msg.content or ""
    head = text[:1500]
    n = max(1, len(text.strip()))
    share = min(1.0, sum(len(s) for s in constraints) / n) if constraints else 0.0
    user = msg.role == Role.USER
    return {
        "role_system": float(msg.role == Role.SYSTEM), "role_user": float(user),
        "role_assistant": float(msg.role == Role.ASSISTANT), "role_tool": float(msg.role == Role.TOOL),
        "tool_calls": float(bool(msg.tool_calls)),
        "observation": float(user and bool(_OBSERVATION.search(head[:300]))),
        "task_statement": float(bool(lx.TASK_STATEMENT.search(head))),
        "first_user": float(first_user and user), "constraint_share": share, "constraint_any": float(bool(constraints)),
        "bound": float(bool(_BOUND.search(head))), "intent": float(bool(lx.INTENT.search(head))),
        "question": float(bool(_QUESTION.search(head[-300:]))),
        "preference": float(bool(lx.PREF_POS.search(head) or lx.PREF_NEG.search(head))),
        "profile": float(bool(lx.BASIC.search(head) or lx.RELATION.search(head) or lx.ABILITY.search(head)
                              or lx.LIFE_GOAL.search(head) or lx.DECISION_STYLE.search(head))),
        "affirm": float(len(text) < 120 and bool(lx.AFFIRM.search(text))),
        "reject": float(len(text) < 200 and bool(lx.REJECT.search(text))),
        "plan": float(bool(lx.PLAN.search(head))), "success": float(bool(lx.SUCCESS.search(head))),
        "failure": float(bool(lx.FAILED.search(head))), "short": float(len(text) < 40), "long": float(len(text) > 1000),
        "values": min(1.0, len(_VALUE.findall(head)) / 6), "zh": float(bool(_CJK.search(head))),
        "navigation": float(user and navigation(text)), "small_talk": float(user and small_talk(text)),
        "standing": float(user and bool(_STANDING.search(head))),
    }


def _probs(main: ContextType, conf: float, also: Sequence[ContextType] = ()) -> dict[str, float]:
    """A distribution with ``conf`` on ``main``, 60% of the rest on ``also`` and the remainder spread."""
    rest = 1.0 - conf
    out = {str(t): 0.0 for t in CONTEXT_TYPES}
    out[main] = conf
    others = [t for t in CONTEXT_TYPES if t != main and t not in also]
    for t in also:
        out[t] += rest * 0.6 / len(also)
    spread = rest * (0.4 if also else 1.0) / max(1, len(others))
    for t in others:
        out[t] += spread
    return out


class RuleTypeClassifier:
    """The rule path: role first, then the cues of :mod:`ctxscore.memory.lexicon` (see :meth:`decide`)."""

    def classify(self, msg: Message, constraints: Sequence[str] = (), first_user: bool = False,
                 signals: Mapping[str, float] | None = None) -> TypePrediction:
        """The context type of ``msg`` (``constraints``: its hard-constraint sentences; ``first_user``: the
        first user message of its task; ``signals``: precomputed :func:`type_signals`)."""
        s = signals if signals is not None else type_signals(msg, constraints, first_user)
        main, conf, also, rule = self.decide(s)
        return TypePrediction(main, _probs(main, conf, also), "rules", tuple(also), rule)

    @staticmethod
    def decide(s: Mapping[str, float]) -> tuple[ContextType, float, list[ContextType], str]:
        """(primary type, confidence, secondary types, rule name) from the signals, in this order:
        system -> instruction; tool role, tool calls, agent observations -> tool; for user messages: a
        task statement -> goal; constraint sentences over half the text -> constraint; a navigation
        request ("Next page please.", :func:`navigation`) -> task (it moves the current step on and
        states no goal); the task's opening message (its first user message that is no greeting)
        with a request, or of at least 40 characters naming three values or more (places, dates,
        amounts: "My wife and I are flying from Dublin to Barcelona in June."), -> goal, with user as
        a secondary type when it also states a preference or a profile item ("We're planning a family
        trip to Barcelona in June; my wife loves architecture ...") and constraint when it also gives
        a standing instruction; a profile or preference statement -> user; a short affirmation or
        rejection -> user (a decision); a standing instruction, i.e. how to handle a kind of thing
        from now on, beside the task ("Send all confirmations to john@example.com please.", "Always
        quote prices in EUR.", 以后都用中文回复; not a question without a request, nor a one-off request
        on an existing set: "Please forward all the invoices to accounting.", see :data:`_STANDING`)
        -> constraint (soft: a side instruction is no sub-goal); a request, a question or the task's opening
        message -> goal; a greeting or thanks alone -> task; other values -> constraint (soft); else
        task. Assistant messages -> task. Signals missing from ``s`` count as 0."""
        T = ContextType
        cons = [T.CONSTRAINT] if s["constraint_any"] else []
        if s["role_system"]:
            return T.INSTRUCTION, _RULE_CONFIDENCE, cons, "role:system"
        if s["role_tool"] or s["tool_calls"] or s["observation"]:
            return T.TOOL, _RULE_CONFIDENCE, [], "role:tool" if s["role_tool"] else "tool_io"
        if s["role_user"]:
            if s["task_statement"]:
                return T.GOAL, 0.9, cons, "task_statement"
            if s["constraint_share"] >= 0.5:
                return T.CONSTRAINT, 0.8, [T.GOAL] if s["intent"] else [], "constraint_sentences"
            if s.get("navigation"):
                return T.TASK, 0.7, [], "navigation"
            opening = bool(s["first_user"]) and not s.get("small_talk")
            if opening and (s["intent"] or (not s["short"] and s["values"] >= 0.5)):
                also = [*cons, *([T.CONSTRAINT] if s.get("standing") and not cons else []),
                        *([T.USER] if s["preference"] or s["profile"] else [])]
                return T.GOAL, 0.7, also, "first_request"
            if s["preference"] or s["profile"]:
                return T.USER, 0.75, cons, "profile_statement"
            if (s["affirm"] or s["reject"]) and not s["intent"]:
                return T.USER, 0.6, [], "decision"
            if s.get("standing") and (s["intent"] or not s["question"]):
                return T.CONSTRAINT, 0.65, [], "standing_instruction"
            if s["intent"] or s["question"] or opening:
                return T.GOAL, 0.65, cons, "request"
            if s.get("small_talk"):
                return T.TASK, 0.6, [], "small_talk"
            if s["constraint_any"] or s["bound"] or s["values"] >= 0.3:
                return T.CONSTRAINT, 0.5, [], "values"
            return T.TASK, 0.4, [], "user_other"
        if s["plan"] or s["success"]:
            return T.TASK, 0.7, [], "plan_or_report"
        return T.TASK, 0.55, [], "assistant"


# -- the learned head --------------------------------------------------------------------------------
#: Folder of the packaged head.
DEFAULT_HEAD_DIR = Path(__file__).resolve().parents[1] / "models" / "context_types"
HEAD_FORMAT_VERSION = 1
HEAD_FILE = "head.skops"
#: Characters of the text the lexical features read (the head and the tail, as the scorer's features).
HEAD_TEXT_CHARS = 600


@dataclass(frozen=True)
class HeadSpec:
    """The head's feature layout: ``[char 1-3-gram hashes (lexical_dim) | role one-hot (4) | signals]``.

    Attributes:
        lexical_dim: buckets of the hashed character n-grams (L2-normalised counts).
        signal_names: the rule signals, in order (:data:`SIGNAL_NAMES`).
    """

    lexical_dim: int = 1024
    signal_names: tuple[str, ...] = SIGNAL_NAMES

    @property
    def n_features(self) -> int:
        """Columns of a feature row."""
        return self.lexical_dim + 4 + len(self.signal_names)

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return {"lexical_dim": self.lexical_dim, "signal_names": list(self.signal_names)}


def _lexical_text(text: str) -> str:
    return text if len(text) <= HEAD_TEXT_CHARS else text[: HEAD_TEXT_CHARS // 2 + 100] + " … " + text[-(HEAD_TEXT_CHARS // 2 - 100):]


def head_features(messages: Sequence[Message], signals: Sequence[Mapping[str, float]], spec: HeadSpec) -> np.ndarray:
    """Feature rows ``(n, spec.n_features)`` float32 for the head (the one featurizer: training and run
    time both call it). ``signals[i]`` are :func:`type_signals` of ``messages[i]``."""
    from sklearn.feature_extraction.text import HashingVectorizer  # noqa: PLC0415 - scikit-learn is a core dependency

    n = len(messages)
    vec = HashingVectorizer(n_features=spec.lexical_dim, analyzer="char_wb", ngram_range=(1, 3),
                            alternate_sign=False, norm="l2")
    lex = vec.transform([_lexical_text(m.text()) for m in messages]).toarray() if n else np.zeros((0, spec.lexical_dim))
    roles = np.array([[float(m.role == r) for r in (Role.SYSTEM, Role.USER, Role.ASSISTANT, Role.TOOL)] for m in messages],
                     dtype=np.float64).reshape(n, 4)
    sig = np.array([[float(s.get(k, 0.0)) for k in spec.signal_names] for s in signals], dtype=np.float64).reshape(
        n, len(spec.signal_names))
    return np.hstack([lex, roles, sig]).astype(np.float32)


@dataclass
class TypeHead:
    """The learned context-type head: a scikit-learn classifier over :func:`head_features`.

    Attributes:
        estimator: fitted, with ``predict_proba`` and ``classes_`` (type names).
        spec: the feature layout.
        config: the packaged config (metrics, training data), or empty.
    """

    estimator: Any
    spec: HeadSpec = field(default_factory=HeadSpec)
    config: dict[str, Any] = field(default_factory=dict)

    def predict_proba(self, messages: Sequence[Message], signals: Sequence[Mapping[str, float]]) -> list[dict[str, float]]:
        """Probability per type for each message (the six types; a type the head never saw gets 0)."""
        if not messages:
            return []
        raw = np.asarray(self.estimator.predict_proba(head_features(messages, signals, self.spec)), dtype=np.float64)
        classes = [str(c) for c in self.estimator.classes_]
        out = []
        for row in raw:
            d = {str(t): 0.0 for t in CONTEXT_TYPES}
            for c, p in zip(classes, row, strict=True):
                d[c] = float(p)
            out.append(d)
        return out

    def save(self, folder: str | Path, metrics: Mapping[str, Any] | None = None) -> Path:
        """Write ``config.json`` and ``head.skops`` (with its sha256) to ``folder``; returns it."""
        import skops.io as sio  # noqa: PLC0415

        from ..scoring.package import sha256_file  # noqa: PLC0415

        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        sio.dump(self.estimator, out / HEAD_FILE)
        cfg = {"format_version": HEAD_FORMAT_VERSION, "labels": [str(t) for t in CONTEXT_TYPES],
               "weight": float(self.config.get("weight", HEAD_WEIGHT)),
               "feature_spec": self.spec.to_dict(), "files": {HEAD_FILE: sha256_file(out / HEAD_FILE)},
               "metrics": dict(metrics or {})}
        (out / "config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        return out

    @classmethod
    def load(cls, folder: str | Path = DEFAULT_HEAD_DIR) -> TypeHead:
        """Read a packaged head (hash and skops types verified).

        Raises:
            ModelLoadError: missing or unreadable files, another format version, a sha256 mismatch, a
                type outside the skops allowlist, or a head whose width differs from its spec.
        """
        from ..scoring.package import load_skops, sha256_file  # noqa: PLC0415

        folder = Path(folder)
        try:
            cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"no context-type head at {folder}: {exc}; train one with "
                                 "`python -m training.context_types --out DIR`") from None
        if cfg.get("format_version") != HEAD_FORMAT_VERSION:
            raise ModelLoadError(f"{folder}/config.json: format_version {cfg.get('format_version')!r}, expected "
                                 f"{HEAD_FORMAT_VERSION}; retrain with `python -m training.context_types`")
        digest = sha256_file(folder / HEAD_FILE) if (folder / HEAD_FILE).is_file() else None
        if digest is None or digest != cfg.get("files", {}).get(HEAD_FILE):
            raise ModelLoadError(f"{folder / HEAD_FILE} is missing or its sha256 differs from config.json; refusing "
                                 "to load it (retrain with `python -m training.context_types`)")
        spec = HeadSpec(int(cfg["feature_spec"]["lexical_dim"]), tuple(cfg["feature_spec"]["signal_names"]))
        est = load_skops(folder / HEAD_FILE)
        if getattr(est, "n_features_in_", spec.n_features) != spec.n_features:
            raise ModelLoadError(f"{folder}: the head expects {est.n_features_in_} features, its spec gives {spec.n_features}")
        return cls(est, spec, cfg)


def load_default_head() -> TypeHead | None:
    """The packaged head, or ``None`` when it is absent or unreadable (the rules are used then)."""
    try:
        return TypeHead.load(DEFAULT_HEAD_DIR)
    except ModelLoadError:
        return None


#: Weight of the learned head in :func:`blend` (rules get ``1 - HEAD_WEIGHT``) when the head's config
#: names none (a packaged head carries the weight chosen on the dev split, ``config["weight"]``).
HEAD_WEIGHT = 0.3


def blend(rule: TypePrediction, learned: Mapping[str, float] | None, weight: float = HEAD_WEIGHT) -> TypePrediction:
    """Mix the rule prediction with the head's probabilities (``weight`` on the head, in [0, 1]).

    Rule decisions made on the role (system, tool input and output) are kept: the head does not
    overrule what the message's role already says.
    """
    if learned is None or rule.rule in ("role:system", "role:tool", "tool_io") or weight <= 0:
        return rule
    probs = {t: (1 - weight) * rule.probs.get(t, 0.0) + weight * float(learned.get(t, 0.0)) for t in rule.probs}
    total = sum(probs.values()) or 1.0
    probs = {t: p / total for t, p in probs.items()}
    main = ContextType(max(probs, key=lambda t: probs[t]))
    also = tuple(t for t in rule.also if t != main)
    if main != rule.type and rule.type not in also and probs[rule.type] >= 0.25:
        also = (*also, rule.type)
    return TypePrediction(main, probs, "blend" if weight < 1 else "learned", also, rule.rule)

