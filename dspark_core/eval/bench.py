"""The benchmark harness: methods x benchmarks x temperatures, side by side in one run.

For every temperature and every prompt turn, plain decoding runs first and then every method, so
each ratio compares runs made seconds apart on the same machine state. Rows go to
``<out>/rows.csv`` as soon as a prompt's methods are all measured (one synced write per turn), with
the settings and machine in ``<out>/settings.json``; re-running the same command skips what is
already there, so an interrupted run loses nothing, and a run killed in the middle of a write
leaves neither a torn nor a duplicated row (the rerun cuts the unfinished turn and measures it
again). A turn whose prompt plus ``max_new_tokens`` does not fit the target's context window is
not measured: it goes to ``<out>/skipped.jsonl`` with the reason. Speedup is the median over
prompts of the per-prompt throughput ratio ``(method tok/s) / (plain tok/s)``.

Dtypes (``dtypes``): the target runs in each listed dtype (float32, bfloat16), and so do plain
decoding and every method, the order of the dtypes rotating from turn to turn. Every row carries two
ratios: ``speedup`` against plain decoding in its own dtype, and ``speedup_vs_fastest_plain`` against
the fastest plain decoding measured on that turn in any dtype (ours or ``hf-generate``), so a slow
baseline never inflates a ratio. A row of one of our methods also splits its rounds' time into their
parts (drafting, the target forward, the target's probabilities, the acceptance walk, the KV cache,
bookkeeping; :class:`~dspark_core.core.rounds.RoundRecord`) and records the share spent outside the
target's forward. Greedy rows record the first token where a method parts from plain decoding in the
same dtype (in bfloat16 that happens at near-ties; see tests/test_bf16_greedy.py).

Methods are ours (``ngram``, ``oracle``, ``draft-lm``, ``eagle``, ``dflash``, ``dspark-markov``,
``dspark-rnn``, and each trained one behind prompt lookup, e.g. ``dspark-markov+ngram``
(:class:`~dspark_core.drafters.lookup.LookupFirst`): :func:`speculative_generate`, at fixed block lengths
or, for dspark drafters, under the hardware-aware scheduler with a cost profile measured at the start
of the run) or peers run
through transformers' public API
(``hf-generate``: ``model.generate``; ``hf-assisted``: assisted generation with the draft LM at the
library's default settings; ``hf-prompt-lookup``: prompt lookup decoding), or llama.cpp
(``llamacpp``, ``llamacpp-lookup``: :mod:`dspark_core.eval.llamacpp`, on the GGUF file the default
target comes from, once per turn whatever the dtypes; its rows' dtype is the GGUF's, ``q4_1``, and
``speedup_vs_llamacpp`` compares every row with llama.cpp's plain decoding).
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..core.jsonl import (
    append_csv,
    append_jsonl,
    cut_torn_tail,
    drop_last_lines,
    read_jsonl,
)
from ..core.limits import check_block, context_overflow
from ..core.linear_layout import check_linear_layout, follow_target_layout, layout_of
from ..core.paths import PROMPT_DIR
from ..core.prompts import load_prompt_set
from ..core.provenance import machine_info
from ..core.rounds import ROUND_PARTS, GenerationResult
from ..core.sampling import SamplingConfig
from ..core.target import DTYPES, dtype_name, encode_prompt, eos_token_ids, load_target
from ..decode.loop import autoregressive_generate, speculative_generate
from ..decode.policies import FixedLength, HardwareAware
from ..decode.profile import CostProfile, combine_dtypes, measure_profiles
from ..drafters.draft_lm import load_draft_lm
from ..drafters.registry import (
    FEATURE_DRAFTERS,
    SHIPPED_DRAFTERS,
    build_drafter,
    shipped_drafter,
    split_lookup_first,
)
from .llamacpp import LLAMACPP, LOOKUP_TOKENS, LlamaCppPeer, require_llama_cpp

BENCHMARKS = ("math", "humaneval", "chat", "long_input", "format")
PEERS = ("hf-generate", "hf-assisted", "hf-prompt-lookup")
KEY = ("temperature", "benchmark", "prompt_id", "turn")  # one measured turn: its rows are written together
# drafters on the target's features, by kind and by shipped name: eagle, dflash, dspark, dspark-markov, dspark-rnn
TRAINED = FEATURE_DRAFTERS + tuple(name for name in SHIPPED_DRAFTERS if name not in FEATURE_DRAFTERS)
OURS = ("ngram", "oracle", "draft-lm", *TRAINED)  # and each trained one behind prompt lookup, e.g. dspark-markov+ngram
GGUF_DTYPE = "q4_1"  # the dtype column of llama.cpp's rows: the GGUF's quantisation
PLAIN_FAMILIES = ("plain", "hf-generate")  # plain decoding, ours or transformers': the baselines of every ratio


@dataclass(frozen=True)
class Method:
    """A drafter (or peer) name, a block length and, for trained drafters, a checkpoint folder.
    Plain decoding is ``Method("plain", 0)``; a peer's ``gamma`` 0 means the library default.
    ``scheduled``: verify with the hardware-aware scheduler (at most ``gamma`` tokens) instead of
    all ``gamma`` (dspark drafters only)."""

    name: str
    gamma: int = 0
    checkpoint: str | None = None
    scheduled: bool = False

    @property
    def label(self) -> str:
        if self.name in ("plain", "hf-generate", "llamacpp") or (self.name in PEERS + LLAMACPP and not self.gamma):
            return self.name
        shown = self.name
        if self.checkpoint and self.name not in PEERS + LLAMACPP:
            shown = Path(self.checkpoint).name + self.lookup_suffix
        return f"{shown}@{'hw' if self.scheduled else ''}{self.gamma}"

    @property
    def base(self) -> str:
        """The name without a lookup suffix (``dspark-markov+ngram2`` -> ``dspark-markov``)."""
        return split_lookup_first(self.name, TRAINED)[0]

    @property
    def lookup_suffix(self) -> str:
        """The lookup suffix, or "" (``dspark-markov+ngram2`` -> ``+ngram2``)."""
        return self.name[len(self.base):]

    @property
    def drafter(self) -> str:
        """The drafter kind :func:`build_drafter` takes (``dspark-markov+ngram2`` -> ``dspark+ngram2``)."""
        return ("dspark" if self.base.startswith("dspark") else self.base) + self.lookup_suffix


PLAIN = Method("plain")


def parse_methods(spec: str) -> list[Method]:
    """``"ngram:3,5;dspark-markov:7;dflash=runs/x:7;hf-assisted;hf-prompt-lookup:10"`` -> methods.

    ``name[=folder][:g1,g2]``. Trained drafters without ``=folder`` use the shipped checkpoint for
    the default target; block lengths are required except for peers. A dspark drafter's ``hwG``
    (e.g. ``dspark-markov:2,hw7``) runs the hardware-aware scheduler with at most G tokens a round.
    """
    methods = []
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        head, _, gammas = part.partition(":")
        name, _, checkpoint = head.partition("=")
        name, checkpoint = name.strip(), checkpoint.strip() or None
        base, min_ngram = split_lookup_first(name, TRAINED)
        if base not in OURS + PEERS + LLAMACPP:
            raise ValueError(f"Unknown method {name!r} in {spec!r}; choose from {', '.join(OURS + PEERS + LLAMACPP)} "
                             "(a trained drafter may take '+ngram', e.g. 'dspark-markov+ngram').")
        if name == "llamacpp" and gammas:
            raise ValueError(f"{part!r}: llamacpp is plain decoding and takes no block length (llamacpp-lookup does).")
        if not gammas and name not in PEERS + LLAMACPP:
            raise ValueError(f"Method {part!r} needs block lengths, e.g. 'ngram:3,5,7' or 'dspark=<folder>:7'.")
        shipped = {"hf-assisted": "draft-lm"}.get(name, base)
        if checkpoint is None and shipped in SHIPPED_DRAFTERS + ("draft-lm",):
            checkpoint = str(shipped_drafter(shipped))
        for g in (gammas.split(",") if gammas else ["0"]):
            g = g.strip()
            scheduled = g.startswith("hw")
            if scheduled and not (name.startswith("dspark") and min_ngram is None):
                raise ValueError(f"{part!r}: the hardware-aware scheduler ('hw{g[2:]}') needs a dspark drafter's "
                                 "confidences on every draft; use dspark, dspark-markov or dspark-rnn "
                                 "(copied drafts of '+ngram' have none).")
            if not g.removeprefix("hw").isdigit():
                raise ValueError(f"{part!r}: block lengths are integers, or hwG for the scheduler (e.g. 'hw7').")
            methods.append(Method(name, int(g.removeprefix("hw")), checkpoint, scheduled))
    return methods


@dataclass
class BenchSettings:
    """One benchmark run. ``benchmarks`` are names of ``data/prompts/<name>.jsonl`` or JSONL paths;
    ``n_prompts`` caps the records taken from each, the first N or, with ``records="last"``, the last N (the
    selection set's end, for choosing a setting on records no evaluation run reads); every turn of a record is measured;
    ``dtypes``: the target's dtypes, each running plain decoding and every method (the command's
    profiles run float32 and bfloat16; the library's default is float32 alone). ``linear_layout``: the
    target's linear weights as loaded (``torch``) or ``input-major`` in every dtype, with the drafters following
    (:mod:`..core.linear_layout`; ``python -m dspark_core.eval.linear_layout`` compares the two side by side)."""

    benchmarks: tuple[str, ...] = BENCHMARKS
    methods: str = "ngram:7;oracle:7"
    temperatures: tuple[float, ...] = (0.0, 1.0)
    n_prompts: int | None = 2
    records: str = "first"
    max_new_tokens: int = 128
    seed: int = 0
    top_k: int = 0
    top_p: float = 1.0
    model: str = "smollm2-135m-instruct"
    dtypes: tuple[str, ...] = ("float32",)
    linear_layout: str = "torch"

    def __post_init__(self) -> None:
        self.benchmarks, self.temperatures = tuple(self.benchmarks), tuple(float(t) for t in self.temperatures)
        self.dtypes = tuple(self.dtypes)
        check_linear_layout(self.linear_layout)
        if not self.benchmarks or not self.temperatures:
            raise ValueError("Pass at least one benchmark and one temperature.")
        unknown = [d for d in self.dtypes if d not in DTYPES]
        if unknown or not self.dtypes or len(set(self.dtypes)) < len(self.dtypes):
            raise ValueError(f"dtypes must be distinct names from {', '.join(DTYPES)}, got {self.dtypes}.")
        if self.max_new_tokens < 1 or (self.n_prompts is not None and self.n_prompts < 1):
            raise ValueError("max_new_tokens and n_prompts must be >= 1.")
        if self.records not in ("first", "last"):
            raise ValueError(f"records must be 'first' or 'last', got {self.records!r}.")
        parse_methods(self.methods)  # fail early on a bad spec


BOTH_DTYPES = ("float32", "bfloat16")  # the command's default: every ratio also against the other dtype's plain decoding
PROFILES = {
    "quick": BenchSettings(
        methods="ngram:7;oracle:7;draft-lm:4;eagle:7;dflash:7;dspark-markov:7,hw7;dspark-rnn:7;"
                "hf-generate;hf-assisted;hf-prompt-lookup:10",
        n_prompts=1, max_new_tokens=64, dtypes=BOTH_DTYPES,
    ),
    # every shipped drafter and peer, and prompt lookup in front of dspark-markov (ours), the best dspark configuration
    "full": BenchSettings(
        methods="ngram:7;oracle:7;draft-lm:4;eagle:7;dflash:7;dspark-markov:7;dspark-markov+ngram:7;dspark-rnn:7;"
                "hf-generate;hf-assisted;hf-prompt-lookup:10",
        n_prompts=3, max_new_tokens=96, dtypes=BOTH_DTYPES,
    ),
    # DSpark's scheduling against the best fixed lengths on this CPU and the strongest peers, on the
    # full profile's prompts
    "scheduled": BenchSettings(
        methods="ngram:7;dspark-markov:1,2,3,hw7;dspark-rnn:2,hw7;hf-prompt-lookup:10",
        n_prompts=3, max_new_tokens=96, dtypes=BOTH_DTYPES,
    ),
    # Prompt lookup in front of dspark-markov (ours) against each alone and transformers' prompt lookup, on the
    # full profile's prompts, in bfloat16; its block 7 greedy and 4 at T=1 (chosen by lookup-block)
    "lookup-first": BenchSettings(
        methods="ngram:7;dspark-markov:7;dspark-markov+ngram:4,7;hf-prompt-lookup:10",
        n_prompts=3, max_new_tokens=96, dtypes=("bfloat16",),
    ),
    # Choosing the shortest match it copies from, on the last records of each set (never in the profiles above)
    "lookup-selection": BenchSettings(
        methods="ngram:7;dspark-markov:7;dspark-markov+ngram1:7;dspark-markov+ngram2:7;dspark-markov+ngram3:7;"
                "dspark-markov+ngram4:7",
        n_prompts=2, records="last", max_new_tokens=96, dtypes=("bfloat16",),
    ),
    # Choosing its block at each temperature, on the same last records
    "lookup-block": BenchSettings(
        methods="dspark-markov+ngram:3,4,5,7", n_prompts=2, records="last", max_new_tokens=96, dtypes=("bfloat16",),
    ),
}


def benchmark_path(name: str) -> Path:
    path = Path(name) if name.endswith(".jsonl") else PROMPT_DIR / f"{name}.jsonl"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in PROMPT_DIR.glob("*.jsonl") if p.stem != "train"))
        raise FileNotFoundError(f"No benchmark {name!r} ({path} is missing); known benchmarks: {known}.")
    return path


@dataclass
class _Peer:
    """A transformers peer: one ``model.generate`` call per prompt, timed end to end."""

    method: Method
    assistant: PreTrainedModel | None = None

    def generate(self, model: PreTrainedModel, prompt: torch.Tensor, sampling: SamplingConfig,
                 max_new_tokens: int, seed: int, eos: tuple[int, ...]) -> GenerationResult:
        kwargs: dict = {"max_new_tokens": max_new_tokens, "eos_token_id": list(eos), "pad_token_id": eos[0]}
        if sampling.greedy:
            kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
        else:
            kwargs.update(do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
        if self.method.name == "hf-assisted":
            kwargs["assistant_model"] = self.assistant
            if self.method.gamma:
                kwargs["num_assistant_tokens"] = self.method.gamma
        if self.method.name == "hf-prompt-lookup":
            kwargs["prompt_lookup_num_tokens"] = self.method.gamma or 10
        ids = prompt[None].to(model.device)
        torch.manual_seed(seed)
        start = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
        elapsed = time.perf_counter() - start
        return GenerationResult(prompt_len=len(prompt), tokens=out[0, len(prompt):].tolist(), total_time=elapsed)


@dataclass
class _Runner:
    """Runs methods on one target (one dtype): builds each method once (the oracle per prompt: it
    needs the plain output). ``profile`` is the cost profile the scheduled methods read."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    profile: CostProfile | None = None
    built: dict = field(default_factory=dict)

    def drafter(self, method: Method):
        """The drafter of one of our methods other than the oracle, built once."""
        if method not in self.built:
            self.built[method] = build_drafter(method.drafter, self.model, self.tokenizer, draft_model=method.checkpoint)
        return self.built[method]

    def check_blocks(self, methods: list[Method]) -> None:
        """Build every drafter now and refuse a gamma beyond its trained block, before the run folder is touched."""
        for method in methods:
            if method.name not in PEERS + LLAMACPP and method.name != "oracle":
                check_block(self.drafter(method), method.gamma)

    def run(self, method: Method, prompt: torch.Tensor, plain: GenerationResult | None, **kwargs) -> GenerationResult:
        if method.name in PEERS:
            peer = self.built.get(method)
            if peer is None:
                assistant = (load_draft_lm(method.checkpoint, self.tokenizer, str(self.model.device), self.model.dtype)[0]
                             if method.name == "hf-assisted" else None)
                if assistant is not None:
                    follow_target_layout(self.model, assistant)  # in the target's layout, as our draft LM
                peer = self.built[method] = _Peer(method, assistant)
            return peer.generate(self.model, prompt, kwargs["sampling"], kwargs["max_new_tokens"], kwargs["seed"],
                                 kwargs["eos_token_ids"])
        if method is PLAIN:
            return autoregressive_generate(self.model, prompt, **kwargs)
        if method.name == "oracle":
            drafter = build_drafter("oracle", self.model, self.tokenizer, reference=plain.tokens)
        else:
            drafter = self.drafter(method)
        policy = HardwareAware(method.gamma, self.profile.steps_per_second) if method.scheduled else FixedLength(method.gamma)
        return speculative_generate(self.model, prompt, drafter, policy, **kwargs)


@dataclass
class _LlamaRunner:
    """Runs the llama.cpp methods (one model per method, built on first use)."""

    vocab_size: int
    context: int
    built: dict = field(default_factory=dict)

    def run(self, method: Method, prompt: torch.Tensor, **kwargs) -> GenerationResult:
        if method not in self.built:
            lookup = (method.gamma or LOOKUP_TOKENS) if method.name == "llamacpp-lookup" else 0
            self.built[method] = LlamaCppPeer(lookup, self.vocab_size, self.context)
        return self.built[method].generate(prompt, kwargs["sampling"], kwargs["max_new_tokens"], kwargs["seed"],
                                           kwargs["eos_token_ids"])


def _first_divergence(tokens: list[int], reference: list[int]) -> float:
    """Index of the first token where ``tokens`` and ``reference`` differ (NaN when they are equal)."""
    if tokens == reference:
        return np.nan
    return next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), min(len(tokens), len(reference)))


