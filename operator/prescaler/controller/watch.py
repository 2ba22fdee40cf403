"""With shards, each replica watches only the pools of the shards it serves.

Every pool carries its shard as a label (:data:`prescaler.sharding.SHARD_LABEL`, e.g.
``prescaler.io/shard: 3-of-6``), so a replica asks the API server for those pools only:
one list-and-watch (:class:`prescaler.kube.ObjectStream`) per shard it serves (per watched
namespace), opened when it takes the shard and closed when it stops serving it. Three
replicas then decode a third of the pools' events each, where each decoded all of them
through kopf (whose ``labels=`` filter runs on the client, after the decoding).

:class:`ShardWatch` keeps the labels current, and turns the streams into the pools' loops:

- **Labels.** One more stream per replica selects the pools no shard's selector matches
  (:func:`prescaler.sharding.relabel_selector`: new pools, or labelled under another shard
  count); the replica serving a pool's shard labels it, and the pool leaves that stream
  for its shard's. A pool whose spec moves it to another shard (its primary target
  changed) is relabelled by the replica serving the shard its label names. One writer per
  pool: the replica serving its shard, or the one serving the shard its label names.
- **Loops.** A pool of a served shard is fed to its loop (``on_pool``); the pools a new
  stream lists first tick within a short spread (a shard just taken over). A ``DELETED``
  event ends the loop, whether the pool was deleted or left the selector (relabelled, a
  ``DELETED`` with its new labels); a shard no longer served ends its pools' loops (the
  shard's Lease hand-over writes or drops what they kept, :class:`ShardGate`).
- **Relists.** After ``410 Gone`` a stream lists its shard again: a pool it had that the
  list lacks was deleted (or moved) in the gap, and its loop ends. The list is the
  stream's own, so no second list is needed (kopf's path runs a :class:`Sweep`).
- **Target claims.** The pools of the shards served here, by target: every pool on one
  target is on that target's shard, so the older of two keeps it as without shards.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from prescaler.api import GROUP, PLURAL, VERSION
from prescaler.controller.model import TargetClaim, target_claims
from prescaler.controller.shards import ShardGate
from prescaler.kube import Event, KubeApi, KubeError, Listed, NotFound
from prescaler.metrics import Metrics
from prescaler.sharding import (
    SHARD_LABEL,
    label_patch,
    labelled_shard,
    relabel_selector,
    shard_selector,
)

log = logging.getLogger("prescaler.watch")

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
    """The target claims of the pools watched here, as kopf's index has them for all."""

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


def _uid(body: Mapping[str, Any]) -> str:
    return str(body["metadata"]["uid"])


def _namespace(body: Mapping[str, Any]) -> str:
    return str(body["metadata"]["namespace"])


