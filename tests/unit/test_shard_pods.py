"""Which replica decides a gated pod with shards (``ShardGate.owns_pod``): the one serving
the shard of a pool that scales the pod's workload, else, when no pool scales it, the one
serving the sweeper shard. Each gated pod has exactly one owner among the replicas."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from prescaler.controller.model import PoolObject
from prescaler.controller.shards import SWEEPER_SHARD, ShardGate
from prescaler.metrics import Metrics

SHARDS = 4


class Serving:
    """The parts of ``ShardLeases`` the gate reads: which shards this replica serves."""

    def __init__(self, shards: set[int]) -> None:
        self.serving = shards
        self.shards = SHARDS
        self.identity = f"r{min(shards) if shards else 'x'}"

    def serves(self, shard: int) -> bool:
        return shard in self.serving


def _gate(shards: set[int]) -> ShardGate:
    return ShardGate(
        leases=Serving(shards),  # type: ignore[arg-type]
        reconciler=SimpleNamespace(),  # type: ignore[arg-type]
        metrics=Metrics(),
    )


def _pool(name: str, target: str, uid: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": uid},
        "spec": {"target": {"name": target}},
    }


def _replicas() -> list[ShardGate]:
    """Two replicas splitting the shards, both watching every pool."""
    return [_gate({0, 1}), _gate({2, 3})]


def test_a_pod_of_a_scaled_workload_belongs_to_its_pools_replica() -> None:
    replicas = _replicas()
    pools = [_pool(f"p{i}", f"llm-{i}", f"uid-{i}") for i in range(12)]
    for gate in replicas:
        for body in pools:
            gate.observe(body)
    for i, body in enumerate(pools):
        shard = replicas[0].shard_of_body(body)
        owners = [g.owns_pod(("ns", "Deployment", f"llm-{i}")) for g in replicas]
        assert owners == [shard in {0, 1}, shard in {2, 3}], (i, shard)
        # Its hot standby's pods too.
        hot = [g.owns_pod(("ns", "Deployment", f"p{i}-hot")) for g in replicas]
        assert hot == owners


@pytest.mark.parametrize("key", [("ns", "Deployment", "nobody"), None])
def test_a_pod_no_pool_scales_belongs_to_the_sweeper_only(
    key: tuple[str, str, str] | None,
) -> None:
    replicas = _replicas()
    for gate in replicas:
        gate.observe(_pool("p", "llm", "uid-1"))
    assert [g.owns_pod(key) for g in replicas] == [
        SWEEPER_SHARD in {0, 1},
        SWEEPER_SHARD in {2, 3},
    ]


def test_a_deleted_or_retargeted_pool_gives_its_workload_to_the_sweeper() -> None:
    gate = _gate({3})  # not the sweeper
    body = _pool("p", "llm", "uid-1")
    shard = gate.shard_of_body(body)
    gate.observe(body)
    assert gate.owns_pod(("ns", "Deployment", "llm")) == (shard == 3)
    gate.observe(_pool("p", "other", "uid-1"))  # retargeted
    assert not gate.owns_pod(("ns", "Deployment", "llm"))
    gate.forget(PoolObject("ns", "p", "uid-1", 1, {"target": {"name": "other"}}, {}))
    assert not gate.owns_pod(("ns", "Deployment", "other"))
