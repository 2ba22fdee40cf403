"""Backtest benchmark: the real traces x cold starts 240/480 s, predictive vs reactive vs oracle.

Run from the project root (the traces live in ``../shared/traces``)::

    .venv/bin/python benchmarks/backtest_table.py            # all runs, updates README.md
    .venv/bin/python benchmarks/backtest_table.py --jobs 1   # sequential (clean timings)
    .venv/bin/python benchmarks/backtest_table.py --only servegen -- --observed-headroom 1.5
    .venv/bin/python benchmarks/backtest_table.py --sections degradation   # levels only

``--only`` replaces just those runs' rows in the README and keeps the others.

It runs ``prescaler backtest`` once per (trace, cold start), keeps the JSON and timeline in
``--out`` (default: a temporary directory), and rewrites only the parts of
``benchmarks/README.md`` between the ``backtest:begin``/``backtest:end`` markers (the
scores) and the ``degradation:begin``/``degradation:end`` markers (the minutes at each
degradation level and the forecast's lead over the queue, from the same runs);
``--sections`` picks which.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, get_args

from _readme import replace_section  # the scripts run with benchmarks/ on sys.path
from fetch_traces import ensure_args
from fetch_traces import path as fetched
from prescaler.planning import Driver

ROOT = Path(__file__).resolve().parents[1]
TRACES = Path("../shared/traces")
README = ROOT / "benchmarks" / "README.md"
BEGIN, END = "<!-- backtest:begin -->", "<!-- backtest:end -->"
DEGRADATION_BEGIN, DEGRADATION_END = "<!-- degradation:begin -->", "<!-- degradation:end -->"
DRIVERS_BEGIN, DRIVERS_END = "<!-- drivers:begin -->", "<!-- drivers:end -->"
SECTIONS = ("backtest", "degradation", "drivers")
DRIVERS: tuple[str, ...] = get_args(Driver)
"""The rules a plan names as its driver, in table order (one list: the planner's)."""
DEGRADATION_POLICIES = ("predictive", "reactive")
"""The fleets the degradation table shows (every policy's levels are in the JSON)."""
COLD_STARTS = (240, 480)
POLICIES = ("reactive", "predictive", "oracle", "persistence")
"""``persistence`` is a reference row: k x the demand seen now, released at once."""

# One replica: 20k prompt+output tokens/s (compute-bound); demand scaled so that the
# peak minute needs 40 replicas.
COMMON = [
    "--replica-tokens-per-second",
    "20000",
    "--scale-to-peak-replicas",
    "40",
    "--policies",
    ",".join(POLICIES),
    "--quiet",
]

# The predictive policy runs at the product's defaults: no policy flag at all, so the
# backtest reads every knob from the InferencePool spec model, as a pool that sets nothing
# gets them. Only the persistence reference has a knob of its own.
OPERATING_POINT = ["--persistence-k", "1.4"]

SG = TRACES / "servegen_m_small" / "language__m-small"


def _fetched(name: str) -> list[str]:
    """A fetched rate trace's last 14 days after 35 of history, 1000/200 tokens a request."""
    return [
        *("--trace", str(fetched(name)), "--format", "rate"),
        *("--prompt-tokens", "1000", "--output-tokens", "200"),
        *("--replay-days", "14", "--history-days", "35"),
    ]


RUNS: dict[str, list[str]] = {
    "servegen (14 d, 1-min decisions)": [
        "--trace",
        f"{SG}_aggregate_rate_10min.csv",
        "--format",
        "servegen",
        "--token-mix",
        f"{SG}_input_tokens_pdf.csv.gz",
    ],
    "azure code (1 h at 10x)": [
        "--trace",
        str(TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"),
        "--format",
        "azure",
        "--time-scale",
        "10",
        "--trace-step-seconds",
        "600",
    ],
    "azure conv (1 h at 10x)": [
        "--trace",
        str(TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"),
        "--format",
        "azure",
        "--time-scale",
        "10",
        "--trace-step-seconds",
        "600",
    ],
    "nab taxi (last 28 d, 1-min decisions)": [
        "--trace",
        str(TRACES / "nab_nyc_taxi" / "nyc_taxi.csv"),
        "--format",
        "nab",
        "--prompt-tokens",
        "1000",
        "--output-tokens",
        "200",
        "--replay-days",
        "28",
        "--history-days",
        "35",
    ],
    # The fetched real traces (benchmarks/fetch_traces.py), their last 14 days as in the
    # frontier's held-out cells.
    **{f"{name} (last 14 d, 1-min decisions)": _fetched(name) for name in ("flights", "retail")},
}


def _one(name: str, args: list[str], cold: int, out: Path, extra: list[str]) -> dict[str, Any]:
    slug = name.split(" ")[0] + ("-" + name.split(" ")[1] if name.startswith("azure") else "")
    stem = out / f"{slug}-{cold}"
    cmd = [
        sys.executable,
        "-m",
        "prescaler.cli",
        "backtest",
        *args,
        *COMMON,
        *OPERATING_POINT,
        *extra,
        "--cold-start-seconds",
        str(cold),
        "--json",
        f"{stem}.json",
        "--timeline",
        f"{stem}.csv",
        "--plot",
        f"{stem}.png",
    ]
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True)
    body: dict[str, Any] = json.loads(Path(f"{stem}.json").read_text())
    body["_wall"] = time.perf_counter() - t0
    body["_name"] = name
    print(f"done: {name} cold {cold}s in {body['_wall']:.0f}s", file=sys.stderr)
    return body


def _fmt_ratio(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| trace | cold start | policy | shortfall min | unserved token frac | GPU-hours "
        "| GPU-h / oracle | scale events | direction changes / day | pred/react shortfall "
        "| pred/oracle GPU-h |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        ratios = r.get("ratios", {})
        oracle = r["policies"].get("oracle", {}).get("gpu_hours")
        for i, (policy, s) in enumerate(r["policies"].items()):
            first = i == 0
            r_short = _fmt_ratio(ratios.get("shortfall_predictive_over_reactive"))
            r_gpu = _fmt_ratio(ratios.get("gpu_hours_predictive_over_oracle"))
            own = _fmt_ratio(s["gpu_hours"] / oracle if oracle else None)
            label = "persistence (reference)" if policy == "persistence" else policy
            lines.append(
                f"| {r['_name'] if first else ''} | {r['cold_start_seconds']:.0f} s "
                f"| {label} | {s['shortfall_minutes']} | {s['unserved_token_fraction']:.4f} "
                f"| {s['gpu_hours']:.1f} | {own} | {s['scale_events']} "
                f"| {s.get('direction_changes_per_day', 0.0):.1f} "
                f"| {r_short if first else ''} | {r_gpu if first else ''} |"
            )
    return "\n".join(lines)


def timings(results: list[dict[str, Any]]) -> str:
    lines = [
        "| trace | cold start | minutes | predictive replay (s) | whole command (s) |",
        "|---|---|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['_name']} | {r['cold_start_seconds']:.0f} s | {r['minutes']} "
            f"| {r['runtime_seconds'].get('predictive', 0):.0f} | {r['_wall']:.0f} |"
        )
    return "\n".join(lines)


def drivers_table(results: list[dict[str, Any]]) -> str:
    """Per run, the share of the predictive policy's GPU-hours (and decisions) each rule
    drove: which margin is paid for."""
    lines = [
        "| trace | cold start | " + " | ".join(DRIVERS) + " |",
        "|---|---|" + "---:|" * len(DRIVERS),
    ]
    for r in results:
        shares = r.get("drivers", {}).get("predictive", {})
        cells = []
        for name in DRIVERS:
            d = shares.get(name)
            cells.append(
                "" if d is None else f"{d['gpu_hour_share']:.0%} ({d['decision_share']:.0%})"
            )
        lines.append(
            f"| {r['_name']} | {r['cold_start_seconds']:.0f} s | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


def _minutes(x: float) -> str:
    return f"{x:.1f}"


def _seconds(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0f}"


def degradation_table(results: list[dict[str, Any]]) -> str:
    """Minutes at each degradation level per fleet, and the forecast's lead over the queue."""
    lines = [
        "| trace | cold start | fleet | normal min | warning min | critical min "
        "| queue alone: warning / critical min | forecast shortfall ≥ warning min "
        "| queue episodes | forecast first | median lead (s) | p90 lead (s) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        first = True
        for policy in DEGRADATION_POLICIES:
            s = r["policies"].get(policy, {}).get("degradation")
            if s is None:
                continue
            m, q, lead = s["minutes"], s["queue_only_minutes"], s["lead"] or {}
            share = lead.get("forecast_first_share")
            first_cell = "n/a" if share is None else f"{lead['forecast_first']} ({share:.0%})"
            label = "reactive (HPA)" if policy == "reactive" else policy
            lines.append(
                f"| {r['_name'] if first else ''} | {r['cold_start_seconds']:.0f} s | {label} "
                f"| {_minutes(m['normal'])} | {_minutes(m['warning'])} "
                f"| {_minutes(m['critical'])} "
                f"| {_minutes(q['warning'])} / {_minutes(q['critical'])} "
                f"| {_minutes(s['forecast_shortfall_warning_minutes'])} "
                f"| {lead.get('episodes', 'n/a')} | {first_cell} "
                f"| {_seconds(lead.get('median_seconds'))} "
                f"| {_seconds(lead.get('p90_seconds'))} |"
            )
            first = False
    return "\n".join(lines)


def _rows_by_run(table_text: str) -> tuple[list[str], dict[tuple[str, str], list[str]]]:
    """A Markdown table's header lines and its rows grouped by (trace, cold start).

    In the results table a run's first row names the trace and the rest leave it blank;
    in the timings table every row names it.
    """
    header: list[str] = []
    groups: dict[tuple[str, str], list[str]] = {}
    key: tuple[str, str] | None = None
    for line in table_text.strip().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(header) < 2:
            header.append(line)
            continue
        if cells[0]:
            key = (cells[0], cells[1])
        if key is None:
            raise ValueError(f"a row before any trace: {line!r}")
        groups.setdefault(key, []).append(line)
    return header, groups


def merge_tables(old: str, new: str) -> str:
    """``old`` with the runs that ``new`` has replaced in place (new runs appended)."""
    header, old_groups = _rows_by_run(old)
    _, new_groups = _rows_by_run(new)
    merged = {k: new_groups.get(k, v) for k, v in old_groups.items()}
    merged.update({k: v for k, v in new_groups.items() if k not in merged})
    return "\n".join(header + [line for rows in merged.values() for line in rows])


def merge_section(tbl: str, tim: str) -> str | None:
    """The README's backtest section with only these runs' rows replaced, or ``None``
    when the section is not in the expected shape (two tables split by a "Run times")."""
    text = README.read_text() if README.exists() else ""
    if BEGIN not in text or END not in text:
        return None
    old = text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")
    parts = old.split("\n\nRun times", 1)
    if len(parts) != 2 or "\n\n" not in parts[1]:
        return None
    times_intro, old_tim = parts[1].split("\n\n", 1)
    return (
        f"{merge_tables(parts[0], tbl)}\n\nRun times{times_intro}\n\n{merge_tables(old_tim, tim)}"
    )


def write_readme(section: str) -> None:
    replace_section(BEGIN, END, section, "Backtest", README)


def merge_marked(begin: str, end: str, tbl: str) -> str:
    """The README's table between ``begin`` and ``end`` with only these runs' rows
    replaced (the degradation and drivers tables)."""
    text = README.read_text() if README.exists() else ""
    if begin not in text or end not in text:
        return tbl
    old = text.split(begin, 1)[1].split(end, 1)[0].strip("\n")
    return merge_tables(old, tbl) if old.startswith("|") else tbl


def write_degradation(tbl: str) -> None:
    replace_section(DEGRADATION_BEGIN, DEGRADATION_END, tbl, "Degradation levels", README)


def _sections(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = set(names) - set(SECTIONS)
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"expected some of {', '.join(SECTIONS)}")
    return names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="keep JSON/CSV/PNG here")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", help="substring of the trace names to run")
    parser.add_argument("--no-readme", action="store_true")
    parser.add_argument(
        "--sections",
        type=_sections,
        default=list(SECTIONS),
        help="README sections to rewrite: backtest, degradation (default both)",
    )
    parser.add_argument("extra", nargs="*", help="extra backtest flags (after --)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="prescaler-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    jobs = [
        (n, a, c)
        for n, a in RUNS.items()
        for c in COLD_STARTS
        if args.only is None or args.only in n
    ]
    for name in {n for n, _, _ in jobs}:
        ensure_args(RUNS[name])  # the fetched traces, on first use
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(lambda j: _one(*j, out, args.extra), jobs))
    tbl, tim, deg = table(results), timings(results), degradation_table(results)
    print(tbl)
    print()
    print(tim)
    print()
    print(deg)
    if not args.no_readme and "backtest" in args.sections:
        # A subset (--only) replaces its own rows and keeps the other runs' rows.
        merged = merge_section(tbl, tim) if args.only is not None else None
        if merged is not None:
            write_readme(merged)
        else:
            how = "one run at a time" if args.jobs == 1 else f"{args.jobs} runs in parallel"
            write_readme(f"{tbl}\n\nRun times ({how}, on 2 shared cores):\n\n{tim}")
    if not args.no_readme and "degradation" in args.sections:
        if args.only is not None:
            deg = merge_marked(DEGRADATION_BEGIN, DEGRADATION_END, deg)
        write_degradation(deg)
    drv = drivers_table(results)
    print()
    print(drv)
    if not args.no_readme and "drivers" in args.sections:
        # A subset (--only) replaces its own rows, as in the other tables.
        if args.only is not None:
            drv = merge_marked(DRIVERS_BEGIN, DRIVERS_END, drv)
        replace_section(DRIVERS_BEGIN, DRIVERS_END, drv, "Drivers", README)
    print(f"outputs in {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
