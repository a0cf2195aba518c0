"""Serving trained drafters (eagle / dflash / dspark) through the drafter interface.

Per sequence each keeps the per-layer keys/values of its context. The context only ever holds
committed tokens (their target hidden states arrive after verification), so it never needs
rolling back: each round appends the newly committed tokens and drafts after the anchor.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..core.checksums import verify_checksums
from ..core.fp8 import load_weights
from ..core.linear_layout import follow_target_layout
from ..core.rounds import Draft, DraftContext
from ..core.sampling import SamplingConfig, probs_from_logits, sample
from ..core.target import target_fingerprint, tokenizer_fingerprint
from ..decode.calibration import Scaling, load_calibration, sampling_key
from ..models.config import DrafterConfig
from ..models.eagle import EagleDraftModel
from ..models.parallel import KV, ParallelDraftModel, TargetBoundDraftModel, concat_kv


def check_drafter_target(drafter: TargetBoundDraftModel, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
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
    path: str | Path, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, dtype: torch.dtype | None = None
) -> BlockDrafter | EagleDrafter:
    """Load a saved drafter folder (config.json + model.safetensors) and bind it to the target.
    Its ``checksums.sha256``, when present, is checked first (a mismatch is a clear error).

    The drafter runs in ``dtype``, by default the target's: a bfloat16 target drafts in bfloat16 too,
    which halves the drafter's weight reads where the hardware computes bfloat16 natively. Its draft
    distributions ``q`` are float32 either way (:func:`probs_from_logits`), so verification is unchanged."""
    if Path(path).is_dir():
        verify_checksums(Path(path))
    try:
        config = DrafterConfig.from_pretrained(path)
        cls = EagleDraftModel if config.kind == "eagle" else ParallelDraftModel
        drafter = load_weights(cls(config), Path(path)).to(model.device, dtype or model.dtype)
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise ValueError(f"Could not load the drafter checkpoint at {path}: it is missing, truncated or corrupt "
                         f"({type(err).__name__}: {err}). Re-create it with `dspark train` or restore the file.") from err
    if config.kind == "eagle":
        return EagleDrafter(drafter, model, tokenizer)
    return BlockDrafter(drafter, model, tokenizer, calibration=load_calibration(Path(path)))


def _bind(drafter: TargetBoundDraftModel, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> TargetBoundDraftModel:
    check_drafter_target(drafter, model, tokenizer)
    follow_target_layout(model, drafter)
    drafter.attach_target(model.get_input_embeddings().weight, model.get_output_embeddings().weight)
    return drafter.eval()


def _draft_from_logits(
    drafter: TargetBoundDraftModel, logits: torch.Tensor, sampling: SamplingConfig, generator, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token from draft-vocabulary logits [Vd]; returns (target id, q over the target vocabulary [V]).

    Greedy needs only the argmax (lowest index on ties, as :func:`probs_from_logits`), and q is one-hot
    on it; otherwise q is the processed distribution, mapped onto the target's ids (0 outside the draft vocabulary)."""
    q = torch.zeros(vocab_size, device=logits.device)
    if sampling.greedy:
        token = drafter.draft_token_ids[logits.argmax()]
        return token, q.index_fill_(0, token.view(1), 1.0)
    probs = probs_from_logits(logits, sampling)
    return drafter.draft_token_ids[sample(probs, generator)], q.index_copy_(0, drafter.draft_token_ids, probs)


