"""Leader election on a ``coordination.k8s.io/v1`` Lease: one operator replica acts.

The rules are client-go's (``k8s.io/client-go/tools/leaderelection``):

- A candidate takes the Lease when nobody holds it, or when the holder has not renewed it
  for ``leaseDurationSeconds`` *as observed on this candidate's own monotonic clock* (the
  time since the record last changed, so clock skew between nodes does not matter).
- The holder renews every ``retry_period``; it counts as leader only while its last
  successful renewal is younger than ``renew_deadline`` (< lease duration), so it stops
  acting before any other candidate can take over.
- Writes use the Lease's resourceVersion: of two candidates racing, the API server accepts
  one and answers the other 409.
- On a clean stop the holder releases the Lease (empty holder), so a standby replica takes
  over within one retry period instead of waiting out the lease.

One :class:`LeaseElector` holds one Lease: the leader Lease (:meth:`LeaseElector.run`), or
one shard or member slot among many (:class:`prescaler.kube.ShardLeases` drives several,
reading them with one list and handing each its object: :meth:`LeaseElector.observe`,
``try_acquire_or_renew(listed)``).

Why not ``kubernetes.leaderelection``: its loop cannot be stopped or release the Lease, and
its lock uses the process-global client configuration.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

log = logging.getLogger("prescaler.leader")

READ: Any = object()
"""``try_acquire_or_renew``'s default: read the Lease first (else: the Lease as listed,
``None`` when the list did not have it)."""


@dataclass(frozen=True, slots=True)
class LeaseTimings:
    """client-go's defaults: 15 s lease, 10 s renew deadline, 2 s retry (validated where
    they are configured, :class:`prescaler.settings.LeaderSettings`)."""

    lease_duration_seconds: float = 15.0
    renew_deadline_seconds: float = 10.0
    retry_period_seconds: float = 2.0

    @property
    def call_timeout(self) -> tuple[float, float]:
        """The ``_request_timeout`` (connect, read) of each Lease call. An attempt is a
        read and a write, so it ends within the renew deadline, as client-go bounds each
        attempt by it: a hung connection costs a renewal, never the replica's place in
        the election (its next attempt, a retry period later, can win the Lease back)."""
        half = self.renew_deadline_seconds / 2
        return (half, half)


@dataclass(frozen=True, slots=True)
class Observed:
    """The Lease as last read, and when (this process's monotonic clock) it last changed."""

    holder: str | None
    renew_time: str | None
    duration_seconds: float
    changed_at: float


def _now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class LeaseElector:
    """Holds (or waits for) one Lease; :meth:`is_leader` gates every write the operator makes."""

    coordination: Any
    """A ``CoordinationV1Api``."""
    namespace: str
    name: str
    identity: str
    timings: LeaseTimings = field(default_factory=LeaseTimings)
    clock: Callable[[], float] = time.monotonic
    on_change: Callable[[bool], None] | None = None
    """Called with the new state whenever this candidate gains or loses the lead."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Labels of the Lease when this candidate creates it."""
    annotations: Callable[[], Mapping[str, str]] | None = None
    """Annotations this candidate writes on the Lease with every renewal (e.g. what the
    shard weighs, for the replicas that do not hold it)."""
    _observed: Observed | None = None
    _renewed_at: float | None = None
    _leading: bool = False
    _pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="lease")
    )

    @classmethod
    def for_client(
        cls, api_client: client.ApiClient, namespace: str, name: str, identity: str, **kw: Any
    ) -> LeaseElector:
        return cls(client.CoordinationV1Api(api_client), namespace, name, identity, **kw)

    # ------------------------------------------------------------------ state
    def is_leader(self) -> bool:
        """True while this candidate holds the Lease and renewed it within the deadline."""
        if self._renewed_at is None:
            return False
        return self.clock() - self._renewed_at < self.timings.renew_deadline_seconds

    @property
    def holder(self) -> str | None:
        return self._observed.holder if self._observed is not None else None

    def available(self) -> bool:
        """As last observed, nobody else holds the Lease: it is free, ours, missing, or its
        holder has not renewed it for its duration (on this candidate's clock)."""
        seen = self._observed
        if seen is None or seen.holder in (None, self.identity):
            return True
        return self.clock() - seen.changed_at >= seen.duration_seconds

    def observe(self, lease: Any) -> None:
        """Record the Lease as listed (``None``: it does not exist) without writing, so
        that its expiry is judged from when its record last changed."""
        if lease is None:
            self._observed = None
            return
        spec = lease.spec or client.V1LeaseSpec()
        self._see(spec, self.clock())

    # ------------------------------------------------------------------ loop
    async def run(self, stop: asyncio.Event) -> None:
        """Acquire and renew until ``stop`` is set, then release the Lease if held."""
        try:
            while not stop.is_set():
                ok = await self._step()
                self._set_leading(ok and self.is_leader())
                delay = self.timings.retry_period_seconds
                if not self._leading:
                    delay *= 1.0 + random.uniform(0.0, 0.2)  # jitter followers
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=delay)
        finally:
            if self._renewed_at is not None:
                with contextlib.suppress(Exception):
                    await asyncio.get_running_loop().run_in_executor(self._pool, self.release)
            self._renewed_at = None
            self._set_leading(False)
            self._pool.shutdown(wait=False, cancel_futures=True)

    async def _step(self) -> bool:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, self.try_acquire_or_renew)
        except Exception as exc:  # a failed renewal must never stop the loop
            log.warning("lease %s/%s: %s", self.namespace, self.name, exc)
            return False

    def _set_leading(self, leading: bool) -> None:
        if leading != self._leading:
            self._leading = leading
            log.info(
                "%s %s the lead (lease %s/%s)",
                self.identity,
                "took" if leading else "lost",
                self.namespace,
                self.name,
            )
            if self.on_change is not None:
                self.on_change(leading)

    # ------------------------------------------------------------------ one attempt
    def try_acquire_or_renew(self, listed: Any = READ) -> bool:
        """One client-go attempt (blocking): True if this candidate holds the Lease now.
        ``listed``: the Lease as just listed (``None``: not there), instead of a read."""
        now = self.clock()
        lease = listed
        if listed is READ:
            try:
                lease = self.coordination.read_namespaced_lease(
                    self.name, self.namespace, _request_timeout=self.timings.call_timeout
                )
            except ApiException as exc:
                if exc.status != 404:
                    raise
                lease = None
        if lease is None:
            return self._create(now)
        spec = lease.spec or client.V1LeaseSpec()
        seen = self._see(spec, now)
        if seen.holder not in (None, self.identity) and now - seen.changed_at < (
            seen.duration_seconds
        ):
            return False  # someone else holds an unexpired lease
        holder = seen.holder
        stamp = _now_micro()
        if holder != self.identity:
            spec.acquire_time = stamp
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
        spec.holder_identity = self.identity
        spec.lease_duration_seconds = int(self.timings.lease_duration_seconds)
        spec.renew_time = stamp
        lease.spec = spec
        if self.annotations is not None:
            meta = lease.metadata or client.V1ObjectMeta()
            meta.annotations = {**(meta.annotations or {}), **self.annotations()}
            lease.metadata = meta
        try:
            self.coordination.replace_namespaced_lease(
                self.name, self.namespace, lease, _request_timeout=self.timings.call_timeout
            )
        except ApiException as exc:
            if exc.status == 409:  # another candidate wrote first
                return False
            raise
        self._observed = Observed(self.identity, stamp, seen.duration_seconds, now)
        self._renewed_at = now
        return True

    def _see(self, spec: Any, now: float) -> Observed:
        """The Lease's record as observed now; its change time moves only when it changed."""
        holder = spec.holder_identity or None
        renew = _iso(spec.renew_time)
        duration = float(spec.lease_duration_seconds or self.timings.lease_duration_seconds)
        seen = self._observed
        if seen is None or (seen.holder, seen.renew_time) != (holder, renew):
            seen = Observed(holder, renew, duration, now)
            self._observed = seen
        return seen

    def _create(self, now: float) -> bool:
        stamp = _now_micro()
        body = client.V1Lease(
            metadata=client.V1ObjectMeta(
                name=self.name,
                namespace=self.namespace,
                labels=dict(self.labels) or None,
                annotations=dict(self.annotations()) if self.annotations is not None else None,
            ),
            spec=client.V1LeaseSpec(
                holder_identity=self.identity,
                lease_duration_seconds=int(self.timings.lease_duration_seconds),
                acquire_time=stamp,
                renew_time=stamp,
                lease_transitions=0,
            ),
        )
        try:
            self.coordination.create_namespaced_lease(
                self.namespace, body, _request_timeout=self.timings.call_timeout
            )
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        self._observed = Observed(self.identity, stamp, self.timings.lease_duration_seconds, now)
        self._renewed_at = now
        return True

    def release(self) -> None:
        """Give the Lease up (client-go's ReleaseOnCancel; blocking): empty holder, 1 s
        duration. This candidate stops counting as its holder first, whatever the write's
        outcome."""
        self._renewed_at = None
        timeout = self.timings.call_timeout
        lease = self.coordination.read_namespaced_lease(
            self.name, self.namespace, _request_timeout=timeout
        )
        spec = lease.spec
        if spec is None or spec.holder_identity != self.identity:
            return
        spec.holder_identity = None
        spec.lease_duration_seconds = 1
        spec.renew_time = _now_micro()
        self.coordination.replace_namespaced_lease(
            self.name, self.namespace, lease, _request_timeout=timeout
        )
        self._observed = None
        log.info("%s released lease %s/%s", self.identity, self.namespace, self.name)


def _iso(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)
