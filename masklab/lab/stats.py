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


def bootstrap_ratio(
    a: Sequence[float], b: Sequence[float], confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
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


def reliability(probs: Sequence[float], labels: Sequence[bool], bins: int = 10) -> tuple[float, list[dict]]:
    """Expected calibration error of keep probabilities against what happened (each unit: its
    probability, whether it is evidence) over ``bins`` equal-width bins, and each bin's count,
    mean probability and share of evidence (the reliability plot's points)."""
    import numpy as np

    p, y = np.asarray(probs, dtype=float), np.asarray(labels, dtype=float)
    which = np.minimum((p * bins).astype(int), bins - 1)
    rows, ece = [], 0.0
    for b in range(bins):
        m = which == b
        if not m.any():
            continue
        conf, acc = float(p[m].mean()), float(y[m].mean())
        ece += m.sum() / len(p) * abs(conf - acc)
        rows.append({"bin": b, "n": int(m.sum()), "probability": conf, "evidence": acc})
    return float(ece), rows


def platt(probs: Sequence[float], labels: Sequence[bool]) -> tuple[float, float]:
    """``(a, b)`` of Platt scaling fitted on ``probs`` and ``labels``: the calibrated probability is
    ``sigmoid(a * logit(p) + b)`` (a logistic regression on the logit, by maximum likelihood)."""
    import numpy as np
    from scipy.optimize import minimize

    p = np.clip(np.asarray(probs, dtype=float), 1e-6, 1 - 1e-6)
    x, y = np.log(p / (1 - p)), np.asarray(labels, dtype=float)

    def nll(w):
        z = w[0] * x + w[1]
        return float(np.sum(np.logaddexp(0, z) - y * z))

    w = minimize(nll, np.array([1.0, 0.0]), method="L-BFGS-B").x
    return float(w[0]), float(w[1])
