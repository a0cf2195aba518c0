"""The drafter interface: every drafter returns tokens plus the exact distributions they came from."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from ..sampling import SamplingConfig


@dataclass
class DraftContext:
    """What a drafter sees at the start of a round.

    tokens:       committed token ids, prompt included; ``tokens[-1]`` is the anchor (the last token
                  the target produced, or the last prompt token in the first round).
    prompt_len:   how many of ``tokens`` are the prompt.
    new_features: [n, m, d] target hidden states (at the drafter's ``feature_layers``) of the ``n``
                  tokens committed since the previous round, anchor excluded (it has not been through
                  the target yet); ``None`` for drafters that ask for no layers.
    vocab_size:   size of the target's vocabulary (width of every returned distribution).
    admit:        the verification policy's stop rule (``policy.admit``): given c_1..c_k, whether
                  position k will be verified. A drafter with confidences may stop at the first
                  position it rejects, before sampling that token; others ignore it.
    """

    tokens: list[int]
    prompt_len: int
    new_features: torch.Tensor | None
    vocab_size: int
    admit: Callable[[Sequence[float]], bool] | None = None


@dataclass
class Draft:
    """A proposal of ``g`` tokens following the anchor.

    tokens:      [g] token ids.
    probs:       [g, V] the exact distribution each token was sampled from (one-hot for deterministic
                 drafters); row k is conditioned on tokens 1..k-1 of this draft.
    confidences: [g] optional estimates that token k is accepted given 1..k-1 were.
    """

    tokens: torch.Tensor
    probs: torch.Tensor
    confidences: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @staticmethod
    def empty(vocab_size: int) -> "Draft":
        return Draft(tokens=torch.zeros(0, dtype=torch.long), probs=torch.zeros(0, vocab_size))


class Drafter(Protocol):
    """Proposes draft tokens. Drafters may keep per-sequence state; ``reset`` starts a new sequence."""

    feature_layers: tuple[int, ...]

    def reset(self) -> None: ...

    def propose(
        self, context: DraftContext, max_tokens: int, sampling: SamplingConfig, generator: torch.Generator | None
    ) -> Draft: ...
