"""The planner's memory of recent targets: a release keeps the largest target of the last
lookahead plus stabilization period, so a forecast that jumps from one decision to the
next does not flap the fleet; the memory survives a restart through the pool's status."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from prescaler.api import InferencePoolStatus, PlanStatus, RecentTarget
from prescaler.capacity import CapacityModel, TokenProfile
from prescaler.controller.status import recent_targets, rfc3339
from prescaler.planning import (
    FleetState,
    PlanInputs,
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
