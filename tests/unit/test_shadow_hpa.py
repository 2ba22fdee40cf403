"""The shadow HPA: the backtest's reactive policy driven step by step by live observations,
and its counters (pure, no I/O)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from prescaler.backtest import (
    Demand,
    FleetConfig,
    Hour,
    Observed,
    ReactivePolicy,
    ShadowFleet,
    ShadowSetup,
    ShadowState,
    compare,
    direction_budget,
    direction_changes,
    shadow_step,
    simulate,
)
from prescaler.controller.status import against_hpa_status, shadow_state

T0 = 1_700_000_040.0  # a whole minute
CAP = 5.0  # requests/s per replica
SETUP = ShadowSetup(replica_capacity=CAP, min_replicas=1, max_replicas=20, cold_start_seconds=60)


def _run(
    demand: list[float], *, ready: int = 4, setup: ShadowSetup = SETUP, **seen: int
) -> ShadowState:
    """One observation every 15 s from T0, of ``demand[k]`` and a fixed real fleet."""
    state = ShadowState()
    for k, d in enumerate(demand):
        obs = Observed(now=T0 + 15 * k, demand=d, ready=ready, existing=ready, **seen)
        state = shadow_step(state, setup, obs)
    return state


def test_the_shadow_makes_the_backtests_reactive_decisions() -> None:
    """Fed what the backtest's HPA sees (the demand one metric lag old), the shadow's
    replicas follow the backtest's reactive policy step for step: the same code decides."""
    rng = np.random.default_rng(7)
    minutes = 60
    per_minute = np.concatenate(
        [np.full(8, 12.0), 12 + 30 * np.abs(np.sin(np.arange(minutes - 8) / 6))]
    ) + rng.uniform(0, 3, minutes)
    per_minute[:8] = 12.0
    demand = Demand(
        start=T0,
        tokens_per_s=per_minute,
        observed_requests_per_s=per_minute,
        prompt_tokens=1.0,
        output_tokens=0.0,
    )
    config = FleetConfig(replica_tokens_per_second=CAP, cold_start_seconds=60, max_replicas=20)
    policy = ReactivePolicy(CAP, config.min_replicas, config.max_replicas)
    run = simulate(demand, policy, config)
    per_step = np.repeat(per_minute, 4)
    state = ShadowState()
    existing = []
    for k in range(len(per_step)):
        seen = per_step[max(0, k - 2)]  # the metric lags 30 s
        state = shadow_step(state, SETUP, Observed(T0 + 15 * k, seen, ready=1, existing=1))
        existing.append(state.hpa.existing)
    assert existing[0] == run.existing_per_step[0]
    # The backtest's HPA records its first sight one sync earlier; from the first steady
    # stabilization window on, both decide alike.
    assert existing[20:] == [int(n) for n in run.existing_per_step[20:]]
    assert max(existing) > existing[0]  # it did scale


def test_a_covered_fleet_is_never_short_and_costs_its_replicas() -> None:
    state = _run([10.0] * 241, ready=4)  # 10 req/s, 4 x 5 req/s ready
    c = compare(state, T0 + 3600, "24h", 86400)
    assert c.observed_hours == pytest.approx(1.0)
    assert c.gpu_hours == pytest.approx(4.0)
    assert c.unserved_fraction == 0.0
    assert c.short_minutes == 0
    # The shadow starts at the demand over 70 % of a replica (3) and stays there.
    assert state.hpa.existing == 3
    assert c.hpa_gpu_hours == pytest.approx(3.0)
    assert c.saved_gpu_hours == pytest.approx(-1.0)
    assert c.hpa_short_minutes == 0


def test_a_jump_leaves_the_shadow_short_for_its_cold_start() -> None:
    """Demand doubles: the HPA scales up within a sync, but its replicas are ready only one
    cold start later; the real fleet, already large enough, is never short."""
    state = _run([10.0] * 40 + [30.0] * 40, ready=8)
    c = compare(state, T0 + 80 * 15, "24h", 86400)
    assert c.short_minutes == 0
    assert c.unserved_fraction == 0.0
    assert 1 <= c.hpa_short_minutes <= 3
    assert c.hpa_unserved_fraction is not None
    assert c.hpa_unserved_fraction > 0.01
    assert state.hpa.ready * CAP >= 30.0


def test_in_dry_run_the_plan_is_simulated_with_the_same_cold_start() -> None:
    state = _run([10.0] * 2 + [30.0] * 26, ready=2, planned=8, planned_standby=1)
    assert state.planned is not None
    # Planned from 2 ready to 8: 6 replicas start at the second sync, ready 60 s later.
    assert state.planned.existing == 8
    assert state.planned.ready == 8
    c = compare(state, T0 + 28 * 15, "24h", 86400)
    assert c.standby_gpu_hours == pytest.approx(27 * 15 / 3600)
    # The two replicas ready until then could not serve 30 req/s; the real fleet does not
    # count in dry run.
    assert c.short_minutes == 2  # [T0 + 15, T0 + 75): in minutes 0 and 1
    assert c.unserved_fraction is not None
    assert c.unserved_fraction > 0


