"""The pools' last plans, as any operator replica reads them: from the API server.

The replica that reconciles a pool (its shard's, or the leader) writes the plan into the
pool's ``status``; every replica may be asked for it. A read is one GET of the pool, kept
for ``cache_seconds`` so that KEDA's calls for one pool (``IsActive``, ``GetMetrics``, the
HPA's metric reads, a push stream's checks) cost the API server one read per period
whichever replica answers, and concurrent calls share one read.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from prescaler.api import GROUP, PLURAL, VERSION
from prescaler.kube import KubeError, NotFound
from prescaler.scaler._answers import ScalerError


class CustomObjectReader(Protocol):
    """The one call the scaler makes to the API server."""

    async def get_custom_object(
        self, group: str, version: str, plural: str, namespace: str, name: str
    ) -> dict[str, Any]: ...


class PoolReader:
    """Pool objects by namespace and name, read through a short cache."""

    def __init__(
        self,
        kube: CustomObjectReader,
        cache_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube = kube
        self._cache_seconds = cache_seconds
        self._clock = clock
        self._kept: dict[tuple[str, str], tuple[float, asyncio.Future[Mapping[str, Any] | None]]]
        self._kept = {}

    async def get(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The pool object, or ``None`` when it does not exist. An API error is a
        :class:`ScalerError` (``UNAVAILABLE``), never cached."""
        key = (namespace, name)
        now = self._clock()
        kept = self._kept.get(key)
        if kept is not None and now - kept[0] <= self._cache_seconds:
            future = kept[1]
            if not (future.done() and future.exception() is not None):
                return await asyncio.shield(future)
        future = asyncio.get_running_loop().create_future()
        self._kept[key] = (now, future)
        for old in [k for k, (at, _) in self._kept.items() if now - at > self._cache_seconds]:
            del self._kept[old]
        try:
            body: Mapping[str, Any] | None = await self._kube.get_custom_object(
                GROUP, VERSION, PLURAL, namespace, name
            )
        except NotFound:
            body = None
        except KubeError as exc:
            self._kept.pop(key, None)
            error = ScalerError(
                "UNAVAILABLE", f"cannot read InferencePool {namespace}/{name}: {exc}"
            )
            future.set_exception(error)
            future.exception()  # retrieved: waiters get it, nobody logs it as lost
            raise error from None
        except BaseException:
            self._kept.pop(key, None)
            future.cancel()
            raise
        future.set_result(body)
        return body
