"""API server faults, injected for real: the operator talks to the local kube-apiserver
through a fault-injecting proxy (``cluster.apiproxy``), kopf's watches and the pipeline's
calls alike. Each case answers a kind of request with 409, 429 (``Retry-After``), 500 or
503, or cuts the pool watch mid-stream, while a spec change asks for a scale 1 -> 3. The
operator must retry and converge to the same plan: replicas 3, the status written (with
the scale's time), exactly one scale write reaching the API server and one ``ScaledUp``
Event, and nothing reported as an external change.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cluster.apiproxy import ApiProxy, Rule
from cluster.launcher import LocalCluster
from cluster.objects import gpu_deployment
from integration.operator_fixtures import (  # noqa: F401 (fixtures)
    Kube,
    crd_fixture,
    running_operator,
    wait_for,
)
from prescaler.api import GROUP, PLURAL, VERSION
from prescaler.metrics import Metrics

pytestmark = pytest.mark.cluster

SCALE = r"/namespaces/[^/]+/deployments/llm/scale$"
STATUS = r"/inferencepools/chat/status$"
RETRIES = 5
"""The adapter's retries per call (``KubeClient`` backoffs)."""

FAULTS: dict[str, Rule] = {
    # Beyond the adapter's retries: the reconcile fails after its scale, the next one must
    # find its own write and restore the scale's time.
    "status-patch-409": Rule("PATCH", STATUS, status=409, times=RETRIES + 3),
    "scale-patch-409": Rule("PATCH", SCALE, status=409, times=RETRIES + 3),
    "scale-patch-503": Rule("PATCH", SCALE, status=503, times=3),
    "deployment-read-429": Rule(
        "GET", r"/deployments/llm$", status=429, times=2, retry_after=2, watch=False
    ),
    "pod-list-500": Rule("GET", r"/namespaces/[^/]+/pods$", status=500, times=3, watch=False),
    "pool-watch-drop": Rule("GET", r"/inferencepools$", action="drop", times=3, watch=True),
}


@pytest.fixture
def api_proxy(cluster: LocalCluster, tmp_path: Path) -> Iterator[ApiProxy]:
    proxy = ApiProxy.start_for(cluster.kubeconfig, tmp_path / "apiproxy")
    try:
        yield proxy
    finally:
        proxy.stop()


def _reconciles(metrics: Metrics) -> float:
    return sum(
        s.value
        for family in metrics.registry.collect()
        for s in family.samples
        if s.name == "prescaler_reconcile_duration_seconds_count"
    )


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions", []) if c["type"] == kind), {})


