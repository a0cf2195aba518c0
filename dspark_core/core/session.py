"""A causal LM with its KV cache: feed tokens, read logits (and chosen hidden states), roll back.

The same class serves the target (verification forwards) and a draft LM. Rolling back is how a
partial acceptance is undone: the cache is cut to the committed length, so the next forward sees
exactly the committed tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel


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
    output of decoder layer ``i``, and ``-1`` the final (normed) hidden state.
    """

    def __init__(self, model: PreTrainedModel, feature_layers: tuple[int, ...] = ()):
        self.model = model
        self.feature_layers = tuple(feature_layers)
        self.cache = DynamicCache(config=model.config)

    @property
    def length(self) -> int:
        """Number of tokens whose keys and values are cached."""
        return self.cache.get_seq_length()

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor | list[int]) -> StepOutput:
        """Append ``tokens`` (1-D, n >= 1) to the sequence and return their logits and features."""
        ids = torch.as_tensor(tokens, dtype=torch.long, device=self.model.device).reshape(1, -1)
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
