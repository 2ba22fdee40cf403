"""The seasonal profile: the median of the same time over the last days (or weeks), scaled
by the level, with a band from the spread across the days; on series with known structure."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest

from prescaler_forecast import (
    ForecastService,
    InsufficientHistoryError,
    ModelSpec,
    SeasonalNaive,
    SeasonalProfile,
)
from prescaler_forecast._fitting import eligible_models, make_forecaster

DAY = 86_400.0
WEEK = 7 * DAY
FOUR_HOURS = 4 * 3600.0
T0 = 1_704_067_200.0  # 2024-01-01T00:00Z, a Monday
PER_DAY = 1440  # one-minute bins


def _series(values: np.ndarray, start: float, step: float = 60.0) -> pd.Series:
    t = start + step * np.arange(len(values))
    return pd.Series(values, index=pd.to_datetime(t, unit="s", utc=True))


def _means(points: tuple[object, ...]) -> np.ndarray:
    return np.array([p.mean for p in points])  # type: ignore[attr-defined]


def test_an_odd_day_yesterday_does_not_carry_into_today(
    seasonal: Callable[..., pd.Series], true_rate: Callable[..., np.ndarray]
) -> None:
    """Yesterday's next three hours ran at twice the usual demand (an incident, a launch):
    the seasonal naive forecasts twice the demand, the median of the last seven days the
    usual one."""
    s = seasonal(days=8, noise="none")
    s.iloc[-PER_DAY : -PER_DAY + 180] *= 2.0  # yesterday, from this time of day on
    points = SeasonalProfile().fit(s).predict(3 * 3600)
    starts = np.array([p.t - 60 for p in points])
    assert _means(points) == pytest.approx(true_rate(starts), rel=0.01)
    naive = _means(SeasonalNaive().fit(s).predict(3 * 3600))
    assert naive == pytest.approx(2.0 * true_rate(starts), rel=0.02)


@pytest.mark.parametrize(
    ("factor", "ratio"),
    [(1.5, 1.5), (0.6, 0.6), (10.0, 4.0), (0.01, 0.25)],
    ids=["above", "below", "clipped-high", "clipped-low"],
)
def test_the_profile_is_scaled_by_the_last_hours_level(
    seasonal: Callable[..., pd.Series],
    true_rate: Callable[..., np.ndarray],
    factor: float,
    ratio: float,
) -> None:
    s = seasonal(days=8, noise="none")
    s.iloc[-120:] *= factor  # the last two hours run at this multiple of the usual
    model = SeasonalProfile().fit(s)
    assert model.level_ratio == pytest.approx(ratio, rel=1e-3)
    points = model.predict(1800)
    starts = np.array([p.t - 60 for p in points])
    assert _means(points) == pytest.approx(ratio * true_rate(starts), rel=0.01)


def test_a_burst_inside_the_level_window_does_not_scale_the_day(
    seasonal: Callable[..., pd.Series],
) -> None:
    s = seasonal(days=8, noise="none")
    s.iloc[-15:-5] *= 4.0  # a 10-minute burst that ended five minutes ago
    assert SeasonalProfile().fit(s).level_ratio == pytest.approx(1.0, abs=0.02)


def _weekly(days: int, end: float) -> pd.Series:
    """Demand with a daily cycle, at 100 on weekdays and 40 on weekends."""
    t = end - 60 * np.arange(days * PER_DAY, 0, -1)
    weekend = ((t - T0) // DAY) % 7 >= 5
    rate = np.where(weekend, 40.0, 100.0) * (1 + 0.3 * np.sin(2 * np.pi * (t - T0) / DAY))
    return _series(rate, t[0])


SATURDAY = T0 + 5 * DAY


@pytest.mark.parametrize(
    ("days", "long_period", "weekly"),
    [(28, WEEK, True), (21, WEEK, True), (20, WEEK, False), (28, None, False)],
    ids=["four-weeks", "three-weeks", "short-of-three-weeks", "no-weekly-period"],
)
def test_the_same_weekday_once_the_history_covers_three_weeks(
    days: int, long_period: float | None, weekly: bool
) -> None:
    """On a Friday night the next hours are a Saturday's: the weekly profile knows it, the
    daily one (the median of the last seven days: five weekdays, two weekend days) does
    not."""
    model = SeasonalProfile(long_period_seconds=long_period).fit(_weekly(days, SATURDAY))
    points = model.predict(6 * 3600)
    starts = np.array([p.t - 60 for p in points])
    shape = 1 + 0.3 * np.sin(2 * np.pi * (starts - T0) / DAY)
    if weekly:
        assert model.profile_period_seconds == WEEK
        assert model.profile_periods == min(4, days // 7)
        assert _means(points) == pytest.approx(40.0 * shape, rel=0.01)
    else:
        assert model.profile_period_seconds == DAY
        assert model.profile_periods == 7
        assert _means(points) == pytest.approx(100.0 * shape, rel=0.01)


def test_the_band_widens_with_the_day_to_day_spread(seasonal: Callable[..., pd.Series]) -> None:
    """Seven days alike give a band as wide as the noise; seven days whose level varies by
    ±20-30 % give one about as wide as that."""
    calm = seasonal(days=8, seed=1)
    spread = calm.copy()
    factors = np.repeat([0.7, 1.25, 1.0, 0.8, 1.3, 1.1, 0.9, 1.0], PER_DAY)
    spread[:] = spread.to_numpy() * factors
    narrow = SeasonalProfile().fit(calm).predict(3600, quantile=0.9)
    wide = SeasonalProfile().fit(spread).predict(3600, quantile=0.9)
    for p in narrow:
        assert 1.0 <= p.upper / p.mean < 1.05
        assert 0.95 < p.lower / p.mean <= 1.0
    for p in wide:
        assert 1.15 < p.upper / p.mean < 1.45
        assert 0.6 < p.lower / p.mean < 0.9


def test_the_band_follows_the_level(seasonal: Callable[..., pd.Series]) -> None:
    """The band is relative: twice the level, twice the band."""
    s = seasonal(days=8, seed=2)
    s[:] = s.to_numpy() * np.repeat([0.7, 1.25, 1.0, 0.8, 1.3, 1.1, 0.9, 1.0], PER_DAY)
    base = SeasonalProfile().fit(s).predict(1800)
    s.iloc[-120:] *= 2.0
    doubled = SeasonalProfile().fit(s).predict(1800)
    for a, b in zip(base, doubled, strict=True):
        assert b.mean == pytest.approx(2 * a.mean, rel=0.05)
        assert b.upper / b.mean == pytest.approx(a.upper / a.mean, rel=1e-6)


def test_two_periods_of_history_are_needed(seasonal: Callable[..., pd.Series]) -> None:
    with pytest.raises(InsufficientHistoryError, match="seasonal_profile needs 48 h"):
        SeasonalProfile().fit(seasonal(days=1.9))
    model = SeasonalProfile().fit(seasonal(days=2))
    assert model.profile_periods == 2
    with pytest.raises(InsufficientHistoryError):
        SeasonalProfile(period_seconds=FOUR_HOURS).fit(seasonal(days=7 / 24))
    assert SeasonalProfile(period_seconds=FOUR_HOURS).fit(seasonal(days=8 / 24)).fitted
    values = np.full(round(1.5 * DAY / 60), 10.0)
    assert "seasonal_profile" not in eligible_models(("seasonal_profile",), T0, values, 60.0)
    values = np.full(round(2 * DAY / 60), 10.0)
    assert eligible_models(("seasonal_profile",), T0, values, 60.0) == ("seasonal_profile",)


def test_the_configured_periods_are_followed() -> None:
    default = make_forecaster(ModelSpec("seasonal_profile", 60.0, 600.0))
    assert isinstance(default, SeasonalProfile)
    assert (default.period_seconds, default.long_period_seconds) == (DAY, WEEK)
    three = ModelSpec(
        "seasonal_profile", 60.0, 600.0, seasonality_periods=(2 * DAY, FOUR_HOURS, DAY)
    )
    model = make_forecaster(three)
    assert isinstance(model, SeasonalProfile)
    assert (model.period_seconds, model.long_period_seconds) == (FOUR_HOURS, 2 * DAY)
    one = make_forecaster(
        ModelSpec("seasonal_profile", 60.0, 600.0, seasonality_periods=(FOUR_HOURS,))
    )
    assert isinstance(one, SeasonalProfile)
    assert (one.period_seconds, one.long_period_seconds) == (FOUR_HOURS, None)


def test_a_four_hour_cycle_is_forecast_as_one(seasonal: Callable[..., pd.Series]) -> None:
    """Twelve hours of a 4-hour cycle, a period given to the service: the profile of the
    last three cycles is the cycle; with the default periods the history is too short."""
    series = seasonal(days=0.5, period=FOUR_HOURS, seed=3)
    now = T0 + 0.5 * DAY
    service = ForecastService(
        model="seasonal_profile",
        horizon_seconds=FOUR_HOURS,
        step_seconds=60,
        seasonality_periods=[FOUR_HOURS],
        calibrate=False,
    )
    forecast = service.forecast(series, now)
    assert (forecast.model, forecast.status) == ("seasonal_profile", "ok")
    starts = np.array([p.t - 60 for p in forecast.points])
    truth = 100 * (1 + 0.3 * np.sin(2 * np.pi * (starts - T0) / FOUR_HOURS))
    assert _means(forecast.points) == pytest.approx(truth, rel=0.05)
    default = ForecastService(model="seasonal_profile", horizon_seconds=3600, step_seconds=60)
    assert default.forecast(series, now).status == "insufficient_history"


def test_auto_selection_takes_it_where_days_have_incidents() -> None:
    """Every day has a 3-hour incident at double demand, each at another time of day: the
    seasonal naive repeats yesterday's incident today, the profile's median does not, and
    auto-selection (where the profile is a candidate with one period or two) sees it."""
    assert "seasonal_profile" in ForecastService(horizon_seconds=600, step_seconds=60).candidates
    one = ForecastService(horizon_seconds=600, step_seconds=60, seasonality_periods=[DAY])
    assert "seasonal_profile" in one.candidates
    days = 6
    t = T0 + 60 * np.arange(days * PER_DAY)
    rate = 100 * (1 + 0.5 * np.sin(2 * np.pi * (t - T0) / DAY))
    rng = np.random.default_rng(4)
    for day, hour in enumerate(rng.permutation(np.arange(2, 22, 3))[:days]):
        first = day * PER_DAY + hour * 60
        rate[first : first + 180] *= 2.0
    counts = rng.poisson(rate * 60) / 60.0
    service = ForecastService(
        horizon_seconds=1800,
        step_seconds=60,
        candidates=("seasonal_naive", "seasonal_profile"),
    )
    forecast = service.forecast(_series(counts, T0), T0 + days * DAY)
    assert forecast.model == "seasonal_profile", forecast.detail
    assert service.selection is not None
    assert service.selection.scores["seasonal_profile"] < service.selection.scores["seasonal_naive"]
