"""Demand history read from a real Prometheus lands on the forecasting grid at its true time.

Prometheus stamps ``rate(x[W])`` at the END of its window; the forecasting grid reads a
sample as the interval that STARTS at its stamp. The history is a backfilled daily step
from LOW to HIGH req/s (scrapes every 15 s, not aligned with the minute, as real ones),
read through :class:`PrometheusSource` and the grid exactly as the operator reads it.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pandas as pd
import pytest

from cluster.prometheus import Prometheus, vllm_samples
from prescaler.settings import ReconcileSettings
from prescaler.sources import PrometheusSource, render_queries
from prescaler_forecast import STATUS_OK, ForecastService
from prescaler_forecast._hygiene import series_to_grid

pytestmark = [pytest.mark.prometheus]

DAY = 86_400
STEP = 60.0
LOW, HIGH = 2.0, 20.0
HIGH_FOR = 6 * 3600
SCRAPE, OFFSET = 15.0, 7.0
NAMESPACE = "serving"
QUERY = f'sum(rate(vllm:request_success_total{{namespace="{NAMESPACE}"}}[60s]))'


def backfill_daily_step(prometheus: Prometheus, step_at: float, end: float) -> None:
    """LOW req/s, except HIGH for six hours from ``step_at``'s time of day; three days up
    to ``end``."""
    start = step_at - 3 * DAY - 3600
    times = [start + OFFSET + SCRAPE * i for i in range(int((end - start) // SCRAPE))]
    rates = [HIGH if (t - step_at) % DAY < HIGH_FOR else LOW for t in times]
    prometheus.backfill(vllm_samples(times, rates, namespace=NAMESPACE, model_name="llm"))


def operator_source(prometheus: Prometheus) -> PrometheusSource:
    """The source the operator builds for a vLLM pool, at its default rate window."""
    queries = render_queries(
        "vllm", selector=f'namespace="{NAMESPACE}"', window=ReconcileSettings().rate_window
    )
    return PrometheusSource(prometheus.url, queries)


@pytest.fixture
def step_at(prometheus: Prometheus) -> float:
    """Today's step time, two hours ago on the minute (also yesterday's and the day before)."""
    now = time.time()
    at = math.floor((now - 2 * 3600) / STEP) * STEP
    backfill_daily_step(prometheus, at, now)
    return at


def bin_value(start: float, values: np.ndarray, t: float) -> float:
    i = round((t - start) / STEP)
    assert 0 <= i < len(values), f"no bin at {t} in a grid from {start}"
    return float(values[i])


def test_prometheus_stamps_a_rate_at_the_end_of_its_window(
    prometheus: Prometheus, step_at: float
) -> None:
    """What the adapter corrects: the value stamped at the step reads the minute before it."""
    answer = prometheus.query_range(QUERY, step_at - STEP, step_at + STEP, STEP)
    (series,) = answer["result"]
    values = {float(ts): float(v) for ts, v in series["values"]}
    assert values[step_at] == pytest.approx(LOW)
    assert values[step_at + STEP] == pytest.approx(HIGH)


def test_history_reads_each_step_at_its_true_time(prometheus: Prometheus, step_at: float) -> None:
    source = operator_source(prometheus)
    try:
        now = time.time()
        history = source.history(now - 3 * DAY, now, STEP)
    finally:
        source.close()
    start, values = series_to_grid(history, STEP, before=now)
    assert start % STEP == 0
    # Every fully observed minute is there, up to the one that ended last before `now`.
    assert start + len(values) * STEP == math.floor(now / STEP) * STEP
    assert np.isfinite(values).all()
    for day in (2, 1, 0):
        at = step_at - day * DAY
        before = [bin_value(start, values, at - k * STEP) for k in range(10, 0, -1)]
        after = [bin_value(start, values, at + k * STEP) for k in range(10)]
        # The bin that starts at the step, and each after it, reads HIGH; the one before, LOW.
        assert before == pytest.approx([LOW] * 10, rel=1e-6), (day, before)
        assert after == pytest.approx([HIGH] * 10, rel=1e-6), (day, after)
        end = at + HIGH_FOR  # and back down at the end (today's is still to come)
        if end + STEP <= now:
            assert bin_value(start, values, end - STEP) == pytest.approx(HIGH, rel=1e-6)
            assert bin_value(start, values, end) == pytest.approx(LOW, rel=1e-6)


def fetch_like_the_operator(
    source: PrometheusSource, nows: list[float], lookback: float, step: float
) -> pd.Series:
    """The forecast hub's history: the whole lookback once, then from its last stamp
    minus five steps, joined (newest wins) and cut to the lookback."""
    history: pd.Series | None = None
    for now in nows:
        start = now - lookback if history is None else history.index[-1].timestamp() - 5 * step
        fresh = source.history(start, now, step)
        joined = fresh if history is None else pd.concat([history, fresh])
        joined = joined[~joined.index.duplicated(keep="last")].sort_index()
        history = joined[joined.index >= pd.Timestamp(now - lookback, unit="s", tz="UTC")]
    assert history is not None
    return history


def test_the_operator_forecast_rises_at_the_step(prometheus: Prometheus, step_at: float) -> None:
    """Before today's step, yesterday's comes back in the forecast at today's step time."""
    nows = [step_at - 1500.5, step_at - 1200.5, step_at - 617.25]
    now, lookback = nows[-1], 2 * DAY
    source = operator_source(prometheus)
    try:
        history = fetch_like_the_operator(source, nows, lookback, STEP)
        whole = source.history(now - lookback, now, STEP)
    finally:
        source.close()
    # The incremental fetches join into what one fetch of the whole lookback reads.
    pd.testing.assert_series_equal(history, whole)
    service = ForecastService(model="seasonal_naive", horizon_seconds=1800, step_seconds=STEP)
    forecast = service.forecast(history, now)
    assert forecast.status == STATUS_OK, forecast.detail
    assert forecast.model == "seasonal_naive"
    mean = {p.t: p.mean for p in forecast.points}  # a point's t is the END of its step
    # seasonal_naive smooths yesterday with a centred median of 3 minutes: the edge stays
    # where it was, and the step's own minute (the point ending one step after it) is HIGH.
    assert mean[step_at - STEP] == pytest.approx(LOW, rel=1e-3)
    assert mean[step_at] == pytest.approx(LOW, rel=1e-3)
    assert mean[step_at + STEP] == pytest.approx(HIGH, rel=1e-3)
    assert mean[step_at + 2 * STEP] == pytest.approx(HIGH, rel=1e-3)
