"""The pools' watch: every watched pool (:class:`PoolWatch`), or with shards, only the
pools that touch the shards a replica serves (:class:`ShardWatch`).

Without shards, one list-and-watch of the pools per watched namespace (or one for the
whole cluster, kept to the namespace patterns here) feeds every pool to its loop and keeps
the claims on each target (:class:`ClaimIndex`) from the same stream. A pool is fed once
its stream has listed every pool: the claims on its targets are then known. A relist after
``410 Gone`` ends the loops of the pools it lacks (deleted in the gap).

With shards, each replica watches only the pools that touch the shards it serves.

Every pool carries one label per shard it touches (:func:`prescaler.sharding.shard_labels`,
e.g. ``prescaler.io/shard-3-of-6: primary``, and ``prescaler.io/shard-5-of-6: secondary``
for a pool with roles whose other role target hashes to shard 5), so a replica asks the
API server for those pools only: one list-and-watch (:class:`prescaler.kube.ObjectStream`)
per shard it watches (per watched namespace), opened when it starts watching the shard
and closed when it stops. Three replicas then decode about a third of the pools' events
each, where each decoded all of them through kopf (whose ``labels=`` filter runs on the
client, after the decoding).

:class:`ShardWatch` keeps the labels current, and turns the streams into the pools' loops:

- **Which shards.** The shards served here, and the secondary shards of the pools served
  here: a pool's reconcile needs every claim on each of its targets, and the pools
  claiming a target all carry its shard's label. A pool served here is fed to its loop
  once every shard it touches has been listed (:meth:`ShardWatch.ready`; a reconcile
  waits for it too, as the pool's targets can change).
- **Claims and workloads.** Every pool any of these streams has, primary or secondary,
  is in the target claims (:class:`ClaimIndex`: the older of two pools on one target
  keeps it, as without shards) and in :class:`ShardGate`'s map of workloads (who decides
  a gated pod), until no stream here has it.
- **Labels.** One more stream per replica selects the pools no label names a primary of
  under this shard count (:func:`prescaler.sharding.relabel_selector`: new pools, or
  labelled under another count); the replica serving a pool's primary shard labels it,
  and the pool leaves that stream for its shards'. A pool whose labels are not what its
  spec says (its targets changed, a label was edited) is relabelled by the replica
  serving its primary shard, or the one serving the shard its labels name as primary.
- **Loops.** A pool whose primary shard is served here is fed to its loop (``on_pool``);
  the pools a new stream lists first tick within a short spread (a shard just taken
  over). A ``DELETED`` event ends the loop, whether the pool was deleted or left the
  selector (relabelled, a ``DELETED`` with its new labels); so does a pool whose primary
  moved to another shard, and a shard no longer served ends its pools' loops (the
  shard's Lease hand-over writes or drops what they kept, :class:`ShardGate`).
- **Relists.** After ``410 Gone`` a stream lists its shard again: a pool it had that the
  list lacks was deleted (or moved) in the gap, and its loop ends. The list is the
  stream's own, so no second list is needed.
"""

from __future__ import annotations

import asyncio
import fnmatch
import inspect
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from prescaler.api import GROUP, PLURAL, VERSION
from prescaler.controller.model import TargetClaim, target_claims
from prescaler.controller.shards import ShardGate
from prescaler.kube import Event, KubeApi, KubeError, Listed, NotFound
from prescaler.metrics import Metrics
from prescaler.sharding import (
    label_patch,
    labelled_shard,
    labelled_shards,
    relabel_selector,
    shard_selector,
    touched_shards,
)

log = logging.getLogger("prescaler.watch")

OLD_FINALIZER = "prescaler.io/finalizer"
"""The finalizer older versions put on every pool (kopf's, for its timers): taken off
wherever a pool is seen without shards, so that a pool being deleted is not held."""
RELABEL_RETRY_SECONDS = 5.0
"""A failed label write is tried again after this long, while it is still due."""

Leave = Literal["deleted", "moved", "unserved", "terminating"]
"""Why a pool's loop ends here: deleted (or gone from a relist), relabelled to another
shard, its shard no longer served here, or being deleted (finalizers pending)."""

Body = dict[str, Any]


class Stream(Protocol):
    def start(self) -> None: ...
    def stop(self) -> None: ...
    async def wait_stopped(self, timeout: float = ...) -> None: ...


