"""Shards of the pools across replicas: one ``coordination.k8s.io/v1`` Lease per shard.

Each shard Lease follows :class:`~prescaler.kube.LeaseElector`'s client-go rules (expiry
judged on the candidate's own clock, writes conditional on the resourceVersion, a holder
acts only while its last renewal is younger than the renew deadline, which is shorter than
the lease duration). So a replica has stopped acting on a shard before anyone else may take
its Lease, whether it stops cleanly, hangs, or dies.

Replicas count themselves on member slot Leases (``<base>-member-<i>``, as many as there
are shards): each replica holds one slot, and the slots that are held and not expired are
the live replicas. Every retry period (:meth:`ShardLeases.run`) a replica:

1. lists the set's Leases (one call, by label);
2. renews its slot (or takes a free one) and the shards it holds;
3. balances the pools (:func:`prescaler.sharding.balance`, from the holders it sees and
   what each shard weighs: its own count for the shards it holds, which it also writes on
   their Leases, else what their holders wrote): the most loaded replica stops acting on
   the shard it should give up (:meth:`serves` turns false at once), waits until no
   reconcile runs on it, lets the caller write what it kept back (``on_release``) and
   only then releases its Lease;
4. takes the free or expired shards that fall to it (a replica that died has its shards
   taken within the lease duration, as soon as its slot expires too).

A shard whose renewal was late is lost without a write (``on_lost``): its successor may
already act on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from prescaler.kube._lease import LeaseElector, LeaseTimings
from prescaler.sharding import (
    SHARD_LEASE_LABEL,
    WEIGHT_ANNOTATION,
    balance,
    shard_lease_name,
    slot_lease_name,
)

log = logging.getLogger("prescaler.shards")


MAX_LEASE_THREADS = 16
"""At most this many Lease calls of one replica at once."""


def lease_threads(shards: int) -> int:
    """Threads (and connections) for a replica's Lease calls: one per shard it may hold
    and one for its slot, at most :data:`MAX_LEASE_THREADS`."""
    return min(shards + 1, MAX_LEASE_THREADS)


async def _nothing(_: int) -> None:
    return None


@dataclass
class ShardLeases:
    """This replica's shard and member slot Leases; :meth:`serves` gates every action on a
    pool of a shard."""

    coordination: Any
    """A ``CoordinationV1Api``."""
    namespace: str
    base: str
    """The set's base name: Leases ``<base>-shard-<i>`` and ``<base>-member-<i>``."""
    identity: str
    shards: int
    timings: LeaseTimings = field(default_factory=LeaseTimings)
    clock: Callable[[], float] = time.monotonic
    busy: Callable[[int], bool] = lambda _: False
    """Whether a reconcile of the shard runs now (a shard is released only when not)."""
    on_release: Callable[[int], Awaitable[None]] = _nothing
    """Called before a shard held in good standing is given up (write what was kept)."""
    on_lost: Callable[[int], None] = lambda _: None
    """Called when a shard stopped being served without a clean release."""
    on_change: Callable[[frozenset[int]], None] = lambda _: None
    """Called with the shards served whenever that set changes."""
    join_delay_seconds: float | None = None
    """A replica that finds others serving waits this long after its start before it
    takes a member slot (default: the lease duration), so it has listed and watched its
    pools before the others hand shards over to it; alone, it takes one at once."""
    weights: Callable[[], Sequence[float]] | None = None
    """What each shard weighs (its pools plus one), if the caller sees every pool; by
    default each shard weighs what :attr:`pools` says for the shards this replica holds,
    and what their holders last wrote on the others' Leases (:data:`WEIGHT_ANNOTATION`)."""
    pools: Callable[[int], int | None] = lambda _: None
    """How many pools of a shard this replica sees (``None``: it does not know), written
    on the shard's Lease with every renewal."""
    _started_at: float | None = None
    _shard: list[LeaseElector] = field(default_factory=list)
    _slot: list[LeaseElector] = field(default_factory=list)
    _my_slot: int | None = None
    _draining: set[int] = field(default_factory=set)
    _serving: frozenset[int] = frozenset()
    _live: int = 0
    api_client: client.ApiClient | None = None
    """A client of the Leases' own, closed when the loop ends (:meth:`for_client`): Lease
    calls never wait for a connection behind the reconciles' calls."""
    _pool: ThreadPoolExecutor | None = None
    """Threads for the Lease calls (:func:`lease_threads`), so the renewals of one round go
    out side by side."""

    def __post_init__(self) -> None:
        if self.shards < 1:
            raise ValueError("shards must be >= 1")
        labels = {SHARD_LEASE_LABEL: self.base}

        def elector(name: str, shard: int | None = None) -> LeaseElector:
            return LeaseElector(
                self.coordination,
                self.namespace,
                name,
                self.identity,
                timings=self.timings,
                clock=self.clock,
                labels=labels,
                annotations=(lambda: self._weight_note(shard)) if shard is not None else None,
            )

        self._shard = [elector(shard_lease_name(self.base, i), i) for i in range(self.shards)]
        self._slot = [elector(slot_lease_name(self.base, i)) for i in range(self.shards)]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=lease_threads(self.shards), thread_name_prefix="shard-leases"
            )

    @classmethod
    def for_client(
        cls,
        api_client: client.ApiClient,
        namespace: str,
        base: str,
        identity: str,
        shards: int,
        **kw: Any,
    ) -> ShardLeases:
        """Over ``api_client``, which the loop closes when it ends."""
        coordination = client.CoordinationV1Api(api_client)
        return cls(coordination, namespace, base, identity, shards, api_client=api_client, **kw)

    # ------------------------------------------------------------------ state
    def serves(self, shard: int) -> bool:
        """True while this replica holds the shard's Lease, renewed within the renew
        deadline, and is not giving it up."""
        return shard not in self._draining and self._shard[shard].is_leader()

    def serving(self) -> frozenset[int]:
        return frozenset(i for i in range(self.shards) if self.serves(i))

    @property
    def slot(self) -> int | None:
        """This replica's member slot, while it holds one."""
        if self._my_slot is not None and self._slot[self._my_slot].is_leader():
            return self._my_slot
        return None

    @property
    def replicas(self) -> int:
        """Live replicas (member slots held), as last counted."""
        return self._live

    # ------------------------------------------------------------------ loop
    async def run(self, stop: asyncio.Event) -> None:
        """Hold, renew and rebalance until ``stop`` is set; then stop acting on every
        shard, let the caller write what it kept, and release every Lease."""
        try:
            while not stop.is_set():
                try:
                    await self.step()
                except Exception as exc:  # a failed round must never stop the loop
                    log.warning("shard leases %s/%s: %s", self.namespace, self.base, exc)
                self._notice()
                delay = self.timings.retry_period_seconds * (1.0 + random.uniform(0.0, 0.1))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=delay)
        finally:
            await self._leave()

    async def step(self) -> None:
        """One round: list, renew, then give up or take shards toward the balance. The
        renewals (slot and held shards) go out side by side, so a slow API server costs a
        round one call's latency, not one per Lease."""
        if self._started_at is None:
            self._started_at = self.clock()
        listed = await self._io(self._list)
        renewing = [i for i, e in enumerate(self._shard) if e.is_leader() or i in self._draining]
        for i, elector in enumerate(self._shard):
            if i not in renewing:
                elector.observe(listed.get(elector.name))
        results = await asyncio.gather(
            self._io(self._take_slot, listed),
            *(
                self._io(self._shard[i].try_acquire_or_renew, listed.get(self._shard[i].name))
                for i in renewing
            ),
            return_exceptions=True,
        )
        if isinstance(results[0], BaseException):
            log.warning("member slot of %s: %s", self.base, results[0])
        for i, ok in zip(renewing, results[1:], strict=True):
            if isinstance(ok, BaseException):
                log.warning("shard %d of %s: renewal failed: %s", i, self.base, ok)
            elif not ok and not self._shard[i].is_leader():
                self._draining.discard(i)
        live = [i for i, e in enumerate(self._slot) if e.is_leader() or not e.available()]
        self._live = len(live)
        weights = list(self.weights()) if self.weights is not None else self._weights(listed)
        moves = balance(weights, self._holders(live), live, self.slot, self._draining)
        self._draining.update(moves.release)
        if self.slot is None:  # not counted by the others: give up what it holds
            self._draining.update(i for i, e in enumerate(self._shard) if e.is_leader())
        self._notice()
        for i in sorted(self._draining):
            if not self.busy(i):
                await self._give_up(i)
        for i in moves.acquire:
            elector = self._shard[i]
            if await self._io(elector.try_acquire_or_renew, listed.get(elector.name)):
                log.info("%s took shard %d of %s", self.identity, i, self.base)

    def _weight_note(self, shard: int) -> dict[str, str]:
        count = self.pools(shard)
        return {WEIGHT_ANNOTATION: str(count)} if count is not None else {}

    def _weights(self, listed: dict[str, Any]) -> list[float]:
        """Each shard's pools plus one: counted here for the shards held here, else as the
        holder last wrote on the Lease (a shard never held weighs one)."""
        weights = []
        for i, elector in enumerate(self._shard):
            count = self.pools(i) if elector.is_leader() else None
            if count is None:
                lease = listed.get(elector.name)
                notes = (lease.metadata.annotations if lease is not None else None) or {}
                with contextlib.suppress(TypeError, ValueError):
                    count = max(0, int(str(notes.get(WEIGHT_ANNOTATION))))
            weights.append(1.0 + (count or 0))
        return weights

    def _holders(self, live: Sequence[int]) -> dict[int, int | None]:
        """Each shard's holder as a live slot (-1: a holder without one), ``None`` when
        the shard is free or expired, as last observed."""
        slot_of = {self._slot[i].holder: i for i in live}
        holders: dict[int, int | None] = {}
        for i, elector in enumerate(self._shard):
            if elector.is_leader() or i in self._draining:
                holders[i] = self.slot if self.slot is not None else -1
            elif elector.available():
                holders[i] = None
            else:
                holders[i] = slot_of.get(elector.holder, -1)
        return holders

    async def _give_up(self, shard: int) -> None:
        with contextlib.suppress(Exception):
            await self.on_release(shard)
        try:
            await self._io(self._shard[shard].release)
            log.info("%s released shard %d of %s", self.identity, shard, self.base)
        except Exception as exc:
            log.warning("shard %d of %s: release failed: %s", shard, self.base, exc)
        self._draining.discard(shard)

    def _notice(self) -> None:
        """Tell the caller which shards are served now, and which were lost."""
        now = self.serving()
        if now == self._serving:
            return
        for shard in self._serving - now:
            if shard not in self._draining:
                self.on_lost(shard)
        self._serving = now
        log.info("%s serves shards %s of %s", self.identity, sorted(now), self.base)
        self.on_change(now)

    async def _leave(self) -> None:
        self._draining.update(self.serving())
        self._notice()
        for shard in sorted(self._draining):
            if self._shard[shard].is_leader():
                await self._give_up(shard)
        self._draining.clear()
        if self._my_slot is not None:
            with contextlib.suppress(Exception):
                await self._io(self._slot[self._my_slot].release)
        self._my_slot = None
        self._notice()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if self.api_client is not None:
            self.api_client.close()  # type: ignore[no-untyped-call]

    # ------------------------------------------------------------------ I/O
    async def _io(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _list(self) -> dict[str, Any]:
        """The set's Leases by name (blocking); the other replicas' slots observed."""
        listing = self.coordination.list_namespaced_lease(
            self.namespace,
            label_selector=f"{SHARD_LEASE_LABEL}={self.base}",
            _request_timeout=self.timings.call_timeout,
        )
        listed = {lease.metadata.name: lease for lease in listing.items}
        for i, elector in enumerate(self._slot):
            if i != self._my_slot:
                elector.observe(listed.get(elector.name))
        return listed

    def _take_slot(self, listed: dict[str, Any]) -> None:
        """Renew this replica's member slot, or take the first free one."""
        if self._my_slot is not None:
            elector = self._slot[self._my_slot]
            if elector.try_acquire_or_renew(listed.get(elector.name)) or elector.is_leader():
                return
            self._my_slot = None
        delay = self.join_delay_seconds
        if delay is None:
            delay = self.timings.lease_duration_seconds
        started = self._started_at if self._started_at is not None else self.clock()
        if self.clock() - started < delay and not all(e.available() for e in self._slot):
            return  # others serve: join once this replica has seen its pools
        for i, elector in enumerate(self._slot):
            lease = listed.get(elector.name)
            if elector.available() and elector.try_acquire_or_renew(lease):
                self._my_slot = i
                log.info("%s holds member slot %d of %s", self.identity, i, self.base)
                return
