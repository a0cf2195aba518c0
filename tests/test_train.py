"""Training: blocks tile the spans, epochs visit every sequence, the quick recipe trains, resumes exactly
after an interruption and serves losslessly; every drafter kind, loss recipe and the draft LM train."""

import csv
import json
from collections import Counter

import numpy as np
import pandas as pd
import pytest
import torch

from dspark_core import FixedLength, autoregressive_generate, speculative_generate
from dspark_core.data.features import FeatureSpec, build_feature_store
from dspark_core.data.sequences import Sequences, render_conversation
from dspark_core.drafters.registry import build_drafter
from dspark_core.drafters.trained import load_trained_drafter
from dspark_core.eval.heldout import domain_acceptance, write_curve_row
from dspark_core.train import drafters as train_module
from dspark_core.train.config import TrainConfig
from dspark_core.train.drafters import (
    block_anchors,
    build_draft_lm,
    draft_lm_loss,
    epoch_rows,
    epoch_steps,
    lm_batch,
    planned_steps,
    step_anchors,
    train,
    train_draft_lm,
)

QUICK = dict(drafter="dspark", head="rnn", block=4, draft_vocab=512, rank=16, steps=20, tokens_per_step=60,
             save_every=10, log_every=5, val_fraction=0.25, warmup=5)
TOPICS = ["rivers", "bread", "stars", "chess", "rain", "bees", "clocks", "maps"]


@pytest.fixture(scope="module")
def tiny(target, tmp_path_factory):
    """Eight short conversations (two assistant turns each) and their feature store."""
    model, tokenizer = target
    tokens, spans = [], []
    for topic in TOPICS:
        turns = [("user", f"Tell me one fact about {topic}."), ("assistant", f"Here is a fact about {topic}: they are "
                 f"older than most people think, and many stories are told about {topic}."),
                 ("user", "And another?"), ("assistant", f"People have studied {topic} for centuries.")]
        t, s = render_conversation(tokenizer, turns, 512)
        tokens.append(t)
        spans.append(s)
    sequences = Sequences([f"c{i}" for i in range(len(TOPICS))], ["fixed:test"] * len(TOPICS), tokens, spans)
    store = build_feature_store(model, tokenizer, sequences, FeatureSpec(layers=(2, 15, 28)),
                                root=tmp_path_factory.mktemp("features"))
    return sequences, store


def test_block_anchors_tile_every_span():
    spans = [(10, 30), (40, 45), (50, 52)]  # the last one is too short for a block of 4
    anchors = block_anchors(spans, 4)
    covered = {a + k for a in anchors for k in range(1, 5)}
    assert all(any(s <= a + 1 and a + 4 < e for s, e in spans) for a in anchors), "a block leaves its span"
    assert set(range(10, 30)) | set(range(40, 45)) <= covered
    assert not covered & set(range(50, 52))
    assert anchors.tolist() == [9, 13, 17, 21, 25, 39, 40], "shift 0 is the tiling every earlier run trained on"
    for shift in range(1, 4):  # a shifted tiling still covers every span and stays inside them
        shifted = block_anchors(spans, 4, shift)
        assert {a + k for a in shifted for k in range(1, 5)} == covered
        assert 9 + shift in shifted and set(shifted) != set(anchors)
    with pytest.raises(ValueError, match="shift"):
        block_anchors(spans, 4, 4)


def test_shifted_tilings_change_with_the_step_and_repeat_on_resume():
    spans = [(10, 60)]
    config = TrainConfig(shift_anchors=True, block=7)
    tilings = [tuple(step_anchors(spans, config, step, 3)) for step in range(40)]
    assert tilings == [tuple(step_anchors(spans, config, step, 3)) for step in range(40)], "a resumed run sees the same blocks"
    assert len(set(tilings)) == config.block, "every shift occurs"
    assert len({tuple(step_anchors(spans, config, 0, row)) for row in range(20)}) > 1, "rows draw their own shifts"
    fixed = TrainConfig(block=7, max_blocks=3)
    assert all(step_anchors(spans, fixed, step, 3).tolist() == block_anchors(spans, 7)[:3].tolist() for step in range(5)), \
        "off by default: one tiling every epoch, cut to max_blocks"
    with pytest.raises(ValueError, match="shift_anchors"):
        TrainConfig(drafter="draft-lm", shift_anchors=True)


