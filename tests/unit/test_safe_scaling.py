"""Features that make scaling safe, on the pure parts: the planner's rules for unschedulable
replicas, idle pools and hot standby; the drain ranking; the idle clock; the cold start
without waits for a node; the pod view of the Kubernetes adapter."""

from __future__ import annotations

from typing import Any

import pytest

from prescaler.api import ColdStartSpec, DemandStatus
from prescaler.capacity import CapacityModel, TokenProfile
from prescaler.controller.status import idle_since, learn_cold_start, rfc3339
from prescaler.kube import DELETION_COST_ANNOTATION, ROLE_LABEL, PodStart, pod_start
from prescaler.planning import (
    FleetState,
    PlanInputs,
    PodLoad,
    ScalePlan,
    ScalingPolicy,
    drain_plan,
    plan,
)
from prescaler.sources import Snapshot
from unit.fake_forecasts import Forecast, Point
from unit.test_status_pipeline import FakeKube, _condition, _kube, _reconciler, _run, _spec, _window

NOW = 1_800_000_000.0
STEP = 60.0
CAPACITY = CapacityModel(TokenProfile(600, 400), tokens_per_second=1000)  # 1 req/s a replica
PERIOD = 300.0


def flat(upper: float) -> Forecast:
    return Forecast(tuple(Point(NOW + STEP * (i + 1), upper, upper) for i in range(20)), NOW)


def decide(
    fleet: FleetState, forecast: Forecast | None = None, min_replicas: int = 1, **policy: Any
) -> ScalePlan:
    return plan(
        PlanInputs(
            now=NOW,
            capacity=CAPACITY,
            fleet=fleet,
            policy=ScalingPolicy(
                min_replicas=min_replicas,
                max_replicas=20,
                scale_down_mode="forecast",
                scale_down_stabilization_seconds=PERIOD,
                scale_down_requires_observation=True,
                **policy,
            ),
            cold_start_seconds=120.0,
            forecast=forecast,
        )
    )


# ---------------------------------------------------------------------- capacity awareness
def test_unschedulable_replicas_hold_a_scale_up() -> None:
    fleet = FleetState(5, ready_replicas=3, observed_requests_per_second=8.0)
    assert decide(fleet, flat(8.0)).desired_replicas == 8  # the control: it would grow
    stuck = decide(FleetState(5, 3, None, None, 8.0, unschedulable_replicas=2), flat(8.0))
    assert (stuck.action, stuck.desired_replicas, stuck.target_replicas) == ("hold", 5, 8)
    assert stuck.unschedulable_replicas == 2
    assert "2 replicas cannot be scheduled" in stuck.reason


def test_unschedulable_replicas_do_not_hold_a_scale_up_to_min_replicas() -> None:
    # One replica, its pod waiting for room; the floor is 3 and demand asks for 8.
    stuck = decide(FleetState(1, 0, None, None, 8.0, unschedulable_replicas=1), flat(8.0), 3)
    assert (stuck.action, stuck.desired_replicas, stuck.target_replicas) == ("scale_up", 3, 8)
    assert stuck.driver == "floor"
    assert "1 replicas cannot be scheduled" in stuck.reason
    # At the floor already: nothing more while a pod waits.
    at_floor = decide(FleetState(3, 2, None, None, 8.0, unschedulable_replicas=1), flat(8.0), 3)
    assert (at_floor.action, at_floor.desired_replicas) == ("hold", 3)


def test_unschedulable_replicas_do_not_stop_a_scale_down() -> None:
    fleet = FleetState(5, 3, None, None, 1.0, unschedulable_replicas=2)
    assert decide(fleet, flat(1.0)).desired_replicas == 1


def _pod(name: str, created: float, ready: float | None, **kw: Any) -> PodStart:
    return PodStart(name, created, ready, **kw)


