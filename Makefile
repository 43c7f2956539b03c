# Two commands for a fresh machine (README): `make chat` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
MODELS ?= $(HOME)/.cache/localspec-bench

.PHONY: install chat test test-fast test-unit bench-models wheel clean

$(VENV)/.installed: pyproject.toml packaging/build-llama-wheel.sh $(wildcard packaging/patches/*.patch)
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU build of torch: the local 2.13.0 file where it exists, else PyTorch's CPU index
	$(BIN)/pip install -q "torch==2.13.0" || $(BIN)/pip install -q torch --index-url https://download.pytorch.org/whl/cpu
	# a rebuilt wheel (another patch) keeps the version: pip would keep the one installed
	whl="$$(PYTHON=$(BIN)/python packaging/build-llama-wheel.sh)" && $(BIN)/pip install -q "$$whl" && \
		$(BIN)/pip install -q --force-reinstall --no-deps "$$whl" && \
		rm -rf $(VENV)/avx2-ggml && if [ -d "$$(dirname "$$whl")/avx2" ]; then \
		cp -rP "$$(dirname "$$whl")/avx2" $(VENV)/avx2-ggml; fi
	$(BIN)/pip install -q -e ".[test,serve]"
	touch $@

install: $(VENV)/.installed

bench-models:
	tools/fetch-bench-models $(MODELS)

# the target alone: the 0.5B draft beside it made the adaptive engine slower on every workload
# measured (docs/decisions/0027); --draft adds it
chat: install bench-models
	$(BIN)/localspec chat --model $(MODELS)/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf

test: install bench-models
	$(BIN)/ruff check .
	LOCALSPEC_BENCH_MODELS=$(MODELS) $(BIN)/python -m pytest -q -rs

# Test tiers: tests/unit (pure logic, seconds), tests/engine (the tiny models), tests/app (the CLI,
# the engine process, the chat screen under Pilot) and tests/system (wheel, clean venv, pull against a
# local hub, tmux, the reference pair, the hostile-input suite). `make test` runs them all; test-fast
# the first three less the tests marked slow or real_pair (pyproject.toml says which: kill/crash runs,
# the draft head's CLI and sampling runs, the reference pair, ...), one worker per CPU (pytest-xdist;
# tests/conftest.py keeps each worker to its CPU).
test-fast: install
	$(BIN)/python -m pytest -q -n auto -m "not slow and not real_pair" tests/unit tests/engine tests/app

test-unit: install
	$(BIN)/python -m pytest -q tests/unit

wheel:
	$(BIN)/python -m build --outdir dist .

clean:
	rm -rf $(VENV) dist build .cache
