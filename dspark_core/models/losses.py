"""Drafter training losses: DSpark's (paper eq. 8-12: 0.1 CE + 0.9 TV + 1.0 BCE-confidence,
position weights exp(-(k-1)/gamma), gamma the block size g unless set), DFlash's (CE only, same weights) and EAGLE-3's (soft cross-entropy
against the target's distribution, step weights 0.8^(k-1)); ``dspark-kl`` (ours) is DSpark's plus
EAGLE-3's soft cross-entropy at weight 1 (TV trains the sampled acceptance, the soft labels the
argmax that greedy acceptance needs). A dspark drafter adds the confidence BCE to every recipe.

Shapes: ``[..., g]`` per block position, ``[..., g, Vd]`` over the draft vocabulary. The target's
distribution ``p_t`` lives on the full vocabulary; restricted to the draft vocabulary it is
``p_t_draft`` and the mass it puts outside is ``p_t_outside`` (where the draft has q = 0).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

LOSS_WEIGHTS = {"ce": 0.1, "tv": 0.9, "conf": 1.0}
RECIPES = {  # loss name -> (term weights, per-position decay: None for exp(-(k-1)/g), else the base of base^(k-1))
    "dspark": (LOSS_WEIGHTS, None),
    "dspark-kl": ({**LOSS_WEIGHTS, "soft_ce": 1.0}, None),
    "ce": ({"ce": 1.0, "conf": 1.0}, None),
    "eagle3": ({"soft_ce": 1.0, "conf": 1.0}, 0.8),
}


def position_weights(block_size: int, base: float | None = None, decay: float | None = None) -> torch.Tensor:
    """w_k = exp(-(k - 1) / decay), ``decay`` the block size g when None, or base^(k - 1), for k = 1..g."""
    k = torch.arange(block_size, dtype=torch.float32)
    return torch.exp(-k / (decay or block_size)) if base is None else base**k


def l1_distance(p_draft: torch.Tensor, p_t_draft: torch.Tensor, p_t_outside: torch.Tensor) -> torch.Tensor:
    """||p_d - p_t||_1 over the full vocabulary, with p_d zero outside the draft vocabulary."""
    return (p_draft - p_t_draft).abs().sum(-1) + p_t_outside


def soft_acceptance(l1: torch.Tensor) -> torch.Tensor:
    """c*_k = 1 - ||p_d - p_t||_1 / 2: the probability the exact rule accepts a token drawn from p_d."""
    return 1.0 - 0.5 * l1


def drafter_loss(
    draft_logits: torch.Tensor,
    confidences: torch.Tensor | None,
    p_t_draft: torch.Tensor,
    p_t_outside: torch.Tensor,
    labels: torch.Tensor,
    recipe: str = "dspark",
    block_weights: torch.Tensor | None = None,
    position_decay: float | None = None,
) -> dict[str, torch.Tensor]:
    """Loss terms averaged over blocks, each summed over positions with weights w_k; ``loss`` is the
    recipe's weighted sum (every term is returned, weighted or not, for the loss curve). ``block_weights``
    [...] weighs the average (0 for a padding block); equal weights when None. ``position_decay`` sets
    the decay of exp(-(k-1)/decay) (None: the block size g); a recipe with step weights base^(k-1) refuses it.

    draft_logits: [..., g, Vd]; confidences: [..., g] or None (no confidence head);
    p_t_draft: [..., g, Vd]; p_t_outside: [..., g]; labels: [..., g] draft-vocab index of the
    target-written next token, Vd when it lies outside the draft vocabulary (no CE term then).
    """
    weights, base = RECIPES[recipe]
    if base is not None and position_decay is not None:
        raise ValueError(f"the {recipe} loss weighs step k by {base}^(k-1); it takes no position_decay")
    g, vd = draft_logits.shape[-2], draft_logits.shape[-1]
    w = position_weights(g, base, position_decay).to(draft_logits.device)
    log_p = F.log_softmax(draft_logits.float(), dim=-1)
    inside = labels < vd
    ce = -(log_p.gather(-1, labels.clamp(max=vd - 1)[..., None]).squeeze(-1) * inside)
    l1 = l1_distance(log_p.exp(), p_t_draft, p_t_outside)
    soft_ce = -(p_t_draft * log_p).sum(-1)
    terms = {"ce": ce, "tv": l1, "soft_ce": soft_ce}
    if confidences is not None:
        label = soft_acceptance(l1.detach()).clamp(0.0, 1.0)
        c = confidences.float().clamp(1e-6, 1 - 1e-6)  # BCE written out: F.binary_cross_entropy refuses autocast
        terms["conf"] = -(label * c.log() + (1 - label) * (1 - c).log())
    if block_weights is None:
        block_weights = torch.ones(labels.shape[:-1], device=labels.device)
    share = block_weights / block_weights.sum()
    out = {name: ((value * w).sum(-1) * share).sum() for name, value in terms.items()}
    out["loss"] = sum(weights.get(name, 0.0) * value for name, value in out.items())
    return out


def expected_tau(acceptance: torch.Tensor) -> torch.Tensor:
    """1 + sum_k prod_{i<=k} a_i for per-position conditional acceptance a [..., g]."""
    return 1.0 + torch.cumprod(acceptance, dim=-1).sum(-1)


__all__ = ["LOSS_WEIGHTS", "RECIPES", "drafter_loss", "expected_tau", "l1_distance", "position_weights", "soft_acceptance"]
