import pytest
import torch

from dspark_core import SamplingConfig, probs_from_logits
from dspark_core.core.sampling import sample_from_logits

from .stats import chi_square_p


def test_greedy_is_one_hot_on_first_argmax():
    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0]])
    assert probs_from_logits(logits, SamplingConfig(0.0)).tolist() == [[0.0, 1.0, 0.0, 0.0]]


def test_temperature_softmax():
    logits = torch.tensor([1.0, 2.0, 3.0])
    expected = torch.softmax(logits / 0.5, dim=-1)
    assert torch.allclose(probs_from_logits(logits, SamplingConfig(0.5)), expected)


def test_top_k_keeps_k_and_renormalises():
    logits = torch.tensor([0.1, 3.0, 2.0, -1.0, 1.0])
    probs = probs_from_logits(logits, SamplingConfig(1.0, top_k=2))
    assert (probs > 0).nonzero().flatten().tolist() == [1, 2]
    assert torch.allclose(probs[[1, 2]], torch.softmax(logits[[1, 2]], dim=-1))


def test_top_p_keeps_smallest_set_reaching_mass():
    probs_in = torch.tensor([0.5, 0.3, 0.15, 0.05])
    probs = probs_from_logits(probs_in.log(), SamplingConfig(1.0, top_p=0.8))
    assert probs.tolist() == pytest.approx([0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0])
    probs = probs_from_logits(probs_in.log(), SamplingConfig(1.0, top_p=0.81))
    assert probs.tolist() == pytest.approx([0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0])


@pytest.mark.parametrize("kwargs", [dict(temperature=-1.0), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5)])
def test_invalid_sampling_config(kwargs):
    with pytest.raises(ValueError):
        SamplingConfig(**kwargs)


def _chi_square_p(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of the drawn tokens' counts against ``probs`` (a draw outside its support fails)."""
    return chi_square_p(torch.bincount(tokens, minlength=len(probs)).numpy(), probs.double().numpy())


@pytest.mark.parametrize("row", ["nucleus inside the candidates", "nucleus beyond them (full distribution)"])
def test_sampling_among_candidates_has_the_law_of_probs_from_logits(row):
    # 64 tokens, 8 candidates. Peaked: 0.4, 0.3, 0.2 hold 0.9 >= top_p 0.85, the nucleus is those three (the mass
    # ranked before the 0.06 token is 0.9). Flat: the top 8 hold 1/8, so the row falls back to the whole vocabulary.
    base = torch.full((64,), 0.04 / 60)
    base[[5, 17, 40, 2]] = torch.tensor([0.4, 0.3, 0.2, 0.06])
    logits = (base.log() if row.startswith("nucleus inside") else torch.zeros(64)) * 0.7
    config = SamplingConfig(0.7, top_p=0.85)
    draws = 40_000
    generator = torch.Generator().manual_seed(0)
    tokens = sample_from_logits(logits.expand(draws, 64), config, generator, candidates=8)
    expected = probs_from_logits(logits, config)
    assert _chi_square_p(tokens, expected) > 1e-3  # a wrong law of this size fails by hundreds of sigmas
    if row.startswith("nucleus inside"):
        assert sorted(tokens.unique().tolist()) == [5, 17, 40]


def test_sampling_among_candidates_is_seeded_and_greedy_is_the_argmax():
    logits = torch.randn(32, 1000, generator=torch.Generator().manual_seed(1)) * 4
    config = SamplingConfig(0.7, top_p=0.8)
    first = sample_from_logits(logits, config, torch.Generator().manual_seed(3))
    assert torch.equal(first, sample_from_logits(logits, config, torch.Generator().manual_seed(3)))
    assert torch.equal(sample_from_logits(logits, SamplingConfig(0.0)), logits.argmax(-1))


def test_a_batch_mixing_both_paths_draws_each_row_from_its_own_law():
    # four distinct rows over 64 tokens, 8 candidates, interleaved 4,000 times: rows 0 and 2 hold their nucleus in
    # their top 8 (each on other tokens), rows 1 and 3 do not (the whole-distribution path), so every batch mixes them
    generator = torch.Generator().manual_seed(5)
    peaked = torch.full((64,), 0.1 / 60).log()
    peaked[:4] = torch.tensor([0.45, 0.25, 0.15, 0.05]).log()
    rows = torch.stack([peaked[torch.randperm(64, generator=generator)], torch.randn(64, generator=generator) * 0.3,
                        peaked[torch.randperm(64, generator=generator)], torch.randn(64, generator=generator) * 0.3])
    config = SamplingConfig(1.0, top_p=0.8)
    assert [bool(probs_from_logits(r, config).topk(8).values.sum() >= 0.8) for r in rows] == [True, False, True, False]
    tokens = sample_from_logits(rows.repeat(4_000, 1), config, torch.Generator().manual_seed(0), candidates=8)
    for r in range(4):
        assert _chi_square_p(tokens[r::4], probs_from_logits(rows[r], config)) > 1e-3, f"row {r}"


def test_sample_from_logits_wants_rows():
    with pytest.raises(ValueError, match=r"logits \[N, V\]"):
        sample_from_logits(torch.zeros(10), SamplingConfig(0.7, top_p=0.8))
