"""A batched speculative-decoding engine: R concurrent requests, one target forward per round.

Every round each active request drafts a block, the policy picks each request's verification
length (jointly for the hardware-aware scheduler), and ONE target forward verifies every request's
``[anchor, x_1..x_l]``, right-padded to the longest. Requests join (after a prefill of their own)
and leave between rounds.

KV layout: one cache of shape [R, heads, S, head_dim] whose S *slots* are shared by all rows. A
round appends the same number of slots to every row; slots that hold padding or rejected draft
tokens become *holes*, masked out of attention for good (``valid`` [R, S]). Rolling a request back
is therefore masking, not copying, and rows never move. Positions (RoPE) are per request. After a
round the cache is compacted (holes dropped) once it holds more than ``COMPACT_SLACK`` times the
slots the longest live request needs and more than ``COMPACT_MIN_SLOTS``: between rounds
``S <= max(COMPACT_MIN_SLOTS, COMPACT_SLACK * max_r valid[r].sum())``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, PreTrainedModel

from ..core.limits import check_block, check_context
from ..core.rounds import Draft, DraftContext, Drafter, GenerationResult
from ..core.sampling import SamplingConfig
from .loop import Stopwatch, commit_round, verify_round
from .policies import VerificationPolicy

COMPACT_MIN_SLOTS = 64  # a cache this small is never compacted (copying would cost more than the holes)
COMPACT_SLACK = 2  # compact when the slots exceed this many times the longest live request's committed tokens


@dataclass
class Request:
    """One generation in the engine: its committed tokens, drafter state and per-round records."""

    id: int
    prompt: list[int]
    max_new_tokens: int
    drafter: Drafter | None
    generator: torch.Generator
    tokens: list[int] = field(default_factory=list)  # prompt + committed new tokens
    result: GenerationResult | None = None
    new_features: torch.Tensor | None = None  # target features of committed tokens the drafter has not seen yet
    finished: bool = False


class BatchedKV:
    """The shared slot cache. ``valid[r, s]``: slot s of row r holds a committed token of request r."""

    def __init__(self, model: PreTrainedModel):
        self.model = model
        self.cache: DynamicCache | None = None
        self.valid = torch.zeros(0, 0, dtype=torch.bool)
        self.round_start = 0  # first slot the last forward appended

    @property
    def slots(self) -> int:
        return self.valid.shape[1]

    def _layers(self) -> list:
        return self.cache.layers if self.cache is not None else []

    def add_row(self, cache: DynamicCache, length: int) -> None:
        """Append a request whose own cache holds ``length`` >= 1 committed tokens."""
        width = max(self.slots, length)
        if self.cache is None:
            self.cache = cache
        else:
            for mine, theirs in zip(self._layers(), cache.layers):
                mine.keys = torch.cat([_pad_slots(mine.keys, width), _pad_slots(theirs.keys, width)])
                mine.values = torch.cat([_pad_slots(mine.values, width), _pad_slots(theirs.values, width)])
        row = torch.zeros(1, width, dtype=torch.bool)
        row[0, :length] = True
        self.valid = torch.cat([torch.nn.functional.pad(self.valid, (0, width - self.slots)), row])

    def keep_rows(self, rows: list[int]) -> None:
        """Drop every row not in ``rows`` (finished requests)."""
        if not rows:
            self.cache, self.valid = None, torch.zeros(0, 0, dtype=torch.bool)
            return
        index = torch.tensor(rows, dtype=torch.long)
        for layer in self._layers():
            layer.keys, layer.values = layer.keys[index], layer.values[index]
        self.valid = self.valid[index]

    def compact(self) -> None:
        """Move each row's valid slots to the front, in order, and drop the columns left empty."""
        counts = self.valid.sum(1)
        width = int(counts.max()) if len(counts) else 0
        for layer in self._layers():
            for name in ("keys", "values"):
                old = getattr(layer, name)
                new = old.new_zeros(old.shape[0], old.shape[1], width, old.shape[3])
                for r in range(old.shape[0]):
                    new[r, :, : counts[r]] = old[r][:, self.valid[r]]
                setattr(layer, name, new)
        self.valid = torch.arange(width)[None] < counts[:, None]

    @torch.inference_mode()
    def forward(self, inputs: list[list[int]], positions: list[int], feature_layers: tuple[int, ...]):
        """Feed row r the tokens ``inputs[r]`` at positions ``positions[r]``, ``positions[r] + 1``, ...

        Returns per-row logits [n_r, V] and features [n_r, m, d] (None without feature layers).
        The appended slots count as valid until :meth:`keep` trims them."""
        rows, width = len(inputs), max(len(x) for x in inputs)
        ids = torch.zeros(rows, width, dtype=torch.long)
        new_valid = torch.zeros(rows, width, dtype=torch.bool)
        for r, x in enumerate(inputs):
            ids[r, : len(x)], new_valid[r, : len(x)] = torch.tensor(x), True
        pos = torch.tensor(positions)[:, None] + torch.arange(width)
        mask = torch.cat([self.valid, new_valid], 1).long()
        device = self.model.device
        out = self.model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=pos.to(device),
                         cache=self.cache, use_cache=True, output_hidden_states=bool(feature_layers))
        self.round_start = self.slots
        self.valid = torch.cat([self.valid, new_valid], 1)
        logits = [out.logits[r, : len(x)].float() for r, x in enumerate(inputs)]
        if not feature_layers:
            return logits, [None] * rows
        stacked = torch.stack([out.hidden_states[i] for i in feature_layers], dim=2).float()  # [R, L, m, d]
        return logits, [stacked[r, : len(x)] for r, x in enumerate(inputs)]

    def keep(self, row: int, kept: int) -> None:
        """Of the slots the last forward appended to ``row``, keep the first ``kept``."""
        self.valid[row, self.round_start + kept :] = False


