"""The batched engine: every request's greedy output equals plain greedy decoding of it alone,
with requests of different lengths, finishing mid-batch and joining late."""

import pytest
import torch

from dspark_core import FixedLength, NgramDrafter, autoregressive_generate
from dspark_core.decode.engine import BatchedEngine
from dspark_core.decode.policies import HardwareAware
from dspark_core.drafters.registry import build_drafter

MAX_NEW = [40, 12, 40, 25, 40]  # request 1 finishes early; with max_batch 3, requests 3 and 4 join later


@pytest.fixture(scope="module")
def plain_outputs(target, prompts, eos):
    model, _ = target
    return [autoregressive_generate(model, p, max_new_tokens=n, eos_token_ids=eos).tokens
            for p, n in zip(prompts, MAX_NEW)]


def serve(model, prompts, eos, policy, make_drafter):
    engine = BatchedEngine(model, policy, make_drafter, eos_token_ids=eos, max_batch=3)
    for prompt, n in zip(prompts, MAX_NEW):
        engine.submit(prompt, n)
    return engine, engine.run()


@pytest.mark.parametrize("policy", [FixedLength(0), FixedLength(4)], ids=["plain", "ngram-4"])
def test_batched_greedy_equals_plain_per_request(target, prompts, eos, plain_outputs, policy):
    model, _ = target
    engine, done = serve(model, prompts, eos, policy, NgramDrafter if policy.gamma else None)
    assert [r.result.tokens for r in done] == plain_outputs
    assert engine.rounds < sum(MAX_NEW)  # requests really shared rounds
    assert not engine.active and not engine.waiting


def test_hardware_aware_batch_with_confidences(target, prompts, eos, plain_outputs):
    """A drafter with confidences under the batch scheduler (steep cost: budgets vary by request)."""
    model, _ = target

    class Confident(NgramDrafter):
        def propose(self, *args):
            draft = super().propose(*args)
            draft.confidences = torch.linspace(0.9, 0.3, len(draft)) if len(draft) else None
            return draft

    policy = HardwareAware(4, lambda tokens, requests: 1.0 / (1 + 0.05 * tokens))
    engine, done = serve(model, prompts, eos, policy, Confident)
    assert [r.result.tokens for r in done] == plain_outputs
    assert len(set(engine.budgets)) > 1


def test_rounds_without_drafting_keep_the_drafter_context(target, prompts, eos, plain_outputs):
    """With two or more requests this cost profile makes even a certain draft token not worth its
    slot, so the engine skips drafting; once a request is alone it drafts again, and the dspark
    drafter first catches up on the target features of every token it did not see."""
    model, tokenizer = target
    policy = HardwareAware(4, lambda tokens, requests: 1.0 if requests == 1 else 1.0 / tokens)
    engine, done = serve(model, prompts, eos, policy, lambda: build_drafter("dspark", model, tokenizer))
    assert [r.result.tokens for r in done] == plain_outputs
    rounds = [r for request in done for r in request.result.rounds]
    assert any(r.proposed == 0 for r in rounds) and any(r.proposed > 0 for r in rounds)


def test_lookup_first_in_the_batch_equals_plain_per_request(target, prompts, eos, plain_outputs):
    """Prompt lookup in front of the shipped dspark-markov, one per request: copied and drafted rounds
    interleave across the batch, and each request's output is still plain greedy decoding's."""
    model, tokenizer = target
    engine, done = serve(model, prompts, eos, FixedLength(7), lambda: build_drafter("dspark+ngram", model, tokenizer))
    assert [r.result.tokens for r in done] == plain_outputs
    rounds = [r for request in done for r in request.result.rounds if r.proposed]
    assert any(r.confidences is None for r in rounds) and any(r.confidences is not None for r in rounds)
