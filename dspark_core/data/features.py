"""The feature store: the frozen target's view of the training text, computed once per target and data.

For every token of every training sequence the target's forward gives the two things a drafter
learns from:

- its hidden states at the drafter's ``layers`` (the context features, eq. 2), kept in float8
  (e4m3) with one float32 scale per token and layer: 2% relative error, a quarter of float32's disk;
- its next-token distribution at temperature 1, kept as the ``top_k`` most likely tokens and their
  probabilities (float16). The mass outside them is ``1 - sum``; the loss treats it as mass the
  drafter cannot match, so it is exact when ``top_k`` covers the distribution (the top 16 tokens
  hold nearly all of this target's mass) and an upper bound on the L1 distance otherwise. It is
  computed only where a drafter reads it (:func:`label_positions`: from the token before each span to
  the one before its end); elsewhere (a conversation's user turns) the ids and probabilities are 0.
  The LM head is a fifth of a forward's multiply-adds, so this saves about a tenth of the build.

At ~1.9 KB per token (3 layers of width 576, top 16) ten million tokens take 19 GB; the store
refuses to start when the estimate exceeds ``max_gb``. Files live in
``$DSPARK_CACHE_DIR/features/<key>/`` (never committed), keyed by the target fingerprint and
dtype, the data's fingerprint and the spec, so stale features are never read. The store is built
in chunks of whole sequences, each written atomically: an interrupted build resumes at the first
missing chunk.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..core.fp8 import from_fp8, to_fp8
from ..core.paths import process_tmp
from ..core.target import cache_dir, target_fingerprint
from .sequences import Sequences, Span

# Rows of the LM head computed at a time. 128 rows of float32 logits (25 MB for this target's 49,152 tokens)
# stay near the CPU's caches through the top-k and log-sum-exp; 2,048-row slices (400 MB) made that tail
# cost about as much as the target's forward on short sequences.
HEAD_ROWS = 128


@dataclass(frozen=True)
class FeatureSpec:
    layers: tuple[int, ...] = (2, 15, 28)
    top_k: int = 16
    chunk_tokens: int = 1 << 18  # tokens per chunk file (whole sequences)
    tokens_per_forward: int = 8192  # batch size of the target forwards, in (padded) tokens

    def bytes_per_token(self, hidden_size: int) -> int:
        return len(self.layers) * (hidden_size + 4) + self.top_k * 6


def quantize(hidden: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """[..., d] float -> (float8 e4m3 bits [..., d] uint8, scales [...] float32), as :func:`..core.fp8.to_fp8`."""
    values, scales = to_fp8(hidden)
    return values.view(torch.uint8).numpy(), scales.numpy()


def dequantize(bits: np.ndarray, scales: np.ndarray) -> torch.Tensor:
    """Inverse of :func:`quantize`: float32 [..., d]."""
    return from_fp8(torch.from_numpy(np.array(bits)).view(torch.float8_e4m3fn), torch.from_numpy(np.array(scales)))


def _chunks(lengths: list[int], chunk_tokens: int) -> list[tuple[int, int]]:
    """[first, end) sequence ranges of about ``chunk_tokens`` tokens each."""
    bounds, first, size = [], 0, 0
    for i, n in enumerate(lengths):
        if size and size + n > chunk_tokens:
            bounds.append((first, i))
            first, size = i, 0
        size += n
    return bounds + [(first, len(lengths))] if lengths else bounds


class FeatureStore:
    """Memory-mapped features of every sequence. Sequence i lives in chunk ``chunk_of[i]`` at token
    offset ``start_of[i]``; :meth:`features` and :meth:`target_topk` read it back."""

    FILES = ("bits", "scales", "topk_ids", "topk_probs")

    def __init__(self, folder: Path, spec: FeatureSpec, sequences: Sequences):
        self.folder, self.spec, self.sequences = folder, spec, sequences
        lengths = [len(t) for t in sequences.tokens]
        self.bounds = _chunks(lengths, spec.chunk_tokens)
        self.chunk_of = np.zeros(len(lengths), dtype=np.int64)
        self.start_of = np.zeros(len(lengths), dtype=np.int64)
        for c, (first, end) in enumerate(self.bounds):
            self.chunk_of[first:end] = c
            self.start_of[first:end] = np.cumsum([0] + lengths[first:end])[:-1]
        self._open: dict[int, dict[str, np.ndarray]] = {}

    def chunk_path(self, c: int, name: str) -> Path:
        return self.folder / f"{c:05d}-{name}.npy"

    def done(self, c: int) -> bool:
        return self.chunk_path(c, "topk_probs").is_file()  # written last

    def _arrays(self, c: int) -> dict[str, np.ndarray]:
        if c not in self._open:
            if not self.done(c):
                raise RuntimeError(f"chunk {c} of {self.folder} is not built; run build_feature_store first")
            self._open[c] = {name: np.load(self.chunk_path(c, name), mmap_mode="r") for name in self.FILES}
        return self._open[c]

    def features(self, i: int, end: int | None = None) -> torch.Tensor:
        """Context features of sequence i, positions [0, end): float32 [end, m, d]."""
        arrays, start = self._arrays(int(self.chunk_of[i])), int(self.start_of[i])
        stop = start + (len(self.sequences.tokens[i]) if end is None else end)
        return dequantize(arrays["bits"][start:stop], arrays["scales"][start:stop])

    def target_topk(self, i: int, positions: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The target's top-k next-token ids [..., k] (int64) and probabilities [..., k] (float32) at
        ``positions`` [...] of sequence i (the distribution of the token after each position)."""
        arrays, at = self._arrays(int(self.chunk_of[i])), int(self.start_of[i]) + positions
        return (torch.from_numpy(arrays["topk_ids"][at].astype(np.int64)),
                torch.from_numpy(arrays["topk_probs"][at].astype(np.float32)))


