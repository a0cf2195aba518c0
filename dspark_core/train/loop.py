"""The training loop every drafter shares, its pickle-free checkpoints, and saving a trained model."""

from __future__ import annotations

import csv
import json
import math
import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch
from accelerate import Accelerator
from safetensors.torch import load_file as load_torch_file
from safetensors.torch import load_model, save_file, save_model
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from ..core.checksums import write_checksums
from ..core.fp8 import save_weights
from .config import TrainConfig


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
    batches_for: Callable[[int], list[dict]],
    config: TrainConfig,
    out_dir: Path,
    desc: str,
    on_save: Callable[[int, torch.nn.Module], None] | None = None,
) -> torch.nn.Module:
    """The training loop shared by every drafter: AdamW with warm-up and cosine decay, gradient
    clipping, ``accelerate`` for devices, a loss CSV, and a pickle-free checkpoint every
    ``save_every`` steps from which an interrupted run resumes exactly (a step's batches depend on
    the step number only, so a resumed run sees the same batches).

    batches_for(step) returns the step's micro-batches: dicts of CPU tensors plus ``weight``, their
    share of the step (weights sum to 1); loss_fn(model, batch) returns named terms including ``loss``.
    on_save(step, module) runs after every checkpoint (e.g. to measure held-out acceptance as training goes),
    and again at the checkpoint a run resumes from, so it must give the same result when repeated.
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
    _keep_log_until(log_path, step)
    if step and on_save is not None and accelerator.is_main_process:  # a kill inside the last hook loses nothing
        on_save(step, accelerator.unwrap_model(wrapped).eval())
    wrapped.train()
    bar = tqdm(total=config.steps, initial=step, desc=desc, unit="step", disable=not accelerator.is_main_process)
    sums: Counter = Counter()
    tic = time.perf_counter()
    while step < config.steps:
        terms: Counter = Counter()
        for micro in batches_for(step):  # gradient accumulation: each micro-batch weighted by its share of the step
            weight = micro.pop("weight")
            with torch.autocast(accelerator.device.type, dtype=torch.bfloat16, enabled=config.bf16):
                micro_terms = loss_fn(wrapped, {k: v.to(accelerator.device) for k, v in micro.items()})
            accelerator.backward(micro_terms["loss"] * weight)
            terms.update({k: float(v.detach()) * weight for k, v in micro_terms.items()})
        accelerator.clip_grad_norm_(wrapped.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        step += 1
        bar.update(1)
        sums.update(terms)
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
                if on_save is not None:
                    unwrapped = accelerator.unwrap_model(wrapped).eval()
                    on_save(step, unwrapped)
                    unwrapped.train()
    bar.close()
    return accelerator.unwrap_model(wrapped).eval()


def _keep_log_until(log_path: Path, step: int) -> None:
    """Drop the loss rows logged after ``step`` (a run killed after logging but before saving its
    state repeats those steps when it resumes) and a torn last line."""
    if not log_path.is_file():
        return
    header, *rows = log_path.read_text().split("\n")[:-1]  # the part after the last newline is torn or empty
    kept = [row for row in rows if int(row.split(",", 1)[0]) <= step]
    if kept:
        log_path.write_text("".join(line + "\n" for line in [header, *kept]))
    else:
        log_path.unlink()


def save_checkpoint(module: PreTrainedModel, out_dir: Path, dtype: str) -> None:
    """The config and the weights in ``dtype`` (``bfloat16``, or ``float8`` with per-row scales: half the
    size again; loading expands to float32), with the weights' SHA-256 beside them (checked at load)."""
    module.config.save_pretrained(out_dir)
    if getattr(module, "generation_config", None) is not None and module.can_generate():
        module.generation_config.save_pretrained(out_dir)
    save_weights(module, out_dir, dtype)
    write_checksums(out_dir)
