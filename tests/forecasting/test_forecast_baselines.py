"""Cheap models and the Forecaster interface, on synthetic series with known structure."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest

from prescaler_forecast import (
    InsufficientHistoryError,
    Persistence,
    RecentMean,
    RecentTrend,
    SeasonalNaive,
    SeasonalNaiveWeekly,
    origins_between,
    rolling_origin,
    series_to_grid,
)
from prescaler_forecast._fitting import ModelRunner, ModelSpec

DAY = 86_400.0


def test_seasonal_naive_recovers_period_and_level(
    seasonal: Callable[..., pd.Series], true_rate: Callable[..., np.ndarray]
) -> None:
    s = seasonal(days=3, noise="none")
    model = SeasonalNaive().fit(s)
    points = model.predict(3600)
    assert len(points) == 60
    starts = np.array([p.t - 60 for p in points])
    assert [p.mean for p in points] == pytest.approx(true_rate(starts), rel=0.01)


def test_seasonal_naive_scales_by_recent_level(seasonal: Callable[..., pd.Series]) -> None:
    s = seasonal(days=3, noise="none")
    s.iloc[-120:] *= 1.5  # the last two hours run 50 % above yesterday
    model = SeasonalNaive().fit(s)
    per_day = int(DAY // 60)
    yesterday = s.iloc[-per_day : -per_day + 10].to_numpy()
    assert [p.mean for p in model.predict(600)] == pytest.approx(1.5 * yesterday, rel=0.02)


def test_weekly_needs_a_week_of_history(seasonal: Callable[..., pd.Series]) -> None:
    with pytest.raises(InsufficientHistoryError, match="seasonal_naive_weekly"):
        SeasonalNaiveWeekly().fit(seasonal(days=5))
    assert SeasonalNaiveWeekly().fit(seasonal(days=8)).fitted


def test_recent_trend_follows_a_line_and_ignores_an_outlier() -> None:
    t = pd.to_datetime(1_704_067_200 + 60 * np.arange(30), unit="s", utc=True)
    y = 50 + 2.0 * np.arange(30) + np.random.default_rng(0).normal(0, 0.5, 30)
    y[-3] = 500.0  # one wild sample must not bend a robust fit
    model = RecentTrend(slope_weight=1.0).fit(pd.Series(y, index=t))
    assert [p.mean for p in model.predict(180)] == pytest.approx([110, 112, 114], abs=1.0)


def test_recent_trend_clips_negative_forecasts() -> None:
    t = pd.to_datetime(1_704_067_200 + 60 * np.arange(10), unit="s", utc=True)
    model = RecentTrend(slope_weight=1.0).fit(pd.Series(20 - 2.0 * np.arange(10), index=t))
    points = model.predict(1200)
    assert points[-1].mean == 0.0
    assert all(p.lower >= 0 and p.upper >= p.mean for p in points)


def test_short_history_raises_insufficient_history() -> None:
    t = pd.to_datetime([1_704_067_200, 1_704_067_260], unit="s", utc=True)
    with pytest.raises(InsufficientHistoryError):
        RecentTrend().fit(pd.Series([1.0, 2.0], index=t))


def test_predict_at_a_multiple_of_the_step_averages(seasonal: Callable[..., pd.Series]) -> None:
    model = SeasonalNaive().fit(seasonal(days=3, noise="none"))
    fine = model.predict(600)
    coarse = model.predict(600, step_seconds=300)
    assert len(coarse) == 2
    assert coarse[0].mean == pytest.approx(np.mean([p.mean for p in fine[:5]]))
    assert coarse[1].t == fine[-1].t
    with pytest.raises(ValueError, match="multiple"):
        model.predict(600, step_seconds=90)


@pytest.mark.parametrize("name", ["seasonal_naive", "recent_trend"])
def test_interval_covers_truth_at_roughly_the_stated_rate(
    seasonal: Callable[..., pd.Series], name: str
) -> None:
    # Poisson noise at 100 rps on 60 s bins, 10-minute horizon, 90 % upper quantile.
    s = seasonal(days=4, seed=3)
    start, grid = series_to_grid(s, 60)
    runner = ModelRunner(ModelSpec(name, 60, 600, quantile=0.9), refit_seconds=60)
    origins = origins_between(start + 3 * DAY, start + 4 * DAY - 600, 60, 200)
    result = rolling_origin(lambda a, b, c: runner.forecast(a, b, c), start, grid, 60, origins)
    assert result.pairs > 1500
    assert 0.8 <= result.coverage <= 0.98


def test_persistence_is_the_last_value_and_recent_mean_the_last_ten_minutes(
    seasonal: Callable[..., pd.Series],
) -> None:
    s = seasonal(days=1, noise="poisson")
    last = Persistence().fit(s).predict(300)
    assert [p.mean for p in last] == pytest.approx([float(s.iloc[-1])] * 5)
    mean = RecentMean().fit(s).predict(300)
    assert [p.mean for p in mean] == pytest.approx([float(s.iloc[-10:].mean())] * 5)


def test_persistence_band_is_its_own_errors_and_widens_with_the_lead(
    seasonal: Callable[..., pd.Series],
) -> None:
    # A random walk: the spread of y[t + k] / y[t] grows like sqrt(k).
    rng = np.random.default_rng(3)
    s = seasonal(days=2, noise="none")
    s[:] = 100.0 * np.exp(np.cumsum(rng.normal(0.0, 0.02, len(s))))
    points = Persistence().fit(s).predict(1800, quantile=0.9)
    first, last = points[0], points[-1]
    assert first.upper / first.mean > 1.01
    assert np.log(last.upper / last.mean) > 3 * np.log(first.upper / first.mean)
    # Calibrated: over the history, about 90 % of 30-minute-ahead values lie under the band.
    y = s.to_numpy()
    ratio = last.upper / last.mean
    covered = np.mean(y[30:] <= y[:-30] * ratio)
    assert 0.85 <= covered <= 0.95


def test_persistence_rides_out_a_gap_at_the_end(seasonal: Callable[..., pd.Series]) -> None:
    s = seasonal(days=1, noise="none")
    s.iloc[-3:] = np.nan
    points = RecentMean().fit(s).predict(120)
    assert points[0].mean == pytest.approx(float(s.iloc[-10:-3].mean()), rel=1e-6)