def test_cold_start_includes_the_wait_for_a_node_and_shows_both_parts() -> None:
    spec = ColdStartSpec(mode="auto", seconds=300, samples=10)
    pods = [
        _pod("a", 100, 160, scheduled_at=100),
        _pod("waits", 110, None, unschedulable="0/3 nodes are available"),
        _pod("b", 120, 185, scheduled_at=121),
    ]
    learned = learn_cold_start(None, spec, pods, now=200)
    assert learned.samples == [60.0, 65.0], "a pod waiting for a node holds up no other"
    assert learned.pending == ["waits"]
    # An autoscaler's node came 90 s after the pod: the whole wait is lead time.
    pods[1] = _pod("waits", 110, 110 + 90 + 60, scheduled_at=110 + 90)
    again = learn_cold_start(learned, spec, pods, now=300)
    assert again.samples == [60.0, 65.0, 150.0]
    assert again.scheduling_samples == [0.0, 1.0, 90.0]
    assert again.seconds == again.p90_seconds == 150.0
    assert again.scheduling_p90_seconds == 90.0
    assert again.startup_p90_seconds == 64.0


def test_capacity_that_never_comes_is_left_out_of_the_cold_start() -> None:
    spec = ColdStartSpec(mode="auto", seconds=300, samples=10)
    stuck = _pod("stuck", 100, None, unschedulable="0/3 nodes are available")
    waiting = learn_cold_start(None, spec, [stuck, _pod("a", 100, 160)], now=100 + 899)
    assert waiting.pending == ["stuck"]
    given_up = learn_cold_start(waiting, spec, [stuck], now=100 + 900)
    assert given_up.pending == []
    # If it is scheduled after all, long after, it is not a sample either.
    late = _pod("stuck", 100, 100 + 2000, scheduled_at=100 + 1950)
    assert learn_cold_start(given_up, spec, [late], now=3000).samples == [60.0]


def test_a_pod_on_its_way_out_before_it_was_ready_is_not_waited_for() -> None:
    spec = ColdStartSpec(mode="auto", seconds=300, samples=10)
    gone = _pod("gone", 100, None, terminating=True)
    assert learn_cold_start(None, spec, [gone], now=101).pending == []


T0 = "2027-01-15T08:0"


def test_pod_view_reads_scheduling_deletion_cost_and_role() -> None:
    def pod(conditions: list[dict[str, Any]], **meta: Any) -> dict[str, Any]:
        base = {"name": "p", "creationTimestamp": "2027-01-15T08:00:00Z", **meta}
        return {"metadata": base, "status": {"conditions": conditions}}

    pending = pod_start(
        pod(
            [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/4 nodes are available: 3 Insufficient nvidia.com/gpu.",
                }
            ]
        )
    )
    assert pending.unschedulable == "0/4 nodes are available: 3 Insufficient nvidia.com/gpu."
    assert not pending.ready
    running = pod_start(
        pod(
            [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": T0 + "0:05Z"},
                {"type": "Ready", "status": "True", "lastTransitionTime": T0 + "1:05Z"},
            ],
            annotations={DELETION_COST_ANNOTATION: "7"},
            labels={ROLE_LABEL: "hot-standby"},
        )
    )  # fmt: skip
    assert running.unschedulable is None
    assert running.ready_at is not None
    assert running.scheduled_at is not None
    assert running.ready_at - running.scheduled_at == 60
    assert (running.deletion_cost, running.role) == (7, "hot-standby")
    gone = pod_start(pod([], deletionTimestamp="2027-01-15T08:02:00Z"))
    assert gone.terminating
    assert pod_start(pod([], annotations={DELETION_COST_ANNOTATION: "x"})).deletion_cost is None


# ---------------------------------------------------------------------- drain
def test_drain_costs_are_running_requests_and_only_changes_are_written() -> None:
    pods = [PodLoad("a"), PodLoad("b", deletion_cost=6), PodLoad("c", deletion_cost=9)]
    drain = drain_plan(pods, {"a": 0.0, "b": 6.0, "c": 1.4, "gone": 3.0})
    assert dict(drain.costs) == {"a": 0, "c": 1}  # b already carries 6
    assert drain.reason == "drain: idlest first by running requests (a 0, c 1, b 6)"


def test_drain_never_guesses() -> None:
    pods = [PodLoad("a", deletion_cost=3), PodLoad("b")]
    partial = drain_plan(pods, {"a": 2.0})
    assert partial.costs == ()
    assert "no per-pod running requests for b" in partial.reason
    assert "left as they are" in partial.reason
    failed = drain_plan(pods, None, "query running: connection refused")
    assert failed.costs == ()
    assert "connection refused" in failed.reason


