"""``python -m cluster up|down|status`` (run with ``tests`` on ``PYTHONPATH``).

``up`` starts a local cluster that outlives the command (for the demo and manual work),
writes its kubeconfig to ``<run-dir>/kubeconfig`` and its PIDs to
``<run-dir>/state.json``; ``down`` stops exactly those PIDs. The default run dir is
``out/cluster`` in the project.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .launcher import ClusterConfig, LocalCluster, env_float, running_procs, stop_from_state
from .paths import PROJECT_ROOT
from .procs import ComponentError


def _up(run_dir: Path, gpu_delay_s: float) -> int:
    alive = running_procs(run_dir)
    if alive:
        print(f"cluster already running in {run_dir}: {', '.join(p.name for p in alive)}")
        print(f"export KUBECONFIG={run_dir / 'kubeconfig'}")
        return 0
    stop_from_state(run_dir)  # a stale state file from a crashed run
    cluster = LocalCluster(
        run_dir, ClusterConfig(gpu_ready_delay_s=gpu_delay_s), tie_to_parent=False
    )
    t0 = time.monotonic()
    try:
        cluster.start()
    except ComponentError as e:
        print(f"cluster-up failed: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # e.g. an API error while creating the fake nodes
        print(f"cluster-up failed: {e!r}; logs in {run_dir / 'logs'}", file=sys.stderr)
        return 1
    took = time.monotonic() - t0
    rss = cluster.memory_bytes()
    print(f"cluster up in {took:.1f}s, API server {cluster.server}")
    print(
        "memory (RSS): "
        + ", ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in rss.items())
        + f"; total {sum(rss.values()) / 2**20:.0f} MiB"
    )
    print(f"logs: {run_dir / 'logs'}")
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    return 0


def _down(run_dir: Path) -> int:
    stopped = stop_from_state(run_dir)
    print(f"stopped: {', '.join(stopped)}" if stopped else "no cluster running")
    return 0


def _status(run_dir: Path) -> int:
    alive = running_procs(run_dir)
    if not alive:
        print("no cluster running")
        return 1
    for p in alive:
        print(f"{p.name:24} pid {p.pid:>7}  rss {p.rss_bytes() / 2**20:6.0f} MiB  log {p.log}")
    print(f"export KUBECONFIG={run_dir / 'kubeconfig'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster", description=__doc__)
    parser.add_argument("command", choices=("up", "down", "status"))
    parser.add_argument(
        "--run-dir", type=Path, default=PROJECT_ROOT / "out" / "cluster", help="state directory"
    )
    parser.add_argument(
        "--gpu-ready-delay",
        type=float,
        default=env_float("PRESCALER_FAKE_READY_DELAY", 10.0),
        help="seconds from start to Ready of a GPU pod ($PRESCALER_FAKE_READY_DELAY, 10)",
    )
    args = parser.parse_args(argv)
    run_dir: Path = args.run_dir.resolve()
    if args.command == "up":
        return _up(run_dir, args.gpu_ready_delay)
    if args.command == "down":
        return _down(run_dir)
    return _status(run_dir)


if __name__ == "__main__":
    sys.exit(main())
