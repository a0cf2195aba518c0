"""The ``dspark`` command line: ``generate``, ``bench``, ``data`` and ``train``."""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import sys
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from .core.linear_layout import LINEAR_LAYOUTS
from .core.paths import RESULTS_DIR
from .core.prompts import first_turn_messages, load_prompt_set
from .core.provenance import timestamp
from .core.rounds import GenerationResult
from .core.sampling import SamplingConfig
from .core.target import (
    DEFAULT_TARGET,
    DTYPES,
    dtype_name,
    encode_prompt,
    eos_token_ids,
    load_target,
)
from .data import distill, train_prompts, training_set
from .data.distill import DISTILL_DIR, DistillSettings
from .data.features import FeatureSpec, build_feature_store
from .data.training_set import training_sequences
from .decode import calibration as cal
from .decode.loop import autoregressive_generate, speculative_generate
from .decode.policies import FixedLength
from .decode.profile import (
    combine_dtypes,
    default_profile_path,
    measure_profiles,
    native_bf16,
    serving_dtype,
)
from .decode.shapes import get_shape
from .drafters.lookup import LOOKUP_FIRST_NGRAM
from .drafters.registry import DRAFTER_NAMES, LOOKUP_FIRST, build_drafter, check_drafter_name
from .drafters.registry import shipped_drafter as drafter_folder
from .eval.bench import (
    BENCHMARKS,
    PROFILES,
    BenchSettings,
    benchmark_path,
    report,
    run_bench,
)
from .eval.calibrate import calibration_prompts, collect_rounds
from .eval.gpu_results import profile_shape, resolve_dtype
from .eval.heldout import evaluate_folder, selection_curve, selection_store
from .eval.lean_round import measure_round_split, summarize_round_split
from .train.config import CE_LABELS, LOSSES, TrainConfig
from .train.drafters import train, train_draft_lm

AUTO_DTYPE = ("auto: the fastest in this machine's cost profile (`dspark profile`), else bfloat16 where the CPU or GPU "
              "computes it natively (AMX or AVX512-BF16 on a CPU; elsewhere bfloat16 is emulated, ~10x slower), else float32")


LAYOUT_HELP = ("the target's linear weights: torch (as loaded) or input-major (re-strided for the few-row products of "
               "verification, drafters following; faster in float32 on the Intel Xeon without AMX measured, see "
               "data/results/linear-layout)")


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=DEFAULT_TARGET, help="target: the embedded default, a hub id or a folder")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    parser.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0: off)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus mass to keep (1: off)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["auto", *DTYPES], default="auto", help=f"the target's dtype ({AUTO_DTYPE})")


def _serving_dtype(name: str, device: str) -> torch.dtype:
    """The torch dtype of ``--dtype``; ``auto`` is resolved (and says why) by :func:`serving_dtype`."""
    if name != "auto":
        return DTYPES[name]
    chosen, why = serving_dtype(device)
    print(f"dtype: {chosen} ({why})", file=sys.stderr)
    return DTYPES[chosen]


def _dtype_name(name: str, device: str) -> str:
    """A dtype name, ``auto`` resolved."""
    return dtype_name(_serving_dtype(name, device))


def _print_rounds(result: GenerationResult, gamma: int) -> None:
    print(f"\nnew tokens {len(result.tokens)}  rounds {len(result.rounds)}  tau {result.tau:.2f}  "
          f"acceptance {result.acceptance_rate:.3f}  tok/s {result.tokens_per_second:.1f}")
    if gamma:
        reached, accepted = result.position_counts(gamma)
        cond = "  ".join(f"{k + 1}:{a}/{r}" for k, (r, a) in enumerate(zip(reached, accepted)) if r)
        print(f"conditional acceptance per position (accepted/reached): {cond}")
    parts = "  ".join(f"{part} {seconds:.3f}s" for part, seconds in result.time_split().items())
    print(f"time: {parts}  total {result.total_time:.3f}s ({result.outside_forward_share:.1%} of the rounds outside "
          "the target's forward)")


