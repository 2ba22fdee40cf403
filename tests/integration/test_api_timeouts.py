"""An API server connection that accepts a request and never answers holds nothing for
ever: a pipeline call is retried after its timeout, and a leader whose renewal hung stops
acting, then wins its Lease back. Through the fault-injecting proxy in front of the real
kube-apiserver (``cluster.apiproxy``, rule ``hang``); every wait is on a condition with a
generous deadline."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes import client

from cluster.apiproxy import ApiProxy, Rule
from cluster.objects import gpu_deployment
from prescaler.kube import KubeClient, LeaseElector, LeaseTimings, load_api_client

pytestmark = pytest.mark.cluster

DEADLINE = 120.0
"""Seconds a wait may take on a busy machine before the test fails (the calls' and the
Lease's own timeouts are a few seconds)."""


def test_a_call_whose_connection_never_answers_is_retried_after_its_timeout(
    kube: Any, namespace: str, api_proxy: ApiProxy
) -> None:
    apps: Any = client.AppsV1Api(kube)
    apps.create_namespaced_deployment(namespace, gpu_deployment("llm", 2))
    hang = api_proxy.add(Rule("GET", r"/deployments/llm$", action="hang", times=1, watch=False))
    api = load_api_client(str(api_proxy.kubeconfig))
    pipeline = KubeClient(api, threads=2, timeout_seconds=2.0)

    async def read() -> Any:
        return await asyncio.wait_for(
            pipeline.get_workload(namespace, "Deployment", "llm"), DEADLINE
        )

    try:
        workload = asyncio.run(read())
    finally:
        pipeline.close()
    assert workload.replicas == 2
    assert hang.fired == 1
    reads = [s for s in api_proxy.seen() if s.path.endswith("/deployments/llm")]
    assert [s.injected for s in reads] == ["hang", None]  # the hung attempt, then its retry


def test_a_leader_whose_renewal_hung_stops_acting_and_rejoins(
    namespace: str, api_proxy: ApiProxy
) -> None:
    """Before: the Lease calls had no timeout, so the one renewal thread waited for ever on
    the hung read and the replica never took part in the election again."""
    timings = LeaseTimings(
        lease_duration_seconds=8, renew_deadline_seconds=4, retry_period_seconds=1
    )
    api = load_api_client(str(api_proxy.kubeconfig))
    changes: list[bool] = []
    elector = LeaseElector.for_client(
        api, namespace, "lead", "a", timings=timings, on_change=changes.append
    )

    async def until(what: str, check: Any) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEADLINE
        while not check():
            assert loop.time() < deadline, f"not within {DEADLINE:g} s: {what}"
            await asyncio.sleep(0.1)

    async def scenario() -> None:
        stop = asyncio.Event()
        running = asyncio.create_task(elector.run(stop))
        try:
            await until("the first lead", lambda: changes == [True])
            api_proxy.add(Rule("GET", r"/leases/lead$", action="hang", times=1, watch=False))
            await until("the lead lost to the hung renewal", lambda: changes[-1:] == [False])
            await until("the lead won back", lambda: changes[-1:] == [True])
            assert elector.is_leader()
        finally:
            stop.set()
            await asyncio.wait_for(running, DEADLINE)

    try:
        asyncio.run(scenario())
    finally:
        api.close()  # type: ignore[no-untyped-call]
    assert changes == [True, False, True, False]  # the last: stopped, it let the Lease go
    hung = [s for s in api_proxy.seen() if s.injected == "hang"]
    assert len(hung) == 1
