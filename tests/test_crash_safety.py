"""Crash safety of ``dspark bench``: a run killed with SIGKILL in the middle of a write resumes
with no torn and no duplicated rows, for real (a subprocess, killed from outside), and the
append-only file helpers it shares with the data pipeline cut exactly what an interrupted write left."""

import csv
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from dspark_core.cli import main
from dspark_core.core.jsonl import (
    PAUSE_MID_WRITE,
    append_csv,
    cut_torn_tail,
    drop_last_lines,
)
from dspark_core.eval.bench import KEY, _finished_turns

BENCH = ["bench", "--benchmarks", "smoke", "--n-prompts", "2", "--methods", "ngram:3;ngram:5;oracle:3",
         "--temperatures", "0", "--max-new-tokens", "8", "--dtypes", "float32"]
PER_TURN = 4  # plain and three methods


def test_append_csv_cuts_a_torn_line_and_writes_the_header_once(tmp_path):
    path = tmp_path / "rows.csv"
    append_csv(path, [{"a": 1, "b": "x,y"}, {"a": 2, "b": "[1, 2]"}])
    with path.open("a") as handle:
        handle.write("3,unfinis")  # a write cut short
    append_csv(path, [{"a": 4, "b": "z"}])
    assert path.read_text() == 'a,b\n1,"x,y"\n2,"[1, 2]"\n4,z\n'
    drop_last_lines(path, 2)
    assert path.read_text() == 'a,b\n1,"x,y"\n'
    path.write_text("a,")  # torn inside the header: the file starts over
    cut_torn_tail(path)
    append_csv(path, [{"a": 5, "b": "w"}])
    assert path.read_text() == "a,b\n5,w\n"


def test_an_unfinished_turn_is_cut_whole(tmp_path):
    """The rows of one turn are appended in one write; a kill inside it leaves some complete rows
    of that turn and a torn one. Neither may count as measured (the turn would lose its other methods)."""
    path = tmp_path / "rows.csv"
    row = dict(zip(KEY, (0.0, "smoke", "p1", 1)))
    append_csv(path, [{**row, "method": m} for m in ("plain", "a", "b", "c")])
    with path.open("a") as handle:
        handle.write("0.0,smoke,p2,1,plain\n0.0,smoke,p2,1,a\n0.0,smoke,p2")
    assert _finished_turns(path, PER_TURN) == [(0.0, "smoke", "p1", 1)] * PER_TURN
    assert len(pd.read_csv(path)) == PER_TURN and path.read_text().endswith(",c\n")


@pytest.mark.slow  # runs dspark bench on the default target
def test_bench_killed_in_the_middle_of_a_write_resumes_without_torn_or_duplicated_rows(tmp_path):
    out = tmp_path / "run"
    assert main(BENCH + ["--out", str(out)]) == 0
    complete = (out / "rows.csv").read_text().splitlines(keepends=True)
    assert len(complete) == 1 + 2 * PER_TURN
    first_turn = "".join(complete[: 1 + PER_TURN])
    (out / "rows.csv").write_text(first_turn)  # as if the run had stopped after its first turn

    marker = tmp_path / "paused-mid-write"
    env = {**os.environ, PAUSE_MID_WRITE: str(marker), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "dspark_core.cli", *BENCH, "--out", str(out)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.exists(), f"the rerun never reached its write: {proc.communicate(timeout=60)[1].decode()[-2000:]}"
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    torn = (out / "rows.csv").read_text()
    assert torn.startswith(first_turn) and not torn.endswith("\n")  # killed inside a line of the second turn
    assert torn.count("\n") > first_turn.count("\n")  # ... after some complete rows of that turn

    assert main(BENCH + ["--out", str(out)]) == 0
    text = (out / "rows.csv").read_text()
    assert text.startswith(first_turn) and text.endswith("\n")
    lines = list(csv.reader(text.splitlines()))
    assert {len(line) for line in lines} == {len(lines[0])}  # no torn row
    rows = pd.read_csv(out / "rows.csv")
    assert len(rows) == 2 * PER_TURN and not rows.duplicated([*KEY, "method"]).any()
    assert (rows.groupby("prompt_id")["method"].nunique() == PER_TURN).all() and rows["same_as_plain"].all()
