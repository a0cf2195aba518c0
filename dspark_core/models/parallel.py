"""The parallel block draft model (DFlash-style backbone) and DSpark's sequential and confidence heads.

Shapes: B batch, T context tokens, N block tokens (n blocks of g), d hidden size, m fused target
layers, Vd draft vocabulary, r head rank.

Backbone (paper eq. 2-3). Target hidden states at ``feature_layers`` are fused,
``H_ctx = RMSNorm(W_c [H(l_1); ...; H(l_m)])``, and every draft layer attends to
``[W_K H_ctx ; W_K H_block]`` (KV injection). A block is the anchor's embedding followed by g - 1
learned mask embeddings at positions ``anchor_pos .. anchor_pos + g - 1`` (with ``anchor_feature``, ours,
each plus ``W_a H_ctx[a - 1]``, the fused feature of the token before the anchor); block tokens see the
context strictly before the anchor and each other (bidirectionally). Output k gives base logits
``U_k`` over the draft vocabulary through the target's frozen LM head.

Heads (DSpark, eq. 4-7). ``p_k(v) = softmax(U_k + B_k)(v)`` with ``B_k`` from the previous token:
Markov ``B = W1[x_{k-1}] W2`` or RNN ``s_k = g * s_{k-1} + (1 - g) * tanh(W_c z_k)``,
``B_k = tanh(W_o z_k) W2`` with ``z_k = [s_{k-1}; W1[x_{k-1}]; h_k]``. Confidence
``c_k = sigmoid(w . [h_k; W1[x_{k-1}]])``. Position 1 uses the anchor as ``x_0``.

The target's embedding and LM head are shared and frozen: they are attached with
:meth:`ParallelDraftModel.attach_target` and never saved with the drafter.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel

from .config import DrafterConfig

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [B, kv_heads, positions, head_dim]


def concat_kv(first: KV, second: KV) -> KV:
    """Per-layer keys/values of ``first`` followed by ``second`` along positions."""
    return [(torch.cat([k1, k2], 2), torch.cat([v1, v2], 2)) for (k1, v1), (k2, v2) in zip(first, second)]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary position embedding. x: [B, heads, n, hd]; positions: [B, n]."""
    half = x.shape[-1] // 2
    freqs = theta ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angles = positions.float()[:, None, :, None] * freqs  # [B, 1, n, half]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Masked attention with grouped key/value heads, as two matmuls (the masks here are arbitrary,
    where the CPU flash kernel is slow). q [B, H, N, hd], k / v [B, H_kv, S, hd], mask [B, N, S]
    (True = may attend; every query sees at least one key). Returns [B, N, H * hd]."""
    batch, heads, n, hd = q.shape
    kv_heads = k.shape[1]
    q = q.reshape(batch, kv_heads, heads // kv_heads * n, hd)  # query heads grouped by their key/value head
    scores = (q @ k.transpose(-1, -2)).float().view(batch, kv_heads, heads // kv_heads, n, -1) * hd**-0.5
    probs = scores.masked_fill(~mask[:, None, None], float("-inf")).softmax(-1).to(v.dtype)
    out = probs.view(batch, kv_heads, -1, k.shape[2]) @ v  # [B, H_kv, G * N, hd]
    return out.view(batch, heads, n, hd).transpose(1, 2).reshape(batch, n, heads * hd)


class DraftLayer(nn.Module):
    """Pre-norm transformer layer whose keys and values also cover the injected target context."""

    def __init__(self, config: DrafterConfig):
        super().__init__()
        d, hd = config.hidden_size, config.head_dim
        self.heads, self.kv_heads, self.head_dim, self.theta = config.num_heads, config.num_kv_heads, hd, config.rope_theta
        self.q_proj = nn.Linear(d, self.heads * hd, bias=False)
        self.k_proj = nn.Linear(d, self.kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, self.kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(self.heads * hd, d, bias=False)
        self.attn_norm = RMSNorm(d, config.rms_norm_eps)
        self.mlp_norm = RMSNorm(d, config.rms_norm_eps)
        self.gate_proj = nn.Linear(d, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(d, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, d, bias=False)

    def _split(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        return x.view(x.shape[0], x.shape[1], heads, self.head_dim).transpose(1, 2)

    def context_kv(self, ctx: torch.Tensor, ctx_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotated keys and values [B, kv_heads, T, hd] of fused context features ctx [B, T, d]."""
        k = rotate(self._split(self.k_proj(ctx), self.kv_heads), ctx_pos, self.theta)
        return k, self._split(self.v_proj(ctx), self.kv_heads)

    def forward(
        self, x: torch.Tensor, pos: torch.Tensor, ctx_kv: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """x: [B, N, d] block states at positions pos [B, N]; mask: [B, N, T + N] (True = may attend).

        Returns the new states [B, N, d] and the block's own rotated keys/values [B, kv_heads, N, hd]
        (autoregressive drafters cache them)."""
        h = self.attn_norm(x)
        q = rotate(self._split(self.q_proj(h), self.heads), pos, self.theta)
        own_k = rotate(self._split(self.k_proj(h), self.kv_heads), pos, self.theta)
        own_v = self._split(self.v_proj(h), self.kv_heads)
        k = torch.cat([ctx_kv[0], own_k], dim=2)
        v = torch.cat([ctx_kv[1], own_v], dim=2)
        x = x + self.o_proj(grouped_attention(q, k, v, mask))
        h = self.mlp_norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h)), (own_k, own_v)


