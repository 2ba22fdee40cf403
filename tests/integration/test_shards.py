"""Shards across operator replicas, on real ``prescaler run`` processes and real Leases.

Three replicas split 300 pools over 6 shard Leases (``integration.shard_world``). Each
pool's serving replica is read two ways: from the operators' own ``/metrics``
(``prescaler_pool_reconciles_total`` is exported only by the replica serving the pool) and
from ``status.servedBy``, which the serving replica writes. The replicas run with the
default 15 s reconcile period and 12 s Leases (renew deadline 8 s, retry 1.5 s; client-go's
are 15, 10 and 2), set by flags.

- every pool is reconciled by exactly one replica, the one its status names, on the shard
  its target hashes to, which the pool's ``prescaler.io/shard`` label names; each replica
  decodes only the watch events of its own shards' pools
  (``prescaler_pool_watch_events_total``);
- a pool created later is labelled, and one retargeted to another shard is relabelled and
  served by that shard's replica;
- a replica killed with SIGKILL has its shards taken by the survivors, its pools are
  reconciled again, each by exactly one replica, and no pool gets two scale writes for the
  decision it was making;
- a replica that joins gets its share, the replicas move the shards the balance rule
  moves from the Leases before the join and no more, and every pool is reconciled after
  the join, each by exactly one replica.

Everything waits on conditions with generous deadlines. How long a takeover and a join
take is measured by ``benchmarks/shard_faults.py`` (benchmarks/README.md), not bounded
here: these tests run on machines as busy as a shared CI runner.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from cluster.launcher import LocalCluster
from cluster.objects import gpu_deployment, with_readiness_gate
from integration.chart_rbac import chart_identity
from integration.operator_fixtures import (  # noqa: F401 (fixtures)
    Kube,
    crd_fixture,
    running_operator,
    wait_for,
)
from integration.shard_world import (
    POOLS,
    SHARDS,
    Replicas,
    View,
    create_pools,
    join_one,
    kill_while_scaling,
    lease_holder,
    owners_of,
    replicas,
    statuses,
    steady,
)
from prescaler.api import GROUP, PLURAL, PREWARM_CONDITION, VERSION
from prescaler.prewarm import NOT_CONFIGURED
from prescaler.sharding import pool_shard, shard_key, shard_labels, workload_shard

pytestmark = [pytest.mark.cluster, pytest.mark.slow]  # 1-3 minutes each: started early


# ---------------------------------------------------------------------- tests


def _released_and_ready(k: Any, namespace: str, selector: str, what: str) -> Any:
    """Wait for a pod of ``selector`` whose prewarm gate condition is True (released), then
    for it to turn Ready; returns the pod."""

    def released() -> Any:
        pods = k.core.list_namespaced_pod(namespace, label_selector=selector).items
        for pod in pods:
            for cond in pod.status.conditions or []:
                if cond.type == PREWARM_CONDITION and cond.status == "True":
                    return pod
        return None

    pod = wait_for(released, 180, f"{what}'s gate condition")
    wait_for(
        lambda: any(
            c.type == "Ready" and c.status == "True"
            for c in k.core.read_namespaced_pod(pod.metadata.name, namespace).status.conditions
            or []
        ),
        120,
        f"{what} Ready",
    )
    return pod


def test_three_replicas_each_pool_is_served_by_exactly_one(
    cluster: LocalCluster, crd: None, kube: Any, namespace: str, tmp_path: Path
) -> None:
    k = Kube(kube, namespace)
    shards = create_pools(k, POOLS)
    assert len(set(shards.values())) == SHARDS
    with replicas(cluster, namespace, tmp_path, ["r0", "r1", "r2"]) as running:
        started = time.monotonic()
        owners = wait_for(
            lambda: steady(k, running, shards, [2, 2, 2]),
            300,
            "three replicas serving 2 shards each, every pool on one of them",
            interval=1.0,
        )
        print(f"steady after {time.monotonic() - started:.1f} s")
        before = running.views()
        assert before is not None

        def reconciled_twice_more() -> dict[str, View] | None:
            views = running.views()
            if views is None:
                return None
            _, doubled = owners_of(views)
            assert not doubled, f"pools served by two replicas at once: {sorted(doubled)[:5]}"
            for pool, owner in owners.items():
                now = views[owner].served.get(pool)
                if now is None or now[2] < before[owner].served[pool][2] + 2:
                    return None
            return views

        after = wait_for(reconciled_twice_more, 180, "every pool reconciled twice more")
        for pool, owner in owners.items():
            claims = [r for r, v in after.items() if pool in v.served]
            assert claims == [owner], (pool, claims)
            assert after[owner].served[pool][0] == shards[pool]
        # Every shard Lease names the replica that serves its pools.
        for shard in range(SHARDS):
            holder = lease_holder(kube, namespace, shard)
            assert {owners[p] for p, s in shards.items() if s == shard} == {holder}
        now = statuses(k)
        assert Counter(s["servedBy"]["replica"] for s in now.values()) == Counter(owners.values())
        assert all(s["servedBy"]["shards"] == SHARDS for s in now.values())
        # Each replica decoded only its own shards' pools meanwhile: every pool's status
        # was written twice more, by its replica, and no other replica's watch saw it.
        for identity, view in after.items():
            grew = {w for w, n in view.watched.items() if n > before[identity].watched.get(w, 0)}
            mine = {str(s) for s in view.serving}
            assert grew <= mine, (identity, sorted(grew), sorted(mine))
            assert mine <= grew, (identity, "a served shard's events were not seen")
            assert "all" not in view.watched  # kopf watches no pools with shards
        # Every pool carries its shard as a label, written by the operator.
        labels = pool_labels(k)
        assert labels == {p: one_shard(s) for p, s in shards.items()}


def shared(k: Kube, running: Replicas, shards: dict[str, int]) -> dict[str, str] | None:
    """:func:`steady` whatever the split, as long as every replica serves a shard: with
    60 pools the shards weigh unequally, and a heavy one may be a replica's only one."""
    views = running.views()
    if views is None:
        return None
    quotas = [int(v.shards) for v in views.values()]
    if sum(quotas) != SHARDS or min(quotas) < 1:
        return None
    return steady(k, running, shards, quotas)


