"""The real local cluster, shared by every test folder that needs it (one per session).

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

Under pytest-xdist (``make test`` runs ``-n`` workers), every worker has its own local
cluster, started when its first cluster test asks for one: tests keep a whole cluster's
capacity (3 x 8 GPUs) to themselves, and a cluster-wide operator sees only its own worker's
namespaces. Workers take the tests that wait longest first
(:func:`pytest_collection_modifyitems`), so no worker is left with a long test at the end.

The cluster starts only when a test asks for one of these. Tests using them are marked
``@pytest.mark.cluster``. Missing binaries are an error, not a skip: ``make test`` builds
them first (``make cluster-bin``). ``tests/integration/conftest.py`` adds ``prometheus``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings

from cluster.launcher import ClusterConfig, LocalCluster, env_float, wait_default_service_account

# Property tests draw the same examples on every run (a suite that fails on one draw in
# a hundred stops everything from landing); ``HYPOTHESIS_PROFILE=explore`` draws new ones
# (a failure found so goes into the test as an ``@example``).
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


def _weight(item: pytest.Item) -> int:
    """How long a test is likely to take, by its marks: the demo, then the cluster and
    Prometheus tests (they wait on cold starts and timers), then slow ones, then the rest."""
    marks = {m.name for m in item.iter_markers()}
    return (
        8 * ("cluster" in marks and "slow" in marks)
        + 4 * ("cluster" in marks)
        + 2 * ("prometheus" in marks)
        + ("slow" in marks)
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist, the longest tests first (a stable sort, the same on every worker,
    as xdist requires): with ``--maxschedchunk 1`` each worker takes the next test when it is
    free, so the long ones are spread out and the short ones fill the gaps."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=_weight, reverse=True)


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