def _round_split(result: GenerationResult) -> dict:
    """Seconds of each round part summed over the rounds (NaN without rounds: a peer), and the share of
    the rounds' time spent outside the target's forward."""
    split = result.time_split()
    columns = {f"{part}_time": split[part] if result.rounds else np.nan for part in ROUND_PARTS}
    columns["outside_forward_share"] = result.outside_forward_share
    return columns


def _row(key: dict, dtype: str, method: Method, result: GenerationResult, plain: GenerationResult, greedy: bool) -> dict:
    """One measured generation; ``plain`` is plain decoding of the same turn in the same dtype (llama.cpp:
    the first listed dtype's). The ratios against the fastest plain decoding are filled per turn later."""
    measured_rounds = bool(result.rounds) and method is not PLAIN
    reached, accepted = result.position_counts(method.gamma) if measured_rounds else ([], [])
    plain_per_token = plain.total_time / max(1, len(plain.tokens))
    draft_time = sum(r.draft_time for r in result.rounds)
    verify_time = sum(r.verify_time for r in result.rounds)
    n_rounds = len(result.rounds)
    return {
        **key,
        "dtype": dtype,
        "method": method.label,
        "family": method.name,
        "gamma": method.gamma,
        "new_tokens": len(result.tokens),
        "rounds": n_rounds if result.rounds else np.nan,
        "tau": result.tau if result.rounds else np.nan,
        "acceptance_rate": result.acceptance_rate if measured_rounds else np.nan,
        **_round_split(result),
        "verify_time": verify_time if result.rounds else np.nan,
        "total_time": result.total_time,
        "tokens_per_s": result.tokens_per_second,
        "speedup": result.tokens_per_second * plain_per_token,
        "speedup_vs_fastest_plain": np.nan,
        "fastest_plain": "",
        "speedup_vs_llamacpp": np.nan,
        "draft_cost_per_round": draft_time / n_rounds / plain_per_token if measured_rounds else np.nan,
        "verify_cost_per_round": verify_time / n_rounds / plain_per_token if measured_rounds else np.nan,
        "same_as_plain": (result.tokens == plain.tokens) if greedy else np.nan,
        "first_divergence": _first_divergence(result.tokens, plain.tokens) if greedy else np.nan,
        "reached_per_position": json.dumps(reached),
        "accepted_per_position": json.dumps(accepted),
    }