def test_an_epoch_visits_every_training_sequence_once(tiny):
    sequences, _ = tiny
    rows = np.arange(len(sequences))
    config = TrainConfig(tokens_per_step=60)
    steps = epoch_steps(sequences, rows, config, 0)
    assert sorted(i for step in steps for i in step) == rows.tolist()
    assert steps != epoch_steps(sequences, rows, config, 1), "every epoch has its own order"
    plan = planned_steps(sequences, rows, TrainConfig(tokens_per_step=60, epochs=1.5))
    assert len(plan) == int(np.ceil(1.5 * len(steps)))
    by_steps = TrainConfig(tokens_per_step=60, steps=2 * len(steps))
    assert len(planned_steps(sequences, rows, by_steps)) == 2 * len(steps)
    assert by_steps.epochs == 2.0, "train_meta.json records the epochs a --steps run covered"


@pytest.mark.parametrize("kind", ["dspark", "eagle"])
def test_a_padded_batch_has_the_loss_and_gradients_of_the_unpadded_one(target, tiny, kind):
    """Training pads a sequence's blocks and context to repeated shapes (make_batch's ``pad``): the padding
    blocks weigh nothing and no block sees the padded context, so the loss and its gradients are unchanged."""
    model, tokenizer = target
    sequences, store = tiny
    config = TrainConfig(drafter=kind, block=4, draft_vocab=512, rank=16, loss="eagle3" if kind == "eagle" else "dspark")
    drafter = train_module.build_drafter_model(config, model, tokenizer, torch.arange(512))
    anchors = block_anchors(sequences.spans[0], config.block)
    results = []
    for pad in (None, (16, 128)):
        batch = train_module.make_batch(store, 0, anchors, config.block, pad=pad)
        drafter.zero_grad()
        terms = train_module.compute_loss(drafter, drafter, batch, config.loss)
        terms["loss"].backward()
        results.append((batch, terms, [p.grad.clone() for p in drafter.parameters() if p.grad is not None]))
    (plain, plain_terms, plain_grads), (padded, padded_terms, padded_grads) = results
    assert padded["anchors"].shape[1] == 16 and padded["features"].shape[1] == 128 > plain["features"].shape[1]
    assert padded["block_weights"].sum() == len(anchors) < 16
    for name in plain_terms:
        assert torch.allclose(plain_terms[name], padded_terms[name], rtol=1e-5), name
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(plain_grads, padded_grads))


def test_distill_repeats_visit_each_distilled_answer_that_many_times_an_epoch(tiny):
    sequences, _ = tiny
    mixed = Sequences(sequences.ids, ["distill:chat", "fixed:test"] * 4, sequences.tokens, sequences.spans)
    rows = np.arange(1, len(mixed))
    assert epoch_rows(mixed, rows, 1).tolist() == rows.tolist(), "one repeat leaves every earlier plan as it was"
    config = TrainConfig(tokens_per_step=60, distill_repeats=3)
    visits = Counter(i for step in planned_steps(mixed, rows, config) for i in step)
    assert config.epochs == 1.0
    assert visits == {i: 3 if mixed.sources[i].startswith("distill:") else 1 for i in rows.tolist()}
    with pytest.raises(ValueError, match="distill_repeats"):
        TrainConfig(distill_repeats=0)


@pytest.mark.parametrize("settings", [{"position_decay": -1.0}, {"position_decay": 4.0, "loss": "eagle3"},
                                      {"position_decay": 4.0, "drafter": "draft-lm"}])
def test_position_decay_only_where_the_loss_has_exponential_weights(settings):
    with pytest.raises(ValueError, match="position_decay"):
        TrainConfig(**settings)


