"""A real local Kubernetes control plane with fake GPU nodes, on loopback only.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler are the real binaries
built by ``make cluster-bin``; kwok plays the kubelets of fake nodes. Everything listens
on 127.0.0.1 on free ports, and all state (PKI, etcd data, kubeconfig, logs, PIDs) lives
in one run directory.

Why our own launcher rather than ``kwokctl --runtime binary``: kwokctl downloads
binaries and picks ports and flags itself; here every flag is visible, ports are free
loopback ports (parallel runs do not collide), start-up waits on each component with a
clear error and the component logs, and the pytest fixture stops exactly the PIDs it
started, also when the test process dies (the children get SIGKILL from the kernel).

Usage::

    cluster = LocalCluster(run_dir)
    cluster.start()           # blocks until /readyz and every fake node is Ready
    api = cluster.api_client()
    ...
    cluster.stop()

``python -m cluster up|down|status`` (with ``tests`` on ``PYTHONPATH``) drives the same
code for ``make cluster-up`` / ``make cluster-down``.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import procs
from .certs import FRONT_PROXY_CLIENT, Pki, make_pki
from .kwok_stages import GPU_RESOURCE, stages_yaml
from .paths import bin_dir, require_binaries

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
FAKE_NODE_LABEL = "prescaler.io/fake-node"
NODE_POOL_LABEL = "prescaler.io/node-pool"
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.64.0.0/16"
STATE_FILE = "state.json"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
# Metadata-level audit of ServiceAccount users only (the operator under test runs as one;
# the control plane and the tests use the admin certificate), so the log stays small.
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    userGroups: ["system:serviceaccounts"]
  - level: None
"""


PORT_ATTEMPTS = 3
"""Start-ups tried when a component finds its port taken (picked free, then bound)."""


@dataclass(frozen=True)
class GpuNodePool:
    """A group of identical fake GPU nodes."""

    name: str = "gpu-h100"
    count: int = 3
    gpus_per_node: int = 8
    gpu_product: str = "NVIDIA-H100-80GB-HBM3"
    gpu_memory_mib: int = 81559
    cpu: str = "192"
    memory: str = "2000Gi"


@dataclass(frozen=True)
class ClusterConfig:
    """What the fake fleet looks like and how fast fake pods become Ready."""

    gpu_pools: tuple[GpuNodePool, ...] = (GpuNodePool(),)
    cpu_nodes: int = 1
    """Untainted nodes without GPUs, for ordinary pods."""
    gpu_ready_delay_s: float = 10.0
    """Default time a pod requesting nvidia.com/gpu takes from start to Ready (image pull
    plus weight load); a pod overrides it with the prescaler.io/fake-ready-delay
    annotation (a Go duration, e.g. "45s")."""
    cpu_ready_delay_s: float = 0.5
    """Default time other pods take from start to Ready."""
    start_timeout_s: float = 120.0


@dataclass
class ClusterState:
    """What ``cluster-down`` needs to stop a cluster started by another process."""

    run_dir: str
    kubeconfig: str
    server: str
    procs: list[dict[str, str | int]] = field(default_factory=list)


