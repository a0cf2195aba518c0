"""Parallel drafters (dflash / dspark): losslessness with untrained weights, save/load, clear errors, losses."""

import math

import numpy as np
import pytest
import torch

from dspark_core import (
    DraftContext,
    FixedLength,
    SamplingConfig,
    autoregressive_generate,
    speculative_generate,
)
from dspark_core.cli import main
from dspark_core.core import verification
from dspark_core.drafters.trained import (
    BlockDrafter,
    EagleDrafter,
    load_trained_drafter,
)
from dspark_core.models import (
    drafter_loss,
    eagle,
    l1_distance,
    parallel,
    position_weights,
    soft_acceptance,
)
from dspark_core.models.parallel import block_attention

from .stats import chi_square_p
from .tiny import VARIANTS, drafter_for, tiny_target


@pytest.mark.parametrize("name", VARIANTS)
def test_untrained_drafter_is_lossless_greedy(target, prompts, eos, name):
    model, tokenizer = target
    serving = EagleDrafter if name == "eagle" else BlockDrafter
    drafter = serving(drafter_for(model, tokenizer, name), model, tokenizer)
    for prompt in prompts[:2]:
        plain = autoregressive_generate(model, prompt, max_new_tokens=24, eos_token_ids=eos)
        result = speculative_generate(model, prompt, drafter, FixedLength(5), max_new_tokens=24, eos_token_ids=eos)
        assert result.tokens == plain.tokens
        emitted = 0
        for r in result.rounds:  # a full block each round, cut only where the token budget ends
            assert r.proposed == min(5, 24 - emitted - 1)
            emitted += r.emitted


@pytest.mark.slow  # a chi-square test over many samples (about a minute)
def test_dspark_first_token_distribution_matches_target_at_temperature_1(monkeypatch):
    """Chi-square (p > 1e-3) of the first emitted token over N = 3000 seeded generations.

    The drafter's reduced vocabulary (12 of 16 tokens) makes q = 0 for some tokens the target likes;
    the same statistic with the residual replaced by p must fail (p < 1e-6). The control needs fewer
    samples: over its N = 1000 seeds (0-999) its p-value is 4e-25, and 5e-30 and 5e-27 over seeds 5000-5999
    and 10000-10999 (3e-92 over N = 3000)."""
    model, tokenizer = tiny_target()
    drafter = drafter_for(model, tokenizer, "dspark-markov", draft_vocab_size=12, rank=8, block_size=4,
                          tokenizer_fingerprint="", target_fingerprint="")
    block = BlockDrafter(drafter, model, tokenizer)
    prompt = [3, 7, 1, 9, 4]
    with torch.no_grad():
        p = torch.softmax(model(torch.tensor([prompt])).logits[0, -1].double(), -1).numpy()

    def first_tokens(n: int) -> np.ndarray:
        counts = np.zeros(16)
        for seed in range(n):
            # Room for the whole block (all 4 are verified); every token counts as EOS, so the run ends with
            # the first round, which decides the first token.
            out = speculative_generate(model, prompt, block, FixedLength(4), sampling=SamplingConfig(1.0),
                                       max_new_tokens=5, seed=seed, eos_token_ids=tuple(range(16)))
            assert out.rounds[0].verified == 4
            counts[out.tokens[0]] += 1
        return counts

    assert chi_square_p(first_tokens(3000), p) > 1e-3
    monkeypatch.setattr(verification, "residual", lambda p_row, q_row: p_row)
    assert chi_square_p(first_tokens(1000), p) < 1e-6


def test_loading_for_another_target_fails(target, tmp_path):
    model, tokenizer = target
    with pytest.raises(ValueError, match="hidden size 64 vs the target's 576"):
        BlockDrafter(drafter_for(model, tokenizer, "dflash", hidden_size=64, target_hidden_size=64, num_heads=4,
                                 num_kv_heads=2, head_dim=16), model, tokenizer)
    with pytest.raises(ValueError, match="vocabulary 32000"):
        BlockDrafter(drafter_for(model, tokenizer, "dflash", target_vocab_size=32000), model, tokenizer)
    with pytest.raises(ValueError, match="tokenizer fingerprint deadbeef"):
        BlockDrafter(drafter_for(model, tokenizer, "dflash", tokenizer_fingerprint="deadbeef"), model, tokenizer)


