"""The HPA led by the forecast (``spec.policy: leading``): the forecast at the HPA's target,
and its replay beside the forecast planner on the same forecasts, made once."""

from __future__ import annotations

import pandas as pd

from prescaler.backtest._policies import SharedForecasts
from prescaler.planning import leading_replicas
from unit.fake_forecasts import Forecast, Point

RATE = 1.0  # requests/s per replica


def test_the_forecast_at_the_hpas_target() -> None:
    assert leading_replicas(3.5, RATE, 0.7) == 5
    assert leading_replicas(3.5, RATE, 0.5) == 7
    assert leading_replicas(0.0, RATE, 0.7) == 0
    assert leading_replicas(float("nan"), RATE, 0.7) == 0
    assert leading_replicas(3.5, 0.0, 0.7) == 0


class Counting:
    """A forecaster that counts what it is asked."""

    def __init__(self) -> None:
        self.asked: list[float] = []

    def forecast(self, history: pd.Series, now: float) -> Forecast:
        self.asked.append(now)
        return Forecast((Point(now + 60, float(len(self.asked)), 1.0),), now)


def test_runs_on_the_same_demand_share_one_forecast_per_time() -> None:
    inner = Counting()
    shared = SharedForecasts(inner)
    history = pd.Series([1.0, 2.0])
    first = [shared.forecast(history, t) for t in (60.0, 120.0)]
    second = [shared.forecast(history, t) for t in (60.0, 120.0, 180.0)]
    assert inner.asked == [60.0, 120.0, 180.0]
    assert second[:2] == first
    assert shared.held == 1  # 60 and 120 let go once both runs had them; 180 awaits one


def test_a_forecast_every_run_has_had_is_let_go() -> None:
    inner = Counting()
    shared = SharedForecasts(inner, runs=3)
    history = pd.Series([1.0, 2.0])
    for _ in range(3):
        shared.forecast(history, 60.0)
    assert shared.held == 0
    assert inner.asked == [60.0]
    shared.forecast(history, 60.0)  # a fourth asks again: made anew, not kept forever
    assert inner.asked == [60.0, 60.0]