@pytest.mark.parametrize("fault", FAULTS.values(), ids=list(FAULTS))
def test_the_operator_converges_through_api_server_faults(
    cluster: LocalCluster,
    crd: None,
    kube: Any,
    namespace: str,
    api_proxy: ApiProxy,
    fault: Rule,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    k = Kube(kube, namespace)
    k.deployment_and_pool(min_replicas=1)
    monkeypatch.setenv("KUBECONFIG", str(api_proxy.kubeconfig))  # kopf's own login
    with running_operator(cluster, namespace, kubeconfig=str(api_proxy.kubeconfig)) as metrics:
        wait_for(lambda: k.status("chat").get("appliedReplicas") == 1, 120, "the first status")
        rule = api_proxy.add(replace(fault, fired=0, fired_at=[]))
        k.patch_pool("chat", {"minReplicas": 3})
        wait_for(lambda: rule.exhausted, 180, f"the fault to fire {rule.times} times")
        wait_for(lambda: k.deployment("llm").spec.replicas == 3, 180, "replicas 3")
        wait_for(
            lambda: (
                k.status("chat").get("appliedReplicas") == 3
                and k.status("chat").get("lastScaleUpTime")
            ),
            180,
            "the status of the scale",
        )
        # Converged: a few more reconciles change nothing.
        seen = _reconciles(metrics)
        wait_for(lambda: _reconciles(metrics) >= seen + 3, 120, "three more reconciles")
        status = k.status("chat")

    assert k.deployment("llm").spec.replicas == 3
    assert status["desiredReplicas"] == 3
    assert _condition(status, "ExternalChange").get("status") == "False", status
    assert "externalChange" not in status
    reasons = [e.reason for e in k.events("chat")]
    assert reasons.count("ScaledUp") == 1, reasons
    assert "ScaledDown" not in reasons, reasons
    assert "ExternalChange" not in reasons, reasons
    scales = [s for s in api_proxy.seen() if s.method == "PATCH" and s.path.endswith("/llm/scale")]
    written = [s for s in scales if s.injected is None and s.status == 200]
    assert [json.loads(s.body)["spec"]["replicas"] for s in written] == [3], scales
    if fault.retry_after is not None:
        # Each retry waited at least what the server asked for.
        after = [
            s.at
            for s in api_proxy.seen()
            if s.method == fault.method and s.path.endswith("/deployments/llm")
        ]
        for fired in rule.fired_at:
            retry = min(t for t in after if t > fired)
            assert retry - fired >= fault.retry_after - 0.05, (fired, retry)


POOL_WATCH = r"/namespaces/[^/]+/inferencepools$"


def test_a_pool_deleted_while_the_watch_was_down_is_never_acted_on_again(
    cluster: LocalCluster,
    crd: None,
    kube: Any,
    namespace: str,
    api_proxy: ApiProxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pool watch goes quiet (its events lost), pool ``chat`` is deleted and its
    Deployment scaled to 0, below the pool's floor; then the watch resumes with ``410
    Gone`` and the operator lists the pools again. No ``DELETED`` event ever arrives: the
    relist alone must end the pool's loop, and until it does, nothing may scale for it."""
    k = Kube(kube, namespace)
    k.deployment_and_pool(min_replicas=1)
    k.create_deployment(gpu_deployment("other", 1))
    k.create_pool(
        "keep",
        {
            "target": {"name": "other"},
            "minReplicas": 1,
            "maxReplicas": 2,
            "model": {"tokensPerSecond": 3750},
            "coldStart": {"mode": "fixed", "seconds": 30},
        },
    )
    monkeypatch.setenv("KUBECONFIG", str(api_proxy.kubeconfig))  # kopf's own login
    with running_operator(cluster, namespace, kubeconfig=str(api_proxy.kubeconfig)) as metrics:

        def last(pool: str) -> float | None:
            return metrics.registry.get_sample_value(
                "prescaler_last_reconcile_timestamp_seconds",
                {"namespace": namespace, "pool": pool},
            )

        wait_for(
            lambda: all(k.status(p).get("appliedReplicas") == 1 for p in ("chat", "keep")),
            120,
            "both pools' first statuses",
        )
        gap = api_proxy.add(Rule(None, POOL_WATCH, action="mute", watch=True))
        wait_for(lambda: gap.exhausted, 60, "the pool watch to go quiet")
        k.delete_pool("chat")
        wait_for(
            lambda: (
                not k.custom.list_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, field_selector="metadata.name=chat"
                )["items"]
            ),
            60,
            "the pool to be gone",
        )
        k.apps.patch_namespaced_deployment_scale("llm", namespace, {"spec": {"replicas": 0}})
        deleted = time.monotonic()
        # The loop still runs (no event told it): it reads its target, and the plan for a
        # floor of 1 over 0 replicas is a scale-up, which the pool's absence must stop.
        reconciled = last("chat")
        wait_for(lambda: (last("chat") or 0.0) > (reconciled or 0.0) + 2, 60, "a tick or two")
        gone = api_proxy.add(Rule("GET", POOL_WATCH, action="gone", watch=True))
        gap.lifted = True
        wait_for(lambda: gone.exhausted, 60, "the watch to resume, and be told 410 Gone")
        wait_for(lambda: last("chat") is None, 60, "the deleted pool's loop to end")
        ended = time.monotonic()
        kept = last("keep") or 0.0
        wait_for(lambda: (last("keep") or 0.0) >= kept + 3, 60, "three more reconciles of keep")

    seen = api_proxy.seen()
    relists = [
        s
        for s in seen
        if s.method == "GET"
        and s.at > deleted
        and "watch" not in s.query
        and s.path.endswith("/inferencepools")
    ]
    assert relists, "the operator listed the pools again"
    touches = [s for s in seen if "/deployments/llm" in s.path]
    assert not [s for s in touches if s.method != "GET" and s.at > deleted], touches
    assert not [s for s in touches if s.at > ended], "the deleted pool's loop went on"
    assert k.deployment("llm").spec.replicas == 0
    assert k.deployment("other").spec.replicas == 1
    assert "ScaledUp" not in [e.reason for e in k.events("chat")]
