"""kopf handlers: the only module with ``@kopf.on.*``. Each is a few lines; the work is in
:mod:`prescaler.reconcile`."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import kopf

from prescaler.api import GROUP, PLURAL, VERSION
from prescaler.kube import KubeError
from prescaler.reconcile import PoolObject, TargetClaim, target_claim, target_owner

if TYPE_CHECKING:
    from prescaler.reconcile_runtime import Runtime


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
    )


def register(registry: kopf.OperatorRegistry, runtime: Runtime) -> None:
    """Register the handlers of one operator run on ``registry``."""
    from prescaler.reconcile_runtime import configure_kopf

    interval = runtime.settings.reconcile.interval_seconds

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # In-cluster service account, else KUBECONFIG (read now, not at import time).
        info: kopf.ConnectionInfo | None = kopf.login_with_service_account(**kwargs)
        return info or kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure_kopf(settings)

    # Which pools claim which target, kept from the watch stream (no extra API calls).
    # The id names the kwarg the index arrives as (a nested function's default is its qualname).
    @kopf.index(GROUP, VERSION, PLURAL, registry=registry, id="pools_by_target")
    def pools_by_target(body: kopf.Body, **_: Any) -> dict[Any, TargetClaim]:
        key, claim = target_claim(body)
        return {key: claim}

    @kopf.timer(
        GROUP,
        VERSION,
        PLURAL,
        registry=registry,
        interval=interval,
        # On the interval grid: a slow reconcile does not push the pool's next one later.
        sharp=True,
        # Spread first runs over one period, so N pools do not fire in one burst.
        initial_delay=lambda **_: random.uniform(0, interval),
    )
    async def reconcile(patch: kopf.Patch, body: kopf.Body, **kwargs: Any) -> None:
        claims: kopf.Index[Any, TargetClaim] = kwargs["pools_by_target"]
        key, me = target_claim(body)
        owner = target_owner(me, claims.get(key, []))
        try:
            pool = _pool({"body": body, **kwargs}, superseded_by=owner)
            patch.status.update(await runtime.reconciler.reconcile(pool))
        except KubeError as exc:
            raise kopf.TemporaryError(str(exc), delay=interval) from exc

    # A raw watch event, not on.delete: no diffbase or progress annotations on the pool.
    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    def forget(type: str | None, **kwargs: Any) -> None:
        if type == "DELETED":
            runtime.reconciler.forget(_pool(kwargs))
