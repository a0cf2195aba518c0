"""Sequential Temperature Scaling (STS) of the confidence head, and the metrics that judge it.

The scheduler needs survival probabilities a_k = c_1 ... c_k with the right absolute values. STS
(paper §3.2.1) rescales each position's confidence logit by a temperature T_k chosen left to right:
T_k minimises the expected calibration error of the cumulative product at position k with T_1..T_{k-1}
already fixed. Labels come from real verification rounds: the prefix of length k survived when the
round accepted at least k draft tokens; a position counts only in rounds that verified it.

Temperature scaling sharpens or softens a position's confidences around 0.5 but cannot move their
mean when the head is off by a base rate (as ours is at sampling temperature 1, where acceptance is
lower than in the training contexts). :func:`fit_sts_with_bias` also fits a per-position bias b_k,
c_k -> sigma(logit(c_k) / T_k + b_k), with the same left-to-right search: sequential Platt scaling,
an opt-in extension that is not in the paper.

A fit is served only where it helps: :func:`cross_fit` fits on each half of the rounds (split by prompt),
scores on the other, and keeps the fit only when it lowers the held-out Brier score in both directions; otherwise
the raw confidences are served. Our head is trained against the exact soft acceptance and starts near calibrated,
where a grid search on ECE (itself near its noise floor at a thousand rounds) fits noise.

Calibration is fitted per sampling temperature (greedy and sampled acceptance differ) on held-out
prompts and saved as ``calibration.json`` beside the drafter, which then applies it when serving.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CALIBRATION_FILE = "calibration.json"
GRID = np.exp(np.linspace(np.log(0.05), np.log(20.0), 241))
BIAS_GRID = np.linspace(-2.0, 2.0, 41)


@dataclass
class Rounds:
    """Confidence data from verification rounds: raw confidences [N, g], verified and accepted [N],
    and per round the index of its prompt and the prompt's domain [N]. Rounds of one prompt are
    correlated, so fit and held-out halves are split by prompt."""

    confidences: np.ndarray
    verified: np.ndarray
    accepted: np.ndarray
    prompt: np.ndarray
    domain: np.ndarray

    def subset(self, mask: np.ndarray) -> Rounds:
        return Rounds(self.confidences[mask], self.verified[mask], self.accepted[mask], self.prompt[mask], self.domain[mask])

    def split_by_prompt(self) -> tuple[Rounds, Rounds]:
        """(fit, held-out): the rounds of even-numbered prompts, the rounds of odd-numbered ones."""
        even = self.prompt % 2 == 0
        return self.subset(even), self.subset(~even)

    def position(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(row mask of rounds that verified position k, label: the length-k prefix survived)."""
        return self.verified >= k, self.accepted >= k

    def save(self, path: Path) -> Path:
        """Write the rounds to a .npz file (no pickled objects; :meth:`load` reads it back)."""
        np.savez_compressed(path, confidences=self.confidences.astype(np.float32), verified=self.verified,
                            accepted=self.accepted, prompt=self.prompt, domain=self.domain.astype(str))
        return Path(path)

    @staticmethod
    def load(path: Path) -> Rounds:
        with np.load(path, allow_pickle=False) as data:
            return Rounds(data["confidences"].astype(np.float64), data["verified"], data["accepted"], data["prompt"],
                          data["domain"])


def _logit(c: np.ndarray) -> np.ndarray:
    c = np.clip(c, 1e-6, 1 - 1e-6)
    return np.log(c) - np.log1p(-c)


@dataclass
class Scaling:
    """Per-position rescaling of raw confidences: c_k -> sigma(logit(c_k) / T_k + b_k); temperatures
    and biases [g]. STS has every b_k = 0; the identity has T = 1, b = 0."""

    temperatures: np.ndarray
    biases: np.ndarray

    def __call__(self, confidences: np.ndarray, first: int = 0) -> np.ndarray:
        """Rescaled confidences [..., n] of positions first + 1 .. first + n."""
        n = confidences.shape[-1]
        t, b = self.temperatures[first : first + n], self.biases[first : first + n]
        return 1.0 / (1.0 + np.exp(-(_logit(confidences) / t + b)))

    @staticmethod
    def identity(g: int) -> Scaling:
        """The raw confidences of ``g`` positions, unchanged."""
        return Scaling(np.ones(g), np.zeros(g))

    @property
    def method(self) -> str:
        if self.biases.any():
            return "sts+bias"
        return "none" if (self.temperatures == 1).all() else "sts"