def test_a_selection_curve_holds_one_row_per_checkpoint_of_the_latest_run(tmp_path):
    curve = tmp_path / "selection-curve.csv"
    for step in (10, 20, 30):
        write_curve_row(curve, {"step": step, "greedy_tau": step / 10})
    for step in (10, 20):  # a fresh run into the same folder, stopped after its second checkpoint
        write_curve_row(curve, {"step": step, "greedy_tau": step / 100})
    assert pd.read_csv(curve).to_dict("list") == {"step": [10, 20], "greedy_tau": [0.1, 0.2]}
    write_curve_row(curve, {"step": 30, "greedy_tau": 0.3})  # resumed from step 20
    assert pd.read_csv(curve).to_dict("list") == {"step": [10, 20, 30], "greedy_tau": [0.1, 0.2, 0.3]}


def test_quick_recipe_trains_resumes_and_serves(target, tiny, prompts, eos, tmp_path, monkeypatch):
    model, tokenizer = target
    _, store = tiny
    straight = train(TrainConfig(**QUICK), model, tokenizer, store, tmp_path / "straight")

    calls = {"n": 0}
    real = train_module.compute_loss

    def interrupted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 25:  # after the checkpoint at step 10 (two sequences a step)
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(train_module, "compute_loss", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train(TrainConfig(**QUICK), model, tokenizer, store, tmp_path / "resumed")
    monkeypatch.setattr(train_module, "compute_loss", real)
    assert json.loads((tmp_path / "resumed" / "state" / "state.json").read_text())["step"] == 10
    with (tmp_path / "resumed" / "loss.csv").open("a") as log:  # a row logged after the last save, and a torn line
        log.write("15,1,1,1,1,1,1,1\n16,0.")
    hooked = []  # checkpoints whose on_save ran in the resumed run: the one resumed from, then the later ones
    resumed = train(TrainConfig(**QUICK), model, tokenizer, store, tmp_path / "resumed",
                    on_save=lambda step, module: hooked.append((step, module.training)))
    assert hooked == [(10, False), (20, False)]
    for name, tensor in straight.state_dict().items():
        assert torch.allclose(tensor, resumed.state_dict()[name], atol=1e-6), name
    steps = [int(r["step"]) for r in csv.DictReader((tmp_path / "resumed" / "loss.csv").open())]
    assert steps == [5, 10, 15, 20], "the resumed log repeats or loses rows"

    meta = json.loads((tmp_path / "straight" / "train_meta.json").read_text())
    assert len(meta["held_out_acceptance"]) == 4 and len(meta["held_out_greedy_acceptance"]) == 4
    assert meta["train_tokens"] == sum(len(t) for i, t in enumerate(store.sequences.tokens) if i in
                                       set(train_module.split_indices(8, 0.25)[0].tolist()))
    assert meta["mix"]["fixed:test"]["sequences"] == 6

    drafter = load_trained_drafter(tmp_path / "straight", model, tokenizer)
    plain = autoregressive_generate(model, prompts[0], max_new_tokens=16, eos_token_ids=eos)
    spec = speculative_generate(model, prompts[0], drafter, FixedLength(4), max_new_tokens=16, eos_token_ids=eos)
    assert spec.tokens == plain.tokens

    table = domain_acceptance(drafter.drafter, store)
    assert list(table.index) == ["fixed:test", "mean"] and 0 <= table.loc["mean", "greedy_a1"] <= 1


@pytest.mark.parametrize("kind,loss", [("eagle", "eagle3"), ("dflash", "ce"), ("dspark", "eagle3")])
def test_other_kinds_and_recipes_train_and_serve(target, tiny, prompts, eos, tmp_path, kind, loss):
    model, tokenizer = target
    _, store = tiny
    config = TrainConfig(**{**QUICK, "drafter": kind, "head": "markov", "loss": loss, "steps": 4, "save_every": 4,
                            "log_every": 2, "ce_label": "argmax", "init_from_target": kind == "dflash", "bf16": True,
                            "position_decay": 4.0 if loss == "ce" else 0.0,
                            "save_dtype": "float8" if kind == "dspark" else "bfloat16"})
    trained = train(config, model, tokenizer, store, tmp_path)
    assert trained.config.kind == kind
    rows = list(csv.DictReader((tmp_path / "loss.csv").open()))
    assert len(rows) == 2 and all(float(r["tv"]) > 0 and float(r["soft_ce"]) > 0 for r in rows)
    drafter = load_trained_drafter(tmp_path, model, tokenizer)
    plain = autoregressive_generate(model, prompts[1], max_new_tokens=12, eos_token_ids=eos)
    assert speculative_generate(model, prompts[1], drafter, FixedLength(4), max_new_tokens=12,
                                eos_token_ids=eos).tokens == plain.tokens


def test_init_from_target_copies_the_top_layers(target):
    from dspark_core.train.drafters import build_drafter_model

    model, tokenizer = target
    drafter = build_drafter_model(TrainConfig(drafter="dflash", layers=2, draft_vocab=64, init_from_target=True),
                                  model, tokenizer, torch.arange(64))
    assert torch.equal(drafter.layers[1].q_proj.weight, model.model.layers[-1].self_attn.q_proj.weight.float())
    assert torch.equal(drafter.layers[0].down_proj.weight, model.model.layers[-2].mlp.down_proj.weight.float())


def test_init_drafter_starts_from_a_trained_drafter_and_refuses_another_architecture(target, tiny, tmp_path):
    from dspark_core.core.fp8 import load_weights
    from dspark_core.train.drafters import build_drafter_model

    model, tokenizer = target
    _, store = tiny
    config = TrainConfig(**{**QUICK, "head": "markov", "steps": 2, "save_every": 2, "log_every": 2})
    train(config, model, tokenizer, store, tmp_path / "first")
    saved = load_weights(build_drafter_model(config, model, tokenizer, torch.arange(512)), tmp_path / "first")

    warm = TrainConfig(**{**QUICK, "head": "markov", "init_drafter": str(tmp_path / "first")})
    started = build_drafter_model(warm, model, tokenizer, torch.arange(512, 1024))  # the checkpoint's vocabulary wins
    assert torch.equal(started.draft_token_ids, saved.draft_token_ids)
    assert not torch.equal(started.draft_token_ids, torch.arange(512, 1024))
    for (name, mine), theirs in zip(started.state_dict().items(), saved.state_dict().values()):
        assert torch.equal(mine, theirs), name

    other = TrainConfig(**{**QUICK, "head": "markov", "layers": 2, "init_drafter": str(tmp_path / "first")})
    with pytest.raises(ValueError, match="num_layers 1 .theirs. vs 2"):
        build_drafter_model(other, model, tokenizer, torch.arange(512))
    with pytest.raises(ValueError, match="excludes init_from_target"):
        TrainConfig(**{**QUICK, "init_drafter": str(tmp_path / "first"), "init_from_target": True})


def test_draft_lm_distils_and_drafts(target, tiny, prompts, eos, tmp_path):
    model, tokenizer = target
    sequences, _ = tiny
    config = TrainConfig(**{**QUICK, "drafter": "draft-lm", "layers": 1, "lm_width": 64, "steps": 4,
                            "save_every": 4, "log_every": 2})
    train_draft_lm(config, model, tokenizer, sequences, tmp_path)
    meta = json.loads((tmp_path / "train_meta.json").read_text())
    assert meta["held_out_ce"] > 0
    weights = tmp_path / "model.safetensors"
    assert weights.stat().st_size < 2 * 49152 * 64 * 2 * 0.75, "the tied embedding was stored twice"
    drafter = build_drafter("draft-lm", model, tokenizer, draft_model=str(tmp_path))
    plain = autoregressive_generate(model, prompts[3], max_new_tokens=12, eos_token_ids=eos)
    assert speculative_generate(model, prompts[3], drafter, FixedLength(3), max_new_tokens=12,
                                eos_token_ids=eos).tokens == plain.tokens


def test_held_out_acceptance_of_a_draft_lm_that_is_the_target(target, tiny):
    """The target itself, measured as a draft LM, proposes the target's argmax after every prefix: greedy
    acceptance 1 at every position, and its analytic acceptance at T=1 is the stored top-k mass (the
    bound counts the mass beyond the top k twice, once per side of the L1 distance). A drafter read one
    position off would match almost nowhere."""
    model, _ = target
    _, store = tiny
    table = domain_acceptance(model, store)
    greedy = table.loc["mean", [f"greedy_a{k}" for k in range(1, 8)]].to_numpy()
    assert greedy.min() > 0.99 and table.loc["mean", "outside_vocab"] == 0.0
    masses = []
    for i, spans in enumerate(store.sequences.spans):
        anchors = block_anchors(spans, 7)
        if len(anchors):
            masses.append(store.target_topk(i, anchors[:, None] + np.arange(7))[1].sum(-1).numpy().ravel())
    sampled = table.loc["mean", [f"sampled_a{k}" for k in range(1, 8)]].to_numpy()
    assert np.allclose(sampled.mean(), np.concatenate(masses).mean(), atol=2e-3)


def test_draft_lm_loss_is_the_models_own_loss_on_span_tokens(target, tiny):
    """The LM head applied at span positions only gives the model's own CE (labels -100 off the spans),
    on a padded batch of sequences of different lengths."""
    model, _ = target
    sequences, _ = tiny
    lm = build_draft_lm(TrainConfig(drafter="draft-lm", layers=1, lm_width=64), model)
    first_turn = sequences.spans[3][0]  # sequence 3 cut after its first answer: a shorter row, padded
    mixed = Sequences(["a", "b"], ["t", "t"], [sequences.tokens[0], sequences.tokens[3][: first_turn[1]]],
                      [sequences.spans[0], [first_turn]])
    batch = lm_batch(mixed, [0, 1])
    assert batch["attention_mask"][1].sum() < batch["attention_mask"][0].sum()
    with torch.no_grad():
        ours = draft_lm_loss(lm, lm.get_output_embeddings(), batch)["loss"]
        theirs = lm(**batch).loss
    assert torch.allclose(ours, theirs, rtol=1e-5), (ours, theirs)


def test_float8_checkpoints_are_half_the_size_and_within_two_percent(target, tmp_path):
    from dspark_core.core.fp8 import load_weights, save_weights
    from dspark_core.train.drafters import build_drafter_model

    model, tokenizer = target
    drafter = build_drafter_model(TrainConfig(drafter="dspark", draft_vocab=512, rank=16), model, tokenizer, torch.arange(512))
    save_weights(drafter, tmp_path / "bf16", "bfloat16")
    save_weights(drafter, tmp_path / "fp8", "float8")
    sizes = {d: (tmp_path / d / "model.safetensors").stat().st_size for d in ("bf16", "fp8")}
    assert sizes["fp8"] < 0.6 * sizes["bf16"]
    loaded = load_weights(type(drafter)(drafter.config), tmp_path / "fp8")
    for name, tensor in drafter.state_dict().items():
        error = (loaded.state_dict()[name].float() - tensor.float()).norm() / tensor.float().norm().clamp_min(1e-12)
        assert error < 0.03, (name, float(error))
    with pytest.raises(ValueError, match="does not fit"):
        load_weights(type(drafter)(drafter.config.__class__(**{**drafter.config.to_dict(), "rank": 8})), tmp_path / "fp8")


def test_step_length_times_a_synthetic_micro_batch_per_sequence_length():
    from dspark_core.eval.step_length import measure_step_lengths, synthetic_batch, synthetic_drafter

    shape = dict(hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=64, vocab=300)
    drafter = synthetic_drafter(layers=1, draft_vocab=64, shape=shape)
    batch, blocks = synthetic_batch(drafter, 64)
    assert batch["anchor_pos"].shape[1] % 16 == 0 and batch["features"].shape[1] % 128 == 0  # padded as training pads
    assert int(batch["block_weights"].sum()) == blocks > 0
    rows = measure_step_lengths((32, 64), ("float32",), repeats=1, drafter=drafter)
    assert list(rows.length) == [32, 64] and (rows.step_s > 0).all()
    assert rows.attention_share.between(0, 1, inclusive="neither").all()
    assert drafter.fuse.weight.grad is not None  # the step ran backward
