"""Fitting as a picklable value, the cached-fit runner and the nowcast correction.

The expensive step is :func:`fit_model`: a top-level function from a picklable
:class:`ModelSpec` and a history to a picklable :class:`FittedModel`, so it can run in a
``concurrent.futures.ProcessPoolExecutor``. A :class:`FittedModel` holds no Prophet object,
only the arrays it needs: the model's curve from a little before the end of the history
to ``valid_seconds + horizon`` after it, and the interval per lead.

:func:`forecast_from_fit` turns a fitted model into a :class:`Forecast` at any later "now"
inside that range: if the model takes a nowcast (Prophet), the curve is scaled by the
median of the per-bin ratios observed / curve over the last ``nowcast_seconds`` before now
(clipped to [1/3, 3]), so a sudden level shift is followed at once, not at the next refit,
while a burst that has already ended does not hold the forecast up. The correction fades
over the horizon (``nowcast_decay_seconds``), as a deviation from the seasonal curve does.
Where the curve misses the observed level by more than that clip (a trend extrapolated to
zero under a busy pool), the forecast holds the observed level instead. Auto-selection
scores Prophet through this same function, so it judges the forecast that is served.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np
import pandas as pd

from prescaler_forecast._base import Band, Forecaster, check_quantile
from prescaler_forecast._baselines import (
    Persistence,
    RecentMean,
    RecentTrend,
    SeasonalNaive,
    SeasonalNaiveWeekly,
)
from prescaler_forecast._calibration import (
    NOWCAST_DECAY_SECONDS,
    decay_ratio,
    off_curve_level,
    robust_ratio,
)
from prescaler_forecast._hygiene import series_to_grid
from prescaler_forecast._profile import SeasonalProfile
from prescaler_forecast._prophet import ProphetForecaster
from prescaler_forecast._types import (
    SEASONALITY_PERIODS,
    STATUS_INSUFFICIENT_HISTORY,
    EventWindow,
    Forecast,
    ForecastPoint,
    check_periods,
)

__all__ = [
    "FALLBACK_MODEL",
    "MODEL_NAMES",
    "FittedModel",
    "ModelRunner",
    "ModelSpec",
    "eligible_models",
    "fallback_forecast",
    "fit_grid_model",
    "fit_model",
    "forecast_from_fit",
    "make_forecaster",
]

FloatArray = np.ndarray

MODEL_NAMES: tuple[str, ...] = (
    "persistence",
    "recent_mean",
    "recent_trend",
    "seasonal_naive",
    "seasonal_naive_weekly",
    "seasonal_profile",
    "prophet",
)
"""Registered models, cheapest first (ties in the selection go to the earlier one)."""
FALLBACK_MODEL = "fallback"
"""Model name reported when no model has enough history (last level, or zero)."""


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to fit one model; picklable."""

    name: str
    """A name from :data:`MODEL_NAMES`."""
    step_seconds: float
    """The forecast grid step."""
    horizon_seconds: float
    """How far ahead forecasts from this fit reach (lead time + margin)."""
    quantile: float = 0.9
    """Upper quantile of the interval."""
    valid_seconds: float = 0.0
    """How long after the end of its history a fit may still be used (with a nowcast)."""
    lookback_seconds: float | None = None
    """Recent history Prophet fits on (default 14 days); cheap models use short windows."""
    events: tuple[EventWindow, ...] = ()
    """Scheduled windows, past and future, turned into Prophet regressors."""
    nowcast_seconds: float = 300.0
    """Window of the nowcast ratio."""
    nowcast_decay_seconds: float = NOWCAST_DECAY_SECONDS
    """How fast the nowcast correction fades over the horizon (e-folding time)."""
    seasonality_periods: tuple[float, ...] = SEASONALITY_PERIODS
    """The demand's cycles in seconds, shortest first: ``seasonal_naive`` repeats the
    shortest, ``seasonal_naive_weekly`` the longest, ``seasonal_profile`` takes the median
    over the last cycles of the longest (once its history covers three) or else of the
    shortest, Prophet fits one seasonality each."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "seasonality_periods", check_periods(self.seasonality_periods))
        if self.name not in MODEL_NAMES:
            raise ValueError(f"unknown model {self.name!r}; choose from {', '.join(MODEL_NAMES)}")
        for label, value in (
            ("step_seconds", self.step_seconds),
            ("horizon_seconds", self.horizon_seconds),
        ):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{label} must be > 0, got {value}")
        check_quantile(self.quantile)

    @property
    def leads(self) -> int:
        """Leads an interval must cover: the horizon plus one partly elapsed step."""
        return math.ceil(self.horizon_seconds / self.step_seconds - 1e-9) + 1


@dataclass(frozen=True)
class FittedModel:
    """A fit reduced to arrays: picklable and cheap to send between processes."""

    name: str
    step_seconds: float
    quantile: float
    history_end: float
    """Unix seconds where the fitted history ends (end of its last bin)."""
    curve_start: float
    """Unix seconds of the start of ``curve[0]``'s bin."""
    curve: FloatArray = field(repr=False)
    """The model's mean per bin (before any nowcast)."""
    band: Band = field(repr=False)
    """Interval per lead after the forecast origin."""
    nowcast: bool
    nowcast_bins: int
    fit_seconds: float
    """Wall time of the fit (for reports)."""
    nowcast_decay_seconds: float = NOWCAST_DECAY_SECONDS
    """How fast the nowcast correction fades over the horizon (e-folding time)."""

    @property
    def curve_end(self) -> float:
        return self.curve_start + len(self.curve) * self.step_seconds

    def usable_at(self, now: float, horizon_seconds: float) -> bool:
        """Whether a forecast at ``now`` for this horizon stays inside the cached curve."""
        origin = _floor(now, self.step_seconds)
        if not self.nowcast:
            return math.isclose(origin, self.history_end)
        return origin >= self.history_end and now + horizon_seconds <= self.curve_end + 1e-6


