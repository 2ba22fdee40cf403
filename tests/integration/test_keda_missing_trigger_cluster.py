"""A ScaledObject that real KEDA reconciled while prescaler's scaler was down: KEDA built
its HPA from the cron trigger alone and does not come back (its triggers are idle and it
has a fallback, as the README's example does, so its Ready condition never turns and
nothing else makes it reconcile). On the local cluster:

- the operator starts (its scaler listening before its health endpoint answers, which
  reports the scaler): the pool says so (condition ``KedaTrigger`` False naming the fix,
  a Warning Event ``KedaTriggerMissing``, ``prescaler_keda_trigger_missing`` 1), and KEDA's
  HPA still lacks the trigger;
- the operator restarted with ``PRESCALER_KEDA_NUDGE=true``: it annotates KEDA's HPA, KEDA
  reconciles the ScaledObject and its HPA gains the trigger's metric; the pool's condition
  turns True, the metric 0, and the ScaledObject's generation never moved.

KEDA's operator runs on this machine and reaches the scaler on ``127.0.0.1:<port>``.
"""

from __future__ import annotations

import contextlib
import json
import socket
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from cluster.keda import GROUP as KEDA_GROUP
from cluster.keda import SCALED_OBJECTS, Keda, hpa_name, scaled_object, scaler_address
from cluster.keda import VERSION as KEDA_VERSION
from cluster.launcher import LocalCluster
from cluster.objects import gpu_deployment
from cluster.procs import free_port
from integration.operator_fixtures import (  # noqa: F401 (fixtures)
    Kube,
    crd_fixture,
    operator_process,
    scrape,
    wait_for,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

NAME = "llama-chat"
INTERVAL = 2.0
"""The operator's reconcile period: the trigger is reported missing after 2 of them."""
PLAN = 2
"""The pool's floor: the plan it serves (no forecast)."""


def listening(port: int) -> bool:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.settimeout(2.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def health(port: int) -> dict[str, Any] | None:
    """kopf's health endpoint's answer, or ``None`` while it answers nothing or fails."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
            return dict(json.loads(resp.read()))
    except (OSError, urllib.error.HTTPError, ValueError):
        return None


def hpa_metrics(k: Kube) -> list[str] | None:
    """The external metrics of KEDA's HPA (``None``: no HPA yet)."""
    try:
        current = k.autoscaling.read_namespaced_horizontal_pod_autoscaler(hpa_name(NAME), k.ns)
    except Exception:
        return None
    return [m.external.metric.name for m in current.spec.metrics or [] if m.external]


def idle_cron() -> dict[str, Any]:
    """A cron trigger whose window is half a day away: idle for the whole test."""
    hour = (datetime.now(UTC).hour + 12) % 24
    return {
        "type": "cron",
        "metadata": {
            "timezone": "Etc/UTC",
            "start": f"0 {hour} * * *",
            "end": f"30 {hour} * * *",
            "desiredReplicas": "3",
        },
    }


def generation(k: Kube) -> int:
    so = k.custom.get_namespaced_custom_object(KEDA_GROUP, KEDA_VERSION, k.ns, SCALED_OBJECTS, NAME)
    return int(so["metadata"]["generation"])


@pytest.mark.timeout(1200)
def test_a_trigger_keda_left_out_is_told_then_nudged_back(
    keda: Keda,
    crd: None,
    cluster: LocalCluster,
    kube: Any,
    namespace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    k = Kube(kube, namespace)
    port = free_port()
    k.create_deployment(gpu_deployment(NAME, 1))
    k.create_pool(
        NAME,
        {
            "target": {"kind": "ScaledObject", "name": NAME},
            "mode": "kedaTrigger",
            "minReplicas": PLAN,
            "maxReplicas": 4,
            "model": {"tokensPerSecond": 2400},
            "coldStart": {"mode": "fixed", "seconds": 30},
        },
    )
    external = {
        "type": "external",
        "metricType": "AverageValue",
        "metadata": {"scalerAddress": scaler_address(port), "pool": NAME},
    }
    body = scaled_object(
        NAME,
        NAME,
        [idle_cron(), external],
        minReplicaCount=1,
        maxReplicaCount=4,
        pollingInterval=5,
        fallback={"failureThreshold": 3, "replicas": 1},
    )
    assert not listening(port)
    k.custom.create_namespaced_custom_object(
        KEDA_GROUP, KEDA_VERSION, namespace, SCALED_OBJECTS, body
    )
    # KEDA reconciles it while nothing listens on the scaler's port: an HPA of the cron alone.
    built = wait_for(
        lambda: (m := hpa_metrics(k)) and m, 300, "KEDA's HPA (of the cron trigger alone)"
    )
    assert not any("prescaler" in name for name in built), built
    created = generation(k)

    def metric(port: int) -> float | None:
        return scrape(port).get("prescaler_keda_trigger_missing")

    # (1) The operator starts, only telling.
    health_port = free_port()
    monkeypatch.setenv("PRESCALER_LIVENESS_ENDPOINT", f"http://127.0.0.1:{health_port}/healthz")
    monkeypatch.delenv("PRESCALER_KEDA_NUDGE", raising=False)
    flags = ["--scaler-port", str(port), "--scaler-host", "127.0.0.1"]
    log = tmp_path / "operator.log"
    with operator_process(cluster, namespace, log, interval=INTERVAL, extra_args=flags) as (
        _,
        metrics_port,
    ):
        answer = wait_for(lambda: health(health_port), 300, "the operator's health endpoint")
        assert answer.get("scaler") == "listening", answer
        assert listening(port)
        condition = wait_for(
            lambda: k.condition_is(NAME, "KedaTrigger", "False"),
            300,
            "condition KedaTrigger False",
            explain=lambda: f"status {k.status(NAME)}; HPA {hpa_metrics(k)}",
        )
        assert condition["reason"] == "NotInHpa"
        assert (
            f"kubectl annotate hpa {hpa_name(NAME)} prescaler.io/keda-reconcile"
            in (condition["message"])
        )
        event = k.event(NAME, "KedaTriggerMissing")
        assert event.type == "Warning"
        wait_for(lambda: metric(metrics_port) == 1, 120, "prescaler_keda_trigger_missing 1")
        assert not any("prescaler" in name for name in hpa_metrics(k) or [])
        assert "nudgedAt" not in k.status(NAME)["keda"]

    # (2) Restarted with the nudge on: KEDA's HPA gains the trigger.
    monkeypatch.setenv("PRESCALER_KEDA_NUDGE", "true")
    monkeypatch.setenv("PRESCALER_KEDA_NUDGE_SECONDS", "10")
    with operator_process(cluster, namespace, log, interval=INTERVAL, extra_args=flags) as (
        _,
        metrics_port,
    ):
        served = f"s1-prescaler-{NAME}"
        wait_for(
            lambda: served in (hpa_metrics(k) or []),
            300,
            f"KEDA's HPA gaining {served}",
            explain=lambda: (
                f"status {k.status(NAME)}; HPA {hpa_metrics(k)}; log "
                + "\n".join(log.read_text(errors="replace").splitlines()[-20:])
            ),
        )
        wait_for(lambda: k.condition_is(NAME, "KedaTrigger", "True"), 120, "KedaTrigger True")
        assert k.status(NAME)["keda"].get("nudgedAt")
        assert k.event(NAME, "KedaTriggerInHpa").type == "Normal"
        wait_for(lambda: metric(metrics_port) == 0, 120, "prescaler_keda_trigger_missing 0")
        assert scrape(metrics_port).get("prescaler_keda_nudges_total", 0) >= 1
    assert generation(k) == created  # the ScaledObject was never written
