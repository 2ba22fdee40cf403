"""Plain data passed between the controller's steps: the pool as the handlers see it, the
claims on targets, what a reconcile gathered, a forecast result, and the typed failure that
makes a pool Invalid. No I/O and no logic beyond the claim rules."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prescaler.api import API_VERSION, KIND, ColdStartStatus, SelectionStatus, ServedByStatus
from prescaler.kube import FieldWriter, Hpa, ObjectRef, PodStart, ScaledObject, Workload
from prescaler.sources import Snapshot
from prescaler_forecast import Forecast


@dataclass(frozen=True, slots=True)
class PoolObject:
    """The parts of an InferencePool object the reconcile reads."""

    namespace: str
    name: str
    uid: str
    generation: int | None
    spec: Mapping[str, Any]
    status: Mapping[str, Any]
    superseded_by: str | None = None
    """An older pool that already scales the same target (see :func:`target_owner`)."""
    resource_version: str | None = None
    """The object's ``metadata.resourceVersion`` its status was read at (a status write
    carries only what changed since, and only onto that version)."""
    served_by: ServedByStatus | None = None
    """The replica and shard serving the pool (``status.servedBy``; sharded operators)."""

    @property
    def ref(self) -> ObjectRef:
        return ObjectRef(API_VERSION, KIND, self.name, self.namespace, self.uid)

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class Gathered:
    """Everything the planner and the status need, read from the cluster and Prometheus."""

    workload: Workload
    current_replicas: int
    cold_start: ColdStartStatus
    snapshot: Snapshot | None
    metrics_problem: str | None
    forecast: ForecastResult | None
    pods: tuple[PodStart, ...] = ()
    """The target's pods."""
    hot_pods: tuple[PodStart, ...] = ()
    """The pool's hot standby pods, waiting and promoted (``prescaler.io/role``)."""
    idle_since: float | None = None
    """Since when demand has been zero or absent, as witnessed (see ``status.idle_since``)."""
    current_writer: FieldWriter | None = None
    """Who last wrote ``current_replicas`` on the target (``managedFields``)."""
    hpa: Hpa | None = None
    """An HPA on the pool's target (in ``hpaFloor`` mode, the target itself), if any: the
    shadow HPA scales to its utilization target."""
    keda: ScaledObject | None = None
    """The target ScaledObject (mode ``kedaTrigger``)."""
    keda_hpa: Hpa | None = None
    """The HPA KEDA made for it (``status.hpaName`` of the ScaledObject), once readable."""
    metrics_warning: str | None = None
    """Why the Prometheus credentials are at risk (sent over plain http), if they are."""


@dataclass(frozen=True, slots=True, order=True)
class TargetClaim:
    """A pool's claim on its target. Claims order by age: the oldest pool owns the target."""

    created: str
    """creationTimestamp (RFC 3339 in UTC, so it sorts as text)."""
    name: str
    blocked: bool = False
    """The pool is Invalid for a reason of its own: it scales nothing, so it claims nothing."""


TARGET_CONFLICT = "TargetConflict"
INVALID_REASONS = (
    "InvalidSpec",
    "TargetNotFound",
    "UnsupportedTarget",
    "KedaOwnedHpa",
    "InvalidPromQL",
    "SecretNotFound",
    "InvalidSecret",
    TARGET_CONFLICT,
)
"""Every reason an :class:`InvalidPool` gives (``prescaler_reconcile_errors_total``'s
``reason`` label: its series exist at 0 from the start, so a dashboard shows none)."""


def fleet_key(uid: str, role: str | None) -> str:
    """The cache key of one fleet: a pool's uid, or ``<uid>/<role>`` for a role's."""
    return uid if role is None else f"{uid}/{role}"


def fleet_label(pool: str, role: str | None) -> str:
    """The ``pool`` label of one fleet's metric series: the pool's name, or
    ``<pool>/<role>`` for a disaggregated pool's role."""
    return pool if role is None else f"{pool}/{role}"


def target_claims(
    pool: Mapping[str, Any],
) -> tuple[tuple[tuple[str, str, str], ...], TargetClaim]:
    """The index keys (namespace, target kind, target name) of every target a pool body
    scales (its target, or each role's), and its claim on them."""
    meta, spec = pool.get("metadata") or {}, pool.get("spec") or {}
    roles = spec.get("roles")
    targets = [spec.get("target") or {}]
    if isinstance(roles, Mapping):
        targets = [(r or {}).get("target") or {} for r in roles.values() if isinstance(r, Mapping)]
    conditions = (pool.get("status") or {}).get("conditions") or []
    blocked = any(
        c.get("type") == "Invalid"
        and c.get("status") == "True"
        and c.get("reason") != TARGET_CONFLICT
        for c in conditions
    )
    keys = tuple(
        (
            str(meta.get("namespace")),
            str(target.get("kind", "Deployment")),
            str(target.get("name")),
        )
        for target in targets
    )
    claim = TargetClaim(str(meta.get("creationTimestamp", "")), str(meta.get("name")), blocked)
    return keys, claim


def target_owner(me: TargetClaim, claims: Iterable[TargetClaim]) -> str | None:
    """The older pool that owns the target ``me`` also claims, or ``None`` if ``me`` does.

    Two pools scaling one Deployment would undo each other's plans every cycle. The oldest
    pool that is not itself broken keeps the target; every younger one is flagged Invalid.
    """
    rivals = sorted(c for c in claims if c.name != me.name and not c.blocked and c < me)
    return rivals[0].name if rivals else None


class NotServing(Exception):
    """This replica stopped serving the pool's shard during the reconcile (its Lease
    renewal was late, or the shard is being given up): nothing more is written."""


class PoolGone(Exception):
    """The pool no longer exists (or a pool of the same name and another uid replaced it):
    its loop ends, and nothing more is written for it."""


class InvalidPool(Exception):
    """The pool cannot be served as specified; the message says why."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ForecastResult:
    """The forecast to plan with (``None`` if none is usable) and why."""

    forecast: Forecast | None
    healthy: bool
    reason: str
    message: str
    stale: bool = False
    """An expensive step or the history refresh is overdue by more than the stale limit."""
    age_seconds: float | None = None
    """Seconds since the history behind the forecast's fit ended."""
    selection: SelectionStatus | None = None
    """The series' auto-selection, for the status."""
