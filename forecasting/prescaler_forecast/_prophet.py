"""Prophet with seasonality (daily/weekly, or any periods), event regressors, a nowcast and
calibrated bands.

Cost control (fit in about 0.3 s for a week of one-minute points on 2 cores):

* Prophet is fitted on at most ``max_fit_points`` points: a finer history is averaged
  into coarser bins first (a week of one-minute points becomes 5-minute bins). Seasonal
  shapes at daily and weekly scale survive; minute-level noise is not something Prophet's
  smooth curve could follow anyway, and the nowcast correction restores the level.
* Prophet's own posterior sampling is off (``uncertainty_samples=0``, no samples): over a
  5-20 minute horizon its trend uncertainty is negligible and its Gaussian noise term is
  measured at the fitted (coarser) resolution. The interval instead comes from the
  empirical log-ratio errors of the nowcast-corrected curve at the forecast step over the
  last ``calibration_seconds`` of history, per lead (see ``_calibration``).
* Prophet and cmdstanpy log through the ``prophet`` and ``cmdstanpy`` loggers; those loggers
  (only those) are disabled. Prophet 1.5 calls ``DataFrame.drop(inplace=True)``, which
  pandas 3.1 flags with ``Pandas4Warning``; that one warning is ignored around Prophet calls.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import pandas as pd
from pandas.errors import Pandas4Warning

from prescaler_forecast._base import Band, Forecaster
from prescaler_forecast._calibration import (
    NOWCAST_DECAY_SECONDS,
    decay_ratio,
    log_ratio_bands,
    off_curve_level,
    robust_ratio,
    rolling_ratio,
)
from prescaler_forecast._types import SEASONALITY_PERIODS, EventWindow, check_periods

__all__ = ["ProphetForecaster", "quiet_prophet"]

FloatArray = np.ndarray
IntArray = np.ndarray

DAY = 86_400.0
WEEK = 7 * DAY
_NOISY_LOGGERS = ("prophet", "prophet.plot", "prophet.models", "prophet.forecaster", "cmdstanpy")


def _disable_loggers() -> None:
    for name in _NOISY_LOGGERS:
        logging.getLogger(name).disabled = True


@contextmanager
def quiet_prophet() -> Iterator[None]:
    """Disable Prophet's and cmdstanpy's loggers and ignore Prophet's one pandas warning."""
    _disable_loggers()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The inplace keyword", category=Pandas4Warning)
        yield


