"""Self-distillation data: the target answers the training prompts, and its answers are training text.

``dspark data generate`` answers every record of ``data/prompts/distill.jsonl`` (see
:mod:`.training_set`) turn by turn: all first turns, then the second turns with the target's own
first answers in the context, and so on. Answers are sampled in batches of prompts of similar
length (:func:`answer_batch`: a pre-allocated KV cache, finished rows dropped as they end, top-p
sampled among the few hundred most likely tokens), and every finished batch is appended to ``parts.jsonl``,
so an interrupted run resumes where it stopped (a line torn by a crash is detected and dropped).

``pack`` appends everything answered since the last pack as compact token ids: new
``responses-NNN.safetensors`` chunks (uint16 when the vocabulary fits; a packed chunk is never
rewritten) and ``meta.json`` (ids, turns, sampling settings, target fingerprint, counts, which pack
wrote which chunks on which machine). Prompt ids are not stored: :func:`load` rebuilds them from the
prompt file and the earlier answers with the chat template, from every chunk or from the first N (a
training run pinned to the data it was trained on). Only the packed files are committed.

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

from ..core.jsonl import append_jsonl, read_jsonl, replace_jsonl
from ..core.paths import REPO_ROOT
from ..core.prompts import load_prompt_set
from ..core.provenance import machine_info
from ..core.sampling import SamplingConfig, sample_from_logits
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
    candidates: int = 256,
) -> list[list[int]]:
    """Sample one answer per prompt (ending at an EOS token, kept, or after ``max_new_tokens``).

    The prompts are left-padded into one pre-allocated cache; a row stops costing anything once it
    has ended (rows are dropped from the cache whenever a quarter of them have finished). Each token
    is drawn among the ``candidates`` most likely where they hold the nucleus
    (:func:`..core.sampling.sample_from_logits`; the vocabulary size draws from the whole distribution).
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
        tokens = sample_from_logits(logits, sampling, generator, candidates).cpu()
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


@dataclass(frozen=True)
class _Stored:
    """What an answers folder holds, read once: its packed ``meta.json`` (None when nothing is packed) and the
    batches of ``parts.jsonl`` not packed yet (one line per batch: a batch is saved whole or not at all)."""

    out_dir: Path
    meta: dict | None
    parts: list[dict]


def _read_stored(out_dir: Path) -> _Stored:
    return _Stored(out_dir, _read_meta(out_dir), read_jsonl(out_dir / "parts.jsonl"))


def _answered(stored: _Stored) -> tuple[dict[tuple[str, int], list[int]], dict[tuple[str, int], str]]:
    """{(id, turn): answer} from the packed chunks and ``parts.jsonl``, and {(id, turn): the target's
    dtype when it answered} (a run may be resumed in another dtype: the fastest one differs by machine)."""
    done, dtypes = {}, {}
    if stored.meta is not None:
        keys = list(zip(stored.meta["ids"], stored.meta["turns"]))
        done.update(zip(keys, _packed_answers(stored.out_dir, stored.meta)))
        dtypes.update(zip(keys, stored.meta["dtypes"]))
    for batch in stored.parts:
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
    stored = _read_stored(out_dir)
    _check_same_inputs(stored, model, tokenizer, None, settings)  # before hours of answering, not at packing
    done, _ = _answered(stored)
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
            append_jsonl(parts, [{"turn": turn, "dtype": dtype, "settings": asdict(settings), "answers": batch}])
            done.update({(i, turn): answer for i, answer in batch.items()})
            new_tokens += sum(len(a) for a in answers)
            bar.update(len(todo))
            bar.set_postfix(tok_per_s=f"{new_tokens / (time.perf_counter() - tic):.0f}")
    bar.close()
    return parts


def _read_chunks(out_dir: Path, names: list[str]) -> list[list[int]]:
    """Every answer of the chunk files ``names``, in order."""
    answers = []
    for name in names:
        arrays = load_file(str(out_dir / name))
        tokens, offsets = arrays["tokens"].astype(np.int64), arrays["offsets"]
        answers += [tokens[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])]
    return answers


def _packed_answers(out_dir: Path, meta: dict, chunks: int | None = None) -> list[list[int]]:
    """The answers of the first ``chunks`` chunks (all when None), checked against ``meta.json``'s lists."""
    names = meta["chunks"] if chunks is None else meta["chunks"][:chunks]
    answers = _read_chunks(out_dir, names)
    expected = len(meta["ids"]) if chunks is None else sum(meta["chunk_answers"][:chunks])
    if len(answers) != expected:
        raise ValueError(f"{out_dir}: the chunks hold {len(answers)} answers, meta.json lists {expected}; "
                         "re-run `dspark data pack`.")
    return answers


