"""dspark_core: lossless speculative decoding with semi-autoregressive drafters and scheduled verification."""

from .core.rounds import GenerationResult, RoundRecord
from .core.sampling import SamplingConfig, one_hot, probs_from_logits, sample
from .core.session import CausalLMSession, StepOutput
from .core.target import (
    DEFAULT_TARGET,
    encode_prompt,
    eos_token_ids,
    load_target,
    tokenizer_fingerprint,
)
from .core.verification import Verdict, residual, verify_chain
from .decode.loop import autoregressive_generate, speculative_generate
from .decode.policies import FixedLength, VerificationPolicy
from .drafters import (
    Draft,
    DraftContext,
    Drafter,
    DraftLMDrafter,
    NgramDrafter,
    OracleDrafter,
)

__all__ = [
    "DEFAULT_TARGET", "CausalLMSession", "Draft", "DraftContext", "DraftLMDrafter", "Drafter", "FixedLength",
    "GenerationResult", "NgramDrafter", "OracleDrafter", "RoundRecord", "SamplingConfig", "StepOutput",
    "VerificationPolicy", "Verdict", "autoregressive_generate", "encode_prompt", "eos_token_ids", "load_target",
    "one_hot", "probs_from_logits", "residual", "sample", "speculative_generate", "tokenizer_fingerprint",
    "verify_chain",
]
