"""An Eagle3-style autoregressive draft model on fused multi-layer target features.

At context position t the input pairs the fused target feature ``f_t`` (eq. 2) with the embedding
of the next token: ``x_t = W_in [RMSNorm(E[x_{t+1}]); f_t]``; causal layers over these inputs give
``h_t``, whose logits predict ``x_{t+2}``. Drafting after anchor ``a`` starts from ``h_{a-1}``
(the pair ``(f_{a-1}, anchor)``) and continues autoregressively: step k feeds the drafter's own
``h`` in place of the target feature it does not have, ``(h^{k-1}, x_{a+k-1})`` at position
``a + k - 2``, attending to the true context (positions < a) and to its own earlier steps.

Training-time test: training unrolls exactly this for ``block_size`` steps from random anchors, so
the drafter learns on its own features, as at inference.
"""

from __future__ import annotations

import torch
from torch import nn

from .config import DrafterConfig
from .parallel import KV, RMSNorm, TargetBoundDraftModel, block_chunks, concat_kv, first_positions

STEP_CHUNK = 256  # blocks per chunk of training-time test: a step runs one query per block (32 measured 1.6x slower)


class EagleDraftModel(TargetBoundDraftModel):
    def __init__(self, config: DrafterConfig):
        super().__init__(config)
        self.embed_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.in_proj = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)
        self.post_init()

    def step_inputs(self, hidden: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
        """Pair a feature (fused target feature or the drafter's own h) [..., d] with the next token [...]."""
        emb = self.embed_norm(self.target_part("embedding")[next_tokens])
        return self.in_proj(torch.cat([emb, hidden], dim=-1))

    def run(self, x: torch.Tensor, pos: torch.Tensor, ctx_kv: KV, ctx_mask: torch.Tensor, blocks: int = 1,
            local_past: KV | None = None, local_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, KV]:
        """Layers over inputs x [B, N, d] at pos [B, N] (``blocks`` blocks of consecutive inputs), attending to
        ctx_kv (per-layer keys/values [B, h, T, hd]) where ctx_mask [B, N, T] and to their own block's keys:
        ``local_past`` (per layer [B, h, blocks, P, hd]) and their own, as :meth:`DraftLayer.forward`.
        Returns final-normed h [B, N, d] and the inputs' own per-layer keys/values [B, h, N, hd]."""
        own = []
        for i, (layer, kv) in enumerate(zip(self.layers, ctx_kv)):
            x, new = layer(x, pos, kv, ctx_mask, blocks, None if local_past is None else local_past[i], local_mask)
            own.append(new)
        return self.final_norm(x), own

    def empty_kv(self, batch: int, device: torch.device) -> KV:
        shape = (batch, self.config.num_kv_heads, 0, self.config.head_dim)
        return [(torch.zeros(shape, device=device, dtype=self.dtype), torch.zeros(shape, device=device, dtype=self.dtype))
                for _ in self.layers]

    def encode_context(self, features: torch.Tensor, next_tokens: torch.Tensor, past: KV, start: int) -> tuple[torch.Tensor, KV]:
        """Causal pass over context pairs (f_t, x_{t+1}) at positions start.. after the cached ``past``.

        features: [B, n, m, d_t]; next_tokens: [B, n]. Returns h [B, n, d] and the keys/values of
        past + new positions."""
        batch, n = next_tokens.shape
        x = self.step_inputs(self.fuse_context(features), next_tokens)
        pos = torch.arange(start, start + n, device=x.device).expand(batch, -1)
        sees_past = torch.ones(batch, n, start, dtype=torch.bool, device=x.device)
        causal = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
        h, own = self.run(x, pos, past, sees_past, local_mask=causal)
        return h, concat_kv(past, own)

    def forward(
        self,
        features: torch.Tensor,
        ctx_next_tokens: torch.Tensor,
        anchors: torch.Tensor,
        anchor_pos: torch.Tensor,
        ctx_visible: torch.Tensor,
        prev_tokens: torch.Tensor,
    ) -> tuple[torch.Tensor, None]:
        """Training-time test over n blocks per sequence. Shapes as :meth:`ParallelDraftModel.forward`,
        plus ctx_next_tokens [B, T] (x_{t+1} for each context position t). Returns logits [B, n, g, Vd]."""
        batch = anchors.shape[0]
        h_ctx, ctx_kv = self.encode_context(features, ctx_next_tokens, self.empty_kv(batch, features.device), 0)
        h_before = h_ctx.gather(1, (anchor_pos - 1)[..., None].expand(-1, -1, h_ctx.shape[-1]))  # step 1: h_{a-1}
        return torch.cat([  # the blocks a chunk at a time, each over the context it sees (block_chunks)
            self.unroll(h_before[:, chunk], first_positions(ctx_kv, length), anchor_pos[:, chunk],
                        ctx_visible[:, chunk, :length], prev_tokens[:, chunk])
            for chunk, length in block_chunks(ctx_visible, STEP_CHUNK)], dim=1), None

    def unroll(self, h: torch.Tensor, ctx_kv: KV, anchor_pos: torch.Tensor, ctx_visible: torch.Tensor,
               prev_tokens: torch.Tensor) -> torch.Tensor:
        """Training-time test of n blocks from h_{a-1} [B, n, d]: logits [B, n, g, Vd]. Step k of every block
        sees the context before its anchor (ctx_kv where ctx_visible [B, n, T]) and its own chain of steps."""
        n = h.shape[1]
        logits = [self.base_logits(h)]
        chain: KV = [(keys[:, :, None, :0].expand(-1, -1, n, -1, -1),) * 2 for keys, _ in ctx_kv]  # [B, h, n, 0, hd]
        for k in range(1, self.config.block_size):
            x = self.step_inputs(h, prev_tokens[..., k])
            h, own = self.run(x, anchor_pos + k - 1, ctx_kv, ctx_visible, blocks=n, local_past=chain)
            chain = [(torch.cat([keys, new_keys[:, :, :, None]], 3), torch.cat([values, new_values[:, :, :, None]], 3))
                     for (keys, values), (new_keys, new_values) in zip(chain, own)]
            logits.append(self.base_logits(h))
        return torch.stack(logits, dim=2)
