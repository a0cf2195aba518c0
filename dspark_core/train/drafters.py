"""Training eagle / dflash / dspark drafters on the feature store, and the independent draft LM.

An epoch visits every training sequence once, in a seeded order, a few sequences per step (until
``tokens_per_step`` span tokens are in it). In each sequence the anchors tile every span a drafter
learns (from the token before the span on, as in decoding), so every span token is a block target
once per epoch; a sequence is one micro-batch (no padding), and the step's micro-batches are
weighted by their share of its blocks. The loss is the configured recipe (:mod:`..models.losses`)
against the target's stored top-k distribution.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from ..core.checksums import verify_checksums
from ..core.fp8 import load_weights
from ..core.provenance import machine_info
from ..core.target import target_fingerprint, tokenizer_fingerprint
from ..data.features import FeatureStore
from ..data.sequences import Sequences, Span
from ..models import (
    DrafterConfig,
    EagleDraftModel,
    ParallelDraftModel,
    drafter_loss,
    expected_tau,
    soft_acceptance,
)
from ..models.losses import l1_distance
from ..models.parallel import TargetBoundDraftModel
from .config import TrainConfig
from .loop import fit, save_checkpoint


def split_indices(n: int, val_fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A fixed train / held-out split of sequence indices."""
    order = np.random.default_rng(seed).permutation(n)
    n_val = int(round(n * val_fraction))
    return np.sort(order[n_val:]), np.sort(order[:n_val])


def block_anchors(spans: list[Span], g: int, shift: int = 0) -> np.ndarray:
    """Anchors whose blocks (tokens a+1..a+g) tile every span [s, e): a = s-1, then s-1+shift,
    s-1+shift+g, ..., and the last possible anchor e-1-g so the span's end is covered too (a block
    overlaps its neighbour at the span's ends only). Spans shorter than g+1 give none. 0 <= shift < g."""
    if not 0 <= shift < g:
        raise ValueError(f"shift must be in 0..{g - 1}, got {shift}")
    anchors: set[int] = set()
    for start, end in spans:
        first, last = max(start - 1, 1), end - 1 - g
        if last >= first:
            anchors.update(range(first + shift, last + 1, g))
            anchors.update((first, last))
    return np.array(sorted(anchors), dtype=np.int64)


def step_anchors(spans: list[Span], config: TrainConfig, step: int, row: int) -> np.ndarray:
    """The anchors sequence ``row`` (its ``spans``) trains at ``step``: its block tiling, with
    ``shift_anchors`` shifted by a seeded draw in 0..g-1 (a function of the step, so a resumed run sees
    the same blocks), cut to ``max_blocks``."""
    shift = int(np.random.default_rng([config.seed, step, row]).integers(config.block)) if config.shift_anchors else 0
    return block_anchors(spans, config.block, shift)[: config.max_blocks]


def epoch_steps(sequences: Sequences, rows: np.ndarray, config: TrainConfig, epoch: int) -> list[list[int]]:
    """One epoch's steps: the rows in a seeded order, cut into groups of about ``tokens_per_step`` span tokens."""
    order = np.random.default_rng([config.seed, epoch]).permutation(rows)
    steps, current, size = [], [], 0
    for i in order.tolist():
        current.append(i)
        size += sum(e - s for s, e in sequences.spans[i])
        if size >= config.tokens_per_step:
            steps.append(current)
            current, size = [], 0
    return steps + [current] if current else steps


