"""Sequential Temperature Scaling and its metrics, on synthetic rounds with a known miscalibration."""

import numpy as np
import pytest

from dspark_core.decode.calibration import (
    Rounds,
    Scaling,
    auc,
    brier,
    cross_fit,
    ece,
    ece_floor,
    fit_sts,
    fit_sts_with_bias,
    position_metrics,
    reliability,
    survival_brier,
)


def test_metrics_on_hand_computed_values():
    pred = np.array([0.1, 0.4, 0.35, 0.8])
    label = np.array([False, False, True, True])
    assert auc(pred, label) == pytest.approx(0.75)  # pairs (pos > neg): 0.8>0.1, 0.8>0.4, 0.35>0.1
    assert brier(pred, label) == pytest.approx((0.01 + 0.16 + 0.4225 + 0.04) / 4)
    # two bins: [0, 0.5) holds 0.1, 0.4, 0.35 (mean 0.2833, rate 1/3); [0.5, 1] holds 0.8 (rate 1)
    assert ece(pred, label, bins=2) == pytest.approx(0.75 * abs(0.85 / 3 - 1 / 3) + 0.25 * 0.2)


def synthetic_rounds(n: int = 20_000, g: int = 5, true_temperature: float = 2.5, true_bias: float = 0.0,
                     seed: int = 0) -> Rounds:
    """Raw confidences are miscalibrated: the real conditional acceptance is sigma(logit(c) / T + b)."""
    rng = np.random.default_rng(seed)
    raw = 1 / (1 + np.exp(-rng.normal(1.5, 1.5, size=(n, g))))
    true = Scaling(np.full(g, true_temperature), np.full(g, true_bias))(raw)
    survived = np.cumprod(rng.random((n, g)) < true, axis=1)
    return Rounds(raw, np.full(n, g), survived.sum(1), np.arange(n) // 50, np.full(n, "synthetic"))


def test_sts_recovers_the_temperature_and_halves_ece():
    rounds = synthetic_rounds()
    scaling = fit_sts(rounds)
    assert np.allclose(scaling.temperatures, 2.5, rtol=0.3), scaling  # ECE grid search is noisy deep in the block
    assert scaling.method == "sts" and not scaling.biases.any()
    before, after = position_metrics(rounds), position_metrics(rounds, scaling)
    for b, a in zip(before, after):
        assert a["ece"] < 0.5 * b["ece"], (b, a)
        assert a["brier"] <= b["brier"] + 1e-9
    assert after[0]["auc"] == pytest.approx(before[0]["auc"])  # order-preserving at position 1


def test_cross_fit_serves_sts_only_where_it_beats_the_raw_confidences_on_held_out_rounds():
    """A head that is off (real acceptance at temperature 2.5) gets its fit in both directions; a head that is
    already calibrated, on a thousand rounds as `dspark calibrate` collects, keeps its raw confidences (the fit
    only follows the noise of its half) unless the fit is asked for."""
    scaling, decision = cross_fit(synthetic_rounds(n=4000), fit_sts)
    assert decision["kept"] and scaling.method == "sts" and all(c < 0 for c in decision["held_out_brier_change"])
    calibrated = synthetic_rounds(n=1000, g=3, true_temperature=1.0)
    scaling, decision = cross_fit(calibrated, fit_sts)
    assert not decision["kept"] and scaling.method == "none" and decision["fitted"] == "sts", decision
    assert survival_brier(calibrated, scaling) == pytest.approx(survival_brier(calibrated))
    kept, _ = cross_fit(calibrated, fit_sts, keep_fit=True)
    assert kept.temperatures.tolist() == decision["fitted_temperatures"] != [1.0, 1.0, 1.0]


def test_reliability_bins_cover_every_round():
    rounds = synthetic_rounds(n=2000)
    bins = reliability(rounds, k=2)
    assert sum(b["count"] for b in bins) == 2000
    assert all(0 <= b["observed"] <= 1 and 0 <= b["predicted"] <= 1 for b in bins)


def test_rounds_split_by_prompt_and_round_trip_through_npz(tmp_path):
    rounds = synthetic_rounds(n=500)
    fit, held = rounds.split_by_prompt()
    assert set(fit.prompt % 2) == {0} and set(held.prompt % 2) == {1}
    assert len(fit.verified) + len(held.verified) == 500
    loaded = Rounds.load(rounds.save(tmp_path / "rounds.npz"))
    assert np.allclose(loaded.confidences, rounds.confidences, atol=1e-6)
    assert (loaded.accepted == rounds.accepted).all() and (loaded.domain == "synthetic").all()


def test_ece_floor_is_what_calibrated_labels_score():
    """Labels drawn from the predictions themselves score about the floor; labels from a shifted
    law score well above it."""
    rng = np.random.default_rng(3)
    pred = rng.uniform(0.05, 0.6, size=3000)
    floor = ece_floor(pred)
    assert 0 < floor < 0.05
    calibrated = [ece(pred, rng.random(3000) < pred) for _ in range(20)]
    assert abs(np.mean(calibrated) - floor) < 0.3 * floor
    assert ece(pred, rng.random(3000) < pred + 0.15) > 3 * floor


@pytest.mark.slow  # a grid search over many rounds
def test_a_base_rate_shift_needs_the_bias():
    """When the head is off by a base rate (real acceptance sigma(logit(c) - 1)), temperatures alone
    leave most of the ECE at position 1; with the bias the fit finds b = -1 and halves it everywhere."""
    rounds = synthetic_rounds(n=8000, g=3, true_temperature=1.0, true_bias=-1.0)
    before = position_metrics(rounds)
    sts, platt = fit_sts(rounds), fit_sts_with_bias(rounds)
    assert position_metrics(rounds, sts)[0]["ece"] > 0.5 * before[0]["ece"]
    assert platt.method == "sts+bias" and abs(platt.biases[0] + 1.0) <= 0.2, platt
    for b, a in zip(before, position_metrics(rounds, platt)):
        assert a["ece"] < 0.5 * b["ece"], (b, a)
