"""Small models for tests: a tiny random-weight Llama target with a word-level tokenizer (fast
enough to decode thousands of tokens, on the same code paths as a real target: KV cache, RoPE,
masks), and untrained drafters of every kind shaped for any target."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from dspark_core.core.target import target_fingerprint, tokenizer_fingerprint
from dspark_core.models import (
    DrafterConfig,
    EagleDraftModel,
    ParallelDraftModel,
    TargetBoundDraftModel,
)


def tiny_target(vocab: int = 16, window: int = 64, seed: int = 1, lm_head_scale: float = 6.0,
                dtype: torch.dtype = torch.float32):
    """(model, tokenizer): 2 layers, width 32, ``vocab`` tokens ``t0..``, a context window of ``window``.
    ``lm_head_scale`` sharpens the random next-token distributions."""
    torch.manual_seed(seed)
    words = {f"t{i}": i for i in range(vocab)}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(words, unk_token="t0")))
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=window,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(lm_head_scale)
    return model.to(dtype), tokenizer


HEADS = {"eagle": "none", "dflash": "none", "dspark-markov": "markov", "dspark-rnn": "rnn"}
VARIANTS = {**{name: {} for name in HEADS}, "dspark-markov+anchor": {"anchor_feature": True}}  # name -> config overrides


def drafter_for(model, tokenizer, name: str, **overrides) -> TargetBoundDraftModel:
    """An untrained drafter ``name`` (a key of VARIANTS) shaped for ``model``: block 5, 1024 draft tokens,
    seeded; ``overrides`` replace any DrafterConfig field."""
    torch.manual_seed(0)
    cfg = model.config
    base = name.split("+")[0]
    settings = dict(
        kind=base.split("-")[0], head=HEADS[base], **VARIANTS[name], block_size=5, draft_vocab_size=1024,
        hidden_size=cfg.hidden_size, target_hidden_size=cfg.hidden_size, num_heads=cfg.num_attention_heads,
        num_kv_heads=cfg.num_key_value_heads, head_dim=cfg.hidden_size // cfg.num_attention_heads,
        intermediate_size=2 * cfg.hidden_size, target_vocab_size=cfg.vocab_size, rank=16,
        feature_layers=(1, cfg.num_hidden_layers // 2, cfg.num_hidden_layers),
        tokenizer_fingerprint=tokenizer_fingerprint(tokenizer), target_fingerprint=target_fingerprint(model, tokenizer),
    )
    settings.update(overrides)
    drafter = (EagleDraftModel if name == "eagle" else ParallelDraftModel)(DrafterConfig(**settings))
    if drafter.config.kind == "dspark":
        torch.nn.init.normal_(drafter.w2.weight, std=0.5)  # make the sequential head matter
    if drafter.config.anchor_feature:
        torch.nn.init.normal_(drafter.anchor_proj.weight, std=0.5)  # and the anchor feature
    return drafter
