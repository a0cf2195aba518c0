"""The decoding loop: speculative decoding, and plain decoding as its zero-draft special case.

Invariant between rounds: the target's KV cache holds every committed token except the last one,
the *anchor*. A round drafts after the anchor, runs ONE target forward over
``[anchor, x_1..x_l]`` (giving ``p_1..p_{l+1}``), verifies, commits the emitted tokens and rolls
the cache back to ``committed - 1``. With no drafter the forward is over ``[anchor]`` alone and the
round is exactly one step of ordinary autoregressive decoding, on the same machinery.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from transformers import PreTrainedModel

from ..core.limits import check_block, check_context
from ..core.rounds import (
    ROUND_PARTS,
    Draft,
    DraftContext,
    Drafter,
    GenerationResult,
    RoundRecord,
)
from ..core.sampling import SamplingConfig, probs_from_logits
from ..core.session import CausalLMSession
from ..core.verification import Verdict, verify_chain, verify_greedy
from .policies import FixedLength, VerificationPolicy


class Stopwatch:
    """Splits wall-clock time into named parts: ``lap(name)`` charges the time since the previous lap
    (or since the stopwatch started) to ``name``, so the parts tile the time without gaps."""

    def __init__(self) -> None:
        self.last = time.perf_counter()
        self.parts: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.parts[name] = self.parts.get(name, 0.0) + now - self.last
        self.last = now

    def take(self) -> dict[str, float]:
        """The parts timed since the last ``take``, and start afresh (the clock keeps running)."""
        parts, self.parts = self.parts, {}
        return parts


def _no_lap(name: str) -> None:
    return None


def verify_round(
    draft: Draft,
    length: int,
    logits: torch.Tensor,
    sampling: SamplingConfig,
    generator: torch.Generator,
    eos_token_ids: tuple[int, ...],
    max_tokens: int,
    lap: Callable[[str], None] = _no_lap,
) -> Verdict:
    """Verify the first ``length`` draft tokens with the target's logits [length + 1, V] of this
    round's forward over ``[anchor, x_1..x_length]``; emits at most ``max_tokens`` tokens.

    Greedy reads only the target's argmax ids (:func:`verify_greedy`, no
    one-hot rows over the vocabulary); otherwise the processed probabilities go to :func:`verify_chain`.
    ``lap`` is called with ``"probs"`` after the target side and ``"accept"`` after the acceptance walk."""
    tokens, probs = draft.tokens[:length], draft.probs[:length]
    if sampling.greedy:
        target_tokens = logits.argmax(dim=-1).cpu()
        lap("probs")
        verdict = verify_greedy(tokens, probs, target_tokens, eos_token_ids=eos_token_ids, max_tokens=max_tokens)
    else:
        target_probs = probs_from_logits(logits, sampling)
        lap("probs")
        verdict = verify_chain(tokens, probs.to(target_probs.device), target_probs, generator,
                               eos_token_ids=eos_token_ids, max_tokens=max_tokens)
    lap("accept")
    return verdict


def commit_round(
    result: GenerationResult, tokens: list[int], draft: Draft, length: int, verdict: Verdict, parts: dict[str, float],
) -> None:
    """Append the emitted tokens to ``tokens`` (prompt + committed) and ``result``, and record the
    round with the seconds of its parts (``parts``: a :class:`Stopwatch`'s, keyed by ``ROUND_PARTS``)."""
    tokens += verdict.tokens
    result.tokens += verdict.tokens
    confidences = draft.confidences.tolist() if draft.confidences is not None else None
    seconds = {part: parts.get(part, 0.0) for part in ROUND_PARTS}
    verify_time = seconds["forward"] + seconds["probs"] + seconds["accept"] + seconds["cache"]
    result.rounds.append(RoundRecord(
        proposed=len(draft), verified=length, accepted=verdict.accepted, emitted=len(verdict.tokens),
        confidences=confidences, draft_time=seconds["draft"], verify_time=verify_time,
        forward_time=seconds["forward"], probs_time=seconds["probs"], accept_time=seconds["accept"],
        cache_time=seconds["cache"], other_time=seconds["other"]))


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
    kv_cache: str = "dynamic",
) -> GenerationResult:
    """Generate up to ``max_new_tokens`` after ``prompt_ids`` (1-D, non-empty).

    ``drafter=None`` (or a policy of length 0) is plain autoregressive decoding. The result is
    seeded: the same arguments give the same tokens. Stops after an EOS token. Raises before any
    forward when prompt + ``max_new_tokens`` exceeds the target's context window, or the policy's
    gamma exceeds a trained drafter's block (see :mod:`dspark_core.core.limits`). ``kv_cache``:
    ``"dynamic"`` or ``"static"`` (pre-allocated for the whole generation), see
    :class:`~dspark_core.core.session.CausalLMSession`. Each round records the seconds of its parts.
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
    check_block(drafter, policy.gamma)
    feature_layers = drafter.feature_layers if drafter is not None else ()
    vocab_size = model.get_output_embeddings().weight.shape[0]
    generator = torch.Generator(device=model.device).manual_seed(seed)
    session = CausalLMSession(model, feature_layers, kv_cache, max_length=len(prompt) + max_new_tokens)
    if drafter is not None:
        drafter.reset()

    start = time.perf_counter()
    new_features = session.forward(prompt[:-1]).features if len(prompt) > 1 else None
    result = GenerationResult(prompt_len=len(prompt), tokens=[], prefill_time=time.perf_counter() - start)
    tokens = list(prompt)
    watch = Stopwatch()
    while len(result.tokens) < max_new_tokens:
        watch.lap("other")
        budget = max_new_tokens - len(result.tokens)
        draft = Draft.empty(vocab_size)
        if drafter is not None and policy.gamma > 0:
            context = DraftContext(tokens, len(prompt), new_features, vocab_size, admit=policy.admit)
            draft = drafter.propose(context, min(policy.gamma, budget - 1), sampling, generator)
        length = policy.verify_length(draft, budget - 1)
        watch.lap("draft")
        step = session.forward([tokens[-1]] + draft.tokens[:length].tolist())
        watch.lap("forward")
        verdict = verify_round(draft, length, step.logits, sampling, generator, eos_token_ids, budget, watch.lap)
        session.rollback(len(tokens) + verdict.accepted)
        if step.features is not None:
            new_features = step.features[: verdict.accepted + 1]
        watch.lap("cache")
        commit_round(result, tokens, draft, length, verdict, watch.take())
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
