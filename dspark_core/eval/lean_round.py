"""Where a round's time goes outside the target's forward, and whether a pre-allocated KV cache pays:
the measurement ``dspark profile --round-split`` runs (meant for a quiet machine).

For each prompt and repetition, every (dtype, method, KV cache) cell decodes the prompt greedily once,
the cells in an order rotated from one repetition to the next so drift in the machine's load hits them
alike. Methods: plain decoding, the oracle (the target's own continuation, the ceiling) and the shipped
dspark-markov drafter, at block length ``gamma``; KV caches: ``dynamic`` (grown by concatenation,
cropped on rollback) and ``static`` (pre-allocated, written in place; see
:class:`~dspark_core.core.session.CausalLMSession`). Each row records tokens/s, the milliseconds per
round of each part (:data:`~dspark_core.core.rounds.ROUND_PARTS`), the share of the rounds' time
outside the target's forward, and the tokens, so the summary can check that both caches decode the same.
"""

from __future__ import annotations

import json

import pandas as pd
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..core.rounds import ROUND_PARTS, GenerationResult
from ..core.session import KV_CACHES
from ..core.target import eos_token_ids
from ..decode.loop import autoregressive_generate, speculative_generate
from ..decode.policies import FixedLength
from ..drafters.lookup import OracleDrafter
from ..drafters.registry import build_drafter

METHODS = ("plain", "oracle", "dspark-markov")


def split_per_round(result: GenerationResult) -> dict[str, float]:
    """Milliseconds per round of each round part, and the share of the rounds' time outside the forward."""
    split = result.time_split()
    columns = {f"{part}_ms": 1000 * split[part] / max(1, len(result.rounds)) for part in ROUND_PARTS}
    columns["outside_forward_share"] = result.outside_forward_share
    return columns


def measure_round_split(models: dict[str, PreTrainedModel], tokenizer: PreTrainedTokenizerBase,
                        prompts: list[torch.Tensor], gamma: int = 7, max_new_tokens: int = 64,
                        repeats: int = 1) -> pd.DataFrame:
    """One row per (prompt, repetition, dtype, method, KV cache) cell; ``models``: the target per dtype name."""
    first = next(iter(models.values()))
    eos = eos_token_ids(first, tokenizer)
    drafters = {name: build_drafter("dspark", model, tokenizer) for name, model in models.items()}
    cells = [(dtype, method, cache) for dtype in models for method in METHODS for cache in KV_CACHES]
    rows = []
    for index, prompt in enumerate(prompts):
        references = {name: autoregressive_generate(model, prompt, max_new_tokens=max_new_tokens, eos_token_ids=eos).tokens
                      for name, model in models.items()}  # the oracle's continuation, untimed
        for repeat in range(repeats):
            turn = (index * repeats + repeat) % len(cells)
            for dtype, method, cache in cells[turn:] + cells[:turn]:
                drafter = {"plain": None, "oracle": OracleDrafter(references[dtype]), "dspark-markov": drafters[dtype]}[method]
                result = speculative_generate(models[dtype], prompt, drafter, FixedLength(gamma) if drafter else None,
                                              max_new_tokens=max_new_tokens, eos_token_ids=eos, kv_cache=cache)
                rows.append({"prompt": index, "repeat": repeat, "dtype": dtype, "method": method, "kv_cache": cache,
                             "gamma": gamma if drafter else 0, "new_tokens": len(result.tokens),
                             "rounds": len(result.rounds), "tau": result.tau, "tokens_per_s": result.tokens_per_second,
                             **split_per_round(result), "tokens": json.dumps(result.tokens)})
    return pd.DataFrame(rows)


def summarize_round_split(rows: pd.DataFrame) -> pd.DataFrame:
    """Per dtype, method and KV cache: median tokens/s, ms per round of each part and share outside the
    forward; ``static_over_dynamic``: the median per-prompt ratio of the static cache's tokens/s to the
    dynamic one's; ``same_tokens``: the share of runs whose tokens equal the dynamic cache's run."""
    keys = ["prompt", "repeat", "dtype", "method"]
    dynamic = rows.loc[rows["kv_cache"] == "dynamic", [*keys, "tokens_per_s", "tokens"]]
    paired = rows.merge(dynamic, on=keys, suffixes=("", "_dynamic"))
    paired["static_over_dynamic"] = paired["tokens_per_s"] / paired["tokens_per_s_dynamic"]
    paired["same_tokens"] = paired["tokens"] == paired["tokens_dynamic"]
    columns = ["tokens_per_s", "tau", *(f"{part}_ms" for part in ROUND_PARTS), "outside_forward_share",
               "static_over_dynamic"]
    table = paired.groupby(["dtype", "method", "kv_cache"], sort=False)[columns].median()
    table["same_tokens"] = paired.groupby(["dtype", "method", "kv_cache"], sort=False)["same_tokens"].mean()
    return table.round(3)
