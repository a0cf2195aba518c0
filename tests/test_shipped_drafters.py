"""The drafters shipped for the default target: present, small, lossless, and better than nothing.

Greedy output with every shipped drafter equals plain greedy decoding (fp32, 5 prompts x 64 tokens).
The trained drafters must also accept something: more than 0.15 draft tokens per round on average
(an untrained drafter accepts about 0; the shipped ones accept 0.4 to 0.7 here). A broken checkpoint
stays lossless, so only this catches it.
"""

import json

import pytest

from dspark_core import FixedLength, autoregressive_generate, speculative_generate
from dspark_core.drafters.registry import SHIPPED_DIR, SHIPPED_DRAFTERS, build_drafter, shipped_drafter

MAX_NEW = 64
NAMES = SHIPPED_DRAFTERS + ("draft-lm",)
KIND = {"eagle": "eagle", "dflash": "dflash", "dspark-markov": "dspark", "dspark-rnn": "dspark", "draft-lm": "draft-lm"}


@pytest.fixture(scope="module")
def plain_outputs(target, prompts, eos):
    return [autoregressive_generate(target[0], p, max_new_tokens=MAX_NEW, eos_token_ids=eos).tokens for p in prompts]


def test_every_drafter_is_shipped_with_its_record_and_fits_the_budget():
    total = 0
    for name in NAMES:
        folder = shipped_drafter(name)
        assert (folder / "model.safetensors").is_file(), f"{folder} has no weights; run `make train-drafters`"
        assert (folder / "loss.csv").is_file() and (folder / "train_meta.json").is_file()
        meta = json.loads((folder / "train_meta.json").read_text())
        assert meta["target_fingerprint"] and meta["config"]["drafter"] == KIND[name]
        total += sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    assert total < 80e6, f"shipped drafters take {total / 1e6:.1f} MB (budget 80 MB)"
    assert not any(SHIPPED_DIR.rglob("state")), "training state (optimizer) must not be shipped"


@pytest.mark.parametrize("name", NAMES)
def test_shipped_drafter_is_lossless_greedy_and_accepts(target, prompts, eos, plain_outputs, name):
    model, tokenizer = target
    drafter = build_drafter(KIND[name], model, tokenizer, draft_model=str(shipped_drafter(name)))
    gamma = 4 if name == "draft-lm" else 7
    accepted = rounds = 0
    for prompt, plain in zip(prompts, plain_outputs):
        result = speculative_generate(model, prompt, drafter, FixedLength(gamma), max_new_tokens=MAX_NEW,
                                      eos_token_ids=eos)
        assert result.tokens == plain
        accepted += sum(r.accepted for r in result.rounds)
        rounds += len(result.rounds)
    assert accepted / rounds > 0.15, f"{name} accepts only {accepted} draft tokens in {rounds} rounds"