def _against_fastest_plain(rows: list[dict]) -> None:
    """Fill each row of one turn with its throughput over the fastest plain decoding measured on that
    turn in any dtype (ours or hf-generate), naming it, and over llama.cpp's plain decoding (if run)."""
    plains = [r for r in rows if r["family"] in PLAIN_FAMILIES]
    fastest = max(plains, key=lambda r: r["tokens_per_s"])
    llama = next((r["tokens_per_s"] for r in rows if r["family"] == "llamacpp"), np.nan)
    for row in rows:
        row["speedup_vs_fastest_plain"] = row["tokens_per_s"] / fastest["tokens_per_s"]
        row["fastest_plain"] = f"{fastest['method']}/{fastest['dtype']}"
        row["speedup_vs_llamacpp"] = row["tokens_per_s"] / llama


def _finished_turns(rows_file: Path, per_turn: int) -> list[tuple]:
    """Keys (:data:`KEY`) of the turns in ``rows_file``, each with all its ``per_turn`` rows.

    A turn's rows are appended in one write, so a run killed in the middle of it leaves a torn last
    line and possibly the first complete rows of that turn, at the end of the file: both are cut
    here, and the turn is measured again, whole."""
    if not rows_file.is_file():
        return []
    cut_torn_tail(rows_file)
    if rows_file.stat().st_size == 0:
        return []
    keys = list(pd.read_csv(rows_file, usecols=list(KEY))[list(KEY)].itertuples(index=False, name=None))
    trailing = 0
    while trailing < len(keys) and keys[-1 - trailing] == keys[-1]:
        trailing += 1
    if keys and trailing < per_turn:
        drop_last_lines(rows_file, trailing)
        keys = keys[:-trailing]
    return keys


