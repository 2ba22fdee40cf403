"""Shard Leases (``prescaler.kube.ShardLeases``) of several replicas against an in-memory
Lease API with resourceVersions, on a clock the test moves: every shard is served by at
most one replica at any moment, the shards balance, a dead replica's shards are taken
over once its Leases expire, and a joining replica gets its share only after the others
stopped acting on it."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from prescaler.kube import LeaseTimings, ShardLeases

TIMINGS = LeaseTimings(lease_duration_seconds=6, renew_deadline_seconds=4, retry_period_seconds=1)
SHARDS = 6


class FakeLeases:
    """``CoordinationV1Api``'s Lease calls on a dict, with optimistic concurrency."""

    def __init__(self) -> None:
        self.leases: dict[str, Any] = {}
        self._versions = itertools.count(1)
        self.timeouts: list[Any] = []
        """The ``_request_timeout`` of every call, in order."""

    def _stamp(self, lease: Any) -> Any:
        lease.metadata.resource_version = str(next(self._versions))
        self.leases[lease.metadata.name] = copy.deepcopy(lease)
        return copy.deepcopy(lease)

    def list_namespaced_lease(
        self, namespace: str, label_selector: str, _request_timeout: Any = None
    ) -> Any:
        self.timeouts.append(_request_timeout)
        key, _, value = label_selector.partition("=")
        items = [
            copy.deepcopy(lease)
            for lease in self.leases.values()
            if (lease.metadata.labels or {}).get(key) == value
        ]
        return client.V1LeaseList(items=items)

    def read_namespaced_lease(self, name: str, namespace: str, _request_timeout: Any = None) -> Any:
        self.timeouts.append(_request_timeout)
        if name not in self.leases:
            raise ApiException(status=404)
        return copy.deepcopy(self.leases[name])

    def create_namespaced_lease(
        self, namespace: str, body: Any, _request_timeout: Any = None
    ) -> Any:
        self.timeouts.append(_request_timeout)
        if body.metadata.name in self.leases:
            raise ApiException(status=409)
        return self._stamp(body)

    def replace_namespaced_lease(
        self, name: str, namespace: str, body: Any, _request_timeout: Any = None
    ) -> Any:
        self.timeouts.append(_request_timeout)
        current = self.leases.get(name)
        if current is None:
            raise ApiException(status=404)
        if body.metadata.resource_version != current.metadata.resource_version:
            raise ApiException(status=409)
        return self._stamp(body)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _replica(api: FakeLeases, clock: Clock, name: str, join_delay: float = 0.0) -> ShardLeases:
    return ShardLeases(
        api, "ns", "op", name, SHARDS, timings=TIMINGS, clock=clock, join_delay_seconds=join_delay
    )