def test_a_gap_is_not_scored_and_the_shadow_goes_on() -> None:
    state = _run([10.0] * 20, ready=4)
    before = compare(state, T0 + 300, "24h", 86400)
    later = shadow_step(state, SETUP, Observed(T0 + 19 * 15 + 3600, 10.0, ready=4, existing=4))
    after = compare(later, T0 + 19 * 15 + 3600, "24h", 86400)
    assert after.observed_hours == pytest.approx(before.observed_hours)
    assert later.hpa.existing == state.hpa.existing


def test_unknown_demand_scores_nothing_and_holds_the_shadow() -> None:
    state = _run([10.0] * 8, ready=4)
    held = state
    for k in range(8, 40):
        held = shadow_step(held, SETUP, Observed(T0 + 15 * k, None, ready=4, existing=4))
    assert held.hpa.existing == state.hpa.existing
    assert compare(held, T0 + 600, "24h", 86400).observed_hours == pytest.approx(
        compare(state, T0 + 600, "24h", 86400).observed_hours
    )


def _hours(n: int, start: float = T0) -> ShadowState:
    """``n`` hours, each scored for 30 s (three observations 15 s apart)."""
    state = ShadowState()
    for hour in range(n):
        t = start + hour * 3600
        for k in range(3):
            state = shadow_step(state, SETUP, Observed(t + 15 * k, 10.0, ready=4, existing=4))
    return state


