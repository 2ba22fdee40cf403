"""The measured lead time includes the wait for a node, on the real local cluster.

A GPU Deployment's pods select a node pool that does not exist yet. The operator scales it
up; its pod waits, unschedulable, until a kwok GPU node of that pool appears, as a cluster
autoscaler or Karpenter would bring it, at least 90 s after the pod was created. The pool's
measured cold start must cover that wait: it is lead time a forecast scale-up has to plan
for, not only the engine's start-up.

The only wall-clock wait is the scenario's own (the node comes 90 s late); every assertion
is on object timestamps and status values.
"""

from __future__ import annotations

import contextlib
import time
from datetime import datetime
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from cluster.launcher import gpu_node
from cluster.objects import gpu_deployment
from integration.operator_fixtures import (  # noqa: F401 (fixtures)
    Kube,
    crd_fixture,
    operator_fixture,
    wait_for,
)
from prescaler.metrics import Metrics

pytestmark = [pytest.mark.cluster]

MODEL = {"tokensPerSecond": 3750, "promptTokens": 600, "outputTokens": 150}
NODE_WAIT = 90.0
"""How long after the pod's creation its node appears, at least."""
READY_DELAY = 5.0
"""The fake engine's start-up on the node: scheduled -> Ready."""
POOL_LABEL = "prescaler.io/test-node-pool"
POOL_TAINT = "prescaler.io/test-node-pool"


def _ts(value: datetime) -> float:
    return value.timestamp()


def _pods(k: Kube) -> list[Any]:
    items = k.core.list_namespaced_pod(k.ns, label_selector="app=llm").items
    return [p for p in items if p.metadata.deletion_timestamp is None]


def _condition(pod: Any, kind: str) -> Any:
    return next((c for c in pod.status.conditions or [] if c.type == kind), None)


def test_the_cold_start_includes_the_wait_for_a_node_an_autoscaler_brings(
    kube: Any, namespace: str, operator: Metrics
) -> None:
    k = Kube(kube, namespace)
    # A node pool of this test's own: only its pods select it, and only they tolerate its
    # taint, so no other test's pod lands on the node while it exists.
    pool = namespace
    deployment = gpu_deployment("llm", 0, ready_delay=f"{READY_DELAY:g}s")
    template = deployment["spec"]["template"]["spec"]
    template["nodeSelector"] = {POOL_LABEL: pool}
    template["tolerations"] = [
        {"key": POOL_TAINT, "operator": "Equal", "value": pool, "effect": "NoSchedule"}
    ]
    k.create_deployment(deployment)
    k.create_pool(
        "chat",
        {
            "target": {"name": "llm"},
            "minReplicas": 1,
            "maxReplicas": 2,
            "model": MODEL,
            "coldStart": {"mode": "auto", "seconds": 30, "samples": 5},
        },
    )
    wait_for(lambda: k.deployment("llm").spec.replicas == 1, 60, "the scale-up to 1")
    (pod,) = wait_for(
        lambda: (
            len(pods := _pods(k)) == 1
            and (c := _condition(pods[0], "PodScheduled"))
            and c.reason == "Unschedulable"
            and pods
        ),
        60,
        "the pod, unschedulable",
    )
    created = _ts(pod.metadata.creation_timestamp)
    cond = wait_for(
        lambda: (c := k.condition("chat", "CapacityAvailable")) and c["status"] == "False" and c,
        60,
        "CapacityAvailable=False while the pod waits for a node",
    )
    assert cond["reason"] == "Unschedulable"
    # Remembered, not yet a sample (nor given up on: that takes 15 minutes unscheduled).
    waiting = wait_for(
        lambda: (
            (c := k.status("chat").get("coldStart"))
            and pod.metadata.name in c.get("pending", [])
            and c
        ),
        60,
        "the pod pending in status.coldStart",
    )
    assert not waiting.get("samples"), waiting

    # The node comes (creation timestamps have second resolution: one more for safety).
    time.sleep(max(0.0, created + NODE_WAIT + 1 - time.time()))
    node = f"late-gpu-{namespace}"
    k.core.create_node(
        gpu_node(
            node,
            gpus=1,
            labels={POOL_LABEL: pool},
            taints=[{"key": POOL_TAINT, "value": pool, "effect": "NoSchedule"}],
        )
    )
    try:
        came = _ts(k.core.read_node(node).metadata.creation_timestamp)
        assert came >= created + NODE_WAIT, "the node came at least 90 s after the pod"
        ready = wait_for(
            lambda: (
                (p := k.core.read_namespaced_pod(pod.metadata.name, namespace))
                and (c := _condition(p, "Ready"))
                and c.status == "True"
                and p
            ),
            120,
            "the pod Ready on the new node",
        )
        assert ready.spec.node_name == node
        scheduled = _ts(_condition(ready, "PodScheduled").last_transition_time)
        ready_at = _ts(_condition(ready, "Ready").last_transition_time)
        assert scheduled >= came

        cold = wait_for(
            lambda: (c := k.status("chat").get("coldStart")) and c.get("samples") and c,
            60,
            "the pod's cold-start sample",
        )
        (sample,) = cold["samples"]
        (wait,) = cold["schedulingSamples"]
        # Creation -> Ready, as the pod's own timestamps say, the wait for the node included.
        assert sample == pytest.approx(ready_at - created, abs=1), cold
        assert sample >= NODE_WAIT + READY_DELAY - 1, cold
        assert wait >= NODE_WAIT - 1, cold
        assert wait == pytest.approx(scheduled - created, abs=1), cold
        assert cold["schedulingP90Seconds"] >= NODE_WAIT - 1, cold
        assert READY_DELAY - 1 <= cold["startupP90Seconds"] < NODE_WAIT / 2, cold
        assert cold["source"] == "measured", cold
        assert cold["seconds"] >= NODE_WAIT, cold
        assert not cold.get("pending"), cold
    finally:
        with contextlib.suppress(ApiException):
            k.core.delete_node(node)
        # No kubelet finishes a deletion on a node that is gone: remove its pods outright.
        for leftover in k.core.list_namespaced_pod(
            namespace, field_selector=f"spec.nodeName={node}"
        ).items:
            with contextlib.suppress(ApiException):
                k.core.delete_namespaced_pod(
                    leftover.metadata.name, namespace, grace_period_seconds=0
                )
