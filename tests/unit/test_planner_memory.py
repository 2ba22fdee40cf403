"""The planner's memory of recent targets: a release keeps the largest target of the last
lookahead plus stabilization period, so a forecast that jumps from one decision to the
next does not flap the fleet; the memory survives a restart through the pool's status."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from prescaler.api import InferencePoolStatus, PlanStatus, RecentTarget, parse_spec, scaling_policy
from prescaler.capacity import CapacityModel, TokenProfile
from prescaler.controller.status import recent_targets, rfc3339
from prescaler.planning import (
    FleetState,
    PlanInputs,
    RiskSizing,
    ScalePlan,
    ScalingPolicy,
    ScheduledWindow,
    plan,
)

NOW = 1_800_000_000.0
STEP = 60.0
COLD_START = 240.0
# 1 request/s per replica.
CAPACITY = CapacityModel(TokenProfile(600, 400), tokens_per_second=1000)
POLICY = ScalingPolicy(
    min_replicas=1,
    max_replicas=20,
    scale_down_mode="forecast",
    scale_down_stabilization_seconds=120.0,
)
MEMORY = COLD_START + POLICY.lead_margin_seconds + POLICY.scale_down_stabilization_seconds


class Flat:
    """A flat forecast of ``rps`` made at ``at``."""

    def __init__(self, rps: float, at: float) -> None:
        self.generated_at, self.step_seconds = at, STEP
        self.points = tuple(_Point(at + STEP * (i + 1), rps) for i in range(20))


class _Point:
    def __init__(self, t: float, rps: float) -> None:
        self.t, self.mean, self.upper = t, rps, rps


def decide(
    current: int, rps: float, now: float, recent: tuple[tuple[float, int], ...]
) -> ScalePlan:
    return plan(
        PlanInputs(
            now=now,
            capacity=CAPACITY,
            fleet=FleetState(current, current, recent_targets=recent),
            policy=POLICY,
            cold_start_seconds=COLD_START,
            forecast=Flat(rps, now),
        )
    )


def test_a_release_keeps_the_largest_recent_target() -> None:
    # 200 s ago a forecast asked for 9; now one asks for 4: the fleet of 9 keeps 9.
    held = decide(9, 4.0, NOW, ((NOW - 200.0, 9),))
    assert held.target_replicas == 4
    assert held.desired_replicas == 9
    assert held.action == "hold"
    # Without that memory, the same decision releases to 4.
    assert decide(9, 4.0, NOW, ()).desired_replicas == 4


def test_the_memory_ends_after_the_lookahead_plus_the_period() -> None:
    inside = decide(9, 4.0, NOW, ((NOW - MEMORY + 1.0, 7),))
    assert inside.desired_replicas == 7  # released to what was asked for inside the memory
    beyond = decide(9, 4.0, NOW, ((NOW - MEMORY, 7),))
    assert beyond.desired_replicas == 4


def test_the_memory_never_holds_a_scale_up_back_and_keeps_only_what_bounds_the_maximum() -> None:
    up = decide(3, 8.0, NOW, ((NOW - 120.0, 5),))
    assert up.desired_replicas == 8
    # 5 is below the new target: it can never be the largest again, so it is dropped.
    assert up.recent_targets == ((NOW, 8),)
    later = decide(8, 6.0, NOW + 30.0, up.recent_targets)
    assert later.recent_targets == ((NOW, 8), (NOW + 30.0, 6))
    # A larger target than every earlier one replaces them all.
    assert decide(8, 10.0, NOW + 60.0, later.recent_targets).recent_targets == ((NOW + 60.0, 10),)


def test_an_idle_pool_reaches_zero_whatever_the_memory_says() -> None:
    policy = ScalingPolicy(
        min_replicas=0,
        max_replicas=20,
        scale_down_mode="forecast",
        scale_down_stabilization_seconds=120.0,
    )
    idle = plan(
        PlanInputs(
            now=NOW,
            capacity=CAPACITY,
            fleet=FleetState(
                1, 1, None, None, 0.0, idle_seconds=300.0, recent_targets=((NOW - 100.0, 1),)
            ),
            policy=policy,
            cold_start_seconds=COLD_START,
            forecast=Flat(0.0, NOW),
        )
    )
    assert idle.desired_replicas == 0


def test_the_memory_round_trips_through_the_status() -> None:
    status = InferencePoolStatus(
        plan=PlanStatus(
            action="hold",
            reason="r",
            constraint="compute",
            target_replicas=4,
            lookahead_seconds=300.0,
            recent_targets=[
                RecentTarget(at=rfc3339(NOW - 60.0), replicas=9),
                RecentTarget(at="garbage", replicas=12),
                RecentTarget(at=rfc3339(NOW), replicas=4),
            ],
        )
    )
    assert recent_targets(status) == ((NOW - 60.0, 9), (NOW, 4))
    assert recent_targets(InferencePoolStatus()) == ()


def test_a_window_floor_is_not_remembered() -> None:
    start = datetime.fromtimestamp(NOW, UTC)
    window = ScheduledWindow(
        name="launch", start=start, end=start + timedelta(minutes=10), min_replicas=12
    )
    during = plan(
        PlanInputs(
            now=NOW + 300.0,
            capacity=CAPACITY,
            fleet=FleetState(12, 12),
            policy=POLICY,
            cold_start_seconds=COLD_START,
            forecast=Flat(2.0, NOW + 300.0),
            windows=(window,),
        )
    )
    assert during.desired_replicas == 12
    assert during.recent_targets == ((NOW + 300.0, 2),)  # demand's target, not the floor


def after_release(
    forecast_rps: float,
    observed_rps: float | None,
    released_ago: float,
    windows: tuple[ScheduledWindow, ...] = (),
) -> ScalePlan:
    """A fleet of 5 that released a replica ``released_ago`` seconds ago, and a forecast of
    ``forecast_rps`` (1 request/s per replica)."""
    return plan(
        PlanInputs(
            now=NOW,
            capacity=CAPACITY,
            fleet=FleetState(
                5,
                5,
                last_scale_down_at=NOW - released_ago,
                observed_requests_per_second=observed_rps,
            ),
            policy=POLICY,
            cold_start_seconds=COLD_START,
            forecast=Flat(forecast_rps, NOW),
            windows=windows,
        )
    )


def test_a_forecast_alone_does_not_add_back_within_the_period_after_a_release() -> None:
    # Released 60 s ago; the forecast now asks for 7, and what arrives (4 req/s) needs 4.
    held = after_release(7.0, 4.0, 60.0)
    assert held.target_replicas == 7
    assert (held.desired_replicas, held.action, held.driver) == (5, "hold", "stabilization")
    assert "only what arrives now adds replicas back" in held.reason
    # After the period the same forecast adds them back; so does a missing release.
    assert after_release(7.0, 4.0, POLICY.scale_down_stabilization_seconds).desired_replicas == 7
    assert after_release(7.0, 4.0, 1e9).desired_replicas == 7
    # A missing observation does not add them back within the period either.
    assert after_release(7.0, None, 60.0).desired_replicas == 5


def test_what_arrives_now_or_a_window_adds_back_at_once_after_a_release() -> None:
    # What arrives now (6 req/s) needs more than the 5 left: the plan scales to its target.
    short = after_release(7.0, 6.0, 60.0)
    assert (short.desired_replicas, short.action) == (7, "scale_up")
    # A window's floor is known ahead: it is honoured within the period too.
    start = datetime.fromtimestamp(NOW, UTC)
    window = ScheduledWindow(
        name="launch", start=start, end=start + timedelta(minutes=10), min_replicas=8
    )
    warmed = after_release(2.0, 2.0, 60.0, windows=(window,))
    assert (warmed.desired_replicas, warmed.driver) == (8, "window")


# With the peak risk model (margin 1: it sizes for what is known now, 1 request/s per
# replica), as the product plans.
SIZING = RiskSizing(margin=1.0, level=0.9, calibrated=True)
RAMP = replace(POLICY, observed_trend_seconds=120.0)


def sized(
    current: int,
    rps: float,
    *,
    rise: float | None = None,
    recent: tuple[tuple[float, int], ...] = (),
) -> ScalePlan:
    """A fleet of ``current`` that sees ``rps`` arrive (and forecasts it flat), rising at
    ``rise`` per second."""
    return plan(
        PlanInputs(
            now=NOW,
            capacity=CAPACITY,
            fleet=FleetState(
                current,
                current,
                observed_requests_per_second=rps,
                observed_rise_per_second=rise,
                recent_targets=recent,
            ),
            policy=RAMP,
            cold_start_seconds=COLD_START,
            forecast=Flat(rps, NOW),
            risk=SIZING,
        )
    )


def test_a_release_keeps_the_hpas_tolerance_to_spare() -> None:
    # 5.2 req/s needs 6 replicas, and 5 would serve it with 4 % to spare: within the HPA's
    # 10 %, the fleet of 6 holds, and the memory remembers 6 for it.
    held = sized(6, 5.2)
    assert (held.target_replicas, held.desired_replicas, held.driver) == (6, 6, "forecast")
    near = sized(7, 5.2)
    assert (near.target_replicas, near.desired_replicas, near.driver) == (6, 6, "forecast")
    edge = sized(6, 4.6)  # 5 replicas serve 4.6 with 9 % to spare: not enough
    assert (edge.target_replicas, edge.desired_replicas, edge.driver) == (5, 6, "memory")
    assert edge.recent_targets == ((NOW, 6),)
    # Beyond the tolerance, the release goes through: 4.5 req/s with 11 % to spare.
    assert sized(6, 4.5).desired_replicas == 5
    # A remembered decision holds with its tolerance too, for the memory's span.
    assert sized(6, 4.0, recent=((NOW - 200.0, 6),)).desired_replicas == 6
    assert sized(6, 4.0, recent=((NOW - MEMORY - 400.0, 6),)).desired_replicas == 5


def test_a_ramp_the_nowcast_alone_sees_extends_a_scale_up_but_does_not_start_one() -> None:
    # 5 req/s arrive, rising 0.01/s: the ramp nowcast sizes for 6.2 (7 replicas), but what
    # arrives now fits the 6 there are: no replica for a climb that may be a noisy minute.
    held = sized(6, 5.0, rise=0.01)
    assert held.target_replicas == 7
    assert (held.desired_replicas, held.action, held.driver) == (6, "hold", "stabilization")
    assert "only the ramp nowcast asks for more" in held.reason
    # Once what arrives now needs more than the fleet, the scale-up takes the ramp along:
    # 6.2 req/s need 7 replicas, and the ramp sizes for 7.4 (8).
    climbing = sized(6, 6.2, rise=0.01)
    assert (climbing.desired_replicas, climbing.action) == (8, "scale_up")
    # Without a rise, the same fleet and demand hold: the rule changes nothing else.
    assert sized(6, 5.0).desired_replicas == 6


def with_budget(
    current: int,
    rps: float,
    budget: int | None,
    *,
    up: float | None,
    down: float | None,
    policy: ScalingPolicy = POLICY,
    reserve: int | None = None,
) -> ScalePlan:
    """A fleet of ``current`` on a flat forecast of ``rps``, its last scale-up at ``up``
    and scale-down at ``down`` (well past the period), ``budget`` direction changes left
    over the day and ``reserve`` over the week."""
    return plan(
        PlanInputs(
            now=NOW,
            capacity=CAPACITY,
            fleet=FleetState(current, current, last_scale_up_at=up, last_scale_down_at=down),
            policy=policy,
            cold_start_seconds=COLD_START,
            forecast=Flat(rps, NOW),
            direction_budget=budget,
            direction_reserve=reserve,
        )
    )


def test_a_release_that_reverses_a_scale_up_waits_while_no_direction_change_is_left() -> None:
    """The fleet changes direction no more often than its shadow HPA over the trailing
    day: with none left, a release after a scale-up holds, and says why."""
    up, down = NOW - 3600, NOW - 7200
    held = with_budget(8, 3.0, 0, up=up, down=down)
    assert (held.action, held.desired_replicas, held.driver) == ("hold", 8, "direction")
    assert "as often as its shadow HPA" in held.reason
    assert with_budget(8, 3.0, -2, up=up, down=down).desired_replicas == 8
    # With one left, or with no budget known (no shadow), it releases.
    for budget in (1, None):
        released = with_budget(8, 3.0, budget, up=up, down=down)
        assert (released.action, released.desired_replicas) == ("scale_down", 3)


def test_a_release_of_most_of_the_fleet_spends_the_weeks_direction_changes() -> None:
    """With the day's direction changes spent, a release that frees more than half the
    fleet goes ahead while the trailing week has one left (a night is not held at the
    evening's peak); a smaller one, or any with the week's spent too, still waits."""
    up, down = NOW - 3600, NOW - 7200
    released = with_budget(8, 3.0, 0, up=up, down=down, reserve=1)
    assert (released.action, released.desired_replicas) == ("scale_down", 3)
    assert "spends one of the week's 1" in released.reason
    # Half the fleet or less: the day's limit holds, whatever the week has left.
    half = with_budget(8, 4.0, 0, up=up, down=down, reserve=5)
    assert (half.action, half.desired_replicas, half.driver) == ("hold", 8, "direction")
    # The week's spent as well: the release waits, however much it frees.
    for reserve in (0, -1, None):
        held = with_budget(8, 3.0, 0, up=up, down=down, reserve=reserve)
        assert (held.action, held.desired_replicas, held.driver) == ("hold", 8, "direction")
    # With the day's changes left, the week's play no part.
    assert with_budget(8, 3.0, 1, up=up, down=down, reserve=0).desired_replicas == 3


def test_the_direction_budget_never_holds_a_scale_up_or_a_release_that_goes_on() -> None:
    """A release after a release is no change of direction, and a scale-up is never held
    (the budget only delays releases: it never costs a replica demand asks for)."""
    up, down = NOW - 7200, NOW - 3600  # the last scale was down
    again = with_budget(8, 3.0, 0, up=up, down=down)
    assert (again.action, again.desired_replicas) == ("scale_down", 3)
    rise = with_budget(3, 8.0, -5, up=up, down=down)
    assert (rise.action, rise.desired_replicas) == ("scale_up", 8)
    rise = with_budget(3, 8.0, -5, up=down, down=up)  # after a scale-up: still up
    assert (rise.action, rise.desired_replicas) == ("scale_up", 8)


def test_a_pool_that_frees_its_direction_changes_releases_whatever_the_budget() -> None:
    """``spec.scaleDown.directionChanges: free`` (the policy's field, from the spec) lets a
    release go with no direction change left."""
    free = parse_spec(
        {
            "target": {"name": "llm"},
            "model": {"tokensPerSecond": 1000},
            "scaleDown": {"directionChanges": "free"},
        }
    )
    assert (
        parse_spec(
            {"target": {"name": "llm"}, "model": {"tokensPerSecond": 1000}}
        ).scale_down.direction_changes
        == "asHpa"
    )
    policy = replace(POLICY, direction_changes_as_hpa=scaling_policy(free).direction_changes_as_hpa)
    assert policy.direction_changes_as_hpa is False
    released = plan(
        PlanInputs(
            now=NOW,
            capacity=CAPACITY,
            fleet=FleetState(8, 8, last_scale_up_at=NOW - 3600, last_scale_down_at=NOW - 7200),
            policy=policy,
            cold_start_seconds=COLD_START,
            forecast=Flat(3.0, NOW),
            direction_budget=0,
        )
    )
    assert (released.action, released.desired_replicas) == ("scale_down", 3)


class Dip:
    """A forecast made at ``at``, two hours of minutes: ``low`` until ``back`` seconds
    ahead, then ``high``."""

    def __init__(self, low: float, high: float, back: float, at: float = NOW) -> None:
        self.generated_at, self.step_seconds = at, STEP
        self.points = tuple(
            _Point(at + STEP * (i + 1), low if STEP * (i + 1) < back else high) for i in range(120)
        )


def after(forecast: Dip, *, up: float, down: float, policy: ScalingPolicy = POLICY) -> ScalePlan:
    """A fleet of 8 (well past its stabilization period) on ``forecast``."""
    return plan(
        PlanInputs(
            now=NOW,
            capacity=CAPACITY,
            fleet=FleetState(8, 8, last_scale_up_at=up, last_scale_down_at=down),
            policy=policy,
            cold_start_seconds=COLD_START,
            forecast=forecast,
        )
    )


def test_a_release_that_reverses_a_scale_up_keeps_what_the_forecast_asks_back() -> None:
    """A release after a scale-up is a direction change: it keeps what the forecast asks
    for again after the lookahead, over its horizon, and waits wholly if that is every
    replica (a dip the forecast sees the end of is not worth two changes)."""
    up, down = NOW - 3600, NOW - 7200
    lookahead = COLD_START + POLICY.lead_margin_seconds
    soon = lookahead + 1800.0
    held = after(Dip(3.0, 8.0, soon), up=up, down=down)
    assert (held.action, held.desired_replicas, held.driver) == ("hold", 8, "release")
    assert held.target_replicas == 3
    assert "asks 8 back within its horizon" in held.reason
    partly = after(Dip(3.0, 6.0, soon), up=up, down=down)
    assert (partly.action, partly.desired_replicas) == ("scale_down", 6)
    # Asked back only beyond the forecast's horizon (two hours): the release goes whole.
    late = after(Dip(3.0, 8.0, 121 * STEP), up=up, down=down)
    assert (late.action, late.desired_replicas) == ("scale_down", 3)


def test_a_release_after_a_release_keeps_what_the_forecast_asks_back_too() -> None:
    """Buying replicas back after any release is a direction change: a release that goes
    on keeps what the forecast asks back as well (it waits wholly when that is every
    replica), and with ``directionChanges: free`` it releases to the lookahead's target."""
    soon = COLD_START + POLICY.lead_margin_seconds + 1800.0
    up, down = NOW - 7200, NOW - 3600  # the last scale was down
    on = after(Dip(3.0, 8.0, soon), up=up, down=down)
    assert (on.action, on.desired_replicas, on.driver) == ("hold", 8, "release")
    partly = after(Dip(3.0, 6.0, soon), up=up, down=down)
    assert (partly.action, partly.desired_replicas) == ("scale_down", 6)
    late = after(Dip(3.0, 8.0, 121 * STEP), up=up, down=down)
    assert (late.action, late.desired_replicas) == ("scale_down", 3)
    free = replace(POLICY, direction_changes_as_hpa=False)
    released = after(Dip(3.0, 8.0, soon), up=NOW - 3600, down=NOW - 7200, policy=free)
    assert (released.action, released.desired_replicas) == ("scale_down", 3)


def test_a_release_that_reverses_a_scale_up_frees_more_than_the_hpas_tolerance() -> None:
    """A direction change is not spent on a tenth of the fleet or less (the HPA does not
    act within its 10 % tolerance): after a scale-up, a fleet of 20 that 19 serve holds,
    one that 17 serve releases 3; after a scale-down, it releases the one."""
    up, down = NOW - 3600, NOW - 7200
    held = with_budget(20, 19.0, None, up=up, down=down)
    assert (held.action, held.desired_replicas, held.driver) == ("hold", 20, "release")
    assert held.target_replicas == 19
    assert "tolerance" in held.reason
    assert with_budget(20, 18.0, None, up=up, down=down).desired_replicas == 20  # 2 of 20
    released = with_budget(20, 17.0, None, up=up, down=down)
    assert (released.action, released.desired_replicas) == ("scale_down", 17)
    on = with_budget(20, 19.0, None, up=down, down=up)
    assert (on.action, on.desired_replicas) == ("scale_down", 19)
    free = replace(POLICY, direction_changes_as_hpa=False)
    loose = with_budget(20, 19.0, None, up=up, down=down, policy=free)
    assert (loose.action, loose.desired_replicas) == ("scale_down", 19)