StreamFactory = Callable[[str | None, str, Callable[[Listed | Event], None]], Stream]
"""Opens a stream: namespace (``None``: all), label selector, and where its items go."""


class ClaimIndex(Mapping[tuple[str, str, str], tuple[TargetClaim, ...]]):
    """The target claims of the pools watched here (with shards, every pool on the targets
    of the pools served here)."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[str, str, str], dict[str, TargetClaim]] = {}
        self._keys: dict[str, tuple[tuple[str, str, str], ...]] = {}

    def __getitem__(self, key: tuple[str, str, str]) -> tuple[TargetClaim, ...]:
        return tuple(self._by_key[key].values())

    def __iter__(self) -> Iterator[tuple[str, str, str]]:
        return iter(self._by_key)

    def __len__(self) -> int:
        return len(self._by_key)

    def put(self, body: Mapping[str, Any]) -> None:
        uid = str(body["metadata"]["uid"])
        self.drop(uid)
        keys, claim = target_claims(body)
        self._keys[uid] = keys
        for key in keys:
            self._by_key.setdefault(key, {})[uid] = claim

    def drop(self, uid: str) -> None:
        for key in self._keys.pop(uid, ()):
            claims = self._by_key.get(key, {})
            claims.pop(uid, None)
            if not claims:
                self._by_key.pop(key, None)


def in_scope(namespaces: Sequence[str]) -> Callable[[str], bool]:
    """Whether a namespace is watched, for kopf-style patterns (``*``/``?`` globs, a
    leading ``!`` excludes; commas separate): what a cluster-wide stream keeps."""
    parts = [p.strip() for ns in namespaces for p in ns.split(",") if p.strip()]
    include = [p for p in parts if not p.startswith("!")]
    exclude = [p[1:] for p in parts if p.startswith("!")]

    def check(namespace: str) -> bool:
        if any(fnmatch.fnmatchcase(namespace, p) for p in exclude):
            return False
        return not include or any(fnmatch.fnmatchcase(namespace, p) for p in include)

    return check


def _scopes(namespaces: Sequence[str]) -> tuple[tuple[str | None, ...], Callable[[str], bool]]:
    """The streams' scopes (one per plain namespace name, else the whole cluster) and what
    a cluster-wide stream keeps (the patterns)."""
    names = tuple(namespaces)
    if names and not any(set("!*?,") & set(ns) for ns in names):
        return names, lambda _: True
    return (None,), in_scope(names)


def _spawn(tasks: set[asyncio.Task[None]], work: Awaitable[None], name: str) -> None:
    """Run ``work`` as a task kept in ``tasks`` until it ends; its failure is logged."""

    async def run() -> None:
        try:
            await work
        except Exception:
            log.exception("%s failed", name)

    def done(task: asyncio.Task[None]) -> None:
        tasks.discard(task)
        if inspect.iscoroutine(work):
            work.close()  # cancelled before it ran (on close): never awaited otherwise

    task = asyncio.create_task(run(), name=name)
    tasks.add(task)
    task.add_done_callback(done)


def _uid(body: Mapping[str, Any]) -> str:
    return str(body["metadata"]["uid"])


def _namespace(body: Mapping[str, Any]) -> str:
    return str(body["metadata"]["namespace"])


@dataclass
class PoolWatch:
    """The pool streams of a replica without shards (see the module's docstring)."""

    metrics: Metrics
    open_stream: StreamFactory
    on_pool: Callable[[Body], None]
    """A pool as it is now, once its stream has listed (its claims are known)."""
    on_leave: Callable[[Body, Leave], Awaitable[None]]
    """A pool whose loop ends: ``deleted`` (or gone from a relist), or ``terminating``."""
    namespaces: Sequence[str] = ()
    """Watched namespace names or kopf patterns (empty: every namespace)."""
    kube: KubeApi | None = None
    """Where :data:`OLD_FINALIZER` is taken off (``None``: it is left)."""
    claims: ClaimIndex = field(default_factory=ClaimIndex)
    _scopes: tuple[str | None, ...] = ()
    _keep: Callable[[str], bool] = lambda _: True
    _streams: list[Stream] = field(default_factory=list)
    _held: dict[str, Body] = field(default_factory=dict)
    """Every pool the streams have, by uid (for a relist to find those deleted in a gap)."""
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _closed: bool = False

    def __post_init__(self) -> None:
        self._scopes, self._keep = _scopes(self.namespaces)

    def start(self) -> None:
        """Open a stream per scope (a watched namespace, or the whole cluster)."""
        if self._streams or self._closed:
            return
        for scope in self._scopes:

            def deliver(item: Listed | Event, scope: str | None = scope) -> None:
                self._item(scope, item)

            stream = self.open_stream(scope, "", deliver)
            self._streams.append(stream)
            stream.start()

    def ready(self, body: Mapping[str, Any]) -> bool:
        """Always: a pool is fed only once its stream has listed (the claims on its
        targets, all in its namespace, are then known)."""
        return True

    async def close(self) -> None:
        """Close every stream and wait for their threads."""
        self._closed = True
        streams, self._streams = self._streams, []
        for stream in streams:
            stream.stop()
        pending = list(self._tasks)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        await asyncio.gather(*(s.wait_stopped() for s in streams), return_exceptions=True)

    def _item(self, scope: str | None, item: Listed | Event) -> None:
        if self._closed:
            return
        counter = self.metrics.pool_watch_events.labels("all")
        if isinstance(item, Listed):
            counter.inc(len(item.items))
            listed = {_uid(body) for body in item.items}
            for uid, body in list(self._held.items()):
                if uid not in listed and (scope is None or _namespace(body) == scope):
                    self._gone(body)  # deleted while the watch was down: no event came
            bodies = [b for b in item.items if self._keep(_namespace(b))]
            for body in bodies:  # every claim first, then the loops
                self._seen(body)
            for body in bodies:
                self._feed(body)
            return
        counter.inc()
        body = item.object
        if not self._keep(_namespace(body)):
            return
        if item.type == "DELETED":
            self._gone(body)
            return
        self._seen(body)
        self._feed(body)

    def _seen(self, body: Body) -> None:
        self._held[_uid(body)] = body
        self.claims.put(body)
        if self.kube is not None and OLD_FINALIZER in (body["metadata"].get("finalizers") or ()):
            _spawn(self._tasks, self._release(self.kube, body), "release of a finalizer")

    async def _release(self, kube: KubeApi, body: Body) -> None:
        """Take :data:`OLD_FINALIZER` off the pool as seen (a conflict leaves it to the
        next event, which shows the pool as it is then)."""
        meta = body["metadata"]
        keep = [f for f in meta.get("finalizers") or () if f != OLD_FINALIZER]
        patch = {
            "metadata": {"finalizers": keep or None, "resourceVersion": meta["resourceVersion"]}
        }
        try:
            await kube.patch_custom_object(
                GROUP, VERSION, PLURAL, meta["namespace"], meta["name"], patch
            )
        except NotFound:
            return
        except KubeError as exc:
            log.warning(
                "%s/%s: old finalizer not taken off: %s", meta["namespace"], meta["name"], exc
            )
            return
        log.info(
            "%s/%s: old finalizer %s taken off", meta["namespace"], meta["name"], OLD_FINALIZER
        )

    def _feed(self, body: Body) -> None:
        if body["metadata"].get("deletionTimestamp"):
            # Finalizers pending: no more reconciles; its claims stay until it is gone.
            _spawn(self._tasks, self.on_leave(body, "terminating"), "end of a loop")
        else:
            self.on_pool(body)

    def _gone(self, body: Body) -> None:
        """A pool deleted: its loop ends, and its claims go with it."""
        uid = _uid(body)
        self._held.pop(uid, None)
        self.claims.drop(uid)
        _spawn(self._tasks, self.on_leave(body, "deleted"), "end of a loop")


@dataclass
class ShardWatch:
    """The pool streams of one replica with shards (see the module's docstring)."""

    gate: ShardGate
    kube: KubeApi
    metrics: Metrics
    open_stream: StreamFactory
    on_pool: Callable[[Body, bool], None]
    """A pool of a shard served here, as it is now; ``True``: tick soon (just taken over,
    or just ready: :meth:`ready`)."""
    on_leave: Callable[[Body, Leave], Awaitable[None]]
    """A pool whose loop ends here, and why."""
    namespaces: Sequence[str] = ()
    """Watched namespace names or kopf patterns (empty: every namespace)."""
    retry_seconds: float = RELABEL_RETRY_SECONDS
    claims: ClaimIndex = field(default_factory=ClaimIndex)
    _scopes: tuple[str | None, ...] = ()
    _keep: Callable[[str], bool] = lambda _: True
    _streams: dict[tuple[int | None, str | None], Stream] = field(default_factory=dict)
    _watched: set[int] = field(default_factory=set)
    """Shards whose streams are open: those served here, and the secondary shards of the
    pools served here."""
    _held: dict[int, dict[str, Body]] = field(default_factory=dict)
    """Every pool each open shard stream has (primary or secondary there), by uid."""
    _where: dict[str, set[int]] = field(default_factory=dict)
    """The shard streams that have a pool, by uid: its claims and workloads are known
    here while one does."""
    _pools: dict[int, dict[str, Body]] = field(default_factory=dict)
    """Pools served here (primary on a served shard), by shard and uid."""
    _touches: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """The shards each pool served here touches, by uid."""
    _wanted: Counter[int] = field(default_factory=Counter)
    """How many pools served here touch each shard (its stream stays open while any do)."""
    _waiting: dict[str, Body] = field(default_factory=dict)
    """Pools served here not fed to a loop yet: a secondary shard's stream has not listed."""
    _listed: dict[int, set[str | None]] = field(default_factory=dict)
    """The scopes whose stream of the shard has delivered its first list."""
    _foreign: dict[str, Body] = field(default_factory=dict)
    """Pools no label names a primary of (not labelled for this shard count), by uid."""
    _labelling: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _serving: frozenset[int] = frozenset()
    _started: bool = False
    _closed: bool = False

    def __post_init__(self) -> None:
        self._scopes, self._keep = _scopes(self.namespaces)

    @property
    def shards(self) -> int:
        return self.gate.leases.shards

    def touched(self, body: Mapping[str, Any]) -> dict[int, str]:
        meta = body["metadata"]
        return touched_shards(str(meta["namespace"]), body.get("spec") or {}, self.shards)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Open the relabel streams and a stream per shard served now."""
        if self._started or self._closed:
            return
        self._started = True
        for scope in self._scopes:
            self._open(None, scope, relabel_selector(self.shards))
        serving, self._serving = self._serving, frozenset()
        self.follow(serving)

    def follow(self, serving: frozenset[int]) -> None:
        """The shards served here changed: the loops of the lost ones' pools end (the
        shard's Lease hand-over writes or drops what they kept), the pools the gained
        ones' streams already have (watched as secondary shards) are fed, the streams
        follow (:meth:`_streams_follow`), and the waiting pools that fall to the gained
        shards are labelled."""
        if self._closed:
            return
        gained, lost = serving - self._serving, self._serving - serving
        self._serving = serving
        if not self._started:
            return
        for shard in sorted(lost):
            for uid in list(self._pools.get(shard, {})):
                body = self._unserve(shard, uid)
                if body is not None:
                    self._spawn(self.on_leave(body, "unserved"), "end of a loop")
            self._pools.pop(shard, None)
        for shard in sorted(gained):
            self._pools.setdefault(shard, {})
            for body in list(self._held.get(shard, {}).values()):
                self._pool_seen(shard, body, soon=True)
        self._streams_follow()
        for body in list(self._foreign.values()):
            self._label_if_mine(body)

    def _streams_follow(self) -> None:
        """Open the streams of the shards to watch (served, or secondary to a pool served
        here) and close the others'."""
        want = set(self._serving) | {s for s, n in self._wanted.items() if n > 0}
        for shard in sorted(self._watched - want):
            self._watched.discard(shard)
            for scope in self._scopes:
                stream = self._streams.pop((shard, scope), None)
                if stream is not None:
                    stream.stop()
                    self._spawn(stream.wait_stopped(), "close of a shard's watch")
            self._listed.pop(shard, None)
            for body in self._held.pop(shard, {}).values():
                self._unhold(shard, body)
        for shard in sorted(want - self._watched):
            self._watched.add(shard)
            self._held.setdefault(shard, {})
            for scope in self._scopes:
                self._open(shard, scope, shard_selector(shard, self.shards))

    def _serve(self, shard: int, body: Body) -> None:
        """A pool served here, as it is now (the secondary shards it touches are
        watched: :meth:`_streams_follow`)."""
        uid = _uid(body)
        self._pools[shard][uid] = body
        touched = tuple(sorted(self.touched(body)))
        if self._touches.get(uid) != touched:
            self._untouch(uid)
            self._touches[uid] = touched
            self._wanted.update(touched)

    def _unserve(self, shard: int, uid: str) -> Body | None:
        """A pool no longer served here (its body, if it was)."""
        body = self._pools.get(shard, {}).pop(uid, None)
        if body is not None:
            self._waiting.pop(uid, None)
            self._untouch(uid)
        return body

    def _untouch(self, uid: str) -> None:
        self._wanted.subtract(self._touches.pop(uid, ()))
        for shard in [s for s, n in self._wanted.items() if n <= 0]:
            del self._wanted[shard]

    async def close(self) -> None:
        """Close every stream and wait for their threads; cancel pending label writes."""
        self._closed = True
        streams = list(self._streams.values())
        self._streams.clear()
        for stream in streams:
            stream.stop()
        pending = [*self._tasks, *self._labelling.values()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        await asyncio.gather(*(s.wait_stopped() for s in streams), return_exceptions=True)

    def pools(self, shard: int) -> int | None:
        """Pools served on a shard, once its streams have listed them (the weight its
        Lease carries); ``None`` otherwise."""
        if shard not in self._serving or not self._has_listed(shard):
            return None
        return len(self._pools.get(shard, {}))

    def serves_uid(self, uid: str) -> bool:
        """Whether a pool is served here now (on any shard): a loop ended for its old
        shard is the same loop its new one feeds (both served here)."""
        return any(uid in pools for pools in self._pools.values())

    def _has_listed(self, shard: int) -> bool:
        return len(self._listed.get(shard, ())) >= len(self._scopes)

    def ready(self, body: Mapping[str, Any]) -> bool:
        """Whether every shard the pool touches is watched here and listed: only then are
        all the claims on its targets known (a reconcile waits until then)."""
        return all(self._has_listed(shard) for shard in self.touched(body))

    # ------------------------------------------------------------------ streams
    def _open(self, shard: int | None, scope: str | None, selector: str) -> None:
        def deliver(item: Listed | Event) -> None:
            if shard is None:
                self._relabel_item(scope, item)
            else:
                self._shard_item(shard, scope, item)

        stream = self.open_stream(scope, selector, deliver)
        self._streams[(shard, scope)] = stream
        stream.start()

    def _count(self, watch: str, n: int = 1) -> None:
        if n:
            self.metrics.pool_watch_events.labels(watch).inc(n)

    def _shard_item(self, shard: int, scope: str | None, item: Listed | Event) -> None:
        if shard not in self._watched or self._closed:
            return
        held = self._held.setdefault(shard, {})
        if isinstance(item, Listed):
            self._count(str(shard), len(item.items))
            first = scope not in self._listed.setdefault(shard, set())
            self._listed[shard].add(scope)
            listed = {_uid(body) for body in item.items}
            for uid, body in list(held.items()):
                if uid not in listed and (scope is None or _namespace(body) == scope):
                    # Deleted, or moved away, while the watch was down: no event came.
                    self._gone(shard, body, "deleted")
            for body in item.items:
                self._pool_seen(shard, body, soon=first)
            self._feed_ready()
            self._streams_follow()
            return
        self._count(str(shard))
        body = item.object
        if not self._keep(_namespace(body)):
            return
        if item.type == "DELETED":
            if _uid(body) in held:
                labels = (body.get("metadata") or {}).get("labels")
                why: Leave = "deleted" if shard in labelled_shards(labels, self.shards) else "moved"
                self._gone(shard, body, why)
                self._streams_follow()
            return
        self._pool_seen(shard, body, soon=False)
        self._streams_follow()

    def _pool_seen(self, shard: int, body: Body, *, soon: bool) -> None:
        """A pool a shard's stream has: known here (claims, workloads); fed to its loop
        if this replica serves it; relabelled if its labels are not its spec's."""
        if not self._keep(_namespace(body)):
            return
        uid = _uid(body)
        if body["metadata"].get("deletionTimestamp"):
            self._gone(shard, body, "terminating")
            return
        self._held.setdefault(shard, {})[uid] = body
        self._where.setdefault(uid, set()).add(shard)
        self.claims.put(body)
        self.gate.observe(body)
        self._label_if_due(body)
        pools = self._pools.get(shard)
        home = self.gate.shard_of_body(body)
        if home != shard or shard not in self._serving:
            # Secondary here, or its spec moved it: a loop it had here ends.
            if self._unserve(shard, uid) is not None:
                self._spawn(self.on_leave(body, "moved"), "end of a loop")
            return
        assert pools is not None
        fed = uid in pools and uid not in self._waiting
        self._serve(shard, body)
        if fed or self.ready(body):
            self._waiting.pop(uid, None)
            self.on_pool(body, soon)  # a fed pool not ready: its reconcile waits (ready)
        else:
            self._waiting[uid] = body

    def _feed_ready(self) -> None:
        for uid, body in list(self._waiting.items()):
            if self.ready(body):
                del self._waiting[uid]
                self.on_pool(body, True)

    def _gone(self, shard: int, body: Body, why: Leave) -> None:
        """A pool a shard's stream no longer has: its loop ends if it was served here."""
        uid = _uid(body)
        held = self._held.get(shard, {})
        known = held.pop(uid, None)
        if known is not None:
            self._unhold(shard, known)
        if self._unserve(shard, uid) is not None:
            self._spawn(self.on_leave(body, why), "end of a loop")

    def _unhold(self, shard: int, body: Body) -> None:
        uid = _uid(body)
        where = self._where.get(uid, set())
        where.discard(shard)
        if not where:
            self._where.pop(uid, None)
            self.claims.drop(uid)
            self.gate.unwatch(uid)

    def _relabel_item(self, scope: str | None, item: Listed | Event) -> None:
        if self._closed:
            return
        if isinstance(item, Listed):
            self._count("relabel", len(item.items))
            for uid, body in list(self._foreign.items()):
                if scope is None or _namespace(body) == scope:
                    del self._foreign[uid]
            for body in item.items:
                if self._keep(_namespace(body)):
                    self._foreign[_uid(body)] = body
                    self._label_if_mine(body)
            return
        self._count("relabel")
        body = item.object
        if item.type == "DELETED" or not self._keep(_namespace(body)):
            self._foreign.pop(_uid(body), None)
            return
        self._foreign[_uid(body)] = body
        self._label_if_mine(body)

    def _label_if_mine(self, body: Body) -> None:
        if self.gate.leases.serves(self.gate.shard_of_body(body)):
            self._relabel(body)

    def _label_if_due(self, body: Body) -> None:
        if self._due(body) and self._patch(body) is not None:
            self._relabel(body)

    # ------------------------------------------------------------------ labels
    def _patch(self, body: Mapping[str, Any]) -> dict[str, Any] | None:
        meta = body["metadata"]
        return label_patch(
            meta.get("labels"), str(meta["namespace"]), body.get("spec") or {}, self.shards
        )

    def _relabel(self, body: Body) -> None:
        uid = _uid(body)
        running = self._labelling.get(uid)
        if running is not None and not running.done():
            return
        task = asyncio.create_task(self._write_label(body), name=f"label of pool {uid}")
        self._labelling[uid] = task
        task.add_done_callback(lambda _: self._labelling.pop(uid, None))

    def _due(self, body: Body) -> bool:
        """The label write is this replica's to make: it serves the pool's primary
        shard, or the one its labels name as primary."""
        labels = (body.get("metadata") or {}).get("labels")
        named = labelled_shard(labels, self.shards)
        return self.gate.leases.serves(self.gate.shard_of_body(body)) or (
            named is not None and named in self._serving
        )

    async def _write_label(self, body: Body) -> None:
        meta = body["metadata"]
        while not self._closed:
            patch = self._patch(body)
            if patch is None:
                return
            try:
                await self.kube.patch_custom_object(
                    GROUP, VERSION, PLURAL, meta["namespace"], meta["name"], patch
                )
                log.info(
                    "%s/%s: shard labels %s", meta["namespace"], meta["name"], patch["metadata"]
                )
                return
            except NotFound:
                return
            except KubeError as exc:
                log.warning("%s/%s: label not written: %s", meta["namespace"], meta["name"], exc)
            await asyncio.sleep(self.retry_seconds)
            if not self._due(body):
                return

    def _spawn(self, work: Awaitable[None], name: str) -> None:
        _spawn(self._tasks, work, name)
