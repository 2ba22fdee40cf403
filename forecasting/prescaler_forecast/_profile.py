"""The seasonal profile: the median of the same time of day over the last days (or of the
same time of week over the last weeks), scaled by the current level."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from prescaler_forecast._base import Band, Forecaster
from prescaler_forecast._baselines import DAY, WEEK, _bins
from prescaler_forecast._calibration import DEFAULT_LOG_SPREAD, normal_quantile, row_quantile

__all__ = ["SeasonalProfile"]

FloatArray = np.ndarray
IntArray = np.ndarray

LEVEL_CLIP = (0.25, 4.0)
"""Bounds of the level ratio: a recent hour far off the profile is more likely a burst
or a gap than a new level."""


class SeasonalProfile(Forecaster):
    """The median of the same time of day over the last days, scaled by the current level.

    :class:`SeasonalNaive` repeats one day: when yesterday was unusual (an incident, a
    launch, a holiday) so is its forecast for today. Here each future bin starts from the
    **median** of the demand at the same phase of the cycle over the last ``N`` cycles,
    so one odd day in seven moves nothing.

    * **Which cycle.** ``period_seconds`` is the "day" (the shortest configured period).
      When ``long_period_seconds`` (the "week", the longest) is given and the history
      covers at least ``min_long_periods`` of it, the profile is the same time of the week
      (the same weekday) over at most ``max_long_periods`` weeks; otherwise every day, over
      at most ``max_periods`` days. ``N`` is as many whole cycles as the history covers, up
      to that cap. Missing bins are skipped.
    * **Smoothing.** Each cycle contributes the bins within ``smooth_seconds`` (centred) of
      the phase, so the median runs over cycles × neighbouring bins: a lone noisy bin is
      dropped, and an edge that recurs every day stays where it is.
    * **Level.** The profile is scaled by the median of the last ``level_seconds`` of
      demand over the profile's median on the same bins (the ratio of their means when
      either median is zero, as with sparse counts; 1 when nothing is known), clipped to
      [0.25, 4]: a day that runs 20 % above the usual runs 20 % above it all day.
    * **Band.** From the spread across the cycles: per bin, the empirical quantile of
      ``log(value / profile)`` over the values its median was taken of, averaged over the
      bins within ``spread_seconds`` (centred). Wide where the days disagree (a peak whose
      height varies), narrow where they agree; multiplicative, so it scales with the mean.

    Needs two cycles of the short period: with one, there is nothing to take a median of.
    Its cost does not grow with the history: a fit and a forecast read ``N`` cycles ×
    the smoothing window for each bin of the level window and of the horizon.
    """

    name = "seasonal_profile"

    def __init__(
        self,
        *,
        period_seconds: float = DAY,
        long_period_seconds: float | None = WEEK,
        max_periods: int = 7,
        max_long_periods: int = 4,
        min_long_periods: int = 3,
        level_seconds: float = 3600.0,
        smooth_seconds: float = 180.0,
        spread_seconds: float = 1800.0,
    ) -> None:
        super().__init__()
        for label, value in (
            ("period_seconds", period_seconds),
            ("long_period_seconds", long_period_seconds),
        ):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{label} must be > 0, got {value}")
        if min(max_periods, max_long_periods, min_long_periods) < 1:
            raise ValueError("the period counts must be >= 1")
        self.period_seconds = float(period_seconds)
        self.long_period_seconds = (
            None if long_period_seconds is None else float(long_period_seconds)
        )
        self.max_periods = max_periods
        self.max_long_periods = max_long_periods
        self.min_long_periods = min_long_periods
        self.level_seconds = level_seconds
        self.smooth_seconds = smooth_seconds
        self.spread_seconds = spread_seconds
        self._cycle = 1
        self._cycles = 1
        self._offsets: IntArray = np.zeros(1, dtype=np.int64)
        self._ratio = 1.0
        self._fallback = 0.0

    # ---------------------------------------------------------------- what the fit chose
    @property
    def profile_period_seconds(self) -> float:
        """The cycle the profile repeats: the short period, or the long one."""
        self._require_fitted()
        return self._cycle * self._step

    @property
    def profile_periods(self) -> int:
        """How many cycles the median is taken over (``N``)."""
        self._require_fitted()
        return self._cycles

    @property
    def level_ratio(self) -> float:
        """The recent level over the profile's, as applied to the forecast."""
        self._require_fitted()
        return self._ratio

    # ---------------------------------------------------------------- the model
    def min_history_seconds(self, step_seconds: float) -> float:
        return 2 * _bins(self.period_seconds, step_seconds) * step_seconds

    def _fit(self) -> None:
        step, y = self._step, self._y
        n = len(y)
        finite = np.flatnonzero(np.isfinite(y))
        span = n - int(finite[0])
        day = _bins(self.period_seconds, step)
        week = None if self.long_period_seconds is None else _bins(self.long_period_seconds, step)
        if week is not None and week > day and span >= self.min_long_periods * week:
            self._cycle, self._cycles = week, min(self.max_long_periods, span // week)
        else:
            self._cycle, self._cycles = day, max(1, min(self.max_periods, span // day))
        half = _bins(self.smooth_seconds, step) // 2
        self._offsets = np.arange(-half, half + 1, dtype=np.int64)
        level = _bins(self.level_seconds, step)
        recent_bins = np.arange(max(0, n - level), n)
        usual = row_quantile(self._values(recent_bins), 0.5)
        self._ratio = _level_ratio(y[recent_bins], usual)
        # Where no cycle has data for a bin: the last observed level (a gap is not zero).
        self._fallback = float(y[finite[-level:]].mean()) / self._ratio

    def _values(self, targets: IntArray) -> FloatArray:
        """One row per target bin: the history at the same phase in each of the last ``N``
        cycles observed before it, with the smoothing window's neighbours (NaN where the
        history has no value)."""
        n, cycle = len(self._y), self._cycle
        t = np.asarray(targets, dtype=np.int64)
        # The latest cycle back whose bin is observed: 1 inside the next cycle, then 2, ...
        first = np.maximum(1, -((n - 1 - t) // cycle))
        back = first[:, None] + np.arange(self._cycles, dtype=np.int64)
        index = (t[:, None] - back * cycle)[:, :, None] + self._offsets
        index = index.reshape(len(t), -1)
        ok = (index >= 0) & (index < n)
        out = np.full(index.shape, np.nan)
        out[ok] = self._y[index[ok]]
        return out

    def _profile(self, targets: IntArray) -> FloatArray:
        profile = row_quantile(self._values(targets), 0.5)
        return np.where(np.isfinite(profile), profile, self._fallback)

    def _mean(self, leads: IntArray) -> FloatArray:
        targets = len(self._y) - 1 + np.asarray(leads, dtype=np.int64)
        return self._profile(targets) * self._ratio

    def _band(self, n_leads: int, quantile: float) -> Band:
        half = _bins(self.spread_seconds, self._step) // 2
        targets = len(self._y) - 1 + np.arange(1 - half, n_leads + half + 1, dtype=np.int64)
        values = self._values(targets)
        profile = row_quantile(values, 0.5)
        known = profile[np.isfinite(profile)]
        floor = max(0.01 * float(known.mean()), 1e-9) if len(known) else 1e-9
        spread = np.log((values + floor) / (profile[:, None] + floor))
        few = np.isfinite(spread).sum(axis=1) < 2
        z = normal_quantile(quantile) * DEFAULT_LOG_SPREAD
        bounds = []
        for q, default in ((quantile, z), (1 - quantile, -z)):
            per_bin = np.where(few, np.nan, row_quantile(spread, q))
            rolled = pd.Series(per_bin).rolling(2 * half + 1, center=True, min_periods=1).mean()
            lead_rows = rolled.to_numpy()[half : half + n_leads]
            bounds.append(np.where(np.isfinite(lead_rows), lead_rows, default))
        hi, lo = bounds
        return Band.multiplicative(np.exp(np.minimum(lo, 0.0)), np.exp(np.maximum(hi, 0.0)))


def _level_ratio(recent: FloatArray, usual: FloatArray) -> float:
    """Recent demand over the profile on the same bins: a ratio of medians (a burst inside
    the window does not scale the whole day), of means when a median is zero (sparse
    counts), 1 when nothing is known; clipped to :data:`LEVEL_CLIP`."""
    ok = np.isfinite(recent) & np.isfinite(usual)
    if not ok.any():
        return 1.0
    now, before = recent[ok], usual[ok]
    now_median, before_median = float(np.median(now)), float(np.median(before))
    if now_median > 0 and before_median > 0:
        ratio = now_median / before_median
    elif float(before.mean()) > 0:
        ratio = float(now.mean()) / float(before.mean())
    else:
        return 1.0
    return float(np.clip(ratio, *LEVEL_CLIP))
