"""Build a drafter by name, for the CLI and the benchmark scripts."""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from ..target import load_target
from .base import Drafter
from .draft_lm import DraftLMDrafter
from .lookup import NgramDrafter, OracleDrafter

DRAFTER_NAMES = ("none", "ngram", "draft-lm", "oracle")


def build_drafter(
    name: str,
    target_tokenizer: PreTrainedTokenizerBase,
    *,
    draft_model: str | None = None,
    reference: Sequence[int] | None = None,
    device: str = "cpu",
) -> Drafter | None:
    """A drafter by name (``None`` for ``"none"``, plain decoding).

    draft-lm needs ``draft_model`` (a Hugging Face id or folder with the target's tokenizer);
    oracle needs ``reference``, the continuation it will propose.
    """
    if name == "none":
        return None
    if name == "ngram":
        return NgramDrafter()
    if name == "oracle":
        if reference is None:
            raise ValueError("The oracle drafter needs a reference continuation (e.g. the target's greedy output).")
        return OracleDrafter(reference)
    if name == "draft-lm":
        if not draft_model:
            raise ValueError("The draft-lm drafter needs a draft model: pass --draft-model <hub id or folder>.")
        model, tokenizer = load_target(draft_model, device=device)
        return DraftLMDrafter(model, tokenizer, target_tokenizer)
    raise ValueError(f"Unknown drafter {name!r}; choose one of {', '.join(DRAFTER_NAMES)}.")