def make_forecaster(spec: ModelSpec) -> Forecaster:
    """A fresh, unfitted model for this spec."""
    periods = spec.seasonality_periods
    if spec.name == "prophet":
        if spec.lookback_seconds is None:
            return ProphetForecaster(
                events=spec.events,
                nowcast_seconds=spec.nowcast_seconds,
                nowcast_decay_seconds=spec.nowcast_decay_seconds,
                seasonality_periods=periods,
            )
        return ProphetForecaster(
            events=spec.events,
            nowcast_seconds=spec.nowcast_seconds,
            nowcast_decay_seconds=spec.nowcast_decay_seconds,
            lookback_seconds=spec.lookback_seconds,
            seasonality_periods=periods,
        )
    factories: dict[str, Callable[[], Forecaster]] = {
        "persistence": Persistence,
        "recent_mean": RecentMean,
        "recent_trend": RecentTrend,
        "seasonal_naive": partial(SeasonalNaive, period_seconds=periods[0]),
        "seasonal_naive_weekly": partial(SeasonalNaiveWeekly, period_seconds=periods[-1]),
        "seasonal_profile": partial(
            SeasonalProfile,
            period_seconds=periods[0],
            long_period_seconds=periods[-1] if len(periods) > 1 else None,
        ),
    }
    return factories[spec.name]()


def fit_grid_model(
    spec: ModelSpec,
    start: float,
    values: FloatArray,
    *,
    with_band: bool = True,
    forecaster: Forecaster | None = None,
) -> FittedModel:
    """Fit ``spec`` on a regular grid (bin ``i`` starts at ``start + i*step``).

    ``with_band=False`` skips calibrating the interval (a zero-width band): for scoring by
    sMAPE, which looks at the mean only, at half the cost of a cheap model's fit.
    ``forecaster`` replaces the registered model of ``spec.name`` (an unfitted instance).
    Raises :class:`InsufficientHistoryError` if the model cannot use this much history.
    """
    began = time.perf_counter()
    unfitted = forecaster if forecaster is not None else make_forecaster(spec)
    model = unfitted.fit_grid(start, values, spec.step_seconds)
    n = len(values)
    if with_band:
        band = model._band(spec.leads, spec.quantile)
    else:
        ones = np.ones(spec.leads)
        band = Band.multiplicative(ones, ones)
    if isinstance(model, ProphetForecaster):
        nowcast_bins = max(1, round(spec.nowcast_seconds / spec.step_seconds))
        first = n - min(n, nowcast_bins)
        future = math.ceil((spec.valid_seconds + spec.horizon_seconds) / spec.step_seconds) + 1
        curve = model.raw_curve(first, n - first + future)
        curve_start = start + first * spec.step_seconds
    else:
        nowcast_bins = 0
        curve = model._mean(np.arange(1, spec.leads + 1))
        curve_start = model.end
    return FittedModel(
        name=spec.name,
        step_seconds=spec.step_seconds,
        quantile=spec.quantile,
        history_end=model.end,
        curve_start=curve_start,
        curve=np.asarray(curve, dtype=float),
        band=band,
        nowcast=model.nowcast,
        nowcast_bins=nowcast_bins,
        fit_seconds=time.perf_counter() - began,
        nowcast_decay_seconds=spec.nowcast_decay_seconds,
    )


