"""Training prompts and self-distillation data: reproducible, disjoint from evaluation, resumable."""

import json
import re
from pathlib import Path

import pytest

from dspark_core.data import distill
from dspark_core.core.prompts import load_prompt_set
from dspark_core.data.train_prompts import (
    DEFAULT_COUNTS,
    TRAIN_PROMPTS,
    generate_train_prompts,
    meta_path,
    python_version,
)

PROMPT_DIR = TRAIN_PROMPTS.parent


def normalise(text: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"\d+", "#", text.lower())).strip()


def shingles(text: str, n: int = 5) -> set[tuple[str, ...]]:
    words = normalise(text).split()
    return {tuple(words[i : i + n]) for i in range(max(1, len(words) - n + 1))}


def test_committed_train_prompts_are_reproducible():
    made_with = json.loads(meta_path(TRAIN_PROMPTS).read_text())["python"]
    if made_with != python_version():
        pytest.skip(f"train.jsonl was written by Python {made_with}; standard-library docstrings differ in {python_version()}")
    committed = load_prompt_set(TRAIN_PROMPTS)
    assert committed == generate_train_prompts()
    assert len(committed) == sum(DEFAULT_COUNTS.values())
    assert len({r["turns"][0] for r in committed}) == len(committed)


def test_no_evaluation_prompt_overlaps_training():
    """Exact match after normalising numbers/case/spaces, or word 5-gram Jaccard >= 0.5, counts as overlap."""
    train = [r["turns"][0] for r in load_prompt_set(TRAIN_PROMPTS)]
    train_norm = {normalise(t) for t in train}
    index: dict[tuple[str, ...], set[int]] = {}
    train_shingles = [shingles(t) for t in train]
    for i, sh in enumerate(train_shingles):
        for s in sh:
            index.setdefault(s, set()).add(i)
    eval_files = [p for p in PROMPT_DIR.glob("*.jsonl") if p != TRAIN_PROMPTS]
    assert eval_files, "no evaluation prompt sets found"
    overlaps = []
    for path in eval_files:
        for record in load_prompt_set(path):
            for turn in record["turns"]:
                assert normalise(turn) not in train_norm, f"{record['id']} equals a training prompt"
                sh = shingles(turn)
                candidates = set().union(*(index.get(s, set()) for s in sh))
                for i in candidates:
                    jaccard = len(sh & train_shingles[i]) / len(sh | train_shingles[i])
                    if jaccard >= 0.5:
                        overlaps.append((record["id"], train[i][:60], round(jaccard, 2)))
    assert not overlaps, overlaps


def test_distillation_resumes_after_interruption(target, tmp_path, monkeypatch):
    model, tokenizer = target
    records = load_prompt_set(TRAIN_PROMPTS)[::1250][:4]
    settings = distill.DistillSettings(max_new_tokens=6, batch_size=2, seed=3)
    full = tmp_path / "full"
    distill.generate(model, tokenizer, records, full, settings)

    interrupted = tmp_path / "interrupted"
    real_generate = model.generate
    calls = {"n": 0}

    def failing_generate(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real_generate(*args, **kwargs)

    monkeypatch.setattr(model, "generate", failing_generate)
    with pytest.raises(KeyboardInterrupt):
        distill.generate(model, tokenizer, records, interrupted, settings)
    monkeypatch.setattr(model, "generate", real_generate)
    assert len((interrupted / "parts.jsonl").read_text().splitlines()) == 2
    distill.generate(model, tokenizer, records, interrupted, settings)

    def answers(folder: Path) -> dict:
        return {json.loads(l)["id"]: json.loads(l)["response"] for l in (folder / "parts.jsonl").read_text().splitlines()}

    assert answers(interrupted) == answers(full)
    prompt_file = tmp_path / "p.jsonl"
    prompt_file.write_text("".join(json.dumps(r) + "\n" for r in records))
    distill.pack(model, tokenizer, records, prompt_file, interrupted, settings)
    data = distill.load(interrupted)
    assert data.ids == [r["id"] for r in records] and data.meta["complete"]
    assert data.responses == [answers(full)[r["id"]] for r in records]
