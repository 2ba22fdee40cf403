"""The chart renders valid, hardened Kubernetes objects, and its schema rejects bad values.

Real helm (``make cluster-bin`` builds it), real Kubernetes OpenAPI schemas
(kubernetes-validate, strict: unknown fields fail). No cluster needed.
"""

from __future__ import annotations

import json
import re
import textwrap
import tomllib
from typing import Any

import kubernetes_validate
import promql_parser as pp
import pytest
import yaml
from chart_tools import (
    CHART,
    KUBE_VERSION,
    Helm,
    HelmError,
    by_kind,
    env_of,
    one,
    operator_container,
)

from cluster.paths import PROJECT_ROOT
from prescaler.api import InferencePoolSpec
from prescaler.metrics import Metrics
from prescaler.settings import from_env

NAMESPACED: dict[str, Any] = {"watch": {"namespaces": ["team-a", "team-b"]}}

ALL_OPTIONAL: dict[str, Any] = {
    "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "placeholderPriorityClass": {"create": True},
    "networkPolicy": {
        "enabled": True,
        "ingress": {
            "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mon"}}}]
        },
        "egress": {
            "apiServer": {"cidrs": ["10.0.0.1/32"]},
            "prometheus": {
                "to": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
            },
            "extra": [{"to": [{"ipBlock": {"cidr": "192.0.2.0/24"}}], "ports": [{"port": 443}]}],
        },
    },
    "grafanaDashboard": {"namespace": "monitoring", "annotations": {"grafana_folder": "LLM"}},
    "operator": {"logLevel": "debug", "extraEnv": [{"name": "EXTRA", "value": "1"}]},
    "podAnnotations": {"example.com/a": "b"},
    "priorityClassName": "system-cluster-critical",
    "imagePullSecrets": [{"name": "registry"}],
    "keda": {"enabled": True, "tls": {"secretName": "prescaler-scaler-tls"}},
    "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
}

MINIMAL: dict[str, Any] = {
    "replicaCount": 1,
    "rbac": {"create": False},
    "serviceAccount": {"create": False, "name": "my-operator"},
    "placeholderPriorityClass": {"create": False},
    "grafanaDashboard": {"enabled": False},
    "podAntiAffinity": "none",
    "topologySpreadConstraints": [],
    "tmpSizeLimit": "",
}

VARIANTS = {
    "default": None,
    "namespaced": NAMESPACED,
    "all-optional": ALL_OPTIONAL,
    "namespaced-all-optional": {**ALL_OPTIONAL, **NAMESPACED},
    "minimal": MINIMAL,
}

# kubernetes-validate ships the Kubernetes API's own schemas only. The ServiceMonitor and
# the PrometheusRule are prometheus-operator CRD types, so they are checked by hand below.
NOT_IN_KUBERNETES_SCHEMAS = {"ServiceMonitor", "PrometheusRule"}


def _validate_strict(docs: list[dict[str, Any]]) -> set[str]:
    """Validate every object in strict mode; returns the kinds that had no schema."""
    unvalidated: set[str] = set()
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            unvalidated.add(doc["kind"])
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {exc.message} at {exc.path}")
    return unvalidated


