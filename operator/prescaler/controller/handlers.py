"""kopf handlers: the only module with ``@kopf.on.*``. Each is a few lines; the work is in
:mod:`prescaler.controller.reconcile`. Also kopf's own settings (:func:`configure_kopf`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import kopf

from prescaler.api import GROUP, PLURAL, VERSION
from prescaler.controller.loops import Loops, Sweep
from prescaler.controller.model import (
    PoolGone,
    PoolObject,
    TargetClaim,
    target_claims,
    target_owner,
)
from prescaler.controller.watch import Leave, ShardWatch, StreamFactory
from prescaler.kube import KubeError

if TYPE_CHECKING:
    from prescaler.controller.prewarm import Prewarmer
    from prescaler.controller.reconcile import Reconciler
    from prescaler.controller.shards import ShardGate

Claims = Mapping[Any, Collection[TargetClaim]]
"""Target -> the claims of the pools on it: kopf's index of every pool, or (with shards)
the watch's of the pools of the shards served here (all the pools on their targets)."""
Seen = tuple[Mapping[str, Any], Claims]
"""What a pool's loop ticks with: its latest body and the claims on its targets."""


log = logging.getLogger("prescaler.handlers")

KICK_SPREAD_SECONDS = 2.0
"""The pools of a shard just taken over tick within this long (or an eighth of the period,
if shorter): soon, but not all in one burst."""


def _pool(kwargs: dict[str, Any], superseded_by: str | None = None) -> PoolObject:
    body = kwargs["body"]
    return PoolObject(
        namespace=body["metadata"]["namespace"],
        name=body["metadata"]["name"],
        uid=body["metadata"]["uid"],
        generation=body["metadata"].get("generation"),
        spec=dict(body.get("spec") or {}),
        status=dict(body.get("status") or {}),
        superseded_by=superseded_by,
        resource_version=body["metadata"].get("resourceVersion"),
    )


def _key(body: Mapping[str, Any]) -> str:
    """A pool's loop key: namespace, name and uid (a pool recreated under its name is
    another loop)."""
    meta = body["metadata"]
    return f"{meta['namespace']}/{meta['name']} ({meta['uid']})"


def configure_kopf(kopf_settings: kopf.OperatorSettings, namespaces: Sequence[str] = ()) -> None:
    """Keep kopf's own marks on our objects to what it needs, under our own prefix, and its
    API calls to what the Helm chart's RBAC grants."""
    # No handler needs a finalizer (kopf adds one only for timers, daemons and on.delete).
    # Named, so that kopf takes off the one an older operator version put on a pool.
    kopf_settings.persistence.finalizer = "prescaler.io/finalizer"
    kopf_settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix="prescaler.io"
    )
    kopf_settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="prescaler.io", key="last-handled-configuration"
    )
    kopf_settings.posting.level = logging.WARNING
    kopf_settings.watching.server_timeout = 300
    kopf_settings.networking.request_timeout = 60
    # kopf's runtime scanning lists and watches CRDs (and, unless cluster-wide, namespaces)
    # across the cluster, to follow namespace patterns and CRD changes. Plain names or the
    # whole cluster need neither (the chart installs the CRD before the operator starts).
    kopf_settings.scanning.disabled = not any(set("!*?,") & set(ns) for ns in namespaces)


