"""The degradation policy enforced by real gateways, end to end, on the local cluster.

One world: the Gateway API Inference Extension's CRDs beside prescaler's, a pool whose
fleet has nothing Ready (so the operator, as the chart runs it, raises it to ``critical``
on the forecast shortfall and writes its ConfigMap), ``prescaler admit`` as its own
process watching that ConfigMap, and NGINX and Caddy configured as ``docs/degradation.md``
shows, in front of the fake engine. Both gateways must shed ``batch`` with 503 and the
ConfigMap's exact ``Retry-After``, let ``interactive`` through, answer 413 to a context
above the cap, let everything through once the level falls, and, with ``prescaler admit``
hung or stopped, let every request through with none lost or left hanging.

``prescaler admit`` acts as the chart's ServiceAccount for it, and the audit log shows it
only listed and watched ConfigMaps. A second one reads through a fault proxy that answers
its first watch with ``410 Gone`` and cuts the next: it must list again, resume, and agree
with the first on every check. The operator's own ConfigMap drives the rise; the
later changes (a cap, the fall, another contract) are written to the ConfigMap directly,
which is what a gateway sees either way.
The operator never touches the Inference Extension's ``InferencePool`` of the same name:
the API server's audit log holds every call it made. Last, the chart installs beside the
Inference Extension's CRDs with ``admission.enabled``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from cluster import procs
from cluster.apiproxy import ApiProxy, Rule
from cluster.fake_engine import FakeEngine
from cluster.gateways import Gateway
from cluster.launcher import LocalCluster
from cluster.objects import gpu_deployment
from cluster.paths import PROJECT_ROOT, bin_dir, gie_crds_dir
from integration.chart_rbac import admission_identity, audit_calls, chart_identity
from integration.history_world import (  # noqa: F401 (fixtures)
    LIVE_RECENT_MEAN,
    HistoryWorld,
    world_fixture,
)
from integration.operator_fixtures import (  # noqa: F401 (fixtures)
    crd_fixture,
    running_operator,
    scrape,
    wait_for,
)

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus]

GIE_GROUP = "inference.networking.k8s.io"
MODEL = {"tokensPerSecond": 3750, "promptTokens": 600, "outputTokens": 150}
SHED_BODY = "overloaded: lane batch is shed at critical, retry later\n"
REQUEST_TIMEOUT = 60.0
"""A request through a gateway that takes longer than this has hung."""


@dataclass(frozen=True)
class Reply:
    status: int
    retry_after: str | None
    body: str


def send(
    gateway: Gateway, lane: str | None, body: bytes = b'{"prompt": "hi"}', **headers: str
) -> Reply:
    """One completion request through ``gateway`` in ``lane``."""
    sent = {"Content-Type": "application/json", **headers}
    if lane is not None:
        sent["x-priority-lane"] = lane
    request = urllib.request.Request(f"{gateway.url}/v1/completions", data=body, headers=sent)
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT) as answer:
            return Reply(answer.status, answer.headers.get("Retry-After"), answer.read().decode())
    except urllib.error.HTTPError as exc:
        return Reply(exc.code, exc.headers.get("Retry-After"), exc.read().decode())


def install_gie_crds(api: Any) -> list[str]:
    """The Inference Extension's CRDs (``make cluster-bin`` copies them from its module),
    installed and Established; their names."""
    ext: Any = client.ApiextensionsV1Api(api)
    names = []
    for path in sorted(gie_crds_dir().glob("*.yaml")):
        body = yaml.safe_load(path.read_text())
        names.append(body["metadata"]["name"])
        with contextlib.suppress(ApiException):
            ext.create_custom_resource_definition(body)

    def established() -> bool:
        for name in names:
            conditions = ext.read_custom_resource_definition(name).status.conditions or []
            if not any(c.type == "Established" and c.status == "True" for c in conditions):
                return False
        return True

    wait_for(established, 60, "the Inference Extension's CRDs to be Established")
    return names


@contextlib.contextmanager
def admit_process(namespace: str, kubeconfig: Path, directory: Path) -> Iterator[procs.Proc]:
    """``prescaler admit`` serving ``namespace`` as ``kubeconfig``'s user, once ready."""
    directory.mkdir(parents=True, exist_ok=True)
    port, metrics_port = procs.free_port(), procs.free_port()
    argv = [sys.executable, "-m", "prescaler.cli", "admit", "--namespace", namespace,
            "--host", "127.0.0.1", "--port", str(port), "--metrics-port", str(metrics_port),
            "--kubeconfig", str(kubeconfig)]  # fmt: skip
    proc = procs.start("prescaler-admit", argv, directory, tie_to_parent=True)
    try:

        def ready() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
                return bool(r.status == 200)

        procs.wait_for("prescaler admit to be ready", ready, 120, [proc])
        object.__setattr__(proc, "ports", (port, metrics_port))
        yield proc
    finally:
        proc.stop()