def answer_counts(domains: list[str], dtypes: list[str], answers: list[list[int]], eos: list[int]) -> dict:
    """The counts ``meta.json`` records about packed answers (and a snapshot of them reports)."""
    by_domain: dict[str, int] = {}
    for domain, answer in zip(domains, answers):
        by_domain[domain] = by_domain.get(domain, 0) + len(answer)
    return {"target_dtypes": dict(Counter(dtypes)), "turns_answered": len(answers),
            "response_tokens": sum(len(a) for a in answers), "response_tokens_by_domain": by_domain,
            "ended_with_eos": sum(1 for a in answers if a and a[-1] in eos)}


def pack(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    records: list[dict],
    prompt_file: Path,
    out_dir: Path = DISTILL_DIR,
    settings: DistillSettings = DistillSettings(),
) -> Path:
    """Append every answered turn that is not packed yet (in prompt-file order) as new token-id chunks,
    and rewrite ``meta.json`` to list them after the earlier ones.

    Packed chunks are never rewritten, so the first N chunks always hold the same answers: a training run
    pinned to them (``--distill-chunks N``) reads the same text after later answers are packed. A turn is
    packed only when every earlier turn of its record is, so the first N chunks always rebuild their own
    prompts. Answers that cannot be packed yet stay in ``parts.jsonl``."""
    meta_path = out_dir / "meta.json"
    stored = _read_stored(out_dir)
    _check_same_inputs(stored, model, tokenizer, prompt_file, settings)
    old = stored.meta
    done, dtypes = _answered(stored)
    packed = set(zip(old["ids"], old["turns"])) if old else set()
    new = []
    for r in records:
        for turn in range(1, len(r["turns"]) + 1):
            if (r["id"], turn) not in done:
                break
            if (r["id"], turn) not in packed:
                new.append((r["id"], turn, r["domain"]))
    if old is None and not new:
        raise ValueError(f"Nothing in {out_dir} answers a turn of these records yet: run `dspark data generate` first.")
    vocab = model.get_output_embeddings().weight.shape[0]
    dtype = np.uint16 if vocab <= np.iinfo(np.uint16).max + 1 else np.int32
    chunks, chunk_answers = (old["chunks"], old["chunk_answers"]) if old else ([], [])
    added = []
    for start in range(0, len(new), settings.chunk_size):
        part = [done[(i, t)] for i, t, _ in new[start : start + settings.chunk_size]]
        name = f"responses-{len(chunks) + len(added):03d}.safetensors"
        save_file({"tokens": np.array([t for a in part for t in a], dtype=dtype),
                   "offsets": np.cumsum([0] + [len(a) for a in part]).astype(np.int64)}, str(out_dir / name))
        added.append(name)
        chunk_answers = chunk_answers + [len(part)]
    keys = (list(zip(old["ids"], old["turns"], old["domains"])) if old else []) + new
    keyset = {(i, t) for i, t, _ in keys}
    key_dtypes = (old["dtypes"] if old else []) + [dtypes[(i, t)] for i, t, _ in new]
    answers = [done[(i, t)] for i, t, _ in keys]
    eos = list(eos_token_ids(model, tokenizer))
    packs = (old["packs"] if old else []) + ([{"chunks": added, "machine": machine_info()}] if added else [])
    meta = {
        "target_fingerprint": target_fingerprint(model, tokenizer),
        "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
        "prompt_file": _display_path(prompt_file),
        "prompt_file_sha256": file_sha256(prompt_file),
        "settings": asdict(settings),
        "eos_token_ids": eos,
        "turns_total": sum(len(r["turns"]) for r in records),
        "complete": all((r["id"], t) in keyset for r in records for t in range(1, len(r["turns"]) + 1)),
        **answer_counts([d for _, _, d in keys], key_dtypes, answers, eos),
        "chunks": chunks + added,
        "chunk_answers": chunk_answers,
        "packs": packs,  # which pack wrote which chunks, on which machine
        "machine": packs[-1]["machine"],  # of the last pack that wrote chunks (pack refuses to write none)
        "ids": [i for i, _, _ in keys],
        "turns": [t for _, t, _ in keys],
        "domains": [d for _, _, d in keys],
        "dtypes": key_dtypes,
        "command": "dspark data generate && dspark data pack",
    }
    meta_path.write_text(json.dumps(meta, indent=1))
    _keep_unpacked_parts(stored, keyset)
    return meta_path


def _read_meta(out_dir: Path) -> dict | None:
    """``meta.json`` of ``out_dir`` (None when nothing is packed); raises ValueError for one written before
    packing became append-only."""
    path = out_dir / "meta.json"
    if not path.is_file():
        return None
    meta = json.loads(path.read_text())
    missing = [key for key in ("chunk_answers", "packs", "eos_token_ids") if key not in meta]
    if missing:
        raise ValueError(f"{path} was written before packing became append-only (no {', '.join(missing)}). Add them "
                         "(chunk_answers: the answers of each chunk, its offsets less one; packs: [{chunks: every "
                         "chunk, machine: its machine}]; eos_token_ids: the target's) or generate into another --out-dir.")
    return meta


