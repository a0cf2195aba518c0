"""Linear layouts side by side: the target (and its drafters) with row-major linear weights, as loaded
("torch"), and in the other layouts of :mod:`..core.linear_layout`, on the evaluation sets, greedy, in one dtype.

Every turn runs plain decoding and every method in each layout, the layouts' order alternating from
turn to turn. Each row carries the round's parts (per round: the target's forward, the drafting), its
speed against the fastest plain decoding of the turn in either layout, and whether its tokens equal
plain decoding's in its own layout and in the row-major one. Rows are appended turn by turn, so an
interrupted run resumes where it stopped.

    python -m dspark_core.eval.linear_layout --out data/results/linear-layout/<stamp>   (make bench-layout)
    python -m dspark_core.eval.linear_layout --dtype bfloat16 --layouts torch,onednn-packed
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from ..core.jsonl import append_csv
from ..core.linear_layout import check_linear_layout
from ..core.prompts import load_prompt_set
from ..core.provenance import machine_info
from ..core.target import DTYPES, encode_prompt, eos_token_ids, load_target
from ..decode.loop import speculative_generate
from ..decode.policies import FixedLength
from ..drafters.registry import build_drafter
from .bench import BENCHMARKS, PLAIN, Method, benchmark_path, parse_methods


@dataclass
class LayoutSettings:
    """One run: the first ``n_prompts`` records of each benchmark, their first turn, greedy, in ``layouts``
    (``"torch"`` among them: every row is compared with its plain decoding)."""

    benchmarks: tuple[str, ...] = BENCHMARKS
    methods: str = "ngram:7;eagle:7;dflash:7;dspark-markov:7"
    n_prompts: int = 2
    max_new_tokens: int = 64
    dtype: str = "float32"
    layouts: tuple[str, ...] = ("torch", "input-major")

    def __post_init__(self) -> None:
        self.benchmarks, self.layouts = tuple(self.benchmarks), tuple(self.layouts)
        for layout in self.layouts:
            check_linear_layout(layout)
        if "torch" not in self.layouts or len(set(self.layouts)) != len(self.layouts):
            raise ValueError(f"layouts must be distinct and include 'torch', got {self.layouts!r}.")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}.")
        if self.n_prompts < 1 or self.max_new_tokens < 1:
            raise ValueError("n_prompts and max_new_tokens must be >= 1.")
        if any(m.name not in ("ngram", "eagle", "dflash", "dspark-markov", "dspark-rnn", "draft-lm")
               for m in parse_methods(self.methods)):
            raise ValueError(f"methods must be ours with a fixed block (ngram, eagle, dflash, dspark-markov, "
                             f"dspark-rnn, draft-lm), got {self.methods!r}.")


def _row(key: dict, layout: str, method: Method, result, plain, plain_torch) -> dict:
    rounds = max(1, len(result.rounds))
    split = result.time_split()
    return {**key, "layout": layout, "method": method.label, "new_tokens": len(result.tokens), "rounds": len(result.rounds),
            "tau": result.tau, "forward_ms_per_round": 1000 * split["forward"] / rounds,
            "draft_ms_per_round": 1000 * split["draft"] / rounds, "total_time": result.total_time,
            "ms_per_token": 1000 * result.total_time / max(1, len(result.tokens)),
            "same_as_plain": result.tokens == plain.tokens, "same_as_torch_plain": result.tokens == plain_torch.tokens}


def measure_layouts(settings: LayoutSettings, out_dir: Path) -> pd.DataFrame:
    """Run (or resume) the comparison into ``out_dir`` (rows.csv, settings.json); returns every row."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows_file = out_dir / "rows.csv"
    settings_file, wanted = out_dir / "settings.json", json.loads(json.dumps(asdict(settings)))
    if rows_file.is_file() and settings_file.is_file():
        stored = {"layouts": ["torch", "input-major"], **json.loads(settings_file.read_text())}  # older runs: both
        stored.pop("machine")
        if stored != wanted:
            raise ValueError(f"{out_dir} holds a run with other settings ({stored}); pass another --out to run {wanted}.")
    done = set(pd.read_csv(rows_file).prompt_id) if rows_file.is_file() else set()
    settings_file.write_text(json.dumps({**wanted, "machine": machine_info()}, indent=1))
    loaded = {layout: load_target(None, DTYPES[settings.dtype], linear_layout=layout) for layout in settings.layouts}
    models, tokenizer = {layout: pair[0] for layout, pair in loaded.items()}, loaded["torch"][1]
    eos = eos_token_ids(models["torch"], tokenizer)
    methods = parse_methods(settings.methods)
    drafters = {(layout, m): build_drafter(m.drafter, model, tokenizer, draft_model=m.checkpoint)
                for layout, model in models.items() for m in methods}
    records = [(name, r) for name in settings.benchmarks for r in load_prompt_set(benchmark_path(name))[: settings.n_prompts]]
    warm = encode_prompt(tokenizer, "Write two sentences about the sea.")
    for model in models.values():  # untimed: warms every code path
        speculative_generate(model, warm, None, None, max_new_tokens=8, eos_token_ids=eos)
    for (layout, method), drafter in drafters.items():
        speculative_generate(models[layout], warm, drafter, FixedLength(method.gamma), max_new_tokens=8, eos_token_ids=eos)
    for index, (name, record) in enumerate(tqdm(records, desc="layouts", unit="turn")):
        if record["id"] in done:
            continue
        prompt = encode_prompt(tokenizer, record["turns"][0])
        key = {"benchmark": name, "domain": record["domain"], "prompt_id": record["id"]}
        shift = index % len(settings.layouts)
        order = settings.layouts[shift:] + settings.layouts[:shift]
        runs: dict = {}
        for layout in order:
            runs[layout, PLAIN] = speculative_generate(models[layout], prompt, None, None,
                                                       max_new_tokens=settings.max_new_tokens, eos_token_ids=eos)
            for method in methods:
                runs[layout, method] = speculative_generate(models[layout], prompt, drafters[layout, method],
                                                            FixedLength(method.gamma), max_new_tokens=settings.max_new_tokens,
                                                            eos_token_ids=eos)
        fastest = min(runs[layout, PLAIN].total_time / max(1, len(runs[layout, PLAIN].tokens)) for layout in settings.layouts)
        rows = [_row(key, layout, method, result, runs[layout, PLAIN], runs["torch", PLAIN])
                for (layout, method), result in runs.items()]
        append_csv(rows_file, [{**row, "speedup_vs_fastest_plain": 1000 * fastest / row["ms_per_token"]} for row in rows])
    return pd.read_csv(rows_file)


