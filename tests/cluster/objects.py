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
