"""Real KEDA (its operator and its metrics API server) against a local cluster.

``keda-operator`` and ``keda-adapter`` are built from KEDA's Go module by
``make cluster-bin`` (``hack/cluster/tools/keda``) and run here as local processes, as the
launcher runs the control plane: logs in files, free loopback ports, waits on readiness,
stopped by PID. What the Helm chart would do in a real cluster is done here by hand:

- KEDA's CRDs (ScaledObject, ScaledJob, TriggerAuthentication,
  ClusterTriggerAuthentication, and eventing's CloudEventSource and
  ClusterCloudEventSource, which the operator watches too), copied from the pinned module
  by ``make cluster-bin``.
- The ``keda`` namespace (``POD_NAMESPACE`` and ``KEDA_CLUSTER_OBJECT_NAMESPACE``); the
  operator watches every namespace (``WATCH_NAMESPACE=""``).
- The certificates the two use between themselves (the adapter calls the operator's gRPC
  metrics service with mutual TLS): one CA and one certificate for both ends, made up front
  in a cert dir (``ca.crt``, ``tls.crt``, ``tls.key``, as KEDA mounts its Secret), with
  KEDA's own rotation off. The adapter serves the external metrics API with that
  certificate too.
- The aggregated API: the APIService ``v1beta1.external.metrics.k8s.io`` for the Service
  ``keda/keda-operator-metrics-apiserver``. There is no Service network here, and
  EndpointSlices refuse loopback addresses, so that Service is an ExternalName for
  ``127.0.0.1``: the aggregator resolves an ExternalName Service to its name and the
  APIService's port, and dials the adapter there (it verifies the certificate for
  ``<service>.<namespace>.svc`` against the APIService's ``caBundle``).

The kube-controller-manager's HPA controller (15 s sync) then scales what KEDA's HPAs ask.

KEDA's scalers run in the operator process on this machine: an ``external`` trigger's
``scalerAddress`` is ``127.0.0.1:<port>`` of a local server (:func:`scaler_address`).
KEDA asks an external scaler for its metric spec before it reads a metric, and its
``fallback`` counts only failed reads: an external scaler that answers ``GetMetricSpec`` but
fails ``GetMetrics`` gets the fallback replicas, one that cannot be reached at all does not
(the HPA holds its replicas; kedacore/keda#8056), nor does a ScaledObject whose scaler was
never reached get an HPA.

Usage::

    keda = Keda(cluster, run_dir)
    keda.start()    # blocks until the APIService is Available
    ...
    keda.stop()
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import ssl
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from . import procs
from .certs import make_service_certs
from .launcher import LocalCluster
from .paths import MissingBinaryError, bin_dir, keda_crds_dir, require_binaries

BINARIES = ("keda-operator", "keda-adapter")
NAMESPACE = "keda"
"""Where KEDA runs: its pod namespace and cluster object namespace."""
GROUP = "keda.sh"
VERSION = "v1alpha1"
SCALED_OBJECTS = "scaledobjects"
EXTERNAL_METRICS_GROUP = "external.metrics.k8s.io"
EXTERNAL_METRICS_VERSION = "v1beta1"
APISERVICE = f"{EXTERNAL_METRICS_VERSION}.{EXTERNAL_METRICS_GROUP}"
METRICS_SERVICE = "keda-operator-metrics-apiserver"
"""The Service the APIService points at (the name KEDA's chart gives it)."""
OPERATOR_SERVICE = "keda-operator"
SCALED_OBJECT_LABEL = "scaledobject.keda.sh/name"
"""The label KEDA puts on an HPA's external metric selector, naming its ScaledObject."""


def scaler_address(port: int) -> str:
    """The ``scalerAddress`` of an ``external`` trigger for a server on this machine's
    ``port``: KEDA's operator runs here, on loopback."""
    return f"127.0.0.1:{port}"


def hpa_name(scaled_object: str) -> str:
    """The HPA KEDA creates for a ScaledObject (owned by it)."""
    return f"keda-hpa-{scaled_object}"


def scaled_object(
    name: str,
    target: str,
    triggers: Sequence[Mapping[str, Any]],
    **spec: Any,
) -> dict[str, Any]:
    """A ScaledObject scaling the Deployment ``target`` on ``triggers``; ``spec`` adds or
    overrides fields (``minReplicaCount``, ``pollingInterval``, ``fallback``, ...)."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ScaledObject",
        "metadata": {"name": name},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
            "triggers": [dict(t) for t in triggers],
            **spec,
        },
    }


class Keda:
    """Start, use and stop KEDA on one :class:`LocalCluster`. See the module docstring."""

    def __init__(
        self,
        cluster: LocalCluster,
        run_dir: Path,
        *,
        tie_to_parent: bool = True,
        start_timeout_s: float = 240.0,
    ) -> None:
        self.cluster = cluster
        self.run_dir = run_dir.resolve()
        self.tie_to_parent = tie_to_parent
        self.start_timeout_s = start_timeout_s
        self.namespace = NAMESPACE
        self.procs: list[procs.Proc] = []
        self.grpc_port = 0
        """The operator's gRPC metrics service (the adapter's upstream)."""
        self.adapter_port = 0
        """The adapter's external metrics API (HTTPS, behind the APIService)."""
        self.operator_metrics_port = 0
        """The operator's Prometheus metrics (HTTP ``/metrics``)."""
        self._apiservice_created = False

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Install the CRDs, start the operator and the adapter, register the APIService
        and wait until it is Available. Raises ``procs.ComponentError`` (with the logs)
        and leaves nothing running when start-up fails."""
        require_binaries(BINARIES)
        crds = sorted(keda_crds_dir().glob("*.yaml"))
        if not crds:
            raise MissingBinaryError(
                f"KEDA's CRDs are missing in {keda_crds_dir()}: run `make cluster-bin`"
            )
        try:
            self._start(crds)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Unregister the APIService (an unavailable aggregated API would stall discovery,
        and with it namespace deletion, for the rest of the cluster's life), then stop the
        processes by PID, newest first. Idempotent."""
        if self._apiservice_created:
            with contextlib.suppress(Exception):
                self._delete_apiservice()
            self._apiservice_created = False
        for p in reversed(self.procs):
            p.stop()
        self.procs.clear()

    def __enter__(self) -> Keda:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def logs(self) -> Path:
        return self.run_dir / "logs"

    # ------------------------------------------------------------------ internals

    def _start(self, crds: list[Path]) -> None:
        from kubernetes import client

        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        certs = make_service_certs(
            self.run_dir / "certs",
            "keda",
            [
                *_service_names(OPERATOR_SERVICE, NAMESPACE),
                *_service_names(METRICS_SERVICE, NAMESPACE),
            ],
        )
        # The CAs KEDA's scalers trust besides the system's (its --ca-dir): KEDA's own, so
        # that a test's TLS server may use a certificate from it.
        custom_ca = self.run_dir / "custom-ca"
        custom_ca.mkdir(exist_ok=True)
        shutil.copyfile(certs / "ca.crt", custom_ca / "ca.crt")
        api = self.cluster.api_client()
        try:
            _install_crds(api, crds, self.start_timeout_s)
            core: Any = client.CoreV1Api(api)
            with _exists_ok():
                core.create_namespace({"metadata": {"name": NAMESPACE}})

            kubeconfig = str(self.cluster.kubeconfig)
            env = {
                **os.environ,
                "KUBECONFIG": kubeconfig,
                "WATCH_NAMESPACE": "",
                "POD_NAMESPACE": NAMESPACE,
                "KEDA_CLUSTER_OBJECT_NAMESPACE": NAMESPACE,
            }
            bins = bin_dir()
            self.grpc_port = procs.free_port()
            self.operator_metrics_port = procs.free_port()
            probe_port = procs.free_port()
            operator = self._spawn(
                "keda-operator",
                [
                    str(bins / "keda-operator"),
                    "--leader-elect=false",
                    f"--metrics-bind-address=127.0.0.1:{self.operator_metrics_port}",
                    f"--health-probe-bind-address=127.0.0.1:{probe_port}",
                    f"--metrics-service-bind-address=127.0.0.1:{self.grpc_port}",
                    f"--cert-dir={certs}",
                    "--enable-cert-rotation=false",
                    f"--ca-dir={custom_ca}",
                    "--zap-encoder=console",
                    "--zap-log-level=info",
                ],
                env,
            )
            procs.wait_for(
                "keda-operator /readyz",
                lambda: _http_ok(f"http://127.0.0.1:{probe_port}/readyz"),
                self.start_timeout_s,
                [operator],
            )
            procs.wait_for(
                "keda-operator's gRPC metrics service",
                lambda: _port_open(self.grpc_port),
                self.start_timeout_s,
                [operator],
            )

            self.adapter_port = procs.free_port()
            adapter = self._spawn(
                "keda-adapter",
                [
                    str(bins / "keda-adapter"),
                    "--bind-address=127.0.0.1",
                    f"--secure-port={self.adapter_port}",
                    f"--cert-dir={certs}",
                    f"--tls-cert-file={certs / 'tls.crt'}",
                    f"--tls-private-key-file={certs / 'tls.key'}",
                    f"--metrics-service-address=127.0.0.1:{self.grpc_port}",
                    f"--port={procs.free_port()}",
                    f"--lister-kubeconfig={kubeconfig}",
                    f"--authentication-kubeconfig={kubeconfig}",
                    f"--authorization-kubeconfig={kubeconfig}",
                    "--zap-encoder=console",
                    "--zap-log-level=info",
                ],
                env,
            )
            adapter_tls = ssl.create_default_context(cafile=str(certs / "ca.crt"))
            procs.wait_for(
                "keda-adapter /readyz",
                lambda: _http_ok(f"https://127.0.0.1:{self.adapter_port}/readyz", adapter_tls),
                self.start_timeout_s,
                [operator, adapter],
            )

            self._register_apiservice(api, (certs / "ca.crt").read_bytes())
            procs.wait_for(
                f"APIService {APISERVICE} Available",
                lambda: _apiservice_available(api),
                self.start_timeout_s,
                [operator, adapter],
            )
        finally:
            api.close()

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> procs.Proc:
        p = procs.start(name, argv, self.logs, tie_to_parent=self.tie_to_parent, env=env)
        self.procs.append(p)
        return p

    def _register_apiservice(self, api: Any, ca_pem: bytes) -> None:
        from kubernetes import client

        core: Any = client.CoreV1Api(api)
        service = {
            "metadata": {"name": METRICS_SERVICE, "namespace": NAMESPACE},
            "spec": {
                "type": "ExternalName",
                "externalName": "127.0.0.1",
                "ports": [{"name": "https", "port": self.adapter_port, "protocol": "TCP"}],
            },
        }
        with contextlib.suppress(client.ApiException):
            core.delete_namespaced_service(METRICS_SERVICE, NAMESPACE)
        core.create_namespaced_service(NAMESPACE, service)

        registration: Any = client.ApiregistrationV1Api(api)
        body = {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": APISERVICE},
            "spec": {
                "group": EXTERNAL_METRICS_GROUP,
                "version": EXTERNAL_METRICS_VERSION,
                "service": {
                    "name": METRICS_SERVICE,
                    "namespace": NAMESPACE,
                    "port": self.adapter_port,
                },
                "caBundle": base64.b64encode(ca_pem).decode(),
                "groupPriorityMinimum": 100,
                "versionPriority": 100,
            },
        }
        with contextlib.suppress(client.ApiException):
            registration.delete_api_service(APISERVICE)
        registration.create_api_service(body)
        self._apiservice_created = True

    def _delete_apiservice(self) -> None:
        from kubernetes import client

        api = self.cluster.api_client()
        try:
            registration: Any = client.ApiregistrationV1Api(api)
            registration.delete_api_service(APISERVICE)
        finally:
            api.close()


