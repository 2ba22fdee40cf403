"""Placeholders only at a PriorityClass the operator allows, and below the target's pods.

Whoever may create a pool names its placeholders' PriorityClass; the operator creates
the pods that hold GPUs at it. A class the operator is not configured to allow, or one
whose value is not below the priority of the target's own pods, gets no placeholders: the
pool's StandbyAllowed condition and a Warning Event say why, and the pool still scales.
"""

from __future__ import annotations

from typing import Any

from prescaler.settings import ReconcileSettings, from_env
from unit.test_status_pipeline import (
    TEMPLATE,
    FakeKube,
    _condition,
    _kube,
    _reconciler,
    _run,
    _spec,
    _window,
)

CRITICAL = "system-cluster-critical"


def _holders(name: str, **extra: Any) -> dict[str, Any]:
    placeholders = {"enabled": True, "priorityClassName": name}
    return _spec(standby={"placeholders": placeholders}, schedules=[_window(100, 400, 4)], **extra)


def _with_classes(kube: FakeKube, **classes: int) -> FakeKube:
    kube.priority_classes.update({k.replace("_", "-"): v for k, v in classes.items()})
    return kube


def test_a_class_the_operator_does_not_allow_gets_no_placeholders_and_the_pool_scales() -> None:
    kube = _with_classes(_kube(), system_cluster_critical=2_000_000_000)
    status = _run(_reconciler(kube), _holders(CRITICAL))
    assert "pool-placeholder" not in kube.objects, "no pod at system-cluster-critical"
    allowed = _condition(status, "StandbyAllowed")
    assert (allowed["status"], allowed["reason"]) == ("False", "PriorityClassNotAllowed")
    assert CRITICAL in allowed["message"]
    assert "prescaler-placeholder" in allowed["message"], "it names what is allowed"
    assert ("Warning", "PriorityClassNotAllowed") in [e[:2] for e in kube.events]
    # Nothing else of the pool stops: it scales for its window, and it is not Invalid.
    assert ("scale", "Deployment", "llm", 4) in kube.calls
    assert _condition(status, "Invalid")["status"] == "False"
    assert status.get("standby") is None
    # The next reconcile says it again in the status, not in another Event.
    before = len(kube.events)
    _run(_reconciler(kube), _holders(CRITICAL), status)
    assert [e for e in kube.events[before:] if e[1] == "PriorityClassNotAllowed"] == []


def test_an_allowed_class_not_below_the_targets_pods_is_refused() -> None:
    kube = _with_classes(_kube(), gpu_standby=100, serving=100)
    rec = _reconciler(kube)
    rec.placeholder_priority_classes = ("prescaler-placeholder", "gpu-standby")
    # No class on the target's pods: the default priority, 0.
    status = _run(rec, _holders("gpu-standby"))
    allowed = _condition(status, "StandbyAllowed")
    assert (allowed["status"], allowed["reason"]) == ("False", "PriorityNotBelowTarget")
    assert "not below" in allowed["message"]
    assert "pool-placeholder" not in kube.objects
    # The target's own class, equal: a replica could not preempt a placeholder either.
    template = {**TEMPLATE, "spec": {**TEMPLATE["spec"], "priorityClassName": "serving"}}
    kube.workloads[("Deployment", "llm")] = kube.workloads[("Deployment", "llm")].__class__(
        "Deployment", "llm", 1, 1, "app=llm", template
    )
    status = _run(_reconciler_like(rec, kube), _holders("gpu-standby"))
    assert _condition(status, "StandbyAllowed")["reason"] == "PriorityNotBelowTarget"
    # Above it, allowed and below the target's: placeholders.
    kube.priority_classes["serving"] = 1000
    status = _run(_reconciler_like(rec, kube), _holders("gpu-standby"))
    allowed = _condition(status, "StandbyAllowed")
    assert (allowed["status"], allowed["reason"]) == ("True", "Allowed")
    holder = kube.objects["pool-placeholder"]
    assert holder["spec"]["template"]["spec"]["priorityClassName"] == "gpu-standby"


def _reconciler_like(rec: Any, kube: FakeKube) -> Any:
    fresh = _reconciler(kube)
    fresh.placeholder_priority_classes = rec.placeholder_priority_classes
    return fresh


def test_placeholders_made_before_are_removed_once_refused() -> None:
    kube = _kube()
    status = _run(_reconciler(kube), _holders("prescaler-placeholder"))
    assert _condition(status, "StandbyAllowed")["status"] == "True"
    assert "pool-placeholder" in kube.objects
    rec = _reconciler(kube)
    rec.placeholder_priority_classes = ()  # the operator now allows none
    status = _run(rec, _holders("prescaler-placeholder"), status)
    assert "pool-placeholder" not in kube.objects
    assert ("delete", "Deployment", "pool-placeholder") in kube.calls
    assert _condition(status, "StandbyAllowed")["reason"] == "PriorityClassNotAllowed"
    # Placeholders turned off: the condition goes with them.
    status = _run(rec, _spec(), status)
    assert all(c["type"] != "StandbyAllowed" for c in status["conditions"])


def test_a_class_that_does_not_exist_is_refused() -> None:
    kube = _kube()
    rec = _reconciler(kube)
    rec.placeholder_priority_classes = ("nowhere",)
    status = _run(rec, _holders("nowhere"))
    allowed = _condition(status, "StandbyAllowed")
    assert (allowed["status"], allowed["reason"]) == ("False", "PriorityClassNotFound")
    assert "pool-placeholder" not in kube.objects


def test_the_allowed_classes_are_a_setting_defaulting_to_the_operators_own() -> None:
    assert ReconcileSettings().placeholder_priority_classes == ("prescaler-placeholder",)
    env = {"PRESCALER_RECONCILE_PLACEHOLDER_PRIORITY_CLASSES": "prescaler-placeholder, gpu-low"}
    assert from_env(env).reconcile.placeholder_priority_classes == (
        "prescaler-placeholder",
        "gpu-low",
    )
    none = {"PRESCALER_RECONCILE_PLACEHOLDER_PRIORITY_CLASSES": ""}
    assert from_env(none).reconcile.placeholder_priority_classes == ()
