"""What a pool's schedules cost a reconcile, on the densest schedules the spec admits.

    .venv/bin/python benchmarks/schedules.py [--repeat 5] [--write]

64 windows (the CRD's most), each firing every hour (the most often a window may recur)
and lasting 31 days (the longest occurrence), so 744 occurrences of each overlap any
moment. Times, as the median of ``--repeat`` runs on this machine:

* the planner's decision for the pool (its window floor and its standby horizon), on the
  event loop once per reconcile;
* the forecaster's calendar over its longest range (90 days of history plus a 7-day
  horizon), once per history refresh, in a thread;

and, beside each, what listing every occurrence in the same range costs (how both were
listed before they stopped at what they use). ``--write`` puts the table in
``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _readme import replace_section
from prescaler.capacity import CapacityModel, TokenProfile
from prescaler.planning import (
    FleetState,
    PlanInputs,
    ScalingPolicy,
    ScheduledWindow,
    event_windows,
    plan,
)
from prescaler.settings import ReconcileSettings

NOW = 1_800_000_000.0
DAY = 86_400.0
SCHEDULES = 64
LOOKAHEAD = 600.0  # what the planner lists windows over: a cold start plus margin


def windows() -> tuple[ScheduledWindow, ...]:
    return tuple(
        ScheduledWindow(
            f"w{i}", cron=f"{i % 60} * * * *", duration_seconds=31 * DAY, min_replicas=2
        )
        for i in range(SCHEDULES)
    )


def median_ms(call: Callable[[], object], repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        runs.append(time.perf_counter() - started)
    return 1000 * statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--write", action="store_true", help="update benchmarks/README.md")
    args = parser.parse_args()
    ws = windows()
    inputs = PlanInputs(
        now=NOW,
        capacity=CapacityModel(TokenProfile(600, 400), tokens_per_second=1000),
        fleet=FleetState(1, 1),
        policy=ScalingPolicy(min_replicas=1, max_replicas=20, standby_max_replicas=4),
        cold_start_seconds=540,
        forecast=None,
        windows=ws,
    )
    since, until = NOW - 90 * DAY, NOW + 7 * DAY
    rows = [
        ("planner decision (floor and standby)", lambda: plan(inputs),
         lambda: [w.occurrences(NOW, NOW + 2 * LOOKAHEAD) for w in ws]),
        ("forecaster calendar (97 days)", lambda: event_windows(ws, since, until),
         lambda: [w.occurrences(since, until) for w in ws[:4]]),
    ]  # fmt: skip
    period = ReconcileSettings().interval_seconds
    lines = [
        f"64 hourly windows of 31 days on one pool; median of {args.repeat} runs; the "
        f"reconcile period is {period:g} s.",
        "",
        "| step | now (ms) | listing every occurrence (ms) |",
        "|---|---|---|",
    ]
    for name, now_call, all_call in rows:
        now_ms = median_ms(now_call, args.repeat)
        all_ms = median_ms(all_call, max(1, args.repeat // 5))
        if "calendar" in name:  # listed for 4 windows: 64 cost 16 times as much
            all_ms *= SCHEDULES / 4
        lines.append(f"| {name} | {now_ms:.1f} | {all_ms:,.0f} |")
    table = "\n".join(lines)
    print(table)
    if args.write:
        replace_section(
            "<!-- schedules:begin -->", "<!-- schedules:end -->", table, "Schedules at the limit"
        )


if __name__ == "__main__":
    main()
