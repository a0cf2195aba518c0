"""One training experiment's settings (saved into ``train_meta.json``)."""

from __future__ import annotations

from dataclasses import dataclass

from ..models.losses import RECIPES

LOSSES = tuple(RECIPES)
CE_LABELS = ("text", "argmax")


@dataclass
class TrainConfig:
    """``drafter`` is eagle / dflash / dspark (on the feature store) or draft-lm (an independent small
    causal LM of ``layers`` layers and width ``lm_width``).

    loss: ``dspark`` (0.1 CE + 0.9 TV + 1.0 BCE, position weights exp(-(k-1)/g)), ``dspark-kl`` (ours:
    DSpark's plus 1.0 soft CE against the target's distribution, same weights), ``ce`` (DFlash's: CE,
    + BCE for dspark, same weights) or ``eagle3`` (EAGLE-3's: soft CE against the target's
    distribution, step weights 0.8^(k-1)); the draft LM always uses CE.
    position_decay: the loss's position weights are exp(-(k-1)/position_decay); 0 takes the block size
    g, as the paper writes them (DeepSpec's code uses 4 at block 7). Not for ``eagle3`` (0.8^(k-1)) or
    the draft LM.
    ce_label: the CE term's label, ``text`` (the next token of the training text) or ``argmax`` (the
    target's most likely next token; on fixed text it differs from the text).
    init_from_target: start each draft layer from the target's top layers (the last ``layers``
    decoder layers) instead of random weights.
    init_drafter: a trained drafter's folder to start from (a warm start: its weights and draft
    vocabulary; its architecture must equal this config's). The schedule starts over.
    anchor_feature: (ours; dflash, dspark) the block's inputs also get the fused target feature of the
    token before the anchor (:class:`..models.DrafterConfig`).
    shift_anchors: (eagle, dflash, dspark) shift each sequence's block tiling by a seeded offset in
    0..g-1 at every step, so that later epochs train on other blocks (other anchors, each token at
    another block position) instead of repeating the first epoch's; off, every epoch repeats one tiling.
    distill_repeats: how many times an epoch visits each self-distilled answer (source ``distill:*``;
    fixed text and every other source once): the target's own answers teach more per token than fixed
    text, so a mix can weight them up without dropping the fixed text.
    epochs: passes over the training split; a step takes sequences until ``tokens_per_step`` span
    tokens are in it, and every span token is a block target once per epoch. ``steps`` > 0 overrides
    the count (quick runs). bf16: autocast the drafter's forward and backward to bfloat16.
    """

    drafter: str = "dspark"
    head: str = "markov"
    layers: int = 1
    block: int = 7
    feature_layers: tuple[int, ...] = (2, 15, 28)
    draft_vocab: int = 8192
    rank: int = 256
    loss: str = "dspark"
    position_decay: float = 0.0
    ce_label: str = "text"
    init_from_target: bool = False
    init_drafter: str = ""
    anchor_feature: bool = False
    shift_anchors: bool = False
    distill_repeats: int = 1
    epochs: float = 1.0
    steps: int = 0
    tokens_per_step: int = 4096
    max_blocks: int = 256
    lr: float = 6e-4
    warmup: int = 50
    val_fraction: float = 0.02
    log_every: int = 20
    save_every: int = 200
    seed: int = 0
    lm_width: int = 256
    bf16: bool = False
    save_dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {self.loss!r}")
        if self.ce_label not in CE_LABELS:
            raise ValueError(f"ce_label must be one of {CE_LABELS}, got {self.ce_label!r}")
        if self.drafter not in ("eagle", "dflash", "dspark", "draft-lm"):
            raise ValueError(f"drafter must be eagle, dflash, dspark or draft-lm, got {self.drafter!r}")
        if self.drafter != "dspark":
            self.head = "none"
        for name in ("layers", "block", "tokens_per_step", "max_blocks", "draft_vocab", "distill_repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.steps < 0 or self.epochs <= 0:
            raise ValueError(f"epochs must be > 0 and steps >= 0 (0: from epochs), got {self.epochs}, {self.steps}")
        if self.position_decay < 0:
            raise ValueError(f"position_decay must be > 0 (or 0: the block size), got {self.position_decay}")
        if self.position_decay and (self.loss == "eagle3" or self.drafter == "draft-lm"):
            raise ValueError("position_decay sets the exp(-(k-1)/decay) weights of the dspark, dspark-kl and ce losses; "
                             "eagle3 weighs steps by 0.8^(k-1) and the draft LM trains every position alike")
        if self.shift_anchors and self.drafter == "draft-lm":
            raise ValueError("shift_anchors applies to eagle, dflash and dspark; the draft LM trains on every position")
        if self.init_drafter and (self.init_from_target or self.drafter == "draft-lm"):
            raise ValueError("init_drafter starts an eagle, dflash or dspark drafter from a trained one; "
                             "it excludes init_from_target and the draft LM")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {self.val_fraction}")
