"""The operator process: builds the pipeline from typed settings and runs kopf with it.

``prescaler run`` calls :func:`run_operator`; tests and the benchmark call it too, in a
thread, with a ``stop_flag``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import kopf
from grpc import aio
from kubernetes import client

from prescaler.api import GROUP, PLURAL, VERSION
from prescaler.controller import handlers
from prescaler.controller.calibrate import HistoryCalibrator
from prescaler.controller.fits import FitProcesses
from prescaler.controller.forecast import ForecastHub
from prescaler.controller.keda import TriggerWatch
from prescaler.controller.prewarm import Prewarmer
from prescaler.controller.reconcile import Reconciler
from prescaler.controller.shards import ShardGate
from prescaler.controller.watch import Stream, StreamFactory
from prescaler.kube import (
    Event,
    KubeClient,
    LeaseElector,
    LeaseTimings,
    Listed,
    ObjectStream,
    ShardLeases,
    lease_threads,
    load_api_client,
)
from prescaler.metrics import Metrics
from prescaler.scaler import TlsFiles, external_scaler, start_server
from prescaler.settings import OperatorSettings

log = logging.getLogger("prescaler")

TLS_CLOSE_GRACE_SECONDS = 0.5
"""How long a stopping operator lets closed TLS connections finish closing."""

SCALER_THREADS = 4
"""API client threads of the KEDA external scaler for the pools it knows (one GET per pool
per cache period); the lookups of pools not found before have ``unknown_reads`` more."""
SCALER_GRACE_SECONDS = 1.0
"""How long a stopping operator lets the scaler's calls in flight finish."""

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass
class Runtime:
    """Long-lived objects of one operator run."""

    settings: OperatorSettings
    metrics: Metrics
    reconciler: Reconciler
    kube: KubeClient
    io_pool: ThreadPoolExecutor
    fit_pool: FitProcesses | None
    prewarmer: Prewarmer | None

    @classmethod
    def build(cls, settings: OperatorSettings, metrics: Metrics | None = None) -> Runtime:
        rs = settings.reconcile
        metrics = metrics or Metrics()
        kube = KubeClient(
            load_api_client(rs.kubeconfig, pool_size=rs.kube_threads),
            rs.kube_threads,
            timeout_seconds=rs.kube_timeout_seconds,
        )
        io_pool = ThreadPoolExecutor(max_workers=rs.kube_threads, thread_name_prefix="prom")
        fit_pool = None
        if rs.forecast_workers > 0:
            fit_pool = FitProcesses(
                rs.forecast_workers, nice=rs.fit_worker_nice, memory_mib=rs.fit_memory_mib
            )
        hub = ForecastHub(
            metrics=metrics,
            executor=None,  # with fit processes, fits run there; without, in a thread
            io_executor=io_pool,
            fit_processes=fit_pool,
            wait_seconds=rs.forecast_wait_seconds,
            model_timeout_seconds=rs.forecast_model_timeout_seconds,
            fit_timeout_seconds=rs.forecast_fit_timeout_seconds,
            fit_workers=max(1, rs.forecast_workers),
            fit_queue_limit=rs.fit_queue_limit,
            first_fit_spread_seconds=rs.first_fit_spread_seconds,
            stale_seconds=rs.forecast_stale_seconds,
        )
        ps = settings.prewarm
        prewarmer = None
        if ps.enabled:
            prewarmer = Prewarmer(
                kube,
                metrics,
                concurrency=ps.concurrency,
                unclaimed_seconds=ps.unclaimed_seconds,
                config_map_seconds=ps.config_map_seconds,
            )
        # A replay is minutes of CPU at most: always in a (niced) process of its own, never
        # in a thread beside the reconciles, also when fits run in threads.
        calibrations = fit_pool or FitProcesses(
            1, nice=rs.fit_worker_nice, memory_mib=rs.fit_memory_mib
        )
        calibrator = HistoryCalibrator(
            io_executor=io_pool,
            fit_processes=calibrations,
            timeout_seconds=rs.calibration_timeout_seconds,
            retry_seconds=rs.calibration_timeout_seconds,
        )
        reconciler = Reconciler(
            kube=kube,
            metrics=metrics,
            forecasts=hub,
            calibrator=calibrator,
            io_executor=io_pool,
            prometheus_timeout_seconds=rs.prometheus_timeout_seconds,
            prometheus_max_response_bytes=rs.prometheus_max_response_bytes,
            placeholder_priority_classes=rs.placeholder_priority_classes,
            rate_window=rs.rate_window,
            interval_seconds=rs.interval_seconds,
            policy_check_seconds=rs.policy_check_seconds,
            prewarm=prewarmer,
            keda=TriggerWatch(
                settings.keda.missing_periods, settings.keda.nudge, settings.keda.nudge_seconds
            ),
        )
        return cls(settings, metrics, reconciler, kube, io_pool, fit_pool, prewarmer)

    def close(self) -> None:
        self.reconciler.forecasts.close()
        calibrator = self.reconciler.calibrator
        if calibrator is not None:
            calibrator.close()
            if (
                calibrator.fit_processes is not None
                and calibrator.fit_processes is not self.fit_pool
            ):
                calibrator.fit_processes.shutdown()
        if self.fit_pool is not None:
            self.fit_pool.shutdown()
        self.io_pool.shutdown(wait=False, cancel_futures=True)
        self.kube.close()