class _ServedDrafter:
    """What serving every trained draft model shares: binding to the target, the per-sequence context
    (keys/values of committed tokens only) and the check that each round extended it correctly."""

    def __init__(self, drafter: TargetBoundDraftModel, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase):
        self.drafter = _bind(drafter, model, tokenizer)
        self.feature_layers = tuple(drafter.config.feature_layers)
        self.reset()

    @property
    def block_size(self) -> int:
        """The most tokens it drafts a round (its trained block): a larger gamma is refused."""
        return self.drafter.config.block_size

    def reset(self) -> None:
        self.kv: KV | None = None
        self.ctx_len = 0

    def _extend(self, features: torch.Tensor, tokens: list[int]) -> None:
        """Add the next ``n`` committed tokens (features [n, m, d_t]) to the context."""
        raise NotImplementedError

    def _draft(self, gamma: int, sampling: SamplingConfig, generator, context: DraftContext) -> Draft:
        raise NotImplementedError

    @torch.inference_mode()
    def observe(self, context: DraftContext) -> None:
        """Add the round's ``new_features`` to the context and check it then holds every committed token
        but the anchor. Every round must pass its features through here, whether it drafts or not."""
        if context.new_features is not None and context.new_features.shape[0]:
            self._extend(context.new_features.to(self.drafter.dtype), context.tokens)
            self.ctx_len += context.new_features.shape[0]
        if self.ctx_len != len(context.tokens) - 1 or self.kv is None:
            raise RuntimeError(f"drafter context holds {self.ctx_len} tokens, expected {len(context.tokens) - 1}: "
                               "call reset() before a new sequence and pass every round's new_features")

    @torch.inference_mode()
    def propose(
        self, context: DraftContext, gamma: int, sampling: SamplingConfig, generator: torch.Generator | None
    ) -> Draft:
        self.observe(context)
        gamma = min(gamma, self.block_size)
        if gamma < 1:
            return Draft.empty(context.vocab_size)
        return self._draft(gamma, sampling, generator, context)


MARKOV_ROWS = 1024  # previous tokens whose Markov bias rows a served dspark-markov keeps (Vd numbers each)


class BlockDrafter(_ServedDrafter):
    """Drafts one block per round with a :class:`ParallelDraftModel` (dflash / dspark).

    ``calibration`` maps a sampling key (see :func:`sampling_key`) to a :class:`Scaling` (STS); the
    dspark confidences are rescaled with it when serving at that sampling temperature. ``markov_rows``:
    how many previous tokens' Markov bias rows to keep (see :meth:`_head_step`; 0 keeps none)."""

    def __init__(self, drafter: ParallelDraftModel, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                 calibration: dict[str, Scaling] | None = None, markov_rows: int = MARKOV_ROWS):
        super().__init__(drafter, model, tokenizer)
        self.calibration = calibration or {}
        self.markov_rows = markov_rows if drafter.config.kind == "dspark" and drafter.config.head == "markov" else 0
        self.bias_rows: OrderedDict[int, torch.Tensor] = OrderedDict()  # draft id of x_{k-1} -> B_k [Vd], oldest first

    def reset(self) -> None:
        super().reset()
        self.last_ctx: torch.Tensor | None = None  # H_ctx [1, 1, d] of the last context token (anchor_feature)

    def _extend(self, features: torch.Tensor, tokens: list[int]) -> None:
        ctx = self.drafter.fuse_context(features[None])
        pos = torch.arange(self.ctx_len, self.ctx_len + features.shape[0], device=ctx.device)[None]
        new = self.drafter.context_kv(ctx, pos)
        self.kv = new if self.kv is None else concat_kv(self.kv, new)
        self.last_ctx = ctx[:, -1:]  # [1, 1, d]: H_ctx of the token before the next anchor

    def _calibrated(self, confidence: torch.Tensor, k: int, sampling: SamplingConfig) -> float:
        """c_k after STS for this sampling temperature (raw when none is stored), rounded to float32
        exactly as the returned Draft holds it, so a stop rule sees what the policy later sees."""
        scaling = self.calibration.get(sampling_key(sampling.temperature))
        value = np.asarray([float(confidence)])
        if scaling is not None:
            value = scaling(value, k)
        return float(np.float32(value[0]))

    def _head_step(self, hidden: torch.Tensor, prev: torch.Tensor, state: torch.Tensor | None):
        """The sequential head's step, as :meth:`ParallelDraftModel.head_step`. A Markov head's bias row
        ``B_k = W2 W1[x_{k-1}]`` depends on the previous token alone, so the rows of the ``markov_rows`` most
        recent previous tokens are kept: a hit reads Vd numbers instead of all of W2 [Vd, r], and it is the row
        the head computed for that token, so the draft is unchanged."""
        if not self.markov_rows:
            return self.drafter.head_step(hidden, prev, state)
        e, key = self.drafter.w1(prev), int(prev)
        row = self.bias_rows.pop(key, None)
        self.bias_rows[key] = row = self.drafter.w2(e) if row is None else row
        if len(self.bias_rows) > self.markov_rows:
            self.bias_rows.popitem(last=False)
        return row, self.drafter.head_confidence(hidden, e), None

    def _draft(self, gamma: int, sampling: SamplingConfig, generator, context: DraftContext) -> Draft:
        device = self.kv[0][0].device
        anchor_id = torch.tensor([[context.tokens[-1]]], device=device)
        visible = torch.ones(1, 1, self.ctx_len, dtype=torch.bool, device=device)
        hidden = self.drafter.block_states(anchor_id, torch.tensor([[self.ctx_len]], device=device), self.kv, visible,
                                           self.last_ctx)[0, 0]
        dspark = self.drafter.config.kind == "dspark"
        tokens, rows, confidences = [], [], []
        prev, state, base = anchor_id[0, 0], None, None  # base: [n, Vd] base logits of the block's first n positions
        for k in range(gamma):
            bias = 0.0
            if dspark:  # c_k comes before token k: a stop rule can end the block without drafting it
                bias, conf, state = self._head_step(hidden[k], self.drafter.to_draft_ids(prev), state)
                confidences.append(self._calibrated(conf, k, sampling))
                if context.admit is not None and not context.admit(confidences):
                    confidences.pop()
                    break
            # Base logits in one matmul for the whole block (it reads the LM head once); under a stop rule
            # position 1 alone first (the rule often ends the block there), then the rest.
            if base is None:
                base = self.drafter.base_logits(hidden[: 1 if context.admit is not None else gamma])
            elif k == base.shape[0]:
                base = torch.cat([base, self.drafter.base_logits(hidden[k:gamma])])
            row = base[k] + bias
            prev, q = _draft_from_logits(self.drafter, row, sampling, generator, context.vocab_size)
            tokens.append(prev)
            rows.append(q)
        if not tokens:
            return Draft(tokens=torch.zeros(0, dtype=torch.long), probs=torch.zeros(0, context.vocab_size),
                         confidences=torch.zeros(0) if dspark else None)
        return Draft(tokens=torch.stack(tokens).cpu(), probs=torch.stack(rows),
                     confidences=torch.tensor(confidences, dtype=torch.float32) if dspark else None)


