"""The target's cost profile: forward steps per second vs tokens in the batch, on one machine.

``measure_profile`` times one target forward with R requests x n new tokens each over a cached
context of ``context`` tokens per request, for n in ``tokens`` (default 1..max_tokens) and R in
``requests``. The hardware-aware scheduler reads ``steps_per_second(tokens, requests)`` from it.

Timing: on a GPU each call is bracketed by CUDA events after ``warmup`` untimed calls and the
device is synchronised between calls, so host-side launch gaps count as they do in decoding; on a
CPU ``time.perf_counter``. Three modes, recorded in ``meta["mode"]``:

- ``eager``: a ``DynamicCache`` rolled back after every call (what this repository's loop does);
- ``static``: a pre-allocated ``StaticCache`` whose write position is reset before every call;
- ``graphs``: ``static`` with each (R, n) forward captured once in a CUDA graph and replayed (what a
  serving engine does to remove launch overhead). A graph is used only after its logits match the
  eager forward's; a cell where capture or that check fails is timed eagerly and listed in
  ``meta["eager_cells"]`` with the reason.

A profile records the machine it was measured on; loading it on another machine is an error unless
asked for explicitly, so a foreign profile is never used silently.

Several dtypes: ``measure_profiles`` times the same target in several dtypes on the same grid, call by
call interleaved, and ``combine_dtypes`` keeps them in one profile (``by_dtype``) with the dtype that
serves speculative decoding fastest (``fastest_dtype``, :func:`seconds_per_token`) as its top-level
curves; ``for_dtype`` reads one dtype back. ``serving_dtype`` is what ``--dtype auto`` serves in.
"""

from __future__ import annotations

import inspect
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
import transformers
from tqdm.auto import tqdm
from transformers import DynamicCache, PreTrainedModel, StaticCache

from ..core.provenance import cpu_bf16_units, machine_info
from ..core.target import cache_dir, dtype_name

# what CostProfile.load compares; the CPU model and units tell apart machines that share a host name
MACHINE_KEYS = ("host", "processor", "cpu_count", "cpu_model", "cpu_units", "torch", "threads", "cuda")
MODES = ("eager", "static", "graphs")
SPECULATION_ACCEPTANCE = 0.6  # per-position acceptance at which dtypes are compared for speculative decoding


def _nearest_at_or_above(keys: Sequence[str], requests: int) -> str:
    """The smallest profiled R at or above ``requests`` (the largest when none is)."""
    profiled = sorted(int(r) for r in keys)
    return str(next((r for r in profiled if r >= requests), profiled[-1]))


