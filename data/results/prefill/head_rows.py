"""The feature store's forward (dspark_core.data.features.target_features, bfloat16 target) with the LM head's
top-k and log-sum-exp over 2,048-row slices (before) and HEAD_ROWS-row slices (now), alternated on the same
random token batches, 3 runs each; medians to head_rows.csv beside this file. Run from the repository root on a
quiet machine: .venv/bin/python data/results/prefill/head_rows.py"""

import statistics
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

import dspark_core.data.features as features
from dspark_core.core.target import load_target

torch.set_num_threads(2)
model, _ = load_target(dtype=torch.bfloat16)
spec, rng, rows_now = features.FeatureSpec(), np.random.default_rng(0), features.HEAD_ROWS
records = []
for count, length in [(32, 256), (4, 2048)]:
    batch = [rng.integers(100, 40000, length) for _ in range(count)]
    features.target_features(model, batch, spec)  # warm-up
    rates: dict[int, list[float]] = {2048: [], rows_now: []}
    for _ in range(3):
        for rows in rates:
            features.HEAD_ROWS = rows
            start = time.perf_counter()
            features.target_features(model, batch, spec)
            rates[rows].append(count * length / (time.perf_counter() - start))
    records += [{"batch": f"{count} x {length} tokens", "head_rows": rows, "tokens_per_s": round(statistics.median(v))}
                for rows, v in rates.items()]
table = pd.DataFrame(records)
table.to_csv(Path(__file__).with_name("head_rows.csv"), index=False)
print(table.to_string(index=False))
