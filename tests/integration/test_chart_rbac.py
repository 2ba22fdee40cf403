"""The chart's RBAC, for real: what it grants is what the operator uses, and nothing more.

Every operator scenario (the ``operator`` fixture) already runs as the chart's
ServiceAccount with the chart's rules for its namespace, so a rule the operator needs and
the chart lacks fails those tests. Here, in both modes (namespace-scoped Roles and the
cluster-wide ClusterRole), one scenario walks every code path that calls the API; the API
server's audit log (``LocalCluster.audit_log``) then says which (apiGroup, resource, verb)
the ServiceAccount used. The chart may grant nothing the operator did not use, except the
few entries of ``NOT_REQUESTED``, each with its reason. The static checks (no wildcard, a
comment on every rule, the shape of both modes) need only ``helm``.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from cluster.launcher import LocalCluster
from cluster.objects import gpu_deployment, with_readiness_gate
from integration.chart_rbac import (
    CHART,
    Call,
    Grant,
    audit_calls,
    chart_identity,
    granted,
    helm_template,
)
from integration.operator_fixtures import (  # noqa: F401 (fixtures)
    MIN_DEADLINE,
    Kube,
    crd_fixture,
    pool_body,
    running_operator,
    wait_for,
)
from prescaler.api import GROUP, PLURAL, PREWARM_CONDITION, VERSION

MODEL = {"tokensPerSecond": 3750, "promptTokens": 600, "outputTokens": 150}
PRIORITY_CLASS = "prescaler-placeholder"
OLD_FINALIZER = "prescaler.io/finalizer"
"""What operator versions that reconciled on a kopf timer put on every pool."""

NOT_REQUESTED: dict[Grant, str] = {
    ("prescaler.io", "inferencepools/finalizers", "update"): (
        "never a request: the OwnerReferencesPermissionEnforcement admission plugin checks it "
        "when the operator creates a standby object owned by its pool (blockOwnerDeletion); "
        "the standby scenarios fail without it"
    ),
}
"""Granted but never requested, with the reason. Keep it short and true."""


# ---------------------------------------------------------------------- static checks
def _rules(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def test_no_wildcards_and_a_comment_on_every_rule() -> None:
    for values in (
        {},
        {"watch.namespaces": ["team-a", "team-b"], "placeholderPriorityClass.create": False},
    ):
        for obj in helm_template("rel", "ops", values):
            for rule in obj.get("rules") or []:
                for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                    assert "*" not in (rule.get(field) or []), (obj["metadata"]["name"], rule)
                assert rule.get("resources"), rule  # no nonResourceURLs
    lines = (CHART / "templates" / "rbac.yaml").read_text().splitlines()
    rules = [i for i, line in enumerate(lines) if line.strip().startswith("- apiGroups:")]
    assert len(rules) >= 10
    for i in rules:
        assert lines[i - 1].strip().startswith("#"), f"rbac.yaml:{i + 1} has no comment"


def test_cluster_wide_mode_is_one_cluster_role_and_the_lease_role() -> None:
    objects = helm_template("rel", "ops", {})
    (cluster_role,) = _rules(objects, "ClusterRole")
    (binding,) = _rules(objects, "ClusterRoleBinding")
    (lease_role,) = _rules(objects, "Role")
    assert lease_role["metadata"]["namespace"] == "ops"
    assert {r for o in [lease_role] for r in granted([o])} == {
        ("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")
    }
    assert binding["roleRef"]["name"] == cluster_role["metadata"]["name"]
    assert binding["subjects"][0]["namespace"] == "ops"
    # The same rules as the namespace-scoped mode's Roles and ClusterRole together.
    scoped = helm_template("rel", "ops", {"watch.namespaces": ["a"]})
    assert granted([cluster_role]) == granted(
        [o for o in scoped if o["metadata"]["name"] != lease_role["metadata"]["name"]]
    )


def test_namespace_mode_binds_a_role_in_each_namespace_and_keeps_the_cluster_role_small() -> None:
    objects = helm_template("rel", "ops", {"watch.namespaces": ["team-a", "team-b"]})
    roles = {o["metadata"]["namespace"]: o for o in _rules(objects, "Role")}
    bindings = {o["metadata"]["namespace"] for o in _rules(objects, "RoleBinding")}
    assert set(roles) == {"team-a", "team-b", "ops"}  # ops: the leader Lease only
    assert bindings == {"team-a", "team-b", "ops"}
    assert ("apps", "deployments/scale", "patch") in granted([roles["team-a"]])
    (cluster_role,) = _rules(objects, "ClusterRole")
    # Cluster-scoped: reading PriorityClasses only (the placeholders' class and the target
    # pods' class, any name; list: the global default), no Deployment, Secret or HPA.
    assert granted([cluster_role]) == {
        ("scheduling.k8s.io", "priorityclasses", verb) for verb in ("get", "list")
    }
    # PriorityClass creation only when the chart does not create it.
    own = helm_template(
        "rel", "ops", {"watch.namespaces": ["a"], "placeholderPriorityClass.create": False}
    )
    (cluster_role,) = _rules(own, "ClusterRole")
    assert ("scheduling.k8s.io", "priorityclasses", "create") in granted([cluster_role])
    assert not _rules(own, "PriorityClass")
    assert not [
        o for o in helm_template("rel", "ops", {"rbac.create": False}) if "Role" in o["kind"]
    ]


def test_a_namespace_pattern_fails_the_render() -> None:
    with pytest.raises(AssertionError, match=r"watch.namespaces.*pattern"):
        helm_template("rel", "ops", {"watch.namespaces": ["team-*"]})


# ---------------------------------------------------------------------- on the cluster
def _statefulset(name: str) -> dict[str, Any]:
    body = gpu_deployment(name, 1, ready_delay="1s")
    body["kind"] = "StatefulSet"
    body["spec"]["serviceName"] = name
    return body


def _hpa(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": 1,
            "maxReplicas": 4,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {
                        "name": "cpu",
                        "target": {"type": "Utilization", "averageUtilization": 70},
                    },
                }
            ],
        },
    }


def _gone(read: Any, *args: Any) -> bool:
    try:
        read(*args)
        return False
    except ApiException as exc:
        return bool(exc.status == 404)


def _window(minimum: int) -> list[dict[str, Any]]:
    now = time.gmtime(time.time() - 60)
    later = time.gmtime(time.time() + 3600)
    fmt = "%Y-%m-%dT%H:%M:%S"
    return [
        {
            "name": "w",
            "start": time.strftime(fmt, now),
            "end": time.strftime(fmt, later),
            "minReplicas": minimum,
            "leadSeconds": 0,
        }
    ]


def _walk_every_path(k: Kube) -> None:
    """Pools that reach every API call of the operator (see the chart's rule comments)."""
    ns = k.ns
    k.create_deployment(gpu_deployment("web", 1, ready_delay="1s"))
    k.apps.create_namespaced_stateful_set(ns, _statefulset("db"))
    k.create_deployment(gpu_deployment("floor", 1, ready_delay="1s"))
    k.autoscaling.create_namespaced_horizontal_pod_autoscaler(ns, _hpa("floor"))
    k.create_deployment(gpu_deployment("metered", 1, ready_delay="1s"))
    k.core.create_namespaced_secret(
        ns, {"metadata": {"name": "prom"}, "stringData": {"token": "t"}}
    )
    base: dict[str, Any] = {"maxReplicas": 4, "model": MODEL}
    fixed = {"mode": "fixed", "seconds": 1, "marginSeconds": 0}
    # replicas of a Deployment, cold start measured from its pods, every kind of standby.
    k.create_pool(
        "web",
        {
            **base,
            "target": {"name": "web"},
            "schedules": _window(2),
            "standby": {
                "imagePrePull": {"enabled": True},
                "placeholders": {"enabled": True, "maxReplicas": 1},
                "hot": {"replicas": 1},
            },
        },
    )
    k.create_pool(
        "db",
        {
            **base,
            "target": {"kind": "StatefulSet", "name": "db"},
            "coldStart": fixed,
            "schedules": _window(2),
        },
    )
    k.create_pool(
        "floor",
        {
            **base,
            "mode": "hpaFloor",
            "target": {"kind": "HorizontalPodAutoscaler", "name": "floor"},
            "coldStart": fixed,
            "schedules": _window(2),
        },
    )
    # Prometheus credentials from a Secret (nothing listens there: the pool only degrades).
    k.create_pool(
        "metered",
        {
            **base,
            "target": {"name": "metered"},
            "coldStart": fixed,
            "forecast": {
                "prometheus": {"url": "http://127.0.0.1:9", "authSecretRef": {"name": "prom"}},
                "model": "seasonal_naive",
            },
        },
    )
    wait_for(lambda: k.deployment("web").spec.replicas == 2, 60, "web scaled to 2")
    wait_for(
        lambda: k.apps.read_namespaced_stateful_set("db", ns).spec.replicas == 2, 60, "db scaled"
    )
    wait_for(
        lambda: (
            k.autoscaling.read_namespaced_horizontal_pod_autoscaler("floor", ns).spec.min_replicas
            == 2
        ),
        60,
        "the HPA floor raised",
    )
    wait_for(lambda: not _gone(k.deployment, "web-hot"), 60, "the hot standby")
    wait_for(lambda: not _gone(k.deployment, "web-placeholder"), 60, "the placeholders")
    wait_for(
        lambda: not _gone(k.apps.read_namespaced_daemon_set, "web-prepull", ns), 60, "pre-pull"
    )
    # Changed standby objects are replaced (update), disabled ones deleted.
    k.patch_pool("web", {"standby": {"hot": {"replicas": 2}, "imagePrePull": {"image": "pull:2"}}})
    wait_for(lambda: k.deployment("web-hot").spec.replicas == 2, 60, "the hot standby resized")
    wait_for(
        lambda: (
            k.apps.read_namespaced_daemon_set("web-prepull", ns)
            .spec.template.spec.containers[0]
            .image
            == "pull:2"
        ),
        60,
        "the pre-pull image changed",
    )
    k.patch_pool(
        "web",
        {
            "standby": {
                "hot": {"replicas": 0},
                "imagePrePull": {"enabled": False},
                "placeholders": {"enabled": False},
            }
        },
    )
    for name in ("web-hot", "web-placeholder"):
        wait_for(functools.partial(_gone, k.deployment, name), 60, f"{name} deleted")
    wait_for(
        lambda: _gone(k.apps.read_namespaced_daemon_set, "web-prepull", ns), 60, "pre-pull deleted"
    )
    # The degradation ConfigMap (create): one edited by hand is put back (update), one
    # turned off is deleted.
    cm = "web-degradation"
    read_cm = k.core.read_namespaced_config_map
    wait_for(lambda: not _gone(read_cm, cm, ns), 60, "the degradation ConfigMap")
    k.core.patch_namespaced_config_map(
        cm,
        ns,
        {"metadata": {"annotations": {"prescaler.io/spec-hash": "x"}}, "data": {"level": "x"}},
    )
    wait_for(lambda: read_cm(cm, ns).data["level"] == "normal", 60, "the ConfigMap put back")
    k.patch_pool("web", {"degradation": {"configMap": False}})
    wait_for(lambda: _gone(read_cm, cm, ns), 60, "the degradation ConfigMap deleted")
    # A hot standby pod is promoted (patch) into a target that grows, and retired (delete)
    # once the target's own replica is Ready.
    k.create_deployment(gpu_deployment("burst", 1, ready_delay="6s"))
    k.create_pool(
        "burst",
        {
            **base,
            "target": {"name": "burst"},
            "coldStart": fixed,
            "schedules": _window(1),
            "standby": {"hot": {"replicas": 1}},
        },
    )
    wait_for(
        lambda: (
            not _gone(k.deployment, "burst-hot")
            and (k.deployment("burst-hot").status.ready_replicas or 0) == 1
        ),
        60,
        "a ready hot standby",
    )
    k.patch_pool("burst", {"schedules": _window(2)})
    wait_for(
        lambda: "HotStandbyRetired" in [e.reason for e in k.events("burst")],
        60,
        "the hot standby promoted and retired",
    )
    # Prewarm: kopf's pod watch sees a gated pod; its prompts' ConfigMap lacks the key, so
    # it is released (pods/status) after the ConfigMap is read, without reaching an engine.
    k.core.create_namespaced_config_map(
        ns, {"metadata": {"name": "prompts"}, "data": {"other": "[]"}}
    )
    k.create_deployment(
        with_readiness_gate(gpu_deployment("warm", 1, ready_delay="1s"), PREWARM_CONDITION)
    )
    k.create_pool(
        "warm",
        {
            **base,
            "target": {"name": "warm"},
            "coldStart": fixed,
            "prewarm": {"configMapRef": {"name": "prompts"}},
        },
    )
    wait_for(lambda: _released(k, "warm"), 120, "the gated pod released")
    # A pool deleted goes without the operator (it has no finalizer to take off) ...
    k.delete_pool("db")
    wait_for(lambda: _gone(k.pool, "db"), 60, "the pool db to go")
    # ... and kopf takes an older version's finalizer off a pool (patch).
    legacy = pool_body("legacy", {**base, "target": {"name": "db", "kind": "StatefulSet"}})
    legacy["metadata"]["finalizers"] = [OLD_FINALIZER]
    k.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, legacy)
    wait_for(
        lambda: not k.pool("legacy")["metadata"].get("finalizers"), 60, "the old finalizer off"
    )


