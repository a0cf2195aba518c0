"""Self-distillation data: the target answers every training prompt; the answers are the training text.

``dspark data generate`` samples answers in batches (left-padded ``model.generate``), appending each
finished batch to ``parts.jsonl`` so an interrupted run resumes where it stopped. ``pack`` turns
everything done so far into ``tokens.safetensors`` (flat int32 token arrays with offsets) and
``meta.json`` (target fingerprint, sampling settings, prompt-set hash, counts). Only the packed files
are committed.

Recipe (DSpark paper, 3.3): temperature 0.7, top-p 0.8.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import load_file, save_file
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..core.prompts import REPO_ROOT, first_turn_messages
from ..core.provenance import machine_info
from ..core.target import encode_prompt, eos_token_ids, target_fingerprint

DISTILL_DIR = REPO_ROOT / "data" / "distill" / "smollm2-135m-instruct"


@dataclass(frozen=True)
class DistillSettings:
    temperature: float = 0.7
    top_p: float = 0.8
    max_new_tokens: int = 192
    batch_size: int = 32
    seed: int = 0


@dataclass
class DistillData:
    """Prompts and target-written responses as token ids (prompt ids include the chat template)."""

    ids: list[str]
    domains: list[str]
    prompts: list[list[int]]
    responses: list[list[int]]
    meta: dict

    def subset(self, count: int, seed: int = 0) -> "DistillData":
        """A seeded random subset of ``count`` sequences (all domains mixed), in their original order."""
        if count >= len(self.ids):
            return self
        keep = sorted(random.Random(seed).sample(range(len(self.ids)), count))
        pick = lambda values: [values[i] for i in keep]  # noqa: E731
        return DistillData(pick(self.ids), pick(self.domains), pick(self.prompts), pick(self.responses), self.meta)


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def _read_parts(path: Path) -> dict[str, list[int]]:
    """Responses already written, by prompt id; a torn last line (a crash mid-write) is ignored."""
    done: dict[str, list[int]] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            done[record["id"]] = record["response"]
    return done


def _batches(lengths: list[int], batch_size: int, seed: int) -> list[list[int]]:
    """Prompt indices in batches, in a fixed order that a resumed run repeats.

    Prompts are shuffled (so a partial run is a random, domain-mixed subset), cut into chunks of
    16 batches, and sorted by length inside each chunk (so a batch carries little padding).
    """
    order = list(range(len(lengths)))
    random.Random(seed).shuffle(order)
    chunk = batch_size * 16
    batches = []
    for start in range(0, len(order), chunk):
        part = sorted(order[start : start + chunk], key=lambda i: lengths[i])
        batches += [part[i : i + batch_size] for i in range(0, len(part), batch_size)]
    return batches


def _cut_at_eos(tokens: list[int], eos: tuple[int, ...]) -> list[int]:
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[: i + 1]
    return tokens


def generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    records: list[dict],
    out_dir: Path = DISTILL_DIR,
    settings: DistillSettings = DistillSettings(),
) -> Path:
    """Answer every record's first turn with the target, resuming from ``out_dir/parts.jsonl``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = out_dir / "parts.jsonl"
    done = {**_packed_responses(out_dir), **_read_parts(parts)}
    encoded = [encode_prompt(tokenizer, first_turn_messages(r)).tolist() for r in records]
    eos = eos_token_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    batches = _batches([len(e) for e in encoded], settings.batch_size, settings.seed)
    todo = [(b, idx) for b, idx in enumerate(batches) if any(records[i]["id"] not in done for i in idx)]
    with parts.open("a") as handle, tqdm(total=len(records), initial=len(records) - sum(len(i) for _, i in todo),
                                         desc="distill", unit="prompt") as bar:
        for batch_index, indices in todo:
            width = max(len(encoded[i]) for i in indices)
            input_ids = torch.full((len(indices), width), pad, dtype=torch.long)
            attention = torch.zeros_like(input_ids)
            for row, i in enumerate(indices):
                input_ids[row, width - len(encoded[i]) :] = torch.tensor(encoded[i])
                attention[row, width - len(encoded[i]) :] = 1
            torch.manual_seed(settings.seed * 1_000_003 + batch_index)  # a batch's sample does not depend on resumes
            with torch.inference_mode():
                out = model.generate(
                    input_ids.to(model.device), attention_mask=attention.to(model.device), do_sample=True,
                    temperature=settings.temperature, top_p=settings.top_p, top_k=0,
                    max_new_tokens=settings.max_new_tokens, pad_token_id=pad,
                )
            lines = [
                json.dumps({"id": records[i]["id"], "response": _cut_at_eos(out[row, width:].tolist(), eos)})
                for row, i in enumerate(indices)
            ]
            handle.write("\n".join(lines) + "\n")
            handle.flush()
            bar.update(len(indices))
    return parts


