"""Fixtures and helpers for the operator's cluster tests: the CRD, the operator in a thread.

Import the fixtures into a test module (``from integration.operator_fixtures import ...``).
The operator runs in-process (``prescaler.controller.runtime.operate``) in its own thread and
event loop, watching only the test's namespace, with a fast timer. The ``operator`` fixture
runs it as the Helm chart does: as the chart's ServiceAccount, under the chart's RBAC
(``integration.chart_rbac``), leader on the chart's Lease.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from cluster.launcher import LocalCluster
from cluster.objects import gpu_deployment
from cluster.procs import free_port
from integration.chart_rbac import ChartIdentity, chart_identity
from prescaler.api import GROUP, PLURAL, VERSION
from prescaler.metrics import Metrics
from prescaler.settings import (
    LeaderSettings,
    MetricsSettings,
    OperatorSettings,
    ReconcileSettings,
    ScalerSettings,
    WatchSettings,
)

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / f"{PLURAL}.{GROUP}.yaml"


MIN_DEADLINE = 180.0
"""The shortest a test waits for anything. A wait ends as soon as its condition holds, so a
long deadline costs a passing test nothing; a short one fails on a busy machine."""


RECONCILE_SECONDS = 1.0
"""The test operators' reconcile period (a plan's lookahead covers it too)."""


def wait_for(
    check: Callable[[], Any],
    timeout: float,
    what: str,
    interval: float = 0.25,
    explain: Callable[[], str] | None = None,
) -> Any:
    """Poll until ``check()`` is truthy; fail the test naming ``what`` otherwise (and, with
    ``explain``, what it returns then: the state of the chain that should have got there).
    The deadline is ``timeout`` seconds, but never less than :data:`MIN_DEADLINE`."""
    timeout = max(timeout, MIN_DEADLINE)
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    message = f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})"
    if explain is not None:
        try:
            message += "\n" + explain()
        except Exception as exc:  # a diagnosis must not hide the failure
            message += f"\n(no diagnosis: {exc!r})"
    pytest.fail(message)


@pytest.fixture(scope="session", name="crd")
def crd_fixture(cluster: LocalCluster) -> None:
    """The generated CRD, installed once and Established."""
    api_client = cluster.api_client()
    ext: Any = client.ApiextensionsV1Api(api_client)
    body = yaml.safe_load(CRD_FILE.read_text())
    name = body["metadata"]["name"]
    try:
        ext.create_custom_resource_definition(body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        current = ext.read_custom_resource_definition(name)
        body["metadata"]["resourceVersion"] = current.metadata.resource_version
        ext.replace_custom_resource_definition(name, body)

    def established() -> bool:
        conditions = ext.read_custom_resource_definition(name).status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    wait_for(established, 30, "the CRD to be Established")
    api_client.close()


@contextmanager
def running_operator(
    cluster: LocalCluster,
    namespace: str,
    identity: ChartIdentity | None = None,
    clusterwide: bool = False,
    shards: int = 0,
    scaler: ScalerSettings | None = None,
    **reconcile: Any,
) -> Iterator[Metrics]:
    """The operator watching ``namespace`` (or every namespace) until the block ends; yields
    its metrics. With ``identity`` it acts as the chart's ServiceAccount and elects itself
    leader on the chart's Lease in ``namespace`` (with ``shards``: holds the chart's shard
    Leases), as the chart runs it; else as the admin. ``scaler``: the KEDA external
    scaler's settings (off by default)."""
    from prescaler.controller.runtime import run_operator

    leader = LeaderSettings()
    if identity is not None and identity.lease_name:
        base = identity.lease_name.removesuffix("-shard-0")
        leader = LeaderSettings(enabled=True, lease_name=base, namespace=namespace, shards=shards)
    kubeconfig = identity.kubeconfig if identity is not None else cluster.kubeconfig
    settings = OperatorSettings(
        watch=WatchSettings(namespaces=() if clusterwide else (namespace,)),
        leader=leader,
        metrics=MetricsSettings(port=0),
        scaler=scaler or ScalerSettings(),
        reconcile=replace(
            ReconcileSettings(
                interval_seconds=RECONCILE_SECONDS,
                forecast_workers=0,
                forecast_wait_seconds=20.0,
                kubeconfig=str(kubeconfig),
                kube_threads=4,
            ),
            **reconcile,
        ),
    )
    metrics = Metrics()
    stop, ready = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def main() -> None:
        try:
            run_operator(settings, stop_flag=stop, ready_flag=ready, metrics=metrics)
        except BaseException as exc:  # surfaced in the test thread
            errors.append(exc)

    thread = threading.Thread(target=main, name="prescaler-operator", daemon=True)
    thread.start()
    wait_for(lambda: ready.is_set() or errors, 60, "the operator to start")
    if errors:
        raise errors[0]
    try:
        yield metrics
    finally:
        stop.set()
        thread.join(STOP_TIMEOUT)
        if thread.is_alive():
            pytest.fail(f"the operator did not stop within {STOP_TIMEOUT:.0f} s of its stop flag")
        collect_leaks("the operator")
        if errors:
            raise errors[0]


