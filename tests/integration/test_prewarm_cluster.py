"""Prewarmed replicas on the real local cluster: the readiness gate, the warm-up, the pod
condition, the Events and the cold start. The operator runs as the Helm chart's
ServiceAccount, so every call here is also checked against the chart's RBAC.

How the engine is reached: kwok gives pods fake IPs that nothing answers on. These tests
add a kwok GPU node whose ``spec.podCIDR`` is a loopback range (``127.64.N.0/24``), so its
pods get loopback addresses; the operator then really connects to each pod's IP and port,
where a local fake engine (``cluster.fake_engine``, bound to ``0.0.0.0``) answers
``/v1/models`` and ``/v1/completions`` and tells the pods apart by the address each
request reached. kwok's stages make a pod Ready as a kubelet does: containers ready and
every readiness gate's condition True (``cluster.kwok_stages``).

What they cover: the operator's pod watch, its decisions, the HTTP requests it sends to the
pod IP and port (model lookup, prompts, ``max_tokens: 1``, the budget), the timeout, the
``prescaler.io/prewarmed`` condition written through ``pods/status``, the gate holding
Ready until then, the Events, and the measured cold start (created -> Ready) spanning
the warm-up. What they do not: a real kubelet, container runtime or engine (no model is
loaded, no prefix cache filled, no kernel run: the fake engine only records the requests),
a pod network (every address is this machine's loopback), and Services for the loopback
pods (EndpointSlices refuse loopback addresses). Service membership is therefore shown on
an ordinary kwok node, with a warm-up that needs no engine (its prompts' ConfigMap is
missing, so the pod is released as failed): its endpoint is not ready until the operator
sets the condition, then ready.

No assertion depends on how long something took: the fake engine holds a warm-up until
the test has looked at the pod, waits are on conditions with generous deadlines, and
orderings are read from the objects' own timestamps.
"""

from __future__ import annotations

import functools
import itertools
import random
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from cluster.fake_engine import MODEL, Behaviour, FakeEngine
from cluster.launcher import LocalCluster
from cluster.objects import gpu_deployment, loopback_gpu_node, on_node, with_readiness_gate
from integration.chart_rbac import chart_identity
from integration.operator_fixtures import (  # noqa: F401 (fixtures)
    Kube,
    crd_fixture,
    operator_fixture,
    running_operator,
    wait_for,
)
from prescaler.api import PREWARM_CONDITION
from prescaler.metrics import Metrics

pytestmark = [pytest.mark.cluster]

MODEL_SPEC = {"tokensPerSecond": 3750, "promptTokens": 600, "outputTokens": 150}
PROMPTS = ["You are a helpful assistant.", "You are a careful code reviewer.", "Summarize:"]
_SUBNETS = itertools.count(random.randrange(1, 200))


# ---------------------------------------------------------------------- fixtures
@pytest.fixture
def loopback_node(kube: Any) -> Iterator[Callable[[], tuple[str, str]]]:
    """Make kwok GPU nodes whose pods get loopback IPs; yields a factory returning
    ``(node name, address prefix)``. The nodes are deleted afterwards."""
    core: Any = client.CoreV1Api(kube)
    made: list[str] = []

    def make() -> tuple[str, str]:
        subnet = next(_SUBNETS) % 250 + 1
        name = f"loop-{subnet}-{random.randrange(16**6):06x}"
        core.create_node(loopback_gpu_node(name, f"127.64.{subnet}.0/24"))
        made.append(name)
        wait_for(
            lambda: any(
                c.type == "Ready" and c.status == "True"
                for c in core.read_node(name).status.conditions or []
            ),
            60,
            f"node {name} Ready",
        )
        return name, f"127.64.{subnet}."

    try:
        yield make
    finally:
        for name in made:
            try:
                core.delete_node(name)
            except ApiException as exc:
                if exc.status != 404:
                    raise


@pytest.fixture
def engine() -> Iterator[FakeEngine]:
    """The fake engine on every local address; warm-ups that reach it block until a test
    sets a behaviour for their node's addresses (``set_behaviour``)."""
    held = threading.Event()
    with FakeEngine("0.0.0.0", default=Behaviour(hold=held)) as server:
        yield server
        held.set()


# ---------------------------------------------------------------------- helpers
def _pods(k: Kube, app: str) -> list[Any]:
    items = k.core.list_namespaced_pod(k.ns, label_selector=f"app={app}").items
    return [p for p in items if p.metadata.deletion_timestamp is None]


def _pod(k: Kube, app: str) -> Any:
    pods = wait_for(lambda: _pods(k, app), 60, f"a pod of {app}")
    return pods[0]


