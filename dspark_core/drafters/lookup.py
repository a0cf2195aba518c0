"""Deterministic drafters that copy tokens: n-gram prompt lookup and the oracle.

Both propose one-hot distributions, so the verifier accepts token ``x`` with probability
``p(x)`` (greedy: iff ``x`` is the target's argmax).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..core.rounds import Draft, DraftContext
from ..core.sampling import SamplingConfig, one_hot


def _one_hot_draft(tokens: Sequence[int], vocab_size: int) -> Draft:
    ids = torch.tensor(list(tokens), dtype=torch.long)
    return Draft(tokens=ids, probs=one_hot(ids, vocab_size))


class NgramDrafter:
    """Prompt lookup: find the latest earlier occurrence of the context's last n tokens and copy
    what followed it. Tries ``n = max_ngram`` down to ``min_ngram``; proposes nothing if no match."""

    feature_layers: tuple[int, ...] = ()

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got min={min_ngram}, max={max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def reset(self) -> None:
        pass

    def propose(self, context: DraftContext, gamma: int, sampling: SamplingConfig, generator=None) -> Draft:
        tokens = context.tokens
        for n in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            suffix = tokens[-n:]
            for start in range(len(tokens) - n - 1, -1, -1):
                if tokens[start : start + n] == suffix:
                    follow = tokens[start + n : start + n + gamma]
                    return _one_hot_draft(follow, context.vocab_size)
        return Draft.empty(context.vocab_size)


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
