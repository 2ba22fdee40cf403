"""`helm install` into the real local API server, then the objects are read back from it.

Each test installs a uniquely named release into a fresh namespace and uninstalls it at the
end. The operator pods are not waited for: the image is not in any registry, and nothing
here depends on the pods running.

The ServiceMonitor is left out of these installs: the local cluster has no
prometheus-operator CRDs, so the API server would reject the kind itself.
``test_chart_render.py`` checks that object.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_tools import Helm

from cluster.launcher import LocalCluster
from cluster.paths import PROJECT_ROOT

pytestmark = pytest.mark.cluster

CRD_FILE = PROJECT_ROOT / "crds" / "inferencepools.prescaler.io.yaml"


def wait_for(check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Poll ``check`` until it returns something truthy (generous deadlines: the machine
    is shared; nothing here asserts on time)."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what} (last: {last!r})")


def as_dict(api: Any, obj: Any) -> dict[str, Any]:
    """A kubernetes client object as the camelCase dict the API server returned."""
    out: dict[str, Any] = api.sanitize_for_serialization(obj)
    return out


def not_found(read: Callable[[], Any]) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        read()
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


@contextmanager
def installed(
    cluster: LocalCluster, tmp_path: Path, namespace: str, values: dict[str, Any]
) -> Iterator[tuple[str, str]]:
    """``helm install`` (fullname = release name), yields (fullname, NOTES); uninstalls."""
    helm = Helm(tmp_path / "helm", kubeconfig=cluster.kubeconfig)
    release = f"p-{namespace}"
    args = ["install", release, str(PROJECT_ROOT / "charts" / "prescaler")]
    args += ["--namespace", namespace, "--values", str(helm.values_file(values))]
    args += ["--set", f"fullnameOverride={release}", "--timeout", "5m"]
    out = helm.run(*args, timeout_s=600)
    try:
        yield release, out.split("NOTES:", 1)[1] if "NOTES:" in out else ""
    finally:
        helm.run("uninstall", release, "--namespace", namespace, "--wait", timeout_s=600)


def test_install_cluster_wide_with_optional_objects(
    cluster: LocalCluster, kube: Any, namespace: str, tmp_path: Path
) -> None:
    from kubernetes import client

    apps: Any = client.AppsV1Api(kube)
    core: Any = client.CoreV1Api(kube)
    ext: Any = client.ApiextensionsV1Api(kube)
    policy: Any = client.PolicyV1Api(kube)
    net: Any = client.NetworkingV1Api(kube)
    scheduling: Any = client.SchedulingV1Api(kube)
    rbac: Any = client.RbacAuthorizationV1Api(kube)

    priority_class = f"{namespace}-placeholder"  # cluster-scoped: unique per test
    values = {
        "placeholderPriorityClass": {"create": True, "name": priority_class},
        "networkPolicy": {"enabled": True},
        "grafanaDashboard": {"enabled": True, "annotations": {"grafana_folder": "LLM"}},
        "keda": {"enabled": True},
    }
    with installed(cluster, tmp_path, namespace, values) as (fullname, notes):
        assert "kubectl get ppool" in notes
        assert "describe ppool" in notes

        # The CRD: installed from the chart's crds/ (or already there), Established, and
        # the same definition as the generated crds/.
        expected = yaml.safe_load(CRD_FILE.read_text())
        name = expected["metadata"]["name"]

        def established() -> dict[str, Any] | None:
            crd = as_dict(kube, ext.read_custom_resource_definition(name))
            conditions = crd.get("status", {}).get("conditions", [])
            ok = any(c["type"] == "Established" and c["status"] == "True" for c in conditions)
            return crd if ok else None

        crd = wait_for(established, 60, "the CRD to be Established")
        assert crd["spec"]["group"] == expected["spec"]["group"]
        assert crd["spec"]["scope"] == expected["spec"]["scope"]
        assert expected["spec"]["names"].items() <= crd["spec"]["names"].items()
        (served,) = crd["spec"]["versions"]
        (wanted,) = expected["spec"]["versions"]
        for key in ("name", "served", "storage", "subresources", "schema"):
            assert served[key] == wanted[key], key
        assert served["additionalPrinterColumns"] == wanted["additionalPrinterColumns"]

        # The operator Deployment, as the API server stored it.
        deployment = as_dict(kube, apps.read_namespaced_deployment(fullname, namespace))
        assert deployment["spec"]["replicas"] == 2
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == 10001
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["serviceAccountName"] == fullname
        assert pod["automountServiceAccountToken"] is True
        (container,) = pod["containers"]
        sc = container["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
            "metrics": 8080,
            "health": 8081,
            "scaler": 9090,
        }
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert container[probe]["httpGet"]["path"] == "/healthz"
            assert container[probe]["httpGet"]["port"] == "health"
        assert container["resources"]["requests"]["cpu"]
        assert container["resources"]["limits"]["memory"]
        assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
        env = {e["name"]: e for e in container["env"]}
        assert env["PRESCALER_LEADER_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == (
            "metadata.namespace"
        )

        service = as_dict(kube, core.read_namespaced_service(f"{fullname}-metrics", namespace))
        (port,) = service["spec"]["ports"]
        assert (port["name"], port["port"], port["targetPort"]) == ("metrics", 8080, "metrics")
        scaler = as_dict(kube, core.read_namespaced_service(f"{fullname}-scaler", namespace))
        (port,) = scaler["spec"]["ports"]
        assert (port["port"], port["targetPort"], port["appProtocol"]) == (9090, "scaler", "grpc")
        sa = as_dict(kube, core.read_namespaced_service_account(fullname, namespace))
        assert sa["metadata"]["labels"]["app.kubernetes.io/instance"] == fullname
        pdb = as_dict(kube, policy.read_namespaced_pod_disruption_budget(fullname, namespace))
        assert pdb["spec"]["maxUnavailable"] == 1
        netpol = as_dict(kube, net.read_namespaced_network_policy(fullname, namespace))
        assert netpol["spec"]["policyTypes"] == ["Ingress", "Egress"]

        dashboard = as_dict(
            kube, core.read_namespaced_config_map(f"{fullname}-dashboard", namespace)
        )
        assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert dashboard["metadata"]["annotations"]["grafana_folder"] == "LLM"
        assert '"panels"' in dashboard["data"]["prescaler.json"]

        pc = as_dict(kube, scheduling.read_priority_class(priority_class))
        assert (pc["value"], pc["preemptionPolicy"], pc.get("globalDefault", False)) == (
            -10,
            "Never",
            False,
        )

        # Cluster-wide mode: the RBAC template (rbac.yaml) made a ClusterRole.
        rbac.read_cluster_role(fullname)

    # helm uninstall removed the release's objects; the CRD stays (helm never deletes
    # crds/, so the pools survive an uninstall).
    wait_for(
        lambda: not_found(lambda: apps.read_namespaced_deployment(fullname, namespace)),
        120,
        "the Deployment to go",
    )
    wait_for(
        lambda: not_found(lambda: scheduling.read_priority_class(priority_class)),
        120,
        "the PriorityClass to go",
    )
    ext.read_custom_resource_definition(name)


def test_install_namespace_scoped(
    cluster: LocalCluster, kube: Any, namespace: str, tmp_path: Path
) -> None:
    from kubernetes import client

    apps: Any = client.AppsV1Api(kube)
    rbac: Any = client.RbacAuthorizationV1Api(kube)
    values = {
        "watch": {"namespaces": [namespace]},
        "replicaCount": 1,
        "placeholderPriorityClass": {"create": False},
    }
    with installed(cluster, tmp_path, namespace, values) as (fullname, notes):
        assert namespace in notes
        deployment = as_dict(kube, apps.read_namespaced_deployment(fullname, namespace))
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["PRESCALER_WATCH_NAMESPACES"] == namespace
        roles = rbac.list_namespaced_role(namespace).items
        assert roles, "namespace-scoped mode made no Role in the watched namespace"
        assert not_found(lambda: rbac.read_cluster_role(fullname))
