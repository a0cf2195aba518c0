"""The feature store's target forward (bfloat16 target) on right-padded batches of unequal lengths, with the
attention mask (before) and without it (now: causal attention never lets a real position see the padding to its
right), alternated, 3 runs each; medians and the largest
difference at real positions to padding_mask.csv beside this file. Run from the repository root on a quiet
machine: .venv/bin/python data/results/prefill/padding_mask.py"""

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from dspark_core.core.target import load_target
from dspark_core.eval.throughput import median_rates

torch.set_num_threads(2)
model, _ = load_target(dtype=torch.bfloat16)
rng = np.random.default_rng(0)


def padded(lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded random token ids [B, max length] and their 0/1 mask."""
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n], mask[row, :n] = torch.from_numpy(rng.integers(100, 40000, n)), 1
    return ids, mask


@torch.inference_mode()
def forward(ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    return model.model(input_ids=ids, attention_mask=mask).last_hidden_state


def counted(ids: torch.Tensor, mask: torch.Tensor, masked: bool):
    """A forward of the batch, with or without its mask; returns the real tokens it read."""
    def run() -> int:
        forward(ids, mask if masked else None)
        return int(mask.sum())
    return run


records = []
for count, low, high in [(64, 96, 128), (16, 384, 512), (4, 1536, 2048)]:
    ids, mask = padded(list(rng.integers(low, high + 1, count)))
    real = mask.bool()
    difference = (forward(ids, mask)[real].float() - forward(ids, None)[real].float()).abs().max().item()
    rates = median_rates({"with mask": counted(ids, mask, True), "no mask": counted(ids, mask, False)}, repeats=3)
    records += [{"batch": f"{count} x {low}-{high} tokens", "attention_mask": name, "tokens_per_s": round(rate),
                 "max_abs_difference_at_real_positions": difference} for name, rate in rates.items()]
table = pd.DataFrame(records)
table.to_csv(Path(__file__).with_name("padding_mask.csv"), index=False)
print(table.to_string(index=False))