# ---------------------------------------------------------------------- idle pools
def test_an_idle_pool_reaches_zero_after_a_whole_stabilization_period() -> None:
    # The series is absent: no forecast, no observation. Idle for the whole period.
    idle = decide(FleetState(2, 2, idle_seconds=PERIOD), None, min_replicas=0)
    assert (idle.action, idle.desired_replicas, idle.idle) == ("scale_down", 0, True)
    # A zero series with a forecast of zero: the same.
    zero = decide(FleetState(2, 2, None, None, 0.0, idle_seconds=PERIOD + 1), flat(0.0), 0)
    assert zero.desired_replicas == 0


def test_an_absent_series_right_after_a_restart_holds() -> None:
    # The clock restarted with the operator: idle for less than the period.
    fresh = decide(FleetState(2, 2, idle_seconds=5.0), None, min_replicas=0)
    assert (fresh.action, fresh.desired_replicas, fresh.idle) == ("hold", 2, False)
    # No idle clock at all (Prometheus unreachable): hold as well.
    assert decide(FleetState(2, 2), None, min_replicas=0).desired_replicas == 2


def test_zero_demand_stops_at_one_replica_until_idle_long_enough() -> None:
    short = decide(FleetState(3, 3, None, None, 0.0, idle_seconds=10.0), flat(0.0), 0)
    assert (short.action, short.desired_replicas) == ("scale_down", 1)
    assert "zero only after 300s of zero or absent demand" in short.reason
    at_one = decide(FleetState(1, 1, None, None, 0.0, idle_seconds=10.0), flat(0.0), 0)
    assert at_one.action == "steady"


def test_idle_never_overrides_min_replicas_a_forecast_or_demand() -> None:
    assert decide(FleetState(2, 2, idle_seconds=1e6), None, min_replicas=1).desired_replicas == 2
    rising = decide(FleetState(2, 2, None, None, 0.0, idle_seconds=1e6), flat(3.0), 0)
    assert rising.desired_replicas == 3
    woken = decide(FleetState(0, 0, None, None, 2.0), None, min_replicas=0)
    assert (woken.action, woken.desired_replicas) == ("scale_up", 2)


def _snapshot(rps: float | None, absent: bool = False) -> Snapshot:
    return Snapshot(at=NOW, requests_per_second=rps, demand_absent=absent)


def test_the_idle_clock_counts_only_witnessed_zero_or_absent_demand() -> None:
    started = NOW - 1000
    before = DemandStatus(idle_since=rfc3339(NOW - 600))
    assert idle_since(before, _snapshot(0.0), NOW, started) == NOW - 600
    assert idle_since(before, _snapshot(None, absent=True), NOW, started) == NOW - 600
    assert idle_since(None, _snapshot(0.0), NOW, started) == NOW  # starts now
    assert idle_since(before, _snapshot(0.5), NOW, started) is None  # demand
    assert idle_since(before, _snapshot(None), NOW, started) is None  # garbage value
    assert idle_since(before, None, NOW, started) is None  # Prometheus unreachable
    # A restarted operator starts the clock at its first reconcile, whatever status says.
    assert idle_since(before, _snapshot(None, absent=True), NOW, NOW - 5) == NOW - 5


# ---------------------------------------------------------------------- hot standby
def test_hot_standby_is_promoted_while_ready_capacity_falls_short() -> None:
    up = decide(FleetState(2, 2, None, None, 5.0, hot_ready_replicas=2), flat(5.0))
    assert (up.desired_replicas, up.promote_replicas, up.retire_replicas) == (5, 2, 0)
    one = decide(FleetState(2, 2, None, None, 3.0, hot_ready_replicas=2), flat(3.0))
    assert one.promote_replicas == 1  # only the gap
    covered = decide(FleetState(3, 3, None, None, 3.0, hot_ready_replicas=2), flat(3.0))
    assert covered.promote_replicas == 0


