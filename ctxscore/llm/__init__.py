"""The LLM path (extra ``llm``): an OpenAI-compatible client, and the compressor, classifier and query
writer built on it. Nothing here runs unless you make an :class:`LLMClient`.

Importing this package without the ``openai`` package raises :class:`ImportError` with the install
hint (``pip install 'ctxscore[llm]'``).
"""

from .classifier import DualPathScorer, LLMClassifier
from .client import Completion, LLMClient, LLMError, LLMResponseError, Usage
from .compressor import LLMCompressor, SummaryLayer, meaning_problems
from .queries import LLMQueryWriter, Queries

__all__ = [
    "Completion", "DualPathScorer", "LLMClassifier", "LLMClient", "LLMCompressor", "LLMError", "LLMQueryWriter",
    "LLMResponseError", "Queries", "SummaryLayer", "Usage", "meaning_problems",
]
