"""The context verifier: cheap checks on every build, a fuller pass between turns.

``ContextManager(layers=[FactLedger(), ContextVerifier()])``; each window then carries typed
:class:`~ctxscore.verify.findings.Finding` s in ``window.findings``:

- as messages arrive, :class:`~ctxscore.verify.analysis.Tracker` reads each one once (goal drift,
  constraints contradicted, task state against tool results, guesses presented as the user's word);
- after each build the open findings of the active task are reported with the window checks of
  :mod:`ctxscore.verify.window_checks` (constraints missing or weakened, conclusions without evidence
  in the recent turns, stale, duplicate and conflicting facts);
- :meth:`ContextVerifier.check` reads the whole session again (every task, with hindsight: a drift the
  user later accepted is withdrawn) and checks the last window in full.

Nothing here changes the window: the findings say what to do (page in, re-pin, ask the user, re-check).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..errors import ConfigError
from ..window.history import Entry
from ..window.layers import Layer, LayerContext
from .analysis import Tracker
from .findings import Finding
from .window_checks import check_window


def _unique(findings: Sequence[Finding]) -> list[Finding]:
    seen: set[tuple[str, tuple[str, ...], str]] = set()
    out = []
    for f in findings:
        k = (str(f.kind), f.ids, f.message)
        if k not in seen:
            seen.add(k)
            out.append(f)
    return out


class ContextVerifier(Layer):
    """The verifier layer (see the module docstring).

    Args:
        ledger: the session's :class:`~ctxscore.memory.ledger.FactLedger` (stale facts), optional;
            :meth:`check` also finds one among the manager's layers.
        profile: the :class:`~ctxscore.memory.profile.ProfileLayer` (conflicting profile items), optional.
    """

    def __init__(self, ledger: Any = None, profile: Any = None) -> None:
        self.ledger, self.profile = ledger, profile
        self.last: tuple[Any, Any] | None = None
        self.tracker = Tracker()

    def attach(self, ctx: LayerContext) -> None:
        """Start reading the session with its rule file."""
        self.ctx = ctx
        self.tracker = Tracker(config=ctx.rules.config)

    def on_reset(self) -> None:
        """Forget what was read (the kept messages come again)."""
        self.tracker = Tracker(config=self.tracker.config)
        self.last = None

    def on_add(self, entries: Sequence[Entry]) -> None:
        """Read each new message once."""
        for e in entries:
            self.tracker.add(e)

    def after_build(self, window: Any, view: Any) -> None:
        """Append the findings of this build to ``window.findings``: the open ones of the active task and
        the window checks (cheap pass)."""
        self.last = (window, view)
        found = self.tracker.open_findings(view.history.task_no)
        found += check_window(self.tracker, window, view, full=False, ledger=self.ledger, profile=self.profile)
        window.findings.extend(_unique(found))

    def check(self, manager: Any = None) -> list[Finding]:
        """The fuller pass: every task of the session read again, and the last window checked in full.

        Args:
            manager: the :class:`~ctxscore.window.manager.ContextManager` (its history and layers);
                default: the history this layer is attached to.

        Returns the findings (``stage="check"``), the offending message first in each ``ids``.

        Raises:
            ConfigError: no ``manager`` and the verifier is no manager's layer.
        """
        if manager is None and getattr(self, "ctx", None) is None:
            raise ConfigError("this ContextVerifier is no layer of a ContextManager yet: pass it in "
                              "ContextManager(layers=[...]) or call check(manager)")
        history = manager.history if manager is not None else self.ctx.history
        ledger, profile = self.ledger, self.profile
        if manager is not None:
            from ..memory.ledger import FactLedger  # noqa: PLC0415
            from ..memory.profile import ProfileLayer  # noqa: PLC0415

            layers = manager.state.layers
            ledger = ledger or next((x for x in layers if isinstance(x, FactLedger)), None)
            profile = profile or next((x for x in layers if isinstance(x, ProfileLayer)), None)
        tr = Tracker(config=self.tracker.config)
        for e in history.entries:
            tr.add(e)
        found = [f for task in sorted(tr.findings) for f in tr.findings[task]]
        mine = manager is None or any(x is self for x in manager.state.layers)
        if self.last is not None and mine:  # the last window it saw is of its own session only
            window, view = self.last
            found += check_window(tr, window, view, full=True, ledger=ledger, profile=profile)
        return [replace(f, stage="check") for f in _unique(found)]

    def state(self) -> dict[str, Any]:
        """The open findings by task (JSON-ready)."""
        return {"open": {str(t): [f.to_dict() for f in fs] for t, fs in self.tracker.findings.items() if fs}}
