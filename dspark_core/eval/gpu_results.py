"""The prepared GPU measurement: latency profiles of random-weight targets and drafters, into one folder.

    python -m dspark_core.eval.gpu_results --out data/results/gpu/<stamp>        # make gpu-results

For each target shape (default: the default target's own, Qwen3-4B and Qwen3-8B, see
:mod:`dspark_core.decode.shapes`), built with random weights in bfloat16 on the GPU, it measures

- the target's forward latency for R requests x n new tokens over a KV context of ``--context``
  tokens per request, once per mode: ``eager`` (a dynamic cache, as this repository decodes) and
  ``graphs`` (a static cache with every shape captured in a CUDA graph, as a serving engine runs);
- the draft cost of a dspark drafter of that width with 1-5 layers at each R
  (:mod:`dspark_core.eval.draft_cost`), attached to every profile of the shape.

It writes into ``--out``: ``profile-<shape>-<mode>.json`` (a :class:`CostProfile`, readable by the
scheduler and the round simulator), ``surface.csv`` and ``draft.csv`` (the same numbers as tables),
and ``settings.json`` (command, versions, machine, grid, wall time per part, and any part skipped
because ``--budget-s`` ran out). It needs only torch, transformers, numpy and tqdm.
"""

from __future__ import annotations

import argparse
import csv
import json
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ..core.provenance import machine_info
from ..decode.profile import MODES, CostProfile, measure_profile, versions
from ..decode.shapes import SHAPES, TargetShape, build_random_target, get_shape
from .draft_cost import measure_draft_cost

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_dtype(name: str, device: str) -> torch.dtype:
    """``auto``: bfloat16 on CUDA, float32 on a CPU (as the default target runs there)."""
    if name == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    if name not in DTYPES:
        raise ValueError(f"dtype must be auto or one of {', '.join(DTYPES)}, got {name!r}")
    return DTYPES[name]


def profile_shape(
    shape: TargetShape,
    device: str,
    dtype: torch.dtype,
    requests: tuple[int, ...],
    tokens: tuple[int, ...],
    context: int,
    repeats: int,
    modes: tuple[str, ...] = ("eager",),
    draft_layers: tuple[int, ...] = (),
    block: int = 7,
    warmup: int = 2,
    command: str = "",
) -> list[CostProfile]:
    """One profile per mode of a random-weight target of ``shape``; the draft cost of a dspark drafter
    of each depth in ``draft_layers`` (none when empty) is measured once and attached to every profile."""
    meta = {"shape": asdict(shape), "weights": "random (timing only)", "command": command}
    model = build_random_target(shape, dtype, device)
    profiles = [measure_profile(model, requests, context=context, repeats=repeats, tokens=tokens, mode=mode,
                                warmup=warmup, meta=dict(meta)) for mode in modes]
    del model
    if draft_layers:
        seconds, spread = measure_draft_cost(shape, draft_layers, requests, context, block, device, dtype, repeats, warmup)
        for profile in profiles:
            profile.draft = seconds
            profile.meta["draft"] = {"drafter": "dspark-markov ParallelDraftModel, random weights, eager, greedy",
                                     "block": block, "draft_vocab": shape.draft_vocab, "spread": spread}
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    return profiles


