"""Engines of the evaluation: :mod:`training.engine` (``local`` and ``ray``) and the loader that lets Ray
workers load the learned scorer themselves (a loaded scorer does not pickle)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from training.engine import ENGINES, Engine, LocalEngine, RayEngine, Sized, make_engine

__all__ = ["ENGINES", "Engine", "LocalEngine", "RayEngine", "Sized", "make_engine", "packaged_scorer_loader"]


def packaged_scorer_loader(model: dict[str, Any]) -> Callable[[], Any] | None:
    """A picklable loader of the learned scorer an evaluation resolved (its ``model`` info): the
    packaged folder (``uri`` is a folder) or the registered version (``models:/name/version``).
    ``None`` when the info names neither (the caller then cannot distribute the learned policy)."""
    import functools

    uri = str(model.get("uri") or "")
    if uri and Path(uri).is_dir():
        from .models import load_packaged

        return functools.partial(load_packaged, Path(uri))
    if uri.startswith("models:/") and model.get("version"):
        return functools.partial(_load_registered_scorer, str(model["version"]))
    return None


def _load_registered_scorer(version: str) -> Any:
    from .models import load_registered

    return load_registered(version)[0]
