"""A causal LM with its KV cache: feed tokens, read logits (and chosen hidden states), roll back.

The same class serves the target (verification forwards) and a draft LM. Rolling back is how a
partial acceptance is undone: the cache is cut to the committed length, so the next forward sees
exactly the committed tokens.

Two caches (``kv_cache``): ``"dynamic"`` (transformers' DynamicCache) concatenates every forward's
keys and values onto the cache, copying it whole each time, and a rollback slices it shorter;
``"static"`` (StaticCache) allocates ``max_length`` slots once, writes new keys and values in place,
and a rollback only moves its write position back (attention then reads all slots, the unwritten
ones masked). Which one is faster depends on the machine: ``dspark profile --round-split`` measures both.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel, StaticCache

KV_CACHES = ("dynamic", "static")


@dataclass
class StepOutput:
    """What one forward returns for its ``n`` new tokens.

    logits:   [n, V] float32, row i predicts the token after input i.
    features: [n, m, d] hidden states at the session's ``feature_layers`` (``None`` when none asked).
    """

    logits: torch.Tensor
    features: torch.Tensor | None


class CausalLMSession:
    """One sequence's KV-cached view of ``model``.

    ``feature_layers`` index the model's ``hidden_states`` tuple: 0 is the embedding output, ``i`` the
    output of decoder layer ``i``, and ``-1`` the final (normed) hidden state. ``kv_cache`` is
    ``"dynamic"`` or ``"static"`` (see the module docstring); a static cache holds at most ``max_length`` tokens.
    """

    def __init__(self, model: PreTrainedModel, feature_layers: tuple[int, ...] = (), kv_cache: str = "dynamic",
                 max_length: int | None = None):
        if kv_cache not in KV_CACHES:
            raise ValueError(f"kv_cache must be one of {KV_CACHES}, got {kv_cache!r}")
        if kv_cache == "static" and not max_length:
            raise ValueError("A static KV cache needs max_length, the most tokens the sequence will hold.")
        self.model = model
        self.feature_layers = tuple(feature_layers)
        self.max_length = max_length if kv_cache == "static" else None
        self.cache = (StaticCache(config=model.config, max_cache_len=max_length) if kv_cache == "static"
                      else DynamicCache(config=model.config))

    @property
    def length(self) -> int:
        """Number of tokens whose keys and values are cached."""
        return int(self.cache.get_seq_length())

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor | list[int]) -> StepOutput:
        """Append ``tokens`` (1-D, n >= 1) to the sequence and return their logits and features."""
        ids = torch.as_tensor(tokens, dtype=torch.long, device=self.model.device).reshape(1, -1)
        if self.max_length is not None and self.length + ids.shape[1] > self.max_length:
            raise ValueError(f"The static KV cache holds {self.max_length} tokens; {self.length} are cached and "
                             f"{ids.shape[1]} more were fed. Create the session with a larger max_length.")
        out = self.model(
            input_ids=ids,
            cache=self.cache,
            use_cache=True,
            output_hidden_states=bool(self.feature_layers),
        )
        features = None
        if self.feature_layers:
            features = torch.stack([out.hidden_states[i][0] for i in self.feature_layers], dim=1).float()
        return StepOutput(logits=out.logits[0].float(), features=features)

    def rollback(self, length: int) -> None:
        """Cut the cache back to its first ``length`` tokens (a no-op when it is not longer)."""
        if length < 0:
            raise ValueError(f"rollback length must be >= 0, got {length}")
        extra = self.length - length
        if extra > 0:
            self.cache.crop(-extra)