class ProphetForecaster(Forecaster):
    """Prophet on the recent history, plus past occurrences of scheduled events.

    * One seasonality per period of ``seasonality_periods`` (default one day and one week),
      each once the history spans ``min_cycles`` (2) of its periods, as Prophet's own rule
      does for its daily and weekly ones (2 days, 14 days). A day and a week are Prophet's
      own ``daily`` and ``weekly`` (Fourier orders 4 and 3); any other period is added as
      ``period_<seconds>s``, with order 4 below a week and 3 from a week up.
    * Each :class:`EventWindow` name with an occurrence inside the fitted history becomes a
      multiplicative regressor (the share of each bin inside a window of that name), so a
      past Black Friday teaches the next one its lift. Past occurrences older than the
      fitted history are kept too: the history is the recent ``lookback`` plus
      ``event_context_seconds`` around each older occurrence in the given series.
    * :meth:`predict` applies the nowcast correction at the end of the history: the curve
      is scaled by the median of the per-bin ratios observed / fitted over the last
      ``nowcast_seconds`` (burst-proof), fading over the horizon with
      ``nowcast_decay_seconds``; where the curve misses that level by more than the
      ratio's clip (3x), the forecast holds the observed level.
    """

    name = "prophet"
    cheap = False
    nowcast = True

    def __init__(
        self,
        *,
        events: Sequence[EventWindow] = (),
        lookback_seconds: float | None = 14 * DAY,
        max_fit_points: int = 2100,
        nowcast_seconds: float = 300.0,
        nowcast_decay_seconds: float = NOWCAST_DECAY_SECONDS,
        calibration_seconds: float = DAY,
        seasonality_periods: Sequence[float] = SEASONALITY_PERIODS,
        min_cycles: float = 2.0,
        n_changepoints: int = 15,
        changepoint_prior_scale: float = 0.05,
        event_context_seconds: float = DAY,
    ) -> None:
        super().__init__()
        self.events = tuple(events)
        self.lookback_seconds = lookback_seconds
        self.max_fit_points = max_fit_points
        self.nowcast_seconds = nowcast_seconds
        self.nowcast_decay_seconds = nowcast_decay_seconds
        self.calibration_seconds = calibration_seconds
        self.seasonality_periods = check_periods(seasonality_periods)
        self.min_cycles = min_cycles
        self.n_changepoints = n_changepoints
        self.changepoint_prior_scale = changepoint_prior_scale
        self.event_context_seconds = event_context_seconds
        self._model: Any = None
        self._regressors: tuple[str, ...] = ()
        self._ratio = 1.0
        self._level: float | None = None
        self._insample: FloatArray = np.empty(0)

    def min_history_seconds(self, step_seconds: float) -> float:
        return max(1800.0, 20 * step_seconds)

    # ------------------------------------------------------------------ fitting
    def _fit(self) -> None:
        self._fit_prophet()
        # In-sample curve at the forecast step, for the nowcast and the calibration.
        y, step, n = self._y, self._step, len(self._y)
        self._ratio = 1.0
        back = min(n, _bins(self.calibration_seconds, step) + self._nowcast_bins())
        self._insample_from = n - back
        self._insample = self._raw(np.arange(self._insample_from, n))
        window = self._nowcast_bins()
        self._ratio = robust_ratio(y[-window:], self._insample[-window:])
        self._level = off_curve_level(y[-window:], self._insample[-window:])

    def _fit_prophet(self) -> None:
        """Fit Prophet itself (``self._model``, ``self._regressors``)."""
        _disable_loggers()  # before the import: prophet.plot logs at import time
        from prophet import Prophet  # heavy import, only where a fit happens

        y, step, start = self._y, self._step, self._start
        n = len(y)
        keep = np.zeros(n, dtype=bool)
        recent = n if self.lookback_seconds is None else math.ceil(self.lookback_seconds / step)
        keep[max(0, n - recent) :] = True
        bin_start = start + np.arange(n) * step
        for ev in self.events:  # older occurrences of an event, with some context around
            lo = np.searchsorted(bin_start, ev.start - self.event_context_seconds)
            hi = np.searchsorted(bin_start, ev.end + self.event_context_seconds)
            keep[lo:hi] = True
        idx = np.flatnonzero(keep & np.isfinite(y))
        span = (idx[-1] - idx[0] + 1) * step
        periods = [p for p in self.seasonality_periods if span >= self.min_cycles * p]
        factor = max(1, math.ceil(len(idx) / self.max_fit_points))
        width = factor * step
        # Average into bins of `factor` steps, labelled by their midpoints.
        groups = idx // factor
        uniq, inverse = np.unique(groups, return_inverse=True)
        sums = np.bincount(inverse, weights=y[idx])
        counts = np.bincount(inverse)
        fit_start = start + uniq * width
        ds_seconds = fit_start + width / 2
        frame = pd.DataFrame({"ds": _naive_utc(ds_seconds), "y": sums / counts})
        first, last = fit_start[0], fit_start[-1] + width
        self._regressors = tuple(
            sorted({ev.name for ev in self.events if ev.start < last and ev.end > first})
        )
        for name in self._regressors:
            frame[name] = self._event_share(name, fit_start, width)
        self._regressors = tuple(r for r in self._regressors if frame[r].to_numpy().any())
        frame = frame[["ds", "y", *self._regressors]]
        with quiet_prophet():
            model = Prophet(
                growth="linear",
                daily_seasonality=DAY in periods,
                weekly_seasonality=WEEK in periods,
                yearly_seasonality=False,
                n_changepoints=min(self.n_changepoints, max(0, len(frame) // 4)),
                changepoint_prior_scale=self.changepoint_prior_scale,
                uncertainty_samples=0,
            )
            for period in periods:
                if period not in (DAY, WEEK):
                    model.add_seasonality(
                        name=f"period_{period:.0f}s",
                        period=period / DAY,
                        fourier_order=4 if period < WEEK else 3,
                    )
            for name in self._regressors:
                model.add_regressor(name, mode="multiplicative", standardize=False)
            model.fit(frame)
        self._model = model

    def _nowcast_bins(self) -> int:
        return _bins(self.nowcast_seconds, self._step)

    def _event_share(self, name: str, bin_starts: FloatArray, width: float) -> FloatArray:
        share = np.zeros(len(bin_starts))
        for ev in self.events:
            if ev.name == name:
                overlap = np.minimum(bin_starts + width, ev.end) - np.maximum(bin_starts, ev.start)
                share += np.clip(overlap, 0.0, width) / width
        return np.minimum(share, 1.0)

    def _raw(self, bins: IntArray) -> FloatArray:
        """Prophet's curve (no nowcast) for grid bins (0 = first history bin)."""
        starts = self._start + np.asarray(bins, dtype=float) * self._step
        frame = pd.DataFrame({"ds": _naive_utc(starts + self._step / 2)})
        for name in self._regressors:
            frame[name] = self._event_share(name, starts, self._step)
        with quiet_prophet():
            forecast = self._model.predict(frame)
        yhat: FloatArray = np.maximum(forecast["yhat"].to_numpy(dtype=float), 0.0)
        return yhat

    # ------------------------------------------------------------------ prediction
    def _mean(self, leads: IntArray) -> FloatArray:
        leads = np.asarray(leads, dtype=int)
        if self._level is not None:  # the curve misses the observed level: hold it
            return np.full(len(leads), self._level)
        ratio = decay_ratio(self._ratio, (leads - 1) * self._step, self.nowcast_decay_seconds)
        mean: FloatArray = self._raw(len(self._y) - 1 + leads) * ratio
        return mean

    def raw_curve(self, first_bin: int, n_bins: int) -> FloatArray:
        """Prophet's curve without the nowcast, for grid bins ``first_bin ..`` (0 = first
        history bin; bins past the history are the future). Used to cache a fit."""
        self._require_fitted()
        return self._raw(np.arange(first_bin, first_bin + n_bins))

    def _band(self, n_leads: int, quantile: float) -> Band:
        y = self._y[self._insample_from :]
        fitted = self._insample
        window = self._nowcast_bins()
        ratio = rolling_ratio(y, fitted, window)
        first = min(window, len(y) - 1)
        targets = np.arange(first, len(y))
        # Row k-1: each target against the curve faded from the ratio k bins before it.
        leads = np.arange(1, n_leads + 1)[:, None]
        origins = targets[None, :] - leads
        keep = origins >= 0
        fade = decay_ratio(
            ratio[np.maximum(origins, 0)],
            np.broadcast_to((leads - 1) * self._step, origins.shape),
            self.nowcast_decay_seconds,
        )
        lo, hi = log_ratio_bands(
            np.where(keep, y[targets][None, :], np.nan),
            np.where(keep, fitted[targets][None, :] * fade, np.nan),
            quantile,
        )
        return Band.multiplicative(lo, hi)


def _bins(seconds: float, step: float) -> int:
    return max(1, round(seconds / step))


def _naive_utc(seconds: FloatArray) -> pd.DatetimeIndex:
    """Prophet wants tz-naive timestamps: UTC wall-clock."""
    return pd.to_datetime(np.asarray(seconds, dtype=float), unit="s").as_unit("ns")
