"""kopf handlers: the only module with ``@kopf.on.*``. Each is a few lines; the work is in
:mod:`prescaler.controller.reconcile`. Also kopf's own settings (:func:`configure_kopf`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import kopf

from prescaler.controller.loops import Loops
from prescaler.controller.model import (
    PoolGone,
    PoolObject,
    TargetClaim,
    target_claims,
    target_owner,
)
from prescaler.controller.watch import (
    OLD_FINALIZER,
    Leave,
    PoolWatch,
    ShardWatch,
    StreamFactory,
)
from prescaler.kube import KubeError

if TYPE_CHECKING:
    from prescaler.controller.prewarm import Prewarmer
    from prescaler.controller.reconcile import Reconciler
    from prescaler.controller.shards import ShardGate

Claims = Mapping[Any, Collection[TargetClaim]]
"""Target -> the claims of the pools on it, kept by the pools' watch: of every watched pool,
or (with shards) of the pools on the targets of the shards served here."""
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
    # No handler needs a finalizer (kopf adds one only for timers, daemons and on.delete),
    # and kopf watches no pool: the pools' watch takes off the one older versions put on.
    kopf_settings.persistence.finalizer = OLD_FINALIZER
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
    *,
    streams: StreamFactory,
) -> None:
    """Register the handlers of one operator run on ``registry``: ``reconciler`` serves
    every pool once per ``interval`` seconds, while ``is_leader()`` (if given) says this
    replica holds the leader Lease, or (with ``shards``) while it holds the pool's shard;
    otherwise the replica only watches. ``namespaces`` are
    the watched names or kopf patterns (empty: cluster-wide). ``prewarmer`` (if given)
    sees every pod event in them: it decides which pods to warm, and acts if leader.

    The pools are not watched by kopf but over ``streams`` (list-and-watch streams): every
    watched pool (:class:`~prescaler.controller.watch.PoolWatch`), or with ``shards`` only
    those of the shards this replica serves, selected by label on the API server
    (:class:`~prescaler.controller.watch.ShardWatch`). Both keep the claims on each target
    from their own streams: kopf's index would hold every handler until every pool was
    indexed, at a cost quadratic in the pools."""

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # In-cluster service account, else KUBECONFIG (read now, not at import time).
        info: kopf.ConnectionInfo | None = kopf.login_with_service_account(**kwargs)
        return info or kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure_kopf(settings, namespaces)

    # Each pool's own reconcile loop (controller/loops.py), fed by the pools' watch. Not a
    # kopf timer: kopf puts a finalizer on every object a timer serves, so a pool, or its
    # namespace, could not be deleted while no operator ran.
    async def reconcile(seen: Seen) -> None:
        body, claims = seen
        if is_leader is not None and not is_leader():
            return  # a standby replica: no reads, no writes
        if not watch.ready(body):
            return  # a stream it needs has not listed yet: claims on its targets unknown
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

    loops: Loops[Seen] = Loops(interval, reconcile, name="reconcile of pool", expected=(KubeError,))
    watch: ShardWatch | PoolWatch
    if shards is not None:
        watch = _shard_watch(shards, reconciler, loops, interval, namespaces, streams)
    else:
        watch = _pool_watch(reconciler, loops, gone, namespaces, streams)

    @kopf.on.startup(registry=registry)
    async def start_watch(**_: Any) -> None:  # on the event loop: the streams hand to it
        watch.start()

    @kopf.on.cleanup(registry=registry)
    async def stop_loops(**_: Any) -> None:
        await watch.close()
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


def _pool_watch(
    reconciler: Reconciler,
    loops: Loops[Seen],
    gone: Callable[[Seen], None],
    namespaces: Sequence[str],
    streams: StreamFactory,
) -> PoolWatch:
    """Every watched pool, fed to its loop."""

    def on_pool(body: Mapping[str, Any]) -> None:
        loops.feed(_key(body), (body, watch.claims))

    async def on_leave(body: Mapping[str, Any], why: Leave) -> None:
        await loops.stop(_key(body))  # after its running reconcile, if one runs
        if why == "deleted":
            gone((body, watch.claims))

    watch = PoolWatch(
        reconciler.metrics,
        streams,
        on_pool=on_pool,
        on_leave=on_leave,
        namespaces=namespaces,
        kube=reconciler.kube,
    )
    return watch


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
