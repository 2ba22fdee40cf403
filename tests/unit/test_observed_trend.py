"""The nowcast follows a ramp: a rising observation is sized where it is heading."""

from __future__ import annotations

import math

import pytest

from prescaler.api import ForecastSpec, parse_spec, scaling_policy
from prescaler.capacity import CapacityModel, TokenProfile
from prescaler.planning import (
    FleetState,
    PlanInputs,
    ScalingPolicy,
    observed_rise,
    plan,
    remember_observation,
)

NOW = 1_800_000_000.0
# 1 request/s per replica: 1000 tokens per request at 1000 tokens/s.
CAPACITY = CapacityModel(TokenProfile(600, 400), tokens_per_second=1000)


def desired(
    observed: float | None,
    rise: float | None,
    trend: float = 120.0,
    released_at: float | None = None,
) -> int:
    return plan(
        PlanInputs(
            now=NOW,
            capacity=CAPACITY,
            fleet=FleetState(
                current_replicas=10,
                ready_replicas=10,
                observed_requests_per_second=observed,
                observed_rise_per_second=rise,
                last_scale_down_at=released_at,
            ),
            policy=ScalingPolicy(
                min_replicas=1,
                max_replicas=100,
                observed_trend_seconds=trend,
                scale_down_requires_observation=True,
                scale_down_stabilization_seconds=300.0,
            ),
            cold_start_seconds=240.0,
        )
    ).desired_replicas


def test_a_rising_observation_is_sized_where_it_is_heading() -> None:
    # 20 req/s now, rising 0.1 req/s each second: 120 s further up its rise it is 32.
    assert desired(20.0, 0.1) == 32
    assert desired(20.0, 0.1, trend=240.0) == 44
    assert desired(20.0, 0.1, trend=0.0) == 20  # off: the observation as it is
    assert desired(20.0, None) == 20


@pytest.mark.parametrize("rise", [-0.1, 0.0, math.nan, math.inf])
def test_a_fall_or_garbage_is_never_extrapolated(rise: float) -> None:
    assert desired(20.0, rise) == 20


def test_no_rise_is_extrapolated_within_a_stabilization_period_after_a_release() -> None:
    # Noise that looks like a climb would add back what was just released.
    assert desired(20.0, 0.1, released_at=NOW - 60.0) == 20
    assert desired(20.0, 0.1, released_at=NOW - 300.0) == 32


def test_no_observation_no_trend() -> None:
    # A rise without an observation now (a metrics gap) adds nothing, and nothing shrinks.
    assert desired(None, 0.5) == 10


def test_the_rise_is_measured_over_the_last_minute() -> None:
    recent: tuple[tuple[float, float], ...] = ()
    for i, demand in enumerate([10.0, 10.0, 10.0, 10.0, 14.0, 16.0]):
        now = NOW + 15.0 * i
        recent = remember_observation(recent, now, demand)
    now = NOW + 15.0 * 6
    # From the newest observation at least 50 s old (60 s ago: 10) to 18 now.
    assert observed_rise(recent, now, 18.0) == pytest.approx((18.0 - 10.0) / 60.0)
    # What it keeps stays short: the newest old enough, and the younger ones.
    assert [t - NOW for t, _ in remember_observation(recent, now, 18.0)] == [
        30.0,
        45.0,
        60.0,
        75.0,
        90.0,
    ]


def test_no_rise_without_an_earlier_observation_in_range() -> None:
    assert observed_rise((), NOW, 10.0) is None
    assert observed_rise(((NOW - 20.0, 5.0),), NOW, 10.0) is None  # too young
    assert observed_rise(((NOW - 600.0, 5.0),), NOW, 10.0) is None  # too old: a gap
    assert observed_rise(((NOW - 60.0, 5.0),), NOW, None) is None  # nothing now
    assert observed_rise(((NOW - 60.0, 5.0),), NOW, math.nan) is None


def test_garbage_is_not_remembered() -> None:
    assert remember_observation((), NOW, math.nan) == ()
    assert remember_observation((), NOW, -1.0) == ()
    assert remember_observation((), NOW, None) == ()


def test_the_trend_is_on_by_default_and_the_spec_sets_it() -> None:
    base = {
        "target": {"name": "llm"},
        "maxReplicas": 4,
        "model": {"tokensPerSecond": 1000},
        "forecast": {"prometheus": {"url": "http://prometheus:9090"}},
    }
    default = ForecastSpec.model_fields["observed_trend_seconds"].default
    assert scaling_policy(parse_spec(base)).observed_trend_seconds == default == 120
    off = {**base, "forecast": {**base["forecast"], "observedTrendSeconds": 0}}
    assert scaling_policy(parse_spec(off)).observed_trend_seconds == 0.0
