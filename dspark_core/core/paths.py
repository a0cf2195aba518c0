"""Where the repository keeps what the package reads and writes: one definition of each folder."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PROMPT_DIR = REPO_ROOT / "data" / "prompts"  # evaluation sets and the training mix
RESULTS_DIR = REPO_ROOT / "data" / "results"  # benchmark runs and result tables
