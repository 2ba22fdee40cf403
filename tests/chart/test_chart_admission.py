"""The chart's ``admission.enabled``: ``prescaler admit`` beside the operator, with its own
Deployment, Service, least-privilege RBAC, PodDisruptionBudget and NetworkPolicy.

Real helm, real Kubernetes OpenAPI schemas (kubernetes-validate, strict). No cluster needed.
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from chart_tools import KUBE_VERSION, Helm, by_kind

from prescaler.cli import build_parser

ENABLED: dict[str, Any] = {"admission": {"enabled": True, "gatewayNamespaces": ["gateways"]}}


def admission(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        d
        for d in docs
        if (d["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "admission"
    ]


def test_off_by_default(helm: Helm) -> None:
    assert admission(helm.template()) == []


@pytest.mark.parametrize("namespaces", [[], ["team-a", "team-b"]])
def test_objects_validate_and_rbac_is_list_and_watch_on_config_maps_only(
    helm: Helm, namespaces: list[str]
) -> None:
    docs = helm.template({**ENABLED, "watch": {"namespaces": namespaces}})
    objects = admission(docs)
    kinds = sorted(d["kind"] for d in objects)
    binding = "RoleBinding" if namespaces else "ClusterRoleBinding"
    role = "Role" if namespaces else "ClusterRole"
    per = max(1, len(namespaces))
    assert kinds == sorted(["Deployment", "Service", "ServiceAccount", "PodDisruptionBudget",
                            "NetworkPolicy"] + [role, binding] * per)  # fmt: skip
    for doc in objects:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    for rbac in by_kind(objects, role):
        assert rbac["rules"] == [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch"]}
        ]
    assert sorted(r["metadata"].get("namespace", "") for r in by_kind(objects, role)) == (
        namespaces or [""]
    )
    (deployment,) = by_kind(objects, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    # The arguments are the command line's own: they parse.
    args = build_parser().parse_args(container["args"])
    assert args.command == "admit"
    assert args.namespaces == (namespaces or None)
    assert (args.port, args.metrics_port) == (8081, 8080)


def test_two_replicas_a_budget_a_service_and_probes(helm: Helm) -> None:
    docs = helm.template(ENABLED)
    objects = admission(docs)
    (deployment,) = by_kind(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    selector = deployment["spec"]["selector"]["matchLabels"]
    (pdb,) = by_kind(objects, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"] == selector
    assert pdb["spec"]["maxUnavailable"] == 1
    (service,) = by_kind(objects, "Service")
    assert service["metadata"]["name"] == "prescaler-admission"
    assert service["spec"]["selector"] == selector
    assert service["spec"]["ports"] == [
        {"name": "http-check", "port": 8081, "targetPort": "check", "protocol": "TCP",
         "appProtocol": "http"}
    ]  # fmt: skip
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "check"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "check"}
    # The operator's Services and budget never select the admission pods, nor the reverse.
    labels = set(deployment["spec"]["template"]["metadata"]["labels"].items())
    (operator,) = [d for d in by_kind(docs, "Deployment") if d is not deployment]
    operator_labels = set(operator["spec"]["template"]["metadata"]["labels"].items())
    for other in by_kind(docs, "Service") + by_kind(docs, "PodDisruptionBudget"):
        selects = set(selector_of(other).items())
        ours = other in objects
        assert selects <= (labels if ours else operator_labels), other["metadata"]["name"]
        assert not selects <= (operator_labels if ours else labels), other["metadata"]["name"]


def selector_of(obj: dict[str, Any]) -> dict[str, str]:
    selector: dict[str, str] = obj["spec"]["selector"]
    return selector.get("matchLabels", selector)  # type: ignore[return-value]


def test_only_the_gateways_namespaces_reach_the_check_port(helm: Helm) -> None:
    values = {"admission": {**ENABLED["admission"], "gatewayNamespaces": ["gw-a", "gw-b"]}}
    (policy,) = by_kind(admission(helm.template(values)), "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    rules = policy["spec"]["ingress"]
    check = [r for r in rules if r["ports"] == [{"port": "check", "protocol": "TCP"}]]
    assert len(check) == 1
    assert check[0]["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}}
        for ns in ("gw-a", "gw-b")
    ]
    others = [r for r in rules if r not in check]
    assert others == [{"ports": [{"port": "metrics", "protocol": "TCP"}]}]
    # No gateway namespace and no peer: nothing reaches the check port.
    closed = {"admission": {"enabled": True}}
    (policy,) = by_kind(admission(helm.template(closed)), "NetworkPolicy")
    assert all(r["ports"][0]["port"] != "check" for r in policy["spec"]["ingress"])


def test_routes_reach_the_command_line(helm: Helm) -> None:
    values = {"admission": {"enabled": True, "routes": ["/v1/chat=llm/chat", "a.example=llm/a"]}}
    (deployment,) = by_kind(admission(helm.template(values)), "Deployment")
    args = build_parser().parse_args(
        deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    assert args.route == ["/v1/chat=llm/chat", "a.example=llm/a"]