def test_lint_is_clean(helm: Helm) -> None:
    for values in (None, ALL_OPTIONAL, NAMESPACED):
        args = ["lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION]
        if values is not None:
            args += ["--values", str(helm.values_file(values))]
        out = helm.run(*args)
        assert "0 chart(s) failed" in out
        assert "[ERROR]" not in out, out
        assert "[WARNING]" not in out, out


def _pinned(module: str, tools: str) -> str:
    """The version ``hack/cluster/tools/<tools>/go.mod`` requires of ``module``."""
    go_mod = (PROJECT_ROOT / "hack" / "cluster" / "tools" / tools / "go.mod").read_text()
    found = re.search(rf"^\s*{re.escape(module)} (v\S+)", go_mod, re.MULTILINE)
    assert found, f"{module} is not required in tools/{tools}/go.mod"
    return found[1]


def test_helm_reports_its_version_and_renders_the_chart_without_kube_version(
    helm: Helm,
) -> None:
    """The chart requires Kubernetes >= 1.27. Without a cluster or ``--kube-version``,
    helm assumes the Kubernetes minor of the client-go it is built with, which the build's
    link flags set (unset, helm assumes v1.20 and refuses the chart)."""
    version = helm.run("version", "--template", "{{ .Version }}").strip()
    assert version == _pinned("helm.sh/helm/v3", "helm")
    minor = _pinned("k8s.io/client-go", "helm").split(".")[1]  # v0.Y.Z is Kubernetes 1.Y
    probe = helm.home / "probe"
    (probe / "templates").mkdir(parents=True)
    (probe / "Chart.yaml").write_text("apiVersion: v2\nname: probe\nversion: 0.1.0\n")
    (probe / "templates" / "kube.yaml").write_text(
        "kind: ConfigMap\napiVersion: v1\nmetadata: {name: probe}\n"
        "data: {kube: '{{ .Capabilities.KubeVersion.Version }}'}\n"
    )
    (assumed,) = yaml.safe_load_all(helm.run("template", "probe", str(probe)))
    assert assumed["data"]["kube"] == f"v1.{minor}.0"
    out = helm.run("template", "prescaler", str(CHART), "--namespace", "prescaler-system")
    docs = [doc for doc in yaml.safe_load_all(out) if doc]
    assert {"Deployment", "Service"} <= {d["kind"] for d in docs}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_template_validates_in_strict_mode(helm: Helm, variant: str) -> None:
    docs = helm.template(VARIANTS[variant], include_crds=True)
    assert _validate_strict(docs) <= NOT_IN_KUBERNETES_SCHEMAS
    kinds = {d["kind"] for d in docs}
    assert {"CustomResourceDefinition", "Deployment", "Service"} <= kinds
    for doc in docs:
        if doc["kind"] != "CustomResourceDefinition":
            assert doc["metadata"]["labels"]["app.kubernetes.io/instance"] == "prescaler"


def test_validation_catches_an_unknown_field() -> None:
    """The strict validator this file relies on does reject what it should."""
    bad = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "x"},
        "spec": {"ports": [{"port": 80, "targetPort": "metrics", "protocl": "TCP"}]},
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBE_VERSION, strict=True)


def test_service_monitor_scrapes_the_metrics_service(helm: Helm) -> None:
    docs = helm.template(ALL_OPTIONAL)
    monitor = one(docs, "ServiceMonitor")
    services = {d["metadata"]["name"]: d for d in by_kind(docs, "Service")}
    assert set(services) == {"prescaler-metrics", "prescaler-scaler"}  # keda.enabled
    service = services["prescaler-metrics"]
    scaler_labels = services["prescaler-scaler"]["metadata"]["labels"]
    assert not monitor["spec"]["selector"]["matchLabels"].items() <= scaler_labels.items()
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    spec = monitor["spec"]
    assert set(spec) == {"namespaceSelector", "selector", "endpoints"}
    assert spec["namespaceSelector"] == {"matchNames": [service["metadata"]["namespace"]]}
    selector = spec["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    (endpoint,) = spec["endpoints"]
    assert set(endpoint) == {"port", "path", "interval", "scrapeTimeout", "honorLabels"}
    assert endpoint["honorLabels"] is True
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    for key in ("interval", "scrapeTimeout"):
        assert re.fullmatch(r"([0-9]+(ms|s|m|h))+", endpoint[key])


def test_operator_pod_is_hardened(helm: Helm) -> None:
    docs = helm.template()
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is True
    assert pod["serviceAccountName"] == "prescaler"
    container = operator_container(docs)
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["runAsNonRoot"] is True
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["resources"]["requests"]
    assert container["resources"]["limits"]
    (tmp,) = pod["volumes"]
    assert "emptyDir" in tmp
    assert container["volumeMounts"] == [{"name": tmp["name"], "mountPath": "/tmp"}]
    env = env_of(container)
    for var in ("HOME", "TMPDIR"):
        assert env[var] == "/tmp"
    assert env["MPLCONFIGDIR"].startswith("/tmp/")


def test_probes_and_ports(helm: Helm) -> None:
    container = operator_container(helm.template())
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 8080, "health": 8081}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    env = env_of(container)
    assert env["PRESCALER_LIVENESS_ENDPOINT"] == "http://0.0.0.0:8081/healthz"
    assert env["PRESCALER_METRICS_PORT"] == "8080"
    assert container["command"] == ["prescaler"]
    assert container["args"] == ["run"]


