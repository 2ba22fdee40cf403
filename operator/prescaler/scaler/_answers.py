"""What the KEDA external scaler answers, as plain values (pure: no gRPC, no Kubernetes).

A ScaledObject's trigger of type ``external`` (or ``external-push``) names a pool in its
metadata; KEDA passes that metadata, with the ScaledObject's name and namespace, on every
call. :func:`parse_query` turns it into a :class:`Query` (always in the ScaledObject's own
namespace), :func:`answer` turns the pool object as the API server has it into the plan
KEDA scales to, and every refusal is a :class:`ScalerError` whose
:attr:`~ScalerError.code` the gRPC layer maps to a status code. A refusal quotes what the
client sent only through :func:`shown`: cut short and escaped, so neither the reply nor a
log line repeats client text of any length or with control characters.

The metric is the pool's planned replicas (``status.desiredReplicas``) against a target of
1 per replica, so the HPA that KEDA makes asks for exactly the plan (beside other triggers,
the HPA takes the largest).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

ErrorCode = Literal[
    "INVALID_ARGUMENT",
    "NOT_FOUND",
    "PERMISSION_DENIED",
    "FAILED_PRECONDITION",
    "UNAVAILABLE",
    "RESOURCE_EXHAUSTED",
]
"""The gRPC status codes a refusal carries (their names in ``grpc.StatusCode``)."""

POOL_KEY = "pool"
NAMESPACE_KEY = "namespace"
KEDA_KEYS = frozenset(
    {"scalerAddress", "enableTLS", "unsafeSsl", "caCert", "tlsClientCert", "tlsClientKey"}
)
"""Metadata that KEDA's external scaler reads itself and passes on with ours."""
METRIC_PREFIX = "prescaler-"
TARGET_SIZE = 1
"""Each planned replica is one unit of the metric: the HPA asks for metric / 1 replicas."""
KEDA_MODE = "kedaTrigger"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_PLAIN = re.compile(r"^[A-Za-z0-9._-]*$")
SHOWN_CHARS = 64
"""The most characters of one client string a refusal quotes."""
SHOWN_KEYS = 4
"""The most unknown metadata keys a refusal names (then how many more)."""


def shown(text: str, limit: int = SHOWN_CHARS) -> str:
    """Client text as a refusal quotes it: a plain short name as it is; anything else
    escaped (``ascii``, quoted) and cut to ``limit`` characters, marked ``...``."""
    if len(text) <= limit and _PLAIN.match(text):
        return text
    quoted = ascii(text[:limit])
    return f"{quoted}..." if len(text) > limit else quoted


class ScalerError(Exception):
    """A call the scaler refuses, with the gRPC code to refuse it with."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code: ErrorCode = code
        self.message = message


@dataclass(frozen=True, slots=True)
class Query:
    """The pool one trigger asks about."""

    namespace: str
    pool: str

    @property
    def metric_name(self) -> str:
        """The metric's name in ``GetMetricSpec`` (KEDA prefixes ``s<trigger index>-``)."""
        return f"{METRIC_PREFIX}{self.pool}"

    def names_hpa_metric(self, name: str) -> bool:
        """``name`` (an ``External`` metric of KEDA's HPA) is this pool's plan: KEDA named
        it ``s<trigger index>-`` and :attr:`metric_name`."""
        return re.fullmatch(rf"s\d+-{re.escape(self.metric_name)}", name) is not None


@dataclass(frozen=True, slots=True)
class Plan:
    """What a pool's last plan asks for, and when it was made."""

    replicas: int
    planned_at: float

    @property
    def active(self) -> bool:
        """KEDA's activity: a plan of zero lets a ``minReplicaCount: 0`` workload go to zero."""
        return self.replicas > 0