def pool_labels(k: Kube) -> dict[str, dict[str, str]]:
    """Each pool's shard labels."""
    listing = k.custom.list_namespaced_custom_object(GROUP, VERSION, k.ns, PLURAL)
    return {
        p["metadata"]["name"]: {
            key: value
            for key, value in (p["metadata"].get("labels") or {}).items()
            if key.startswith("prescaler.io/shard")
        }
        for p in listing["items"]
    }


def one_shard(shard: int) -> dict[str, str]:
    """The labels of a pool with one target, on ``shard``."""
    return {shard_key(shard, SHARDS): "primary"}


def test_a_retargeted_pool_is_relabelled_and_moves_to_its_new_shards_replica(
    cluster: LocalCluster, crd: None, kube: Any, namespace: str, tmp_path: Path
) -> None:
    """Labels kept current: a pool created while the replicas run is labelled with its
    shard, and one whose spec moves it to another shard (a new target) is relabelled and
    served there; a label written by hand under another shard count is corrected."""
    k = Kube(kube, namespace)
    shards = create_pools(k, 60)
    with replicas(cluster, namespace, tmp_path, ["r0", "r1", "r2"]) as running:
        owners = wait_for(
            lambda: shared(k, running, shards),
            300,
            "three replicas sharing the shards, every pool on one of them",
            interval=1.0,
        )
        # A pool created now, and a pool moved to a target on another replica's shard.
        late = {"target": {"name": "late"}, "minReplicas": 0, "maxReplicas": 1}
        k.create_deployment(gpu_deployment("late", 0))
        k.create_pool("late", {**late, "model": {"tokensPerSecond": 3750}})
        shards["late"] = pool_shard(k.ns, late, SHARDS)
        moved = "p-0"
        by_shard = {shards[p]: owners[p] for p in owners}
        target = next(
            name
            for name in (f"moved-{i}" for i in itertools.count())
            if by_shard[pool_shard(k.ns, {"target": {"name": name}}, SHARDS)] != owners[moved]
        )
        k.create_deployment(gpu_deployment(target, 0))
        k.patch_pool(moved, {"target": {"name": target}})
        shards[moved] = pool_shard(k.ns, {"target": {"name": target}}, SHARDS)
        # A label under another count, written by hand, on a third pool.
        k.custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            k.ns,
            PLURAL,
            "p-1",
            {
                "metadata": {
                    "labels": {shard_key(0, 2): "primary", shard_key(shards["p-1"], SHARDS): None}
                }
            },
        )
        expected = {p: one_shard(s) for p, s in shards.items()}
        wait_for(lambda: pool_labels(k) == expected or None, 120, "every pool labelled")
        now = wait_for(
            lambda: shared(k, running, shards),
            180,
            "the late and the moved pool served on their shards, by exactly one replica",
            interval=1.0,
        )
        assert now[moved] == by_shard[shards[moved]] != owners[moved]


