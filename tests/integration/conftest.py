"""Fixtures for the integration tests; the cluster fixtures live in ``tests/conftest.py``.

``prometheus`` (function): its own empty Prometheus on a free loopback port.

    - ``prometheus.url``
    - ``prometheus.backfill(samples_or_openmetrics_text)``: adds history and restarts
      the server (about a second). Build samples with ``cluster.prometheus``:
      ``vllm_samples(times_s, rate_rps, namespace=..., model_name=..., pods=...)``
      turns a request-rate series into vLLM counters and gauges;
      ``servegen_rate(days=2, end_at_s=now)`` reads a real trace.
    - ``prometheus.query(promql, at_s)`` / ``prometheus.query_range(promql, start_s,
      end_s, step_s)``.

``keda`` (session): real KEDA (operator and metrics API server, built by
    ``make cluster-bin``) on the session's cluster, started when a test first asks for it
    (once per pytest-xdist worker) and running until the session ends; see
    ``cluster.keda``.

    - KEDA's CRDs are installed; create ScaledObjects in the test's ``namespace``
      (``cluster.keda.scaled_object(...)`` builds one). KEDA watches every namespace and
      runs in ``keda.namespace`` (``keda``).
    - KEDA's operator runs on this machine: an ``external`` trigger's ``scalerAddress`` is
      ``cluster.keda.scaler_address(port)`` (``127.0.0.1:<port>``) of a local server.
    - ``external.metrics.k8s.io`` is served (the APIService is Available); the
      kube-controller-manager's HPA controller scales what KEDA's HPA
      (``cluster.keda.hpa_name(scaled_object)``, owned by the ScaledObject) asks.

Tests using these are marked ``@pytest.mark.cluster`` / ``@pytest.mark.prometheus``.
Missing binaries are an error, not a skip: ``make test`` builds them first
(``make cluster-bin prometheus-bin``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.apiproxy import ApiProxy
from cluster.keda import Keda
from cluster.launcher import LocalCluster
from cluster.prometheus import Prometheus


@pytest.fixture
def api_proxy(cluster: LocalCluster, tmp_path: Path) -> Iterator[ApiProxy]:
    proxy = ApiProxy.start_for(cluster.kubeconfig, tmp_path / "apiproxy")
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Prometheus]:
    prom = Prometheus(tmp_path / "prometheus")
    prom.start()
    try:
        yield prom
    finally:
        prom.stop()


@pytest.fixture(scope="session")
def keda(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keda]:
    running = Keda(cluster, tmp_path_factory.mktemp("keda"))
    running.start()
    try:
        yield running
    finally:
        running.stop()
