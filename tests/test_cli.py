"""The command line end to end on the default target, with tiny settings."""

import json

import pandas as pd
import pytest

from dspark_core.cli import main
from dspark_core.core.prompts import SMOKE_PROMPTS, load_prompt_set
from dspark_core.eval.bench import round_split

pytestmark = pytest.mark.slow  # every test runs the CLI on the default target


def test_generate_prints_text_and_round_stats(capsys):
    assert main(["generate", "--prompt", "Name two colours.", "--drafter", "ngram", "--gamma", "3",
                 "--max-new-tokens", "12"]) == 0
    out = capsys.readouterr().out
    assert "tau" in out and "acceptance" in out and "conditional acceptance per position" in out


def test_generate_and_bench_take_the_input_major_layout(tmp_path, capsys):
    assert main(["generate", "--prompt", "Name two colours.", "--drafter", "dspark", "--gamma", "7",
                 "--max-new-tokens", "8", "--linear-layout", "input-major", "--dtype", "float32"]) == 0
    assert "tau" in capsys.readouterr().out
    out = tmp_path / "run"
    assert main(BENCH[:6] + ["ngram:3;dspark-markov:3"] + BENCH[7:] + ["--linear-layout", "input-major", "--out", str(out)]) == 0
    assert json.loads((out / "settings.json").read_text())["settings"]["linear_layout"] == "input-major"
    assert pd.read_csv(out / "rows.csv")["same_as_plain"].all()
    with pytest.raises(SystemExit):
        main(["generate", "--prompt", "Hi.", "--linear-layout", "column-major"])


def test_generate_oracle(capsys):
    assert main(["generate", "--prompt", "Count from one to five.", "--drafter", "oracle", "--gamma", "4",
                 "--max-new-tokens", "16"]) == 0
    assert "acceptance 1.000" in capsys.readouterr().out


BENCH = ["bench", "--benchmarks", "smoke", "--n-prompts", "2", "--methods",
         "ngram:3;oracle:3;hf-prompt-lookup:3;dspark-markov:hw3",
         "--temperatures", "0", "--max-new-tokens", "12", "--dtypes", "float32"]


