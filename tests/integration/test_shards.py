"""Shards across operator replicas, on real ``prescaler run`` processes and real Leases.

Three replicas split 300 pools over 6 shard Leases. Each pool's serving replica is read
two ways: from the operators' own ``/metrics`` (``prescaler_pool_reconciles_total`` is
exported only by the replica serving the pool) and from ``status.servedBy``, which the
serving replica writes. The replicas run with the default 15 s reconcile period and 12 s
Leases (renew deadline 8 s, retry 1.5 s; client-go's are 15, 10 and 2), set by flags.

- every pool is reconciled by exactly one replica, the one its status names, on the shard
  its demand series hashes to;
- a replica killed with SIGKILL has its shards taken within the lease duration (plus the
  rounds in which expiry is seen and the Lease written), its pools are reconciled right
  after, and no pool gets two scale writes for the decision it was making;
- a replica that joins gets its share: the others stop acting on a shard before they
  release its Lease, and no pool goes longer than one cycle plus the lease duration
  between two reconciles.

Everything waits on conditions with generous deadlines; time is measured only where a
bound is asserted, from the operators' own timestamps where they exist.
"""

from __future__ import annotations

import itertools
import signal
import subprocess
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from cluster.launcher import LocalCluster
from cluster.objects import gpu_deployment
from integration.chart_rbac import chart_identity
from integration.operator_fixtures import (  # noqa: F401 (fixtures)
    Kube,
    crd_fixture,
    operator_process,
    running_operator,
    wait_for,
)
from prescaler.api import GROUP, PLURAL, VERSION
from prescaler.sharding import pool_shard, shard_lease_name

pytestmark = [pytest.mark.cluster, pytest.mark.slow]  # 1-3 minutes each: started early

POOLS = 300
SHARDS = 6
INTERVAL = 15.0
LEASE, RENEW, RETRY = 12.0, 8.0, 1.5
ARGS = [
    "--shards",
    str(SHARDS),
    "--lease-duration",
    str(LEASE),
    "--renew-deadline",
    str(RENEW),
    "--retry-period",
    str(RETRY),
]


# ---------------------------------------------------------------------- objects
def _create_pools(k: Kube, n: int) -> dict[str, int]:
    """``n`` Deployments at 0 replicas and a pool on each (floor 0, no forecast); returns
    each pool's expected shard."""
    shards = {}
    for i in range(n):
        name = f"p-{i}"
        k.create_deployment(
            {
                "metadata": {"name": name},
                "spec": {
                    "replicas": 0,
                    "selector": {"matchLabels": {"app": name}},
                    "template": {
                        "metadata": {"labels": {"app": name}},
                        "spec": {"containers": [{"name": "c", "image": "fake"}]},
                    },
                },
            }
        )
        spec = {
            "target": {"name": name},
            "minReplicas": 0,
            "maxReplicas": 2,
            "model": {"tokensPerSecond": 3750},
            "coldStart": {"mode": "fixed", "seconds": 30},
        }
        k.create_pool(name, spec)
        shards[name] = pool_shard(k.ns, name, spec, SHARDS)
    return shards


def _statuses(k: Kube) -> dict[str, dict[str, Any]]:
    listing = k.custom.list_namespaced_custom_object(GROUP, VERSION, k.ns, PLURAL)
    return {p["metadata"]["name"]: p.get("status") or {} for p in listing["items"]}


# ---------------------------------------------------------------------- metrics
def _samples(port: int) -> list[tuple[str, dict[str, str], float]] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


class View:
    """One replica's /metrics, as read once: which pools it serves (pool -> shard, count),
    when it last reconciled each, and how many shards it serves."""

    def __init__(self, samples: list[tuple[str, dict[str, str], float]]) -> None:
        self.served: dict[str, tuple[int, str, float]] = {}
        self.last: dict[str, float] = {}
        self.shards = -1.0
        for name, labels, value in samples:
            if name == "prescaler_pool_reconciles_total":
                self.served[labels["pool"]] = (int(labels["shard"]), labels["replica"], value)
            elif name == "prescaler_last_reconcile_timestamp_seconds":
                self.last[labels["pool"]] = value
            elif name == "prescaler_shards_served":
                self.shards = value


def _view(port: int) -> View | None:
    samples = _samples(port)
    return View(samples) if samples is not None else None


class Replicas:
    """``prescaler run --shards`` processes on one namespace, by identity."""

    def __init__(self, cluster: LocalCluster, namespace: str, logs: Path) -> None:
        self.cluster, self.namespace, self.logs = cluster, namespace, logs
        self.stack = ExitStack()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ports: dict[str, int] = {}

    def start(self, identity: str) -> None:
        proc, port = self.stack.enter_context(
            operator_process(
                self.cluster,
                self.namespace,
                self.logs / f"{identity}.log",
                leader_identity=identity,
                interval=INTERVAL,
                extra_args=ARGS,
            )
        )
        self.procs[identity], self.ports[identity] = proc, port

    def kill(self, identity: str) -> None:
        proc = self.procs.pop(identity)
        self.ports.pop(identity)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)

    def views(self) -> dict[str, View] | None:
        """Every live replica's metrics, or None while one does not answer."""
        views = {}
        for identity, port in list(self.ports.items()):
            view = _view(port)
            if view is None:
                return None
            views[identity] = view
        return views