def cmd_generate(args: argparse.Namespace) -> None:
    sampling = SamplingConfig(args.temperature, args.top_k, args.top_p)
    check_drafter_name(args.drafter)
    model, tokenizer = load_target(args.model, dtype=_serving_dtype(args.dtype, args.device), device=args.device,
                                   linear_layout=args.linear_layout)
    prompt = encode_prompt(tokenizer, args.prompt)
    kwargs = dict(sampling=sampling, max_new_tokens=args.max_new_tokens, seed=args.seed,
                  eos_token_ids=eos_token_ids(model, tokenizer))
    reference = autoregressive_generate(model, prompt, **kwargs).tokens if args.drafter == "oracle" else None
    drafter = build_drafter(args.drafter, model, tokenizer, draft_model=args.draft_model, reference=reference)
    result = speculative_generate(model, prompt, drafter, FixedLength(args.gamma) if drafter else None, **kwargs)
    print(tokenizer.decode(result.tokens, skip_special_tokens=True))
    _print_rounds(result, args.gamma if drafter else 0)


def cmd_bench(args: argparse.Namespace) -> None:
    overrides = {f.name: getattr(args, f.name) for f in fields(BenchSettings) if getattr(args, f.name, None) is not None}
    if "dtypes" in overrides:
        overrides["dtypes"] = tuple(dict.fromkeys(_dtype_name(d, args.device) for d in overrides["dtypes"]))
    settings = replace(PROFILES[args.profile], **overrides)
    out = Path(args.out or RESULTS_DIR / f"bench-{args.profile}")
    if args.fresh and out.exists():
        shutil.rmtree(out)
    model, tokenizer = load_target(settings.model, device=args.device, linear_layout=settings.linear_layout)
    rows = run_bench(settings, out, model, tokenizer)
    print(report(rows))
    print(f"\nrows: {out / 'rows.csv'}  settings: {out / 'settings.json'}")
    if (out / "skipped.jsonl").is_file():
        print(f"skipped turns (too long for the context window): {out / 'skipped.jsonl'}")


def cmd_profile(args: argparse.Namespace) -> None:
    tokens = tuple(args.tokens or range(1, args.max_tokens + 1))
    command = "dspark " + " ".join(sys.argv[1:])
    if args.round_split:
        _round_split(args)
        return
    if args.shape:  # a random-weight target of a named shape: no weights needed, timing only
        (profile,) = profile_shape(get_shape(args.shape), args.device, resolve_dtype(args.dtype, args.device),
                                   tuple(args.requests), tokens, args.context, args.repeats, (args.mode,),
                                   tuple(args.draft_layers), args.block, command=command)
    elif args.draft_layers:
        raise SystemExit("--draft-layers sizes a drafter from a target shape: pass --shape too (e.g. smollm2-135m).")
    else:
        profile = _profile_dtypes(args, tokens, command)
    path = profile.save(Path(args.out) if args.out else default_profile_path(args.device))
    for name in sorted(profile.by_dtype or {profile.meta["dtype"]: None}):
        curves = profile.for_dtype(name)
        print(f"target forward steps per second, {name} ({profile.meta['mode']}; rows: requests R, columns: new "
              f"tokens n = {' '.join(map(str, profile.token_counts()))})")
        for rows, curve in curves.steps.items():
            print(f"R={rows:>3}: " + " ".join(f"{s:7.2f}" for s in curve))
    if profile.fastest_dtype:
        rule = profile.meta["fastest_dtype"]
        print(f"fastest for speculative decoding: {profile.fastest_dtype} (expected ms per token at acceptance "
              f"{rule['acceptance']} a position, drafting free: "
              + ", ".join(f"{d} {1000 * t:.2f}" for d, t in rule["seconds_per_token"].items()) + ")")
    for layers, table in (profile.draft or {}).items():
        print(f"draft ms per round, {layers} layer(s): " + " ".join(f"R={r}:{1000 * s:.2f}" for r, s in table.items()))
    print(f"saved to {path}")


