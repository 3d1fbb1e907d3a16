"""ctxscore: scored, tiered context windows for long LLM-agent conversations.

Quick use::

    from ctxscore import ContextManager
    cm = ContextManager(budget=8000)
    cm.extend(openai_messages)
    window = cm.build(query="what is the booking reference?")
    client.chat.completions.create(model=..., messages=window.messages)

Imports only numpy, tiktoken, bpe-openai, scikit-learn and skops (no torch, mlflow or datasets).
"""

from .config import OnOverflow, Policy, ValueFactors
from .errors import BudgetError, ConfigError, CtxScoreError, InputError, ModelLoadError
from .messages import CATEGORIES, Category, Message, Tier
from .scoring.base import Prediction, Scorer
from .scoring.rules import RuleClassifier, RuleConfig, extract_entities
from .tokens import TokenCounter
from .window.manager import ContextManager
from .window.result import ContextWindow, Decision

__version__ = "0.1.0"

__all__ = [
    "CATEGORIES",
    "BudgetError",
    "Category",
    "ConfigError",
    "ContextManager",
    "ContextWindow",
    "CtxScoreError",
    "Decision",
    "InputError",
    "Message",
    "ModelLoadError",
    "OnOverflow",
    "Policy",
    "Prediction",
    "RuleClassifier",
    "RuleConfig",
    "Scorer",
    "Tier",
    "TokenCounter",
    "ValueFactors",
    "extract_entities",
]