def store_key(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, sequences: Sequences, spec: FeatureSpec) -> str:
    payload = {"target": target_fingerprint(model, tokenizer), "dtype": str(model.dtype), "data": sequences.fingerprint(),
               "layers": list(spec.layers), "top_k": spec.top_k, "chunk_tokens": spec.chunk_tokens}
    return hashlib.sha256(json.dumps(payload).encode()).hexdigest()[:16]


def label_positions(spans: list[Span], length: int) -> np.ndarray:
    """[length] bool: the positions whose next-token distribution a drafter learns from, positions
    max(s - 1, 0) .. e - 2 of every span [s, e) (a block after anchor a reads positions a .. a + g - 1)."""
    needed = np.zeros(length, dtype=bool)
    for start, end in spans:
        needed[max(start - 1, 0) : min(end - 1, length)] = True
    return needed


@torch.inference_mode()
def target_features(model: PreTrainedModel, batch: list[np.ndarray], spec: FeatureSpec,
                    needed: list[np.ndarray] | None = None) -> list[tuple[torch.Tensor, ...]]:
    """Per sequence: (hidden [L, m, d], top-k ids [L, k], top-k probs [L, k]) from one right-padded forward.
    ``needed``: per sequence a [L] bool mask of the positions that get the top k (the rest get ids and
    probabilities 0); all positions when None."""
    width = max(len(s) for s in batch)
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    wanted = torch.zeros(len(batch), width, dtype=torch.bool)
    for row, seq in enumerate(batch):
        ids[row, : len(seq)] = torch.from_numpy(seq.astype(np.int64))
        wanted[row, : len(seq)] = True if needed is None else torch.from_numpy(needed[row])
    # Right padding needs no attention mask: causal attention never lets a real position see the padding to its
    # right. Without one, real positions come out equal and the forward runs 1.36x the tokens/s on 4 rows of
    # 1,536-2,048 tokens (data/results/prefill/padding_mask.py).
    out = model.model(input_ids=ids.to(model.device), output_hidden_states=True)
    head = model.get_output_embeddings().weight
    chosen = out.last_hidden_state[wanted.to(model.device)]  # [N, d]: the LM head runs where the top k is kept
    flat_ids = torch.zeros(len(chosen), spec.top_k, dtype=torch.long)
    flat_probs = torch.zeros(len(chosen), spec.top_k)
    for start in range(0, len(chosen), HEAD_ROWS):
        rows = slice(start, start + HEAD_ROWS)
        logits = (chosen[rows] @ head.T).float()
        values, order = logits.topk(spec.top_k, dim=-1)
        flat_ids[rows] = order.cpu()
        flat_probs[rows] = torch.exp(values - torch.logsumexp(logits, -1, keepdim=True)).cpu()
    top_ids = torch.zeros(len(batch), width, spec.top_k, dtype=torch.long)
    top_probs = torch.zeros(len(batch), width, spec.top_k)
    top_ids[wanted], top_probs[wanted] = flat_ids, flat_probs
    return [(torch.stack([out.hidden_states[layer][row, : len(seq)] for layer in spec.layers], dim=1).cpu(),
             top_ids[row, : len(seq)], top_probs[row, : len(seq)]) for row, seq in enumerate(batch)]


