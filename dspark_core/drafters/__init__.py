"""Layer 3, drafters: all return draft tokens, the exact distributions they were sampled from, and optional confidences."""

from ..core.rounds import Draft, DraftContext, Drafter
from .draft_lm import DraftLMDrafter
from .lookup import NgramDrafter, OracleDrafter

__all__ = ["Draft", "DraftContext", "Drafter", "DraftLMDrafter", "NgramDrafter", "OracleDrafter"]
