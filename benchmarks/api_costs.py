"""What one API call of a reconcile costs the local API server and etcd, in CPU.

    .venv/bin/python benchmarks/api_costs.py [--calls 1000]

Starts the local cluster (tests/cluster), creates 50 Deployments and one InferencePool,
and makes each kind of call a reconcile makes ``--calls`` times in a row: a GET of a
Deployment, a LIST of one Deployment's pods by label selector, a LIST of a namespace's
HPAs, and a status write of a small status and of a week-old pool's status (a week of
shadow-HPA buckets as the operator keeps them: 24 hourly and 7 daily, about 9 KB), each as
the whole merge patch and as a JSON patch of one value. Prints the CPU milliseconds per
call of kube-apiserver and etcd (from /proc of the cluster's processes, children of this
one), and the wall time per call.

Needs the cluster binaries (``make cluster-bin``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import yaml  # noqa: E402
from kubernetes import client  # noqa: E402

from _week_old import week_old_against_hpa  # noqa: E402
from cluster.launcher import ClusterConfig, LocalCluster  # noqa: E402
from operator_scale import _cluster_cpu  # noqa: E402

GROUP, VERSION, PLURAL = "prescaler.io", "v1alpha1", "inferencepools"


def week_old_status() -> dict[str, Any]:
    """A status with a week-old pool's shadow-HPA comparison (the rest kept small)."""
    against = week_old_against_hpa(time.time())
    return {"againstHpa": against, "demand": {"requestsPerSecond": 1.0}}


def measure(name: str, calls: int, call: Callable[[int], object]) -> None:
    def cpu() -> tuple[float, float]:
        c = _cluster_cpu()
        return c.get("kube-apiserver", 0.0), c.get("etcd", 0.0)

    (a0, e0), t0 = cpu(), time.monotonic()
    for i in range(calls):
        call(i)
    (a1, e1), wall = cpu(), time.monotonic() - t0
    print(
        json.dumps(
            {
                "call": name,
                "kube_apiserver_cpu_ms": round(1000 * (a1 - a0) / calls, 2),
                "etcd_cpu_ms": round(1000 * (e1 - e0) / calls, 2),
                "wall_ms": round(1000 * wall / calls, 1),
            }
        ),
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=1000)
    n = parser.parse_args().calls
    with tempfile.TemporaryDirectory(prefix="prescaler-api-costs-") as tmp:
        cluster = LocalCluster(
            Path(tmp) / "cluster", ClusterConfig(cpu_nodes=2), tie_to_parent=True
        )
        cluster.start()
        try:
            api = cluster.api_client()
            crd = yaml.safe_load((ROOT / "crds" / "inferencepools.prescaler.io.yaml").read_text())
            client.ApiextensionsV1Api(api).create_custom_resource_definition(crd)
            time.sleep(3)
            ns = "costs"
            core: Any = client.CoreV1Api(api)
            apps: Any = client.AppsV1Api(api)
            hpas: Any = client.AutoscalingV2Api(api)
            custom: Any = client.CustomObjectsApi(api)
            core.create_namespace({"metadata": {"name": ns}})
            for i in range(50):
                labels = {"app": f"d{i}"}
                apps.create_namespaced_deployment(
                    ns,
                    {
                        "metadata": {"name": f"d{i}"},
                        "spec": {
                            "replicas": 1,
                            "selector": {"matchLabels": labels},
                            "template": {
                                "metadata": {"labels": labels},
                                "spec": {"containers": [{"name": "c", "image": "fake"}]},
                            },
                        },
                    },
                )
            custom.create_namespaced_custom_object(
                GROUP,
                VERSION,
                ns,
                PLURAL,
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "InferencePool",
                    "metadata": {"name": "p"},
                    "spec": {
                        "target": {"name": "d0"},
                        "maxReplicas": 1,
                        "model": {"tokensPerSecond": 2000},
                    },
                },
            )
            time.sleep(5)
            raw = {"_preload_content": False}
            measure(
                "GET deployment",
                n,
                lambda i: apps.read_namespaced_deployment(f"d{i % 50}", ns, **raw).data,
            )
            measure(
                "LIST pods by selector",
                n,
                lambda i: core.list_namespaced_pod(ns, label_selector=f"app=d{i % 50}", **raw).data,
            )
            measure(
                "LIST HPAs",
                n,
                lambda i: hpas.list_namespaced_horizontal_pod_autoscaler(ns, **raw).data,
            )
            for label, status in (
                ("small", {"demand": {"requestsPerSecond": 1.0}}),
                ("week-old", week_old_status()),
            ):
                size = len(json.dumps(status))

                def patch(body: object, content_type: str) -> object:
                    return custom.patch_namespaced_custom_object_status(
                        GROUP, VERSION, ns, PLURAL, "p", body, _content_type=content_type, **raw
                    ).data

                def merge(i: int, status: dict[str, Any] = status) -> object:
                    body = {"status": {**status, "demand": {"requestsPerSecond": float(i)}}}
                    return patch(body, "application/merge-patch+json")

                def one_value(i: int) -> object:
                    path = "/status/demand/requestsPerSecond"
                    ops = [{"op": "replace", "path": path, "value": i + 0.5}]
                    return patch(ops, "application/json-patch+json")

                merge(0)
                measure(f"status write, {label} status ({size} B), whole merge patch", n, merge)
                measure(f"status write, {label} status, JSON patch of one value", n, one_value)
            api.close()
        finally:
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
