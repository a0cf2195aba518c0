"""The shipped drafters as a table read from their own metadata (``train_meta.json``, ``config.json``,
the weights' size), so that what the README says about them is never written by hand.

``python -m dspark_core.eval.shipped`` prints the table; ``--readme README.md`` rewrites the block between
the README's markers, and a test checks that the README holds what this prints.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..drafters.registry import SHIPPED_DRAFTERS, shipped_drafter

START, END = "<!-- shipped-drafters:start -->", "<!-- shipped-drafters:end -->"


def _training_text(meta: dict) -> str:
    """What the drafter was trained on, from its train_meta's data section."""
    data = meta["data"]
    if "train_tokens" in meta:
        mix = ", ".join(f"{name} {part['tokens']:,}" for name, part in meta["mix"].items())
        return f"ShareGPT mix, {meta['train_tokens']:,} tokens ({mix})"
    return f"template prompts ({data['prompt_file']}): {data['response_tokens']:,} answer tokens"


def _step_size(config: dict) -> str:
    if config.get("tokens_per_step"):
        return f"{config['tokens_per_step']:,} span tokens"
    return f"{config['batch_size']} sequences x {config['blocks_per_seq']} blocks"


def _steps_text(config: dict) -> str:
    """The run's steps (and epochs); a warm start names the run whose weights it started from."""
    text = f"{config['steps']:,}" + (f" ({config['epochs']:g} epochs)" if config.get("epochs") else "")
    if config.get("init_drafter"):
        text += f", from `{Path(config['init_drafter']).name}`"
    return text


def drafter_row(name: str) -> dict[str, str]:
    """One shipped drafter's settings, read from its folder."""
    folder = shipped_drafter(name)
    meta = json.loads((folder / "train_meta.json").read_text())
    config = meta["config"]
    weights = "float8, re-saved" if "weights" in meta else config["save_dtype"]
    lm = config["drafter"] == "draft-lm"  # a standalone LM: next-token CE, drafts any length
    return {
        "drafter": name,
        "layers": str(config["layers"]),
        "block": "any" if lm else str(config["block"]),
        "loss": "next-token CE" if lm else config["loss"],
        "steps": _steps_text(config),
        "per step": _step_size(config),
        "trained on": _training_text(meta),
        "weights": f"{weights}, {(folder / 'model.safetensors').stat().st_size / 2**20:.1f} MiB",
    }


def shipped_table() -> str:
    """The Markdown table of every shipped drafter."""
    rows = [drafter_row(name) for name in (*SHIPPED_DRAFTERS, "draft-lm")]
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row[column] for column in header) + " |" for row in rows]
    return "\n".join(lines)


def readme_block(readme: str) -> str:
    """The text between the README's shipped-drafters markers."""
    if START not in readme or END not in readme:
        raise ValueError(f"The README has no {START} ... {END} block to hold the shipped drafters' table.")
    return readme.split(START, 1)[1].split(END, 1)[0].strip("\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readme", type=Path, default=None, help="rewrite this README's shipped-drafters block")
    args = parser.parse_args()
    table = shipped_table()
    if args.readme is None:
        print(table)
        return
    text = args.readme.read_text()
    old = readme_block(text)
    args.readme.write_text(text.replace(old, table, 1) if old else text.replace(START, f"{START}\n{table}", 1))
    print(f"{args.readme}: shipped drafters' table {'unchanged' if old == table else 'updated'}")


if __name__ == "__main__":
    main()
