"""An engine soak: hundreds of requests with random prompt lengths, ``max_new_tokens`` and join
times through the batched engine, under fixed lengths (n-gram drafter) and under the hardware-aware
scheduler (an untrained dspark drafter, a cost profile that skips drafting under load).

After every round: each live request's cache row holds exactly its committed tokens, and the shared
cache holds no more slots than the engine's compaction bound allows for the live requests
(``S <= max(COMPACT_MIN_SLOTS, COMPACT_SLACK * longest live request)``). At the end: every request
finished exactly once, and every greedy output equals plain decoding of that request alone.

The target is a tiny random-weight Llama in float64 (no argmax near-ties between batched and single
forwards). The quick version (200 requests, about a minute) runs with the suite; ``make soak``
(``DSPARK_SOAK=long``) runs 2,000 longer requests. Each run prints its figures: requests, tokens,
rounds, peak cache and process memory, divergences.
"""

from __future__ import annotations

import os
import random
import resource
from dataclasses import dataclass

import pytest
import torch

from dspark_core import FixedLength, NgramDrafter, autoregressive_generate
from dspark_core.decode.engine import (
    COMPACT_MIN_SLOTS,
    COMPACT_SLACK,
    BatchedEngine,
    BatchedKV,
)
from dspark_core.decode.policies import HardwareAware
from dspark_core.drafters.trained import BlockDrafter

from .tiny import drafter_for, tiny_target

pytestmark = pytest.mark.slow  # 200 engine requests (about a minute)

LONG = os.environ.get("DSPARK_SOAK") == "long"
REQUESTS, MAX_PROMPT, MAX_NEW, MAX_BATCH = (2000, 160, 96, 16) if LONG else (200, 48, 32, 8)
VOCAB = 24
EOS = (VOCAB - 1,)  # emitted now and then by the random target: some requests end early
GAMMA = 4


@dataclass(frozen=True)
class Job:
    prompt: list[int]
    max_new_tokens: int
    join: int  # the engine round at which it is submitted


@pytest.fixture(scope="module")
def tiny():
    return tiny_target(vocab=VOCAB, window=MAX_PROMPT + MAX_NEW, seed=3, lm_head_scale=3.0, dtype=torch.float64)


@pytest.fixture(scope="module")
def jobs() -> list[Job]:
    """Random lengths; arrivals over about 1.5 rounds per request, so the batch fills, queues and drains."""
    rng = random.Random(0)
    return sorted((Job([rng.randrange(VOCAB - 1) for _ in range(rng.randint(2, MAX_PROMPT))], rng.randint(1, MAX_NEW),
                       rng.randrange(int(1.5 * REQUESTS))) for _ in range(REQUESTS)), key=lambda j: j.join)


@pytest.fixture(scope="module")
def plain(tiny, jobs) -> list[list[int]]:
    model, _ = tiny
    return [autoregressive_generate(model, j.prompt, max_new_tokens=j.max_new_tokens, eos_token_ids=EOS).tokens
            for j in jobs]


def kv_bytes(kv: BatchedKV) -> int:
    return sum(t.numel() * t.element_size() for layer in kv._layers() for t in (layer.keys, layer.values))


def check_cache(engine: BatchedEngine) -> None:
    """Each live row holds its committed tokens (anchor excluded); the slots stay within the compaction bound."""
    kv = engine.kv
    assert kv.valid.shape[0] == len(engine.active)
    for row, request in enumerate(engine.active):
        assert int(kv.valid[row].sum()) == len(request.tokens) - 1, f"request {request.id}: its cache row is wrong"
    need = max((len(r.tokens) - 1 for r in engine.active), default=0)
    assert kv.slots <= max(COMPACT_MIN_SLOTS, COMPACT_SLACK * need), (
        f"the cache holds {kv.slots} slots for live requests needing at most {need}")
    assert all(layer.keys.shape[:3:2] == (len(engine.active), kv.slots) for layer in kv._layers())


