"""A ``kedaTrigger`` pool whose trigger KEDA left out of its HPA is told (condition
``KedaTrigger``, one Warning Event, ``prescaler_keda_trigger_missing``) past a grace of a
few reconcile periods, and with the ``keda.nudge`` setting on, the operator annotates KEDA's
HPA (at most once per nudge period) so that KEDA rebuilds it. The reconcile pipeline runs
against the fake Kubernetes of ``test_keda_mode``; the same against real KEDA is
``tests/integration/test_keda_missing_trigger_cluster.py``."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import kopf
import pytest

from prescaler.controller.keda import NUDGE_ANNOTATION, TriggerWatch
from prescaler.controller.runtime import scaler_probe
from prescaler.controller.status import rfc3339
from prescaler.kube import KubeError
from prescaler.settings import from_env
from unit.test_keda_mode import SCALED_OBJECT, Cluster, _spec, keda_hpa

PERIOD = 30.0
"""The fake cluster's reconcile period (``Reconciler.interval_seconds``'s default): the
namespace's HPAs are listed once per period, so each step below moves a period on."""
MISSING = "s1-prescaler-other-pool"
SERVED = "s1-prescaler-pool"


def missing_gauge(c: Cluster) -> float | None:
    return c.rec.metrics.registry.get_sample_value(
        "prescaler_keda_trigger_missing", {"namespace": "ns", "pool": "pool"}
    )


def nudges(c: Cluster, outcome: str) -> float | None:
    return c.rec.metrics.registry.get_sample_value(
        "prescaler_keda_nudges_total", {"namespace": "ns", "pool": "pool", "outcome": outcome}
    )


def events(c: Cluster, reason: str) -> list[tuple[str, str, str]]:
    return [e for e in c.kube.events if e[1] == reason]


def step(c: Cluster) -> dict[str, Any]:
    return c.reconcile(PERIOD)


def test_a_trigger_missing_past_the_grace_is_told_once_and_its_return_too() -> None:
    c = Cluster(_spec())
    c.kube.hpa = keda_hpa(SERVED)
    step(c)
    assert (c.condition("KedaTrigger")["status"], c.condition("KedaTrigger")["reason"]) == (
        "True",
        "InHpa",
    )
    assert missing_gauge(c) == 0

    # KEDA rebuilt its HPA while it could not reach the scaler: the trigger is gone.
    c.kube.hpa = keda_hpa(MISSING)
    status = step(c)
    since = status["keda"]["missingSince"]
    assert since == rfc3339(c.now)
    # Within the grace (2 periods, this one's end included): not known to be lasting yet.
    assert c.condition("KedaTrigger")["status"] == "Unknown"
    assert missing_gauge(c) == 0
    step(c)
    step(c)
    assert c.condition("KedaTrigger")["status"] == "Unknown"
    assert not events(c, "KedaTriggerMissing")

    # Past it: False, the fix named, one Warning Event, the metric.
    status = step(c)
    condition = c.condition("KedaTrigger")
    assert (condition["status"], condition["reason"]) == ("False", "NotInHpa")
    assert status["keda"]["missingSince"] == since
    assert f"kubectl annotate hpa keda-hpa-llama-so {NUDGE_ANNOTATION}=" in condition["message"]
    assert "setting keda.nudge" in condition["message"]
    assert missing_gauge(c) == 1
    assert [(t, r) for t, r, _ in events(c, "KedaTriggerMissing")] == [
        ("Warning", "KedaTriggerMissing")
    ]
    for _ in range(3):
        step(c)
    assert len(events(c, "KedaTriggerMissing")) == 1  # once per episode, not per reconcile
    assert c.kube.annotations == []  # nudges are off by default: only told

    # Someone made KEDA reconcile: the trigger is back.
    c.kube.hpa = keda_hpa(SERVED)
    status = step(c)
    assert c.condition("KedaTrigger")["status"] == "True"
    assert status["keda"].get("missingSince") is None  # the merge patch removes it
    assert missing_gauge(c) == 0
    assert [r for _, r, _ in c.kube.events if r.startswith("KedaTrigger")] == [
        "KedaTriggerMissing",
        "KedaTriggerInHpa",
    ]


