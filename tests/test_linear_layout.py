"""Input-major and oneDNN-packed linear weights: the same function, drafters follow the target, greedy identity holds."""

import copy

import pandas as pd
import pytest
import torch

from dspark_core import FixedLength, autoregressive_generate, load_target, speculative_generate
from dspark_core.core.linear_layout import (
    PackedLinear,
    apply_linear_layout,
    input_major,
    is_input_major,
    layout_of,
    pack_weight,
    use_input_major_linears,
    use_packed_linears,
)
from dspark_core.core.session import CausalLMSession
from dspark_core.drafters.registry import build_drafter
from dspark_core.drafters.trained import BlockDrafter
from dspark_core.eval.bench import BenchSettings, run_bench
from dspark_core.eval.linear_layout import LayoutSettings, measure_layouts, summarize_layouts

from .tiny import drafter_for, tiny_target


def test_input_major_keeps_the_matrix_and_transposes_its_memory():
    weight = torch.randn(6, 4)
    moved = input_major(weight)
    assert torch.equal(moved, weight) and moved.shape == (6, 4)
    assert moved.t().is_contiguous() and not moved.is_contiguous()
    assert is_input_major(moved) and not is_input_major(weight)
    assert not is_input_major(torch.randn(1, 4).t().contiguous().t())  # a single row is both layouts


