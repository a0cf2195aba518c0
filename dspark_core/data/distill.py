"""Self-distillation data: the target answers the training prompts, and its answers are training text.

``dspark data generate`` answers every record of ``data/prompts/distill.jsonl`` (see
:mod:`.training_set`) turn by turn: all first turns, then the second turns with the target's own
first answers in the context, and so on. Answers are sampled in batches of prompts of similar
length (:func:`answer_batch`: a pre-allocated KV cache, finished rows dropped as they end, top-p
over the few hundred most likely tokens), and every finished batch is appended to ``parts.jsonl``,
so an interrupted run resumes where it stopped (a line torn by a crash is detected and dropped).

``pack`` writes everything answered so far as compact token ids: ``responses-NNN.safetensors``
chunks (uint16 when the vocabulary fits) and ``meta.json`` (ids, turns, sampling settings, target
fingerprint, counts). Prompt ids are not stored: :func:`load` rebuilds them from the prompt file and
the earlier answers with the chat template. Only the packed files are committed.

Recipe (DSpark paper, 3.3): temperature 0.7, top-p 0.8.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import load_file, save_file
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase, StaticCache

from ..core.jsonl import append_jsonl, read_jsonl
from ..core.paths import REPO_ROOT
from ..core.prompts import load_prompt_set
from ..core.provenance import machine_info
from ..core.sampling import SamplingConfig, probs_from_logits, sample
from ..core.target import (
    encode_prompt,
    eos_token_ids,
    target_fingerprint,
    tokenizer_fingerprint,
)
from .sequences import Sequences

DISTILL_DIR = REPO_ROOT / "data" / "distill" / "smollm2-135m-instruct"


@dataclass(frozen=True)
class DistillSettings:
    temperature: float = 0.7
    top_p: float = 0.8
    max_new_tokens: int = 256
    batch_size: int = 128
    seed: int = 0
    chunk_size: int = 1500  # answers per packed file


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def _select_rows(cache: StaticCache, rows: torch.Tensor) -> None:
    """Keep only ``rows`` of every layer of a pre-allocated cache."""
    for layer in cache.layers:
        layer.keys, layer.values = layer.keys[rows], layer.values[rows]


@torch.inference_mode()
def answer_batch(
    model: PreTrainedModel,
    prompts: list[list[int]],
    settings: DistillSettings,
    eos: tuple[int, ...],
    generator: torch.Generator,
) -> list[list[int]]:
    """Sample one answer per prompt (ending at an EOS token, kept, or after ``max_new_tokens``).

    The prompts are left-padded into one pre-allocated cache; a row stops costing anything once it
    has ended (rows are dropped from the cache whenever a quarter of them have finished).
    """
    sampling = SamplingConfig(settings.temperature, 0, settings.top_p)
    width, device = max(len(p) for p in prompts), model.device
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :], mask[row, width - len(prompt) :] = torch.tensor(prompt), 1
    cache = StaticCache(config=model.config, max_cache_len=width + settings.max_new_tokens)
    positions = (mask.cumsum(1) - 1).clamp_min(0)
    logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device),
                   cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
    answers: list[list[int]] = [[] for _ in prompts]
    live = torch.arange(len(prompts))  # prompt index of each cache row
    ended = torch.zeros(len(prompts), dtype=torch.bool)  # per cache row
    next_position = positions[:, -1] + 1
    for step in range(settings.max_new_tokens):
        tokens = sample(probs_from_logits(logits, sampling), generator).cpu()
        for row, (index, token) in enumerate(zip(live.tolist(), tokens.tolist())):
            if not ended[row]:
                answers[index].append(token)
                ended[row] = token in eos
        if ended.all() or step + 1 == settings.max_new_tokens:
            break
        if ended.sum() * 4 >= len(live):
            keep = (~ended).nonzero().squeeze(-1)
            _select_rows(cache, keep.to(device))
            live, tokens, mask, next_position, ended = live[keep], tokens[keep], mask[keep], next_position[keep], ended[keep]
        mask = torch.cat([mask, torch.ones(len(live), 1, dtype=torch.long)], dim=1)
        logits = model(input_ids=tokens[:, None].to(device), attention_mask=mask.to(device),
                       position_ids=next_position[:, None].to(device), cache=cache, use_cache=True).logits[:, -1]
        next_position = next_position + 1
    return answers


def _batches(lengths: list[int], batch_size: int, seed: int) -> list[list[int]]:
    """Indices in batches, in a fixed order that a resumed run repeats: shuffled (so a partial run is
    a random, domain-mixed subset), cut into chunks of 16 batches, sorted by length inside each chunk."""
    order = list(range(len(lengths)))
    random.Random(seed).shuffle(order)
    chunk = batch_size * 16
    batches = []
    for start in range(0, len(order), chunk):
        part = sorted(order[start : start + chunk], key=lambda i: lengths[i])
        batches += [part[i : i + batch_size] for i in range(0, len(part), batch_size)]
    return batches


def turn_messages(record: dict, turn: int, answers: dict[tuple[str, int], list[int]],
                  tokenizer: PreTrainedTokenizerBase) -> list[dict[str, str]]:
    """The chat messages that ask ``record``'s turn ``turn`` (1-based): its earlier user turns, each
    followed by the target's own answer to it (decoded), then the user turn itself."""
    messages = []
    for t in range(1, turn):
        messages += [{"role": "user", "content": record["turns"][t - 1]},
                     {"role": "assistant", "content": tokenizer.decode(answers[(record["id"], t)], skip_special_tokens=True)}]
    return messages + [{"role": "user", "content": record["turns"][turn - 1]}]


