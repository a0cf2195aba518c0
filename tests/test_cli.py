"""The command line end to end on the default target, with tiny settings."""

import json

import pandas as pd

from dspark_core.cli import main


def test_generate_prints_text_and_round_stats(capsys):
    assert main(["generate", "--prompt", "Name two colours.", "--drafter", "ngram", "--gamma", "3",
                 "--max-new-tokens", "12"]) == 0
    out = capsys.readouterr().out
    assert "tau" in out and "acceptance" in out and "conditional acceptance per position" in out


def test_generate_oracle(capsys):
    assert main(["generate", "--prompt", "Count from one to five.", "--drafter", "oracle", "--gamma", "4",
                 "--max-new-tokens", "16"]) == 0
    assert "acceptance 1.000" in capsys.readouterr().out


BENCH = ["bench", "--benchmarks", "smoke", "--n-prompts", "2", "--methods",
         "ngram:3;oracle:3;hf-prompt-lookup:3;dspark-markov:hw3",
         "--temperatures", "0", "--max-new-tokens", "12"]


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
    assert "speedup per domain" in capsys.readouterr().out

    # An interrupted run: drop the second prompt's rows; re-running measures only what is missing.
    first = rows[rows["prompt_id"] == rows["prompt_id"].iloc[0]]
    first.to_csv(out / "rows.csv", index=False)
    assert main(BENCH + ["--out", str(out)]) == 0
    resumed = pd.read_csv(out / "rows.csv")
    assert len(resumed) == 10 and resumed.iloc[:5].equals(first.reset_index(drop=True))
    assert json.loads((out / "cost-profile.json").read_text()) == profile  # reused, not re-measured
    assert (resumed.groupby("method")["prompt_id"].nunique() == 2).all()

    assert main(BENCH[:-1] + ["16", "--out", str(out)]) == 2
    assert "holds a run with other settings" in capsys.readouterr().err


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
    assert set(load_calibration(folder)) == {"greedy"}
    # refitting on the saved rounds reproduces the fit without decoding
    (folder / "calibration.json").unlink()
    assert main(["calibrate", "--drafter-dir", str(folder), "--rounds", str(folder / "calibration-rounds-greedy.npz")]) == 0
    assert json.loads((folder / "calibration.json").read_text())["greedy"]["temperatures"] == stored["temperatures"]
