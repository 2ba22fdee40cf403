"""What a steady-state reconcile costs the API server and Prometheus: status writes carry
only what changed (nothing: no write), and reads are shared or skipped when nothing moved."""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass, field, replace
from typing import Any

import jsonpatch
import pytest

from prescaler.controller.forecast import ForecastHub
from prescaler.controller.model import PoolGone, PoolObject
from prescaler.controller.reconcile import Reconciler
from prescaler.controller.status import (
    apply_merge_patch,
    observation_only,
    rfc3339,
    status_ops,
)
from prescaler.kube import Hpa, KubeError, NotFound, PodStart
from prescaler.metrics import Metrics
from prescaler.sources import Snapshot
from unit.test_status_pipeline import NOW, FakeKube, _kube, _spec

NOW_TEXT = "2025-06-15T15:09:40Z"


def _hour(start: float, seconds: float) -> dict[str, Any]:
    return {"start": start, "seconds": seconds, "gpuHours": 1.0, "hpaGpuHours": 2.0}


def _status(hours: int, current_seconds: float) -> dict[str, Any]:
    week = [_hour(3600.0 * i, 3600.0) for i in range(hours - 1)]
    return {
        "desiredReplicas": 3,
        "conditions": [{"type": "Ready", "status": "True"}],
        "againstHpa": {"clock": 100.0, "hours": [*week, _hour(3600.0 * hours, current_seconds)]},
    }