def register(
    registry: kopf.OperatorRegistry,
    reconciler: Reconciler,
    interval: float,
    is_leader: Callable[[], bool] | None = None,
    namespaces: Sequence[str] = (),
    prewarmer: Prewarmer | None = None,
    shards: ShardGate | None = None,
    streams: StreamFactory | None = None,
) -> None:
    """Register the handlers of one operator run on ``registry``: ``reconciler`` serves
    every pool once per ``interval`` seconds, while ``is_leader()`` (if given) says this
    replica holds the leader Lease, or (with ``shards``) while it holds the pool's shard;
    otherwise the replica only watches. ``namespaces`` are
    the watched names or kopf patterns (empty: cluster-wide). ``prewarmer`` (if given)
    sees every pod event in them: it decides which pods to warm, and acts if leader.

    With ``shards`` and ``streams``, the pools are not watched by kopf but by a
    :class:`~prescaler.controller.watch.ShardWatch` over ``streams``: only those of the
    shards this replica serves, selected by label on the API server."""

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # In-cluster service account, else KUBECONFIG (read now, not at import time).
        info: kopf.ConnectionInfo | None = kopf.login_with_service_account(**kwargs)
        return info or kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure_kopf(settings, namespaces)

    # Each pool's own reconcile loop (controller/loops.py), fed by raw watch events. Not a
    # kopf timer: kopf puts a finalizer on every object a timer serves, so a pool, or its
    # namespace, could not be deleted while no operator ran.
    async def reconcile(seen: Seen) -> None:
        body, claims = seen
        if is_leader is not None and not is_leader():
            return  # a standby replica: no reads, no writes
        if watch is not None and not watch.ready(body):
            return  # a shard it touches is not listed yet: claims on its targets unknown
        keys, me = target_claims(body)
        owner = next(
            (o for key in keys if (o := target_owner(me, claims.get(key, []))) is not None), None
        )
        pool = _pool({"body": body}, superseded_by=owner)
        try:
            if shards is None:
                await reconciler.run(pool)
                return
            with shards.acting(pool) as mine:
                if mine is not None:  # else another replica serves its shard
                    await reconciler.run(mine)
        except PoolGone as exc:
            log.info("%s: its loop ends", exc)
            loops.discard(_key(body))
            gone(seen)

    def gone(seen: Seen) -> None:
        pool = _pool({"body": seen[0]})
        reconciler.forget(pool)
        if shards is not None:
            shards.forget(pool)

    async def list_uids(namespace: str | None) -> set[str]:
        return await reconciler.kube.list_custom_object_uids(GROUP, VERSION, PLURAL, namespace)

    loops: Loops[Seen] = Loops(interval, reconcile, name="reconcile of pool", expected=(KubeError,))
    # A pool deleted while the watch was down sends no DELETED event: after a relist, the
    # loops of pools the API server no longer has end.
    sweep = Sweep(
        loops,
        uid_of=lambda seen: str(seen[0]["metadata"]["uid"]),
        scope_of=lambda seen: str(seen[0]["metadata"]["namespace"]) if namespaces else None,
        list_uids=list_uids,
        gone=gone,
    )
    watch: ShardWatch | None = None
    if shards is not None and streams is not None:
        watch = _shard_watch(shards, reconciler, loops, interval, namespaces, streams)

        @kopf.on.startup(registry=registry)
        async def watch_shards(**_: Any) -> None:  # on the event loop: streams hand to it
            if watch is not None:
                watch.start()

    else:
        if shards is not None:
            gate = shards

            def taken_over(gained: frozenset[int]) -> None:
                # Spread a little: a shard's pools do not all tick at once.
                spread = min(interval / 8, KICK_SPREAD_SECONDS)
                loops.kick(lambda seen: gate.shard_of_body(seen[0]) in gained, within=spread)

            gate.on_gained = taken_over

        # Which pools claim which target, kept from the watch stream (no extra API calls).
        # The id names the kwarg the index arrives as (a nested function's default is its
        # qualname).
        @kopf.index(GROUP, VERSION, PLURAL, registry=registry, id="pools_by_target")
        def pools_by_target(body: kopf.Body, **_: Any) -> dict[Any, TargetClaim]:
            keys, claim = target_claims(body)
            return dict.fromkeys(keys, claim)

        events = reconciler.metrics.pool_watch_events.labels("all")

        # A raw watch event, not on.delete: no finalizer, diffbase or progress annotations.
        @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
        async def follow(type: str | None, body: kopf.Body, **kwargs: Any) -> None:
            events.inc()
            key = _key(body)
            if type is None and key in loops:  # a relist (after a watch gap), not the first
                sweep.listed()
            if type != "DELETED" and not body["metadata"].get("deletionTimestamp"):
                loops.feed(key, (body, kwargs["pools_by_target"]))
                if shards is not None:
                    shards.observe(body)  # which workloads its pool scales
                return
            await loops.stop(key)  # after its running reconcile, if one runs
            if type == "DELETED":
                gone((body, kwargs["pools_by_target"]))

    @kopf.on.cleanup(registry=registry)
    async def stop_loops(**_: Any) -> None:
        if watch is not None:
            await watch.close()
        await sweep.close()
        await loops.close()
        if shards is not None:
            await reconciler.flush(only=shards.serves_pool)  # only the shards still held
        elif is_leader is None or is_leader():
            await reconciler.flush()  # the statuses kept back, so a successor goes on

    if prewarmer is not None:
        # A raw watch event: kopf writes nothing to the pods (no finalizer, no annotation).
        @kopf.on.event("v1", "pods", registry=registry)
        async def pods(type: str | None, body: kopf.Body, **_: Any) -> None:
            prewarmer.observe(type, body)


def _shard_watch(
    gate: ShardGate,
    reconciler: Reconciler,
    loops: Loops[Seen],
    interval: float,
    namespaces: Sequence[str],
    streams: StreamFactory,
) -> ShardWatch:
    """The pools of the shards this replica serves, fed to their loops."""
    # The pools of a shard just taken over tick soon, but not all at once.
    spread = min(interval / 8, KICK_SPREAD_SECONDS)

    def on_pool(body: Mapping[str, Any], soon: bool) -> None:
        loops.feed(_key(body), (body, watch.claims), within=spread if soon else None)

    async def on_leave(body: Mapping[str, Any], why: Leave) -> None:
        # What the replica knows of the pool's targets and workloads (claims, gated pods)
        # is the watch's to keep: it may still see the pool on another shard.
        key = _key(body)
        if why != "terminating" and watch.serves_uid(str(body["metadata"]["uid"])):
            return  # its primary moved to another shard served here, which feeds it now
        if why == "unserved":
            # The shard's hand-over (ShardGate.release or .lost) writes or drops what its
            # pools kept; a reconcile running now is waited for there.
            loops.discard(key)
            return
        await loops.stop(key)  # after its running reconcile, if one runs
        if why != "terminating":
            pool = _pool({"body": body})
            reconciler.forget(pool)
            gate.drop(pool)

    watch = ShardWatch(
        gate,
        reconciler.kube,
        reconciler.metrics,
        streams,
        on_pool=on_pool,
        on_leave=on_leave,
        namespaces=namespaces,
    )
    gate.on_serving = watch.follow
    gate.leases.pools = watch.pools
    return watch