def _packed_responses(out_dir: Path) -> dict[str, list[int]]:
    if not (out_dir / "tokens.safetensors").is_file():
        return {}
    data = load(out_dir)
    return dict(zip(data.ids, data.responses))


def pack(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    records: list[dict],
    prompt_file: Path,
    out_dir: Path = DISTILL_DIR,
    settings: DistillSettings = DistillSettings(),
) -> Path:
    """Write everything answered so far to ``tokens.safetensors`` + ``meta.json`` (in prompt-file order)."""
    done = {**_packed_responses(out_dir), **_read_parts(out_dir / "parts.jsonl")}
    kept = [r for r in records if r["id"] in done]
    prompts = [encode_prompt(tokenizer, first_turn_messages(r)).tolist() for r in kept]
    responses = [done[r["id"]] for r in kept]

    def flat(seqs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        offsets = np.cumsum([0] + [len(s) for s in seqs]).astype(np.int64)
        return np.array([t for s in seqs for t in s], dtype=np.int32), offsets

    prompt_tokens, prompt_offsets = flat(prompts)
    response_tokens, response_offsets = flat(responses)
    save_file({"prompt_tokens": prompt_tokens, "prompt_offsets": prompt_offsets,
               "response_tokens": response_tokens, "response_offsets": response_offsets},
              str(out_dir / "tokens.safetensors"))
    eos = eos_token_ids(model, tokenizer)
    meta = {
        "target_fingerprint": target_fingerprint(model, tokenizer),
        "prompt_file": _display_path(prompt_file),
        "prompt_file_sha256": file_sha256(prompt_file),
        "settings": asdict(settings),
        "n_prompts_total": len(records),
        "n_answered": len(kept),
        "complete": len(kept) == len(records),
        "response_tokens": int(response_tokens.size),
        "ended_with_eos": int(sum(1 for r in responses if r and r[-1] in eos)),
        "ids": [r["id"] for r in kept],
        "domains": [r["domain"] for r in kept],
        "machine": machine_info(),
        "command": "dspark data generate && dspark data pack",
    }
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=1))
    return out_dir / "tokens.safetensors"


def _display_path(path: Path) -> str:
    """The path relative to the repository when it lies inside it (stable across checkouts)."""
    path = Path(path).resolve()
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def load(out_dir: Path = DISTILL_DIR) -> DistillData:
    """Read packed distillation data; raises a clear error when it is missing or inconsistent."""
    tensors_path, meta_path = out_dir / "tokens.safetensors", out_dir / "meta.json"
    if not tensors_path.is_file() or not meta_path.is_file():
        raise FileNotFoundError(f"No distillation data in {out_dir}: run `dspark data generate` then `dspark data pack`.")
    arrays = load_file(str(tensors_path))
    meta = json.loads(meta_path.read_text())

    def split(tokens: np.ndarray, offsets: np.ndarray) -> list[list[int]]:
        return [tokens[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])]

    prompts = split(arrays["prompt_tokens"], arrays["prompt_offsets"])
    responses = split(arrays["response_tokens"], arrays["response_offsets"])
    if not len(prompts) == len(responses) == len(meta["ids"]):
        raise ValueError(f"{out_dir}: token arrays and meta.json disagree on the number of prompts; re-run `dspark data pack`.")
    return DistillData(meta["ids"], meta["domains"], prompts, responses, meta)