def soak(model, jobs: list[Job], policy, make_drafter) -> tuple[BatchedEngine, dict]:
    """Submit each job at its join round (so request i is ``jobs[i]``), step until all are done,
    checking the cache every round; returns the engine and the peak rows, slots and cache bytes."""
    engine = BatchedEngine(model, policy, make_drafter, eos_token_ids=EOS, max_batch=MAX_BATCH)
    pending, finished_order = list(jobs), []
    peak = dict(rows=0, slots=0, kv_bytes=0)
    now = 0
    while pending or engine.waiting or engine.active:
        if not (engine.waiting or engine.active):
            now = max(now, pending[0].join)  # idle: the next arrival
        while pending and pending[0].join <= now:
            job = pending.pop(0)
            engine.submit(job.prompt, job.max_new_tokens)
        done_before = len(engine.finished)
        engine.step()
        finished_order += [r.id for r in engine.finished[done_before:]]
        check_cache(engine)
        rows = len(engine.active) + len(engine.finished) - done_before  # the rows of this round's forward
        peak = dict(rows=max(peak["rows"], rows), slots=max(peak["slots"], engine.kv.slots),
                    kv_bytes=max(peak["kv_bytes"], kv_bytes(engine.kv)))
        now += 1
    assert sorted(finished_order) == list(range(len(jobs)))  # every request finished, exactly once
    assert all(r.finished and r.prompt == jobs[r.id].prompt for r in engine.finished)
    return engine, peak


def report(name: str, engine: BatchedEngine, peak: dict, divergences: int) -> None:
    tokens = sum(len(r.result.tokens) for r in engine.finished)
    print(f"\nsoak {name}: {len(engine.finished)} requests, {tokens} tokens in {engine.rounds} rounds, "
          f"peak {peak['rows']} rows x {peak['slots']} slots = {peak['kv_bytes'] / 2**10:.0f} KiB of KV cache, "
          f"process peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10:.0f} MiB, "
          f"divergences from plain decoding: {divergences}")


def knee(tokens: int, requests: int) -> float:
    """A cost profile with a knee at 6 tokens: with 6 or more requests no draft token pays for its slot."""
    return 1.0 / max(1.0, tokens / 6)


@pytest.mark.parametrize("name", ["fixed-ngram", "hardware-dspark"])
def test_soak_greedy_outputs_equal_plain_decoding(tiny, jobs, plain, name):
    model, tokenizer = tiny
    if name == "fixed-ngram":
        policy, make_drafter = FixedLength(GAMMA), NgramDrafter
    else:
        drafter = drafter_for(model, tokenizer, "dspark-markov", draft_vocab_size=VOCAB - 4, rank=8, block_size=GAMMA,
                              tokenizer_fingerprint="", target_fingerprint="").double()
        policy, make_drafter = HardwareAware(GAMMA, knee), lambda: BlockDrafter(drafter, model, tokenizer)
    engine, peak = soak(model, jobs, policy, make_drafter)
    outputs = {r.id: r.result.tokens for r in engine.finished}
    divergences = sum(outputs[i] != plain[i] for i in range(len(jobs)))
    report(name, engine, peak, divergences)
    assert divergences == 0
    assert peak["rows"] == MAX_BATCH and engine.rounds < sum(len(p) for p in plain)  # full batches, shared rounds
    assert peak["slots"] > COMPACT_MIN_SLOTS  # the cache grew past the floor, so the compaction bound was binding
    rounds = [r for request in engine.finished for r in request.result.rounds]
    assert any(r.accepted > 0 for r in rounds)
    if name == "hardware-dspark":
        assert any(r.proposed == 0 for r in rounds) and len(set(engine.budgets)) > 2  # skipped and varied


def test_the_cache_check_catches_an_engine_that_never_compacts(tiny, jobs, monkeypatch):
    """Negative control: without compaction the cache outgrows the live requests and check_cache fails."""
    model, _ = tiny
    monkeypatch.setattr(BatchedKV, "compact", lambda self: None)
    with pytest.raises(AssertionError, match="the cache holds"):
        soak(model, jobs[:80], FixedLength(GAMMA), NgramDrafter)
