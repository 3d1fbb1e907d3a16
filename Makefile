# ctxscore: `make run` (the main job) and `make test` (the tests) on a fresh clone; other targets below.
#   make run    build data, train + register the scorer, evaluate against baselines, promote, export to out/scorer
#   make ship   copy the champion into the package (ctxscore/models/default): the only target that changes tracked files
#   make feedback   one turn of the recall-failure feedback loop (then `make run` again)
#   make test   the test suite (what CI runs)
# Both create .venv on first use (torch==2.13.0 CPU first, then the package with its extras:
# train, dev, and llm, serve, langchain for the LLM path, the proxy and the LangChain tests).
#   make bench-load   the load benchmark of the server backends (PostgreSQL + Redis; see docs/scale.md)

PYTHON ?= python3
VENV   ?= .venv
# Extras installed into .venv: training, tests, and the backends (PostgreSQL, Redis, Ray) whose tests
# run against real servers (see README, "Serving many agents").
EXTRAS ?= train,dev,llm,serve,langchain,postgres,redis,scale
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
OUT    ?= out/eval
# The scorer variants `make run` compares: the default embedder with two heads and two label sets
# (4 runs). The full grid of the README: SWEEP="--embedder use --embedder minilm --embedder e5 --head logreg --head hgb --head mlp".
SWEEP  ?= --embedder use --head logreg --head mlp
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install run ship feedback test bench bench-load clean-data

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e ".[$(EXTRAS)]"
	touch $(STAMP)

install: $(STAMP)

# The main job. Every step reuses what an earlier run left when its inputs are unchanged: the
# dataset (manifest hashes), embeddings (data/cache), training (fingerprint tag on the registered
# version), the evaluation (fingerprint in out/eval/metrics.json) and promotion (earlier eval runs).
# A fresh MLflow store gets the shipped scorer as its baseline champion; the candidate is promoted
# only if it beats it. The champion is exported to out/scorer (git-ignored): `make run` changes no
# tracked file.
run: $(STAMP)
	$(PY) -m training.data build
	$(PY) -m training.train --sweep $(SWEEP) --table out/scorer_sweep.md
	$(PY) -m eval run --sessions data/processed/eval_sessions.jsonl --model candidate --no-feedback --reuse --out $(OUT)
	$(PY) -m eval promote
	$(PY) -m training.registry export --alias champion --out out/scorer
	$(PY) -m eval summary --out $(OUT)

# Ship the champion: copy it into the package (the scorer `import ctxscore` uses), then review and
# commit the diff of ctxscore/models/default. While the champion is the shipped baseline, the files
# come back byte-identical.
ship: $(STAMP)
	$(PY) -m training.registry export --alias champion --out ctxscore/models/default

# One turn of the feedback loop: replay the dev sessions with the champion at the reference budget and
# append every missed key fact to data/feedback/recall_failures.jsonl; the next `make run` trains
# iteration N+1 on it (MLflow tag feedback_iteration) and its report compares N with N+1.
feedback: $(STAMP)
	$(PY) -m eval run --sessions data/processed/dev_sessions.jsonl --model champion --policies learned \
	    --budget 0.25 --feedback-budgets f0.25 --out out/feedback

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/runtime.py
	$(PY) benchmarks/scoring.py

clean-data:
	rm -rf data/processed data/cache out
