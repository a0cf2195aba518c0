"""Sequential Temperature Scaling (STS) of the confidence head, and the metrics that judge it.

The scheduler needs survival probabilities a_k = c_1 ... c_k with the right absolute values. STS
(paper §3.2.1) rescales each position's confidence logit by a temperature T_k chosen left to right:
T_k minimises the expected calibration error of the cumulative product at position k with T_1..T_{k-1}
already fixed. Labels come from real verification rounds: the prefix of length k survived when the
round accepted at least k draft tokens; a position counts only in rounds that verified it.

Calibration is fitted per sampling temperature (greedy and sampled acceptance differ) on held-out
prompts and saved as ``calibration.json`` beside the drafter, which then applies it when serving.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CALIBRATION_FILE = "calibration.json"
GRID = np.exp(np.linspace(np.log(0.05), np.log(20.0), 241))


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

    def subset(self, mask: np.ndarray) -> "Rounds":
        return Rounds(self.confidences[mask], self.verified[mask], self.accepted[mask], self.prompt[mask], self.domain[mask])

    def split_by_prompt(self) -> tuple["Rounds", "Rounds"]:
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
    def load(path: Path) -> "Rounds":
        with np.load(path, allow_pickle=False) as data:
            return Rounds(data["confidences"].astype(np.float64), data["verified"], data["accepted"], data["prompt"],
                          data["domain"])


def _logit(c: np.ndarray) -> np.ndarray:
    c = np.clip(c, 1e-6, 1 - 1e-6)
    return np.log(c) - np.log1p(-c)


def scaled(confidences: np.ndarray, temperatures: np.ndarray) -> np.ndarray:
    """sigma(logit(c_k) / T_k) per position; confidences [..., g], temperatures [g]."""
    return 1.0 / (1.0 + np.exp(-_logit(confidences) / temperatures[: confidences.shape[-1]]))


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


def fit_sts(rounds: Rounds, grid: np.ndarray = GRID) -> np.ndarray:
    """Temperatures T_1..T_g, each by 1-D grid search on the ECE of the cumulative product."""
    g = rounds.confidences.shape[1]
    logits = _logit(rounds.confidences)
    survival = np.ones(len(rounds.verified))
    temperatures = np.ones(g)
    for k in range(1, g + 1):
        rows, label = rounds.position(k)
        if rows.sum() == 0:
            break
        scores = [ece(survival[rows] / (1 + np.exp(-logits[rows, k - 1] / t)), label[rows]) for t in grid]
        temperatures[k - 1] = grid[int(np.argmin(scores))]
        survival = survival / (1 + np.exp(-logits[:, k - 1] / temperatures[k - 1]))
    return temperatures


def ece_floor(pred: np.ndarray, draws: int = 100, seed: int = 0) -> float:
    """The ECE a perfectly calibrated predictor scores on a sample of this size: the mean ECE of
    ``pred`` against labels drawn from Bernoulli(pred). An ECE near it is noise, not miscalibration,
    and no calibration method can push the measured ECE far below it."""
    if len(pred) == 0:
        return float("nan")
    rng = np.random.default_rng(seed)
    return float(np.mean([ece(pred, rng.random(len(pred)) < pred) for _ in range(draws)]))


def position_metrics(rounds: Rounds, temperatures: np.ndarray | None = None) -> list[dict]:
    """Per position k: ECE (and its noise floor, :func:`ece_floor`), AUC and Brier of the survival
    probability a_k (raw, or after STS)."""
    conf = rounds.confidences if temperatures is None else scaled(rounds.confidences, temperatures)
    survival = np.cumprod(conf, axis=1)
    out = []
    for k in range(1, conf.shape[1] + 1):
        rows, label = rounds.position(k)
        pred, y = survival[rows, k - 1], label[rows]
        out.append({"k": k, "n": int(rows.sum()), "rate": float(y.mean()) if len(y) else float("nan"),
                    "ece": ece(pred, y), "ece_floor": ece_floor(pred), "auc": auc(pred, y), "brier": brier(pred, y)})
    return out


def reliability(rounds: Rounds, k: int, temperatures: np.ndarray | None = None, bins: int = 10) -> list[dict]:
    """Reliability-diagram data at position k: per bin the mean predicted survival, the observed
    survival rate and the number of rounds."""
    conf = rounds.confidences if temperatures is None else scaled(rounds.confidences, temperatures)
    rows, label = rounds.position(k)
    pred, y = np.cumprod(conf, axis=1)[rows, k - 1], label[rows]
    index = np.minimum((pred * bins).astype(int), bins - 1)
    return [{"bin": (b + 0.5) / bins, "predicted": float(pred[index == b].mean()), "observed": float(y[index == b].mean()),
             "count": int((index == b).sum())} for b in range(bins) if (index == b).any()]


def sampling_key(temperature: float) -> str:
    return "greedy" if temperature == 0 else f"temperature={temperature:g}"


def rounds_file(temperature: float) -> str:
    """File name of the rounds a calibration at this sampling temperature was fitted on."""
    return f"calibration-rounds-{sampling_key(temperature).replace('=', '')}.npz"


def save_calibration(folder: Path, temperature: float, temperatures: np.ndarray, metrics: dict) -> Path:
    """Add (or replace) the STS temperatures for one sampling temperature in ``folder/calibration.json``."""
    path = Path(folder) / CALIBRATION_FILE
    stored = json.loads(path.read_text()) if path.is_file() else {}
    stored[sampling_key(temperature)] = {"temperatures": [float(t) for t in temperatures], **metrics}
    path.write_text(json.dumps(stored, indent=1))
    return path


def load_calibration(folder: Path) -> dict[str, np.ndarray]:
    """{sampling key: temperatures [g]} from ``folder/calibration.json`` (empty when there is none)."""
    path = Path(folder) / CALIBRATION_FILE
    if not path.is_file():
        return {}
    return {key: np.asarray(entry["temperatures"]) for key, entry in json.loads(path.read_text()).items()}


def calibration_prompts(count: int, seed: int = 0) -> list[dict]:
    """Training-set prompts the target never answered for the distillation data: held out from the
    drafters' training and disjoint from every evaluation set, so calibrating on them leaks nothing."""
    import random

    from .distill import DISTILL_DIR
    from .prompts import load_prompt_set
    from .train_prompts import TRAIN_PROMPTS

    used = set(json.loads((DISTILL_DIR / "meta.json").read_text())["ids"])
    unused = [r for r in load_prompt_set(TRAIN_PROMPTS) if r["id"] not in used]
    return random.Random(seed).sample(unused, min(count, len(unused)))


