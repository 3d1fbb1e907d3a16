"""Which learned scorer the ``learned`` policy evaluates, and where it comes from."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

log = logging.getLogger("eval")


class ModelUnavailable(Exception):
    """The requested learned scorer cannot be loaded (the message says why)."""


def load_packaged(path: Path) -> Any:
    """``LearnedScorer.from_pretrained(path)``; raises :class:`ModelUnavailable` with the reason."""
    from ctxscore.errors import ModelLoadError
    from ctxscore.scoring.learned import LearnedScorer

    try:
        return LearnedScorer.from_pretrained(path)
    except (ModelLoadError, OSError, ValueError) as exc:
        raise ModelUnavailable(str(exc)) from exc


def load_version(version: Any, alias: str | None) -> tuple[Any, dict[str, Any]]:
    """Load a registered model version (from :func:`training.registry.get_version`), downloaded into a
    temporary folder that is removed when the scorer is garbage-collected or the process exits.

    Returns:
        ``(scorer, info)`` with ``info`` from :func:`training.registry.version_info`.

    Raises:
        ModelUnavailable: its packaged folder cannot be found or loaded.
    """
    from training import registry

    tmp = tempfile.mkdtemp(prefix="ctxscore-model-")
    try:
        scorer = load_packaged(registry.download_scorer(version, tmp))
    except FileNotFoundError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ModelUnavailable(str(exc)) from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # the download stays while the scorer may read it (its rule file, when saved again) and goes with it
    weakref.finalize(scorer, shutil.rmtree, tmp, ignore_errors=True)
    return scorer, registry.version_info(version, alias)


def load_registered(alias_or_version: str) -> tuple[Any, dict[str, Any]]:
    """Load a registered version of ``ctxscore-scorer`` by alias or version number.

    Raises:
        ModelUnavailable: no such alias/version, or its packaged folder cannot be found or loaded.
    """
    from training import registry

    version = registry.get_version(alias_or_version)
    if version is None:
        raise ModelUnavailable(f"registered model {registry.MODEL_NAME!r} has no alias or version {alias_or_version!r}")
    return load_version(version, None if alias_or_version.isdigit() else alias_or_version)


def _ensure_champion() -> None:
    """A store without a champion gets the shipped scorer as its baseline champion, as promotion and
    export give it (:func:`training.registry.ensure_champion`); raises :class:`ModelUnavailable`."""
    from ctxscore.errors import ModelLoadError
    from training import registry

    try:
        registry.ensure_champion()
    except ModelLoadError as exc:
        raise ModelUnavailable(f"no champion registered, and the shipped scorer does not load: {exc}") from exc


def folder_info(path: Path, alias: str | None = None) -> dict[str, Any]:
    """Model info of a packaged folder: ``uri`` (the resolved path), ``config_sha256`` (its
    ``config.json``, which holds the sha256 of every other file: a re-export changes it, so an
    evaluation's fingerprint does too) and ``alias`` when given."""
    from ctxscore.scoring.package import CONFIG_FILE, sha256_file

    info: dict[str, Any] = {"uri": str(path.resolve()), "config_sha256": sha256_file(path / CONFIG_FILE)}
    return {**info, "alias": alias} if alias else info


def resolve_learned(spec: str, use_mlflow: bool = True) -> tuple[Any, dict[str, Any], str | None]:
    """The scorer for the ``learned`` policy.

    Args:
        spec: ``"auto"`` (registry alias ``candidate``, then ``champion``, then the shipped default),
            ``"default"`` (``ctxscore/models/default``), ``"none"``, an alias, a version number, or a
            path to a packaged scorer folder. ``"champion"`` in a store without one (and ``use_mlflow``)
            registers the shipped scorer as the baseline champion first.
        use_mlflow: whether the registry may be consulted (``auto`` skips it when False).

    Returns:
        ``(scorer or None, model info, skip reason or None)``; with ``auto`` or ``none`` an
        unavailable model gives ``None`` and a reason instead of an error.

    Raises:
        ModelUnavailable: an explicitly requested model cannot be loaded.
    """
    from ctxscore.scoring.package import DEFAULT_MODEL_DIR

    if spec == "none":
        return None, {}, "disabled with --model none"
    if spec == "default":
        return load_packaged(DEFAULT_MODEL_DIR), folder_info(DEFAULT_MODEL_DIR, "shipped default"), None
    p = Path(spec)
    if p.exists() or "/" in spec or os.sep in spec:  # a path (no alias holds a slash): its own error when it is wrong
        return load_packaged(p), folder_info(p), None
    if spec == "champion" and use_mlflow:
        _ensure_champion()
    if spec != "auto":
        scorer, info = load_registered(spec)
        return scorer, info, None
    reasons = []
    if use_mlflow:
        for alias in ("candidate", "champion"):
            try:
                scorer, info = load_registered(alias)
                return scorer, info, None
            except ModelUnavailable as exc:
                reasons.append(str(exc))
            except Exception as exc:  # noqa: BLE001 - a broken store must not stop the baselines
                reasons.append(f"MLflow registry unavailable: {exc}")
                break
    try:
        return load_packaged(DEFAULT_MODEL_DIR), folder_info(DEFAULT_MODEL_DIR, "shipped default"), None
    except ModelUnavailable as exc:
        reasons.append(f"shipped default: {exc}")
    return None, {}, "; ".join(reasons)