def fit_model(spec: ModelSpec, series: pd.Series) -> FittedModel:
    """Fit ``spec`` on a demand history (a process-pool friendly top-level function).

    ``series`` must hold only data before the forecast time; it is regularized with
    :func:`clean_series` at ``spec.step_seconds``.
    """
    start, grid = series_to_grid(series, spec.step_seconds)
    return fit_grid_model(spec, start, grid)


def forecast_from_fit(
    fitted: FittedModel,
    start: float,
    values: FloatArray,
    now: float,
    horizon_seconds: float,
    *,
    score: float | None = None,
    detail: str = "",
) -> Forecast:
    """The forecast at ``now`` from a cached fit, with the nowcast correction.

    ``values`` is the regular grid from ``start`` up to the last bin ending by ``now``.
    Points are the grid steps covering ``(now, now + horizon]``: the first one is the step
    that contains ``now`` (or starts at it).
    """
    step = fitted.step_seconds
    origin = _floor(now, step)
    n_points = math.ceil((now + horizon_seconds - origin) / step - 1e-9)
    offset = round((origin - fitted.curve_start) / step)
    mean = fitted.curve[offset : offset + n_points]
    if len(mean) < n_points:
        raise ValueError("the fitted curve does not cover this forecast; refit first")
    ratio, level = 1.0, None
    if fitted.nowcast:
        ratio, level = _nowcast(fitted, start, values, origin)
        leads = np.arange(len(mean), dtype=float) * step
        if level is None:
            mean = mean * decay_ratio(ratio, leads, fitted.nowcast_decay_seconds)
        else:
            mean = np.full(len(mean), level)
    mean, lower, upper = fitted.band.apply(mean)
    points = tuple(
        ForecastPoint(origin + (k + 1) * step, float(m), float(lo), float(hi))
        for k, (m, lo, hi) in enumerate(zip(mean, lower, upper, strict=True))
    )
    if fitted.nowcast and not detail:
        age = f"fitted {max(0.0, now - fitted.history_end):.0f} s ago"
        if level is None:
            detail = f"{age}; nowcast x{ratio:.3f}"
        else:
            detail = f"{age}; the curve misses the observed level by over 3x: holds {level:.3g}"
    return Forecast(
        model=fitted.name,
        score=score,
        step_seconds=step,
        generated_at=now,
        quantile=fitted.quantile,
        points=points,
        detail=detail,
    )


def _nowcast(
    fitted: FittedModel, start: float, values: FloatArray, origin: float
) -> tuple[float, float | None]:
    """The nowcast ratio at ``origin``, and the observed level to hold instead of the
    curve when the curve misses it beyond the ratio's clip (else ``None``)."""
    step = fitted.step_seconds
    end_bin = round((origin - start) / step)  # bins [.., end_bin) are observed
    lo_bin = max(0, end_bin - fitted.nowcast_bins)
    observed = np.asarray(values[lo_bin:end_bin], dtype=float)
    c0 = round((start + lo_bin * step - fitted.curve_start) / step)
    if c0 < 0:
        return 1.0, None
    expected = fitted.curve[c0 : c0 + len(observed)]
    observed = observed[: len(expected)]
    return robust_ratio(observed, expected), off_curve_level(observed, expected)


