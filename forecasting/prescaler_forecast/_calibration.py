"""Empirical interval calibration shared by the models (pure numpy, no model code).

Intervals are multiplicative: demand noise grows with the level (Poisson-like arrivals,
bursty clients), so a model's errors are measured as ``log(actual / predicted)`` and the
band at the requested quantile is ``mean * exp(quantile of those log-ratios)``.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pandas as pd

__all__ = ["DEFAULT_LOG_SPREAD", "log_ratio_band", "normal_quantile", "trailing_mean"]

FloatArray = np.ndarray

DEFAULT_LOG_SPREAD = 0.25
"""Standard deviation of log-ratios assumed when too few residuals exist to measure it."""

_MIN_RESIDUALS = 20


def normal_quantile(q: float) -> float:
    """The standard normal quantile (``z`` with ``P(Z <= z) = q``)."""
    return NormalDist().inv_cdf(q)


def trailing_mean(values: FloatArray, window: int) -> FloatArray:
    """Mean of the finite values among the last ``window`` entries up to each index (NaN
    when none is finite)."""
    series = pd.Series(np.asarray(values, dtype=float))
    return series.rolling(max(1, window), min_periods=1).mean().to_numpy()


def log_ratio_band(
    actual: FloatArray, predicted: FloatArray, quantile: float
) -> tuple[float, float]:
    """``(lower, upper)`` multipliers from the empirical log-ratios ``actual/predicted``.

    Pairs with a missing value are skipped. A small floor (1 % of the mean actual) keeps
    zero demand from producing infinite ratios. With fewer than 20 pairs the spread falls
    back to :data:`DEFAULT_LOG_SPREAD` as a normal standard deviation. The multipliers
    always bracket 1 (``lower <= 1 <= upper``).
    """
    a = np.asarray(actual, dtype=float)
    p = np.asarray(predicted, dtype=float)
    ok = np.isfinite(a) & np.isfinite(p) & (a >= 0) & (p >= 0)
    a, p = a[ok], p[ok]
    if len(a) < _MIN_RESIDUALS:
        z = normal_quantile(quantile)
        return math.exp(-z * DEFAULT_LOG_SPREAD), math.exp(z * DEFAULT_LOG_SPREAD)
    floor = max(0.01 * float(a.mean()), 1e-9)
    ratios = np.log((a + floor) / (p + floor))
    hi = float(np.quantile(ratios, quantile))
    lo = float(np.quantile(ratios, 1 - quantile))
    return min(1.0, math.exp(lo)), max(1.0, math.exp(hi))
