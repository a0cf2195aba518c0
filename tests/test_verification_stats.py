"""Statistics: sampling the real verifier reproduces the target distribution.

Toy Markov target/draft on V = 4 tokens, gamma = 3 draft positions. Each sample runs one
verification round with ``verify_chain`` and completes the output to 3 tokens with plain target
sampling, so the 64-cell histogram of the first 3 tokens must follow the target's joint.

Test: Pearson chi-square goodness of fit on N = 20,000 samples (seeded), cells with expected count
< 5 pooled. The correct rule must give p-value > 1e-3; the negative control (the residual replaced
by ``p``, "forgetting the residual") must give p-value < 1e-6. Zero-probability cells (top-k/top-p)
must stay empty. Total variation to the target is reported too and must be < 0.03 (its sampling
noise at this N is about 0.015). Both dtypes a target runs in: its logits are rounded through float32
or bfloat16 before ``probs_from_logits``, and the sampled output must follow that target exactly.
"""

import numpy as np
import pytest
import torch

from dspark_core import SamplingConfig, verify_chain
from dspark_core.core import verification

from .stats import chi_square_p
from .toy import tables, target_joint

pytestmark = pytest.mark.slow  # chi-square tests over 20,000 sampled rounds each (about 4 s apiece)

VOCAB, GAMMA, LENGTH, N = 4, 3, 3, 20_000


TARGET_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def sample_histogram(sampling: SamplingConfig, one_hot_draft: bool, seed: int,
                     target_dtype: torch.dtype = torch.float32) -> tuple[dict, dict]:
    target, draft = tables(VOCAB, sampling, seed, one_hot_draft, dtype=torch.float32, target_dtype=target_dtype)
    gen = torch.Generator().manual_seed(seed)
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(N):
        prev, drafted, rows = 0, [], []
        for _ in range(GAMMA):
            token = int(torch.multinomial(draft[prev], 1, generator=gen))
            drafted.append(token)
            rows.append(draft[prev])
            prev = token
        contexts = [0] + drafted
        verdict = verify_chain(torch.tensor(drafted), torch.stack(rows), target[contexts], gen)
        out = verdict.tokens[:LENGTH]
        while len(out) < LENGTH:
            out.append(int(torch.multinomial(target[out[-1]], 1, generator=gen)))
        counts[tuple(out)] = counts.get(tuple(out), 0) + 1
    return counts, target_joint(target.double(), 0, LENGTH)


def goodness_of_fit(counts: dict, joint: dict) -> tuple[float, float]:
    """(chi-square p-value, total variation); raises if a zero-probability cell was hit."""
    impossible = {seq: c for seq, c in counts.items() if joint.get(seq, 0.0) == 0.0}
    assert not impossible, f"samples in zero-probability cells: {impossible}"
    cells = list(joint)
    tv = 0.5 * sum(abs(counts.get(seq, 0) / N - p) for seq, p in joint.items())
    return chi_square_p(np.array([counts.get(seq, 0) for seq in cells]), np.array([joint[seq] for seq in cells])), tv


CONFIGS = {
    "temperature 1": (SamplingConfig(1.0), False),
    "top-k 3": (SamplingConfig(1.0, top_k=3), False),
    "top-p 0.8": (SamplingConfig(1.0, top_p=0.8), False),
    "one-hot draft": (SamplingConfig(1.0), True),
}


@pytest.mark.parametrize("target_dtype", TARGET_DTYPES)
@pytest.mark.parametrize("name", CONFIGS)
def test_sampled_output_matches_target(name, target_dtype):
    counts, joint = sample_histogram(*CONFIGS[name], seed=11, target_dtype=TARGET_DTYPES[target_dtype])
    pvalue, tv = goodness_of_fit(counts, joint)
    assert pvalue > 1e-3, f"{name}: chi-square p = {pvalue:.2e}, TV = {tv:.4f}"
    assert tv < 0.03


@pytest.mark.parametrize("target_dtype", TARGET_DTYPES)
@pytest.mark.parametrize("name", ["temperature 1", "one-hot draft"])
def test_forgetting_the_residual_is_detected(name, target_dtype, monkeypatch):
    """Negative control: resampling from p instead of the residual must fail the same test."""
    monkeypatch.setattr(verification, "residual", lambda p, q: p)
    counts, joint = sample_histogram(*CONFIGS[name], seed=11, target_dtype=TARGET_DTYPES[target_dtype])
    pvalue, tv = goodness_of_fit(counts, joint)
    assert pvalue < 1e-6, f"{name}: the wrong rule passed (p = {pvalue:.2e}, TV = {tv:.4f})"
