"""Engines that run one function over many items: in this process (``local``) or on Ray (``ray``).

``python -m eval run --engine ray [--address ADDR] [--workers N]`` replays sessions on Ray
(:mod:`eval.engine`) and ``python -m training.embed_cache --engine ray`` embeds texts on Ray (extra
``scale``: ``pip install 'ctxscore[scale]'``). Both give the results of the local engine: items are
processed by the same code, one item per call, and results come back in the order of the items.

An engine maps ``fn(state, item)`` over items, where ``state`` is made once per worker by a
``setup()`` callable (load a scorer or an embedder once, not once per item). With Ray, ``fn`` and
``setup`` must be picklable (module-level functions, ``functools.partial`` of them); each worker
is a Ray actor holding one CPU. Without ``--address`` a local Ray cluster is started with
``--workers`` CPUs (default: all) and stopped after the run; with an address the cluster must have
ctxscore importable (installed, or this checkout on its ``PYTHONPATH``). The workers stay up for
the same ``(fn, setup)`` pair between calls (an embedder is loaded once per worker for a whole run)
until another pair is mapped, :meth:`RayEngine.release` or :meth:`Engine.close`.
"""

from __future__ import annotations

import abc
import gc
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from ctxscore.errors import ConfigError

from .paths import REPO_ROOT

log = logging.getLogger("training")

ENGINES = ("local", "ray")
#: Environment variables passed to Ray workers (the settings the evaluation and training read).
WORKER_ENV_PREFIXES = ("CTXSCORE_", "MLFLOW_", "HF_", "TRANSFORMERS_", "TIKTOKEN_", "TOKENIZERS_")
#: Seconds :meth:`RayEngine.release` waits for the workers to drop their state before stopping them.
CLOSE_TIMEOUT_S = 30.0


class Engine(abc.ABC):
    """Maps ``fn(state, item)`` over items, ``state = setup()`` made once per worker.

    Attributes:
        name: ``"local"`` or ``"ray"``.
        workers: number of workers (1 for the local engine).
    """

    name: str = ""
    workers: int = 1

    @abc.abstractmethod
    def imap(self, fn: Callable[[Any, Any], Any], items: Sequence[Any],
             setup: Callable[[], Any] | None = None) -> Iterator[Any]:
        """Yield ``fn(state, item)`` for each item, in the order of ``items``.

        Raises:
            Exception: what ``fn`` or ``setup`` raised (the first failing item's error).
        """

    def map(self, fn: Callable[[Any, Any], Any], items: Sequence[Any], setup: Callable[[], Any] | None = None) -> list[Any]:
        """:meth:`imap` as a list."""
        return list(self.imap(fn, items, setup))

    def close(self) -> None:
        """Release the workers (a second call does nothing)."""
        self.closed = True

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def describe(self) -> str:
        """A short description for logs and reports (``ray, 2 workers``)."""
        return f"{self.name}, {self.workers} worker{'s' if self.workers != 1 else ''}"


class LocalEngine(Engine):
    """Runs everything in this process, one item after another."""

    name = "local"

    def imap(self, fn: Callable[[Any, Any], Any], items: Sequence[Any],
             setup: Callable[[], Any] | None = None) -> Iterator[Any]:
        state = setup() if setup is not None else None
        for item in items:
            yield fn(state, item)


class _Worker:
    """The Ray actor: makes the state once, then runs ``fn`` on the items it is given."""

    def __init__(self, fn: Callable[[Any, Any], Any], setup: Callable[[], Any] | None) -> None:
        self.fn = fn
        self.state = setup() if setup is not None else None

    def run(self, item: Any) -> Any:
        return self.fn(self.state, item)

    def close(self) -> None:
        """Drop the state and collect it, so that its finalizers run (a registered scorer's download
        folder is removed with the scorer): :func:`ray.kill`, which stops the actor next, runs none."""
        self.state = None
        gc.collect()


class RayEngine(Engine):
    """Runs items on Ray actors, one CPU each (see the module docstring).

    Args:
        address: a Ray cluster address (``ray://host:10001`` or ``host:6379``); ``None`` starts a local
            cluster for this engine (stopped by :meth:`close`).
        workers: actors to start; default: the CPUs of the cluster (local: this machine's CPUs).

    Raises:
        ConfigError: Ray is not installed, or ``workers`` is not positive.
    """

    name = "ray"

    def __init__(self, address: str | None = None, workers: int | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise ConfigError("--engine ray needs Ray; install it with `pip install 'ctxscore[scale]'`") from None
        if workers is not None and workers < 1:
            raise ConfigError(f"workers must be a positive integer, got {workers}")
        self._ray = ray
        self._started = False
        env = {k: v for k, v in os.environ.items() if k.startswith(WORKER_ENV_PREFIXES)}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
        if not ray.is_initialized():
            kw: dict[str, Any] = {"runtime_env": {"env_vars": env}, "logging_level": logging.WARNING,
                                  "log_to_driver": False}
            if address is None:
                kw.update(num_cpus=workers or os.cpu_count() or 1, include_dashboard=False)
            ray.init(address=address, **kw)
            self._started = True
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.workers = workers or max(1, cpus)
        self.address = address
        self._actor = ray.remote(num_cpus=1)(_Worker)
        self._actors: dict[tuple[int, int], tuple[list[Any], tuple[Any, Any]]] = {}

    def imap(self, fn: Callable[[Any, Any], Any], items: Sequence[Any],
             setup: Callable[[], Any] | None = None) -> Iterator[Any]:
        from ray.util import ActorPool

        items = list(items)
        if not items:
            return
        key = (id(fn), id(setup))
        if key not in self._actors:  # one pool at a time (its actors hold the CPUs), kept for the same pair
            self.release()
            self._actors[key] = ([self._actor.remote(fn, setup) for _ in range(self.workers)], (fn, setup))
        pool = ActorPool(self._actors[key][0])
        yield from pool.map(lambda a, item: a.run.remote(item), items)

    def release(self) -> None:
        """Stop the workers (their CPUs go back to the cluster); the next call starts new ones. Each
        worker first drops its state (:meth:`_Worker.close`, up to :data:`CLOSE_TIMEOUT_S` seconds;
        one that does not answer is stopped all the same)."""
        actors = [a for group, _ in self._actors.values() for a in group]
        if actors:
            try:
                self._ray.get([a.close.remote() for a in actors], timeout=CLOSE_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - a worker that died or hangs is killed below anyway
                log.warning("a Ray worker did not release its state (%s); stopping it", exc)
        for a in actors:
            self._ray.kill(a)
        self._actors.clear()

    def close(self) -> None:
        self.release()
        if self._started:
            self._ray.shutdown()
            self._started = False


def make_engine(name: str = "local", address: str | None = None, workers: int | None = None) -> Engine:
    """The engine called ``name`` (``local`` or ``ray``).

    Raises:
        ConfigError: an unknown engine, ``--address``/``--workers`` with the local engine, or Ray missing.
    """
    if name == "local":
        if address is not None:
            raise ConfigError("--address needs --engine ray")
        if workers not in (None, 1):
            raise ConfigError("--workers needs --engine ray (the local engine has one worker)")
        return LocalEngine()
    if name == "ray":
        return RayEngine(address, workers)
    raise ConfigError(f"unknown engine {name!r}; choose from {', '.join(ENGINES)}")


class Sized:
    """An iterator with a known length (so a progress bar shows the total)."""

    def __init__(self, it: Iterable[Any], n: int) -> None:
        self.it, self.n = it, n

    def __iter__(self) -> Iterator[Any]:
        return iter(self.it)

    def __len__(self) -> int:
        return self.n
