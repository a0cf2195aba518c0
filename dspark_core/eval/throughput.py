"""How fast the training data is made: answering (self-distillation), the target's prefill (features),
and a drafter's training step, each in float32 and bfloat16, measured side by side.

Every measurement repeats its variants in turn (A, B, C, A, B, C, ...) on the same inputs and reports
the median rate, so a busy moment of the machine hits them all alike. The old answering path, one
``model.generate`` call per batch of 32 left-padded prompts in float32, is measured beside the new
one (:func:`..data.distill.answer_batch`).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from transformers import PreTrainedModel

from ..core.paths import RESULTS_DIR
from ..core.prompts import load_prompt_set
from ..core.provenance import machine_info, timestamp
from ..core.target import DTYPES, encode_prompt, eos_token_ids, load_target
from ..data.distill import DistillSettings, answer_batch
from ..data.features import FeatureSpec, FeatureStore, target_features
from ..data.training_set import DISTILL_PROMPTS
from ..train.config import TrainConfig
from ..train.drafters import TRAIN_PADDING, build_drafter_model, compute_loss, make_batch, step_anchors


def median_rates(variants: dict[str, Callable[[], int]], repeats: int) -> dict[str, float]:
    """{name: median of units / second} over ``repeats`` interleaved runs of every variant (each
    returns how many units it made)."""
    rates: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, run in variants.items():
            start = time.perf_counter()
            units = run()
            rates[name].append(units / (time.perf_counter() - start))
    return {name: statistics.median(values) for name, values in rates.items()}


def _generate_old(model: PreTrainedModel, prompts: list[list[int]], settings: DistillSettings, eos: tuple[int, ...]) -> int:
    """The answering path before this change: ``model.generate`` per batch of 32, EOS rows kept running."""
    made = 0
    for start in range(0, len(prompts), 32):
        batch = prompts[start : start + 32]
        width = max(len(p) for p in batch)
        ids = torch.full((len(batch), width), eos[0], dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, p in enumerate(batch):
            ids[row, width - len(p) :], mask[row, width - len(p) :] = torch.tensor(p), 1
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, do_sample=True, temperature=settings.temperature,
                                 top_p=settings.top_p, top_k=0, max_new_tokens=settings.max_new_tokens, pad_token_id=eos[0])
        for row in out[:, width:].tolist():
            made += next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
    return made


def answering(models: dict[str, PreTrainedModel], prompts: list[list[int]], eos: tuple[int, ...],
              settings: DistillSettings = DistillSettings(), repeats: int = 3,
              whole_vocabulary: bool = False) -> pd.DataFrame:
    """Response tokens per second: the old path in float32, then (``whole_vocabulary``) :func:`answer_batch` in
    float32 drawing each token over the whole vocabulary, as it did before it drew among the 256 most likely,
    then :func:`answer_batch` in every dtype of ``models``."""
    prompts = sorted(prompts, key=len)

    def new(model: PreTrainedModel, candidates: int = 256) -> Callable[[], int]:
        def run() -> int:
            made = 0
            for start in range(0, len(prompts), settings.batch_size):
                made += sum(map(len, answer_batch(model, prompts[start : start + settings.batch_size], settings, eos,
                                                  torch.Generator().manual_seed(start), candidates)))
            return made
        return run

    variants = {"model.generate, batch 32, float32 (before)": lambda: _generate_old(models["float32"], prompts, settings, eos)}
    if whole_vocabulary:
        vocab = models["float32"].get_output_embeddings().weight.shape[0]
        variants[f"answer_batch, batch {settings.batch_size}, float32, drawn over the whole vocabulary (before)"] = \
            new(models["float32"], vocab)
    variants.update({f"answer_batch, batch {settings.batch_size}, {dtype}": new(m) for dtype, m in models.items()})
    rates = median_rates(variants, repeats)
    return pd.DataFrame([{"stage": "answering", "variant": k, "unit": "response tokens/s", "rate": v} for k, v in rates.items()])


def prefill(models: dict[str, PreTrainedModel], sequences: list[np.ndarray], spec: FeatureSpec = FeatureSpec(),
            repeats: int = 3) -> pd.DataFrame:
    """Tokens per second of the feature store's forward (layers and top-k) in every dtype, batched as it batches."""
    def run(model: PreTrainedModel) -> Callable[[], int]:
        def go() -> int:
            with torch.inference_mode():
                target_features(model, sequences, spec)
            return sum(len(s) for s in sequences)
        return go

    rates = median_rates({dtype: run(m) for dtype, m in models.items()}, repeats)
    return pd.DataFrame([{"stage": "prefill (features)", "variant": f"batch of {len(sequences)}, {k}", "unit": "tokens/s",
                          "rate": v} for k, v in rates.items()])


