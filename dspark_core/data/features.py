"""Feature cache: the frozen target's hidden states over the distillation data, computed once.

For every sequence (prompt + target-written response) it stores, per token, the hidden states at
the drafters' ``feature_layers`` plus the final (normed) hidden state, in float16, and the
log-normaliser of the target's logits (so ``p_t`` on any sub-vocabulary is
``exp(h_final . W[ids] - logsumexp)`` without the full LM head at training time).

Files live in ``$DSPARK_CACHE_DIR/features/<key>/`` (never committed), where the key hashes the
target fingerprint, the packed data and the layers: new data or another target makes a new key, so
a stale cache is never read. Building is resumable: progress is saved every few sequences.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..core.target import cache_dir, target_fingerprint
from .sequences import Sequences


@dataclass
class FeatureCache:
    """Memory-mapped features of every sequence, flat over tokens.

    tokens:   [N] int32 token ids; offsets: [S + 1] sequence boundaries; prompt_lens: [S].
    hidden:   [N, m + 1, d] float16: the m feature layers, then the final hidden state.
    lse:      [N] float32 log-sum-exp of the target logits at each position.
    """

    folder: Path
    layers: tuple[int, ...]
    tokens: np.ndarray
    offsets: np.ndarray
    prompt_lens: np.ndarray
    hidden: np.ndarray
    lse: np.ndarray

    def __len__(self) -> int:
        return len(self.prompt_lens)


def cache_key(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, data: Sequences, layers: tuple[int, ...]) -> str:
    payload = json.dumps({
        "target": target_fingerprint(model, tokenizer),
        "data": hashlib.sha256(json.dumps([data.prompts, data.responses]).encode()).hexdigest(),
        "layers": list(layers),
    })
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def build_feature_cache(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    data: Sequences,
    layers: tuple[int, ...],
    root: Path | None = None,
    batch_size: int = 8,
) -> FeatureCache:
    """Open the cache for (target, data, layers), computing whatever is missing first (``batch_size``
    sequences per target forward; progress is saved after each batch, so an interrupted build resumes)."""
    folder = (root or cache_dir() / "features") / cache_key(model, tokenizer, data, layers)
    folder.mkdir(parents=True, exist_ok=True)
    sequences = [p + r for p, r in zip(data.prompts, data.responses)]
    offsets = np.cumsum([0] + [len(s) for s in sequences]).astype(np.int64)
    total, rows, dim = int(offsets[-1]), len(layers) + 1, model.config.hidden_size  # rows: m layers + final
    mode = "r+" if (folder / "hidden.npy").is_file() else "w+"
    hidden = np.lib.format.open_memmap(folder / "hidden.npy", mode=mode, dtype=np.float16, shape=(total, rows, dim))
    lse = np.lib.format.open_memmap(folder / "lse.npy", mode=mode, dtype=np.float32, shape=(total,))
    progress_file = folder / "progress.json"
    done = json.loads(progress_file.read_text())["sequences"] if progress_file.is_file() else 0
    if done < len(sequences):
        with torch.inference_mode(), tqdm(total=len(sequences), initial=done, desc="features", unit="seq") as bar:
            for first in range(done, len(sequences), batch_size):
                batch = sequences[first : first + batch_size]
                width = max(len(s) for s in batch)
                ids = torch.zeros(len(batch), width, dtype=torch.long)
                mask = torch.zeros_like(ids)
                for row, seq in enumerate(batch):  # right padding: causal attention keeps real positions exact
                    ids[row, : len(seq)], mask[row, : len(seq)] = torch.tensor(seq), 1
                out = model(input_ids=ids.to(model.device), attention_mask=mask.to(model.device), output_hidden_states=True)
                states = torch.stack([out.hidden_states[layer] for layer in layers] + [out.hidden_states[-1]], 2)
                if states.abs().max() > torch.finfo(torch.float16).max:
                    raise ValueError("target hidden states overflow float16 in the feature cache; choose other "
                                     "--feature-layers (this target's activations are too large to store)")
                log_norm = torch.logsumexp(out.logits.float(), -1)
                for row, seq in enumerate(batch):
                    i = first + row
                    hidden[offsets[i] : offsets[i + 1]] = states[row, : len(seq)].half().cpu().numpy()
                    lse[offsets[i] : offsets[i + 1]] = log_norm[row, : len(seq)].cpu().numpy()
                hidden.flush()
                lse.flush()
                progress_file.write_text(json.dumps({"sequences": first + len(batch)}))
                bar.update(len(batch))
    tokens = np.concatenate([np.asarray(s, dtype=np.int32) for s in sequences])
    prompt_lens = np.array([len(p) for p in data.prompts], dtype=np.int64)
    return FeatureCache(folder, tuple(layers), tokens, offsets, prompt_lens,
                        np.load(folder / "hidden.npy", mmap_mode="r"), np.load(folder / "lse.npy", mmap_mode="r"))