def test_windows_keep_their_hours_and_old_hours_are_dropped() -> None:
    """The last 24 hours stay hourly; older hours merge into one bucket per UTC day, and the
    7-day window counts a day's bucket when most of it lies in the window."""
    start = 86400.0 * 20_000 + 5 * 3600  # a day's 05:00, so the days are cut mid-window
    state = _hours(9 * 24, start)
    now = start + (9 * 24 - 1) * 3600 + 30
    hourly = [h for h in state.hours if h.span == 3600.0]
    daily = [h for h in state.hours if h.span > 3600.0]
    assert len(hourly) == 24
    assert [h.start for h in hourly] == [now // 3600 * 3600 - 3600 * k for k in range(23, -1, -1)]
    assert all(h.start % 86400 == 0 for h in daily)
    assert len(state.hours) <= 24 + 8
    day, week = compare(state, now, "24h", 86400), compare(state, now, "7d", 7 * 86400)
    assert day.observed_hours == pytest.approx(24 * 30 / 3600)
    # The week counts whole days around its edge: within half a day of 7 days, and
    # nothing counted twice or lost (every counted bucket holds 30 s per hour it covers).
    counted = [h for h in state.hours if h.counted_in(now // 3600 * 3600 - 7 * 86400 + 3600)]
    assert week.observed_hours == pytest.approx(sum(h.span for h in counted) / 3600 * 30 / 3600)
    assert 6.5 * 24 * 30 / 3600 <= week.observed_hours <= 7.5 * 24 * 30 / 3600
    assert week.gpu_hours == pytest.approx(4 * week.observed_hours)


def test_a_restarted_week_of_hourly_buckets_is_merged_into_days() -> None:
    """A status written before the buckets were merged (168 hourly ones) is merged at the
    next observation, its counts kept."""
    state = _hours(2)
    now = T0 + 3600 + 30
    old = tuple(
        Hour(now // 3600 * 3600 - 3600 * k, seconds=30.0, demand=300.0, gpu_hours=1.0)
        for k in range(167, 1, -1)
    )
    state = replace(state, hours=old + state.hours)
    before = compare(state, now, "7d", 7 * 86400)
    after = shadow_step(state, SETUP, Observed(now + 15, 10.0, ready=4, existing=4))
    assert len(after.hours) <= 24 + 8
    week = compare(after, now + 15, "7d", 7 * 86400)
    assert abs(week.observed_hours - before.observed_hours) <= 12 * 30 / 3600


def test_the_status_keeps_the_whole_state() -> None:
    """A restarted operator goes on from ``status.againstHpa`` exactly where the last one
    stopped (as far as the status rounds)."""
    state = _run([10.0] * 40 + [30.0] * 10, ready=8, planned=6)
    status = against_hpa_status(state, SETUP, "default", T0 + 50 * 15)
    again = shadow_state(type(status).model_validate(status.wire()))
    assert again.clock == state.clock
    assert again.hpa == state.hpa
    assert again.planned == state.planned
    assert again.recommendations == state.recommendations
    assert again.metric_ready == state.metric_ready
    assert (again.minute, again.short, again.hpa_short) == (
        state.minute,
        state.short,
        state.hpa_short,
    )
    assert (again.fleet_replicas, again.direction, again.hpa_direction) == (
        state.fleet_replicas,
        state.direction,
        state.hpa_direction,
    )
    for a, b in zip(again.hours, state.hours, strict=True):
        assert (a.start, a.span) == (b.start, b.span)
        assert a.gpu_hours == pytest.approx(b.gpu_hours, abs=1e-6)
        assert a.hpa_short_minutes == b.hpa_short_minutes
        assert a.direction_changes == b.direction_changes
        assert a.hpa_direction_changes == b.hpa_direction_changes
    assert status.basis == "plan"
    assert status.last24_hours is not None
    assert status.summary.endswith("%)")


def test_the_shadow_fleet_removes_starting_replicas_first() -> None:
    fleet = ShadowFleet(2).scale_to(5, 0.0, 60.0)
    assert (fleet.ready, fleet.starting) == (2, (60.0, 60.0, 60.0))
    assert fleet.scale_to(3, 10.0, 60.0) == ShadowFleet(2, (60.0,))
    assert fleet.scale_to(1, 10.0, 60.0) == ShadowFleet(1)
    assert fleet.advance(60.0) == ShadowFleet(5)


def test_the_hpa_target_sets_the_shadows_start() -> None:
    setup = ShadowSetup(
        replica_capacity=CAP, min_replicas=1, max_replicas=20, cold_start_seconds=60, target=0.5
    )
    assert _run([10.0], setup=setup).hpa.existing == math.ceil(10 / (0.5 * CAP))


@pytest.mark.parametrize(
    ("metrics", "share"),
    [
        ([{"type": "Resource", "resource": {"target": {"averageUtilization": 60}}}], 0.6),
        ([{"type": "Pods", "pods": {"target": {"averageValue": "800m"}}}], 0.8),
        (
            [
                {"type": "Resource", "resource": {"target": {"averageUtilization": 90}}},
                {"type": "External", "external": {"target": {"value": "0.5"}}},
            ],
            0.5,
        ),
        ([{"type": "Pods", "pods": {"target": {"averageValue": "30"}}}], None),
        (None, None),
    ],
)
def test_the_hpas_target_is_read_as_a_share_of_a_replica(
    metrics: list[dict[str, object]] | None, share: float | None
) -> None:
    from prescaler.kube._client import hpa_from

    hpa = hpa_from(
        {
            "metadata": {"name": "llm"},
            "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "llm"}, "metrics": metrics},
        }
    )
    assert (hpa.target_kind, hpa.target_name) == ("Deployment", "llm")
    assert hpa.target_utilization == share


def test_both_fleets_direction_changes_are_counted_as_the_backtest_counts_them() -> None:
    """The fleet's direction changes, from its count at each observation, and the shadow's,
    from its syncs: the same count as the backtest's :func:`direction_changes` of each
    series; :func:`direction_budget` is the shadow's less the fleet's over the day."""
    rng = np.random.default_rng(3)
    levels = [10.0, 40.0, 12.0, 45.0, 10.0, 50.0, 11.0]
    demand = list(np.repeat(levels, 80) + rng.uniform(0, 2, 560))
    fleet = list(np.repeat([2, 5, 3, 5, 4, 4, 6, 2], 70))  # up, down, up, down, up, down
    state = ShadowState()
    hpa, ours = [], []
    for k, (d, n) in enumerate(zip(demand, fleet, strict=True)):
        state = shadow_step(state, SETUP, Observed(T0 + 15 * k, d, ready=int(n), existing=int(n)))
        hpa.append(state.hpa.existing)
        ours.append(int(n))
    day = compare(state, T0 + 15 * len(demand), "24h", 86400)
    assert day.direction_changes == direction_changes(np.array(ours, dtype=float)) == 5
    assert day.hpa_direction_changes == direction_changes(np.array(hpa, dtype=float))
    assert day.hpa_direction_changes >= 4  # it followed the three rises and falls
    # Two hours observed: the shadow's day is young, and the fleet may lead it by one.
    budget = direction_budget(state, T0 + 15 * len(demand))
    assert budget == day.hpa_direction_changes - day.direction_changes + 1
    # A whole day observed on, steady: the changes have left the window, none is owed
    # either way, and the fleet may lead by none.
    now = T0 + 15 * len(demand)
    for k in range(1, 24 * 12 + 1):
        state = shadow_step(state, SETUP, Observed(now + 300 * k, 10.0, ready=2, existing=2))
    later = now + 300 * 24 * 12
    assert compare(state, later, "24h", 86400).observed_hours > 22
    assert direction_budget(state, later) == 0
    # The trailing week still holds the first two hours' changes, and has seen one day of
    # seven: the fleet may lead the shadow's count by one there.
    week = compare(state, later, "7d", 7 * 86400)
    assert (week.direction_changes, week.hpa_direction_changes) == (5, day.hpa_direction_changes)
    assert direction_budget(state, later, "7d") == day.hpa_direction_changes - 5 + 1
