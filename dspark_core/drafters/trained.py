"""Serving trained drafters (eagle / dflash / dspark) through the drafter interface.

Per sequence each keeps the per-layer keys/values of its context. The context only ever holds
committed tokens (their target hidden states arrive after verification), so it never needs
rolling back: each round appends the newly committed tokens and drafts after the anchor.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..models.eagle import EagleDrafter
from ..models.parallel import ParallelDrafter, TargetBoundDrafter
from ..models.config import DrafterConfig
from ..sampling import SamplingConfig, probs_from_logits, sample
from ..target import target_fingerprint, tokenizer_fingerprint
from .base import Draft, DraftContext


def check_drafter_target(drafter: TargetBoundDrafter, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """Raise a clear error when the drafter was trained for another target."""
    cfg, target_cfg = drafter.config, model.config
    problems = []
    if cfg.target_hidden_size != target_cfg.hidden_size:
        problems.append(f"hidden size {cfg.target_hidden_size} vs the target's {target_cfg.hidden_size}")
    if cfg.target_vocab_size != model.get_output_embeddings().weight.shape[0]:
        problems.append(f"vocabulary {cfg.target_vocab_size} vs the target's {model.get_output_embeddings().weight.shape[0]}")
    if cfg.tokenizer_fingerprint and cfg.tokenizer_fingerprint != tokenizer_fingerprint(tokenizer):
        problems.append(f"tokenizer fingerprint {cfg.tokenizer_fingerprint} vs the target's {tokenizer_fingerprint(tokenizer)}")
    if cfg.target_fingerprint and cfg.target_fingerprint != target_fingerprint(model, tokenizer):
        problems.append(f"target fingerprint {cfg.target_fingerprint} vs {target_fingerprint(model, tokenizer)}")
    if problems:
        raise ValueError("This drafter was trained for another target: " + "; ".join(problems)
                         + ". Load the target it was trained for, or train a drafter for this one (`dspark train`).")


def load_trained_drafter(
    path: str | Path, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> "BlockDrafter | EagleServing":
    """Load a saved drafter folder (config.json + model.safetensors) and bind it to the target."""
    try:
        config = DrafterConfig.from_pretrained(path)
        cls = EagleDrafter if config.kind == "eagle" else ParallelDrafter
        drafter = cls.from_pretrained(path, dtype=torch.float32).to(model.device)
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise ValueError(f"Could not load the drafter checkpoint at {path}: it is missing, truncated or corrupt "
                         f"({type(err).__name__}: {err}). Re-create it with `dspark train` or restore the file.") from err
    return EagleServing(drafter, model, tokenizer) if config.kind == "eagle" else BlockDrafter(drafter, model, tokenizer)


def _bind(drafter: TargetBoundDrafter, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> TargetBoundDrafter:
    check_drafter_target(drafter, model, tokenizer)
    drafter.attach_target(model.get_input_embeddings().weight, model.get_output_embeddings().weight)
    return drafter.eval()


def _draft_from_logits(
    drafter: TargetBoundDrafter, logits: torch.Tensor, sampling: SamplingConfig, generator, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token from draft-vocabulary logits [Vd]; returns (target id, q over the target vocabulary [V])."""
    q = probs_from_logits(logits, sampling)
    token = drafter.draft_token_ids[sample(q, generator)]
    return token, torch.zeros(vocab_size, device=q.device).index_copy_(0, drafter.draft_token_ids, q)