def _condition(pod: Any, kind: str) -> Any:
    return next((c for c in pod.status.conditions or [] if c.type == kind), None)


def _true(pod: Any, kind: str) -> bool:
    cond = _condition(pod, kind)
    return cond is not None and cond.status == "True"


def _reread(k: Kube, pod: Any) -> Any:
    return k.core.read_namespaced_pod(pod.metadata.name, k.ns)


def _ready_again(k: Kube, pod: Any) -> Any:
    """``pod`` read afresh once it is Ready, else None."""
    fresh = _reread(k, pod)
    return fresh if _true(fresh, "Ready") else None


def _warning_events(k: Kube, name: str, reason: str) -> list[Any]:
    return [e for e in k.events(name) if e.reason == reason and e.type == "Warning"]


def _at(cond: Any) -> float:
    stamp: datetime = cond.last_transition_time
    return stamp.timestamp()


def _pod_events(k: Kube, name: str) -> list[Any]:
    listing = k.core.list_namespaced_event(
        k.ns, field_selector=f"involvedObject.name={name},involvedObject.kind=Pod"
    )
    return [e for e in listing.items if e.source and e.source.component == "prescaler"]


def _deployment(name: str, node: str | None, *, gated: bool = True) -> dict[str, Any]:
    body = gpu_deployment(name, 1, ready_delay="2s")
    if node is not None:
        body = on_node(body, node)
    return with_readiness_gate(body, PREWARM_CONDITION) if gated else body


def _pool(k: Kube, name: str, prewarm: dict[str, Any]) -> None:
    k.create_pool(
        name,
        {
            "target": {"name": name},
            "minReplicas": 1,
            "maxReplicas": 1,
            "model": MODEL_SPEC,
            "coldStart": {"mode": "auto", "seconds": 60, "samples": 5},
            "prewarm": prewarm,
        },
    )


def _ready_after_the_gate(pod: Any) -> None:
    """Ready turned True no earlier than the gate's condition, which came after the
    containers were ready (second-resolution timestamps)."""
    containers, gate, ready = (
        _condition(pod, "ContainersReady"),
        _condition(pod, PREWARM_CONDITION),
        _condition(pod, "Ready"),
    )
    assert _at(containers) <= _at(gate) <= _at(ready), pod.status.conditions


# ---------------------------------------------------------------------- the gate
def test_a_gated_pod_is_ready_only_after_its_warm_up_which_its_cold_start_includes(
    kube: Any,
    namespace: str,
    operator: Metrics,
    engine: FakeEngine,
    loopback_node: Callable[[], tuple[str, str]],
) -> None:
    k = Kube(kube, namespace)
    node, prefix = loopback_node()
    hold = threading.Event()
    engine.set_behaviour(prefix, Behaviour(hold=hold))
    k.create_deployment(_deployment("llm", node))
    _pool(k, "llm", {"prompts": PROMPTS, "maxRequests": 2, "port": engine.port})

    # The warm-up reached the pod's own address; the engine holds its first completion.
    pod = _pod(k, "llm")
    ip = wait_for(lambda: _reread(k, pod).status.pod_ip, 60, "the pod's IP")
    assert ip.startswith(prefix)
    wait_for(lambda: engine.completions(ip), 120, "a warm-up request at the pod's IP")
    held = _reread(k, pod)
    assert _true(held, "ContainersReady")
    assert not _true(held, "Ready"), "a pod being warmed is not Ready"
    assert _condition(held, PREWARM_CONDITION) is None
    # The warm-up starts once the reconcile publishes the pool's claim, before that
    # reconcile writes the pool's status: wait for the condition, don't race it.
    gate = wait_for(lambda: k.condition("llm", "Prewarm"), 60, "the pool's Prewarm condition")
    assert gate is not None
    assert (gate["status"], gate["reason"]) == ("True", "Gated")

    hold.set()
    ready = wait_for(
        lambda: _true(p := _reread(k, pod), "Ready") and p, 120, "the pod Ready after warm-up"
    )
    cond = _condition(ready, PREWARM_CONDITION)
    assert (cond.status, cond.reason) == ("True", "Prewarmed")
    assert f"2 warm-up requests answered by model {MODEL}" in cond.message
    _ready_after_the_gate(ready)
    requests = engine.requests(ip)
    assert [(r.method, r.path) for r in requests] == [
        ("GET", "/v1/models"),
        ("POST", "/v1/completions"),
        ("POST", "/v1/completions"),
    ], "the budget of 2 leaves the third prompt unsent"
    assert [r.body for r in requests[1:]] == [
        {"model": MODEL, "prompt": p, "max_tokens": 1, "temperature": 0} for p in PROMPTS[:2]
    ]
    # The Event follows the condition it reports.
    events = wait_for(lambda: _pod_events(k, pod.metadata.name), 60, "the pod's Event")
    assert [e.reason for e in events] == ["Prewarmed"]

    # The measured cold start (created -> Ready) runs until after the warm-up.
    cold = wait_for(
        lambda: (c := k.status("llm").get("coldStart")) and c.get("samples") and c,
        120,
        "a measured cold start",
    )
    created = ready.metadata.creation_timestamp.timestamp()
    (sample,) = cold["samples"]
    assert sample == round(_at(_condition(ready, "Ready")) - created, 1)
    assert sample >= _at(cond) - created


