"""The drafters shipped for the default target: present, small, lossless, and better than nothing.

Greedy output with every shipped drafter equals plain greedy decoding (fp32, 5 prompts x 64 tokens).
The trained drafters must also accept something: more than 0.15 draft tokens per round on average
(an untrained drafter accepts about 0). A broken checkpoint stays lossless, so only this catches it.
"""

import json

import pytest
import torch

from dspark_core import (
    FixedLength,
    SamplingConfig,
    autoregressive_generate,
    speculative_generate,
)
from dspark_core.core.rounds import DraftContext
from dspark_core.core.session import CausalLMSession
from dspark_core.decode.policies import HardwareAware, SurvivalThreshold
from dspark_core.drafters.registry import (
    SHIPPED_DIR,
    SHIPPED_DRAFTERS,
    build_drafter,
    shipped_drafter,
)

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
    assert total < 45e6, f"shipped drafters take {total / 1e6:.1f} MB (budget 45 MB, issue 10)"
    shipped = [SHIPPED_DIR / name for name in NAMES]  # recipe and ablation runs keep their state locally (git-ignored)
    assert not any(path for folder in shipped for path in folder.rglob("state")), "training state (optimizer) must not be shipped"


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


STEEP = {b: 1.0 / (1 + 0.3 * (b - 1)) for b in range(1, 9)}  # each verified token costs 30% of a step


@pytest.mark.parametrize("policy", [SurvivalThreshold(7, 0.3), HardwareAware(7, lambda b, r: STEEP[b])],
                         ids=["survival", "hardware-aware"])
def test_dspark_drafts_only_what_the_policy_verifies(target, prompts, eos, plain_outputs, policy):
    """With a stop rule the dspark drafter stops at the first position the policy rejects: the
    output stays plain greedy, every drafted token is verified, and the shorter draft is a prefix of
    the full block (same tokens, same confidences)."""
    model, tokenizer = target
    drafter = build_drafter("dspark", model, tokenizer)
    lengths = []
    for prompt, plain in list(zip(prompts, plain_outputs))[:2]:
        result = speculative_generate(model, prompt, drafter, policy, max_new_tokens=MAX_NEW, eos_token_ids=eos)
        assert result.tokens == plain
        assert all(r.proposed == r.verified for r in result.rounds)
        lengths += [r.verified for r in result.rounds]
    assert 0 in lengths or min(lengths) < 7 and max(lengths) > 0, lengths  # the rule did stop somewhere

    session = CausalLMSession(model, drafter.feature_layers)
    prompt = prompts[0].tolist()
    drafter.reset()
    full = drafter.propose(DraftContext(prompt, len(prompt), session.forward(prompt[:-1]).features, len(tokenizer)),
                           7, SamplingConfig(), None)
    short = drafter.propose(DraftContext(prompt, len(prompt), None, len(tokenizer), admit=lambda c: len(c) < 3), 7,
                            SamplingConfig(), None)
    assert len(short) == 2 and short.tokens.tolist() == full.tokens[:2].tolist()
    assert torch.equal(short.confidences, full.confidences[:2]) and torch.equal(short.probs, full.probs[:2])
