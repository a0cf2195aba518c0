"""Where the repository keeps what the package reads and writes: one definition of each folder."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PROMPT_DIR = REPO_ROOT / "data" / "prompts"  # evaluation sets and the training mix
RESULTS_DIR = REPO_ROOT / "data" / "results"  # benchmark runs and result tables


def process_tmp(path: Path) -> Path:
    """A temporary sibling of ``path`` that only this process writes (same suffix): write it, then
    ``rename`` it onto ``path``, so that processes filling the same cache at once never mix their bytes."""
    return path.with_name(f"{path.stem}.{os.getpid()}.tmp{path.suffix}")
