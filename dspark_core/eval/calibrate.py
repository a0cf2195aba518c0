"""Collecting calibration rounds: a dspark drafter decodes held-out training prompts, and every
round's confidences, verified and accepted counts become the data that :mod:`..decode.calibration`
fits and scores."""

from __future__ import annotations

import random

import numpy as np
from tqdm.auto import tqdm

from ..core.prompts import first_turn_messages, load_prompt_set
from ..core.target import encode_prompt, eos_token_ids
from ..data.training_set import CALIBRATION_PROMPTS
from ..decode.calibration import Rounds
from ..decode.loop import speculative_generate
from ..decode.policies import FixedLength


def calibration_prompts(count: int, seed: int = 0) -> list[dict]:
    """``count`` of the held-out ShareGPT first turns (``data/prompts/calibration.jsonl``): never trained
    on, neither answered nor teacher-forced, and disjoint from every evaluation set, so calibrating on them
    leaks nothing."""
    records = load_prompt_set(CALIBRATION_PROMPTS)
    return random.Random(seed).sample(records, min(count, len(records)))


def collect_rounds(model, tokenizer, drafter, records: list[dict], gamma: int, sampling, max_new_tokens: int = 96,
                   seed: int = 0) -> Rounds:
    """Run fixed-length speculative decoding with a dspark drafter (its raw, uncalibrated confidences)
    on ``records`` and return every round's confidences, verified and accepted counts."""
    saved, drafter.calibration = drafter.calibration, {}
    conf, verified, accepted, prompt, domain = [], [], [], [], []
    try:
        for index, record in enumerate(tqdm(records, desc="calibration rounds", unit="prompt")):
            result = speculative_generate(model, encode_prompt(tokenizer, first_turn_messages(record)), drafter,
                                          FixedLength(gamma), sampling=sampling, max_new_tokens=max_new_tokens,
                                          seed=seed, eos_token_ids=eos_token_ids(model, tokenizer))
            for r in result.rounds:
                if r.confidences is not None and len(r.confidences) == gamma:
                    conf.append(r.confidences)
                    verified.append(r.verified)
                    accepted.append(r.accepted)
                    prompt.append(index)
                    domain.append(record.get("domain", ""))
    finally:
        drafter.calibration = saved
    return Rounds(np.asarray(conf).reshape(-1, gamma), np.asarray(verified, dtype=int), np.asarray(accepted, dtype=int),
                  np.asarray(prompt, dtype=int), np.asarray(domain, dtype=str))
