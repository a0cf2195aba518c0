"""Logits to probabilities under temperature / top-k / top-p, for draft and target alike.

Losslessness needs the verifier to compare the target's processed distribution ``p`` with the
exact distribution ``q`` each draft token was sampled from; routing both through
:func:`probs_from_logits` with the same :class:`SamplingConfig` guarantees they are processed the
same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingConfig:
    """How tokens are chosen. ``temperature == 0`` is greedy (a one-hot distribution on the argmax).

    top_k: keep the k most likely tokens (0 keeps all).
    top_p: keep the smallest set of most likely tokens whose mass reaches top_p (1.0 keeps all).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 means greedy), got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (1 disables it), got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def probs_from_logits(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """Probabilities ``[..., V]`` (float32, rows sum to 1) from logits ``[..., V]``.

    Ties in greedy mode go to the lowest token id, as ``torch.argmax`` and ``model.generate`` do.
    """
    logits = logits.float()
    if config.greedy:
        return one_hot(logits.argmax(dim=-1), logits.shape[-1])
    logits = logits / config.temperature
    if config.top_k and config.top_k < logits.shape[-1]:
        kth = torch.topk(logits, config.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if config.top_p < 1.0:
        probs = probs * nucleus(probs, config.top_p)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def nucleus(probs: torch.Tensor, top_p: float, candidates: int = 256) -> torch.Tensor:
    """Mask ``[..., V]`` of the smallest set of most likely tokens whose mass reaches ``top_p``.

    A token is kept when the mass of the tokens ranked before it is below ``top_p`` (so the most
    likely token always is). Ranking only the ``candidates`` most likely tokens gives the same set
    whenever they hold at least ``top_p`` of the mass, which a full sort of the vocabulary (done for
    the other rows) would cost far more to find.
    """
    flat = probs.reshape(-1, probs.shape[-1])
    keep = torch.zeros_like(flat, dtype=torch.bool)
    values, order = flat.topk(min(candidates, flat.shape[-1]), dim=-1)
    inside = values.sum(-1) >= top_p
    rows = inside.nonzero().squeeze(-1)
    if rows.numel():
        keep[rows] = keep[rows].scatter(-1, order[rows], _kept(values[rows], top_p))
    rest = (~inside).nonzero().squeeze(-1)
    if rest.numel():
        values, order = flat[rest].sort(dim=-1, descending=True)
        keep[rest] = keep[rest].scatter(-1, order, _kept(values, top_p))
    return keep.reshape(probs.shape)


def _kept(ranked: torch.Tensor, top_p: float) -> torch.Tensor:
    """Of probabilities ranked in descending order ``[N, k]``: those whose predecessors hold less than ``top_p``."""
    return (ranked.cumsum(-1) - ranked) < top_p


def sample_from_logits(logits: torch.Tensor, config: SamplingConfig, generator: torch.Generator | None = None,
                       candidates: int = 256) -> torch.Tensor:
    """One token id per row of ``logits`` ``[N, V]`` (returns ``[N]``), drawn from
    ``probs_from_logits(logits, config)``, without renormalising and drawing over all ``V`` tokens where
    top-p allows it: a row whose ``candidates`` most likely tokens hold at least ``top_p`` of the mass draws among
    them (its nucleus, the same mask as :func:`nucleus` computes from the same probabilities); other
    rows, greedy and top-k configs draw from the whole distribution. Same law as
    ``sample(probs_from_logits(...))``, another random stream; for sampling many rows, as
    self-distillation does, where drawing over the whole vocabulary cost a fifth of a decoding step."""
    if logits.dim() != 2:
        raise ValueError(f"sample_from_logits takes logits [N, V], got shape {tuple(logits.shape)}")
    if config.greedy or config.top_k or config.top_p == 1.0 or candidates >= logits.shape[-1]:
        return sample(probs_from_logits(logits, config), generator)
    probs = torch.softmax(logits.float() / config.temperature, dim=-1)  # as probs_from_logits computes them
    values, order = probs.topk(candidates, dim=-1)
    inside = values.sum(-1) >= config.top_p
    tokens = torch.empty(len(logits), dtype=torch.long, device=logits.device)
    if inside.any():
        picked = torch.multinomial(values[inside] * _kept(values[inside], config.top_p), 1, generator=generator)
        tokens[inside] = order[inside].gather(-1, picked).squeeze(-1)
    if not inside.all():
        tokens[~inside] = sample(probs_from_logits(logits[~inside], config), generator)
    return tokens


def one_hot(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """One-hot distributions ``[..., V]`` (float32) for token ids ``[...]``: the ``q`` of a deterministic draft."""
    return torch.nn.functional.one_hot(tokens.long(), vocab_size).float()


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token id per row of ``probs`` ``[..., V]``; returns ``[...]``."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])