def _records(benchmark: str, settings: BenchSettings) -> list[dict]:
    """The records of one benchmark a run measures (:class:`BenchSettings` ``n_prompts`` and ``records``)."""
    records = load_prompt_set(benchmark_path(benchmark))
    if settings.n_prompts is None:
        return records
    return records[: settings.n_prompts] if settings.records == "first" else records[-settings.n_prompts:]


def _prepare_out_dir(out_dir: Path, settings: BenchSettings, per_turn: int) -> set[tuple]:
    """Check a resumed run has the same settings; return the turns (:data:`KEY`) measured or skipped
    already, after cutting what an interrupted write left (``per_turn``: rows a measured turn writes)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    settings_file, rows_file = out_dir / "settings.json", out_dir / "rows.csv"
    wanted = asdict(settings)
    if settings_file.is_file():
        stored = {"linear_layout": "torch", "records": "first",  # older runs: as loaded, first records
                  **json.loads(settings_file.read_text())["settings"]}
        if stored != json.loads(json.dumps(wanted)):
            raise ValueError(f"{out_dir} holds a run with other settings ({settings_file}); pass another output "
                             "folder, or --fresh to discard it.")
    else:
        settings_file.write_text(json.dumps({"settings": wanted, "machine": machine_info(),
                                             "started": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=2))
    skipped = [tuple(row[k] for k in KEY) for row in read_jsonl(out_dir / "skipped.jsonl")]
    return set(_finished_turns(rows_file, per_turn)) | set(skipped)


def _cost_profile(out_dir: Path, models: dict[str, PreTrainedModel], methods: list[Method]) -> CostProfile | None:
    """The single-request cost profile of the scheduled methods, every dtype measured interleaved:
    measured once per run folder and stored there (``cost-profile.json``), so a resumed run schedules
    as the first part did; each dtype's methods read :meth:`CostProfile.for_dtype`."""
    if not any(m.scheduled for m in methods):
        return None
    path = out_dir / "cost-profile.json"
    if path.is_file():
        return CostProfile.load(path)
    longest = max(m.gamma for m in methods if m.scheduled) + 1
    profile = combine_dtypes(measure_profiles(list(models.values()), requests=(1,), max_tokens=longest))
    profile.save(path)
    return profile


