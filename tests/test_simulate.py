"""The round simulator: replaying a real CPU run reproduces its tau exactly and its time within the
profile's noise; synthetic rounds, toy profiles and roofline projections give the values the algebra says."""

import numpy as np
import pytest

from dspark_core import FixedLength, NgramDrafter, encode_prompt, speculative_generate
from dspark_core.decode.calibration import Rounds, Scaling
from dspark_core.decode.policies import HardwareAware, SurvivalThreshold
from dspark_core.decode.profile import CostProfile, measure_profile
from dspark_core.decode.roofline import roofline_profile
from dspark_core.decode.shapes import SHAPES
from dspark_core.decode.simulate import (
    calibrated,
    conditional_acceptance,
    project,
    replay,
    rounds_from_acceptance,
    rounds_from_result,
    standard_methods,
)

GAMMA = 4


def toy_profile(ms: list[float], requests: tuple[int, ...] = (1,)) -> CostProfile:
    """A profile whose forward of n tokens per request takes ms[n - 1] milliseconds at every R."""
    return CostProfile(machine={}, device="cpu", context=1, steps={str(r): [1000 / t for t in ms] for r in requests},
                       tokens=list(range(1, len(ms) + 1)), draft={"1": {str(r): 0.002 for r in requests}})


def test_replaying_a_real_run_gives_its_tau_exactly_and_its_time_within_the_noise(target):
    model, tokenizer = target
    prompt = encode_prompt(tokenizer, "Write a Python function that returns the n-th Fibonacci number, then call it "
                                      "for n = 1 to 10.")
    # Three runs (the same rounds: greedy, fp32) interleaved with three profiles, so that a machine that speeds up
    # or slows down between a run and its profile moves both sides; their medians are compared.
    real, simulated, noise = [], [], []
    for _ in range(3):
        result = speculative_generate(model, prompt, NgramDrafter(), FixedLength(GAMMA), max_new_tokens=64, seed=0)
        assert sum(r.emitted for r in result.rounds) == sum(r.accepted + 1 for r in result.rounds)  # no EOS cut
        profile = measure_profile(model, (1,), context=len(prompt) + len(result.tokens) // 2, repeats=5,
                                  tokens=range(1, GAMMA + 2))
        replayed = replay(rounds_from_result(result), "fixed", FixedLength(GAMMA), profile, 1, lambda requests: 0.0)
        assert replayed.tau == result.tau
        assert replayed.steps == len(result.rounds)
        assert replayed.verified == sum(r.verified for r in result.rounds)
        # Time: the run's verification time against the profile's forwards. The n-gram drafter's own time is
        # negligible (checked) and simulated as 0.
        real.append(sum(r.verify_time for r in result.rounds))
        assert sum(r.draft_time for r in result.rounds) < 0.02 * real[-1]
        simulated.append(replayed.seconds)
        noise.append(max(profile.spread["1"][r.verified] for r in result.rounds))
    # The loop's verify time also holds sampling, the acceptance test and the rollback, a few percent, hence
    # the 10% floor; a simulator off by a constant factor (a forward of n tokens priced as n forwards, or the
    # wrong context) lands far outside it.
    ratio = float(np.median(simulated) / np.median(real))
    assert abs(ratio - 1) <= max(0.10, 2 * float(np.median(noise))), (simulated, real, noise)


def test_synthetic_rounds_follow_the_given_acceptance():
    alpha = [0.9, 0.8, 0.7]
    rounds = rounds_from_acceptance(alpha, 40000, seed=1)
    assert np.allclose(conditional_acceptance(rounds), alpha, atol=0.01)
    expected_tau = 1 + np.cumprod(alpha).sum()
    flat = toy_profile([10.0] * 4)
    tau = replay(rounds, "fixed-3", FixedLength(3), flat, 1, lambda r: 0.0).tau
    assert tau == pytest.approx(expected_tau, abs=0.02)


def test_the_scheduler_verifies_what_pays_for_itself():
    rounds = rounds_from_acceptance([0.9, 0.9, 0.9], 200, seed=0)
    free = toy_profile([10.0] * 4)  # verifying more costs nothing: the scheduler verifies the whole block
    steep = toy_profile([10.0, 40.0, 80.0, 120.0])  # a second token costs 3 forwards: verify nothing
    no_draft = lambda requests: 0.0  # noqa: E731
    full = replay(rounds, "hw", HardwareAware(3, free.steps_per_second), free, 1, no_draft)
    assert full.verified == 3 * 200
    assert full.tau == replay(rounds, "fixed-3", FixedLength(3), free, 1, no_draft).tau
    skipped = replay(rounds, "hw", HardwareAware(3, steep.steps_per_second), steep, 1, lambda r: 1.0)
    assert (skipped.verified, skipped.tau, skipped.draft_seconds) == (0, 1.0, 0.0)  # drafting skipped as well


