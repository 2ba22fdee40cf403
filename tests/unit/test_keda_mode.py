"""A pool whose target is a KEDA ScaledObject (mode ``kedaTrigger``) plans and reports
but writes no replicas, and KEDA's writes are never external changes; a pool in mode
``hpaFloor`` refuses an HPA that a ScaledObject owns. The reconcile pipeline runs against
a fake Kubernetes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import Any

from prescaler.controller.forecast import ForecastHub
from prescaler.controller.model import INVALID_REASONS, PoolObject
from prescaler.controller.reconcile import Reconciler
from prescaler.kube import (
    FieldWriter,
    Hpa,
    NotFound,
    ObjectRef,
    PodStart,
    StandbyObservation,
    Workload,
    scaled_object_from,
)
from prescaler.kube._client import hpa_from
from prescaler.metrics import Metrics
from prescaler.scaler import answer, parse_query

NOW = 1_750_000_000.0
SCALED_OBJECT = {
    "apiVersion": "keda.sh/v1alpha1",
    "kind": "ScaledObject",
    "metadata": {"name": "llama-so", "namespace": "ns"},
    "spec": {
        "scaleTargetRef": {"name": "llm"},
        "triggers": [
            {"type": "cpu", "metadata": {"value": "80"}},
            {"type": "external", "metadata": {"scalerAddress": "x:9090", "pool": "pool"}},
        ],
    },
    "status": {"hpaName": "keda-hpa-llama-so"},
}


@dataclass
class FakeKube:
    workload: Workload
    scaled_object: dict[str, Any] = field(default_factory=lambda: dict(SCALED_OBJECT))
    hpa: Hpa | None = None
    writes: list[tuple[str, int]] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    reads: list[tuple[str, str, str]] = field(default_factory=list)
    annotations: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    """The nudges: annotations written on an HPA (controller/keda.py)."""
    annotate_error: Exception | None = None

    async def get_workload(self, namespace: str, kind: str, name: str) -> Workload:
        assert (kind, name) == (self.workload.kind, self.workload.name)
        return self.workload

    async def get_custom_object(
        self, group: str, version: str, plural: str, namespace: str, name: str
    ) -> dict[str, Any]:
        self.reads.append((group, plural, name))
        if (group, version, plural, name) != ("keda.sh", "v1alpha1", "scaledobjects", "llama-so"):
            raise NotFound(f"{plural} {name}", 404)
        return self.scaled_object

    async def list_hpas(self, namespace: str) -> list[Hpa]:
        return [self.hpa] if self.hpa is not None else []

    async def get_hpa(self, namespace: str, name: str) -> Hpa:
        assert self.hpa is not None
        return self.hpa

    async def patch_scale(self, namespace: str, kind: str, name: str, replicas: int) -> None:
        self.writes.append(("scale", replicas))

    async def patch_hpa_min(self, namespace: str, name: str, min_replicas: int) -> None:
        self.writes.append(("hpa", min_replicas))

    async def annotate_hpa(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        if self.annotate_error is not None:
            raise self.annotate_error
        self.annotations.append((name, dict(annotations)))

    async def list_pod_starts(self, namespace: str, selector: str) -> list[PodStart]:
        return []

    async def custom_object_uid(
        self, group: str, version: str, plural: str, namespace: str, name: str
    ) -> str | None:
        return "uid-1"

    async def post_event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))

    async def ensure(self, obj: dict[str, Any]) -> StandbyObservation:
        return StandbyObservation(desired=0, ready=0)


def _spec(**extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "target": {"kind": "ScaledObject", "name": "llama-so"},
        "mode": "kedaTrigger",
        "minReplicas": 3,
        "maxReplicas": 8,
        "model": {"tokensPerSecond": 3000},
        "coldStart": {"mode": "fixed", "seconds": 60, "marginSeconds": 0},
    }
    spec.update(extra)
    return spec


class Cluster:
    def __init__(self, spec: dict[str, Any], replicas: int = 1) -> None:
        self.kube = FakeKube(Workload("Deployment", "llm", replicas, replicas, ""))
        self.spec = spec
        self.status: dict[str, Any] = {}
        self.now = NOW
        metrics = Metrics()
        self.rec = Reconciler(
            kube=self.kube,  # type: ignore[arg-type]
            metrics=metrics,
            forecasts=ForecastHub(metrics=metrics, executor=None),
            clock=lambda: self.now,
        )

    def reconcile(self, seconds: float = 10.0) -> dict[str, Any]:
        self.now += seconds
        pool = PoolObject("ns", "pool", "uid-1", 1, self.spec, self.status)
        patch = asyncio.run(self.rec.reconcile(pool))
        merged = {**self.status, **patch}
        self.status = {k: v for k, v in merged.items() if v is not None}
        return self.status

    def condition(self, type_: str) -> dict[str, Any]:
        return next(c for c in self.status["conditions"] if c["type"] == type_)


def test_a_keda_pool_plans_and_reports_but_writes_no_replicas() -> None:
    c = Cluster(_spec(), replicas=1)
    status = c.reconcile()
    assert c.kube.writes == []
    assert status["desiredReplicas"] == 3  # the floor: the plan KEDA is served
    assert status["keda"] == {
        "scaledObject": "llama-so",
        "workload": "Deployment/llm",
        "hpa": "keda-hpa-llama-so",
        "workloadReplicas": 1,
        "triggers": 1,
        "message": "KEDA scales Deployment/llm to the largest of its triggers: 1 now, the plan 3",
    }
    assert ("Normal", "ScaledUp") in [(t, r) for t, r, _ in c.kube.events]
    # What the scaler answers from this status.
    query = parse_query("llama-so", "ns", {"pool": "pool"})
    body = {"spec": c.spec, "status": status}
    assert answer(query, body, c.now, 60).replicas == 3


def test_keda_scaling_the_workload_is_never_an_external_change() -> None:
    c = Cluster(_spec(), replicas=1)
    c.reconcile()
    # KEDA's HPA scales the workload to 3, then another trigger to 7, written by KEDA.
    for replicas in (3, 7):
        c.kube.workload = replace(
            c.kube.workload,
            replicas=replicas,
            ready_replicas=replicas,
            replicas_writer=FieldWriter("kube-controller-manager", c.now, "scale"),
        )
        status = c.reconcile()
        assert c.condition("ExternalChange")["status"] == "False"
        assert c.condition("ExternalChange")["reason"] == "KedaScales"
        assert "externalChange" not in status
        assert status["keda"]["workloadReplicas"] == replicas
    assert status["desiredReplicas"] == 3  # the plan paces from the plan, not from KEDA's 7
    assert c.kube.writes == []
    assert not [e for e in c.kube.events if e[0] == "Warning"]


def test_keda_s_fallback_is_reported() -> None:
    c = Cluster(_spec())
    c.kube.scaled_object = {
        **SCALED_OBJECT,
        "status": {
            "hpaName": "keda-hpa-llama-so",
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "Active", "status": "True"},
                {"type": "Fallback", "status": "True"},
            ],
        },
    }
    keda = c.reconcile()["keda"]
    assert (keda["active"], keda["fallback"]) == (True, True)
    assert "at its fallback" in keda["message"]


def keda_hpa(*metric_names: str) -> Hpa:
    """KEDA's HPA for ``llama-so`` as the API server returns it, with an ``External``
    metric per name (and the cpu trigger's ``Resource`` metric)."""
    return hpa_from(
        {
            "metadata": {
                "name": "keda-hpa-llama-so",
                "ownerReferences": [
                    {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "name": "llama-so"}
                ],
            },
            "spec": {
                "scaleTargetRef": {"kind": "Deployment", "name": "llm"},
                "minReplicas": 1,
                "maxReplicas": 8,
                "metrics": [
                    {
                        "type": "Resource",
                        "resource": {
                            "name": "cpu",
                            "target": {"type": "Utilization", "averageUtilization": 80},
                        },
                    },
                    *(
                        {
                            "type": "External",
                            "external": {
                                "metric": {
                                    "name": name,
                                    "selector": {
                                        "matchLabels": {"scaledobject.keda.sh/name": "llama-so"}
                                    },
                                },
                                "target": {"type": "AverageValue", "averageValue": "1"},
                            },
                        }
                        for name in metric_names
                    ),
                ],
            },
        }
    )


def test_status_says_whether_keda_s_hpa_carries_the_plan() -> None:
    c = Cluster(_spec())
    c.kube.hpa = keda_hpa("s1-prescaler-pool")
    keda = c.reconcile()["keda"]
    assert keda["metric"] is True
    assert keda["message"].startswith("KEDA scales Deployment/llm")

    # KEDA built its HPA without this pool's trigger (it could not reach the scaler then):
    # the trigger is there, the plan scales nothing, and the status says so.
    c.kube.hpa = keda_hpa("s1-prescaler-other-pool")
    c.rec._hpas.clear()  # the namespace's HPAs are listed once per period
    keda = c.reconcile()["keda"]
    assert (keda["triggers"], keda["metric"]) == (1, False)
    assert "no metric prescaler-pool for this pool's trigger" in keda["message"]
    assert "the plan (3) scales nothing" in keda["message"]


def test_a_keda_metric_name_is_told_apart_from_another_pool_s() -> None:
    query = parse_query("llama-so", "ns", {"pool": "chat"})
    assert query.names_hpa_metric("s0-prescaler-chat")
    assert query.names_hpa_metric("s12-prescaler-chat")
    assert not query.names_hpa_metric("s0-prescaler-chat-2")
    assert not query.names_hpa_metric("prescaler-chat")
    assert not query.names_hpa_metric("s0-prescaler-chatx")
    assert keda_hpa("s0-a", "s1-b").external_metrics == ("s0-a", "s1-b")


def test_a_scaled_object_without_our_trigger_is_reported() -> None:
    c = Cluster(_spec())
    c.kube.scaled_object = {
        **SCALED_OBJECT,
        "spec": {"scaleTargetRef": {"name": "llm"}, "triggers": [{"type": "cpu"}]},
    }
    status = c.reconcile()
    assert status["keda"]["triggers"] == 0
    assert "no external trigger with metadata pool: pool" in status["keda"]["message"]


def test_a_missing_scaled_object_makes_the_pool_invalid() -> None:
    c = Cluster(_spec(target={"kind": "ScaledObject", "name": "gone"}))
    c.reconcile()
    invalid = c.condition("Invalid")
    assert (invalid["status"], invalid["reason"]) == ("True", "TargetNotFound")


def test_hpa_floor_refuses_an_hpa_that_keda_owns_and_names_the_scaled_object() -> None:
    c = Cluster(
        _spec(
            target={"kind": "HorizontalPodAutoscaler", "name": "keda-hpa-llama-so"}, mode="hpaFloor"
        )
    )
    c.kube.hpa = hpa_from(
        {
            "metadata": {
                "name": "keda-hpa-llama-so",
                "ownerReferences": [
                    {
                        "apiVersion": "keda.sh/v1alpha1",
                        "kind": "ScaledObject",
                        "name": "llama-so",
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "minReplicas": 1,
                "maxReplicas": 10,
                "scaleTargetRef": {"kind": "Deployment", "name": "llm"},
            },
        }
    )
    c.reconcile()
    invalid = c.condition("Invalid")
    assert (invalid["status"], invalid["reason"]) == ("True", "KedaOwnedHpa")
    assert "ScaledObject llama-so" in invalid["message"]
    assert "kind: ScaledObject" in invalid["message"]
    assert c.kube.writes == []
    assert [(t, r) for t, r, _ in c.kube.events] == [("Warning", "KedaOwnedHpa")]
    assert "KedaOwnedHpa" in INVALID_REASONS


def test_an_hpa_owned_by_something_else_is_not_keda_s() -> None:
    hpa = hpa_from(
        {
            "metadata": {
                "name": "h",
                "ownerReferences": [{"apiVersion": "example.com/v1", "kind": "ScaledObject"}],
            },
            "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "llm"}},
        }
    )
    assert hpa.scaled_object is None


def test_a_scaled_object_s_triggers_name_pools() -> None:
    so = scaled_object_from(
        {
            "metadata": {"name": "so"},
            "spec": {
                "scaleTargetRef": {"kind": "StatefulSet", "name": "llm"},
                "triggers": [
                    {"type": "external", "metadata": {"pool": "a"}},
                    {"type": "external-push", "metadata": {"pool": "a", "namespace": "other"}},
                    {"type": "prometheus", "metadata": {"pool": "a"}},
                ],
            },
        }
    )
    assert (so.target_kind, so.target_name, so.hpa_name) == ("StatefulSet", "llm", None)
    assert so.triggers_for("ns", "a") == 1
    assert so.triggers_for("other", "a") == 2
