"""Chain verification: the exact speculative-sampling acceptance rule.

Exact rule (Leviathan et al. 2023; Chen et al. 2023), left to right over draft tokens
``x_1..x_l`` sampled from ``q_1..q_l``, with target distributions ``p_1..p_{l+1}``:

* accept ``x_k`` with probability ``min(1, p_k(x_k) / q_k(x_k))`` (``q_k(x_k) = 0`` rejects);
* at the first rejection emit a token from the residual ``norm(max(0, p_k - q_k))`` and stop;
* if all ``l`` are accepted, emit a bonus token from ``p_{l+1}``.

Each emitted token is then distributed exactly as the target's. A one-hot ``q`` (argmax or
n-gram drafts) is a special case: accept with probability ``p_k(x_k)``, else sample from ``p_k``
with ``x_k`` removed. Under greedy decoding ``p`` is one-hot too and the rule reduces to "accept
while the draft equals the target's argmax" (:func:`verify_greedy`, which needs only the argmax ids).

The tutorial threshold rule, which is NOT lossless, lives apart in :mod:`dspark_core.core.lossy`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .sampling import sample


@dataclass
class Verdict:
    """Outcome of one verification.

    accepted: how many draft tokens were accepted (and emitted).
    tokens:   the emitted tokens: accepted drafts, then the residual or bonus token, cut after the
              first end-of-sequence token and at ``max_tokens``.
    finished: an end-of-sequence token was emitted or ``max_tokens`` was reached.
    """

    accepted: int
    tokens: list[int]
    finished: bool


def verify_chain(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    eos_token_ids: tuple[int, ...] = (),
    max_tokens: int | None = None,
) -> Verdict:
    """Verify ``l`` draft tokens against the target with the exact rule.

    draft_tokens: [l] token ids.
    draft_probs:  [l, V] the exact distributions the draft tokens were sampled from.
    target_probs: [l + 1, V] target distributions, processed with the same sampling settings.
    """
    return walk_chain(draft_tokens, draft_probs, target_probs, generator, acceptance_probability, residual,
                      eos_token_ids=eos_token_ids, max_tokens=max_tokens)


def walk_chain(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
    acceptance: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    rejection: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    *,
    eos_token_ids: tuple[int, ...] = (),
    max_tokens: int | None = None,
) -> Verdict:
    """The left-to-right walk of a chain rule, given its two parts.

    Shapes as in :func:`verify_chain`. ``acceptance(p_x [l], q_x [l]) -> [l]``: the probability of
    accepting each draft token; ``rejection(p_k [V], q_k [V]) -> [V]``: the distribution of the token
    emitted at the first rejection. With all ``l`` accepted the bonus token comes from ``p_{l+1}``.
    """
    num_draft = draft_tokens.shape[0]
    if target_probs.shape[0] != num_draft + 1:
        raise ValueError(f"target_probs needs {num_draft + 1} rows for {num_draft} draft tokens, got {target_probs.shape[0]}")
    uniforms = torch.rand(num_draft, generator=generator, device=target_probs.device)
    draft_tokens = draft_tokens.to(target_probs.device)
    rows = torch.arange(num_draft, device=target_probs.device)
    chances = acceptance(target_probs[rows, draft_tokens], draft_probs[rows, draft_tokens])
    accepted = _leading_true(uniforms < chances)
    if accepted < num_draft:
        fallback = rejection(target_probs[accepted], draft_probs[accepted])
    else:
        fallback = target_probs[num_draft]
    next_token = int(sample(fallback, generator))
    return _cut(draft_tokens[:accepted].tolist() + [next_token], accepted, eos_token_ids, max_tokens)


def verify_greedy(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_tokens: torch.Tensor,
    *,
    eos_token_ids: tuple[int, ...] = (),
    max_tokens: int | None = None,
) -> Verdict:
    """The exact rule when the target is greedy, read from its argmax ids instead of one-hot rows.

    draft_tokens:  [l] token ids.
    draft_probs:   [l, V] the distributions the draft tokens were sampled from.
    target_tokens: [l + 1] the target's argmax at each position (p_k is one-hot on it).

    With a one-hot ``p_k`` the exact rule accepts ``x_k`` with probability 1 when ``x_k`` is the
    argmax and ``q_k(x_k) > 0``, and 0 otherwise; the residual ``norm(max(0, p_k - q_k))`` of a
    one-hot ``p_k`` is that same one-hot (or all zero, when it falls back to ``p_k``), so the token
    after the accepted prefix is always the target's argmax. One vectorised comparison gives the
    same verdict as :func:`verify_chain` on the one-hot rows, and draws no random numbers.
    """
    num_draft = draft_tokens.shape[0]
    if target_tokens.shape[0] != num_draft + 1:
        raise ValueError(f"target_tokens needs {num_draft + 1} ids for {num_draft} draft tokens, got {target_tokens.shape[0]}")
    rows = torch.arange(num_draft, device=draft_probs.device)
    drafted_mass = draft_probs[rows, draft_tokens.to(draft_probs.device)].cpu()
    accepted = _leading_true((draft_tokens.cpu() == target_tokens[:num_draft].cpu()) & (drafted_mass > 0))
    tokens = draft_tokens[:accepted].tolist() + [int(target_tokens[accepted])]
    return _cut(tokens, accepted, eos_token_ids, max_tokens)


def _leading_true(flags: torch.Tensor) -> int:
    """Length of the leading run of True in a 1-D bool tensor (the accepted prefix)."""
    return int(flags.int().cumprod(0).sum())


def acceptance_probability(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """``min(1, p_x / q_x)`` elementwise (any shape): the probability of accepting a draft token with
    target probability ``p_x`` and draft probability ``q_x``; 0 when ``q_x == 0`` (it cannot have come from ``q``)."""
    return torch.where(q_x > 0, torch.clamp(p_x / q_x.clamp_min(torch.finfo(q_x.dtype).tiny), max=1.0), 0.0)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``norm(max(0, p - q))`` over ``[V]``: the distribution of the token emitted at a rejection;
    falls back to ``p`` when it is all zero (only reachable if ``p == q``)."""
    r = (p - q).clamp_min(0.0)
    total = r.sum()
    return r / total if total > 0 else p


def _cut(tokens: list[int], accepted: int, eos_token_ids: tuple[int, ...], max_tokens: int | None) -> Verdict:
    """Cut emitted tokens after the first EOS and at ``max_tokens``."""
    finished = False
    for i, token in enumerate(tokens):
        if token in eos_token_ids:
            tokens, finished = tokens[: i + 1], True
            break
    if max_tokens is not None and len(tokens) >= max_tokens:
        tokens, finished = tokens[:max_tokens], True
    return Verdict(accepted=min(accepted, len(tokens)), tokens=tokens, finished=finished)
