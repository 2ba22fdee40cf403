"""Operator at scale: N InferencePools against the local cluster and a real Prometheus.

    .venv/bin/python benchmarks/operator_scale.py --pools 500 2000 [--cycles 2] [--restart]

For each N: a fresh namespace with N CPU Deployments (kwok pods) and N pools, each with a
forecast over backfilled history (a daily cycle, phase-shifted per history group; pool
``i`` reads group ``i % --series``, so pools of one group read the same series). The
forecast model is the InferencePool spec's default (``auto``) unless ``--model`` says
otherwise. The operator runs in-process with a 60 s timer and the default worker counts.
After a warm-up cycle it measures ``--cycles`` full cycles and prints one JSON line per N:
reconcile p50/p99 (bucket bounds of the operator's own histogram), reconciles/min, the
share of pools reconciled in every cycle, forecast fits/min, operator CPU seconds per
cycle (this process, plus fit workers), RSS, the pools' ForecastHealthy reasons, status
writes per minute by kind, and the CPU the whole stack spent per reconcile by component
(operator with its fit workers, kube-apiserver, Prometheus, etcd, the rest).

``--week-old-status`` starts every pool with the status a week-old pool has (a week of
``status.againstHpa`` buckets, 24 hourly and 7 daily, about 9 KB; 168 hourly ones, about
40 KB, before they were merged): an API server's cost per status write follows the
object's size.

Every run also prints every client's API calls per reconcile, by verb and resource (from
kube-apiserver's ``apiserver_request_total``; kwok's and the controllers' heartbeats are
among them), and the operator's Events per minute by reason. ``--idle-baseline`` then
measures the same cluster, pools and Deployments for one more cycle with the operator
stopped, and reports the stack's CPU per reconcile above that too.

``--shards N`` runs ``--replicas`` (default N) ``prescaler run --shards N`` processes on
the pools instead of one operator in this process, and reports each replica's share: the
shards and pools it serves, its reconciles per minute, p99, CPU seconds per cycle (with
its fit workers) and RSS, plus the share of all pools reconciled in every cycle.

``--restart`` then stops the operator and starts a fresh one on the same pools (as after
a crash or a failover) and reports each of its first ``--restart-cycles`` (default
``--cycles``) cycles on its own: whether every pool was reconciled, p99, selections redone
versus resumed from status, and the ForecastHealthy reasons at the cycle's end; and how
long after the restart half, 90 %, 99 % and all of the pools had their first reconcile,
and had been handed to the operator by its watch (sampled every 2 s).

Needs the cluster binaries (``make cluster-bin``) and Debian's prometheus/promtool.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import yaml  # noqa: E402
from kubernetes import client  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from _week_old import week_old_against_hpa  # noqa: E402
from cluster.launcher import ClusterConfig, LocalCluster  # noqa: E402
from cluster.procs import free_port  # noqa: E402
from cluster.prometheus import Prometheus, vllm_samples  # noqa: E402
from prescaler.api import ForecastSpec  # noqa: E402
from prescaler.metrics import Metrics  # noqa: E402
from prescaler.settings import (  # noqa: E402
    MetricsSettings,
    OperatorSettings,
    ReconcileSettings,
    WatchSettings,
)

DAY = 86_400
DEFAULT_MODEL = str(ForecastSpec.default_of("model"))
INTERVAL = 60.0


def _children_rss_and_cpu() -> tuple[int, float]:
    """RSS (bytes) and CPU seconds of this process' forecast fit workers (the spawned
    ``multiprocessing`` children, with the Stan processes their Prophet fits ran; the
    cluster and Prometheus are children too, not counted)."""
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
        cpu += sum(int(x) for x in stat[11:15]) / tick
        rss += int(stat[21]) * page
    return rss, cpu


def _cluster_cpu() -> dict[str, float]:
    """CPU seconds of the other children (API server, etcd, kwok, Prometheus...) by name."""
    me, tick = os.getpid(), os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            name, rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)
            if int(rest.split()[1]) != me:
                continue
            if b"multiprocessing" in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
        except OSError:
            continue
        comm = name.split("(", 1)[1]
        out[comm] = out.get(comm, 0.0) + sum(int(x) for x in rest.split()[11:15]) / tick
    return out


def _api_requests(api: Any) -> dict[str, float]:
    """kube-apiserver's ``apiserver_request_total``, summed by verb and resource (with
    its subresource): every client's calls, the operator's among them."""
    response = api.call_api("GET", f"{api.configuration.host}/metrics")
    response.read()
    out: dict[str, float] = {}
    for name, labels, value in _samples(response.data.decode()):
        if name != "apiserver_request_total":
            continue
        resource_ = labels.get("resource", "")
        if labels.get("subresource"):
            resource_ += "/" + labels["subresource"]
        key = f"{labels.get('verb', '')} {resource_}"
        out[key] = out.get(key, 0.0) + value
    return out


def _components(cpu: dict[str, float]) -> dict[str, float]:
    """The cluster's CPU by component: kube-apiserver, Prometheus, etcd, and the rest
    (controller-manager, scheduler and kwok)."""
    main = ("kube-apiserver", "prometheus", "etcd")
    return {
        **{n: cpu.get(n, 0.0) for n in main},
        "rest": sum(c for n, c in cpu.items() if n not in main),
    }


def _machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


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


def _by_label(metrics: Metrics, name: str, label: str) -> dict[str, float]:
    """A labelled counter's totals, by one label's value."""
    out: dict[str, float] = {}
    for family in metrics.registry.collect():
        if family.name == name:
            for s in family.samples:
                if s.name.endswith("_total"):
                    key = s.labels.get(label, "")
                    out[key] = out.get(key, 0.0) + s.value
    return out


def _gauges(metrics: Metrics, name: str) -> dict[str, float]:
    """A per-pool gauge's values, by pool name."""
    return {
        s.labels["pool"]: s.value
        for family in metrics.registry.collect()
        if family.name == name
        for s in family.samples
        if "pool" in s.labels
    }


