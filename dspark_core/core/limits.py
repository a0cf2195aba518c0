"""Limits a request must respect before any forward runs: the target's context window and a
drafter's trained block.

Context window: a model's position embeddings cover ``max_position_embeddings`` tokens (8,192 for
the default target). A generation holds at most ``prompt + max_new_tokens`` tokens, so it must fit;
past the window the target reads positions it was never trained on and its text is garbage.

Block: a trained drafter (eagle, dflash, dspark) drafts at most ``block_size`` tokens a round, the
block it was trained with. A policy that asks for more is an error, never a silent cap: the user
would otherwise believe they measured gamma 40 when they measured gamma 7.
"""

from __future__ import annotations

from transformers import PreTrainedModel

from .rounds import Drafter


def context_window(model: PreTrainedModel) -> int | None:
    """Tokens the target's position embeddings cover (``max_position_embeddings``), None if unknown."""
    return getattr(model.config.get_text_config(), "max_position_embeddings", None)


def context_overflow(model: PreTrainedModel, prompt_tokens: int, max_new_tokens: int) -> str | None:
    """Why ``prompt_tokens + max_new_tokens`` does not fit the target's context window (None when it fits)."""
    window = context_window(model)
    if window is None or prompt_tokens + max_new_tokens <= window:
        return None
    return (f"the prompt ({prompt_tokens} tokens) plus max_new_tokens ({max_new_tokens}) is "
            f"{prompt_tokens + max_new_tokens} tokens, more than the target's context window of {window} tokens "
            "(max_position_embeddings): shorten the prompt or lower max_new_tokens")


def check_context(model: PreTrainedModel, prompt_tokens: int, max_new_tokens: int) -> None:
    """Raise a ValueError stating both numbers and the window when the request does not fit it."""
    reason = context_overflow(model, prompt_tokens, max_new_tokens)
    if reason is not None:
        raise ValueError(reason[0].upper() + reason[1:] + ".")


def check_block(drafter: Drafter | None, gamma: int) -> None:
    """Raise a ValueError when ``gamma`` exceeds the drafter's ``block_size`` (drafters without one,
    such as n-gram lookup or a draft LM, draft any number of tokens)."""
    block = getattr(drafter, "block_size", None)
    if block is not None and gamma > block:
        raise ValueError(f"gamma {gamma} exceeds this drafter's block of {block} tokens: it was trained to draft at "
                         f"most {block} a round. Pass gamma <= {block} (--gamma {block}, FixedLength({block}), "
                         f"'name:{block}' in bench methods), or train a drafter with a longer block "
                         f"(dspark train --block {gamma}).")
