"""Every notebook executes headlessly under papermill with small parameters; a failing cell fails the test."""

from pathlib import Path

import papermill as pm
import pytest

from dspark_core.drafters.registry import shipped_drafter
from dspark_core.models import DrafterConfig

pytestmark = pytest.mark.slow  # papermill runs of the notebooks on the default target

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
SHIPPED_DEPTH = DrafterConfig.from_pretrained(shipped_drafter("dspark-markov")).num_layers

SMALL = {
    "01_theory.ipynb": dict(n_random_pairs=50, n_samples=3000, n_sim_rounds=20000, n_timing_repeats=3, max_gamma=7,
                            timing_token_counts=[1, 2, 4, 8], n_lossy_samples=3000),
    "02_implementation.ipynb": dict(n_prompts=2, gammas=[1, 4], max_new_tokens=24, reference_new_tokens=16, gamma=4,
                                    wrong_position=2),
    "03_training.ipynb": dict(n_answer_prompts=2, answer_max_new_tokens=8, n_prefill_sequences=2, prefill_length=64,
                              n_training_timing_sequences=1, throughput_repeats=1, vocab_text_tokens=1000,
                              selection_per_benchmark=1, selection_new_tokens=16, feature_cache="scratch", n_timing_repeats=3,
                              tiny_sequences=8, tiny_max_sequence_tokens=256, tiny_steps=10, tiny_tokens_per_step=256,
                              tiny_block=4, n_eval_prompts=1, max_new_tokens=24),
    "04_ablations.ipynb": dict(run_dir=None, ablation_dir=None, benchmarks=["math", "format"], methods="ngram:3;oracle:3",
                               temperatures=[0.0], n_prompts=1, max_new_tokens=12, block_lengths=[3]),
    "05_scheduling.ipynb": dict(profile_requests=[1, 2], profile_max_tokens=3, profile_repeats=1, n_calibration_prompts=3,
                                max_new_tokens=16, n_eval_prompts=2, fixed_lengths=[1, 3], concurrency=[1, 2],
                                load_repeats=2),
    "06_gpu_results.ipynb": dict(gpu_results=None, cpu_results="measure", cpu_requests=[1, 2], cpu_tokens=[1, 2, 4, 8],
                                 cpu_context=32, cpu_repeats=1, cpu_draft_layers=sorted({SHIPPED_DEPTH, 5}), max_rounds=300,
                                 n_paper_rounds=300, concurrency=[1, 2], replay_new_tokens=24),
}

# Notebooks that write result tables: their results_dir goes to the test's tmp folder, and these files must appear.
RESULTS = {
    "03_training.ipynb": ["throughput-*.csv", "vocab-coverage-*.csv"],
    "05_scheduling.ipynb": ["scheduling-calibration-*.csv", "scheduling-single-*.csv", "scheduling-load-*.csv"],
    "06_gpu_results.ipynb": ["gpu-projection-*.csv", "gpu-speedups-*.csv"],
}


def test_every_notebook_has_small_parameters():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(SMALL)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_notebook_executes(name, tmp_path):
    parameters = {**SMALL[name], "figures_dir": str(tmp_path)}
    if name in RESULTS:
        parameters["results_dir"] = str(tmp_path / "results")
    pm.execute_notebook(
        NOTEBOOKS / name,
        tmp_path / name,
        parameters=parameters,
        cwd=str(NOTEBOOKS),
        kernel_name="python3",
        progress_bar=False,
    )
    assert any(tmp_path.glob("*.png")), "the notebook wrote no figure"
    for pattern in RESULTS.get(name, []):
        assert any((tmp_path / "results").glob(pattern)), f"the notebook wrote no {pattern}"


@pytest.mark.parametrize("name, parameters, named", [
    ("01_theory.ipynb", {"n_samples": 10}, "n_samples"),
    ("03_training.ipynb", {"prefill_length": 4096}, "prefill_length"),
])
def test_bad_parameter_is_reported(tmp_path, name, parameters, named):
    with pytest.raises(pm.PapermillExecutionError, match=named):
        pm.execute_notebook(NOTEBOOKS / name, tmp_path / "bad.ipynb", parameters=parameters,
                            cwd=str(NOTEBOOKS), kernel_name="python3", progress_bar=False)
