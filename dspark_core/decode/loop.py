"""The decoding loop: speculative decoding, and plain decoding as its zero-draft special case.

Invariant between rounds: the target's KV cache holds every committed token except the last one,
the *anchor*. A round drafts after the anchor, runs ONE target forward over
``[anchor, x_1..x_l]`` (giving ``p_1..p_{l+1}``), verifies, commits the emitted tokens and rolls
the cache back to ``committed - 1``. With no drafter the forward is over ``[anchor]`` alone and the
round is exactly one step of ordinary autoregressive decoding, on the same machinery.
"""

from __future__ import annotations

import time

import torch
from transformers import PreTrainedModel

from ..core.limits import check_block, check_context
from ..core.rounds import Draft, DraftContext, Drafter, GenerationResult, RoundRecord
from ..core.sampling import SamplingConfig, probs_from_logits
from ..core.session import CausalLMSession
from ..core.verification import AcceptanceRule, Verdict, verify_chain
from .policies import FixedLength, VerificationPolicy


def verify_round(
    draft: Draft,
    length: int,
    logits: torch.Tensor,
    sampling: SamplingConfig,
    generator: torch.Generator,
    eos_token_ids: tuple[int, ...],
    max_tokens: int,
    rule: AcceptanceRule = "exact",
) -> Verdict:
    """Verify the first ``length`` draft tokens with the target's logits [length + 1, V] of this
    round's forward over ``[anchor, x_1..x_length]``; emits at most ``max_tokens`` tokens."""
    target_probs = probs_from_logits(logits, sampling)
    return verify_chain(draft.tokens[:length], draft.probs[:length].to(target_probs.device), target_probs, generator,
                        eos_token_ids=eos_token_ids, max_tokens=max_tokens, rule=rule)


def commit_round(
    result: GenerationResult, tokens: list[int], draft: Draft, length: int, verdict: Verdict,
    draft_time: float, verify_time: float,
) -> None:
    """Append the emitted tokens to ``tokens`` (prompt + committed) and ``result``, and record the round."""
    tokens += verdict.tokens
    result.tokens += verdict.tokens
    confidences = draft.confidences.tolist() if draft.confidences is not None else None
    result.rounds.append(RoundRecord(len(draft), length, verdict.accepted, len(verdict.tokens), draft_time, verify_time,
                                     confidences))


def speculative_generate(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor | list[int],
    drafter: Drafter | None = None,
    policy: VerificationPolicy | None = None,
    *,
    sampling: SamplingConfig = SamplingConfig(),
    max_new_tokens: int = 128,
    seed: int = 0,
    eos_token_ids: tuple[int, ...] = (),
    rule: AcceptanceRule = "exact",
) -> GenerationResult:
    """Generate up to ``max_new_tokens`` after ``prompt_ids`` (1-D, non-empty).

    ``drafter=None`` (or a policy of length 0) is plain autoregressive decoding. The result is
    seeded: the same arguments give the same tokens. Stops after an EOS token. Raises before any
    forward when prompt + ``max_new_tokens`` exceeds the target's context window, or the policy's
    gamma exceeds a trained drafter's block (see :mod:`dspark_core.core.limits`).
    """
    prompt = torch.as_tensor(prompt_ids).reshape(-1).tolist()
    if not prompt:
        raise ValueError("The prompt is empty: pass at least one token.")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if drafter is not None and policy is None:
        raise ValueError("Pass a verification policy with the drafter, e.g. FixedLength(gamma=5).")
    check_context(model, len(prompt), max_new_tokens)
    policy = policy or FixedLength(0)
    check_block(drafter, policy.max_draft)
    feature_layers = drafter.feature_layers if drafter is not None else ()
    vocab_size = model.get_output_embeddings().weight.shape[0]
    generator = torch.Generator(device=model.device).manual_seed(seed)
    session = CausalLMSession(model, feature_layers)
    if drafter is not None:
        drafter.reset()

    start = time.perf_counter()
    new_features = session.forward(prompt[:-1]).features if len(prompt) > 1 else None
    result = GenerationResult(prompt_len=len(prompt), tokens=[], prefill_time=time.perf_counter() - start)
    tokens = list(prompt)
    while len(result.tokens) < max_new_tokens:
        budget = max_new_tokens - len(result.tokens)
        t0 = time.perf_counter()
        draft = Draft.empty(vocab_size)
        if drafter is not None and policy.max_draft > 0:
            context = DraftContext(tokens, len(prompt), new_features, vocab_size, admit=policy.admit)
            draft = drafter.propose(context, min(policy.max_draft, budget - 1), sampling, generator)
        length = policy.verify_length(draft, budget - 1)
        t1 = time.perf_counter()
        step = session.forward([tokens[-1]] + draft.tokens[:length].tolist())
        verdict = verify_round(draft, length, step.logits, sampling, generator, eos_token_ids, budget, rule)
        session.rollback(len(tokens) + verdict.accepted)
        if step.features is not None:
            new_features = step.features[: verdict.accepted + 1]
        commit_round(result, tokens, draft, length, verdict, t1 - t0, time.perf_counter() - t1)
        if verdict.finished:
            break
    result.total_time = time.perf_counter() - start
    return result


def autoregressive_generate(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor | list[int],
    *,
    sampling: SamplingConfig = SamplingConfig(),
    max_new_tokens: int = 128,
    seed: int = 0,
    eos_token_ids: tuple[int, ...] = (),
) -> GenerationResult:
    """Plain decoding, one target forward per token: the baseline every speedup is measured against."""
    return speculative_generate(
        model, prompt_ids, None, None, sampling=sampling, max_new_tokens=max_new_tokens, seed=seed,
        eos_token_ids=eos_token_ids,
    )
