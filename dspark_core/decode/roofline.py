"""A roofline projection of a cost profile from an accelerator's published peak bandwidth and compute.

For a target shape and no measured profile, each forward is assumed to take as long as the slower of
reading its bytes and doing its arithmetic at peak:

    T(R, n) = max(bytes / bandwidth, flops / peak)
    bytes   = w * (P - embedding table when untied) + w * R * C * 2 * layers * kv_heads * head_dim
    flops   = 2 * (P - embedding table when untied) * R * n + 4 * layers * heads * head_dim * R * n * (C + n)

with w bytes per value (2 for bfloat16), P the parameter count, C the KV context per request. A
dspark drafter's round (:mod:`dspark_core.eval.draft_cost` describes the work) is projected the same
way: its layers, the fusion of ``block + 1`` new target states, the block's pass over the context,
base logits through the LM head restricted to the draft vocabulary, and ``block`` sequential Markov
steps that each read ``W2``. No launch overhead, no kernel inefficiency: a lower bound on time, so a
projection from it is an upper bound on speed. It stands in for a GPU profile until one is measured.
"""

from __future__ import annotations

from collections.abc import Sequence

from .profile import CostProfile
from .shapes import TargetShape

RANK = 256  # the Markov head's rank r
FEATURES = 3  # fused target layers


def _layer_parameters(shape: TargetShape) -> int:
    d, h = shape.hidden_size, shape.head_dim
    return d * h * 2 * (shape.num_attention_heads + shape.num_key_value_heads) + 3 * d * shape.intermediate_size


def forward_seconds(shape: TargetShape, rows: int, n: int, context: int, bandwidth: float, peak: float,
                    width: int = 2) -> float:
    """Projected seconds of one target forward of ``rows`` x ``n`` new tokens over ``context`` cached tokens."""
    table = shape.vocab_size * shape.hidden_size
    weights = shape.parameters - (0 if shape.tie_word_embeddings else table)  # the LM head is read, the embedding gathered
    kv = rows * context * 2 * shape.num_hidden_layers * shape.num_key_value_heads * shape.head_dim
    tokens = rows * n
    flops = 2 * weights * tokens  # a multiply-add per weight read (the layers and the LM head) per token
    flops += 4 * shape.num_hidden_layers * shape.num_attention_heads * shape.head_dim * tokens * (context + n)
    return max(width * (weights + kv) / bandwidth, flops / peak)


def draft_seconds(shape: TargetShape, layers: int, rows: int, context: int, bandwidth: float, peak: float,
                  block: int = 7, width: int = 2) -> float:
    """Projected seconds of one drafting round for ``rows`` requests with a ``layers``-deep dspark drafter."""
    d, vd = shape.hidden_size, shape.draft_vocab
    weights = layers * _layer_parameters(shape) + FEATURES * d * d + vd * d + 2 * RANK * vd
    kv = layers * rows * context * 2 * shape.num_key_value_heads * shape.head_dim
    reads = weights + kv + (block - 1) * RANK * vd  # W2 is read again at every sequential step
    new, drafted = rows * (block + 1), rows * block
    flops = 2 * FEATURES * d * d * new + 2 * layers * _layer_parameters(shape) * drafted
    flops += 2 * layers * 2 * shape.num_key_value_heads * shape.head_dim * d * new  # new context keys/values
    flops += 4 * layers * shape.num_attention_heads * shape.head_dim * drafted * (context + block)
    flops += 2 * (d + RANK) * vd * drafted
    return max(width * reads / bandwidth, flops / peak)


def roofline_profile(shape: TargetShape, device: str, bandwidth: float, peak: float, requests: Sequence[int],
                     tokens: Sequence[int], context: int, draft_layers: Sequence[int] = (1, 2, 3, 4, 5),
                     block: int = 7, width: int = 2, source: str = "") -> CostProfile:
    """A :class:`CostProfile` of projected times: ``bandwidth`` in bytes/s, ``peak`` in FLOP/s."""
    steps = {str(r): [1.0 / forward_seconds(shape, r, n, context, bandwidth, peak, width) for n in tokens]
             for r in requests}
    draft = {str(layers): {str(r): draft_seconds(shape, layers, r, context, bandwidth, peak, block, width)
                           for r in requests} for layers in draft_layers}
    meta = {"mode": "roofline", "shape": {"name": shape.name}, "bandwidth": bandwidth, "peak_flops": peak,
            "bytes_per_value": width, "source": source, "draft": {"block": block, "draft_vocab": shape.draft_vocab}}
    return CostProfile(machine={"projection": device}, device=f"{device} (roofline projection)", context=context,
                       steps=steps, tokens=list(tokens), draft=draft, meta=meta)
