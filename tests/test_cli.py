"""The command line end to end on the default target, with tiny settings."""

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


def test_compare_writes_rows_and_summary(tmp_path, capsys):
    assert main(["compare", "--n-prompts", "2", "--methods", "ngram:3;oracle:3", "--max-new-tokens", "16",
                 "--out-dir", str(tmp_path)]) == 0
    rows = pd.read_csv(next(tmp_path.glob("compare-*.csv")))
    assert set(rows["method"]) == {"plain", "ngram@3", "oracle@3"} and len(rows) == 6
    assert rows["same_as_plain"].all()
    assert (rows.loc[rows["method"] == "oracle@3", "acceptance_rate"] == 1.0).all()
    assert next(tmp_path.glob("compare-*.json")).is_file()
    assert "speedup" in capsys.readouterr().out
