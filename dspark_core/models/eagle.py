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
from .parallel import KV, RMSNorm, TargetBoundDraftModel, concat_kv


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

    def run(self, x: torch.Tensor, pos: torch.Tensor, past: KV, mask: torch.Tensor) -> tuple[torch.Tensor, KV]:
        """Layers over inputs x [B, N, d] at pos [B, N]; past: per-layer keys/values [B, h, P, hd];
        mask [B, N, P + N]. Returns final-normed h [B, N, d] and the inputs' own per-layer keys/values."""
        own = []
        for layer, kv in zip(self.layers, past):
            x, new = layer(x, pos, kv, mask)
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
        mask = torch.ones(n, start + n, dtype=torch.bool, device=x.device).tril(start).expand(batch, -1, -1)
        h, own = self.run(x, pos, past, mask)
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
        batch, n = anchors.shape
        h_ctx, ctx_kv = self.encode_context(features, ctx_next_tokens, self.empty_kv(batch, features.device), 0)
        h = h_ctx.gather(1, (anchor_pos - 1)[..., None].expand(-1, -1, h_ctx.shape[-1]))  # step 1: h_{a-1}
        logits = [self.base_logits(h)]
        chain: KV = [(k[:, :, :0], v[:, :, :0]) for k, v in ctx_kv]
        eye = torch.eye(n, dtype=torch.bool, device=h.device)
        for k in range(1, self.config.block_size):
            x = self.step_inputs(h, prev_tokens[..., k])
            past = concat_kv(ctx_kv, chain)
            mask = torch.cat([ctx_visible] + [eye.expand(batch, -1, -1)] * k, dim=2)  # context < a, own chain
            h, own = self.run(x, anchor_pos + k - 1, past, mask)
            chain = concat_kv(chain, own)
            logits.append(self.base_logits(h))
        return torch.stack(logits, dim=2), None
