"""Rolling-origin evaluation and error metrics, apart from the models (like Prophet's
``diagnostics``).

At each origin ``o`` a forecaster sees only the grid bins that ended by ``o`` and
forecasts ``(o, o + horizon]``; its points are compared with the bins actually observed
there. Bins that are missing (NaN) in the truth are skipped.

Metrics (all over every (origin, step) pair):

* ``smape``: symmetric MAPE in percent, ``200/n * Σ |f - y| / (|f| + |y|)`` (a pair with
  ``f = y = 0`` counts 0). **This is the selection metric.** It is bounded, treats over- and
  under-forecasts alike and, unlike MAPE, does not explode on quiet periods.
* ``mape``: MAPE in percent, over pairs with ``y > 0``.
* ``wape``: ``Σ|f - y| / Σ|y|`` in percent (error weighted by demand).
* ``coverage``: the share of pairs with ``y <= upper`` (compare with the stated quantile).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from prescaler_forecast._types import Forecast

__all__ = ["EvaluationResult", "accuracy", "origins_between", "rolling_origin"]

FloatArray = np.ndarray

ForecastFn = Callable[[float, FloatArray, float], Forecast]
"""``(grid start, grid values observed before now, now) -> Forecast``."""


@dataclass(frozen=True)
class EvaluationResult:
    """Accuracy of one forecaster over a set of origins."""

    smape: float
    """Symmetric MAPE, percent (the selection metric)."""
    mape: float
    """MAPE over non-zero truths, percent."""
    wape: float
    """Weighted absolute percentage error, percent."""
    coverage: float
    """Share of truths at or below the upper bound."""
    pairs: int
    """How many (origin, step) pairs were scored."""
    origins: int
    """How many origins produced a forecast."""
    seconds: float
    """Wall time spent forecasting (fits included)."""
    statuses: tuple[str, ...] = ()
    """Distinct forecast statuses seen (e.g. ``insufficient_history``)."""


def accuracy(
    mean: FloatArray, upper: FloatArray, truth: FloatArray
) -> tuple[float, float, float, float]:
    """``(smape, mape, wape, coverage)`` of forecasts against truth; NaN truths skipped."""
    f = np.asarray(mean, dtype=float)
    u = np.asarray(upper, dtype=float)
    y = np.asarray(truth, dtype=float)
    ok = np.isfinite(y) & np.isfinite(f)
    f, u, y = f[ok], u[ok], y[ok]
    if len(y) == 0:
        return math.nan, math.nan, math.nan, math.nan
    denominator = np.abs(f) + np.abs(y)
    with np.errstate(invalid="ignore", divide="ignore"):
        sym = np.where(denominator > 0, np.abs(f - y) / denominator, 0.0)
    smape = 200.0 * float(sym.mean())
    positive = y > 0
    mape = math.nan
    if positive.any():
        mape = 100.0 * float(np.mean(np.abs(f - y)[positive] / y[positive]))
    total = float(np.abs(y).sum())
    wape = 100.0 * float(np.abs(f - y).sum()) / total if total > 0 else math.nan
    coverage = float(np.mean(y <= u))
    return smape, mape, wape, coverage


def origins_between(
    first: float, last: float, step_seconds: float, count: int
) -> tuple[float, ...]:
    """Up to ``count`` grid-aligned origins evenly spread over ``[first, last]``."""
    if count <= 0 or last < first:
        return ()
    lo = math.ceil(first / step_seconds - 1e-9)
    hi = math.floor(last / step_seconds + 1e-9)
    if hi < lo:
        return ()
    picks = np.unique(np.round(np.linspace(lo, hi, min(count, hi - lo + 1))).astype(np.int64))
    return tuple(float(k) * step_seconds for k in picks)


def rolling_origin(
    forecast_fn: ForecastFn,
    start: float,
    values: FloatArray,
    step_seconds: float,
    origins: Sequence[float],
) -> EvaluationResult:
    """Score ``forecast_fn`` at each origin (in time order) on a regular grid.

    ``forecast_fn`` receives only the bins that ended by the origin. Truth is the grid
    itself after the origin.
    """
    y = np.asarray(values, dtype=float)
    means: list[float] = []
    uppers: list[float] = []
    truths: list[float] = []
    statuses: set[str] = set()
    produced = 0
    began = time.perf_counter()
    for origin in sorted(origins):
        cut = max(0, min(len(y), math.floor((origin - start) / step_seconds + 1e-9)))
        forecast = forecast_fn(start, y[:cut], origin)
        produced += 1
        statuses.add(forecast.status)
        for point in forecast.points:
            index = round((point.t - step_seconds - start) / step_seconds)
            if 0 <= index < len(y) and point.t - step_seconds >= origin - 1e-6:
                means.append(point.mean)
                uppers.append(point.upper)
                truths.append(float(y[index]))
    seconds = time.perf_counter() - began
    smape, mape, wape, coverage = accuracy(np.array(means), np.array(uppers), np.array(truths))
    pairs = int(np.isfinite(np.array(truths)).sum()) if truths else 0
    return EvaluationResult(
        smape=smape,
        mape=mape,
        wape=wape,
        coverage=coverage,
        pairs=pairs,
        origins=produced,
        seconds=seconds,
        statuses=tuple(sorted(statuses)),
    )
