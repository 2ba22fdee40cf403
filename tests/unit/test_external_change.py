"""Someone else changed the target's replicas: detection from the writer, the three
policies, a lost status write of our own, and hpaFloor (the HPA's own changes are not
external). The reconcile pipeline runs against a fake Kubernetes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from prescaler.controller.forecast import ForecastHub
from prescaler.controller.model import PoolObject
from prescaler.controller.reconcile import Reconciler
from prescaler.controller.status import rfc3339
from prescaler.kube import (
    FIELD_MANAGER,
    FieldWriter,
    Hpa,
    ObjectRef,
    PodStart,
    StandbyObservation,
    Workload,
)
from prescaler.metrics import Metrics

NOW = 1_750_000_000.0
HAND = "kubectl-scale"


@dataclass
class FakeKube:
    workload: Workload
    pools: dict[str, str] = field(default_factory=lambda: {"pool": "uid-1"})
    """The pools the API server has now: name -> uid."""
    hpa: Hpa | None = None
    scales: list[int] = field(default_factory=list)
    floors: list[int] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)

    async def get_workload(self, namespace: str, kind: str, name: str) -> Workload:
        return self.workload

    async def list_hpas(self, namespace: str) -> list[Hpa]:
        return []

    async def get_hpa(self, namespace: str, name: str) -> Hpa:
        assert self.hpa is not None
        return self.hpa

    async def patch_scale(self, namespace: str, kind: str, name: str, replicas: int) -> None:
        self.scales.append(replicas)
        self.set_by(FIELD_MANAGER, replicas, None)

    async def patch_hpa_min(self, namespace: str, name: str, min_replicas: int) -> None:
        assert self.hpa is not None
        self.floors.append(min_replicas)
        self.hpa = replace(
            self.hpa,
            min_replicas=min_replicas,
            min_replicas_writer=FieldWriter(FIELD_MANAGER, NOW),
        )

    async def list_pod_starts(self, namespace: str, selector: str) -> list[PodStart]:
        return []

    async def custom_object_uid(
        self, group: str, version: str, plural: str, namespace: str, name: str
    ) -> str | None:
        return self.pools.get(name)

    async def post_event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))

    async def ensure(self, obj: dict[str, Any]) -> StandbyObservation:
        self.objects[obj["metadata"]["name"]] = obj
        return StandbyObservation(desired=0, ready=0)

    def set_by(self, manager: str, replicas: int, at: float | None) -> None:
        self.workload = replace(
            self.workload,
            replicas=replicas,
            replicas_writer=FieldWriter(manager, at, "scale"),
        )


def _pool(spec: dict[str, Any], status: dict[str, Any], generation: int = 1) -> PoolObject:
    return PoolObject("ns", "pool", "uid-1", generation, spec, status)


def _spec(**extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "target": {"kind": "Deployment", "name": "llm"},
        "minReplicas": 3,
        "maxReplicas": 8,
        "model": {"tokensPerSecond": 3000},
        "coldStart": {"mode": "fixed", "seconds": 60, "marginSeconds": 0},
    }
    spec.update(extra)
    return spec


class Cluster:
    """A pool reconciled again and again, its status kept as the API server would."""

    def __init__(self, spec: dict[str, Any], replicas: int = 1) -> None:
        self.kube = FakeKube(Workload("Deployment", "llm", replicas, replicas, ""))
        self.spec = spec
        self.status: dict[str, Any] = {}
        self.generation = 1
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
        patch = asyncio.run(self.rec.reconcile(_pool(self.spec, self.status, self.generation)))
        merged = {**self.status, **patch}
        self.status = {k: v for k, v in merged.items() if v is not None}
        return self.status

    def condition(self) -> dict[str, Any]:
        return next(c for c in self.status["conditions"] if c["type"] == "ExternalChange")

    def warnings(self) -> list[str]:
        return [m for t, r, m in self.kube.events if r == "ExternalChange" and t == "Warning"]


def test_our_own_scales_are_never_external() -> None:
    c = Cluster(_spec())
    status = c.reconcile()
    assert c.kube.scales == [3]
    assert status["appliedReplicas"] == 3
    c.spec = _spec(minReplicas=5)
    status = c.reconcile()
    assert c.kube.scales == [3, 5]
    assert c.condition()["status"] == "False"
    assert c.condition()["reason"] == "InControl"
    assert not c.warnings()
    assert "externalChange" not in status


def test_revert_reports_the_manager_and_puts_the_plan_back() -> None:
    c = Cluster(_spec())
    c.reconcile()
    c.kube.set_by(HAND, 1, NOW + 5)
    status = c.reconcile()
    assert c.kube.scales == [3, 3]
    change = status["externalChange"]
    assert change["manager"] == HAND
    assert (change["from"], change["to"], change["action"]) == (3, 1, "Reverted")
    assert change["changedAt"] == rfc3339(NOW + 5)
    assert c.condition()["status"] == "True"
    assert c.condition()["reason"] == "Reverted"
    assert c.warnings() == [
        f"{HAND} changed replicas of Deployment llm 3 -> 1 at {rfc3339(NOW + 5)}, not this "
        "operator; reverting to the plan (spec.externalChanges: revert)"
    ]
    status = c.reconcile()
    assert c.condition()["status"] == "False"
    assert HAND in c.condition()["message"]
    assert len(c.warnings()) == 1, "one change, one Event"
    assert c.kube.scales == [3, 3]


def test_respect_holds_the_other_value_until_the_plan_moves() -> None:
    c = Cluster(_spec(externalChanges="respect"))
    c.reconcile()
    c.kube.set_by(HAND, 5, NOW + 5)
    for _ in range(3):
        status = c.reconcile()
        assert c.kube.scales == [3]
        assert status["appliedReplicas"] == 5
        assert status["plan"]["action"] == "hold"
        assert c.condition()["reason"] == "Respected"
    assert len(c.warnings()) == 1
    c.spec = _spec(externalChanges="respect", minReplicas=6)
    status = c.reconcile()
    assert c.kube.scales == [3, 6]
    assert status["externalChange"]["action"] == "Resumed"
    assert c.condition()["status"] == "False"


def test_pause_holds_until_the_spec_is_edited_or_the_value_is_put_back() -> None:
    c = Cluster(_spec(externalChanges="pause"))
    c.reconcile()
    c.kube.set_by(HAND, 1, None)
    c.reconcile()
    c.spec = _spec(externalChanges="pause", minReplicas=4)  # a new plan, same generation
    status = c.reconcile()
    assert c.kube.scales == [3]
    assert status["externalChange"]["action"] == "Paused"
    assert status["externalChange"]["manager"] == HAND
    assert "changedAt" not in status["externalChange"]
    c.generation = 2  # the user edits the spec
    status = c.reconcile()
    assert c.kube.scales == [3, 4]
    assert status["externalChange"]["action"] == "Resumed"

    # Paused again, then someone puts the operator's value back: scaling resumes.
    c.kube.set_by(HAND, 2, NOW)
    c.reconcile()
    c.kube.set_by("other-hand", 4, NOW)
    status = c.reconcile()
    assert status["externalChange"]["action"] == "Resumed"
    assert len(c.warnings()) == 2


def test_a_lost_status_write_of_our_own_is_adopted_with_its_scale_time() -> None:
    c = Cluster(_spec(scaleDown={"mode": "paced", "stabilizationSeconds": 600}))
    c.reconcile()
    before = dict(c.status)
    c.spec = _spec(minReplicas=6, scaleDown={"mode": "paced", "stabilizationSeconds": 600})
    c.reconcile()  # scales 3 -> 6; pretend its status never reached the API server
    assert c.kube.scales == [3, 6]
    c.status = before
    c.spec = _spec(minReplicas=1, scaleDown={"mode": "paced", "stabilizationSeconds": 600})
    status = c.reconcile()
    assert not c.warnings()
    assert status["appliedReplicas"] == 6
    assert status["lastScaleUpTime"] == rfc3339(c.now), "restored (found now: no time)"
    assert c.kube.scales == [3, 6], "a scale-down inside the lost scale-up's stabilization"


def test_a_first_scale_whose_status_was_lost_keeps_its_time() -> None:
    c = Cluster(_spec(scaleDown={"mode": "paced", "stabilizationSeconds": 600}))
    c.reconcile()  # scales 1 -> 3; its status (the first one) never reached the API server
    assert c.kube.scales == [3]
    c.status = {}
    c.spec = _spec(minReplicas=1, scaleDown={"mode": "paced", "stabilizationSeconds": 600})
    status = c.reconcile()
    assert not c.warnings()
    assert status["appliedReplicas"] == 3
    assert status["lastScaleUpTime"] == rfc3339(c.now), "restored (found now: no time)"
    assert c.kube.scales == [3], "a scale-down inside the lost scale-up's stabilization"


def test_a_target_first_set_by_someone_else_is_not_adopted() -> None:
    c = Cluster(_spec())
    c.kube.set_by(HAND, 3, NOW)
    status = c.reconcile()
    assert "lastScaleUpTime" not in status
    assert not c.warnings()


@pytest.mark.parametrize("writer", [FieldWriter(HAND, NOW), None])
def test_a_writer_not_recorded_is_external_too(writer: FieldWriter | None) -> None:
    c = Cluster(_spec())
    c.reconcile()
    c.kube.workload = replace(c.kube.workload, replicas=2, replicas_writer=writer)
    status = c.reconcile()
    assert status["externalChange"]["manager"] == (HAND if writer else "unknown")


def test_a_renamed_target_starts_afresh_instead_of_being_an_external_change() -> None:
    c = Cluster(_spec(externalChanges="respect"))
    c.reconcile()
    assert c.kube.scales == [3]
    c.kube.set_by(HAND, 5, NOW)  # a change on the old target, respected
    status = c.reconcile()
    assert (status["externalChange"]["action"], len(c.warnings())) == ("Respected", 1)
    # The pool now names another Deployment, which someone else keeps at 2.
    c.kube.workload = Workload(
        "Deployment", "llm2", 2, 2, "", replicas_writer=FieldWriter(HAND, None)
    )
    c.spec = _spec(externalChanges="respect", target={"kind": "Deployment", "name": "llm2"})
    c.generation = 2
    status = c.reconcile()
    assert len(c.warnings()) == 1, "a rename is not an external change"
    assert "externalChange" not in status, "the old target's change does not hold the new one"
    assert c.condition()["reason"] == "InControl"
    assert c.kube.scales == [3, 3], "the plan applies to the new target"
    assert (status["appliedReplicas"], status["appliedTarget"]) == (3, "Deployment/llm2")
    # A change on the new target is still one.
    c.kube.set_by(HAND, 6, NOW)
    status = c.reconcile()
    assert (status["externalChange"]["from"], status["externalChange"]["to"]) == (3, 6)
    assert len(c.warnings()) == 2


def test_hpa_floor_mode_watches_the_floor_not_the_hpa_s_replicas() -> None:
    c = Cluster(_spec(target={"kind": "HorizontalPodAutoscaler", "name": "llm"}, mode="hpaFloor"))
    c.kube.hpa = Hpa("llm", 1, 8, 1, "Deployment", "llm")
    c.reconcile()
    assert c.kube.floors == [3]
    # The HPA scales the Deployment: its job.
    c.kube.set_by("horizontal-pod-autoscaler", 7, NOW)
    c.reconcile()
    assert not c.warnings()
    # Someone lowers the floor: external.
    c.kube.hpa = replace(c.kube.hpa, min_replicas=1, min_replicas_writer=FieldWriter(HAND, NOW))
    c.reconcile()
    assert c.kube.floors == [3, 3]
    assert c.warnings()[0].startswith(f"{HAND} changed minReplicas of HPA llm 3 -> 1")


def test_dry_run_detects_nothing_and_records_nothing() -> None:
    c = Cluster(_spec(dryRun=True))
    status = c.reconcile()
    c.kube.set_by(HAND, 2, NOW)
    status = c.reconcile()
    assert "appliedReplicas" not in status
    assert c.condition()["status"] == "Unknown"
    assert not c.warnings()