def backfill(prometheus: Prometheus, namespace: str, groups: int, days: float) -> None:
    """``days`` at 60 s of a daily cycle per history group (pools share groups), reaching
    an hour ahead so that creating thousands of pools does not outlast the data."""
    now = time.time()
    start = now - days * DAY
    times = [start + 60 * i for i in range(int((now + 3600 - start) // 60))]
    batch = max(1, round(50 * 2 / days))  # about a million samples per promtool run
    for first in range(0, groups, batch):
        samples = []
        for g in range(first, min(groups, first + batch)):
            phase = g * DAY / groups
            rates = [5 + 4 * math.sin(2 * math.pi * ((t + phase) % DAY) / DAY) for t in times]
            samples += vllm_samples(
                times, rates, namespace=namespace, model_name=f"group-{g}", step_s=60
            )
        prometheus.backfill(samples)


def create_pools(
    api: Any, prometheus: Prometheus, ns: str, pools: int, groups: int, model: str, days: float
) -> None:
    apps: Any = client.AppsV1Api(api)
    custom: Any = client.CustomObjectsApi(api)
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
                        "selector": f'namespace="{ns}",model_name="group-{i % groups}"',
                        "model": model,
                        "lookbackSeconds": round(days * DAY),
                        "refitSeconds": 3600,
                        "horizonSeconds": 1800,
                    },
                },
            },
        )


def pool_namespace(
    api: Any, prometheus: Prometheus, ns: str, pools: int, groups: int, model: str, days: float
) -> None:
    """The namespace ``ns`` with ``pools`` pools on ``groups`` backfilled series."""
    client.CoreV1Api(api).create_namespace({"metadata": {"name": ns}})
    backfill(prometheus, ns, groups, days)
    create_pools(api, prometheus, ns, pools, groups, model, days)


def seed_week(api: Any, ns: str, pools: int) -> None:
    """Give every pool the status of a pool a week old: ``status.againstHpa`` with a week
    of buckets (the counters a restart goes on from), as the operator would have written
    them."""
    custom: Any = client.CustomObjectsApi(api)
    status = week_old_against_hpa(time.time())
    for i in range(pools):
        custom.patch_namespaced_custom_object_status(
            "prescaler.io",
            "v1alpha1",
            ns,
            "inferencepools",
            f"llm-{i}",
            {"status": {"againstHpa": status}},
            _content_type="application/merge-patch+json",
        )


