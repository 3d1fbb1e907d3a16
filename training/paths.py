"""Where things live: the repository root, the corpora, and the project's data and output folders.

The one definition of :data:`REPO_ROOT`; every other module of ``training``, ``eval`` and
``benchmarks`` imports its paths from here. Paths are resolved relative to the repository root
(the folder holding ``pyproject.toml``), never the current directory, so the commands behave the
same from anywhere. Standard library only: importable without any extra.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Environment variable that points at the shared corpora folder.
CORPORA_ENV = "CTXSCORE_CORPORA"

#: Repository root (``training/paths.py`` -> one level up from ``training/``).
REPO_ROOT = Path(__file__).resolve().parents[1]

#: Default processed-output folder of ``python -m training.data build`` (git-ignored).
DEFAULT_OUT = REPO_ROOT / "data" / "processed"

#: Feedback records of the evaluation (``recall_failures.jsonl``, ``eval_history.jsonl``; git-ignored).
FEEDBACK_DIR = REPO_ROOT / "data" / "feedback"

#: Default embedding cache folder of training and evaluation (git-ignored).
CACHE_DIR = REPO_ROOT / "data" / "cache" / "embeddings"

#: The local MLflow store (SQLite database and artifacts; content git-ignored).
MLRUNS_DIR = REPO_ROOT / "mlruns"

#: Reports, plots and exported scorers of the runs (git-ignored).
OUT_DIR = REPO_ROOT / "out"

#: The project-written labelled set (written by the bundled-set helper, loaded as source ``bundled``).
DEFAULT_BUNDLED = REPO_ROOT / "data" / "bundled" / "sessions.jsonl"

#: Sub-folders of the corpora root, by source name; used to report partial corpora.
SOURCE_DIRS = {
    "sgd": "sgd",
    "multiwoz": "multiwoz21",
    "crosswoz": "crosswoz",
    "tau_airline": "tau_bench",
    "swe_mini": "swe_mini",
}


class CorporaMissingError(FileNotFoundError):
    """The corpora folder (or a file the build needs) is absent; the message names the path and
    the ``CTXSCORE_CORPORA`` variable."""


def corpora_root(path: str | os.PathLike[str] | None = None) -> Path:
    """The corpora folder: ``path`` if given, else ``$CTXSCORE_CORPORA``, else ``../shared/datasets``
    relative to the repository root. Relative values are resolved against the repository root.

    The folder is not checked here; use :func:`require_corpora` for that.
    """
    raw = path if path is not None else os.environ.get(CORPORA_ENV) or "../shared/datasets"
    p = Path(raw).expanduser()
    if not p.is_absolute():
        p = REPO_ROOT / p
    return p.resolve()


def corpora_explicit(path: str | os.PathLike[str] | None = None) -> bool:
    """True when the corpora location was chosen explicitly (argument or ``CTXSCORE_CORPORA``)."""
    return path is not None or bool(os.environ.get(CORPORA_ENV))


def corpora_present(root: Path) -> bool:
    """True when ``root`` holds the labels file and at least one source folder."""
    return (root / "labels" / "distilled.jsonl").is_file() and any(
        (root / d).is_dir() for d in SOURCE_DIRS.values()
    )


def require_corpora(root: Path | None = None) -> Path:
    """Return the corpora root, or raise :class:`CorporaMissingError` naming the path it looked at.

    Raises:
        CorporaMissingError: the folder, its ``labels/distilled.jsonl`` or all source folders are absent.
    """
    root = corpora_root() if root is None else Path(root)
    if not corpora_present(root):
        raise CorporaMissingError(missing_message(root))
    return root


def missing_message(root: Path) -> str:
    """Human-readable explanation of a missing corpora folder, naming the fix."""
    return (
        f"corpora not found at {root} (expected labels/distilled.jsonl and the sgd/, multiwoz21/, "
        f"crosswoz/, tau_bench/, swe_mini/ folders). Set {CORPORA_ENV}=/path/to/shared/datasets "
        f"or pass --corpora PATH; the default is ../shared/datasets relative to the repository root "
        f"({REPO_ROOT})."
    )
