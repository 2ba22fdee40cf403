"""Real KEDA on the local cluster: a ScaledObject's HPA scales a Deployment, and KEDA's
fallback holds a Deployment at its fallback replicas when the trigger's source fails.

The trigger is ``metrics-api``, against a small HTTP server the test runs on loopback
(:class:`MetricServer`): KEDA's operator polls it and answers the adapter, the adapter
answers ``external.metrics.k8s.io``, and the kube-controller-manager's HPA controller
scales the Deployment to ``ceil(value / targetValue)``.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from cluster.keda import (
    EXTERNAL_METRICS_GROUP,
    EXTERNAL_METRICS_VERSION,
    GROUP,
    SCALED_OBJECT_LABEL,
    SCALED_OBJECTS,
    VERSION,
    Keda,
    hpa_name,
    scaled_object,
)
from cluster.objects import gpu_deployment
from integration.operator_fixtures import Kube, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

TARGET_VALUE = 2
"""The metrics-api trigger's targetValue: one replica per 2 units of the served value."""
MAX_REPLICAS = 8


class MetricServer:
    """``GET /`` answers ``{"value": <value>}``, or 500 while ``failing``; on loopback."""

    def __init__(self, value: float) -> None:
        self.value = value
        self.failing = False
        self.requests = 0
        state = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                state.requests += 1
                if state.failing:
                    self.send_error(500, "the metric source is down")
                    return
                body = json.dumps({"value": state.value}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> MetricServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


@pytest.fixture
def metric_server() -> Iterator[MetricServer]:
    with MetricServer(value=0) as server:
        yield server


def _metrics_api_trigger(url: str) -> dict[str, Any]:
    return {
        "type": "metrics-api",
        "metadata": {
            "url": url,
            "format": "json",
            "valueLocation": "value",
            "targetValue": str(TARGET_VALUE),
        },
    }


def _create_scaled_object(kube: Kube, body: dict[str, Any]) -> None:
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, kube.ns, SCALED_OBJECTS, body)


def _scaled_object_condition(kube: Kube, name: str, kind: str) -> dict[str, Any] | None:
    so = kube.custom.get_namespaced_custom_object(GROUP, VERSION, kube.ns, SCALED_OBJECTS, name)
    for cond in (so.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def _hpa(kube: Kube, name: str) -> Any:
    try:
        return kube.autoscaling.read_namespaced_horizontal_pod_autoscaler(name, kube.ns)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _replicas(kube: Kube, name: str) -> int:
    return int(kube.deployment(name).spec.replicas or 0)


def test_keda_scales_a_deployment_through_its_hpa(
    keda: Keda, kube: Any, namespace: str, metric_server: MetricServer
) -> None:
    k = Kube(kube, namespace)
    k.create_deployment(gpu_deployment("llm", 1))
    metric_server.value = 7
    want = math.ceil(7 / TARGET_VALUE)
    _create_scaled_object(
        k,
        scaled_object(
            "chat",
            "llm",
            [_metrics_api_trigger(metric_server.url)],
            minReplicaCount=1,
            maxReplicaCount=MAX_REPLICAS,
            pollingInterval=5,
        ),
    )

    # KEDA creates its HPA, owned by the ScaledObject, on the trigger's external metric.
    hpa = wait_for(lambda: _hpa(k, hpa_name("chat")), 120, "KEDA's HPA")
    owners = hpa.metadata.owner_references or []
    assert [(o.kind, o.name, o.controller) for o in owners] == [("ScaledObject", "chat", True)]
    assert hpa.spec.scale_target_ref.name == "llm"
    (metric,) = hpa.spec.metrics
    assert metric.type == "External"
    assert metric.external.metric.selector.match_labels == {SCALED_OBJECT_LABEL: "chat"}
    wait_for(
        lambda: (_scaled_object_condition(k, "chat", "Ready") or {}).get("status") == "True",
        120,
        "the ScaledObject Ready",
    )

    # external.metrics.k8s.io answers through the aggregation layer with the served value.
    def external_value() -> float | None:
        try:
            listing = k.custom.list_namespaced_custom_object(
                EXTERNAL_METRICS_GROUP,
                EXTERNAL_METRICS_VERSION,
                namespace,
                metric.external.metric.name,
                label_selector=f"{SCALED_OBJECT_LABEL}=chat",
            )
        except ApiException:  # not served yet
            return None
        items = listing.get("items") or []
        return _quantity(items[0]["value"]) if items else None

    assert wait_for(external_value, 120, "the external metric") == 7

    # The controller manager's HPA controller scales the Deployment.
    wait_for(lambda: _replicas(k, "llm") == want, 300, f"the Deployment at {want} replicas")
    wait_for(
        lambda: (_hpa(k, hpa_name("chat")).status.desired_replicas or 0) == want,
        120,
        f"the HPA's desired replicas at {want}",
    )

    # Deleting the ScaledObject deletes its HPA.
    k.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, SCALED_OBJECTS, "chat")
    wait_for(lambda: _hpa(k, hpa_name("chat")) is None, 120, "the HPA gone with its owner")


def test_keda_fallback_holds_the_fallback_replicas_while_the_source_fails(
    keda: Keda, kube: Any, namespace: str, metric_server: MetricServer
) -> None:
    k = Kube(kube, namespace)
    k.create_deployment(gpu_deployment("llm", 1))
    metric_server.value = 2  # one replica
    fallback_replicas = 3
    _create_scaled_object(
        k,
        scaled_object(
            "chat",
            "llm",
            [_metrics_api_trigger(metric_server.url)],
            minReplicaCount=1,
            maxReplicaCount=MAX_REPLICAS,
            pollingInterval=5,
            fallback={"failureThreshold": 3, "replicas": fallback_replicas},
        ),
    )
    wait_for(lambda: _hpa(k, hpa_name("chat")), 120, "KEDA's HPA")
    wait_for(
        lambda: (_scaled_object_condition(k, "chat", "Ready") or {}).get("status") == "True",
        120,
        "the ScaledObject Ready",
    )
    wait_for(
        lambda: _hpa(k, hpa_name("chat")).status.current_metrics or [],
        120,
        "the HPA reading the metric",
    )
    assert _replicas(k, "llm") == 1

    # The source fails: after failureThreshold failed reads KEDA answers the HPA with a
    # value that makes it ask for the fallback replicas.
    metric_server.failing = True
    wait_for(
        lambda: _replicas(k, "llm") == fallback_replicas,
        300,
        f"the Deployment at the fallback's {fallback_replicas} replicas",
    )
    wait_for(
        lambda: (_scaled_object_condition(k, "chat", "Fallback") or {}).get("status") == "True",
        120,
        "the Fallback condition True",
    )

    # The source recovers: the fallback ends.
    metric_server.failing = False
    wait_for(
        lambda: (_scaled_object_condition(k, "chat", "Fallback") or {}).get("status") == "False",
        300,
        "the fallback to end",
    )


def _quantity(raw: str) -> float:
    """A Kubernetes quantity as KEDA's adapter writes metric values (``7``, ``7500m``)."""
    if raw.endswith("m"):
        return float(raw[:-1]) / 1000
    if raw.endswith("k"):
        return float(raw[:-1]) * 1000
    return float(raw)
