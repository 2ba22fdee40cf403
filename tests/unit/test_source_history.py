"""Demand history is stamped at the start of the step it describes, as the forecasting grid
reads it (no I/O: a fake Prometheus evaluates ``rate(x[W])`` exactly, stamped as the real
one does, at the END of its window)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd
import pytest

from prescaler.sources import MAX_POINTS_PER_QUERY, PrometheusSource, render_queries
from prescaler.sources._profiles import format_duration, parse_duration
from prescaler_forecast._hygiene import series_to_grid

STEP = 60.0
T = 1_700_000_040.0  # the step from LOW to HIGH, on the minute
LOW, HIGH = 2.0, 20.0
_WINDOW = re.compile(r"\[(\d+)s\]")


def step_mean(a: float, b: float) -> float:
    """Mean over (a, b] of a rate that is LOW before T and HIGH from T."""
    high = max(0.0, b - max(a, T))
    return (high * HIGH + (b - a - high) * LOW) / (b - a)


class FakePrometheus:
    """``custom_query_range`` of the real client, answering ``rate(x[Ns])`` exactly.

    A value stamped ``t`` is the mean over the window that ends at ``t``, as Prometheus'
    own. Windows narrower than ``min_window`` get no data (too few scrapes in them).
    """

    def __init__(
        self,
        mean: Callable[[float, float], float] = step_mean,
        *,
        min_window: float = 0.0,
        series: int = 1,
    ) -> None:
        self.mean = mean
        self.min_window = min_window
        self.series = series
        self.calls: list[tuple[str, int, int, float]] = []

    def custom_query_range(
        self, query: str, start_time: datetime, end_time: datetime, step: str
    ) -> list[dict[str, Any]]:
        start, end = round(start_time.timestamp()), round(end_time.timestamp())  # as the client
        step_s = float(step)
        self.calls.append((query, start, end, step_s))
        points = math.floor((end - start) / step_s) + 1
        assert points <= 11_000, "Prometheus would refuse this range"
        found = _WINDOW.search(query)
        window = float(found.group(1)) if found else STEP
        if window < self.min_window:
            return []
        values = [
            [start + i * step_s, repr(self.mean(start + i * step_s - window, start + i * step_s))]
            for i in range(points)
        ]
        share = [[ts, repr(float(v) / self.series)] for ts, v in values]
        return [{"metric": {"pod": str(i)}, "values": share} for i in range(self.series)]

    def close(self) -> None:
        pass


def source(fake: FakePrometheus, **render: Any) -> PrometheusSource:
    src = PrometheusSource("http://prometheus.invalid", render_queries("vllm", **render))
    src._prom = fake  # type: ignore[assignment]
    return src


def grid_at(series: pd.Series, now: float, t: float) -> float:
    first, values = series_to_grid(series, STEP, before=now)
    return float(values[int((t - first) // STEP)])


def seconds(index: pd.Index) -> np.ndarray:
    return np.asarray([ts.timestamp() for ts in index])


def test_each_sample_is_the_mean_of_the_step_that_starts_at_its_stamp() -> None:
    fake = FakePrometheus()
    now = T + 3600 + 17
    history = source(fake).history(T - 3600 + 5, now, STEP)
    # The rate window follows the step, and is read at the end of each step.
    assert fake.calls[0][0] == "sum(rate(vllm:request_success_total[60s]))"
    assert fake.calls[0][1] == T - 3600 + 60 + STEP
    stamps = seconds(history.index)
    assert stamps[0] == T - 3600 + 60, "the first step starting at or after `start`"
    assert np.all(stamps % STEP == 0), "stamps are the forecasting grid's bin starts"
    assert stamps[-1] + STEP <= now < stamps[-1] + 2 * STEP, "the last fully observed step"
    assert history[pd.Timestamp(T - STEP, unit="s", tz="UTC")] == LOW
    assert history[pd.Timestamp(T, unit="s", tz="UTC")] == HIGH
    assert history[history.index < pd.Timestamp(T, unit="s", tz="UTC")].eq(LOW).all()
    assert history[history.index >= pd.Timestamp(T, unit="s", tz="UTC")].eq(HIGH).all()


def test_the_forecasting_grid_sees_the_step_at_its_true_time() -> None:
    now = T + 7200 + 42
    history = source(FakePrometheus()).history(now - 86_400, now, STEP)
    assert grid_at(history, now, T - STEP) == pytest.approx(LOW)
    for k in range(5):
        assert grid_at(history, now, T + k * STEP) == pytest.approx(HIGH)
    first, values = series_to_grid(history, STEP, before=now)
    # Every bin up to the last one that has ended by `now` is there, nothing later.
    assert first + len(values) * STEP == math.floor(now / STEP) * STEP
    assert np.isfinite(values).all()


def test_series_are_summed_and_garbage_is_dropped() -> None:
    fake = FakePrometheus(series=3)
    history = source(fake).history(T - 600, T + 600, STEP)
    assert history[pd.Timestamp(T, unit="s", tz="UTC")] == pytest.approx(HIGH)

    def garbage(a: float, b: float) -> float:
        return math.nan if a + STEP == T else -1.0 if a == T else step_mean(a, b)

    history = source(FakePrometheus(garbage)).history(T - 600, T + 600, STEP)
    assert pd.Timestamp(T - STEP, unit="s", tz="UTC") not in history.index
    assert pd.Timestamp(T, unit="s", tz="UTC") not in history.index
    assert history[pd.Timestamp(T + STEP, unit="s", tz="UTC")] == HIGH


def test_long_ranges_are_split_without_gaps_or_overlaps() -> None:
    fake = FakePrometheus()
    start = T - 3 * MAX_POINTS_PER_QUERY * STEP + 30
    history = source(fake).history(start, T + 600, STEP)
    assert len(fake.calls) == 4
    stamps = seconds(history.index)
    assert np.all(np.diff(stamps) == STEP), "contiguous, each step once"
    assert stamps[0] == math.ceil(start / STEP) * STEP
    assert all(
        (end - begin) / step + 1 <= MAX_POINTS_PER_QUERY for _, begin, end, step in fake.calls
    )


def test_incremental_fetches_join_like_one_fetch() -> None:
    """The forecast hub fetches the lookback once, then from its last stamp minus 5 steps."""
    fake = FakePrometheus()
    src = source(fake)
    lookback, now0 = 6 * 3600, T - 300 + 13
    history = src.history(now0 - lookback, now0, STEP)
    for now in (now0 + 60, now0 + 125, T + 7, T + 61, T + 600.5):
        fresh = src.history(history.index[-1].timestamp() - 5 * STEP, now, STEP)
        history = pd.concat([history, fresh])
        history = history[~history.index.duplicated(keep="last")].sort_index()
        whole = src.history(now0 - lookback, now, STEP)
        pd.testing.assert_series_equal(history, whole)
        first, values = series_to_grid(history, STEP, before=now)
        assert first + len(values) * STEP == math.floor(now / STEP) * STEP


def test_too_few_scrapes_for_the_step_fall_back_to_a_centred_wider_window() -> None:
    fake = FakePrometheus(min_window=120)  # e.g. 60 s scrapes: a 60 s window holds one
    now = T + 3600 + 5
    history = source(fake).history(T - 3600, now, STEP)
    assert [c[0] for c in fake.calls] == [
        "sum(rate(vllm:request_success_total[60s]))",
        "sum(rate(vllm:request_success_total[120s]))",
    ]
    # The 2-minute window is centred on the step it stands for: smoothed, but not late.
    at = {
        t: history[pd.Timestamp(t, unit="s", tz="UTC")]
        for t in (T - 2 * STEP, T - STEP, T, T + STEP)
    }
    assert at[T - 2 * STEP] == LOW
    assert at[T - STEP] == pytest.approx((90 * LOW + 30 * HIGH) / 120)
    assert at[T] == pytest.approx((30 * LOW + 90 * HIGH) / 120)
    assert at[T + STEP] == HIGH
    assert (at[T - STEP] + at[T]) / 2 == pytest.approx((LOW + HIGH) / 2), "no lag"
    # A centred window needs data after its step: the newest bin whose window has ended.
    assert history.index[-1].timestamp() + STEP + 30 <= now


def test_a_wider_window_is_not_used_when_it_fills_no_more_steps() -> None:
    # Data only for the last hour of a day's lookback: the step window is kept.
    def recent(a: float, b: float) -> float:
        return step_mean(a, b) if a >= T - 3600 else math.nan

    fake = FakePrometheus(recent)
    history = source(fake).history(T - 86_400, T + 600, STEP)
    assert len(fake.calls) == 2
    assert "[60s]" in fake.calls[-2][0]
    assert "[120s]" in fake.calls[-1][0]
    assert history[pd.Timestamp(T, unit="s", tz="UTC")] == HIGH


def test_custom_queries_follow_the_window_only_when_they_ask_for_it() -> None:
    fake = FakePrometheus()
    src = source(fake, overrides={"requests_per_second": "sum(rate(my_requests[$window]))"})
    assert src.queries.requests_per_second == "sum(rate(my_requests[2m]))"
    history = src.history(T - 600, T + 600, STEP)
    assert fake.calls[-1][0] == "sum(rate(my_requests[60s]))"
    assert history[pd.Timestamp(T, unit="s", tz="UTC")] == HIGH

    verbatim = "sum(rate(my_requests[1m]))"
    fake = FakePrometheus()
    src = source(fake, overrides={"requests_per_second": verbatim})
    assert src.queries.demand_template is None
    history = src.history(T - 600, T + 600, STEP)
    assert [c[0] for c in fake.calls] == [verbatim], "used as is, and never widened"
    assert history[pd.Timestamp(T, unit="s", tz="UTC")] == HIGH


def test_profiles_keep_the_history_template_open_and_snapshots_on_the_rate_window() -> None:
    q = render_queries("sglang", selector='ns="a"', window="5m")
    assert q.requests_per_second == 'sum(rate(sglang:num_requests_total{ns="a"}[5m]))'
    assert q.demand_template == ('sum(rate(sglang:num_requests_total{ns="a"}[$window]))')
    assert q.rate_window_seconds == 300
    assert q.demand_at(60) == 'sum(rate(sglang:num_requests_total{ns="a"}[60s]))'
    assert [name for name, _ in q.items()] == [
        "requests_per_second",
        "prompt_tokens_per_second",
        "output_tokens_per_second",
        "running",
        "waiting",
        "waiting_growth_per_second",
        "context_tokens",
        "kv_cache_usage",
        "ttft_p95_seconds",
        "ttft_p99_seconds",
    ]
    assert q.ttft_p95_seconds == (
        "histogram_quantile(0.95, sum by (le) "
        '(rate(sglang:time_to_first_token_seconds_bucket{ns="a"}[5m])))'
    )
    # An engine without a KV-cache metric reads none, and a user's query adds one.
    tgi = render_queries("tgi")
    assert "kv_cache_usage" not in [name for name, _ in tgi.items()]
    custom = render_queries("tgi", overrides={"kv_cache_usage": "avg(my_kv_usage)"})
    assert ("kv_cache_usage", "avg(my_kv_usage)") in custom.items()
    assert q.waiting_growth_per_second == 'deriv(sum(sglang:num_queue_reqs{ns="a"})[5m:37500ms])'


@pytest.mark.parametrize(
    ("text", "seconds"), [("2m", 120), ("90s", 90), ("1h30m", 5400), ("500ms", 0.5), ("1d", 86400)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds
    assert parse_duration(format_duration(seconds)) == seconds


@pytest.mark.parametrize("text", ["", "2", "m", "2 m", "-1m", "0s", "1.5m"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_a_bad_step_is_refused() -> None:
    src = source(FakePrometheus())
    for step in (0.0, -60.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="step_seconds"):
            src.history(T - 600, T, step)
