"""Target shapes for timing: random-weight causal LMs built from a config, no weights downloaded.

A forward pass costs the same whatever the weights hold, so the latency of a target (and of a drafter
sized like it) is measured on a model built from its published configuration with random weights.
The shapes below are written here from their published ``config.json`` files; ``tiny`` is a
two-layer toy for tests on a CPU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
)


@dataclass(frozen=True)
class TargetShape:
    """What sets a decoder-only target's cost: ``model_type`` (a transformers architecture), widths,
    depth, vocabulary. ``draft_vocab``: the vocabulary a dspark drafter for this target drafts over
    (its LM head is the target's, restricted to these many tokens)."""

    name: str
    model_type: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rope_theta: float
    rms_norm_eps: float
    tie_word_embeddings: bool
    max_position_embeddings: int
    draft_vocab: int
    source: str

    def config(self) -> PretrainedConfig:
        """A transformers config of this shape (rope given both ways: transformers 5 reads
        ``rope_parameters``, earlier releases ``rope_theta``)."""
        fields = {k: v for k, v in asdict(self).items() if k not in ("name", "model_type", "draft_vocab", "source")}
        return AutoConfig.for_model(self.model_type, **fields,
                                    rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta})

    @property
    def parameters(self) -> int:
        """Parameter count: embeddings (twice when untied), attention, MLP and norms of every layer."""
        d, h = self.hidden_size, self.head_dim
        attention = d * h * (self.num_attention_heads * 2 + self.num_key_value_heads * 2)
        layer = attention + 3 * d * self.intermediate_size + 2 * d + (2 * h if self.model_type == "qwen3" else 0)
        embeddings = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return embeddings + self.num_hidden_layers * layer + d


SHAPES: dict[str, TargetShape] = {
    # The default target (dspark_core.core.target.DEFAULT_TARGET): its config.json as the embedded GGUF
    # converts to (LlamaForCausalLM); the shipped drafters draft over its 8,192 most frequent tokens.
    "smollm2-135m": TargetShape(
        name="smollm2-135m", model_type="llama", hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, head_dim=64, intermediate_size=1536, vocab_size=49152, rope_theta=100000.0,
        rms_norm_eps=1e-5, tie_word_embeddings=True, max_position_embeddings=8192, draft_vocab=8192,
        source="HuggingFaceTB/SmolLM2-135M-Instruct config.json (the default target's own config)",
    ),
    # https://huggingface.co/Qwen/Qwen3-4B/blob/main/config.json (Qwen3ForCausalLM); the paper's drafters share
    # the target's full LM head, so the drafter drafts over all 151,936 tokens.
    "qwen3-4b": TargetShape(
        name="qwen3-4b", model_type="qwen3", hidden_size=2560, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, intermediate_size=9728, vocab_size=151936, rope_theta=1000000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=40960, draft_vocab=151936,
        source="https://huggingface.co/Qwen/Qwen3-4B/blob/main/config.json",
    ),
    # https://huggingface.co/Qwen/Qwen3-8B/blob/main/config.json: wider, untied embeddings.
    "qwen3-8b": TargetShape(
        name="qwen3-8b", model_type="qwen3", hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, intermediate_size=12288, vocab_size=151936, rope_theta=1000000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=False, max_position_embeddings=40960, draft_vocab=151936,
        source="https://huggingface.co/Qwen/Qwen3-8B/blob/main/config.json",
    ),
    # A toy for tests: two Llama layers, a 1,024-token vocabulary.
    "tiny": TargetShape(
        name="tiny", model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, intermediate_size=128, vocab_size=1024, rope_theta=10000.0,
        rms_norm_eps=1e-5, tie_word_embeddings=True, max_position_embeddings=4096, draft_vocab=256,
        source="a two-layer toy for tests",
    ),
}


def get_shape(name: str) -> TargetShape:
    if name not in SHAPES:
        raise ValueError(f"Unknown target shape {name!r}; choose from {', '.join(SHAPES)}.")
    return SHAPES[name]


@torch.no_grad()
def build_random_target(shape: TargetShape, dtype: torch.dtype, device: str | torch.device) -> PreTrainedModel:
    """A causal LM of ``shape`` with random weights (normal, std 0.02), built directly on ``device``
    (an 8B model initialises in seconds on a GPU, minutes on a CPU) and put in eval mode."""
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(shape.config(), dtype=dtype)
    return model.eval()