def training(model: PreTrainedModel, tokenizer, store: FeatureStore, rows: list[int], repeats: int = 3) -> pd.DataFrame:
    """Block tokens per second of a dspark-markov training step (forward, backward, AdamW), float32 and bf16 autocast."""
    def run(bf16: bool) -> Callable[[], int]:
        config = TrainConfig(bf16=bf16)
        drafter = build_drafter_model(config, model, tokenizer, torch.arange(config.draft_vocab))
        optimizer = torch.optim.AdamW(drafter.parameters(), lr=1e-5)

        def go() -> int:
            blocks = 0
            for i in rows:
                anchors = step_anchors(store.sequences.spans[i], config, 0, i)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    terms = compute_loss(drafter, drafter, make_batch(store, i, anchors, config.block, pad=TRAIN_PADDING),
                                         config.loss)
                terms["loss"].backward()
                blocks += len(anchors)
            optimizer.step()
            optimizer.zero_grad()
            return blocks * config.block
        return go

    rates = median_rates({"float32": run(False), "bfloat16 autocast": run(True)}, repeats)
    return pd.DataFrame([{"stage": "training (dspark-markov)", "variant": k, "unit": "block tokens/s", "rate": v}
                         for k, v in rates.items()])


def main(argv: list[str] | None = None) -> Path:
    """``python -m dspark_core.eval.throughput``: answering alone, on first turns of the distillation prompts
    (a seeded sample), every path side by side; writes ``data/results/throughput-answering-<time>.csv``."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--prompts", type=int, default=128, help="first turns of data/prompts/distill.jsonl to answer")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=DistillSettings.batch_size)
    parser.add_argument("--dtypes", nargs="+", default=["float32"], choices=sorted(DTYPES),
                        help="answer_batch's dtypes (float32 is always measured: the older paths run in it)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs of every path; the median is kept")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="CSV path (default data/results/throughput-answering-<time>.csv)")
    args = parser.parse_args(argv)
    records = load_prompt_set(DISTILL_PROMPTS)
    if not 1 <= args.prompts <= len(records):
        parser.error(f"--prompts must be 1 to {len(records)} (the records of {DISTILL_PROMPTS.name}), got {args.prompts}")
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_target()
    models = {name: model if name == "float32" else load_target(dtype=DTYPES[name])[0]
              for name in ["float32", *[d for d in args.dtypes if d != "float32"]]}
    records = random.Random(args.seed).sample(records, args.prompts)
    prompts = [encode_prompt(tokenizer, r["turns"][0]).tolist() for r in records]
    settings = DistillSettings(max_new_tokens=args.max_new_tokens, batch_size=args.batch_size)
    rates = answering(models, prompts, eos_token_ids(model, tokenizer), settings, args.repeats, whole_vocabulary=True)
    rates["x first row of its stage"] = rates["rate"] / rates["rate"].iloc[0]
    machine = machine_info()
    rates = rates.assign(prompts=args.prompts, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                         load_average=round(os.getloadavg()[0], 2), cpu_model=machine["cpu_model"],
                         cpu_units=machine["cpu_units"], torch_threads=machine["threads"], git_commit=machine["git_commit"])
    out = Path(args.out) if args.out else RESULTS_DIR / f"throughput-answering-{timestamp()}.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    rates.to_csv(out, index=False)
    print(rates[["variant", "rate", "x first row of its stage"]].to_string(index=False))
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    main()
