"""The :class:`Forecaster` interface: public methods validate, private ones compute."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Self

import numpy as np
import pandas as pd

from prescaler_forecast._hygiene import series_to_grid, unix_seconds
from prescaler_forecast._types import ForecastPoint, InsufficientHistoryError

__all__ = ["Band", "Forecaster", "check_quantile"]

FloatArray = np.ndarray
IntArray = np.ndarray


def check_quantile(quantile: float) -> float:
    """Validate an upper quantile (``0.5 <= q < 1``)."""
    if not (isinstance(quantile, (int, float)) and 0.5 <= quantile < 1):
        raise ValueError(f"quantile must be in [0.5, 1), got {quantile!r}")
    return float(quantile)


@dataclass(frozen=True)
class Band:
    """Interval per lead (index ``k-1`` for lead ``k``), relative to the mean.

    ``lower = max(0, mean * lo_mult - lo_add)`` and ``upper = mean * hi_mult + hi_add``.
    Multiplicative models leave the ``*_add`` arrays at 0; additive ones the ``*_mult`` at 1.
    """

    lo_mult: FloatArray
    hi_mult: FloatArray
    lo_add: FloatArray
    hi_add: FloatArray

    @classmethod
    def multiplicative(cls, lo: FloatArray, hi: FloatArray) -> Band:
        zeros = np.zeros(len(lo))
        return cls(np.asarray(lo, dtype=float), np.asarray(hi, dtype=float), zeros, zeros)

    @classmethod
    def additive(cls, lo: FloatArray, hi: FloatArray) -> Band:
        ones = np.ones(len(lo))
        return cls(ones, ones, np.asarray(lo, dtype=float), np.asarray(hi, dtype=float))

    def apply(self, mean: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        """``(mean, lower, upper)``, clipped so that ``0 <= lower <= mean <= upper``.

        A non-finite mean raises ``ValueError``: a model that cannot say the demand has
        failed (the service passes it over); read as zero, it would release the fleet.
        """
        raw = np.asarray(mean, dtype=float)
        if not np.all(np.isfinite(raw)):
            raise ValueError("the model answered a non-finite mean demand")
        m = np.maximum(raw, 0.0)
        n = len(m)
        upper = np.maximum(m * self.hi_mult[:n] + self.hi_add[:n], m)
        lower = np.clip(m * self.lo_mult[:n] - self.lo_add[:n], 0.0, m)
        return m, lower, upper


class Forecaster(ABC):
    """A demand model: :meth:`fit` on a history, then :meth:`predict` the next horizon.

    ``fit`` and ``predict`` validate their inputs and call the private ``_fit``, ``_mean``
    and ``_band`` that subclasses implement. Leads count steps after the last fitted bin:
    lead 1 is the bin that starts where the history ends.
    """

    name: ClassVar[str]
    """Registry name, reported in :attr:`Forecast.model`."""
    cheap: ClassVar[bool] = True
    """Cheap models are refitted on every forecast; expensive ones are cached between refits."""
    nowcast: ClassVar[bool] = False
    """Whether a cached fit gets the nowcast correction (latest observed / forecast ratio)."""

    def __init__(self) -> None:
        self._y: FloatArray = np.empty(0)
        self._start = 0.0
        self._step = 0.0
        self._fitted = False

    # ---------------------------------------------------------------- public API
    @property
    def fitted(self) -> bool:
        """Whether :meth:`fit` succeeded."""
        return self._fitted

    @property
    def step_seconds(self) -> float:
        """The step of the fitted grid."""
        self._require_fitted()
        return self._step

    @property
    def end(self) -> float:
        """Unix seconds where the fitted history ends (end of its last bin)."""
        self._require_fitted()
        return self._start + len(self._y) * self._step

    def min_history_seconds(self, step_seconds: float) -> float:
        """The shortest history (seconds of grid) this model accepts at this step."""
        return 3 * step_seconds

    def fit(self, series: pd.Series, *, step_seconds: float | None = None) -> Self:
        """Fit on a demand series (tz-aware UTC ``DatetimeIndex``; NaN = missing).

        The series is regularized with :func:`clean_series` at ``step_seconds`` (default:
        the median spacing of the index). Raises :class:`InsufficientHistoryError` when
        the history is too short for this model.
        """
        if step_seconds is None:
            if not isinstance(series, pd.Series) or len(series) < 2:
                raise InsufficientHistoryError("need at least 2 samples to infer the step")
            if not isinstance(series.index, pd.DatetimeIndex):
                raise TypeError("series must have a DatetimeIndex")
            step_seconds = float(np.median(np.diff(unix_seconds(series.index))))
        start, grid = series_to_grid(series, step_seconds)
        return self.fit_grid(start, grid, step_seconds)

    def fit_grid(self, start: float, values: FloatArray, step_seconds: float) -> Self:
        """Fit on an already regular grid: bin ``i`` is ``[start + i*step, start + (i+1)*step)``."""
        if not (math.isfinite(step_seconds) and step_seconds > 0):
            raise ValueError(f"step_seconds must be > 0, got {step_seconds}")
        y = np.asarray(values, dtype=float).copy()
        y[~np.isfinite(y) | (y < 0)] = np.nan
        finite = np.flatnonzero(np.isfinite(y))
        need = self.min_history_seconds(step_seconds)
        span = 0.0 if len(finite) == 0 else (finite[-1] - finite[0] + 1) * step_seconds
        if len(finite) < 3 or span < need:
            raise InsufficientHistoryError(
                f"{self.name} needs {need / 3600:.3g} h of history, got {span / 3600:.3g} h"
            )
        self._y, self._start, self._step = y, float(start), float(step_seconds)
        self._fitted = False
        self._fit()
        self._fitted = True
        return self

    def predict(
        self, horizon_seconds: float, step_seconds: float | None = None, quantile: float = 0.9
    ) -> tuple[ForecastPoint, ...]:
        """Forecast ``ceil(horizon / step)`` steps after the fitted history.

        ``step_seconds`` must be the fitted step or a whole multiple of it (then fitted
        steps are averaged). ``quantile`` is the upper quantile; the lower bound is the
        ``1 - quantile`` quantile. Means are clipped at 0.
        """
        self._require_fitted()
        q = check_quantile(quantile)
        if not (math.isfinite(horizon_seconds) and horizon_seconds > 0):
            raise ValueError(f"horizon_seconds must be > 0, got {horizon_seconds}")
        out_step = self._step if step_seconds is None else float(step_seconds)
        ratio = out_step / self._step
        if not (ratio >= 1 and abs(ratio - round(ratio)) < 1e-9):
            raise ValueError(
                f"step_seconds must be a multiple of the fitted step {self._step:g}, "
                f"got {out_step:g}"
            )
        group = round(ratio)
        n_out = math.ceil(horizon_seconds / out_step - 1e-9)
        leads = np.arange(1, n_out * group + 1)
        mean, lower, upper = self._band(len(leads), q).apply(self._mean(leads))
        if group > 1:
            mean, lower, upper = (
                a.reshape(n_out, group).mean(axis=1) for a in (mean, lower, upper)
            )
        end = self.end
        return tuple(
            ForecastPoint(end + (i + 1) * out_step, float(m), float(lo), float(hi))
            for i, (m, lo, hi) in enumerate(zip(mean, lower, upper, strict=True))
        )

    # ---------------------------------------------------------------- for subclasses
    @abstractmethod
    def _fit(self) -> None:
        """Fit on ``self._y`` (NaN = missing), ``self._start`` and ``self._step``."""

    @abstractmethod
    def _mean(self, leads: IntArray) -> FloatArray:
        """Mean demand at these leads (1 = first bin after the history)."""

    @abstractmethod
    def _band(self, n_leads: int, quantile: float) -> Band:
        """The interval for leads ``1..n_leads`` at this upper quantile."""

    def _require_fitted(self) -> None:
        if not self._fitted:
            raise RuntimeError(f"{type(self).__name__} is not fitted; call fit() first")
