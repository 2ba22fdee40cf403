"""Which pods need a warm-up and what to do with each, as plain data and pure functions.

A pod is *gated* when its spec lists the readiness gate ``prescaler.io/prewarmed``: it is
not Ready, and its Services do not route to it, until that pod condition is ``True``. The
operator sets it once the warm-up is over, whatever its outcome, so the gate can delay a
replica by at most one warm-up timeout and never keeps it out of service for good.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import yaml

from prescaler.api import PREWARM_CONDITION, PrewarmSpec

Reason = Literal["Prewarmed", "PrewarmFailed", "PrewarmTimedOut", "PrewarmNotConfigured"]
PREWARMED: Reason = "Prewarmed"
"""Every warm-up request was answered."""
FAILED: Reason = "PrewarmFailed"
"""The engine answered an error or garbage, or there were no prompts to send."""
TIMED_OUT: Reason = "PrewarmTimedOut"
"""The warm-up did not finish within ``timeoutSeconds``."""
NOT_CONFIGURED: Reason = "PrewarmNotConfigured"
"""A gated pod that no pool with ``spec.prewarm`` warms: released without requests."""
REASONS: tuple[Reason, ...] = (PREWARMED, FAILED, TIMED_OUT, NOT_CONFIGURED)

TEMPLATE_HASH_LABEL = "pod-template-hash"
"""The label a Deployment's ReplicaSet puts on its pods; the ReplicaSet is named
``<deployment>-<hash>``."""


@dataclass(frozen=True, slots=True)
class WarmupConfig:
    """What one pod's warm-up sends, from the pool's ``spec.prewarm`` and its prompts."""

    prompts: tuple[str, ...]
    max_requests: int = 8
    timeout_seconds: float = 120.0
    port: int = 8000
    path: str = "/v1/completions"
    models_path: str = "/v1/models"
    model: str | None = None

    @property
    def requests(self) -> tuple[str, ...]:
        """The prompts sent, in order: each once, at most ``max_requests``."""
        return self.prompts[: self.max_requests]


def warmup_config(spec: PrewarmSpec, prompts: Sequence[str]) -> WarmupConfig:
    """The warm-up a pool's ``spec.prewarm`` asks for, with its (resolved) prompts."""
    return WarmupConfig(
        prompts=tuple(prompts),
        max_requests=spec.max_requests,
        timeout_seconds=float(spec.timeout_seconds),
        port=spec.port,
        path=spec.path,
        models_path=spec.models_path,
        model=spec.model,
    )


@dataclass(frozen=True, slots=True)
class WarmupResult:
    """How one pod's warm-up ended: the pod condition's reason and message."""

    reason: Reason
    message: str
    sent: int = 0
    """Completion requests sent."""
    answered: int = 0
    """Of those, answered with a completion."""
    model: str | None = None
    """The model name the requests carried."""
    seconds: float = 0.0
    """How long the warm-up took."""


MAX_PROMPTS = 4096
"""Prompts a ConfigMap may hold at most (only ``maxRequests`` of them are sent)."""


def parse_prompts(text: str) -> tuple[str, ...]:
    """The prompts in a ConfigMap value: a YAML (or JSON) list of non-empty strings.

    Raises ``ValueError`` saying what is wrong, for the pool's condition.
    """
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ValueError(f"not YAML or JSON{where}") from None
    if not isinstance(data, list):
        raise ValueError(f"not a list of prompts but {type(data).__name__}")
    if not data:
        raise ValueError("the list of prompts is empty")
    if len(data) > MAX_PROMPTS:
        raise ValueError(f"{len(data)} prompts, more than {MAX_PROMPTS}")
    for i, item in enumerate(data):
        if isinstance(item, dict):
            raise ValueError(
                f"item {i} is a mapping, not a string: quote a prompt that has ': ' in it "
                "or ends with ':'"
            )
        if not isinstance(item, str) or not item:
            raise ValueError(f"item {i} is not a non-empty string")
    return tuple(data)


# ---------------------------------------------------------------------- templates
def has_gate(template: Mapping[str, Any]) -> bool:
    """Does the pod template list the readiness gate ``prescaler.io/prewarmed``?"""
    gates = (template.get("spec") or {}).get("readinessGates") or []
    return any(
        isinstance(g, Mapping) and g.get("conditionType") == PREWARM_CONDITION for g in gates
    )