def _targets(settings: BenchSettings, model: PreTrainedModel | None,
             tokenizer: PreTrainedTokenizerBase | None) -> tuple[dict[str, PreTrainedModel], PreTrainedTokenizerBase]:
    """The target in each of ``settings.dtypes``: ``model`` itself where its dtype is listed, a cast copy
    of it for the others, or ``settings.model`` loaded in each when no model is given."""
    if model is None or tokenizer is None:
        loaded = {name: load_target(settings.model, dtype=DTYPES[name], linear_layout=settings.linear_layout)
                  for name in settings.dtypes}
        return {name: pair[0] for name, pair in loaded.items()}, next(iter(loaded.values()))[1]
    if (layout := layout_of(model)) != settings.linear_layout:
        raise ValueError(f"The target passed has {layout} linears and the settings ask for "
                         f"{settings.linear_layout}: load it with load_target(..., linear_layout={settings.linear_layout!r}).")
    given = dtype_name(model.dtype)
    if given != "float32" and set(settings.dtypes) != {given}:
        raise ValueError(f"Pass the target in float32 to run it in {settings.dtypes}: the other dtypes are cast "
                         f"from it, and a {given} copy has already lost float32's precision.")
    return {name: model if given == name else copy.deepcopy(model).to(DTYPES[name]) for name in settings.dtypes}, tokenizer