def _append(pending: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
    """Features not yet handed to the drafter (rounds without drafting leave them pending), then ``new``."""
    return new if pending is None else torch.cat([pending, new])


def _pad_slots(t: torch.Tensor, width: int) -> torch.Tensor:
    """Zero-pad the slot axis of a [B, H, S, D] tensor to ``width``."""
    return torch.nn.functional.pad(t, (0, 0, 0, width - t.shape[2]))


class BatchedEngine:
    """Serves many requests with speculative decoding, verifying all of them in one forward per round.

    make_drafter: builds a fresh drafter per request (``None``: plain decoding, one token a round).
    policy:       verification lengths; the hardware-aware scheduler decides for the whole batch.
    max_batch:    requests decoded together; the rest wait and join as others finish.
    Requests are seeded ``seed + id``, drafting and verifying with their own generator.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        policy: VerificationPolicy,
        make_drafter=None,
        *,
        sampling: SamplingConfig = SamplingConfig(),
        eos_token_ids: tuple[int, ...] = (),
        max_batch: int = 16,
        seed: int = 0,
    ):
        self.model, self.policy, self.make_drafter = model, policy, make_drafter
        self.sampling, self.eos_token_ids, self.max_batch, self.seed = sampling, eos_token_ids, max_batch, seed
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.kv = BatchedKV(model)
        self.waiting: list[Request] = []
        self.active: list[Request] = []
        self.finished: list[Request] = []
        self.feature_layers: tuple[int, ...] = ()
        self.rounds = 0
        self.budgets: list[int] = []  # verified draft tokens per request, one entry per request-round

    def submit(self, prompt_ids: torch.Tensor | list[int], max_new_tokens: int) -> Request:
        """Queue a request; raises (nothing queued) when it cannot be served: see :mod:`dspark_core.core.limits`."""
        prompt = torch.as_tensor(prompt_ids).reshape(-1).tolist()
        if len(prompt) < 2:
            raise ValueError("The engine needs prompts of at least 2 tokens (use the chat template).")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        check_context(self.model, len(prompt), max_new_tokens)
        rid = len(self.waiting) + len(self.active) + len(self.finished)
        drafter = self.make_drafter() if self.make_drafter else None
        check_block(drafter, self.policy.gamma)
        request = Request(rid, prompt, max_new_tokens, drafter, torch.Generator().manual_seed(self.seed + rid),
                          tokens=list(prompt), result=GenerationResult(prompt_len=len(prompt), tokens=[]))
        if drafter is not None:
            drafter.reset()
            self.feature_layers = tuple(drafter.feature_layers)
        self.waiting.append(request)
        return request

    @torch.inference_mode()
    def _admit(self) -> None:
        while self.waiting and len(self.active) < self.max_batch:
            request = self.waiting.pop(0)
            cache = DynamicCache(config=self.model.config)
            ids = torch.tensor([request.prompt[:-1]], device=self.model.device)
            out = self.model(input_ids=ids, cache=cache, use_cache=True, output_hidden_states=bool(self.feature_layers))
            if self.feature_layers:
                request.new_features = torch.stack([out.hidden_states[i][0] for i in self.feature_layers], 1).float()
            self.kv.add_row(cache, len(request.prompt) - 1)
            self.active.append(request)

    @torch.inference_mode()
    def step(self) -> None:
        """One round for every active request (admitting waiting ones first)."""
        self._admit()
        watch = Stopwatch()
        drafts, budgets = [], []
        drafting = self.policy.worth_drafting(len(self.active))
        for request in self.active:
            budget = request.max_new_tokens - len(request.result.tokens) - 1  # draft tokens; one more is emitted
            draft = Draft.empty(self.vocab_size)
            if request.drafter is not None and drafting:
                context = DraftContext(request.tokens, len(request.prompt), request.new_features, self.vocab_size)
                draft = request.drafter.propose(context, min(self.policy.gamma, budget), self.sampling, request.generator)
                request.new_features = None  # handed to the drafter
            drafts.append(draft)
            budgets.append(budget)
        lengths = self.policy.verify_lengths(drafts, budgets)
        watch.lap("draft")
        inputs = [[r.tokens[-1]] + d.tokens[:n].tolist() for r, d, n in zip(self.active, drafts, lengths)]
        logits, features = self.kv.forward(inputs, [len(r.tokens) - 1 for r in self.active], self.feature_layers)
        watch.lap("forward")
        shared = watch.take()  # drafting and the forward serve the whole batch
        for row, (request, draft, length) in enumerate(zip(self.active, drafts, lengths)):
            verdict = verify_round(draft, length, logits[row], self.sampling, request.generator, self.eos_token_ids,
                                   request.max_new_tokens - len(request.result.tokens), lap=watch.lap)
            self.kv.keep(row, 1 + verdict.accepted)
            if features[row] is not None:
                request.new_features = _append(request.new_features, features[row][: verdict.accepted + 1])
            watch.lap("cache")
            request.finished = verdict.finished
            commit_round(request.result, request.tokens, draft, length, verdict, {**shared, **watch.take()})
            self.budgets.append(length)
        self.rounds += 1
        keep = [i for i, r in enumerate(self.active) if not r.finished]
        self.finished += [r for r in self.active if r.finished]
        self.active = [self.active[i] for i in keep]
        self.kv.keep_rows(keep)
        if self.kv.slots > COMPACT_MIN_SLOTS and self.kv.slots > COMPACT_SLACK * int(self.kv.valid.sum(1).max()):
            self.kv.compact()

    def run(self) -> list[Request]:
        """Step until every submitted request has finished; returns them in submission order."""
        while self.waiting or self.active:
            self.step()
        return sorted(self.finished, key=lambda r: r.id)
