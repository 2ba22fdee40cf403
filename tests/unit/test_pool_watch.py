"""The pool watch of a replica without shards (``prescaler.controller.watch.PoolWatch``):
one stream per scope, every pool fed once its stream has listed, the claims kept from the
same stream, loops ended on delete, deletion and relist. Fake streams, no I/O."""

from __future__ import annotations

import asyncio
from typing import Any

from prescaler.controller.model import target_claims, target_owner
from prescaler.controller.watch import OLD_FINALIZER, Leave, PoolWatch
from prescaler.kube import Event, Listed
from prescaler.metrics import Metrics
from unit.fake_streams import FakeStream


def _pool(name: str, target: str, ns: str = "ns", created: str = "2024-01-01T00:00:00Z") -> Any:
    meta = {"namespace": ns, "name": name, "uid": f"uid-{name}", "creationTimestamp": created}
    return {"metadata": meta, "spec": {"target": {"name": target}}}


class FakeKube:
    def __init__(self) -> None:
        self.patches: list[tuple[str, dict[str, Any]]] = []

    async def patch_custom_object(self, *args: Any) -> None:
        self.patches.append((args[4], args[5]))


class World:
    def __init__(self, namespaces: tuple[str, ...] = ()) -> None:
        self.kube = FakeKube()
        self.streams: list[FakeStream] = []
        self.fed: list[str] = []
        self.owners: dict[str, str | None] = {}
        self.left: list[tuple[str, Leave]] = []
        self.metrics = Metrics()

        def open_stream(scope: str | None, selector: str, deliver: Any) -> FakeStream:
            stream = FakeStream(scope, selector, deliver)
            self.streams.append(stream)
            return stream

        def on_pool(body: Any) -> None:
            # What a reconcile of this pool would decide now: who owns its target.
            name = body["metadata"]["name"]
            self.fed.append(name)
            keys, me = target_claims(body)
            self.owners[name] = target_owner(me, self.watch.claims.get(keys[0], []))

        async def on_leave(body: Any, why: Leave) -> None:
            self.left.append((body["metadata"]["name"], why))

        self.watch = PoolWatch(
            self.metrics,
            open_stream,
            on_pool=on_pool,
            on_leave=on_leave,
            namespaces=namespaces,
            kube=self.kube,  # type: ignore[arg-type]
        )

    def events(self) -> float:
        return self.metrics.pool_watch_events.labels("all")._value.get()


def test_every_pool_is_fed_with_every_claim_of_the_list_known() -> None:
    async def scenario() -> None:
        w = World()
        w.watch.start()
        assert [(s.scope, s.selector, s.started) for s in w.streams] == [(None, "", True)]
        younger = _pool("new", "llm", created="2024-02-01T00:00:00Z")
        older = _pool("old", "llm")
        # The younger pool comes first in the list: it is fed knowing the older one.
        w.streams[0].deliver(Listed((younger, older, _pool("b", "other")), relist=False))
        assert w.fed == ["new", "old", "b"]
        assert w.owners == {"new": "old", "old": None, "b": None}
        assert w.events() == 3
        w.streams[0].deliver(Event("MODIFIED", {**older, "status": {"x": 1}}))
        assert w.fed[-1] == "old"
        assert w.events() == 4
        await w.watch.close()
        assert w.streams[0].stopped

    asyncio.run(scenario())


def test_deleted_terminating_and_relisted_pools_end_their_loops() -> None:
    async def scenario() -> None:
        w = World()
        w.watch.start()
        stream = w.streams[0]
        a, b, c, d = (_pool(n, f"t-{n}") for n in "abcd")
        stream.deliver(Listed((a, b, c, d), relist=False))
        stream.deliver(Event("DELETED", a))
        terminating = {
            **b,
            "metadata": {**b["metadata"], "deletionTimestamp": "2024-03-01T00:00:00Z"},
        }
        stream.deliver(Event("MODIFIED", terminating))
        # 410 Gone, then a relist without b (its finalizers done) and c (deleted in the gap).
        stream.deliver(Listed((d,), relist=True))
        await asyncio.sleep(0.01)
        assert w.left == [
            ("a", "deleted"),
            ("b", "terminating"),
            ("b", "deleted"),
            ("c", "deleted"),
        ]
        assert set(w.watch.claims) == {("ns", "Deployment", "t-d")}
        assert w.fed == ["a", "b", "c", "d", "d"]
        await w.watch.close()

    asyncio.run(scenario())


def test_a_stream_per_namespace_and_patterns_kept_on_the_client() -> None:
    async def scenario() -> None:
        named = World(("team-a", "team-b"))
        named.watch.start()
        assert [s.scope for s in named.streams] == ["team-a", "team-b"]
        # A relist of one namespace ends no loop of the other's.
        named.streams[0].deliver(Listed((_pool("a", "t", ns="team-a"),), relist=False))
        named.streams[1].deliver(Listed((_pool("b", "t", ns="team-b"),), relist=False))
        named.streams[0].deliver(Listed((), relist=True))
        await asyncio.sleep(0.01)
        assert named.left == [("a", "deleted")]
        assert set(named.watch.claims) == {("team-b", "Deployment", "t")}
        await named.watch.close()

        patterns = World(("team-*", "!team-x"))
        patterns.watch.start()
        assert [s.scope for s in patterns.streams] == [None]
        bodies = (_pool("a", "t", ns="team-a"), _pool("x", "t", ns="team-x"))
        patterns.streams[0].deliver(Listed(bodies, relist=False))
        patterns.streams[0].deliver(Event("ADDED", _pool("o", "t", ns="other")))
        assert patterns.fed == ["a"]
        await patterns.watch.close()

    asyncio.run(scenario())


def test_the_finalizer_of_older_versions_is_taken_off_and_others_kept() -> None:
    async def scenario() -> None:
        w = World()
        w.watch.start()
        legacy = _pool("legacy", "t")
        legacy["metadata"].update(
            finalizers=[OLD_FINALIZER, "example.com/keep"], resourceVersion="7"
        )
        deleting = _pool("deleting", "u")
        deleting["metadata"].update(
            finalizers=[OLD_FINALIZER],
            resourceVersion="8",
            deletionTimestamp="2024-03-01T00:00:00Z",
        )
        w.streams[0].deliver(Listed((legacy, deleting, _pool("new", "v")), relist=False))
        await asyncio.sleep(0.01)
        assert sorted(w.kube.patches) == [
            ("deleting", {"metadata": {"finalizers": None, "resourceVersion": "8"}}),
            ("legacy", {"metadata": {"finalizers": ["example.com/keep"], "resourceVersion": "7"}}),
        ]
        assert w.fed == ["legacy", "new"]
        assert w.left == [("deleting", "terminating")]
        await w.watch.close()

    asyncio.run(scenario())