def fallback_forecast(
    values: FloatArray,
    step_seconds: float,
    now: float,
    horizon_seconds: float,
    quantile: float,
    detail: str,
) -> Forecast:
    """What to answer with too little history: the mean of the last (up to 5) observed
    values, flat, with a ±50 % band, or zeros without any data; status
    ``insufficient_history``."""
    finite = np.asarray(values, dtype=float)
    finite = finite[np.isfinite(finite)][-5:]
    level = float(finite.mean()) if len(finite) else 0.0
    origin = _floor(now, step_seconds)
    n_points = math.ceil((now + horizon_seconds - origin) / step_seconds - 1e-9)
    points = tuple(
        ForecastPoint(origin + (k + 1) * step_seconds, level, 0.5 * level, 1.5 * level)
        for k in range(n_points)
    )
    return Forecast(
        model=FALLBACK_MODEL,
        score=None,
        step_seconds=step_seconds,
        generated_at=now,
        quantile=quantile,
        points=points,
        status=STATUS_INSUFFICIENT_HISTORY,
        detail=detail,
    )


class ModelRunner:
    """One model with its refit cadence: cheap models refit on every call, others every
    ``refit_seconds`` (or when the cached curve runs out), with the nowcast in between."""

    def __init__(
        self,
        spec: ModelSpec,
        refit_seconds: float,
        *,
        with_band: bool = True,
        make: Callable[[], Forecaster] | None = None,
    ) -> None:
        self.spec = spec
        self.refit_seconds = refit_seconds
        self.with_band = with_band
        """``False``: fits skip the interval (see :func:`fit_grid_model`); for backtests."""
        self.make = make
        """Builds the model instead of the registered one of ``spec.name`` (``None``: that)."""
        self.cheap = (make() if make is not None else make_forecaster(spec)).cheap
        """Cheap models refit on every call; the others are cached between refits."""
        self.fitted: FittedModel | None = None
        self.fit_count = 0
        self.fit_seconds = 0.0

    def refit_due(self, now: float) -> bool:
        """Whether the next forecast at ``now`` needs a fresh fit."""
        f = self.fitted
        return (
            f is None
            or not f.usable_at(now, self.spec.horizon_seconds)
            or now - f.history_end >= self.refit_seconds
        )

    def install(self, fitted: FittedModel) -> None:
        """Use a fit made elsewhere (e.g. in a process pool)."""
        if fitted.name != self.spec.name:
            raise ValueError(f"fit is for {fitted.name!r}, runner is for {self.spec.name!r}")
        self.fitted = fitted
        self.fit_count += 1
        self.fit_seconds += fitted.fit_seconds

    def forecast(
        self, start: float, values: FloatArray, now: float, *, score: float | None = None
    ) -> Forecast:
        """Forecast at ``now`` from the grid observed before it, refitting when due.

        Raises :class:`InsufficientHistoryError` when the model cannot be fitted.
        """
        if self.cheap or self.refit_due(now):
            spec = self.spec
            end = start + len(values) * spec.step_seconds
            if self.cheap and now - end >= spec.step_seconds:
                # The data ends steps before now (a source that delivers late): the curve
                # must reach from that end past now + horizon.
                spec = replace(spec, horizon_seconds=spec.horizon_seconds + now - end)
            model = self.make() if self.make is not None else None
            fitted = fit_grid_model(spec, start, values, with_band=self.with_band, forecaster=model)
            self.install(fitted)
        assert self.fitted is not None
        return forecast_from_fit(
            self.fitted, start, values, now, self.spec.horizon_seconds, score=score
        )


def eligible_models(
    names: Sequence[str],
    start: float,
    values: FloatArray,
    step_seconds: float,
    *,
    seasonality_periods: Sequence[float] = SEASONALITY_PERIODS,
) -> tuple[str, ...]:
    """The models whose minimum history the grid's observed span meets (a seasonal model's
    is its period plus its level window)."""
    finite = np.flatnonzero(np.isfinite(values))
    if len(finite) < 3:
        return ()
    span = (finite[-1] - finite[0] + 1) * step_seconds
    out = []
    for name in names:
        spec_model = make_forecaster(
            ModelSpec(
                name, step_seconds, step_seconds, seasonality_periods=tuple(seasonality_periods)
            )
        )
        if span >= spec_model.min_history_seconds(step_seconds):
            out.append(name)
    return tuple(out)


def _floor(t: float, step: float) -> float:
    return math.floor(t / step + 1e-9) * step
