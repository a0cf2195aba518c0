"""Where and when a result was made: machine information, git commit and timestamps."""

from __future__ import annotations

import os
import platform
import subprocess
import time

import torch

from .paths import REPO_ROOT


def git_commit() -> str:
    """The short commit hash of the working tree, with ``+dirty`` when it has uncommitted changes."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def committed_text(commit: str, path: str) -> str | None:
    """The text of ``path`` (relative to the repository root) at ``commit``, or None where git, the commit
    or the file is missing (a run folder from another repository, a path that was never committed)."""
    try:
        shown = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=REPO_ROOT, capture_output=True, text=True)
    except OSError:
        return None
    return shown.stdout if shown.returncode == 0 else None


def cpu_model() -> str:
    """The CPU's model name as the kernel reports it (``/proc/cpuinfo``), else Python's processor string."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            named = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), None)
    except OSError:
        named = None
    return named or platform.processor() or "unknown"


def cpu_bf16_units() -> list[str]:
    """The CPU units that compute bfloat16 natively, of AVX512-BF16 and AMX (empty: oneDNN emulates bfloat16)."""
    checks = {"AVX512-BF16": getattr(torch.cpu, "_is_avx512_bf16_supported", None),
              "AMX": getattr(torch.cpu, "_is_amx_tile_supported", None)}
    return [unit for unit, check in checks.items() if check is not None and check()]


def machine_info() -> dict[str, str]:
    """Host, processor, core count, CPU model and vector units (the widest torch uses, e.g. AVX2 or AVX512, plus
    the bfloat16 ones), torch build and threads, accelerator, git commit."""
    return {
        "host": platform.node(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": str(os.cpu_count()),
        "cpu_model": cpu_model(),
        "cpu_units": "+".join([torch.backends.cpu.get_cpu_capability(), *cpu_bf16_units()]),
        "torch": torch.__version__,
        "threads": str(torch.get_num_threads()),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
        "git_commit": git_commit(),
    }


def timestamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")