def _served(replicas: list[ShardLeases]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {i: [] for i in range(SHARDS)}
    for r in replicas:
        for shard in r.serving():
            out[shard].append(r.identity)
    return out


async def _rounds(
    replicas: list[ShardLeases], clock: Clock, n: int, all_: list[ShardLeases]
) -> None:
    """``n`` rounds of every live replica, one retry period apart, checking after each
    step that no shard is served twice (``all_`` includes dead replicas: a dead one
    must have stopped acting too, by its own deadline)."""
    for _ in range(n):
        for r in replicas:
            await r.step()
            doubled = {s: who for s, who in _served(all_).items() if len(who) > 1}
            assert not doubled, f"shards served twice at t={clock.now}: {doubled}"
        clock.now += TIMINGS.retry_period_seconds


def test_replicas_split_the_shards_take_over_and_rebalance() -> None:
    async def main() -> None:
        api, clock = FakeLeases(), Clock()
        a, b, c = (_replica(api, clock, n) for n in "abc")
        everyone = [a, b, c]
        await _rounds([a, b, c], clock, 8, everyone)
        served = _served(everyone)
        assert all(len(who) == 1 for who in served.values()), served
        assert sorted(len(r.serving()) for r in everyone) == [2, 2, 2]
        assert {r.replicas for r in everyone} == {3}

        # c dies (no more rounds, no release): its shards are served again once its
        # Leases expire, by a and b, within the lease duration plus a few rounds.
        orphans = c.serving()
        died = clock.now
        while not orphans <= a.serving() | b.serving():
            await _rounds([a, b], clock, 1, everyone)
            assert clock.now - died <= TIMINGS.lease_duration_seconds + 4, "slow takeover"
        assert not c.serving(), "a dead replica still counts as serving"
        assert sorted(len(r.serving()) for r in (a, b)) == [3, 3]

        # d joins: a and b give up a shard each, d takes them; never two at once.
        d = _replica(api, clock, "d")
        everyone.append(d)
        await _rounds([a, b, d], clock, 8, everyone)
        assert sorted(len(r.serving()) for r in (a, b, d)) == [2, 2, 2]

        # A clean stop releases everything at once: the others take over in a round or two.
        stop = asyncio.Event()
        stop.set()
        await d.run(stop)
        assert not d.serving()
        await _rounds([a, b], clock, 3, everyone)
        assert sorted(len(r.serving()) for r in (a, b)) == [3, 3]
        for r in (a, b):
            await r.run(stop)  # leaves
        held = {n: lease.spec.holder_identity for n, lease in api.leases.items()}
        assert {n: h for n, h in held.items() if h is not None} == {"op-member-2": "c"}, held
        # Every Lease call had a timeout, and an attempt's read and write together fit in
        # the renew deadline: a hung connection costs a renewal, not the replica's place.
        assert api.timeouts
        assert all(t is not None for t in api.timeouts)
        assert {2 * max(t) for t in api.timeouts} == {TIMINGS.renew_deadline_seconds}

    asyncio.run(main())


def test_a_replica_gives_up_a_shard_only_once_no_reconcile_of_it_runs() -> None:
    async def main() -> None:
        api, clock = FakeLeases(), Clock()
        a = _replica(api, clock, "a")
        released: list[int] = []

        async def on_release(shard: int) -> None:
            released.append(shard)

        running = {5}
        a.busy = lambda shard: shard in running
        a.on_release = on_release
        await _rounds([a], clock, 3, [a])
        assert a.serving() == frozenset(range(SHARDS))
        b = _replica(api, clock, "b")
        await _rounds([a, b], clock, 4, [a, b])
        # a stopped acting on 3, 4 and 5; 3 and 4 are released and taken by b; 5 waits
        # for its reconcile, still held by a (who no longer acts on it).
        assert a.serving() == frozenset({0, 1, 2})
        assert sorted(released) == [3, 4]
        assert b.serving() == frozenset({3, 4})
        running.clear()
        await _rounds([a, b], clock, 3, [a, b])
        assert sorted(released) == [3, 4, 5]
        assert b.serving() == frozenset({3, 4, 5})

    asyncio.run(main())


def test_a_holder_that_cannot_renew_stops_acting_before_its_lease_can_be_taken() -> None:
    async def main() -> None:
        api, clock = FakeLeases(), Clock()
        a, b = _replica(api, clock, "a"), _replica(api, clock, "b")
        lost: list[int] = []
        a.on_lost = lost.append
        await _rounds([a, b], clock, 6, [a, b])
        mine = a.serving()
        assert len(mine) == 3

        broken = True
        list_leases = api.list_namespaced_lease

        def failing(namespace: str, label_selector: str, _request_timeout: Any = None) -> Any:
            if broken:
                raise ApiException(status=503)
            return list_leases(namespace, label_selector, _request_timeout)

        a.coordination = type("Broken", (), {})()
        a.coordination.list_namespaced_lease = failing  # a's API calls fail from now on
        for elector in (*a._shard, *a._slot):
            elector.coordination = a.coordination
        t0 = clock.now
        while mine & a.serving():
            with contextlib.suppress(ApiException):
                await a.step()
            a._notice()
            await b.step()
            clock.now += 1
            assert not (a.serving() & b.serving())
        assert clock.now - t0 <= TIMINGS.renew_deadline_seconds + 1
        a._notice()  # what its next round does, failed or not
        assert sorted(lost) == sorted(mine)
        await _rounds([b], clock, TIMINGS.lease_duration_seconds + 3, [a, b])
        assert b.serving() == frozenset(range(SHARDS))

    asyncio.run(main())


def test_a_replica_that_finds_others_serving_joins_after_its_delay() -> None:
    async def main() -> None:
        api, clock = FakeLeases(), Clock()
        a = _replica(api, clock, "a", join_delay=5.0)
        await _rounds([a], clock, 1, [a])
        assert a.slot is not None, "alone, a replica takes a slot at once"
        b = _replica(api, clock, "b", join_delay=5.0)
        await _rounds([a, b], clock, 4, [a, b])
        assert b.slot is None
        assert a.serving() == frozenset(range(SHARDS))
        await _rounds([a, b], clock, 6, [a, b])
        assert b.slot is not None
        assert len(b.serving()) == 3

    asyncio.run(main())