def test_the_nudge_annotates_keda_s_hpa_at_most_once_per_nudge_period() -> None:
    c = Cluster(_spec())
    c.rec.keda = TriggerWatch(nudge=True, nudge_seconds=100)
    c.kube.hpa = keda_hpa(MISSING)
    for _ in range(3):
        step(c)
    assert c.kube.annotations == []  # not within the grace
    status = step(c)
    assert c.kube.annotations == [("keda-hpa-llama-so", {NUDGE_ANNOTATION: rfc3339(c.now)})]
    assert status["keda"]["nudgedAt"] == rfc3339(c.now)
    assert nudges(c, "written") == 1
    message = c.condition("KedaTrigger")["message"]
    assert "the operator nudges KEDA" in message
    assert "every 100 s" in message
    assert "kubectl annotate" not in message
    assert len(events(c, "KedaTriggerMissing")) == 1

    step(c)
    step(c)  # 60 s after the nudge: not again yet
    assert len(c.kube.annotations) == 1
    step(c)  # 90 s
    step(c)  # 120 s
    assert len(c.kube.annotations) == 2
    assert c.kube.annotations[-1][1] == {NUDGE_ANNOTATION: rfc3339(c.now)}
    assert nudges(c, "written") == 2
    assert len(events(c, "KedaTriggerMissing")) == 1


def test_a_nudge_that_cannot_be_written_is_said_and_not_retried_every_period() -> None:
    c = Cluster(_spec())
    c.rec.keda = TriggerWatch(nudge=True, nudge_seconds=100)
    c.kube.hpa = keda_hpa(MISSING)
    c.kube.annotate_error = KubeError("horizontalpodautoscalers is forbidden", 403)
    for _ in range(4):
        step(c)
    assert nudges(c, "failed") == 1
    assert (
        "the last nudge failed: horizontalpodautoscalers is forbidden"
        in (c.condition("KedaTrigger")["message"])
    )
    step(c)
    assert nudges(c, "failed") == 1
    assert c.condition("KedaTrigger")["status"] == "False"


def test_a_dry_run_pool_is_told_but_never_nudges() -> None:
    c = Cluster(_spec(dryRun=True))
    c.rec.keda = TriggerWatch(nudge=True, nudge_seconds=1)
    c.kube.hpa = keda_hpa(MISSING)
    for _ in range(6):
        step(c)
    assert c.condition("KedaTrigger")["status"] == "False"
    assert c.kube.annotations == []


def test_a_scaled_object_without_the_trigger_is_told_and_not_nudged() -> None:
    c = Cluster(_spec())
    c.rec.keda = TriggerWatch(nudge=True, nudge_seconds=1)
    c.kube.scaled_object = {
        **SCALED_OBJECT,
        "spec": {"scaleTargetRef": {"name": "llm"}, "triggers": [{"type": "cpu"}]},
    }
    c.kube.hpa = keda_hpa()
    for _ in range(5):
        step(c)
    condition = c.condition("KedaTrigger")
    assert (condition["status"], condition["reason"]) == ("False", "NoTrigger")
    assert "add one (type external or external-push" in condition["message"]
    assert "metadata pool: pool" in condition["message"]
    assert missing_gauge(c) == 1
    assert c.kube.annotations == []  # KEDA would rebuild the same HPA
    assert len(events(c, "KedaTriggerMissing")) == 1


def test_no_hpa_yet_is_unknown_and_not_missing() -> None:
    """KEDA makes no HPA while it reaches no trigger's scaler, and retries that itself."""
    c = Cluster(_spec())
    for _ in range(4):
        step(c)
    condition = c.condition("KedaTrigger")
    assert (condition["status"], condition["reason"]) == ("Unknown", "NoHpa")
    assert missing_gauge(c) == 0
    assert not events(c, "KedaTriggerMissing")


def test_the_keda_settings_read_from_the_environment() -> None:
    settings = from_env(
        {
            "PRESCALER_KEDA_NUDGE": "true",
            "PRESCALER_KEDA_MISSING_PERIODS": "3",
            "PRESCALER_KEDA_NUDGE_SECONDS": "90",
        }
    )
    assert (settings.keda.nudge, settings.keda.missing_periods, settings.keda.nudge_seconds) == (
        True,
        3.0,
        90.0,
    )
    assert from_env({}).keda.nudge is False
    with pytest.raises(ValueError, match="keda missing periods"):
        from_env({"PRESCALER_KEDA_MISSING_PERIODS": "0"})


def test_the_scaler_probe_says_whether_the_scaler_port_accepts() -> None:
    """The health endpoint's probe (controller/runtime.py): a port that accepts is
    ``listening``; a closed one fails the probe, so kopf's /healthz answers 500."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert asyncio.run(scaler_probe("0.0.0.0", port)()) == "listening"
    with pytest.raises(kopf.PermanentError, match=f"127.0.0.1:{port}"):
        asyncio.run(scaler_probe("127.0.0.1", port)())