def _profile_dtypes(args: argparse.Namespace, tokens: tuple[int, ...], command: str):
    """The default (or named) target's profile in every dtype of ``--dtypes``, measured interleaved."""
    models = _targets_in(args.dtypes, args.model, args.device)
    profiles = measure_profiles(list(models.values()), tuple(args.requests), context=args.context, repeats=args.repeats,
                                tokens=tokens, mode=args.mode, meta={"command": command, "model": args.model})
    return combine_dtypes(profiles)


def _targets_in(dtypes: tuple[str, ...], model: str, device: str) -> dict:
    """The target in each dtype, cast from one float32 load."""
    reference, _ = load_target(model, device=device)
    return {name: reference if name == "float32" else copy.deepcopy(reference).to(DTYPES[name]) for name in dtypes}


def _round_split(args: argparse.Namespace) -> None:
    """``dspark profile --round-split``: where a round's time goes, dynamic against static KV cache."""
    models = _targets_in(args.dtypes, args.model, args.device)
    _, tokenizer = load_target(args.model, device=args.device)
    prompts = [encode_prompt(tokenizer, first_turn_messages(load_prompt_set(benchmark_path(name))[0]))
               for name in BENCHMARKS]
    rows = measure_round_split(models, tokenizer, prompts, args.gamma, args.max_new_tokens_split, args.repeats)
    out = Path(args.out) if args.out else RESULTS_DIR / f"round-split-{timestamp()}.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    rows.to_csv(out, index=False)
    print(summarize_round_split(rows).to_string())
    print(f"rows: {out}")


def cmd_calibrate(args: argparse.Namespace) -> None:
    model, tokenizer = load_target(args.model, device=args.device)
    drafter = build_drafter("dspark", model, tokenizer, draft_model=args.drafter_dir)
    folder = Path(args.drafter_dir or drafter_folder("dspark-markov"))
    sampling = SamplingConfig(args.temperature, args.top_k, args.top_p)
    if args.rounds:
        rounds = cal.Rounds.load(args.rounds)
        print(f"refitting on {len(rounds.verified)} saved rounds from {args.rounds}")
    else:
        records = calibration_prompts(args.n_prompts, args.seed)
        rounds = collect_rounds(model, tokenizer, drafter, records, args.gamma, sampling, args.max_new_tokens, args.seed)
        print(f"rounds saved to {rounds.save(folder / cal.rounds_file(args.temperature))} (refit with --rounds)")
    fit, held = rounds.split_by_prompt()
    if min(len(fit.verified), len(held.verified)) < 10:
        raise ValueError(f"Only {len(rounds.verified)} full rounds were collected; pass more --n-prompts.")
    scaling, decision = cal.cross_fit(rounds, cal.fit_sts_with_bias if args.with_bias else cal.fit_sts, args.keep_fit)
    before, after = cal.position_metrics(held), cal.position_metrics(held, scaling)
    diagrams = {k: {"before": cal.reliability(held, k), "after": cal.reliability(held, k, scaling)}
                for k in range(1, rounds.confidences.shape[1] + 1)}
    path = cal.save_calibration(folder, args.temperature, scaling, {
        "rounds": int(len(rounds.verified)), "prompts": int(len(np.unique(rounds.prompt))),
        "fit_on": "rounds of even-numbered prompts", "scored_on": "rounds of odd-numbered prompts",
        "cross_fit": decision, "before": before, "after": after, "reliability": diagrams})
    change = ", ".join(f"{c:+.4f} ({d})" for c, d in zip(decision["held_out_brier_change"],
                                                          decision["brier_change_directions"]))
    print(f"{decision['fitted']} changes the held-out survival Brier (summed over positions) by {change}: "
          f"serving {'the fit' if scaling.method != 'none' else 'the raw confidences'}"
          f"{' (--keep-fit)' if args.keep_fit and not decision['kept'] else ''}")
    print(f"{scaling.method}: position  n     rate   ECE before -> after (floor)   AUC before -> after   "
          "Brier before -> after   T     b")
    for b, a, t, bias in zip(before, after, scaling.temperatures, scaling.biases):
        print(f"k={b['k']:<7} {b['n']:<5} {b['rate']:.3f}  {b['ece']:.4f} -> {a['ece']:.4f} ({a['ece_floor']:.4f})  "
              f"{b['auc']:.3f} -> {a['auc']:.3f}        {b['brier']:.4f} -> {a['brier']:.4f}     {t:.2f}  {bias:+.1f}")
    print(f"saved to {path}")


