import pytest
import torch

from dspark_core import SamplingConfig, probs_from_logits


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
