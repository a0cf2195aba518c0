"""Round simulator: replay measured verification rounds through a cost profile.

A measured round i says how many draft positions had a known verdict (``verified_i``), how long the
accepted prefix was (``accepted_i``) and what the drafter's confidences were (``confidences_i``,
calibrated, as the serving policy sees them). A policy that verifies ``l <= verified_i`` positions of
that round emits ``min(accepted_i, l) + 1`` tokens (the accepted prefix, cut at l, plus the target's
own token). That is exact for the round: a position after the first rejection is rejected whatever
is verified. What the simulator assumes is that rounds are independent draws: after a round that a
policy cut shorter, the next round is the next measured one, not the one that would have followed.

R concurrent requests: the rounds are shuffled (seeded) and dealt R at a time; each deal is one
step, one target forward over B tokens: R x (1 + max_r l_r) when the rows are padded to the longest, as
the batched engine runs them, or sum_r (l_r + 1) when they are flattened
(:func:`~dspark_core.decode.policies.forward_tokens`). A step costs

    T_step = T_draft(R) + 1 / SPS(B, R)

with T_draft the drafter's cost for R requests (zero for plain decoding and for a step in which the
scheduler skips drafting, :meth:`~dspark_core.decode.policies.VerificationPolicy.worth_drafting`) and SPS a cost model
read from the profile, the same one the hardware-aware scheduler is given: padded rows with
``profile.steps_per_second`` (ceil(B / R) tokens per row: the longest row's), the default, or flattened
rows with ``profile.flattened_steps_per_second`` (B / R, as variable-length kernels cost).
The policies are the ones decoding uses (:mod:`dspark_core.decode.policies`); nothing here
re-implements them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..core.rounds import Draft, GenerationResult
from .calibration import Rounds, Scaling
from .policies import (
    FixedLength,
    HardwareAware,
    SurvivalThreshold,
    VerificationPolicy,
    forward_tokens,
)
from .profile import CostProfile

StepsPerSecond = Callable[[int, int], float]  # SPS(B tokens, R requests)


def rounds_from_result(result: GenerationResult) -> Rounds:
    """The rounds of one generation; confidences [N, g] are NaN where the drafter gave none
    (g: the longest proposal). ``prompt`` is 0 and ``domain`` empty for every round."""
    width = max([r.proposed for r in result.rounds] + [1])
    confidences = np.full((len(result.rounds), width), np.nan)
    for i, r in enumerate(result.rounds):
        if r.confidences:
            confidences[i, : len(r.confidences)] = r.confidences
    n = len(result.rounds)
    return Rounds(confidences, np.array([r.verified for r in result.rounds], dtype=int),
                  np.array([r.accepted for r in result.rounds], dtype=int), np.zeros(n, dtype=int),
                  np.full(n, "", dtype=str))


def rounds_from_acceptance(acceptance: Sequence[float], count: int, seed: int = 0) -> Rounds:
    """``count`` synthetic rounds of a drafter whose position k is accepted with probability
    ``acceptance[k-1]`` given positions 1..k-1 were (conditional acceptance, as the paper's Figure 2
    reports it). Every round's confidences are those probabilities: a drafter calibrated on average
    that knows nothing about the individual round."""
    alpha = np.asarray(acceptance, dtype=float)
    if alpha.ndim != 1 or not len(alpha) or ((alpha < 0) | (alpha > 1)).any():
        raise ValueError(f"acceptance must be a non-empty list of probabilities, got {acceptance!r}")
    survive = np.random.default_rng(seed).random((count, len(alpha))) < alpha
    accepted = np.cumprod(survive, axis=1).sum(axis=1)
    return Rounds(np.tile(alpha, (count, 1)), np.full(count, len(alpha)), accepted.astype(int),
                  np.zeros(count, dtype=int), np.full(count, "", dtype=str))


def calibrated(rounds: Rounds, scaling: Scaling) -> Rounds:
    """The same rounds with confidences rescaled as a calibrated drafter serves them."""
    return Rounds(scaling(rounds.confidences), rounds.verified, rounds.accepted, rounds.prompt, rounds.domain)


def conditional_acceptance(rounds: Rounds) -> np.ndarray:
    """[g] accepted / reached per position k, where reached counts rounds that verified k with 1..k-1 accepted."""
    width = rounds.confidences.shape[1]
    reached = np.array([((rounds.verified >= k) & (rounds.accepted >= k - 1)).sum() for k in range(1, width + 1)])
    accepted = np.array([(rounds.accepted >= k).sum() for k in range(1, width + 1)])
    return accepted / np.maximum(reached, 1)


def standard_methods(gamma: int, thresholds: Sequence[float], steps_per_second: StepsPerSecond,
                     rows: str = "padded") -> dict[str, VerificationPolicy]:
    """Plain decoding, every fixed length 1..gamma, the static survival thresholds and the
    hardware-aware scheduler (Algorithm 1 reading ``steps_per_second`` under the row layout ``rows``), by label."""
    methods: dict[str, VerificationPolicy] = {"plain": FixedLength(0)}
    methods.update({f"fixed-{g}": FixedLength(g) for g in range(1, gamma + 1)})
    methods.update({f"survival-{t:g}": SurvivalThreshold(gamma, t) for t in thresholds})
    methods[f"hw-{gamma}"] = HardwareAware(gamma, steps_per_second, rows)
    return methods


@dataclass
class Replay:
    """Totals of one method at one concurrency R over ``steps`` steps of R rounds each."""

    method: str
    requests: int
    steps: int
    tokens: int
    verified: int
    seconds: float
    draft_seconds: float

    @property
    def tau(self) -> float:
        """Tokens per request per round, the target's own token included."""
        return self.tokens / (self.steps * self.requests)

    def row(self) -> dict:
        return {"method": self.method, "R": self.requests, "steps": self.steps, "tau": self.tau,
                "verified_per_request": self.verified / (self.steps * self.requests),
                "step_ms": 1000 * self.seconds / self.steps, "draft_share": self.draft_seconds / self.seconds,
                "per_user_tps": self.tokens / self.requests / self.seconds, "total_tps": self.tokens / self.seconds}