def test_bench_writes_rows_resumes_and_refuses_other_settings(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(BENCH + ["--out", str(out)]) == 0
    rows = pd.read_csv(out / "rows.csv")
    assert set(rows["method"]) == {"plain", "ngram@3", "oracle@3", "hf-prompt-lookup@3", "dspark-markov@hw3"}
    assert len(rows) == 10 and rows["same_as_plain"].all()
    profile = json.loads((out / "cost-profile.json").read_text())  # measured once for the scheduled method
    assert len(profile["steps"]["1"]) == 4
    assert (rows.loc[rows["method"] == "oracle@3", "acceptance_rate"] == 1.0).all()
    assert json.loads((out / "settings.json").read_text())["machine"]["git_commit"]
    assert "speedup over plain decoding in the same dtype" in capsys.readouterr().out

    # An interrupted run: drop the second prompt's rows; re-running measures only what is missing.
    first = rows[rows["prompt_id"] == rows["prompt_id"].iloc[0]]
    first.to_csv(out / "rows.csv", index=False)
    assert main(BENCH + ["--out", str(out)]) == 0
    resumed = pd.read_csv(out / "rows.csv")
    assert len(resumed) == 10 and resumed.iloc[:5].equals(first.reset_index(drop=True))
    assert json.loads((out / "cost-profile.json").read_text()) == profile  # reused, not re-measured
    assert (resumed.groupby("method")["prompt_id"].nunique() == 2).all()

    assert main(BENCH[:-3] + ["16", "--dtypes", "float32", "--out", str(out)]) == 2
    assert "holds a run with other settings" in capsys.readouterr().err


def test_bench_in_both_dtypes_reports_both_baselines_and_the_round_split(tmp_path, capsys):
    """Every method and plain decoding run in float32 and bfloat16; each row's speedup is against plain
    decoding in its own dtype, and speedup_vs_fastest_plain against the fastest plain decoding of that
    turn in any dtype (hf-generate included), which it names; our methods split their rounds' time."""
    out = tmp_path / "run"
    spec = ["bench", "--benchmarks", "smoke", "--n-prompts", "1", "--methods", "ngram:3;dspark-markov:hw3;hf-generate",
            "--temperatures", "0", "--max-new-tokens", "12", "--dtypes", "float32,bfloat16", "--out", str(out)]
    assert main(spec) == 0
    printed = capsys.readouterr().out
    assert "speedup over the fastest plain decoding in any dtype" in printed and "where a round's time goes" in printed
    rows = pd.read_csv(out / "rows.csv")
    assert len(rows) == 8 and set(rows["dtype"]) == {"float32", "bfloat16"}
    for _, part in rows.groupby("dtype"):
        plain = part.loc[part["method"] == "plain", "tokens_per_s"].item()
        assert (part["speedup"] - part["tokens_per_s"] / plain).abs().max() < 1e-9
    plains = rows[rows["family"].isin(["plain", "hf-generate"])]
    fastest = plains.loc[plains["tokens_per_s"].idxmax()]
    assert (rows["fastest_plain"] == f"{fastest['method']}/{fastest['dtype']}").all()
    assert (rows["speedup_vs_fastest_plain"] - rows["tokens_per_s"] / fastest["tokens_per_s"]).abs().max() < 1e-9
    assert plains["speedup_vs_fastest_plain"].max() == pytest.approx(1.0)
    ours = rows[rows["family"].isin(["plain", "ngram", "dspark-markov"])]
    assert ours["outside_forward_share"].between(0, 1).all() and (ours["forward_time"] > 0).all()
    assert rows.loc[rows["family"] == "hf-generate", "forward_time"].isna().all()
    assert rows.loc[rows["dtype"] == "float32", "same_as_plain"].all()
    profile = json.loads((out / "cost-profile.json").read_text())
    assert set(profile["by_dtype"]) == {"float32", "bfloat16"} and profile["fastest_dtype"] in profile["by_dtype"]


def test_calibrate_writes_sts_beside_the_drafter(tmp_path, capsys):
    import shutil

    from dspark_core.decode.calibration import load_calibration
    from dspark_core.drafters.registry import shipped_drafter

    folder = tmp_path / "dspark"
    shutil.copytree(shipped_drafter("dspark-markov"), folder)
    (folder / "calibration.json").unlink(missing_ok=True)  # the shipped one; this run writes its own
    assert main(["calibrate", "--drafter-dir", str(folder), "--n-prompts", "3", "--max-new-tokens", "48",
                 "--gamma", "3"]) == 0
    assert "ECE before -> after" in capsys.readouterr().out
    stored = json.loads((folder / "calibration.json").read_text())["greedy"]
    assert len(stored["temperatures"]) == 3 and len(stored["before"]) == 3
    assert stored["method"] in ("sts", "none") and stored["cross_fit"]["kept"] == (stored["method"] == "sts")
    assert set(load_calibration(folder)) == {"greedy"}
    # refitting on the saved rounds reproduces the fit without decoding
    (folder / "calibration.json").unlink()
    assert main(["calibrate", "--drafter-dir", str(folder), "--rounds", str(folder / "calibration-rounds-greedy.npz")]) == 0
    assert json.loads((folder / "calibration.json").read_text())["greedy"]["temperatures"] == stored["temperatures"]


def test_lookup_first_runs_from_generate_and_from_bench_on_the_last_records(tmp_path, capsys):
    assert main(["generate", "--prompt", "Say 'one two three' three times.", "--drafter", "dspark+ngram", "--gamma", "7",
                 "--max-new-tokens", "16", "--dtype", "float32"]) == 0
    assert "tau" in capsys.readouterr().out
    assert main(["generate", "--prompt", "Hi.", "--drafter", "ngram+ngram"]) == 2
    assert "goes behind a drafter trained on the target's features" in capsys.readouterr().err
    out = tmp_path / "run"
    assert main(["bench", "--benchmarks", "smoke", "--n-prompts", "1", "--records", "last", "--methods",
                 "dspark-markov+ngram:3", "--temperatures", "0", "--max-new-tokens", "12", "--dtypes", "float32",
                 "--out", str(out)]) == 0
    rows = pd.read_csv(out / "rows.csv")
    assert set(rows["method"]) == {"plain", "dspark-markov+ngram@3"} and rows["same_as_plain"].all()
    assert set(rows["prompt_id"]) == {load_prompt_set(SMOKE_PROMPTS)[-1]["id"]}
    assert "dspark-markov+ngram@3" in round_split(rows).index.get_level_values("method")  # timed as ours