class TargetBoundDraftModel(PreTrainedModel):
    """What every trained draft model shares: fusion of target features (eq. 2), a reduced draft
    vocabulary (``draft_token_ids``, target ids), and the target's frozen embedding and LM head,
    attached at load time and never saved."""

    config_class = DrafterConfig
    base_model_prefix = "drafter"
    _no_split_modules = ["DraftLayer"]

    def __init__(self, config: DrafterConfig):
        super().__init__(config)
        if config.hidden_size != config.target_hidden_size:
            raise ValueError("hidden_size must equal target_hidden_size: the drafter shares the target's embedding and LM head.")
        d = config.hidden_size
        self.fuse = nn.Linear(len(config.feature_layers) * config.target_hidden_size, d, bias=False)
        self.ctx_norm = RMSNorm(d, config.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(config) for _ in range(config.num_layers))
        self.final_norm = RMSNorm(d, config.rms_norm_eps)
        self.register_buffer("draft_token_ids", torch.arange(config.draft_vocab_size), persistent=True)
        self._target: dict[str, torch.Tensor] = {}

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def attach_target(self, embedding: torch.Tensor, lm_head: torch.Tensor) -> None:
        """Share the target's input embedding [V, d] and LM head [V, d] (frozen, not saved)."""
        vocab = self.config.target_vocab_size
        if embedding.shape != (vocab, self.config.hidden_size) or lm_head.shape != embedding.shape:
            raise ValueError(
                f"This drafter was trained for a target with vocabulary {vocab} and hidden size "
                f"{self.config.hidden_size}; got embedding {tuple(embedding.shape)} and LM head {tuple(lm_head.shape)}."
            )
        to_draft = torch.full((vocab,), self.config.draft_vocab_size, dtype=torch.long, device=embedding.device)
        to_draft[self.draft_token_ids] = torch.arange(self.config.draft_vocab_size, device=embedding.device)
        self._target = {  # in the drafter's own dtype (a bfloat16 target may serve a float32 drafter)
            "embedding": embedding.detach().to(self.dtype),
            "head": lm_head.detach()[self.draft_token_ids].to(self.dtype),  # [Vd, d]
            "to_draft": to_draft,
        }

    def target_part(self, name: str) -> torch.Tensor:
        if not self._target:
            raise RuntimeError("Attach the target first: drafter.attach_target(embedding, lm_head).")
        return self._target[name]

    def to_draft_ids(self, target_ids: torch.Tensor) -> torch.Tensor:
        """Target token ids -> draft-vocabulary indices; tokens outside it map to Vd."""
        return self.target_part("to_draft")[target_ids]

    def fuse_context(self, features: torch.Tensor) -> torch.Tensor:
        """Target features [B, T, m, d_t] -> H_ctx [B, T, d]."""
        return self.ctx_norm(self.fuse(features.flatten(-2)))

    def base_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary through the target's LM head: [..., d] -> [..., Vd]."""
        return hidden @ self.target_part("head").T