@dataclass
class CostProfile:
    """Latency of a target forward (and, optionally, of a drafter) on one machine.

    steps[str(R)][i]: target forwards per second with R requests of ``tokens[i]`` new tokens each.
    tokens:  the profiled new-token counts n, increasing; None means 1..len(curve) (older profiles).
    spread:  spread[str(R)][i], the relative interquartile range of that cell's timed calls (its noise).
    draft:   draft[str(layers)][str(R)], seconds per round to draft one block for each of R requests with a
             dspark drafter of that depth (see :mod:`dspark_core.eval.draft_cost`).
    meta:    how it was measured: target shape, dtype, mode, timer, versions, command.
    by_dtype: by_dtype[dtype] = {"steps": ..., "spread": ...}, the same grid measured in each dtype
             (interleaved); the top-level steps and spread are then those of ``fastest_dtype``.
    fastest_dtype: the dtype with the lowest expected time per token of speculative decoding
             (:func:`seconds_per_token`; how it was chosen is in ``meta["fastest_dtype"]``).
    """

    machine: dict
    device: str
    context: int
    steps: dict[str, list[float]]
    tokens: list[int] | None = None
    spread: dict[str, list[float]] | None = None
    draft: dict[str, dict[str, float]] | None = None
    meta: dict = field(default_factory=dict)
    by_dtype: dict[str, dict[str, dict[str, list[float]]]] | None = None
    fastest_dtype: str | None = None

    def for_dtype(self, dtype: str) -> CostProfile:
        """The profile of the target in ``dtype``: its curves from ``by_dtype``, or this profile itself
        when it was measured in that one dtype only. Raises when ``dtype`` was not measured."""
        if self.by_dtype is None and self.meta.get("dtype") == dtype:
            return self
        measured = sorted(self.by_dtype or {}) or [self.meta.get("dtype")]
        if not self.by_dtype or dtype not in self.by_dtype:
            raise ValueError(f"This cost profile was measured in {measured}, not {dtype}; measure it with "
                             f"`dspark profile --dtypes {dtype}`.")
        curves = self.by_dtype[dtype]
        return replace(self, steps=curves["steps"], spread=curves["spread"], by_dtype=None, fastest_dtype=None,
                       meta={**self.meta, "dtype": dtype})

    def token_counts(self) -> list[int]:
        return list(self.tokens) if self.tokens else list(range(1, len(next(iter(self.steps.values()))) + 1))

    def forward_seconds(self, n: float, requests: int) -> float:
        """Seconds of one forward of ``requests`` rows x ``n`` new tokens (the nearest profiled R at or
        above ``requests``). Between profiled n the time is interpolated linearly (n may be fractional:
        a flattened batch); beyond the longest it grows in proportion to n; below the shortest it is the
        shortest's."""
        curve = self.steps[_nearest_at_or_above(list(self.steps), requests)]
        seconds = [1.0 / s for s in curve]
        counts = self.token_counts()
        if n >= counts[-1]:
            return seconds[-1] * n / counts[-1]
        return float(np.interp(n, counts, seconds))

    def steps_per_second(self, tokens: int, requests: int) -> float:
        """SPS(B) for B = ``tokens`` spread evenly over ``requests`` rows: 1 / forward_seconds(ceil(B / R), R)."""
        return 1.0 / self.forward_seconds(max(1, math.ceil(tokens / max(1, requests))), requests)

    def flattened_steps_per_second(self, tokens: int, requests: int) -> float:
        """SPS(B) when the B tokens of R rows run as one flattened variable-length batch (the serving
        kernels of paper section 5.3): the time at B / R tokens per row, not rounded up, so it is as smooth
        in B as the profile is in n."""
        return 1.0 / self.forward_seconds(max(1.0, tokens / max(1, requests)), requests)

    def draft_seconds(self, layers: int, requests: int) -> float:
        """Seconds to draft one block for each of ``requests`` requests with a ``layers``-deep dspark drafter."""
        if not self.draft or str(layers) not in self.draft:
            have = sorted(self.draft or {}, key=int)
            raise ValueError(f"This profile has no draft cost for a {layers}-layer drafter (it has {have or 'none'}); "
                             "measure one with `dspark profile --shape <name> --draft-layers ...`.")
        table = self.draft[str(layers)]
        return table[_nearest_at_or_above(list(table), requests)]

    def save(self, path: Path) -> Path:
        """Write the JSON; a profile of one dtype leaves out the dtype fields, as profiles were before them."""
        data = {k: v for k, v in asdict(self).items() if v is not None or k not in ("by_dtype", "fastest_dtype")}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1))
        return path

    @staticmethod
    def load(path: Path, allow_other_machine: bool = False) -> CostProfile:
        if not path.is_file():
            raise FileNotFoundError(f"No cost profile at {path}; measure one with `dspark profile`.")
        profile = CostProfile(**json.loads(path.read_text()))
        here = machine_info()
        differs = {k: (profile.machine.get(k), here[k]) for k in MACHINE_KEYS if profile.machine.get(k) != here[k]}
        unrecorded = [k for k in MACHINE_KEYS if k not in profile.machine]
        if differs and not allow_other_machine:
            where = (f"was measured before profiles recorded {', '.join(unrecorded)}, so it may be another machine's"
                     if unrecorded else f"was measured on another machine ({differs})")
            raise ValueError(f"The cost profile {path} {where}; measure this one with `dspark profile`, or pass "
                             "allow_other_machine=True knowingly.")
        return profile