def _answered(out_dir: Path) -> tuple[dict[tuple[str, int], list[int]], dict[tuple[str, int], str]]:
    """{(id, turn): answer} from the packed chunks and ``parts.jsonl``, and {(id, turn): the target's
    dtype when it answered} (a run may be resumed in another dtype: the fastest one differs by machine)."""
    done, dtypes = {}, {}
    if (out_dir / "meta.json").is_file():
        meta = json.loads((out_dir / "meta.json").read_text())
        keys = list(zip(meta["ids"], meta["turns"]))
        done.update(zip(keys, _read_chunks(out_dir, meta)))
        dtypes.update(zip(keys, meta.get("dtypes") or [meta["target_dtype"]] * len(keys)))  # packed before dtypes were kept
    for batch in read_jsonl(out_dir / "parts.jsonl"):  # one line per batch: a batch is saved whole or not at all
        done.update({(i, batch["turn"]): answer for i, answer in batch["answers"].items()})
        dtypes.update({(i, batch["turn"]): batch["dtype"] for i in batch["answers"]})
    return done, dtypes


def generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    records: list[dict],
    out_dir: Path = DISTILL_DIR,
    settings: DistillSettings = DistillSettings(),
) -> Path:
    """Answer every turn of every record with the target, resuming from what ``out_dir`` holds."""
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = out_dir / "parts.jsonl"
    done, _ = _answered(out_dir)
    dtype = str(model.dtype).removeprefix("torch.")
    eos = eos_token_ids(model, tokenizer)
    total = sum(len(r["turns"]) for r in records)
    bar = tqdm(total=total, initial=sum(1 for r in records for t in range(len(r["turns"])) if (r["id"], t + 1) in done),
               desc="distill", unit="answer")
    new_tokens, tic = 0, time.perf_counter()
    for turn in range(1, max(len(r["turns"]) for r in records) + 1):
        asked = [r for r in records if len(r["turns"]) >= turn]
        encoded = [encode_prompt(tokenizer, turn_messages(r, turn, done, tokenizer)).tolist() if (r["id"], turn) not in done
                   else [] for r in asked]
        for batch_index, indices in enumerate(_batches([len(e) for e in encoded], settings.batch_size, settings.seed + turn)):
            todo = [i for i in indices if (asked[i]["id"], turn) not in done]
            if not todo:
                continue
            # the batch's sample depends on its seed and members only, never on where a run was resumed
            generator = torch.Generator(device=model.device).manual_seed(settings.seed * 1_000_003 + turn * 10_007 + batch_index)
            answers = answer_batch(model, [encoded[i] for i in todo], settings, eos, generator)
            batch = {asked[i]["id"]: answer for i, answer in zip(todo, answers)}
            append_jsonl(parts, [{"turn": turn, "dtype": dtype, "answers": batch}])
            done.update({(i, turn): answer for i, answer in batch.items()})
            new_tokens += sum(len(a) for a in answers)
            bar.update(len(todo))
            bar.set_postfix(tok_per_s=f"{new_tokens / (time.perf_counter() - tic):.0f}")
    bar.close()
    return parts


def _read_chunks(out_dir: Path, meta: dict) -> list[list[int]]:
    answers = []
    for name in meta["chunks"]:
        arrays = load_file(str(out_dir / name))
        tokens, offsets = arrays["tokens"].astype(np.int64), arrays["offsets"]
        answers += [tokens[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])]
    if len(answers) != len(meta["ids"]):
        raise ValueError(f"{out_dir}: the chunks hold {len(answers)} answers, meta.json lists {len(meta['ids'])}; "
                         "re-run `dspark data pack`.")
    return answers