def make_batch(store: FeatureStore, i: int, anchors: np.ndarray, g: int, ce_label: str = "text",
               pad: tuple[int, int] | None = None) -> dict:
    """Teacher-forced blocks of sequence ``i`` at ``anchors`` [n] (a batch of one sequence).

    Returns tensors: features [1, T, m, d_t] (T = the last anchor: the context any block needs),
    ctx_next_tokens [1, T] (x_{t+1}), anchors / anchor_pos [1, n], ctx_visible [1, n, T],
    prev_tokens / labels [1, n, g] (the token before / at each block position; labels are the text's
    next token or the target's argmax), top_ids / top_probs [1, n, g, k] (the target's distribution
    at each block position), block_weights [1, n] (1; 0 for padding).

    ``pad`` = (blocks, context): round n up to a multiple of ``blocks`` with copies of the last block
    (weight 0) and T up to a multiple of ``context`` with zero features that no block sees. Training
    pads so that its matrix shapes repeat: on a CPU every new shape costs oneDNN a kernel build (about
    a quarter of an unpadded step's time).
    """
    n = len(anchors)
    if pad is not None:
        anchors = np.concatenate([anchors, np.full(-n % pad[0], anchors[-1])])
    tokens = torch.from_numpy(np.asarray(store.sequences.tokens[i], dtype=np.int64))
    width = int(anchors.max())
    at = anchors[:, None] + np.arange(g)  # [n, g]: position anchor + k - 1 predicts token anchor + k
    top_ids, top_probs = store.target_topk(i, at)
    features, next_tokens = store.features(i, width), tokens[1 : width + 1]
    if pad is not None:
        extra = -width % pad[1]
        features = torch.cat([features, features.new_zeros(extra, *features.shape[1:])])
        next_tokens = torch.cat([next_tokens, next_tokens.new_zeros(extra)])
    batch = {
        "features": features,
        "ctx_next_tokens": next_tokens,
        "anchor_pos": torch.from_numpy(anchors),
        "ctx_visible": torch.arange(len(features))[None, :] < torch.from_numpy(anchors)[:, None],
        "prev_tokens": tokens[at],
        "labels": tokens[at + 1] if ce_label == "text" else top_ids[..., 0],
        "top_ids": top_ids,
        "top_probs": top_probs,
        "block_weights": (torch.arange(len(anchors)) < n).float(),
    }
    batch["anchors"] = batch["prev_tokens"][:, 0]
    return {name: value[None] for name, value in batch.items()}


TRAIN_PADDING = (16, 128)  # training batches round blocks up to a multiple of 16 and context to one of 128


def drafter_inputs(batch: dict) -> dict:
    """The part of a batch that a drafter's training forward takes."""
    names = ("features", "ctx_next_tokens", "anchors", "anchor_pos", "ctx_visible", "prev_tokens")
    return {name: batch[name] for name in names}


