"""The Helm chart's RBAC on the local cluster: render it, apply it, act as its ServiceAccount.

``chart_identity(cluster, namespace, tmp_dir)`` renders ``charts/prescaler`` with ``helm
template`` for a release named after ``namespace`` and installed there, applies its
ServiceAccount, (Cluster)Roles and bindings and its placeholder PriorityClass with the
admin client, and yields a :class:`ChartIdentity`: a kubeconfig that authenticates as
that ServiceAccount with a TokenRequest-issued token (what the pod's projected token
is), the rendered RBAC objects and the audit user name. Cluster-scoped RBAC objects are
deleted afterwards (the namespaced ones go with the namespace).

``admission_identity(cluster, namespace, tmp_dir)`` does the same for ``prescaler admit``
(``admission.enabled``): its own ServiceAccount, Role and RoleBinding.

``audit_calls(cluster, user)`` reads what that user asked the API server, from the
cluster's audit log; ``granted(objects)`` expands the rendered rules.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, utils
from kubernetes.client.exceptions import ApiException

from cluster.launcher import LocalCluster
from cluster.paths import PROJECT_ROOT, bin_dir, require_binaries

CHART = PROJECT_ROOT / "charts" / "prescaler"
RBAC_KINDS = ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")
APPLIED_KINDS = ("ServiceAccount", *RBAC_KINDS, "PriorityClass")
KUBE_VERSION = "1.33.0"
"""What ``helm template`` renders for without a cluster (the chart's kubeVersion floor)."""


def helm_template(
    release: str, namespace: str, values: dict[str, Any], kube_version: str = KUBE_VERSION
) -> list[dict[str, Any]]:
    """The chart's objects for ``release`` in ``namespace`` with ``values`` (``--set-json``)."""
    require_binaries(["helm"])
    argv = [str(bin_dir() / "helm"), "template", release, str(CHART), "--namespace", namespace]
    argv += ["--kube-version", kube_version]
    for key, value in values.items():
        argv += ["--set-json", f"{key}={json.dumps(value)}"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if out.returncode != 0:
        raise AssertionError(f"helm template failed: {out.stderr}")
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


Grant = tuple[str, str, str]
"""(apiGroup, resource or resource/subresource, verb)."""


def granted(objects: Iterable[dict[str, Any]]) -> set[Grant]:
    """Every (apiGroup, resource, verb) the rendered Roles and ClusterRoles allow."""
    grants: set[Grant] = set()
    for obj in objects:
        if obj["kind"] not in ("Role", "ClusterRole"):
            continue
        for rule in obj.get("rules") or []:
            for group in rule.get("apiGroups") or []:
                for resource in rule.get("resources") or []:
                    for verb in rule.get("verbs") or []:
                        grants.add((group, resource, verb))
    return grants


@dataclass(frozen=True)
class Call:
    """One API request of the audited user (Metadata level: no bodies)."""

    grant: Grant
    namespace: str | None
    name: str | None
    code: int
    forbidden_by_rbac: bool


def audit_calls(cluster: LocalCluster, user: str) -> list[Call]:
    """The resource requests ``user`` made so far (non-resource URLs such as discovery left out)."""
    calls: dict[str, Call] = {}
    if not cluster.audit_log.exists():
        return []
    with cluster.audit_log.open() as lines:
        for line in lines:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:  # the line the API server is writing now
                continue
            ref = event.get("objectRef")
            if event.get("user", {}).get("username") != user or not ref or "resource" not in ref:
                continue
            sub = ref.get("subresource")
            resource = f"{ref['resource']}/{sub}" if sub else ref["resource"]
            annotations = event.get("annotations") or {}
            calls[event["auditID"]] = Call(
                grant=(ref.get("apiGroup", ""), resource, event["verb"]),
                namespace=ref.get("namespace"),
                name=ref.get("name"),
                code=int((event.get("responseStatus") or {}).get("code", 0)),
                forbidden_by_rbac=annotations.get("authorization.k8s.io/decision") == "forbid",
            )
    return list(calls.values())


@dataclass(frozen=True)
class ChartIdentity:
    kubeconfig: Path
    """Authenticates as the chart's ServiceAccount."""
    user: str
    """That ServiceAccount's user name in the audit log."""
    objects: list[dict[str, Any]]
    """The applied objects as rendered (ServiceAccount, RBAC, PriorityClass)."""
    lease_name: str
    """The leader Lease the chart's Role names."""


def _apply(api: Any, obj: dict[str, Any], namespace: str) -> None:
    try:
        utils.create_from_dict(api, obj, namespace=namespace)  # type: ignore[no-untyped-call]
    except utils.FailToCreateError as exc:
        if not all(e.status == 409 for e in exc.api_exceptions):
            raise


def _delete_cluster_rbac(api: Any, obj: dict[str, Any]) -> None:
    rbac: Any = client.RbacAuthorizationV1Api(api)
    delete = {
        "ClusterRole": rbac.delete_cluster_role,
        "ClusterRoleBinding": rbac.delete_cluster_role_binding,
    }.get(obj["kind"])
    if delete is None:
        return
    try:
        delete(obj["metadata"]["name"])
    except ApiException as exc:
        if exc.status != 404:
            raise


def _lease_name(objects: list[dict[str, Any]]) -> str:
    for obj in objects:
        if obj["kind"] != "Role":
            continue
        for rule in obj.get("rules") or []:
            if "leases" in rule.get("resources", []) and rule.get("resourceNames"):
                return str(rule["resourceNames"][0])
    return ""


def _sa_kubeconfig(cluster: LocalCluster, token: str, path: Path) -> Path:
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    (cluster_entry,) = admin["clusters"]
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster_entry],
        "users": [{"name": "operator", "user": {"token": token}}],
        "contexts": [
            {"name": "operator", "context": {"cluster": cluster_entry["name"], "user": "operator"}}
        ],
        "current-context": "operator",
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    path.chmod(0o600)
    return path


@contextmanager
def chart_identity(
    cluster: LocalCluster,
    namespace: str,
    tmp_dir: Path,
    *,
    clusterwide: bool = False,
    values: dict[str, Any] | None = None,
) -> Iterator[ChartIdentity]:
    """The chart installed as release ``namespace`` in ``namespace`` (RBAC only), watching
    that namespace (or the whole cluster); yields a kubeconfig acting as its ServiceAccount."""
    settings = {"watch.namespaces": [] if clusterwide else [namespace], **(values or {})}
    api = cluster.api_client()
    objects: list[dict[str, Any]] = []
    try:
        version = client.VersionApi(api).get_code().git_version.lstrip("v")
        rendered = helm_template(namespace, namespace, settings, kube_version=version)
        objects += [o for o in rendered if o["kind"] in APPLIED_KINDS]
        (account,) = [o for o in objects if o["kind"] == "ServiceAccount"]
        sa_name = account["metadata"]["name"]
        for obj in objects:
            _apply(api, obj, namespace)
        core: Any = client.CoreV1Api(api)
        token = core.create_namespaced_service_account_token(
            sa_name, namespace, {"spec": {"expirationSeconds": 3600}}
        ).status.token
        yield ChartIdentity(
            kubeconfig=_sa_kubeconfig(cluster, token, tmp_dir / "operator.kubeconfig"),
            user=f"system:serviceaccount:{namespace}:{sa_name}",
            objects=objects,
            lease_name=_lease_name(objects),
        )
    finally:
        for obj in objects:
            _delete_cluster_rbac(api, obj)
        api.close()


@contextmanager
def admission_identity(
    cluster: LocalCluster, namespace: str, tmp_dir: Path
) -> Iterator[ChartIdentity]:
    """The chart's ``prescaler admit`` identity for release ``namespace`` in ``namespace``
    (``admission.enabled``, watching that namespace): its ServiceAccount, Role and
    RoleBinding applied; yields a kubeconfig acting as that ServiceAccount."""
    settings = {"watch.namespaces": [namespace], "admission.enabled": True}
    api = cluster.api_client()
    try:
        version = client.VersionApi(api).get_code().git_version.lstrip("v")
        rendered = helm_template(namespace, namespace, settings, kube_version=version)
        objects = [
            o
            for o in rendered
            if o["kind"] in APPLIED_KINDS
            and (o["metadata"].get("labels") or {}).get("app.kubernetes.io/component")
            == "admission"
        ]
        (account,) = [o for o in objects if o["kind"] == "ServiceAccount"]
        sa_name = account["metadata"]["name"]
        for obj in objects:
            _apply(api, obj, namespace)
        core: Any = client.CoreV1Api(api)
        token = core.create_namespaced_service_account_token(
            sa_name, namespace, {"spec": {"expirationSeconds": 3600}}
        ).status.token
        yield ChartIdentity(
            kubeconfig=_sa_kubeconfig(cluster, token, tmp_dir / "admission.kubeconfig"),
            user=f"system:serviceaccount:{namespace}:{sa_name}",
            objects=objects,
            lease_name="",
        )
    finally:
        api.close()