def pack(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    records: list[dict],
    prompt_file: Path,
    out_dir: Path = DISTILL_DIR,
    settings: DistillSettings = DistillSettings(),
) -> Path:
    """Write every answered turn (in prompt-file order) as token-id chunks plus ``meta.json``.

    A turn is packed only when every earlier turn of its record is, so the packed data always
    rebuilds its own prompts."""
    done, dtypes = _answered(out_dir)
    keys = []
    for r in records:
        for turn in range(1, len(r["turns"]) + 1):
            if (r["id"], turn) not in done:
                break
            keys.append((r["id"], turn, r["domain"]))
    answers = [done[(i, t)] for i, t, _ in keys]
    vocab = model.get_output_embeddings().weight.shape[0]
    dtype = np.uint16 if vocab <= np.iinfo(np.uint16).max + 1 else np.int32
    for old in out_dir.glob("responses-*.safetensors"):
        old.unlink()
    chunks = []
    for c, start in enumerate(range(0, len(answers), settings.chunk_size)):
        part = answers[start : start + settings.chunk_size]
        name = f"responses-{c:03d}.safetensors"
        save_file({"tokens": np.array([t for a in part for t in a], dtype=dtype),
                   "offsets": np.cumsum([0] + [len(a) for a in part]).astype(np.int64)}, str(out_dir / name))
        chunks.append(name)
    eos = eos_token_ids(model, tokenizer)
    domains: dict[str, int] = {}
    for (_, _, domain), answer in zip(keys, answers):
        domains[domain] = domains.get(domain, 0) + len(answer)
    meta = {
        "target_fingerprint": target_fingerprint(model, tokenizer),
        "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
        "target_dtypes": dict(Counter(dtypes[(i, t)] for i, t, _ in keys)),
        "prompt_file": _display_path(prompt_file),
        "prompt_file_sha256": file_sha256(prompt_file),
        "settings": asdict(settings),
        "turns_total": sum(len(r["turns"]) for r in records),
        "turns_answered": len(keys),
        "complete": len(keys) == sum(len(r["turns"]) for r in records),
        "response_tokens": sum(len(a) for a in answers),
        "response_tokens_by_domain": domains,
        "ended_with_eos": sum(1 for a in answers if a and a[-1] in eos),
        "chunks": chunks,
        "ids": [i for i, _, _ in keys],
        "turns": [t for _, t, _ in keys],
        "domains": [d for _, _, d in keys],
        "dtypes": [dtypes[(i, t)] for i, t, _ in keys],
        "machine": machine_info(),
        "command": "dspark data generate && dspark data pack",
    }
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=1))
    (out_dir / "parts.jsonl").unlink(missing_ok=True)  # everything in it is packed now
    return out_dir / "meta.json"


def _display_path(path: Path) -> str:
    """The path relative to the repository when it lies inside it (stable across checkouts)."""
    path = Path(path).resolve()
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def load(tokenizer: PreTrainedTokenizerBase, out_dir: Path = DISTILL_DIR) -> Sequences:
    """Packed answers as training sequences (prompt ids rebuilt with the chat template; the span a
    drafter learns is the answer). Raises a clear error when the data is missing, inconsistent, or
    was made with another tokenizer or prompt file."""
    meta_path = out_dir / "meta.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"No distillation data in {out_dir}: run `dspark data generate` then `dspark data pack`.")
    meta = json.loads(meta_path.read_text())
    if meta["tokenizer_fingerprint"] != tokenizer_fingerprint(tokenizer):
        raise ValueError(f"{out_dir} was made with another tokenizer (fingerprint {meta['tokenizer_fingerprint']}, "
                         f"this target's is {tokenizer_fingerprint(tokenizer)}); generate data for this target.")
    prompt_file = REPO_ROOT / meta["prompt_file"] if not Path(meta["prompt_file"]).is_absolute() else Path(meta["prompt_file"])
    if file_sha256(prompt_file) != meta["prompt_file_sha256"]:
        raise ValueError(f"{prompt_file} changed since {out_dir} was packed; re-run `dspark data generate`.")
    records = {r["id"]: r for r in load_prompt_set(prompt_file)}
    answers = dict(zip(zip(meta["ids"], meta["turns"]), _read_chunks(out_dir, meta)))
    tokens, spans, names = [], [], []
    for record_id, turn in answers:
        prompt = encode_prompt(tokenizer, turn_messages(records[record_id], turn, answers, tokenizer)).numpy()
        answer = np.asarray(answers[(record_id, turn)], dtype=np.int64)
        tokens.append(np.concatenate([prompt, answer]).astype(np.int32))
        spans.append([(len(prompt), len(prompt) + len(answer))])
        names.append(f"{record_id}#{turn}")
    return Sequences(names, [f"distill:{d}" for d in meta["domains"]], tokens, spans,
                     {"distill": {k: v for k, v in meta.items() if k not in ("ids", "turns", "domains", "dtypes")}})