def build_feature_store(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    sequences: Sequences,
    spec: FeatureSpec = FeatureSpec(),
    root: Path | None = None,
    max_gb: float = 20.0,
) -> FeatureStore:
    """Open the store for (target, data, spec), computing the chunks it lacks first."""
    estimate = sequences.total_tokens * spec.bytes_per_token(model.config.hidden_size) / 1e9
    if estimate > max_gb:
        raise ValueError(f"The feature store for {sequences.total_tokens:,} tokens would take {estimate:.1f} GB, over the "
                         f"{max_gb:g} GB budget; train on fewer sequences, fewer --feature-layers, or raise the budget.")
    folder = (root or cache_dir() / "features") / store_key(model, tokenizer, sequences, spec)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "spec.json").write_text(json.dumps({**asdict(spec), "sequences": len(sequences),
                                                  "tokens": sequences.total_tokens, "estimated_gb": estimate}))
    store = FeatureStore(folder, spec, sequences)
    todo = [c for c in range(len(store.bounds)) if not store.done(c)]
    m, d = len(spec.layers), model.config.hidden_size
    with tqdm(total=sequences.total_tokens, desc="features", unit="tok", unit_scale=True,
              initial=sequences.total_tokens - sum(len(sequences.tokens[i]) for c in todo
                                                   for i in range(*store.bounds[c]))) as bar:
        for c in todo:
            first, end = store.bounds[c]
            size = sum(len(sequences.tokens[i]) for i in range(first, end))
            arrays = {"bits": np.zeros((size, m, d), np.uint8), "scales": np.zeros((size, m), np.float32),
                      "topk_ids": np.zeros((size, spec.top_k), np.int32), "topk_probs": np.zeros((size, spec.top_k), np.float16)}
            order = sorted(range(first, end), key=lambda i: len(sequences.tokens[i]))  # little padding per forward
            while order:  # ascending lengths: the last sequence added is the widest
                batch = [order.pop(0)]
                while order and (len(batch) + 1) * len(sequences.tokens[order[0]]) <= spec.tokens_per_forward:
                    batch.append(order.pop(0))
                computed = target_features(model, [sequences.tokens[i] for i in batch], spec,
                                           [label_positions(sequences.spans[i], len(sequences.tokens[i])) for i in batch])
                for i, (hidden, top_ids, top_probs) in zip(batch, computed):
                    at = slice(int(store.start_of[i]), int(store.start_of[i]) + len(sequences.tokens[i]))
                    arrays["bits"][at], arrays["scales"][at] = quantize(hidden)
                    arrays["topk_ids"][at], arrays["topk_probs"][at] = top_ids.numpy(), top_probs.numpy()
                    bar.update(len(sequences.tokens[i]))
            for name in FeatureStore.FILES:  # topk_probs last: its presence marks the chunk complete
                tmp = process_tmp(store.chunk_path(c, name))
                np.save(tmp, arrays[name])
                tmp.rename(store.chunk_path(c, name))
    return store
