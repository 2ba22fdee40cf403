"""Operator at scale: N InferencePools against the local cluster and a real Prometheus.

    .venv/bin/python benchmarks/operator_scale.py --pools 50 200 500 [--cycles 3]

For each N: a fresh namespace with N CPU Deployments (kwok pods) and N pools, each with a
forecast over backfilled history (a daily cycle from the ServeGen-like shape, a distinct
``model_name`` per history group). The operator runs in-process with a 60 s timer and the
default worker counts. After a warm-up cycle it measures ``--cycles`` full cycles and
prints one JSON line per N: reconcile p50/p99 (from the operator's own histogram, exact
per-call times), reconciles/min, forecast fits/min, operator CPU seconds per cycle (this
process, plus fit workers) and RSS (this process, plus fit workers).

Needs the cluster binaries (``make cluster-bin``) and Debian's prometheus/promtool.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import yaml  # noqa: E402
from kubernetes import client  # noqa: E402

from cluster.launcher import ClusterConfig, LocalCluster  # noqa: E402
from cluster.prometheus import Prometheus, vllm_samples  # noqa: E402
from prescaler.metrics import Metrics  # noqa: E402
from prescaler.settings import (  # noqa: E402
    MetricsSettings,
    OperatorSettings,
    ReconcileSettings,
    WatchSettings,
)

DAY = 86_400
GROUPS = 10


def _children_rss_and_cpu() -> tuple[int, float]:
    """RSS (bytes) and CPU seconds of this process' forecast fit workers (the spawned
    ``multiprocessing`` children; the cluster and Prometheus are children too, not counted)."""
    rss, cpu = 0, 0.0
    me = os.getpid()
    tick = os.sysconf("SC_CLK_TCK")
    page = os.sysconf("SC_PAGE_SIZE")
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(stat[1]) != me:
            continue
        try:
            if b"multiprocessing" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
        except OSError:
            continue
        cpu += (int(stat[11]) + int(stat[12])) / tick
        rss += int(stat[21]) * page
    return rss, cpu


def _self_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _histogram(metrics: Metrics, name: str) -> tuple[list[float], list[float], float, float]:
    for family in metrics.registry.collect():
        if family.name == name:
            bounds, counts, total, count = [], [], 0.0, 0.0
            for s in family.samples:
                if s.name.endswith("_bucket"):
                    bounds.append(float(s.labels["le"]))
                    counts.append(s.value)
                elif s.name.endswith("_sum"):
                    total = s.value
                elif s.name.endswith("_count"):
                    count = s.value
            return bounds, counts, total, count
    return [], [], 0.0, 0.0


def _quantile(bounds: list[float], before: list[float], after: list[float], q: float) -> float:
    """Upper bucket bound of the q-quantile of the observations between two snapshots."""
    deltas = [a - b for a, b in zip(after, before, strict=True)]
    total = deltas[-1] if deltas else 0
    if total <= 0:
        return math.nan
    for bound, cumulative in zip(bounds, deltas, strict=True):
        if cumulative >= q * total:
            return bound
    return math.inf


def _counter(metrics: Metrics, name: str) -> float:
    return sum(
        s.value
        for family in metrics.registry.collect()
        if family.name == name
        for s in family.samples
        if s.name.endswith("_total")
    )


def backfill(prometheus: Prometheus, namespace: str) -> None:
    """Two days at 60 s of a daily cycle per history group (pools share groups)."""
    now = time.time()
    start = now - 2 * DAY
    times = [start + 60 * i for i in range(int((now + 600 - start) // 60))]
    samples = []
    for g in range(GROUPS):
        phase = g * 3600
        rates = [5 + 4 * math.sin(2 * math.pi * ((t + phase) % DAY) / DAY) for t in times]
        samples += vllm_samples(
            times, rates, namespace=namespace, model_name=f"group-{g}", step_s=60
        )
    prometheus.backfill(samples)


def run_one(
    cluster: LocalCluster, prometheus: Prometheus, pools: int, cycles: int, model: str
) -> dict[str, Any]:
    from prescaler.reconcile_runtime import run_operator

    api = cluster.api_client()
    core: Any = client.CoreV1Api(api)
    apps: Any = client.AppsV1Api(api)
    custom: Any = client.CustomObjectsApi(api)
    ns = f"bench-{pools}-{int(time.time())}"
    core.create_namespace({"metadata": {"name": ns}})
    backfill(prometheus, ns)
    for i in range(pools):
        name = f"llm-{i}"
        apps.create_namespaced_deployment(
            ns,
            {
                "metadata": {"name": name},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": {"app": name}},
                    "template": {
                        "metadata": {"labels": {"app": name}},
                        "spec": {"containers": [{"name": "c", "image": "fake"}]},
                    },
                },
            },
        )
        custom.create_namespaced_custom_object(
            "prescaler.io",
            "v1alpha1",
            ns,
            "inferencepools",
            {
                "apiVersion": "prescaler.io/v1alpha1",
                "kind": "InferencePool",
                "metadata": {"name": name},
                "spec": {
                    "target": {"name": name},
                    "maxReplicas": 1,
                    "model": {"tokensPerSecond": 20000},
                    "coldStart": {"mode": "auto", "seconds": 60},
                    "forecast": {
                        "prometheus": {"url": prometheus.url},
                        "selector": f'namespace="{ns}",model_name="group-{i % GROUPS}"',
                        "model": model,
                        "lookbackSeconds": 2 * DAY,
                        "refitSeconds": 3600,
                        "horizonSeconds": 1800,
                    },
                },
            },
        )
    interval = 60.0
    settings = OperatorSettings(
        watch=WatchSettings(namespaces=(ns,)),
        metrics=MetricsSettings(port=0),
        reconcile=ReconcileSettings(interval_seconds=interval, kubeconfig=str(cluster.kubeconfig)),
    )
    metrics = Metrics()
    stop, ready = threading.Event(), threading.Event()
    thread = threading.Thread(
        target=run_operator,
        args=(settings,),
        kwargs={"stop_flag": stop, "ready_flag": ready, "metrics": metrics},
    )
    cpu0 = time.process_time()
    thread.start()
    ready.wait(120)
    time.sleep(interval + 10)  # warm-up: first history fetches, selections and fits
    bounds, before, _, count0 = _histogram(metrics, "prescaler_reconcile_duration_seconds")
    fits0 = _counter(metrics, "prescaler_forecast_fits")
    cpu1, (_, child_cpu1) = time.process_time(), _children_rss_and_cpu()
    t1 = time.monotonic()
    peak_rss = 0
    peak_children = 0
    while time.monotonic() - t1 < cycles * interval:
        time.sleep(5)
        child_rss, _ = _children_rss_and_cpu()
        peak_rss = max(peak_rss, _self_rss())
        peak_children = max(peak_children, child_rss)
    elapsed = time.monotonic() - t1
    _, after, _, count1 = _histogram(metrics, "prescaler_reconcile_duration_seconds")
    fits1 = _counter(metrics, "prescaler_forecast_fits")
    cpu2, (_, child_cpu2) = time.process_time(), _children_rss_and_cpu()
    stop.set()
    thread.join(120)
    core.delete_namespace(ns)
    api.close()
    minutes = elapsed / 60
    return {
        "pools": pools,
        "model": model,
        "cycle_seconds": interval,
        "reconciles_per_min": round((count1 - count0) / minutes, 1),
        "reconcile_p50_s_le": _quantile(bounds, before, after, 0.5),
        "reconcile_p99_s_le": _quantile(bounds, before, after, 0.99),
        "forecast_fits_per_min": round((fits1 - fits0) / minutes, 1),
        "operator_cpu_s_per_cycle": round((cpu2 - cpu1) / (elapsed / interval), 2),
        "fit_workers_cpu_s_per_cycle": round((child_cpu2 - child_cpu1) / (elapsed / interval), 2),
        "warmup_cpu_s": round(cpu1 - cpu0, 1),
        "operator_rss_mib": round(peak_rss / 2**20),
        "fit_workers_rss_mib": round(peak_children / 2**20),
        "max_rss_mib_getrusage": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pools", type=int, nargs="+", default=[50, 200, 500])
    parser.add_argument("--cycles", type=int, default=2)
    parser.add_argument("--model", default="seasonal_naive", help="forecast model of every pool")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="prescaler-bench-") as tmp:
        cluster = LocalCluster(
            Path(tmp) / "cluster", ClusterConfig(cpu_nodes=6), tie_to_parent=True
        )
        cluster.start()
        os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
        prometheus = Prometheus(Path(tmp) / "prometheus")
        prometheus.start()
        try:
            api = cluster.api_client()
            crd = yaml.safe_load((ROOT / "crds" / "inferencepools.prescaler.io.yaml").read_text())
            client.ApiextensionsV1Api(api).create_custom_resource_definition(crd)
            time.sleep(3)
            api.close()
            for n in args.pools:
                print(
                    json.dumps(run_one(cluster, prometheus, n, args.cycles, args.model)), flush=True
                )
        finally:
            prometheus.stop()
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
