"""The harness is real: a real API server, scheduler, controllers, kwok and Prometheus."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from cluster import objects
from cluster.kwok_stages import GPU_RESOURCE
from cluster.launcher import LocalCluster, poll
from cluster.netstat import listening_sockets
from cluster.prometheus import (
    MAX_POINTS_PER_SERIES,
    Prometheus,
    servegen_rate,
    vllm_samples,
)

# ----------------------------------------------------------------------- helpers


def gpu_deployment(
    name: str, replicas: int, *, gpus: int = 1, ready_delay: str | None = None
) -> dict[str, Any]:
    return objects.gpu_deployment(
        name, replicas, gpus=gpus, ready_delay=ready_delay, cpu="4", grace_seconds=5
    )


def kube_apis(kube: Any) -> tuple[Any, Any]:
    """CoreV1Api and AppsV1Api, typed loosely: tests pass plain dict manifests."""
    core: Any = client.CoreV1Api(kube)
    apps: Any = client.AppsV1Api(kube)
    return core, apps


def pods_of(core: Any, namespace: str, app: str) -> list[Any]:
    pods = core.list_namespaced_pod(namespace, label_selector=f"app={app}").items
    return [p for p in pods if p.metadata.deletion_timestamp is None]


def is_ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def ready_since(pod: Any) -> datetime | None:
    for c in pod.status.conditions or []:
        if c.type == "Ready" and c.status == "True":
            when: datetime = c.last_transition_time
            return when
    return None


def ready_replicas(apps: Any, namespace: str, name: str) -> int:
    status = apps.read_namespaced_deployment_status(name, namespace).status
    return int(status.ready_replicas or 0)


# ------------------------------------------------------------------------- tests


@pytest.mark.cluster
def test_only_loopback_listeners(cluster: LocalCluster) -> None:
    pids = {p.pid for p in cluster.procs}
    sockets = listening_sockets(pids)
    assert sockets, "expected the components to listen somewhere"
    exposed = [s for s in sockets if not s.is_loopback]
    assert not exposed, f"components listen on non-loopback addresses: {exposed}"


@pytest.fixture
def crd(kube: Any) -> Iterator[tuple[str, str]]:
    ext: Any = client.ApiextensionsV1Api(kube)
    group = f"h{uuid.uuid4().hex[:8]}.harness.prescaler.io"
    plural = "widgets"
    ext.create_custom_resource_definition(
        {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{group}"},
            "spec": {
                "group": group,
                "scope": "Namespaced",
                "names": {"plural": plural, "singular": "widget", "kind": "Widget"},
                "versions": [
                    {
                        "name": "v1alpha1",
                        "served": True,
                        "storage": True,
                        "subresources": {"status": {}},
                        "schema": {
                            "openAPIV3Schema": {
                                "type": "object",
                                "properties": {
                                    "spec": {
                                        "type": "object",
                                        "properties": {"replicas": {"type": "integer"}},
                                    },
                                    "status": {
                                        "type": "object",
                                        "properties": {"observed": {"type": "integer"}},
                                    },
                                },
                            }
                        },
                    }
                ],
            },
        }
    )

    def established() -> bool:
        got = ext.read_custom_resource_definition(f"{plural}.{group}")
        return any(
            c.type == "Established" and c.status == "True" for c in got.status.conditions or []
        )

    assert poll(established, 30), "CRD never became Established"
    try:
        yield group, plural
    finally:
        ext.delete_custom_resource_definition(f"{plural}.{group}")


@pytest.mark.cluster
def test_crd_custom_resource_and_status_subresource(
    kube: Any, namespace: str, crd: tuple[str, str]
) -> None:
    group, plural = crd
    custom: Any = client.CustomObjectsApi(kube)
    body = {
        "apiVersion": f"{group}/v1alpha1",
        "kind": "Widget",
        "metadata": {"name": "w1"},
        "spec": {"replicas": 3},
        "status": {"observed": 99},  # ignored: status is a subresource
    }

    def create() -> bool:
        try:
            custom.create_namespaced_custom_object(group, "v1alpha1", namespace, plural, body)
        except ApiException as e:  # discovery of a new CRD can lag a moment
            if e.status == 404:
                return False
            raise
        return True

    assert poll(create, 30)
    got = custom.get_namespaced_custom_object(group, "v1alpha1", namespace, plural, "w1")
    assert got["spec"] == {"replicas": 3}
    assert "status" not in got or got["status"] == {}

    custom.patch_namespaced_custom_object_status(
        group, "v1alpha1", namespace, plural, "w1", {"status": {"observed": 3}}
    )
    got = custom.get_namespaced_custom_object(group, "v1alpha1", namespace, plural, "w1")
    assert got["status"] == {"observed": 3}
    assert got["metadata"]["generation"] == 1  # a status write does not bump generation

    custom.patch_namespaced_custom_object(
        group, "v1alpha1", namespace, plural, "w1", {"spec": {"replicas": 5}}
    )
    got = custom.get_namespaced_custom_object(group, "v1alpha1", namespace, plural, "w1")
    assert got["metadata"]["generation"] == 2
    assert got["status"] == {"observed": 3}


@pytest.mark.cluster
def test_gpu_pods_scheduled_on_gpu_nodes_and_ready_only_after_delay(
    kube: Any, namespace: str
) -> None:
    core, apps = kube_apis(kube)
    delay_s = 8.0
    created = time.monotonic()
    apps.create_namespaced_deployment(
        namespace, gpu_deployment("llm", 2, ready_delay=f"{delay_s:g}s")
    )

    def started() -> bool:
        pods = pods_of(core, namespace, "llm")
        return len(pods) == 2 and all(p.status.phase == "Running" for p in pods)

    assert poll(started, 60), "pods were not scheduled and started"
    # Started, loading the model: not Ready yet (the delay has not passed).
    pods = pods_of(core, namespace, "llm")
    assert not any(is_ready(p) for p in pods)
    assert ready_replicas(apps, namespace, "llm") == 0
    gpu_nodes = {
        n.metadata.name for n in core.list_node(label_selector="nvidia.com/gpu.present=true").items
    }
    for p in pods:
        assert p.spec.node_name in gpu_nodes
        tolerations = {(t.key, t.effect) for t in p.spec.tolerations or []}
        assert (GPU_RESOURCE, "NoSchedule") in tolerations

    assert poll(lambda: ready_replicas(apps, namespace, "llm") == 2, delay_s + 60)
    elapsed = time.monotonic() - created
    assert elapsed >= delay_s - 0.5
    for p in pods_of(core, namespace, "llm"):
        since = ready_since(p)
        assert since is not None
        # Timestamps have one-second resolution: allow that much.
        assert (since - p.status.start_time).total_seconds() >= delay_s - 1.5


@pytest.mark.cluster
def test_gpu_capacity_limits_scheduling(kube: Any, namespace: str) -> None:
    core, apps = kube_apis(kube)
    gpu_nodes = core.list_node(label_selector="nvidia.com/gpu.present=true").items
    whole_nodes = len(gpu_nodes)
    per_node = int(gpu_nodes[0].status.allocatable[GPU_RESOURCE])
    apps.create_namespaced_deployment(
        namespace,
        gpu_deployment("big", whole_nodes + 1, gpus=per_node, ready_delay="0s"),
    )

    def placed() -> bool:
        pods = pods_of(core, namespace, "big")
        bound = [p for p in pods if p.spec.node_name]
        return len(pods) == whole_nodes + 1 and len(bound) == whole_nodes

    assert poll(placed, 60)
    pending = [p for p in pods_of(core, namespace, "big") if not p.spec.node_name]
    assert len(pending) == 1

    def unschedulable() -> bool:
        pod = core.read_namespaced_pod(pending[0].metadata.name, namespace)
        return any(
            c.type == "PodScheduled" and c.reason == "Unschedulable"
            for c in pod.status.conditions or []
        )

    assert poll(unschedulable, 30)


@pytest.mark.cluster
def test_scaling_changes_ready_pods(kube: Any, namespace: str) -> None:
    core, apps = kube_apis(kube)
    apps.create_namespaced_deployment(namespace, gpu_deployment("svc", 1, ready_delay="1s"))

    def ready_pods() -> int:
        return sum(1 for p in pods_of(core, namespace, "svc") if is_ready(p))

    assert poll(lambda: ready_pods() == 1, 60)

    apps.patch_namespaced_deployment_scale("svc", namespace, {"spec": {"replicas": 4}})
    assert poll(lambda: ready_pods() == 4, 90)
    assert poll(lambda: ready_replicas(apps, namespace, "svc") == 4, 30)

    apps.patch_namespaced_deployment_scale("svc", namespace, {"spec": {"replicas": 2}})

    def scaled_down() -> bool:
        # Terminated pods are gone, not just marked: kwok completes the deletion.
        all_pods = core.list_namespaced_pod(namespace, label_selector="app=svc").items
        return len(all_pods) == 2 and ready_pods() == 2

    assert poll(scaled_down, 90)
    assert poll(lambda: ready_replicas(apps, namespace, "svc") == 2, 30)


@pytest.mark.cluster
def test_deleting_a_deployment_collects_its_pods(kube: Any, namespace: str) -> None:
    core, apps = kube_apis(kube)
    apps.create_namespaced_deployment(namespace, gpu_deployment("gc", 2, ready_delay="0s"))
    assert poll(lambda: len(pods_of(core, namespace, "gc")) == 2, 60)
    apps.delete_namespaced_deployment("gc", namespace, propagation_policy="Background")

    def gone() -> bool:
        rs = apps.list_namespaced_replica_set(namespace).items
        pods = core.list_namespaced_pod(namespace, label_selector="app=gc").items
        return not rs and not pods

    assert poll(gone, 90), "garbage collector did not remove the ReplicaSet and pods"


TRACES = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces"


@pytest.mark.prometheus
@pytest.mark.skipif(not TRACES.is_dir(), reason="../shared/traces not present")
def test_range_query_over_backfilled_history(prometheus: Prometheus) -> None:
    end = math.floor(time.time() / 600) * 600
    times, rates = servegen_rate(days=2, end_at_s=end, scale=0.01)
    prometheus.backfill(
        vllm_samples(
            times, rates, namespace="llm", model_name="m-small", pods=("a", "b"), step_s=30
        )
    )

    start, stop, step = end - 86_400, end - 600, 60
    data = prometheus.query_range(
        'sum(rate(vllm:request_success_total{namespace="llm"}[5m]))', start, stop, step
    )
    (series,) = data["result"]
    values = series["values"]
    expected_points = (stop - start) // step + 1
    assert not any(math.isnan(r) for r in rates), "the first two days of the trace have no gaps"
    assert len(values) == expected_points
    assert values[0][0] == start
    assert values[-1][0] == stop

    # rate() gives back the trace's rate inside a 10-minute window.
    by_window = dict(zip(times, rates, strict=True))
    window = end - 3 * 3600
    (got,) = [float(v) for t, v in values if t == window + 480]
    assert got == pytest.approx(by_window[window], rel=0.01)

    labels = prometheus.query('vllm:num_requests_running{namespace="llm"}', end - 60)
    assert {r["metric"]["pod"] for r in labels["result"]} == {"a", "b"}
    assert {r["metric"]["model_name"] for r in labels["result"]} == {"m-small"}

    assert prometheus.proc is not None
    listeners = listening_sockets({prometheus.proc.pid})
    assert listeners
    assert all(s.is_loopback for s in listeners), listeners

    with pytest.raises(ValueError, match="11000"):
        prometheus.query_range(
            "vllm:num_requests_running", end - step * MAX_POINTS_PER_SERIES, end, step
        )
