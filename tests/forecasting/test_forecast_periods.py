"""Seasonal periods at any time scale: a 4-hour cycle is forecast as one, and the defaults
(one day, one week) are what every model uses when no period is given."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest

from prescaler_forecast import (
    SEASONALITY_PERIODS,
    ForecastService,
    ModelSpec,
    ProphetForecaster,
    SeasonalNaive,
    SeasonalNaiveWeekly,
)
from prescaler_forecast._fitting import eligible_models, make_forecaster

DAY = 86_400.0
WEEK = 7 * DAY
FOUR_HOURS = 4 * 3600.0
T0 = 1_704_067_200.0


def _peak_offset(points: tuple[object, ...], step: float, period: float) -> float:
    """Where in the cycle (seconds after its start) the forecast's mean peaks."""
    starts = np.array([p.t - step for p in points])  # type: ignore[attr-defined]
    means = np.array([p.mean for p in points])  # type: ignore[attr-defined]
    return float((starts[np.argmax(means)] - T0) % period)


def _cycle_error(offset: float, expected: float, period: float) -> float:
    d = abs(offset - expected) % period
    return min(d, period - d)


def test_defaults_are_a_day_and_a_week() -> None:
    assert SEASONALITY_PERIODS == (DAY, WEEK)
    spec = ModelSpec("seasonal_naive", 60.0, 600.0)
    assert spec.seasonality_periods == (DAY, WEEK)
    daily = make_forecaster(spec)
    weekly = make_forecaster(ModelSpec("seasonal_naive_weekly", 60.0, 600.0))
    assert isinstance(daily, SeasonalNaive)
    assert daily.period_seconds == DAY
    assert isinstance(weekly, SeasonalNaiveWeekly)
    assert weekly.period_seconds == WEEK
    prophet = make_forecaster(ModelSpec("prophet", 60.0, 600.0))
    assert isinstance(prophet, ProphetForecaster)
    assert prophet.seasonality_periods == (DAY, WEEK)
    assert SeasonalNaive().period_seconds == DAY
    assert SeasonalNaiveWeekly().period_seconds == WEEK
    assert ForecastService(horizon_seconds=600, step_seconds=60).spec.seasonality_periods == (
        DAY,
        WEEK,
    )


def test_periods_are_sorted_deduplicated_and_checked() -> None:
    spec = ModelSpec("seasonal_naive", 60.0, 600.0, seasonality_periods=(WEEK, 3600.0, WEEK))
    assert spec.seasonality_periods == (3600.0, WEEK)
    assert make_forecaster(spec).period_seconds == 3600.0  # type: ignore[attr-defined]
    weekly = make_forecaster(
        ModelSpec(
            "seasonal_naive_weekly", 60.0, 600.0, seasonality_periods=spec.seasonality_periods
        )
    )
    assert weekly.period_seconds == WEEK  # type: ignore[attr-defined]
    for bad in [(), (0.0,), (-5.0,), (float("nan"),)]:
        with pytest.raises(ValueError, match="period"):
            ModelSpec("seasonal_naive", 60.0, 600.0, seasonality_periods=bad)
    with pytest.raises(ValueError, match="period_seconds"):
        SeasonalNaive(period_seconds=0.0)


def test_eligibility_follows_the_period() -> None:
    """A seasonal model takes part once the history covers its period (plus its level
    window), whatever that period is."""
    values = np.full(round(6 * 3600 / 60), 10.0)  # six hours of one-minute bins
    names = ("persistence", "seasonal_naive", "seasonal_naive_weekly")
    assert eligible_models(names, T0, values, 60.0) == ("persistence",)
    short = eligible_models(names, T0, values, 60.0, seasonality_periods=(FOUR_HOURS, 2 * DAY))
    assert short == ("persistence", "seasonal_naive")


def test_one_period_leaves_the_long_model_out_of_auto_selection() -> None:
    one = ForecastService(horizon_seconds=600, step_seconds=60, seasonality_periods=[FOUR_HOURS])
    assert "seasonal_naive_weekly" not in one.candidates
    assert "seasonal_naive" in one.candidates
    assert one.spec.seasonality_periods == (FOUR_HOURS,)
    two = ForecastService(horizon_seconds=600, step_seconds=60)
    assert "seasonal_naive_weekly" in two.candidates


def test_seasonal_naive_with_a_four_hour_period_predicts_the_cycle(
    seasonal: Callable[..., pd.Series],
) -> None:
    """Twelve hours of a 4-hour cycle: the forecast of the next 4 hours peaks an hour into
    the cycle (where the sine does) and follows its shape."""
    series = seasonal(days=0.5, step=60, period=FOUR_HOURS, seed=3)
    service = ForecastService(
        model="seasonal_naive",
        horizon_seconds=FOUR_HOURS,
        step_seconds=60,
        seasonality_periods=[FOUR_HOURS],
        calibrate=False,
    )
    now = T0 + 0.5 * DAY
    forecast = service.forecast(series, now)
    assert forecast.model == "seasonal_naive"
    assert forecast.status == "ok"
    assert _cycle_error(_peak_offset(forecast.points, 60, FOUR_HOURS), 3600, FOUR_HOURS) <= 900
    starts = np.array([p.t - 60 for p in forecast.points])
    truth = 100 * (1 + 0.3 * np.sin(2 * np.pi * (starts - T0) / FOUR_HOURS))
    means = np.array([p.mean for p in forecast.points])
    assert means == pytest.approx(truth, rel=0.1)
    # With the default periods the same history is too short for the seasonal model.
    default = ForecastService(model="seasonal_naive", horizon_seconds=FOUR_HOURS, step_seconds=60)
    assert default.forecast(series, now).status != "ok"


def test_auto_selection_picks_a_seasonal_model_on_a_short_cycle(
    seasonal: Callable[..., pd.Series],
) -> None:
    series = seasonal(days=1.0, step=60, period=FOUR_HOURS, amplitude=0.6, seed=5)
    cheap = ("persistence", "recent_mean", "recent_trend", "seasonal_naive")
    service = ForecastService(
        horizon_seconds=3600, step_seconds=60, seasonality_periods=[FOUR_HOURS], candidates=cheap
    )
    forecast = service.forecast(series, T0 + DAY)
    assert forecast.model == "seasonal_naive", forecast.detail


@pytest.mark.slow
def test_prophet_with_a_four_hour_period_predicts_the_cycle(
    seasonal: Callable[..., pd.Series],
) -> None:
    """Prophet fits a seasonality of any period: a day of a 4-hour cycle (six cycles) and
    the next 4 hours peak an hour into the cycle, on the curve's level."""
    series = seasonal(days=1.0, step=300, period=FOUR_HOURS, seed=2)
    model = ProphetForecaster(seasonality_periods=(FOUR_HOURS,)).fit(series)
    points = model.predict(FOUR_HOURS)
    assert _cycle_error(_peak_offset(points, 300, FOUR_HOURS), 3600, FOUR_HOURS) <= 900
    starts = np.array([p.t - 300 for p in points])
    truth = 100 * (1 + 0.3 * np.sin(2 * np.pi * (starts - T0) / FOUR_HOURS))
    assert np.array([p.mean for p in points]) == pytest.approx(truth, rel=0.08)
    # The default periods see no cycle in one day: a flat-ish curve, not this one.
    flat = ProphetForecaster().fit(series).predict(FOUR_HOURS)
    spread = np.ptp([p.mean for p in flat])
    assert spread < 0.3 * np.ptp(truth)
