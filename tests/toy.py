"""A toy Markov "language model" for exact and statistical tests of verification.

Target and draft are V x V transition tables: row ``prev`` is the next-token distribution after
token ``prev``, processed by the library's own ``probs_from_logits`` so that top-k/top-p and
one-hot drafts are covered.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

import torch

from dspark_core import SamplingConfig, probs_from_logits
from dspark_core.core.lossy import threshold_rule
from dspark_core.core.verification import acceptance_probability, residual


def tables(vocab: int, sampling: SamplingConfig, seed: int, one_hot_draft: bool = False, dtype=torch.float64,
           target_dtype: torch.dtype | None = None):
    """Target and draft transition tables ``[V, V]`` (rows are distributions) from seeded random logits.
    ``target_dtype``: round the target's logits through the dtype the target runs in (float32,
    bfloat16) before ``probs_from_logits``, as a target in that dtype hands them to the verifier."""
    gen = torch.Generator().manual_seed(seed)
    target_logits = torch.randn(vocab, vocab, generator=gen, dtype=dtype) * 1.5
    draft_logits = torch.randn(vocab, vocab, generator=gen, dtype=dtype) * 1.5
    if target_dtype is not None:
        target_logits = target_logits.to(target_dtype)
    return tables_from_logits(target_logits, draft_logits, sampling, one_hot_draft, dtype)


def tables_from_logits(target_logits: torch.Tensor, draft_logits: torch.Tensor, sampling: SamplingConfig,
                       one_hot_draft: bool = False, dtype=torch.float64):
    """Target and draft tables ``[V, V]`` from logits ``[V, V]`` (-inf: probability 0), both processed
    with ``sampling``; a one-hot draft is its greedy argmax."""
    draft_cfg = SamplingConfig(0.0) if one_hot_draft else sampling
    target = probs_from_logits(target_logits, sampling).to(dtype)
    draft = probs_from_logits(draft_logits, draft_cfg).to(dtype)
    # probs_from_logits works in float32; renormalise in float64 so rows sum to 1 exactly enough for 1e-6 checks
    return target / target.sum(-1, keepdim=True), draft / draft.sum(-1, keepdim=True)


def target_joint(target: torch.Tensor, anchor: int, length: int) -> dict[tuple[int, ...], float]:
    """Exact probability of every token sequence of ``length`` after ``anchor`` under the target."""
    vocab = target.shape[0]
    joint = {}
    for seq in itertools.product(range(vocab), repeat=length):
        prob, prev = 1.0, anchor
        for token in seq:
            prob *= float(target[prev, token])
            prev = token
        joint[seq] = prob
    return joint


def rule_parts(rule: str, threshold: float = 0.1):
    """(acceptance(p_x, q_x), rejection(p [V], q [V]) -> [V]) of ``rule``: ``"exact"``, the verifier's
    own functions, or ``"lossy-threshold"``, the NOT lossless rule of ``dspark_core.core.lossy``."""
    if rule == "exact":
        return acceptance_probability, residual
    if rule == "lossy-threshold":
        return threshold_rule(threshold)
    raise ValueError(f"unknown acceptance rule {rule!r}; use 'exact' or 'lossy-threshold'")


def round_distribution(target, draft, anchor: int, gamma: int, rule: str = "exact", threshold: float = 0.1):
    """Exact distribution of the tokens one verification round emits, derived from the verifier's
    own acceptance probability and rejection distribution (``gamma`` draft positions)."""
    vocab = target.shape[0]
    acceptance, rejection = rule_parts(rule, threshold)
    out: dict[tuple[int, ...], float] = defaultdict(float)

    def walk(prev: int, emitted: tuple[int, ...], prob: float) -> None:
        if len(emitted) == gamma:  # every draft accepted: bonus token from the target
            for y in range(vocab):
                out[emitted + (y,)] += prob * float(target[prev, y])
            return
        rejected = 0.0
        for x in range(vocab):
            q_x = draft[prev, x]
            if q_x == 0:
                continue
            a = float(acceptance(target[prev, x], q_x))
            if a > 0:
                walk(x, emitted + (x,), prob * float(q_x) * a)
            rejected += prob * float(q_x) * (1 - a)
        if rejected > 0:
            fallback = rejection(target[prev], draft[prev])
            for y in range(vocab):
                out[emitted + (y,)] += rejected * float(fallback[y])

    walk(anchor, (), 1.0)
    return dict(out)


def extend_with_target(round_dist, target, length: int) -> dict[tuple[int, ...], float]:
    """Distribution of the first ``length`` tokens when a round is followed by plain target sampling."""
    vocab = target.shape[0]
    out: dict[tuple[int, ...], float] = defaultdict(float)
    for emitted, prob in round_dist.items():
        emitted = emitted[:length]
        for tail in itertools.product(range(vocab), repeat=length - len(emitted)):
            p, prev = prob, emitted[-1]
            for token in tail:
                p *= float(target[prev, token])
                prev = token
            out[emitted + tail] += p
    return dict(out)


def law_errors(target, draft, gamma: int, rule: str = "exact", anchor: int = 0) -> tuple[float, float]:
    """Max absolute error and total-variation distance between the joint of the first gamma + 1
    tokens after ``anchor`` (one round with ``gamma`` draft positions, then plain target sampling)
    and the target's own joint; the round's law comes from the verifier's own functions."""
    length = gamma + 1
    spec = extend_with_target(round_distribution(target, draft, anchor, gamma, rule), target, length)
    exact = target_joint(target, anchor, length)
    assert abs(sum(spec.values()) - 1.0) < 1e-9
    diffs = [abs(spec.get(seq, 0.0) - prob) for seq, prob in exact.items()]
    return max(diffs), 0.5 * sum(diffs)
