"""Decoding on the real default target (fp32, CPU): greedy identity, oracle tau, KV rollback."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from dspark_core import (
    CausalLMSession,
    DraftLMDrafter,
    FixedLength,
    NgramDrafter,
    OracleDrafter,
    SamplingConfig,
    autoregressive_generate,
    speculative_generate,
)

MAX_NEW = 64


def random_draft_lm(vocab_size: int) -> LlamaForCausalLM:
    """A tiny randomly initialised Llama with the target's vocabulary (trained weights come later)."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def plain_outputs(target, prompts, eos):
    model, _ = target
    return [autoregressive_generate(model, p, max_new_tokens=MAX_NEW, eos_token_ids=eos).tokens for p in prompts]


def test_plain_equals_model_generate(target, prompts, plain_outputs):
    model, tokenizer = target
    for prompt, plain in zip(prompts, plain_outputs):
        ids = prompt[None]
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=MAX_NEW,
                             pad_token_id=tokenizer.pad_token_id)
        assert out[0, ids.shape[1]:].tolist() == plain


@pytest.mark.parametrize("drafter_name,gamma", [
    ("ngram", 1), ("ngram", 4), ("ngram", 7),
    ("oracle", 2), ("oracle", 7),
    ("draft-lm", 3),
])
def test_greedy_speculative_equals_plain(target, prompts, eos, plain_outputs, drafter_name, gamma):
    model, tokenizer = target
    for prompt, plain in zip(prompts, plain_outputs):
        if drafter_name == "ngram":
            drafter = NgramDrafter()
        elif drafter_name == "oracle":
            drafter = OracleDrafter(plain)
        else:
            drafter = DraftLMDrafter(random_draft_lm(len(tokenizer)), tokenizer, tokenizer)
        result = speculative_generate(model, prompt, drafter, FixedLength(gamma), max_new_tokens=MAX_NEW,
                                      eos_token_ids=eos)
        assert result.tokens == plain
        assert sum(r.emitted for r in result.rounds) == len(plain)


def test_oracle_full_rounds_emit_gamma_plus_one(target, prompts, eos, plain_outputs):
    model, _ = target
    gamma = 5
    for prompt, plain in zip(prompts, plain_outputs):
        result = speculative_generate(model, prompt, OracleDrafter(plain), FixedLength(gamma),
                                      max_new_tokens=MAX_NEW, eos_token_ids=eos)
        full = [r for r in result.rounds if r.verified == gamma]
        assert full and all(r.accepted == gamma and r.emitted == gamma + 1 for r in full)
        assert all(r.accepted == r.verified for r in result.rounds)


def test_kv_rollback_matches_fresh_forward(target, prompts):
    """After a rejection and rollback, the next forward equals a fresh pass over the committed tokens."""
    model, _ = target
    prompt = prompts[0].tolist()
    session = CausalLMSession(model)
    session.forward(prompt[:-1])
    anchor = prompt[-1]
    step = session.forward([anchor, 11, 22, 33])  # three junk draft tokens
    correction = int(step.logits[0].argmax())
    assert correction != 11, "the junk draft should be rejected at position 1"
    session.rollback(len(prompt))  # keep prompt[:-1] + anchor; the correction becomes the new anchor
    assert session.length == len(prompt)
    after = session.forward([correction]).logits[-1]
    fresh = CausalLMSession(model).forward(prompt + [correction]).logits[-1]
    assert torch.allclose(after, fresh, atol=1e-4), float((after - fresh).abs().max())
    assert int(after.argmax()) == int(fresh.argmax())


def test_sampling_is_seeded_and_speculative_runs_at_temperature_1(target, prompts, eos):
    model, _ = target
    sampling = SamplingConfig(1.0, top_p=0.9)
    runs = [speculative_generate(model, prompts[1], NgramDrafter(), FixedLength(4), sampling=sampling,
                                 max_new_tokens=24, seed=5, eos_token_ids=eos).tokens for _ in range(2)]
    assert runs[0] == runs[1]
    plain = [autoregressive_generate(model, prompts[1], sampling=sampling, max_new_tokens=24, seed=s,
                                     eos_token_ids=eos).tokens for s in (1, 2)]
    assert plain[0] != plain[1]


def test_rounds_record_times_and_counts(target, prompts, eos, plain_outputs):
    model, _ = target
    result = speculative_generate(model, prompts[0], NgramDrafter(), FixedLength(3), max_new_tokens=MAX_NEW,
                                  eos_token_ids=eos)
    assert all(0 <= r.accepted <= r.verified <= r.proposed <= 3 for r in result.rounds)
    assert all(r.draft_time >= 0 and r.verify_time > 0 for r in result.rounds)
    reached, accepted = result.position_counts(3)
    assert all(a <= r for a, r in zip(accepted, reached))
    assert reached[0] == sum(1 for r in result.rounds if r.verified >= 1)


def test_round_parts_tile_the_generation(target, prompts, eos):
    """A round's parts (draft, forward, probs, accept, cache, other) tile the decoding time without
    gaps: with the prefill they add up to total_time, less only the recording of the last round."""
    model, _ = target
    result = speculative_generate(model, prompts[0], NgramDrafter(), FixedLength(3), max_new_tokens=24,
                                  eos_token_ids=eos)
    for r in result.rounds:
        assert r.forward_time > 0 and r.probs_time > 0 and r.accept_time > 0 and r.cache_time > 0
        assert r.verify_time == pytest.approx(r.forward_time + r.probs_time + r.accept_time + r.cache_time)
    covered = sum(result.time_split().values())
    assert covered <= result.total_time < covered + 0.02 * result.total_time + 5e-3


@pytest.mark.parametrize("drafter_name", ["none", "ngram", "oracle"])
def test_static_kv_cache_gives_plain_greedy(target, prompts, eos, plain_outputs, drafter_name):
    """The pre-allocated cache (written in place, rolled back by moving its write position) decodes
    exactly what the dynamic one does, plain decoding included."""
    model, _ = target
    for prompt, plain in zip(prompts[:2], plain_outputs[:2]):
        drafter = {"none": None, "ngram": NgramDrafter(), "oracle": OracleDrafter(plain)}[drafter_name]
        result = speculative_generate(model, prompt, drafter, FixedLength(5) if drafter else None,
                                      max_new_tokens=MAX_NEW, eos_token_ids=eos, kv_cache="static")
        assert result.tokens == plain


def test_static_kv_cache_refuses_more_than_it_holds(target, prompts):
    model, _ = target
    session = CausalLMSession(model, kv_cache="static", max_length=4)
    session.forward([1, 2, 3])
    session.rollback(1)
    assert session.length == 1
    with pytest.raises(ValueError, match="holds 4 tokens"):
        session.forward([4, 5, 6, 7])
    with pytest.raises(ValueError, match="max_length"):
        CausalLMSession(model, kv_cache="static")