@contextmanager
def replicas(
    cluster: LocalCluster, namespace: str, logs: Path, names: list[str]
) -> Iterator[Replicas]:
    running = Replicas(cluster, namespace, logs)
    with running.stack:
        for name in names:
            running.start(name)
        yield running


def _owners(views: dict[str, View]) -> tuple[dict[str, str], set[str]]:
    """Pool -> the replica whose metrics say it serves it; and the pools two replicas
    claimed in this read."""
    owners: dict[str, str] = {}
    doubled: set[str] = set()
    for identity, view in views.items():
        for pool, (_, replica, _) in view.served.items():
            assert replica == identity
            if pool in owners:
                doubled.add(pool)
            owners[pool] = identity
    return owners, doubled


def _steady(
    k: Kube, running: Replicas, shards: dict[str, int], quotas: list[int]
) -> dict[str, str] | None:
    """Pool -> serving replica, once every pool is served by exactly one replica, the
    replicas serve ``quotas`` shards, and every status names the pool's replica and shard.
    The statuses are read after the metrics and the metrics again after them, so a move
    in between is seen."""
    views = running.views()
    if views is None or sorted(v.shards for v in views.values()) != sorted(quotas):
        return None
    owners, doubled = _owners(views)
    if doubled or set(owners) != set(shards):
        return None
    for pool, status in _statuses(k).items():
        served = status.get("servedBy") or {}
        if (served.get("replica"), served.get("shard")) != (owners[pool], shards[pool]):
            return None
    again = running.views()
    if again is None or _owners(again) != (owners, set()):
        return None
    return owners


def _lease_holder(kube: Any, namespace: str, shard: int) -> str | None:
    lease = client.CoordinationV1Api(kube).read_namespaced_lease(
        shard_lease_name("prescaler", shard), namespace
    )
    return lease.spec.holder_identity if lease.spec is not None else None