def cmd_data(args: argparse.Namespace) -> None:
    if args.action == "prompts":
        records = train_prompts.generate_train_prompts()
        path = train_prompts.write_prompt_set(records, Path(args.prompts or train_prompts.TRAIN_PROMPTS))
        print(f"wrote {len(records)} templated training prompts to {path} (python {train_prompts.python_version()})")
        return
    if args.action == "build":
        mix = training_set.build_training_set(out_dir=Path(args.prompts).parent if args.prompts else training_set.PROMPT_DIR)
        print(json.dumps(mix, indent=1))
        return
    prompt_file = Path(args.prompts or training_set.DISTILL_PROMPTS)
    records = load_prompt_set(prompt_file)[: args.n_prompts]
    model, tokenizer = load_target(args.model, dtype=_serving_dtype(args.dtype, args.device), device=args.device)
    settings = distill.DistillSettings(args.temperature, args.top_p, args.max_new_tokens, args.batch_size, args.seed)
    out_dir = Path(args.out_dir)
    if args.action == "generate":
        distill.generate(model, tokenizer, records, out_dir, settings)
    path = distill.pack(model, tokenizer, records, prompt_file, out_dir, settings)
    print(f"packed {path}")


def cmd_train(args: argparse.Namespace) -> None:
    config = TrainConfig(
        drafter=args.drafter, head=args.head, layers=args.layers, block=args.block,
        feature_layers=tuple(args.feature_layers), draft_vocab=args.draft_vocab, rank=args.rank, loss=args.loss,
        position_decay=args.position_decay, ce_label=args.ce_label, init_from_target=args.init_from_target,
        init_drafter=args.init_drafter or "",
        anchor_feature=args.anchor_feature,
        shift_anchors=args.shift_anchors, distill_repeats=args.distill_repeats,
        epochs=args.epochs, steps=args.steps, tokens_per_step=args.tokens_per_step, lr=args.lr, warmup=args.warmup,
        val_fraction=args.val_fraction, seed=args.seed, save_every=args.save_every, lm_width=args.lm_width,
        bf16=args.autocast == "bfloat16" or (args.autocast == "auto" and native_bf16(args.device)), save_dtype=args.save_dtype,
    )
    sources = tuple(args.sources.split(","))
    if args.distill_chunks is not None and "distill" not in sources:
        raise ValueError(f"--distill-chunks pins the self-distilled answers, but --sources {args.sources} has no distill")
    model, tokenizer = load_target(args.model, dtype=_serving_dtype(args.dtype, args.device), device=args.device)
    sequences = training_sequences(tokenizer, sources, args.max_tokens, args.seed, args.fixed_tokens,
                                   distill_chunks=args.distill_chunks)
    print(f"training text: {len(sequences):,} sequences, {sequences.total_tokens:,} tokens, "
          f"{sequences.span_tokens:,} in spans; mix {json.dumps(sequences.counts())}")
    on_save = None
    if args.selection:  # a draft LM reads no features: any store of the selection set holds the target's top k
        curve = Path(args.out) / "selection-curve.csv"
        judge = model if model.dtype == torch.float32 else load_target(args.model, device=args.device)[0]
        on_save = selection_curve(selection_store(judge, tokenizer, config.feature_layers), curve)  # float32, as heldout
    if config.drafter == "draft-lm":
        trained = train_draft_lm(config, model, tokenizer, sequences, Path(args.out), on_save)
    else:
        spec = FeatureSpec(layers=config.feature_layers, top_k=args.top_k)
        store = build_feature_store(model, tokenizer, sequences, spec, max_gb=args.max_gb)
        if args.features_only:
            print(f"feature store ready: {store.folder}")
            return
        trained = train(config, model, tokenizer, store, Path(args.out), on_save)
    print(f"saved {config.drafter} ({sum(p.numel() for p in trained.parameters()) / 1e6:.1f}M parameters) to {args.out}")


