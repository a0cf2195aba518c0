"""Training smoke test (the quick recipe): features, a few steps, resume after interruption, serving."""

import csv
import json

import pytest
import torch

from dspark_core import FixedLength, autoregressive_generate, speculative_generate
from dspark_core.data.distill import load
from dspark_core.data.features import build_feature_cache
from dspark_core.drafters import build_drafter
from dspark_core.drafters.trained import load_trained_drafter
from dspark_core.train import drafters as train_module
from dspark_core.train.drafters import TrainConfig, train, train_draft_lm

QUICK = dict(drafter="dspark", head="rnn", block=4, draft_vocab=512, rank=16, steps=20, batch_size=4,
             blocks_per_seq=2, save_every=10, log_every=5, val_fraction=0.25, warmup=5)


@pytest.fixture(scope="module")
def tiny(target, tmp_path_factory):
    model, tokenizer = target
    data = load().subset(12, seed=0)
    cache = build_feature_cache(model, tokenizer, data, (2, 15, 28), root=tmp_path_factory.mktemp("features"))
    return data, cache


def test_feature_cache_matches_target_and_is_reused(target, tiny, tmp_path):
    model, tokenizer = target
    data, cache = tiny
    seq = data.prompts[0] + data.responses[0]
    with torch.no_grad():
        out = model(input_ids=torch.tensor([seq]), output_hidden_states=True)
    assert cache.hidden.shape[1:] == (4, 576)
    assert torch.allclose(torch.tensor(cache.hidden[: len(seq), 1], dtype=torch.float32), out.hidden_states[15][0], atol=2e-2, rtol=1e-2)
    assert torch.allclose(torch.tensor(cache.lse[: len(seq)]), torch.logsumexp(out.logits[0], -1), atol=1e-3)
    assert json.loads((cache.folder / "progress.json").read_text())["sequences"] == 12
    again = build_feature_cache(model, tokenizer, data, (2, 15, 28), root=cache.folder.parent)
    assert again.folder == cache.folder
    other = build_feature_cache(model, tokenizer, data, (3, 15, 28), root=tmp_path)
    assert other.folder.name != cache.folder.name


def test_quick_recipe_trains_resumes_and_serves(target, tiny, prompts, eos, tmp_path, monkeypatch):
    model, tokenizer = target
    data, cache = tiny
    config = TrainConfig(**QUICK)
    straight = train(config, model, tokenizer, data, cache, tmp_path / "straight")

    calls = {"n": 0}
    real = train_module.compute_loss

    def interrupted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 13:  # after the checkpoint at step 10
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(train_module, "compute_loss", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train(config, model, tokenizer, data, cache, tmp_path / "resumed")
    monkeypatch.setattr(train_module, "compute_loss", real)
    assert json.loads((tmp_path / "resumed" / "state" / "state.json").read_text())["step"] == 10
    resumed = train(config, model, tokenizer, data, cache, tmp_path / "resumed")
    for name, tensor in straight.state_dict().items():
        assert torch.allclose(tensor, resumed.state_dict()[name], atol=1e-6), name

    rows = list(csv.DictReader((tmp_path / "straight" / "loss.csv").open()))
    assert [int(r["step"]) for r in rows] == [5, 10, 15, 20]
    assert all(float(r["loss"]) > 0 for r in rows)
    meta = json.loads((tmp_path / "straight" / "train_meta.json").read_text())
    assert len(meta["held_out_acceptance"]) == 4 and meta["target_fingerprint"]
    assert meta["data"]["sequences"] == 12

    drafter = load_trained_drafter(tmp_path / "straight", model, tokenizer)
    plain = autoregressive_generate(model, prompts[0], max_new_tokens=16, eos_token_ids=eos)
    spec = speculative_generate(model, prompts[0], drafter, FixedLength(4), max_new_tokens=16, eos_token_ids=eos)
    assert spec.tokens == plain.tokens


@pytest.mark.parametrize("kind", ["eagle", "dflash"])
def test_other_kinds_train_and_serve(target, tiny, prompts, eos, tmp_path, kind):
    model, tokenizer = target
    data, cache = tiny
    config = TrainConfig(**{**QUICK, "drafter": kind, "steps": 4, "save_every": 4, "log_every": 2})
    trained = train(config, model, tokenizer, data, cache, tmp_path)
    assert trained.config.kind == kind and trained.config.head == "none"
    rows = list(csv.DictReader((tmp_path / "loss.csv").open()))
    assert len(rows) == 2 and all(float(r["tv"]) > 0 for r in rows)
    drafter = load_trained_drafter(tmp_path, model, tokenizer)
    plain = autoregressive_generate(model, prompts[1], max_new_tokens=12, eos_token_ids=eos)
    assert speculative_generate(model, prompts[1], drafter, FixedLength(4), max_new_tokens=12,
                                eos_token_ids=eos).tokens == plain.tokens


def test_draft_lm_distils_and_drafts(target, tiny, prompts, eos, tmp_path):
    model, tokenizer = target
    data, _ = tiny
    config = TrainConfig(**{**QUICK, "drafter": "draft-lm", "layers": 1, "lm_width": 64, "steps": 4,
                            "save_every": 4, "log_every": 2})
    train_draft_lm(config, model, tokenizer, data, tmp_path)
    meta = json.loads((tmp_path / "train_meta.json").read_text())
    assert meta["held_out_ce"] > 0
    weights = tmp_path / "model.safetensors"
    assert weights.stat().st_size < 2 * 49152 * 64 * 2 * 0.75, "the tied embedding was stored twice"
    drafter = build_drafter("draft-lm", model, tokenizer, draft_model=str(tmp_path))
    plain = autoregressive_generate(model, prompts[3], max_new_tokens=12, eos_token_ids=eos)
    assert speculative_generate(model, prompts[3], drafter, FixedLength(3), max_new_tokens=12,
                                eos_token_ids=eos).tokens == plain.tokens