STOP_TIMEOUT = 300.0
"""How long a stopped operator may take to finish (kopf stops its watchers, runs the
cleanup and closes its sessions); generous, for a busy machine."""


def collect_leaks(what: str) -> None:
    """Collect garbage now, so whatever ``what`` left open is reported here, by the fixture
    that ran it, and not by whichever later test the collector happens to run in."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        gc.collect()
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    if leaks:
        pytest.fail(f"{what} left {len(leaks)} resource(s) open: " + "; ".join(leaks[:3]))


@contextmanager
def chart_operator(
    cluster: LocalCluster,
    namespace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    **reconcile: Any,
) -> Iterator[Metrics]:
    """The operator as the Helm chart runs it (its ServiceAccount, RBAC and Lease), with
    reconcile settings of the test's (``running_operator``'s keywords)."""
    with chart_identity(cluster, namespace, tmp_path) as identity:
        monkeypatch.setenv("KUBECONFIG", str(identity.kubeconfig))  # kopf's own login
        with running_operator(cluster, namespace, identity, **reconcile) as metrics:
            yield metrics


@pytest.fixture(name="operator")
def operator_fixture(
    cluster: LocalCluster,
    crd: None,
    namespace: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> Iterator[Metrics]:
    """The operator on the test namespace with a 1 s timer, as the Helm chart runs it: under
    the chart's ServiceAccount and RBAC for that namespace (a rule it lacks fails the test),
    leader on the chart's Lease."""
    with chart_operator(cluster, namespace, tmp_path, monkeypatch) as metrics:
        yield metrics


# ---------------------------------------------------------------------- objects
def pool_body(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferencePool",
        "metadata": {"name": name},
        "spec": spec,
    }