def _released(k: Kube, app: str) -> bool:
    for pod in k.core.list_namespaced_pod(k.ns, label_selector=f"app={app}").items:
        for cond in pod.status.conditions or []:
            if cond.type == PREWARM_CONDITION and cond.status == "True":
                return True
    return False


def _mine(calls: list[Call], namespace: str) -> list[Call]:
    """Calls in the test's namespace and cluster-scoped ones; a cluster-wide operator also
    meets other tests' leftover pools in namespaces being deleted, which are not ours."""
    return [c for c in calls if c.namespace in (namespace, None)]


@pytest.fixture
def no_placeholder_class(kube: Any) -> None:
    """Without the chart's PriorityClass: the operator must create it."""
    scheduling: Any = client.SchedulingV1Api(kube)
    try:
        scheduling.delete_priority_class(PRIORITY_CLASS)
    except ApiException as exc:
        if exc.status != 404:
            raise
    wait_for(lambda: _gone(scheduling.read_priority_class, PRIORITY_CLASS), 30, "no PriorityClass")


@pytest.mark.cluster
@pytest.mark.parametrize(
    ("clusterwide", "chart_priority_class"),
    [(False, False), (True, True)],
    ids=["namespace-scoped,operator-creates-priorityclass", "cluster-wide,chart-priorityclass"],
)
def test_the_operator_uses_every_granted_rule_and_only_those(
    cluster: LocalCluster,
    crd: None,
    kube: Any,
    namespace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    no_placeholder_class: None,
    clusterwide: bool,
    chart_priority_class: bool,
) -> None:
    values = {"placeholderPriorityClass.create": chart_priority_class}
    with chart_identity(
        cluster, namespace, tmp_path, clusterwide=clusterwide, values=values
    ) as identity:
        grants = granted(identity.objects)
        assert set(NOT_REQUESTED) <= grants, "NOT_REQUESTED names a rule the chart dropped"
        expected = grants - set(NOT_REQUESTED)
        monkeypatch.setenv("KUBECONFIG", str(identity.kubeconfig))
        with running_operator(cluster, namespace, identity, clusterwide=clusterwide):
            _walk_every_path(Kube(kube, namespace))

            # The last calls (a lease renewal, a Warning) may still be on their way; the
            # assertions below name whatever is still unused after the deadline.
            deadline = time.monotonic() + MIN_DEADLINE
            while time.monotonic() < deadline:
                calls = _mine(audit_calls(cluster, identity.user), namespace)
                if expected <= {c.grant for c in calls}:
                    break
                time.sleep(0.5)
        calls = _mine(audit_calls(cluster, identity.user), namespace)
    denied = sorted(
        {(c.grant, c.namespace, c.code) for c in calls if c.code == 403 or c.forbidden_by_rbac}
    )
    assert not denied, f"the operator was refused (a rule the chart lacks): {denied}"
    used = {c.grant for c in calls}
    assert used <= grants, sorted(used - grants)
    unused = grants - used - set(NOT_REQUESTED)
    assert not unused, f"granted, never used: {sorted(unused)}"
    assert not used & set(NOT_REQUESTED), "a NOT_REQUESTED rule is requested now: drop it there"
    if not chart_priority_class:
        assert ("scheduling.k8s.io", "priorityclasses", "create") in used
    if clusterwide:
        lists = {
            c.namespace for c in calls if c.grant == ("prescaler.io", "inferencepools", "list")
        }
        assert lists == {None}, "cluster-wide mode lists pools across the cluster"
