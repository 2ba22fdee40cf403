"""Tenants benchmark: the defaults against the HPA's curve on every ServeGen tenant.

Run from the project root (the traces live in ``../shared/traces``)::

    .venv/bin/python benchmarks/tenants.py               # every tenant, 240 s and 600 s
    .venv/bin/python benchmarks/tenants.py --only client_31 --cold 240

The frontier benchmark (``frontier.py``) judges the defaults on four traces. ServeGen's
per-client file splits its aggregate into the tenants that send it: 17 of them send at
least a request per second at the median (the demo's rule for a tenant that is a pool of
its own, ``prescaler_demo.scenario.tenant_traces``), and their shapes differ from the
aggregate and from each other: steady ones, daily cycles, tenants that switch on and off,
and spikes of 14 × the median. No knob or default was chosen on any of them, so each is
traffic the defaults have not seen. Each tenant's last 7 days are replayed, as the
aggregate's are, scaled so that its peak needs 40 replicas, through the same code as
``frontier.py`` (:func:`frontier.replayer`): the HPA over its target and the smoothed
oracle over ``k`` (:func:`frontier.reference_points`), and prescaler at its defaults.
About 15 minutes on 2 cores with ``--jobs 2`` (34 replays; a default replay takes 35–50 s).

``--first-halves`` replays days 4-7 instead (the frontier's first halves: where a change
is to be tuned before the last 7 days judge it), and flags after ``--`` go to prescaler's
point (``-- --observed-headroom 1.2``); both only print. A whole run at the defaults keeps
the points in ``benchmarks/frontier/tenants.json`` (``--from-points`` rewrites the tables
from it without replaying) and rewrites the part of ``benchmarks/README.md``
between the ``tenants:begin``/``tenants:end`` markers: per tenant and cold start, the HPA
at 0.7's unserved share, the default's unserved tokens and GPU-hours ÷ the HPA's and its
frontier ratio (its unserved ÷ the HPA curve's at the same GPU-hours); and per cold start,
how many tenants fall in each band of the frontier ratio, and the median of the unserved
ratios (not the mean: where the HPA leaves next to nothing waiting, one ratio runs to
thousands).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

import frontier as F  # the scripts run with benchmarks/ on sys.path
from _readme import replace_section

POINTS = F.PLOTS / "tenants.json"
AGGREGATE = Path(f"{F.SG}_aggregate_rate_10min.csv")
DEMO = F.ROOT / "hack" / "demo"


@dataclass(frozen=True)
class Tenant:
    name: str
    median_rps: float
    peak_over_median: float


def tenants(out: Path) -> list[tuple[Tenant, Path]]:
    """Every tenant of the per-client file that the demo would take as a pool, busiest
    first, each with its series written to ``out`` as a ``rate`` trace
    (``timestamp,requests_per_second``; a collection gap of the aggregate is empty)."""
    sys.path.insert(0, str(DEMO))
    from prescaler_demo.scenario import tenant_traces

    from prescaler.backtest.traces import load_trace

    aggregate = load_trace(AGGREGATE, "servegen")
    out.mkdir(parents=True, exist_ok=True)
    found = []
    for trace in tenant_traces(AGGREGATE, aggregate):
        name = trace.name.rsplit("tenant ", 1)[1]
        rps = np.asarray(trace.rps, dtype=float)
        stamps = trace.start + trace.step_seconds * np.arange(len(rps))
        lines = ["timestamp,requests_per_second"]
        lines += [
            f"{t:.0f},{'' if not math.isfinite(r) else f'{r:.6g}'}"
            for t, r in zip(stamps, rps, strict=True)
        ]
        path = out / f"{name}.csv"
        path.write_text("\n".join(lines) + "\n")
        median = float(np.nanmedian(rps))
        found.append((Tenant(name, median, float(np.nanmax(rps)) / median), path))
    return sorted(found, key=lambda t: -t[0].median_rps)


def trace_args(path: Path, first_half: bool = False) -> list[str]:
    """The backtest flags for a tenant's series: the aggregate's token mix, its last 7
    days (``first_half``: days 4-7, the frontier's first halves)."""
    part = (
        ["--max-minutes", str(7 * 1440), "--replay-days", "3.5"]
        if first_half
        else ["--replay-days", "7"]
    )
    return [
        "--trace", str(path), "--format", "rate",
        "--token-mix", f"{F.SG}_input_tokens_pdf.csv.gz", *part,
    ]  # fmt: skip


def replay_tenant(job: tuple[Tenant, Path, int, bool, list[str]]) -> list[F.Point]:
    """The HPA's and the smoothed oracle's curves, and the default point (with ``extra``
    backtest flags: a variant's, in its place)."""
    from prescaler.api import ObjectiveSpec

    tenant, path, cold, first_half, extra = job
    _, one, replay = F.replayer(trace_args(path, first_half), cold)
    points = F.reference_points(one, replay)
    relative = ObjectiveSpec.default_of("relative_to_hpa")
    default = replay(one("predictive", extra))
    points.append(F.Point("predictive", "relative", relative, True, *default))
    print(f"{tenant.name} {cold} s done", file=sys.stderr, flush=True)
    return points


def section(runs: Sequence[tuple[Tenant, int, list[F.Point]]]) -> str:
    lines = [
        "| tenant | median req/s | peak ÷ median | cold start | HPA at 0.7: unserved | "
        "default: unserved ÷ HPA | GPU-h ÷ HPA | frontier ratio |",
        "|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for tenant, cold, points in runs:
        h, hpa, d = F.default_headline(points), F.hpa_point(points), F.default_point(points)
        ratio = h.ratio_text
        unserved = F._fmt(h.unserved) if h.unserved is not None else f"{d.unserved:.3%} (HPA none)"
        note = " (dearer than the HPA at 0.5)" if h.dearer_than_half else ""
        lines.append(
            f"| {tenant.name} | {tenant.median_rps:.1f} | {tenant.peak_over_median:.1f} "
            f"| {cold} s | {hpa.unserved:.3%} | {unserved} | {h.gpu_hours:.3f}{note} | {ratio} |"
        )
    lines += [
        "",
        "| cold start | tenants | " + " | ".join(f"frontier ratio {b}" for b in F.BANDS[:3])
        + " | " + " | ".join(F.BANDS[3:]) + " | worse than the HPA on both axes | "
        "dearer than the HPA at 0.5 | unserved ÷ HPA (median) | GPU-h ÷ HPA (summed) |",
        "|---|---:|" + "---:|" * (len(F.BANDS) + 4),
    ]  # fmt: skip
    for cold in sorted({c for _, c, _ in runs}):
        mine = [pts for _, c, pts in runs if c == cold]
        counts = dict.fromkeys(F.BANDS, 0)
        worse = dearer = 0
        pairs = []
        for points in mine:
            h, hpa, d = F.default_headline(points), F.hpa_point(points), F.default_point(points)
            counts[h.band] += 1
            worse += h.worse_on_both
            dearer += h.dearer_than_half
            pairs.append((hpa, d))
        _, gpu = F.over_traces(pairs)
        ratios = [d.unserved / hpa.unserved for hpa, d in pairs if hpa.unserved > 0]
        median = f"{float(np.median(ratios)):.2f}" if ratios else "n/a"
        lines.append(
            f"| {cold} s | {len(mine)} | "
            + " | ".join(str(counts[b]) for b in F.BANDS)
            + f" | {worse} | {dearer} | {median} | {gpu:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="substring of the tenant names to run")
    parser.add_argument("--cold", type=int, action="append", help="cold start(s) in seconds")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--no-readme", action="store_true")
    parser.add_argument(
        "--from-points", action="store_true", help=f"no replay: tables from {POINTS}"
    )
    parser.add_argument(
        "--first-halves",
        action="store_true",
        help="replay days 4-7 of each tenant, where a variant is to be tuned (prints only)",
    )
    parser.add_argument(
        "extra", nargs="*", help="backtest flags for prescaler's point (after --; prints only)"
    )
    args = parser.parse_args()
    whole = args.only is None and args.cold is None and not args.first_halves and not args.extra
    if args.from_points:
        runs = [
            (Tenant(**r["tenant"]), r["cold"], [F.Point(**p) for p in r["points"]])
            for r in json.loads(POINTS.read_text())
        ]
    else:
        found = tenants(Path(tempfile.mkdtemp(prefix="prescaler-tenants-")))
        jobs = [
            (t, path, cold, args.first_halves, args.extra)
            for t, path in found
            if args.only is None or args.only in t.name
            for cold in args.cold or F.COLD_STARTS
        ]
        with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            results = list(pool.map(replay_tenant, jobs))
        runs = [(job[0], job[2], pts) for job, pts in zip(jobs, results, strict=True)]
        if whole:
            stored = [
                {"tenant": asdict(t), "cold": c, "points": [asdict(p) for p in pts]}
                for t, c, pts in runs
            ]
            POINTS.write_text(json.dumps(stored, indent=1) + "\n")
    text = section(runs)
    print(text)
    if not args.no_readme and (whole or args.from_points):  # the held-out defaults only
        replace_section(
            "<!-- tenants:begin -->", "<!-- tenants:end -->", text, "Tenants (ServeGen, held out)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
