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
from dataclasses import replace
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
    """The pool watch goes quiet (its events lost), and pools ``chat`` and ``quiet`` are
    deleted; ``chat``'s Deployment is scaled to 0, below its floor. Then the watch resumes
    with ``410 Gone`` and the operator lists the pools again. No ``DELETED`` event ever
    arrives. ``chat``'s loop plans a scale-up, which the pool's absence must stop (and
    end the loop); ``quiet``'s loop writes nothing and goes on until the relist, which
    must end it (its status writes are refused with 503 meanwhile, so that no 404 on
    them ends it first). ``keep`` is served throughout."""
    k = Kube(kube, namespace)
    k.deployment_and_pool(min_replicas=1)
    for name, deployment in (("quiet", "idle"), ("keep", "other")):
        k.create_deployment(gpu_deployment(deployment, 1))
        k.create_pool(
            name,
            {
                "target": {"name": deployment},
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

        def ticked(pool: str, since: float) -> bool:
            return (last(pool) or 0.0) > since + 2

        wait_for(
            lambda: all(k.status(p).get("appliedReplicas") == 1 for p in ("chat", "quiet", "keep")),
            120,
            "the pools' first statuses",
        )
        api_proxy.add(Rule("PATCH", r"/inferencepools/quiet/status$", status=503, times=10**6))
        gap = api_proxy.add(Rule(None, POOL_WATCH, action="mute", watch=True))
        wait_for(lambda: gap.exhausted, 60, "the pool watch to go quiet")
        for pool in ("chat", "quiet"):
            k.delete_pool(pool)

        def gone() -> bool:
            listing = k.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
            return {p["metadata"]["name"] for p in listing["items"]} == {"keep"}

        wait_for(gone, 60, "the pools to be gone")
        deleted_wall = time.time()
        k.apps.patch_namespaced_deployment_scale("llm", namespace, {"spec": {"replicas": 0}})
        deleted = time.monotonic()
        # chat's next tick plans 0 -> 1: the read of the pool before the scale ends it.
        wait_for(lambda: last("chat") is None, 60, "chat's loop to end at its planned scale")
        # quiet's loop writes nothing, so nothing tells it yet: it goes on in the gap.
        wait_for(lambda: ticked("quiet", deleted_wall), 60, "quiet's loop to tick in the gap")
        assert gap.fired == 1, "the watch stayed quiet"
        lists = len(_own_pool_lists(api_proxy))
        gone_rule = api_proxy.add(Rule("GET", POOL_WATCH, action="gone", watch=True))
        gap.lifted = True
        wait_for(lambda: gone_rule.exhausted, 60, "the watch to resume, and be told 410 Gone")
        wait_for(lambda: last("quiet") is None, 60, "the relist to end quiet's loop")
        assert len(_own_pool_lists(api_proxy)) > lists, "the relist ended it"
        ended = time.monotonic()
        kept = last("keep") or 0.0
        wait_for(lambda: ticked("keep", kept), 60, "keep reconciled again after the relist")

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
    writes = [s for s in seen if s.method != "GET" and s.at > deleted]
    assert not [s for s in writes if "/deployments/llm" in s.path], writes
    after = [s for s in seen if s.at > ended]
    assert not [s for s in after if "/deployments/idle" in s.path], "quiet's loop went on"
    assert not [s for s in after if "/inferencepools/quiet" in s.path], "quiet's loop went on"
    assert [s for s in seen if s.path.endswith("/quiet/status") and s.at < ended], (
        "quiet's loop ticked in the gap (its status writes refused)"
    )
    assert k.deployment("llm").spec.replicas == 0
    assert k.deployment("other").spec.replicas == 1
    assert "ScaledUp" not in [e.reason for e in k.events("chat")]


def _own_pool_lists(proxy: ApiProxy) -> list[Any]:
    """The operator's own lists of pools (its watch streams page them)."""
    return [
        s
        for s in proxy.seen()
        if s.method == "GET" and s.path.endswith("/inferencepools") and "limit=" in s.query
    ]
