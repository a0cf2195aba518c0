"""A training step's cost per block token as the training sequences grow, on synthetic features.

The 10M-token mix trains on fixed conversations about four times as long as the distilled answers, and its
steps ran at about half the rate. This times one teacher-forced micro-batch (forward, loss, backward) of a
dspark-markov drafter of the shipped recipe's shape (two layers, five fused target layers, the anchor
feature, block 7, position decay 4) on one sequence of T tokens whose last three quarters are the span it
learns (as a conversation's answers are), padded as training pads, with random features and target
distributions: the work depends on the shapes only. Per T and precision it records the step's median time,
the time per block token, and the share of the step's operator time spent in the context attention's
batched matmuls, masking and softmax (the part that grows with T).

    python -m dspark_core.eval.step_length --out data/results/train-speed/step-length-<stamp>.csv
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile

from ..core.provenance import machine_info
from ..decode.profile import native_bf16
from ..models import DrafterConfig, ParallelDraftModel
from ..train.drafters import TRAIN_PADDING, block_anchors, compute_loss

ATTENTION_OPS = ("aten::bmm", "aten::masked_fill_", "aten::_softmax", "aten::_softmax_backward_data")
SHAPE = dict(hidden_size=576, num_heads=9, num_kv_heads=3, head_dim=64, intermediate_size=1536, vocab=49152)  # the default target's


def synthetic_drafter(layers: int = 2, draft_vocab: int = 8192, shape: dict = SHAPE) -> ParallelDraftModel:
    """A dspark-markov drafter of the shipped recipe's shape, bound to a random target head."""
    d = shape["hidden_size"]
    drafter = ParallelDraftModel(DrafterConfig(
        kind="dspark", head="markov", block_size=7, num_layers=layers, hidden_size=d, num_heads=shape["num_heads"],
        num_kv_heads=shape["num_kv_heads"], head_dim=shape["head_dim"], intermediate_size=shape["intermediate_size"],
        feature_layers=[2, 8, 15, 21, 28], draft_vocab_size=draft_vocab, rank=256, target_hidden_size=d,
        target_vocab_size=shape["vocab"], anchor_feature=True))
    drafter.attach_target(torch.randn(shape["vocab"], d) * 0.02, torch.randn(shape["vocab"], d) * 0.02)
    return drafter


def synthetic_batch(drafter: ParallelDraftModel, length: int, top_k: int = 8, seed: int = 0) -> tuple[dict, int]:
    """A training micro-batch (as :func:`..train.drafters.make_batch` builds, padded as training pads) of one
    sequence of ``length`` tokens, span = its last three quarters; returns it and its unpadded block count."""
    config, generator = drafter.config, torch.Generator().manual_seed(seed)
    g, vocab = config.block_size, config.target_vocab_size
    anchors = block_anchors([(length // 4, length)], g)[:256]
    n = len(anchors)
    anchors = np.concatenate([anchors, np.full(-n % TRAIN_PADDING[0], anchors[-1])])
    width = int(anchors.max()) + (-int(anchors.max()) % TRAIN_PADDING[1])
    top_ids = torch.randint(0, vocab, (len(anchors), g, top_k), generator=generator)
    batch = {
        "features": torch.randn(width, len(config.feature_layers), config.target_hidden_size, generator=generator),
        "ctx_next_tokens": torch.randint(0, vocab, (width,), generator=generator),
        "anchor_pos": torch.from_numpy(anchors),
        "ctx_visible": torch.arange(width)[None] < torch.from_numpy(anchors)[:, None],
        "prev_tokens": torch.randint(0, vocab, (len(anchors), g), generator=generator),
        "labels": top_ids[..., 0], "top_ids": top_ids,
        "top_probs": torch.softmax(torch.randn(len(anchors), g, top_k, generator=generator), -1),
        "block_weights": (torch.arange(len(anchors)) < n).float(),
    }
    batch["anchors"] = batch["prev_tokens"][:, 0]
    return {name: value[None] for name, value in batch.items()}, n


def train_step(drafter: ParallelDraftModel, batch: dict, bf16: bool) -> None:
    """Forward, the DSpark loss (position decay 4) and backward of one micro-batch, as training runs it."""
    drafter.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = compute_loss(drafter, drafter, batch, "dspark", 4.0)["loss"]
    loss.backward()


def measure_step_lengths(lengths: tuple[int, ...] = (256, 512, 1024, 1536), precisions: tuple[str, ...] | None = None,
                         repeats: int = 3, drafter: ParallelDraftModel | None = None) -> pd.DataFrame:
    """One row per (precision, T): median step seconds over ``repeats`` (after one untimed step), seconds per
    block token, and the context attention's share of a profiled step's operator time. ``precisions``:
    float32 and, where the CPU computes it natively, bfloat16 autocast (training's two settings)."""
    drafter = drafter or synthetic_drafter()
    precisions = precisions or (("float32", "bfloat16") if native_bf16() else ("float32",))
    rows = []
    for precision in precisions:
        for length in lengths:
            batch, blocks = synthetic_batch(drafter, length)
            bf16 = precision == "bfloat16"
            train_step(drafter, batch, bf16)
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                train_step(drafter, batch, bf16)
                times.append(time.perf_counter() - start)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                train_step(drafter, batch, bf16)
            ops = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
            seconds = statistics.median(times)
            rows.append({"precision": precision, "length": length, "blocks": blocks, "step_s": seconds,
                         "ms_per_block_token": 1000 * seconds / (blocks * drafter.config.block_size),
                         "attention_share": sum(ops.get(op, 0.0) for op in ATTENTION_OPS) / sum(ops.values())})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path,
                        default=Path("data/results/train-speed") / f"step-length-{time.strftime('%Y%m%d-%H%M%S')}.csv")
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 1536])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    rows = measure_step_lengths(tuple(args.lengths), repeats=args.repeats)
    machine = machine_info()
    rows = rows.assign(threads=machine["threads"], git_commit=machine["git_commit"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows.to_csv(args.out, index=False)
    print(rows.to_string(index=False, float_format=lambda v: f"{v:.3f}"))


if __name__ == "__main__":
    main()
