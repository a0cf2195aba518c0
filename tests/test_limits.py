"""Limits: a request that does not fit the target's context window, and a gamma beyond a trained
drafter's block, are clear errors before any forward, from the library, the engine and the CLI;
``bench`` records an over-long turn as skipped and measures the rest."""

import json

import pandas as pd
import pytest

from dspark_core import (
    FixedLength,
    NgramDrafter,
    autoregressive_generate,
    speculative_generate,
)
from dspark_core.cli import main
from dspark_core.core.jsonl import read_jsonl
from dspark_core.decode.engine import BatchedEngine
from dspark_core.decode.policies import HardwareAware
from dspark_core.drafters.registry import shipped_drafter
from dspark_core.drafters.trained import BlockDrafter

from .tiny import drafter_for, tiny_target

WINDOW = 64


@pytest.fixture(scope="module")
def tiny():
    return tiny_target(window=WINDOW)


def test_library_refuses_a_request_past_the_context_window(tiny):
    model, _ = tiny
    prompt = list(range(1, 15)) * 4  # 56 tokens
    assert len(autoregressive_generate(model, prompt, max_new_tokens=WINDOW - 56).tokens) == WINDOW - 56  # fits exactly
    message = r"prompt \(56 tokens\) plus max_new_tokens \(9\) is 65 tokens, more than the target's context window of 64"
    with pytest.raises(ValueError, match=message):
        speculative_generate(model, prompt, NgramDrafter(), FixedLength(3), max_new_tokens=9)
    engine = BatchedEngine(model, FixedLength(3), NgramDrafter)
    with pytest.raises(ValueError, match=message):
        engine.submit(prompt, 9)
    assert not engine.waiting  # nothing was queued


def test_gamma_beyond_a_trained_block_is_an_error(tiny):
    model, tokenizer = tiny
    block = BlockDrafter(drafter_for(model, tokenizer, "dspark-markov", draft_vocab_size=12, rank=8, block_size=4,
                                     tokenizer_fingerprint="", target_fingerprint=""), model, tokenizer)
    prompt = [3, 7, 1, 9, 4]
    assert len(speculative_generate(model, prompt, block, FixedLength(4), max_new_tokens=8).tokens) == 8
    with pytest.raises(ValueError, match=r"gamma 5 exceeds this drafter's block of 4 tokens.*Pass gamma <= 4"):
        speculative_generate(model, prompt, block, HardwareAware(5, lambda tokens, requests: 1.0), max_new_tokens=8)
    engine = BatchedEngine(model, FixedLength(40), lambda: block)
    with pytest.raises(ValueError, match="gamma 40 exceeds this drafter's block of 4"):
        engine.submit(prompt, 8)


def shipped_block() -> int:
    return json.loads((shipped_drafter("dspark-markov") / "config.json").read_text())["block_size"]


@pytest.mark.slow  # runs dspark generate on the default target
def test_cli_generate_refuses_both(capsys):
    document = "Summarize. " + " ".join(f"word{i}" for i in range(4000))  # about 9,000 tokens
    assert main(["generate", "--prompt", document, "--drafter", "ngram", "--max-new-tokens", "64"]) == 2
    err = capsys.readouterr().err
    assert "plus max_new_tokens (64)" in err and "context window of 8192 tokens" in err
    block = shipped_block()
    assert main(["generate", "--prompt", "Hi.", "--drafter", "dspark", "--gamma", str(block + 33)]) == 2
    assert f"gamma {block + 33} exceeds this drafter's block of {block} tokens" in capsys.readouterr().err


@pytest.mark.slow  # runs dspark bench on the default target
def test_bench_skips_over_long_turns_and_refuses_a_gamma_beyond_the_block(tmp_path, capsys):
    long_turn = "Summarize. " + " ".join(f"word{i}" for i in range(4000))
    prompts = tmp_path / "mixed.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": "short", "domain": "chat", "turns": ["Name two colours."]},
        {"id": "long", "domain": "chat", "turns": [long_turn, "And in one word?"]},
    ]))
    out = tmp_path / "run"
    bench = ["bench", "--benchmarks", str(prompts), "--n-prompts", "2", "--methods", "ngram:3", "--temperatures", "0",
             "--max-new-tokens", "8", "--dtypes", "float32", "--out", str(out)]
    for _ in range(2):  # the rerun resumes: nothing measured or skipped twice
        assert main(bench) == 0
        rows = pd.read_csv(out / "rows.csv")
        assert set(rows["prompt_id"]) == {"short"} and len(rows) == 2
        skipped = read_jsonl(out / "skipped.jsonl")
        assert [(s["prompt_id"], s["turn"]) for s in skipped] == [("long", 1), ("long", 2)]
        assert "context window of 8192 tokens" in skipped[0]["reason"] and "turn 1" in skipped[1]["reason"]
    captured = capsys.readouterr()
    assert captured.out.count("long turn 1: the prompt (") == 1  # said once, by the run that skipped it

    block = shipped_block()
    other = tmp_path / "gamma"
    assert main(["bench", "--benchmarks", "smoke", "--methods", f"dspark-markov:{block + 2}", "--out", str(other)]) == 2
    assert f"exceeds this drafter's block of {block}" in capsys.readouterr().err
    assert not other.exists()  # refused before the run folder was written, so a corrected command can use it