def test_promoted_pods_retire_as_the_targets_own_replicas_become_ready() -> None:
    def step(ready: int) -> tuple[int, int]:
        fleet = FleetState(5, ready, None, None, 5.0, promoted_replicas=2, hot_ready_replicas=2)
        p = decide(fleet, flat(5.0))
        return p.promote_replicas, p.retire_replicas

    assert step(3) == (0, 0)
    assert step(4) == (0, 1)
    assert step(5) == (0, 2)
    assert step(2) == (1, 0)  # a promoted pod is not enough: one more


def test_a_promoted_pod_that_turned_not_ready_is_retired_and_replaced_from_standby() -> None:
    def step(ready: int, hot_ready: int) -> tuple[int, int, int]:
        # 5 wanted; 2 promoted, one of which turned not Ready (so not counted as serving).
        fleet = FleetState(
            5,
            ready,
            None,
            None,
            5.0,
            promoted_replicas=1,
            promoted_unready_replicas=1,
            hot_ready_replicas=hot_ready,
        )
        p = decide(fleet, flat(5.0))
        return p.promote_replicas, p.retire_replicas, p.retire_unready_replicas

    assert step(3, 2) == (1, 0, 1)  # retired, and a ready standby pod takes its place
    assert step(3, 0) == (0, 0, 1)  # retired even with no standby pod to replace it
    assert step(5, 2) == (0, 1, 1)  # the target's own replicas cover the plan: all go


@pytest.mark.parametrize("promoted", [0, 1])
def test_hot_standby_does_not_change_the_replica_count(promoted: int) -> None:
    fleet = FleetState(2, 2, None, None, 4.0, promoted_replicas=promoted, hot_ready_replicas=1)
    assert decide(fleet, flat(4.0)).desired_replicas == 4


# ---------------------------------------------------------------------- the pipeline
class Kube(FakeKube):
    """The pipeline's fake Kubernetes, with pod patches and deletions recorded."""

    hot: list[PodStart]

    async def list_pod_starts(self, namespace: str, selector: str) -> list[PodStart]:
        return list(getattr(self, "hot", [])) if "prescaler.io/role" in selector else self.pods

    async def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self.calls.append(("patch_pod", name, patch))

    async def delete_pod(self, namespace: str, name: str) -> None:
        self.calls.append(("delete_pod", name))


def _fake(replicas: int, ready: int) -> Kube:
    kube = Kube()
    kube.workloads = _kube(replicas, ready).workloads
    return kube


def test_unschedulable_replicas_are_a_condition_and_one_event_per_change() -> None:
    kube = _fake(3, 2)
    message = "0/4 nodes are available: 3 Insufficient nvidia.com/gpu."
    kube.pods = [
        PodStart("a", NOW - 100, NOW - 50),
        PodStart("b", NOW - 100, NOW - 40),
        PodStart("c", NOW - 30, None, unschedulable=message),
    ]
    spec = _spec(schedules=[_window(-10, 3600, 5)])
    status = _run(_reconciler(kube), spec)
    cond = _condition(status, "CapacityAvailable")
    assert (cond["status"], cond["reason"]) == ("False", "Unschedulable")
    assert cond["message"].startswith("1 of 3 replicas cannot be scheduled")
    assert message in cond["message"]
    assert kube.calls == [], "no more replicas while one cannot be scheduled"
    assert status["plan"]["action"] == "hold"
    assert "1 unschedulable" in _condition(status, "Ready")["message"]
    assert [(e[0], e[1]) for e in kube.events] == [("Warning", "Unschedulable")]
    again = _run(_reconciler(kube), spec, status)
    assert len(kube.events) == 1, "the same state is not reported again"
    kube.pods[2] = PodStart("c", NOW - 30, None, scheduled_at=NOW)
    cleared = _run(_reconciler(kube), spec, again)
    assert _condition(cleared, "CapacityAvailable")["status"] == "True"
    assert [e[1] for e in kube.events][1:] == ["ScaledUp", "Schedulable"]
    assert kube.calls == [("scale", "Deployment", "llm", 5)]


