"""Which replica decides a gated pod with shards (``ShardGate.owns_pod``): the one serving
the shard of a pool that scales the pod's workload, else the one serving the workload's
own shard (which sees every pool on it); a hot standby's pods are their pool's replica's.
Each gated pod has exactly one owner among the replicas, though each sees only the pools
touching its own shards (and the secondary shards of the pools it serves)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from prescaler.controller.model import PoolObject
from prescaler.controller.shards import SWEEPER_SHARD, ShardGate
from prescaler.kube import ROLE_HOT, ROLE_LABEL
from prescaler.metrics import Metrics
from prescaler.sharding import touched_shards, workload_shard

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
    """Two replicas splitting the shards."""
    return [_gate({0, 1}), _gate({2, 3})]


def _observe_own(replicas: list[ShardGate], bodies: list[dict[str, Any]]) -> None:
    """Each replica sees the pools of the shards it serves only (its watch selects them)."""
    for gate in replicas:
        for body in bodies:
            if gate.leases.serves(gate.shard_of_body(body)):
                gate.observe(body)


def test_a_pod_of_a_scaled_workload_belongs_to_its_pools_replica() -> None:
    replicas = _replicas()
    pools = [_pool(f"p{i}", f"llm-{i}", f"uid-{i}") for i in range(12)]
    _observe_own(replicas, pools)
    for i, body in enumerate(pools):
        shard = replicas[0].shard_of_body(body)
        owners = [g.owns_pod(("ns", "Deployment", f"llm-{i}")) for g in replicas]
        assert owners == [shard in {0, 1}, shard in {2, 3}], (i, shard)
        # Its hot standby's pods too, and only there.
        hot_key = ("ns", "Deployment", f"p{i}-hot")
        hot = [g.owns_pod(hot_key, {ROLE_LABEL: ROLE_HOT}) for g in replicas]
        assert hot == owners


def test_a_pod_no_pool_scales_belongs_to_the_replica_of_its_workloads_shard() -> None:
    replicas = _replicas()
    _observe_own(replicas, [_pool("p", "llm", "uid-1")])
    for i in range(20):
        key = ("ns", "Deployment", f"nobody-{i}")
        shard = workload_shard(*key, SHARDS)
        assert [g.owns_pod(key) for g in replicas] == [shard in {0, 1}, shard in {2, 3}]


def test_a_pod_of_no_workload_belongs_to_the_sweeper_only() -> None:
    replicas = _replicas()
    assert [g.owns_pod(None) for g in replicas] == [
        SWEEPER_SHARD in {0, 1},
        SWEEPER_SHARD in {2, 3},
    ]


def test_a_deleted_or_retargeted_pool_gives_its_workload_to_the_workloads_shard() -> None:
    gate = _gate({3})
    body = _pool("p", "llm", "uid-1")
    shard = gate.shard_of_body(body)
    gate.observe(body)
    assert gate.owns_pod(("ns", "Deployment", "llm")) == (shard == 3)
    gate.observe(_pool("p", "other", "uid-1"))  # retargeted
    llm = workload_shard("ns", "Deployment", "llm", SHARDS)
    assert gate.owns_pod(("ns", "Deployment", "llm")) == (llm == 3)
    gate.forget(PoolObject("ns", "p", "uid-1", 1, {"target": {"name": "other"}}, {}))
    other = workload_shard("ns", "Deployment", "other", SHARDS)
    assert gate.owns_pod(("ns", "Deployment", "other")) == (other == 3)


def _observe_touching(replicas: list[ShardGate], bodies: list[dict[str, Any]]) -> None:
    """What the watch shows each replica with labels per touched shard: the pools touching
    the shards it serves, and those touching the secondary shards of the pools it serves."""
    for gate in replicas:
        touched = {_uid(b): set(touched_shards("ns", b["spec"], SHARDS)) for b in bodies}
        watched = set(gate.leases.serving)  # type: ignore[attr-defined]
        for body in bodies:
            if gate.leases.serves(gate.shard_of_body(body)):
                watched |= touched[_uid(body)]
        for body in bodies:
            if touched[_uid(body)] & watched:
                gate.observe(body)


def _uid(body: dict[str, Any]) -> str:
    return str(body["metadata"]["uid"])


def test_with_roles_across_shards_each_gated_pod_has_exactly_one_owner() -> None:
    """Pools with roles on two targets of different shards, and plain pools, some on the
    same targets (the older keeps a target): each workload's gated pods are decided by
    exactly one replica, the one serving the pool that keeps it, or (none on it) the
    workload's shard's."""
    bodies: list[dict[str, Any]] = []
    for i in range(16):
        role = {
            "metadata": {
                "namespace": "ns",
                "name": f"role-{i}",
                "uid": f"uid-role-{i}",
                "creationTimestamp": f"2024-01-{i + 1:02d}T00:00:00Z",
            },
            "spec": {
                "roles": {
                    "prefill": {"target": {"name": f"pre-{i}"}},
                    "decode": {"target": {"name": f"dec-{i}"}},
                }
            },
        }
        bodies.append(role)
        if i % 2:  # an older or a younger plain pool on the role pool's second target
            plain = _pool(f"plain-{i}", f"pre-{i}", f"uid-plain-{i}")
            day = i - 1 if i % 4 == 1 else i + 2
            plain["metadata"]["creationTimestamp"] = f"2024-01-{day:02d}T12:00:00Z"
            bodies.append(plain)
    replicas = [_gate({0}), _gate({1, 2}), _gate({3})]
    _observe_touching(replicas, bodies)
    keys = [("ns", "Deployment", f"{kind}-{i}") for i in range(16) for kind in ("pre", "dec")]
    keys += [("ns", "Deployment", f"nobody-{i}") for i in range(8)]
    for key in keys:
        owners = [g.leases.identity for g in replicas if g.owns_pod(key)]
        assert len(owners) == 1, (key, owners)