async def operate(
    settings: OperatorSettings,
    *,
    stop_flag: asyncio.Event | threading.Event | None = None,
    ready_flag: asyncio.Event | threading.Event | None = None,
    metrics: Metrics | None = None,
) -> None:
    """Run the operator until ``stop_flag`` is set (or forever).

    With leader election on, every replica watches the pools and serves its probes and
    metrics, but only the Lease holder reconciles (:class:`prescaler.kube.LeaseElector`);
    with shards, each replica reconciles the pools of the shards whose Leases it holds
    (:class:`prescaler.kube.ShardLeases`).
    """
    runtime = Runtime.build(settings, metrics)
    if settings.metrics.port > 0:
        runtime.metrics.serve(settings.metrics.port, settings.metrics.host)
    try:
        scaler = await serve_scaler(settings, runtime.metrics)
    except BaseException:
        runtime.close()  # e.g. the scaler's port is taken: nothing else started yet
        raise
    gate = shard_gate(settings, runtime)
    elector = leader_elector(settings, runtime) if gate is None else None
    election_stop = asyncio.Event()
    election: asyncio.Task[None] | None = None
    if elector is not None:
        election = asyncio.create_task(elector.run(election_stop), name="leader election")
    if gate is not None:
        election = asyncio.create_task(gate.leases.run(election_stop), name="shard leases")
    prewarmer = runtime.prewarmer
    if prewarmer is not None:
        if elector is not None:
            prewarmer.is_leader = elector.is_leader
        if gate is not None:
            # Each replica warms the pods its own pools claim; a gated pod that no pool
            # of its own claims is its pool's replica's, or (no pool scales it) the
            # sweeper's, which releases it after the grace.
            serving = gate.leases.serving
            prewarmer.is_leader = lambda: bool(serving())
            prewarmer.owns_unclaimed = gate.owns_pod
        prewarmer.start()
    streams = pool_streams(settings, gate)
    registry = kopf.OperatorRegistry()
    handlers.register(
        registry,
        runtime.reconciler,
        settings.reconcile.interval_seconds,
        is_leader=elector.is_leader if elector is not None else None,
        namespaces=settings.watch.namespaces,
        prewarmer=prewarmer,
        shards=gate,
        streams=streams[0],
    )
    if scaler is not None:
        server = scaler[0]

        # Before kopf cancels the tasks started after it (the scaler's calls among them).
        @kopf.on.cleanup(registry=registry)
        async def stop_scaler(**_: object) -> None:
            await server.stop(SCALER_GRACE_SECONDS)

        # The scaler listens before kopf serves the health endpoint (it started above), and
        # the endpoint fails while it does not: the readiness probe keeps a replica whose
        # scaler does not answer out of the scaler's Service, so KEDA is never pointed at
        # it, and the liveness probe restarts it.
        kopf.on.probe(id="scaler", registry=registry)(scaler_probe(settings.scaler.host, scaler[2]))

    try:
        await kopf.operator(
            registry=registry,
            clusterwide=settings.clusterwide,
            namespaces=list(settings.watch.namespaces),
            standalone=True,  # no kopf peering: the Lease decides who acts
            liveness_endpoint=settings.liveness_endpoint,
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )
    finally:
        if scaler is not None:
            await scaler[0].stop(None)  # stopped already, unless kopf never got to clean up
            scaler[1].close()
        # Warm-ups end first (their connections close), while the API is still reachable.
        if prewarmer is not None:
            await prewarmer.close()
        if election is not None:
            election_stop.set()  # ends the loop, which releases the Lease(s)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(election, timeout=10)
        streams[1].close()  # type: ignore[no-untyped-call]
        runtime.close()
        # kopf has closed its aiohttp sessions, but their TLS transports finish closing only
        # in later turns of the loop; ending the loop at once leaves them unclosed (aiohttp's
        # "graceful shutdown" advice).
        await asyncio.sleep(TLS_CLOSE_GRACE_SECONDS)


async def serve_scaler(
    settings: OperatorSettings, metrics: Metrics
) -> tuple[aio.Server, KubeClient, int] | None:
    """Start the KEDA external scaler when ``settings.scaler.port`` is set: every replica
    serves it, whichever shards it holds, answering from the pools' status (read through
    a client of its own, so an answer never queues behind reconciles). Returns the server,
    that client and the port it listens on."""
    ss = settings.scaler
    if ss.port == 0:
        return None
    threads = SCALER_THREADS + ss.unknown_reads
    kube = KubeClient(load_api_client(settings.reconcile.kubeconfig, pool_size=threads), threads)
    servicer = external_scaler(
        kube,
        allowed_namespaces=settings.watch.namespaces,
        stale_seconds=ss.stale_periods * settings.reconcile.interval_seconds,
        stream_seconds=ss.stream_seconds,
        cache_seconds=ss.cache_seconds,
        max_streams=ss.max_streams,
        stream_max_seconds=ss.stream_max_seconds,
        not_found_seconds=ss.not_found_seconds,
        unknown_reads=ss.unknown_reads,
        unknown_queue=ss.unknown_queue,
        remembered_pools=ss.remembered_pools,
        counter=metrics,
    )
    tls = None
    if ss.tls_cert is not None and ss.tls_key is not None:
        tls = TlsFiles(Path(ss.tls_cert), Path(ss.tls_key), Path(ss.tls_ca) if ss.tls_ca else None)
    try:
        server, bound = await start_server(
            servicer,
            ss.port,
            ss.host,
            tls,
            max_concurrent_rpcs=ss.max_concurrent_rpcs,
            max_message_bytes=ss.max_message_bytes,
        )
    except BaseException:
        kube.close()
        raise
    return server, kube, bound


