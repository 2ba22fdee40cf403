"""A disaggregated pool through the reconcile pipeline, against a fake Kubernetes with two
Deployments: each role is scaled, reported and governed on its own."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from prescaler.api import AgainstHpaStatus, AgainstHpaWindow
from prescaler.controller.forecast import ForecastHub
from prescaler.controller.model import PoolObject
from prescaler.controller.reconcile import Reconciler
from prescaler.controller.status import roles_against_hpa, roles_window
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


# ------------------------------------------------------------------ the value report
HOUR = 3600.0


def _bucket(hours_ago: int, seconds: float = HOUR, **counters: float) -> dict[str, Any]:
    start = (NOW // HOUR - hours_ago) * HOUR
    return {"start": start, "seconds": seconds, **counters}


def _kept(*hours: dict[str, Any]) -> dict[str, Any]:
    """A role's comparison as a previous operator left it in the status."""
    return {"clock": NOW - 15, "hpa": {"ready": 1}, "hours": list(hours)}


# Prefill counts prompt tokens, decode output tokens: ten times fewer here.
PREFILL_HOURS = (
    _bucket(2, demand=1e6, gpu_hours=8, standby_gpu_hours=1, unserved=1000, short_minutes=2,
            hpa_gpu_hours=10, hpa_unserved=5000, hpa_short_minutes=6),
    _bucket(1, demand=1e6, gpu_hours=8, hpa_gpu_hours=10, direction_changes=2,
            hpa_direction_changes=3),
)  # fmt: skip
DECODE_HOURS = (
    _bucket(1, seconds=1800, demand=1e5, gpu_hours=4, unserved=20, short_minutes=3,
            hpa_gpu_hours=5, hpa_unserved=100, hpa_short_minutes=4, direction_changes=1),
)  # fmt: skip


def test_a_disaggregated_pool_reports_its_roles_comparisons_added_up() -> None:
    c = Cluster()
    spec = {**SPEC, "forecast": {"prometheus": {"url": "http://127.0.0.1:1"}}}
    c.status = {
        "roles": {
            "prefill": {"againstHpa": _kept(*PREFILL_HOURS)},
            "decode": {"againstHpa": _kept(*DECODE_HOURS)},
        }
    }
    c.now += 5  # nothing listens on port 1: no demand is read, the counters stand
    pool = PoolObject("ns", "pd", "uid-1", 1, spec, c.status)
    status = asyncio.run(c.rec.reconcile(pool))
    roles = [status["roles"][r]["againstHpa"] for r in ("prefill", "decode")]
    total = status["againstHpa"]
    for window in ("last24Hours", "last7Days"):
        mine, theirs = total[window], [r[window] for r in roles]
        for key in ("gpuHours", "standbyGpuHours", "hpaGpuHours", "savedGpuHours"):
            assert mine[key] == pytest.approx(sum(w[key] for w in theirs)), key
        assert mine == {
            "observedHours": 0.5,  # decode was compared for half an hour
            "gpuHours": 20.0,
            "standbyGpuHours": 1.0,
            "hpaGpuHours": 25.0,
            "savedGpuHours": 5.0,
            "savedPercent": 20.0,  # of the summed HPA GPU-hours
            "unservedFraction": 0.0005,  # prefill's 1000 of 2e6, over decode's 20 of 1e5
            "hpaUnservedFraction": 0.0025,  # prefill's 5000 of 2e6
            "shortMinutes": 3,  # decode's
            "hpaShortMinutes": 6,  # prefill's
            "directionChanges": 3,  # each role's fleet scales on its own: added up
            "hpaDirectionChanges": 3,
        }
    # The column `kubectl get -o wide` shows, and nothing of a shadow of its own.
    assert total["summary"] == "5.0 GPU-h (20%)"
    assert set(total) == {"basis", "summary", "last24Hours", "last7Days"}
    # The pool's metrics, under its own name beside its roles'.
    assert (_saved(c, "pd"), _saved(c, "pd/prefill"), _saved(c, "pd/decode")) == (5, 4, 1)
    shadow = "prescaler_shadow_hpa_replicas"
    assert c.metrics.registry.get_sample_value(shadow, {"namespace": "ns", "pool": "pd"}) is None
    assert c.metrics.registry.get_sample_value(shadow, {"namespace": "ns", "pool": "pd/decode"})
    c.rec.forget(pool)
    assert _saved(c, "pd") is None


def _saved(c: Cluster, pool: str) -> float | None:
    labels = {"namespace": "ns", "pool": pool, "window": "24h"}
    return c.metrics.registry.get_sample_value("prescaler_against_hpa_saved_gpu_hours", labels)


def test_the_pool_sum_needs_every_role_and_takes_the_worse_roles_service() -> None:
    day = AgainstHpaWindow(
        observed_hours=24, gpu_hours=10, standby_gpu_hours=0, hpa_gpu_hours=8,
        saved_gpu_hours=-2, saved_percent=-25, unserved_fraction=None,
        hpa_unserved_fraction=None, short_minutes=0, hpa_short_minutes=0,
    )  # fmt: skip
    busy = day.model_copy(update={"unserved_fraction": 0.01, "hpa_unserved_fraction": 0.02})
    both = roles_window([day, busy])
    assert both is not None
    assert (both.gpu_hours, both.hpa_gpu_hours, both.saved_gpu_hours) == (20, 16, -4)
    assert both.saved_percent == -25
    # A role without demand in the window has no share: the other's stands.
    assert (both.unserved_fraction, both.hpa_unserved_fraction) == (0.01, 0.02)
    quiet = roles_window([day, day])
    assert quiet is not None
    assert quiet.unserved_fraction is None
    assert roles_window([day, None]) is None
    idle = day.model_copy(update={"gpu_hours": 0, "hpa_gpu_hours": 0, "saved_gpu_hours": 0})
    unused = roles_window([idle, idle])
    assert unused is not None
    assert unused.saved_percent is None
    kept = AgainstHpaStatus(last24_hours=day, last7_days=day)
    assert roles_against_hpa([kept, None]) is None  # a role without a forecast
    planned = roles_against_hpa([kept, kept.model_copy(update={"basis": "plan"})])
    assert planned is not None
    assert planned.basis == "plan"
    assert planned.summary == "-4.0 GPU-h (-25%)"