def collect_rounds(model, tokenizer, drafter, records: list[dict], gamma: int, sampling, max_new_tokens: int = 96,
                   seed: int = 0) -> Rounds:
    """Run fixed-length speculative decoding with a dspark drafter (its raw, uncalibrated confidences)
    on ``records`` and return every round's confidences, verified and accepted counts."""
    from tqdm.auto import tqdm

    from .decoding import speculative_generate
    from .policies import FixedLength
    from .prompts import first_turn_messages
    from .target import encode_prompt, eos_token_ids

    saved, drafter.calibration = drafter.calibration, {}
    conf, verified, accepted, prompt, domain = [], [], [], [], []
    try:
        for index, record in enumerate(tqdm(records, desc="calibration rounds", unit="prompt")):
            result = speculative_generate(model, encode_prompt(tokenizer, first_turn_messages(record)), drafter,
                                          FixedLength(gamma), sampling=sampling, max_new_tokens=max_new_tokens,
                                          seed=seed, eos_token_ids=eos_token_ids(model, tokenizer))
            for r in result.rounds:
                if r.confidences is not None and len(r.confidences) == gamma:
                    conf.append(r.confidences)
                    verified.append(r.verified)
                    accepted.append(r.accepted)
                    prompt.append(index)
                    domain.append(record.get("domain", ""))
    finally:
        drafter.calibration = saved
    return Rounds(np.asarray(conf).reshape(-1, gamma), np.asarray(verified, dtype=int), np.asarray(accepted, dtype=int),
                  np.asarray(prompt, dtype=int), np.asarray(domain, dtype=str))
