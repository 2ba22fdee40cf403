"""Known-events benchmark: a one-day 3-6x event inserted into a real trace, replayed through
``prescaler backtest`` with the event declared as a scheduled window and without.

Run from the project root (the traces live in ``../shared/traces``)::

    .venv/bin/python benchmarks/event_benchmark.py                 # all runs, updates README
    .venv/bin/python benchmarks/event_benchmark.py --only nab --multipliers 6 --no-readme

For each trace and event multiplier ``M`` it:

1. reads the trace and scales it so that the peak minute of its replayed days needs exactly
   40 replicas of 20,000 tokens/s *before* the event is inserted (what
   ``--scale-to-peak-replicas 40`` does on the original trace), so the event really needs up
   to ``M`` x the normal peak's capacity;
2. multiplies one day of it by ``M`` with a linear ramp (90 minutes up from the event's
   start, a plateau, 90 minutes down to its end), and writes the result in the trace's own
   format to ``--out`` (a temporary directory by default; nothing is written to the repo);
3. replays it at the product defaults (no policy flags: the InferencePool spec's defaults),
   240 s cold start, ``--max-replicas 2 x M x 40``: once with ``reactive,predictive,oracle``
   and no window, once with ``predictive`` and the event declared as a dated window
   (``rps`` = the event's peak request rate, ``lead`` = 30 minutes);
4. scores the window ``[start, end)`` and the window with its pre-warm lead on their own
   (``--score-span``) and rewrites only the part of ``benchmarks/README.md`` between the
   ``events:begin``/``events:end`` markers.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from _readme import replace_section  # the scripts run with benchmarks/ on sys.path

ROOT = Path(__file__).resolve().parents[1]
TRACES = Path("../shared/traces")
README = ROOT / "benchmarks" / "README.md"
BEGIN, END = "<!-- events:begin -->", "<!-- events:end -->"
COLD_START = 240
REPLICA_TPS = 20000.0
PEAK_REPLICAS = 40
LEAD_SECONDS = 1800
RAMP_MINUTES = 90
SG = TRACES / "servegen_m_small" / "language__m-small"


@dataclass(frozen=True)
class Scenario:
    label: str
    path: Path
    fmt: str
    prompt_tokens: float
    output_tokens: float
    replay_days: float
    event_start: str
    """Naive ISO time (the traces' clock, read as UTC) the ramp up begins."""
    history_days: float | None = None


SCENARIOS = {
    # NYC taxi: 30-min bins over 7 months; the last 14 days replayed with 35 days of history
    # (as the backtest table does), the event on a Thursday clear of the late-January
    # blizzard that NAB labels as an anomaly.
    "nab": Scenario(
        label="nab taxi (last 14 d)",
        path=TRACES / "nab_nyc_taxi" / "nyc_taxi.csv",
        fmt="nab",
        prompt_tokens=1000.0,
        output_tokens=200.0,
        replay_days=14.0,
        history_days=35.0,
        event_start="2015-01-22T09:00:00",
    ),
    # ServeGen: 10-min bins over 14 days; the last 7 replayed, the event on the Wednesday.
    # Mean lengths are the ServeGen pdfs' means (119.7 prompt, 14.9 output tokens) so that
    # demand is the rate times a constant and the pre-scaling is exact.
    "servegen": Scenario(
        label="servegen (last 7 d)",
        path=Path(f"{SG}_aggregate_rate_10min.csv"),
        fmt="servegen",
        prompt_tokens=119.67,
        output_tokens=14.89,
        replay_days=7.0,
        event_start="2024-01-10T10:00:00",
    ),
}


def event_factor(
    times: np.ndarray,
    start: float,
    multiplier: float,
    ramp_seconds: float,
    length_seconds: float = 86400.0,
) -> np.ndarray:
    """``1`` outside ``[start, start + length)``, rising linearly to ``multiplier`` over
    ``ramp_seconds``, flat, and falling back to ``1`` over the last ``ramp_seconds``."""
    t = np.asarray(times, dtype=float) - start
    up = np.clip(t / ramp_seconds, 0.0, 1.0)
    down = np.clip((length_seconds - t) / ramp_seconds, 0.0, 1.0)
    return np.asarray(1.0 + (multiplier - 1.0) * np.minimum(up, down), dtype=float)


def _scale_factor(sc: Scenario) -> tuple[float, Any]:
    """The demand scale that ``--scale-to-peak-replicas 40`` applies to the original trace."""
    from prescaler.backtest import demand_from_trace, peak_factor
    from prescaler.backtest.traces import load_trace

    trace = load_trace(sc.path, sc.fmt)
    demand = demand_from_trace(
        trace, prompt_tokens=sc.prompt_tokens, output_tokens=sc.output_tokens
    ).with_replay_days(sc.replay_days)
    peak = float(demand.replay_tokens_per_s.max())
    # One part in 1e9 below, so that writing and re-reading the file cannot round the
    # pre-event peak up to a 41st replica.
    return peak_factor(peak, PEAK_REPLICAS, REPLICA_TPS) * (1 - 1e-9), trace


def write_event_trace(sc: Scenario, multiplier: float, out: Path) -> dict[str, Any]:
    """Write the scaled trace with the event; return where it is and what the event needs."""
    factor, trace = _scale_factor(sc)
    start = pd.Timestamp(sc.event_start, tz="UTC").timestamp()
    end = start + 86400.0
    times = trace.times()
    mid = times + trace.step_seconds / 2  # a bin's factor is taken at its middle
    rps = np.asarray(trace.rps, dtype=float) * factor
    rps = rps * event_factor(mid, start, multiplier, RAMP_MINUTES * 60.0)
    ok = np.isfinite(rps)
    path = out / f"{sc.path.stem}-event-x{multiplier:g}.csv"
    if sc.fmt == "nab":
        stamps = pd.to_datetime(times[ok], unit="s").strftime("%Y-%m-%d %H:%M:%S")
        frame = pd.DataFrame({"timestamp": stamps, "value": rps[ok] * trace.step_seconds})
    else:  # servegen: seconds since its epoch; a zero rate marks a collection gap
        from prescaler.backtest.traces import SERVEGEN_EPOCH

        frame = pd.DataFrame(
            {
                "t_sec": np.rint(times - SERVEGEN_EPOCH).astype(np.int64),
                "rate_rps": np.where(ok, rps, 0.0),
            }
        )
    frame.to_csv(path, index=False, float_format="%.10g")
    inside = ok & (mid >= start) & (mid < end)
    peak_rps = float(rps[inside].max())
    tokens = sc.prompt_tokens + sc.output_tokens
    return {
        "path": path,
        "start": start,
        "end": end,
        "peak_rps": peak_rps,
        "peak_replicas": math.ceil(peak_rps * tokens / REPLICA_TPS - 1e-9),
        "scale": factor,
    }


def _iso(t: float) -> str:
    return pd.Timestamp(t, unit="s", tz="UTC").strftime("%Y-%m-%dT%H:%M:%S")


def commands(
    sc: Scenario, multiplier: float, event: dict[str, Any], out: Path
) -> dict[str, list[str]]:
    start, end = event["start"], event["end"]
    base = [
        "--trace",
        str(event["path"]),
        "--format",
        sc.fmt,
        "--prompt-tokens",
        f"{sc.prompt_tokens:g}",
        "--output-tokens",
        f"{sc.output_tokens:g}",
        "--replay-days",
        f"{sc.replay_days:g}",
        *(["--history-days", f"{sc.history_days:g}"] if sc.history_days else []),
        "--cold-start-seconds",
        str(COLD_START),
        "--replica-tokens-per-second",
        f"{REPLICA_TPS:g}",
        "--max-replicas",
        str(math.ceil(2 * multiplier * PEAK_REPLICAS)),
        "--score-span",
        f"name=window,start={_iso(start)},end={_iso(end)}",
        "--score-span",
        f"name=lead+window,start={_iso(start - LEAD_SECONDS)},end={_iso(end)}",
        "--quiet",
    ]
    window = (
        f"name=event,start={_iso(start)},end={_iso(end)},"
        f"rps={event['peak_rps']:.6g},lead={LEAD_SECONDS}"
    )
    stem = out / f"{sc.fmt}-x{multiplier:g}"
    return {
        "no window": [
            *base,
            "--policies",
            "reactive,predictive,oracle",
            "--json",
            f"{stem}-nowindow.json",
        ],
        "window": [
            *base,
            "--policies",
            "predictive",
            "--window",
            window,
            "--json",
            f"{stem}-window.json",
        ],
    }


def _run(cmd: list[str]) -> tuple[dict[str, Any], float]:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "prescaler.cli", "backtest", *cmd], cwd=ROOT, check=True)
    elapsed = time.perf_counter() - t0
    json_out = cmd[cmd.index("--json") + 1]
    return json.loads(Path(json_out).read_text()), elapsed


