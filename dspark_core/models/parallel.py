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

from ..core.linear_layout import input_major, is_input_major
from .config import DrafterConfig

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [B, kv_heads, positions, head_dim]


def concat_kv(first: KV, second: KV) -> KV:
    """Per-layer keys/values of ``first`` followed by ``second`` along positions."""
    return [(torch.cat([k1, k2], 2), torch.cat([v1, v2], 2)) for (k1, v1), (k2, v2) in zip(first, second)]


BLOCK_CHUNK = 32  # blocks per pass in a teacher-forced forward (224 queries at g = 7; 64 measured no faster on a CPU)
CONTEXT_MULTIPLE = 128  # a chunk's context is cut at a multiple of this (repeated shapes: oneDNN reuses its kernels)


def block_chunks(ctx_visible: torch.Tensor, size: int) -> list[tuple[slice, int]]:
    """The blocks of a teacher-forced forward in chunks of ``size``, each with the context length it
    needs: up to its last visible position, rounded up to a multiple of ``CONTEXT_MULTIPLE`` (at most T).
    Blocks never see each other, so a chunk attends over the context its own blocks see and no further:
    with anchors in ascending order, that halves the attention over a whole sequence. ctx_visible: [B, n, T]."""
    n, length = ctx_visible.shape[1:]
    ends = (ctx_visible.any(0) * torch.arange(1, length + 1, device=ctx_visible.device)).amax(-1)  # [n]
    chunks = []
    for start in range(0, n, size):
        end = int(ends[start : start + size].max())
        chunks.append((slice(start, start + size), min(length, -(-end // CONTEXT_MULTIPLE) * CONTEXT_MULTIPLE)))
    return chunks


def first_positions(kv: KV, length: int) -> KV:
    """Per-layer keys/values of the first ``length`` positions."""
    return [(k[:, :, :length], v[:, :, :length]) for k, v in kv]


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


def block_attention(q: torch.Tensor, ctx_k: torch.Tensor, ctx_v: torch.Tensor, ctx_mask: torch.Tensor,
                    local_k: torch.Tensor, local_v: torch.Tensor, local_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of queries in n blocks over the shared context plus each block's own keys, with grouped
    key/value heads, as matmuls (the masks here are arbitrary, where the CPU flash kernel is slow).

    q [B, H, N, hd]: n blocks of s = N / n consecutive queries. ctx_k / ctx_v [B, H_kv, T, hd], visible where
    ctx_mask [B, N, T]. local_k / local_v [B, H_kv, n, L, hd]: block j's own keys, seen by block j's queries
    only (where local_mask [s, L], or all when None); every query must see at least one key. One softmax over
    both parts, so this equals dense attention over [context; every block's keys] with the other blocks'
    keys masked out, at T + L keys a query instead of T + N. Returns [B, N, H * hd]."""
    batch, heads, n_queries, hd = q.shape
    kv_heads, length = ctx_k.shape[1], ctx_k.shape[2]
    group, blocks, own = heads // kv_heads, local_k.shape[2], local_k.shape[3]
    q = (q * hd**-0.5).reshape(batch, kv_heads, group, n_queries, hd)  # query heads grouped by their key/value head
    ctx_scores = q.view(batch, kv_heads, group * n_queries, hd) @ ctx_k.transpose(-1, -2)  # [B, H_kv, G * N, T]
    local_scores = q.view(batch, kv_heads, group, blocks, -1, hd) @ local_k[:, :, None].transpose(-1, -2)
    scores = torch.cat([ctx_scores.view(batch, kv_heads, group, n_queries, length),
                        local_scores.view(batch, kv_heads, group, n_queries, own)], dim=-1)
    local_mask = torch.ones(n_queries // blocks, own, dtype=torch.bool, device=q.device) if local_mask is None else local_mask
    mask = torch.cat([ctx_mask, local_mask.repeat(blocks, 1).expand(batch, -1, -1)], dim=-1)  # [B, N, T + L]
    # In the scores' own dtype: a bfloat16 matmul has already rounded them, and softmax accumulates in float32.
    probs = scores.masked_fill(~mask[:, None, None], float("-inf")).softmax(-1)
    out = probs[..., :length].reshape(batch, kv_heads, group * n_queries, length) @ ctx_v  # [B, H_kv, G * N, hd]
    out_local = probs[..., length:].reshape(batch, kv_heads, group, blocks, -1, own) @ local_v[:, :, None]
    out = out.view(batch, kv_heads, group, n_queries, hd) + out_local.view(batch, kv_heads, group, n_queries, hd)
    return out.view(batch, heads, n_queries, hd).transpose(1, 2).reshape(batch, n_queries, heads * hd)


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
        self, x: torch.Tensor, pos: torch.Tensor, ctx_kv: tuple[torch.Tensor, torch.Tensor], ctx_mask: torch.Tensor,
        blocks: int = 1, local_past: tuple[torch.Tensor, torch.Tensor] | None = None,
        local_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """x: [B, N, d] states at positions pos [B, N], in ``blocks`` blocks of consecutive queries. Each query
        sees the context keys/values ctx_kv [B, kv_heads, T, hd] where ctx_mask [B, N, T], and its own block's
        keys: ``local_past`` [B, kv_heads, blocks, P, hd] (keys a block made earlier; none when None) followed
        by the block's own, all of them or where local_mask [N / blocks, P + N / blocks] (see
        :func:`block_attention`).

        Returns the new states [B, N, d] and the inputs' own rotated keys/values [B, kv_heads, N, hd]
        (autoregressive drafters cache them)."""
        h = self.attn_norm(x)
        q = rotate(self._split(self.q_proj(h), self.heads), pos, self.theta)
        own_k = rotate(self._split(self.k_proj(h), self.kv_heads), pos, self.theta)
        own_v = self._split(self.v_proj(h), self.kv_heads)
        local_k, local_v = (t.unflatten(2, (blocks, -1)) for t in (own_k, own_v))  # [B, kv_heads, blocks, N / blocks, hd]
        if local_past is not None:
            local_k, local_v = torch.cat([local_past[0], local_k], 3), torch.cat([local_past[1], local_v], 3)
        x = x + self.o_proj(block_attention(q, *ctx_kv, ctx_mask, local_k, local_v, local_mask))
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
        """Share the target's input embedding [V, d] and LM head [V, d] (frozen, not saved); the draft
        vocabulary's rows of the head keep its memory layout (:mod:`..core.linear_layout`)."""
        vocab = self.config.target_vocab_size
        if embedding.shape != (vocab, self.config.hidden_size) or lm_head.shape != embedding.shape:
            raise ValueError(
                f"This drafter was trained for a target with vocabulary {vocab} and hidden size "
                f"{self.config.hidden_size}; got embedding {tuple(embedding.shape)} and LM head {tuple(lm_head.shape)}."
            )
        to_draft = torch.full((vocab,), self.config.draft_vocab_size, dtype=torch.long, device=embedding.device)
        to_draft[self.draft_token_ids] = torch.arange(self.config.draft_vocab_size, device=embedding.device)
        head = lm_head.detach()[self.draft_token_ids].to(self.dtype)  # [Vd, d]
        self._target = {  # in the drafter's own dtype (a bfloat16 target may serve a float32 drafter)
            "embedding": embedding.detach().to(self.dtype),
            "head": input_major(head) if is_input_major(lm_head) else head,  # the target head's layout
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
        ctx_mask = ctx_visible.repeat_interleave(g, dim=1)  # [B, N, T]; each block also sees itself
        for layer, kv in zip(self.layers, ctx_kv):
            x, _ = layer(x, pos, kv, ctx_mask, blocks=n)
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
        ctx_kv = self.context_kv(ctx, positions)
        hidden = torch.cat([  # the blocks a chunk at a time, each over the context it sees (block_chunks)
            self.block_states(anchors[:, chunk], anchor_pos[:, chunk], first_positions(ctx_kv, length),
                              ctx_visible[:, chunk, :length], None if before_anchor is None else before_anchor[:, chunk])
            for chunk, length in block_chunks(ctx_visible, BLOCK_CHUNK)], dim=1)
        return self.teacher_forced(hidden, prev_tokens)

    # ------------------------------------------------------------------------- DSpark heads
    def head_step(
        self, hidden: torch.Tensor, prev: torch.Tensor, state: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """One sequential step. hidden [..., d], prev draft-vocab ids [...], state [..., r] (RNN).

        Returns the transition bias B_k [..., Vd], the confidence c_k [...] and the new state.
        """
        e = self.w1(prev)
        confidence = self.head_confidence(hidden, e)
        if self.config.head == "markov":
            return self.w2(e), confidence, None
        if state is None:
            state = hidden.new_zeros(*hidden.shape[:-1], self.config.rank)
        gate, cand, out = self.cell(torch.cat([state, e, hidden], dim=-1)).chunk(3, dim=-1)
        gate = torch.sigmoid(gate)
        state = gate * state + (1 - gate) * torch.tanh(cand)
        return self.w2(torch.tanh(out)), confidence, state

    def head_confidence(self, hidden: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """c_k [...] from h_k [..., d] and the previous token's W1 row e [..., r]."""
        return torch.sigmoid(self.confidence(torch.cat([hidden, e], dim=-1))).squeeze(-1)

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
