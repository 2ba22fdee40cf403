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

__all__ = [
    "DEFAULT_LOG_SPREAD",
    "NOWCAST_DECAY_SECONDS",
    "decay_ratio",
    "log_ratio_band",
    "log_ratio_bands",
    "normal_quantile",
    "off_curve_level",
    "robust_ratio",
    "rolling_ratio",
    "row_quantile",
    "row_quantiles",
    "trailing_mean",
    "trailing_median",
]

NOWCAST_DECAY_SECONDS = 3600.0
"""How fast a nowcast correction fades over the horizon (e-folding time): a level that
differs from the model's curve now mostly still differs in ten minutes, much less so in
three hours."""

RATIO_CLIP = (1 / 3, 3.0)

FloatArray = np.ndarray
IntArray = np.ndarray

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


def trailing_median(values: FloatArray, window: int) -> FloatArray:
    """Median of the finite values among the last ``window`` entries up to each index: a
    level that a short burst inside the window does not move."""
    series = pd.Series(np.asarray(values, dtype=float))
    return series.rolling(max(1, window), min_periods=1).median().to_numpy()


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


def log_ratio_bands(
    actual: FloatArray, predicted: FloatArray, quantile: float
) -> tuple[FloatArray, FloatArray]:
    """:func:`log_ratio_band` of every row of two equally shaped 2-D arrays (NaN pads a
    short row), as arrays of ``lower`` and ``upper`` multipliers: one sort for all the
    leads of a band, not a quantile per lead."""
    # In place where it can be: at every lead of a two-hour band over two days of origins
    # the arrays are megabytes, and each fresh temporary costs more (its pages) than the
    # arithmetic on it.
    a = np.asarray(actual, dtype=float)
    p = np.asarray(predicted, dtype=float)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(a)
        ok &= np.isfinite(p)
        ok &= a >= 0
        ok &= p >= 0
    count = ok.sum(axis=1)
    ratios = np.where(ok, a, 0.0)
    mean = ratios.sum(axis=1) / np.maximum(count, 1)
    floor = np.maximum(0.01 * mean, 1e-9)[:, None]
    ratios += floor
    below = np.where(ok, p, 0.0)
    below += floor
    with np.errstate(invalid="ignore", divide="ignore"):
        np.divide(ratios, below, out=ratios)
        np.log(ratios, out=ratios)
    np.copyto(ratios, np.nan, where=~ok)
    finite = np.isfinite(ratios).sum(axis=1)
    ratios.sort(axis=1)  # ours: sorted in place, NaN last
    hi, lo = np.exp(_sorted_row_quantiles(ratios, finite, (quantile, 1 - quantile)))
    z = normal_quantile(quantile)
    few = count < _MIN_RESIDUALS
    lo = np.where(few, math.exp(-z * DEFAULT_LOG_SPREAD), np.minimum(1.0, lo))
    hi = np.where(few, math.exp(z * DEFAULT_LOG_SPREAD), np.maximum(1.0, hi))
    return lo, hi


def row_quantile(values: FloatArray, q: float) -> FloatArray:
    """The ``q`` quantile (linear, as :func:`numpy.quantile`) of each row's finite values;
    NaN for a row without any. Vectorised: ``nanquantile`` loops over rows in Python."""
    return np.asarray(row_quantiles(values, (q,))[0], dtype=float)


def row_quantiles(values: FloatArray, qs: tuple[float, ...]) -> FloatArray:
    """:func:`row_quantile` at each of ``qs`` (one row of the result per ``q``), the rows
    sorted once."""
    return _sorted_row_quantiles(
        np.sort(values, axis=1), np.isfinite(values).sum(axis=1), qs
    )  # NaN sorts last


