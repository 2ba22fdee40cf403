"""The pool watch of a replica with shards (``prescaler.controller.watch.ShardWatch``): a
stream per served shard by label, the relabel stream, labels written by the right replica,
loops ended on delete, move, lost shard and relist. Fake streams and API, no I/O."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from prescaler.controller.model import target_claims, target_owner
from prescaler.controller.shards import ShardGate
from prescaler.controller.watch import ClaimIndex, Leave, ShardWatch, in_scope
from prescaler.kube import Event, Listed
from prescaler.metrics import Metrics
from prescaler.sharding import (
    PRIMARY,
    pool_shard,
    relabel_selector,
    shard_key,
    shard_labels,
    shard_selector,
    workload_shard,
)
from unit.fake_streams import FakeStream

SHARDS = 4


class Serving:
    def __init__(self, shards: set[int]) -> None:
        self.serving = set(shards)
        self.shards = SHARDS
        self.identity = "r"

    def serves(self, shard: int) -> bool:
        return shard in self.serving


class FakeKube:
    def __init__(self) -> None:
        self.patches: list[tuple[str, dict[str, Any]]] = []

    async def patch_custom_object(self, *args: Any) -> None:
        self.patches.append((args[4], args[5]))


def _pool(
    name: str,
    target: str | tuple[str, ...],
    labels: bool | dict[str, str] = False,
    created: str = "2024-01-01T00:00:00Z",
) -> Any:
    """A pool on ``target`` (a tuple: a pool with one role per target), labelled as its
    spec says (``True``), or with ``labels``."""
    meta: dict[str, Any] = {
        "namespace": "ns",
        "name": name,
        "uid": f"uid-{name}",
        "creationTimestamp": created,
    }
    if isinstance(target, tuple):
        spec: dict[str, Any] = {
            "roles": {f"r{i}": {"target": {"name": t}} for i, t in enumerate(target)}
        }
    else:
        spec = {"target": {"name": target}}
    if labels is True:
        meta["labels"] = shard_labels("ns", spec, SHARDS)
    elif labels:
        meta["labels"] = dict(labels)
    return {"metadata": meta, "spec": spec}


def _label(shard: int) -> dict[str, str]:
    return {shard_key(shard, SHARDS): PRIMARY}


def _patch(body: Any) -> tuple[str, dict[str, Any]]:
    """The label patch of an unlabelled pool."""
    want = shard_labels("ns", body["spec"], SHARDS)
    return body["metadata"]["name"], {"metadata": {"labels": want}}


def _target_in(shard: int, avoid: frozenset[str] | set[str] = frozenset()) -> str:
    i = 0
    while True:
        name = f"t{i}"
        if name not in avoid and pool_shard("ns", {"target": {"name": name}}, SHARDS) == shard:
            return name
        i += 1


class World:
    def __init__(self, serving: set[int]) -> None:
        self.leases = Serving(serving)
        self.gate = ShardGate(
            leases=self.leases,  # type: ignore[arg-type]
            reconciler=SimpleNamespace(),  # type: ignore[arg-type]
            metrics=Metrics(),
        )
        self.kube = FakeKube()
        self.streams: list[FakeStream] = []
        self.fed: list[tuple[str, bool]] = []
        self.left: list[tuple[str, Leave]] = []

        def open_stream(scope: str | None, selector: str, deliver: Any) -> FakeStream:
            stream = FakeStream(scope, selector, deliver)
            self.streams.append(stream)
            return stream

        async def on_leave(body: Any, why: Leave) -> None:
            self.left.append((body["metadata"]["name"], why))

        self.watch = ShardWatch(
            self.gate,
            self.kube,  # type: ignore[arg-type]
            self.gate.metrics,
            open_stream,
            on_pool=lambda body, soon: self.fed.append((body["metadata"]["name"], soon)),
            on_leave=on_leave,
            namespaces=("ns",),
            retry_seconds=0.01,
        )

    def stream(self, selector: str) -> FakeStream:
        live = [s for s in self.streams if s.selector == selector and not s.stopped]
        assert len(live) == 1, (selector, [s.selector for s in self.streams])
        return live[0]

    def events(self, watch: str) -> float:
        return self.gate.metrics.pool_watch_events.labels(watch)._value.get()


def test_a_replica_watches_its_shards_by_label_and_follows_what_it_serves() -> None:
    async def scenario() -> None:
        w = World({1})
        w.watch.follow(frozenset({1}))
        w.watch.start()
        assert sorted(s.selector for s in w.streams) == sorted(
            [relabel_selector(SHARDS), shard_selector(1, SHARDS)]
        )
        assert all(s.scope == "ns" and s.started for s in w.streams)
        mine = _pool("a", _target_in(1), True)
        w.stream(shard_selector(1, SHARDS)).deliver(Listed((mine,), relist=False))
        assert w.fed == [("a", True)]  # a shard just taken over: it ticks soon
        assert w.watch.pools(1) == 1
        assert w.watch.pools(2) is None
        assert w.events("1") == 1
        # Shard 2 gained, shard 1 lost: its stream closes and its pools' loops end.
        w.leases.serving = {2}
        w.watch.follow(frozenset({2}))
        await asyncio.sleep(0)
        assert w.stream(shard_selector(2, SHARDS)).started
        assert [s.stopped for s in w.streams if s.selector == shard_selector(1, SHARDS)] == [True]
        assert w.left == [("a", "unserved")]
        assert not w.watch.claims
        await w.watch.close()

    asyncio.run(scenario())


def test_unlabelled_pools_are_labelled_by_the_replica_serving_their_shard() -> None:
    async def scenario() -> None:
        w = World({0})
        w.watch.follow(frozenset({0}))
        w.watch.start()
        mine, theirs = _pool("a", _target_in(0)), _pool("b", _target_in(3))
        w.stream(relabel_selector(SHARDS)).deliver(Listed((mine, theirs), relist=False))
        await asyncio.sleep(0.05)
        assert w.kube.patches == [_patch(mine)]
        assert w.fed == []  # fed once its label brings it into the shard's watch
        # Shard 3 gained: the waiting pool of it is labelled now.
        w.leases.serving = {0, 3}
        w.watch.follow(frozenset({0, 3}))
        await asyncio.sleep(0.05)
        assert _patch(theirs) in w.kube.patches
        # Labelled under another count: relabelled too, the old label removed.
        old = _pool("c", _target_in(0), {shard_key(0, 3): PRIMARY})
        w.stream(relabel_selector(SHARDS)).deliver(Event("ADDED", old))
        await asyncio.sleep(0.05)
        want = {**_patch(old)[1]["metadata"]["labels"], shard_key(0, 3): None}
        assert ("c", {"metadata": {"labels": want}}) in w.kube.patches
        await w.watch.close()

    asyncio.run(scenario())


def test_a_pool_moved_by_its_spec_is_relabelled_and_leaves() -> None:
    async def scenario() -> None:
        w = World({1})
        w.watch.follow(frozenset({1}))
        w.watch.start()
        stream = w.stream(shard_selector(1, SHARDS))
        body = _pool("a", _target_in(1), True)
        stream.deliver(Listed((body,), relist=False))
        moved = _pool("a", _target_in(2), _label(1))
        stream.deliver(Event("MODIFIED", moved))
        await asyncio.sleep(0.05)
        want = {shard_key(2, SHARDS): PRIMARY, shard_key(1, SHARDS): None}
        assert w.kube.patches == [("a", {"metadata": {"labels": want}})]
        assert w.left == [("a", "moved")]
        assert w.watch.pools(1) == 0
        await w.watch.close()

    asyncio.run(scenario())


def test_deleted_left_and_relisted_pools_end_their_loops() -> None:
    async def scenario() -> None:
        w = World({1})
        w.watch.follow(frozenset({1}))
        w.watch.start()
        stream = w.stream(shard_selector(1, SHARDS))
        avoid: set[str] = set()
        bodies = {}
        for name in "abcd":
            target = _target_in(1, avoid)
            avoid.add(target)
            bodies[name] = _pool(name, target, True)
        stream.deliver(Listed(tuple(bodies.values()), relist=False))
        stream.deliver(Event("DELETED", bodies["a"]))  # deleted: its last labels match
        left = {**bodies["b"], "metadata": {**bodies["b"]["metadata"], "labels": {}}}
        stream.deliver(Event("DELETED", left))  # its label changed: it left the selector
        # 410 Gone, then a relist without c (deleted in the gap).
        stream.deliver(Listed((bodies["d"],), relist=True))
        await asyncio.sleep(0.01)
        assert w.left == [("a", "deleted"), ("b", "moved"), ("c", "deleted")]
        assert w.watch.pools(1) == 1
        assert set(w.watch.claims) == {("ns", "Deployment", bodies["d"]["spec"]["target"]["name"])}
        await w.watch.close()

    asyncio.run(scenario())


def test_two_pools_on_one_target_are_both_in_the_claims() -> None:
    index = ClaimIndex()
    older = _pool("old", "llm")
    older["metadata"]["creationTimestamp"] = "2024-01-01T00:00:00Z"
    younger = _pool("new", "llm")
    younger["metadata"]["creationTimestamp"] = "2024-02-01T00:00:00Z"
    index.put(older)
    index.put(younger)
    assert [c.name for c in sorted(index[("ns", "Deployment", "llm")])] == ["old", "new"]
    index.drop("uid-old")
    assert [c.name for c in index[("ns", "Deployment", "llm")]] == ["new"]


def test_namespace_patterns_are_kept_on_the_client() -> None:
    keep = in_scope(("team-*", "!team-x"))
    assert keep("team-a")
    assert not keep("team-x")
    assert not keep("other")
    assert in_scope(())("anything")


def _role_targets(first_shard: int, second_shard: int) -> tuple[str, str]:
    """Two role targets, the first (in sort order: the pool's primary) on
    ``first_shard`` and the second on ``second_shard``."""
    for i in range(10_000):
        first = f"a{i}"
        if workload_shard("ns", "Deployment", first, SHARDS) == first_shard:
            break
    for i in range(10_000):
        second = f"b{i}"
        if workload_shard("ns", "Deployment", second, SHARDS) == second_shard:
            return first, second
    raise AssertionError("no such targets")


def _superseded_by(w: World, body: Any) -> str | None:
    keys, me = target_claims(body)
    owners = (target_owner(me, w.watch.claims.get(key, ())) for key in keys)
    return next((o for o in owners if o is not None), None)


def test_a_role_pool_whose_second_target_an_older_pool_on_another_shard_holds_is_in_conflict() -> (
    None
):
    """The replica serving a role pool watches its secondary shard too: it sees the older
    pool on its second target there, before the role pool's loop starts."""

    async def scenario() -> None:
        w = World({1})
        w.watch.follow(frozenset({1}))
        w.watch.start()
        first, second = _role_targets(1, 2)
        older = _pool("older", second, True, created="2024-01-01T00:00:00Z")
        younger = _pool("younger", (first, second), True, created="2024-02-01T00:00:00Z")
        assert younger["metadata"]["labels"] == {
            shard_key(1, SHARDS): PRIMARY,
            shard_key(2, SHARDS): "secondary",
        }
        w.stream(shard_selector(1, SHARDS)).deliver(Listed((younger,), relist=False))
        # Its secondary shard's stream opens; the pool waits until it has listed.
        assert w.fed == []
        assert not w.watch.ready(younger)
        secondary = w.stream(shard_selector(2, SHARDS))
        assert secondary.started
        secondary.deliver(Listed((older, younger), relist=False))
        assert w.fed == [("younger", True)]
        assert _superseded_by(w, younger) == "older"
        assert not w.watch.claims.get(("ns", "Deployment", "nothing"))
        # The older one is seen, not served, and its shard weighs nothing here.
        assert w.watch.pools(2) is None
        assert w.watch.pools(1) == 1
        # The role pool's second target changes to one on its own shard: the secondary
        # stream closes, and the older pool leaves the claims.
        own = _target_in(1, {first})
        moved = _pool("younger", (first, own), True, created="2024-02-01T00:00:00Z")
        w.stream(shard_selector(1, SHARDS)).deliver(Event("MODIFIED", moved))
        assert secondary.stopped
        assert _superseded_by(w, moved) is None
        assert ("ns", "Deployment", second) not in w.watch.claims
        await w.watch.close()

    asyncio.run(scenario())


def test_the_replica_of_a_secondary_shard_sees_the_pool_but_neither_serves_nor_labels_it() -> None:
    """Conflicts are seen from the target's side too, and a gated pod of the role pool's
    second target is its pool's replica's to decide, not the workload's shard's."""

    async def scenario() -> None:
        w = World({2})
        w.watch.follow(frozenset({2}))
        w.watch.start()
        first, second = _role_targets(1, 2)
        role = _pool("role", (first, second), True, created="2024-01-01T00:00:00Z")
        younger = _pool("younger", second, True, created="2024-02-01T00:00:00Z")
        stream = w.stream(shard_selector(2, SHARDS))
        stream.deliver(Listed((role, younger), relist=False))
        assert w.fed == [("younger", True)]  # the role pool is served on shard 1
        assert _superseded_by(w, younger) == "role"
        key = ("ns", "Deployment", second)
        assert not w.gate.owns_pod(key)  # the role pool's replica warms or releases it
        # A stale secondary label: the role pool's replica fixes it, not this one.
        stale = {
            **role,
            "metadata": {
                **role["metadata"],
                "labels": {**role["metadata"]["labels"], shard_key(3, SHARDS): "secondary"},
            },
        }
        stream.deliver(Event("MODIFIED", stale))
        await asyncio.sleep(0.05)
        assert w.kube.patches == []
        # The role pool gone: the workload's gated pods are the shard's replica's again.
        stream.deliver(Event("DELETED", role))
        stream.deliver(Event("DELETED", younger))
        await asyncio.sleep(0.01)
        assert w.left == [("younger", "deleted")]
        assert w.gate.owns_pod(key)
        assert not w.watch.claims
        await w.watch.close()

    asyncio.run(scenario())


def test_a_served_pool_with_stale_secondary_labels_is_relabelled() -> None:
    async def scenario() -> None:
        w = World({1})
        w.watch.follow(frozenset({1}))
        w.watch.start()
        first, second = _role_targets(1, 3)
        body = _pool("role", (first, second), _label(1))  # the secondary label missing
        w.stream(shard_selector(1, SHARDS)).deliver(Listed((body,), relist=False))
        await asyncio.sleep(0.05)
        assert w.kube.patches == [
            ("role", {"metadata": {"labels": {shard_key(3, SHARDS): "secondary"}}})
        ]
        await w.watch.close()

    asyncio.run(scenario())


def test_a_pool_moved_between_two_shards_served_here_stays_served_in_either_order() -> None:
    """A role pool's primary moves to its (already watched) secondary shard, both served
    here: whichever stream delivers the change first, the pool ends served on the new
    shard (the loop its old shard ends is the one the new shard feeds: handlers keep it)."""

    async def scenario(new_first: bool) -> None:
        w = World({1, 2})
        w.watch.follow(frozenset({1, 2}))
        w.watch.start()
        first, second = _role_targets(1, 2)
        body = _pool("role", (first, second), True)
        for shard in (1, 2):
            w.stream(shard_selector(shard, SHARDS)).deliver(Listed((body,), relist=False))
        assert w.fed == [("role", True)]
        assert w.watch.pools(1) == 1
        # The first role target renamed to one that sorts after the second: shard 2 serves.
        later = "z" + first
        moved = _pool("role", (later, second), True)
        assert pool_shard("ns", moved["spec"], SHARDS) == 2
        order = (2, 1) if new_first else (1, 2)
        for shard in order:
            w.stream(shard_selector(shard, SHARDS)).deliver(Event("MODIFIED", moved))
        await asyncio.sleep(0.01)
        assert w.watch.serves_uid("uid-role")
        assert (w.watch.pools(1), w.watch.pools(2)) == (0, 1)
        assert w.fed[-1][0] == "role"
        await w.watch.close()

    asyncio.run(scenario(True))
    asyncio.run(scenario(False))