class CatchUp:
    """After a restart: how long until a share of the pools had their first reconcile."""

    SHARES = (0.5, 0.9, 0.99, 1.0)

    def __init__(self, pools: int) -> None:
        self.pools = pools
        self.reached: dict[float, float] = {}
        self.events: dict[float, float] = {}

    def sample(self, elapsed: float, last: Any, since: float, events: float) -> None:
        """``last``: each pool's last reconcile time; ``events``: pool watch events the
        operator has handled since its start (the initial list's included)."""
        done = sum(1 for t in last if t >= since) / self.pools
        for share in self.SHARES:
            if done >= share and share not in self.reached:
                self.reached[share] = round(elapsed, 1)
            if events >= share * self.pools and share not in self.events:
                self.events[share] = round(elapsed, 1)

    def report(self) -> dict[str, dict[str, float | None]]:
        return {
            "reconciled": {f"{share:.0%}": self.reached.get(share) for share in self.SHARES},
            "pool_events_handled": {
                f"{share:.0%}": self.events.get(share) for share in self.SHARES
            },
        }


class Operator:
    """The operator in a thread of this process, with its own metrics."""

    def __init__(self, settings: OperatorSettings) -> None:
        from prescaler.controller.runtime import run_operator

        self.metrics = Metrics()
        self.stop = threading.Event()
        ready = threading.Event()
        self.started = time.monotonic()
        self.thread = threading.Thread(
            target=run_operator,
            args=(settings,),
            kwargs={"stop_flag": self.stop, "ready_flag": ready, "metrics": self.metrics},
        )
        self.thread.start()
        ready.wait(300)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(300)


def forecast_reasons(api: Any, ns: str) -> dict[str, int]:
    """How many pools have each ForecastHealthy reason (``-``: none yet); the first message
    of each reason other than Fresh goes to stderr."""
    custom: Any = client.CustomObjectsApi(api)
    listing = custom.list_namespaced_custom_object("prescaler.io", "v1alpha1", ns, "inferencepools")
    reasons: dict[str, int] = {}
    for pool in listing["items"]:
        conditions = (pool.get("status") or {}).get("conditions") or []
        healthy: dict[str, Any] = next(
            (c for c in conditions if c["type"] == "ForecastHealthy"), {}
        )
        reason = healthy.get("reason", "-")
        if reason not in reasons and reason != "Fresh":
            print(f"{reason}: {healthy.get('message', '')[:300]}", file=sys.stderr)
        reasons[reason] = reasons.get(reason, 0) + 1
    return dict(sorted(reasons.items()))


def cycle_report(
    api: Any, ns: str, op: Operator, pools: int, started_wall: float, before: dict[str, Any]
) -> dict[str, Any]:
    """One cycle: reconciles, the pools reconciled since ``started_wall``, p99, fits."""
    m = op.metrics
    bounds, after, _, count = _histogram(m, "prescaler_reconcile_duration_seconds")
    seen = _gauges(m, "prescaler_last_reconcile_timestamp_seconds")
    selections = _counter_labeled(m, "prescaler_forecast_fits", "selection")
    return {
        "pools_reconciled": sum(1 for t in seen.values() if t >= started_wall),
        "pools": pools,
        "reconciles": int(count - before["count"]),
        "reconcile_p99_s_le": _quantile(bounds, before["buckets"], after, 0.99),
        "selections_run": int(selections - before["selections"]),
        "selections_resumed": int(_counter(m, "prescaler_forecast_selections_resumed")),
        "stale_pools": int(sum(_gauges(m, "prescaler_forecast_stale").values())),
        "forecast_reasons": forecast_reasons(api, ns),
    }


def _snapshot(m: Metrics) -> dict[str, Any]:
    _, buckets, _, count = _histogram(m, "prescaler_reconcile_duration_seconds")
    return {
        "buckets": buckets,
        "count": count,
        "selections": _counter_labeled(m, "prescaler_forecast_fits", "selection"),
    }


def _counter_labeled(metrics: Metrics, name: str, model: str) -> float:
    return sum(
        s.value
        for family in metrics.registry.collect()
        if family.name == name
        for s in family.samples
        if s.name.endswith("_total") and s.labels.get("model") == model
    )