def test_save_load_roundtrip_and_truncated_checkpoint(target, prompts, eos, tmp_path):
    model, tokenizer = target
    drafter = drafter_for(model, tokenizer, "dspark-rnn")
    drafter.save_pretrained(tmp_path / "ok")
    loaded = load_trained_drafter(tmp_path / "ok", model, tokenizer)
    for name, tensor in drafter.state_dict().items():
        assert torch.equal(tensor, loaded.drafter.state_dict()[name]), name
    vocab = model.config.vocab_size
    assert all(vocab not in t.shape for t in loaded.drafter.state_dict().values()), "the target's embedding was saved"
    weights = tmp_path / "ok" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        load_trained_drafter(tmp_path / "ok", model, tokenizer)
    with pytest.raises(ValueError, match="truncated or corrupt"):
        load_trained_drafter(tmp_path / "missing", model, tokenizer)


def test_loss_terms_match_hand_computation():
    # one block of g = 2 over a draft vocabulary of 3; the target puts 0.1 outside it at position 1
    p_t = torch.tensor([[0.5, 0.3, 0.1], [0.2, 0.2, 0.6]])
    outside = torch.tensor([0.1, 0.0])
    p_d = torch.tensor([[0.6, 0.2, 0.2], [0.2, 0.2, 0.6]])
    l1 = l1_distance(p_d, p_t, outside)
    assert l1.tolist() == pytest.approx([0.1 + 0.1 + 0.1 + 0.1, 0.0])
    assert soft_acceptance(l1).tolist() == pytest.approx([0.8, 1.0])
    assert position_weights(2).tolist() == pytest.approx([1.0, math.exp(-0.5)])

    labels = torch.tensor([1, 3])  # position 2's token lies outside the draft vocabulary: no CE term
    conf = torch.tensor([0.5, 0.9])
    terms = drafter_loss(p_d.log(), conf, p_t, outside, labels)
    w2 = math.exp(-0.5)
    assert float(terms["ce"]) == pytest.approx(-math.log(0.2))
    assert float(terms["tv"]) == pytest.approx(0.4)
    bce1 = -(0.8 * math.log(0.5) + 0.2 * math.log(0.5))
    bce2 = -(1.0 * math.log(0.9))
    assert float(terms["conf"]) == pytest.approx(bce1 + w2 * bce2, rel=1e-5)
    assert float(terms["loss"]) == pytest.approx(0.1 * -math.log(0.2) + 0.9 * 0.4 + bce1 + w2 * bce2, rel=1e-5)
    soft_ce = -(p_t[0] * p_d[0].log()).sum() - w2 * (p_t[1] * p_d[1].log()).sum()  # over the draft vocabulary only
    assert float(terms["soft_ce"]) == pytest.approx(float(soft_ce), rel=1e-5)
    with_kl = drafter_loss(p_d.log(), conf, p_t, outside, labels, "dspark-kl")
    assert float(with_kl["loss"]) == pytest.approx(float(terms["loss"]) + float(soft_ce), rel=1e-5)
    assert "conf" not in drafter_loss(p_d.log(), None, p_t, outside, labels)


def test_position_decay_sets_the_loss_weights():
    assert position_weights(7).tolist() == pytest.approx([math.exp(-k / 7) for k in range(7)])  # the paper's text
    assert position_weights(7, decay=4.0).tolist() == pytest.approx([math.exp(-k / 4) for k in range(7)])
    # g = 2, both positions off by an L1 distance of 0.4: TV = 0.4 + w_2 * 0.4
    p_t = torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.2, 0.6]])
    p_d = torch.tensor([[0.7, 0.1, 0.2], [0.4, 0.2, 0.4]])
    outside, labels = torch.zeros(2), torch.tensor([0, 2])
    for decay, w2 in ((None, math.exp(-1 / 2)), (0.5, math.exp(-2.0))):
        terms = drafter_loss(p_d.log(), None, p_t, outside, labels, position_decay=decay)
        assert float(terms["tv"]) == pytest.approx(0.4 + w2 * 0.4, rel=1e-5)
    with pytest.raises(ValueError, match="position_decay"):
        drafter_loss(p_d.log(), None, p_t, outside, labels, "eagle3", position_decay=4.0)


