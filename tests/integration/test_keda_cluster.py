"""prescaler as a KEDA external scaler, against the real local API server: a pool in mode
``kedaTrigger`` is planned, the operator's own gRPC server answers its plan to a real
client, and the Deployment's replicas are never written by prescaler; a pool in mode
``hpaFloor`` on an HPA that a ScaledObject owns is refused. The operator runs as the Helm
chart runs it with ``keda.enabled`` (its ServiceAccount and RBAC).

KEDA itself is not needed here: a stand-in ScaledObject CRD (any fields) is installed when
the cluster has none, and removed afterwards; the cluster's real KEDA, when present, is used
as it is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import trustme
from grpc import aio
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from cluster.launcher import LocalCluster
from cluster.objects import gpu_deployment
from cluster.procs import free_port
from integration.chart_rbac import chart_identity
from integration.operator_fixtures import (  # noqa: F401 (fixtures)
    Kube,
    crd_fixture,
    operator_process,
    running_operator,
    wait_for,
)
from prescaler.kube import FIELD_MANAGER
from prescaler.scaler._proto import externalscaler_pb2 as pb
from prescaler.scaler._proto import externalscaler_pb2_grpc as pb_grpc
from prescaler.settings import ScalerSettings

pytestmark = pytest.mark.cluster

SO_CRD = "scaledobjects.keda.sh"
STAND_IN: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": SO_CRD, "labels": {"prescaler.io/test-stand-in": "true"}},
    "spec": {
        "group": "keda.sh",
        "names": {
            "kind": "ScaledObject",
            "listKind": "ScaledObjectList",
            "plural": "scaledobjects",
            "singular": "scaledobject",
        },
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
                "subresources": {"status": {}},
            }
        ],
    },
}


@pytest.fixture(name="scaled_objects", scope="module")
def scaled_objects_fixture(cluster: LocalCluster) -> Iterator[None]:
    """ScaledObjects can be created: KEDA's CRD if the cluster has it, else a stand-in,
    deleted (and gone) at the end so a later KEDA install finds no CRD in its way."""
    api = cluster.api_client()
    ext: Any = client.ApiextensionsV1Api(api)
    created = False
    try:
        try:
            ext.create_custom_resource_definition(STAND_IN)
            created = True
        except ApiException as exc:
            if exc.status != 409:
                raise

        def established() -> bool:
            conditions = ext.read_custom_resource_definition(SO_CRD).status.conditions or []
            return any(c.type == "Established" and c.status == "True" for c in conditions)

        wait_for(established, 30, "the ScaledObject CRD to be Established")
        yield
    finally:
        if created:
            ext.delete_custom_resource_definition(SO_CRD)

            def gone() -> bool:
                try:
                    ext.read_custom_resource_definition(SO_CRD)
                except ApiException as exc:
                    return bool(exc.status == 404)
                return False

            wait_for(gone, 60, "the stand-in ScaledObject CRD to be deleted")
        api.close()


def _scaled_object(k: Kube, name: str, target: str, pool: str) -> dict[str, Any]:
    body = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": name},
        "spec": {
            "scaleTargetRef": {"name": target},
            "minReplicaCount": 1,
            "maxReplicaCount": 6,
            "fallback": {"failureThreshold": 3, "replicas": 2},
            "triggers": [
                {
                    "type": "external",
                    "metadata": {"scalerAddress": "prescaler-scaler:9090", "pool": pool},
                }
            ],
        },
    }
    return dict(
        k.custom.create_namespaced_custom_object("keda.sh", "v1alpha1", k.ns, "scaledobjects", body)
    )


def _ref(namespace: str, pool: str) -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name="llm-so", namespace=namespace, scalerMetadata={"pool": pool})


async def _ask(port: int, namespace: str) -> dict[str, Any]:
    """What the operator's scaler answers a real client for pool ``chat`` (and an
    unknown pool)."""
    async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.ExternalScalerStub(channel)
        spec = await stub.GetMetricSpec(_ref(namespace, "chat"))
        metrics = await stub.GetMetrics(
            pb.GetMetricsRequest(
                scaledObjectRef=_ref(namespace, "chat"), metricName="prescaler-chat"
            )
        )
        active = await stub.IsActive(_ref(namespace, "chat"))
        try:
            await stub.IsActive(_ref(namespace, "nothing"))
            unknown: grpc.StatusCode | None = None
        except aio.AioRpcError as exc:
            unknown = exc.code()
        return {
            "spec": [(s.metricName, s.targetSize) for s in spec.metricSpecs],
            "value": [m.metricValue for m in metrics.metricValues],
            "active": active.result,
            "unknown": unknown,
        }


def _replicas_writers(k: Kube, name: str) -> set[str]:
    """The field managers that own the Deployment's ``spec.replicas``."""
    managers = set()
    for entry in k.deployment(name).metadata.managed_fields or []:
        fields = (entry.fields_v1 or {}).get("f:spec") or {}
        if "f:replicas" in fields:
            managers.add(entry.manager)
    return managers


