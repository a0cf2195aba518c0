"""Serving the target in bfloat16: every drafter and the batched engine work on a bfloat16 target (the
trained drafters and the draft LM run in bfloat16 with it, and still hand verification float32 draft
distributions that are exactly what they sampled from); cost
profiles of several dtypes measured interleaved, the fastest recorded and served by ``--dtype auto``;
the round split and the pre-allocated cache measured side by side; llama.cpp as an optional peer."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from dspark_core import FixedLength, autoregressive_generate, speculative_generate
from dspark_core.core.rounds import DraftContext
from dspark_core.core.sampling import SamplingConfig
from dspark_core.core.session import CausalLMSession
from dspark_core.core.target import load_target
from dspark_core.decode import profile as profile_module
from dspark_core.decode.engine import BatchedEngine
from dspark_core.decode.profile import (
    CostProfile,
    combine_dtypes,
    measure_profiles,
    seconds_per_token,
)
from dspark_core.drafters.registry import (
    SHIPPED_DRAFTERS,
    build_drafter,
    shipped_drafter,
)
from dspark_core.drafters.trained import load_trained_drafter
from dspark_core.eval.lean_round import measure_round_split, summarize_round_split

from .tiny import tiny_target

NEW = 24
DRAFTERS = ("ngram", "oracle", "draft-lm", *SHIPPED_DRAFTERS)


@pytest.fixture(scope="module")
def bf16_target():
    return load_target(dtype=torch.bfloat16)


def build(name: str, model, tokenizer, reference: list[int]):
    if name in SHIPPED_DRAFTERS:
        return build_drafter(name.split("-")[0], model, tokenizer, draft_model=str(shipped_drafter(name)))
    return build_drafter(name, model, tokenizer, reference=reference)


@pytest.mark.parametrize("name", DRAFTERS)
def test_every_drafter_serves_a_bfloat16_target(bf16_target, prompts, eos, name):
    """Each drafter decodes with the bfloat16 target and has draft tokens accepted (features or
    embeddings in the wrong dtype, or mis-scaled, would leave a trained drafter guessing)."""
    model, tokenizer = bf16_target
    accepted = 0
    for prompt in prompts[:2]:
        plain = autoregressive_generate(model, prompt, max_new_tokens=NEW, eos_token_ids=eos).tokens
        result = speculative_generate(model, prompt, build(name, model, tokenizer, plain), FixedLength(3),
                                      max_new_tokens=NEW, eos_token_ids=eos)
        assert len(result.tokens) == sum(r.emitted for r in result.rounds) and 0 < len(result.tokens) <= NEW
        accepted += sum(r.accepted for r in result.rounds)
    assert accepted > 0


@pytest.mark.parametrize("name", ("draft-lm", *SHIPPED_DRAFTERS))
def test_learned_drafters_run_in_the_targets_dtype(bf16_target, prompts, name):
    """A learned drafter takes the target's dtype (unless asked for another), and a sampled draft's q rows
    are float32 distributions that gave their token mass: a bfloat16 q, or one renormalised after
    sampling, would break the acceptance rule's exactness."""
    model, tokenizer = bf16_target
    drafter = build(name, model, tokenizer, [])
    weights = drafter.model if name == "draft-lm" else drafter.drafter
    assert {p.dtype for p in weights.parameters()} == {torch.bfloat16}
    if name != "draft-lm":  # a dtype asked for wins over the target's
        assert load_trained_drafter(shipped_drafter(name), model, tokenizer, torch.float32).drafter.dtype == torch.float32
    prompt = prompts[0].tolist()
    drafter.reset()
    generator = torch.Generator().manual_seed(0)
    # the features decoding hands over: every prompt token's but the anchor's (None for the draft LM)
    features = CausalLMSession(model, drafter.feature_layers).forward(prompt[:-1]).features
    context = DraftContext(prompt, len(prompt), features, model.get_output_embeddings().weight.shape[0])
    draft = drafter.propose(context, 3, SamplingConfig(1.0), generator)
    assert draft.probs.dtype == torch.float32 and len(draft.tokens) == 3
    assert torch.allclose(draft.probs.sum(-1), torch.ones(3), atol=1e-5) and draft.probs.shape[1] == context.vocab_size
    assert all(draft.probs[k, t] > 0 for k, t in enumerate(draft.tokens.tolist()))


