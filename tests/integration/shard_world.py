"""Three ``prescaler run --shards`` replicas over a few hundred pools: the objects, each
replica's view from its own ``/metrics``, and the kill and join scenarios, shared by the
shard tests (which check what happens) and ``benchmarks/shard_faults.py`` (which times it).
"""

from __future__ import annotations

import itertools
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from cluster.launcher import LocalCluster
from integration.operator_fixtures import Kube, operator_process, wait_for
from prescaler.api import GROUP, PLURAL, VERSION
from prescaler.sharding import pool_shard, settle, shard_lease_name, slot_lease_name

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
def create_pools(k: Kube, n: int) -> dict[str, int]:
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
        shards[name] = pool_shard(k.ns, spec, SHARDS)
    return shards


def statuses(k: Kube) -> dict[str, dict[str, Any]]:
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
    when it last reconciled each, how many shards it serves, and the pools it decoded from
    each of its watches (a shard's number, or ``relabel``)."""

    def __init__(self, samples: list[tuple[str, dict[str, str], float]]) -> None:
        self.served: dict[str, tuple[int, str, float]] = {}
        self.last: dict[str, float] = {}
        self.shards = -1.0
        self.watched: dict[str, float] = {}
        self.serving: set[int] = set()
        for name, labels, value in samples:
            if name == "prescaler_pool_reconciles_total":
                self.served[labels["pool"]] = (int(labels["shard"]), labels["replica"], value)
            elif name == "prescaler_last_reconcile_timestamp_seconds":
                self.last[labels["pool"]] = value
            elif name == "prescaler_shards_served":
                self.shards = value
            elif name == "prescaler_pool_watch_events_total":
                self.watched[labels["watch"]] = value
            elif name == "prescaler_shard_served" and value == 1:
                self.serving.add(int(labels["shard"]))


def view_of(port: int) -> View | None:
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
            view = view_of(port)
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


def owners_of(views: dict[str, View]) -> tuple[dict[str, str], set[str]]:
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


def steady(
    k: Kube, running: Replicas, shards: dict[str, int], quotas: list[int] | None
) -> dict[str, str] | None:
    """Pool -> serving replica, once every pool is served by exactly one replica, the
    replicas serve ``quotas`` shards (``None``: any), and every status names the pool's
    replica and shard. The statuses are read after the metrics and the metrics again
    after them, so a move in between is seen."""
    views = running.views()
    if views is None:
        return None
    if quotas is not None and sorted(v.shards for v in views.values()) != sorted(quotas):
        return None
    owners, doubled = owners_of(views)
    if doubled or set(owners) != set(shards):
        return None
    for pool, status in statuses(k).items():
        served = status.get("servedBy") or {}
        if (served.get("replica"), served.get("shard")) != (owners[pool], shards[pool]):
            return None
    again = running.views()
    if again is None or owners_of(again) != (owners, set()):
        return None
    return owners


def _leases(k: Kube) -> dict[str, str | None]:
    """Lease name -> holder identity (``None``: none), in the test's namespace."""
    api: Any = client.CoordinationV1Api(k.apps.api_client)
    return {
        lease.metadata.name: lease.spec.holder_identity if lease.spec is not None else None
        for lease in api.list_namespaced_lease(k.ns).items
    }


def shard_holders(k: Kube) -> tuple[dict[int, str | None], dict[str, int]]:
    """Shard -> the replica its Lease names, and replica -> the member slot it holds."""
    leases = _leases(k)
    holders = {i: leases.get(shard_lease_name("prescaler", i)) for i in range(SHARDS)}
    slots = {}
    for i in range(SHARDS):
        holder = leases.get(slot_lease_name("prescaler", i))
        if holder:
            slots[holder] = i
    return holders, slots


def by_rule(
    shards: dict[str, int], holders: dict[int, str | None], slots: dict[str, int]
) -> dict[int, str | None]:
    """Shard -> replica where the balance rule (:func:`prescaler.sharding.settle`) leaves
    the shards from ``holders``, with the replicas on ``slots``; a shard weighs its pools
    plus one, as its holder writes on its Lease."""
    weights = [1.0 + sum(s == i for s in shards.values()) for i in range(SHARDS)]
    start = {i: slots.get(h) if h else None for i, h in holders.items()}
    identity = {slot: name for name, slot in slots.items()}
    left = settle(weights, start, sorted(slots.values()))
    return {i: identity[s] if s is not None else None for i, s in left.items()}


def lease_holder(kube: Any, namespace: str, shard: int) -> str | None:
    lease = client.CoordinationV1Api(kube).read_namespaced_lease(
        shard_lease_name("prescaler", shard), namespace
    )
    return lease.spec.holder_identity if lease.spec is not None else None


def worst_gap(
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


# -------------------------------------------------------------------- scenarios
@dataclass
class Takeover:
    """A replica killed while it scales its pools, as the survivors saw it."""

    victims: list[str]
    """The pools the killed replica served."""
    takeover: float
    """Seconds from the kill until the survivors held every shard of the killed replica."""
    served: float
    """Seconds from the kill until every one of its pools was reconciled again."""
    owners: dict[str, str]
    """Pool -> replica once the survivors share the shards (3 each)."""


def kill_while_scaling(
    k: Kube, kube: Any, running: Replicas, shards: dict[str, int], victim: str = "r1"
) -> Takeover:
    """Three steady replicas; every pool of ``victim`` gets a floor of 1, and ``victim``
    is killed with SIGKILL once it has scaled a third of them."""
    owners = wait_for(
        lambda: steady(k, running, shards, [2, 2, 2]), 300, "three steady replicas", 1.0
    )
    victims = sorted(p for p, owner in owners.items() if owner == victim)
    victim_shards = {shards[p] for p in victims}
    survivors = set(running.procs) - {victim}
    for pool in victims:
        k.patch_pool(pool, {"minReplicas": 1})

    def scaled() -> int:
        items = k.apps.list_namespaced_deployment(k.ns).items
        return sum(1 for d in items if d.metadata.name in victims and d.spec.replicas == 1)

    wait_for(lambda: scaled() >= len(victims) // 3, 120, f"{victim} to scale a third of its pools")
    killed_wall = time.time()
    killed = time.monotonic()
    running.kill(victim)

    def shards_taken() -> bool:
        return all(lease_holder(kube, k.ns, s) in survivors for s in victim_shards)

    wait_for(shards_taken, 120, f"the survivors to take {victim}'s shards", interval=0.2)
    takeover = time.monotonic() - killed

    def served_again() -> bool:
        views = running.views()
        if views is None:
            return False
        last = {p: t for v in views.values() for p, t in v.last.items()}
        return all(last.get(p, 0.0) >= killed_wall for p in victims)

    wait_for(served_again, 120, f"every pool of {victim} reconciled again", interval=0.2)
    served = time.monotonic() - killed
    after = wait_for(
        lambda: steady(k, running, shards, [3, 3]), 300, "two replicas serving 3 shards each", 1.0
    )
    return Takeover(victims, takeover, served, after)


@dataclass
class Join:
    """A fourth replica joining three, as every replica's metrics told it."""

    before: dict[str, str]
    after: dict[str, str]
    """Pool -> replica before the join, and once the four share the shards where the
    balance rule leaves them (no replica's round would move a shard)."""
    expected: dict[str, str]
    """Pool -> replica where the balance rule leaves them from the Leases before the join."""
    moved: set[str]
    joined_at: float
    """Wall-clock time of the join."""
    worst: float
    """The longest time between two reconciles of any pool from the join on (seconds)."""
    where: str
    """The pool of the worst gap."""
    reconciled_after: set[str]
    """The pools whose reconcile after the join some replica's metrics showed."""


def join_one(k: Kube, running: Replicas, shards: dict[str, int], joiner: str = "r3") -> Join:
    """Three steady replicas, then ``joiner`` starts; every replica's metrics are read
    every 0.2 s until the four are steady and the joiner has reconciled what it took."""
    before = wait_for(
        lambda: steady(k, running, shards, [2, 2, 2]), 300, "three steady replicas", 1.0
    )
    held_before, _ = shard_holders(k)
    reads: list[tuple[float, str, View]] = []
    stop = threading.Event()

    def record() -> None:
        while not stop.is_set():
            for identity, port in list(running.ports.items()):
                view = view_of(port)
                if view is not None:
                    reads.append((time.time(), identity, view))
            stop.wait(0.2)

    recorder = threading.Thread(target=record, name="metrics recorder", daemon=True)
    recorder.start()
    try:
        joined_at = time.time()
        running.start(joiner)

        def settled() -> dict[str, str] | None:
            owners = steady(k, running, shards, None)
            if owners is None:
                return None
            holders, slots = shard_holders(k)
            if set(slots) != set(running.procs) or by_rule(shards, holders, slots) != holders:
                return None  # a replica is still to join, or a move is still to come
            return owners

        after = wait_for(settled, 300, "four replicas where the balance rule leaves them", 1.0)
        _, slots = shard_holders(k)
        left = by_rule(shards, held_before, slots)
        expected = {p: str(left[s]) for p, s in shards.items()}
        moved = {p for p in shards if after[p] != before[p]}

        def reconciled_after_the_join() -> bool:
            views = running.views()
            return views is not None and all(
                max((v.last.get(p, 0.0) for v in views.values()), default=0.0) > joined_at
                for p in shards
            )

        wait_for(reconciled_after_the_join, 120, "every pool reconciled after the join")
        settled_at = time.time()
        wait_for(lambda: reads and reads[-1][0] > settled_at + 1, 60, "one more read")
    finally:
        stop.set()
        recorder.join(30)
    worst, where = worst_gap(reads, shards, joined_at)
    reconciled = {p for _, _, view in reads for p, t in view.last.items() if t > joined_at}
    return Join(before, after, expected, moved, joined_at, worst, where, reconciled)