def test_a_keda_pool_is_planned_and_served_and_its_deployment_never_written(
    cluster: LocalCluster,
    crd: None,
    scaled_objects: None,
    kube: Any,
    namespace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    k = Kube(kube, namespace)
    k.create_deployment(gpu_deployment("llm", 1))
    _scaled_object(k, "llm-so", "llm", "chat")
    k.create_pool(
        "chat",
        {
            "target": {"kind": "ScaledObject", "name": "llm-so"},
            "mode": "kedaTrigger",
            "minReplicas": 3,
            "maxReplicas": 6,
            "model": {"tokensPerSecond": 3750},
            "coldStart": {"mode": "fixed", "seconds": 30},
        },
    )
    port = free_port()
    scaler = ScalerSettings(port=port, host="127.0.0.1")
    with chart_identity(cluster, namespace, tmp_path, values={"keda.enabled": True}) as identity:
        monkeypatch.setenv("KUBECONFIG", str(identity.kubeconfig))
        with running_operator(cluster, namespace, identity, scaler=scaler):
            status = wait_for(
                lambda: (s := k.status("chat")).get("desiredReplicas") == 3 and s.get("keda") and s,
                120,
                "the plan of 3 and status.keda",
            )
            assert status["keda"]["scaledObject"] == "llm-so"
            assert status["keda"]["workload"] == "Deployment/llm"
            assert status["keda"]["triggers"] == 1
            assert status["plan"]["plannedAt"]
            # The plan's Event comes after the apply step: had it scaled, it would show.
            event = k.event("chat", "ScaledUp")
            assert "plan served to KEDA" in event.message
            answers = asyncio.run(_ask(port, namespace))
            assert answers == {
                "spec": [("prescaler-chat", 1)],
                "value": [3],
                "active": True,
                "unknown": grpc.StatusCode.NOT_FOUND,
            }
            assert k.deployment("llm").spec.replicas == 1
            assert FIELD_MANAGER not in _replicas_writers(k, "llm")
            condition = k.condition("chat", "Invalid")
            assert condition is not None
            assert condition["status"] == "False"
    assert k.deployment("llm").spec.replicas == 1


def test_hpa_floor_on_an_hpa_keda_owns_is_refused(
    cluster: LocalCluster,
    crd: None,
    scaled_objects: None,
    kube: Any,
    namespace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    k = Kube(kube, namespace)
    k.create_deployment(gpu_deployment("llm", 1))
    owner = _scaled_object(k, "llm-so", "llm", "chat")
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {
            "name": "keda-hpa-llm-so",
            "ownerReferences": [
                {
                    "apiVersion": "keda.sh/v1alpha1",
                    "kind": "ScaledObject",
                    "name": "llm-so",
                    "uid": owner["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm"},
            "minReplicas": 1,
            "maxReplicas": 6,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {
                        "name": "cpu",
                        "target": {"type": "Utilization", "averageUtilization": 70},
                    },
                }
            ],
        },
    }
    k.autoscaling.create_namespaced_horizontal_pod_autoscaler(namespace, hpa)
    k.create_pool(
        "chat",
        {
            "target": {"kind": "HorizontalPodAutoscaler", "name": "keda-hpa-llm-so"},
            "mode": "hpaFloor",
            "minReplicas": 3,
            "maxReplicas": 6,
            "model": {"tokensPerSecond": 3750},
            "coldStart": {"mode": "fixed", "seconds": 30},
        },
    )
    with chart_identity(cluster, namespace, tmp_path) as identity:
        monkeypatch.setenv("KUBECONFIG", str(identity.kubeconfig))
        with running_operator(cluster, namespace, identity):
            invalid = wait_for(
                lambda: k.condition_is("chat", "Invalid", "True"), 120, "the pool to be Invalid"
            )
            assert invalid["reason"] == "KedaOwnedHpa"
            assert "ScaledObject llm-so" in invalid["message"]
            event = k.event("chat", "KedaOwnedHpa")
            assert event.type == "Warning"
    current = k.autoscaling.read_namespaced_horizontal_pod_autoscaler("keda-hpa-llm-so", namespace)
    assert current.spec.min_replicas == 1  # never written: the floor is still its own


def test_prescaler_run_serves_the_scaler_over_mutual_tls(
    cluster: LocalCluster,
    crd: None,
    scaled_objects: None,
    kube: Any,
    namespace: str,
    tmp_path: Path,
) -> None:
    """``prescaler run`` as a real process, as KEDA would reach it on this machine:
    ``--scaler-port`` on 127.0.0.1 with a server certificate for that address and a
    client CA (KEDA's ``caCert``, ``tlsClientCert``, ``tlsClientKey``)."""
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    keda = ca.issue_cert("keda-operator")
    files = {
        "tls.crt": server.cert_chain_pems[0].bytes(),
        "tls.key": server.private_key_pem.bytes(),
        "ca.crt": ca.cert_pem.bytes(),
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    k = Kube(kube, namespace)
    k.create_deployment(gpu_deployment("llm", 1))
    _scaled_object(k, "llm-so", "llm", "chat")
    k.create_pool(
        "chat",
        {
            "target": {"kind": "ScaledObject", "name": "llm-so"},
            "mode": "kedaTrigger",
            "minReplicas": 2,
            "maxReplicas": 6,
            "model": {"tokensPerSecond": 3750},
            "coldStart": {"mode": "fixed", "seconds": 30},
        },
    )
    port = free_port()
    flags = ["--scaler-port", str(port), "--scaler-host", "127.0.0.1"]
    for flag, name in (("cert", "tls.crt"), ("key", "tls.key"), ("ca", "ca.crt")):
        flags += [f"--scaler-tls-{flag}", str(tmp_path / name)]
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca.cert_pem.bytes(),
        private_key=keda.private_key_pem.bytes(),
        certificate_chain=keda.cert_chain_pems[0].bytes(),
    )

    async def plan() -> list[int]:
        async with aio.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
            stub = pb_grpc.ExternalScalerStub(channel)
            request = pb.GetMetricsRequest(scaledObjectRef=_ref(namespace, "chat"))
            try:
                answer = await stub.GetMetrics(request, timeout=10)
            except aio.AioRpcError:
                return []  # not listening yet, or no plan yet
            return [m.metricValue for m in answer.metricValues]

    async def without_client_certificate() -> grpc.StatusCode:
        anonymous = grpc.ssl_channel_credentials(root_certificates=ca.cert_pem.bytes())
        async with aio.secure_channel(f"127.0.0.1:{port}", anonymous) as channel:
            stub = pb_grpc.ExternalScalerStub(channel)
            try:
                await stub.IsActive(_ref(namespace, "chat"), timeout=10)
            except aio.AioRpcError as exc:
                return exc.code()
            return grpc.StatusCode.OK

    with operator_process(cluster, namespace, tmp_path / "operator.log", extra_args=flags):
        # The plan first: a pod that no node takes yet (a worker's earlier test may still be
        # releasing its GPUs) holds the plan at the Deployment's 1, and that is what the
        # scaler would rightly serve.
        wait_for(lambda: k.status("chat").get("desiredReplicas") == 2, 120, "the plan of 2")
        assert wait_for(lambda: asyncio.run(plan()), 120, "the scaler to answer the plan") == [2]
        assert asyncio.run(without_client_certificate()) == grpc.StatusCode.UNAVAILABLE
    assert k.deployment("llm").spec.replicas == 1
