"""Data hygiene: turn a raw demand series into a regular grid the models can trust.

Each problem is handled explicitly, in this order (:func:`clean_series`):

1. **Irregular timestamps and duplicates.** Samples are averaged into bins
   ``[k*step, (k+1)*step)`` anchored at the unix epoch, labelled by the bin start. A
   sample stands for the interval it starts (one sample spacing long), so a coarser
   series (10-minute windows on a 60 s grid) holds each value over its whole window.
2. **Impossible values.** Negative or infinite values become missing (NaN). A negative
   *rate* is what a naive diff over a counter reset gives; use :func:`counter_to_rate` on
   raw counters instead.
3. **Zeros that are really collection gaps.** With Poisson-like arrivals at a local level
   of ``λ`` per second, a bin of ``step`` seconds is empty with probability
   ``exp(-λ·step)``. A zero bin whose surrounding level expects at least
   ``gap_zero_min_count`` requests (default 10, so a true zero has probability < 5e-5) is a
   collection gap and becomes NaN (the ServeGen trace has such windows). Zeros in a
   genuinely quiet series (a few requests per bin) stay zeros. The argument holds only
   where the traffic is steady: a run of zeros is a gap only when the bins on either side
   of it are nearly all busy (:data:`STEADY_SHARE`). In bursty traffic (batch jobs, bulk
   orders: heavy bins between empty ones) the empty bins are the quiet between bursts,
   and masking them would teach the models the bursts without the quiet.
4. **Short gaps** (at most ``max_fill_seconds``) are filled by linear interpolation between
   their neighbours; longer gaps stay NaN and the models skip them.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

__all__ = [
    "clean_series",
    "counter_to_rate",
    "mask_collection_gaps",
    "series_to_grid",
    "unix_seconds",
]

FloatArray = np.ndarray

STEADY_SHARE = 0.8
"""A run of zero bins is a collection gap only where at least this share of the observed
bins around it (``window`` on either side) carried traffic."""


def _check_series(series: pd.Series, what: str = "series") -> pd.Series:
    if not isinstance(series, pd.Series):
        raise TypeError(f"{what} must be a pandas Series, got {type(series).__name__}")
    index = series.index
    if not isinstance(index, pd.DatetimeIndex):
        raise TypeError(f"{what} must have a DatetimeIndex, got {type(index).__name__}")
    if index.tz is None:
        raise ValueError(f"{what} must have a tz-aware (UTC) DatetimeIndex")
    if (
        series.dtype == np.float64
        and str(index.tz) == "UTC"
        and not index.hasnans
        and index.is_monotonic_increasing
    ):
        return series  # already clean: the common case, called once per forecast
    numbers = pd.to_numeric(series, errors="coerce").astype(float)
    values = pd.Series(numbers.to_numpy(dtype=float), index=index.tz_convert("UTC"))
    values = values[values.index.notna()]
    if not values.index.is_monotonic_increasing:
        values = values.sort_index(kind="stable")
    return values


def unix_seconds(index: pd.DatetimeIndex) -> FloatArray:
    """Unix seconds (float) of a tz-aware index, whatever its resolution."""
    per_second = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}.get(str(index.unit))
    if per_second is None or index.hasnans:
        return np.asarray(
            (index - pd.Timestamp(0, tz="UTC")) / pd.Timedelta(seconds=1), dtype=float
        )
    return np.asarray(index.asi8, dtype=float) / per_second


def counter_to_rate(counter: pd.Series) -> pd.Series:
    """Per-second rate from a cumulative counter (e.g. ``vllm:request_success_total``).

    A decrease is a counter reset (a restarted pod): like Prometheus' ``rate()``, the
    increase over that interval is taken to be the post-reset value itself. The result is
    indexed by the *start* of each interval and has one sample fewer than the input.
    """
    values = _check_series(counter, "counter")
    values = values[np.isfinite(values.to_numpy())]
    values = values[~values.index.duplicated(keep="last")]
    if len(values) < 2:
        return pd.Series([], index=pd.DatetimeIndex([], tz="UTC"), dtype=float)
    y = values.to_numpy()
    seconds = unix_seconds(pd.DatetimeIndex(values.index))
    increase = np.diff(y)
    reset = increase < 0
    increase[reset] = y[1:][reset]
    rate = increase / np.diff(seconds)
    return pd.Series(rate, index=values.index[:-1], name=counter.name)


def mask_collection_gaps(
    values: FloatArray, step_seconds: float, *, min_count: float = 10.0, window: int = 12
) -> FloatArray:
    """Turn zeros that are implausible as real traffic into NaN (see module docstring).

    ``values`` is a regular rate grid; the local level of a zero bin is the median of the
    non-zero values within ``window`` bins on either side (or the nearest such level for
    long zero runs). A run of zeros is masked only where the ``window`` bins before it and
    after it were busy (at least :data:`STEADY_SHARE` of those observed non-zero).
    """
    y = np.asarray(values, dtype=float).copy()
    zero = y == 0
    if not zero.any() or min_count <= 0:
        return y
    nonzero = pd.Series(np.where(y > 0, y, np.nan))
    rolling = nonzero.rolling(2 * window + 1, center=True, min_periods=1).median()
    level = rolling.ffill().bfill().to_numpy()
    gap = zero & np.isfinite(level) & (level * step_seconds >= min_count)
    y[gap & _steady_around(y, zero, window)] = np.nan
    return y


def _steady_around(y: FloatArray, zero: np.ndarray, window: int) -> np.ndarray:
    """For each zero bin, whether its run of zeros has busy bins around it: of the observed
    bins within ``window`` before the run and after it, at least :data:`STEADY_SHARE`
    non-zero."""
    n = len(y)
    busy = np.concatenate(([0], np.cumsum(y > 0)))
    seen = np.concatenate(([0], np.cumsum(np.isfinite(y))))
    edges = np.diff(np.concatenate(([0], zero.astype(np.int8), [0])))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    lo, hi = np.maximum(starts - window, 0), np.minimum(ends + window, n)
    around_busy = (busy[starts] - busy[lo]) + (busy[hi] - busy[ends])
    around_seen = (seen[starts] - seen[lo]) + (seen[hi] - seen[ends])
    steady = (around_seen > 0) & (around_busy >= STEADY_SHARE * around_seen)
    out = np.zeros(n, dtype=bool)
    out[zero] = np.repeat(steady, ends - starts)  # the zero bins, run by run
    return out


def series_to_grid(
    series: pd.Series,
    step_seconds: float,
    *,
    before: float | None = None,
    gap_zero_min_count: float = 10.0,
    max_fill_seconds: float | None = None,
) -> tuple[float, FloatArray]:
    """Like :func:`clean_series` but returns ``(first bin start, values)`` as unix seconds.

    Each sample stands for the interval that *starts* at its timestamp and lasts one
    sample spacing (as in ``Trace.rate_series()`` and pandas ``resample``). With
    ``before``, only samples whose interval has ended by then are used, and only bins that
    have ended by then are kept: nothing observed at or after ``before`` leaks in.
    """
    if not (isinstance(step_seconds, (int, float)) and math.isfinite(step_seconds)):
        raise ValueError(f"step_seconds must be a finite number, got {step_seconds!r}")
    if step_seconds <= 0:
        raise ValueError(f"step_seconds must be > 0, got {step_seconds}")
    values = _check_series(series)
    seconds = unix_seconds(pd.DatetimeIndex(values.index))
    y = values.to_numpy(dtype=float, copy=True)
    spacing = float(np.median(np.diff(seconds))) if len(seconds) > 1 else step_seconds
    if before is not None:
        # A sample stands for the interval it starts; keep only intervals over by `before`.
        keep = seconds + spacing <= before + 1e-9 * abs(before)
        seconds, y = seconds[keep], y[keep]
    y[~np.isfinite(y) | (y < 0)] = np.nan
    if len(y) == 0:
        return (0.0 if before is None else _floor(before, step_seconds)), np.empty(0)
    bins = np.floor(seconds / step_seconds).astype(np.int64)
    coarse = spacing > 1.5 * step_seconds  # each sample covers several bins
    first = int(bins[0])
    last = math.floor((seconds[-1] + max(spacing, step_seconds)) / step_seconds - 1e-9) - 1
    last = max(last, int(bins[-1]))
    if before is not None:
        last = min(last, math.floor(before / step_seconds) - 1)
    n = last - first + 1
    if n <= 0:
        return first * step_seconds, np.empty(0)
    rel = bins - first
    inside = rel < n
    rel, y = rel[inside], y[inside]
    finite = np.isfinite(y)
    sums = np.bincount(rel[finite], weights=y[finite], minlength=n)
    counts = np.bincount(rel[finite], minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        grid = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    if coarse:  # a coarse sample's value holds over its whole interval
        grid = pd.Series(grid).ffill(limit=round(spacing / step_seconds) - 1).to_numpy()
    grid = mask_collection_gaps(grid, step_seconds, min_count=gap_zero_min_count)
    if max_fill_seconds is None:
        # Fill what an upsampled coarse series leaves between its samples, and short blips.
        max_fill_seconds = max(5 * step_seconds, 2 * spacing)
    grid = _fill_short_gaps(grid, int(max_fill_seconds // step_seconds))
    return first * step_seconds, grid


def clean_series(
    series: pd.Series,
    step_seconds: float,
    *,
    before: float | None = None,
    gap_zero_min_count: float = 10.0,
    max_fill_seconds: float | None = None,
) -> pd.Series:
    """Regularize a raw demand series (see the module docstring for each rule).

    Args:
        series: demand (requests/s) indexed by a tz-aware ``DatetimeIndex``; irregular,
            unsorted, duplicated and NaN samples are all fine.
        step_seconds: the grid step; bins are ``[k*step, (k+1)*step)`` in unix seconds.
        before: if given, use only samples before this unix time and drop the partly
            observed last bin.
        gap_zero_min_count: a zero bin is a collection gap when the local level expects at
            least this many requests in the bin; ``0`` keeps every zero.
        max_fill_seconds: the longest gap filled by interpolation (default: 5 steps, or two
            sample spacings of a coarser input).

    Returns:
        A float series on the regular grid, indexed by bin start (UTC), NaN where a gap
        remains.
    """
    start, grid = series_to_grid(
        series,
        step_seconds,
        before=before,
        gap_zero_min_count=gap_zero_min_count,
        max_fill_seconds=max_fill_seconds,
    )
    index = pd.to_datetime(start + np.arange(len(grid)) * step_seconds, unit="s", utc=True)
    return pd.Series(grid, index=index, name=series.name)


def _floor(t: float, step: float) -> float:
    return math.floor(t / step) * step


def _fill_short_gaps(values: FloatArray, max_steps: int) -> FloatArray:
    """Linearly interpolate interior NaN runs of at most ``max_steps`` bins."""
    y = np.asarray(values, dtype=float)
    missing = ~np.isfinite(y)
    if max_steps <= 0 or not missing.any() or missing.all():
        return y
    idx = np.arange(len(y))
    known = idx[~missing]
    filled = np.interp(idx, known, y[~missing])
    # Length of the NaN run each missing bin belongs to; edges (no neighbour) stay NaN.
    run_id = np.cumsum(~missing)
    run_len = np.bincount(run_id, weights=missing.astype(float))[run_id]
    interior = (idx > known[0]) & (idx < known[-1])
    fill = missing & interior & (run_len <= max_steps)
    out = y.copy()
    out[fill] = filled[fill]
    return out
