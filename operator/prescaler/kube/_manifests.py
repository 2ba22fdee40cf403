"""Standby objects, built as plain dicts from the pool and its target (pure).

Every object carries the labels ``prescaler.io/pool`` and ``prescaler.io/role``, an owner
reference to the pool (so deleting the pool garbage-collects it) and the hash of its own
content in ``prescaler.io/spec-hash`` (so an unchanged object is never rewritten).

**Security context.** The pre-pull and placeholder containers are ours: they only idle, so
they run as a fixed non-root user with a read-only root filesystem, no privilege
escalation, every capability dropped and the runtime's default seccomp profile (the
``restricted`` Pod Security Standard), whatever image they run. The hot standby copies the
user's engine pod: it gets the same hardening wherever the user left a field unset (no
privilege escalation, capabilities dropped except those the user adds, ``RuntimeDefault``
seccomp), but never a forced non-root user, and nothing the user set is loosened or
overridden (a ``privileged`` container keeps what it needs).
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from prescaler.kube._types import ObjectRef

POOL_LABEL = "prescaler.io/pool"
ROLE_LABEL = "prescaler.io/role"
HASH_ANNOTATION = "prescaler.io/spec-hash"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_NODE_SELECTOR = {"nvidia.com/gpu.present": "true"}
GPU_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
PLACEHOLDER_PRIORITY_VALUE = -10
IDLE_USER = 65532
"""The unprivileged user our idling containers run as (distroless's ``nonroot``)."""
RUNTIME_DEFAULT_SECCOMP = {"type": "RuntimeDefault"}

ROLE_PRE_PULL = "image-pre-pull"
ROLE_PLACEHOLDER = "placeholder"
ROLE_HOT = "hot-standby"
ROLE_PROMOTED = "promoted"
"""A hot standby pod taken into the target's Service (see :func:`promotion_patch`)."""
ROLE_DEGRADATION = "degradation"
"""The ConfigMap that publishes the degradation policy for gateways."""


def object_name(pool: str, role: str) -> str:
    suffix = {
        ROLE_PRE_PULL: "prepull",
        ROLE_PLACEHOLDER: "placeholder",
        ROLE_HOT: "hot",
        ROLE_DEGRADATION: "degradation",
    }[role]
    return f"{pool[: 63 - len(suffix) - 1]}-{suffix}"


def _with_hash(obj: dict[str, Any]) -> dict[str, Any]:
    digest = hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]
    obj["metadata"].setdefault("annotations", {})[HASH_ANNOTATION] = digest
    return obj


def _metadata(owner: ObjectRef, role: str) -> dict[str, Any]:
    return {
        "name": object_name(owner.name, role),
        "namespace": owner.namespace,
        "labels": {POOL_LABEL: owner.name, ROLE_LABEL: role},
        "ownerReferences": [owner.owner_reference()],
    }


def _placement(template: dict[str, Any]) -> dict[str, Any]:
    """Node selector, affinity and tolerations of the target, so standby lands where it runs."""
    spec = template.get("spec", {})
    placement: dict[str, Any] = {
        "nodeSelector": dict(spec.get("nodeSelector") or GPU_NODE_SELECTOR),
        "tolerations": [*spec.get("tolerations", [])],
    }
    if GPU_TOLERATION not in placement["tolerations"]:
        placement["tolerations"].append(GPU_TOLERATION)
    if spec.get("affinity"):
        placement["affinity"] = copy.deepcopy(spec["affinity"])
    return placement


def _idle_pod_security() -> dict[str, Any]:
    """Pod ``securityContext`` of our own idling pods (pre-pull, placeholders)."""
    return {
        "runAsNonRoot": True,
        "runAsUser": IDLE_USER,
        "runAsGroup": IDLE_USER,
        "seccompProfile": dict(RUNTIME_DEFAULT_SECCOMP),
    }


def _idle_container_security() -> dict[str, Any]:
    """Container ``securityContext`` of our own idling containers."""
    return {
        "runAsNonRoot": True,
        "runAsUser": IDLE_USER,
        "runAsGroup": IDLE_USER,
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": dict(RUNTIME_DEFAULT_SECCOMP),
    }


def _harden_engine_container(container: dict[str, Any]) -> None:
    """Fill in the hardening a user's engine container left unset, loosening nothing.

    ``allowPrivilegeEscalation: false`` is added unless the user set it or the container is
    privileged or adds ``SYS_ADMIN`` (the API server refuses that combination). Every
    capability is dropped except those the user adds; a privileged container is left as
    it is. No user is forced: the engine's image decides whether it can run as non-root.
    """
    sc = container["securityContext"] = dict(container.get("securityContext") or {})
    privileged = bool(sc.get("privileged"))
    caps = sc.get("capabilities") or {}
    added = {str(c).upper().removeprefix("CAP_") for c in caps.get("add") or []}
    if "allowPrivilegeEscalation" not in sc and not privileged and "SYS_ADMIN" not in added:
        sc["allowPrivilegeEscalation"] = False
    if not privileged:
        drop = [str(c) for c in caps.get("drop") or []]
        if "ALL" not in (c.upper() for c in drop):
            drop = ["ALL", *drop]
        sc["capabilities"] = {**caps, "drop": drop}