# ---------------------------------------------------------------------- tests
def test_three_replicas_each_pool_is_served_by_exactly_one(
    cluster: LocalCluster, crd: None, kube: Any, namespace: str, tmp_path: Path
) -> None:
    k = Kube(kube, namespace)
    shards = _create_pools(k, POOLS)
    assert len(set(shards.values())) == SHARDS
    with replicas(cluster, namespace, tmp_path, ["r0", "r1", "r2"]) as running:
        started = time.monotonic()
        owners = wait_for(
            lambda: _steady(k, running, shards, [2, 2, 2]),
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
            _, doubled = _owners(views)
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
            holder = _lease_holder(kube, namespace, shard)
            assert {owners[p] for p, s in shards.items() if s == shard} == {holder}
        statuses = _statuses(k)
        assert Counter(s["servedBy"]["replica"] for s in statuses.values()) == Counter(
            owners.values()
        )
        assert all(s["servedBy"]["shards"] == SHARDS for s in statuses.values())


def test_a_killed_replicas_pools_are_served_again_within_the_lease(
    cluster: LocalCluster, crd: None, kube: Any, namespace: str, tmp_path: Path
) -> None:
    k = Kube(kube, namespace)
    shards = _create_pools(k, POOLS)
    with replicas(cluster, namespace, tmp_path, ["r0", "r1", "r2"]) as running:
        owners = wait_for(
            lambda: _steady(k, running, shards, [2, 2, 2]), 300, "three steady replicas", 1.0
        )
        victims = sorted(p for p, owner in owners.items() if owner == "r1")
        victim_shards = {shards[p] for p in victims}
        # A decision in progress: every victim pool's floor goes to 1; r1 scales some of
        # them and is killed while it goes through the rest.
        for pool in victims:
            k.patch_pool(pool, {"minReplicas": 1})

        def scaled() -> int:
            items = k.apps.list_namespaced_deployment(namespace).items
            return sum(1 for d in items if d.metadata.name in victims and d.spec.replicas == 1)

        wait_for(lambda: scaled() >= len(victims) // 3, 120, "r1 to scale a third of its pools")
        killed_wall = time.time()
        killed = time.monotonic()
        running.kill("r1")

        def shards_taken() -> bool:
            return all(_lease_holder(kube, namespace, s) in ("r0", "r2") for s in victim_shards)

        wait_for(shards_taken, 120, "r0 and r2 to take r1's shards", interval=0.2)
        takeover = time.monotonic() - killed

        def served_again() -> bool:
            views = running.views()
            if views is None:
                return False
            last = {p: t for v in views.values() for p, t in v.last.items()}
            return all(last.get(p, 0.0) >= killed_wall for p in victims)

        wait_for(served_again, 120, "every pool of r1 reconciled by r0 or r2", interval=0.2)
        served = time.monotonic() - killed
        print(f"{len(victims)} pools of the killed replica: shards taken after {takeover:.1f} s,")
        print(f"all reconciled again after {served:.1f} s (lease {LEASE:g} s)")
        # Expiry is judged from when a survivor saw the last renewal (up to a retry period
        # after it), and the Lease is written at the next round (another retry period);
        # 4 s more for a busy machine (a round's own calls, this test's polling).
        assert takeover <= LEASE + 2 * RETRY + 4.0, takeover
        # Each pool within a cycle of the takeover (the new holder kicks them, spread over
        # 1.9 s), plus 10 s for a busy machine to get through a hundred reconciles.
        assert served <= takeover + INTERVAL + 10.0, served

        def recorded() -> bool:
            statuses = _statuses(k)
            return all(
                statuses[p].get("appliedReplicas") == 1
                and (statuses[p].get("servedBy") or {}).get("replica") in ("r0", "r2")
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
    shards = _create_pools(k, POOLS)
    with replicas(cluster, namespace, tmp_path, ["r0", "r1", "r2"]) as running:
        before = wait_for(
            lambda: _steady(k, running, shards, [2, 2, 2]), 300, "three steady replicas", 1.0
        )
        # Every read of every replica's metrics from now on: (read at, replica, view).
        reads: list[tuple[float, str, View]] = []
        stop = threading.Event()

        def record() -> None:
            while not stop.is_set():
                for identity, port in list(running.ports.items()):
                    view = _view(port)
                    if view is not None:
                        reads.append((time.time(), identity, view))
                stop.wait(0.2)

        recorder = threading.Thread(target=record, name="metrics recorder", daemon=True)
        recorder.start()
        try:
            joined_at = time.time()
            running.start("r3")
            after = wait_for(
                lambda: _steady(k, running, shards, [2, 2, 1, 1]),
                300,
                "four replicas sharing the 6 shards 2, 2, 1, 1",
                1.0,
            )
            moved = {p for p in shards if after[p] != before[p]}
            assert moved, Counter(after.values())
            assert all(after[p] == "r3" for p in moved), Counter(after.values())

            def reconciled_after_the_move() -> bool:
                views = running.views()
                return views is not None and all(
                    views["r3"].last.get(p, 0.0) > joined_at for p in moved
                )

            wait_for(reconciled_after_the_move, 120, "r3 to reconcile the pools it took")
            settled_at = time.time()
            wait_for(lambda: reads and reads[-1][0] > settled_at + 1, 60, "one more read")
        finally:
            stop.set()
            recorder.join(30)

    worst, where = _worst_gap(reads, shards, joined_at)
    print(f"{len(moved)} pools moved to r3; longest time between two reconciles of a pool")
    print(f"from the join on: {worst:.1f} s ({where}; bound {INTERVAL + LEASE:g} s)")
    assert worst <= INTERVAL + LEASE, (worst, where)


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
    # A pool's shard hashes its namespace (random here) and name: pick names until each
    # shard has three pools, so that both are served whatever the namespace.
    names = (f"p-{i}" for i in itertools.count())
    while len(shards) < 6:
        name = next(names)
        spec = {"target": {"name": name}, "minReplicas": 0, "maxReplicas": 1}
        shard = pool_shard(namespace, name, spec, 2)
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
                statuses = _statuses(k)
                return all(
                    (statuses[p].get("servedBy") or {}).get("shard") == s for p, s in shards.items()
                )

            wait_for(served, 120, "every pool served, on its shard")
            assert metrics.registry.get_sample_value("prescaler_shards_served") == 2
        base = identity.lease_name.removesuffix("-shard-0")
        leases = client.CoordinationV1Api(kube).list_namespaced_lease(namespace).items
        names = {lease.metadata.name for lease in leases}
        assert {f"{base}-shard-0", f"{base}-shard-1", f"{base}-member-0"} <= names
        # A clean stop released them.
        assert all(
            not lease.spec.holder_identity for lease in leases if lease.metadata.name in names
        )


def _worst_gap(
    reads: list[tuple[float, str, View]], pools: dict[str, int], since: float
) -> tuple[float, str]:
    """The longest time between two reconciles of one pool after ``since``, from every
    replica's ``prescaler_last_reconcile_timestamp_seconds`` as read. A replica drops a
    pool's series when it gives the pool's shard up; if it had not been read since its
    last reconcile, that reconcile is counted at the earliest it could have been (the
    previous one seen plus one period), which can only lengthen the gap."""
    times: dict[str, set[float]] = {p: set() for p in pools}
    seen: dict[tuple[str, str], tuple[float, float]] = {}  # (replica, pool) -> (read, ts)
    for read_at, identity, view in reads:
        for pool, ts in view.last.items():
            times[pool].add(ts)
            seen[(identity, pool)] = (read_at, ts)
        for (replica, pool), (_, ts) in list(seen.items()):
            if replica == identity and pool not in view.last:
                del seen[(replica, pool)]  # gone: given up
                if read_at - ts >= INTERVAL:
                    times[pool].add(ts + INTERVAL)
    worst, where = 0.0, ""
    for pool, stamps in times.items():
        ordered = sorted(t for t in stamps if t >= since - INTERVAL)
        for a, b in itertools.pairwise(ordered):
            if b - a > worst:
                worst, where = b - a, pool
    return worst, where
