"""Drafters that copy tokens: n-gram prompt lookup, the oracle, and lookup in front of a trained drafter.

Copied tokens come with one-hot distributions, so the verifier accepts token ``x`` with probability
``p(x)`` (greedy: iff ``x`` is the target's argmax).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from ..core.rounds import Draft, DraftContext
from ..core.sampling import SamplingConfig, one_hot
from .trained import BlockDrafter, EagleDrafter


def _one_hot_draft(tokens: Sequence[int], vocab_size: int) -> Draft:
    ids = torch.tensor(list(tokens), dtype=torch.long)
    return Draft(tokens=ids, probs=one_hot(ids, vocab_size))


class NgramDrafter:
    """Prompt lookup: copy what followed the earlier occurrence of the context's longest suffix that occurred
    before (at most ``max_ngram`` tokens; the latest occurrence among equals). Proposes nothing when that suffix
    is shorter than ``min_ngram``."""

    feature_layers: tuple[int, ...] = ()

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got min={min_ngram}, max={max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def reset(self) -> None:
        pass

    def propose(self, context: DraftContext, gamma: int, sampling: SamplingConfig, generator=None) -> Draft:
        tokens = context.tokens
        best, best_end = 0, -1  # longest match, and where its latest occurrence ends
        for end in range(len(tokens) - 2, -1, -1):  # one backward pass; the longest match wins, the latest on ties
            length = 0
            while length < min(self.max_ngram, end + 1) and tokens[end - length] == tokens[-1 - length]:
                length += 1
            if length > best:
                best, best_end = length, end
                if best == self.max_ngram:
                    break
        if best < self.min_ngram:
            return Draft.empty(context.vocab_size)
        return _one_hot_draft(tokens[best_end + 1 : best_end + 1 + gamma], context.vocab_size)


class OracleDrafter:
    """Proposes a known reference continuation (e.g. the target's own greedy output): the ceiling
    on tau at a given block length. Proposes nothing once the sequence has left the reference."""

    feature_layers: tuple[int, ...] = ()

    def __init__(self, reference: Sequence[int]):
        self.reference = list(reference)

    def reset(self) -> None:
        pass

    def propose(self, context: DraftContext, gamma: int, sampling: SamplingConfig, generator=None) -> Draft:
        generated = context.tokens[context.prompt_len :]
        if generated != self.reference[: len(generated)]:
            return Draft.empty(context.vocab_size)
        offset = len(generated)
        return _one_hot_draft(self.reference[offset : offset + gamma], context.vocab_size)


LOOKUP_FIRST_NGRAM = 2  # the shortest match LookupFirst copies from; chosen on the selection set (data/results/lookup-first)


class LookupFirst:
    """Ours: copy when the context's last ``min_ngram`` or more tokens occurred earlier in it (prompt lookup,
    longest match first), otherwise draft with the trained ``drafter``.

    The choice reads committed tokens only, never the target's verdict on this round, and either draft carries
    the exact distributions it came from, so verification stays lossless. The trained drafter takes every
    round's target features whichever draft is used, so its context stays whole. Copied drafts have no
    confidences: run it with a fixed block length (:class:`~dspark_core.decode.policies.FixedLength`). Its block is
    the trained drafter's (``block_size``): copies are no longer than drafts, so a label's gamma holds for both."""

    def __init__(self, drafter: BlockDrafter | EagleDrafter, min_ngram: int = LOOKUP_FIRST_NGRAM, max_ngram: int = 8):
        self.drafter = drafter
        self.lookup = NgramDrafter(max_ngram=max(max_ngram, min_ngram), min_ngram=min_ngram)
        self.feature_layers = drafter.feature_layers
        self.block_size = drafter.block_size

    def reset(self) -> None:
        self.drafter.reset()

    def propose(self, context: DraftContext, gamma: int, sampling: SamplingConfig, generator=None) -> Draft:
        self.drafter.observe(context)
        copied = self.lookup.propose(context, gamma, sampling, generator)
        if len(copied):
            return copied
        return self.drafter.propose(replace(context, new_features=None), gamma, sampling, generator)
