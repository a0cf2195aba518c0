"""dspark_core: lossless speculative decoding with semi-autoregressive drafters and scheduled verification."""

from .decoding import GenerationResult, RoundRecord, autoregressive_generate, speculative_generate
from .drafters import Draft, DraftContext, Drafter, DraftLMDrafter, NgramDrafter, OracleDrafter
from .policies import FixedLength, VerificationPolicy
from .sampling import SamplingConfig, one_hot, probs_from_logits, sample
from .session import CausalLMSession, StepOutput
from .target import DEFAULT_TARGET, encode_prompt, eos_token_ids, load_target, tokenizer_fingerprint
from .verification import Verdict, residual, verify_chain

__all__ = [
    "DEFAULT_TARGET", "CausalLMSession", "Draft", "DraftContext", "DraftLMDrafter", "Drafter", "FixedLength",
    "GenerationResult", "NgramDrafter", "OracleDrafter", "RoundRecord", "SamplingConfig", "StepOutput",
    "VerificationPolicy", "Verdict", "autoregressive_generate", "encode_prompt", "eos_token_ids", "load_target",
    "one_hot", "probs_from_logits", "residual", "sample", "speculative_generate", "tokenizer_fingerprint",
    "verify_chain",
]