def test_cli_generate_with_a_drafter_checkpoint(target, tmp_path, capsys):
    model, tokenizer = target
    drafter_for(model, tokenizer, "dspark-markov").save_pretrained(tmp_path / "dspark")
    args = ["generate", "--prompt", "Name a colour.", "--gamma", "5", "--max-new-tokens", "8",
            "--draft-model", str(tmp_path / "dspark")]
    assert main(args + ["--drafter", "dspark"]) == 0
    assert "conditional acceptance per position" in capsys.readouterr().out
    assert main(args + ["--drafter", "dflash"]) == 2
    assert "holds a dspark drafter, not dflash" in capsys.readouterr().err
    assert main(["bench", "--benchmarks", "smoke", "--n-prompts", "1", "--temperatures", "0",
                 "--methods", f"dspark={tmp_path / 'dspark'}:5", "--max-new-tokens", "8", "--out", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "dspark@5" in out and "conditional acceptance per position" in out


@pytest.mark.parametrize("name", VARIANTS)
def test_training_forward_matches_inference_drafting(target, prompts, name):
    """The teacher-forced training pass, fed the tokens the serving path sampled (temperature 1),
    reproduces the distributions it sampled them from (for eagle: training-time test = inference)."""
    model, tokenizer = target
    drafter = drafter_for(model, tokenizer, name)
    serving = (EagleDrafter if name == "eagle" else BlockDrafter)(drafter, model, tokenizer)
    tokens = prompts[2].tolist() + [28, 253, 1345, 30, 42, 7]
    layers = drafter.config.feature_layers
    with torch.no_grad():
        hidden = model(input_ids=torch.tensor([tokens]), output_hidden_states=True).hidden_states
    features = torch.stack([hidden[i][0] for i in layers], dim=1)  # [T, m, d]
    a = len(tokens) - 3
    draft = serving.propose(DraftContext(tokens[: a + 1], len(prompts[2]), features[:a], len(tokenizer)), 5,
                            SamplingConfig(1.0), torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits, _ = drafter(features[None, :a], torch.tensor([tokens[1 : a + 1]]), torch.tensor([[tokens[a]]]),
                            torch.tensor([[a]]), torch.ones(1, 1, a, dtype=torch.bool),
                            torch.tensor([[[tokens[a]] + draft.tokens[:-1].tolist()]]))
    ids = drafter.draft_token_ids
    assert torch.allclose(torch.softmax(logits[0, 0], -1), draft.probs[:, ids], atol=1e-5)
    assert float(draft.probs.sum(-1).sub(1).abs().max()) < 1e-5 and float(draft.probs[:, ids].sum(-1).min()) > 0.999


def test_block_attention_equals_dense_attention_with_other_blocks_masked():
    """block_attention (context keys plus each block's own keys, one softmax) is dense attention over
    [context; every block's keys] with the other blocks' keys masked, grouped key/value heads included,
    with and without a mask over a block's own keys; a wrong block assignment fails the same check."""
    gen = torch.Generator().manual_seed(0)
    batch, heads, kv_heads, hd, length, blocks, size, past = 2, 4, 2, 8, 11, 3, 2, 1
    n, own = blocks * size, past + size
    q = torch.randn(batch, heads, n, hd, generator=gen, dtype=torch.float64)
    ctx_k, ctx_v = (torch.randn(batch, kv_heads, length, hd, generator=gen, dtype=torch.float64) for _ in range(2))
    local_k, local_v = (torch.randn(batch, kv_heads, blocks, own, hd, generator=gen, dtype=torch.float64) for _ in range(2))
    ctx_mask = torch.rand(batch, n, length, generator=gen) < 0.6
    causal = torch.ones(size, own, dtype=torch.bool).tril(past)

    def dense(local_mask, block_of_query):
        keys = torch.cat([ctx_k, local_k.flatten(2, 3)], 2).repeat_interleave(heads // kv_heads, 1)
        values = torch.cat([ctx_v, local_v.flatten(2, 3)], 2).repeat_interleave(heads // kv_heads, 1)
        own_mask = torch.zeros(n, blocks * own, dtype=torch.bool)
        for i in range(n):
            j = block_of_query[i]
            own_mask[i, j * own : (j + 1) * own] = local_mask[i % size]
        mask = torch.cat([ctx_mask, own_mask.expand(batch, -1, -1)], -1)
        scores = (q @ keys.transpose(-1, -2) / hd**0.5).masked_fill(~mask[:, None], float("-inf"))
        return (scores.softmax(-1) @ values).transpose(1, 2).reshape(batch, n, heads * hd)

    right = [i // size for i in range(n)]
    for local_mask in (None, causal):
        got = block_attention(q, ctx_k, ctx_v, ctx_mask, local_k, local_v, local_mask)
        full = torch.ones(size, own, dtype=torch.bool) if local_mask is None else local_mask
        assert torch.allclose(got, dense(full, right), atol=1e-12)
        assert not torch.allclose(got, dense(full, right[size:] + right[:size]), atol=1e-3)  # negative control


@pytest.mark.parametrize("name", VARIANTS)
def test_a_forward_in_chunks_of_blocks_equals_one_pass(monkeypatch, name):
    """Training forwards run the blocks a chunk at a time, each over the context its blocks see
    (block_chunks): the logits equal those of one pass over every block and the whole context."""
    model, tokenizer = tiny_target(vocab=64)
    drafter = drafter_for(model, tokenizer, name, draft_vocab_size=48, block_size=4)
    drafter.attach_target(model.get_input_embeddings().weight, model.get_output_embeddings().weight)
    gen = torch.Generator().manual_seed(1)
    length, g = 40, 4
    anchor_pos = torch.tensor([[2, 5, 9, 13, 17, 20, 24, 28, 31, 35]])
    tokens = torch.randint(0, 64, (1, length + g + 1), generator=gen)
    inputs = dict(features=torch.randn(1, length, 3, model.config.hidden_size, generator=gen),
                  ctx_next_tokens=tokens[:, 1 : length + 1], anchors=tokens[:, anchor_pos[0]], anchor_pos=anchor_pos,
                  ctx_visible=(torch.arange(length)[None, :] < anchor_pos[0][:, None])[None],
                  prev_tokens=tokens[:, anchor_pos[0][:, None] + torch.arange(g)])
    with torch.no_grad():
        whole, _ = drafter(**inputs)
        monkeypatch.setattr(parallel, "BLOCK_CHUNK", 3)
        monkeypatch.setattr(eagle, "STEP_CHUNK", 3)
        monkeypatch.setattr(parallel, "CONTEXT_MULTIPLE", 8)
        assert [end for _, end in parallel.block_chunks(inputs["ctx_visible"], 3)] == [16, 24, 32, 40]
        chunked, _ = drafter(**inputs)
    assert torch.allclose(whole, chunked, atol=1e-5)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_markov_bias_rows_kept_per_token_leave_every_draft_unchanged(temperature):
    """The served dspark-markov keeps B(x) = W2 W1[x] per previous token: its drafts (tokens, q rows,
    confidences) equal those of a drafter that recomputes every row, and it keeps at most markov_rows."""
    model, tokenizer = tiny_target(vocab=64, window=256)
    drafter = drafter_for(model, tokenizer, "dspark-markov", draft_vocab_size=48, tokenizer_fingerprint="",
                          target_fingerprint="")
    kept, fresh = (BlockDrafter(drafter, model, tokenizer, markov_rows=rows) for rows in (3, 0))
    drafts = {id(kept): [], id(fresh): []}
    for served in (kept, fresh):
        propose = served.propose
        served.propose = lambda *a, _p=propose, _s=served, **k: drafts[id(_s)].append(_p(*a, **k)) or drafts[id(_s)][-1]
        speculative_generate(model, [1, 5, 9, 2], served, FixedLength(5), sampling=SamplingConfig(temperature),
                             max_new_tokens=120, seed=3)
    assert len(drafts[id(kept)]) == len(drafts[id(fresh)]) > 10
    for a, b in zip(drafts[id(kept)], drafts[id(fresh)]):
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.probs, b.probs)
        assert (a.confidences is None and b.confidences is None) or torch.equal(a.confidences, b.confidences)
    assert len(kept.bias_rows) == 3 and not fresh.bias_rows