@dataclass
class ShardWatch:
    """The pool streams of one replica with shards (see the module's docstring)."""

    gate: ShardGate
    kube: KubeApi
    metrics: Metrics
    open_stream: StreamFactory
    on_pool: Callable[[Body, bool], None]
    """A pool of a shard served here, as it is now; ``True``: tick soon (just taken over)."""
    on_leave: Callable[[Body, Leave], Awaitable[None]]
    """A pool whose loop ends here, and why."""
    namespaces: Sequence[str] = ()
    """Watched namespace names or kopf patterns (empty: every namespace)."""
    retry_seconds: float = RELABEL_RETRY_SECONDS
    claims: ClaimIndex = field(default_factory=ClaimIndex)
    _scopes: tuple[str | None, ...] = ()
    _keep: Callable[[str], bool] = lambda _: True
    _streams: dict[tuple[int | None, str | None], Stream] = field(default_factory=dict)
    _pools: dict[int, dict[str, Body]] = field(default_factory=dict)
    """Pools of each shard served here, by uid."""
    _listed: dict[int, set[str | None]] = field(default_factory=dict)
    """The scopes whose stream of the shard has delivered its first list."""
    _foreign: dict[str, Body] = field(default_factory=dict)
    """Pools no shard's selector matches (not labelled for this shard count), by uid."""
    _labelling: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _serving: frozenset[int] = frozenset()
    _started: bool = False
    _closed: bool = False

    def __post_init__(self) -> None:
        names = tuple(self.namespaces)
        if names and not any(set("!*?,") & set(ns) for ns in names):
            self._scopes = names  # one stream per namespace
        else:
            self._scopes = (None,)  # cluster-wide, kept to the patterns here
            self._keep = in_scope(names)

    @property
    def shards(self) -> int:
        return self.gate.leases.shards

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
        """The shards served here changed: open the streams of the gained ones, close
        those of the lost ones (their pools' loops end), and label the waiting pools that
        fall to the gained ones."""
        if self._closed:
            return
        gained, lost = serving - self._serving, self._serving - serving
        self._serving = serving
        if not self._started:
            return
        for shard in sorted(lost):
            for scope in self._scopes:
                stream = self._streams.pop((shard, scope), None)
                if stream is not None:
                    stream.stop()
                    self._spawn(stream.wait_stopped(), "close of a shard's watch")
            self._listed.pop(shard, None)
            for body in self._pools.pop(shard, {}).values():
                self._unwatch(body)
                self._spawn(self.on_leave(body, "unserved"), "end of a loop")
        for shard in sorted(gained):
            self._pools.setdefault(shard, {})
            for scope in self._scopes:
                self._open(shard, scope, shard_selector(shard, self.shards))
        for body in list(self._foreign.values()):
            self._label_if_mine(body)

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
        """Pools of a shard served here, once its streams have listed them (the weight
        its Lease carries); ``None`` otherwise."""
        if shard not in self._serving or len(self._listed.get(shard, ())) < len(self._scopes):
            return None
        return len(self._pools.get(shard, {}))

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
        if shard not in self._serving or self._closed:
            return
        pools = self._pools.setdefault(shard, {})
        if isinstance(item, Listed):
            self._count(str(shard), len(item.items))
            first = scope not in self._listed.setdefault(shard, set())
            self._listed[shard].add(scope)
            listed = {_uid(body) for body in item.items}
            for uid, body in list(pools.items()):
                if uid not in listed and (scope is None or _namespace(body) == scope):
                    # Deleted, or moved away, while the watch was down: no event came.
                    pools.pop(uid, None)
                    self._unwatch(body)
                    self._spawn(self.on_leave(body, "deleted"), "end of a loop")
            for body in item.items:
                self._pool_seen(shard, body, soon=first)
            return
        self._count(str(shard))
        body = item.object
        if not self._keep(_namespace(body)):
            return
        if item.type == "DELETED":
            known = pools.pop(_uid(body), None)
            if known is not None:
                self._unwatch(body)
                labels = (body.get("metadata") or {}).get("labels")
                why: Leave = "deleted" if labelled_shard(labels, self.shards) == shard else "moved"
                self._spawn(self.on_leave(body, why), "end of a loop")
            return
        self._pool_seen(shard, body, soon=False)

    def _pool_seen(self, shard: int, body: Body, *, soon: bool) -> None:
        if not self._keep(_namespace(body)):
            return
        pools = self._pools[shard]
        uid = _uid(body)
        home = self.gate.shard_of_body(body)
        if home != shard:  # its spec moved it: relabel it, it leaves this watch
            self._relabel(body, home)
            if pools.pop(uid, None) is not None:
                self._unwatch(body)
                self._spawn(self.on_leave(body, "moved"), "end of a loop")
            return
        if body["metadata"].get("deletionTimestamp"):
            if pools.pop(uid, None) is not None:
                self._unwatch(body)
                self._spawn(self.on_leave(body, "terminating"), "end of a loop")
            return
        pools[uid] = body
        self.claims.put(body)
        self.gate.observe(body)
        self.on_pool(body, soon)

    def _unwatch(self, body: Body) -> None:
        self.claims.drop(_uid(body))

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
        shard = self.gate.shard_of_body(body)
        if self.gate.leases.serves(shard):
            self._relabel(body, shard)

    # ------------------------------------------------------------------ labels
    def _relabel(self, body: Body, shard: int) -> None:
        uid = _uid(body)
        running = self._labelling.get(uid)
        if running is not None and not running.done():
            return
        task = asyncio.create_task(self._write_label(body, shard), name=f"label of pool {uid}")
        self._labelling[uid] = task
        task.add_done_callback(lambda _: self._labelling.pop(uid, None))

    def _due(self, body: Body, shard: int) -> bool:
        """The label write is still this replica's to make: it serves the pool's shard,
        or the one its label names."""
        labels = (body.get("metadata") or {}).get("labels")
        named = labelled_shard(labels, self.shards)
        return self.gate.leases.serves(shard) or (named is not None and named in self._serving)

    async def _write_label(self, body: Body, shard: int) -> None:
        meta = body["metadata"]
        patch = label_patch(shard, self.shards)
        while not self._closed:
            try:
                await self.kube.patch_custom_object(
                    GROUP, VERSION, PLURAL, meta["namespace"], meta["name"], patch
                )
                log.info(
                    "%s/%s: labelled %s=%s",
                    meta["namespace"],
                    meta["name"],
                    SHARD_LABEL,
                    patch["metadata"]["labels"][SHARD_LABEL],
                )
                return
            except NotFound:
                return
            except KubeError as exc:
                log.warning("%s/%s: label not written: %s", meta["namespace"], meta["name"], exc)
            await asyncio.sleep(self.retry_seconds)
            if not self._due(body, shard):
                return

    def _spawn(self, work: Awaitable[None], name: str) -> None:
        async def run() -> None:
            try:
                await work
            except Exception:
                log.exception("%s failed", name)

        task = asyncio.create_task(run(), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
