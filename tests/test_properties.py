"""Property tests (hypothesis) over random small cases, as vLLM tests its rejection sampler.

- the exact law of a verification round, derived from the verifier's own acceptance probability and
  rejection distribution, equals the target's joint to 1e-6 for random target and draft tables with
  zeros, ties, one-hot drafts and random temperature / top-k / top-p, anchored at either vocabulary edge;
- ``verify_chain`` itself walks that law: its acceptances are exactly ``u_k < min(1, p/q)`` on its
  own uniforms, the token after them has mass under the residual or bonus distribution, and EOS and
  the length limit cut where they should, for draft tokens anywhere (edges and q = 0 included);
- the reduced draft vocabulary maps target ids to draft indices and back at every id, edges
  included, and a drafted token's q lives on it and sums to 1;
- every policy verifies a prefix of the block within gamma and the budget, the prefix its stop rule
  admits, and never looks past the position it stops at (non-anticipating).

Cases are derandomised (the same examples every run) and kept to a few seconds per test.
"""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_core import SamplingConfig, probs_from_logits, verify_chain
from dspark_core.core.verification import acceptance_probability, residual
from dspark_core.decode.policies import (
    ConfidenceThreshold,
    FixedLength,
    HardwareAware,
    SurvivalThreshold,
)
from dspark_core.drafters.trained import _draft_from_logits
from dspark_core.models import DrafterConfig, ParallelDraftModel

from .test_policies import draft_with
from .toy import law_errors, tables_from_logits

PROPERTY = settings(deadline=None, database=None, derandomize=True)

# a logit: -inf (probability 0 after softmax), a few repeated values (ties) or any value in a range
LOGIT = st.one_of(st.sampled_from([-math.inf, -1.0, 0.0, 0.0, 2.0]), st.floats(-3.0, 3.0))


def logit_tables(vocab: int) -> st.SearchStrategy:
    """[V, V] logits, every row with at least one finite entry."""
    row = st.lists(LOGIT, min_size=vocab, max_size=vocab).filter(lambda r: any(math.isfinite(x) for x in r))
    return st.lists(row, min_size=vocab, max_size=vocab).map(lambda rows: torch.tensor(rows, dtype=torch.float64))


@st.composite
def samplings(draw, vocab: int) -> SamplingConfig:
    return SamplingConfig(temperature=draw(st.sampled_from([0.0, 0.3, 0.7, 1.0, 1.8])), top_k=draw(st.integers(0, vocab)),
                          top_p=draw(st.sampled_from([1.0, 0.95, 0.6, 0.2])))


@st.composite
def markov_cases(draw, max_vocab: int = 4):
    """(target [V, V], draft [V, V], sampling, gamma): random Markov tables processed like the real thing."""
    vocab = draw(st.integers(2, max_vocab))
    sampling = draw(samplings(vocab))
    target, draft = tables_from_logits(draw(logit_tables(vocab)), draw(logit_tables(vocab)), sampling,
                                       one_hot_draft=draw(st.booleans()))
    return target, draft, sampling, draw(st.integers(1, 3 if vocab <= 3 else 2))


# ------------------------------------------------------------------------------- verification
@settings(PROPERTY, max_examples=300)
@given(markov_cases(), st.booleans())
def test_exact_law_equals_the_target_on_random_cases(case, anchor_at_end):
    target, draft, _, gamma = case
    anchor = target.shape[0] - 1 if anchor_at_end else 0
    assert law_errors(target, draft, gamma, anchor=anchor)[0] < 1e-6


@settings(PROPERTY, max_examples=500)
@given(markov_cases(max_vocab=6), st.data())
def test_verify_chain_walks_the_exact_law(case, data):
    target, draft, _, gamma = case
    vocab = target.shape[0]
    edge_or_any = st.one_of(st.sampled_from([0, vocab - 1]), st.integers(0, vocab - 1))
    anchor = data.draw(edge_or_any)
    tokens = data.draw(st.lists(edge_or_any, min_size=0, max_size=gamma))  # any tokens: q = 0 ones included
    eos = data.draw(st.sampled_from([(), (vocab - 1,), (0,)]))
    max_tokens = data.draw(st.one_of(st.none(), st.integers(1, gamma + 1)))
    seed = data.draw(st.integers(0, 2**31 - 1))
    prev = [anchor] + tokens
    p, q = target[prev], draft[prev[:-1]]  # [l + 1, V], [l, V]
    verdict = verify_chain(torch.tensor(tokens, dtype=torch.long), q, p, torch.Generator().manual_seed(seed),
                           eos_token_ids=eos, max_tokens=max_tokens)

    uniforms = torch.rand(len(tokens), generator=torch.Generator().manual_seed(seed))
    accepted = 0
    while accepted < len(tokens) and uniforms[accepted] < acceptance_probability(p[accepted, tokens[accepted]],
                                                                                  q[accepted, tokens[accepted]]):
        accepted += 1
    assert all(q[k, x] > 0 for k, x in enumerate(tokens[:accepted]))  # a token with q = 0 is never accepted
    drafts = tokens[:accepted]
    eos_at = next((i + 1 for i, x in enumerate(drafts) if x in eos), None)
    if eos_at is not None or (max_tokens is not None and max_tokens <= accepted):  # cut before the last token
        assert verdict.tokens == drafts[: min(eos_at or accepted, max_tokens or accepted)] and verdict.finished
    else:
        *head, last = verdict.tokens
        fallback = residual(p[accepted], q[accepted]) if accepted < len(tokens) else p[accepted]
        assert head == drafts and fallback[last] > 0  # the residual or bonus token, from its distribution
        assert verdict.finished == (last in eos or (max_tokens is not None and accepted + 1 >= max_tokens))
    assert verdict.accepted == min(accepted, len(verdict.tokens))


