"""Training parallel drafters (dflash / dspark) on the feature cache, under ``accelerate``.

Each step samples sequences from the training split and ``blocks_per_seq`` random anchors in each
(from the last prompt token on, as in decoding), builds teacher-forced blocks, and minimises the
DSpark loss (or CE only, for ablations). Everything needed to continue is saved every
``save_every`` steps (``accelerate`` state + step), so an interrupted run resumes where it stopped;
the loss curve goes to ``loss.csv`` and the finished drafter to ``config.json`` + ``model.safetensors``.
"""

from __future__ import annotations

import csv
import json
import math
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator
from safetensors.torch import load_file as load_torch_file
from safetensors.torch import load_model, save_file, save_model
from tqdm.auto import tqdm
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from ..core.provenance import machine_info
from ..core.target import target_fingerprint, tokenizer_fingerprint
from ..data.sequences import Sequences
from ..data.features import FeatureCache
from ..models import DrafterConfig, EagleDrafter, ParallelDrafter, drafter_loss
from ..models.losses import LOSS_WEIGHTS, soft_acceptance
from ..models.parallel import TargetBoundDrafter


@dataclass
class TrainConfig:
    """One experiment. ``drafter`` is eagle / dflash / dspark (on the feature cache) or draft-lm (an
    independent small causal LM of ``layers`` layers and width ``lm_width``). ``loss`` is ``dspark``
    (0.1 CE + 0.9 TV + 1.0 BCE) or ``ce`` (CE, + BCE for dspark); the draft LM always uses CE."""

    drafter: str = "dspark"
    head: str = "markov"
    layers: int = 1
    block: int = 7
    feature_layers: tuple[int, ...] = (2, 15, 28)
    draft_vocab: int = 8192
    rank: int = 256
    loss: str = "dspark"
    steps: int = 2000
    batch_size: int = 8
    blocks_per_seq: int = 8
    lr: float = 1e-3
    warmup: int = 100
    val_fraction: float = 0.05
    log_every: int = 20
    save_every: int = 200
    seed: int = 0
    lm_width: int = 256
    save_dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        if self.loss not in ("dspark", "ce"):
            raise ValueError(f"loss must be 'dspark' or 'ce', got {self.loss!r}")
        if self.drafter not in ("eagle", "dflash", "dspark", "draft-lm"):
            raise ValueError(f"drafter must be eagle, dflash, dspark or draft-lm, got {self.drafter!r}")
        if self.drafter != "dspark":
            self.head = "none"
        for name in ("layers", "block", "steps", "batch_size", "blocks_per_seq", "draft_vocab"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {self.val_fraction}")


def split_indices(n: int, val_fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A fixed train / held-out split of sequence indices."""
    order = np.random.default_rng(seed).permutation(n)
    n_val = int(round(n * val_fraction))
    return np.sort(order[n_val:]), np.sort(order[:n_val])


def frequent_tokens(data: Sequences, size: int) -> torch.Tensor:
    """The ``size`` most frequent response tokens (ties by id): the draft vocabulary, as target ids."""
    counts = Counter(t for r in data.responses for t in r)
    ranked = sorted(counts, key=lambda t: (-counts[t], t))[:size]
    ranked += [t for t in range(size + len(ranked)) if t not in counts][: size - len(ranked)]
    return torch.tensor(sorted(ranked), dtype=torch.long)


def make_batch(cache: FeatureCache, rows: np.ndarray, blocks: int, g: int, rng: np.random.Generator) -> dict:
    """Teacher-forced blocks for the sequences ``rows`` (those too short for one block are skipped).

    Returns tensors: features [B, T, m, d_t], ctx_next_tokens [B, T] (x_{t+1}), anchors / anchor_pos [B, n], ctx_visible [B, n, T],
    prev_tokens / next_tokens [B, n, g], final [B, n, g, d_t] and lse [B, n, g] at the positions
    whose target distribution each draft position imitates (anchor_pos + k - 1).
    """
    m = len(cache.layers)
    picks = []  # (flat start of the sequence, its sorted anchors)
    for i in rows:
        start, end = int(cache.offsets[i]), int(cache.offsets[i + 1])
        low, high = max(1, int(cache.prompt_lens[i]) - 1), end - start - 1 - g  # tokens a+1..a+g must exist
        if high >= low:
            picks.append((start, np.sort(rng.integers(low, high + 1, size=blocks))))
    if not picks:
        raise ValueError("no sequence in the batch is long enough for one block; lower --block")
    width = max(int(a.max()) for _, a in picks)  # context needed: positions before the last anchor
    k = np.arange(g)
    feats, ctx_next, anchors, visible, prev, nxt, final, lse = [], [], [], [], [], [], [], []
    for start, a in picks:
        f = np.zeros((width, m, cache.hidden.shape[-1]), dtype=np.float32)
        f[: int(a.max())] = cache.hidden[start : start + int(a.max()), :m]
        feats.append(f)
        follow = np.zeros(width, dtype=cache.tokens.dtype)  # x_{t+1}; positions at or past its anchors are unused
        seen = cache.tokens[start + 1 : start + 1 + int(a.max())]
        follow[: len(seen)] = seen
        ctx_next.append(follow)
        anchors.append(a)
        visible.append(np.arange(width)[None, :] < a[:, None])
        at = start + a[:, None] + k  # [n, g] flat indices of anchor + k
        prev.append(cache.tokens[at])
        nxt.append(cache.tokens[at + 1])
        final.append(cache.hidden[at, m].astype(np.float32))
        lse.append(cache.lse[at])
    batch = {
        "features": feats, "ctx_next_tokens": ctx_next, "anchor_pos": anchors, "ctx_visible": visible, "prev_tokens": prev,
        "next_tokens": nxt, "final": final, "lse": lse,
    }
    out = {name: torch.from_numpy(np.stack(v)) for name, v in batch.items()}
    out["anchors"] = out["prev_tokens"][..., 0].long()
    for name in ("ctx_next_tokens", "anchor_pos", "prev_tokens", "next_tokens"):
        out[name] = out[name].long()
    return out


def drafter_inputs(batch: dict) -> dict:
    """The part of a batch that a drafter's training forward takes."""
    names = ("features", "ctx_next_tokens", "anchors", "anchor_pos", "ctx_visible", "prev_tokens")
    return {name: batch[name] for name in names}


def target_probs_on_draft_vocab(drafter: TargetBoundDrafter, final: torch.Tensor, lse: torch.Tensor):
    """p_t restricted to the draft vocabulary [..., Vd] and the mass outside it [...]."""
    p = torch.exp(final @ drafter.target_part("head").T - lse[..., None])
    return p, (1.0 - p.sum(-1)).clamp_min(0.0)


def compute_loss(drafter: TargetBoundDrafter, model: torch.nn.Module, batch: dict, loss: str) -> dict[str, torch.Tensor]:
    """Loss terms of one batch; ``model`` is ``drafter`` or its accelerate-wrapped version."""
    logits, confidences = model(**drafter_inputs(batch))
    p_t, outside = target_probs_on_draft_vocab(drafter, batch["final"], batch["lse"])
    weights = LOSS_WEIGHTS if loss == "dspark" else {"ce": 1.0, "tv": 0.0, "conf": 1.0}
    return drafter_loss(logits, confidences, p_t, outside, drafter.to_draft_ids(batch["next_tokens"]), weights)


@torch.no_grad()
def held_out_acceptance(drafter: TargetBoundDrafter, cache: FeatureCache, rows: np.ndarray, g: int, seed: int = 0) -> np.ndarray:
    """Mean analytic acceptance 1 - ||p_d - p_t||_1 / 2 per position on held-out sequences
    (teacher-forced: the prefix is the target's own text, as when positions 1..k-1 were accepted)."""
    rng = np.random.default_rng(seed)
    total, count = torch.zeros(g), 0
    for chunk in np.array_split(rows, max(1, len(rows) // 8)):
        batch = make_batch(cache, chunk, 4, g, rng)
        logits, _ = drafter(**drafter_inputs(batch))
        p_t, outside = target_probs_on_draft_vocab(drafter, batch["final"], batch["lse"])
        l1 = (torch.softmax(logits, -1) - p_t).abs().sum(-1) + outside
        total += soft_acceptance(l1).flatten(0, 1).sum(0)
        count += l1.shape[0] * l1.shape[1]
    return (total / max(1, count)).numpy()


def build_drafter_model(config: TrainConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                        data: Sequences) -> TargetBoundDrafter:
    """A fresh drafter sized like one target layer, bound to the target, with its draft vocabulary."""
    tc = model.config
    cls = EagleDrafter if config.drafter == "eagle" else ParallelDrafter
    drafter = cls(DrafterConfig(
        kind=config.drafter, head=config.head, block_size=config.block, num_layers=config.layers,
        hidden_size=tc.hidden_size, num_heads=tc.num_attention_heads, num_kv_heads=tc.num_key_value_heads,
        head_dim=getattr(tc, "head_dim", tc.hidden_size // tc.num_attention_heads),
        intermediate_size=tc.intermediate_size, rms_norm_eps=tc.rms_norm_eps,
        rope_theta=float(getattr(tc, "rope_parameters", {}).get("rope_theta", 10000.0)),
        feature_layers=config.feature_layers, draft_vocab_size=config.draft_vocab, rank=config.rank,
        target_hidden_size=tc.hidden_size, target_vocab_size=model.get_output_embeddings().weight.shape[0],
        target_fingerprint=target_fingerprint(model, tokenizer), tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
    ))
    drafter.draft_token_ids.copy_(frequent_tokens(data, config.draft_vocab))
    drafter.attach_target(model.get_input_embeddings().weight, model.get_output_embeddings().weight)
    return drafter


def save_training_state(folder: Path, module: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    """Weights and AdamW moments in safetensors, the rest in JSON (no pickle); written atomically."""
    tmp = folder.with_name(folder.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    save_model(module, str(tmp / "model.safetensors"))  # handles tied weights
    state = optimizer.state_dict()
    tensors = {f"{i}.{name}": value for i, slots in state["state"].items() for name, value in slots.items()
               if torch.is_tensor(value) and value.dim() > 0}
    scalars = {f"{i}.{name}": float(value) for i, slots in state["state"].items() for name, value in slots.items()
               if not (torch.is_tensor(value) and value.dim() > 0)}
    save_file(tensors, str(tmp / "optimizer.safetensors"))
    (tmp / "state.json").write_text(json.dumps({"step": step, "scalars": scalars, "param_groups": state["param_groups"]}))
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)


def load_training_state(folder: Path, module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Restore what :func:`save_training_state` wrote; returns the step to continue from."""
    load_model(module, str(folder / "model.safetensors"))
    meta = json.loads((folder / "state.json").read_text())
    slots: dict[int, dict] = {}
    for key, value in load_torch_file(str(folder / "optimizer.safetensors")).items():
        index, name = key.split(".", 1)
        slots.setdefault(int(index), {})[name] = value
    for key, value in meta["scalars"].items():
        index, name = key.split(".", 1)
        slots.setdefault(int(index), {})[name] = torch.tensor(value)
    optimizer.load_state_dict({"state": slots, "param_groups": meta["param_groups"]})
    return int(meta["step"])


def fit(
    module: torch.nn.Module,
    loss_fn: Callable[[torch.nn.Module, dict], dict[str, torch.Tensor]],
    sample_batch: Callable[[np.random.Generator], dict],
    config: TrainConfig,
    out_dir: Path,
    desc: str,
) -> torch.nn.Module:
    """The training loop shared by every drafter: AdamW with warm-up and cosine decay, gradient
    clipping, ``accelerate`` for devices, a loss CSV, and a pickle-free checkpoint every
    ``save_every`` steps from which an interrupted run resumes exactly (batches are drawn from an
    RNG seeded by the step, so a resumed run sees the same batches).

    loss_fn(model, batch) returns named terms including ``loss``; sample_batch(rng) returns a dict
    of tensors on the CPU.
    """
    accelerator = Accelerator()
    optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=config.lr, weight_decay=0.0)

    def schedule(step: int) -> float:
        if step < config.warmup:
            return (step + 1) / config.warmup
        return 0.5 * (1 + math.cos(math.pi * (step - config.warmup) / max(1, config.steps - config.warmup)))

    state_dir, log_path = out_dir / "state", out_dir / "loss.csv"
    step = load_training_state(state_dir, module, optimizer) if (state_dir / "state.json").is_file() else 0
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule, last_epoch=step - 1)
    wrapped, optimizer, scheduler = accelerator.prepare(module, optimizer, scheduler)
    if step == 0:
        log_path.unlink(missing_ok=True)
    wrapped.train()
    bar = tqdm(total=config.steps, initial=step, desc=desc, unit="step", disable=not accelerator.is_main_process)
    sums: Counter = Counter()
    tic = time.perf_counter()
    while step < config.steps:
        rng = np.random.default_rng([config.seed, step, accelerator.process_index])
        batch = {k: v.to(accelerator.device) for k, v in sample_batch(rng).items()}
        terms = loss_fn(wrapped, batch)
        accelerator.backward(terms["loss"])
        accelerator.clip_grad_norm_(wrapped.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        step += 1
        bar.update(1)
        sums.update({k: float(v.detach()) for k, v in terms.items()})
        sums["steps"] += 1
        if (step % config.log_every == 0 or step == config.steps) and accelerator.is_main_process:
            names = sorted(k for k in sums if k != "steps")
            row = {"step": step, **{k: f"{sums[k] / sums['steps']:.5g}" for k in names},
                   "lr": f"{scheduler.get_last_lr()[0]:.5g}", "steps_per_s": f"{sums['steps'] / (time.perf_counter() - tic):.4g}"}
            new_file = not log_path.is_file()
            with log_path.open("a", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(row))
                if new_file:
                    writer.writeheader()
                writer.writerow(row)
            bar.set_postfix(loss=row["loss"])
            sums, tic = Counter(), time.perf_counter()
        if step % config.save_every == 0 or step == config.steps:
            accelerator.wait_for_everyone()
            if accelerator.is_main_process:
                inner = optimizer.optimizer if hasattr(optimizer, "optimizer") else optimizer
                save_training_state(state_dir, accelerator.unwrap_model(wrapped), inner, step)
    bar.close()
    return accelerator.unwrap_model(wrapped).eval()


def save_checkpoint(module: PreTrainedModel, out_dir: Path, dtype: str) -> None:
    """save_pretrained in ``dtype`` (bfloat16 halves the shipped size; loading casts back to float32)."""
    converted: dict[int, torch.Tensor] = {}  # by storage, so tied weights stay tied (and are stored once)
    cast = {}
    for name, tensor in module.state_dict().items():
        if tensor.is_floating_point():
            tensor = converted.setdefault(tensor.data_ptr(), tensor.to(getattr(torch, dtype)))
        cast[name] = tensor
    module.save_pretrained(out_dir, state_dict=cast)


def run_metadata(config: TrainConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                 data: Sequences, **extra) -> dict:
    """What a run was trained on and with: written as train_meta.json beside the checkpoint."""
    return {
        "config": asdict(config), "target_fingerprint": target_fingerprint(model, tokenizer),
        "data": {"prompt_file": data.meta.get("prompt_file"), "prompt_file_sha256": data.meta.get("prompt_file_sha256"),
                 "sequences": len(data.ids), "response_tokens": sum(len(r) for r in data.responses),
                 "packed_sequences": data.meta.get("n_answered")},
        "machine": machine_info(), **extra,
    }


def train(
    config: TrainConfig,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    data: Sequences,
    cache: FeatureCache,
    out_dir: Path,
) -> TargetBoundDrafter:
    """Train (or resume) an eagle / dflash / dspark drafter into ``out_dir``; returns it bound to the target."""
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(config.seed)
    drafter = build_drafter_model(config, model, tokenizer, data)
    train_rows, val_rows = split_indices(len(cache), config.val_fraction, config.seed)
    meta = run_metadata(config, model, tokenizer, data, feature_cache=cache.folder.name,
                        train_sequences=len(train_rows), val_sequences=len(val_rows))
    (out_dir / "train_meta.json").write_text(json.dumps(meta, indent=1, default=str))

    def sample_batch(rng: np.random.Generator) -> dict:
        rows = rng.choice(train_rows, size=min(config.batch_size, len(train_rows)), replace=False)
        return make_batch(cache, rows, config.blocks_per_seq, config.block, rng)

    desc = f"train {config.drafter}" + (f"-{config.head}" if config.drafter == "dspark" else "")
    drafter = fit(drafter, lambda m, b: compute_loss(drafter, m, b, config.loss), sample_batch, config, out_dir, desc)
    save_checkpoint(drafter, out_dir, config.save_dtype)
    if len(val_rows):
        acceptance = held_out_acceptance(drafter, cache, val_rows, config.block)
        meta["held_out_acceptance"] = acceptance.round(4).tolist()
        meta["held_out_expected_tau"] = float(1 + np.cumprod(acceptance).sum())
        (out_dir / "train_meta.json").write_text(json.dumps(meta, indent=1, default=str))
    return drafter


def build_draft_lm(config: TrainConfig, model: PreTrainedModel) -> LlamaForCausalLM:
    """A small Llama with the target's vocabulary, special tokens and RoPE. Its embedding starts as
    the target's, projected to ``lm_width`` by a fixed random matrix (token structure for free)."""
    tc = model.config
    heads = max(1, config.lm_width // 64)
    lm = LlamaForCausalLM(LlamaConfig(
        vocab_size=tc.vocab_size, hidden_size=config.lm_width, intermediate_size=config.lm_width * 8 // 3,
        num_hidden_layers=config.layers, num_attention_heads=heads, num_key_value_heads=heads,
        max_position_embeddings=tc.max_position_embeddings, rope_parameters=getattr(tc, "rope_parameters", None),
        rms_norm_eps=tc.rms_norm_eps, tie_word_embeddings=True, bos_token_id=tc.bos_token_id,
        eos_token_id=tc.eos_token_id, pad_token_id=tc.pad_token_id,
    ))
    generator = torch.Generator().manual_seed(config.seed)
    projection = torch.randn(tc.hidden_size, config.lm_width, generator=generator) / math.sqrt(tc.hidden_size)
    with torch.no_grad():
        lm.get_input_embeddings().weight.copy_(model.get_input_embeddings().weight @ projection)
    lm.generation_config.eos_token_id = model.generation_config.eos_token_id
    return lm


def lm_batch(data: Sequences, rows: np.ndarray, max_len: int = 512) -> dict:
    """Prompt + response token ids, right-padded; the loss covers response tokens only."""
    seqs = [(data.prompts[i] + data.responses[i])[:max_len] for i in rows]
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    labels = torch.full((len(seqs), width), -100, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for row, (i, seq) in enumerate(zip(rows, seqs)):
        ids[row, : len(seq)] = torch.tensor(seq)
        mask[row, : len(seq)] = 1
        labels[row, len(data.prompts[i]) : len(seq)] = ids[row, len(data.prompts[i]) : len(seq)]
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def train_draft_lm(
    config: TrainConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, data: Sequences, out_dir: Path
) -> LlamaForCausalLM:
    """Distil an independent small draft LM from the target-written answers (CE on response tokens)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(config.seed)
    lm = build_draft_lm(config, model)
    train_rows, val_rows = split_indices(len(data.ids), config.val_fraction, config.seed)
    meta = run_metadata(config, model, tokenizer, data, train_sequences=len(train_rows), val_sequences=len(val_rows))

    def sample_batch(rng: np.random.Generator) -> dict:
        return lm_batch(data, rng.choice(train_rows, size=min(config.batch_size, len(train_rows)), replace=False))

    lm = fit(lm, lambda m, b: {"loss": m(**b).loss}, sample_batch, config, out_dir, "train draft-lm")
    lm.config.tokenizer_fingerprint = tokenizer_fingerprint(tokenizer)  # the target's tokenizer serves it (not stored)
    save_checkpoint(lm, out_dir, config.save_dtype)
    if len(val_rows):
        with torch.no_grad():
            losses = [float(lm(**lm_batch(data, chunk)).loss) for chunk in np.array_split(val_rows, max(1, len(val_rows) // 8))]
        meta["held_out_ce"] = float(np.mean(losses))
    (out_dir / "train_meta.json").write_text(json.dumps(meta, indent=1, default=str))
    return lm
