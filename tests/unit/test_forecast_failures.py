"""The forecaster fails: a model that raises, answers NaN, or hangs, and pathological
series. A fallback takes over, ``ForecastHealthy=False`` says why, and other series are
unaffected.

The failing models are real model subclasses handed to a real ``ForecastService``
(``models=``); the hub is the real ``ForecastHub`` with a real thread pool.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import numpy as np
import pandas as pd
import pytest

from prescaler.api import ForecastSpec
from prescaler.controller.forecast import ForecastHub
from prescaler.controller.model import ForecastResult
from prescaler.metrics import Metrics
from prescaler.sources import PrometheusSource
from prescaler_forecast import (
    MODEL_NAMES,
    STATUS_MODEL_FAILED,
    STATUS_OK,
    EventWindow,
    Forecaster,
    ForecastService,
    RecentMean,
)

DAY = 86_400.0
STEP = 60.0
NOW = 1_750_000_020.0  # on the step grid
LEVEL = 10.0


class Exploding(RecentMean):
    """Raises on every fit, as a broken model or library would."""

    def _fit(self) -> None:
        raise RuntimeError("injected failure")


class AnswersNaN(RecentMean):
    """Fits, then answers NaN demand."""

    def _mean(self, leads: Any) -> Any:
        return np.full(len(leads), math.nan)


class Hanging(RecentMean):
    """Blocks in its fit until ``release`` is set (a model that never returns)."""

    release = threading.Event()

    def _fit(self) -> None:
        self.release.wait(60)
        super()._fit()


def steady(start: float = NOW - 2 * DAY, end: float = NOW) -> pd.Series:
    t = np.arange(start, end, STEP)
    return pd.Series(np.full(len(t), LEVEL), index=pd.to_datetime(t, unit="s", utc=True))


FAILURES: dict[str, Callable[[], Forecaster]] = {
    "raises": Exploding,
    "answers_nan": AnswersNaN,
}


@pytest.mark.parametrize("failure", FAILURES.keys())
def test_a_failing_fixed_model_falls_back_to_the_last_level(failure: str) -> None:
    service = ForecastService(
        model="recent_mean",
        horizon_seconds=1800,
        step_seconds=STEP,
        models={"recent_mean": FAILURES[failure]},
    )
    forecast = service.forecast(steady(), NOW)
    assert forecast.status == STATUS_MODEL_FAILED
    assert forecast.model == "fallback"
    assert "recent_mean failed" in forecast.detail
    # The last level, never zero: a failed model is no reason to release the fleet.
    assert all(math.isclose(p.mean, LEVEL) for p in forecast.points)
    assert forecast.peak_upper() >= LEVEL
    cached = service.forecast_cached(steady(), NOW)
    assert cached.status == STATUS_MODEL_FAILED


@pytest.mark.parametrize("failure", FAILURES.keys())
def test_another_candidate_takes_over_from_a_failing_one(failure: str) -> None:
    service = ForecastService(
        model="auto",
        horizon_seconds=1800,
        step_seconds=STEP,
        candidates=("recent_mean", "persistence"),
        models={"recent_mean": FAILURES[failure]},
    )
    forecast = service.forecast_cached(steady(), NOW)
    assert forecast.status == STATUS_MODEL_FAILED
    assert forecast.model == "persistence"
    assert "recent_mean failed" in forecast.detail
    assert "persistence took over" in forecast.detail
    assert all(math.isclose(p.mean, LEVEL) for p in forecast.points)


def pathological(kind: str) -> pd.Series:
    """Three days of LEVEL, made pathological."""
    t = np.arange(NOW - 3 * DAY, NOW, STEP)
    y = np.full(len(t), LEVEL)
    if kind == "all_zero":
        y[:] = 0.0
    elif kind == "one_huge_spike":
        y[-180] = 1e9  # three hours ago: outside today's and yesterday's horizon
    elif kind == "nan_runs":
        y[-30:] = math.nan  # the newest half hour
        y[-600:-480] = math.nan  # two hours, earlier today
        yesterday = len(t) - int(DAY / STEP)
        y[yesterday - 60 : yesterday + 120] = math.nan  # yesterday around this time
    return pd.Series(y, index=pd.to_datetime(t, unit="s", utc=True))


SERIES = ["constant", "all_zero", "one_huge_spike", "nan_runs"]
CHEAP_MODELS = [
    "persistence",
    "recent_mean",
    "recent_trend",
    "seasonal_naive",
    "seasonal_naive_weekly",
    "seasonal_profile",
]


def test_the_pathological_cases_cover_every_cheap_model() -> None:
    assert set(CHEAP_MODELS) == set(MODEL_NAMES) - {"prophet"}


@pytest.mark.parametrize("kind", SERIES)
@pytest.mark.parametrize("model", CHEAP_MODELS)
def test_pathological_series_give_finite_forecasts_never_zero_for_missing_data(
    kind: str, model: str
) -> None:
    service = ForecastService(model=model, horizon_seconds=1800, step_seconds=STEP)
    forecast = service.forecast(pathological(kind), NOW)
    assert forecast.points
    assert all(math.isfinite(p.upper) and p.upper >= p.mean >= 0 for p in forecast.points)
    means = [p.mean for p in forecast.points]
    if kind == "all_zero":
        assert max(means) == 0.0
    else:
        # A gap is not zero demand; a spike three hours ago is not the next half hour.
        assert min(means) == pytest.approx(LEVEL, rel=0.05), forecast
        assert forecast.peak_upper() < 100 * LEVEL, forecast


@pytest.mark.parametrize("model", CHEAP_MODELS)
def test_a_history_that_ends_steps_before_now_forecasts_from_its_end(model: str) -> None:
    """A source that delivers late (a rate window read centred lags by half its width):
    the data end five steps before now. Found by the Prometheus fault tests: every cheap
    model raised "the fitted curve does not cover this forecast", and the pool planned on
    the last-level fallback at 1.5x."""
    service = ForecastService(model=model, horizon_seconds=300, step_seconds=15)
    history = steady(NOW - 8 * DAY, NOW - 5 * 15).resample("15s").ffill()
    forecast = service.forecast(history, NOW)
    assert forecast.status == STATUS_OK, forecast.detail
    assert forecast.model == model
    assert min(p.mean for p in forecast.points) == pytest.approx(LEVEL)


# ---------------------------------------------------------------------- the hub
class Source:
    """A steady history, whatever the range asked for."""

    def history(self, start: float, end: float, step: float) -> pd.Series:
        return steady(max(start, NOW - 2 * DAY), end - step + 1)


def spec(model: str) -> ForecastSpec:
    return ForecastSpec.model_validate(
        {"prometheus": {"url": "http://prometheus:9090"}, "horizonSeconds": 1800, "model": model}
    )


def failing_service(model: Callable[[], Forecaster]) -> Any:
    def make(s: ForecastSpec, events: Sequence[EventWindow]) -> ForecastService:
        models = {"recent_mean": model} if s.model == "recent_mean" else {}
        return ForecastService(
            model=s.model, horizon_seconds=s.horizon_seconds, step_seconds=s.step_seconds,
            models=models,
        )  # fmt: skip

    return make


def run_hub(model: Callable[[], Forecaster], scenario: Callable[..., Any]) -> None:
    """``scenario(hub, get)`` with the bad model on spec model ``recent_mean``; a healthy
    ``persistence`` series beside it."""
    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="test-forecast")
    hub = ForecastHub(
        metrics=Metrics(),
        executor=None,
        io_executor=pool,
        wait_seconds=5.0,
        model_timeout_seconds=0.5,
        first_fit_spread_seconds=0.0,
        make_service=failing_service(model),
    )

    async def get(uid: str, model_name: str, now: float) -> ForecastResult:
        source = cast(PrometheusSource, Source())
        return await hub.get(uid, spec(model_name), (), source, f"series-{uid}", now)

    try:
        asyncio.run(scenario(hub, get))
    finally:
        Hanging.release.set()
        hub.close()
        pool.shutdown(wait=True)


@pytest.mark.parametrize("failure", FAILURES.keys())
def test_the_hub_reports_a_failed_model_and_plans_with_the_fallback(failure: str) -> None:
    async def scenario(hub: ForecastHub, get: Any) -> None:
        bad = await get("bad", "recent_mean", NOW)
        good = await get("good", "persistence", NOW)
        assert (bad.healthy, bad.reason) == (False, "ModelFailed")
        assert "recent_mean failed" in bad.message
        assert bad.forecast is not None  # the fallback takes over
        assert bad.forecast.model == "fallback"
        assert min(p.mean for p in bad.forecast.points) == pytest.approx(LEVEL)
        assert (good.healthy, good.reason) == (True, "Fresh")
        assert good.forecast is not None
        assert good.forecast.status == STATUS_OK

    run_hub(FAILURES[failure], scenario)


def test_a_hanging_model_times_out_without_holding_the_loop_and_recovers() -> None:
    Hanging.release.clear()

    async def scenario(hub: ForecastHub, get: Any) -> None:
        ticks = 0

        async def tick() -> None:  # the event loop keeps turning meanwhile
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.create_task(tick())
        slow = await get("slow", "recent_mean", NOW)
        assert (slow.healthy, slow.reason) == (False, "ForecastTimeout")
        assert "did not answer within 0.5s" in slow.message
        assert slow.forecast is not None
        assert min(p.mean for p in slow.forecast.points) == pytest.approx(LEVEL)
        assert ticks > 10, "the loop was held while the model hung"
        # The hung call is not started again while it runs; other series are unaffected.
        again = await get("slow", "recent_mean", NOW + STEP)
        assert again.reason == "ForecastTimeout"
        assert "has not returned" in again.message
        good = await get("good", "persistence", NOW + STEP)
        assert (good.healthy, good.reason) == (True, "Fresh")
        # The model returns: the next refresh is healthy again.
        Hanging.release.set()
        for _ in range(3000):  # until the hung call has returned (a generous bound)
            if all(s.computing is None or s.computing.done() for s in hub._series.values()):
                break
            await asyncio.sleep(0.01)
        recovered = await get("slow", "recent_mean", NOW + 2 * STEP)
        assert (recovered.healthy, recovered.reason) == (True, "Fresh"), recovered
        ticker.cancel()

    run_hub(Hanging, scenario)