# ---------------------------------------------------------------------- helpers


def _service_names(name: str, namespace: str) -> Iterator[str]:
    yield name
    yield f"{name}.{namespace}"
    yield f"{name}.{namespace}.svc"
    yield f"{name}.{namespace}.svc.cluster.local"


@contextlib.contextmanager
def _exists_ok() -> Iterator[None]:
    from kubernetes import client

    try:
        yield
    except client.ApiException as exc:
        if exc.status != 409:
            raise


def _install_crds(api: Any, files: list[Path], timeout_s: float) -> None:
    """Create (or replace) each CRD and wait until all are Established."""
    from kubernetes import client

    ext: Any = client.ApiextensionsV1Api(api)
    names = []
    for path in files:
        body = yaml.safe_load(path.read_text())
        name = body["metadata"]["name"]
        names.append(name)
        try:
            ext.create_custom_resource_definition(body)
        except client.ApiException as exc:
            if exc.status != 409:
                raise
            current = ext.read_custom_resource_definition(name)
            body["metadata"]["resourceVersion"] = current.metadata.resource_version
            ext.replace_custom_resource_definition(name, body)

    def established() -> bool:
        for name in names:
            conditions = ext.read_custom_resource_definition(name).status.conditions or []
            if not any(c.type == "Established" and c.status == "True" for c in conditions):
                return False
        return True

    procs.wait_for("KEDA's CRDs Established", established, timeout_s)


def _apiservice_available(api: Any) -> bool:
    from kubernetes import client

    registration: Any = client.ApiregistrationV1Api(api)
    conditions = registration.read_api_service(APISERVICE).status.conditions or []
    return any(c.type == "Available" and c.status == "True" for c in conditions)


def _http_ok(url: str, ctx: ssl.SSLContext | None = None) -> bool:
    with urllib.request.urlopen(url, timeout=5, context=ctx) as resp:
        return bool(resp.status == 200)


def _port_open(port: int) -> bool:
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=2):
        return True
