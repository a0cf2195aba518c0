"""Verification-length policies: how many of the drafted tokens the target verifies this round.

A policy decides from draft-side information only (the draft and its confidences), never from the
target's verdict. For losslessness the decision "verify position k" may depend on tokens 1..k-1 of
the draft but not on token k itself (the *non-anticipating* property, paper Appendix A): every
policy here stops at the first position it rejects, and position k's confidence c_k depends on
token k-1 only. The decoding loop asks the drafter for ``policy.gamma`` tokens and verifies
``policy.verify_length(draft, budget)`` of them.

A single-request policy is also a *stop rule*: ``policy.admit(c_1..c_k)`` says whether position k is
verified, given that 1..k-1 are. A drafter with a confidence head computes c_k before it samples token
k, so it can stop drafting at the first position the policy will not verify and save its cost;
``verify_length`` is then the whole (shorter) draft.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from ..core.rounds import Draft
from ..core.verification import acceptance_probability, residual


class VerificationPolicy:
    """Base of the policies: draft ``gamma`` tokens a round, verify the prefix :meth:`admit` allows.

    Subclasses define :meth:`admit`; a policy with a batch view (the hardware-aware scheduler)
    also overrides :meth:`verify_lengths` and :meth:`worth_drafting`."""

    def __init__(self, gamma: int):
        if gamma < 0:
            raise ValueError(f"gamma must be >= 0, got {gamma}")
        self.gamma = gamma

    def admit(self, confidences: Sequence[float]) -> bool:
        """Whether position k = len(confidences) is verified, given c_1..c_k and that 1..k-1 are."""
        raise NotImplementedError

    def verify_length(self, draft: Draft, budget: int) -> int:
        """Number of leading draft tokens to verify, at most ``min(len(draft), budget)``: the
        positions :meth:`admit` accepts, up to the first it refuses."""
        confidences = _confidences(draft).tolist()
        length = 0
        while length < min(len(draft), budget) and self.admit(confidences[: length + 1]):
            length += 1
        return length

    def verify_lengths(self, drafts: Sequence[Draft], budgets: Sequence[int]) -> list[int]:
        """Verification lengths of requests verified together in one target forward (each alone here)."""
        return [self.verify_length(d, b) for d, b in zip(drafts, budgets)]

    def worth_drafting(self, requests: int) -> bool:
        """False when the policy will verify nothing this round whatever the drafts say, so drafting
        can be skipped. Depends on the batch size only, never on drafts."""
        return self.gamma > 0


def _confidences(draft: Draft) -> torch.Tensor:
    if len(draft) == 0:
        return torch.zeros(0, dtype=torch.float64)
    if draft.confidences is None:
        raise ValueError("This policy needs per-position confidences on every draft: use a dspark drafter (it has a "
                         "confidence head), not one behind prompt lookup ('+ngram': copied drafts have none).")
    return draft.confidences.double()


class FixedLength(VerificationPolicy):
    """Draft ``gamma`` tokens and verify all of them (up to the remaining token budget)."""

    def verify_length(self, draft: Draft, budget: int) -> int:
        return max(0, min(len(draft), self.gamma, budget))

    def admit(self, confidences: Sequence[float]) -> bool:
        return len(confidences) <= self.gamma


class _Threshold(VerificationPolicy):
    """A policy that compares a score of c_1..c_k with ``threshold``."""

    def __init__(self, gamma: int, threshold: float):
        super().__init__(gamma)
        self.threshold = threshold

    def score(self, confidences: Sequence[float]) -> float:
        raise NotImplementedError

    def admit(self, confidences: Sequence[float]) -> bool:
        return len(confidences) <= self.gamma and self.score(confidences) >= self.threshold


class ConfidenceThreshold(_Threshold):
    """Verify the draft up to the first position whose confidence c_k is below ``threshold``."""

    def score(self, confidences: Sequence[float]) -> float:
        return confidences[-1]


class SurvivalThreshold(_Threshold):
    """Verify the draft while the survival probability a_k = c_1 ... c_k is at least ``threshold``."""

    def score(self, confidences: Sequence[float]) -> float:
        return math.prod(confidences)


ROW_LAYOUTS = ("padded", "flattened")


def check_rows(rows: str) -> None:
    if rows not in ROW_LAYOUTS:
        raise ValueError(f"rows must be one of {ROW_LAYOUTS}, got {rows!r}")


def forward_tokens(lengths: Sequence[int], rows: str = "padded") -> int:
    """Tokens the target's forward runs to verify l_1..l_R draft tokens (each request adds its anchor).

    ``"padded"``: R x (1 + max l), every row padded to the longest, as the batched engine runs them;
    ``"flattened"``: R + sum l, the rows packed into one variable-length batch (paper section 5.3)."""
    check_rows(rows)
    if rows == "padded":
        return len(lengths) * (1 + max(lengths, default=0))
    return len(lengths) + sum(lengths)


def schedule_prefixes(
    survivals: Sequence[torch.Tensor],
    steps_per_second: Callable[[int], float],
    rows: str = "padded",
    lossy_retrospective: bool = False,
) -> list[int]:
    """Paper Algorithm 1: verification lengths l_1..l_R maximising tau* x SPS(B) over R requests.

    survivals[r]: [g_r] non-increasing prefix survival probabilities a_{r,1..g_r}.
    steps_per_second(B): target forward steps per second with B tokens in the batch (B >= R), where
    B = :func:`forward_tokens` of the lengths under the row layout ``rows`` (padding included).
    Candidates (r, j) are admitted in descending a_{r,j} (ties: smaller j first, so a prefix is
    always admitted before its extension); each admission extends one request by a token and adds
    a_{r,j} to the expected accepted tokens. The search ends at the first admission that does not raise
    the throughput (the early stop), which keeps the decision for x_{r,j} independent of x_{r,j} itself.
    ``lossy_retrospective=True`` drops the early stop and returns the best point of the whole path:
    that leaks future tokens into the admission and is NOT lossless (a demonstration, Appendix A).
    """
    requests = len(survivals)
    candidates = sorted(
        ((float(a), j, r) for r, surv in enumerate(survivals) for j, a in enumerate(surv.tolist(), start=1) if a > 0),
        key=lambda c: (-c[0], c[1], c[2]),
    )
    lengths, best = [0] * requests, [0] * requests
    expected = float(requests)
    best_throughput = expected * steps_per_second(forward_tokens(lengths, rows))
    for a, j, r in candidates:
        lengths[r], expected = j, expected + a
        throughput = expected * steps_per_second(forward_tokens(lengths, rows))
        if throughput > best_throughput:
            best_throughput, best = throughput, list(lengths)
        elif not lossy_retrospective:
            break
    return best


class HardwareAware(VerificationPolicy):
    """Algorithm 1 as a policy: verify the prefixes that maximise expected tokens per second under
    the measured cost ``steps_per_second(tokens, requests)`` (tokens in the target forward, counting
    each request's anchor and, with ``rows="padded"``, the padding of shorter rows: :func:`forward_tokens`).
    One request decides alone; :meth:`verify_lengths` schedules a batch. ``lossy_retrospective`` is the
    NOT lossless variant without the early stop (demonstration only)."""

    def __init__(self, gamma: int, steps_per_second: Callable[[int, int], float], rows: str = "padded",
                 lossy_retrospective: bool = False):
        super().__init__(gamma)
        check_rows(rows)
        self.steps_per_second, self.rows, self.lossy_retrospective = steps_per_second, rows, lossy_retrospective

    def verify_lengths(self, drafts: Sequence[Draft], budgets: Sequence[int]) -> list[int]:
        survivals = [torch.cumprod(_confidences(d), 0)[: max(0, min(b, self.gamma))] for d, b in zip(drafts, budgets)]
        requests = len(drafts)
        return schedule_prefixes(survivals, lambda tokens: self.steps_per_second(tokens, requests), self.rows,
                                 self.lossy_retrospective)

    def verify_length(self, draft: Draft, budget: int) -> int:
        return self.verify_lengths([draft], [budget])[0]

    def admit(self, confidences: Sequence[float]) -> bool:
        """Algorithm 1 for one request: candidates come in order k = 1, 2, ..., so position k is
        admitted when Algorithm 1 run on c_1..c_k admits all k (the early stop ends the search at the
        first position that does not raise the throughput). Always the early-stopping rule: the lossy
        retrospective variant decides after seeing the whole block, which no stop rule can."""
        k = len(confidences)
        survivals = torch.cumprod(torch.tensor(confidences, dtype=torch.float64), 0)
        return k <= self.gamma and schedule_prefixes([survivals], lambda tokens: self.steps_per_second(tokens, 1)) == [k]

    def worth_drafting(self, requests: int) -> bool:
        """False when even a certain token (survival 1) would not raise the throughput of
        ``requests`` anchors."""
        anchors, one_more = [0] * requests, [1] + [0] * (requests - 1)
        sps = self.steps_per_second
        return self.gamma > 0 and ((requests + 1) * sps(forward_tokens(one_more, self.rows), requests)
                                   > requests * sps(forward_tokens(anchors, self.rows), requests))


def first_token_law(
    p: torch.Tensor,
    q: torch.Tensor,
    survivals_given_first: Callable[[int], torch.Tensor],
    policy: VerificationPolicy,
) -> torch.Tensor:
    """Exact distribution [V] of the first emitted token of one round, for a single request.

    p, q: [V] target and draft distributions at position 1; survivals_given_first(x): the draft's
    confidences c_1..c_g when the first drafted token is x (they may depend on x through c_2..).
    The policy is run on every possible first token; a verified token is accepted with
    min(1, p/q) and otherwise replaced from the residual; an unverified one is replaced by a
    fresh sample from p. Equals p exactly for every non-anticipating policy (paper Appendix A).
    """
    out = torch.zeros_like(p)
    for x in range(len(q)):
        if q[x] == 0:
            continue
        confidences = survivals_given_first(x)
        draft = Draft(tokens=torch.full((len(confidences),), x), probs=q.expand(len(confidences), -1),
                      confidences=confidences)
        if policy.verify_length(draft, len(confidences)) == 0:
            out += q[x] * p
            continue
        accept = acceptance_probability(p[x], q[x])
        out[x] += q[x] * accept
        out += q[x] * (1 - accept) * residual(p, q)
    return out