def parse_query(
    scaled_object: str, scaled_object_namespace: str, metadata: Mapping[str, str]
) -> Query:
    """The pool a trigger names: ``pool`` (required), in the ScaledObject's namespace.

    A trigger reads only the pools of its own namespace, as a pool's target is in the
    pool's: ``namespace`` may repeat the ScaledObject's, and any other is refused
    (``PERMISSION_DENIED``) before any pool is read, so the refusal says nothing of whether
    such a pool exists. Unknown keys are refused, so a typo is an error and not a
    default."""
    unknown = sorted(k for k in metadata if k not in KEDA_KEYS | {POOL_KEY, NAMESPACE_KEY})
    where = f"ScaledObject {shown(scaled_object_namespace) or '?'}/{shown(scaled_object) or '?'}"
    if unknown:
        named = ", ".join(shown(k) for k in unknown[:SHOWN_KEYS])
        if len(unknown) > SHOWN_KEYS:
            named += f" and {len(unknown) - SHOWN_KEYS} more"
        raise ScalerError(
            "INVALID_ARGUMENT",
            f"{where}: unknown trigger metadata {named}; prescaler reads "
            f"'{POOL_KEY}' (required) and '{NAMESPACE_KEY}' (only the ScaledObject's own)",
        )
    pool = metadata.get(POOL_KEY, "").strip()
    if not pool:
        raise ScalerError(
            "INVALID_ARGUMENT",
            f"{where}: trigger metadata needs '{POOL_KEY}': the InferencePool's name",
        )
    if not _NAME.match(pool):
        raise ScalerError(
            "INVALID_ARGUMENT",
            f"{where}: '{POOL_KEY}' {shown(pool)} is not a Kubernetes object name",
        )
    namespace = scaled_object_namespace
    if not namespace:
        raise ScalerError("INVALID_ARGUMENT", f"{where}: the call names no namespace")
    if not _NAMESPACE.match(namespace):
        raise ScalerError(
            "INVALID_ARGUMENT", f"{where}: namespace {shown(namespace)} is not a namespace name"
        )
    asked = metadata.get(NAMESPACE_KEY, "").strip()
    if asked and asked != namespace:
        raise ScalerError(
            "PERMISSION_DENIED",
            f"{where}: a trigger reads only the pools of its ScaledObject's namespace; "
            f"drop '{NAMESPACE_KEY}' from its metadata",
        )
    return Query(namespace, pool)


def check_namespace(query: Query, allowed: Iterable[str]) -> None:
    """Refuse a pool outside the namespaces the operator serves (glob patterns; none:
    every namespace)."""
    patterns = tuple(allowed)
    if patterns and not any(fnmatch.fnmatchcase(query.namespace, p) for p in patterns):
        raise ScalerError(
            "PERMISSION_DENIED",
            f"namespace {query.namespace} is not served by this operator "
            f"(it serves {', '.join(patterns)})",
        )


def answer(query: Query, pool: Mapping[str, Any] | None, now: float, stale_seconds: float) -> Plan:
    """The plan KEDA scales to, from the pool object (``None``: not found), or why not.

    Refused: an unknown pool; a pool that does not declare KEDA's trigger as its way of
    scaling (``spec.mode: kedaTrigger``: otherwise prescaler scales the workload itself and
    the two would fight); a pool in dry run (nothing acts on its plan); a disaggregated
    pool; an Invalid pool; a pool with no plan yet; and a plan older than
    ``stale_seconds`` (the operator is not reconciling it). KEDA then applies the
    ScaledObject's ``fallback``.
    """
    name = f"InferencePool {query.namespace}/{query.pool}"
    if pool is None:
        raise ScalerError("NOT_FOUND", f"{name} not found")
    spec = _mapping(pool.get("spec"))
    status = _mapping(pool.get("status"))
    if spec.get("roles") is not None:
        raise ScalerError(
            "FAILED_PRECONDITION",
            f"{name} is disaggregated (spec.roles); the KEDA scaler serves unified pools",
        )
    if spec.get("mode") != KEDA_MODE:
        raise ScalerError(
            "FAILED_PRECONDITION",
            f"{name} scales its target itself (spec.mode: {spec.get('mode') or 'replicas'}); "
            "to scale through KEDA, set spec.target to the ScaledObject "
            f"(kind: ScaledObject) and spec.mode: {KEDA_MODE}",
        )
    if spec.get("dryRun") is True:
        raise ScalerError(
            "FAILED_PRECONDITION", f"{name} is in dry run (spec.dryRun): its plan is not served"
        )
    for condition in status.get("conditions") or ():
        if (
            isinstance(condition, Mapping)
            and condition.get("type") == "Invalid"
            and condition.get("status") == "True"
        ):
            raise ScalerError(
                "FAILED_PRECONDITION",
                f"{name} is Invalid ({condition.get('reason')}): {condition.get('message')}",
            )
    replicas = status.get("desiredReplicas")
    planned_at = _time(_mapping(status.get("plan")).get("plannedAt"))
    if not isinstance(replicas, int) or isinstance(replicas, bool) or planned_at is None:
        raise ScalerError("UNAVAILABLE", f"{name} has no plan yet")
    age = now - planned_at
    if age > stale_seconds:
        raise ScalerError(
            "UNAVAILABLE",
            f"{name}: its last plan is {age:.0f} s old (stale after {stale_seconds:.0f} s); "
            "is the operator reconciling it?",
        )
    return Plan(max(0, replicas), planned_at)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _time(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
