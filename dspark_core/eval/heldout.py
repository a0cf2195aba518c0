"""Held-out acceptance on the evaluation sets: how a recipe is chosen without decoding.

The *selection set* is the last ``per_benchmark`` records of every evaluation set (the benchmark
runs use the first ones, so the prompts a recipe is chosen on are not the prompts it is reported
on), answered greedily by the target. With teacher forcing on the target's own greedy answer, a
drafter's block after anchor a sees exactly what decoding shows it when the round's earlier
positions were accepted, so the share of blocks whose draft argmax equals the target's argmax at
position k, among those where positions 1..k-1 did, is the conditional greedy acceptance decoding
would measure at k (over every anchor rather than only round starts). The analytic acceptance at
temperature 1 (1 - ||p_d - p_t||_1 / 2) comes with it. Both are per domain. A draft LM is measured the
same way, at the shipped drafters' block length (it drafts any length).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..core.paths import PROMPT_DIR, process_tmp
from ..core.prompts import load_prompt_set
from ..core.target import cache_dir, encode_prompt, eos_token_ids, target_fingerprint
from ..data.distill import DistillSettings, answer_batch
from ..data.eval_prompts import EVAL_SETS
from ..data.features import FeatureSpec, FeatureStore, build_feature_store
from ..data.sequences import Sequences
from ..drafters.draft_lm import load_draft_lm
from ..drafters.trained import load_trained_drafter
from ..models import DrafterConfig
from ..models.losses import expected_tau
from ..models.parallel import TargetBoundDraftModel
from ..train.drafters import held_out_acceptance

DRAFT_LM_BLOCK = 7  # the block a draft LM is measured at: the shipped drafters'


def selection_set(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, per_benchmark: int = 24,
                  max_new_tokens: int = 128) -> Sequences:
    """The last ``per_benchmark`` first turns of every evaluation set with the target's greedy answers
    (cached per target and dtype in ``$DSPARK_CACHE_DIR/selection``); the span is the answer."""
    key = f"{target_fingerprint(model, tokenizer)}-{str(model.dtype).removeprefix('torch.')}-{per_benchmark}-{max_new_tokens}"
    path = cache_dir() / "selection" / f"{key}.json"
    if not path.is_file():
        records = [r for name in EVAL_SETS for r in load_prompt_set(PROMPT_DIR / name)[-per_benchmark:]]
        prompts = [encode_prompt(tokenizer, r["turns"][0]).tolist() for r in records]
        settings = DistillSettings(temperature=0.0, top_p=1.0, max_new_tokens=max_new_tokens)
        eos, answers = eos_token_ids(model, tokenizer), []
        for start in tqdm(range(0, len(prompts), 32), desc="selection set: greedy answers", unit="batch of 32"):
            answers += answer_batch(model, prompts[start : start + 32], settings, eos, torch.Generator())
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = process_tmp(path)
        tmp.write_text(json.dumps([{"id": r["id"], "domain": r["domain"], "prompt": p, "answer": a}
                                   for r, p, a in zip(records, prompts, answers)]))
        tmp.rename(path)
    rows = json.loads(path.read_text())
    return Sequences([r["id"] for r in rows], [r["domain"] for r in rows],
                     [np.asarray(r["prompt"] + r["answer"], dtype=np.int32) for r in rows],
                     [[(len(r["prompt"]), len(r["prompt"]) + len(r["answer"]))] for r in rows], {"selection_set": key})


def selection_store(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, layers: tuple[int, ...],
                    per_benchmark: int = 24) -> FeatureStore:
    return build_feature_store(model, tokenizer, selection_set(model, tokenizer, per_benchmark), FeatureSpec(layers=layers))


@torch.no_grad()
def domain_acceptance(drafter: TargetBoundDraftModel | PreTrainedModel, store: FeatureStore) -> pd.DataFrame:
    """One row per domain (and ``mean``, the mean over domains): the share of the target's greedy tokens
    outside the draft vocabulary (a cap on acceptance; none for a draft LM, which has the target's),
    greedy conditional acceptance a1..ag, expected tau from them, and the same at temperature 1 (analytic).
    ``drafter`` is a feature drafter (g is its block) or a draft LM (g is ``DRAFT_LM_BLOCK``)."""
    if isinstance(drafter, TargetBoundDraftModel):
        g, vocabulary = drafter.config.block_size, drafter.draft_token_ids
    else:
        g, vocabulary = DRAFT_LM_BLOCK, torch.arange(drafter.config.vocab_size)
    rows, sources = [], np.asarray(store.sequences.sources)
    for domain in sorted(set(sources)):
        measured = held_out_acceptance(drafter, store, np.flatnonzero(sources == domain), g)
        row = {"domain": domain, "outside_vocab": outside_share(vocabulary, store, np.flatnonzero(sources == domain))}
        for kind in ("greedy", "sampled"):
            acceptance = torch.tensor(measured[kind])
            row.update({f"{kind}_a{k + 1}": float(a) for k, a in enumerate(acceptance)})
            row[f"{kind}_tau"] = float(expected_tau(acceptance))
        rows.append(row)
    table = pd.DataFrame(rows).set_index("domain")
    table.loc["mean"] = table.mean()
    return table


def outside_share(draft_token_ids: torch.Tensor, store: FeatureStore, rows: np.ndarray) -> float:
    """Share of the target's most likely next tokens at the span positions of ``rows`` that are not in
    the draft vocabulary ``draft_token_ids`` (target ids)."""
    vocab, outside, total = set(draft_token_ids.tolist()), 0, 0
    for i in rows.tolist():
        for start, end in store.sequences.spans[i]:
            top = store.target_topk(i, np.arange(start - 1, end - 1))[0][:, 0].tolist()
            outside += sum(t not in vocab for t in top)
            total += len(top)
    return outside / max(1, total)


def evaluate_folder(folder: Path, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, per_benchmark: int = 24) -> pd.DataFrame:
    """Load a trained drafter folder (a feature drafter or a draft LM), measure it on the selection set
    in float32 (the precision it trained in, whatever the target's dtype), and save ``selection.csv`` beside it."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder} holds no config.json: pass a drafter folder written by `dspark train`.")
    if json.loads((folder / "config.json").read_text()).get("model_type") == DrafterConfig.model_type:
        served = load_trained_drafter(folder, model, tokenizer, torch.float32)
        drafter, layers = served.drafter, tuple(served.feature_layers)
    else:  # a draft LM reads no features: any store of the selection set holds the target's top k
        drafter, layers = load_draft_lm(str(folder), tokenizer)[0], FeatureSpec().layers
    table = domain_acceptance(drafter, selection_store(model, tokenizer, layers, per_benchmark))
    table.to_csv(folder / "selection.csv")
    return table


def write_curve_row(out_file: Path, row: dict) -> None:
    """Add one checkpoint's row (``step`` and its measures) to a selection curve, dropping the rows
    at that step and after it: a row is written only after its checkpoint is saved, so such rows come
    from an earlier run into the same folder (a fresh start over an old curve). Written atomically."""
    curve = pd.DataFrame([row])
    if out_file.is_file():
        earlier = pd.read_csv(out_file)
        curve = pd.concat([earlier[earlier["step"] < row["step"]], curve], ignore_index=True)
    tmp = process_tmp(out_file)
    curve.to_csv(tmp, index=False)
    tmp.rename(out_file)


def selection_curve(store: FeatureStore, out_file: Path) -> Callable[[int, TargetBoundDraftModel | PreTrainedModel], None]:
    """A training ``on_save`` hook: write the step's mean greedy a1 and expected tau (greedy and
    sampled) on the selection set to ``out_file``, to see when held-out acceptance stops rising."""

    def measure(step: int, drafter: TargetBoundDraftModel | PreTrainedModel) -> None:
        mean = domain_acceptance(drafter, store).loc["mean"]
        write_curve_row(out_file, {"step": step, "greedy_a1": mean["greedy_a1"], "greedy_tau": mean["greedy_tau"],
                                   "sampled_tau": mean["sampled_tau"]})

    return measure
