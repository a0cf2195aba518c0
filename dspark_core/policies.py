"""Verification-length policies: how many of the drafted tokens the target verifies this round.

A policy decides from draft-side information only (the draft and its confidences), never from the
target's verdict, which keeps verification lossless. The decoding loop asks the drafter for
``policy.max_draft`` tokens and verifies ``policy.verify_length(draft, budget)`` of them.
"""

from __future__ import annotations

from typing import Protocol

from .drafters.base import Draft


class VerificationPolicy(Protocol):
    max_draft: int

    def verify_length(self, draft: Draft, budget: int) -> int:
        """Number of leading draft tokens to verify, at most ``min(len(draft), budget)``."""
        ...


class FixedLength:
    """Draft ``gamma`` tokens and verify all of them (up to the remaining token budget)."""

    def __init__(self, gamma: int):
        if gamma < 0:
            raise ValueError(f"gamma must be >= 0, got {gamma}")
        self.max_draft = gamma

    def verify_length(self, draft: Draft, budget: int) -> int:
        return max(0, min(len(draft), self.max_draft, budget))