SCALER_PROBE_SECONDS = 2.0
"""How long the health endpoint's probe waits for the scaler's port to accept."""


def scaler_probe(host: str, port: int) -> Callable[..., Awaitable[str]]:
    """A kopf probe: ``listening`` once a TCP connection to the scaler's port is accepted
    (on loopback when it listens on every address); else a permanent error, which makes
    kopf's health endpoint answer 500."""
    address = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)

    async def probe(**_: object) -> str:
        try:
            _reader, writer = await asyncio.wait_for(
                asyncio.open_connection(address, port), SCALER_PROBE_SECONDS
            )
        except (OSError, TimeoutError) as exc:
            raise kopf.PermanentError(
                f"the KEDA scaler does not accept connections on {address}:{port}: {exc}"
            ) from None
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return "listening"

    return probe


def _identity(settings: OperatorSettings) -> tuple[str, str]:
    """The Leases' namespace and this replica's identity in them."""
    leader = settings.leader
    namespace = leader.namespace or _own_namespace() or "default"
    identity = leader.identity or f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"
    return namespace, identity


def shard_gate(settings: OperatorSettings, runtime: Runtime) -> ShardGate | None:
    """This replica's shards, or ``None`` unless the operator runs with shards."""
    leader = settings.leader
    if not leader.enabled or leader.shards < 1:
        return None
    namespace, identity = _identity(settings)
    runtime.metrics.leader.set(0)  # no single leader: see prescaler_shards_served
    runtime.metrics.shards_served.set(0)
    # The Leases get a client of their own: a renewal never queues behind reconciles.
    leases = ShardLeases.for_client(
        load_api_client(settings.reconcile.kubeconfig, pool_size=lease_threads(leader.shards)),
        namespace,
        leader.lease_name,
        identity,
        leader.shards,
        timings=LeaseTimings(
            leader.lease_duration_seconds,
            leader.renew_deadline_seconds,
            leader.retry_period_seconds,
        ),
    )
    gate = ShardGate(leases, runtime.reconciler, runtime.metrics)
    if runtime.prewarmer is not None:
        prewarmer = runtime.prewarmer
        changed = gate.changed

        def kick(serving: frozenset[int]) -> None:
            changed(serving)
            prewarmer.kick()

        leases.on_change = kick
    return gate


def pool_streams(
    settings: OperatorSettings, gate: ShardGate | None
) -> tuple[StreamFactory, client.ApiClient]:
    """What opens the pools' watch streams (:class:`ObjectStream`), over a client of their
    own (a watch holds its connection), and that client to close."""
    names = settings.watch.namespaces
    per_scope = gate.leases.shards + 1 if gate is not None else 1
    streams = per_scope * max(1, len(names))
    api = load_api_client(settings.reconcile.kubeconfig, pool_size=min(64, streams))

    def open_stream(
        namespace: str | None, selector: str, deliver: Callable[[Listed | Event], None]
    ) -> Stream:
        return ObjectStream(api, GROUP, VERSION, PLURAL, namespace, selector, deliver)

    return open_stream, api


def leader_elector(settings: OperatorSettings, runtime: Runtime) -> LeaseElector | None:
    """The Lease elector of this replica, or ``None`` when leader election is off."""
    leader = settings.leader
    if not leader.enabled:
        return None
    namespace, identity = _identity(settings)
    metrics = runtime.metrics
    metrics.leader.set(0)  # a standby until the Lease is ours

    def changed(leading: bool) -> None:
        metrics.leader.set(1 if leading else 0)
        if not leading:
            metrics.forget_pools()
        if runtime.prewarmer is not None:
            runtime.prewarmer.kick()  # warm (or stop warming) at once

    return LeaseElector.for_client(
        runtime.kube.api_client,
        namespace,
        leader.lease_name,
        identity,
        timings=LeaseTimings(
            leader.lease_duration_seconds,
            leader.renew_deadline_seconds,
            leader.retry_period_seconds,
        ),
        on_change=changed,
    )


def _own_namespace() -> str | None:
    """The pod's namespace, from its service account mount (``None`` outside a cluster)."""
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or None
    except OSError:
        return None


def run_operator(settings: OperatorSettings, **kwargs: object) -> None:
    """Blocking form of :func:`operate`."""
    asyncio.run(operate(settings, **kwargs))  # type: ignore[arg-type]
