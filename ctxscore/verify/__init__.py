"""The context verifier: typed findings about drift in the window (see :mod:`ctxscore.verify.verifier`)."""

from .findings import Action, Finding, FindingKind, Severity
from .verifier import ContextVerifier

__all__ = ["Action", "ContextVerifier", "Finding", "FindingKind", "Severity"]
