"""Shard faults, timed: how long a killed replica's pools go unserved, and how long a
joining replica leaves a pool between two reconciles.

    .venv/bin/python benchmarks/shard_faults.py [--runs 3] [--burners 2]

Each run starts a fresh namespace with the shard tests' world (``integration.shard_world``:
300 pools on 6 shard Leases, three ``prescaler run --shards 6`` processes with a 15 s
period and 12 s Leases, renew deadline 8 s, retry 1.5 s) and plays both scenarios the
shard tests check:

- **kill**: every pool of one replica gets a floor of 1, and the replica is killed with
  SIGKILL once it has scaled a third of them. Reported: seconds from the kill until the
  survivors hold all its shard Leases (``takeover``), and until every one of its pools
  was reconciled again (``served``).
- **join**: a fourth replica starts beside three steady ones. Reported: the longest time
  between two reconciles of any pool from the join on (``worst_gap``), from every
  replica's ``prescaler_last_reconcile_timestamp_seconds`` read every 0.2 s, and how many
  pools moved.

``--burners N`` runs N busy-looping processes beside it, as ``make test-stress`` does, so
the numbers can be read on a machine as busy as a shared CI runner. One JSON line per
run and scenario, then the min / median / max of each figure.

Needs the cluster binaries (``make cluster-bin``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import yaml  # noqa: E402
from kubernetes import client  # noqa: E402

from cluster.launcher import ClusterConfig, LocalCluster, wait_default_service_account  # noqa: E402
from integration.operator_fixtures import Kube  # noqa: E402
from integration.shard_world import (  # noqa: E402
    INTERVAL,
    LEASE,
    POOLS,
    RETRY,
    create_pools,
    join_one,
    kill_while_scaling,
    replicas,
)


@contextmanager
def burners(n: int) -> Iterator[None]:
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


@contextmanager
def fresh_namespace(api: Any) -> Iterator[str]:
    core = client.CoreV1Api(api)
    name = f"b-{uuid.uuid4().hex[:10]}"
    core.create_namespace({"metadata": {"name": name}})
    wait_default_service_account(api, name)
    try:
        yield name
    finally:
        core.delete_namespace(name, propagation_policy="Background")


def kill_run(cluster: LocalCluster, api: Any, logs: Path) -> dict[str, Any]:
    with fresh_namespace(api) as ns:
        k = Kube(api, ns)
        shards = create_pools(k, POOLS)
        with replicas(cluster, ns, logs, ["r0", "r1", "r2"]) as running:
            killed = kill_while_scaling(k, api, running, shards, victim="r1")
    return {
        "scenario": "kill",
        "pools_of_the_killed_replica": len(killed.victims),
        "takeover_s": round(killed.takeover, 1),
        "served_s": round(killed.served, 1),
    }


def join_run(cluster: LocalCluster, api: Any, logs: Path) -> dict[str, Any]:
    with fresh_namespace(api) as ns:
        k = Kube(api, ns)
        shards = create_pools(k, POOLS)
        with replicas(cluster, ns, logs, ["r0", "r1", "r2"]) as running:
            join = join_one(k, running, shards, joiner="r3")
    return {
        "scenario": "join",
        "moved_pools": len(join.moved),
        "worst_gap_s": round(join.worst, 1),
        "worst_gap_pool": join.where,
    }


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("takeover_s", "served_s", "worst_gap_s"):
        values = [row[key] for row in rows if key in row]
        if values:
            out[key] = {
                "min": min(values),
                "median": statistics.median(values),
                "max": max(values),
                "runs": len(values),
            }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3, help="runs of each scenario")
    parser.add_argument("--burners", type=int, default=0, help="busy-looping processes beside")
    args = parser.parse_args()
    print(
        f"# {POOLS} pools, period {INTERVAL:g} s, lease {LEASE:g} s, retry {RETRY:g} s,"
        f" {args.burners} burner(s), {os.cpu_count()} cores",
        flush=True,
    )
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="prescaler-shards-") as tmp:
        cluster = LocalCluster(Path(tmp) / "cluster", ClusterConfig(), tie_to_parent=True)
        cluster.start()
        os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
        api = cluster.api_client()
        try:
            crd = yaml.safe_load((ROOT / "crds" / "inferencepools.prescaler.io.yaml").read_text())
            client.ApiextensionsV1Api(api).create_custom_resource_definition(crd)
            time.sleep(3)
            with burners(args.burners):
                for run in range(args.runs):
                    for play in (kill_run, join_run):
                        logs = Path(tmp) / f"{play.__name__}-{run}"
                        logs.mkdir()
                        row = play(cluster, api, logs)
                        rows.append(row)
                        print(json.dumps(row), flush=True)
        finally:
            api.close()
            cluster.stop()
    print(json.dumps({"summary": summary(rows), "burners": args.burners}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
