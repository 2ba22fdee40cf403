"""High availability: replicas elect one leader on a Lease; only the leader acts.

The election rules run against the real API server with hand-moved clocks (no sleeps); the
failover runs two real ``prescaler run`` processes and kills the leader with SIGKILL.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from cluster.launcher import LocalCluster
from integration.operator_fixtures import (  # noqa: F401 (fixtures)
    Kube,
    crd_fixture,
    operator_process,
    scrape,
    wait_for,
)
from prescaler.kube import LeaseElector, LeaseTimings

pytestmark = pytest.mark.cluster

TIMINGS = LeaseTimings(lease_duration_seconds=15, renew_deadline_seconds=10, retry_period_seconds=2)


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _lease(kube: Any, namespace: str, name: str) -> Any:
    return client.CoordinationV1Api(kube).read_namespaced_lease(name, namespace).spec


def test_the_lease_has_one_holder_and_passes_on_only_after_it_expires(
    kube: Any, namespace: str
) -> None:
    clock_a, clock_b = Clock(), Clock()
    a = LeaseElector.for_client(kube, namespace, "lead", "a", timings=TIMINGS, clock=clock_a)
    b = LeaseElector.for_client(kube, namespace, "lead", "b", timings=TIMINGS, clock=clock_b)

    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    assert a.is_leader()
    assert not b.is_leader()
    assert _lease(kube, namespace, "lead").holder_identity == "a"

    clock_b.advance(14)
    assert not b.try_acquire_or_renew(), "b took a lease that was 14 s old (duration 15 s)"
    assert a.try_acquire_or_renew()  # a renews
    assert not b.try_acquire_or_renew()  # b sees the renewal and counts again from now
    clock_b.advance(14)
    assert not b.try_acquire_or_renew(), "b ignored a's renewal"

    clock_b.advance(2)  # 16 s without a renewal b could see
    assert b.try_acquire_or_renew()
    spec = _lease(kube, namespace, "lead")
    assert spec.holder_identity == "b"
    assert spec.lease_transitions == 1

    # a's next attempt sees b's fresh lease; a stops acting once its renew deadline passes.
    assert not a.try_acquire_or_renew()
    clock_a.advance(TIMINGS.renew_deadline_seconds)
    assert not a.is_leader()
    assert b.is_leader()


def test_a_leader_that_stops_releases_the_lease_at_once(kube: Any, namespace: str) -> None:
    a = LeaseElector.for_client(kube, namespace, "lead", "a", timings=TIMINGS)
    b = LeaseElector.for_client(kube, namespace, "lead", "b", timings=TIMINGS)

    async def lead_then_stop() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(a.run(stop))
        deadline = time.monotonic() + 60
        while not a.is_leader() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert a.is_leader()
        stop.set()
        await asyncio.wait_for(task, 60)

    asyncio.run(lead_then_stop())
    assert not a.is_leader()
    assert _lease(kube, namespace, "lead").holder_identity is None
    assert b.try_acquire_or_renew(), "b had to wait out a lease that was released"


# ---------------------------------------------------------------------- two processes
@contextmanager
def _operator(
    cluster: LocalCluster, namespace: str, identity: str, log_dir: Path
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    with operator_process(
        cluster, namespace, log_dir / f"{identity}.log", leader_identity=identity
    ) as running:
        yield running


def test_two_replicas_exactly_one_acts_and_the_other_takes_over_after_sigkill(
    cluster: LocalCluster, crd: None, kube: Any, namespace: str, tmp_path: Path
) -> None:
    k = Kube(kube, namespace)
    k.deployment_and_pool(min_replicas=2)
    reconciles = "prescaler_reconcile_duration_seconds_count"

    def holder() -> str | None:
        try:
            return str(_lease(kube, namespace, "prescaler").holder_identity or "") or None
        except client.exceptions.ApiException:
            return None

    with (
        _operator(cluster, namespace, "op-a", tmp_path) as (proc_a, port_a),
        _operator(cluster, namespace, "op-b", tmp_path) as (proc_b, port_b),
    ):
        procs = {"op-a": (proc_a, port_a), "op-b": (proc_b, port_b)}
        leader = wait_for(holder, 180, "one replica to take the Lease", interval=0.5)
        follower = "op-b" if leader == "op-a" else "op-a"
        leader_port, follower_port = procs[leader][1], procs[follower][1]
        wait_for(lambda: k.deployment("llm").spec.replicas == 2, 120, "the leader to scale to 2")
        wait_for(lambda: scrape(leader_port).get(reconciles, 0) >= 5, 120, "5 leader reconciles")
        wait_for(lambda: scrape(follower_port), 120, "the standby replica's /metrics")
        standby = scrape(follower_port)
        assert standby.get("prescaler_leader") == 0
        assert standby.get(reconciles, 0) == 0, "the standby replica reconciled"
        assert scrape(leader_port).get("prescaler_leader") == 1
        assert holder() == leader

        killed_at = time.monotonic()
        procs[leader][0].send_signal(signal.SIGKILL)
        procs[leader][0].wait(30)
        wait_for(lambda: holder() == follower, 120, "the standby replica to take the Lease")
        wait_for(
            lambda: scrape(follower_port).get(reconciles, 0) >= 1,
            120,
            "the new leader to reconcile",
        )
        takeover = time.monotonic() - killed_at
        print(f"takeover after SIGKILL of the leader: {takeover:.1f} s")
        assert scrape(follower_port).get("prescaler_leader") == 1

        # The new leader acts: a raised floor reaches the Deployment.
        k.patch_pool("chat", {"minReplicas": 3})
        wait_for(
            lambda: k.deployment("llm").spec.replicas == 3, 120, "the new leader to scale to 3"
        )
        assert procs[follower][0].poll() is None