def _check_same_inputs(stored: _Stored, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                       prompt_file: Path | None, settings: DistillSettings) -> None:
    """Check that what the folder holds was answered by this target with these sampling settings (and, when
    given, from this prompt file): new answers extend it only then. Raises ValueError naming what differs."""
    recorded = stored.meta or {}
    now = {"target_fingerprint": target_fingerprint(model, tokenizer), "settings": asdict(settings)}
    if prompt_file is not None:
        now["prompt_file_sha256"] = file_sha256(prompt_file)
    differ = [f"{key} {recorded[key]!r} (packed) vs {value!r}" for key, value in now.items()
              if key in recorded and recorded[key] != value]
    differ += [f"settings {batch['settings']!r} (parts.jsonl, turn {batch['turn']}) vs {now['settings']!r}"
               for batch in stored.parts if batch.get("settings") != now["settings"]][:1]
    if differ:
        raise ValueError(f"{stored.out_dir} holds answers made with other inputs: " + "; ".join(differ)
                         + ". Pass the settings they were made with, or use another --out-dir.")


def _keep_unpacked_parts(stored: _Stored, packed: set[tuple[str, int]]) -> None:
    """Rewrite ``parts.jsonl`` with only the answers of ``stored.parts`` not packed (no file when none is left),
    atomically. Not to run while ``generate`` appends to it."""
    rest = []
    for batch in stored.parts:
        answers = {i: a for i, a in batch["answers"].items() if (i, batch["turn"]) not in packed}
        if answers:
            rest.append({**batch, "answers": answers})
    replace_jsonl(stored.out_dir / "parts.jsonl", rest)


def _display_path(path: Path) -> str:
    """The path relative to the repository when it lies inside it (stable across checkouts)."""
    path = Path(path).resolve()
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def load(tokenizer: PreTrainedTokenizerBase, out_dir: Path = DISTILL_DIR, chunks: int | None = None) -> Sequences:
    """Packed answers as training sequences (prompt ids rebuilt with the chat template; the span a
    drafter learns is the answer): every chunk, or the first ``chunks`` (a snapshot that later packs
    leave unchanged; its counts in the sequences' meta are the snapshot's). Raises a clear error when
    the data is missing, inconsistent, or was made with another tokenizer or prompt file."""
    meta = _read_meta(out_dir)
    if meta is None:
        raise FileNotFoundError(f"No distillation data in {out_dir}: run `dspark data generate` then `dspark data pack`.")
    if meta["tokenizer_fingerprint"] != tokenizer_fingerprint(tokenizer):
        raise ValueError(f"{out_dir} was made with another tokenizer (fingerprint {meta['tokenizer_fingerprint']}, "
                         f"this target's is {tokenizer_fingerprint(tokenizer)}); generate data for this target.")
    if chunks is not None and not 1 <= chunks <= len(meta["chunks"]):
        raise ValueError(f"{out_dir} holds {len(meta['chunks'])} chunks of answers; --distill-chunks must be 1 to "
                         f"{len(meta['chunks'])} (or left out: all), got {chunks}")
    prompt_file = REPO_ROOT / meta["prompt_file"] if not Path(meta["prompt_file"]).is_absolute() else Path(meta["prompt_file"])
    if file_sha256(prompt_file) != meta["prompt_file_sha256"]:
        raise ValueError(f"{prompt_file} changed since {out_dir} was packed; re-run `dspark data generate`.")
    records = {r["id"]: r for r in load_prompt_set(prompt_file)}
    snapshot = _packed_answers(out_dir, meta, chunks)
    n = len(snapshot)
    answers = dict(zip(zip(meta["ids"][:n], meta["turns"][:n]), snapshot))
    tokens, spans, names = [], [], []
    for record_id, turn in answers:
        prompt = encode_prompt(tokenizer, turn_messages(records[record_id], turn, answers, tokenizer)).numpy()
        answer = np.asarray(answers[(record_id, turn)], dtype=np.int64)
        tokens.append(np.concatenate([prompt, answer]).astype(np.int32))
        spans.append([(len(prompt), len(prompt) + len(answer))])
        names.append(f"{record_id}#{turn}")
    names_read = meta["chunks"][: chunks or len(meta["chunks"])]
    summary = {k: v for k, v in meta.items() if k not in ("ids", "turns", "domains", "dtypes", "chunk_answers")}
    summary.update(answer_counts(meta["domains"][:n], meta["dtypes"][:n], snapshot, meta["eos_token_ids"]),
                   complete=n == meta["turns_total"], chunks=names_read,
                   packs=[p for p in meta["packs"] if set(p["chunks"]) & set(names_read)])
    summary["machine"] = summary["packs"][-1]["machine"]
    return Sequences(names, [f"distill:{d}" for d in meta["domains"][:n]], tokens, spans, {"distill": summary})
