"""The one goodness-of-fit test the statistical tests share: Pearson's chi-square of observed counts against a law."""

from __future__ import annotations

import numpy as np
from scipy.stats import chisquare


def chi_square_p(counts: np.ndarray, probs: np.ndarray) -> float:
    """p-value of ``counts`` (draws per cell, shape [cells]) against ``probs`` (the law over the same cells).

    A draw in a zero-probability cell fails at once (no p-value can excuse it). Cells expected to hold fewer than 5
    draws are pooled into one, as the test requires.
    """
    counts, probs = np.asarray(counts, dtype=float), np.asarray(probs, dtype=float)
    assert counts.shape == probs.shape, f"{counts.shape} counts vs {probs.shape} probabilities"
    impossible = np.flatnonzero((probs == 0) & (counts > 0))
    assert not len(impossible), f"draws in zero-probability cells: {impossible.tolist()}"
    support = probs > 0
    observed, expected = counts[support], probs[support] / probs[support].sum() * counts.sum()
    small = expected < 5
    if small.any():
        observed = np.append(observed[~small], observed[small].sum())
        expected = np.append(expected[~small], expected[small].sum())
    return float(chisquare(observed, expected).pvalue)  # both sum to the draws: pooling keeps the totals