def test_tiny_target_computes_the_same_logits_and_keeps_its_embedding():
    model, _ = tiny_target(vocab=16)
    model.config.tie_word_embeddings = True
    model.lm_head.weight = model.model.embed_tokens.weight  # tied, as SmolLM2's head is
    ids = torch.randint(0, 16, (1, 12))
    before = model(input_ids=ids).logits
    assert use_input_major_linears(model) == 2 * 7 + 1  # q k v o gate up down per layer, and the LM head
    assert all(is_input_major(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert model.model.embed_tokens.weight.is_contiguous()  # lookups keep the row-major embedding
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    torch.testing.assert_close(model(input_ids=ids).logits, before, rtol=1e-5, atol=1e-5)


def test_packed_linears_compute_the_same_logits_over_the_same_parameters():
    model, _ = tiny_target(vocab=16)
    model.lm_head.weight = model.model.embed_tokens.weight  # tied, as SmolLM2's head is
    ids = torch.randint(0, 16, (1, 12))
    before, keys = model(input_ids=ids).logits, set(model.state_dict())
    with torch.inference_mode():
        assert use_packed_linears(model) == 2 * 7 + 1 and use_packed_linears(model) == 0  # packed once
        assert layout_of(model) == "onednn-packed" and set(model.state_dict()) == keys
        assert model.lm_head.weight is model.model.embed_tokens.weight  # the parameters are shared, not copied
        torch.testing.assert_close(model(input_ids=ids).logits, before, rtol=1e-5, atol=1e-5)
        if not torch.ops.mkldnn._is_mkldnn_bf16_supported():  # an AVX2-only CPU: casting re-packs, which oneDNN refuses
            with pytest.raises(ValueError, match="AVX512"):
                copy.deepcopy(model).to(torch.bfloat16)
            return
        reference, _ = tiny_target(vocab=16)
        reference.load_state_dict(model.state_dict())
        copied = copy.deepcopy(model).to(torch.bfloat16)  # as bench casts a copy; casting re-packs the weights
        assert copied.lm_head.weight is copied.model.embed_tokens.weight and copied.lm_head.packed is not model.lm_head.packed
        torch.testing.assert_close(copied(input_ids=ids).logits, reference.to(torch.bfloat16)(input_ids=ids).logits)
        torch.testing.assert_close(model(input_ids=ids).logits, before, rtol=1e-5, atol=1e-5)  # the original kept


def test_packing_bfloat16_where_onednn_cannot_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)  # an AVX2-only CPU
    with pytest.raises(ValueError, match="AVX512.*'torch' layout"):
        pack_weight(torch.randn(3, 4, dtype=torch.bfloat16))
    pack_weight(torch.randn(3, 4))  # float32 still packs


def test_a_packed_linear_refuses_to_run_where_gradients_are_wanted():
    linear = PackedLinear(torch.nn.Linear(4, 3))
    with pytest.raises(RuntimeError, match="inference"):
        linear(torch.randn(2, 4))
    with torch.no_grad():
        assert linear(torch.randn(2, 4)).shape == (2, 3)


def test_an_unknown_layout_is_a_clear_error():
    model, _ = tiny_target()
    with pytest.raises(ValueError, match="input-major"):
        apply_linear_layout(model, "column-major")


def test_a_trained_drafter_follows_a_packed_target():
    model, tokenizer = tiny_target(vocab=1100)
    apply_linear_layout(model, "onednn-packed")
    drafter = BlockDrafter(drafter_for(model, tokenizer, "dspark-markov"), model, tokenizer)
    linears = [m for m in drafter.drafter.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(isinstance(m, PackedLinear) for m in linears)


def test_a_trained_drafter_follows_the_targets_layout():
    model, tokenizer = tiny_target(vocab=1100)
    apply_linear_layout(model, "input-major")
    drafter = BlockDrafter(drafter_for(model, tokenizer, "dspark-markov"), model, tokenizer)
    linears = [m for m in drafter.drafter.modules() if isinstance(m, torch.nn.Linear) and m.weight.shape[0] > 1]
    assert linears and all(is_input_major(m.weight) for m in linears)
    assert is_input_major(drafter.drafter.target_part("head"))
    row_major, _ = tiny_target(vocab=1100)
    plain = BlockDrafter(drafter_for(row_major, tokenizer, "dspark-markov"), row_major, tokenizer)
    assert not is_input_major(plain.drafter.target_part("head"))


def test_verify_forward_agrees_with_one_token_forwards_in_both_layouts(target, prompts):
    model, _ = target
    moved = apply_linear_layout(load_target()[0], "input-major")
    tokens = [10, 20, 30, 40, 50, 60, 70, 80]
    for m in (model, moved):
        session = CausalLMSession(m)
        session.forward(prompts[0])
        block = session.forward(tokens).logits
        session.rollback(len(prompts[0]))
        single = torch.cat([session.forward([t]).logits for t in tokens])
        torch.testing.assert_close(block, single, rtol=0, atol=1e-3)


@pytest.mark.parametrize("layout", ["input-major", "onednn-packed"])
def test_greedy_speculative_equals_plain_in_each_layout(target, prompts, eos, layout):
    _, tokenizer = target
    model = apply_linear_layout(load_target()[0], layout)
    drafter = build_drafter("dspark", model, tokenizer)
    assert layout_of(model) == layout and is_input_major(drafter.drafter.target_part("head")) == (layout == "input-major")
    for prompt in prompts[:3]:
        plain = autoregressive_generate(model, prompt, max_new_tokens=48, eos_token_ids=eos).tokens
        result = speculative_generate(model, prompt, drafter, FixedLength(7), max_new_tokens=48, eos_token_ids=eos)
        assert result.tokens == plain


def test_layout_comparison_writes_resumable_rows(target, tmp_path):
    settings = LayoutSettings(benchmarks=("math",), methods="ngram:3", n_prompts=1, max_new_tokens=4)
    rows = measure_layouts(settings, tmp_path)
    assert set(rows.layout) == {"torch", "input-major"} and set(rows.method) == {"plain", "ngram@3"}
    assert rows.same_as_plain.all()
    again = measure_layouts(settings, tmp_path)  # resumed: the finished turn is not measured twice
    pd.testing.assert_frame_equal(rows, again)
    summary = summarize_layouts(rows)
    assert len(summary) == 4 and (summary.verify_steps > 0).all()


def test_layout_settings_refuse_peers_and_runs_without_the_row_major_reference(target, tmp_path):
    with pytest.raises(ValueError, match="methods must be ours"):
        LayoutSettings(methods="hf-prompt-lookup:10")
    with pytest.raises(ValueError, match="include 'torch'"):
        LayoutSettings(layouts=("input-major", "onednn-packed"))
    with pytest.raises(ValueError, match="column-major"):
        LayoutSettings(layouts=("torch", "column-major"))
    measure_layouts(LayoutSettings(benchmarks=("math",), methods="ngram:3", n_prompts=1, max_new_tokens=2), tmp_path)
    with pytest.raises(ValueError, match="other settings"):  # resuming with other layouts would mix two runs
        measure_layouts(LayoutSettings(benchmarks=("math",), methods="ngram:3", n_prompts=1, max_new_tokens=2,
                                       layouts=("torch", "onednn-packed")), tmp_path)


def test_bench_refuses_a_target_in_another_layout_than_its_settings(target, tmp_path):
    model, tokenizer = target
    assert layout_of(model) == "torch"
    with pytest.raises(ValueError, match="linear_layout='input-major'"):
        run_bench(BenchSettings(linear_layout="input-major"), tmp_path, model, tokenizer)
    assert not any(tmp_path.iterdir())  # refused before anything was written
