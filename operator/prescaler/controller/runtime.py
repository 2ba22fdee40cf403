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

from prescaler.controller import handlers
from prescaler.controller.forecast import ForecastHub
from prescaler.controller.reconcile import Reconciler
from prescaler.kube import KubeClient, load_api_client
from prescaler.metrics import Metrics
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


async def operate(
    settings: OperatorSettings,
    *,
    stop_flag: asyncio.Event | threading.Event | None = None,
    ready_flag: asyncio.Event | threading.Event | None = None,
    metrics: Metrics | None = None,
) -> None:
    """Run the operator until ``stop_flag`` is set (or forever)."""
    runtime = Runtime.build(settings, metrics)
    if settings.metrics.port > 0:
        runtime.metrics.serve(settings.metrics.port, settings.metrics.host)
    registry = kopf.OperatorRegistry()
    handlers.register(registry, runtime.reconciler, settings.reconcile.interval_seconds)
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
