"""Deleting a pool, or its namespace, never waits for an operator.

The operator reconciles each pool in its own loop fed by watch events, so it puts no
finalizer on a pool. With no operator running (uninstalled, down, scaled to zero), a pool
and the namespace it lives in are deleted like any other object. Pools an older version
left with its finalizer ``prescaler.io/finalizer`` lose it as soon as this operator
starts, and one already being deleted goes then.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from cluster.launcher import LocalCluster, wait_default_service_account
from cluster.objects import gpu_deployment
from integration.operator_fixtures import (  # noqa: F401 (fixtures)
    Kube,
    crd_fixture,
    pool_body,
    running_operator,
    wait_for,
)
from prescaler.api import GROUP, PLURAL, VERSION

OLD_FINALIZER = "prescaler.io/finalizer"
MODEL = {"tokensPerSecond": 3750, "promptTokens": 600, "outputTokens": 150}
FIXED = {"mode": "fixed", "seconds": 1, "marginSeconds": 0}


def _window(minimum: int) -> list[dict[str, Any]]:
    fmt = "%Y-%m-%dT%H:%M:%S"
    return [
        {
            "name": "w",
            "start": time.strftime(fmt, time.gmtime(time.time() - 60)),
            "end": time.strftime(fmt, time.gmtime(time.time() + 3600)),
            "minReplicas": minimum,
            "leadSeconds": 0,
        }
    ]


def _gone(read: Any, *args: Any) -> bool:
    try:
        read(*args)
        return False
    except ApiException as exc:
        return bool(exc.status == 404)


def _there(read: Any, *args: Any) -> bool:
    return not _gone(read, *args)


@contextlib.contextmanager
def _own_namespace(k: Kube) -> Iterator[str]:
    """A namespace the test deletes itself (the ``namespace`` fixture deletes its own at
    the end, which must still exist then). Deleted at the end if the test did not."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    k.core.create_namespace({"metadata": {"name": name, "labels": {"prescaler.io/test": "true"}}})
    wait_default_service_account(k.core.api_client, name)
    try:
        yield name
    finally:
        with contextlib.suppress(ApiException):
            k.core.delete_namespace(name, propagation_policy="Background")


def _errors(records: list[logging.LogRecord]) -> list[str]:
    return [
        f"{r.name}: {r.getMessage()}"
        for r in records
        if r.levelno >= logging.ERROR and r.name.split(".")[0] in ("prescaler", "kopf")
    ]


@pytest.mark.cluster
def test_a_pool_and_its_namespace_delete_with_no_operator_and_old_finalizers_go(
    cluster: LocalCluster,
    crd: None,
    kube: Any,
    namespace: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))  # kopf's own login
    caplog.set_level(logging.WARNING)
    admin = Kube(kube, namespace)
    with _own_namespace(admin) as doomed:
        # A served pool with every kind of standby and its degradation ConfigMap.
        d = Kube(kube, doomed)
        d.create_deployment(gpu_deployment("web", 1, ready_delay="1s"))
        d.create_pool(
            "web",
            {
                "target": {"name": "web"},
                "maxReplicas": 4,
                "model": MODEL,
                "coldStart": FIXED,
                "schedules": _window(2),
                "standby": {
                    "imagePrePull": {"enabled": True},
                    "placeholders": {"enabled": True, "maxReplicas": 1},
                    "hot": {"replicas": 1},
                },
            },
        )
        with running_operator(cluster, doomed):
            wait_for(lambda: d.deployment("web").spec.replicas == 2, 60, "web scaled to 2")
            for name in ("web-hot", "web-placeholder"):
                wait_for(functools.partial(_there, d.deployment, name), 60, name)
            read_ds, read_cm = d.apps.read_namespaced_daemon_set, d.core.read_namespaced_config_map
            wait_for(lambda: _there(read_ds, "web-prepull", doomed), 60, "the pre-pull DaemonSet")
            wait_for(lambda: _there(read_cm, "web-degradation", doomed), 60, "the ConfigMap")
            wait_for(lambda: d.status("web").get("plan"), 60, "the pool's status")
            meta = d.pool("web")["metadata"]
            # Nothing of kopf's on the pool: no finalizer, no progress or diffbase annotation.
            assert not meta.get("finalizers"), meta
            assert not meta.get("annotations"), meta
        # The operator is stopped; the namespace goes anyway.
        d.core.delete_namespace(doomed)
        wait_for(lambda: _gone(d.core.read_namespace, doomed), 60, f"namespace {doomed} gone")

    # Pools as an older version left them, with its finalizer: one live, one already
    # being deleted (it hangs in Terminating while no operator runs).
    k = admin
    k.create_deployment(gpu_deployment("llm", 1, ready_delay="1s"))
    spec = {"target": {"name": "llm"}, "maxReplicas": 4, "model": MODEL, "coldStart": FIXED}
    for name in ("legacy", "legacy-deleted"):
        body = pool_body(name, spec)
        body["metadata"]["finalizers"] = [OLD_FINALIZER]
        k.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    try:
        k.delete_pool("legacy-deleted")
        assert k.pool("legacy-deleted")["metadata"].get("deletionTimestamp")

        # The operator again, after the namespace deletion.
        with running_operator(cluster, namespace):
            wait_for(
                lambda: not k.pool("legacy")["metadata"].get("finalizers"),
                60,
                "the old finalizer taken off",
            )
            wait_for(lambda: _gone(k.pool, "legacy-deleted"), 60, "the deleted old pool gone")
            wait_for(lambda: k.status("legacy").get("plan"), 60, "the old pool served")
            assert not k.pool("legacy")["metadata"].get("annotations")
        # A pool deleted while no operator runs goes at once.
        k.delete_pool("legacy")
        wait_for(lambda: _gone(k.pool, "legacy"), 60, "the pool deleted with no operator")
    finally:
        for name in ("legacy", "legacy-deleted"):  # a failed test must not leave them hanging
            with contextlib.suppress(ApiException):
                k.custom.patch_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, name, {"metadata": {"finalizers": None}}
                )

    # Nothing left behind: no pool anywhere in the deleted namespace, and no errors.
    leftovers = k.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]
    assert not [p for p in leftovers if p["metadata"]["namespace"] in (doomed, namespace)]
    assert _errors(caplog.records) == []
