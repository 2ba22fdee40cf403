"""Kubernetes objects the integration tests create on the local cluster."""

from __future__ import annotations

from typing import Any

from .kwok_stages import GPU_RESOURCE, READY_DELAY_ANNOTATION


def gpu_deployment(
    name: str,
    replicas: int,
    *,
    gpus: int = 1,
    ready_delay: str | None = None,
    cpu: str = "1",
    grace_seconds: int = 0,
) -> dict[str, Any]:
    """A fake vLLM Deployment on kwok GPU nodes; ``ready_delay`` (e.g. ``"45s"``) simulates
    the image pull and weight load before its pods turn Ready."""
    annotations = {READY_DELAY_ANNOTATION: ready_delay} if ready_delay else {}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": annotations},
                "spec": {
                    "containers": [
                        {
                            "name": "vllm",
                            "image": "vllm/vllm-openai:fake",
                            "resources": {
                                "requests": {"cpu": cpu, GPU_RESOURCE: str(gpus)},
                                "limits": {GPU_RESOURCE: str(gpus)},
                            },
                        }
                    ],
                    "terminationGracePeriodSeconds": grace_seconds,
                },
            },
        },
    }


LOOPBACK_TAINT = "prescaler.io/loopback-node"


def loopback_gpu_node(name: str, pod_cidr: str, *, gpus: int = 8) -> dict[str, Any]:
    """A kwok GPU node whose pods get addresses from ``pod_cidr``, a loopback range such as
    ``127.64.3.0/24``: on this machine every such address reaches a server bound to
    ``0.0.0.0``, so a fake engine answers at each pod's own IP. Tainted
    ``prescaler.io/loopback-node=<name>``: only pods placed with :func:`on_node` land here.
    (EndpointSlices refuse loopback addresses: these pods never join a Service.)"""
    resources = {
        "cpu": "64",
        "memory": "512Gi",
        "pods": "110",
        "ephemeral-storage": "1Ti",
        GPU_RESOURCE: str(gpus),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/hostname": name,
                "type": "kwok",
                "prescaler.io/fake-node": "true",
                "nvidia.com/gpu.present": "true",
            },
        },
        "spec": {
            "podCIDR": pod_cidr,
            "podCIDRs": [pod_cidr],
            "taints": [
                {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"},
                {"key": LOOPBACK_TAINT, "value": name, "effect": "NoSchedule"},
            ],
        },
        "status": {"capacity": resources, "allocatable": resources},
    }


def on_node(deployment: dict[str, Any], node: str) -> dict[str, Any]:
    """``deployment`` with its pods placed on ``node`` (a :func:`loopback_gpu_node`)."""
    spec = deployment["spec"]["template"]["spec"]
    spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    spec["tolerations"] = [
        *spec.get("tolerations", []),
        {"key": LOOPBACK_TAINT, "operator": "Equal", "value": node, "effect": "NoSchedule"},
    ]
    return deployment


def with_readiness_gate(deployment: dict[str, Any], condition: str) -> dict[str, Any]:
    """``deployment`` whose pods are Ready only once ``condition`` is True as well."""
    spec = deployment["spec"]["template"]["spec"]
    spec["readinessGates"] = [*spec.get("readinessGates", []), {"conditionType": condition}]
    return deployment
