"""The queue term: a full fleet's served rate hides demand; arrivals are what is served plus
the queue's growth, and the backlog drains within the lookahead. It only ever adds."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prescaler.capacity import CapacityModel, TokenProfile
from prescaler.planning import FleetState, PlanInputs, ScalePlan, ScalingPolicy, plan
from prescaler.sources._prometheus import _instant_value

NOW = 1_800_000_000.0
# 1 request/s per replica: 1000 tokens per request at 1000 tokens/s.
CAPACITY = CapacityModel(TokenProfile(600, 400), tokens_per_second=1000)
POLICY = ScalingPolicy(min_replicas=1, max_replicas=100, observed_headroom=1.4)
COLD_START = 60.0  # + the default 60 s margin: a lookahead of 120 s


def decide(
    current: int,
    served: float | None,
    *,
    waiting: float | None = None,
    growth: float | None = None,
    now: float = NOW,
    last_up: float | None = None,
) -> ScalePlan:
    fleet = FleetState(
        current,
        current,
        last_scale_up_at=last_up,
        observed_requests_per_second=served,
        waiting_requests=waiting,
        waiting_growth_per_second=growth,
    )
    return plan(
        PlanInputs(
            now=now,
            capacity=CAPACITY,
            fleet=fleet,
            policy=POLICY,
            cold_start_seconds=COLD_START,
            forecast=None,
        )
    )


def test_a_full_fleet_with_a_growing_queue_plans_on_arrivals_and_the_backlog() -> None:
    # 7 replicas serve 7 req/s; 10 arrive, so the queue grows by 3 req/s and holds 120.
    blind = decide(7, 7.0)
    assert blind.desired_replicas == 10  # 7 x 1.4: the served rate alone
    queued = decide(7, 7.0, waiting=120, growth=3.0)
    # (7 + 3) x 1.4 + 120 / 120 s = 15 req/s.
    assert queued.desired_replicas == 15
    assert queued.reason.startswith("scale up 7 -> 15: queue: served 7 req/s +3 queue growth")
    assert "120 waiting / 120s" in queued.reason


def test_the_queue_term_scales_a_saturated_fleet_up_faster() -> None:
    """A step from 5 to 20 req/s on a fleet of 5: replicas come one cold start after they
    are asked for, the fleet serves what is ready and queues the rest. With the queue
    signals the fleet covers the arrivals sooner and leaves less unserved."""

    def play(with_queue: bool) -> tuple[float, float]:
        arrivals, dt = 20.0, 15.0
        asked = [(NOW - COLD_START, 5)]  # no forecast: it only grows (missing data holds)
        queue, late, covered_at = 0.0, 0.0, math.inf
        last_queue = 0.0
        served = 5.0
        last_up: float | None = None
        current = 5
        for k in range(80):
            now = NOW + k * dt
            ready = max(n for t, n in asked if t + COLD_START <= now)
            result = decide(
                current,
                served,
                waiting=queue if with_queue else None,
                growth=(queue - last_queue) / dt if with_queue and k else None,
                now=now,
                last_up=last_up,
            )
            if result.desired_replicas > current:
                last_up = now
            current = result.desired_replicas
            asked.append((now, current))
            offered = queue + arrivals * dt
            done = min(offered, ready * dt)
            late += max(0.0, arrivals * dt - max(0.0, ready * dt - queue))
            last_queue, queue = queue, offered - done
            served = done / dt
            if ready >= arrivals and queue == 0 and covered_at == math.inf:
                covered_at = now
        return covered_at, late

    blind_at, blind_late = play(with_queue=False)
    queue_at, queue_late = play(with_queue=True)
    assert queue_at < blind_at
    assert queue_late < blind_late


def test_a_draining_queue_lowers_nothing_below_the_guard() -> None:
    # 10 served, the queue drains by 4 req/s (6 arrive): it is gone in 25 s, well within
    # the lookahead, so the plain guard (10 x 1.4) stands.
    plain = decide(14, 10.0)
    draining = decide(14, 10.0, waiting=100, growth=-4.0)
    assert draining.desired_replicas == plain.desired_replicas == 14
    assert "queue" not in draining.reason


def test_a_backlog_that_would_outlast_the_lookahead_is_drained_within_it() -> None:
    # Draining at 4 req/s, 2400 waiting would take 600 s: 6 x 1.4 + 2400 / 120 s = 28.4.
    result = decide(10, 10.0, waiting=2400, growth=-4.0)
    assert result.desired_replicas == 29
    assert "queue" in result.reason


@pytest.mark.parametrize(
    ("waiting", "growth"),
    [
        (None, None),
        (math.nan, math.nan),
        (math.inf, math.inf),
        (-5.0, None),
        (-math.inf, -math.inf),
        (None, -math.inf),
    ],
)
def test_missing_or_garbage_queue_data_is_no_term(
    waiting: float | None, growth: float | None
) -> None:
    plain = decide(7, 7.0)
    result = decide(7, 7.0, waiting=waiting, growth=growth)
    assert result.desired_replicas == plain.desired_replicas
    assert result.reason == plain.reason


def test_no_observed_demand_no_queue_term_and_no_scale_down() -> None:
    # Without the served rate there are no arrivals to speak of; missing data holds.
    result = decide(7, None, waiting=500, growth=10.0)
    assert result.desired_replicas == 7
    assert "queue" not in result.reason


@settings(max_examples=200, deadline=None)
@given(
    current=st.integers(min_value=1, max_value=100),
    served=st.floats(min_value=0, max_value=1e6),
    waiting=st.none() | st.floats(allow_nan=True, allow_infinity=True),
    growth=st.none() | st.floats(allow_nan=True, allow_infinity=True),
)
def test_property_the_queue_term_never_lowers_the_plan(
    current: int, served: float, waiting: float | None, growth: float | None
) -> None:
    plain = decide(current, served)
    queued = decide(current, served, waiting=waiting, growth=growth)
    assert queued.desired_replicas >= plain.desired_replicas
    assert queued.target_replicas >= plain.target_replicas


def test_queue_growth_reads_signed_and_garbage_reads_as_missing() -> None:
    drain = [{"metric": {}, "value": [NOW, "-2.5"]}]
    assert _instant_value(drain, signed=True) == -2.5
    assert _instant_value(drain) is None  # a negative count is garbage
    assert _instant_value([{"metric": {}, "value": [NOW, "NaN"]}], signed=True) is None
    assert _instant_value([{"metric": {}, "value": [NOW, "+Inf"]}], signed=True) is None
    assert _instant_value([], signed=True) is None