class LocalCluster:
    """Start, use and stop one local cluster. See the module docstring."""

    def __init__(
        self,
        run_dir: Path,
        config: ClusterConfig | None = None,
        *,
        tie_to_parent: bool = True,
    ) -> None:
        self.run_dir = run_dir.resolve()
        self.config = config or ClusterConfig()
        self.tie_to_parent = tie_to_parent
        self.kubeconfig = self.run_dir / "kubeconfig"
        self.audit_log = self.run_dir / "logs" / "audit.log"
        """JSON lines, one audit event per request made by a ServiceAccount."""
        self.server = ""
        self.procs: list[procs.Proc] = []
        self._pki: Pki | None = None

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start every component and wait until the cluster is usable.

        Raises ``procs.ComponentError`` (with component logs) and leaves nothing
        running when start-up fails.
        """
        require_binaries(COMPONENTS)
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                self._start()
                return
            except procs.ComponentError as exc:
                self.stop()
                # A port picked free was taken before the component bound it (another
                # worker, or an outgoing connection's ephemeral port): pick again.
                if "address already in use" not in str(exc) or attempt == PORT_ATTEMPTS:
                    raise
            except BaseException:
                self.stop()
                raise

    def stop(self) -> None:
        """Stop every started component by PID, newest first. Idempotent."""
        for p in reversed(self.procs):
            p.stop()
        self.procs.clear()
        state = self.run_dir / STATE_FILE
        if state.exists():
            state.unlink()

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------- clients

    def api_client(self) -> Any:
        """A fresh ``kubernetes.client.ApiClient`` for the admin kubeconfig."""
        from kubernetes import config as kube_config

        return kube_config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(self.kubeconfig)
        )

    def memory_bytes(self) -> dict[str, int]:
        """Resident memory of each component."""
        return {p.name: p.rss_bytes() for p in self.procs}

    # ------------------------------------------------------------------ internals

    def _start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for stale in ("etcd", "pki", "logs"):  # every start is a fresh cluster
            shutil.rmtree(self.run_dir / stale, ignore_errors=True)
        logs = self.run_dir / "logs"
        logs.mkdir()
        self._pki = pki = make_pki(self.run_dir / "pki")
        bins = bin_dir()
        cfg = self.config

        etcd_port, etcd_peer = procs.free_port(), procs.free_port()
        api_port = procs.free_port()
        kcm_port, sched_port = procs.free_port(), procs.free_port()
        self.server = f"https://127.0.0.1:{api_port}"
        self._write_kubeconfig(pki)

        etcd_url = f"http://127.0.0.1:{etcd_port}"
        peer_url = f"http://127.0.0.1:{etcd_peer}"
        etcd = self._spawn(
            "etcd",
            [
                str(bins / "etcd"),
                "--name=local",
                f"--data-dir={self.run_dir / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=local={peer_url}",
                "--unsafe-no-fsync",
                "--log-level=warn",
                "--quota-backend-bytes=2147483648",
            ],
        )
        procs.wait_for("etcd /health", lambda: _http_ok(f"{etcd_url}/health"), 30, [etcd])

        audit_policy = self.run_dir / "audit-policy.yaml"
        audit_policy.write_text(AUDIT_POLICY)
        apiserver = self._spawn(
            "kube-apiserver",
            [
                str(bins / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={api_port}",
                f"--tls-cert-file={pki.server_crt}",
                f"--tls-private-key-file={pki.server_key}",
                f"--client-ca-file={pki.ca_crt}",
                # The aggregation layer (KEDA's metrics API server is an aggregated API):
                # the API server proxies to it as the front proxy, with user and groups in
                # headers, trusted through the front proxy's own CA. The aggregator dials the
                # APIService's Service by its ClusterIP, or by the name of an ExternalName
                # Service (no aggregator routing: EndpointSlices refuse loopback addresses).
                f"--requestheader-client-ca-file={pki.front_proxy_ca_crt}",
                f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-username-headers=X-Remote-User",
                f"--proxy-client-cert-file={pki.front_proxy_client_crt}",
                f"--proxy-client-key-file={pki.front_proxy_client_key}",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=RBAC",
                # OwnerReferencesPermissionEnforcement: as on stricter distributions, setting
                # blockOwnerDeletion needs RBAC on the owner's finalizers.
                "--enable-admission-plugins=ExtendedResourceToleration,"
                "OwnerReferencesPermissionEnforcement",
                f"--audit-policy-file={audit_policy}",
                f"--audit-log-path={self.audit_log}",
                # The 'kubernetes' Service endpoint may not be a loopback address.
                "--endpoint-reconciler-type=none",
                "--enable-priority-and-fairness=false",
                "--profiling=false",
                f"--cert-dir={self.run_dir / 'pki' / 'generated'}",
            ],
        )
        procs.wait_for(
            "kube-apiserver /readyz",
            lambda: _http_ok(f"{self.server}/readyz", self._ssl_context()),
            cfg.start_timeout_s,
            [etcd, apiserver],
        )

        kubeconfig = str(self.kubeconfig)
        common = [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            "--leader-elect=false",
            "--profiling=false",
        ]
        kcm = self._spawn(
            "kube-controller-manager",
            [
                str(bins / "kube-controller-manager"),
                *common,
                f"--secure-port={kcm_port}",
                f"--service-account-private-key-file={pki.sa_key}",
                f"--root-ca-file={pki.ca_crt}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--use-service-account-credentials=false",
                f"--cert-dir={self.run_dir / 'pki' / 'kcm'}",
            ],
        )
        sched = self._spawn(
            "kube-scheduler",
            [
                str(bins / "kube-scheduler"),
                *common,
                f"--secure-port={sched_port}",
                f"--cert-dir={self.run_dir / 'pki' / 'scheduler'}",
            ],
        )
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        procs.wait_for(
            "kube-controller-manager /healthz",
            lambda: _http_ok(f"https://127.0.0.1:{kcm_port}/healthz", insecure),
            cfg.start_timeout_s,
            [apiserver, kcm],
        )
        procs.wait_for(
            "kube-scheduler /healthz",
            lambda: _http_ok(f"https://127.0.0.1:{sched_port}/healthz", insecure),
            cfg.start_timeout_s,
            [apiserver, sched],
        )

        kwok_config = self.run_dir / "kwok.yaml"
        kwok_config.write_text(stages_yaml(cfg.gpu_ready_delay_s, cfg.cpu_ready_delay_s))
        kwok = self._spawn(
            "kwok",
            [
                str(bins / "kwok"),
                f"--kubeconfig={kubeconfig}",
                f"--config={kwok_config}",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
                f"--cidr={POD_CIDR}",
                "--node-ip=10.63.0.1",
                "--node-lease-duration-seconds=40",
            ],
        )
        api = self.api_client()
        try:
            self._create_nodes(api)
            want = {n["metadata"]["name"] for n in self._node_manifests()}
            procs.wait_for(
                f"{len(want)} fake nodes Ready",
                lambda: want <= _ready_nodes(api),
                cfg.start_timeout_s,
                [apiserver, kcm, sched, kwok],
            )
            procs.wait_for(
                "the default ServiceAccount",
                lambda: _has_default_sa(api, "default"),
                cfg.start_timeout_s,
                [apiserver, kcm],
            )
        finally:
            api.close()
        self._write_state()

    def _spawn(self, name: str, argv: list[str]) -> procs.Proc:
        p = procs.start(name, argv, self.run_dir / "logs", tie_to_parent=self.tie_to_parent)
        self.procs.append(p)
        self._write_state()
        return p

    def _write_state(self) -> None:
        state = ClusterState(
            run_dir=str(self.run_dir),
            kubeconfig=str(self.kubeconfig),
            server=self.server,
            procs=[p.to_json() for p in self.procs],
        )
        (self.run_dir / STATE_FILE).write_text(json.dumps(asdict(state), indent=2))

    def _ssl_context(self) -> ssl.SSLContext:
        assert self._pki is not None
        ctx = ssl.create_default_context(cafile=str(self._pki.ca_crt))
        ctx.load_cert_chain(str(self._pki.admin_crt), str(self._pki.admin_key))
        return ctx

    def _write_kubeconfig(self, pki: Pki) -> None:
        def b64(p: Path) -> str:
            return base64.b64encode(p.read_bytes()).decode()

        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "prescaler-local",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": b64(pki.ca_crt),
                    },
                }
            ],
            "users": [
                {
                    "name": "prescaler-admin",
                    "user": {
                        "client-certificate-data": b64(pki.admin_crt),
                        "client-key-data": b64(pki.admin_key),
                    },
                }
            ],
            "contexts": [
                {
                    "name": "prescaler-local",
                    "context": {"cluster": "prescaler-local", "user": "prescaler-admin"},
                }
            ],
            "current-context": "prescaler-local",
        }
        self.kubeconfig.write_text(yaml.safe_dump(doc, sort_keys=False))
        self.kubeconfig.chmod(0o600)

    def _node_manifests(self) -> Iterator[dict[str, Any]]:
        for pool in self.config.gpu_pools:
            for i in range(pool.count):
                yield gpu_node(f"{pool.name}-{i}", pool=pool)
        for i in range(self.config.cpu_nodes):
            resources = {"cpu": "32", "memory": "128Gi", "pods": "110", "ephemeral-storage": "1Ti"}
            yield _fake_node(
                f"cpu-{i}",
                {"node.kubernetes.io/instance-type": "fake-cpu", NODE_POOL_LABEL: "cpu"},
                resources,
            )

    def _create_nodes(self, api: Any) -> None:
        from kubernetes import client

        core: Any = client.CoreV1Api(api)
        for node in self._node_manifests():
            core.create_node(node)


# ---------------------------------------------------------------------- nodes


def gpu_node(
    name: str,
    *,
    pool: GpuNodePool | None = None,
    gpus: int | None = None,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] = (),
) -> dict[str, Any]:
    """A fake GPU node that kwok runs (it carries :data:`KWOK_NODE_ANNOTATION`), like the
    ones the cluster starts with: ``pool``'s kind of node (the default pool's if omitted)
    with ``gpus`` GPUs (the pool's count if omitted), tainted ``nvidia.com/gpu`` so only
    pods that request GPUs land on it. ``labels`` are added to (or override) the usual
    ones; ``taints`` are added to the GPU taint. Created after start-up, it is a node that
    a cluster autoscaler or Karpenter brought; delete it when done."""
    pool = pool or GpuNodePool()
    count = pool.gpus_per_node if gpus is None else gpus
    resources = {
        "cpu": pool.cpu,
        "memory": pool.memory,
        "pods": "110",
        "ephemeral-storage": "1Ti",
        GPU_RESOURCE: str(count),
    }
    gpu_labels = {
        "node.kubernetes.io/instance-type": f"fake-{pool.name}",
        NODE_POOL_LABEL: pool.name,
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": pool.gpu_product,
        "nvidia.com/gpu.count": str(count),
        "nvidia.com/gpu.memory": str(pool.gpu_memory_mib),
    }
    # Like GPU node pools in the clouds: only pods that request GPUs (and so get the
    # toleration from ExtendedResourceToleration) land here.
    gpu_taint = {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}
    return _fake_node(name, {**gpu_labels, **(labels or {})}, resources, [gpu_taint, *taints])


def _fake_node(
    name: str,
    labels: Mapping[str, str],
    resources: Mapping[str, str],
    taints: Sequence[Mapping[str, str]] = (),
) -> dict[str, Any]:
    node: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                FAKE_NODE_LABEL: "true",
                "kubernetes.io/hostname": name,
                **labels,
            },
        },
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }
    if taints:
        node["spec"] = {"taints": [dict(t) for t in taints]}
    return node


# ---------------------------------------------------------------------- helpers


def _http_ok(url: str, ctx: ssl.SSLContext | None = None) -> bool:
    with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:
        return bool(resp.status == 200)


def _ready_nodes(api: Any) -> set[str]:
    from kubernetes import client

    core: Any = client.CoreV1Api(api)
    ready: set[str] = set()
    for node in core.list_node().items:
        for cond in node.status.conditions or []:
            if cond.type == "Ready" and cond.status == "True":
                ready.add(node.metadata.name)
    return ready


def _has_default_sa(api: Any, namespace: str) -> bool:
    from kubernetes import client

    core: Any = client.CoreV1Api(api)
    items = core.list_namespaced_service_account(namespace).items
    return any(sa.metadata.name == "default" for sa in items)


def wait_default_service_account(api: Any, namespace: str, timeout_s: float = 30.0) -> None:
    """Pods can only be created once the namespace's default ServiceAccount exists."""
    procs.wait_for(
        f"ServiceAccount default in {namespace}",
        lambda: _has_default_sa(api, namespace),
        timeout_s,
    )


def load_state(run_dir: Path) -> ClusterState | None:
    path = run_dir / STATE_FILE
    if not path.exists():
        return None
    return ClusterState(**json.loads(path.read_text()))


def stop_from_state(run_dir: Path) -> list[str]:
    """Stop the components recorded in ``run_dir`` (by PID); returns their names."""
    state = load_state(run_dir)
    if state is None:
        return []
    stopped = []
    for data in reversed(state.procs):
        p = procs.Proc.from_json(data)
        if p.alive():
            p.stop()
            stopped.append(p.name)
    (run_dir / STATE_FILE).unlink()
    return stopped


def running_procs(run_dir: Path) -> list[procs.Proc]:
    state = load_state(run_dir)
    if state is None:
        return []
    return [p for p in map(procs.Proc.from_json, state.procs) if p.alive()]


def poll(check: Callable[[], bool], timeout_s: float, interval_s: float = 0.25) -> bool:
    """Poll until ``check`` is true; False on timeout. For tests' eventual assertions."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(interval_s)
    return check()


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw else default
