"""The pool's degradation as the operator publishes it: arriving capacity from the pods,
the status round trip that carries the hysteresis, the ConfigMap contract and the Event."""

from __future__ import annotations

from dataclasses import replace

from prescaler.api import ColdStartStatus, InferencePoolStatus, parse_spec
from prescaler.api import capacity_model as build_capacity
from prescaler.controller import degradation
from prescaler.controller.model import Gathered
from prescaler.controller.status import rfc3339
from prescaler.kube import PodStart, Workload
from prescaler.planning import FleetState, PlanInputs, ScalingPolicy, plan
from prescaler.sources import Snapshot

NOW = 1_800_000_000.0
COLD = 120.0
SPEC = parse_spec({"target": {"name": "llm"}, "model": {"tokensPerSecond": 1000}})
CAPACITY = build_capacity(SPEC)


def gathered(pods: tuple[PodStart, ...], replicas: int, ready: int, waiting: float) -> Gathered:
    return Gathered(
        workload=Workload("Deployment", "llm", replicas, ready, "app=llm"),
        current_replicas=replicas,
        cold_start=ColdStartStatus(seconds=COLD, source="fixed"),
        snapshot=Snapshot(at=NOW, requests_per_second=1.0, waiting=waiting),
        metrics_problem=None,
        forecast=None,
        pods=pods,
    )


def decision(current: int, desired: int):  # type: ignore[no-untyped-def]
    fleet = FleetState(current, current, observed_requests_per_second=0.0)
    policy = ScalingPolicy(min_replicas=desired, max_replicas=max(desired, 1))
    return plan(PlanInputs(NOW, CAPACITY, fleet, policy, cold_start_seconds=COLD))


def test_arrivals_are_the_starting_pods_and_the_replicas_without_a_pod() -> None:
    pods = (
        PodStart("ready", NOW - 900, NOW - 800, scheduled_at=NOW - 899),
        PodStart("starting", NOW - 60, None, scheduled_at=NOW - 50),
        PodStart("no-node", NOW - 60, None, unschedulable="0/2 nodes are available"),
        PodStart("leaving", NOW - 60, None, scheduled_at=NOW - 50, terminating=True),
        PodStart("late", NOW - 500, None, scheduled_at=NOW - 400),  # overdue: any moment now
    )
    g = gathered(pods, replicas=4, ready=1, waiting=0.0)
    d = decision(4, 6)
    assert d.desired_replicas == 6
    times = degradation.arrivals(g, d, NOW)
    # The starting pod at scheduled + cold start, the overdue one now; the replicas the
    # plan adds (6 wanted, 4 pods not leaving) one cold start from now; none for the
    # pod no node can take, nor for the one leaving.
    assert times == (NOW, NOW - 50 + COLD, NOW + COLD, NOW + COLD)
    # A dry run asks for nothing: only the target's own replicas are on their way.
    assert degradation.arrivals(g, d, NOW, applied=False) == (NOW, NOW - 50 + COLD)
    # A measured cold start that includes a wait for a node: a pod already on a node is
    # left with the start-up part only (not the wait a second time).
    measured = ColdStartStatus(
        seconds=COLD + 90, source="measured", p90_seconds=COLD + 90, startup_p90_seconds=COLD
    )
    g = replace(g, cold_start=measured)
    assert degradation.arrivals(g, d, NOW, applied=False) == (NOW, NOW - 50 + COLD)


def test_the_status_round_trip_keeps_the_hysteresis() -> None:
    g = gathered((), replicas=2, ready=2, waiting=300.0)
    d = decision(2, 2)
    first = degradation.assess_pool(SPEC, CAPACITY, g, d, InferencePoolStatus(), NOW)
    assert first.level == "critical"
    assert first.changed
    status = InferencePoolStatus(
        degradation=degradation.degradation_status(first, "pool-degradation")
    )
    again = InferencePoolStatus.model_validate(status.model_dump(by_alias=True))
    # The queue is gone a minute later: the level holds through the pool's hold time.
    calm = replace(g, snapshot=Snapshot(at=NOW + 60, requests_per_second=1.0, waiting=0.0))
    held = degradation.assess_pool(SPEC, CAPACITY, calm, d, again, NOW + 60)
    assert held.level == "critical"
    assert not held.changed
    assert held.state.calm_since == NOW + 60


def test_the_config_map_carries_every_key_of_the_contract_as_strings() -> None:
    g = gathered((), replicas=2, ready=2, waiting=100.0)
    result = degradation.assess_pool(SPEC, CAPACITY, g, decision(2, 2), InferencePoolStatus(), NOW)
    data = degradation.config_map_data("pool", degradation.degradation_status(result, "x"))
    assert tuple(data) == degradation.CONFIG_MAP_KEYS
    assert all(isinstance(v, str) for v in data.values())
    assert data["contract"] == "prescaler.io/degradation/v1"
    assert data["level"] == "warning"
    assert data["queueDepthLimit"] == "100"  # 50 per serving replica at warning
    assert data["retryAfterSeconds"] == str(int(COLD))  # nothing on its way: one cold start
    assert data["shedLanes"] == "batch"
    assert data["maxContextTokens"] == ""  # no KV model: no cap
    assert data["since"] == rfc3339(NOW)


def test_a_change_has_one_event_saying_why_and_what_to_do() -> None:
    g = gathered((), replicas=2, ready=2, waiting=300.0)
    result = degradation.assess_pool(SPEC, CAPACITY, g, decision(2, 2), InferencePoolStatus(), NOW)
    type_, reason, message = degradation.change_event(InferencePoolStatus(), result)
    assert (type_, reason) == ("Warning", "DegradationRaised")
    assert message.startswith("degradation normal -> critical: queue 300 waiting")
    assert "503 beyond 20 waiting" in message