def _write_tables(out: Path, profiles: list[CostProfile]) -> None:
    with (out / "surface.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["shape", "mode", "device", "dtype", "context", "R", "n", "ms", "spread"])
        for p in profiles:
            for rows, curve in p.steps.items():
                for n, sps, spread in zip(p.token_counts(), curve, p.spread[rows]):
                    writer.writerow([p.meta["shape"]["name"], p.meta["mode"], p.device, p.meta["dtype"], p.context,
                                     rows, n, round(1000 / sps, 4), round(spread, 4)])
    with (out / "draft.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["shape", "layers", "R", "ms", "spread"])
        seen = set()
        for p in profiles:
            name = p.meta["shape"]["name"]
            if not p.draft or name in seen:
                continue
            seen.add(name)
            for layers, table in p.draft.items():
                for rows, seconds in table.items():
                    writer.writerow([name, layers, rows, round(1000 * seconds, 4),
                                     round(p.meta["draft"]["spread"][layers][rows], 4)])


def run(args: argparse.Namespace, command: str) -> Path:
    """Measure every shape in turn into ``args.out``; parts that would start after ``args.budget_s``
    seconds are skipped and listed in settings.json."""
    out = Path(args.out)
    if out.exists() and any(out.glob("profile-*.json")):
        raise FileExistsError(f"{out} already holds profiles; pass another --out (e.g. a new time stamp).")
    out.mkdir(parents=True, exist_ok=True)
    dtype = resolve_dtype(args.dtype, args.device)
    start = time.perf_counter()
    settings = {"command": command, "versions": versions(), "machine": machine_info(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                "grid": {"shapes": args.shapes, "requests": args.requests, "tokens": args.tokens, "context": args.context,
                         "repeats": args.repeats, "warmup": args.warmup, "modes": args.modes,
                         "draft_layers": args.draft_layers, "block": args.block, "dtype": str(dtype).removeprefix("torch.")},
                "seconds": {}, "skipped": []}
    profiles: list[CostProfile] = []
    for name in args.shapes:
        elapsed = time.perf_counter() - start
        if elapsed > args.budget_s:
            settings["skipped"].append(f"{name}: started after {elapsed:.0f} s > --budget-s {args.budget_s}")
            continue
        print(f"[{elapsed:6.1f} s] {name}", flush=True)
        begin = time.perf_counter()
        if torch.device(args.device).type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        try:
            found = profile_shape(get_shape(name), args.device, dtype, tuple(args.requests), tuple(args.tokens),
                                  args.context, args.repeats, tuple(args.modes), tuple(args.draft_layers), args.block,
                                  args.warmup, command)
        except (RuntimeError, ValueError) as err:  # e.g. out of memory: keep the other shapes, say what failed
            settings["errors"] = {**settings.get("errors", {}), name: f"{type(err).__name__}: {err}"[:500]}
            print(f"{name} failed: {err}", flush=True)
            continue
        for profile in found:
            if torch.device(args.device).type == "cuda":
                profile.meta["peak_memory_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
            profile.save(out / f"profile-{name}-{profile.meta['mode']}.json")
        profiles += found
        settings["seconds"][name] = round(time.perf_counter() - begin, 1)
        _write_tables(out, profiles)
        settings["wall_s"] = round(time.perf_counter() - start, 1)
        (out / "settings.json").write_text(json.dumps(settings, indent=1))
    settings["wall_s"] = round(time.perf_counter() - start, 1)
    (out / "settings.json").write_text(json.dumps(settings, indent=1))
    print(f"[{settings['wall_s']:6.1f} s] wrote {len(profiles)} profiles to {out}", flush=True)
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dspark_core.eval.gpu_results", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="the folder to write (refused if it already holds profiles)")
    parser.add_argument("--shapes", nargs="+", default=["smollm2-135m", "qwen3-4b", "qwen3-8b"], choices=sorted(SHAPES))
    parser.add_argument("--requests", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64], help="concurrent requests R")
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="new tokens per request n")
    parser.add_argument("--context", type=int, default=1024, help="KV context per request during the timing")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per cell (the median is kept)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls before them")
    parser.add_argument("--modes", nargs="+", default=["eager", "graphs"], choices=MODES)
    parser.add_argument("--draft-layers", type=int, nargs="*", default=[1, 2, 3, 4, 5], help="dspark drafter depths")
    parser.add_argument("--block", type=int, default=7, help="tokens drafted per round")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="auto", help="auto (bfloat16 on CUDA, float32 on a CPU), bfloat16, float16, float32")
    parser.add_argument("--budget-s", type=float, default=360.0, help="start no new shape after this many seconds")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    if "graphs" in args.modes and torch.device(args.device).type != "cuda":
        args.modes = [m for m in args.modes if m != "graphs"] or ["eager"]
        print("no CUDA device: measuring without CUDA graphs", flush=True)
    run(args, shlex.join(["python", "-m", "dspark_core.eval.gpu_results", *argv]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
