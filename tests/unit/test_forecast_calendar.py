"""Prophet's event regressors follow the calendar.

A series' forecaster is built once, when its first pool attaches. Its scheduled windows'
occurrences are asked for again by every fit, over that fit's own history and horizon, so a
cron occurrence that starts after the series was built counts without a restart.

The hub is the real ``ForecastHub`` with the real forecaster (``model: prophet``); the
Prometheus source is a fake serving a level of 10 req/s, tripled inside each occurrence of
a cron window (every 6 hours, 30 minutes long).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, cast

import numpy as np
import pandas as pd
import pytest

from prescaler.api import ForecastSpec
from prescaler.controller.forecast import ForecastHub
from prescaler.controller.model import ForecastResult
from prescaler.metrics import Metrics
from prescaler.planning import ScheduledWindow, event_windows
from prescaler.planning._windows import MAX_EVENTS
from prescaler.sources import PrometheusSource

HOUR = 3600.0
STEP = 60.0
MIDNIGHT = 1_749_945_600.0  # 2025-06-15 00:00 UTC
FIRST = MIDNIGHT - 36 * HOUR  # the history starts here: too short for a daily seasonality
LEVEL, LIFT = 10.0, 3.0
BATCH = ScheduledWindow(
    "nightly-batch", cron="0 */6 * * *", duration_seconds=1800, expected_requests_per_second=30
)
BUILT = MIDNIGHT + HOUR  # the series is built at 01:00, its horizon ends at 01:30
OCCURRENCE = MIDNIGHT + 6 * HOUR  # 06:00-06:30: not within the first build's range
LATER = OCCURRENCE - 600  # a forecast at 05:50 reaches it


class CalendarSource:
    """The level, tripled inside the window's occurrences (UTC, every 6 h, 30 min)."""

    def history(self, start: float, end: float, step: float) -> pd.Series:
        t = np.arange(np.ceil(max(start, FIRST) / step) * step, end - step + 1, step)
        inside = (t % (6 * HOUR)) < 1800
        rate = np.where(inside, LEVEL * LIFT, LEVEL)
        return pd.Series(rate, index=pd.to_datetime(t, unit="s", utc=True))


class Inline(Executor):
    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_result(fn(*args, **kwargs))
        return future


def spec() -> ForecastSpec:
    return ForecastSpec.model_validate(
        {
            "prometheus": {"url": "http://prometheus:9090"},
            "model": "prophet",
            "stepSeconds": 60,
            "horizonSeconds": 1800,
            "refitSeconds": 600,
            "lookbackSeconds": 7 * 24 * 3600,
        }
    )


async def forecast_at(hub: ForecastHub, clock: list[float], now: float) -> ForecastResult:
    """The pool's forecast at ``now`` once the fit it asked for is done."""
    clock[0] = now
    source = cast(PrometheusSource, CalendarSource())
    await hub.get("pool", spec(), [BATCH], source, "series", now)
    for _ in range(200_000):  # loop turns, a generous bound
        if hub._fits.running == 0 and hub._fits.pending == 0:
            break
        await asyncio.sleep(0)
    result: ForecastResult = await hub.get("pool", spec(), [BATCH], source, "series", now)
    return result


@pytest.mark.slow  # real Prophet fits
def test_a_cron_occurrence_after_the_first_build_is_in_a_later_forecast() -> None:
    async def scenario() -> tuple[ForecastResult, ForecastResult]:
        clock = [BUILT]
        hub = ForecastHub(
            metrics=Metrics(),
            executor=Inline(),
            io_executor=Inline(),
            first_fit_spread_seconds=0.0,
            clock=lambda: clock[0],
        )
        try:
            first = await forecast_at(hub, clock, BUILT)
            later = await forecast_at(hub, clock, LATER)
        finally:
            hub.close()
        return first, later

    first, later = asyncio.run(scenario())
    assert first.forecast is not None, first
    assert first.forecast.model == "prophet", first
    assert later.forecast is not None, later
    assert later.forecast.model == "prophet", later
    assert later.forecast.generated_at > OCCURRENCE - HOUR  # fitted again, at 05:50
    before = [p.mean for p in later.forecast.points if p.t <= OCCURRENCE]
    during = [p.mean for p in later.forecast.points if OCCURRENCE + STEP < p.t <= OCCURRENCE + 1800]
    assert before
    assert during
    # The fit learned the lift from the past occurrences and applies it to this one.
    assert max(before) < 1.5 * LEVEL, before
    assert min(during) > 2 * LEVEL, during


def test_the_newest_occurrences_are_kept_when_a_window_has_too_many() -> None:
    """Past MAX_EVENTS occurrences, the oldest of the most frequent window are dropped,
    never the coming ones."""
    window = ScheduledWindow("hourly", cron="0 * * * *", duration_seconds=60, min_replicas=1)
    since, until = MIDNIGHT - 10 * 24 * HOUR, MIDNIGHT + HOUR
    events = event_windows([window, BATCH], since, until)
    assert len(events) == MAX_EVENTS
    hourly = [e.start for e in events if e.name == "hourly"]
    # The newest ones, up to the coming hour's (pre-warmed 10 minutes ahead of `until`).
    listed = [o.start for o in window.occurrences(since, until)]
    assert len(listed) > len(hourly)
    assert hourly == listed[len(listed) - len(hourly) :]
    assert max(hourly) == MIDNIGHT + HOUR
    # A rarer window keeps all its occurrences: the frequent one does not crowd it out.
    batches = [e.start for e in events if e.name == "nightly_batch"]
    assert batches == [o.start for o in BATCH.occurrences(since, until)]
    assert [e.start for e in events] == sorted(e.start for e in events)
