"""Features that make scaling safe, on the real local cluster (kwok GPU nodes: 3 x 8 GPUs)
with a real Prometheus: drain-aware scale-down, GPU capacity awareness, idle pools and
hot standby promotion. The operator runs as the Helm chart's ServiceAccount, so every API
call here is also checked against the chart's RBAC.

No assertion depends on how long something took: waits are on conditions with generous
deadlines, and orderings are read from the objects' own timestamps.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import pytest
from kubernetes import client

from cluster.kwok_stages import NOT_READY_ANNOTATION, READY_DELAY_ANNOTATION
from cluster.objects import gpu_deployment
from cluster.prometheus import Prometheus, Sample
from integration.history_world import (  # noqa: F401 (fixtures)
    HistoryWorld,
    scrape_times,
    world_fixture,
)
from integration.operator_fixtures import (  # noqa: F401 (fixtures)
    Kube,
    crd_fixture,
    operator_fixture,
    wait_for,
)
from prescaler.kube import DELETION_COST_ANNOTATION
from prescaler.metrics import Metrics

pytestmark = [pytest.mark.cluster]

DAY = 86_400
# 600 prompt + 150 output tokens per request (the harness' vLLM profile): 5 req/s a replica.
MODEL = {"tokensPerSecond": 3750, "promptTokens": 600, "outputTokens": 150}


def _window(minimum: int) -> list[dict[str, Any]]:
    fmt = "%Y-%m-%dT%H:%M:%S"
    start, end = time.gmtime(time.time() - 60), time.gmtime(time.time() + 3600)
    return [
        {
            "name": "w",
            "start": time.strftime(fmt, start),
            "end": time.strftime(fmt, end),
            "minReplicas": minimum,
            "leadSeconds": 0,
        }
    ]


def _pods(k: Kube, selector: str) -> list[Any]:
    """Pods matching ``selector`` that are not on their way out."""
    items = k.core.list_namespaced_pod(k.ns, label_selector=selector).items
    return [p for p in items if p.metadata.deletion_timestamp is None]


def _ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# ---------------------------------------------------------------------- drain-aware
@pytest.mark.prometheus
def test_the_busiest_pod_survives_a_scale_down(world: HistoryWorld, operator: Metrics) -> None:
    k = world.kube
    k.create_deployment(gpu_deployment("llm", 3, ready_delay="1s"))
    pods = wait_for(
        lambda: len(ready := [p for p in _pods(k, "app=llm") if _ready(p)]) == 3 and ready,
        60,
        "three ready pods",
    )
    names = sorted(p.metadata.name for p in pods)
    busiest = names[1]
    running = {names[0]: 0.0, busiest: 6.0, names[2]: 1.0}
    # Three days of a steady 1 req/s (one replica's worth) for the forecast, and each
    # pod's running requests now, labelled by pod as a Prometheus scrape labels them.
    now = time.time()
    times = scrape_times(now - 3 * DAY, now + 900)
    samples = world.samples(times, lambda _: 1.0, pods=("history",))
    samples = [s for s in samples if s.name != "vllm:num_requests_running"]
    for pod, value in running.items():
        labels = {"namespace": world.namespace, "pod": pod, "model_name": "llm"}
        samples += [Sample("vllm:num_requests_running", labels, t, value) for t in times[-120:]]
    world.prometheus.backfill(samples)

    world.create_pool(
        "chat",
        {
            "minReplicas": 1,
            "maxReplicas": 4,
            "model": MODEL,
            "coldStart": {"mode": "fixed", "seconds": 5, "marginSeconds": 5},
            "scaleDown": {"mode": "forecast", "stabilizationSeconds": 0},
        },
        {"model": "seasonal_naive", "lookbackSeconds": 3 * DAY, "horizonSeconds": 600},
    )
    wait_for(lambda: k.deployment("llm").spec.replicas == 1, 120, "the scale-down to 1")
    left = wait_for(lambda: len(rest := _pods(k, "app=llm")) == 1 and rest, 60, "two pods removed")
    assert left[0].metadata.name == busiest
    costs = {
        p.metadata.name: (p.metadata.annotations or {}).get(DELETION_COST_ANNOTATION) for p in left
    }
    assert costs == {busiest: "6"}
    event = k.event("chat", "ScaledDown")
    assert [e.reason for e in k.events("chat")].count("ScaledDown") == 1
    assert f"drain: idlest first by running requests ({names[0]} 0, {names[2]} 1, {busiest} 6)" in (
        event.message
    )


# ---------------------------------------------------------------------- GPU capacity
def test_unschedulable_replicas_are_reported_and_not_added_to(
    kube: Any, namespace: str, operator: Metrics
) -> None:
    k = Kube(kube, namespace)
    delay = 2.0
    # 4 GPUs a replica: at most 6 fit on 3 nodes x 8 GPUs.
    k.create_deployment(gpu_deployment("big", 1, gpus=4, ready_delay=f"{delay:g}s"))
    spec = {
        "target": {"name": "big"},
        "minReplicas": 1,
        "maxReplicas": 20,
        "model": MODEL,
        "coldStart": {"mode": "auto", "seconds": 300, "samples": 20},
        "scaleUp": {"maxStep": 4},
        "scaleDown": {"mode": "forecast", "stabilizationSeconds": 0},
        "schedules": _window(20),
    }
    k.create_pool("big", spec)
    cond = wait_for(
        lambda: (c := k.condition("big", "CapacityAvailable")) and c["status"] == "False" and c,
        120,
        "CapacityAvailable=False",
    )
    assert cond["reason"] == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in cond["message"]
    # A later reconcile held instead of adding replicas that could not schedule either.
    plan = wait_for(
        lambda: (p := k.status("big").get("plan")) and "cannot be scheduled" in p["reason"] and p,
        60,
        "a plan that holds on unschedulable replicas",
    )
    assert plan["action"] == "hold"
    replicas = k.deployment("big").spec.replicas
    assert replicas < 20, "stopped below the window's 20"
    stuck = [
        p
        for p in _pods(k, "app=big")
        if any(c.reason == "Unschedulable" for c in p.status.conditions or [])
    ]
    assert stuck
    assert k.deployment("big").spec.replicas == replicas
    # Every ready pod is a cold-start sample; the unschedulable ones never are, and they
    # do not hold up counting the pods created after them.
    ready = [p for p in _pods(k, "app=big") if _ready(p)]
    cold = wait_for(
        lambda: (c := k.status("big").get("coldStart")) and len(c["samples"]) >= len(ready) and c,
        60,
        "every ready pod sampled",
    )
    assert all(s <= delay + 3 for s in cold["samples"]), cold
    warnings = [e for e in k.events("big") if e.reason == "Unschedulable"]
    assert warnings
    assert all(e.type == "Warning" for e in warnings)
    messages = [e.message for e in warnings]
    assert len(messages) == len(set(messages)), "one Event per change, not per reconcile"

    # Room again: the window asks for what fits, the Pending replicas go first.
    k.patch_pool("big", {"schedules": _window(len(ready))})
    wait_for(
        lambda: (c := k.condition("big", "CapacityAvailable")) and c["status"] == "True",
        120,
        "CapacityAvailable=True",
    )
    wait_for(
        lambda: "Schedulable" in [e.reason for e in k.events("big")], 30, "a Schedulable Event"
    )


# ---------------------------------------------------------------------- idle pools
@pytest.mark.prometheus
def test_an_idle_pool_with_an_absent_series_reaches_zero_after_its_stabilization(
    kube: Any, namespace: str, prometheus: Prometheus, operator: Metrics
) -> None:
    k = Kube(kube, namespace)
    period = 8
    k.create_deployment(gpu_deployment("idle", 2, ready_delay="1s"))
    k.create_pool(
        "idle",
        {
            "target": {"name": "idle"},
            "minReplicas": 0,
            "maxReplicas": 4,
            "model": MODEL,
            "coldStart": {"mode": "fixed", "seconds": 5, "marginSeconds": 5},
            "scaleDown": {"mode": "forecast", "stabilizationSeconds": period},
            # An empty Prometheus: the demand series is absent.
            "forecast": {"prometheus": {"url": prometheus.url}, "model": "seasonal_naive"},
        },
    )
    since = wait_for(
        lambda: (k.status("idle").get("demand") or {}).get("idleSince"), 60, "idleSince"
    )
    held = k.status("idle")
    assert held["plan"]["action"] == "hold"
    assert k.deployment("idle").spec.replicas == 2
    wait_for(lambda: k.deployment("idle").spec.replicas == 0, 120, "the pool to reach zero")
    event = k.event("idle", "ScaledDown")
    assert [e.reason for e in k.events("idle")].count("ScaledDown") == 1
    scaled_at = (event.event_time or event.first_timestamp).timestamp()
    assert scaled_at >= _ts(since) + period - 1  # second-resolution timestamps
    assert "idle: no demand" in event.message


# ---------------------------------------------------------------------- hot standby
def _not_ready(k: Kube, pod: str, failing: bool, ready_delay: str | None = None) -> None:
    """Make ``pod``'s readiness probe fail (kwok takes it out of Ready) or pass again
    (Ready after ``ready_delay``, else its own)."""
    annotations: dict[str, str | None] = {NOT_READY_ANNOTATION: "true" if failing else None}
    if ready_delay is not None:
        annotations[READY_DELAY_ANNOTATION] = ready_delay
    k.core.patch_namespaced_pod(pod, k.ns, {"metadata": {"annotations": annotations}})


def test_a_hot_standby_pod_is_promoted_into_the_service_and_the_standby_refills(
    kube: Any, namespace: str, operator: Metrics
) -> None:
    k = Kube(kube, namespace)
    delay = 20
    k.create_deployment(gpu_deployment("llm", 1, ready_delay=f"{delay}s"))
    k.core.create_namespaced_service(
        namespace,
        {
            "metadata": {"name": "llm"},
            "spec": {"selector": {"app": "llm"}, "ports": [{"port": 8000}]},
        },
    )
    discovery: Any = client.DiscoveryV1Api(k.core.api_client)

    def serving() -> set[str]:
        slices = discovery.list_namespaced_endpoint_slice(
            namespace, label_selector="kubernetes.io/service-name=llm"
        ).items
        return {
            e.target_ref.name
            for s in slices
            for e in s.endpoints or []
            if e.target_ref is not None and (e.conditions is None or e.conditions.ready)
        }

    k.create_pool(
        "chat",
        {
            "target": {"name": "llm"},
            "minReplicas": 1,
            "maxReplicas": 4,
            "model": MODEL,
            "coldStart": {"mode": "fixed", "seconds": delay, "marginSeconds": 0},
            "schedules": _window(1),
            "standby": {"hot": {"replicas": 2}},
        },
    )
    hot_selector = "prescaler.io/pool=chat,prescaler.io/role=hot-standby"
    promoted_selector = "prescaler.io/pool=chat,prescaler.io/role=promoted"
    ready_hot = wait_for(
        lambda: len(ready := [p for p in _pods(k, hot_selector) if _ready(p)]) == 2 and ready,
        90,
        "two ready hot standby pods",
    )
    hot = {p.metadata.name for p in ready_hot}
    (own,) = wait_for(lambda: serving() or None, 60, "the target's own pod in the Service")
    assert not hot & serving(), "hot standby pods are outside the Service"

    k.patch_pool("chat", {"schedules": _window(2)})
    # The target's new replica stays in its cold start (its readiness probe fails) until
    # released below: the promoted pods bridge it meanwhile.
    (starting,) = wait_for(
        lambda: [
            p.metadata.name
            for p in _pods(k, "app=llm,!prescaler.io/role")
            if p.metadata.name != own
        ],
        60,
        "the target's new replica",
    )
    _not_ready(k, starting, True)
    own_ready: list[int] = []

    def promoted_and_serving() -> set[str]:
        promoted = hot & serving()
        if promoted:
            own_ready.append(k.deployment("llm").status.ready_replicas or 0)
        return promoted

    (first,) = wait_for(promoted_and_serving, 60, "a promoted pod in the Service")
    (second,) = hot - {first}
    # It serves while the target's new replica is still in its cold start.
    assert own_ready == [1]
    promoted = k.core.read_namespaced_pod(first, namespace)
    assert promoted.metadata.labels["prescaler.io/role"] == "promoted"
    assert promoted.metadata.labels["app"] == "llm"
    assert [o.kind for o in promoted.metadata.owner_references] == ["InferencePool"]

    # The promoted pod's engine fails: it leaves the Service, is deleted, and the other
    # ready standby pod is promoted in its place.
    _not_ready(k, first, True)
    wait_for(
        lambda: (
            second in serving()
            and first not in {p.metadata.name for p in _pods(k, "prescaler.io/pool=chat")}
        ),
        60,
        "the failed pod replaced by the other standby pod",
    )
    failed = wait_for(
        lambda: [e for e in k.events("chat") if e.reason == "HotStandbyNotReady"],
        60,
        "the HotStandbyNotReady Event",
    )
    assert failed[0].type == "Warning"
    assert f"deleted promoted {first}: no longer Ready" in failed[0].message
    assert f"promoting {second}" in failed[0].message
    # The standby refills with new pods; the target's ReplicaSet adopts no promoted pod
    # (it stays at its own 2).
    wait_for(
        lambda: len([p for p in _pods(k, hot_selector) if p.metadata.name not in hot]) == 2,
        60,
        "the hot standby refilled",
    )
    assert k.deployment("llm").spec.replicas == 2
    # Once both of the target's own replicas are Ready, the promoted pod is retired.
    _not_ready(k, starting, False, ready_delay="1s")
    wait_for(lambda: not _pods(k, promoted_selector), 90, "the promoted pod retired")
    assert (k.deployment("llm").status.ready_replicas or 0) == 2

    # The operator posts the Event after the delete: wait for it, don't race it.
    def retired() -> list[Any]:
        events = k.events("chat")
        return events if any(e.reason == "HotStandbyRetired" for e in events) else []

    events = wait_for(retired, 60, "the HotStandbyRetired Event")
    # In that order, as far as the API server's timestamps (whole seconds) tell: two
    # Events of one second have no order among them.
    first_at: dict[str, Any] = {}
    for e in events:
        first_at.setdefault(e.reason, e.metadata.creation_timestamp)
    assert (
        first_at["HotStandbyPromoted"]
        <= first_at["HotStandbyNotReady"]
        <= first_at["HotStandbyRetired"]
    )
    assert k.deployment("llm").spec.replicas == 2
    wait_for(lambda: k.status("chat")["standby"]["hot"].get("promoted") == 0, 30, "promoted: 0")