def test_batched_engine_serves_a_bfloat16_target(bf16_target, prompts, eos):
    model, tokenizer = bf16_target
    engine = BatchedEngine(model, FixedLength(3), lambda: build_drafter("dspark", model, tokenizer),
                           eos_token_ids=eos, max_batch=2)
    for prompt in prompts[:3]:
        engine.submit(prompt, 16)
    done = engine.run()
    assert [r.id for r in done] == [0, 1, 2] and all(0 < len(r.result.tokens) <= 16 for r in done)
    assert sum(round_.accepted for r in done for round_ in r.result.rounds) > 0


def toy(ms: list[float], dtype: str) -> CostProfile:
    """A profile whose forward of n = 1, 2, 4, 8 tokens takes ``ms`` milliseconds."""
    return CostProfile(machine={}, device="cpu", context=8, steps={"1": [1000 / t for t in ms]}, tokens=[1, 2, 4, 8],
                       spread={"1": [0.0] * 4}, meta={"dtype": dtype})


def test_the_fastest_dtype_is_the_one_with_the_cheapest_expected_token():
    """The costs of the issue's table (ms for n = 1, 2, 4, 8): float32 has the cheaper single step,
    bfloat16 is nearly flat in n. At acceptance 0.6 a position, bfloat16's 8-token forward yields
    E[tau] = 2.43 tokens for 51.2 ms (21.1 ms a token), float32's best is n = 2 (43.8 / 1.6 = 27.4 ms
    a token), so bfloat16 is the faster for speculative decoding; at acceptance 0 only plain decoding
    remains, and float32 wins."""
    fp32, bf16 = toy([39.0, 43.8, 60.7, 68.9], "float32"), toy([45.9, 47.5, 50.3, 51.2], "bfloat16")
    seconds, n = seconds_per_token(bf16, 0.6)
    assert n == 8 and seconds == pytest.approx(0.0512 / sum(0.6**k for k in range(8)))
    combined = combine_dtypes([fp32, bf16])
    assert combined.fastest_dtype == "bfloat16" and combined.steps == bf16.steps
    assert combined.for_dtype("float32").steps == fp32.steps and combined.for_dtype("float32").meta["dtype"] == "float32"
    assert combine_dtypes([fp32, bf16], acceptance=0.0).fastest_dtype == "float32"
    again = CostProfile(**json.loads(json.dumps(combined.__dict__)))
    assert again.for_dtype("bfloat16").steps == bf16.steps
    with pytest.raises(ValueError, match="not float16"):
        combined.for_dtype("float16")
    assert fp32.for_dtype("float32") is fp32  # a one-dtype profile answers for its own dtype