def _measure_turn(key: dict, turn_index: int, prompt: torch.Tensor, runners: dict[str, _Runner],
                  llama: _LlamaRunner | None, methods: list[Method], **kwargs) -> list[dict]:
    """Every row of one turn: per dtype (their order rotated by ``turn_index``) plain decoding, then
    each of our methods and transformers' peers; then the llama.cpp methods; then the ratios against
    the fastest plain decoding."""
    greedy = kwargs["sampling"].greedy
    names = list(runners)
    rows, plains = [], {}
    for name in names[turn_index % len(names):] + names[: turn_index % len(names)]:
        runner = runners[name]
        plain = plains[name] = runner.run(PLAIN, prompt, None, **kwargs)
        rows.append(_row(key, name, PLAIN, plain, plain, greedy))
        for method in (m for m in methods if m.name not in LLAMACPP):
            rows.append(_row(key, name, method, runner.run(method, prompt, plain, **kwargs), plain, greedy))
    for method in (m for m in methods if m.name in LLAMACPP):
        rows.append(_row(key, GGUF_DTYPE, method, llama.run(method, prompt, **kwargs), plains[names[0]], greedy))
    _against_fastest_plain(rows)
    return rows


def run_bench(
    settings: BenchSettings,
    out_dir: Path,
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> pd.DataFrame:
    """Run (or resume) a benchmark into ``out_dir`` and return all its rows.

    ``model``: the target in float32 (copies are cast to the other listed dtypes), or in the one
    dtype listed; None loads ``settings.model`` in each. Turn t > 1 of a record is asked after the plain greedy answer of the
    turns before it in the first listed dtype (the same history for every method and dtype). With
    temperature 0, ``same_as_plain`` records whether a method's tokens equal plain decoding's in the
    same dtype. A turn that does not fit the target's context window is recorded in ``skipped.jsonl``
    (key and reason) instead; a gamma beyond a drafter's block, or a llama.cpp method without
    llama-cpp-python or with another target than the default, is an error raised before anything is written.
    """
    methods = parse_methods(settings.methods)
    models, tokenizer = _targets(settings, model, tokenizer)
    first = models[settings.dtypes[0]]
    eos = eos_token_ids(first, tokenizer)
    runners = {name: _Runner(m, tokenizer) for name, m in models.items()}
    for runner in runners.values():
        runner.check_blocks(methods)
    llama = None
    if any(m.name in LLAMACPP for m in methods):
        require_llama_cpp()
        if settings.model != BenchSettings.model:
            raise ValueError(f"The llama.cpp methods run on the default target's GGUF only, not {settings.model!r}.")
        llama = _LlamaRunner(first.get_output_embeddings().weight.shape[0], first.config.max_position_embeddings)
    llama_methods = sum(m.name in LLAMACPP for m in methods)
    done = _prepare_out_dir(out_dir, settings, per_turn=len(models) * (1 + len(methods) - llama_methods) + llama_methods)
    profile = _cost_profile(out_dir, models, methods)
    for name, runner in runners.items():
        runner.profile = profile.for_dtype(name) if profile is not None else None
    items = [(name, record) for name in settings.benchmarks for record in _records(name, settings)]
    jobs = [(t, name, record, turn) for t in settings.temperatures for name, record in items
            for turn in range(1, len(record["turns"]) + 1)]
    rows_file, skipped_file = out_dir / "rows.csv", out_dir / "skipped.jsonl"
    warm_up = dict(max_new_tokens=16, seed=settings.seed, eos_token_ids=eos)
    for temperature in settings.temperatures:  # untimed: loads every drafter and warms every code path
        sampling = SamplingConfig(temperature, settings.top_k, settings.top_p)
        _measure_turn({}, 0, encode_prompt(tokenizer, "Write two sentences about the sea."), runners, llama, methods,
                      sampling=sampling, **warm_up)
    history: dict[tuple, list[dict]] = {}  # (record id, turn) -> the messages before that turn
    greedy_kwargs = dict(max_new_tokens=settings.max_new_tokens, seed=settings.seed, eos_token_ids=eos)
    with tqdm(jobs, desc="bench", unit="turn") as bar:
        for index, (temperature, name, record, turn) in enumerate(bar):
            sampling = SamplingConfig(temperature, settings.top_k, settings.top_p)
            key = {"temperature": temperature, "benchmark": name, "domain": record["domain"],
                   "prompt_id": record["id"], "turn": turn}
            turn_key = tuple(key[k] for k in KEY)
            if turn > 1 and (record["id"], turn) not in history:  # its history holds a turn that was skipped
                reason = f"turn {turn - 1} of this record did not fit the context window, and this turn includes it"
            else:
                messages = history.get((record["id"], turn), []) + [{"role": "user", "content": record["turns"][turn - 1]}]
                prompt = encode_prompt(tokenizer, messages)
                reason = context_overflow(first, len(prompt), settings.max_new_tokens)
            if reason is not None:
                if turn_key not in done:
                    append_jsonl(skipped_file, [{**key, "reason": reason}])
                    bar.write(f"skipped {name} {record['id']} turn {turn}: {reason}")
                continue
            if turn < len(record["turns"]) and (record["id"], turn + 1) not in history:  # once, for every temperature
                answer = autoregressive_generate(first, prompt, **greedy_kwargs).tokens
                history[(record["id"], turn + 1)] = messages + [
                    {"role": "assistant", "content": tokenizer.decode(answer, skip_special_tokens=True)}]
            if turn_key in done:
                continue
            append_csv(rows_file, _measure_turn(key, index, prompt, runners, llama, methods, sampling=sampling,
                                                max_new_tokens=settings.max_new_tokens, seed=settings.seed,
                                                eos_token_ids=eos))
    if not rows_file.is_file():
        raise ValueError(f"Every turn was skipped (reasons in {skipped_file}): lower --max-new-tokens or pick "
                         "prompts that fit the target's context window.")
    return pd.read_csv(rows_file)


# ------------------------------------------------------------------------------------ summaries
BY = ("temperature", "dtype", "method")  # a row of every summary table


def with_dtype(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` with a dtype column: rows written before dtypes were recorded ran in float32."""
    return rows if "dtype" in rows else rows.assign(dtype="float32")


def summarize(rows: pd.DataFrame) -> pd.DataFrame:
    """Per temperature, dtype and method: medians of tau, acceptance, tok/s, per-prompt speedup over
    plain decoding in the same dtype and over the fastest plain decoding in any dtype, draft and verify
    cost per round (in plain forwards), the share of a round's time outside the target's forward, and
    the share of greedy outputs identical to plain decoding in the same dtype (older run folders lack
    some of these columns: those are left out)."""
    wanted = {
        "tau": ("tau", "median"), "acceptance": ("acceptance_rate", "median"),
        "tokens_per_s": ("tokens_per_s", "median"), "speedup": ("speedup", "median"),
        "vs_fastest_plain": ("speedup_vs_fastest_plain", "median"), "vs_llamacpp": ("speedup_vs_llamacpp", "median"),
        "draft_cost": ("draft_cost_per_round", "median"), "verify_cost": ("verify_cost_per_round", "median"),
        "outside_forward": ("outside_forward_share", "median"), "same_as_plain": ("same_as_plain", "mean"),
        "prompts": ("prompt_id", "count"),
    }
    rows = with_dtype(rows)
    present = {name: (column, how) for name, (column, how) in wanted.items()
               if column in rows and rows[column].notna().any()}
    return rows.groupby(list(BY), sort=False).agg(**present).round(3)


def per_domain(rows: pd.DataFrame, value: str = "speedup", by: tuple[str, ...] = ("temperature", "method")) -> pd.DataFrame:
    """Median ``value`` per group of ``by`` x domain, plus the mean over domains."""
    table = rows.pivot_table(index=list(by), columns="domain", values=value, aggfunc="median", sort=False)
    table["mean over domains"] = table.mean(axis=1)
    return table.round(3)


def round_split(rows: pd.DataFrame) -> pd.DataFrame:
    """Where a round's time goes, per temperature, dtype and method (our methods and plain decoding):
    median milliseconds per round of each part (:data:`~dspark_core.core.rounds.ROUND_PARTS`) and the
    median share of the rounds' time outside the target's forward."""
    rows = with_dtype(rows)
    ours = rows["family"].map(lambda family: Method(family).base in OURS + ("plain",))
    timed = rows[rows["rounds"].notna() & ours]
    per_round = timed[[f"{part}_time" for part in ROUND_PARTS]].div(timed["rounds"], axis=0) * 1000
    per_round.columns = [f"{part}_ms" for part in ROUND_PARTS]
    table = per_round.assign(outside_forward_share=timed["outside_forward_share"], **{k: timed[k] for k in BY})
    return table.groupby(list(BY), sort=False).median().round(3)


def _sum_padded(column: pd.Series, width: int) -> np.ndarray:
    """Element-wise sum of lists of at most ``width`` numbers (shorter ones padded with zeros)."""
    return np.sum([np.pad(x, (0, width - len(x))) for x in column], axis=0)


def conditional_acceptance(rows: pd.DataFrame, by: tuple[str, ...] = ("temperature", "method")) -> pd.DataFrame:
    """Accepted / reached per position k, where "reached" counts rounds that verified position k
    with positions 1..k-1 accepted; one row per group of ``by``, NaN where a group never reached k."""
    table = {}
    counts = {c: rows[c].map(json.loads) for c in ("reached_per_position", "accepted_per_position")}  # parsed once
    measured = rows.assign(**counts)[counts["reached_per_position"].map(len) > 0]
    width = max(map(len, measured["reached_per_position"]), default=0)  # one width for every group
    for group, part in measured.groupby(list(by), sort=False):
        reached, accepted = (_sum_padded(part[c], width) for c in ("reached_per_position", "accepted_per_position"))
        table[group] = np.divide(accepted, reached, out=np.full(width, np.nan), where=reached > 0)
    frame = pd.DataFrame.from_dict(table, orient="index")
    frame.index = pd.MultiIndex.from_tuples(frame.index, names=list(by)) if len(by) > 1 else frame.index
    frame.columns = [f"k={k + 1}" for k in frame.columns]
    return frame.round(3)


def report(rows: pd.DataFrame) -> str:
    """The text the CLI prints: summary, both speedups and tau per domain, where a round's time goes,
    conditional acceptance."""
    rows = with_dtype(rows)
    parts = [("summary", summarize(rows)),
             ("speedup over plain decoding in the same dtype, per domain (median of per-prompt ratios)",
              per_domain(rows, by=BY))]
    if "speedup_vs_fastest_plain" in rows:
        parts.append(("speedup over the fastest plain decoding in any dtype (hf-generate included), per domain",
                      per_domain(rows, "speedup_vs_fastest_plain", BY)))
    parts += [("tau per domain (median)", per_domain(rows[rows["family"] != "plain"], "tau", BY))]
    if "forward_time" in rows:
        parts.append(("where a round's time goes (ms per round, medians; outside_forward_share: not the target's "
                      "forward)", round_split(rows)))
    parts.append(("conditional acceptance per position", conditional_acceptance(rows, by=BY)))
    return "\n\n".join(f"{title}:\n{table.to_string()}" for title, table in parts)