def run_scenario(key: str, multiplier: float, out: Path) -> dict[str, Any]:
    sc = SCENARIOS[key]
    event = write_event_trace(sc, multiplier, out)
    cmds = commands(sc, multiplier, event, out)
    bodies: dict[str, dict[str, Any]] = {}
    walls: dict[str, float] = {}
    for variant, cmd in cmds.items():
        bodies[variant], walls[variant] = _run(cmd)
        print(
            f"done: {sc.label} x{multiplier:g} {variant} in {walls[variant]:.0f}s", file=sys.stderr
        )
    return {
        "key": key,
        "scenario": sc,
        "multiplier": multiplier,
        "event": event,
        "bodies": bodies,
        "walls": walls,
        "commands": cmds,
    }


ROWS = (
    ("reactive", "no window", "reactive (HPA)"),
    ("predictive", "no window", "predictive, no window"),
    ("predictive", "window", "predictive + window"),
    ("oracle", "no window", "oracle"),
)


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| trace | event | policy | shortfall min in window | unserved frac in window "
        "| GPU-h lead + window | ÷ oracle | shortfall min, whole replay "
        "| unserved frac, whole replay | GPU-h ÷ oracle, whole replay |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        ev = r["event"]
        oracle = r["bodies"]["no window"]
        o_span = oracle["spans"]["lead+window"]["policies"]["oracle"]["gpu_hours"]
        o_all = oracle["policies"]["oracle"]["gpu_hours"]
        for i, (policy, variant, label) in enumerate(ROWS):
            body = r["bodies"][variant]
            inside = body["spans"]["window"]["policies"][policy]
            lead = body["spans"]["lead+window"]["policies"][policy]
            whole = body["policies"][policy]
            first = i == 0
            name = r["scenario"].label if first else ""
            size = f"{r['multiplier']:g}x, peak {ev['peak_replicas']} replicas" if first else ""
            lines.append(
                f"| {name} | {size} "
                f"| {label} | {inside['shortfall_minutes']} "
                f"| {inside['unserved_token_fraction']:.4f} | {lead['gpu_hours']:.1f} "
                f"| {lead['gpu_hours'] / o_span:.2f} | {whole['shortfall_minutes']} "
                f"| {whole['unserved_token_fraction']:.4f} | {whole['gpu_hours'] / o_all:.2f} |"
            )
    return "\n".join(lines)