def test_a_killed_replicas_pools_are_served_again_by_exactly_one_survivor(
    cluster: LocalCluster, crd: None, kube: Any, namespace: str, tmp_path: Path
) -> None:
    k = Kube(kube, namespace)
    shards = create_pools(k, POOLS)
    with replicas(cluster, namespace, tmp_path, ["r0", "r1", "r2"]) as running:
        # A decision in progress: every pool of r1 gets a floor of 1; r1 scales some of
        # them and is killed while it goes through the rest.
        killed = kill_while_scaling(k, kube, running, shards, victim="r1")
        print(f"{len(killed.victims)} pools of the killed replica: its shards taken after")
        print(
            f"{killed.takeover:.1f} s, all its pools reconciled again after {killed.served:.1f} s"
        )
        victims = killed.victims
        # Every pool of the killed replica is on a survivor, one of them only (steady).
        assert {killed.owners[p] for p in victims} <= {"r0", "r2"}

        def recorded() -> bool:
            now = statuses(k)
            return all(
                now[p].get("appliedReplicas") == 1
                and (now[p].get("servedBy") or {}).get("replica") in ("r0", "r2")
                for p in victims
            )

        wait_for(recorded, 180, "every victim pool's scale recorded by its new replica")
        deployments = {
            d.metadata.name: d for d in k.apps.list_namespaced_deployment(namespace).items
        }
        events = k.core.list_namespaced_event(namespace).items
        ups = Counter(e.involved_object.name for e in events if e.reason == "ScaledUp")
        downs = [e.involved_object.name for e in events if e.reason == "ScaledDown"]
        for pool in victims:
            # One change of spec.replicas (generation 1 -> 2) and at most one Event for it:
            # a second write of the same decision, or a scale back and forth, would show.
            assert deployments[pool].spec.replicas == 1
            assert deployments[pool].metadata.generation == 2, pool
            assert ups[pool] <= 1, (pool, ups[pool])
        assert not downs
        assert set(ups) <= set(victims)
        print(f"ScaledUp Events: {sum(ups.values())} for {len(victims)} scaled pools")


def test_a_joining_replica_takes_its_share_without_leaving_a_pool_unserved(
    cluster: LocalCluster, crd: None, kube: Any, namespace: str, tmp_path: Path
) -> None:
    k = Kube(kube, namespace)
    shards = create_pools(k, POOLS)
    with replicas(cluster, namespace, tmp_path, ["r0", "r1", "r2"]) as running:
        join = join_one(k, running, shards, joiner="r3")
    print(f"{len(join.moved)} pools moved to r3; longest time between two reconciles of a")
    print(f"pool from the join on: {join.worst:.1f} s ({join.where})")
    # The newcomer took whole shards from the others, and the replicas moved exactly what
    # the balance rule moves from the Leases before the join: mostly to the newcomer, and
    # a second move among the others only where the rule makes one (a unit test shows a
    # join that does).
    assert join.moved, Counter(join.after.values())
    assert "r3" in join.after.values(), Counter(join.after.values())
    assert join.after == join.expected, (
        Counter(join.after.values()),
        Counter(join.expected.values()),
    )
    # No pool was left behind: each was reconciled after the join (the joiner's too).
    assert join.reconciled_after == set(shards)