def run_one(
    cluster: LocalCluster,
    prometheus: Prometheus,
    pools: int,
    cycles: int,
    model: str,
    groups: int,
    restart: bool,
    days: float,
    week_old: bool = False,
    warmup: float = INTERVAL + 10,
    idle_baseline: bool = False,
    restart_cycles: int = 0,
) -> dict[str, Any]:
    api = cluster.api_client()
    core: Any = client.CoreV1Api(api)
    ns = f"bench-{pools}-{int(time.time())}"
    pool_namespace(api, prometheus, ns, pools, groups, model, days)
    if week_old:
        seed_week(api, ns, pools)
    settings = OperatorSettings(
        watch=WatchSettings(namespaces=(ns,)),
        metrics=MetricsSettings(port=0),
        reconcile=ReconcileSettings(interval_seconds=INTERVAL, kubeconfig=str(cluster.kubeconfig)),
    )
    cpu0 = time.process_time()
    op = Operator(settings)
    time.sleep(warmup)  # warm-up: first history fetches, selections and fits
    metrics = op.metrics
    bounds, before, _, count0 = _histogram(metrics, "prescaler_reconcile_duration_seconds")
    fits0 = _counter(metrics, "prescaler_forecast_fits")
    writes0 = _by_label(metrics, "prescaler_status_writes", "kind")
    cpu1, (_, child_cpu1) = time.process_time(), _children_rss_and_cpu()
    cluster1, busy1 = _cluster_cpu(), _machine_busy()
    requests1 = _api_requests(api)
    t1, wall1 = time.monotonic(), time.time()
    peak_rss = 0
    peak_children = 0
    covered: list[float] = []
    for _ in range(cycles):
        wall = time.time()
        cycle_end = time.monotonic() + INTERVAL
        while time.monotonic() < cycle_end:
            time.sleep(min(5.0, max(0.0, cycle_end - time.monotonic())))
            child_rss, _ = _children_rss_and_cpu()
            peak_rss = max(peak_rss, _self_rss())
            peak_children = max(peak_children, child_rss)
        seen = _gauges(metrics, "prescaler_last_reconcile_timestamp_seconds")
        covered.append(sum(1 for t in seen.values() if t >= wall) / pools)
    elapsed = time.monotonic() - t1
    _, after, _, count1 = _histogram(metrics, "prescaler_reconcile_duration_seconds")
    fits1 = _counter(metrics, "prescaler_forecast_fits")
    writes1 = _by_label(metrics, "prescaler_status_writes", "kind")
    cpu2, (_, child_cpu2) = time.process_time(), _children_rss_and_cpu()
    cluster2, busy2 = _cluster_cpu(), _machine_busy()
    requests2, wall2 = _api_requests(api), time.time()
    reasons = forecast_reasons(api, ns)
    stale = int(sum(_gauges(metrics, "prescaler_forecast_stale").values()))
    series = next(
        (
            s.value
            for f in metrics.registry.collect()
            if f.name == "prescaler_forecast_series"
            for s in f.samples
        ),
        math.nan,
    )
    events = Counter(
        e.reason
        for e in core.list_namespaced_event(ns).items
        if e.event_time is not None and wall1 <= e.event_time.timestamp() <= wall2
    )
    op.close()
    idle: dict[str, float] = {}
    if idle_baseline:
        # The same cluster, pools and Deployments once the operator stopped: what the
        # stack spends on its own (node and lease heartbeats, controllers).
        time.sleep(10)
        before_idle, t_idle = _cluster_cpu(), time.monotonic()
        time.sleep(INTERVAL)
        after_idle, idle_cycles = _cluster_cpu(), (time.monotonic() - t_idle) / INTERVAL
        idle = {n: (c - before_idle.get(n, 0.0)) / idle_cycles for n, c in after_idle.items()}
    minutes = elapsed / 60
    result: dict[str, Any] = {
        "pools": pools,
        "series": groups,
        "history_days": days,
        "week_old_status": week_old,
        "warmup_s": warmup,
        "model": model,
        "cycle_seconds": INTERVAL,
        "reconciles_per_min": round((count1 - count0) / minutes, 1),
        "min_share_of_pools_reconciled_per_cycle": round(min(covered), 4),
        "reconcile_p50_s_le": _quantile(bounds, before, after, 0.5),
        "reconcile_p99_s_le": _quantile(bounds, before, after, 0.99),
        "forecast_fits_per_min": round((fits1 - fits0) / minutes, 1),
        # Status writes per minute: only the changes, the whole status, or none.
        "status_writes_per_min": {
            kind: round((n - writes0.get(kind, 0.0)) / minutes, 1)
            for kind, n in sorted(writes1.items())
        },
        # The operator's Events in the measured cycles, by reason.
        "events_per_min": {r: round(n / minutes, 1) for r, n in sorted(events.items())},
        "forecast_series": series,
        "stale_pools": stale,
        "forecast_reasons": reasons,
        "operator_cpu_s_per_cycle": round((cpu2 - cpu1) / (elapsed / INTERVAL), 2),
        "fit_workers_cpu_s_per_cycle": round((child_cpu2 - child_cpu1) / (elapsed / INTERVAL), 2),
        "cluster_cpu_s_per_cycle": {
            name: round((cpu - cluster1.get(name, 0.0)) / (elapsed / INTERVAL), 1)
            for name, cpu in sorted(cluster2.items())
        },
        "machine_busy_share": round((busy2[0] - busy1[0]) / max(1, busy2[1] - busy1[1]), 3),
        # Everything else on the machine (other users' jobs compete for the same cores).
        "other_cpu_s_per_cycle": round(
            (
                (busy2[0] - busy1[0]) / os.sysconf("SC_CLK_TCK")
                - (cpu2 - cpu1)
                - (child_cpu2 - child_cpu1)
                - sum(cpu - cluster1.get(name, 0.0) for name, cpu in cluster2.items())
            )
            / (elapsed / INTERVAL),
            1,
        ),
        "warmup_cpu_s": round(cpu1 - cpu0, 1),
        "operator_rss_mib": round(peak_rss / 2**20),
        "fit_workers_rss_mib": round(peak_children / 2**20),
        "max_rss_mib_getrusage": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }
    # CPU of the whole stack per reconcile, by component (the fit processes are the
    # operator's too; controller-manager, scheduler and kwok are "rest").
    reconciles = max(1.0, count1 - count0)
    spent = {n: cpu - cluster1.get(n, 0.0) for n, cpu in cluster2.items()}
    parts = {"operator": (cpu2 - cpu1) + (child_cpu2 - child_cpu1), **_components(spent)}
    result["cpu_ms_per_reconcile"] = {
        **{n: round(1000 * cpu / reconciles, 1) for n, cpu in parts.items()},
        "total": round(1000 * sum(parts.values()) / reconciles, 1),
    }
    # Every client's API calls per reconcile, by verb and resource (kwok's node and pod
    # heartbeats, the controllers' and the operator's), the busiest first.
    calls = {k: (n - requests1.get(k, 0.0)) / reconciles for k, n in requests2.items()}
    result["api_calls_per_reconcile"] = {
        k: round(v, 3) for k, v in sorted(calls.items(), key=lambda kv: -kv[1]) if v >= 0.005
    }
    if idle:
        cycles_measured = elapsed / INTERVAL
        idle_parts = _components(idle)
        result["cluster_idle_cpu_s_per_cycle"] = {n: round(c, 2) for n, c in idle_parts.items()}
        # The cluster's CPU beyond what it spends with no operator at all, per reconcile.
        above = {
            n: cpu if n == "operator" else max(0.0, cpu - idle_parts[n] * cycles_measured)
            for n, cpu in parts.items()
        }
        result["cpu_ms_per_reconcile_above_idle"] = {
            **{n: round(1000 * cpu / reconciles, 1) for n, cpu in above.items()},
            "total": round(1000 * sum(above.values()) / reconciles, 1),
        }
    if restart:
        restarted = time.time()
        op = Operator(settings)
        result["restart_ready_s"] = round(time.monotonic() - op.started, 1)
        reports, caught_up = [], CatchUp(pools)
        for _ in range(restart_cycles):
            wall, before_cycle = time.time(), _snapshot(op.metrics)
            while time.time() < wall + INTERVAL:
                time.sleep(2.0)
                seen = _gauges(op.metrics, "prescaler_last_reconcile_timestamp_seconds")
                events = _counter(op.metrics, "prescaler_pool_watch_events")
                caught_up.sample(time.time() - restarted, seen.values(), restarted, events)
            reports.append(cycle_report(api, ns, op, pools, wall, before_cycle))
        op.close()
        result["after_restart"] = reports
        result["after_restart_catch_up_s"] = caught_up.report()
    core.delete_namespace(ns)
    api.close()
    return result


