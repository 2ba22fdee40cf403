"""Which pools this replica acts on, when the operator runs with shards.

:class:`ShardGate` sits between the handlers and the reconciler: a pool's reconcile runs
only while this replica serves the pool's shard (:func:`prescaler.sharding.pool_shard`,
the Lease decides: :class:`prescaler.kube.ShardLeases`), and is counted while it runs, so
that a shard being given up is released only once no reconcile of it runs. When a shard
is given up cleanly, the statuses kept back for its pools are written first; when it is
lost (its renewal was late), they are dropped: its new holder may already act. Either way
the pools' caches and metric series go, so each pool shows up on one replica's
``/metrics`` only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from prescaler.api import ServedByStatus
from prescaler.controller.model import PoolObject
from prescaler.controller.reconcile import Reconciler
from prescaler.kube import ShardLeases
from prescaler.metrics import Metrics
from prescaler.sharding import pool_shard


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
    on_gained: Callable[[frozenset[int]], None] = lambda _: None
    """Called with the shards just taken over (their pools' loops tick at once, so a
    pool waits for its new replica no longer than the handover)."""
    _serving: frozenset[int] = frozenset()
    _seen: dict[str, int] = field(default_factory=dict)
    """Every pool watched (served here or not), by uid, with its shard: the weights."""

    def __post_init__(self) -> None:
        self.leases.busy = self.busy
        self.leases.on_release = self.release
        self.leases.on_lost = self.lost
        self.leases.on_change = self.changed
        self.leases.weights = self.weights
        self.reconciler.serving = self.still_serves

    def observe(self, body: Mapping[str, Any]) -> None:
        """A pool seen on the watch (every replica sees every pool)."""
        self._seen[body["metadata"]["uid"]] = self.shard_of_body(body)

    def weights(self) -> list[float]:
        """What each shard weighs in the balance: its pools, plus one."""
        counts = [1.0] * self.leases.shards
        for shard in self._seen.values():
            counts[shard] += 1.0
        return counts

    def still_serves(self, pool: PoolObject) -> bool:
        """The reconciler's check before it writes: the shard the reconcile started on is
        still served here."""
        return pool.served_by is None or self.leases.serves(pool.served_by.shard)

    def shard(self, namespace: str, name: str, spec: Any) -> int:
        return pool_shard(namespace, name, spec or {}, self.leases.shards)

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
        """A deleted pool."""
        self._pools.pop(pool.uid, None)
        self._seen.pop(pool.uid, None)

    def changed(self, serving: frozenset[int]) -> None:
        gained, self._serving = serving - self._serving, serving
        if gained:
            self.on_gained(gained)
        self.metrics.shards_served.set(len(serving))
        for shard in range(self.leases.shards):
            self.metrics.shard_served.labels(str(shard), self.leases.identity).set(
                1 if shard in serving else 0
            )

    def _drop(self, uid: str) -> None:
        known = self._pools.pop(uid, None)
        if known is not None:
            self.reconciler.forget(known[1])