class EagleDrafter(_ServedDrafter):
    """Drafts autoregressively with an :class:`EagleDraftModel`: one small forward per draft token."""

    def reset(self) -> None:
        super().reset()
        self.last_h: torch.Tensor | None = None  # h at the last context position: it predicts the first draft token

    def _extend(self, features: torch.Tensor, tokens: list[int]) -> None:
        device = self.drafter.draft_token_ids.device
        start = self.ctx_len
        next_tokens = torch.tensor(tokens[start + 1 : start + 1 + features.shape[0]], device=device)[None]
        past = self.kv if self.kv is not None else self.drafter.empty_kv(1, device)
        h, self.kv = self.drafter.encode_context(features[None], next_tokens, past, start)
        self.last_h = h[:, -1:]

    def _draft(self, gamma: int, sampling: SamplingConfig, generator, context: DraftContext) -> Draft:
        h, past, vocab_size = self.last_h, self.kv, context.vocab_size
        tokens, rows = [], []
        for k in range(gamma):
            token, q = _draft_from_logits(self.drafter, self.drafter.base_logits(h[0, 0]), sampling, generator, vocab_size)
            tokens.append(token)
            rows.append(q)
            if k + 1 < gamma:
                pos = torch.tensor([[self.ctx_len + k]], device=h.device)
                sees_past = torch.ones(1, 1, past[0][0].shape[2], dtype=torch.bool, device=h.device)
                h, own = self.drafter.run(self.drafter.step_inputs(h, token.view(1, 1)), pos, past, sees_past)
                past = concat_kv(past, own)
        return Draft(tokens=torch.stack(tokens).cpu(), probs=torch.stack(rows))
