"""Bad input fails early with an error that says what to change."""

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast

from dspark_core import (
    DraftLMDrafter,
    FixedLength,
    NgramDrafter,
    encode_prompt,
    load_target,
    speculative_generate,
)
from dspark_core.cli import main
from dspark_core.core.prompts import load_prompt_set
from dspark_core.drafters.registry import build_drafter
from dspark_core.eval.bench import parse_methods


def test_empty_prompt(target):
    model, tokenizer = target
    for empty in ["", "   ", []]:
        with pytest.raises(ValueError, match="prompt is empty"):
            encode_prompt(tokenizer, empty)
    with pytest.raises(ValueError, match="prompt is empty"):
        speculative_generate(model, torch.zeros(0, dtype=torch.long))


def test_max_new_tokens_below_one(target, prompts):
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        speculative_generate(target[0], prompts[0], NgramDrafter(), FixedLength(3), max_new_tokens=0)


def test_drafter_without_policy(target, prompts):
    with pytest.raises(ValueError, match="verification policy"):
        speculative_generate(target[0], prompts[0], NgramDrafter())


def test_unknown_drafter_and_missing_checkpoints(target, tmp_path):
    with pytest.raises(ValueError, match="Unknown drafter 'eagle9'.*ngram"):
        build_drafter("eagle9", *target)
    for name in ("eagle", "dflash", "dspark"):
        with pytest.raises(ValueError, match="Could not load the drafter checkpoint .* missing, truncated or corrupt"):
            build_drafter(name, *target, draft_model=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="Could not load model"):
        build_drafter("draft-lm", *target, draft_model=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="reference continuation"):
        build_drafter("oracle", *target)


def test_draft_lm_with_another_tokenizer(target):
    model, tokenizer = target
    other = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]")))
    with pytest.raises(ValueError, match="tokenizer .* differs from the target's"):
        DraftLMDrafter(model, other, tokenizer)


def test_unknown_model_id_offline():
    with pytest.raises(ValueError, match="Could not load model 'no-such-org/no-such-model'"):
        load_target("no-such-org/no-such-model")


def test_bad_gamma_and_methods():
    with pytest.raises(ValueError, match="gamma must be >= 0"):
        FixedLength(-1)
    with pytest.raises(ValueError, match="needs block lengths"):
        parse_methods("ngram")
    with pytest.raises(ValueError, match="Unknown method 'ngramm'"):
        parse_methods("ngramm:3")
    with pytest.raises(ValueError, match="needs a dspark drafter's confidences"):
        parse_methods("dflash:hw7")
    with pytest.raises(ValueError, match="block lengths are integers"):
        parse_methods("dspark-markov:seven")


def test_bad_prompt_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_prompt_set(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x", "domain": "chat", "turns": [""]}\n')
    with pytest.raises(ValueError, match="non-empty turns"):
        load_prompt_set(bad)


def test_cli_reports_errors_without_traceback(capsys):
    assert main(["generate", "--prompt", "hi", "--drafter", "nope"]) == 2
    assert "Unknown drafter 'nope'" in capsys.readouterr().err
