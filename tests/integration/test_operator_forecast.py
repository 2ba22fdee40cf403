"""The operator with a real Prometheus: forecast-driven pre-scaling and standby lifecycle.

History is a backfilled daily cycle whose ramp falls a few minutes after the test starts
(the backfill reaches a few minutes into the future, so the rate at "now" is real too).
Cold starts are seconds (kwok delay), so the test runs in a few minutes.
"""

from __future__ import annotations

import math
import time
from datetime import datetime
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from cluster.objects import gpu_deployment
from integration.history_world import HistoryWorld, world_fixture  # noqa: F401 (fixtures)
from integration.operator_fixtures import (  # noqa: F401 (fixtures)
    Kube,
    crd_fixture,
    operator_fixture,
    wait_for,
)
from prescaler.metrics import Metrics

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus]

DAY = 86_400
STEP = 60
LOW, HIGH = 2.0, 18.0
# 600 prompt + 150 output tokens per request (the harness' vLLM profile): 5 req/s per replica.
MODEL = {"tokensPerSecond": 3750, "promptTokens": 600, "outputTokens": 150}
REPLICA_RPS = 5.0


def ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def pool_over_daily_ramp(
    world: HistoryWorld,
    name: str,
    ramp_at: float,
    *,
    pool: dict[str, Any],
    horizon: int,
    ready_delay: str,
) -> None:
    """Three days of a daily cycle: LOW, except HIGH for 30 minutes from ``ramp_at``'s time
    of day; from three days ago to 15 minutes ahead. Pool ``name`` over it."""
    world.pool_over_history(
        name,
        lambda t: HIGH if (t - ramp_at) % DAY < 1800 else LOW,
        ramp_at - 3 * DAY - 600,
        time.time() + 900,
        pool=pool,
        forecast=forecast_fields(horizon),
        ready_delay=ready_delay,
    )


def forecast_fields(horizon: int) -> dict[str, Any]:
    return {
        "engine": "vllm",
        "model": "seasonal_naive",
        "lookbackSeconds": 3 * DAY,
        "stepSeconds": STEP,
        "horizonSeconds": horizon,
        "refitSeconds": 60,
        "quantile": 0.9,
        "headroom": 1.0,
    }


def test_scales_up_ahead_of_the_forecast_ramp(world: HistoryWorld, operator: Metrics) -> None:
    k = world.kube
    # A wide margin and a far ramp leave a slow first forecast or reconcile room on a busy
    # machine; the assertions below still hold the plan to the cold start.
    cold_start, margin = 20, 60
    ramp_at = math.ceil((time.time() + 300) / STEP) * STEP
    pool_over_daily_ramp(
        world,
        "chat",
        ramp_at,
        pool={
            "minReplicas": 1,
            "maxReplicas": 8,
            "model": MODEL,
            "coldStart": {"mode": "fixed", "seconds": cold_start, "marginSeconds": margin},
        },
        horizon=600,
        ready_delay=f"{cold_start}s",
    )
    first = wait_for(lambda: k.status("chat").get("forecast"), 60, "a forecast in status")
    assert first["model"] == "seasonal_naive"
    assert 10 <= len(first["points"]) <= 12
    assert k.deployment("llm").spec.replicas == 1, "no reason to scale before the ramp nears"
    healthy = k.condition("chat", "ForecastHealthy")
    assert healthy is not None
    assert healthy["status"] == "True"
    available = k.condition("chat", "MetricsAvailable")
    assert available is not None
    assert available["status"] == "True"

    # Watch until the fleet grows; keep the forecast seen just before.
    forecasts: list[dict[str, Any]] = []

    def grown() -> bool:
        status = k.status("chat")
        if status.get("forecast"):
            forecasts.append(status["forecast"])
        return bool(k.deployment("llm").spec.replicas > 1)

    wait_for(grown, ramp_at - time.time() + 30, "a scale-up", interval=0.5)
    scaled = k.event("chat", "ScaledUp")
    scaled_at = (scaled.event_time or scaled.first_timestamp).timestamp()
    # Where the forecast rises above what one replica serves (start of that step).
    points = forecasts[-1]["points"]
    rise = next(ts(p["t"]) - STEP for p in points if p["upper"] > REPLICA_RPS)
    assert abs(rise - ramp_at) <= STEP, (rise, ramp_at, points)
    assert scaled_at <= rise - cold_start, (scaled_at, rise)
    # The ramp is gradual at the forecast's resolution: the fleet grows with it, and the
    # full fleet is ready before the forecast reaches the level that needs it.
    need = math.ceil(HIGH / REPLICA_RPS)
    full = next(ts(p["t"]) - STEP for p in points if p["upper"] > (need - 1) * REPLICA_RPS)
    wait_for(
        lambda: (k.deployment("llm").status.ready_replicas or 0) >= need,
        max(1.0, full - time.time() + 30),
        f"{need} ready replicas",
    )
    _, ready = pod_times(k, "llm")  # the API server's times, not this test's polling
    assert ready[need - 1] <= full + 1, "the full fleet was ready only after the demand needed it"
    status = k.status("chat")
    assert status["plan"]["constraint"] in ("compute", "memory")
    assert status["forecast"]["peak"] >= HIGH * 0.8
    assert status["lastScaleUpTime"]


