"""The pools' last plans, as any operator replica reads them: from the API server.

The replica that reconciles a pool (its shard's, or the leader) writes the plan into the
pool's ``status``; every replica may be asked for it. A read is one GET of the pool, kept
for ``cache_seconds`` so that KEDA's calls for one pool (``IsActive``, ``GetMetrics``, the
HPA's metric reads, a push stream's checks) cost the API server one read per period
whichever replica answers, and concurrent calls share one read.

Any client of the scaler may name any pool, so a name costs the API server a read only
within bounds. A pool this reader has found before (a *known* pool) is read at once. A
name it has not found before is looked up through a narrow lane: at most
``unknown_reads`` such GETs at a time and ``unknown_queue`` waiting, beyond which the
call is refused at once (``RESOURCE_EXHAUSTED``) without a read; a name found missing is
answered "not found" for ``not_found_seconds`` without another read. A flood of calls for
names that do not exist therefore neither queues in front of the known pools' reads nor
grows without end: the known and the missing names kept are bounded by
``remembered_pools`` each (the least recently used go first).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from prescaler.api import GROUP, PLURAL, VERSION
from prescaler.kube import KubeError, NotFound
from prescaler.scaler._answers import ScalerError

Key = tuple[str, str]


class CustomObjectReader(Protocol):
    """The one call the scaler makes to the API server."""

    async def get_custom_object(
        self, group: str, version: str, plural: str, namespace: str, name: str
    ) -> dict[str, Any]: ...


class PoolReader:
    """Pool objects by namespace and name, read through a short cache, with the reads of
    names not found before bounded (module docstring)."""

    def __init__(
        self,
        kube: CustomObjectReader,
        cache_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        *,
        not_found_seconds: float = 10.0,
        unknown_reads: int = 2,
        unknown_queue: int = 64,
        remembered_pools: int = 10_000,
    ) -> None:
        self._kube = kube
        self._cache_seconds = cache_seconds
        self._clock = clock
        self._not_found_seconds = not_found_seconds
        self._unknown_gate = asyncio.Semaphore(unknown_reads)
        self._unknown_queue = unknown_queue
        self._unknown_waiting = 0
        self._remembered = remembered_pools
        self._kept: dict[Key, tuple[float, asyncio.Future[Mapping[str, Any] | None]]] = {}
        """The last read of each pool (a task while it runs), with when it began."""
        self._known: OrderedDict[Key, None] = OrderedDict()
        self._missing: OrderedDict[Key, float] = OrderedDict()

    async def get(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The pool object, or ``None`` when it does not exist. An API error is a
        :class:`ScalerError` (``UNAVAILABLE``), never cached; a lookup of a name not found
        before while that lane is full is one too (``RESOURCE_EXHAUSTED``).

        The read runs in a task of its own, shared by every call for the pool until it
        ends: a caller that goes away does not cancel the others' read."""
        key = (namespace, name)
        now = self._clock()
        kept = self._kept.get(key)
        if kept is not None:
            at, read = kept
            failed = read.done() and (read.cancelled() or read.exception() is not None)
            if not read.done() or (not failed and now - at <= self._cache_seconds):
                return await asyncio.shield(read)
        missing_since = self._missing.get(key)
        if missing_since is not None and now - missing_since <= self._not_found_seconds:
            return None
        waiting: list[bool] = []
        if key not in self._known:
            if self._unknown_waiting >= self._unknown_queue:
                raise ScalerError(
                    "RESOURCE_EXHAUSTED",
                    f"too many lookups of pools not seen before ({self._unknown_queue} "
                    "waiting); retry later",
                )
            self._unknown_waiting += 1  # counted now: a burst in one turn sees the queue
            waiting.append(True)

        def served(_: object = None) -> None:
            if waiting:
                waiting.clear()
                self._unknown_waiting -= 1

        read = asyncio.ensure_future(self._fetch(key, served if waiting else None))
        read.add_done_callback(_retrieved)
        read.add_done_callback(served)  # a read cancelled before it began waiting
        self._kept[key] = (now, read)
        self._forget_old(now)
        return await asyncio.shield(read)

    async def _fetch(self, key: Key, served: Callable[[], None] | None) -> Mapping[str, Any] | None:
        """One read of ``key``; ``served`` is given for a name not found before, which
        waits its turn in that lane (and says when it got it)."""
        try:
            if served is None:
                body = await self._read(*key)
            else:
                try:
                    await self._unknown_gate.acquire()
                finally:
                    served()
                try:
                    body = await self._read(*key)
                finally:
                    self._unknown_gate.release()
        except BaseException:
            kept = self._kept.get(key)
            if kept is not None and kept[1] is asyncio.current_task():
                del self._kept[key]
            raise
        self._remember(key, body is not None)
        return body

    async def _read(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        try:
            return await self._kube.get_custom_object(GROUP, VERSION, PLURAL, namespace, name)
        except NotFound:
            return None
        except KubeError as exc:
            raise ScalerError(
                "UNAVAILABLE", f"cannot read InferencePool {namespace}/{name}: {exc}"
            ) from None

    def _remember(self, key: Key, found: bool) -> None:
        """Keep ``key`` among the known pools (found) or the missing names (not found),
        each bounded to ``remembered_pools``, least recently used out first."""
        if found:
            self._missing.pop(key, None)
            self._known[key] = None
            self._known.move_to_end(key)
            while len(self._known) > self._remembered:
                self._known.popitem(last=False)
        else:
            self._known.pop(key, None)
            self._missing[key] = self._clock()
            self._missing.move_to_end(key)
            while len(self._missing) > self._remembered:
                self._missing.popitem(last=False)

    def _forget_old(self, now: float) -> None:
        """Drop the reads done longer ago than the cache period, and the oldest missing
        names past theirs."""
        for old in [
            k
            for k, (at, future) in self._kept.items()
            if future.done() and now - at > self._cache_seconds
        ]:
            del self._kept[old]
        while self._missing:
            key, since = next(iter(self._missing.items()))
            if now - since <= self._not_found_seconds:
                break
            del self._missing[key]


def _retrieved(read: asyncio.Future[Any]) -> None:
    """Mark a read's error as retrieved: its callers get it; nobody logs it as lost."""
    if not read.cancelled():
        read.exception()
