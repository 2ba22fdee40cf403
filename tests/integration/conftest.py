"""Fixtures for tests against a real local cluster and a real Prometheus.

``cluster`` (session): one local control plane (etcd, kube-apiserver,
    kube-controller-manager, kube-scheduler) with kwok fake nodes: 3 GPU nodes with
    8 ``nvidia.com/gpu`` each (tainted ``nvidia.com/gpu=present:NoSchedule``; pods
    that request GPUs get the toleration automatically) and 1 CPU node.

    - ``cluster.kubeconfig``: path of an admin kubeconfig (works with kubectl, the
      ``kubernetes`` client and kopf, e.g. ``KUBECONFIG=cluster.kubeconfig``).
    - ``cluster.api_client()``: a new ``kubernetes.client.ApiClient``; close it.
    - A pod that requests ``nvidia.com/gpu`` becomes Ready ``gpu_ready_delay_s``
      (default 10 s, env ``PRESCALER_FAKE_READY_DELAY``) after it starts; the pod
      annotation ``prescaler.io/fake-ready-delay: "30s"`` overrides it per pod.

``namespace`` (function): a fresh namespace name (with its default ServiceAccount),
    deleted after the test. Use it for every object a test creates.

``kube`` (function): an ``ApiClient`` for the test, closed afterwards.

``prometheus`` (function): its own empty Prometheus on a free loopback port.

    - ``prometheus.url``
    - ``prometheus.backfill(samples_or_openmetrics_text)``: adds history and restarts
      the server (about a second). Build samples with ``cluster.prometheus``:
      ``vllm_samples(times_s, rate_rps, namespace=..., model_name=..., pods=...)``
      turns a request-rate series into vLLM counters and gauges;
      ``servegen_rate(days=2, end_at_s=now)`` reads a real trace.
    - ``prometheus.query(promql, at_s)`` / ``prometheus.query_range(promql, start_s,
      end_s, step_s)``.

Tests using these are marked ``@pytest.mark.cluster`` / ``@pytest.mark.prometheus``.
Missing binaries are an error, not a skip: ``make test`` builds them first
(``make cluster-bin prometheus-bin``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster.launcher import ClusterConfig, LocalCluster, env_float, wait_default_service_account
from cluster.prometheus import Prometheus

# kopf's own API sockets can outlive an in-process operator stopped from a test thread: the
# garbage collector then reports them unclosed while a later test runs, and pytest turns
# that into an error. Only that report is ignored, and only in this folder.
_KOPF_UNCLOSED_SOCKETS = (
    r"ignore:Exception ignored in. <(socket\.socket|function _SelectorTransport\.__del__)"
    ":pytest.PytestUnraisableExceptionWarning"
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.filterwarnings(_KOPF_UNCLOSED_SOCKETS))


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    run_dir = tmp_path_factory.mktemp("cluster")
    config = ClusterConfig(gpu_ready_delay_s=env_float("PRESCALER_FAKE_READY_DELAY", 10.0))
    local = LocalCluster(run_dir, config, tie_to_parent=True)
    local.start()
    try:
        yield local
    finally:
        local.stop()


@pytest.fixture
def kube(cluster: LocalCluster) -> Iterator[Any]:
    api = cluster.api_client()
    try:
        yield api
    finally:
        api.close()


@pytest.fixture
def namespace(kube: Any) -> Iterator[str]:
    from kubernetes import client

    core: Any = client.CoreV1Api(kube)
    name = f"t-{uuid.uuid4().hex[:10]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"prescaler.io/test": "true"}}})
    wait_default_service_account(kube, name)
    try:
        yield name
    finally:
        core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Prometheus]:
    prom = Prometheus(tmp_path / "prometheus")
    prom.start()
    try:
        yield prom
    finally:
        prom.stop()