def section(results: list[dict[str, Any]], out: Path, wall: float, jobs: int) -> str:
    example = results[0]
    shown = []
    for variant in ("no window", "window"):
        argv = [str(a).replace(str(out), "$OUT") for a in example["commands"][variant]]
        shown.append(
            "prescaler backtest "
            + " ".join(a if a.startswith("$OUT/") else shlex.quote(a) for a in argv)
        )
    events = "\n".join(
        f"- {r['scenario'].label}, {r['multiplier']:g}x: {_iso(r['event']['start'])} to "
        f"{_iso(r['event']['end'])} UTC, declared `rps={r['event']['peak_rps']:.6g}` "
        f"(the event's peak; {r['event']['peak_replicas']} replicas of 20,000 tokens/s)"
        for r in results
    )
    runs = "\n".join(
        f"| {r['scenario'].label} | {r['multiplier']:g}x | {r['walls']['no window']:.0f} "
        f"| {r['walls']['window']:.0f} |"
        for r in results
    )
    how = "one run at a time" if jobs == 1 else f"{jobs} scenarios in parallel"
    return (
        f"{table(results)}\n\n"
        f"Events:\n\n{events}\n\n"
        "The commands for the first row group (`$OUT` is the output directory holding the "
        "generated trace):\n\n"
        "```sh\n.venv/bin/python benchmarks/event_benchmark.py\n" + "\n".join(shown) + "\n```\n\n"
        f"Run times ({how}, on 2 shared cores; whole benchmark {wall / 60:.1f} min):\n\n"
        "| trace | event | no window: reactive, predictive, oracle (s) "
        "| window: predictive (s) |\n|---|---|---:|---:|\n"
        f"{runs}"
    )


def write_readme(text_block: str) -> None:
    replace_section(BEGIN, END, text_block, "Known events", README)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, help="keep the generated traces and JSON here")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", choices=sorted(SCENARIOS), help="one trace")
    parser.add_argument("--multipliers", default="3,6", help="event sizes, e.g. 3,6")
    parser.add_argument("--no-readme", action="store_true")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="prescaler-events-"))
    out.mkdir(parents=True, exist_ok=True)
    out = out.resolve()
    multipliers = [float(m) for m in args.multipliers.split(",") if m.strip()]
    jobs = [(k, m) for k in SCENARIOS for m in multipliers if args.only in (None, k)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(lambda j: run_scenario(*j, out), jobs))
    wall = time.perf_counter() - t0
    text = section(results, out, wall, args.jobs)
    print(text)
    if not args.no_readme:
        write_readme(text)
    print(f"outputs in {out}; {wall:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
