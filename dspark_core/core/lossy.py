"""The tutorial "threshold on target probability" rule. It is NOT lossless: measurement only.

A rule that circulates in tutorials reads: accept draft ``x_k`` if ``r < p_k(x_k)`` and
``p_k(x_k) > threshold``, else resample from ``p_k``. It ignores the draft distribution ``q``, so
its output does not follow the target's distribution (notebook 01 measures by how much). Nothing in
decoding uses it; it exists only so that its error can be measured next to the exact rule of
:mod:`dspark_core.core.verification`, on the same walk.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .verification import Verdict, walk_chain


def threshold_acceptance(p_x: torch.Tensor, threshold: float) -> torch.Tensor:
    """``p_x`` where ``p_x > threshold``, else 0, elementwise (any shape): the threshold rule's
    probability of accepting a draft token with target probability ``p_x``. NOT lossless."""
    return torch.where(p_x > threshold, p_x, torch.zeros_like(p_x))


def threshold_rule(threshold: float) -> tuple[Callable, Callable]:
    """The threshold rule's two parts for :func:`~dspark_core.core.verification.walk_chain`: acceptance
    ``(p_x, q_x) -> threshold_acceptance(p_x)`` and rejection ``(p, q) -> p`` (resample from the target)."""
    return (lambda p_x, q_x: threshold_acceptance(p_x, threshold)), (lambda p, q: p)


def verify_chain_threshold(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    threshold: float = 0.1,
    eos_token_ids: tuple[int, ...] = (),
    max_tokens: int | None = None,
) -> Verdict:
    """Verify ``l`` draft tokens with the threshold rule. NOT lossless: measurement only.

    Shapes as in :func:`~dspark_core.core.verification.verify_chain`. Accepts ``x_k`` with probability
    :func:`threshold_acceptance` of ``p_k(x_k)``, at the first rejection resamples from ``p_k`` itself
    (not the residual), and with all ``l`` accepted emits a bonus token from ``p_{l+1}``.
    """
    return walk_chain(draft_tokens, draft_probs, target_probs, generator, *threshold_rule(threshold),
                      eos_token_ids=eos_token_ids, max_tokens=max_tokens)
