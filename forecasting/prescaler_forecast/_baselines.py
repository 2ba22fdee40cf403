"""Cheap models: persistence (last value, recent mean), seasonal-naive (same time one period
ago: yesterday and last week by default) and a robust recent trend."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from numpy.lib.stride_tricks import sliding_window_view

from prescaler_forecast._base import Band, Forecaster
from prescaler_forecast._calibration import (
    log_ratio_bands,
    normal_quantile,
    trailing_mean,
    trailing_median,
)

__all__ = ["Persistence", "RecentMean", "RecentTrend", "SeasonalNaive", "SeasonalNaiveWeekly"]

FloatArray = np.ndarray
IntArray = np.ndarray

DAY = 86_400.0
WEEK = 7 * DAY


def _bins(seconds: float, step: float, lo: int = 1, hi: int | None = None) -> int:
    n = max(lo, round(seconds / step))
    return n if hi is None else min(n, hi)


class Persistence(Forecaster):
    """The last observed value, flat: the forecast every other model must beat.

    On traffic whose next level is unpredictable (a random walk, a bursty service) nothing
    beats it, and auto-selection then falls back to it on its own. The interval is the
    empirical per-lead quantile of ``log(y[t + k] / level[t])`` over the last
    ``calibration_seconds``: exactly this rule's own errors, so its band widens with the
    lead as the data do.
    """

    name = "persistence"
    window_seconds: float = 0.0
    """Mean of the last ``window_seconds`` (0: the last value alone)."""

    def __init__(self, *, calibration_seconds: float = 2 * DAY) -> None:
        super().__init__()
        self.calibration_seconds = calibration_seconds
        self._levels: FloatArray = np.empty(0)

    def min_history_seconds(self, step_seconds: float) -> float:
        return 3 * step_seconds

    def _fit(self) -> None:
        calib = _bins(self.calibration_seconds, self._step)
        window = _bins(self.window_seconds, self._step)
        y = self._y[-(calib + window) :]
        level = trailing_mean(y, window)
        # A gap at the end: the last finite level stands.
        self._levels = pd.Series(level).ffill().to_numpy()
        last = self._levels[-1]
        self._level = float(last) if np.isfinite(last) else 0.0

    def _mean(self, leads: IntArray) -> FloatArray:
        return np.full(len(leads), self._level)

    def _band(self, n_leads: int, quantile: float) -> Band:
        y, level = self._y[-len(self._levels) :], self._levels
        # Row k-1: the value k bins after each level against that level (NaN past the
        # history's end, which leaves the pair out). Views of one padded copy, not a
        # gathered matrix.
        n = len(level)
        padded = np.concatenate([y[1:], np.full(n_leads, np.nan)])
        actual = sliding_window_view(padded, n)[:n_leads]
        lo, hi = log_ratio_bands(actual, np.broadcast_to(level, actual.shape), quantile)
        return Band.multiplicative(lo, hi)


class RecentMean(Persistence):
    """:class:`Persistence` on the mean of the last 10 minutes: steadier on noisy traffic."""

    name = "recent_mean"
    window_seconds = 600.0


class SeasonalNaive(Forecaster):
    """Same time one period ago, scaled by the recent level.

    The period is ``period_seconds`` (one day here, one week for
    :class:`SeasonalNaiveWeekly`), or any cycle given to the constructor: a shift or batch
    cycle, or a day played in compressed time.

    ``mean(t) = smooth(y)(t - P) * level_ratio`` where ``level_ratio`` is the median of the
    last ``level_seconds`` divided by the median of the same window one period earlier
    (clipped to [0.25, 4]); ``smooth`` is a centred moving median over ``smooth_seconds``.
    A median, not a mean: it drops a lone noisy step as well, but keeps a sharp edge where
    it was (a mean spreads yesterday's step over the steps around it, so the full level
    would be forecast one step late, and a fleet sized on it Ready one step late).
    The interval comes from the empirical log-ratio errors of exactly this rule over the
    last ``calibration_seconds`` of history, per lead.
    """

    name = "seasonal_naive"
    period_seconds: float = DAY
    """The cycle: the forecast for ``t`` starts from the value at ``t - period_seconds``."""

    def __init__(
        self,
        *,
        period_seconds: float | None = None,
        level_seconds: float = 1800.0,
        smooth_seconds: float = 180.0,
        calibration_seconds: float = 2 * DAY,
    ) -> None:
        super().__init__()
        if period_seconds is not None:
            if not (math.isfinite(period_seconds) and period_seconds > 0):
                raise ValueError(f"period_seconds must be > 0, got {period_seconds}")
            self.period_seconds = float(period_seconds)
        self.level_seconds = level_seconds
        self.smooth_seconds = smooth_seconds
        self.calibration_seconds = calibration_seconds
        self._smooth: FloatArray = np.empty(0)
        self._ratio_series: FloatArray = np.empty(0)

    def min_history_seconds(self, step_seconds: float) -> float:
        return self.period_seconds + _bins(self.level_seconds, step_seconds) * step_seconds

    def _fit(self) -> None:
        step = self._step
        self._period = _bins(self.period_seconds, step)
        self._level = _bins(self.level_seconds, step)
        width = _bins(self.smooth_seconds, step)
        self._smooth = (
            pd.Series(self._y).rolling(width, center=True, min_periods=1).median().to_numpy()
        )
        # ratio_series[i]: the level ratio an origin whose last observed bin is i would use.
        # Medians, so that a burst inside the level window does not scale the whole day.
        level = trailing_median(self._y, self._level)
        before = np.full(len(level), np.nan)
        before[self._period :] = level[: -self._period]
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = level / before
        self._ratio_series = np.clip(np.where(np.isfinite(ratio), ratio, 1.0), 0.25, 4.0)

    def _reference(self, targets: IntArray) -> FloatArray:
        """Smoothed value one period before each target bin (more periods if needed)."""
        n = len(self._y)
        ref_idx = np.asarray(targets, dtype=int) - self._period
        while (too_late := ref_idx >= n).any():
            ref_idx = np.where(too_late, ref_idx - self._period, ref_idx)
        ref = np.full(len(ref_idx), np.nan)
        ok = ref_idx >= 0
        ref[ok] = self._smooth[ref_idx[ok]]
        # A gap one period ago: fall back to two periods ago, then to the recent level.
        back = ref_idx - self._period
        use_back = ~np.isfinite(ref) & (back >= 0)
        ref[use_back] = self._smooth[back[use_back]]
        tail = self._y[-self._level :]
        recent = float(np.nanmean(tail)) if np.isfinite(tail).any() else 0.0
        fallback = recent / self._ratio_series[-1]
        return np.asarray(np.where(np.isfinite(ref), ref, fallback), dtype=float)

    def _mean(self, leads: IntArray) -> FloatArray:
        targets = len(self._y) - 1 + np.asarray(leads, dtype=int)
        return self._reference(targets) * float(self._ratio_series[-1])

    def _band(self, n_leads: int, quantile: float) -> Band:
        n = len(self._y)
        calib = _bins(self.calibration_seconds, self._step)
        targets = np.arange(max(self._period + 1, n - calib), n)
        # Row k-1: each target against the forecast made k bins before it.
        origins = targets[None, :] - np.arange(1, n_leads + 1)[:, None]
        keep = origins >= 0
        pred = (
            self._smooth[targets - self._period][None, :]
            * self._ratio_series[np.maximum(origins, 0)]
        )
        actual = np.broadcast_to(self._y[targets], origins.shape)
        # A pair without its forecast's origin is left out (its actual reads NaN).
        lo, hi = log_ratio_bands(np.where(keep, actual, np.nan), pred, quantile)
        return Band.multiplicative(lo, hi)


class SeasonalNaiveWeekly(SeasonalNaive):
    """:class:`SeasonalNaive` on the longer cycle: one week by default (same time last
    week)."""

    name = "seasonal_naive_weekly"
    period_seconds = WEEK


class RecentTrend(Forecaster):
    """A robust line through the recent window, for short histories.

    The slope is the Theil–Sen estimator (median of pairwise slopes) over the last
    ``window_seconds``, damped by ``slope_weight``; the level is the line's value at the last
    bin with the intercept fitted by the mean of the detrended values, outliers beyond five
    robust sigmas clipped (a median would sit below the mean of skewed, sparse counts).
    The interval is empirical: the quantiles of how far demand ``k`` steps ahead strayed
    from the trailing window mean over the last ``calibration_seconds`` (per lead,
    additive), so it widens with the lead as the data do.
    """

    name = "recent_trend"

    def __init__(
        self,
        *,
        window_seconds: float = 600.0,
        min_bins: int = 6,
        max_bins: int = 240,
        slope_weight: float = 0.5,
        calibration_seconds: float = DAY,
    ) -> None:
        super().__init__()
        self.window_seconds = window_seconds
        self.min_bins = min_bins
        self.max_bins = max_bins
        self.slope_weight = slope_weight
        self.calibration_seconds = calibration_seconds

    def min_history_seconds(self, step_seconds: float) -> float:
        return 3 * step_seconds

    def _fit(self) -> None:
        window = _bins(self.window_seconds, self._step, self.min_bins, self.max_bins)
        tail = self._y[-window:]
        x = np.flatnonzero(np.isfinite(tail)).astype(float) - (len(tail) - 1)
        y = tail[np.isfinite(tail)]
        if len(y) < 3:
            # The tail window is mostly a gap: use the last finite values we have.
            finite = np.flatnonzero(np.isfinite(self._y))[-window:]
            x = finite.astype(float) - (len(self._y) - 1)
            y = self._y[finite]
        i, j = np.triu_indices(len(x), k=1)
        slopes = (y[j] - y[i]) / (x[j] - x[i])
        slope = float(np.median(slopes)) if len(slopes) else 0.0
        # Mean of the detrended values, with wild outliers (beyond 5 robust sigmas) clipped.
        detrended = y - slope * x
        centre = float(np.median(detrended))
        spread = 1.4826 * float(np.median(np.abs(detrended - centre)))
        if spread > 0:
            detrended = np.clip(detrended, centre - 5 * spread, centre + 5 * spread)
        intercept = float(np.mean(detrended))
        resid = y - (intercept + slope * x)
        self._slope = slope * self.slope_weight
        self._level = intercept  # fitted value at the last bin (x = 0)
        self._sigma = 1.4826 * float(np.median(np.abs(resid - np.median(resid))))
        self._x_mean = float(x.mean())
        self._sxx = float(((x - x.mean()) ** 2).sum())
        self._n = len(x)
        self._window = window

    def _mean(self, leads: IntArray) -> FloatArray:
        return self._level + self._slope * np.asarray(leads, dtype=float)

    def _band(self, n_leads: int, quantile: float) -> Band:
        # Fallback with little history: the least-squares prediction interval, robust sigma.
        z = normal_quantile(quantile)
        lead = np.arange(1, n_leads + 1, dtype=float)
        sxx = self._sxx if self._sxx > 0 else math.inf
        width = z * self._sigma * np.sqrt(1 + 1 / self._n + (lead - self._x_mean) ** 2 / sxx)
        lo, hi = width.copy(), width.copy()
        calib = _bins(self.calibration_seconds, self._step)
        y = self._y[-(calib + n_leads) :]
        level = trailing_mean(y, self._window)
        for k in range(1, n_leads + 1):
            errors = y[k:] - level[:-k]
            errors = errors[np.isfinite(errors)]
            if len(errors) >= 20:
                hi[k - 1] = max(0.0, float(np.quantile(errors, quantile)))
                lo[k - 1] = max(0.0, -float(np.quantile(errors, 1 - quantile)))
        return Band.additive(lo, hi)