# -------------------------------------------------------------------- reduced draft vocabulary
@st.composite
def draft_vocabularies(draw):
    """(target vocabulary V, draft token ids [Vd] as target ids, in any order, edges often included)."""
    vocab = draw(st.integers(2, 48))
    ids = draw(st.permutations(range(vocab)))
    size = draw(st.integers(2, vocab))
    chosen = list(ids[:size])
    for edge in draw(st.sets(st.sampled_from([0, vocab - 1]))):  # force an edge in, keeping the size
        if edge not in chosen:
            chosen[draw(st.integers(0, size - 1))] = edge
    return vocab, torch.tensor(chosen, dtype=torch.long)


def tiny_parallel_drafter(vocab: int, draft_ids: torch.Tensor) -> ParallelDraftModel:
    d = 8
    config = DrafterConfig(kind="dspark", head="markov", block_size=2, hidden_size=d, num_heads=2, num_kv_heads=1,
                           head_dim=4, intermediate_size=8, feature_layers=(0,), draft_vocab_size=len(draft_ids),
                           rank=2, target_hidden_size=d, target_vocab_size=vocab)
    drafter = ParallelDraftModel(config).eval()
    drafter.draft_token_ids.copy_(draft_ids)
    drafter.attach_target(torch.randn(vocab, d), torch.randn(vocab, d))
    return drafter


@settings(PROPERTY, max_examples=100)
@given(draft_vocabularies(), samplings(8), st.integers(0, 2**31 - 1))
def test_draft_vocabulary_round_trips_at_its_boundaries(vocabulary, sampling, seed):
    vocab, ids = vocabulary
    torch.manual_seed(seed)
    drafter = tiny_parallel_drafter(vocab, ids)
    size = len(ids)
    assert torch.equal(drafter.to_draft_ids(ids), torch.arange(size))  # draft -> target -> draft
    everything = drafter.to_draft_ids(torch.arange(vocab))
    inside = torch.zeros(vocab, dtype=torch.bool).index_fill_(0, ids, True)
    assert torch.equal(everything == size, ~inside)  # outside the draft vocabulary: the extra index Vd
    assert torch.equal(ids[everything[inside]], torch.arange(vocab)[inside])  # target -> draft -> target

    hidden = torch.randn(drafter.config.hidden_size)
    with torch.no_grad():
        bias, confidence, _ = drafter.head_step(hidden.expand(vocab, -1), everything, None)  # every id, outside ones too
        logits = drafter.base_logits(hidden) + bias[0]
    assert bias.shape == (vocab, size) and bool(((confidence > 0) & (confidence < 1)).all())
    token, q = _draft_from_logits(drafter, logits, sampling, torch.Generator().manual_seed(seed), vocab)
    assert bool(inside[token]) and q[token] > 0 and q.shape == (vocab,)
    assert float(q[~inside].abs().sum()) == 0.0 and abs(float(q.sum()) - 1.0) < 1e-5
    assert torch.equal(q[ids], probs_from_logits(logits, sampling))


# -------------------------------------------------------------------------------------- policies
CONFIDENCE = st.one_of(st.sampled_from([0.0, 0.25, 0.5, 1.0]), st.floats(0.0, 1.0))


@st.composite
def policies(draw):
    gamma = draw(st.integers(0, 8))
    threshold = draw(st.one_of(st.sampled_from([0.0, 0.25, 0.5, 1.0]), st.floats(0.0, 1.0)))
    kind = draw(st.sampled_from(["fixed", "confidence", "survival", "hardware"]))
    if kind == "fixed":
        return FixedLength(gamma)
    if kind == "confidence":
        return ConfidenceThreshold(gamma, threshold)
    if kind == "survival":
        return SurvivalThreshold(gamma, threshold)
    fixed, per_token = draw(st.floats(0.1, 10.0)), draw(st.floats(0.0, 2.0))  # a cost that grows with the tokens
    return HardwareAware(gamma, lambda tokens, requests: 1.0 / (fixed + per_token * tokens))


@settings(PROPERTY, max_examples=800)
@given(policies(), st.lists(CONFIDENCE, max_size=10), st.integers(-1, 11), st.lists(CONFIDENCE, max_size=10))
def test_policies_verify_a_prefix_within_the_block(policy, confidences, budget, other_tail):
    draft = draft_with(confidences)
    length = policy.verify_length(draft, budget)
    assert 0 <= length <= min(len(draft), max(budget, 0), policy.gamma)
    seen = draft.confidences.tolist()  # as the policy sees them (float32)
    assert all(policy.admit(seen[:k]) for k in range(1, length + 1))  # a prefix its stop rule admits
    if length < min(len(draft), max(budget, 0), policy.gamma):
        assert not policy.admit(seen[: length + 1])  # and it stops at the first position the rule refuses
    if length < len(draft):  # non-anticipating: what follows the first position not verified changes nothing
        assert policy.verify_length(draft_with(confidences[: length + 1] + other_tail), budget) == length


@settings(PROPERTY, max_examples=300)
@given(st.integers(1, 8), st.lists(st.tuples(st.lists(CONFIDENCE, max_size=8), st.integers(-1, 9)), min_size=1, max_size=6),
       st.floats(0.1, 10.0), st.floats(0.0, 2.0))
def test_batch_schedule_stays_within_each_block(gamma, requests, fixed, per_token):
    policy = HardwareAware(gamma, lambda tokens, rows: 1.0 / (fixed + per_token * tokens / rows))
    drafts = [draft_with(c) for c, _ in requests]
    budgets = [b for _, b in requests]
    for draft, budget, length in zip(drafts, budgets, policy.verify_lengths(drafts, budgets)):
        assert 0 <= length <= min(len(draft), max(budget, 0), gamma)