def target_probs_on_vocab(index: torch.Tensor, top_probs: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """p_t on a vocabulary of ``size`` tokens [..., size] from the target's top-k probabilities [..., k]
    at their ``index`` in it [..., k] (``size`` for a token outside it), and the mass it puts outside
    [...] (outside the vocabulary, or beyond the stored top k)."""
    p = torch.zeros(*index.shape[:-1], size + 1, device=top_probs.device).scatter_add_(-1, index, top_probs)[..., :size]
    return p, (1.0 - p.sum(-1)).clamp_min(0.0)


def target_probs_on_draft_vocab(drafter: TargetBoundDraftModel, top_ids: torch.Tensor, top_probs: torch.Tensor):
    """p_t on the draft vocabulary [..., Vd] from the target's top-k ids / probabilities [..., k], and
    the mass it puts outside [...]."""
    return target_probs_on_vocab(drafter.to_draft_ids(top_ids), top_probs, drafter.config.draft_vocab_size)


def compute_loss(drafter: TargetBoundDraftModel, model: torch.nn.Module, batch: dict, loss: str,
                 position_decay: float | None = None) -> dict[str, torch.Tensor]:
    """Loss terms of one batch; ``model`` is ``drafter`` or its accelerate-wrapped version; ``loss`` and
    ``position_decay`` as in :func:`..models.drafter_loss`."""
    logits, confidences = model(**drafter_inputs(batch))
    p_t, outside = target_probs_on_draft_vocab(drafter, batch["top_ids"], batch["top_probs"])
    return drafter_loss(logits, confidences, p_t, outside, drafter.to_draft_ids(batch["labels"]), loss,
                        batch["block_weights"], position_decay)


def feature_drafter_blocks(drafter: TargetBoundDraftModel, store: FeatureStore, i: int, anchors: np.ndarray,
                           g: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A feature drafter's teacher-forced blocks of sequence ``i`` at ``anchors`` [n]: the analytic
    acceptance at temperature 1 [n, g] and whether its argmax is the target's [n, g]."""
    batch = make_batch(store, i, anchors, g)
    logits, _ = drafter(**drafter_inputs(batch))
    p_t, outside = target_probs_on_draft_vocab(drafter, batch["top_ids"], batch["top_probs"])
    sampled = soft_acceptance(l1_distance(torch.softmax(logits.float(), -1), p_t, outside))[0]
    return sampled, (drafter.draft_token_ids[logits.argmax(-1)] == batch["top_ids"][..., 0])[0]


def draft_lm_blocks(lm: PreTrainedModel, store: FeatureStore, i: int, anchors: np.ndarray,
                    g: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same for a draft LM over the target's vocabulary: one forward over the sequence gives its
    next-token distribution after every true prefix, which is what it drafts from at block position k
    when positions 1..k-1 were accepted (the LM head runs at the block positions only)."""
    at = anchors[:, None] + np.arange(g)  # [n, g]: position anchor + k - 1 predicts token anchor + k
    tokens = torch.from_numpy(np.asarray(store.sequences.tokens[i][: int(at.max()) + 1], dtype=np.int64))
    hidden = lm(input_ids=tokens[None], output_hidden_states=True, logits_to_keep=1).hidden_states[-1][0]  # [T, d]
    logits = lm.get_output_embeddings()(hidden[torch.from_numpy(at)]).float()  # [n, g, V]
    top_ids, top_probs = store.target_topk(i, at)
    p_t, outside = target_probs_on_vocab(top_ids, top_probs, logits.shape[-1])  # outside: beyond the top k
    sampled = soft_acceptance(l1_distance(torch.softmax(logits, -1), p_t, outside))
    return sampled, logits.argmax(-1) == top_ids[..., 0]


@torch.no_grad()
def held_out_acceptance(drafter: TargetBoundDraftModel | PreTrainedModel, store: FeatureStore, rows: np.ndarray,
                        g: int) -> dict[str, list[float]]:
    """Per position on held-out sequences, teacher-forced: ``sampled``, the mean analytic acceptance
    1 - ||p_d - p_t||_1 / 2 at temperature 1 (against the stored top-k, so a lower bound), and
    ``greedy``, the share of blocks whose draft argmax equals the target's argmax at position k
    among those where positions 1..k-1 did. ``drafter`` is a feature drafter or a draft LM."""
    blocks = feature_drafter_blocks if isinstance(drafter, TargetBoundDraftModel) else draft_lm_blocks
    sampled, hits, reached = torch.zeros(g), torch.zeros(g), torch.zeros(g)
    count = 0
    for i in rows.tolist():
        anchors = block_anchors(store.sequences.spans[i], g)
        if not len(anchors):
            continue
        accepted, match = blocks(drafter, store, i, anchors, g)
        sampled += accepted.sum(0)
        survived = torch.cumprod(match.float(), -1)
        hits += survived.sum(0)
        reached += torch.cat([torch.full((survived.shape[0], 1), 1.0), survived[:, :-1]], 1).sum(0)
        count += len(anchors)
    return {"sampled": (sampled / max(1, count)).tolist(), "greedy": (hits / reached.clamp_min(1)).tolist()}


def first_ranked_counts(store: FeatureStore, rows: np.ndarray) -> Counter:
    """How often the target ranks each token first at the span positions of ``rows``."""
    counts: Counter = Counter()
    for i in rows.tolist():
        positions = np.concatenate([np.arange(max(s - 1, 0), e - 1) for s, e in store.sequences.spans[i]] or [np.zeros(0, int)])
        if len(positions):
            counts.update(store.target_topk(i, positions)[0][:, 0].tolist())
    return counts


def coverage_of(counts: Counter, token_ids: list[int]) -> float:
    """The share of the counted positions whose first-ranked token is in ``token_ids``."""
    return sum(counts[t] for t in token_ids) / max(1, sum(counts.values()))


def top_tokens(counts: Counter, size: int) -> torch.Tensor:
    """The ``size`` most counted tokens (ties by id; uncounted low ids fill up), as sorted target ids."""
    ranked = sorted(counts, key=lambda t: (-counts[t], t))[:size]
    ranked += [t for t in range(size + len(ranked)) if t not in counts][: size - len(ranked)]
    return torch.tensor(sorted(ranked), dtype=torch.long)


def frequent_tokens(store: FeatureStore, rows: np.ndarray, size: int) -> tuple[torch.Tensor, float]:
    """The ``size`` tokens the target most often ranks first at span positions of ``rows`` (ties by id):
    the draft vocabulary, as sorted target ids; and the share of those positions it covers."""
    counts = first_ranked_counts(store, rows)
    vocab = top_tokens(counts, size)
    return vocab, coverage_of(counts, vocab.tolist())


def build_drafter_model(config: TrainConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                        draft_token_ids: torch.Tensor) -> TargetBoundDraftModel:
    """A fresh drafter sized like one target layer, bound to the target, with its draft vocabulary
    (and, with ``init_from_target``, its layers copied from the target's last ones; with ``init_drafter``,
    a trained drafter's weights and draft vocabulary)."""
    tc = model.config
    cls = EagleDraftModel if config.drafter == "eagle" else ParallelDraftModel
    drafter = cls(DrafterConfig(
        kind=config.drafter, head=config.head, block_size=config.block, num_layers=config.layers,
        hidden_size=tc.hidden_size, num_heads=tc.num_attention_heads, num_kv_heads=tc.num_key_value_heads,
        head_dim=getattr(tc, "head_dim", tc.hidden_size // tc.num_attention_heads),
        intermediate_size=tc.intermediate_size, rms_norm_eps=tc.rms_norm_eps,
        rope_theta=float(getattr(tc, "rope_parameters", {}).get("rope_theta", 10000.0)),
        feature_layers=config.feature_layers, draft_vocab_size=config.draft_vocab, rank=config.rank,
        target_hidden_size=tc.hidden_size, target_vocab_size=model.get_output_embeddings().weight.shape[0],
        target_fingerprint=target_fingerprint(model, tokenizer), tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
        anchor_feature=config.anchor_feature,
    ))
    drafter.draft_token_ids.copy_(draft_token_ids)
    if config.init_from_target:
        copy_target_layers(drafter, model)
    if config.init_drafter:
        start_from_drafter(drafter, Path(config.init_drafter))
    drafter.attach_target(model.get_input_embeddings().weight, model.get_output_embeddings().weight)
    return drafter


def copy_target_layers(drafter: TargetBoundDraftModel, model: PreTrainedModel) -> None:
    """Draft layer j starts as target decoder layer L - n + j (the target's top n layers): attention
    and MLP projections and both norms; the drafter's own keys/values of the context come from the
    same projections applied to the fused features."""
    target_layers = model.model.layers[-len(drafter.layers):]
    pairs = {"q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
             "o_proj": "self_attn.o_proj", "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj",
             "down_proj": "mlp.down_proj", "attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}
    with torch.no_grad():
        for mine, theirs in zip(drafter.layers, target_layers):
            for name, path in pairs.items():
                getattr(mine, name).weight.copy_(theirs.get_submodule(path).weight.float())


# What a warm start must share with the drafter it starts from (the weights' shapes alone miss some).
WARM_START_FIELDS = ("kind", "head", "block_size", "num_layers", "hidden_size", "feature_layers", "draft_vocab_size",
                     "rank", "anchor_feature", "target_fingerprint", "tokenizer_fingerprint")


def start_from_drafter(drafter: TargetBoundDraftModel, folder: Path) -> None:
    """Load the trained drafter in ``folder`` (checksums checked) into ``drafter``: its weights and its draft
    vocabulary. Raises ValueError, naming the settings, where the two differ in architecture or target."""
    verify_checksums(folder)
    trained = DrafterConfig.from_pretrained(folder).to_dict()
    mine = drafter.config.to_dict()
    differ = [f"{name} {trained.get(name)!r} (theirs) vs {mine[name]!r}" for name in WARM_START_FIELDS
              if _plain(trained.get(name)) != _plain(mine[name])]
    if differ:
        raise ValueError(f"--init-drafter {folder} is another architecture or target: " + "; ".join(differ)
                         + ". Pass the training flags it was trained with (its train_meta.json), or start from scratch.")
    load_weights(drafter, folder)


def _plain(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value


def run_metadata(config: TrainConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                 sequences: Sequences, seen: list[int], **extra) -> dict:
    """What a run was trained on and with: written as train_meta.json beside the checkpoint.
    ``seen``: the distinct sequences its steps visited; ``train_tokens`` counts their tokens."""
    visited = sequences.select(sorted(set(seen)))
    return {
        "config": asdict(config), "target_fingerprint": target_fingerprint(model, tokenizer),
        "data": {"fingerprint": sequences.fingerprint(), "sequences": len(sequences), "tokens": sequences.total_tokens,
                 **sequences.meta},
        "train_tokens": visited.total_tokens, "train_span_tokens": visited.span_tokens, "mix": visited.counts(),
        "machine": machine_info(), **extra,
    }


def epoch_rows(sequences: Sequences, rows: np.ndarray, distill_repeats: int) -> np.ndarray:
    """The rows one epoch visits: ``rows``, with every self-distilled one (source ``distill:*``)
    ``distill_repeats`` times."""
    distilled = np.array([sequences.sources[i].startswith("distill:") for i in rows.tolist()], dtype=bool)
    return np.sort(np.concatenate([rows] + [rows[distilled]] * (distill_repeats - 1)))


def planned_steps(sequences: Sequences, rows: np.ndarray, config: TrainConfig) -> list[list[int]]:
    """Every step's sequence rows: ``epochs`` passes (the last one cut short when fractional), or ``steps``,
    each pass over :func:`epoch_rows`. Sets ``config.steps`` and ``config.epochs`` to what the plan covers,
    whichever of the two was given."""
    rows = epoch_rows(sequences, rows, config.distill_repeats)
    plan: list[list[int]] = []
    epoch = 0
    per_epoch = len(epoch_steps(sequences, rows, config, 0))
    total = config.steps or math.ceil(config.epochs * per_epoch)
    while len(plan) < total:
        plan += epoch_steps(sequences, rows, config, epoch)
        epoch += 1
    config.steps, config.epochs = total, round(total / per_epoch, 2)
    return plan[:total]


def train(
    config: TrainConfig,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    store: FeatureStore,
    out_dir: Path,
    on_save: Callable[[int, torch.nn.Module], None] | None = None,
) -> TargetBoundDraftModel:
    """Train (or resume) an eagle / dflash / dspark drafter into ``out_dir``; returns it bound to the target.
    ``on_save(step, drafter)`` runs at every checkpoint."""
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(config.seed)
    sequences = store.sequences
    train_rows, val_rows = split_indices(len(sequences), config.val_fraction, config.seed)
    counts = first_ranked_counts(store, train_rows)
    drafter = build_drafter_model(config, model, tokenizer, top_tokens(counts, config.draft_vocab))
    coverage = coverage_of(counts, drafter.draft_token_ids.tolist())  # a warm start keeps its drafter's vocabulary
    plan = planned_steps(sequences, train_rows, config)
    meta = run_metadata(config, model, tokenizer, sequences, [i for step in plan for i in step],
                        feature_store=store.folder.name, train_sequences=len(train_rows), val_sequences=len(val_rows),
                        draft_vocab_coverage_train=coverage)
    (out_dir / "train_meta.json").write_text(json.dumps(meta, indent=1, default=str))

    def batches_for(step: int) -> list[dict]:
        batches = [make_batch(store, i, a, config.block, config.ce_label, TRAIN_PADDING)
                   for i in plan[step] if len(a := step_anchors(sequences.spans[i], config, step, i))]
        blocks = sum(float(b["block_weights"].sum()) for b in batches)
        return [{**b, "weight": float(b["block_weights"].sum()) / blocks} for b in batches]

    desc = f"train {config.drafter}" + (f"-{config.head}" if config.drafter == "dspark" else "")
    drafter = fit(drafter, lambda m, b: compute_loss(drafter, m, b, config.loss, config.position_decay or None),
                  batches_for, config, out_dir, desc, on_save)
    save_checkpoint(drafter, out_dir, config.save_dtype)
    if len(val_rows):
        acceptance = held_out_acceptance(drafter, store, val_rows, config.block)
        meta["held_out_acceptance"] = [round(a, 4) for a in acceptance["sampled"]]
        meta["held_out_expected_tau"] = float(expected_tau(torch.tensor(acceptance["sampled"])))
        meta["held_out_greedy_acceptance"] = [round(a, 4) for a in acceptance["greedy"]]
        (out_dir / "train_meta.json").write_text(json.dumps(meta, indent=1, default=str))
    return drafter


def build_draft_lm(config: TrainConfig, model: PreTrainedModel) -> LlamaForCausalLM:
    """A small Llama with the target's vocabulary, special tokens and RoPE. Its embedding starts as
    the target's, projected to ``lm_width`` by a fixed random matrix (token structure for free)."""
    tc = model.config
    heads = max(1, config.lm_width // 64)
    lm = LlamaForCausalLM(LlamaConfig(
        vocab_size=tc.vocab_size, hidden_size=config.lm_width, intermediate_size=config.lm_width * 8 // 3,
        num_hidden_layers=config.layers, num_attention_heads=heads, num_key_value_heads=heads,
        max_position_embeddings=tc.max_position_embeddings, rope_parameters=getattr(tc, "rope_parameters", None),
        rms_norm_eps=tc.rms_norm_eps, tie_word_embeddings=True, bos_token_id=tc.bos_token_id,
        eos_token_id=tc.eos_token_id, pad_token_id=tc.pad_token_id,
    ))
    generator = torch.Generator().manual_seed(config.seed)
    projection = torch.randn(tc.hidden_size, config.lm_width, generator=generator) / math.sqrt(tc.hidden_size)
    with torch.no_grad():
        lm.get_input_embeddings().weight.copy_(model.get_input_embeddings().weight.float() @ projection)
    lm.generation_config.eos_token_id = model.generation_config.eos_token_id
    return lm


def lm_batch(sequences: Sequences, rows: list[int]) -> dict:
    """Token ids of ``rows``, right-padded; the loss covers span tokens only."""
    width = max(len(sequences.tokens[i]) for i in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for row, i in enumerate(rows):
        seq = torch.from_numpy(np.asarray(sequences.tokens[i], dtype=np.int64))
        ids[row, : len(seq)], mask[row, : len(seq)] = seq, 1
        for start, end in sequences.spans[i]:
            labels[row, start:end] = seq[start:end]
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def draft_lm_loss(lm: torch.nn.Module, head: torch.nn.Module, batch: dict) -> dict[str, torch.Tensor]:
    """Next-token CE on the span tokens of an ``lm_batch``: the same number as ``lm(**batch).loss``, with
    the LM head ``head`` applied at those positions only, not over the prompt and the padding. ``lm``
    may be wrapped by accelerate (its forward runs through the wrapper); ``head`` is its output embedding."""
    out = lm(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True,
             logits_to_keep=1)
    hidden = out.hidden_states[-1]  # [B, T, d], after the final norm
    labels = batch["labels"][:, 1:]  # position t predicts token t + 1
    keep = labels != -100
    logits = head(hidden[:, :-1][keep])  # [span tokens, V]
    return {"loss": torch.nn.functional.cross_entropy(logits.float(), labels[keep])}


def train_draft_lm(
    config: TrainConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, sequences: Sequences, out_dir: Path,
    on_save: Callable[[int, torch.nn.Module], None] | None = None,
) -> LlamaForCausalLM:
    """Distil an independent small draft LM from the training text (CE on span tokens); ``on_save`` as in
    :func:`train`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(config.seed)
    lm = build_draft_lm(config, model)
    train_rows, val_rows = split_indices(len(sequences), config.val_fraction, config.seed)
    plan = planned_steps(sequences, train_rows, config)
    meta = run_metadata(config, model, tokenizer, sequences, [i for step in plan for i in step],
                        train_sequences=len(train_rows), val_sequences=len(val_rows))

    def batches_for(step: int) -> list[dict]:
        return [{**lm_batch(sequences, plan[step]), "weight": 1.0}]

    head = lm.get_output_embeddings()
    lm = fit(lm, lambda m, b: draft_lm_loss(m, head, b), batches_for, config, out_dir, "train draft-lm", on_save)
    lm.config.tokenizer_fingerprint = tokenizer_fingerprint(tokenizer)  # the target's tokenizer serves it (not stored)
    save_checkpoint(lm, out_dir, config.save_dtype)
    if len(val_rows):
        with torch.no_grad():
            losses = [float(draft_lm_loss(lm, head, lm_batch(sequences, list(chunk)))["loss"])
                      for chunk in np.array_split(val_rows, max(1, len(val_rows) // 8)) if len(chunk)]
        meta["held_out_ce"] = float(np.mean(losses))
    (out_dir / "train_meta.json").write_text(json.dumps(meta, indent=1, default=str))
    return lm