def kubectl(cluster: LocalCluster, *args: str) -> str:
    argv = [str(bin_dir() / "kubectl"), "--kubeconfig", str(cluster.kubeconfig), *args]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_nginx_and_caddy_enforce_the_pools_policy_and_fail_open(
    world: HistoryWorld, tmp_path: Path, api_proxy: ApiProxy
) -> None:
    k, namespace, cluster = world.kube, world.namespace, world.cluster
    api = cluster.api_client()
    try:
        install_gie_crds(api)
        custom: Any = client.CustomObjectsApi(api)
        body = {
            "apiVersion": f"{GIE_GROUP}/v1",
            "kind": "InferencePool",
            "metadata": {"name": "chat"},
            "spec": {
                "selector": {"matchLabels": {"app": "llm"}},
                "targetPorts": [{"number": 8000}],
                "endpointPickerRef": {"name": "epp", "port": {"number": 9002}},
            },
        }
        gie_pool: dict[str, Any] = custom.create_namespaced_custom_object(
            GIE_GROUP, "v1", namespace, "inferencepools", body
        )
    finally:
        api.close()

    # A fleet with nothing Ready within the next cold start: the forecast demand is short
    # by all of it, so the operator raises the pool to critical.
    k.create_deployment(gpu_deployment("llm", 2, ready_delay="3600s"))
    now = time.time()
    world.backfill(lambda _: 6.0, now - 3600, now + 900)
    spec = world.pool_spec(
        {"minReplicas": 1, "maxReplicas": 2, "model": MODEL,
         "coldStart": {"mode": "fixed", "seconds": 900, "marginSeconds": 0}},
        LIVE_RECENT_MEAN,
    )  # fmt: skip
    spec["policy"] = "forecast"
    cm_name = "chat-degradation"

    def config_map() -> dict[str, str]:
        data: dict[str, str] = k.core.read_namespaced_config_map(cm_name, namespace).data
        return data

    def shed_reply(gateway: Gateway) -> Reply:
        """The first 503 on batch (prescaler admit may not have seen the write yet)."""
        deadline = time.monotonic() + 60
        while True:
            reply = through(gateway, "batch")
            if reply.status == 503 or time.monotonic() > deadline:
                return reply
            time.sleep(0.5)

    admitted = 0  # 200s the gateways answered: the engine must have received each

    def through(gateway: Gateway, lane: str | None, **kw: Any) -> Reply:
        nonlocal admitted
        reply = send(gateway, lane, **kw)
        admitted += reply.status == 200
        return reply

    # A second prescaler admit reads through a proxy that answers its first watch with
    # 410 Gone (it must list again) and cuts the next one after 2 s (it must resume).
    gone = api_proxy.add(Rule("GET", r"/configmaps$", action="gone", watch=True))
    cut = api_proxy.add(Rule("GET", r"/configmaps$", action="drop", watch=True, drop_after=2.0))
    with (
        admission_identity(cluster, namespace, tmp_path) as admit_identity,
        FakeEngine() as engine,
        admit_process(namespace, admit_identity.kubeconfig, tmp_path / "admit") as admit,
        admit_process(namespace, api_proxy.kubeconfig, tmp_path / "admit-2") as faulted,
    ):
        port, metrics_port = admit.ports  # type: ignore[attr-defined]
        faulted_port = faulted.ports[0]  # type: ignore[attr-defined]
        where = {"admit_port": port, "engine_port": engine.port, "pool": f"{namespace}/chat"}
        with (
            Gateway.nginx(tmp_path / "nginx", **where) as nginx,
            Gateway.caddy(tmp_path / "caddy", **where) as caddy,
        ):
            gateways = (nginx, caddy)
            # No ConfigMap yet: an unknown pool, let through.
            for g in gateways:
                assert through(g, "batch").status == 200, g.name

            # The operator, as the chart runs it, raises the level and writes the ConfigMap.
            with chart_identity(cluster, namespace, tmp_path) as identity:
                world.monkeypatch.setenv("KUBECONFIG", str(identity.kubeconfig))
                with running_operator(cluster, namespace, identity):
                    k.create_pool("chat", spec)
                    wait_for(
                        lambda: config_map().get("level") == "critical" if _exists(k, cm_name)
                        else False, 240, "the operator's ConfigMap at critical",
                    )  # fmt: skip
                    data = config_map()
                    assert data["shedLanes"] == "batch"
                    degradation = wait_for(
                        lambda: k.status("chat").get("degradation"), 60, "the pool's status"
                    )
                    assert "forecastShortfall" in degradation["raisedBy"], degradation
                    for g in gateways:
                        # Retry-After counts down to the next replica at each reconcile:
                        # the answer is the ConfigMap's value from just before or after.
                        before = config_map()["retryAfterSeconds"]
                        shed = shed_reply(g)
                        after = config_map()["retryAfterSeconds"]
                        assert shed.retry_after in (before, after), (g.name, shed, before, after)
                        assert int(shed.retry_after) > 0
                        assert shed.body == SHED_BODY
                        assert through(g, "interactive").status == 200, g.name
                calls = audit_calls(cluster, identity.user)
            assert calls, "the audit log has none of the operator's calls"
            assert not [c for c in calls if c.grant[0] == GIE_GROUP], "it called GIE's API"

            # The operator stopped: the ConfigMap now changes only as written here.
            def write(**values: str) -> None:
                k.core.patch_namespaced_config_map(cm_name, namespace, {"data": values})

            def outcome(at: int, headers: dict[str, str]) -> str:
                request = urllib.request.Request(
                    f"http://127.0.0.1:{at}/check",
                    headers={"x-prescaler-pool": f"{namespace}/chat", **headers},
                )
                try:
                    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT) as answer:
                        return str(answer.headers["x-prescaler-outcome"])
                except urllib.error.HTTPError as exc:
                    return str(exc.headers["x-prescaler-outcome"])

            def check(**headers: str) -> str:
                """The check's outcome, once both prescaler admits agree on it."""
                seen = {outcome(at, headers) for at in (port, faulted_port)}
                return seen.pop() if len(seen) == 1 else f"disagree: {seen}"

            write(level="critical", retryAfterSeconds="37", maxContextTokens="4096",
                  shedLanes="batch", smallerModelRoute="llama-8b",
                  smallerModelMaxPromptTokens="1024")  # fmt: skip
            wait_for(lambda: check(**{"x-priority-lane": "interactive",
                                      "x-context-tokens": "5000"}) == "too_long",
                     60, "prescaler admit to see the cap")  # fmt: skip
            long_body = b'{"prompt": "' + b"x" * 20_000 + b'"}'
            for g in gateways:
                shed = through(g, "batch")
                assert (shed.status, shed.retry_after) == (503, "37"), (g.name, shed)
                assert through(g, "interactive").status == 200, g.name
                too_long = through(g, "interactive", **{"x-context-tokens": "5000"})
                assert too_long.status == 413, (g.name, too_long)
                assert too_long.body == "context of 5000 tokens above the cap of 4096 for now\n"
                # No context header: the body's length stands in for it.
                estimated = through(g, "interactive", body=long_body)
                assert estimated.status == 413, (g.name, estimated)
                assert "about 5004 tokens" in estimated.body
                assert through(g, "interactive", **{"x-context-tokens": "4096"}).status == 200
                # A short request may go to the smaller model: the engine is told its route.
                seen = len(engine.completions())
                short = through(g, "interactive", **{"x-prompt-tokens": "100"})
                assert short.status == 200, (g.name, short)
                routed = engine.completions()[seen:]
                assert [r.headers.get("x-prescaler-route") for r in routed] == ["llama-8b"]
                # A malformed context header is not the policy's to refuse.
                bad = through(g, "interactive", **{"x-context-tokens": "lots"})
                assert bad.status == 200, (g.name, bad)

            # The level falls: everything passes.
            write(level="normal", retryAfterSeconds="", maxContextTokens="", shedLanes="",
                  smallerModelRoute="", smallerModelMaxPromptTokens="")  # fmt: skip
            wait_for(lambda: check(**{"x-priority-lane": "batch"}) == "admitted", 60,
                     "prescaler admit to see normal")  # fmt: skip
            for g in gateways:
                assert through(g, "batch").status == 200, g.name
                assert through(g, "interactive", **{"x-context-tokens": "99999"}).status == 200

            # A policy of another contract is not understood: let through, counted.
            write(contract="prescaler.io/degradation/v2", level="critical", shedLanes="batch")
            wait_for(lambda: check(**{"x-priority-lane": "batch"}) == "open_unreadable", 60,
                     "prescaler admit to see the other contract")  # fmt: skip
            for g in gateways:
                assert through(g, "batch").status == 200, g.name
            counted = scrape(metrics_port)
            assert counted["prescaler_admission_checks_total"] > 0
            write(contract="prescaler.io/degradation/v1")
            wait_for(lambda: check(**{"x-priority-lane": "batch"}) == "shed", 60,
                     "prescaler admit to shed again")  # fmt: skip
            assert through(nginx, "batch").status == 503

            # The faulted prescaler admit listed again after 410 Gone, resumed after the
            # cut, and followed every write above.
            assert (gone.fired, cut.fired) == (1, 1)
            lists = [x for x in api_proxy.seen() if x.path.endswith("/configmaps")
                     and "watch=" not in x.query]  # fmt: skip
            assert len(lists) >= 2, lists

            # prescaler admit hung (stopped by SIGSTOP: it accepts connections and never
            # answers): both gateways give up on the check after its timeout and let the
            # requests through.
            os.kill(admit.pid, signal.SIGSTOP)
            try:
                with ThreadPoolExecutor(4) as pool:
                    hung = {g.name: list(pool.map(lambda lane, g=g: through(g, lane),
                                                  ["batch", "interactive"] * 2))
                            for g in gateways}  # fmt: skip
            finally:
                os.kill(admit.pid, signal.SIGCONT)
            for name, got in hung.items():
                assert [r.status for r in got] == [200] * 4, (name, got)

            # prescaler admit stopped: both gateways let every request through, none hangs.
            admit.stop()
            lanes = ["batch", "interactive", None] * 4
            with ThreadPoolExecutor(8) as pool:
                replies = {
                    g.name: list(pool.map(lambda lane, g=g: through(g, lane), lanes))
                    for g in gateways
                }
            for name, got in replies.items():
                assert [r.status for r in got] == [200] * len(lanes), (name, got)

        # Nothing lost: every 200 reached the engine, and nothing else did.
        assert len(engine.completions()) == admitted
        # prescaler admit, as the chart runs it, only listed and watched ConfigMaps.
        admit_calls = audit_calls(cluster, admit_identity.user)
        assert admit_calls, "the audit log has none of prescaler admit's calls"
        assert {c.grant for c in admit_calls} == {
            ("", "configmaps", "list"),
            ("", "configmaps", "watch"),
        }, admit_calls
        assert not [c for c in admit_calls if c.forbidden_by_rbac]

    # Each pool is addressed by its own resource: the short name, or the full name.
    assert kubectl(cluster, "get", "ppool", "-n", namespace, "-o", "name").split() == [
        "inferencepool.prescaler.io/chat"
    ]
    full = f"inferencepools.{GIE_GROUP}"
    assert kubectl(cluster, "get", full, "-n", namespace, "-o", "name").split() == [
        f"inferencepool.{GIE_GROUP}/chat"
    ]
    # The operator left the Inference Extension's pool as it was created.
    api = cluster.api_client()
    try:
        reader: Any = client.CustomObjectsApi(api)
        now_gie: dict[str, Any] = reader.get_namespaced_custom_object(
            GIE_GROUP, "v1", namespace, "inferencepools", "chat"
        )
    finally:
        api.close()
    assert now_gie["metadata"]["resourceVersion"] == gie_pool["metadata"]["resourceVersion"]

    # The chart installs beside the Inference Extension's CRDs, prescaler admit included.
    with helm_installed(cluster, namespace, tmp_path / "helm") as release:
        api = cluster.api_client()
        try:
            apps: Any = client.AppsV1Api(api)
            admission = apps.read_namespaced_deployment(f"{release}-admission", namespace)
            assert admission.spec.replicas == 2
            core: Any = client.CoreV1Api(api)
            service = core.read_namespaced_service(f"{release}-admission", namespace)
            assert [p.port for p in service.spec.ports] == [8081]
            policy: Any = client.PolicyV1Api(api)
            assert policy.read_namespaced_pod_disruption_budget(f"{release}-admission", namespace)
        finally:
            api.close()


@contextlib.contextmanager
def helm_installed(cluster: LocalCluster, namespace: str, home: Path) -> Iterator[str]:
    """``helm install`` of the chart in ``namespace`` with ``admission.enabled``, watching
    that namespace; yields the release's fullname; uninstalls."""
    release = f"p-{namespace}"
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }

    def helm(*args: str) -> None:
        argv = [str(bin_dir() / "helm"), *args, "--namespace", namespace]
        out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600,
                             check=False)  # fmt: skip
        assert out.returncode == 0, out.stderr

    helm("install", release, str(PROJECT_ROOT / "charts" / "prescaler"),
         "--set", f"fullnameOverride={release}", "--set", "admission.enabled=true",
         "--set-json", f'watch.namespaces=["{namespace}"]',
         "--set", "placeholderPriorityClass.create=false", "--timeout", "5m")  # fmt: skip
    try:
        yield release
    finally:
        helm("uninstall", release, "--wait")


def _exists(k: Any, name: str) -> bool:
    try:
        k.core.read_namespaced_config_map(name, k.ns)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True
