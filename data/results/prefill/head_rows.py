"""The feature store's forward (dspark_core.data.features.target_features, bfloat16 target) with the LM head's
top-k and log-sum-exp over 2,048-row slices (before) and HEAD_ROWS-row slices (now), alternated on the same
random token batches, 3 runs each; medians to head_rows.csv beside this file. Run from the repository root on a
quiet machine: .venv/bin/python data/results/prefill/head_rows.py"""

from pathlib import Path

import numpy as np
import pandas as pd
import torch

import dspark_core.data.features as features
from dspark_core.core.target import load_target
from dspark_core.eval.throughput import median_rates

torch.set_num_threads(2)
model, _ = load_target(dtype=torch.bfloat16)
spec, rng, rows_now = features.FeatureSpec(), np.random.default_rng(0), features.HEAD_ROWS


def with_head_rows(rows: int, batch: list[np.ndarray]):
    """A run of target_features on ``batch`` with the LM head in ``rows``-row slices; returns its token count."""
    def run() -> int:
        features.HEAD_ROWS = rows
        features.target_features(model, batch, spec)
        return sum(len(s) for s in batch)
    return run


records = []
for count, length in [(32, 256), (4, 2048)]:
    batch = [rng.integers(100, 40000, length) for _ in range(count)]
    features.target_features(model, batch, spec)  # warm-up
    rates = median_rates({str(rows): with_head_rows(rows, batch) for rows in (2048, rows_now)}, repeats=3)
    records += [{"batch": f"{count} x {length} tokens", "head_rows": int(rows), "tokens_per_s": round(rate)}
                for rows, rate in rates.items()]
table = pd.DataFrame(records)
table.to_csv(Path(__file__).with_name("head_rows.csv"), index=False)
print(table.to_string(index=False))