class Kube:
    """Small typed-enough helpers over the test's ApiClient."""

    def __init__(self, api_client: Any, namespace: str) -> None:
        self.ns = namespace
        self.apps: Any = client.AppsV1Api(api_client)
        self.core: Any = client.CoreV1Api(api_client)
        self.custom: Any = client.CustomObjectsApi(api_client)
        self.autoscaling: Any = client.AutoscalingV2Api(api_client)

    def create_deployment(self, body: dict[str, Any]) -> None:
        self.apps.create_namespaced_deployment(self.ns, body)

    def deployment(self, name: str) -> Any:
        return self.apps.read_namespaced_deployment(name, self.ns)

    def create_pool(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return dict(
            self.custom.create_namespaced_custom_object(
                GROUP, VERSION, self.ns, PLURAL, pool_body(name, spec)
            )
        )

    def pool(self, name: str) -> dict[str, Any]:
        return dict(self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name))

    def status(self, name: str) -> dict[str, Any]:
        return dict(self.pool(name).get("status") or {})

    def condition(self, name: str, kind: str) -> dict[str, Any] | None:
        for cond in self.status(name).get("conditions", []):
            if cond["type"] == kind:
                return dict(cond)
        return None

    def condition_is(self, name: str, kind: str, status: str) -> dict[str, Any] | None:
        """Pool ``name``'s condition ``kind`` while its status is ``status``, else None: a
        check for :func:`wait_for` that returns the condition it waited for."""
        cond = self.condition(name, kind)
        return cond if cond is not None and cond["status"] == status else None

    def deployment_and_pool(self, min_replicas: int, **extra: Any) -> None:
        """Deployment ``llm`` (1 GPU replica) and pool ``chat`` scaling it within
        ``[min_replicas, 6]``, 30 s fixed cold start, planned on schedules and bounds."""
        self.create_deployment(gpu_deployment("llm", 1))
        self.create_pool(
            "chat",
            {
                "target": {"name": "llm"},
                "minReplicas": min_replicas,
                "maxReplicas": 6,
                "model": {"tokensPerSecond": 3750},
                "coldStart": {"mode": "fixed", "seconds": 30},
                **extra,
            },
        )

    def patch_pool(self, name: str, spec: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, self.ns, PLURAL, name, {"spec": spec}
        )

    def delete_pool(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)

    def events(self, name: str) -> list[Any]:
        listing = self.core.list_namespaced_event(
            self.ns, field_selector=f"involvedObject.name={name},involvedObject.kind=InferencePool"
        )
        return sorted(listing.items, key=lambda e: e.metadata.creation_timestamp)

    def event(self, name: str, reason: str, deadline: float = 60) -> Any:
        """The first Event of ``reason`` on pool ``name``, once it is there. The operator
        posts an Event after the write it reports, so a test that saw the write waits."""
        return wait_for(
            lambda: next((e for e in self.events(name) if e.reason == reason), None),
            deadline,
            f"a {reason} Event on {name}",
        )


@contextmanager
def recorded(
    read: Callable[[], Any], interval: float, changes_only: bool = False
) -> Iterator[list[Any]]:
    """Calls ``read`` every ``interval`` seconds in a thread until the block ends; yields
    the list of what it returned (with ``changes_only``, each new value once). A call that
    raises (an API hiccup, an object not there yet) records nothing."""
    seen: list[Any] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):
                value = read()
                if not (changes_only and seen and seen[-1] == value):
                    seen.append(value)
            stop.wait(interval)

    thread = threading.Thread(target=watch, name="recorder", daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(10)


# ---------------------------------------------------------------------- processes
def scrape(port: int) -> dict[str, float]:
    """Sample name (no labels) -> summed value, from one operator process's /metrics
    (empty while it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


@contextmanager
def operator_process(
    cluster: LocalCluster,
    namespace: str,
    log: Path,
    *,
    leader_identity: str | None = None,
    interval: float = 2.0,
    extra_args: Sequence[str] = (),
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``prescaler run`` as a real process on ``namespace`` (as the admin), its output in
    ``log``; yields the process and its metrics port. With ``leader_identity`` it elects a
    leader on the Lease ``prescaler`` in ``namespace`` (``extra_args``, e.g. ``--shards``,
    come after). It runs in a session of its own, and that whole process group is killed
    (SIGKILL) at the end, the operator if it still runs and the fit workers it spawned
    (which a killed operator leaves behind); a test may kill the operator earlier."""
    port = free_port()
    argv = [
        str(Path(sys.executable).parent / "prescaler"),
        "run",
        "--namespace",
        namespace,
        "--metrics-port",
        str(port),
        "--interval",
        str(interval),
        "--forecast-workers",
        "0",
    ]
    if leader_identity is not None:
        argv += [
            "--leader-election",
            "--leader-lease",
            "prescaler",
            "--leader-namespace",
            namespace,
            "--leader-identity",
            leader_identity,
        ]
    argv += list(extra_args)
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield proc, port
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
