"""Imports of the optional extras (``llm``, ``serve``, LangChain), each failing with an install hint."""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """Import ``module`` or raise :class:`ImportError` that names the extra to install.

    Args:
        module: the module to import (``"openai"``, ``"fastapi"`` ...).
        extra: the ctxscore extra that provides it (``"llm"``, ``"serve"``, ``"langchain"``).
        purpose: what needs it, for the message (``"ctxscore.llm"``).

    Raises:
        ImportError: the module is not installed; the message says ``pip install 'ctxscore[extra]'``
            (in a checkout: ``pip install -e '.[extra]'``).
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{purpose} needs the package {module.split('.')[0]!r}, which is not installed: "
            f"pip install 'ctxscore[{extra}]' (in a checkout: pip install -e '.[{extra}]')"
        ) from exc
