"""Configuration of the trained drafters (saved as ``config.json`` next to ``model.safetensors``)."""

from __future__ import annotations

from transformers import PretrainedConfig

KINDS = ("eagle", "dflash", "dspark")
HEADS = ("none", "markov", "rnn")


class DrafterConfig(PretrainedConfig):
    """Configuration of a trained draft model (eagle / dflash / dspark) conditioned on a frozen target.

    kind:  ``eagle`` (autoregressive head on fused target features), ``dflash`` (parallel backbone
           only) or ``dspark`` (backbone + sequential head + confidence head).
    head:  ``none`` (eagle, dflash), ``markov`` (low-rank first-order transition, paper eq. 5) or ``rnn`` (eq. 6).
    block_size: gamma, tokens drafted per round (anchor + gamma - 1 mask tokens give gamma logits).
    feature_layers: indices into the target's ``hidden_states`` tuple whose states are fused (eq. 2).
    draft_vocab_size: size of the reduced draft vocabulary (most frequent target tokens); its target
        ids are a buffer of the model. Tokens outside it get q = 0.
    rank: r, width of the Markov embedding W1 and of the RNN state.
    anchor_feature: (ours, parallel drafters only) every block input also gets ``W_a h_{a-1}``, the fused
        target feature of the token before the anchor, as Eagle's input pairs it with the anchor, instead
        of reaching it only through attention to the context.
    target_*: what the drafter was trained for; loading it onto another target fails with a clear error.
    """

    model_type = "dspark_drafter"

    def __init__(
        self,
        kind: str = "dspark",
        head: str = "markov",
        block_size: int = 7,
        num_layers: int = 1,
        hidden_size: int = 576,
        num_heads: int = 9,
        num_kv_heads: int = 3,
        head_dim: int = 64,
        intermediate_size: int = 1536,
        rms_norm_eps: float = 1e-5,
        rope_theta: float = 100000.0,
        feature_layers: tuple[int, ...] = (2, 15, 28),
        draft_vocab_size: int = 8192,
        rank: int = 256,
        target_hidden_size: int = 576,
        target_vocab_size: int = 49152,
        target_fingerprint: str = "",
        tokenizer_fingerprint: str = "",
        anchor_feature: bool = False,
        **kwargs,
    ):
        if kind not in KINDS:
            raise ValueError(f"Unknown drafter kind {kind!r}; choose one of {KINDS}.")
        if head not in HEADS or (kind == "dspark") == (head == "none"):
            raise ValueError(f"kind {kind!r} needs head 'none' (eagle, dflash) or 'markov'/'rnn' (dspark), got {head!r}.")
        if block_size < 1 or num_layers < 1 or draft_vocab_size < 2 or rank < 1:
            raise ValueError("block_size, num_layers, rank must be >= 1 and draft_vocab_size >= 2.")
        self.kind, self.head, self.block_size, self.num_layers = kind, head, block_size, num_layers
        self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim = hidden_size, num_heads, num_kv_heads, head_dim
        self.intermediate_size, self.rms_norm_eps, self.rope_theta = intermediate_size, rms_norm_eps, rope_theta
        self.feature_layers = list(feature_layers)
        self.draft_vocab_size, self.rank = draft_vocab_size, rank
        self.target_hidden_size, self.target_vocab_size = target_hidden_size, target_vocab_size
        self.target_fingerprint, self.tokenizer_fingerprint = target_fingerprint, tokenizer_fingerprint
        if anchor_feature and kind == "eagle":
            raise ValueError("anchor_feature is for parallel drafters (dflash, dspark): eagle's input already pairs them.")
        self.anchor_feature = anchor_feature
        super().__init__(**kwargs)
