"""Append-only JSONL files that survive a crash in the middle of a write.

Every resumable job (distillation, benchmarks) appends whole lines with :func:`append_jsonl`, which
writes a batch of rows in one call and syncs it to disk. A process killed mid-write leaves at most
one torn last line (no final newline): :func:`read_jsonl` ignores it, and the next append cuts it
off before writing, so a resumed run has no torn and no duplicated rows.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def _cut_torn_tail(path: Path) -> None:
    """Drop everything after the last newline (a line whose write was interrupted)."""
    with path.open("rb+") as handle:
        size = handle.seek(0, os.SEEK_END)
        if size == 0:
            return
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return
        block, end = 1 << 16, size
        while end > 0:
            start = max(0, end - block)
            handle.seek(start)
            chunk = handle.read(end - start)
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                handle.truncate(start + cut + 1)
                return
            end = start
        handle.truncate(0)


def append_jsonl(path: Path, rows: list[dict]) -> None:
    """Append ``rows`` as complete lines, after cutting a torn last line, and sync them to disk."""
    path = Path(path)
    if path.is_file():
        _cut_torn_tail(path)
    with path.open("a", encoding="utf-8") as handle:
        handle.write("".join(json.dumps(row) + "\n" for row in rows))
        handle.flush()
        os.fsync(handle.fileno())


def read_jsonl(path: Path) -> list[dict]:
    """Every complete line of ``path`` ([] when it does not exist); a torn last line is ignored.

    A malformed line anywhere else is corruption, not an interrupted write, and raises."""
    path = Path(path)
    if not path.is_file():
        return []
    *complete, _torn = path.read_text(encoding="utf-8").split("\n")  # _torn: "" after a final newline
    rows = []
    for number, line in enumerate(complete, start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number} is not valid JSON ({err}); the file is corrupt, not just interrupted.") from err
    return rows
