"""Append-only line files (JSONL and CSV) that survive a crash in the middle of a write.

Every resumable job (distillation, benchmarks) appends whole lines with :func:`append_jsonl` or
:func:`append_csv`, which write a batch of rows in one call and sync it to disk. A process killed
mid-write leaves at most one torn last line (no final newline): :func:`read_jsonl` ignores it, and
the next append cuts it off (:func:`cut_torn_tail`) before writing, so a resumed run has no torn
and no duplicated rows. A caller whose batch must be saved whole (several lines) drops the complete
lines of an unfinished batch with :func:`drop_last_lines`.

Testing a kill in the middle of a write: with ``$DSPARK_TEST_PAUSE_MID_WRITE`` set to a file path,
an append writes the first half of its batch (synced, ending inside a line), creates that file and
sleeps, so a test can SIGKILL the process at exactly that point. Nothing else reads the variable.
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
from pathlib import Path

PAUSE_MID_WRITE = "DSPARK_TEST_PAUSE_MID_WRITE"


def cut_torn_tail(path: Path) -> None:
    """Drop everything after the last newline of ``path`` (a line whose write was interrupted)."""
    with Path(path).open("rb+") as handle:
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


def drop_last_lines(path: Path, count: int) -> None:
    """Remove the last ``count`` complete lines of ``path`` (its tail must not be torn)."""
    if count <= 0:
        return
    data = Path(path).read_bytes()
    if not data.endswith(b"\n"):
        raise ValueError(f"{path} ends inside a line; cut_torn_tail it first.")
    end = len(data) - 1  # the final newline
    for _ in range(count):
        end = data.rfind(b"\n", 0, end)  # the newline ending the line before; -1 before the first line
    with Path(path).open("rb+") as handle:
        handle.truncate(end + 1)


def _write_synced(handle, text: str) -> None:
    handle.write(text)
    handle.flush()
    os.fsync(handle.fileno())


def _append(path: Path, text: str) -> None:
    """Append ``text`` (whole lines) after cutting a torn last line, and sync it to disk."""
    with path.open("a", encoding="utf-8", newline="") as handle:
        marker = os.environ.get(PAUSE_MID_WRITE)
        if marker:  # tests only (module docstring): stop inside a line and wait for SIGKILL
            half = len(text) // 2
            _write_synced(handle, text[: half - (text[half - 1] == "\n")])
            Path(marker).touch()
            time.sleep(3600)
        _write_synced(handle, text)


def replace_jsonl(path: Path, rows: list[dict]) -> None:
    """Make ``path`` hold exactly ``rows`` (no file when there are none), atomically: the rows are written to a
    synced temporary file beside it, which then replaces it, so a crash leaves the old file or the new one."""
    path = Path(path)
    if not rows:
        path.unlink(missing_ok=True)
        return
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("w") as handle:
        _write_synced(handle, "".join(json.dumps(row) + "\n" for row in rows))
    os.replace(temporary, path)


def append_jsonl(path: Path, rows: list[dict]) -> None:
    """Append ``rows`` as complete JSON lines, after cutting a torn last line, and sync them to disk."""
    path = Path(path)
    if path.is_file():
        cut_torn_tail(path)
    _append(path, "".join(json.dumps(row) + "\n" for row in rows))


def append_csv(path: Path, rows: list[dict]) -> None:
    """Append ``rows`` (dicts with the same keys) as CSV lines in one synced write, after cutting a
    torn last line; the header comes first when the file is new (or held only a torn line).
    Fields must not contain newlines (one row is one line)."""
    path = Path(path)
    if path.is_file():
        cut_torn_tail(path)
    new_file = not path.is_file() or path.stat().st_size == 0
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
    if new_file:
        writer.writeheader()
    writer.writerows(rows)
    text = buffer.getvalue()
    if text.count("\n") != len(rows) + new_file:
        raise ValueError(f"A row for {path} holds a newline; one row must be one line.")
    _append(path, text)


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
