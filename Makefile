# ctxscore: two commands for a fresh clone.
#   make run    build data, train + register the scorer, evaluate against baselines, promote, export
#   make test   the test suite (what CI runs)
# Both create .venv on first use (torch==2.13.0 CPU first, then the package with its extras).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
OUT    ?= out/eval
export CTXSCORE_CORPORA ?= ../shared/datasets
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install run test bench clean-data

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e ".[train,dev]"
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(PY) -m training.data build
	$(PY) -m training.train --sweep
	$(PY) -m eval run --sessions data/processed/eval_sessions.jsonl --out $(OUT)
	$(PY) -m eval promote
	$(PY) -m training.registry export --alias champion --out ctxscore/models/default
	$(PY) -m eval summary --out $(OUT)

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/runtime.py
	$(PY) benchmarks/scoring.py

clean-data:
	rm -rf data/processed data/cache out