def cmd_heldout(args: argparse.Namespace) -> None:
    model, tokenizer = load_target(args.model, dtype=_serving_dtype(args.dtype, args.device), device=args.device)
    tables = {}
    for folder in args.drafters:
        tables[folder] = evaluate_folder(Path(folder), model, tokenizer, args.per_benchmark)
        print(f"\n{folder} (selection set, teacher-forced on the target's greedy answers):")
        print(tables[folder].round(3).to_string())
    if args.out:
        combined = pd.concat({Path(f).name: t for f, t in tables.items()}, names=["drafter"])
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        combined.to_csv(args.out)
        print(f"\nwrote {args.out}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dspark", description="Lossless speculative decoding (DSpark).")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text for one prompt and print round statistics")
    gen.add_argument("--prompt", required=True, help="the user message (the chat template is applied)")
    gen.add_argument("--drafter", default="ngram",
                     help=f"one of {', '.join(DRAFTER_NAMES)}; eagle, dflash or dspark with '{LOOKUP_FIRST}' "
                          f"(or '{LOOKUP_FIRST}N') copies from the context where its last {LOOKUP_FIRST_NGRAM} (N) or more "
                          "tokens occurred before, and drafts elsewhere")
    gen.add_argument("--gamma", type=int, default=5, help="draft tokens verified per round")
    gen.add_argument("--draft-model", default=None, help="checkpoint for --drafter draft-lm (a causal LM: hub id or folder) "
                                                               "or dflash / dspark (a trained drafter folder)")
    gen.add_argument("--linear-layout", choices=LINEAR_LAYOUTS, default="torch", help=LAYOUT_HELP)
    _add_common(gen)
    gen.set_defaults(func=cmd_generate)

    bench = sub.add_parser("bench", help="methods x benchmarks x temperatures side by side (resumable)")
    bench.add_argument("--profile", choices=sorted(PROFILES), default="quick",
                       help="quick: 1 prompt per benchmark, 64 tokens (~10 min); full: 3 prompts, 96 tokens (about 65 min "
                            "on 2 cores with both dtypes); scheduled, lookup-first, lookup-selection, lookup-block: see the README")
    bench.add_argument("--benchmarks", type=lambda s: tuple(s.split(",")), default=None,
                       help=f"comma-separated names in data/prompts/ or JSONL paths (default: {','.join(BENCHMARKS)})")
    bench.add_argument("--methods", default=None,
                       help="'name[=folder][:gammas];...', e.g. 'ngram:3,7;dspark-markov:7;dflash=runs/x:7;hf-assisted' "
                            "(plain decoding always runs); llamacpp and llamacpp-lookup[:G] need `make peers`")
    bench.add_argument("--temperatures", type=lambda s: tuple(float(t) for t in s.split(",")), default=None,
                       help="comma-separated, e.g. 0,1 (0 is greedy)")
    bench.add_argument("--n-prompts", type=int, default=None, help="N records of each benchmark (see --records)")
    bench.add_argument("--records", choices=("first", "last"), default=None,
                       help="take the first N records (the evaluation runs) or the last N (choosing a setting)")
    bench.add_argument("--max-new-tokens", type=int, default=None)
    bench.add_argument("--seed", type=int, default=None)
    bench.add_argument("--top-k", type=int, default=None)
    bench.add_argument("--top-p", type=float, default=None)
    bench.add_argument("--model", default=None, help="target: the embedded default, a hub id or a folder")
    bench.add_argument("--dtypes", type=lambda s: tuple(s.split(",")), default=None,
                       help=f"the target's dtypes, each running plain decoding and every method (default: "
                            f"{','.join(DTYPES)}); auto names the serving default (see generate --dtype)")
    bench.add_argument("--linear-layout", choices=LINEAR_LAYOUTS, default=None, help=LAYOUT_HELP)
    bench.add_argument("--device", default="cpu")
    bench.add_argument("--out", default=None, help="run folder (default data/results/bench-<profile>); "
                                                 "re-running resumes it")
    bench.add_argument("--fresh", action="store_true", help="discard what the run folder holds and start over")
    bench.set_defaults(func=cmd_bench)

    prof = sub.add_parser("profile", help="measure target forward steps per second vs batch shape (for the scheduler)")
    prof.add_argument("--requests", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="concurrent requests R")
    prof.add_argument("--max-tokens", type=int, default=16, help="new tokens per request n = 1..N")
    prof.add_argument("--tokens", type=int, nargs="+", default=None, help="profile these n instead (e.g. 1 2 4 8 16)")
    prof.add_argument("--shape", default=None, help="time a random-weight target of this shape instead of --model: "
                      "smollm2-135m (the default target's), qwen3-4b, qwen3-8b, tiny")
    prof.add_argument("--mode", choices=["eager", "static", "graphs"], default="eager",
                      help="dynamic cache, static cache, or static cache + CUDA graphs (CUDA only)")
    prof.add_argument("--dtype", default="auto", help="with --shape: auto (bfloat16 on CUDA, float32 on a CPU), bfloat16, ...")
    prof.add_argument("--dtypes", type=lambda s: tuple(s.split(",")), default=tuple(DTYPES),
                      help="without --shape: the target's dtypes, measured interleaved; the profile records the "
                           "fastest for speculative decoding, which `--dtype auto` serves in (default: all of them)")
    prof.add_argument("--round-split", action="store_true",
                      help="instead: decode one prompt of each benchmark with plain decoding, the oracle and "
                           "dspark-markov in each of --dtypes, with the dynamic and the pre-allocated KV cache, "
                           "interleaved (--repeats times), and print where a round's time goes")
    prof.add_argument("--gamma", type=int, default=7, help="with --round-split: the block length")
    prof.add_argument("--max-new-tokens-split", type=int, default=64, help="with --round-split: new tokens per run")
    prof.add_argument("--draft-layers", type=int, nargs="*", default=[], help="with --shape: also time dspark drafters this deep")
    prof.add_argument("--block", type=int, default=7, help="with --draft-layers: tokens drafted per round")
    prof.add_argument("--context", type=int, default=128, help="cached tokens per request")
    prof.add_argument("--repeats", type=int, default=5, help="timed forwards per shape (median)")
    prof.add_argument("--model", default=DEFAULT_TARGET)
    prof.add_argument("--device", default="cpu")
    prof.add_argument("--out", default=None, help="JSON path (default: $DSPARK_CACHE_DIR/profiles/<host>-<device>.json); "
                      "with --round-split a CSV (default data/results/round-split-<stamp>.csv)")
    prof.set_defaults(func=cmd_profile)

    held = sub.add_parser("heldout", help="acceptance of trained drafters on the held-out selection set (no decoding)")
    held.add_argument("drafters", nargs="+", help="trained drafter folders")
    held.add_argument("--per-benchmark", type=int, default=24, help="last N records of every evaluation set")
    held.add_argument("--out", default=None, help="CSV of every drafter's table")
    held.add_argument("--dtype", choices=["auto", *DTYPES], default="auto", help=f"the target's dtype ({AUTO_DTYPE})")
    held.add_argument("--model", default=DEFAULT_TARGET)
    held.add_argument("--device", default="cpu")
    held.set_defaults(func=cmd_heldout)

    calib = sub.add_parser("calibrate", help="fit Sequential Temperature Scaling for a dspark drafter's confidences, "
                                                        "served where it beats the raw ones on held-out rounds")
    calib.add_argument("--drafter-dir", default=None, help="dspark drafter folder (default: the shipped dspark-markov)")
    calib.add_argument("--n-prompts", type=int, default=48, help="held-out training prompts to decode")
    calib.add_argument("--gamma", type=int, default=7)
    calib.add_argument("--max-new-tokens", type=int, default=96)
    calib.add_argument("--temperature", type=float, default=0.0, help="sampling temperature to calibrate for")
    calib.add_argument("--top-k", type=int, default=0)
    calib.add_argument("--top-p", type=float, default=1.0)
    calib.add_argument("--seed", type=int, default=0)
    calib.add_argument("--with-bias", action="store_true",
                       help="also fit a per-position bias (sequential Platt scaling; an extension, not the paper's STS)")
    calib.add_argument("--keep-fit", action="store_true",
                       help="serve the fit (on the even-prompt half) even when the cross-fit finds it no better than the "
                            "raw confidences on held-out rounds")
    calib.add_argument("--rounds", default=None,
                       help="refit on saved rounds (the .npz a previous run wrote beside the drafter) instead of decoding")
    calib.add_argument("--model", default=DEFAULT_TARGET)
    calib.add_argument("--device", default="cpu")
    calib.set_defaults(func=cmd_calibrate)

    defaults = DistillSettings()
    data = sub.add_parser("data", help="training data: build the prompt sets, self-distil answers, pack them")
    data.add_argument("action", choices=["prompts", "build", "generate", "pack"],
                      help="prompts: write the templated math/code/chat prompts (train.jsonl); build: the ShareGPT "
                           "training mix (distill.jsonl, conversations.json, calibration.jsonl, mix.json); generate: "
                           "answer distill.jsonl with the target (resumable) and pack; pack: pack what is answered so far")
    data.add_argument("--prompts", default=None, help="prompt file to write (prompts, build) or answer (generate, pack; "
                                                      "default data/prompts/distill.jsonl)")
    data.add_argument("--n-prompts", type=int, default=None, help="answer only the first N prompts")
    data.add_argument("--out-dir", default=str(DISTILL_DIR))
    data.add_argument("--model", default=DEFAULT_TARGET)
    data.add_argument("--temperature", type=float, default=defaults.temperature)
    data.add_argument("--top-p", type=float, default=defaults.top_p)
    data.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens)
    data.add_argument("--batch-size", type=int, default=defaults.batch_size)
    data.add_argument("--seed", type=int, default=defaults.seed)
    data.add_argument("--dtype", choices=["auto", *DTYPES], default="auto",
                      help=f"the target's dtype while answering (the answers are training text; {AUTO_DTYPE})")
    data.add_argument("--device", default="cpu")
    data.set_defaults(func=cmd_data)

    tc = TrainConfig()
    trn = sub.add_parser("train", help="train a drafter (eagle, dflash, dspark, draft-lm) on the training text")
    trn.add_argument("--drafter", choices=["eagle", "dflash", "dspark", "draft-lm"], default=tc.drafter)
    trn.add_argument("--head", choices=["markov", "rnn"], default=tc.head, help="dspark's sequential head")
    trn.add_argument("--layers", type=int, default=tc.layers, help="drafter depth (transformer layers)")
    trn.add_argument("--init-from-target", action="store_true", help="start the draft layers from the target's top layers")
    trn.add_argument("--init-drafter", metavar="DIR",
                     help="warm start: begin from this trained drafter's weights and draft vocabulary (same flags "
                          "as it was trained with); the schedule starts over")
    trn.add_argument("--anchor-feature", action="store_true",
                     help="(ours; dflash, dspark) add the fused target feature of the token before the anchor to the block's inputs")
    trn.add_argument("--shift-anchors", action="store_true",
                     help="(eagle, dflash, dspark) a new seeded block tiling of every sequence at every step, so that "
                          "later epochs see other blocks than the first")
    trn.add_argument("--lm-width", type=int, default=tc.lm_width, help="hidden size of the draft LM (draft-lm only)")
    trn.add_argument("--block", type=int, default=tc.block, help="gamma: tokens drafted per round")
    trn.add_argument("--feature-layers", type=int, nargs="+", default=list(tc.feature_layers),
                     help="target hidden_states indices fused into the context (0 = embeddings)")
    trn.add_argument("--draft-vocab", type=int, default=tc.draft_vocab, help="reduced draft vocabulary size")
    trn.add_argument("--rank", type=int, default=tc.rank, help="Markov embedding / RNN state width r")
    trn.add_argument("--loss", choices=list(LOSSES), default=tc.loss,
                     help="dspark (0.1 CE + 0.9 TV + BCE), dspark-kl (ours: dspark's + 1.0 soft CE), ce (DFlash's), "
                          "eagle3 (soft CE, step weights 0.8^k)")
    trn.add_argument("--position-decay", type=float, default=tc.position_decay,
                     help="loss position weights exp(-(k-1)/decay); 0: the block size, as the paper writes them "
                          "(DeepSpec's code: 4 at block 7); not for --loss eagle3 or the draft LM")
    trn.add_argument("--ce-label", choices=list(CE_LABELS), default=tc.ce_label,
                     help="the CE term's label: the text's next token or the target's argmax")
    trn.add_argument("--epochs", type=float, default=tc.epochs, help="passes over the training split")
    trn.add_argument("--steps", type=int, default=tc.steps, help="train exactly this many steps (0: from --epochs)")
    trn.add_argument("--tokens-per-step", type=int, default=tc.tokens_per_step, help="span tokens per optimizer step")
    trn.add_argument("--lr", type=float, default=tc.lr)
    trn.add_argument("--warmup", type=int, default=tc.warmup)
    trn.add_argument("--val-fraction", type=float, default=tc.val_fraction)
    trn.add_argument("--save-every", type=int, default=tc.save_every)
    trn.add_argument("--autocast", choices=["auto", "bfloat16", "float32"], default="auto",
                     help="the drafter's training precision: bfloat16 autocast or float32; auto: bfloat16 where the "
                          "hardware computes it natively (AMX or AVX512-BF16 on a CPU), else float32")
    trn.add_argument("--save-dtype", choices=["bfloat16", "float8"], default=tc.save_dtype,
                     help="the shipped weights' dtype (float8: e4m3 with a scale per row, half of bfloat16's size)")
    trn.add_argument("--selection", action="store_true",
                     help="at every checkpoint, measure acceptance on the held-out selection set (selection-curve.csv; "
                          "answered and read by the float32 target whatever --dtype, as `dspark heldout` measures)")
    trn.add_argument("--seed", type=int, default=tc.seed)
    trn.add_argument("--sources", default="fixed,distill",
                     help="training text: fixed (ShareGPT conversations read by the target), distill (its own answers)")
    trn.add_argument("--max-tokens", type=int, default=None, help="a seeded random subset of about N tokens of the text")
    trn.add_argument("--fixed-tokens", type=int, default=None,
                     help="about N tokens of fixed-text conversations (a seeded subset), with every distilled answer")
    trn.add_argument("--distill-chunks", type=int, default=None,
                     help="train on the first N chunks of self-distilled answers (data/distill/.../meta.json lists them; "
                          "packing only appends chunks, so N pins a run's data); default: every chunk")
    trn.add_argument("--distill-repeats", type=int, default=tc.distill_repeats,
                     help="times each self-distilled answer is visited per epoch (fixed text once): the mix's weight")
    trn.add_argument("--top-k", type=int, default=16, help="target probabilities stored per position")
    trn.add_argument("--max-gb", type=float, default=20.0, help="disk budget of the feature store")
    trn.add_argument("--features-only", action="store_true", help="build the feature store and stop (resumable)")
    trn.add_argument("--dtype", choices=["auto", *DTYPES], default="auto",
                     help=f"the target's dtype for the features ({AUTO_DTYPE})")
    trn.add_argument("--out", required=True, help="run folder: checkpoints, loss.csv, the trained drafter")
    trn.add_argument("--model", default=DEFAULT_TARGET)
    trn.add_argument("--device", default="cpu")
    trn.set_defaults(func=cmd_train)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ValueError, FileNotFoundError, RuntimeError) as err:
        print(f"dspark: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