def test_env_reaches_the_operator_settings(helm: Helm) -> None:
    """The chart's env is read by the operator's own settings parser, as the pod would."""
    values = {
        **NAMESPACED,
        "metrics": {"port": 9100},
        "health": {"port": 9101},
        "operator": {"reconcileIntervalSeconds": 15, "forecastWorkers": 3, "kubeThreads": 8},
    }
    container = operator_container(helm.template(values))
    literal = {k: v for k, v in env_of(container).items() if isinstance(v, str)}
    settings = from_env(literal)
    assert settings.watch.namespaces == ("team-a", "team-b")
    assert settings.metrics.port == 9100
    assert settings.liveness_endpoint == "http://0.0.0.0:9101/healthz"
    assert settings.reconcile.interval_seconds == 15
    assert settings.reconcile.forecast_workers == 3
    assert settings.reconcile.kube_threads == 8
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 9100, "health": 9101}
    assert settings.leader.enabled is True
    assert settings.leader.lease_name == "prescaler"
    assert settings.leader.lease_duration_seconds == 15
    assert settings.leader.renew_deadline_seconds < settings.leader.lease_duration_seconds
    cluster_wide = from_env(
        {k: v for k, v in env_of(operator_container(helm.template())).items() if isinstance(v, str)}
    )
    assert cluster_wide.clusterwide