def with_gate(template: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the pod template with the readiness gate added (if it lacked it)."""
    pod = copy.deepcopy(dict(template))
    if not has_gate(pod):
        spec = pod.setdefault("spec", {})
        spec["readinessGates"] = [
            *(spec.get("readinessGates") or []),
            {"conditionType": PREWARM_CONDITION},
        ]
    return pod


# ---------------------------------------------------------------------- pods
@dataclass(frozen=True, slots=True)
class PodGate:
    """A pod as warm-up sees it."""

    uid: str
    namespace: str
    name: str
    ip: str | None
    gated: bool
    """Its spec lists the readiness gate: it waits for the condition to be Ready."""
    condition: str | None
    """The status of its ``prescaler.io/prewarmed`` condition (``None``: not set)."""
    containers_ready_at: float | None
    """When ``ContainersReady`` turned True (``None`` while it is not; NaN when it is but
    says no time)."""
    terminating: bool
    created_at: float | None
    """Its ``creationTimestamp``."""
    workload: tuple[str, str] | None
    """``(kind, name)`` of the workload that made it: a Deployment (through its
    ReplicaSet) or a StatefulSet; ``None`` for other pods."""
    labels: Mapping[str, str]

    @property
    def done(self) -> bool:
        return self.condition == "True"

    @property
    def key(self) -> tuple[str, str, str] | None:
        """``(namespace, kind, name)`` of its workload."""
        if self.workload is None:
            return None
        return (self.namespace, *self.workload)


def _time(text: object) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def pod_workload(meta: Mapping[str, Any]) -> tuple[str, str] | None:
    """The workload behind a pod, from its controller's owner reference (no API call):
    ``<deployment>-<pod-template-hash>`` is a Deployment's ReplicaSet."""
    labels = meta.get("labels") or {}
    for ref in meta.get("ownerReferences") or []:
        if not isinstance(ref, Mapping) or not ref.get("controller"):
            continue
        kind, name = str(ref.get("kind") or ""), str(ref.get("name") or "")
        if kind == "StatefulSet":
            return ("StatefulSet", name)
        if kind == "ReplicaSet":
            suffix = f"-{labels.get(TEMPLATE_HASH_LABEL, '')}"
            if len(suffix) > 1 and name.endswith(suffix) and len(name) > len(suffix):
                return ("Deployment", name[: -len(suffix)])
    return None


def pod_gate(pod: Mapping[str, Any]) -> PodGate:
    """Parse a pod body (a watch event's object)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    condition: str | None = None
    containers_ready_at: float | None = None
    for cond in status.get("conditions") or []:
        if not isinstance(cond, Mapping):
            continue
        if cond.get("type") == PREWARM_CONDITION:
            condition = str(cond.get("status"))
        elif cond.get("type") == "ContainersReady" and cond.get("status") == "True":
            containers_ready_at = _time(cond.get("lastTransitionTime")) or math.nan
    return PodGate(
        uid=str(meta.get("uid") or ""),
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        ip=str(status["podIP"]) if status.get("podIP") else None,
        gated=has_gate({"spec": spec}),
        condition=condition,
        containers_ready_at=containers_ready_at,
        terminating=meta.get("deletionTimestamp") is not None,
        created_at=_time(meta.get("creationTimestamp")),
        workload=pod_workload(meta),
        labels=dict(meta.get("labels") or {}),
    )


# ---------------------------------------------------------------------- decisions
@dataclass(frozen=True, slots=True)
class Claim:
    """What a pool published for one workload at its last reconcile."""

    pool: str
    """The pool's name."""
    config: WarmupConfig | None
    """``None``: the pool has no ``spec.prewarm``."""
    problem: str | None = None
    """Why there is nothing to send (the prompts' ConfigMap is missing, say)."""


Verb = Literal["wait", "warm", "release", "forget"]


@dataclass(frozen=True, slots=True)
class Action:
    """What to do with one pod now."""

    verb: Verb
    """``wait``: nothing yet; ``warm``: send the warm-up; ``release``: set the condition
    without requests; ``forget``: stop tracking it."""
    reason: Reason | None = None
    message: str = ""


WAIT = Action("wait")
FORGET = Action("forget")


def decide(
    pod: PodGate,
    claim: Claim | None,
    now: float,
    *,
    waiting_since: float | None,
    unclaimed_grace_seconds: float,
) -> Action:
    """What to do with ``pod``, given the claim on its workload (``None``: no pool
    published one) and since when it has been ready and waiting for one.

    Gated pods are always brought to an end: warmed, or released with a reason. Pods
    without the gate are warmed only when their workload's pool has ``spec.prewarm`` and
    they turned ready within the last timeout (older ones already serve; a warm-up adds
    nothing to them), and then only best effort: they take traffic meanwhile. Such a pod
    that no pool claims yet is waited for while it is young (created within the grace: its
    pool may not have reconciled yet), then forgotten.
    """
    if pod.done or pod.terminating:
        return FORGET
    if not pod.gated:
        if claim is None:
            if pod.workload is None:  # a bare pod, a Job's: no pool scales it
                return FORGET
            young = pod.created_at is not None and now - pod.created_at < unclaimed_grace_seconds
            return WAIT if young else FORGET
        if claim.config is None:
            return FORGET
    if pod.containers_ready_at is None or pod.ip is None:
        return WAIT
    if claim is None:
        if waiting_since is None or now - waiting_since < unclaimed_grace_seconds:
            return WAIT
        return Action(
            "release",
            NOT_CONFIGURED,
            f"released without warm-up: no InferencePool with spec.prewarm scales "
            f"{_workload(pod)} (waited {unclaimed_grace_seconds:.0f} s for one)",
        )
    if claim.config is None:
        return Action(
            "release",
            NOT_CONFIGURED,
            f"released without warm-up: InferencePool {claim.pool} has no spec.prewarm",
        )
    if not pod.gated:
        ready_at = pod.containers_ready_at
        if math.isnan(ready_at) or now - ready_at > claim.config.timeout_seconds:
            return FORGET
    if claim.problem is not None:
        return Action("release", FAILED, f"released without warm-up: {claim.problem}")
    return Action("warm")


def _workload(pod: PodGate) -> str:
    if pod.workload is None:
        return "its owner"
    return f"{pod.workload[0]} {pod.workload[1]}"


def condition_patch(reason: Reason, message: str, now: str) -> dict[str, Any]:
    """The strategic merge patch of ``pods/status`` that sets the condition (merged by
    type: the kubelet's own conditions are untouched). Always ``True``: the gate never
    holds a pod once its warm-up is over, whatever the outcome."""
    return {
        "status": {
            "conditions": [
                {
                    "type": PREWARM_CONDITION,
                    "status": "True",
                    "reason": reason,
                    "message": message[:1024],
                    "lastTransitionTime": now,
                    "lastProbeTime": None,
                }
            ]
        }
    }