def default_profile_path(device: str = "cpu") -> Path:
    info = machine_info()
    return cache_dir() / "profiles" / f"{info['host']}-{device}-{info['threads']}threads.json"


def versions() -> dict[str, str]:
    """The library versions a measurement depends on."""
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "cuda": torch.version.cuda or "none", "device": machine_info()["cuda"]}


def cache_kwarg(model: PreTrainedModel) -> str:
    """The forward keyword that takes the KV cache: ``cache`` (transformers >= 5.2x) or ``past_key_values``
    (earlier releases, which silently ignore an unknown ``cache=``)."""
    return "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"


def time_calls(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int = 1,
               reset: Callable[[], object] | None = None) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn`` after ``warmup`` untimed ones; ``reset`` runs
    untimed before every call. CUDA events on a GPU (synchronised after each call), perf_counter on a CPU."""
    return time_interleaved([(fn, reset)], device, repeats, warmup)[0]


def time_interleaved(calls: Sequence[tuple[Callable[[], object], Callable[[], object] | None]], device: torch.device,
                     repeats: int, warmup: int = 1) -> list[list[float]]:
    """Seconds of ``repeats`` timed calls of each ``(fn, reset)`` in ``calls``, after ``warmup`` untimed
    rounds. Each round calls every fn once, in an order rotated by one each round, so drift in the
    machine's load hits them alike; ``reset`` runs untimed before its fn."""
    times: list[list[float]] = [[] for _ in calls]
    for i in range(warmup + repeats):
        for j in [(i + k) % len(calls) for k in range(len(calls))]:
            fn, reset = calls[j]
            if reset is not None:
                reset()
            elapsed = _time_one(fn, device)
            if i >= warmup:
                times[j].append(elapsed)
    return times