def test_a_failing_or_hanging_engine_still_releases_its_pod_with_the_reason_and_events(
    kube: Any,
    namespace: str,
    operator: Metrics,
    engine: FakeEngine,
    loopback_node: Callable[[], tuple[str, str]],
) -> None:
    k = Kube(kube, namespace)
    cases = {
        "broken": (Behaviour(completion_status=500, completion_body=b"CUDA error"), 600),
        "hung": (Behaviour(hang=True), 3),
    }
    for name, (behaviour, timeout) in cases.items():
        node, prefix = loopback_node()
        engine.set_behaviour(prefix, behaviour)
        k.create_deployment(_deployment(name, node))
        _pool(k, name, {"prompts": PROMPTS, "port": engine.port, "timeoutSeconds": timeout})

    expected = {
        "broken": ("PrewarmFailed", "3 of 3 warm-up requests failed (first: HTTP 500: CUDA error)"),
        "hung": ("PrewarmTimedOut", "not done within 3 s: waiting for warm-up request 1"),
    }
    for name, (reason, says) in expected.items():
        pod = _pod(k, name)
        ready = wait_for(
            functools.partial(_ready_again, k, pod),
            180,
            f"{name}: the pod Ready in spite of its warm-up",
        )
        cond = _condition(ready, PREWARM_CONDITION)
        assert (cond.status, cond.reason) == ("True", reason)
        assert says in cond.message
        _ready_after_the_gate(ready)
        warnings = wait_for(
            functools.partial(_warning_events, k, name, reason),
            60,
            f"{name}: a {reason} Event on the pool",
        )
        assert f"pod {pod.metadata.name}: " in warnings[0].message
        assert says in warnings[0].message
        pod_events = [e for e in _pod_events(k, pod.metadata.name) if e.reason == reason]
        assert [e.type for e in pod_events] == ["Warning"]


def test_without_the_gate_pods_are_warmed_best_effort_and_the_pool_says_so(
    kube: Any,
    namespace: str,
    operator: Metrics,
    engine: FakeEngine,
    loopback_node: Callable[[], tuple[str, str]],
) -> None:
    k = Kube(kube, namespace)
    node, prefix = loopback_node()
    hold = threading.Event()
    engine.set_behaviour(prefix, Behaviour(hold=hold))
    k.create_deployment(_deployment("open", node, gated=False))
    _pool(k, "open", {"prompts": PROMPTS[:1], "port": engine.port})
    cond = wait_for(
        lambda: (c := k.condition("open", "Prewarm")) and c["reason"] == "NotGated" and c,
        60,
        "Prewarm=False NotGated",
    )
    assert cond["status"] == "False"
    assert f"lists no readinessGate {PREWARM_CONDITION}" in cond["message"]
    (event,) = [e for e in k.events("open") if e.reason == "NotGated"]
    assert event.type == "Warning"

    # Ready without waiting for the warm-up the engine still holds; warmed all the same.
    pod = _pod(k, "open")
    ip = wait_for(lambda: _reread(k, pod).status.pod_ip, 60, "the pod's IP")
    wait_for(lambda: engine.completions(ip), 120, "the warm-up request")
    wait_for(lambda: _true(_reread(k, pod), "Ready"), 120, "the pod Ready, warm-up or not")
    assert _condition(_reread(k, pod), PREWARM_CONDITION) is None
    hold.set()
    done = wait_for(
        lambda: (c := _condition(_reread(k, pod), PREWARM_CONDITION)) and c,
        120,
        "the condition recorded on the pod",
    )
    assert (done.status, done.reason) == ("True", "Prewarmed")