def pod_times(k: Kube, app: str) -> tuple[list[float], list[float]]:
    """Server-side times of the target's pods: creations and Ready transitions, sorted."""
    pods = k.core.list_namespaced_pod(k.ns, label_selector=f"app={app}").items
    created = sorted(p.metadata.creation_timestamp.timestamp() for p in pods)
    ready = sorted(
        c.last_transition_time.timestamp()
        for p in pods
        for c in (p.status.conditions or [])
        if c.type == "Ready" and c.status == "True"
    )
    return created, ready


def test_the_full_fleet_is_ready_a_margin_before_yesterdays_step_comes_back(
    world: HistoryWorld, operator: Metrics
) -> None:
    """History is a daily step from 2 to 20 req/s at ``step_at``'s time of day, read back
    through the operator's own Prometheus source. Every replica the step needs is Ready at
    least the margin before the true step time.

    Two things made the last replicas Ready only at the step (margin 60 s, Ready at T+2 s):
    seasonal_naive smoothed yesterday with a centred mean, so its forecast reached the full
    level one step after the step (a median keeps the edge where it was), and a plan stood
    until the next reconcile without its lookahead covering that time. Read late (a rate
    window taken as the interval that starts at its stamp, up to 90 s late), the full fleet
    was asked for 90 s later still.
    """
    k = world.kube
    low, high = 2.0, 20.0
    # kwok's ready delay is the pods' start-up; the pool's cold start adds what a busy
    # machine spends between the plan and a pod's creation, scheduling and API latency.
    ready_delay, margin = 60, 60
    cold_start = ready_delay + 30
    need = math.ceil(high / REPLICA_RPS)
    # Time for the operator's first forecast before the lookahead reaches the rise.
    step_at = math.ceil((time.time() + 420) / STEP) * STEP
    world.backfill(
        lambda t: high if (t - step_at) % DAY < 3600 else low,
        step_at - 3 * DAY - 600,
        time.time() + 900,
        offset=7,  # off the minute
    )
    k.create_deployment(gpu_deployment("llm", 1, ready_delay=f"{ready_delay}s"))
    # The pool's first history read falls just after a minute boundary, the phase at which
    # the late reading was measured (90 s late); the aligned reading does not depend on it.
    time.sleep((-time.time()) % STEP + 1)
    world.create_pool(
        "daily",
        {
            "minReplicas": 1,
            "maxReplicas": 8,
            "model": MODEL,
            "coldStart": {"mode": "fixed", "seconds": cold_start, "marginSeconds": margin},
        },
        forecast_fields(horizon=900),
    )
    wait_for(lambda: k.status("daily").get("forecast"), 120, "a forecast in status")
    assert time.time() < step_at - cold_start - margin, "the test started too late to judge"
    # A generous deadline (a busy machine): wait for the outcome, then judge it by the API
    # server's own timestamps, not by when this thread happened to look.
    wait_for(
        lambda: (k.deployment("llm").status.ready_replicas or 0) >= need,
        max(1.0, step_at - time.time()) + 300,
        f"{need} ready replicas",
        interval=1.0,
    )
    created, ready = pod_times(k, "llm")
    asked = created[need - 1]  # the pod that completed the full fleet
    last_ready = ready[need - 1]
    assert asked <= step_at - margin - ready_delay, ("asked for late", asked - step_at, created)
    assert last_ready <= step_at - margin, ("Ready late", last_ready - step_at, ready)


