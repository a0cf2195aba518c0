"""Side-by-side comparison of plain and speculative decoding on the same prompts in one run.

Methods are interleaved prompt by prompt (plain decoding first, then every speculative method), so
every ratio compares runs made seconds apart on the same machine state. Speedup is reported as the
median of per-prompt ratios ``plain time / method time``.
"""

from __future__ import annotations

import csv
import json
import platform
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .decoding import GenerationResult, autoregressive_generate, speculative_generate
from .drafters.registry import build_drafter
from .policies import FixedLength
from .prompts import REPO_ROOT, first_turn_messages
from .sampling import SamplingConfig
from .target import encode_prompt, eos_token_ids


@dataclass(frozen=True)
class Method:
    """A drafter name, a block length and, for trained drafters, a checkpoint folder;
    ``plain`` is ``Method("none", 0)``."""

    drafter: str
    gamma: int
    checkpoint: str | None = None

    @property
    def label(self) -> str:
        if self.drafter == "none":
            return "plain"
        return f"{Path(self.checkpoint).name if self.checkpoint else self.drafter}@{self.gamma}"


def parse_methods(spec: str) -> list[Method]:
    """``"ngram:3,5,7;dspark=runs/dspark-markov:7"`` -> [Method("ngram", 3), ..., Method("dspark", 7, "runs/dspark-markov")]."""
    methods = []
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        name, _, gammas = part.rpartition(":")
        if not name or not gammas:
            raise ValueError(f"Method {part!r} needs block lengths, e.g. 'ngram:3,5,7' or 'dspark=<folder>:7'.")
        name, _, checkpoint = name.partition("=")
        methods += [Method(name.strip(), int(g), checkpoint.strip() or None) for g in gammas.split(",")]
    return methods


def machine_info() -> dict[str, str]:
    """Where a measurement was made: host, processor, torch build, threads, git commit."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {
        "host": platform.node(),
        "processor": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": str(torch.get_num_threads()),
        "git_commit": commit,
    }


def _row(record: dict, method: Method, result: GenerationResult, plain: GenerationResult) -> dict:
    reached, accepted = result.position_counts(method.gamma)
    return {
        "prompt_id": record["id"],
        "domain": record["domain"],
        "method": method.label,
        "drafter": method.drafter,
        "gamma": method.gamma,
        "new_tokens": len(result.tokens),
        "rounds": len(result.rounds),
        "tau": result.tau,
        "acceptance_rate": result.acceptance_rate,
        "draft_time": sum(r.draft_time for r in result.rounds),
        "verify_time": sum(r.verify_time for r in result.rounds),
        "total_time": result.total_time,
        "tokens_per_s": result.tokens_per_second,
        "speedup": plain.total_time / result.total_time * len(result.tokens) / max(1, len(plain.tokens)),
        "same_as_plain": result.tokens == plain.tokens,
        "reached_per_position": json.dumps(reached),
        "accepted_per_position": json.dumps(accepted),
    }


def compare(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    records: list[dict],
    methods: list[Method],
    *,
    sampling: SamplingConfig = SamplingConfig(),
    max_new_tokens: int = 128,
    seed: int = 0,
    out_csv: Path | None = None,
) -> pd.DataFrame:
    """Run plain decoding and every method on every prompt, interleaved; one row per (prompt, method).

    Rows are appended to ``out_csv`` as they are measured, so an interrupted run keeps its rows.
    The oracle drafter proposes the plain run's continuation for the same prompt and seed.
    Speedup is a throughput ratio: (method tok/s) / (plain tok/s) on the same prompt.
    """
    eos = eos_token_ids(model, tokenizer)
    plain_method = Method("none", 0)
    encoded = [encode_prompt(tokenizer, first_turn_messages(r)) for r in records]
    autoregressive_generate(model, encoded[0], max_new_tokens=8, eos_token_ids=eos)  # warm-up, not measured
    rows: list[dict] = []
    writer = None
    handle = out_csv.open("w", newline="") if out_csv else None
    try:
        for record, prompt in tqdm(list(zip(records, encoded)), desc="prompts", unit="prompt"):
            kwargs = dict(sampling=sampling, max_new_tokens=max_new_tokens, seed=seed, eos_token_ids=eos)
            plain = autoregressive_generate(model, prompt, **kwargs)
            new_rows = [_row(record, plain_method, plain, plain)]
            for method in methods:
                drafter = build_drafter(method.drafter, model, tokenizer, draft_model=method.checkpoint,
                                        reference=plain.tokens)
                result = speculative_generate(model, prompt, drafter, FixedLength(method.gamma), **kwargs)
                new_rows.append(_row(record, method, result, plain))
            rows += new_rows
            if handle:
                if writer is None:
                    writer = csv.DictWriter(handle, fieldnames=list(new_rows[0]))
                    writer.writeheader()
                writer.writerows(new_rows)
                handle.flush()
    finally:
        if handle:
            handle.close()
    return pd.DataFrame(rows)


def summarize(rows: pd.DataFrame) -> pd.DataFrame:
    """Per method: median tau, acceptance, tok/s, median per-prompt speedup, share identical to plain."""
    summary = rows.groupby("method", sort=False).agg(
        tau=("tau", "median"),
        acceptance=("acceptance_rate", "median"),
        tokens_per_s=("tokens_per_s", "median"),
        speedup=("speedup", "median"),
        same_as_plain=("same_as_plain", "mean"),
        prompts=("prompt_id", "count"),
    )
    return summary.round(3)


def conditional_acceptance(rows: pd.DataFrame) -> pd.DataFrame:
    """Per method and position k: accepted / reached over all prompts, where "reached" counts rounds
    that verified position k with positions 1..k-1 accepted."""
    table = {}
    for method, group in rows[rows["gamma"] > 0].groupby("method", sort=False):
        reached = np.sum([json.loads(r) for r in group["reached_per_position"]], axis=0)
        accepted = np.sum([json.loads(a) for a in group["accepted_per_position"]], axis=0)
        table[method] = np.divide(accepted, reached, out=np.full(len(reached), np.nan), where=reached > 0)
    frame = pd.DataFrame.from_dict(table, orient="index")
    frame.columns = [f"k={k + 1}" for k in frame.columns]
    return frame.round(3)


def timestamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")
