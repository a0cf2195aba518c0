"""Prompt sets: JSONL files with one record per line, ``{"id", "domain", "turns": [str, ...]}``."""

from __future__ import annotations

import json
from pathlib import Path

from .paths import PROMPT_DIR

SMOKE_PROMPTS = PROMPT_DIR / "smoke.jsonl"


def load_prompt_set(path: str | Path = SMOKE_PROMPTS) -> list[dict]:
    """Read a prompt set, checking every record has an id, a domain and at least one non-empty turn."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Prompt set {path} does not exist; pass a JSONL file of {{id, domain, turns}} records.")
    records = []
    for line_no, line in enumerate(path.read_text(encoding="utf-8").split("\n"), start=1):  # not splitlines: \u2028 is text
        if not line.strip():
            continue
        record = json.loads(line)
        missing = {"id", "domain", "turns"} - record.keys()
        if missing or not record["turns"] or not all(t.strip() for t in record["turns"]):
            raise ValueError(f"{path}:{line_no}: each record needs id, domain and non-empty turns (missing: {sorted(missing)})")
        records.append(record)
    if not records:
        raise ValueError(f"Prompt set {path} holds no records.")
    return records


def first_turn_messages(record: dict) -> list[dict[str, str]]:
    """The chat messages for a record's first user turn (later turns need the model's earlier answers)."""
    return [{"role": "user", "content": record["turns"][0]}]
