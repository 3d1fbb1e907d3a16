"""The data layer: corpora -> session records -> weak + distilled labels -> a message-level HF
``DatasetDict`` (train / dev / test by session group) and long evaluation sessions.

Entry point: ``python -m training.data build`` (see :mod:`training.data.__main__`). Python API::

    from training.data import build, load_dataset_dict, load_eval_sessions, corpora_root, load_locomo
    manifest = build()                      # idempotent; build(force=True) rebuilds
    dd = load_dataset_dict()                # DatasetDict with train / dev / test
    sessions = load_eval_sessions()         # held-out evaluation sessions (list of dicts)

Formats are in ``docs/contracts.md``; sources, licences, label rules and counts in ``data/README.md``.
"""

from __future__ import annotations

from ..extra import require_train_extra
from ..paths import CORPORA_ENV, CorporaMissingError, corpora_root, require_corpora
from .build import (
    FEATURES,
    BuildConfig,
    build,
    load_dataset_dict,
    load_eval_sessions,
    load_manifest,
)
from .labels import importance_to_value, load_distilled
from .locomo import load_locomo
from .splits import split_of

require_train_extra("training", "training.data", ("datasets", "tqdm"))

__all__ = [
    "CORPORA_ENV",
    "FEATURES",
    "BuildConfig",
    "CorporaMissingError",
    "build",
    "corpora_root",
    "importance_to_value",
    "load_dataset_dict",
    "load_distilled",
    "load_eval_sessions",
    "load_locomo",
    "load_manifest",
    "require_corpora",
    "split_of",
]
