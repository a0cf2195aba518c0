"""Draft cost of a dspark drafter sized like a target: seconds per round vs concurrent requests and depth.

The drafter is this repository's :class:`ParallelDraftModel` (Markov head, random weights, eager PyTorch)
sized as ``dspark train`` sizes it: each draft layer like one target layer, the target's embedding and
LM head shared (restricted to ``shape.draft_vocab`` tokens). One round for R requests, greedy, is

1. the context update: the ``block + 1`` tokens committed last round (the most a round commits) are
   fused and projected to each layer's keys and values (eq. 2);
2. the backbone: anchor + g - 1 mask tokens attend to ``context`` tokens of injected keys/values and to
   each other (one pass, all R blocks batched);
3. the head: base logits of all g positions in one matmul, then g sequential Markov steps
   (``W1[x_{k-1}] W2`` bias, confidence, argmax).

Target features come out of the verification forward, so they cost the drafter nothing here.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import torch

from ..decode.profile import summarize, time_calls
from ..decode.shapes import TargetShape
from ..models.config import DrafterConfig
from ..models.parallel import ParallelDraftModel

FEATURES = 3  # fused target layers, as the shipped drafters fuse (2, 15, 28)


def drafter_for_shape(shape: TargetShape, layers: int, block: int, device: str | torch.device,
                      dtype: torch.dtype) -> ParallelDraftModel:
    """A random-weight dspark-markov drafter of ``layers`` draft layers for a target of ``shape``,
    with random stand-ins for the target's embedding and LM head attached."""
    depth = shape.num_hidden_layers
    config = DrafterConfig(
        kind="dspark", head="markov", block_size=block, num_layers=layers, hidden_size=shape.hidden_size,
        num_heads=shape.num_attention_heads, num_kv_heads=shape.num_key_value_heads, head_dim=shape.head_dim,
        intermediate_size=shape.intermediate_size, rms_norm_eps=shape.rms_norm_eps, rope_theta=shape.rope_theta,
        feature_layers=(2, depth // 2, depth - 2)[:FEATURES], draft_vocab_size=shape.draft_vocab,
        target_hidden_size=shape.hidden_size, target_vocab_size=shape.vocab_size,
    )
    with torch.device(device):
        drafter = ParallelDraftModel(config).to(dtype).eval()
        table = torch.randn(shape.vocab_size, shape.hidden_size, dtype=dtype) * 0.02
    drafter.attach_target(table, table)
    return drafter


@torch.inference_mode()
def draft_round(drafter: ParallelDraftModel, ctx_kv: list, anchors: torch.Tensor, context: int,
                new_features: torch.Tensor) -> torch.Tensor:
    """One greedy drafting round for R requests; returns the drafted draft-vocabulary ids [R, g].

    ctx_kv: the drafter's keys/values of ``context`` tokens per request; anchors: [R, 1] target ids;
    new_features: [R, t, m, d] target features of the t tokens committed last round."""
    rows, t = new_features.shape[:2]
    device = anchors.device
    positions = torch.arange(context - t, context, device=device).expand(rows, -1)
    drafter.context_kv(drafter.fuse_context(new_features), positions)  # written in place by a serving engine
    visible = torch.ones(rows, 1, context, dtype=torch.bool, device=device)
    anchor_pos = torch.full((rows, 1), context, device=device)
    hidden = drafter.block_states(anchors, anchor_pos, ctx_kv, visible)[:, 0]  # [R, g, d]
    logits = drafter.base_logits(hidden)  # [R, g, Vd]
    prev = drafter.to_draft_ids(anchors[:, 0])
    drafted = []
    for k in range(drafter.config.block_size):
        bias, _, _ = drafter.head_step(hidden[:, k], prev, None)
        prev = (logits[:, k] + bias).argmax(-1)
        drafted.append(prev)
    return torch.stack(drafted, dim=1)


def measure_draft_cost(
    shape: TargetShape,
    layers: Sequence[int] = (1, 2, 3, 4, 5),
    requests: Sequence[int] = (1, 2, 4, 8, 16),
    context: int = 128,
    block: int = 7,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    repeats: int = 5,
    warmup: int = 1,
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """(seconds, relative spread): [str(layers)][str(R)] median seconds of one drafting round
    (:func:`draft_round`) for R requests, and the interquartile range of its timed calls over the median."""
    device = torch.device(device)
    seconds: dict[str, dict[str, float]] = {}
    spread: dict[str, dict[str, float]] = {}
    torch.manual_seed(0)
    for depth in layers:
        drafter = drafter_for_shape(shape, depth, block, device, dtype)
        seconds[str(depth)], spread[str(depth)] = {}, {}
        for rows in requests:
            with torch.inference_mode():
                features = torch.randn(rows, context, FEATURES, shape.hidden_size, device=device, dtype=dtype)
                ctx_kv = drafter.context_kv(drafter.fuse_context(features),
                                            torch.arange(context, device=device).expand(rows, -1))
            anchors = torch.randint(100, 1000, (rows, 1), device=device)
            new = features[:, -(block + 1):]
            call = partial(draft_round, drafter, ctx_kv, anchors, context, new)
            seconds[str(depth)][str(rows)], spread[str(depth)][str(rows)] = summarize(
                time_calls(call, device, repeats, warmup))
            del call, ctx_kv, features, new
        del drafter
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return seconds, spread
