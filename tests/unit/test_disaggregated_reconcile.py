"""A disaggregated pool through the reconcile pipeline, against a fake Kubernetes with two
Deployments: each role is scaled, reported and governed on its own."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import Any

from prescaler.controller.forecast import ForecastHub
from prescaler.controller.model import PoolObject
from prescaler.controller.reconcile import Reconciler
from prescaler.kube import (
    FIELD_MANAGER,
    FieldWriter,
    ObjectRef,
    PodStart,
    StandbyObservation,
    Workload,
)
from prescaler.metrics import Metrics

NOW = 1_750_000_000.0


@dataclass
class FakeKube:
    workloads: dict[str, Workload]
    pools: dict[str, str] = field(default_factory=lambda: {"pd": "uid-1"})
    """The pools the API server has now: name -> uid."""
    scales: list[tuple[str, int]] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    config_maps: dict[str, dict[str, Any]] = field(default_factory=dict)

    async def get_workload(self, namespace: str, kind: str, name: str) -> Workload:
        return self.workloads[name]

    async def list_hpas(self, namespace: str) -> list[Any]:
        return []

    async def patch_scale(self, namespace: str, kind: str, name: str, replicas: int) -> None:
        self.scales.append((name, replicas))
        self.set_by(name, FIELD_MANAGER, replicas)

    async def list_pod_starts(self, namespace: str, selector: str) -> list[PodStart]:
        return []

    async def custom_object_uid(
        self, group: str, version: str, plural: str, namespace: str, name: str
    ) -> str | None:
        return self.pools.get(name)

    async def post_event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))

    async def ensure(self, obj: dict[str, Any]) -> StandbyObservation:
        self.config_maps[obj["metadata"]["name"]] = obj
        return StandbyObservation(desired=0, ready=0)

    def set_by(self, name: str, manager: str, replicas: int) -> None:
        self.workloads[name] = replace(
            self.workloads[name],
            replicas=replicas,
            ready_replicas=replicas,
            replicas_writer=FieldWriter(manager, None, "scale"),
        )


# A window of 10 req/s of 3000 prompt and 100 output tokens is open now: prefill needs
# 30,000 prompt tok/s over 8,000 = 4 replicas, decode 1,000 output tok/s over 1,500 = 1.
SPEC: dict[str, Any] = {
    "roles": {
        "prefill": {"target": {"name": "llm-prefill"}, "tokensPerSecond": 8000},
        "decode": {"target": {"name": "llm-decode"}, "tokensPerSecond": 1500},
    },
    "minReplicas": 1,
    "maxReplicas": 10,
    "model": {"promptTokens": 3000, "outputTokens": 100},
    "coldStart": {"mode": "fixed", "seconds": 60, "marginSeconds": 0},
    "schedules": [
        {
            "name": "docs",
            "start": "2025-06-15T00:00:00Z",
            "end": "2025-06-16T00:00:00Z",
            "expectedRequestsPerSecond": 10,
        }
    ],
}


class Cluster:
    def __init__(self) -> None:
        self.kube = FakeKube(
            {name: Workload("Deployment", name, 1, 1, "") for name in ("llm-prefill", "llm-decode")}
        )
        self.status: dict[str, Any] = {}
        self.now = NOW
        metrics = Metrics()
        self.metrics = metrics
        self.rec = Reconciler(
            kube=self.kube,  # type: ignore[arg-type]
            metrics=metrics,
            forecasts=ForecastHub(metrics=metrics, executor=None),
            clock=lambda: self.now,
        )

    def reconcile(self, seconds: float = 10.0) -> dict[str, Any]:
        self.now += seconds
        pool = PoolObject("ns", "pd", "uid-1", 1, SPEC, self.status)
        patch = asyncio.run(self.rec.reconcile(pool))
        merged = {**self.status, **patch}
        self.status = {k: v for k, v in merged.items() if v is not None}
        return self.status


def test_each_role_is_scaled_on_its_own_tokens_and_reported_per_role() -> None:
    c = Cluster()
    status = c.reconcile()
    assert c.kube.scales == [("llm-prefill", 4)]
    (event,) = [m for _, r, m in c.kube.events if r == "ScaledUp"]
    assert event.startswith("prefill: replicas of Deployment llm-prefill: 1 -> 4 (schedule)")
    prefill, decode = status["roles"]["prefill"], status["roles"]["decode"]
    assert (prefill["desiredReplicas"], decode["desiredReplicas"]) == (4, 1)
    # The cold start is each role's own (here fixed), as are the plan and its bottleneck.
    assert prefill["coldStart"]["source"] == decode["coldStart"]["source"] == "fixed"
    assert "prompt tok/s" not in decode["plan"]["reason"]
    assert status["desiredReplicas"] == 5
    assert status["roleSummary"] == "prefill 1/4 schedule, decode 1/1 schedule"
    assert status["degradation"]["level"] in ("normal", "warning", "critical")
    assert c.kube.config_maps["pd-degradation"]["data"]["pool"] == "pd"
    assert "target" not in status  # no top-level plan of its own
    assert "plan" not in status
    # Steady afterwards: nothing more is scaled.
    status = c.reconcile()
    assert c.kube.scales == [("llm-prefill", 4)]
    assert status["roleSummary"] == "prefill 4/4 schedule, decode 1/1 schedule"
    ready = next(x for x in status["conditions"] if x["type"] == "Ready")
    assert ready["status"] == "True"
    labels = {s.labels["pool"] for m in c.metrics.registry.collect() for s in m.samples
              if m.name == "prescaler_desired_replicas"}  # fmt: skip
    assert labels == {"pd/prefill", "pd/decode"}


def test_a_hand_scale_of_one_role_is_reverted_for_that_role_alone() -> None:
    c = Cluster()
    c.reconcile()
    c.reconcile()
    c.kube.set_by("llm-decode", "kubectl-scale", 6)
    status = c.reconcile()
    assert c.kube.scales[-1] == ("llm-decode", 1)
    assert [n for n, _ in c.kube.scales].count("llm-prefill") == 1
    (warning,) = [m for t, r, m in c.kube.events if r == "ExternalChange"]
    assert warning.startswith("decode: kubectl-scale changed replicas of Deployment llm-decode")
    assert status["roles"]["decode"]["externalChange"]["to"] == 6
    assert "externalChange" not in status["roles"]["prefill"]
    change = next(x for x in status["conditions"] if x["type"] == "ExternalChange")
    assert change["status"] == "True"
    assert change["message"].startswith("decode: ")