def _time_one(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds of one call: CUDA events on a GPU (synchronised), perf_counter on a CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000.0
    begin = time.perf_counter()
    fn()
    return time.perf_counter() - begin


def summarize(times: Sequence[float]) -> tuple[float, float]:
    """(median seconds, relative interquartile range) of timed calls."""
    median = float(np.median(times))
    q1, q3 = np.percentile(times, [25, 75])
    return median, float((q3 - q1) / median) if median > 0 else 0.0


def _reset_static(cache: StaticCache, length: int) -> None:
    """Move every layer's write position of a StaticCache back to ``length`` (in place, on the device)."""
    for layer in cache.layers:
        position = getattr(layer, "cumulative_length", None)
        if not isinstance(position, torch.Tensor):
            raise RuntimeError("This transformers release keeps no tensor write position in StaticCache layers "
                               "(cumulative_length); use mode='eager'.")
        position.fill_(length)


def _capture(step: Callable[[], torch.Tensor], reset: Callable[[], None]) -> tuple[Callable[[], None], str]:
    """Capture ``step`` in a CUDA graph; returns (replay, '') when the replayed logits match an eager
    call's, else (the eager step, the reason)."""
    try:
        reset()
        expected = step().float()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up on a side stream, as torch.cuda.graphs asks
            for _ in range(2):
                reset()
                step()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        reset()
        with torch.cuda.graph(graph):
            out = step()
        reset()
        graph.replay()
        error = float((out.float() - expected).abs().max())
        scale = float(expected.abs().max())
        if not error <= 1e-2 * scale + 1e-3:
            return step, f"graph logits differ from eager by {error:.3g} (scale {scale:.3g})"
        return graph.replay, ""
    except Exception as err:  # any capture failure falls back to eager timing, and is recorded
        return step, f"{type(err).__name__}: {err}"[:300]


def _prefill(model: PreTrainedModel, rows: int, context: int, longest: int, mode: str):
    """A cache holding ``context`` tokens for each of ``rows`` requests: dynamic (eager) or static,
    with room for ``longest`` more (static, graphs)."""
    device, key = model.device, cache_kwarg(model)
    ids = torch.randint(100, 1000, (rows, context), generator=torch.Generator().manual_seed(0)).to(device)
    if mode == "eager":
        cache = DynamicCache(config=model.config)
        model(input_ids=ids, use_cache=True, logits_to_keep=1, **{key: cache})
        return cache
    cache = StaticCache(config=model.config, max_cache_len=context + longest)
    positions = torch.arange(context, device=device).expand(rows, -1)
    model(input_ids=ids, position_ids=positions, use_cache=True, logits_to_keep=1, **{key: cache})
    return cache


def _cell(model: PreTrainedModel, cache, rows: int, n: int, context: int, mode: str):
    """(step, reset) of one cell: ``step`` feeds ``n`` new tokens per row after the ``context`` cached
    ones and returns the logits; ``reset`` takes the cache back to ``context`` tokens."""
    device, key = model.device, cache_kwarg(model)
    new = torch.randint(100, 1000, (rows, n), generator=torch.Generator().manual_seed(n)).to(device)
    if mode == "eager":
        def step():
            return model(input_ids=new, use_cache=True, **{key: cache}).logits

        def reset():
            if cache.get_seq_length() > context:
                cache.crop(context - cache.get_seq_length())  # transformers crops by a negative count
        return step, reset
    positions = torch.arange(context, context + n, device=device).expand(rows, -1)

    def step():
        return model(input_ids=new, position_ids=positions, use_cache=True, **{key: cache}).logits

    def reset():
        _reset_static(cache, context)
    return step, reset


@torch.inference_mode()
def measure_profile(
    model: PreTrainedModel,
    requests: tuple[int, ...] = (1, 2, 4, 8, 16),
    max_tokens: int = 16,
    context: int = 128,
    repeats: int = 5,
    *,
    tokens: Sequence[int] | None = None,
    mode: str = "eager",
    warmup: int = 1,
    meta: dict | None = None,
) -> CostProfile:
    """Median time of ``repeats`` target forwards for every (R, n), n in ``tokens`` (default
    1..max_tokens); returns steps per second, each cell's spread and how it was measured."""
    return measure_profiles([model], requests, max_tokens, context, repeats, tokens=tokens, mode=mode, warmup=warmup,
                            meta=meta)[0]


@torch.inference_mode()
def measure_profiles(
    models: Sequence[PreTrainedModel],
    requests: tuple[int, ...] = (1, 2, 4, 8, 16),
    max_tokens: int = 16,
    context: int = 128,
    repeats: int = 5,
    *,
    tokens: Sequence[int] | None = None,
    mode: str = "eager",
    warmup: int = 1,
    meta: dict | None = None,
) -> list[CostProfile]:
    """:func:`measure_profile` of several models on one device (the same target in several dtypes) on
    the same grid, one profile each, their calls interleaved cell by cell (:func:`time_interleaved`)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    device = models[0].device
    if mode == "graphs" and device.type != "cuda":
        raise ValueError("mode='graphs' needs a CUDA device; use 'eager' or 'static' on a CPU.")
    counts = sorted(set(tokens or range(1, max_tokens + 1)))
    if not counts or counts[0] < 1 or not requests or min(requests) < 1:
        raise ValueError(f"requests and tokens must be positive integers, got {requests} and {counts}")
    steps: list[dict[str, list[float]]] = [{} for _ in models]
    spread: list[dict[str, list[float]]] = [{} for _ in models]
    eager_cells: list[dict[str, str]] = [{} for _ in models]
    with tqdm(total=len(requests) * len(counts), desc=f"profile ({mode})", unit="shape") as bar:
        for rows in requests:
            caches = [_prefill(model, rows, context, counts[-1], mode) for model in models]
            for i in range(len(models)):
                steps[i][str(rows)], spread[i][str(rows)] = [], []
            for n in counts:
                calls = []
                for i, (model, cache) in enumerate(zip(models, caches)):
                    step, reset = _cell(model, cache, rows, n, context, mode)
                    call = step
                    if mode == "graphs":
                        call, reason = _capture(step, reset)
                        if reason:
                            eager_cells[i][f"{rows}x{n}"] = reason
                    calls.append((call, reset))
                for i, times in enumerate(time_interleaved(calls, device, repeats, warmup)):
                    median, relative = summarize(times)
                    steps[i][str(rows)].append(1.0 / median)
                    spread[i][str(rows)].append(relative)
                del calls
                bar.update(1)
            del caches
            if device.type == "cuda":
                torch.cuda.empty_cache()
    profiles = []
    for i, model in enumerate(models):
        info = {"mode": mode, "timer": "cuda events" if device.type == "cuda" else "perf_counter",
                "dtype": dtype_name(model.dtype), "repeats": repeats, "warmup": warmup,
                "versions": versions(), **(meta or {})}
        if len(models) > 1:
            info["interleaved_with"] = [dtype_name(m.dtype) for m in models]
        if mode == "graphs":
            info["eager_cells"] = eager_cells[i]
        profiles.append(CostProfile(machine=machine_info(), device=str(device), context=context, steps=steps[i],
                                    tokens=counts, spread=spread[i], meta=info))
    return profiles


def seconds_per_token(profile: CostProfile, acceptance: float = SPECULATION_ACCEPTANCE, requests: int = 1) -> tuple[float, int]:
    """Expected seconds per token of speculative decoding with this profile's forward costs, for a
    drafter whose every position is accepted with probability ``acceptance`` (given the earlier ones),
    at the best forward length n over the profiled counts (n - 1 draft tokens and the anchor; n = 1 is
    plain decoding), drafting taken as free: ``min_n T(n) / E[tau(n)]`` with
    ``E[tau(n)] = 1 + a + ... + a^(n-1)``. Returns (seconds, that n)."""
    options = [(profile.forward_seconds(n, requests) / sum(acceptance**k for k in range(n)), n)
               for n in profile.token_counts()]
    return min(options)


def combine_dtypes(profiles: Sequence[CostProfile], acceptance: float = SPECULATION_ACCEPTANCE) -> CostProfile:
    """One profile of the same grid measured in several dtypes (``meta["dtype"]`` each): ``by_dtype``
    holds every dtype's curves, ``fastest_dtype`` the one with the lowest :func:`seconds_per_token` at
    ``acceptance`` (R = 1), whose curves and meta the top level carries."""
    per_token = {p.meta["dtype"]: seconds_per_token(p, acceptance) for p in profiles}
    fastest = min(per_token, key=lambda name: per_token[name][0])
    best = next(p for p in profiles if p.meta["dtype"] == fastest)
    rule = {"acceptance": acceptance, "requests": 1, "drafting": "free",
            "seconds_per_token": {name: s for name, (s, _) in per_token.items()},
            "best_tokens_per_forward": {name: n for name, (_, n) in per_token.items()}}
    return replace(best, by_dtype={p.meta["dtype"]: {"steps": p.steps, "spread": p.spread} for p in profiles},
                   fastest_dtype=fastest, meta={**best.meta, "fastest_dtype": rule})


def native_bf16(device: str = "cpu") -> bool:
    """Whether the hardware computes bfloat16 natively: a CUDA GPU with bf16, or a CPU with AVX512-BF16
    or AMX (elsewhere oneDNN emulates bfloat16, often slower than float32)."""
    if torch.device(device).type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return bool(cpu_bf16_units())


def serving_dtype(device: str = "cpu") -> tuple[str, str]:
    """(dtype, why) that ``--dtype auto`` serves in: the ``fastest_dtype`` of this machine's cost profile
    (``dspark profile`` writes it to :func:`default_profile_path`) when one exists; else bfloat16 where
    the hardware computes it natively (:func:`native_bf16`), else float32."""
    path = default_profile_path(device)
    if path.is_file():
        try:
            profile = CostProfile.load(path)
        except (ValueError, TypeError, json.JSONDecodeError):
            profile = None  # another machine's, or unreadable: decide from the hardware
        if profile is not None and profile.fastest_dtype:
            return profile.fastest_dtype, f"fastest for speculative decoding in this machine's cost profile {path}"
    if native_bf16(device):
        return "bfloat16", "no cost profile for this machine; the hardware computes bfloat16 natively"
    return "float32", "no cost profile for this machine; the hardware has no native bfloat16"
