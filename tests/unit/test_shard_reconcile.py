"""A reconcile under shards: the serving replica and shard go into ``status.servedBy``, a
reconcile that outlives its shard writes neither the scale nor the status, and a shard
given up writes only its own pools' kept statuses."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from prescaler.api import ServedByStatus
from prescaler.controller.model import PoolObject
from unit.test_status_pipeline import _spec
from unit.test_status_writes import WritingKube, _reconciler, _writing_kube

SERVED = ServedByStatus(replica="r1", shard=3, shards=6)


def _pool(kube: WritingKube, uid: str = "uid-1", **spec: int) -> PoolObject:
    body = _spec(**{"minReplicas": 2, **spec})
    return PoolObject("ns", "pool", uid, 1, body, kube.stored, None, str(kube.version), SERVED)


def test_the_serving_replica_and_shard_are_in_the_status() -> None:
    kube, clock = _writing_kube(), [1.75e9]
    rec = _reconciler(kube, clock)
    asyncio.run(rec.run(_pool(kube)))
    assert kube.stored["servedBy"] == {"replica": "r1", "shard": 3, "shards": 6}
    # Another replica takes the pool over: a decision, written at its first reconcile.
    clock[0] += 60
    other = SERVED.model_copy(update={"replica": "r2"})
    asyncio.run(rec.run(replace(_pool(kube), served_by=other)))
    assert kube.stored["servedBy"]["replica"] == "r2"
    assert len(kube.writes) == 2


def test_a_reconcile_that_outlives_its_shard_writes_nothing() -> None:
    kube, clock = _writing_kube(), [1.75e9]
    rec = _reconciler(kube, clock)
    rec.serving = lambda pool: False  # the renewal was late, or the shard is given up
    asyncio.run(rec.run(_pool(kube, minReplicas=4)))  # a scale-up decision
    assert not [c for c in kube.calls if c[0] == "scale"]
    assert kube.writes == []
    rec.serving = lambda pool: True
    asyncio.run(rec.run(_pool(kube, minReplicas=4)))
    assert [c for c in kube.calls if c[0] == "scale"] == [("scale", "Deployment", "llm", 4)]
    assert len(kube.writes) == 1


def test_a_shard_given_up_writes_only_its_own_kept_statuses() -> None:
    kube, clock = _writing_kube(), [1.75e9]
    rec = _reconciler(kube, clock)
    asyncio.run(rec.run(_pool(kube)))
    clock[0] += 60
    asyncio.run(rec.run(_pool(kube)))  # only observations moved: kept back
    assert len(kube.writes) == 1
    asyncio.run(rec.flush(only=lambda pool: pool.uid == "another"))
    assert len(kube.writes) == 1
    asyncio.run(rec.flush(only=lambda pool: pool.uid == "uid-1"))
    assert len(kube.writes) == 2
