"""Reproducible runs: the same seed gives the same tokens for every method, twice in a row (the
second run reuses the drafter, so no state or global random number leaks between runs); shipped
checkpoints carry the SHA-256 of their weights, checked at load, and a flipped byte is a clear error; a
committed file reads back as it was at a commit (how notebook 04 labels an older run's drafters)."""

import shutil

import pytest

from dspark_core import (
    FixedLength,
    NgramDrafter,
    SamplingConfig,
    autoregressive_generate,
    speculative_generate,
)
from dspark_core.core.checksums import CHECKSUM_FILE, verify_checksums, write_checksums
from dspark_core.core.provenance import committed_text
from dspark_core.decode.engine import BatchedEngine
from dspark_core.drafters.registry import (
    SHIPPED_DRAFTERS,
    build_drafter,
    shipped_drafter,
)
from dspark_core.drafters.trained import load_trained_drafter

from .tiny import drafter_for, tiny_target

METHODS = ("plain", "ngram", "oracle", "draft-lm", *SHIPPED_DRAFTERS)
SAMPLING = SamplingConfig(temperature=1.0, top_k=50)
NEW = 16


def build(name: str, model, tokenizer, reference: list[int]):
    if name == "plain":
        return None
    if name in SHIPPED_DRAFTERS:
        return build_drafter(name.split("-")[0], model, tokenizer, draft_model=str(shipped_drafter(name)))
    return build_drafter(name, model, tokenizer, reference=reference)


@pytest.fixture(scope="module")
def reference(target, prompts, eos) -> list[int]:
    """The plain greedy continuation the oracle proposes."""
    return autoregressive_generate(target[0], prompts[1], max_new_tokens=NEW, eos_token_ids=eos).tokens


@pytest.mark.parametrize("name", METHODS)
def test_same_seed_same_tokens_twice_in_a_row(target, prompts, eos, reference, name):
    model, tokenizer = target
    drafter = build(name, model, tokenizer, reference)
    policy = FixedLength(4) if drafter is not None else None

    def run(seed: int) -> list[int]:
        return speculative_generate(model, prompts[1], drafter, policy, sampling=SAMPLING, max_new_tokens=NEW, seed=seed,
                                    eos_token_ids=eos).tokens

    first = run(7)
    assert run(7) == first
    if name == "plain":
        assert run(8) != first  # the seed is what decides the tokens


def test_engine_same_seed_same_tokens(target, prompts, eos):
    model, _ = target

    def serve() -> list[list[int]]:
        engine = BatchedEngine(model, FixedLength(4), NgramDrafter, sampling=SAMPLING, eos_token_ids=eos, seed=3)
        for prompt in prompts[:2]:
            engine.submit(prompt, NEW)
        return [r.result.tokens for r in engine.run()]

    assert serve() == serve()


def test_shipped_checkpoints_carry_their_sha256():
    for name in (*SHIPPED_DRAFTERS, "draft-lm"):
        folder = shipped_drafter(name)
        names = [line.split("  ")[1] for line in (folder / CHECKSUM_FILE).read_text().splitlines()]
        assert names == ["model.safetensors"] and verify_checksums(folder), name


def flip_a_byte(path) -> None:
    """Flip one bit in the middle of the file: inside the tensor data, so the file still parses."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name, kind", [("dspark-markov", "dspark"), ("draft-lm", "draft-lm")])
def test_a_corrupt_shipped_checkpoint_is_a_clear_error(target, tmp_path, name, kind):
    folder = tmp_path / name
    shutil.copytree(shipped_drafter(name), folder)
    flip_a_byte(folder / "model.safetensors")
    with pytest.raises(ValueError, match=r"model.safetensors does not match its recorded SHA-256 .*corrupt or was replaced"):
        build_drafter(kind, *target, draft_model=str(folder))


def test_checksums_written_at_save_time_are_checked_at_load(tmp_path):
    model, tokenizer = tiny_target()
    drafter_for(model, tokenizer, "dspark-markov", draft_vocab_size=12, rank=8).save_pretrained(tmp_path)
    load_trained_drafter(tmp_path, model, tokenizer)  # no checksums yet: loads unchecked
    assert write_checksums(tmp_path).read_text().endswith("  model.safetensors\n")
    load_trained_drafter(tmp_path, model, tokenizer)
    flip_a_byte(tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="does not match its recorded SHA-256"):
        load_trained_drafter(tmp_path, model, tokenizer)


def test_committed_text_reads_a_file_at_a_commit():
    # HEAD's README as git holds it; a path or a commit that git lacks reads as None, not an exception.
    assert committed_text("HEAD", "README.md").startswith("# dspark\n")
    assert committed_text("HEAD", "no/such/file.json") is None
    assert committed_text("0" * 40, "README.md") is None