def _tree_cpu_and_rss(root: int) -> tuple[float, int]:
    """CPU seconds and RSS (bytes) of a process and its descendants (its fit workers)."""
    tick, page = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")
    stats: dict[int, list[str]] = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            with contextlib.suppress(OSError):
                stats[int(pid)] = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tree, grew = {root}, True
    while grew:
        more = {pid for pid, st in stats.items() if int(st[1]) in tree} - tree
        grew = bool(more)
        tree |= more
    cpu = sum(sum(int(x) for x in stats[p][11:13]) / tick for p in tree if p in stats)
    rss = sum(int(stats[p][21]) * page for p in tree if p in stats)
    return cpu, rss


def _samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of a Prometheus text exposition: name, labels, value."""
    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def _scrape(port: int) -> list[tuple[str, dict[str, str], float]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        return _samples(resp.read().decode())


def _replica_view(port: int) -> dict[str, Any]:
    """One replica's reconcile histogram, per-pool last reconcile times, pools and shards."""
    view: dict[str, Any] = {"bounds": [], "buckets": [], "count": 0.0, "last": {}, "pools": 0}
    for name, labels, value in _scrape(port):
        if name == "prescaler_reconcile_duration_seconds_bucket":
            view["bounds"].append(float(labels["le"]))
            view["buckets"].append(value)
        elif name == "prescaler_reconcile_duration_seconds_count":
            view["count"] = value
        elif name == "prescaler_last_reconcile_timestamp_seconds":
            view["last"][labels["pool"]] = value
        elif name == "prescaler_pool_reconciles_total":
            view["pools"] += 1
        elif name == "prescaler_shards_served":
            view["shards"] = int(value)
    return view


