"""``python -m prescaler_demo``: the live part of ``make demo`` (run with ``hack/demo`` and
``tests`` on ``PYTHONPATH``; ``hack/demo.sh`` does that).

Every option also reads an environment variable (``DEMO_MINUTES``, ``DEMO_TRACE``,
``DEMO_FORMAT``, ``DEMO_OUT``), so ``make demo`` takes either
``make demo ARGS="--minutes 9"`` or ``DEMO_MINUTES=9 make demo``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from cluster.paths import PROJECT_ROOT, TRACES_DIR
from prescaler_demo.scenario import Options, build

DEFAULT_TRACE = TRACES_DIR / "servegen_m_small" / "language__m-small_aggregate_rate_10min.csv"


def parse(argv: list[str] | None) -> tuple[Options, Path]:
    env = os.environ
    d = Options(trace=DEFAULT_TRACE)
    p = argparse.ArgumentParser(prog="python -m prescaler_demo", description=__doc__)
    p.add_argument(
        "--minutes",
        type=float,
        default=float(env.get("DEMO_MINUTES", d.minutes)),
        help="minutes of live play (default 7: the demo ends within 10 minutes)",
    )
    p.add_argument(
        "--trace",
        type=Path,
        default=Path(env.get("DEMO_TRACE", str(d.trace))),
        help="trace file (default: ServeGen m-small, 10-minute rates over 14 days)",
    )
    p.add_argument(
        "--format",
        dest="fmt",
        default=env.get("DEMO_FORMAT", d.fmt),
        help="trace format: servegen, nab, rate, azure, requests (default servegen)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path(env.get("DEMO_OUT", "out/demo")),
        help="output directory (default out/demo)",
    )
    p.add_argument(
        "--seconds-per-step",
        type=float,
        default=d.seconds_per_step,
        help="wall seconds per trace step (default 60: 10x for 10-minute steps)",
    )
    p.add_argument(
        "--cold-start",
        type=float,
        default=d.cold_start_seconds,
        help="seconds a GPU pod takes to become Ready (default 60)",
    )
    p.add_argument(
        "--peak-replicas",
        type=int,
        default=d.peak_replicas,
        help="scale demand so the stretch's peak needs this many replicas (10)",
    )
    p.add_argument(
        "--max-replicas",
        type=int,
        default=d.max_replicas,
        help="pool maximum (default: what the backfilled week's peak needs)",
    )
    p.add_argument(
        "--window-in",
        type=float,
        default=d.window_in_seconds,
        help="seconds from the live start to the scheduled window (360)",
    )
    p.add_argument(
        "--window-minutes",
        type=float,
        default=d.window_minutes,
        help="how long the scheduled window lasts, minutes (1)",
    )
    p.add_argument(
        "--window-replicas",
        type=int,
        default=d.window_replicas,
        help="replicas the scheduled window asks for (12)",
    )
    p.add_argument(
        "--window-lead",
        type=int,
        default=d.window_lead_seconds,
        help="the window's pre-warm lead, seconds (150)",
    )
    p.add_argument(
        "--no-tenants",
        action="store_true",
        help="choose the stretch from the trace itself only, not from its tenants' series",
    )
    p.add_argument(
        "--describe",
        action="store_true",
        help="print the stretch and the settings, and the pool; start nothing",
    )
    a = p.parse_args(argv)  # fmt: skip
    options = Options(
        trace=a.trace,
        fmt=a.fmt,
        minutes=a.minutes,
        seconds_per_step=a.seconds_per_step,
        cold_start_seconds=a.cold_start,
        peak_replicas=a.peak_replicas,
        max_replicas=a.max_replicas,
        window_in_seconds=a.window_in,
        window_minutes=a.window_minutes,
        window_replicas=a.window_replicas,
        window_lead_seconds=a.window_lead,
        tenants=not a.no_tenants,
    )
    out = a.out if a.out.is_absolute() else PROJECT_ROOT / a.out
    if a.describe:
        out = Path("")
    return options, out


def main(argv: list[str] | None = None) -> int:
    options, out = parse(argv)
    from prescaler_demo import live

    try:
        scenario = build(options)
    except (ValueError, OSError) as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    live.describe(scenario)
    if out == Path(""):
        print(scenario.pool_yaml("http://127.0.0.1:9090", 0.0))
        return 0
    try:
        result = live.run(scenario, out)
    except KeyboardInterrupt:
        print("\ndemo: interrupted; everything it started is stopped", file=sys.stderr)
        return 130
    return 0 if result.timeline_rows > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
