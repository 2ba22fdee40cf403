"""The operator killed (SIGKILL) inside a scheduled window, then restarted.

A real ``prescaler run`` process serves a pool whose dated window asks for 3 replicas. It
is killed either the moment the Deployment's replicas change (most likely before the
status recording the scale is written), or once everything is recorded. A new process
takes over and must converge with no scale beyond the plan: no new ``ScaledUp`` or
``ScaledDown`` Event, the replicas left alone, the scale's time and the measured cold
starts kept (they live in the pool's status, not in memory), and its own lost write not
mistaken for someone else's.
"""

from __future__ import annotations

import signal
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from cluster.launcher import LocalCluster
from cluster.objects import gpu_deployment
from integration.operator_fixtures import (  # noqa: F401 (fixtures)
    Kube,
    crd_fixture,
    operator_process,
    scrape,
    wait_for,
)

pytestmark = pytest.mark.cluster

RECONCILES = "prescaler_reconcile_duration_seconds_count"


def _naive(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).replace(tzinfo=None).isoformat(timespec="seconds")


def _scales(k: Kube, since: float = 0.0) -> list[tuple[str, str]]:
    """The scale Events, those the operator stamped at or after ``since`` (a POST the
    killed process had in flight may land after the kill, with the time it was made)."""
    return [
        (e.reason, e.message)
        for e in k.events("chat")
        if e.reason in ("ScaledUp", "ScaledDown")
        and (e.event_time or e.first_timestamp).timestamp() >= since
    ]


@pytest.mark.parametrize("kill_at", ["the-scale", "steady"])
def test_a_killed_operator_restarts_without_scaling_beyond_the_plan(
    cluster: LocalCluster, crd: None, kube: Any, namespace: str, tmp_path: Path, kill_at: str
) -> None:
    k = Kube(kube, namespace)
    k.create_deployment(gpu_deployment("llm", 1, ready_delay="3s"))
    now = time.time()
    k.create_pool(
        "chat",
        {
            "target": {"name": "llm"},
            "minReplicas": 1,
            "maxReplicas": 6,
            "model": {"tokensPerSecond": 3750},
            "coldStart": {"mode": "auto", "seconds": 30, "marginSeconds": 0},
            "scaleDown": {"mode": "paced", "stabilizationSeconds": 60},
            "schedules": [
                {
                    "name": "launch",
                    "start": _naive(now - 60),
                    "end": _naive(now + 3600),
                    "minReplicas": 3,
                    "leadSeconds": 0,
                }
            ],
        },
    )
    log = tmp_path / "operator.log"

    with operator_process(cluster, namespace, log, interval=1) as (first, _):
        if kill_at == "the-scale":
            wait_for(lambda: k.deployment("llm").spec.replicas == 3, 120, "the scale", 0.02)
        else:
            wait_for(
                lambda: (k.status("chat").get("coldStart") or {}).get("samples"),
                120,
                "the scale recorded and cold starts measured",
            )
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    killed = time.time()
    before = k.status("chat")
    scales = _scales(k)
    assert len(scales) <= 1, scales
    assert k.deployment("llm").spec.replicas == 3

    with operator_process(cluster, namespace, log, interval=1) as (_, port):
        wait_for(
            lambda: (
                k.status("chat").get("appliedReplicas") == 3
                and (k.status("chat").get("coldStart") or {}).get("samples")
            ),
            120,
            "the new process to record the scale",
        )
        wait_for(
            lambda: scrape(port).get(RECONCILES, 0) >= 5, 120, "5 reconciles after the restart"
        )
        after = k.status("chat")

    assert k.deployment("llm").spec.replicas == 3
    assert _scales(k, since=killed) == [], "a scale beyond the plan after the restart"
    assert len(_scales(k)) <= 1, _scales(k)
    assert after["plan"]["activeWindows"] == ["launch"]
    assert after["desiredReplicas"] == 3
    assert after["lastScaleUpTime"], "the scale's time is lost"
    if before.get("lastScaleUpTime"):
        assert after["lastScaleUpTime"] == before["lastScaleUpTime"]
    if before.get("coldStart", {}).get("samples"):
        kept = before["coldStart"]["samples"]
        assert after["coldStart"]["samples"][: len(kept)] == kept, "cold starts forgotten"
    external = next(c for c in after["conditions"] if c["type"] == "ExternalChange")
    assert external["status"] == "False", external
    assert "externalChange" not in after