def ece(pred: np.ndarray, label: np.ndarray, bins: int = 15) -> float:
    """Expected calibration error with equal-width bins: sum over bins of |mean pred - rate| x share."""
    if len(pred) == 0:
        return float("nan")
    index = np.minimum((pred * bins).astype(int), bins - 1)
    total = 0.0
    for b in range(bins):
        in_bin = index == b
        if in_bin.any():
            total += in_bin.mean() * abs(pred[in_bin].mean() - label[in_bin].mean())
    return float(total)


def auc(pred: np.ndarray, label: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney, ties counted half); NaN with one class only."""
    pos, neg = pred[label], pred[~label]
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    order = np.argsort(np.concatenate([pos, neg]), kind="mergesort")
    values = np.concatenate([pos, neg])[order]
    ranks = np.empty(len(values))
    i = 0
    while i < len(values):  # average ranks over ties
        j = i
        while j + 1 < len(values) and values[j + 1] == values[i]:
            j += 1
        ranks[i : j + 1] = (i + j) / 2 + 1
        i = j + 1
    rank_of = np.empty(len(values))
    rank_of[order] = ranks
    return float((rank_of[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def brier(pred: np.ndarray, label: np.ndarray) -> float:
    return float(np.mean((pred - label) ** 2)) if len(pred) else float("nan")


def fit_sts(rounds: Rounds, grid: np.ndarray = GRID, biases: np.ndarray | None = None) -> Scaling:
    """T_k (and b_k from ``biases``; STS: 0 only) position by position, left to right, by grid search
    on the ECE of the cumulative product with positions 1..k-1 already rescaled."""
    g = rounds.confidences.shape[1]
    logits = _logit(rounds.confidences)
    survival = np.ones(len(rounds.verified))
    scaling = Scaling(np.ones(g), np.zeros(g))
    candidates = [(t, b) for t in grid for b in (np.zeros(1) if biases is None else biases)]
    for k in range(1, g + 1):
        rows, label = rounds.position(k)
        if rows.sum() == 0:
            break
        scores = [ece(survival[rows] / (1 + np.exp(-(logits[rows, k - 1] / t + b))), label[rows]) for t, b in candidates]
        scaling.temperatures[k - 1], scaling.biases[k - 1] = candidates[int(np.argmin(scores))]
        survival = survival * scaling(rounds.confidences[:, k - 1 : k], k - 1)[:, 0]
    return scaling


def fit_sts_with_bias(rounds: Rounds) -> Scaling:
    """STS+bias (ours, not the paper's): T_k and b_k per position, left to right, on the ECE. The
    temperatures are kept in [0.25, 4]: with a free bias, a huge T_k flattens every confidence to the
    base rate, which scores a low ECE but throws away the ranking the scheduler needs (Brier worsens)."""
    return fit_sts(rounds, grid=GRID[(GRID >= 0.25) & (GRID <= 4.0)], biases=BIAS_GRID)


def survival_by_position(rounds: Rounds, scaling: Scaling | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per position k = 1..g: (the prefix survival a_k, raw or rescaled, of the rounds that verified k; whether
    their length-k prefix survived). What every score below compares."""
    conf = rounds.confidences if scaling is None else scaling(rounds.confidences)
    survival = np.cumprod(conf, axis=1)
    out = []
    for k in range(1, conf.shape[1] + 1):
        rows, label = rounds.position(k)
        out.append((survival[rows, k - 1], label[rows]))
    return out


def survival_brier(rounds: Rounds, scaling: Scaling | None = None) -> float:
    """The Brier score of the prefix survival a_k (raw, or rescaled), summed over positions k, each over the
    rounds that verified k: a proper score, so unlike ECE it needs no bins."""
    return sum((brier(pred, y) for pred, y in survival_by_position(rounds, scaling) if len(pred)), 0.0)


def cross_fit(rounds: Rounds, fit: Callable[[Rounds], Scaling], keep_fit: bool = False) -> tuple[Scaling, dict]:
    """(the rescaling to serve, the decision). ``fit`` runs on the even-prompt half (the fit that is served)
    and on the odd one; each is scored on the other half. The fit is served only if it lowers the held-out
    survival Brier (:func:`survival_brier`) in both directions, or if ``keep_fit``; else the identity (raw
    confidences)."""
    even, odd = rounds.split_by_prompt()
    served = fit(even)
    changes = [survival_brier(scored, fit_) - survival_brier(scored) for fit_, scored in ((served, odd), (fit(odd), even))]
    kept = all(change < 0 for change in changes)
    decision = {"fitted": served.method, "fitted_temperatures": served.temperatures.tolist(),
                "fitted_biases": served.biases.tolist(), "held_out_brier_change": changes,
                "brier_change_directions": ["fit even, score odd", "fit odd, score even"], "kept": kept}
    return (served if kept or keep_fit else Scaling.identity(len(served.temperatures))), decision


def ece_floor(pred: np.ndarray, draws: int = 100, seed: int = 0) -> float:
    """The ECE a perfectly calibrated predictor scores on a sample of this size: the mean ECE of
    ``pred`` against labels drawn from Bernoulli(pred). An ECE near it is noise, not miscalibration,
    and no calibration method can push the measured ECE far below it."""
    if len(pred) == 0:
        return float("nan")
    rng = np.random.default_rng(seed)
    return float(np.mean([ece(pred, rng.random(len(pred)) < pred) for _ in range(draws)]))


def position_metrics(rounds: Rounds, scaling: Scaling | None = None) -> list[dict]:
    """Per position k: ECE (and its noise floor, :func:`ece_floor`), AUC and Brier of the survival
    probability a_k (raw, or rescaled)."""
    return [{"k": k, "n": len(pred), "rate": float(y.mean()) if len(y) else float("nan"),
             "ece": ece(pred, y), "ece_floor": ece_floor(pred), "auc": auc(pred, y), "brier": brier(pred, y)}
            for k, (pred, y) in enumerate(survival_by_position(rounds, scaling), start=1)]


def reliability(rounds: Rounds, k: int, scaling: Scaling | None = None, bins: int = 10) -> list[dict]:
    """Reliability-diagram data at position k: per bin the mean predicted survival, the observed
    survival rate and the number of rounds."""
    pred, y = survival_by_position(rounds, scaling)[k - 1]
    index = np.minimum((pred * bins).astype(int), bins - 1)
    return [{"bin": (b + 0.5) / bins, "predicted": float(pred[index == b].mean()), "observed": float(y[index == b].mean()),
             "count": int((index == b).sum())} for b in range(bins) if (index == b).any()]


def sampling_key(temperature: float) -> str:
    return "greedy" if temperature == 0 else f"temperature={temperature:g}"


def rounds_file(temperature: float) -> str:
    """File name of the rounds a calibration at this sampling temperature was fitted on."""
    return f"calibration-rounds-{sampling_key(temperature).replace('=', '')}.npz"


def save_calibration(folder: Path, temperature: float, scaling: Scaling, metrics: dict) -> Path:
    """Add (or replace) the rescaling for one sampling temperature in ``folder/calibration.json``."""
    path = Path(folder) / CALIBRATION_FILE
    stored = json.loads(path.read_text()) if path.is_file() else {}
    stored[sampling_key(temperature)] = {"method": scaling.method, "temperatures": scaling.temperatures.tolist(),
                                         "biases": scaling.biases.tolist(), **metrics}
    path.write_text(json.dumps(stored, indent=1))
    return path


def load_calibration(folder: Path) -> dict[str, Scaling]:
    """{sampling key: rescaling} from ``folder/calibration.json`` (empty when there is none)."""
    path = Path(folder) / CALIBRATION_FILE
    if not path.is_file():
        return {}
    return {key: Scaling(np.asarray(entry["temperatures"]), np.asarray(entry.get("biases", np.zeros(len(entry["temperatures"])))))
            for key, entry in json.loads(path.read_text()).items()}