def _applied(previous: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    doc = {"status": copy.deepcopy(previous)} if previous else {}
    return dict(jsonpatch.apply_patch(doc, ops)["status"])


def test_an_unchanged_status_needs_no_write() -> None:
    status = _status(168, 600.0)
    assert status_ops(status, copy.deepcopy(status)) == []
    # A whole float comes back from the API server as an integer: not a change.
    assert status_ops({"lookaheadSeconds": 120}, {"lookaheadSeconds": 120.0}) == []
    assert status_ops({"ok": 1}, {"ok": True}) != []


def test_the_current_hour_is_written_without_the_closed_ones() -> None:
    old, new = _status(168, 600.0), _status(168, 660.0)
    new["againstHpa"]["clock"] = 160.0
    ops = status_ops(old, new)
    assert ops == [
        {"op": "replace", "path": "/status/againstHpa/clock", "value": 160.0},
        {"op": "replace", "path": "/status/againstHpa/hours/167/seconds", "value": 660.0},
    ]
    assert _applied(old, ops) == new


def test_an_hour_that_closes_rewrites_the_week_once() -> None:
    old = _status(168, 3600.0)
    hours = old["againstHpa"]["hours"]
    new = copy.deepcopy(old)
    new["againstHpa"]["hours"] = [*copy.deepcopy(hours[1:]), _hour(3600.0 * 169, 15.0)]
    ops = status_ops(old, new)
    assert ops == [
        {"op": "replace", "path": "/status/againstHpa/hours", "value": new["againstHpa"]["hours"]}
    ]
    # Not a full week yet: the list grows, and is written whole.
    young = _status(3, 3600.0)
    grown = copy.deepcopy(young)
    grown["againstHpa"]["hours"].append(_hour(3600.0 * 4, 15.0))
    assert _applied(young, status_ops(young, grown)) == grown


def test_ops_turn_any_status_into_the_new_one() -> None:
    old = {"a": {"b": 1, "c/d": [1, 2], "gone": "x"}, "e~f": None, "same": [{"k": 1}]}
    new = {"a": {"b": 2, "c/d": [1, 2, 3], "new": {"z": 1}}, "same": [{"k": 1}], "g": "h"}
    assert _applied(old, status_ops(old, new)) == new
    assert _applied({}, status_ops({}, new)) == new


def test_a_merge_patch_applies_as_the_api_server_does() -> None:
    previous = {"a": {"b": 1, "c": 2}, "d": [1, 2], "e": 3}
    assert apply_merge_patch(previous, {"a": {"c": None}, "d": [3], "e": None}) == {
        "a": {"b": 1},
        "d": [3],
    }


@dataclass
class WritingKube(FakeKube):
    """Keeps the pool's status as the API server would and records its writes;
    ``moved``: the pool changed since it was read (a JSON patch's resourceVersion test
    fails, and the API server refuses it with 422)."""

    writes: list[tuple[str, Any]] = field(default_factory=list)
    stored: dict[str, Any] = field(default_factory=dict)
    version: int = 41
    moved: bool = False
    deleted: bool = False
    pod_lists: int = 0
    hpa_lists: int = 0

    async def patch_status(
        self, group: str, version: str, plural: str, ns: str, name: str, status: dict[str, Any]
    ) -> None:
        if self.deleted:
            raise NotFound(f"{plural} {name}", 404)
        self.writes.append(("merge", status))
        self.stored, self.version = apply_merge_patch(self.stored, status), self.version + 1

    async def patch_status_ops(
        self,
        group: str,
        version: str,
        plural: str,
        ns: str,
        name: str,
        resource_version: str,
        ops: list[dict[str, Any]],
    ) -> None:
        if self.deleted:
            raise NotFound(f"{plural} {name}", 404)
        if self.moved:
            raise KubeError("test failed", 422)
        assert resource_version == str(self.version)
        self.writes.append(("ops", (resource_version, ops)))
        self.stored, self.version = _applied(self.stored, ops), self.version + 1

    async def list_pod_starts(self, namespace: str, selector: str) -> list[PodStart]:
        self.pod_lists += 1
        return await super().list_pod_starts(namespace, selector)

    async def list_hpas(self, namespace: str) -> list[Hpa]:
        self.hpa_lists += 1
        return await super().list_hpas(namespace)


def _writing_kube(ready: int = 2) -> WritingKube:
    kube = WritingKube()
    kube.workloads = _kube(2, ready).workloads
    w = kube.workloads[("Deployment", "llm")]
    kube.workloads[("Deployment", "llm")] = replace(w, resource_version="7")
    kube.pods = [PodStart(f"llm-{i}", NOW - 900, NOW - 800) for i in range(ready)]
    return kube


def _reconciler(kube: FakeKube, clock: list[float]) -> Reconciler:
    metrics = Metrics()
    return Reconciler(
        kube=kube,  # type: ignore[arg-type]
        metrics=metrics,
        forecasts=ForecastHub(metrics=metrics, executor=None),
        clock=lambda: clock[0],
        interval_seconds=60.0,
        checkpoint_spread=lambda _: 0.0,
    )


def _cycle(rec: Reconciler, kube: WritingKube, versioned: bool = True) -> None:
    """One reconcile of the pool as the API server has it, and its status write."""
    rv = str(kube.version) if versioned else None
    spec = _spec(minReplicas=2)
    asyncio.run(rec.run(PoolObject("ns", "pool", "uid-1", 1, spec, kube.stored, None, rv)))


def test_a_steady_reconcile_writes_nothing_and_reads_no_pods() -> None:
    kube, clock = _writing_kube(), [NOW]
    rec = _reconciler(kube, clock)
    _cycle(rec, kube)
    assert [kind for kind, _ in kube.writes] == ["ops"]  # the first: the whole status
    assert kube.pod_lists == 1
    first = kube.stored
    for _ in range(3):
        clock[0] += 60
        _cycle(rec, kube)
    # Only the plan's times moved (its last recent target's, its own): kept back, not written.
    assert len(kube.writes) == 1
    assert kube.pod_lists == 1  # the target did not move, and every pod was Ready
    # ... until this reconciler's last write is five periods old: then it is written.
    clock[0] += 120
    _cycle(rec, kube)
    assert len(kube.writes) == 2
    ((_, (_, ops)),) = kube.writes[1:]
    assert sorted(op["path"] for op in ops) == [
        "/status/plan/plannedAt",
        "/status/plan/recentTargets/0/at",
    ]
    assert kube.stored != first
    # The target moved (a pod's readiness, a scale): its pods are read again.
    w = kube.workloads[("Deployment", "llm")]
    kube.workloads[("Deployment", "llm")] = replace(w, resource_version="8")
    clock[0] += 60
    _cycle(rec, kube)
    assert kube.pod_lists == 2


def test_observations_wait_for_a_checkpoint_and_decisions_do_not() -> None:
    kept = [
        {"op": "replace", "path": "/status/demand/requestsPerSecond", "value": 2.0},
        {"op": "replace", "path": "/status/againstHpa/hours/167/seconds", "value": 60.0},
        {"op": "replace", "path": "/status/roles/decode/risk/outcomes", "value": 3},
        {"op": "replace", "path": "/status/forecast/points", "value": []},
        {"op": "replace", "path": "/status/degradation/reasons/0", "value": "holding for 9s"},
        {"op": "replace", "path": "/status/conditions/2/message", "value": "auto, sMAPE 9.1%"},
        {"op": "replace", "path": "/status/roles/decode/conditions/0/message", "value": ""},
        {"op": "replace", "path": "/status/conditions/0/lastTransitionTime", "value": NOW_TEXT},
    ]
    written = [
        {"op": "replace", "path": "/status/desiredReplicas", "value": 3},
        {"op": "replace", "path": "/status/forecast/selection", "value": {"model": "x"}},
        {"op": "replace", "path": "/status/roles/decode/plan/action", "value": "scale_up"},
        {"op": "replace", "path": "/status/conditions/0/reason", "value": "Interim"},
        {"op": "replace", "path": "/status/conditions", "value": []},
        {"op": "replace", "path": "/status/degradation/level", "value": "warning"},
        {"op": "add", "path": "/status/demandX", "value": 1},
    ]
    assert all(observation_only(op) for op in kept)
    assert not any(observation_only(op) for op in written)


def test_a_stopping_operator_writes_what_it_kept_back() -> None:
    kube, clock = _writing_kube(), [NOW]
    rec = _reconciler(kube, clock)
    _cycle(rec, kube)
    clock[0] += 60
    _cycle(rec, kube)
    assert len(kube.writes) == 1
    asyncio.run(rec.flush())
    assert len(kube.writes) == 2
    assert kube.stored["plan"]["recentTargets"][-1]["at"] == rfc3339(clock[0])
    asyncio.run(rec.flush())
    assert len(kube.writes) == 2


def test_a_kept_back_status_is_the_next_reconciles_previous() -> None:
    kube, clock = _writing_kube(), [NOW]
    rec = _reconciler(kube, clock)
    _cycle(rec, kube)
    clock[0] += 60
    _cycle(rec, kube)
    kept = rec._kept["uid-1"][1]
    assert kept["plan"]["recentTargets"][-1]["at"] != kube.stored["plan"]["recentTargets"][-1]["at"]
    # The scale-down memory counts from the kept time: a write now carries it.
    kube.workloads[("Deployment", "llm")] = replace(
        kube.workloads[("Deployment", "llm")], resource_version="9"
    )
    kube.version += 1  # someone else changed the pool: the kept status is not used
    clock[0] += 60
    _cycle(rec, kube)
    assert rec._kept["uid-1"][0].resource_version == str(kube.version)


def test_pods_are_read_every_time_while_one_is_not_ready() -> None:
    kube, clock = _writing_kube(ready=1), [NOW]
    rec = _reconciler(kube, clock)
    _cycle(rec, kube)
    clock[0] += 60
    _cycle(rec, kube)
    assert kube.pod_lists == 2


def test_a_pool_that_moved_since_it_was_read_gets_the_whole_merge_patch() -> None:
    kube, clock = _writing_kube(), [NOW]
    kube.moved = True
    _cycle(_reconciler(kube, clock), kube)
    assert [kind for kind, _ in kube.writes] == ["merge"]
    kube.writes.clear()
    kube.stored = {}
    _cycle(_reconciler(kube, clock), kube, versioned=False)  # no version known
    assert [kind for kind, _ in kube.writes] == ["merge"]


def test_the_hpas_of_a_namespace_are_listed_once_a_period_for_all_its_pools() -> None:
    kube, clock = _writing_kube(), [NOW]
    rec = _reconciler(kube, clock)
    spec = _spec(forecast={"prometheus": {"url": "http://127.0.0.1:1"}, "selector": 'a="b"'})
    for i in range(3):
        pool = PoolObject("ns", f"pool-{i}", f"uid-{i}", 1, spec, {})
        asyncio.run(rec.reconcile(pool))
    assert kube.hpa_lists == 1
    clock[0] += 60
    asyncio.run(rec.reconcile(PoolObject("ns", "pool-0", "uid-0", 1, spec, {})))
    assert kube.hpa_lists == 2


class CountingSource:
    def __init__(self) -> None:
        self.calls = 0

    def snapshot(self, at: float) -> Snapshot:
        self.calls += 1
        return Snapshot(at=at, requests_per_second=float(self.calls))


@pytest.mark.parametrize("pools", [2, 5])
def test_pools_reading_one_series_share_its_instant_queries(pools: int) -> None:
    rec, source = _reconciler(FakeKube(), [NOW]), CountingSource()
    objs = [PoolObject("ns", f"p{i}", f"uid-{i}", 1, {}, {}) for i in range(pools)]
    for pool in objs:
        rec._sources[pool.uid] = ("one series", source)  # type: ignore[assignment]

    async def cycle(now: float) -> list[Snapshot]:
        return [
            await rec._snapshot(pool, None, source, now)  # type: ignore[arg-type]
            for pool in objs
        ]

    first = asyncio.run(cycle(NOW))
    assert source.calls == 1
    assert {s.requests_per_second for s in first} == {1.0}
    # A pool never gets the same snapshot twice: its next reconcile queries again.
    again = asyncio.run(rec._snapshot(objs[0], None, source, NOW + 1))  # type: ignore[arg-type]
    assert (source.calls, again.requests_per_second) == (2, 2.0)
    asyncio.run(cycle(NOW + 60))  # a period later: fresh, once
    assert source.calls == 3


def test_pools_started_together_reach_their_checkpoints_in_different_cycles() -> None:
    clock = [NOW]
    rec = _reconciler(FakeKube(), clock)
    rec.checkpoint_spread = lambda period: period * 0.999
    rec._wrote("a", NOW)
    rec._wrote("b", NOW)  # both first writes: counted as made up to a checkpoint earlier
    assert rec._written["a"] == pytest.approx(NOW - 299.7)
    rec._wrote("a", NOW + 60)  # later writes: when they are made
    assert rec._written["a"] == NOW + 60


@pytest.mark.parametrize("versioned", [True, False], ids=["changes", "whole"])
def test_a_status_write_that_finds_the_pool_gone_ends_its_loop(versioned: bool) -> None:
    kube, clock = _writing_kube(), [NOW]
    rec = _reconciler(kube, clock)
    kube.deleted = True
    with pytest.raises(PoolGone):
        _cycle(rec, kube, versioned=versioned)
    assert kube.writes == []
