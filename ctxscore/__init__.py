"""ctxscore: scored, tiered context windows for long LLM-agent conversations.

Quick use::

    from ctxscore import ContextManager
    cm = ContextManager(budget=8000)
    cm.extend(openai_messages)
    window = cm.build(query="what is the booking reference?")
    client.chat.completions.create(model=..., messages=window.messages)

Imports only numpy, tiktoken, bpe-openai, scikit-learn and skops (no torch, mlflow or datasets).
"""

from .errors import BudgetError, ConfigError, CtxScoreError, InputError, ModelLoadError
from .manager import ContextManager, Policy
from .rules import RuleClassifier, RuleConfig, extract_entities
from .scorer import Prediction, Scorer
from .tokens import TokenCounter
from .types import CATEGORIES, Category, ContextWindow, Decision, Message, Tier

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
    "Policy",
    "Prediction",
    "RuleClassifier",
    "RuleConfig",
    "Scorer",
    "Tier",
    "TokenCounter",
    "extract_entities",
]
