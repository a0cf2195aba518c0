"""The types a decoding round passes around: what a drafter sees and proposes (every drafter returns
tokens plus the exact distributions they came from), and what a round and a generation record."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from .sampling import SamplingConfig


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
    def empty(vocab_size: int) -> Draft:
        return Draft(tokens=torch.zeros(0, dtype=torch.long), probs=torch.zeros(0, vocab_size))


class Drafter(Protocol):
    """Proposes draft tokens. Drafters may keep per-sequence state; ``reset`` starts a new sequence.

    A drafter that drafts at most a fixed number of tokens a round (a trained block) also has a
    ``block_size`` attribute; a policy with a larger gamma is then refused (``core.limits.check_block``)."""

    feature_layers: tuple[int, ...]

    def reset(self) -> None: ...

    def propose(
        self, context: DraftContext, gamma: int, sampling: SamplingConfig, generator: torch.Generator | None
    ) -> Draft: ...


ROUND_PARTS = ("draft", "forward", "probs", "accept", "cache", "other")


@dataclass(kw_only=True)
class RoundRecord:
    """One draft-verify round: ``proposed`` drafted, ``verified`` sent to the target, ``accepted``
    of those kept, ``emitted`` tokens committed (accepted + the residual/bonus token, unless cut);
    ``confidences``: the drafter's per-position confidences of the proposed tokens, if it has them.

    Wall-clock seconds of the round's parts (:data:`ROUND_PARTS`), which tile the round:
    draft_time:   building the drafter's context, drafting and choosing the verification length;
    forward_time: the target forward over [anchor, x_1..x_l] (inputs, logits, features);
    probs_time:   the target's distributions from its logits (its argmax ids under greedy);
    accept_time:  the acceptance walk and the EOS / length cut;
    cache_time:   rolling the KV cache back and keeping the features the drafter reads next;
    other_time:   the loop's own bookkeeping since the previous round (recording it, the budget).
    verify_time:  forward + probs + accept + cache, everything after drafting (the field's old meaning).
    In the batched engine draft and forward times are the whole batch's, shared by its requests."""

    proposed: int
    verified: int
    accepted: int
    emitted: int
    draft_time: float
    verify_time: float
    confidences: list[float] | None = None
    forward_time: float = 0.0
    probs_time: float = 0.0
    accept_time: float = 0.0
    cache_time: float = 0.0
    other_time: float = 0.0

    @property
    def round_time(self) -> float:
        """Seconds of the whole round, every part included."""
        return self.draft_time + self.verify_time + self.other_time


@dataclass
class GenerationResult:
    """New tokens (prompt excluded) and the per-round records of one generation."""

    prompt_len: int
    tokens: list[int]
    rounds: list[RoundRecord] = field(default_factory=list)
    prefill_time: float = 0.0
    total_time: float = 0.0

    @property
    def tau(self) -> float:
        """Tokens per round, the bonus/residual token included (plain decoding: 1)."""
        return len(self.tokens) / max(1, len(self.rounds))

    @property
    def acceptance_rate(self) -> float:
        """Accepted / verified draft tokens (NaN when nothing was verified)."""
        verified = sum(r.verified for r in self.rounds)
        return sum(r.accepted for r in self.rounds) / verified if verified else float("nan")

    @property
    def tokens_per_second(self) -> float:
        return len(self.tokens) / self.total_time if self.total_time > 0 else float("nan")

    def time_split(self) -> dict[str, float]:
        """Seconds spent in each round part (:data:`ROUND_PARTS`) summed over the rounds, and in the prefill."""
        split = {"prefill": self.prefill_time}
        for part in ROUND_PARTS:
            split[part] = sum(getattr(r, f"{part}_time") for r in self.rounds)
        return split

    @property
    def outside_forward_share(self) -> float:
        """Share of the rounds' time spent outside the target's forward (NaN without timed rounds)."""
        split = self.time_split()
        rounds = sum(split[part] for part in ROUND_PARTS)
        return (rounds - split["forward"]) / rounds if rounds > 0 else float("nan")

    def position_counts(self, gamma: int) -> tuple[list[int], list[int]]:
        """For positions k = 1..gamma: rounds that verified position k given 1..k-1 were accepted,
        and rounds that accepted it. Their ratio is the conditional acceptance at k."""
        reached = [sum(1 for r in self.rounds if r.verified >= k and r.accepted >= k - 1) for k in range(1, gamma + 1)]
        accepted = [sum(1 for r in self.rounds if r.accepted >= k) for k in range(1, gamma + 1)]
        return reached, accepted