def test_auto_dtype_reads_the_profile_then_the_hardware(tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(profile_module, "native_bf16", lambda device="cpu": False)
    assert profile_module.serving_dtype()[0] == "float32"
    monkeypatch.setattr(profile_module, "native_bf16", lambda device="cpu": True)
    assert profile_module.serving_dtype()[0] == "bfloat16"
    combined = combine_dtypes([toy([10, 30, 60, 120], "float32"), toy([20, 40, 80, 160], "bfloat16")])
    combined.machine = profile_module.machine_info()
    combined.save(profile_module.default_profile_path())
    chosen, why = profile_module.serving_dtype()
    assert chosen == "float32" and "cost profile" in why


@pytest.mark.parametrize("avx512_bf16, amx, units", [(False, False, ""), (True, False, "+AVX512-BF16"),
                                                      (False, True, "+AMX"), (True, True, "+AVX512-BF16+AMX")])
def test_native_bfloat16_and_the_recorded_cpu_units_read_the_same_checks(monkeypatch, avx512_bf16, amx, units):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    assert profile_module.native_bf16("cpu") == bool(units)
    info = profile_module.machine_info()
    assert info["cpu_units"] == torch.backends.cpu.get_cpu_capability() + units  # every result file records them


def test_a_cost_profile_from_before_the_cpu_was_recorded_is_refused_with_the_reason(tmp_path):
    profile = combine_dtypes([toy([10, 30, 60, 120], "float32")])
    profile.machine = {k: v for k, v in profile_module.machine_info().items() if k not in ("cpu_model", "cpu_units")}
    with pytest.raises(ValueError, match="before profiles recorded cpu_model, cpu_units"):
        CostProfile.load(profile.save(tmp_path / "old.json"))
    assert CostProfile.load(tmp_path / "old.json", allow_other_machine=True).machine == profile.machine


def test_profiles_of_two_dtypes_are_measured_interleaved():
    models = [tiny_target(vocab=1024)[0], tiny_target(vocab=1024, dtype=torch.bfloat16)[0]]  # the profile feeds ids < 1000
    fp32, bf16 = measure_profiles(models, (1, 2), context=8, repeats=2, tokens=[1, 3])
    assert fp32.meta["dtype"] == "float32" and bf16.meta["dtype"] == "bfloat16"
    assert bf16.meta["interleaved_with"] == ["float32", "bfloat16"]
    assert all(len(p.steps[r]) == 2 and min(p.steps[r]) > 0 for p in (fp32, bf16) for r in ("1", "2"))


def test_round_split_measures_both_caches_side_by_side(target, prompts):
    """The quiet-machine measurement at tiny size: every (method, cache) cell decoded, the parts of a
    round recorded, and both caches give the same float32 tokens."""
    model, tokenizer = target
    rows = measure_round_split({"float32": model}, tokenizer, prompts[:1], gamma=3, max_new_tokens=8)
    assert len(rows) == 6 and set(rows["kv_cache"]) == {"dynamic", "static"}
    assert (rows["forward_ms"] > 0).all() and rows["outside_forward_share"].between(0, 1).all()
    summary = summarize_round_split(rows)
    assert (summary["same_tokens"] == 1.0).all() and "static_over_dynamic" in summary


def test_llama_cpp_methods_say_how_to_install_it(monkeypatch, tmp_path):
    from dspark_core.eval.bench import BenchSettings, run_bench

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as if llama-cpp-python were not installed
    settings = BenchSettings(benchmarks=("smoke",), methods="llamacpp", n_prompts=1, max_new_tokens=4)
    model, tokenizer = tiny_target()
    with pytest.raises(RuntimeError, match="make peers"):
        run_bench(settings, tmp_path / "run", model, tokenizer)
    assert not (tmp_path / "run").exists()


def test_llama_cpp_runs_beside_our_methods(target, tmp_path):
    """Optional (needs `make peers`): llama.cpp plain and prompt-lookup decoding on the same prompts."""
    pytest.importorskip("llama_cpp")
    from dspark_core.eval.bench import BenchSettings, run_bench

    model, tokenizer = target
    settings = BenchSettings(benchmarks=("smoke",), methods="ngram:3;llamacpp;llamacpp-lookup:5", n_prompts=2,
                             temperatures=(0.0,), max_new_tokens=12)
    rows = run_bench(settings, tmp_path / "run", model, tokenizer)
    assert len(rows) == 8 and set(rows.loc[rows["family"].str.startswith("llamacpp"), "dtype"]) == {"q4_1"}
    llama = rows[rows["method"] == "llamacpp"]
    assert (llama["speedup_vs_llamacpp"] == 1.0).all() and (llama["new_tokens"] > 0).all()
    assert rows["speedup_vs_llamacpp"].notna().all()
