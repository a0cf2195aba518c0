"""Verification-length policies and the hardware-aware prefix scheduler (paper Algorithm 1).

Exact: the Appendix A counterexample. Statistical: the scheduler with token-dependent confidences
keeps the output distribution equal to the target's (chi-square, as in test_verification_stats),
and the retrospective variant without the early stop fails the same test (negative control).
"""

import pytest
import torch

from dspark_core import SamplingConfig, verify_chain
from dspark_core.core.rounds import Draft
from dspark_core.decode.policies import (
    ConfidenceThreshold,
    FixedLength,
    HardwareAware,
    SurvivalThreshold,
    first_token_law,
    forward_tokens,
    schedule_prefixes,
)

from .test_verification_stats import N, goodness_of_fit
from .toy import tables, target_joint


def draft_with(confidences: list[float]) -> Draft:
    g = len(confidences)
    return Draft(torch.zeros(g, dtype=torch.long), torch.full((g, 2), 0.5), torch.tensor(confidences))


# ------------------------------------------------------------------------------------ Appendix A
APPENDIX = {1: 1.0, 2: 0.5, 3: 0.45}
APPENDIX_SPS = APPENDIX.__getitem__


@pytest.mark.parametrize("lossy, expected", [(True, (0.85, 0.15)), (False, (0.7, 0.3))])
def test_appendix_a_counterexample_exactly(lossy, expected):
    p, q = torch.tensor([0.7, 0.3], dtype=torch.float64), torch.tensor([0.5, 0.5], dtype=torch.float64)
    c2 = {0: 0.9, 1: 0.0}  # x1 = A gives a confident continuation, x1 = B a hopeless one
    law = first_token_law(p, q, lambda x: torch.tensor([0.8, c2[x]], dtype=torch.float64),
                          HardwareAware(2, lambda tokens, requests: APPENDIX[tokens], lossy_retrospective=lossy))
    assert torch.allclose(law, torch.tensor(expected, dtype=torch.float64), atol=1e-12)


def test_appendix_a_throughputs():
    assert schedule_prefixes([torch.tensor([0.8, 0.72])], APPENDIX_SPS) == [0]
    assert schedule_prefixes([torch.tensor([0.8, 0.72])], APPENDIX_SPS, lossy_retrospective=True) == [2]
    assert schedule_prefixes([torch.tensor([0.8, 0.0])], APPENDIX_SPS, lossy_retrospective=True) == [0]


# ----------------------------------------------------------------------------------- unit tests
def test_admitted_lengths_are_prefixes_within_gamma():
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        requests = int(torch.randint(1, 6, (1,), generator=gen))
        survivals = [torch.cumprod(torch.rand(int(torch.randint(1, 8, (1,), generator=gen)), generator=gen), 0)
                     for _ in range(requests)]
        slope = float(torch.rand(1, generator=gen)) * 0.2
        lengths = schedule_prefixes(survivals, lambda b, slope=slope: 1.0 / (1 + slope * b))
        assert all(0 <= n <= len(s) for n, s in zip(lengths, survivals))


def test_admission_follows_survival_order():
    """Whatever is admitted has survival >= anything not admitted (across requests)."""
    survivals = [torch.tensor([0.9, 0.5, 0.1]), torch.tensor([0.95, 0.7, 0.6]), torch.tensor([0.3])]
    lengths = schedule_prefixes(survivals, lambda b: 1.0 / (1 + 0.12 * b))
    admitted = [float(s[j]) for s, n in zip(survivals, lengths) for j in range(n)]
    left = [float(s[j]) for s, n in zip(survivals, lengths) for j in range(n, len(s))]
    assert admitted and left and min(admitted) >= max(left)


def test_flat_profile_admits_everything_and_steep_admits_little():
    survivals = [torch.tensor([0.9, 0.8, 0.5, 0.2]), torch.tensor([0.6, 0.3])]
    assert schedule_prefixes(survivals, lambda b: 1.0) == [4, 2]
    assert schedule_prefixes(survivals, lambda b: 1.0 / b**2) == [0, 0]


def test_simple_policies():
    draft = draft_with([0.9, 0.8, 0.3, 0.9])
    assert FixedLength(3).verify_length(draft, 10) == 3
    assert ConfidenceThreshold(4, 0.5).verify_length(draft, 10) == 2
    assert SurvivalThreshold(4, 0.7).verify_length(draft, 10) == 2  # 0.9, 0.72, 0.216
    assert SurvivalThreshold(4, 0.7).verify_length(draft, 1) == 1
    assert HardwareAware(4, lambda b, r: 1.0).verify_length(draft, 10) == 4
    assert HardwareAware(4, lambda b, r: 1.0).verify_length(draft, 2) == 2
    with pytest.raises(ValueError, match="confidence head"):
        ConfidenceThreshold(4, 0.5).verify_length(Draft(draft.tokens, draft.probs), 10)


