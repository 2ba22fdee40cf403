"""The planner: rules on hand-built cases, then properties with Hypothesis."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prescaler.capacity import CapacityModel, TokenProfile
from prescaler.planning import (
    FleetState,
    PlanInputs,
    ScalingPolicy,
    ScheduledWindow,
    next_fleet_state,
    plan,
)
from unit.fake_forecasts import Forecast, Point

NOW = 1_800_000_000.0
STEP = 60.0
# 1 request/s per replica: 1000 tokens per request at 1000 tokens/s.
CAPACITY = CapacityModel(TokenProfile(600, 400), tokens_per_second=1000)


def forecast(uppers: list[float], generated_at: float = NOW) -> Forecast:
    return Forecast(
        tuple(Point(generated_at + STEP * (i + 1), u * 0.8, u) for i, u in enumerate(uppers)),
        generated_at,
    )


def run(
    fc: Forecast | None,
    current: int = 2,
    *,
    policy: ScalingPolicy | None = None,
    cold_start: float = 240.0,
    windows: tuple[ScheduledWindow, ...] = (),
    observed: float | None = None,
    last_up: float | None = None,
    last_down: float | None = None,
    now: float = NOW,
) -> int:
    return plan(
        PlanInputs(
            now=now,
            capacity=CAPACITY,
            fleet=FleetState(current, current, last_up, last_down, observed),
            policy=policy or ScalingPolicy(min_replicas=1, max_replicas=20),
            cold_start_seconds=cold_start,
            forecast=fc,
            windows=windows,
        )
    ).desired_replicas


def test_lead_time_rule_takes_the_peak_within_cold_start_plus_margin() -> None:
    # 240 s cold start + 60 s margin = 5 steps of lookahead: the 6.0 at step 5 counts,
    # the 15.0 at step 7 is beyond it.
    uppers = [1.0, 1.0, 2.0, 3.0, 6.0, 2.0, 15.0]
    result = plan(
        PlanInputs(
            now=NOW,
            capacity=CAPACITY,
            fleet=FleetState(2, 2),
            policy=ScalingPolicy(max_replicas=20),
            cold_start_seconds=240,
            forecast=forecast(uppers),
        )
    )
    assert result.desired_replicas == 6
    assert result.action == "scale_up"
    assert result.constraint == "compute"
    assert "forecast upper 6" in result.reason


def test_max_replicas_caps_and_says_so() -> None:
    policy = ScalingPolicy(min_replicas=1, max_replicas=4)
    result = plan(PlanInputs(NOW, CAPACITY, FleetState(2, 2), policy, 240, forecast([9.0] * 10)))
    assert result.desired_replicas == 4
    assert "capped at maxReplicas 4" in result.reason


def test_observed_demand_is_a_floor_under_a_lagging_forecast() -> None:
    assert run(forecast([2.0] * 10), current=2, observed=7.0) == 7


def test_observed_headroom_is_a_nowcast_guard_above_the_observed_level() -> None:
    # 1 req/s per replica: observed 3.0 x 1.5 = 4.5 needs 5, above a forecast of 2.
    guarded = ScalingPolicy(max_replicas=20, observed_headroom=1.5)
    assert run(forecast([2.0] * 10), current=2, observed=3.0) == 3
    assert run(forecast([2.0] * 10), current=2, observed=3.0, policy=guarded) == 5
    # A forecast above the guard still wins; without an observation there is no guard.
    assert run(forecast([8.0] * 10), current=2, observed=3.0, policy=guarded) == 8
    assert run(forecast([2.0] * 10), current=2, policy=guarded) == 2


@pytest.mark.parametrize("bad", [0.5, 0.99, float("nan"), float("inf")])
def test_observed_headroom_below_one_is_rejected(bad: float) -> None:
    with pytest.raises(ValueError, match="observed headroom"):
        ScalingPolicy(observed_headroom=bad)


def test_a_metrics_gap_holds_when_scale_down_requires_observation() -> None:
    low = forecast([1.0] * 10)
    strict = ScalingPolicy(max_replicas=20, scale_down_requires_observation=True)
    assert run(low, current=8, observed=None, policy=strict) == 8
    assert run(low, current=8, observed=float("nan"), policy=strict) == 8
    assert run(low, current=8, observed=1.0, policy=strict) == 4
    assert run(low, current=8, observed=None) == 4  # off by default
    # A gap never blocks a scale-up.
    assert run(forecast([12.0] * 10), current=8, observed=None, policy=strict) == 12


def test_missing_forecast_holds_and_never_shrinks() -> None:
    assert run(None, current=8) == 8
    assert run(forecast([]), current=8) == 8


def test_stale_forecast_holds() -> None:
    stale = forecast([1.0] * 60, generated_at=NOW - 3600)
    assert run(stale, current=8) == 8


def test_garbage_forecast_holds() -> None:
    assert run(forecast([1.0, float("nan"), 1.0] * 5), current=8) == 8
    assert run(forecast([1.0, -3.0, 1.0] * 5), current=8) == 8
    # A finite band around a NaN mean is garbage too (the risk model sizes on the mean).
    means = tuple(
        Point(NOW + STEP * (i + 1), float("nan") if i == 3 else 0.8, 1.0) for i in range(15)
    )
    assert run(Forecast(means, NOW), current=8) == 8


def test_missing_forecast_still_scales_up_on_observed_demand() -> None:
    assert run(None, current=2, observed=5.0) == 5


def test_scale_down_waits_for_stabilization_after_a_scale_up() -> None:
    low = forecast([1.0] * 10)
    assert run(low, current=8, last_up=NOW - 300) == 8
    assert run(low, current=8, last_up=NOW - 601) == 4


def test_scale_down_at_most_once_per_period_and_by_a_bounded_step() -> None:
    low = forecast([1.0] * 10)
    policy = ScalingPolicy(max_replicas=20, scale_down_max_percent=25)
    assert run(low, current=8, policy=policy, last_down=NOW - 100) == 8
    assert run(low, current=8, policy=policy, last_down=NOW - 700) == 6


def test_scale_down_never_below_target() -> None:
    assert run(forecast([3.0] * 10), current=4) == 3


def test_dated_window_prewarms_by_its_lead() -> None:
    start = datetime.fromtimestamp(NOW + 1800, UTC)
    end = datetime.fromtimestamp(NOW + 5400, UTC)
    window = ScheduledWindow("launch", lead_seconds=1800, min_replicas=12, start=start, end=end)
    before = run(forecast([1.0] * 10, NOW - 60), current=1, windows=(window,), now=NOW - 60)
    at_lead = run(forecast([1.0] * 10), current=1, windows=(window,))
    assert before == 1
    assert at_lead == 12
    after = run(forecast([1.0] * 10, NOW + 5400), current=12, windows=(window,), now=NOW + 5400)
    assert after == 6  # the window is over: a paced step down


def test_a_short_lead_is_stretched_to_the_cold_start() -> None:
    start = datetime.fromtimestamp(NOW + 200, UTC)
    end = datetime.fromtimestamp(NOW + 3600, UTC)
    window = ScheduledWindow("sale", lead_seconds=60, min_replicas=9, start=start, end=end)
    assert run(forecast([1.0] * 10), current=2, windows=(window,), cold_start=240) == 9


def test_window_with_expected_load_goes_through_the_capacity_model() -> None:
    start = datetime.fromtimestamp(NOW - 60, UTC)
    end = datetime.fromtimestamp(NOW + 600, UTC)
    window = ScheduledWindow(
        "campaign", expected_requests_per_second=7.5, start=start, end=end, lead_seconds=0
    )
    result = plan(
        PlanInputs(
            NOW,
            CAPACITY,
            FleetState(2, 2),
            ScalingPolicy(max_replicas=20),
            240,
            forecast([1.0] * 10),
            (window,),
        )
    )
    assert result.desired_replicas == 8
    assert result.constraint == "schedule"
    assert result.active_windows == ("campaign",)


def test_cron_window_in_a_time_zone() -> None:
    # Weekdays 09:00-10:00 in New York. 2027-01-11 is a Monday; 09:00 EST = 14:00 UTC.
    window = ScheduledWindow(
        "open",
        cron="0 9 * * 1-5",
        duration_seconds=3600,
        timezone="America/New_York",
        lead_seconds=600,
        min_replicas=5,
    )
    start = datetime(2027, 1, 11, 14, 0, tzinfo=UTC).timestamp()
    assert window.next_occurrence(start - 7200) is not None
    assert window.next_occurrence(start - 7200).start == start  # type: ignore[union-attr]
    fc = forecast([1.0] * 10, generated_at=start - 600)
    assert run(fc, current=1, windows=(window,), now=start - 600) == 5
    fc = forecast([1.0] * 10, generated_at=start - 1200)
    assert run(fc, current=1, windows=(window,), now=start - 1200) == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_replicas": 1}, "exactly one of"),
        ({"min_replicas": 1, "cron": "not a cron", "duration_seconds": 60}, "invalid cron"),
        ({"min_replicas": 1, "cron": "* * * * *"}, "duration"),
        ({"cron": "* * * * *", "duration_seconds": 60}, "minReplicas or an expected load"),
        (
            {
                "min_replicas": 1,
                "start": datetime(2027, 1, 2, tzinfo=UTC),
                "end": datetime(2027, 1, 1, tzinfo=UTC),
            },
            "ends before it starts",
        ),
        (
            {"min_replicas": 1, "cron": "* * * * *", "duration_seconds": 60, "timezone": "Mars/X"},
            "unknown time zone",
        ),
    ],
)
def test_invalid_windows_are_rejected_with_a_clear_message(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        ScheduledWindow("w", **kwargs)  # type: ignore[arg-type]


def test_hpa_floor_mode_is_carried_in_the_plan() -> None:
    policy = ScalingPolicy(max_replicas=20, mode="hpaFloor")
    result = plan(PlanInputs(NOW, CAPACITY, FleetState(1, 1), policy, 240, forecast([4.0] * 10)))
    assert result.mode == "hpaFloor"
    assert result.desired_replicas == 4


def test_standby_covers_the_gap_to_the_horizon_peak() -> None:
    # The lookahead (240 s + 60 s) reaches the step ending at now + 360 s: peak 3 -> plan 3.
    # The whole-horizon peak 10 needs 7 more, capped at 5 by policy.
    policy = ScalingPolicy(max_replicas=20, standby_max_replicas=5)
    uppers = [3.0] * 6 + [10.0] * 4
    result = plan(PlanInputs(NOW, CAPACITY, FleetState(3, 3), policy, 240, forecast(uppers)))
    assert result.desired_replicas == 3
    assert result.standby_replicas == 5


def test_a_window_within_the_horizon_sizes_standby_before_its_prewarm() -> None:
    # A dated window 20 minutes ahead asks for 5 replicas; its pre-warm (lead 600 s) has
    # not started, so the plan stays at 1, but the placeholders already hold 4 warm nodes.
    start = datetime.fromtimestamp(NOW + 1200, UTC)
    end = datetime.fromtimestamp(NOW + 4800, UTC)
    window = ScheduledWindow("sale", lead_seconds=600, min_replicas=5, start=start, end=end)
    policy = ScalingPolicy(max_replicas=20, standby_max_replicas=8)
    result = plan(
        PlanInputs(NOW, CAPACITY, FleetState(1, 1), policy, 240, forecast([1.0] * 30), (window,))
    )
    assert result.desired_replicas == 1
    assert result.standby_replicas == 4
    # Without a forecast the window still counts.
    blind = plan(PlanInputs(NOW, CAPACITY, FleetState(1, 1), policy, 240, None, (window,)))
    assert blind.standby_replicas == 4


def test_next_fleet_state_records_scale_times() -> None:
    fleet = FleetState(2, 2)
    up = plan(PlanInputs(NOW, CAPACITY, fleet, ScalingPolicy(max_replicas=9), 240, forecast([5.0])))
    after = next_fleet_state(fleet, up)
    assert (after.current_replicas, after.last_scale_up_at) == (5, NOW)


# ----------------------------------------------------------------------------- properties

uppers_st = st.lists(st.floats(0, 40, allow_nan=False), min_size=1, max_size=30)
policy_st = st.builds(
    ScalingPolicy,
    min_replicas=st.integers(0, 5),
    max_replicas=st.integers(5, 30),
    lead_margin_seconds=st.sampled_from([0.0, 60.0, 120.0]),
    scale_down_max_percent=st.sampled_from([10.0, 50.0, 100.0]),
)
fleet_st = st.builds(
    FleetState,
    current_replicas=st.integers(0, 40),
    ready_replicas=st.integers(0, 40),
    last_scale_up_at=st.one_of(st.none(), st.floats(NOW - 3000, NOW)),
    last_scale_down_at=st.one_of(st.none(), st.floats(NOW - 3000, NOW)),
    observed_requests_per_second=st.one_of(st.none(), st.floats(0, 40)),
)
cold_st = st.sampled_from([0.0, 60.0, 240.0, 480.0])


def inputs(
    uppers: list[float] | None, fleet: FleetState, policy: ScalingPolicy, cold: float
) -> PlanInputs:
    return PlanInputs(
        NOW, CAPACITY, fleet, policy, cold, None if uppers is None else forecast(uppers)
    )


@settings(max_examples=300, deadline=None)
@given(uppers=st.one_of(st.none(), uppers_st), fleet=fleet_st, policy=policy_st, cold=cold_st)
def test_property_within_bounds(
    uppers: list[float] | None, fleet: FleetState, policy: ScalingPolicy, cold: float
) -> None:
    desired = plan(inputs(uppers, fleet, policy, cold)).desired_replicas
    assert policy.min_replicas <= desired <= policy.max_replicas


@settings(max_examples=300, deadline=None)
@given(fleet=fleet_st, policy=policy_st, cold=cold_st)
def test_property_never_scales_down_on_missing_forecast(
    fleet: FleetState, policy: ScalingPolicy, cold: float
) -> None:
    desired = plan(inputs(None, fleet, policy, cold)).desired_replicas
    assert desired >= min(fleet.current_replicas, policy.max_replicas)


@settings(max_examples=300, deadline=None)
@given(
    uppers=uppers_st,
    bump=st.lists(st.floats(0, 10, allow_nan=False), min_size=30, max_size=30),
    fleet=fleet_st,
    policy=policy_st,
    cold=cold_st,
)
def test_property_monotone_in_demand(
    uppers: list[float], bump: list[float], fleet: FleetState, policy: ScalingPolicy, cold: float
) -> None:
    higher = [u + b for u, b in zip(uppers, bump, strict=False)]
    low = plan(inputs(uppers, fleet, policy, cold)).desired_replicas
    high = plan(inputs(higher, fleet, policy, cold)).desired_replicas
    assert high >= low


@settings(max_examples=300, deadline=None)
@given(
    uppers=st.one_of(st.none(), uppers_st),
    fleet=fleet_st,
    policy=policy_st,
    cold=cold_st,
    guard=st.floats(1.0, 3.0),
)
def test_property_observed_headroom_never_lowers_the_plan(
    uppers: list[float] | None,
    fleet: FleetState,
    policy: ScalingPolicy,
    cold: float,
    guard: float,
) -> None:
    guarded = replace(policy, observed_headroom=guard)
    base = plan(inputs(uppers, fleet, policy, cold))
    more = plan(inputs(uppers, fleet, guarded, cold))
    assert more.target_replicas >= base.target_replicas
    assert more.desired_replicas >= base.desired_replicas
    if fleet.observed_requests_per_second is not None:
        need = CAPACITY.required(fleet.observed_requests_per_second * guard).replicas
        assert more.target_replicas >= min(need, policy.max_replicas)


@settings(max_examples=200, deadline=None)
@given(
    uppers=uppers_st,
    fleet=fleet_st,
    policy=policy_st,
    cold=cold_st,
    window_min=st.integers(0, 30),
    offset=st.floats(-3000, 3000),
)
def test_property_window_wins_over_a_lower_forecast(
    uppers: list[float],
    fleet: FleetState,
    policy: ScalingPolicy,
    cold: float,
    window_min: int,
    offset: float,
) -> None:
    start = datetime.fromtimestamp(NOW + offset, UTC)
    end = datetime.fromtimestamp(NOW + offset + 3600, UTC)
    window = ScheduledWindow("w", lead_seconds=900, min_replicas=window_min, start=start, end=end)
    base = inputs(uppers, fleet, policy, cold)
    with_window = PlanInputs(
        base.now, base.capacity, base.fleet, base.policy, cold, base.forecast, (window,)
    )
    desired = plan(with_window).desired_replicas
    if NOW + offset - 900 <= NOW < NOW + offset + 3600:
        assert desired >= min(window_min, policy.max_replicas)
    assert desired >= plan(base).desired_replicas


@settings(max_examples=300, deadline=None)
@given(uppers=uppers_st, fleet=fleet_st, policy=policy_st, cold=cold_st)
def test_property_ready_capacity_covers_the_upper_quantile_one_cold_start_ahead(
    uppers: list[float], fleet: FleetState, policy: ScalingPolicy, cold: float
) -> None:
    # Replicas requested now are ready at now + cold start; they must cover the upper
    # quantile of every step up to then, whenever maxReplicas allows it. Within a
    # stabilization period after a release, a forecast alone adds none back (only what
    # arrives now, or a floor, does): the fleet keeps what it has until the period ends.
    fc = forecast(uppers)
    desired = plan(inputs(uppers, fleet, policy, cold)).desired_replicas
    released = fleet.last_scale_down_at
    settled = released is None or NOW - released >= policy.scale_down_stabilization_seconds
    for point in fc.points:
        if point.t - STEP <= NOW + cold:
            need = CAPACITY.required(point.upper).replicas
            if settled:
                assert desired >= min(need, policy.max_replicas)
            else:
                assert desired >= min(need, policy.max_replicas, fleet.current_replicas)


def test_event_windows_cover_past_and_future_occurrences_with_safe_names() -> None:
    from prescaler.planning import event_windows

    window = ScheduledWindow(
        "black-friday", cron="0 8 * * *", duration_seconds=3600, min_replicas=3
    )
    events = event_windows([window], NOW - 3 * 86400, NOW + 86400)
    assert len(events) == 5  # 08:00 UTC on days -3 .. +1 (NOW is 08:00 UTC itself)
    assert {e.name for e in events} == {"black_friday"}
    assert all(e.end - e.start == 3600 for e in events)


FORECAST_MODE = ScalingPolicy(
    min_replicas=1,
    max_replicas=20,
    scale_down_mode="forecast",
    scale_down_stabilization_seconds=120,
    scale_down_requires_observation=True,
)


def test_forecast_mode_releases_at_once_what_the_lookahead_does_not_need() -> None:
    fc = forecast([4.0] * 8)
    # Paced: one step of at most 50 %; forecast mode: straight to what the lookahead needs.
    assert run(fc, 12, observed=3.0) == 6
    assert run(fc, 12, observed=3.0, policy=FORECAST_MODE) == 4
    # A later scale-down does not wait for a period after the last one.
    assert run(fc, 12, observed=3.0, policy=FORECAST_MODE, last_down=NOW - 30) == 4


def test_forecast_mode_keeps_what_a_later_peak_inside_the_lookahead_needs() -> None:
    fc = forecast([2.0, 2.0, 2.0, 9.0, 2.0, 2.0, 2.0, 2.0])
    assert run(fc, 12, observed=2.0, policy=FORECAST_MODE) == 9


def test_forecast_mode_still_waits_after_a_scale_up_and_never_shrinks_blind() -> None:
    fc = forecast([4.0] * 8)
    assert run(fc, 12, observed=3.0, policy=FORECAST_MODE, last_up=NOW - 60) == 12
    assert run(fc, 12, observed=3.0, policy=FORECAST_MODE, last_up=NOW - 121) == 4
    assert run(fc, 12, observed=None, policy=FORECAST_MODE) == 12
    assert run(None, 12, observed=3.0, policy=FORECAST_MODE) == 12