def _drafts(rounds: Rounds) -> list[Draft]:
    """Stand-in drafts carrying each round's confidences (the policies read nothing else)."""
    width = rounds.confidences.shape[1]
    tokens, probs = torch.zeros(width, dtype=torch.long), torch.zeros(width, 0)
    return [Draft(tokens=tokens, probs=probs, confidences=torch.from_numpy(c)) for c in rounds.confidences]


def replay(
    rounds: Rounds,
    method: str,
    policy: VerificationPolicy,
    profile: CostProfile,
    requests: int,
    draft_seconds: Callable[[int], float],
    seed: int = 0,
    drafts: list[Draft] | None = None,
    steps_per_second: StepsPerSecond | None = None,
    rows: str = "padded",
) -> Replay:
    """Replay ``rounds`` under ``policy`` with R = ``requests`` concurrent requests (see the module
    docstring). ``draft_seconds(R)``: the drafter's time per step; ``steps_per_second``: the cost
    model (default ``profile.steps_per_second``), charged for the tokens of the row layout ``rows``. Rounds left over after the last full deal of R are
    not used; R = 1 replays every round in its measured order."""
    if len(rounds.accepted) < requests:
        raise ValueError(f"{len(rounds.accepted)} rounds cannot fill a step of R = {requests} requests; "
                         "pass more rounds or a smaller R.")
    if policy.gamma > rounds.confidences.shape[1]:
        raise ValueError(f"{method}: gamma {policy.gamma} exceeds the {rounds.confidences.shape[1]} positions "
                         "these rounds measured; replay at most that many.")
    if not isinstance(policy, FixedLength) and np.isnan(rounds.confidences).any():
        raise ValueError(f"{method} reads confidences, and these rounds have none (NaN): replay fixed lengths only, "
                         "or rounds of a dspark drafter.")
    drafts = drafts if drafts is not None else _drafts(rounds)
    sps = steps_per_second or profile.steps_per_second
    order = np.arange(len(drafts)) if requests == 1 else np.random.default_rng(seed).permutation(len(drafts))
    steps = len(order) // requests
    drafting = policy.worth_drafting(requests)
    step_draft = draft_seconds(requests) if drafting else 0.0
    tokens = verified = 0
    seconds = 0.0
    for s in range(steps):
        index = order[s * requests : (s + 1) * requests]
        budgets = rounds.verified[index].tolist()
        lengths = policy.verify_lengths([drafts[i] for i in index], budgets) if drafting else [0] * requests
        verified += sum(lengths)
        tokens += sum(min(int(a), length) + 1 for a, length in zip(rounds.accepted[index], lengths))
        seconds += step_draft + 1.0 / sps(forward_tokens(lengths, rows), requests)
    return Replay(method, requests, steps, tokens, verified, seconds, step_draft * steps)


def project(
    rounds: Rounds,
    methods: dict[str, VerificationPolicy],
    profile: CostProfile,
    concurrency: Sequence[int],
    draft_seconds: Callable[[int], float],
    seed: int = 0,
    steps_per_second: StepsPerSecond | None = None,
    rows: str = "padded",
) -> list[dict]:
    """One row per (method, R): tau, verified tokens per request, step time, share of it spent
    drafting, per-user and total tokens per second, and the speedups over plain decoding at that R.
    ``steps_per_second`` and ``rows``: the cost model, which the scheduler in ``methods`` should read too."""
    drafts = _drafts(rounds)
    out = []
    for requests in concurrency:
        plain = 1.0 / profile.forward_seconds(1, requests)  # tokens per second per user, plain decoding
        for label, policy in methods.items():
            row = replay(rounds, label, policy, profile, requests, draft_seconds, seed, drafts, steps_per_second,
                         rows).row()
            row["speedup"] = row["per_user_tps"] / plain
            out.append(row)
    return out