def test_rows_per_method_and_concurrency():
    profile = toy_profile([10.0, 11.0, 12.0, 13.0, 14.0, 30.0, 40.0, 50.0], requests=(1, 2, 4))
    rounds = calibrated(rounds_from_acceptance([0.8] * 7, 400, seed=0), Scaling(np.ones(7), np.zeros(7)))
    methods = standard_methods(7, [0.3, 0.6], profile.steps_per_second)
    assert list(methods) == ["plain", *[f"fixed-{g}" for g in range(1, 8)], "survival-0.3", "survival-0.6", "hw-7"]
    rows = project(rounds, methods, profile, [1, 2, 4], lambda r: profile.draft_seconds(1, r))
    assert len(rows) == len(methods) * 3
    plain = [r for r in rows if r["method"] == "plain"]
    assert all(r["tau"] == 1 and r["speedup"] == pytest.approx(1) and r["draft_share"] == 0 for r in plain)
    for row in rows:
        assert row["total_tps"] == pytest.approx(row["per_user_tps"] * row["R"])


def test_clear_errors():
    rounds = rounds_from_acceptance([0.8, 0.8], 10)
    profile = toy_profile([10.0, 11.0, 12.0])
    with pytest.raises(ValueError, match="exceeds the 2 positions"):
        replay(rounds, "fixed-3", FixedLength(3), profile, 1, lambda r: 0.0)
    with pytest.raises(ValueError, match="cannot fill a step"):
        replay(rounds, "fixed-2", FixedLength(2), profile, 64, lambda r: 0.0)
    no_confidence = Rounds(np.full((10, 2), np.nan), rounds.verified, rounds.accepted, rounds.prompt, rounds.domain)
    with pytest.raises(ValueError, match="reads confidences"):
        replay(no_confidence, "survival", SurvivalThreshold(2, 0.5), profile, 1, lambda r: 0.0)
    with pytest.raises(ValueError, match="probabilities"):
        rounds_from_acceptance([1.5], 10)


def test_a_roofline_profile_is_flat_until_compute_bound():
    shape = SHAPES["qwen3-4b"]
    bandwidth, peak = 4.8e12, 989e12
    profile = roofline_profile(shape, "H200", bandwidth, peak, requests=[1, 64], tokens=[1, 16], context=1024)
    weights = 2 * shape.parameters / bandwidth  # tied embeddings: every weight read once, in bfloat16
    assert profile.forward_seconds(1, 1) == pytest.approx(weights + 2 * 1024 * 2 * 36 * 8 * 128 / bandwidth)
    assert profile.forward_seconds(16, 1) == profile.forward_seconds(1, 1)  # 16 tokens cost what 1 does
    assert profile.forward_seconds(16, 64) == pytest.approx(2 * shape.parameters * 64 * 16 / peak, rel=0.1)
    assert 0 < profile.draft_seconds(1, 1) < profile.draft_seconds(5, 1) < profile.forward_seconds(1, 1)
    rounds = rounds_from_acceptance([0.9] * 7, 64)
    assert replay(rounds, "fixed-7", FixedLength(7), profile, 64, lambda r: profile.draft_seconds(5, r)).tau > 3


def test_flattened_batches_cost_what_their_tokens_do():
    profile = toy_profile([10.0, 12.0, 14.0, 16.0], requests=(4,))
    assert profile.steps_per_second(5, 4) == pytest.approx(1000 / 12.0)  # 5 tokens over 4 rows: 2 per row, rounded up
    assert profile.flattened_steps_per_second(5, 4) == pytest.approx(1000 / 10.5)  # 1.25 per row
    assert profile.flattened_steps_per_second(8, 4) == profile.steps_per_second(8, 4)
    # The early stop of Algorithm 1 ends at the first admission that does not pay. With padded rows, the token
    # that lengthens the longest row costs as if every row grew, so the scheduler stops at one draft token per
    # request; with flattened batches every token costs its share and it verifies more.
    rounds = rounds_from_acceptance([0.95] * 3, 400, seed=0)
    lengths = {}
    for rows, sps in [("padded", profile.steps_per_second), ("flattened", profile.flattened_steps_per_second)]:
        policy = HardwareAware(3, sps, rows)
        lengths[rows] = replay(rounds, "hw", policy, profile, 4, lambda r: 0.0, steps_per_second=sps, rows=rows).verified
    assert (lengths["padded"], lengths["flattened"]) == (1 * 4 * 100, 3 * 4 * 100)