def test_standby_objects_are_created_sized_and_collected(
    world: HistoryWorld, kube: Any, operator: Metrics
) -> None:
    k, namespace = world.kube, world.namespace
    # The ramp is inside the forecast horizon but beyond the lookahead: the plan keeps
    # one replica and warm standby for the rest of the peak.
    ramp_at = math.ceil((time.time() + 400) / STEP) * STEP
    pool_over_daily_ramp(
        world,
        "warm",
        ramp_at,
        pool={
            "maxReplicas": 8,
            "model": MODEL,
            "coldStart": {"mode": "fixed", "seconds": 5, "marginSeconds": 5},
            "standby": {
                "imagePrePull": {"enabled": True},
                "placeholders": {"enabled": True, "maxReplicas": 2},
            },
        },
        horizon=1200,
        ready_delay="1s",
    )
    status = wait_for(
        lambda: (s := k.status("warm")).get("standby", {}).get("placeholders") and s,
        60,
        "standby in status",
    )
    standby = status["plan"]["standbyReplicas"]
    assert standby == 2, status["plan"]  # peak needs 4, plan holds 1, capped at maxReplicas 2
    holder = wait_for(
        lambda: (d := k.deployment("warm-placeholder")).status.ready_replicas == standby and d,
        30,
        "placeholders running",
    )
    assert holder.spec.replicas == standby
    pod_spec = holder.spec.template.spec
    assert pod_spec.priority_class_name == "prescaler-placeholder"
    assert pod_spec.containers[0].resources.requests["nvidia.com/gpu"] == "1"
    priority = client.SchedulingV1Api(kube).read_priority_class("prescaler-placeholder")
    assert priority.value is not None
    assert priority.value < 0
    daemonset = wait_for(
        lambda: (
            (d := k.apps.read_namespaced_daemon_set("warm-prepull", namespace)).status.number_ready
            == 3
            and d
        ),
        30,
        "pre-pull pods on the 3 GPU nodes",
    )
    assert daemonset.spec.template.spec.containers[0].image == "vllm/vllm-openai:fake"
    pool = k.pool("warm")
    for obj in (holder, daemonset):
        owners = obj.metadata.owner_references
        assert [(o.kind, o.uid, o.controller) for o in owners] == [
            ("InferencePool", pool["metadata"]["uid"], True)
        ]
    # kopf marks nothing on our own object (no finalizer: deleting the pool or its namespace
    # needs no running operator; no progress or diffbase annotation), nor on the target.
    assert not pool["metadata"].get("finalizers"), pool["metadata"]
    assert not pool["metadata"].get("annotations"), pool["metadata"]
    target = k.deployment("llm")
    assert not target.metadata.finalizers
    assert not any(
        "kopf" in key or "prescaler" in key for key in (target.metadata.annotations or {})
    )

    replicas_before = target.spec.replicas
    k.delete_pool("warm")

    def gone() -> bool:
        try:
            k.apps.read_namespaced_daemon_set("warm-prepull", namespace)
            return False
        except ApiException as exc:
            if exc.status != 404:
                raise
        try:
            k.deployment("warm-placeholder")
            return False
        except ApiException as exc:
            return bool(exc.status == 404)

    wait_for(gone, 60, "standby objects garbage-collected with the pool")
    wait_for(
        lambda: (
            not k.custom.list_namespaced_custom_object(
                "prescaler.io", "v1alpha1", namespace, "inferencepools"
            )["items"]
        ),
        30,
        "the pool to go",
    )
    assert k.deployment("llm").spec.replicas == replicas_before, "the target keeps its size"