def test_hot_standby_pods_are_promoted_into_the_target_and_retired() -> None:
    kube = _fake(2, 2)
    kube.hot = [
        PodStart("hot-1", NOW - 300, NOW - 200, role="hot-standby"),
        PodStart("hot-2", NOW - 300, NOW - 100, role="hot-standby"),
        PodStart("hot-3", NOW - 10, None, role="hot-standby"),
    ]
    spec = _spec(schedules=[_window(-10, 3600, 4)], standby={"hot": {"replicas": 3}})
    status = _run(_reconciler(kube), spec)
    patched = [c for c in kube.calls if c[0] == "patch_pod"]
    assert [c[1] for c in patched] == ["hot-1", "hot-2"]
    meta = patched[0][2]["metadata"]
    assert meta["labels"] == {
        "app": "llm",
        "prescaler.io/pool": "pool",
        "prescaler.io/role": "promoted",
    }
    assert meta["ownerReferences"][0]["kind"] == "InferencePool"
    assert ("scale", "Deployment", "llm", 4) in kube.calls
    assert "HotStandbyPromoted" in [e[1] for e in kube.events]
    assert status["standby"]["hot"]["promoted"] == 2
    assert _condition(status, "Ready")["status"] == "True"  # 2 ready + 2 promoted
    # The target's own replicas become Ready: the promoted pods go.
    kube.workloads = _fake(4, 4).workloads
    kube.hot = [PodStart(n, NOW - 300, NOW - 100, role="promoted") for n in ("hot-1", "hot-2")]
    kube.calls.clear()
    after = _run(_reconciler(kube), spec, status)
    assert kube.calls == [("delete_pod", "hot-1"), ("delete_pod", "hot-2")]
    assert after["standby"]["hot"]["promoted"] == 0


def test_a_promoted_pod_that_turns_not_ready_is_deleted_and_another_promoted() -> None:
    kube = _fake(4, 2)
    kube.hot = [
        PodStart("hot-1", NOW - 300, NOW - 200, role="promoted"),
        PodStart("hot-2", NOW - 300, None, role="promoted"),  # its readiness probe fails
        PodStart("hot-3", NOW - 100, NOW - 50, role="hot-standby"),
        PodStart("hot-4", NOW - 10, None, role="hot-standby"),  # still loading
    ]
    spec = _spec(schedules=[_window(-10, 3600, 4)], standby={"hot": {"replicas": 2}})
    status = _run(_reconciler(kube), spec)
    assert [c[:2] for c in kube.calls] == [("delete_pod", "hot-2"), ("patch_pod", "hot-3")]
    assert [(e[0], e[1]) for e in kube.events] == [
        ("Warning", "HotStandbyNotReady"),
        ("Normal", "HotStandbyPromoted"),
    ]
    assert "deleted promoted hot-2: no longer Ready" in kube.events[0][2]
    assert "promoting hot-3" in kube.events[0][2]
    assert status["standby"]["hot"]["promoted"] == 2  # hot-1 and hot-3
    assert _condition(status, "Ready")["status"] == "True"  # 2 ready + 2 promoted
    # No ready standby left: the failed pod still goes, and nothing replaces it yet.
    kube.hot = [
        PodStart("hot-1", NOW - 300, None, role="promoted"),
        PodStart("hot-3", NOW - 300, NOW - 100, role="promoted"),
        PodStart("hot-4", NOW - 10, None, role="hot-standby"),
    ]
    kube.calls.clear()
    after = _run(_reconciler(kube), spec, status)
    assert kube.calls == [("delete_pod", "hot-1")]
    assert "no ready hot standby pod to promote" in kube.events[-1][2]
    assert after["standby"]["hot"]["promoted"] == 1
    assert _condition(after, "Ready")["status"] == "False"  # 2 ready + 1 promoted of 4


def test_a_scale_down_without_per_pod_metrics_says_so_and_patches_no_pod() -> None:
    kube = _fake(4, 4)
    kube.pods = [PodStart(f"p{i}", NOW - 500, NOW - 400) for i in range(4)]
    status = _run(_reconciler(kube), _spec())
    assert kube.calls == [("scale", "Deployment", "llm", 1)]
    assert status["plan"]["reason"].endswith(
        "drain: no per-pod running requests (no spec.forecast), pod deletion costs left as they are"
    )
