"""Prophet: seasonality recovery, event-regressor lift, quiet logs (slower: real fits)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest

from prescaler_forecast import EventWindow, ForecastService, ProphetForecaster

pytestmark = pytest.mark.slow

DAY = 86_400.0
T0 = 1_704_067_200.0


def test_recovers_daily_period_and_level(
    seasonal: Callable[..., pd.Series], true_rate: Callable[..., np.ndarray]
) -> None:
    s = seasonal(days=4, step=300, seed=2)
    model = ProphetForecaster().fit(s)
    points = model.predict(DAY / 2)  # half a day ahead: peak and trough both in view
    starts = np.array([p.t - 300 for p in points])
    means = np.array([p.mean for p in points])
    assert means == pytest.approx(true_rate(starts), rel=0.06)
    # The peak lands at the right time of day (6 h after midnight for this sine).
    peak_hour = ((starts[np.argmax(means)] - T0) % DAY) / 3600
    assert abs(peak_hour - 6) <= 1


def _event_series() -> tuple[pd.Series, list[EventWindow], float]:
    """Hourly demand with a daily cycle and a 6-hour event every 7 days that doubles it."""
    step = 900.0
    t = T0 + np.arange(round(22 * DAY / step)) * step
    base = 100 * (1 + 0.3 * np.sin(2 * np.pi * (t - T0) / DAY))
    events = [
        EventWindow(T0 + d * DAY + 10 * 3600, T0 + d * DAY + 16 * 3600, "sale") for d in (6, 13, 20)
    ]
    lift = np.ones_like(t)
    for ev in events:
        lift[(t >= ev.start) & (t < ev.end)] = 2.0
    rate = np.random.default_rng(4).poisson(base * lift * step) / step
    return pd.Series(rate, index=pd.to_datetime(t, unit="s", utc=True)), events, step


def test_event_regressor_learns_the_lift_of_past_occurrences() -> None:
    series, events, step = _event_series()
    now = events[-1].start  # the third sale is about to start; the first two are history
    kwargs = {"horizon_seconds": 4 * 3600, "step_seconds": step, "model": "prophet"}
    with_events = ForecastService(events=events, **kwargs).forecast(series, now)
    without = ForecastService(**kwargs).forecast(series, now)
    lifted = np.mean([p.mean for p in with_events.points])
    plain = np.mean([p.mean for p in without.points])
    assert lifted / plain == pytest.approx(2.0, rel=0.2)
    actual = series[(series.index >= pd.Timestamp(now, unit="s", tz="UTC"))].iloc[:16].mean()
    assert lifted == pytest.approx(actual, rel=0.15)


def test_prophet_and_cmdstanpy_loggers_are_silenced(
    seasonal: Callable[..., pd.Series], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    ProphetForecaster().fit(seasonal(days=1, step=300)).predict(600)
    noisy = [r for r in caplog.records if r.name.split(".")[0] in {"prophet", "cmdstanpy"}]
    assert noisy == []
    # Only those loggers are off; everything else still logs.
    logging.getLogger("prescaler_forecast.test").info("still here")
    assert any(r.name == "prescaler_forecast.test" for r in caplog.records)
