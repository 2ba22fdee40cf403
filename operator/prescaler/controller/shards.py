"""Which pools this replica acts on, when the operator runs with shards.

:class:`ShardGate` sits between the handlers and the reconciler: a pool's reconcile runs
only while this replica serves the pool's shard (:func:`prescaler.sharding.pool_shard`,
the Lease decides: :class:`prescaler.kube.ShardLeases`), and is counted while it runs, so
that a shard being given up is released only once no reconcile of it runs. When a shard
is given up cleanly, the statuses kept back for its pools are written first; when it is
lost (its renewal was late), they are dropped: its new holder may already act. Either way
the pools' caches and metric series go, so each pool shows up on one replica's
``/metrics`` only.

A replica sees only the pools that touch the shards it watches (those it serves, and the
secondary shards of the pools it serves: :mod:`prescaler.controller.watch` watches them
by label), so what needs every pool of a target is kept local by the labels:

- which of two pools on one target keeps it: both carry the target's shard label, so
  the replica serving that shard sees both, and so does the replica serving either
  pool (it watches every shard its pool touches);
- a pod that carries the prewarm readiness gate has one owner among the replicas
  (:meth:`ShardGate.owns_pod`): the replica serving the pool that keeps the pod's
  workload (it warms the pod, or releases it when the pool does not warm), else the
  replica serving the workload's own shard (:func:`prescaler.sharding.workload_shard`),
  which sees every pool on it: when none scales it, it releases the pod after the grace
  period as an operator without shards does. A hot standby's pods are their pool's
  replica's only; a pod of no workload is the replica's serving shard
  :data:`SWEEPER_SHARD`;
- what each shard weighs (its pools) is counted by its holder, which writes it on the
  shard's Lease for the others (:class:`prescaler.kube.ShardLeases`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from prescaler.api import ServedByStatus
from prescaler.controller.model import PoolObject, TargetClaim, target_claims
from prescaler.controller.reconcile import Reconciler
from prescaler.kube import ROLE_HOT, ROLE_LABEL, ShardLeases, object_name
from prescaler.metrics import Metrics
from prescaler.sharding import pool_shard, workload_shard

SWEEPER_SHARD = 0
"""The shard whose replica releases gated pods of no workload."""

WorkloadKey = tuple[str, str, str]
"""``(namespace, kind, name)`` of a workload."""


def workload_keys(body: Mapping[str, Any]) -> tuple[WorkloadKey, ...]:
    """The workloads whose pods a pool may warm: its targets and its hot standby."""
    keys, _ = target_claims(body)
    meta = body.get("metadata") or {}
    hot = (str(meta.get("namespace")), "Deployment", object_name(str(meta.get("name")), ROLE_HOT))
    return (*keys, hot)


@dataclass
class ShardGate:
    """The shards of one replica, as its reconcile loops see them."""

    leases: ShardLeases
    reconciler: Reconciler
    metrics: Metrics
    _running: dict[int, int] = field(default_factory=dict)
    """Reconciles running now, by shard."""
    _pools: dict[str, tuple[int, PoolObject]] = field(default_factory=dict)
    """Pools this replica reconciled, by uid, with their shard."""
    on_serving: Callable[[frozenset[int]], None] = lambda _: None
    """Called with the shards served whenever that set changes (the watch follows it)."""
    _seen: dict[str, int] = field(default_factory=dict)
    """Every pool watched (those of the shards served here), by uid, with its shard."""
    _workloads: dict[WorkloadKey, dict[str, tuple[int, TargetClaim]]] = field(default_factory=dict)
    """Every watched pool's workloads (:func:`workload_keys`): pool uid -> its shard and
    its claim."""
    _keys: dict[str, tuple[WorkloadKey, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.leases.busy = self.busy
        self.leases.on_release = self.release
        self.leases.on_lost = self.lost
        self.leases.on_change = self.changed
        self.reconciler.serving = self.still_serves

    def observe(self, body: Mapping[str, Any]) -> None:
        """A pool seen on the watch of a shard served here."""
        uid = body["metadata"]["uid"]
        shard = self._seen[uid] = self.shard_of_body(body)
        self._unmap(uid)
        keys = self._keys[uid] = workload_keys(body)
        _, claim = target_claims(body)
        for key in keys:
            self._workloads.setdefault(key, {})[uid] = (shard, claim)

    def _unmap(self, uid: str) -> None:
        for key in self._keys.pop(uid, ()):
            owners = self._workloads.get(key, {})
            owners.pop(uid, None)
            if not owners:
                self._workloads.pop(key, None)

    def owns_pod(self, key: WorkloadKey | None, labels: Mapping[str, str] | None = None) -> bool:
        """Whether this replica decides a gated pod of workload ``key`` that no pool of
        its own has claimed for warming: it serves the pool that keeps that workload
        among those it sees (the oldest that is not Invalid for a reason of its own, as
        :func:`~prescaler.controller.model.target_owner` picks), or it sees none and
        serves the workload's shard (whose watch holds every pool on it, primary or
        secondary). A replica that serves the pool that keeps it sees every pool on it
        too (it watches the pool's secondary shards), so two replicas never both decide.
        A hot standby's pod (``labels``) is only its pool's replica's, which claims it; a
        pod of no workload is :data:`SWEEPER_SHARD`'s."""
        owners = self._workloads.get(key) if key is not None else None
        if owners:
            claims = sorted(owners.values(), key=lambda o: (o[1].blocked, o[1]))
            return self.leases.serves(claims[0][0])
        if key is None:
            return self.leases.serves(SWEEPER_SHARD)
        if (labels or {}).get(ROLE_LABEL) == ROLE_HOT:
            return False  # its pool is on another replica's shard, which claims it
        return self.leases.serves(workload_shard(*key, self.leases.shards))

    def still_serves(self, pool: PoolObject) -> bool:
        """The reconciler's check before it writes: the shard the reconcile started on is
        still served here."""
        return pool.served_by is None or self.leases.serves(pool.served_by.shard)

    def shard(self, namespace: str, name: str, spec: Any) -> int:
        return pool_shard(namespace, spec or {}, self.leases.shards)

    def shard_of_body(self, body: Mapping[str, Any]) -> int:
        meta = body["metadata"]
        return self.shard(meta["namespace"], meta["name"], body.get("spec"))

    @contextlib.contextmanager
    def acting(self, pool: PoolObject) -> Iterator[PoolObject | None]:
        """The pool with ``served_by`` set while this replica serves its shard (counted
        as running until the block ends), else ``None``: leave it alone."""
        shard = self.shard(pool.namespace, pool.name, pool.spec)
        known = self._pools.get(pool.uid)
        if known is not None and known[0] != shard:
            self._drop(pool.uid)  # its spec moved it to another shard
        if not self.leases.serves(shard):
            yield None
            return
        served = ServedByStatus(
            replica=self.leases.identity, shard=shard, shards=self.leases.shards
        )
        self._running[shard] = self._running.get(shard, 0) + 1
        self._pools[pool.uid] = (shard, pool)
        try:
            self.metrics.served(pool.namespace, pool.name, shard, self.leases.identity)
            yield replace(pool, served_by=served)
        finally:
            self._running[shard] -= 1

    def busy(self, shard: int) -> bool:
        return self._running.get(shard, 0) > 0

    def serves_pool(self, pool: PoolObject) -> bool:
        return self.leases.serves(self.shard(pool.namespace, pool.name, pool.spec))

    async def release(self, shard: int) -> None:
        """A shard given up cleanly: write its pools' kept statuses, then forget them."""
        uids = {uid for uid, (s, _) in self._pools.items() if s == shard}
        await self.reconciler.flush(only=lambda pool: pool.uid in uids)
        for uid in uids:
            self._drop(uid)

    def lost(self, shard: int) -> None:
        """A shard lost (renewal late): forget its pools without writing."""
        for uid in [uid for uid, (s, _) in self._pools.items() if s == shard]:
            self._drop(uid)

    def forget(self, pool: PoolObject) -> None:
        """A deleted pool, or one whose shard is another's now."""
        self.drop(pool)
        self.unwatch(pool.uid)

    def drop(self, pool: PoolObject) -> None:
        """A pool no longer served here, which the watch may still see (it touches
        another shard watched here): its workloads stay mapped until :meth:`unwatch`."""
        self._pools.pop(pool.uid, None)

    def unwatch(self, uid: str) -> None:
        """A pool no longer watched here (its shard is no longer served here): what the
        shard's hand-over writes or drops for it stays until then."""
        self._seen.pop(uid, None)
        self._unmap(uid)

    def changed(self, serving: frozenset[int]) -> None:
        self.on_serving(serving)
        self.metrics.shards_served.set(len(serving))
        for shard in range(self.leases.shards):
            self.metrics.shard_served.labels(str(shard), self.leases.identity).set(
                1 if shard in serving else 0
            )

    def _drop(self, uid: str) -> None:
        known = self._pools.pop(uid, None)
        if known is not None:
            self.reconciler.forget(known[1])