def _sorted_row_quantiles(a: FloatArray, count: IntArray, qs: tuple[float, ...]) -> FloatArray:
    """:func:`row_quantiles` of rows already sorted (NaN last), ``count`` finite values
    in each."""
    last = np.maximum(count - 1, 0)
    rows = np.arange(len(a))
    out = np.empty((len(qs), len(a)))
    for i, q in enumerate(qs):
        position = q * last
        below = np.floor(position).astype(np.int64)
        above = np.minimum(below + 1, last)
        weight = position - below
        out[i] = a[rows, below] * (1 - weight) + a[rows, above] * weight
    out[:, count == 0] = np.nan
    return out


def robust_ratio(observed: FloatArray, expected: FloatArray) -> float:
    """The burst-proof nowcast: the median of the per-bin ratios ``observed / expected``.

    A mean ratio lets one burst that ended minutes ago hold the whole forecast at the
    burst's level (a 10-minute 4x burst that ended 3 minutes before the origin read x2.0
    through a 5-minute mean); the median of the window's bins follows the majority of
    them, so the level returns with the traffic. Bins with a missing value or a
    non-positive expectation are skipped; ``1.0`` when none is left. Clipped to [1/3, 3].
    """
    o = np.asarray(observed, dtype=float)
    e = np.asarray(expected, dtype=float)
    n = min(len(o), len(e))
    o, e = o[:n], e[:n]
    ok = np.isfinite(o) & np.isfinite(e) & (e > 0) & (o >= 0)
    if not ok.any():
        return 1.0
    return float(np.clip(np.median(o[ok] / e[ok]), *RATIO_CLIP))


def off_curve_level(observed: FloatArray, expected: FloatArray) -> float | None:
    """The observed level when a curve cannot explain it, else ``None``.

    The nowcast scales a curve by at most the clip of :func:`robust_ratio` (3x either
    way). When the median ratio observed / expected over the window lies beyond it, or
    demand is observed while the curve is at zero, the scaled curve still misses the level
    it starts from (a trend extrapolated below zero serves zeros to a busy pool): the
    forecast then holds the observed level (the median of the window's bins). ``None``
    also when no positive demand is observed (an idle pool keeps the curve's ramp).
    """
    o = np.asarray(observed, dtype=float)
    e = np.asarray(expected, dtype=float)
    n = min(len(o), len(e))
    o, e = o[:n], e[:n]
    seen = np.isfinite(o) & (o >= 0)
    if not seen.any():
        return None
    level = float(np.median(o[seen]))
    if not level > 0:
        return None
    ok = seen & np.isfinite(e) & (e > 0)
    if not ok.any():
        return level
    ratio = float(np.median(o[ok] / e[ok]))
    lo, hi = RATIO_CLIP
    return level if not (lo <= ratio <= hi) else None


def rolling_ratio(observed: FloatArray, expected: FloatArray, window: int) -> FloatArray:
    """:func:`robust_ratio` at every index over the trailing ``window`` bins (1.0 where
    nothing is known), for calibrating a band on exactly the nowcast the forecasts use."""
    o = np.asarray(observed, dtype=float)
    e = np.asarray(expected, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_bin = np.where((e > 0) & np.isfinite(o) & (o >= 0), o / e, np.nan)
    rolled = pd.Series(per_bin).rolling(max(1, window), min_periods=1).median().to_numpy()
    return np.clip(np.where(np.isfinite(rolled), rolled, 1.0), *RATIO_CLIP)


def decay_ratio(
    ratio: float | FloatArray, lead_seconds: FloatArray, decay_seconds: float
) -> FloatArray:
    """The nowcast correction at each lead: ``ratio ** exp(-lead / decay)`` (in log space
    it fades exponentially; ``decay_seconds <= 0`` keeps it whole)."""
    lead = np.asarray(lead_seconds, dtype=float)
    if not decay_seconds > 0:
        return np.asarray(np.broadcast_to(np.asarray(ratio, dtype=float), lead.shape), float)
    weight = np.exp(-np.maximum(lead, 0.0) / decay_seconds)
    return np.asarray(np.exp(np.log(ratio) * weight), dtype=float)