def test_a_sharded_replica_needs_only_the_charts_rbac(
    cluster: LocalCluster,
    crd: None,
    kube: Any,
    namespace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rendered with ``shards: 2``, the chart's Lease Role is enough: the replica, as the
    chart's ServiceAccount, takes its member slot and both shard Leases and serves a pool
    of each shard (a call the Role lacks would leave it serving nothing)."""
    k = Kube(kube, namespace)
    shards: dict[str, int] = {}
    # A pool's shard hashes its namespace (random here) and target: pick names until each
    # shard has three pools, so that both are served whatever the namespace.
    candidates = (f"p-{i}" for i in itertools.count())
    while len(shards) < 6:
        name = next(candidates)
        spec = {"target": {"name": name}, "minReplicas": 0, "maxReplicas": 1}
        shard = pool_shard(namespace, spec, 2)
        if sum(s == shard for s in shards.values()) == 3:
            continue
        k.create_deployment(gpu_deployment(name, 0))
        k.create_pool(name, {**spec, "model": {"tokensPerSecond": 3750}})
        shards[name] = shard
    assert sorted(shards.values()) == [0, 0, 0, 1, 1, 1]
    with chart_identity(cluster, namespace, tmp_path, values={"shards": 2}) as identity:
        assert identity.lease_name.endswith("-shard-0"), identity.lease_name
        monkeypatch.setenv("KUBECONFIG", str(identity.kubeconfig))
        with running_operator(cluster, namespace, identity, shards=2) as metrics:

            def served() -> bool:
                now = statuses(k)
                return all(
                    (now[p].get("servedBy") or {}).get("shard") == s for p, s in shards.items()
                )

            wait_for(served, 120, "every pool served, on its shard")
            assert metrics.registry.get_sample_value("prescaler_shards_served") == 2
        base = identity.lease_name.removesuffix("-shard-0")
        leases: list[Any] = client.CoordinationV1Api(kube).list_namespaced_lease(namespace).items
        holders = {lease.metadata.name: lease.spec.holder_identity for lease in leases}
        ours = {f"{base}-shard-0", f"{base}-shard-1", f"{base}-member-0"}
        assert ours <= set(holders)
        # A clean stop released them.
        assert not any(holders.values()), holders


def test_a_gated_pod_no_pool_scales_is_released_by_one_replica(
    cluster: LocalCluster,
    crd: None,
    kube: Any,
    namespace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Deployment whose pods carry the prewarm readiness gate, and no pool on it: with
    shards, the replica serving the sweeper shard releases its pod after the grace (as an
    operator without shards does), and only that replica: one condition write, one
    Event. Before, no replica released it, and the pod never became Ready."""
    k = Kube(kube, namespace)
    create_pools(k, 12)
    k.create_deployment(with_readiness_gate(gpu_deployment("orphan", 1), PREWARM_CONDITION))
    monkeypatch.setenv("PRESCALER_PREWARM_UNCLAIMED_SECONDS", "5")
    with replicas(cluster, namespace, tmp_path, ["r0", "r1", "r2"]):
        pod = _released_and_ready(k, namespace, "app=orphan", "the orphan pod")
        events = [
            e
            for e in k.core.list_namespaced_event(
                namespace, field_selector=f"involvedObject.name={pod.metadata.name}"
            ).items
            if e.reason == NOT_CONFIGURED
        ]
        assert len(events) == 1, [(e.reason, e.message) for e in events]


# ------------------------------------------------- pools with roles across shards
def split_role_targets(kube: Any, namespace: str) -> tuple[str, str]:
    """Two role targets whose shards are held by two different replicas now: the first
    (in sort order: the pool's primary target) and the second."""
    holders = {s: lease_holder(kube, namespace, s) for s in range(SHARDS)}

    def holder(name: str) -> str | None:
        return holders[workload_shard(namespace, "Deployment", name, SHARDS)]

    names = (f"x-{i}" for i in itertools.count())
    second = next(names)
    first = next(
        n for n in (f"a-{i}" for i in itertools.count()) if holder(n) not in (None, holder(second))
    )
    assert first < second
    assert holder(second) is not None
    return first, second


def role_spec(first: str, second: str, floor: int) -> dict[str, Any]:
    """A disaggregated pool: prefill on ``first``, decode on ``second``, at ``floor``."""
    return {
        "roles": {
            "prefill": {"target": {"name": first}, "tokensPerSecond": 10000},
            "decode": {"target": {"name": second}, "tokensPerSecond": 3750},
        },
        "minReplicas": floor,
        "maxReplicas": 3,
        "model": {"promptTokens": 500, "outputTokens": 200},
        "coldStart": {"mode": "fixed", "seconds": 30},
    }


def test_a_younger_role_pool_on_an_older_pools_target_of_another_shard_is_in_conflict(
    cluster: LocalCluster, crd: None, kube: Any, namespace: str, tmp_path: Path
) -> None:
    """A pool with roles whose second role target an older pool already scales, that
    target on a shard held by another replica than the role pool's: the role pool is
    Invalid (TargetConflict) and scales neither target, as without shards. Before, the
    role pool's replica saw no claim on its second target and scaled it."""
    k = Kube(kube, namespace)
    shards = create_pools(k, 60)
    with replicas(cluster, namespace, tmp_path, ["r0", "r1", "r2"]) as running:
        wait_for(
            lambda: shared(k, running, shards),
            300,
            "three replicas sharing the shards, every pool on one of them",
            interval=1.0,
        )
        first, second = split_role_targets(kube, namespace)
        for name in (first, second):
            k.create_deployment(gpu_deployment(name, 0))
        older = {
            "target": {"name": second},
            "minReplicas": 1,
            "maxReplicas": 3,
            "model": {"tokensPerSecond": 3750},
            "coldStart": {"mode": "fixed", "seconds": 30},
        }
        k.create_pool("b-older", older)
        wait_for(
            lambda: k.deployment(second).spec.replicas == 1 or None,
            120,
            "the older pool to scale its target",
        )
        time.sleep(1.1)  # creationTimestamp has whole seconds: the younger is younger
        spec = role_spec(first, second, floor=2)
        k.create_pool("c-younger", spec)
        want = shard_labels(namespace, spec, SHARDS)
        assert len(want) == 2, want
        cond = wait_for(
            lambda: k.condition_is("c-younger", "Invalid", "True"),
            180,
            "the younger role pool flagged",
        )
        assert cond["reason"] == "TargetConflict", cond
        assert "b-older" in cond["message"]
        assert pool_labels(k)["c-younger"] == want
        # The younger pool changed neither of its targets, and the older kept its own.
        assert k.deployment(second).spec.replicas == 1
        assert k.deployment(second).metadata.generation == 2
        assert k.deployment(first).spec.replicas == 0
        assert k.condition_is("b-older", "Invalid", "True") is None


def test_a_gated_pod_of_a_role_pools_second_target_is_released_by_one_replica(
    cluster: LocalCluster,
    crd: None,
    kube: Any,
    namespace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pool with roles scales its second role target, whose shard another replica
    holds, and that target's pods carry the prewarm readiness gate: the pod is the role
    pool's replica's to decide (a role's pods are not warmed: it releases it after the
    grace), not also the workload shard's replica's: one condition write, one Event."""
    k = Kube(kube, namespace)
    shards = create_pools(k, 60)
    monkeypatch.setenv("PRESCALER_PREWARM_UNCLAIMED_SECONDS", "5")
    with replicas(cluster, namespace, tmp_path, ["r0", "r1", "r2"]) as running:
        wait_for(
            lambda: shared(k, running, shards),
            300,
            "three replicas sharing the shards, every pool on one of them",
            interval=1.0,
        )
        first, second = split_role_targets(kube, namespace)
        k.create_deployment(gpu_deployment(first, 0))
        k.create_deployment(with_readiness_gate(gpu_deployment(second, 0), PREWARM_CONDITION))
        k.create_pool("role", role_spec(first, second, floor=1))
        wait_for(
            lambda: k.deployment(second).spec.replicas == 1 or None,
            180,
            "the role pool to scale its second target",
        )

        pod = _released_and_ready(k, namespace, f"app={second}", "the gated pod")
        # Both replicas would have released it within a few seconds of each other: wait
        # for a reconcile of the role pool that starts well after that.
        after = time.time() + 5

        def reconciled_after() -> bool:
            views = running.views() or {}
            return any(
                t > after
                for v in views.values()
                for p, t in v.last.items()
                if p == "role" or p.startswith("role/")
            )

        wait_for(reconciled_after, 120, "one more reconcile of the role pool")
        events = [
            e
            for e in k.core.list_namespaced_event(
                namespace, field_selector=f"involvedObject.name={pod.metadata.name}"
            ).items
            if e.reason == NOT_CONFIGURED
        ]
        assert len(events) == 1, [(e.reason, e.source.component, e.message) for e in events]
