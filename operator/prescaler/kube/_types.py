"""Value types the Kubernetes adapter hands to the reconcile pipeline."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class KubeError(Exception):
    """A Kubernetes API call failed."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class NotFound(KubeError):
    """The object does not exist."""


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """Enough of an object to own others and to be the subject of Events."""

    api_version: str
    kind: str
    name: str
    namespace: str
    uid: str

    def owner_reference(self) -> dict[str, Any]:
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


@dataclass(frozen=True, slots=True)
class FieldWriter:
    """Who last wrote a field, from the object's ``managedFields``."""

    manager: str
    """The field manager (``kubectl``, a controller's name, or ``prescaler-operator``)."""
    time: float | None
    """When that manager last wrote the object (unix s), if recorded."""
    subresource: str = ""
    """The subresource it wrote through (``scale``), empty for the object itself."""


@dataclass(frozen=True, slots=True)
class Workload:
    """A Deployment or StatefulSet as far as scaling and cold starts care."""

    kind: str
    name: str
    replicas: int
    ready_replicas: int
    selector: str
    """Label selector of its pods, in ``a=b,c in (d)`` form."""
    template: dict[str, Any] = field(default_factory=dict)
    """The pod template (metadata and spec)."""
    replicas_writer: FieldWriter | None = None
    """Who last wrote ``spec.replicas`` (``None``: not recorded)."""
    resource_version: str | None = None
    """The object's ``metadata.resourceVersion``: it moves whenever its spec or status
    does (its pods' readiness included)."""


@dataclass(frozen=True, slots=True)
class Hpa:
    """A HorizontalPodAutoscaler's bounds and its scale target."""

    name: str
    min_replicas: int
    max_replicas: int
    current_replicas: int
    target_kind: str
    target_name: str
    min_replicas_writer: FieldWriter | None = None
    """Who last wrote ``spec.minReplicas`` (``None``: not recorded)."""
    target_utilization: float | None = None
    """Its target as a share of a replica's capacity (``averageUtilization: 70``: 0.7; the
    lowest of several); ``None`` when it has none that reads as a share."""
    scaled_object: str | None = None
    """The KEDA ScaledObject that owns it (its controlling ``ownerReference``, kind
    ``ScaledObject`` of ``keda.sh``): KEDA writes its bounds, so nobody else may."""
    external_metrics: tuple[str, ...] = ()
    """The names of its ``External`` metrics (KEDA's HPA: one per trigger it turned into a
    metric, ``s<trigger index>-<the scaler's metric name>``)."""


KEDA_GROUP = "keda.sh"
KEDA_VERSION = "v1alpha1"
SCALED_OBJECTS = "scaledobjects"
EXTERNAL_TRIGGERS = ("external", "external-push")


@dataclass(frozen=True, slots=True)
class ScaledObject:
    """A KEDA ScaledObject as a pool in mode ``kedaTrigger`` sees it."""

    name: str
    target_kind: str
    """``scaleTargetRef.kind`` (KEDA's default: ``Deployment``)."""
    target_name: str
    hpa_name: str | None
    """The HPA KEDA made for it (``status.hpaName``), once it has."""
    pools: tuple[tuple[str | None, str], ...]
    """``(namespace or None, pool)`` named by each of its ``external``/``external-push``
    triggers (``metadata.namespace``, ``metadata.pool``)."""
    active: bool | None = None
    """Its condition ``Active`` (KEDA's activity: some trigger above zero), when reported."""
    fallback: bool | None = None
    """Its condition ``Fallback``: KEDA scales to ``spec.fallback.replicas`` because a
    trigger's scaler keeps failing."""

    def triggers_for(self, namespace: str, pool: str) -> int:
        """How many of its triggers ask prescaler for this pool's plan."""
        return sum(1 for ns, name in self.pools if name == pool and ns in (None, namespace))


@dataclass(frozen=True, slots=True)
class PodStart:
    """One pod of a workload as scaling sees it: its start (creation, scheduling and, once
    Ready, the time it became Ready, unix s) and its state now."""

    name: str
    created: float
    ready_at: float | None
    scheduled_at: float | None = None
    """When the scheduler bound it to a node (``PodScheduled`` turned True)."""
    unschedulable: str | None = None
    """The scheduler's message while no node can take it (``PodScheduled=False``, reason
    ``Unschedulable``); ``None`` otherwise."""
    terminating: bool = False
    """It has a deletion timestamp: on its way out, no longer capacity."""
    deletion_cost: int | None = None
    """Its ``controller.kubernetes.io/pod-deletion-cost`` annotation, if any."""
    role: str | None = None
    """Its ``prescaler.io/role`` label (hot standby pods), if any."""

    @property
    def ready(self) -> bool:
        return self.ready_at is not None and not self.terminating


@dataclass(frozen=True, slots=True)
class StandbyObservation:
    """What a standby object has: pods wanted and pods ready (``None``: it doesn't exist)."""

    desired: int
    ready: int


@dataclass(frozen=True, slots=True)
class SecretData:
    """A Secret's ``type`` and its ``data``, decoded."""

    type: str
    data: dict[str, str]
