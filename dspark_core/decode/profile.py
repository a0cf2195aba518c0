"""The target's cost profile: forward steps per second vs tokens in the batch, on this machine.

``measure_profile`` times one target forward with R requests x n new tokens each (over a cached
context of ``context`` tokens per request), for n = 1..max_tokens and R in ``requests``. The
hardware-aware scheduler reads ``steps_per_second(tokens, requests)`` from it. A profile records
the machine it was measured on; loading it on another machine is an error unless asked for
explicitly, so a foreign profile is never used silently.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import DynamicCache, PreTrainedModel

from ..core.provenance import machine_info
from ..core.target import cache_dir

MACHINE_KEYS = ("host", "processor", "cpu_count", "torch", "threads", "cuda")


@dataclass
class CostProfile:
    """steps_per_second[str(R)][n - 1]: target forwards per second with R requests of n new tokens."""

    machine: dict
    device: str
    context: int
    steps: dict[str, list[float]]

    def steps_per_second(self, tokens: int, requests: int) -> float:
        """SPS(B) for B = ``tokens`` spread evenly over ``requests`` rows (the nearest profiled R at
        or above ``requests``; beyond the longest profiled n, time grows linearly in n)."""
        profiled = sorted(int(r) for r in self.steps)
        rows = next((r for r in profiled if r >= requests), profiled[-1])
        curve = self.steps[str(rows)]
        n = max(1, math.ceil(tokens / max(1, requests)))
        if n <= len(curve):
            return curve[n - 1]
        return curve[-1] * len(curve) / n

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=1))
        return path

    @staticmethod
    def load(path: Path, allow_other_machine: bool = False) -> "CostProfile":
        if not path.is_file():
            raise FileNotFoundError(f"No cost profile at {path}; measure one with `dspark profile`.")
        profile = CostProfile(**json.loads(path.read_text()))
        here = machine_info()
        differs = {k: (profile.machine.get(k), here[k]) for k in MACHINE_KEYS if profile.machine.get(k) != here[k]}
        if differs and not allow_other_machine:
            raise ValueError(f"The cost profile {path} was measured on another machine ({differs}); measure this "
                             "one with `dspark profile`, or pass allow_other_machine=True knowingly.")
        return profile


def default_profile_path(device: str = "cpu") -> Path:
    info = machine_info()
    return cache_dir() / "profiles" / f"{info['host']}-{device}-{info['threads']}threads.json"


@torch.inference_mode()
def measure_profile(
    model: PreTrainedModel,
    requests: tuple[int, ...] = (1, 2, 4, 8, 16),
    max_tokens: int = 16,
    context: int = 128,
    repeats: int = 5,
) -> CostProfile:
    """Median time of ``repeats`` target forwards for every (R, n); returns steps per second."""
    device = model.device
    steps: dict[str, list[float]] = {}
    with tqdm(total=len(requests) * max_tokens, desc="profile", unit="shape") as bar:
        for rows in requests:
            cache = DynamicCache(config=model.config)
            ids = torch.randint(100, 1000, (rows, context), generator=torch.Generator().manual_seed(0)).to(device)
            model(input_ids=ids, cache=cache, use_cache=True)
            curve = []
            for n in range(1, max_tokens + 1):
                new = torch.randint(100, 1000, (rows, n), generator=torch.Generator().manual_seed(n)).to(device)
                times = []
                for _ in range(repeats + 1):  # the first run is a warm-up
                    start = time.perf_counter()
                    model(input_ids=new, cache=cache, use_cache=True)
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    times.append(time.perf_counter() - start)
                    cache.crop(-n)  # back to the context (transformers crops by a negative count)
                curve.append(1.0 / statistics.median(times[1:]))
                bar.update(1)
            steps[str(rows)] = curve
    return CostProfile(machine=machine_info(), device=str(device), context=context, steps=steps)