def _harden_engine_pod(pod: dict[str, Any]) -> None:
    """Hot standby: the user's pod template, hardened where the user left fields unset."""
    spec = pod.setdefault("spec", {})
    psc = spec["securityContext"] = dict(spec.get("securityContext") or {})
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    per_container = any("seccompProfile" in (c.get("securityContext") or {}) for c in containers)
    if "seccompProfile" not in psc and not per_container:
        psc["seccompProfile"] = dict(RUNTIME_DEFAULT_SECCOMP)
    for container in containers:
        _harden_engine_container(container)


def first_image(template: dict[str, Any]) -> str | None:
    containers = template.get("spec", {}).get("containers", [])
    return containers[0].get("image") if containers else None


def pre_pull_daemonset(
    owner: ObjectRef, template: dict[str, Any], image: str, command: list[str]
) -> dict[str, Any]:
    """A DaemonSet whose pods pull ``image`` on the target's nodes, then idle."""
    labels = {POOL_LABEL: owner.name, ROLE_LABEL: ROLE_PRE_PULL}
    return _with_hash(
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": _metadata(owner, ROLE_PRE_PULL),
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        **_placement(template),
                        "terminationGracePeriodSeconds": 0,
                        "automountServiceAccountToken": False,
                        "securityContext": _idle_pod_security(),
                        "containers": [
                            {
                                "name": "pre-pull",
                                "image": image,
                                "command": command,
                                "resources": {
                                    "requests": {"cpu": "1m", "memory": "8Mi"},
                                    "limits": {"cpu": "10m", "memory": "32Mi"},
                                },
                                "securityContext": _idle_container_security(),
                            }
                        ],
                    },
                },
            },
        }
    )


def placeholder_deployment(
    owner: ObjectRef,
    template: dict[str, Any],
    *,
    replicas: int,
    gpus: int,
    image: str,
    priority_class: str,
) -> dict[str, Any]:
    """Low-priority pods each holding one replica's GPUs, preempted by real replicas."""
    labels = {POOL_LABEL: owner.name, ROLE_LABEL: ROLE_PLACEHOLDER}
    return _with_hash(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": _metadata(owner, ROLE_PLACEHOLDER),
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        **_placement(template),
                        "priorityClassName": priority_class,
                        "terminationGracePeriodSeconds": 0,
                        "automountServiceAccountToken": False,
                        "securityContext": _idle_pod_security(),
                        "containers": [
                            {
                                "name": "placeholder",
                                "image": image,
                                "resources": {
                                    "requests": {GPU_RESOURCE: str(gpus)},
                                    "limits": {GPU_RESOURCE: str(gpus)},
                                },
                                "securityContext": _idle_container_security(),
                            }
                        ],
                    },
                },
            },
        }
    )


def hot_standby_deployment(
    owner: ObjectRef,
    template: dict[str, Any],
    *,
    replicas: int,
    readiness_gate: str | None = None,
) -> dict[str, Any]:
    """The target's pod template with its labels replaced, so no Service selects it.

    ``readiness_gate`` (the pool has ``spec.prewarm``): a condition type added to the pods'
    ``readinessGates`` if the template lacks it, so a hot pod is Ready, and promotable,
    only once warmed. The pods are ours: adding the gate rewrites no user object.
    """
    labels = {POOL_LABEL: owner.name, ROLE_LABEL: ROLE_HOT}
    pod = copy.deepcopy(template)
    pod.setdefault("metadata", {})["labels"] = labels
    if readiness_gate is not None:
        spec = pod.setdefault("spec", {})
        gates = list(spec.get("readinessGates") or [])
        if not any(g.get("conditionType") == readiness_gate for g in gates):
            spec["readinessGates"] = [*gates, {"conditionType": readiness_gate}]
    _harden_engine_pod(pod)
    return _with_hash(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": _metadata(owner, ROLE_HOT),
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels}, "template": pod},
        }
    )


def promotion_patch(owner: ObjectRef, template: dict[str, Any]) -> dict[str, Any]:
    """The merge patch that promotes a hot standby pod into the target's Service.

    It gains the target template's labels (so every Service that selects the target's
    pods selects it) and the role ``promoted`` (so the hot standby ReplicaSet no longer
    selects it and starts a replacement: the standby refills). Its owner becomes the pool
    (so deleting the pool removes it). The target's own ReplicaSet never adopts it: that
    one also selects on ``pod-template-hash``, which the pod lacks.
    """
    labels = dict((template.get("metadata") or {}).get("labels") or {})
    labels.update({POOL_LABEL: owner.name, ROLE_LABEL: ROLE_PROMOTED})
    return {"metadata": {"labels": labels, "ownerReferences": [owner.owner_reference()]}}


def degradation_config_map(owner: ObjectRef, data: dict[str, str]) -> dict[str, Any]:
    """The ConfigMap ``<pool>-degradation`` with ``data`` (its format is the degradation
    contract, see ``prescaler.controller.degradation``), owned by the pool."""
    return _with_hash(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _metadata(owner, ROLE_DEGRADATION),
            "data": dict(data),
        }
    )


def placeholder_priority_class(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "prescaler"}},
        "value": PLACEHOLDER_PRIORITY_VALUE,
        "preemptionPolicy": "Never",
        "globalDefault": False,
        "description": "prescaler placeholder pods: hold GPU nodes, preempted by any real pod",
    }
