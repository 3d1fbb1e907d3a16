"""Exceptions raised by ctxscore. Every message says what was wrong and how to fix it."""


class CtxScoreError(Exception):
    """Base class of all ctxscore errors."""


class InputError(CtxScoreError, ValueError):
    """Malformed input: bad JSON/JSONL, unknown role, empty or oversized content, bad encoding."""


class BudgetError(CtxScoreError, ValueError):
    """A token budget that cannot hold the pinned content (the message gives the figures)."""


class ConfigError(CtxScoreError, ValueError):
    """A missing, unreadable or invalid rule file or configuration."""


class ModelLoadError(CtxScoreError, OSError):
    """A missing, corrupt or tampered packaged-scorer folder."""


class StoreError(CtxScoreError):
    """The store cannot be opened, read or written (a damaged or foreign file, a full disk, a lost
    server); the message says which and what to do. Nothing already stored is changed by the failure."""
