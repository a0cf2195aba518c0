"""Exact algebra: the verifier's rule reproduces the target distribution to 1e-6."""

import pytest
import torch

from dspark_core import SamplingConfig, probs_from_logits, verify_chain
from dspark_core.core.lossy import threshold_acceptance, verify_chain_threshold
from dspark_core.core.verification import acceptance_probability, residual

from .toy import law_errors, tables

VOCAB = 5
CONFIGS = {
    "temperature 1": (SamplingConfig(1.0), False),
    "top-k 3": (SamplingConfig(1.0, top_k=3), False),
    "top-p 0.7": (SamplingConfig(1.0, top_p=0.7), False),
    "temperature 0.6": (SamplingConfig(0.6), False),
    "one-hot draft": (SamplingConfig(1.0), True),
    "greedy": (SamplingConfig(0.0), False),
}


TARGET_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def errors(rule: str, gamma: int, sampling: SamplingConfig, one_hot_draft: bool, seed: int,
           target_dtype: torch.dtype | None = None) -> tuple[float, float]:
    """Max absolute error and total-variation distance between the output and target joint over gamma + 1 tokens."""
    return law_errors(*tables(VOCAB, sampling, seed, one_hot_draft, target_dtype=target_dtype), gamma, rule)


@pytest.mark.parametrize("target_dtype", TARGET_DTYPES)
@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("gamma", [1, 3])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_output_distribution_equals_target(name, gamma, seed, target_dtype):
    """Exact with respect to the target as it runs: its logits rounded through its dtype (bfloat16
    coarsens them to 8 significant bits and makes ties) give the distribution p the rule reproduces."""
    sampling, one_hot_draft = CONFIGS[name]
    assert errors("exact", gamma, sampling, one_hot_draft, seed, TARGET_DTYPES[target_dtype])[0] < 1e-6


@pytest.mark.parametrize("target_dtype", TARGET_DTYPES)
@pytest.mark.parametrize("gamma", [1, 3])
def test_lossy_threshold_rule_is_not_lossless(gamma, target_dtype):
    """Negative control: the tutorial rule changes the distribution, and the check above sees it."""
    max_abs, tv = errors("lossy-threshold", gamma, SamplingConfig(1.0), False, seed=0,
                         target_dtype=TARGET_DTYPES[target_dtype])
    assert max_abs > 1e-3 and tv > 1e-2  # the exact rule is below 1e-6 on the same check


def test_acceptance_probability_values():
    p, q = torch.tensor([0.2, 0.6, 0.3]), torch.tensor([0.4, 0.3, 0.0])
    assert acceptance_probability(p, q).tolist() == pytest.approx([0.5, 1.0, 0.0])


def test_residual_values():
    p, q = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.5, 0.3])
    assert residual(p, q).tolist() == pytest.approx([1.0, 0.0, 0.0])
    assert residual(p, p).tolist() == pytest.approx(p.tolist())


def test_draft_token_with_zero_q_is_rejected():
    target = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    verdict = verify_chain(torch.tensor([1]), torch.tensor([[1.0, 0.0, 0.0]]), target, torch.Generator().manual_seed(0))
    assert verdict.accepted == 0 and verdict.tokens == [1]


def test_greedy_accepts_while_draft_equals_argmax():
    target = torch.eye(4)[[1, 2, 0, 3]]  # argmax after each position: 1, 2, 0, 3
    drafts = torch.tensor([1, 2, 3])
    verdict = verify_chain(drafts, torch.eye(4)[drafts], target, torch.Generator().manual_seed(0))
    assert verdict.accepted == 2 and verdict.tokens == [1, 2, 0]
    verdict = verify_chain(torch.tensor([1, 2, 0]), torch.eye(4)[[1, 2, 0]], target, torch.Generator().manual_seed(0))
    assert verdict.accepted == 3 and verdict.tokens == [1, 2, 0, 3]


def test_eos_and_length_limit_inside_block():
    target = torch.eye(5)[[1, 4, 2, 3]]
    drafts = torch.tensor([1, 4, 2])
    gen = torch.Generator().manual_seed(0)
    verdict = verify_chain(drafts, torch.eye(5)[drafts], target, gen, eos_token_ids=(4,))
    assert verdict.tokens == [1, 4] and verdict.accepted == 2 and verdict.finished
    verdict = verify_chain(drafts, torch.eye(5)[drafts], target, gen, max_tokens=1)
    assert verdict.tokens == [1] and verdict.accepted == 1 and verdict.finished
    verdict = verify_chain(drafts[:0], torch.zeros(0, 5), target[:1], gen, eos_token_ids=(1,))
    assert verdict.tokens == [1] and verdict.accepted == 0 and verdict.finished


def test_shape_errors():
    with pytest.raises(ValueError, match="rows"):
        verify_chain(torch.tensor([1]), torch.eye(3)[[1]], torch.eye(3)[[1]])
    with pytest.raises(ValueError, match="rows"):
        verify_chain_threshold(torch.tensor([1]), torch.eye(3)[[1]], torch.eye(3)[[1]])


def test_threshold_rule_ignores_q():
    """The lossy module: p_x above the threshold, else 0, whatever q says; a draft token with q = 0
    that the exact rule rejects (test above) is accepted when the target is sure of it."""
    assert threshold_acceptance(torch.tensor([0.05, 0.1, 0.3]), 0.1).tolist() == pytest.approx([0.0, 0.0, 0.3])
    target = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    verdict = verify_chain_threshold(torch.tensor([1]), torch.tensor([[1.0, 0.0, 0.0]]), target,
                                     torch.Generator().manual_seed(0), threshold=0.1)
    assert verdict.accepted == 1 and verdict.tokens == [1, 2]


@pytest.mark.parametrize("seed", range(12))
def test_verify_greedy_equals_the_exact_rule_on_one_hot_rows(seed):
    """The greedy path (argmax ids, one vectorised comparison) gives verify_chain's verdict on the
    one-hot rows: ties go to the lowest id, a token with q = 0 is rejected even when it is the argmax,
    EOS and the length limit cut. Drafts agree with the argmax at most positions, so long accepted
    prefixes, rejections at every position and q = 0 argmax tokens all occur over the seeds."""
    from dspark_core.core.verification import verify_greedy

    gen = torch.Generator().manual_seed(seed)
    vocab, length = 6, 4
    logits = torch.randint(0, 3, (length + 1, vocab), generator=gen).float()  # coarse values: many ties
    target = probs_from_logits(logits, SamplingConfig(0.0))
    argmax = logits.argmax(-1)
    guess = torch.randint(0, vocab, (length,), generator=gen)
    drafts = torch.where(torch.rand(length, generator=gen) < 0.7, argmax[:length], guess)
    q = torch.softmax(torch.randn(length, vocab, generator=gen), -1)
    q = q * (torch.rand(length, vocab, generator=gen) > 0.25)  # some drafted tokens have q = 0
    q = q / q.sum(-1, keepdim=True).clamp_min(1e-9)
    for eos, max_tokens in [((), None), ((int(argmax[1]),), None), ((), 2)]:
        expected = verify_chain(drafts, q, target, torch.Generator().manual_seed(seed), eos_token_ids=eos,
                                max_tokens=max_tokens)
        assert verify_greedy(drafts, q, argmax, eos_token_ids=eos, max_tokens=max_tokens) == expected
