"""Online calibration of the upper band on the pool's own forecast errors (conformal).

A model's own band is calibrated when it is fitted, on that model's in-sample errors. What
the planner plans on is something else: the forecast actually served, which auto-selection
may have switched between models, which a nowcast corrected, and which is judged at the
lead times the planner uses. :class:`OnlineCalibrator` scores exactly that. It remembers
the mean of every forecast it served, per grid bin of origin and per lead; once the bins
they describe are observed, each pair adds ``log(actual / mean)`` to that lead's recent
errors (the last ``window_seconds``). The upper bound at lead ``k`` is then
``mean × exp(the quantile q of lead k's errors)``: split-conformal with a sliding
calibration set, so the band follows the pool's volatility as it changes (wider on bursty
days, narrower on calm ones) instead of a fixed multiplier. Until a lead has
``min_pairs`` errors, the model's own band stands.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from prescaler_forecast._calibration import row_quantile
from prescaler_forecast._types import Forecast, ForecastPoint

__all__ = ["OnlineCalibrator"]

FloatArray = np.ndarray


class OnlineCalibrator:
    """Per-lead empirical quantiles of the served forecasts' log errors.

    Args:
        quantile: the upper quantile the band estimates.
        window_seconds: how much recent error history one lead's quantile covers.
        min_pairs: errors a lead needs before its calibrated bound replaces the model's.
        max_leads: leads tracked (the planner's lookahead needs only the first few).
    """

    def __init__(
        self,
        quantile: float,
        *,
        window_seconds: float = 2 * 86_400.0,
        min_pairs: int = 120,
        max_leads: int = 180,
    ) -> None:
        if not 0.5 <= quantile < 1:
            raise ValueError(f"quantile must be in [0.5, 1), got {quantile!r}")
        self.quantile = quantile
        self.window_seconds = window_seconds
        self.min_pairs = min_pairs
        self.max_leads = max_leads
        self._step = 0.0
        self._pending: dict[int, FloatArray] = {}
        """Origin bin (absolute, unix seconds / step) -> served means per lead (1-based)."""
        self._errors = np.empty((0, 1))
        """Per lead (row), its recent errors: a ring of the window's capacity, NaN where
        not yet written; rows are added as longer forecasts are served."""
        self._written = np.zeros(0, dtype=np.int64)
        """Per lead, how many errors were ever written (the ring's next slot, modulo)."""
        self._last_scored = -1
        """The last absolute bin whose truth has been scored."""

    def _reset(self, step: float) -> None:
        self._step = step
        self._pending.clear()
        capacity = max(1, round(self.window_seconds / step))
        self._errors = np.empty((0, capacity))
        self._written = np.zeros(0, dtype=np.int64)
        self._last_scored = -1

    def _track(self, leads: int) -> None:
        """Rows for the first ``leads`` leads (at most ``max_leads``)."""
        leads = min(leads, self.max_leads)
        have = len(self._errors)
        if leads > have:
            more = np.full((leads - have, self._errors.shape[1]), np.nan)
            self._errors = np.vstack([self._errors, more])
            self._written = np.concatenate([self._written, np.zeros(leads - have, np.int64)])

    def pairs(self, lead: int) -> int:
        """How many errors lead ``lead`` (1-based) has."""
        if not 0 < lead <= len(self._errors):
            return 0
        return int(min(self._written[lead - 1], self._errors.shape[1]))

    def observe(self, start: float, values: FloatArray, step: float) -> None:
        """Score every remembered forecast whose bins are now in ``values``."""
        if step != self._step:
            self._reset(step)
        n = len(values)
        if n == 0:
            return
        first = round(start / step)
        last = first + n - 1
        if last <= self._last_scored:
            return
        y = np.asarray(values, dtype=float)
        errors, written = self._errors, self._written
        capacity = errors.shape[1]
        for origin in sorted(self._pending):
            means = self._pending[origin]
            # Lead k is bin origin + k - 1 (lead 1 starts at the origin): the leads whose
            # bins are new and in ``values``.
            since = max(self._last_scored + 1, first)
            for k in range(max(1, since - origin + 1), min(len(means), last - origin + 1) + 1):
                actual, mean = y[origin + k - 1 - first], means[k - 1]
                if math.isfinite(actual) and actual >= 0 and mean > 0 and k <= len(errors):
                    floor = 1e-3 * mean
                    at = written[k - 1] % capacity
                    errors[k - 1, at] = math.log((actual + floor) / (mean + floor))
                    written[k - 1] += 1
            if origin + len(means) - 1 <= last:
                del self._pending[origin]
        self._last_scored = last

    def calibrate(self, forecast: Forecast) -> Forecast:
        """Remember ``forecast``'s means and return it with calibrated upper bounds."""
        step = forecast.step_seconds
        if step != self._step:
            self._reset(step)
        if not forecast.points:
            return forecast
        origin = round((forecast.points[0].t - step) / step)
        means = np.array([p.mean for p in forecast.points[: self.max_leads]], dtype=float)
        if origin not in self._pending:
            self._pending[origin] = means
        self._track(len(means))
        points = list(forecast.points)
        leads = min(len(points), len(self._errors))
        capacity = self._errors.shape[1]
        counts = np.minimum(self._written[:leads], capacity)
        enough = counts >= self.min_pairs
        if not enough.any():
            return forecast
        quantiles = np.full(leads, np.nan)
        full = counts == capacity
        if full.any():  # the usual case: every lead's window full, one call for them all
            quantiles[full] = np.quantile(self._errors[:leads][full], self.quantile, axis=1)
        partial = enough & ~full  # filled from the ring's start so far, NaN beyond
        if partial.any():
            width = int(counts[partial].max())
            rows = self._errors[:leads][partial, :width]
            quantiles[partial] = row_quantile(rows, self.quantile)
        for k in np.flatnonzero(enough):
            point = points[k]
            upper = max(point.mean, point.mean * math.exp(float(quantiles[k])))
            points[k] = ForecastPoint(point.t, point.mean, point.lower, upper)
        detail = "; ".join(x for x in (forecast.detail, "band calibrated on served errors") if x)
        return replace(forecast, points=tuple(points), detail=detail)