# ---------------------------------------------------------------------- the Service
def test_a_gated_pod_waits_out_of_its_service_until_a_starting_operator_releases_it(
    cluster: LocalCluster,
    crd: None,
    kube: Any,
    namespace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The hazard and its end: with no operator running, a gated pod stays out of its
    Service; the operator, once started, decides for it at once. Its prompts' ConfigMap is
    missing (bad input): the pod is released as failed, the pool says why."""
    k = Kube(kube, namespace)
    k.create_deployment(_deployment("svc", None))
    k.core.create_namespaced_service(
        namespace,
        {
            "metadata": {"name": "svc"},
            "spec": {"selector": {"app": "svc"}, "ports": [{"port": 80}]},
        },
    )
    discovery: Any = client.DiscoveryV1Api(kube)

    def endpoint(pod_name: str) -> Any:
        slices = discovery.list_namespaced_endpoint_slice(
            namespace, label_selector="kubernetes.io/service-name=svc"
        ).items
        found = [
            e
            for s in slices
            for e in s.endpoints or []
            if e.target_ref is not None and e.target_ref.name == pod_name
        ]
        return found[0] if found else None

    pod = _pod(k, "svc")
    wait_for(lambda: _true(_reread(k, pod), "ContainersReady"), 60, "containers ready")
    waiting = wait_for(lambda: endpoint(pod.metadata.name), 120, "the pod in the EndpointSlice")
    assert waiting.conditions.ready is False
    assert not _true(_reread(k, pod), "Ready")

    _pool(k, "svc", {"configMapRef": {"name": "missing-prompts"}})
    with chart_identity(cluster, namespace, tmp_path) as identity:
        monkeypatch.setenv("KUBECONFIG", str(identity.kubeconfig))
        with running_operator(cluster, namespace, identity):
            ready = wait_for(
                lambda: _true(p := _reread(k, pod), "Ready") and p, 120, "the pod Ready"
            )
            cond = _condition(ready, PREWARM_CONDITION)
            assert (cond.status, cond.reason) == ("True", "PrewarmFailed")
            assert "ConfigMap missing-prompts (spec.prewarm.configMapRef) not found" in (
                cond.message
            )
            _ready_after_the_gate(ready)
            wait_for(
                lambda: (e := endpoint(pod.metadata.name)) and e.conditions.ready,
                120,
                "the pod's endpoint ready",
            )
            gate = wait_for(
                lambda: (c := k.condition("svc", "Prewarm")) and c, 60, "Prewarm on the pool"
            )
            assert (gate["status"], gate["reason"]) == ("False", "PromptsUnavailable")
            reasons = wait_for(
                lambda: (
                    {"PromptsUnavailable", "PrewarmFailed"} <= {e.reason for e in k.events("svc")}
                ),
                60,
                "the pool's Warning Events",
            )
            assert reasons


# ---------------------------------------------------------------------- bad input
BAD_PREWARM: list[tuple[str, dict[str, Any], str]] = [
    ("both-sources", {"prompts": ["a"], "configMapRef": {"name": "p"}}, "exactly one of prompts"),
    ("no-source", {"maxRequests": 2}, "exactly one of prompts"),
    ("empty-prompts", {"prompts": []}, "spec.prewarm.prompts"),
    ("empty-prompt", {"prompts": [""]}, "spec.prewarm.prompts[0]"),
    ("zero-budget", {"prompts": ["a"], "maxRequests": 0}, "spec.prewarm.maxRequests"),
    ("zero-timeout", {"prompts": ["a"], "timeoutSeconds": 0}, "spec.prewarm.timeoutSeconds"),
    ("port-zero", {"prompts": ["a"], "port": 0}, "spec.prewarm.port"),
    ("relative-path", {"prompts": ["a"], "path": "v1/completions"}, "spec.prewarm.path"),
    ("path-with-query", {"prompts": ["a"], "modelsPath": "/v1/models?x=1"}, "modelsPath"),
    ("bad-key", {"configMapRef": {"name": "p", "key": "a/b"}}, "configMapRef.key"),
]


@pytest.mark.parametrize(
    ("prewarm", "fragment"),
    [case[1:] for case in BAD_PREWARM],
    ids=[case[0] for case in BAD_PREWARM],
)
def test_the_api_server_refuses_a_malformed_prewarm(
    kube: Any, namespace: str, crd: None, prewarm: dict[str, Any], fragment: str
) -> None:
    k = Kube(kube, namespace)
    with pytest.raises(ApiException) as info:
        _pool(k, "bad", prewarm)
    assert info.value.status == 422, prewarm
    assert info.value.body is not None, prewarm
    assert fragment in info.value.body, (prewarm, info.value.body)