class ParallelDraftModel(TargetBoundDraftModel):
    """DFlash backbone, with DSpark's sequential head and confidence head when ``config.kind == 'dspark'``."""

    def __init__(self, config: DrafterConfig):
        super().__init__(config)
        d, r = config.hidden_size, config.rank
        self.mask_embedding = nn.Parameter(torch.zeros(d))
        if config.anchor_feature:
            self.anchor_proj = nn.Linear(d, d, bias=False)
        if config.kind == "dspark":
            self.w1 = nn.Embedding(config.draft_vocab_size + 1, r)  # last row: a token outside the draft vocabulary
            self.w2 = nn.Linear(r, config.draft_vocab_size, bias=False)
            self.confidence = nn.Linear(d + r, 1)
            if config.head == "rnn":
                self.cell = nn.Linear(2 * r + d, 3 * r)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, ParallelDraftModel) and module.config.kind == "dspark":
            nn.init.zeros_(module.w2.weight)  # the head starts as a no-op on the backbone's logits

    # ----------------------------------------------------------------------------- backbone
    def context_kv(self, ctx: torch.Tensor, ctx_pos: torch.Tensor) -> KV:
        """Per-layer keys/values of H_ctx [B, T, d] at positions ctx_pos [B, T]."""
        return [layer.context_kv(ctx, ctx_pos) for layer in self.layers]

    def block_states(
        self,
        anchors: torch.Tensor,
        anchor_pos: torch.Tensor,
        ctx_kv: KV,
        ctx_visible: torch.Tensor,
        before_anchor: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Hidden states h_1..h_g [B, n, g, d] of n blocks per row.

        anchors, anchor_pos: [B, n] anchor token ids and their positions.
        ctx_visible: [B, n, T] True where block j may see context token t (t before its anchor).
        before_anchor: [B, n, d] H_ctx at anchor_pos - 1 (needed with ``anchor_feature`` only).
        """
        g = self.config.block_size
        batch, n = anchors.shape
        emb = self.target_part("embedding")[anchors]  # [B, n, d]
        x = torch.cat([emb[:, :, None], self.mask_embedding.expand(batch, n, g - 1, -1)], dim=2)
        if self.config.anchor_feature:
            x = x + self.anchor_proj(before_anchor)[:, :, None]
        x = x.flatten(1, 2)
        pos = (anchor_pos[:, :, None] + torch.arange(g, device=anchors.device)).flatten(1)
        same_block = torch.block_diag(*[torch.ones(g, g, dtype=torch.bool, device=anchors.device)] * n)
        mask = torch.cat(
            [ctx_visible.repeat_interleave(g, dim=1), same_block.expand(batch, -1, -1)], dim=2
        )  # [B, N, T + N]
        for layer, kv in zip(self.layers, ctx_kv):
            x, _ = layer(x, pos, kv, mask)
        return self.final_norm(x).view(batch, n, g, -1)

    def forward(
        self,
        features: torch.Tensor,
        ctx_next_tokens: torch.Tensor,
        anchors: torch.Tensor,
        anchor_pos: torch.Tensor,
        ctx_visible: torch.Tensor,
        prev_tokens: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Teacher-forced training pass over n blocks per sequence.

        features: [B, T, m, d_t] target features of the context; ctx_next_tokens: [B, T] (unused here:
        the training interface is shared with the Eagle drafter); anchors, anchor_pos: [B, n];
        ctx_visible: [B, n, T]; prev_tokens: [B, n, g] (anchor, x*_1 .. x*_{g-1}).
        Returns draft logits [B, n, g, Vd] and confidences [B, n, g] (None for dflash).
        """
        ctx = self.fuse_context(features)
        positions = torch.arange(ctx.shape[1], device=ctx.device).expand(ctx.shape[0], -1)
        before_anchor = None
        if self.config.anchor_feature:
            before_anchor = ctx.gather(1, (anchor_pos - 1)[..., None].expand(-1, -1, ctx.shape[-1]))
        hidden = self.block_states(anchors, anchor_pos, self.context_kv(ctx, positions), ctx_visible, before_anchor)
        return self.teacher_forced(hidden, prev_tokens)

    # ------------------------------------------------------------------------- DSpark heads
    def head_step(
        self, hidden: torch.Tensor, prev: torch.Tensor, state: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """One sequential step. hidden [..., d], prev draft-vocab ids [...], state [..., r] (RNN).

        Returns the transition bias B_k [..., Vd], the confidence c_k [...] and the new state.
        """
        e = self.w1(prev)
        confidence = torch.sigmoid(self.confidence(torch.cat([hidden, e], dim=-1))).squeeze(-1)
        if self.config.head == "markov":
            return self.w2(e), confidence, None
        if state is None:
            state = hidden.new_zeros(*hidden.shape[:-1], self.config.rank)
        gate, cand, out = self.cell(torch.cat([state, e, hidden], dim=-1)).chunk(3, dim=-1)
        gate = torch.sigmoid(gate)
        state = gate * state + (1 - gate) * torch.tanh(cand)
        return self.w2(torch.tanh(out)), confidence, state

    def teacher_forced(
        self, hidden: torch.Tensor, prev_tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Draft logits [..., g, Vd] and confidences [..., g] (None for dflash) given the true
        previous tokens prev_tokens [..., g] (target ids: anchor, x*_1 .. x*_{g-1})."""
        logits = self.base_logits(hidden)
        if self.config.kind == "dflash":
            return logits, None
        prev = self.to_draft_ids(prev_tokens)
        if self.config.head == "markov":
            bias, confidence, _ = self.head_step(hidden, prev, None)
            return logits + bias, confidence
        biases, confidences, state = [], [], None
        for k in range(self.config.block_size):
            bias, conf, state = self.head_step(hidden[..., k, :], prev[..., k], state)
            biases.append(bias)
            confidences.append(conf)
        return logits + torch.stack(biases, dim=-2), torch.stack(confidences, dim=-1)