def summarize_layouts(rows: pd.DataFrame) -> pd.DataFrame:
    """Per layout and method: medians over turns of ms/token, speed against the fastest plain decoding,
    tau, the forward and the drafting of a round in plain steps of the same layout (the plain forward's
    median per round), and the share of turns whose tokens equal plain decoding's (own layout, row-major)."""
    plain_forward = rows[rows.method == "plain"].groupby("layout").forward_ms_per_round.median()
    steps = rows.assign(verify_steps=rows.forward_ms_per_round / rows.layout.map(plain_forward),
                        draft_steps=rows.draft_ms_per_round / rows.layout.map(plain_forward))
    return steps.groupby(["layout", "method"]).agg(
        turns=("prompt_id", "size"), ms_per_token=("ms_per_token", "median"),
        speedup_vs_fastest_plain=("speedup_vs_fastest_plain", "median"), tau=("tau", "median"),
        verify_steps=("verify_steps", "median"), draft_steps=("draft_steps", "median"),
        same_as_plain=("same_as_plain", "mean"), same_as_torch_plain=("same_as_torch_plain", "mean")).reset_index()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("data/results/linear-layout") / time.strftime("%Y%m%d-%H%M%S"))
    parser.add_argument("--n-prompts", type=int, default=LayoutSettings.n_prompts)
    parser.add_argument("--max-new-tokens", type=int, default=LayoutSettings.max_new_tokens)
    parser.add_argument("--methods", default=LayoutSettings.methods)
    parser.add_argument("--benchmarks", type=lambda s: tuple(s.split(",")), default=BENCHMARKS)
    parser.add_argument("--dtype", default=LayoutSettings.dtype, help="float32 or bfloat16 (target and drafters)")
    parser.add_argument("--layouts", type=lambda s: tuple(s.split(",")), default=LayoutSettings.layouts,
                        help="comma-separated linear layouts, 'torch' among them")
    args = parser.parse_args(argv)
    settings = LayoutSettings(benchmarks=args.benchmarks, methods=args.methods, n_prompts=args.n_prompts,
                              max_new_tokens=args.max_new_tokens, dtype=args.dtype, layouts=args.layouts)
    rows = measure_layouts(settings, args.out)
    summary = summarize_layouts(rows)
    summary.to_csv(args.out / "summary.csv", index=False)
    print(summary.to_string(index=False, float_format=lambda v: f"{v:.3f}"))


if __name__ == "__main__":
    main()
