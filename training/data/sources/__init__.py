"""One module per corpus. Each exposes ``SOURCE`` (the id prefix), ``LANGUAGE``,
``input_files(root) -> list[Path]`` and ``iter_sessions(root) -> Iterator[CorpusSession]`` yielding
session records (:mod:`training.data.schema`) whose messages carry a weak label (``"weak"``) and
whose ``key_facts`` hold the facts the evaluation probes. Files are streamed from their gzip / zip
archives; nothing is unpacked to disk.
"""

from __future__ import annotations

from types import ModuleType

from . import crosswoz, multiwoz, sgd, swe_mini, tau

#: Source id -> loader module, in build order.
SOURCES: dict[str, ModuleType] = {
    sgd.SOURCE: sgd,
    multiwoz.SOURCE: multiwoz,
    crosswoz.SOURCE: crosswoz,
    tau.SOURCE: tau,
    swe_mini.SOURCE: swe_mini,
}

__all__ = ["SOURCES"]
