"""Someone else changes the target's replicas: a hand scale 3 -> 1 by another field manager
is detected (``managedFields``), reported (``status.externalChange``, condition
``ExternalChange``, a Warning Event naming the manager) and handled by
``spec.externalChanges``: reverted at once, respected until the plan changes, or paused
until the spec is edited. The operator runs as the Helm chart runs it (``operator``)."""

from __future__ import annotations

from typing import Any

import pytest

from integration.operator_fixtures import (  # noqa: F401 (fixtures)
    Kube,
    crd_fixture,
    operator_fixture,
    wait_for,
)
from prescaler.metrics import Metrics

pytestmark = pytest.mark.cluster

HAND = "on-call-engineer"
"""The field manager of the hand change (``kubectl`` sends its own name the same way)."""


def _reconciles(metrics: Metrics) -> float:
    return sum(
        s.value
        for family in metrics.registry.collect()
        for s in family.samples
        if s.name == "prescaler_reconcile_duration_seconds_count"
    )


def _scale_by_hand(k: Kube, replicas: int) -> None:
    k.apps.patch_namespaced_deployment_scale(
        "llm", k.ns, {"spec": {"replicas": replicas}}, field_manager=HAND
    )


def _change(k: Kube) -> dict[str, Any]:
    return dict(k.status("chat").get("externalChange") or {})


def _reasons(k: Kube) -> list[str]:
    return [e.reason for e in k.events("chat")]


@pytest.mark.parametrize("policy", ["revert", "respect", "pause"])
def test_a_hand_scale_is_detected_reported_and_handled_by_the_policy(
    kube: Any, namespace: str, operator: Metrics, policy: str
) -> None:
    k = Kube(kube, namespace)
    k.deployment_and_pool(min_replicas=3, externalChanges=policy)
    wait_for(lambda: k.status("chat").get("appliedReplicas") == 3, 120, "the scale to 3")
    assert k.deployment("llm").spec.replicas == 3
    assert _reasons(k).count("ScaledUp") == 1

    _scale_by_hand(k, 1)
    change = wait_for(lambda: _change(k).get("to") == 1 and _change(k), 120, "the change")
    assert change["manager"] == HAND
    assert change["from"] == 3
    warning = wait_for(
        lambda: [e for e in k.events("chat") if e.reason == "ExternalChange"], 60, "its Event"
    )
    assert len(warning) == 1, [e.message for e in warning]
    assert warning[0].type == "Warning"
    assert f"{HAND} changed replicas of Deployment llm 3 -> 1" in warning[0].message

    if policy == "revert":
        assert change["action"] == "Reverted"
        wait_for(lambda: k.deployment("llm").spec.replicas == 3, 120, "the revert to 3")
        wait_for(lambda: k.status("chat").get("appliedReplicas") == 3, 120, "status 3")
        # True on the reconcile that found it; False once the target holds the plan again.
        condition = wait_for(
            lambda: (
                (k.condition("chat", "ExternalChange") or {}).get("status") == "False"
                and k.condition("chat", "ExternalChange")
            ),
            120,
            "the condition back to False",
        )
        assert condition["reason"] == "InControl"
        assert HAND in condition["message"], "the condition names the last change"
        assert _reasons(k).count("ScaledUp") == 2  # 1 -> 3, then 1 -> 3 again
        return

    # respect and pause: the hand value holds, the condition says so, nothing is scaled.
    assert change["action"] == ("Respected" if policy == "respect" else "Paused")
    condition = wait_for(lambda: k.condition("chat", "ExternalChange"), 60, "the condition")
    assert condition["status"] == "True"
    assert condition["reason"] == change["action"]
    assert HAND in condition["message"]
    seen = _reconciles(operator)
    wait_for(lambda: _reconciles(operator) >= seen + 3, 120, "three more reconciles")
    assert k.deployment("llm").spec.replicas == 1
    assert k.status("chat")["plan"]["reason"].startswith(f"held at 1 set by {HAND}")
    assert _reasons(k).count("ScaledUp") == 1, "the hand value was fought"

    # What ends it: a new plan (respect) or an edited spec (pause).
    k.patch_pool("chat", {"minReplicas": 4} if policy == "respect" else {"maxReplicas": 5})
    resumed_at = 4 if policy == "respect" else 3
    wait_for(lambda: k.deployment("llm").spec.replicas == resumed_at, 120, "the resume")
    wait_for(lambda: _change(k).get("action") == "Resumed", 120, "action Resumed")
    wait_for(
        lambda: (k.condition("chat", "ExternalChange") or {}).get("status") == "False",
        120,
        "the condition to clear",
    )
    assert _reasons(k).count("ExternalChange") == 1
