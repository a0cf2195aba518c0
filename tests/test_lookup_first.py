"""Prompt lookup, alone and in front of a trained drafter (LookupFirst, ours): what it copies, and that
mixing copied and drafted rounds stays lossless (greedy identity in fp32, chi-square at temperature 1)."""

import numpy as np
import pytest
import torch

from dspark_core import (
    DraftContext,
    FixedLength,
    SamplingConfig,
    autoregressive_generate,
    speculative_generate,
)
from dspark_core.core import verification
from dspark_core.drafters.lookup import LookupFirst, NgramDrafter
from dspark_core.drafters.registry import build_drafter
from dspark_core.drafters.trained import BlockDrafter
from dspark_core.eval.bench import parse_methods

from .stats import chi_square_p
from .tiny import drafter_for, tiny_target


def copied(drafter: NgramDrafter, tokens: list[int], gamma: int = 3) -> list[int]:
    return drafter.propose(DraftContext(tokens, 1, None, 16), gamma, SamplingConfig()).tokens.tolist()


def test_lookup_copies_after_the_longest_match_and_its_latest_occurrence():
    tokens = [5, 1, 2, 8, 9, 3, 2, 6, 7, 1, 2]  # "2" occurs at 2 and 6; "1 2" only at 1..2
    assert copied(NgramDrafter(max_ngram=3), tokens) == [8, 9, 3]  # the longer match wins over the later one
    assert copied(NgramDrafter(max_ngram=1), tokens) == [6, 7, 1]  # one token: the latest occurrence
    assert copied(NgramDrafter(max_ngram=4, min_ngram=3), tokens) == []  # no earlier "7 1 2"
    assert copied(NgramDrafter(), [4, 4]) == [4]  # a copy stops where the context ends
    assert copied(NgramDrafter(), [4]) == []


def latest_longest_match(tokens: list[int], max_ngram: int, min_ngram: int, gamma: int) -> list[int]:
    """The plain definition: for n from the longest down, the latest earlier occurrence of the last n tokens."""
    for n in range(min(max_ngram, len(tokens) - 1), min_ngram - 1, -1):
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == tokens[-n:]:
                return tokens[start + n : start + n + gamma]
    return []


def test_lookup_equals_the_plain_definition_on_random_contexts():
    rng = np.random.default_rng(0)
    for _ in range(2000):
        tokens = rng.integers(0, int(rng.integers(2, 6)), size=int(rng.integers(1, 40))).tolist()
        max_ngram = int(rng.integers(1, 6))
        min_ngram, gamma = int(rng.integers(1, max_ngram + 1)), int(rng.integers(1, 8))
        assert copied(NgramDrafter(max_ngram, min_ngram), tokens, gamma) == latest_longest_match(
            tokens, max_ngram, min_ngram, gamma), (tokens, max_ngram, min_ngram, gamma)


def rounds_by_kind(result) -> tuple[int, int]:
    """(copied rounds, drafted rounds): a dspark draft carries confidences, a copy none."""
    drafted = sum(r.confidences is not None for r in result.rounds if r.proposed)
    return sum(r.proposed > 0 for r in result.rounds) - drafted, drafted


def test_lookup_first_copies_where_the_context_repeats_drafts_elsewhere_and_equals_plain_greedy():
    model, tokenizer = tiny_target()
    drafter = LookupFirst(BlockDrafter(drafter_for(model, tokenizer, "dspark-markov", draft_vocab_size=16, rank=8),
                                       model, tokenizer), min_ngram=2)
    kinds = np.zeros(2, dtype=int)
    for prompt in ([3, 7, 1, 9, 4, 3, 7], [2, 5, 11, 6], [9, 9, 9, 9, 1]):
        plain = autoregressive_generate(model, prompt, max_new_tokens=40)
        result = speculative_generate(model, prompt, drafter, FixedLength(5), max_new_tokens=40)
        assert result.tokens == plain.tokens
        kinds += rounds_by_kind(result)
    assert kinds.min() > 0, f"copied and drafted rounds: {kinds}; the test must run both"
    with pytest.raises(ValueError, match="block"):  # its block is the drafter's (5): copies are no longer
        speculative_generate(model, [3, 7, 1, 9, 4, 3, 7], drafter, FixedLength(6), max_new_tokens=8)


@pytest.mark.slow  # chi-square tests over 3,000 seeded generations (about 30 s)
@pytest.mark.parametrize("prompt, kind", [([3, 7, 1, 9, 4, 3, 7], "copied"), ([2, 5, 11, 6], "drafted")])
def test_lookup_first_first_token_follows_the_target_at_temperature_1(monkeypatch, prompt, kind):
    """Chi-square (p > 1e-3) of the first emitted token over N = 3,000 seeds, with round 1 copied (the prompt
    ends in "3 7", seen before) or drafted (no repeat). With the residual replaced by p the statistic must fail
    (p < 1e-6) on the same seeds."""
    model, tokenizer = tiny_target()
    drafter = LookupFirst(BlockDrafter(drafter_for(model, tokenizer, "dspark-markov", draft_vocab_size=12, rank=8,
                                                   tokenizer_fingerprint="", target_fingerprint=""),
                                       model, tokenizer), min_ngram=2)
    with torch.no_grad():
        p = torch.softmax(model(torch.tensor([prompt])).logits[0, -1].double(), -1).numpy()

    def pvalue() -> float:
        counts = np.zeros(16)
        for seed in range(3000):  # every token ends the run, so the first round decides the first token
            out = speculative_generate(model, prompt, drafter, FixedLength(4), sampling=SamplingConfig(1.0),
                                       max_new_tokens=5, seed=seed, eos_token_ids=tuple(range(16)))
            assert rounds_by_kind(out) == ((1, 0) if kind == "copied" else (0, 1))
            counts[out.tokens[0]] += 1
        return chi_square_p(counts, p)

    assert pvalue() > 1e-3
    monkeypatch.setattr(verification, "residual", lambda p_row, q_row: p_row)
    assert pvalue() < 1e-6


def test_lookup_first_over_the_shipped_dspark_equals_plain_greedy(target, prompts, eos):
    """fp32, the default target, 3 prompts x 64 tokens: the same tokens as plain greedy decoding, from copied
    and drafted rounds both."""
    model, tokenizer = target
    drafter = build_drafter("dspark+ngram", model, tokenizer)
    kinds = np.zeros(2, dtype=int)
    for prompt in prompts[:3]:
        plain = autoregressive_generate(model, prompt, max_new_tokens=64, eos_token_ids=eos)
        result = speculative_generate(model, prompt, drafter, FixedLength(7), max_new_tokens=64, eos_token_ids=eos)
        assert result.tokens == plain.tokens
        kinds += rounds_by_kind(result)
    assert kinds.min() > 0, f"copied and drafted rounds: {kinds}"


def test_bench_names_lookup_first_as_ours_and_refuses_it_the_scheduler():
    method, = parse_methods("dspark-markov+ngram:7")
    assert (method.label, method.drafter) == ("dspark-markov+ngram@7", "dspark+ngram")
    assert method.checkpoint.endswith("dspark-markov")
    with pytest.raises(ValueError, match="confidences on every draft"):
        parse_methods("dspark-markov+ngram:hw7")
    with pytest.raises(ValueError, match="goes behind a drafter trained on the target's features"):
        build_drafter("ngram+ngram", None, None)
    with pytest.raises(ValueError, match="Unknown drafter 'dspak'"):
        build_drafter("dspak", None, None)