def run_sharded(
    cluster: LocalCluster,
    prometheus: Prometheus,
    pools: int,
    cycles: int,
    model: str,
    groups: int,
    days: float,
    shards: int,
    replicas: int,
    warmup: float,
) -> dict[str, Any]:
    """``replicas`` processes of ``prescaler run --shards`` on ``pools`` pools."""
    api = cluster.api_client()
    core: Any = client.CoreV1Api(api)
    ns = f"bench-{pools}-s{shards}-{int(time.time())}"
    pool_namespace(api, prometheus, ns, pools, groups, model, days)
    procs: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    logs = tempfile.mkdtemp(prefix="prescaler-shards-")
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    try:
        for i in range(replicas):
            identity, port = f"replica-{i}", free_port()
            argv = [
                str(Path(sys.executable).parent / "prescaler"),
                "run",
                "--namespace",
                ns,
                "--metrics-port",
                str(port),
                "--interval",
                str(INTERVAL),
                "--leader-election",
                "--leader-namespace",
                ns,
                "--leader-identity",
                identity,
                "--shards",
                str(shards),
            ]
            with open(Path(logs) / f"{identity}.log", "ab") as out:
                procs[identity] = (
                    subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT),
                    port,
                )
        time.sleep(warmup)
        before = {name: _replica_view(port) for name, (_, port) in procs.items()}
        cpu1 = {name: _tree_cpu_and_rss(proc.pid)[0] for name, (proc, _) in procs.items()}
        cluster1, busy1 = _cluster_cpu(), _machine_busy()
        peak_rss = dict.fromkeys(procs, 0)
        covered: list[float] = []
        t1 = time.monotonic()
        for _ in range(cycles):
            wall = time.time()
            cycle_end = time.monotonic() + INTERVAL
            while time.monotonic() < cycle_end:
                time.sleep(min(5.0, max(0.0, cycle_end - time.monotonic())))
                for name, (proc, _) in procs.items():
                    peak_rss[name] = max(peak_rss[name], _tree_cpu_and_rss(proc.pid)[1])
            last: dict[str, float] = {}
            for _, port in procs.values():
                for pool, t in _replica_view(port)["last"].items():
                    last[pool] = max(last.get(pool, 0.0), t)
            covered.append(sum(1 for t in last.values() if t >= wall) / pools)
        elapsed = time.monotonic() - t1
        after = {name: _replica_view(port) for name, (_, port) in procs.items()}
        cpu2 = {name: _tree_cpu_and_rss(proc.pid)[0] for name, (proc, _) in procs.items()}
        cluster2, busy2 = _cluster_cpu(), _machine_busy()
    finally:
        for proc, _ in procs.values():
            proc.terminate()
        for proc, _ in procs.values():
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
    minutes, per_cycle = elapsed / 60, elapsed / INTERVAL
    per_replica = {}
    for name in procs:
        b, a = before[name], after[name]
        per_replica[name] = {
            "shards": a.get("shards"),
            "pools": a["pools"],
            "reconciles_per_min": round((a["count"] - b["count"]) / minutes, 1),
            "reconcile_p99_s_le": _quantile(a["bounds"], b["buckets"], a["buckets"], 0.99),
            "cpu_s_per_cycle": round((cpu2[name] - cpu1[name]) / per_cycle, 2),
            "rss_mib": round(peak_rss[name] / 2**20),
        }
    total = sum(r["reconciles_per_min"] for r in per_replica.values())
    operators = sum(cpu2[n] - cpu1[n] for n in procs)
    spent = {n: cpu - cluster1.get(n, 0.0) for n, cpu in cluster2.items()}
    spent.pop("prescaler", None)  # the replicas, counted above
    reconciles = max(1.0, total * minutes)
    parts = {"operators": operators, **_components(spent)}
    core.delete_namespace(ns)
    api.close()
    return {
        "pools": pools,
        "series": groups,
        "shards": shards,
        "replicas": replicas,
        "model": model,
        "cycle_seconds": INTERVAL,
        "warmup_s": warmup,
        "reconciles_per_min": round(total, 1),
        "min_share_of_pools_reconciled_per_cycle": round(min(covered), 4),
        "per_replica": per_replica,
        "machine_busy_share": round((busy2[0] - busy1[0]) / max(1, busy2[1] - busy1[1]), 3),
        "cpu_ms_per_reconcile": {
            **{n: round(1000 * cpu / reconciles, 1) for n, cpu in parts.items()},
            "total": round(1000 * sum(parts.values()) / reconciles, 1),
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pools", type=int, nargs="+", default=[50, 200, 500])
    parser.add_argument("--cycles", type=int, default=2)
    parser.add_argument(
        "--model", default=DEFAULT_MODEL, help="forecast model of every pool (default: spec's)"
    )
    parser.add_argument(
        "--series", type=int, default=10, help="distinct demand series the pools read"
    )
    parser.add_argument(
        "--history-days", type=float, default=2.0, help="backfilled history and lookback"
    )
    parser.add_argument(
        "--restart", action="store_true", help="then restart the operator and measure again"
    )
    parser.add_argument(
        "--restart-cycles",
        type=int,
        default=0,
        help="cycles measured after the restart (default: --cycles)",
    )
    parser.add_argument(
        "--week-old-status",
        action="store_true",
        help="start every pool with a week of status.againstHpa hours (a steady state)",
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=INTERVAL + 10,
        help="seconds before the measured cycles (a pool's degradation level is held 5 min"
        " after its start, so a steady state needs 6)",
    )
    parser.add_argument(
        "--idle-baseline",
        action="store_true",
        help="then measure the cluster one more cycle with the operator stopped, and"
        " report the stack's CPU per reconcile above that too",
    )
    parser.add_argument(
        "--shards",
        type=int,
        default=0,
        help="run prescaler run --shards N processes instead of one in-process operator",
    )
    parser.add_argument(
        "--replicas", type=int, default=0, help="replicas with --shards (default: N)"
    )
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
                if args.shards > 0:
                    sharded = run_sharded(
                        cluster,
                        prometheus,
                        n,
                        args.cycles,
                        args.model,
                        args.series,
                        args.history_days,
                        args.shards,
                        args.replicas or args.shards,
                        args.warmup,
                    )
                    print(json.dumps(sharded), flush=True)
                    continue
                result = run_one(
                    cluster,
                    prometheus,
                    n,
                    args.cycles,
                    args.model,
                    args.series,
                    args.restart,
                    args.history_days,
                    args.week_old_status,
                    args.warmup,
                    args.idle_baseline,
                    args.restart_cycles or args.cycles,
                )
                print(json.dumps(result), flush=True)
        finally:
            prometheus.stop()
            cluster.stop()
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except SystemExit as exit_:  # argparse's --help (0) and usage errors (2)
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    os._exit(code)  # an in-process operator's threads must not outlive a failed run
