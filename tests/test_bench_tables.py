"""The harness's tables from its rows (no model): conditional acceptance per position."""

import json
import warnings

import numpy as np
import pandas as pd

from dspark_core.eval.bench import conditional_acceptance


def test_conditional_acceptance_sums_counts_and_pads_groups_that_reached_fewer_positions():
    rows = pd.DataFrame({
        "temperature": [0.0, 0.0, 0.0],
        "method": ["a@3", "a@3", "b@1"],
        "reached_per_position": [json.dumps([4, 2, 1]), json.dumps([2]), json.dumps([5])],
        "accepted_per_position": [json.dumps([2, 1, 0]), json.dumps([1]), json.dumps([5])],
    })
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # pandas deprecates frames built from rows of unequal length
        table = conditional_acceptance(rows)
    assert list(table.columns) == ["k=1", "k=2", "k=3"]
    np.testing.assert_allclose(table.loc[(0.0, "a@3")].to_numpy(), [3 / 6, 1 / 2, 0.0], atol=1e-3)
    assert table.loc[(0.0, "b@1"), "k=1"] == 1.0 and table.loc[(0.0, "b@1")].iloc[1:].isna().all()
