"""Intervals and paired tests for comparisons (scipy's implementations).

* :func:`wilson`: the Wilson 95% interval of an accuracy ``k / n``;
* :func:`mcnemar`: the exact (binomial) McNemar p-value of two methods scored on the same
  examples;
* :func:`bootstrap_ratio`: a percentile bootstrap interval of ``mean(a) / mean(b)`` over
  paired examples (e.g. a speed-up).
"""

from __future__ import annotations

from collections.abc import Sequence


def wilson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """``(low, high)`` Wilson interval of ``k`` successes in ``n`` trials (``(0, 1)`` for n = 0)."""
    if n == 0:
        return 0.0, 1.0
    from scipy.stats import binomtest

    ci = binomtest(int(k), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def mcnemar(a: Sequence[bool], b: Sequence[bool]) -> float:
    """Exact two-sided McNemar p-value of paired outcomes ``a`` and ``b`` (1.0 without
    discordant pairs)."""
    if len(a) != len(b):
        raise ValueError(f"paired outcomes of different lengths: {len(a)} and {len(b)}")
    only_a = sum(1 for x, y in zip(a, b) if x and not y)
    only_b = sum(1 for x, y in zip(a, b) if y and not x)
    if only_a + only_b == 0:
        return 1.0
    from scipy.stats import binomtest

    return float(binomtest(only_a, only_a + only_b, 0.5).pvalue)


def bootstrap_ratio(a: Sequence[float], b: Sequence[float], confidence: float = 0.95, resamples: int = 2000,
                    seed: int = 0) -> tuple[float, float]:
    """``(low, high)`` percentile bootstrap interval of ``mean(a) / mean(b)``, resampling
    the paired examples."""
    import numpy as np

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) != len(b) or len(a) == 0:
        raise ValueError("bootstrap_ratio needs paired, non-empty samples")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(a), size=(resamples, len(a)))
    ratios = a[idx].mean(1) / np.maximum(b[idx].mean(1), 1e-12)
    lo, hi = np.quantile(ratios, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(lo), float(hi)