def test_stop_rule_agrees_with_verify_length():
    """A drafter that stops at the first position ``admit`` rejects drafts exactly what the policy
    would verify of the full draft, for every single-request policy."""
    gen = torch.Generator().manual_seed(1)
    steep = {b: 1.0 / (1 + 0.25 * (b - 1) ** 1.5) for b in range(1, 10)}
    policies = [FixedLength(5), ConfidenceThreshold(6, 0.4), SurvivalThreshold(7, 0.3),
                HardwareAware(7, lambda b, r: steep[b]), HardwareAware(7, lambda b, r: 1.0 / b**0.3)]
    for _ in range(300):
        confidences = torch.rand(7, generator=gen).pow(0.3).tolist()
        for policy in policies:
            stop = 0
            while stop < 7 and policy.admit(confidences[: stop + 1]):
                stop += 1
            assert policy.verify_length(draft_with(confidences), 10) == min(stop, policy.gamma), policy


# ---------------------------------------------------------------------------------- statistical
VOCAB, GAMMA, LENGTH = 4, 3, 3


# SPS profiles: with VARIED the early-stopping scheduler verifies 1, 2 or 3 tokens depending on the
# drafted tokens; with APPENDIX_LIKE it verifies nothing, while the retrospective variant verifies 2
# tokens exactly when x_1 leads to a confident continuation (the Appendix A selection bias).
VARIED = {1: 1.0, 2: 0.6, 3: 0.45, 4: 0.4}
APPENDIX_LIKE = {1: 1.0, 2: 0.5, 3: 0.45, 4: 0.3}


def scheduled_histogram(profile: dict, lossy: bool, seed: int = 5) -> tuple[dict, dict, set]:
    """One round with the hardware-aware policy, c_1 = 0.8 and c_{k+1} = table[x_k] (token-dependent),
    then plain target sampling up to LENGTH tokens. Returns counts, the target joint and the set of
    verification lengths the policy chose."""
    target, draft = tables(VOCAB, SamplingConfig(1.0), seed, dtype=torch.float32)
    confidence_after = torch.tensor([0.95, 0.05, 0.9, 0.1])
    policy = HardwareAware(GAMMA, lambda tokens, requests: profile[tokens], lossy_retrospective=lossy)
    gen = torch.Generator().manual_seed(seed)
    counts: dict[tuple[int, ...], int] = {}
    lengths = set()
    for _ in range(N):
        prev, drafted, rows, conf = 0, [], [], []
        for _ in range(GAMMA):
            conf.append(0.8 if not drafted else float(confidence_after[prev]))
            token = int(torch.multinomial(draft[prev], 1, generator=gen))
            drafted.append(token)
            rows.append(draft[prev])
            prev = token
        proposal = Draft(torch.tensor(drafted), torch.stack(rows), torch.tensor(conf))
        length = policy.verify_length(proposal, GAMMA)
        lengths.add(length)
        contexts = [0] + drafted[:length]
        verdict = verify_chain(proposal.tokens[:length], proposal.probs[:length], target[contexts], gen)
        out = verdict.tokens[:LENGTH]
        while len(out) < LENGTH:
            out.append(int(torch.multinomial(target[out[-1]], 1, generator=gen)))
        counts[tuple(out)] = counts.get(tuple(out), 0) + 1
    return counts, target_joint(target.double(), 0, LENGTH), lengths


@pytest.mark.slow  # a chi-square test over sampled rounds
@pytest.mark.parametrize("profile", [VARIED, APPENDIX_LIKE], ids=["varied", "appendix-like"])
def test_hardware_aware_scheduler_is_lossless(profile):
    counts, joint, lengths = scheduled_histogram(profile, lossy=False)
    pvalue, tv = goodness_of_fit(counts, joint)
    assert pvalue > 1e-3 and tv < 0.03, f"p = {pvalue:.2e}, TV = {tv:.4f}"
    if profile is VARIED:
        assert lengths == {1, 2, 3}, lengths  # the test exercises data-dependent lengths


@pytest.mark.slow  # a chi-square test over sampled rounds
def test_retrospective_scheduler_is_detected():
    counts, joint, lengths = scheduled_histogram(APPENDIX_LIKE, lossy=True)
    pvalue, tv = goodness_of_fit(counts, joint)
    assert lengths == {0, 2}
    assert pvalue < 1e-6, f"the lossy scheduler passed (p = {pvalue:.2e}, TV = {tv:.4f})"


def test_padded_rows_price_what_the_engine_runs():
    """The engine pads every row to the longest, so the scheduler prices R x (1 + max l) tokens. Priced as
    flattened rows (R + sum l), one confident request's long prefix looks cheap and the padded batch it
    causes is slower than what the padded pricing picks."""
    assert forward_tokens([3, 0, 1]) == 3 * 4 and forward_tokens([3, 0, 1], "flattened") == 3 + 4
    survivals = [torch.tensor([0.9, 0.8, 0.7]).cumprod(0), torch.tensor([0.05])]

    def sps(tokens):
        return 1.0 / (1 + 0.3 * tokens)

    def engine_throughput(lengths):  # expected tokens per second of the batch the engine runs
        expected = len(lengths) + sum(float(s[:n].sum()) for s, n in zip(survivals, lengths))
        return expected * sps(forward_tokens(lengths, "padded"))

    padded, flattened = schedule_prefixes(survivals, sps, "padded"), schedule_prefixes(survivals, sps, "flattened")
    assert (padded, flattened) == ([1, 0], [3, 0])
    assert engine_throughput(padded) > engine_throughput(flattened)
    with pytest.raises(ValueError, match="rows must be one of"):
        HardwareAware(3, lambda tokens, requests: 1.0, rows="ragged")

