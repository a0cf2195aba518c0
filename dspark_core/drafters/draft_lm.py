"""The classic two-model scheme: a small causal LM with the target's tokenizer drafts autoregressively."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from ..core.checksums import verify_checksums
from ..core.fp8 import load_weights
from ..core.rounds import Draft, DraftContext
from ..core.sampling import SamplingConfig, probs_from_logits, sample
from ..core.session import CausalLMSession
from ..core.target import load_target, tokenizer_fingerprint


def load_draft_lm(
    name_or_path: str, target_tokenizer: PreTrainedTokenizerBase, device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A draft LM in ``dtype`` and its tokenizer: a hub id or folder with its own tokenizer, or a folder
    written by ``dspark train --drafter draft-lm``, which stores no tokenizer but records the fingerprint
    of the target's (it must match ``target_tokenizer``, whose files then serve). A folder's
    ``checksums.sha256``, when present, is checked first."""
    folder = Path(name_or_path)
    if folder.is_dir():
        verify_checksums(folder)
    if not folder.is_dir() or (folder / "tokenizer_config.json").is_file():
        return load_target(name_or_path, dtype=dtype, device=device)
    recorded = getattr(AutoConfig.from_pretrained(folder), "tokenizer_fingerprint", None)
    if recorded is None:
        raise ValueError(f"The draft LM at {folder} has no tokenizer files and records no tokenizer fingerprint; "
                         "add its tokenizer to the folder or re-train it with `dspark train --drafter draft-lm`.")
    if recorded != tokenizer_fingerprint(target_tokenizer):
        raise ValueError(f"The draft LM at {folder} was trained with another tokenizer (fingerprint {recorded}, the "
                         f"target's is {tokenizer_fingerprint(target_tokenizer)}); train one for this target.")
    config = AutoConfig.from_pretrained(folder)
    lm = load_weights(AutoModelForCausalLM.from_config(config, dtype=torch.float32), folder)
    if (folder / "generation_config.json").is_file():
        lm.generation_config = GenerationConfig.from_pretrained(folder)
    return lm.to(device, dtype).eval(), target_tokenizer


class DraftLMDrafter:
    """Samples ``g`` tokens from a draft LM, one forward per token, reusing its KV cache across rounds.

    The draft LM must share the target's tokenizer (checked by fingerprint). Its logits are cut or
    padded to the target's vocabulary *before* sampling, so ``q`` is exactly what was sampled from.
    """

    feature_layers: tuple[int, ...] = ()

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        target_tokenizer: PreTrainedTokenizerBase,
    ):
        mine, theirs = tokenizer_fingerprint(tokenizer), tokenizer_fingerprint(target_tokenizer)
        if mine != theirs:
            raise ValueError(
                f"The draft LM's tokenizer (fingerprint {mine}) differs from the target's ({theirs}): its token ids "
                "would mean different text. Use a draft model trained with the target's tokenizer."
            )
        self.model = model.eval()
        self.session = CausalLMSession(model)
        self.cached: list[int] = []  # the tokens whose keys/values the session holds

    def reset(self) -> None:
        self.session = CausalLMSession(self.model)
        self.cached = []

    def _fit_vocab(self, logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
        width = logits.shape[-1]
        if width >= vocab_size:
            return logits[..., :vocab_size]
        return torch.nn.functional.pad(logits, (0, vocab_size - width), value=float("-inf"))

    def propose(
        self, context: DraftContext, gamma: int, sampling: SamplingConfig, generator: torch.Generator | None
    ) -> Draft:
        if gamma < 1:
            return Draft.empty(context.vocab_size)
        tokens = context.tokens
        common = 0
        limit = min(len(self.cached), len(tokens) - 1)  # the anchor is always fed, so the last logits are fresh
        while common < limit and self.cached[common] == tokens[common]:
            common += 1
        self.session.rollback(common)
        logits = self.session.forward(tokens[common:]).logits[-1]
        drafted, rows = [], []
        for k in range(gamma):
            probs = probs_from_logits(self._fit_vocab(logits, context.vocab_size), sampling)
            token = int(probs.argmax()) if sampling.greedy else int(sample(probs, generator))  # greedy q is one-hot
            drafted.append(token)
            rows.append(probs)
            if k + 1 < gamma:
                logits = self.session.forward([token]).logits[-1]
        self.cached = tokens + drafted[:-1]
        return Draft(tokens=torch.tensor(drafted, dtype=torch.long), probs=torch.stack(rows))
