"""The Prometheus answer limits and the placeholders' allowed PriorityClasses: chart values
that reach the operator's settings, with the operator's own defaults, and the RBAC that
reads PriorityClass values."""

from __future__ import annotations

from typing import Any

import pytest
from chart_tools import Helm, HelmError, env_of, operator_container

from prescaler.settings import OperatorSettings, ReconcileSettings, from_env


def _settings(helm: Helm, values: dict[str, Any] | None = None) -> OperatorSettings:
    env = env_of(operator_container(helm.template(values)))
    return from_env({k: v for k, v in env.items() if isinstance(v, str)})


def test_the_defaults_are_the_operators(helm: Helm) -> None:
    rendered, defaults = _settings(helm).reconcile, ReconcileSettings()
    assert rendered.prometheus_timeout_seconds == defaults.prometheus_timeout_seconds
    assert rendered.prometheus_max_response_bytes == defaults.prometheus_max_response_bytes
    assert rendered.placeholder_priority_classes == defaults.placeholder_priority_classes


def test_set_values_reach_the_operator(helm: Helm) -> None:
    values = {
        "operator": {
            "prometheusMaxResponseBytes": 4 * 1024 * 1024,
            "placeholderPriorityClasses": ["prescaler-placeholder", "gpu-standby"],
        }
    }
    rendered = _settings(helm, values).reconcile
    assert rendered.prometheus_max_response_bytes == 4 * 1024 * 1024
    assert rendered.placeholder_priority_classes == ("prescaler-placeholder", "gpu-standby")
    assert _settings(helm, {"operator": {"placeholderPriorityClasses": []}}).reconcile == (
        ReconcileSettings(placeholder_priority_classes=())
    )


def test_the_schema_refuses_a_cap_too_small(helm: Helm) -> None:
    with pytest.raises(HelmError) as caught:
        helm.template({"operator": {"prometheusMaxResponseBytes": 10}})
    assert "/operator/prometheusMaxResponseBytes" in caught.value.stderr


@pytest.mark.parametrize("namespaced", [False, True])
def test_the_operator_may_read_priority_class_values(helm: Helm, namespaced: bool) -> None:
    values = {"watch": {"namespaces": ["team-a"]}} if namespaced else None
    rules = [
        rule
        for doc in helm.template(values)
        if doc["kind"] == "ClusterRole"
        for rule in doc.get("rules") or []
        if "priorityclasses" in rule["resources"]
    ]
    readers = [r for r in rules if "get" in r["verbs"]]
    assert len(readers) == 1
    assert set(readers[0]["verbs"]) == {"get", "list"}
    assert "resourceNames" not in readers[0], "any class: a pool's and its target pods'"