def test_leader_election_env(helm: Helm) -> None:
    env = env_of(operator_container(helm.template()))
    assert env["PRESCALER_LEADER_ENABLED"] == "true"
    assert env["PRESCALER_LEADER_LEASE_NAME"] == "prescaler"
    assert env["PRESCALER_LEADER_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["PRESCALER_LEADER_IDENTITY"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    named = env_of(operator_container(helm.template({"leaderElection": {"leaseName": "ops"}})))
    assert named["PRESCALER_LEADER_LEASE_NAME"] == "ops"
    single = {"replicaCount": 1, "leaderElection": {"enabled": False}}
    assert env_of(operator_container(helm.template(single)))["PRESCALER_LEADER_ENABLED"] == "false"


def test_two_replicas_without_leader_election_fail(helm: Helm) -> None:
    with pytest.raises(HelmError, match=r"leaderElection\.enabled"):
        helm.template({"leaderElection": {"enabled": False}})
    late = {"leaderElection": {"leaseDurationSeconds": 10, "renewDeadlineSeconds": 10}}
    with pytest.raises(HelmError, match=r"renewDeadlineSeconds must be below"):
        helm.template(late)


def test_shards_env_and_lease_rbac(helm: Helm) -> None:
    """``shards`` reaches the operator's settings, and the Lease Role names every shard
    and member slot Lease the operator uses (``prescaler.sharding.lease_names``) and lets
    it list them; without shards it names the leader Lease only and lists nothing."""
    from prescaler.sharding import lease_names

    values = {"replicaCount": 3, "shards": 6}
    docs = helm.template(values)
    env = env_of(operator_container(docs))
    assert env["PRESCALER_LEADER_SHARDS"] == "6"
    settings = from_env({k: v for k, v in env.items() if isinstance(v, str)})
    assert settings.leader.shards == 6
    assert settings.leader.enabled
    assert one(docs, "Deployment")["spec"]["replicas"] == 3
    role = next(
        r for r in by_kind(docs, "Role") if r["metadata"]["name"].endswith("-leader-election")
    )
    named = [r for r in role["rules"] if r.get("resourceNames")]
    assert [r["resourceNames"] for r in named] == [list(lease_names("prescaler", 6))]
    assert named[0]["verbs"] == ["get", "update"]
    assert {v for r in role["rules"] for v in r["verbs"]} == {"get", "update", "create", "list"}
    assert all(r["resources"] == ["leases"] for r in role["rules"])
    _validate_strict(docs)

    single = helm.template()
    role = next(
        r for r in by_kind(single, "Role") if r["metadata"]["name"].endswith("-leader-election")
    )
    assert [r.get("resourceNames") for r in role["rules"]] == [["prescaler"], None]
    assert env_of(operator_container(single))["PRESCALER_LEADER_SHARDS"] == "0"
    with pytest.raises(HelmError, match=r"shards > 0 needs leaderElection"):
        helm.template({"replicaCount": 1, "shards": 2, "leaderElection": {"enabled": False}})


def test_high_availability_objects(helm: Helm) -> None:
    docs = helm.template()
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    selector = deployment["spec"]["selector"]["matchLabels"]
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}
    pod = deployment["spec"]["template"]["spec"]
    anti = pod["affinity"]["podAntiAffinity"]
    (term,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == selector
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in anti
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"
    assert spread["labelSelector"]["matchLabels"] == selector
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    single = helm.template(MINIMAL)
    assert not by_kind(single, "PodDisruptionBudget")
    assert "affinity" not in one(single, "Deployment")["spec"]["template"]["spec"]


def test_placeholder_priority_class_matches_the_operator(helm: Helm) -> None:
    """Same object as the operator's own (kube.placeholder_priority_class): a real pod
    (priority 0) preempts a placeholder, and a placeholder never preempts anything."""
    from prescaler.api import PlaceholderSpec
    from prescaler.kube import placeholder_priority_class

    default_name = PlaceholderSpec().priority_class_name
    pc = one(helm.template(), "PriorityClass")
    operator_pc = placeholder_priority_class(default_name)
    assert pc["metadata"]["name"] == default_name
    for key in ("value", "preemptionPolicy", "globalDefault"):
        assert pc[key] == operator_pc[key], key
    assert pc["value"] < 0
    assert pc["preemptionPolicy"] == "Never"
    with pytest.raises(HelmError, match="/placeholderPriorityClass/value"):
        helm.template({"placeholderPriorityClass": {"value": 0}})


def test_network_policy_ports(helm: Helm) -> None:
    policy = one(helm.template(ALL_OPTIONAL), "NetworkPolicy")["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    ingress, scaler = policy["ingress"]
    assert {p["port"] for p in ingress["ports"]} == {"metrics", "health"}
    assert ingress["from"] == ALL_OPTIONAL["networkPolicy"]["ingress"]["from"]
    assert scaler == {"ports": [{"port": "scaler", "protocol": "TCP"}], "from": [keda_peer("keda")]}
    egress_ports = [{p["port"] for p in rule["ports"]} for rule in policy["egress"]]
    assert egress_ports == [{443, 6443}, {9090}, {53}, {443}]
    assert policy["egress"][0]["to"] == [{"ipBlock": {"cidr": "10.0.0.1/32"}}]


def keda_peer(namespace: str) -> dict[str, Any]:
    return {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}


def test_only_keda_s_namespace_reaches_the_scaler_port(helm: Helm) -> None:
    """With the scaler on, a NetworkPolicy admits only KEDA's namespace to its port, even
    with `networkPolicy.enabled` off: then an Ingress-only policy of its own that leaves
    the metrics and health ports open to any source."""
    docs = helm.template({"keda": {"enabled": True, "namespace": "keda-system"}})
    policy = one(docs, "NetworkPolicy")
    assert policy["metadata"]["name"] == "prescaler-scaler"
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    assert spec["podSelector"]["matchLabels"] == pod_selector(docs)
    anyone, scaler = spec["ingress"]
    assert {p["port"] for p in anyone["ports"]} == {"metrics", "health"}
    assert "from" not in anyone
    assert [p["port"] for p in scaler["ports"]] == ["scaler"]
    assert scaler["from"] == [keda_peer("keda-system")]
    # Peers of one's own instead, e.g. KEDA's operator pods only.
    peers = [{**keda_peer("keda"), "podSelector": {"matchLabels": {"app": "keda-operator"}}}]
    docs = helm.template({"keda": {"enabled": True, "networkPolicy": {"from": peers}}})
    assert one(docs, "NetworkPolicy")["spec"]["ingress"][1]["from"] == peers
    # Turned off: no policy of its own; the operator's admits the port with the others.
    off = {"keda": {"enabled": True, "networkPolicy": {"enabled": False}}}
    assert not by_kind(helm.template(off), "NetworkPolicy")
    both = helm.template({**off, "networkPolicy": {"enabled": True}})
    (ingress,) = one(both, "NetworkPolicy")["spec"]["ingress"]
    assert {p["port"] for p in ingress["ports"]} == {"metrics", "health", "scaler"}
    assert not by_kind(helm.template(), "NetworkPolicy")  # no scaler, no policy


def _keda_rules(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        rule
        for doc in docs
        if doc["kind"] in ("ClusterRole", "Role")
        for rule in doc.get("rules") or []
        if "keda.sh" in rule["apiGroups"]
    ]


def test_keda_scaler_is_off_by_default(helm: Helm) -> None:
    docs = helm.template()
    container = operator_container(docs)
    assert "PRESCALER_SCALER_PORT" not in env_of(container)
    assert "scaler" not in {p["name"] for p in container["ports"]}
    assert not [d for d in by_kind(docs, "Service") if d["metadata"]["name"].endswith("-scaler")]
    assert _keda_rules(docs) == []


@pytest.mark.parametrize("namespaced", [False, True])
def test_keda_scaler_port_service_tls_and_rbac(helm: Helm, namespaced: bool) -> None:
    values: dict[str, Any] = {
        "keda": {"enabled": True, "tls": {"secretName": "scaler-tls"}},
        **(NAMESPACED if namespaced else {}),
    }
    docs = helm.template(values)
    container = operator_container(docs)
    env = env_of(container)
    settings = from_env({k: v for k, v in env.items() if isinstance(v, str)})
    assert settings.scaler.port == 9090
    assert settings.scaler.tls_cert == "/etc/prescaler/scaler-tls/tls.crt"
    assert settings.scaler.tls_key == "/etc/prescaler/scaler-tls/tls.key"
    assert settings.scaler.tls_ca == "/etc/prescaler/scaler-tls/ca.crt"
    assert {p["name"]: p["containerPort"] for p in container["ports"]}["scaler"] == 9090
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["scaler-tls"] == "/etc/prescaler/scaler-tls"
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    secrets = [v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v]
    assert secrets == ["scaler-tls"]
    (service,) = [d for d in by_kind(docs, "Service") if d["metadata"]["name"].endswith("-scaler")]
    assert service["metadata"]["name"] == "prescaler-scaler"
    (port,) = service["spec"]["ports"]
    assert (port["port"], port["targetPort"], port["appProtocol"]) == (9090, "scaler", "grpc")
    assert service["spec"]["selector"] == pod_selector(docs)
    rules = _keda_rules(docs)
    assert len(rules) == (2 if namespaced else 1)  # one Role per watched namespace
    assert all(
        r == {"apiGroups": ["keda.sh"], "resources": ["scaledobjects"], "verbs": ["get"]}
        for r in rules
    )
    plain = helm.template({"keda": {"enabled": True, "tls": {"secretName": "s", "mutual": False}}})
    plain_env = env_of(operator_container(plain))
    assert "PRESCALER_SCALER_TLS_CERT" in plain_env
    assert "PRESCALER_SCALER_TLS_CA" not in plain_env
    no_tls = env_of(operator_container(helm.template({"keda": {"enabled": True}})))
    assert "PRESCALER_SCALER_TLS_CERT" not in no_tls
    assert "PRESCALER_SCALER_MAX_STREAMS" not in no_tls  # the operator's defaults
    limits = {"maxConcurrentCalls": 100, "maxStreams": 40, "streamMaxSeconds": 300}
    env = env_of(operator_container(helm.template({"keda": {"enabled": True, **limits}})))
    scaler = from_env({k: v for k, v in env.items() if isinstance(v, str)}).scaler
    assert (scaler.max_concurrent_rpcs, scaler.max_streams, scaler.stream_max_seconds) == (
        100,
        40,
        300.0,
    )


def test_keda_nudge_and_missing_periods_reach_the_operator_settings(helm: Helm) -> None:
    """Off by default (the operator only tells); the values feed ``settings.keda``."""
    env = env_of(operator_container(helm.template({"keda": {"enabled": True}})))
    keda = from_env({k: v for k, v in env.items() if isinstance(v, str)}).keda
    assert keda.nudge is False
    assert "PRESCALER_KEDA_NUDGE_SECONDS" not in env  # the operator's defaults
    values = {"enabled": True, "nudge": True, "nudgeSeconds": 120, "missingPeriods": 4}
    env = env_of(operator_container(helm.template({"keda": values})))
    keda = from_env({k: v for k, v in env.items() if isinstance(v, str)}).keda
    assert (keda.nudge, keda.nudge_seconds, keda.missing_periods) == (True, 120.0, 4.0)


def test_prometheus_rule_alerts_on_what_the_operator_exports(helm: Helm) -> None:
    """Off by default; on, its alert reads a metric the operator's registry exports, per
    pool, and names the fix."""
    assert not by_kind(helm.template(), "PrometheusRule")
    rule = one(helm.template(ALL_OPTIONAL), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["metadata"]["namespace"] == "prescaler-system"
    (group,) = rule["spec"]["groups"]
    alerts = {r["alert"]: r for r in group["rules"]}
    assert set(alerts) == {"PrescalerKedaTriggerMissing"}
    alert = alerts["PrescalerKedaTriggerMissing"]
    assert set(alert) == {"alert", "expr", "for", "labels", "annotations"}
    assert alert["for"] == "5m"
    assert alert["labels"] == {"severity": "warning"}
    exported = {family.name for family in Metrics().registry.collect() if family.type == "gauge"}
    read: list[str] = []
    expr = pp.parse(alert["expr"])
    pp.walk(expr, lambda n: read.append(n.name) if isinstance(n, pp.VectorSelector) else None)
    assert read == ["prescaler_keda_trigger_missing"]
    assert set(read) <= exported
    assert isinstance(expr, pp.BinaryExpr)
    assert isinstance(expr.lhs, pp.AggregateExpr)
    assert expr.lhs.modifier is not None
    assert set(expr.lhs.modifier.labels) == {"namespace", "pool"}
    summary = alert["annotations"]["summary"]
    assert "{{ $labels.namespace }}/{{ $labels.pool }}" in summary
    assert "prescaler.io/keda-reconcile" in alert["annotations"]["description"]
    assert "keda.nudge" in alert["annotations"]["description"]


@pytest.mark.parametrize("namespaced", [False, True])
def test_rbac_is_cluster_wide_or_roles_in_the_watched_namespaces(
    helm: Helm, namespaced: bool
) -> None:
    """Both shapes: cluster-wide, one ClusterRole with every rule; with
    ``watch.namespaces``, a Role and RoleBinding in each of those namespaces (the operator
    then watches only them: the same list reaches its settings), and a ClusterRole that
    reads PriorityClasses and nothing else: no Deployment, Secret or HPA right outside
    those namespaces."""
    values: dict[str, Any] = {"keda": {"enabled": True}, **(NAMESPACED if namespaced else {})}
    docs = helm.template(values)
    env = env_of(operator_container(docs))
    settings = from_env({k: v for k, v in env.items() if isinstance(v, str)})

    def grants(doc: dict[str, Any]) -> set[tuple[str, str, str]]:
        return {
            (group, resource, verb)
            for rule in doc.get("rules") or []
            for group in rule["apiGroups"]
            for resource in rule["resources"]
            for verb in rule["verbs"]
        }

    workload = {
        ("apps", "deployments", "get"),
        ("apps", "deployments/scale", "patch"),
        ("", "secrets", "get"),
        ("autoscaling", "horizontalpodautoscalers", "patch"),  # hpaFloor, and KEDA's nudge
        ("keda.sh", "scaledobjects", "get"),
    }
    cluster_roles = by_kind(docs, "ClusterRole")
    roles = {
        r["metadata"]["namespace"]: r
        for r in by_kind(docs, "Role")
        if not r["metadata"]["name"].endswith("-leader-election")
    }
    bound = {b["metadata"]["namespace"]: b for b in by_kind(docs, "RoleBinding")}
    if not namespaced:
        assert settings.clusterwide
        assert roles == {}
        (cluster_role,) = cluster_roles
        assert workload <= grants(cluster_role)
        assert (
            one(docs, "ClusterRoleBinding")["roleRef"]["name"] == cluster_role["metadata"]["name"]
        )
        return
    assert settings.watch.namespaces == ("team-a", "team-b")
    assert set(roles) == {"team-a", "team-b"}
    for namespace, role in roles.items():
        assert workload <= grants(role)
        binding = bound[namespace]
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": role["metadata"]["name"],
        }
        (subject,) = binding["subjects"]
        assert subject == {
            "kind": "ServiceAccount",
            "name": "prescaler",
            "namespace": "prescaler-system",
        }
    (cluster_role,) = cluster_roles
    assert grants(cluster_role) == {
        ("scheduling.k8s.io", "priorityclasses", "get"),
        ("scheduling.k8s.io", "priorityclasses", "list"),
    }


def pod_selector(docs: list[dict[str, Any]]) -> dict[str, str]:
    selector: dict[str, str] = one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    return selector


def test_dashboard_configmap(helm: Helm) -> None:
    docs = helm.template(ALL_OPTIONAL)
    cm = one(docs, "ConfigMap")
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "LLM"}
    shipped = json.loads((CHART / "dashboards" / "prescaler.json").read_text())
    assert json.loads(cm["data"]["prescaler.json"]) == shipped
    assert not by_kind(helm.template(MINIMAL), "ConfigMap")


def test_minimal_variant_creates_no_cluster_objects_it_was_told_not_to(helm: Helm) -> None:
    docs = helm.template(MINIMAL)
    kinds = {d["kind"] for d in docs}
    assert not kinds & {"ServiceAccount", "PriorityClass", "ClusterRole", "Role"}
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "my-operator"
    assert pod["volumes"][0]["emptyDir"] == {}


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"replicaCount": "two"}, "/replicaCount"),
        ({"replicaCont": 2}, "replicaCont"),
        ({"watch": {"namespaces": "x"}}, "/watch/namespaces"),
        ({"watch": {"namespaces": ["team-*"]}}, "/watch/namespaces/0"),
        ({"watch": {"namespace": ["a"]}}, "namespace"),
        ({"operator": {"logLevel": "loud"}}, "/operator/logLevel"),
        ({"operator": {"forecastWorkers": -1}}, "/operator/forecastWorkers"),
        ({"image": {"repository": "x", "pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"leaderElection": {"enabled": "yes"}}, "/leaderElection/enabled"),
        ({"serviceMonitor": {"enabled": True, "interval": "30"}}, "/serviceMonitor/interval"),
        ({"networkPolicy": {"egress": {"prometheus": {"port": 9090}}}}, "port"),
        ({"placeholderPriorityClass": {"value": 5}}, "/placeholderPriorityClass/value"),
        ({"grafanaDashboard": {"label": {"a": "b"}}}, "label"),
        ({"metrics": {"port": 70000}}, "/metrics/port"),
        ({"shards": -1}, "/shards"),
        ({"shards": "4"}, "/shards"),
        ({"keda": {"port": 0}}, "/keda/port"),
        ({"keda": {"tls": {"secret": "x"}}}, "secret"),
        ({"keda": {"enabled": "yes"}}, "/keda/enabled"),
        ({"keda": {"namespace": "KEDA"}}, "/keda/namespace"),
        ({"keda": {"maxStreams": 0}}, "/keda/maxStreams"),
        ({"keda": {"networkPolicy": {"form": []}}}, "form"),
        ({"keda": {"nudge": "yes"}}, "/keda/nudge"),
        ({"keda": {"missingPeriods": 0}}, "/keda/missingPeriods"),
        (
            {"prometheusRule": {"kedaTriggerMissingFor": "5"}},
            "/prometheusRule/kedaTriggerMissingFor",
        ),
    ],
)
def test_schema_rejects_wrong_values(helm: Helm, values: dict[str, Any], field: str) -> None:
    with pytest.raises(HelmError) as caught:
        helm.template(values)
    message = caught.value.stderr
    assert "schema" in message
    assert field in message, message


def test_every_value_is_documented() -> None:
    """Every value in values.yaml has a comment above it or above an enclosing key."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    stack: list[tuple[int, bool]] = []  # (indent, documented) of the enclosing keys
    for index, line in enumerate(lines):
        match = re.match(r"^(\s*)([A-Za-z][\w]*):(.*)$", line)
        if not match:
            continue
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        commented = index > 0 and lines[index - 1].strip().startswith("#")
        documented = commented or any(doc for _, doc in stack)
        if match.group(3).strip():  # a leaf: scalar, flow list or flow map
            assert documented, f"values.yaml:{index + 1} `{line.strip()}` has no comment"
        stack.append((indent, documented))


def test_schema_covers_every_value() -> None:
    """Each key of values.yaml is declared in the schema (which forbids unknown keys)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(node: dict[str, Any], sub: dict[str, Any], path: str) -> None:
        for key, value in node.items():
            declared = sub.get("properties", {})
            assert key in declared, f"{path}{key} is not in values.schema.json"
            if isinstance(value, dict) and declared[key].get("additionalProperties") is False:
                walk(value, declared[key], f"{path}{key}.")

    walk(values, schema, "")


def test_app_version_is_the_package_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == "prescaler"
    assert chart["appVersion"] == project["version"]


def test_notes_example_pool_is_valid() -> None:
    """The first pool NOTES.txt tells users to apply passes the spec model. (The install
    test reads the rendered NOTES from the real `helm install`.)"""
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    block = notes.split("<<'POOL' | kubectl apply -f -\n", 1)[1].split("     POOL\n", 1)[0]
    assert "{{" not in block
    pool = yaml.safe_load(textwrap.dedent(block))
    assert (pool["apiVersion"], pool["kind"]) == ("prescaler.io/v1alpha1", "InferencePool")
    InferencePoolSpec.model_validate(pool["spec"])
    for hint in ("kubectl get ppool", "describe ppool", "dashboard", "Lease"):
        assert hint in notes


def _documented_values() -> list[str]:
    """Dotted paths of the values.yaml keys whose comment starts with ``# --``."""
    paths: list[str] = []
    stack: list[tuple[int, str]] = []
    comment = ""
    for line in (CHART / "values.yaml").read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comment = comment or stripped
            continue
        match = re.match(r"^(\s*)([A-Za-z][\w]*):", line)
        if match:
            indent = len(match.group(1))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            if comment.startswith("# --"):
                paths.append(".".join([key for _, key in stack] + [match.group(2)]))
            stack.append((indent, match.group(2)))
        comment = ""
    return paths


def test_readme_values_table_lists_every_documented_value() -> None:
    readme = (PROJECT_ROOT / "charts" / "README.md").read_text()
    table = readme.split("## Values", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `([\w.]+)` \|", table, flags=re.MULTILINE)
    documented = _documented_values()
    assert len(documented) > 50
    assert listed == documented, "charts/README.md's values table drifted from values.yaml"