class BlockDrafter:
    """Drafts one block per round with a :class:`ParallelDrafter` bound to the target."""

    def __init__(self, drafter: ParallelDrafter, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase):
        self.drafter = _bind(drafter, model, tokenizer)
        self.feature_layers = tuple(drafter.config.feature_layers)
        self.reset()

    def reset(self) -> None:
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.ctx_len = 0

    def _append_context(self, features: torch.Tensor) -> None:
        """features: [n, m, d_t] of the next n committed tokens."""
        ctx = self.drafter.fuse_context(features[None].to(self.drafter.dtype))
        pos = torch.arange(self.ctx_len, self.ctx_len + features.shape[0], device=ctx.device)[None]
        new = self.drafter.context_kv(ctx, pos)
        self.kv = new if self.kv is None else [
            (torch.cat([k, nk], dim=2), torch.cat([v, nv], dim=2)) for (k, v), (nk, nv) in zip(self.kv, new)
        ]
        self.ctx_len += features.shape[0]

    @torch.inference_mode()
    def propose(
        self, context: DraftContext, max_tokens: int, sampling: SamplingConfig, generator: torch.Generator | None
    ) -> Draft:
        if context.new_features is not None and context.new_features.shape[0]:
            self._append_context(context.new_features)
        if self.ctx_len != len(context.tokens) - 1 or self.kv is None:
            raise RuntimeError(f"drafter context holds {self.ctx_len} tokens, expected {len(context.tokens) - 1}: "
                               "call reset() before a new sequence and pass every round's new_features")
        length = min(max_tokens, self.drafter.config.block_size)
        if length < 1:
            return Draft.empty(context.vocab_size)
        device = self.kv[0][0].device
        anchor = torch.tensor([[context.tokens[-1]]], device=device)
        visible = torch.ones(1, 1, self.ctx_len, dtype=torch.bool, device=device)
        hidden = self.drafter.block_states(anchor, torch.tensor([[self.ctx_len]], device=device), self.kv, visible)[0, 0]
        logits = self.drafter.base_logits(hidden[:length])  # [l, Vd]
        tokens, rows, confidences = [], [], []
        prev, state = anchor[0, 0], None
        for k in range(length):
            row = logits[k]
            if self.drafter.config.kind == "dspark":
                bias, conf, state = self.drafter.head_step(hidden[k], self.drafter.to_draft_ids(prev), state)
                row = row + bias
                confidences.append(conf)
            prev, q = _draft_from_logits(self.drafter, row, sampling, generator, context.vocab_size)
            tokens.append(prev)
            rows.append(q)
        return Draft(
            tokens=torch.stack(tokens).cpu(),
            probs=torch.stack(rows),
            confidences=torch.stack(confidences).float().cpu() if confidences else None,
        )


class EagleServing:
    """Drafts autoregressively with an :class:`EagleDrafter`: one small forward per draft token."""

    def __init__(self, drafter: EagleDrafter, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase):
        self.drafter = _bind(drafter, model, tokenizer)
        self.feature_layers = tuple(drafter.config.feature_layers)
        self.reset()

    def reset(self) -> None:
        self.kv = None
        self.ctx_len = 0
        self.last_h: torch.Tensor | None = None

    @torch.inference_mode()
    def propose(
        self, context: DraftContext, max_tokens: int, sampling: SamplingConfig, generator: torch.Generator | None
    ) -> Draft:
        features = context.new_features
        if features is not None and features.shape[0]:
            device = self.drafter.draft_token_ids.device
            start = self.ctx_len
            next_tokens = torch.tensor(context.tokens[start + 1 : start + 1 + features.shape[0]], device=device)[None]
            past = self.kv if self.kv is not None else self.drafter.empty_kv(1, device)
            h, self.kv = self.drafter.encode_context(features[None].to(self.drafter.dtype), next_tokens, past, start)
            self.ctx_len += features.shape[0]
            self.last_h = h[:, -1:]
        if self.ctx_len != len(context.tokens) - 1 or self.last_h is None:
            raise RuntimeError(f"drafter context holds {self.ctx_len} tokens, expected {len(context.tokens) - 1}: "
                               "call reset() before a new sequence and pass every round's new_features")
        length = min(max_tokens, self.drafter.config.block_size)
        if length < 1:
            return Draft.empty(context.vocab_size)
        h, past = self.last_h, self.kv
        tokens, rows = [], []
        for k in range(length):
            token, q = _draft_from_logits(self.drafter, self.drafter.base_logits(h[0, 0]), sampling, generator,
                                          context.vocab_size)
            tokens.append(token)
            rows.append(q)
            if k + 1 < length:
                pos = torch.tensor([[self.ctx_len + k]], device=h.device)
                mask = torch.ones(1, 1, past[0][0].shape[2] + 1, dtype=torch.bool, device=h.device)
                h, own = self.drafter.run(self.drafter.step_inputs(h, token.view(1, 1)), pos, past, mask)
                past = [(torch.cat([pk, nk], 2), torch.cat([pv, nv], 2)) for (pk, pv), (nk, nv) in zip(past, own)]
        return Draft(tokens=torch.stack(tokens).cpu(), probs=torch.stack(rows))
