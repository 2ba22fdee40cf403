"""The operator process: builds the pipeline from typed settings and runs kopf with it.

``prescaler run`` calls :func:`run_operator`; tests and the benchmark call it too, in a
thread, with a ``stop_flag``.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import threading
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass

import kopf

from prescaler.kube import KubeClient, load_api_client
from prescaler.metrics import Metrics
from prescaler.reconcile import Reconciler
from prescaler.reconcile_forecast import ForecastHub
from prescaler.settings import OperatorSettings

log = logging.getLogger("prescaler")


@dataclass
class Runtime:
    """Long-lived objects of one operator run."""

    settings: OperatorSettings
    metrics: Metrics
    reconciler: Reconciler
    kube: KubeClient
    io_pool: ThreadPoolExecutor
    fit_pool: Executor | None

    @classmethod
    def build(cls, settings: OperatorSettings, metrics: Metrics | None = None) -> Runtime:
        rs = settings.reconcile
        metrics = metrics or Metrics()
        kube = KubeClient(
            load_api_client(rs.kubeconfig, pool_size=rs.kube_threads), rs.kube_threads
        )
        io_pool = ThreadPoolExecutor(max_workers=rs.kube_threads, thread_name_prefix="prom")
        fit_pool: Executor | None = None
        if rs.forecast_workers > 0:
            # spawn: forking a process that runs threads is unsafe.
            # nice: fits are background work and must not slow the reconciles down.
            fit_pool = ProcessPoolExecutor(
                max_workers=rs.forecast_workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=os.nice,
                initargs=(rs.fit_worker_nice,),
            )
        hub = ForecastHub(
            metrics=metrics,
            executor=fit_pool,
            io_executor=io_pool,
            wait_seconds=rs.forecast_wait_seconds,
            fit_workers=max(1, rs.forecast_workers),
            fit_queue_limit=rs.fit_queue_limit,
            first_fit_spread_seconds=rs.first_fit_spread_seconds,
            stale_seconds=rs.forecast_stale_seconds,
        )
        reconciler = Reconciler(
            kube=kube,
            metrics=metrics,
            forecasts=hub,
            io_executor=io_pool,
            prometheus_timeout_seconds=rs.prometheus_timeout_seconds,
            rate_window=rs.rate_window,
        )
        return cls(settings, metrics, reconciler, kube, io_pool, fit_pool)

    def close(self) -> None:
        self.reconciler.forecasts.close()
        if self.fit_pool is not None:
            self.fit_pool.shutdown(wait=False, cancel_futures=True)
        self.io_pool.shutdown(wait=False, cancel_futures=True)
        self.kube.close()


def configure_kopf(kopf_settings: kopf.OperatorSettings) -> None:
    """Keep kopf's own marks on our objects to what it needs, under our own prefix."""
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


async def operate(
    settings: OperatorSettings,
    *,
    stop_flag: asyncio.Event | threading.Event | None = None,
    ready_flag: asyncio.Event | threading.Event | None = None,
    metrics: Metrics | None = None,
) -> None:
    """Run the operator until ``stop_flag`` is set (or forever)."""
    from prescaler import handlers

    runtime = Runtime.build(settings, metrics)
    if settings.metrics.port > 0:
        runtime.metrics.serve(settings.metrics.port, settings.metrics.host)
    registry = kopf.OperatorRegistry()
    handlers.register(registry, runtime)
    try:
        await kopf.operator(
            registry=registry,
            clusterwide=settings.clusterwide,
            namespaces=list(settings.watch.namespaces),
            standalone=settings.peering.name is None,
            peering_name=settings.peering.name,
            priority=settings.peering.priority,
            liveness_endpoint=settings.liveness_endpoint,
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )
    finally:
        runtime.close()


def run_operator(settings: OperatorSettings, **kwargs: object) -> None:
    """Blocking form of :func:`operate`."""
    asyncio.run(operate(settings, **kwargs))  # type: ignore[arg-type]
