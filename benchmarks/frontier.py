"""Frontier benchmark: each policy's main knob swept; unserved tokens against GPU-hours.

Run from the project root (the traces live in ``../shared/traces``)::

    .venv/bin/python benchmarks/frontier.py                 # every trace, 240 s and 600 s
    .venv/bin/python benchmarks/frontier.py --only servegen --cold 240

For each trace and cold start it replays the held-out part of the trace (the part no knob
or default was tuned on: the second half of ServeGen, NAB's last 28 days) once per knob
value, in-process through the same code ``prescaler backtest`` runs (its ``prepare``, and
``prescaler.backtest.build_policies`` on the flags' spec and options):

* reactive: the HPA target, 0.5 to 0.9 (0.7 is the brief's baseline);
* persistence: ``k`` x the demand seen now;
* predictive: its one objective knob, ``spec.objective.servedFraction`` (the share of
  demand to serve without waiting for capacity), the product's defaults otherwise (the
  default point is the spec's own). Forecasts do not depend on this knob, so they are
  computed once per trace and replayed for every value;
* smoothed-oracle: ``k`` x the future's centred 31-minute mean (the predictable-part bound).

Besides the shared traces it replays two generated minute-level traces
(``benchmarks/synthetic_traces.py``, fixed seeds), written to a temporary directory.

It writes one PNG per (trace, cold start) (unserved-token fraction against GPU-hours /
oracle, each policy's default point marked, the target's region shaded) and rewrites the part of
``benchmarks/README.md`` between the ``frontier:begin``/``frontier:end`` markers with the
points and, relative to the HPA at target 0.7:

* (a) the GPU-hours predictive needs to match the HPA's unserved fraction, / the HPA's;
* (b) predictive's unserved fraction at the HPA's GPU-hours, / the HPA's;
* what each policy leaves unserved at the target's GPU-hours (``TARGET_GPU``: 0.95 x the
  HPA's), / the HPA's: how far a curve is from the target, and whether knowing the
  future's mean (the smoothed oracle) would reach it.

All are read off the curves by linear interpolation between swept points. The points are
kept in ``benchmarks/frontier/points.json``; ``--from-points`` rewrites the tables and
plots from it without replaying.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from _readme import replace_section  # the scripts run with benchmarks/ on sys.path

ROOT = Path(__file__).resolve().parents[1]
TRACES = Path("../shared/traces")
README = ROOT / "benchmarks" / "README.md"
PLOTS = ROOT / "benchmarks" / "frontier"
POINTS = PLOTS / "points.json"
BEGIN, END = "<!-- frontier:begin -->", "<!-- frontier:end -->"

COMMON = ["--replica-tokens-per-second", "20000", "--scale-to-peak-replicas", "40", "--quiet"]
SG = TRACES / "servegen_m_small" / "language__m-small"
RUNS: dict[str, list[str]] = {
    "servegen (last 7 of 14 d)": [
        "--trace", f"{SG}_aggregate_rate_10min.csv", "--format", "servegen",
        "--token-mix", f"{SG}_input_tokens_pdf.csv.gz", "--replay-days", "7",
    ],
    "nab taxi (last 28 d)": [
        "--trace", str(TRACES / "nab_nyc_taxi" / "nyc_taxi.csv"), "--format", "nab",
        "--prompt-tokens", "1000", "--output-tokens", "200", "--replay-days", "28",
        "--history-days", "35",
    ],
}  # fmt: skip
COLD_STARTS = (240, 600)

HPA_TARGETS = (0.5, 0.6, 0.7, 0.8, 0.9)
PERSISTENCE_K = (1.1, 1.2, 1.3, 1.4, 1.6, 1.8)
SMOOTHED_K = (1.0, 1.1, 1.2, 1.3, 1.4, 1.6)
SERVED = (0.99, 0.999, 0.9995, 0.9999, 0.99995)
TARGET_GPU = 0.95
"""The target's GPU-hours, as a share of the HPA's (its unserved target is 0.7 x the HPA's)."""


@dataclass(frozen=True)
class Point:
    policy: str
    knob: str
    value: float
    default: bool
    unserved: float
    gpu_hours: float
    shortfall_minutes: int


class CachedForecaster:
    """Replays the forecasts of the first run: knobs that only the planner reads do not
    change them, so one forecasting pass serves a whole sweep."""

    def __init__(self, inner: Any, store: dict[int, Any]) -> None:
        self.inner, self.store = inner, store

    def forecast(self, history: Any, now: float) -> Any:
        # The history is a sliding window (the spec's lookback): key on its newest minute.
        key = history.index[-1].value if len(history) else 0
        if key not in self.store:
            self.store[key] = self.inner.forecast(history, now)
        return self.store[key]


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    from prescaler.cli import build_parser

    return build_parser().parse_args(["backtest", *argv])


def sweep(name: str, trace_args: list[str], cold: int) -> list[Point]:
    from prescaler.api import ObjectiveSpec
    from prescaler.backtest import build_policies, score, simulate
    from prescaler.cli._backtest_spec import pool_spec, replay_options
    from prescaler.cli.backtest import prepare

    base = [*trace_args, *COMMON, "--cold-start-seconds", str(cold)]
    args = _parse([*base, "--policies", "oracle"])
    prep = prepare(args)
    points: list[Point] = []

    def replay(policy: Any) -> tuple[float, float, int]:
        run = simulate(prep.demand, policy, prep.config)
        s = score(run, prep.demand, prep.config)
        return s.unserved_token_fraction, s.gpu_hours, s.shortfall_minutes

    def one(policy_name: str, extra: list[str]) -> Any:
        # The library's policy for these flags, on the trace prepare() read once.
        ns = _parse([*base, "--policies", policy_name, *extra])
        options = replay_options(ns, windows=prep.windows, forecast_step=args.forecast_step)
        spec = pool_spec(ns, prep.config)
        return build_policies(
            spec,
            prep.demand,
            [policy_name],
            capacity=prep.capacity,
            config=prep.config,
            options=options,
        )[0]

    started = time.perf_counter()
    oracle = replay(one("oracle", []))
    points.append(Point("oracle", "", 0.0, True, *oracle))
    for t in HPA_TARGETS:
        r = replay(one("reactive", ["--hpa-target", str(t)]))
        points.append(Point("reactive", "target", t, t == 0.7, *r))
    for k in PERSISTENCE_K:
        r = replay(one("persistence", ["--persistence-k", str(k)]))
        points.append(Point("persistence", "k", k, k == 1.4, *r))
    for k in SMOOTHED_K:
        r = replay(one("smoothed-oracle", ["--smoothed-oracle-k", str(k)]))
        points.append(Point("smoothed-oracle", "k", k, k == 1.0, *r))
    default_served = ObjectiveSpec.model_fields["served_fraction"].default
    store: dict[int, Any] = {}
    for f in sorted({*SERVED, default_served}):
        policy = one("predictive", ["--served-fraction", str(f)])
        policy = replace(policy, forecaster=CachedForecaster(policy.forecaster, store))
        r = replay(policy)
        points.append(Point("predictive", "served", f, f == default_served, *r))
    print(f"{name} {cold}s: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return points


def _interp(x: np.ndarray, y: np.ndarray, at: float) -> float | None:
    """Linear interpolation of ``y(x)`` at ``at`` (``x`` sorted ascending); ``None``
    outside the swept range."""
    if len(x) < 2 or not (x[0] <= at <= x[-1]):
        return None
    return float(np.interp(at, x, y))


def headline(points: list[Point]) -> tuple[float | None, float | None]:
    """(a) GPU-hours predictive needs for the HPA's unserved fraction / the HPA's, and
    (b) predictive's unserved fraction at the HPA's GPU-hours / the HPA's."""
    hpa = next(p for p in points if p.policy == "reactive" and p.default)
    pred = sorted((p for p in points if p.policy == "predictive"), key=lambda p: p.gpu_hours)
    gpu = np.array([p.gpu_hours for p in pred])
    uns = np.array([p.unserved for p in pred])
    if hpa.unserved <= 0:  # nothing to interpolate to: the cheapest point with none either
        zero = [p.gpu_hours for p in pred if p.unserved <= 0]
        return (min(zero) / hpa.gpu_hours if zero else None), None
    # Unserved falls as GPU-hours grow; interpolate GPU-hours on the decreasing curve.
    order = np.argsort(uns)
    need = _interp(uns[order], gpu[order], hpa.unserved)
    at = _interp(gpu, uns, hpa.gpu_hours)
    a = None if need is None else need / hpa.gpu_hours
    b = None if at is None or hpa.unserved <= 0 else at / hpa.unserved
    return a, b


def at_gpu(points: list[Point], policy: str, share: float = TARGET_GPU) -> float | None:
    """``policy``'s unserved fraction at ``share`` x the HPA's GPU-hours, / the HPA's
    unserved fraction (``None`` outside the swept range or when the HPA left none). When
    every swept point is cheaper than that, the dearest point's: an upper bound."""
    hpa = next(p for p in points if p.policy == "reactive" and p.default)
    own = sorted((p for p in points if p.policy == policy), key=lambda p: p.gpu_hours)
    at = _interp(
        np.array([p.gpu_hours for p in own]),
        np.array([p.unserved for p in own]),
        share * hpa.gpu_hours,
    )
    if at is None and own and own[-1].gpu_hours < share * hpa.gpu_hours:
        at = own[-1].unserved  # every swept point is cheaper: at most the dearest one's
    return None if at is None or hpa.unserved <= 0 else at / hpa.unserved


def plot(name: str, cold: int, points: list[Point], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    oracle = next(p for p in points if p.policy == "oracle").gpu_hours
    fig, ax = plt.subplots(figsize=(7, 4.5))
    styles = {
        "reactive": ("tab:red", "o"),
        "persistence": ("tab:gray", "s"),
        "predictive": ("tab:blue", "D"),
        "smoothed-oracle": ("tab:green", "^"),
    }
    for policy, (color, marker) in styles.items():
        own = sorted((p for p in points if p.policy == policy), key=lambda p: p.gpu_hours)
        xs = [p.gpu_hours / oracle for p in own]
        ys = [max(p.unserved, 1e-6) for p in own]
        ax.plot(xs, ys, marker=marker, color=color, label=policy, linewidth=1, markersize=4)
        for p in own:
            if p.default:
                ax.plot(
                    p.gpu_hours / oracle,
                    max(p.unserved, 1e-6),
                    marker="*",
                    color=color,
                    markersize=16,
                    markeredgecolor="black",
                )
    hpa = next(p for p in points if p.policy == "reactive" and p.default)
    if hpa.unserved > 0:  # the target: at most 0.7 x its unserved at TARGET_GPU x its cost
        ax.fill_between(
            [ax.get_xlim()[0], TARGET_GPU * hpa.gpu_hours / oracle],
            1e-6,
            0.7 * hpa.unserved,
            color="gold",
            alpha=0.25,
            label=f"target: <= 0.7 x the HPA's unserved at <= {TARGET_GPU:g} x its GPU-h",
        )
    ax.set_yscale("log")
    ax.set_xlabel("GPU-hours / oracle")
    ax.set_ylabel("unserved token fraction (log)")
    ax.set_title(f"{name}, cold start {cold} s (stars: default points)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fmt(x: float | None) -> str:
    return "out of the swept range" if x is None else f"{x:.2f}"


def section(results: list[tuple[str, int, list[Point], Path]]) -> str:
    lines = [
        "| trace | cold start | (a) GPU-h to match the HPA's unserved ÷ HPA | "
        "(b) unserved at the HPA's GPU-h ÷ HPA | predictive default: unserved ÷ HPA | "
        "GPU-h ÷ HPA |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, cold, points, _ in results:
        a, b = headline(points)
        hpa = next(p for p in points if p.policy == "reactive" and p.default)
        d = next(p for p in points if p.policy == "predictive" and p.default)
        ratio = d.unserved / hpa.unserved if hpa.unserved > 0 else math.inf
        lines.append(
            f"| {name} | {cold} s | {_fmt(a)} | {_fmt(b)} | {ratio:.2f} "
            f"| {d.gpu_hours / hpa.gpu_hours:.3f} |"
        )
    out = ["\n".join(lines), ""]
    out.append(
        f"Unserved tokens ÷ the HPA's at {TARGET_GPU:g} × the HPA's GPU-hours (the target is "
        "0.7 × or less), per policy:"
    )
    out.append("")
    out.append("| trace | cold start | predictive | persistence | smoothed oracle | HPA |")
    out.append("|---|---|---:|---:|---:|---:|")
    for name, cold, points, _ in results:
        cells = [
            _fmt(at_gpu(points, policy))
            for policy in ("predictive", "persistence", "smoothed-oracle", "reactive")
        ]
        out.append(f"| {name} | {cold} s | " + " | ".join(cells) + " |")
    out.append("")
    for name, cold, points, path in results:
        oracle = next(p for p in points if p.policy == "oracle").gpu_hours
        link = path.relative_to(README.parent)
        out.append(f"**{name}, cold start {cold} s** ([plot]({link}))")
        out.append("")
        out.append("| policy | knob | unserved token frac | GPU-h / oracle | shortfall min |")
        out.append("|---|---|---:|---:|---:|")
        for p in points:
            if p.policy == "oracle":
                continue
            knob = f"{p.knob} {p.value:g}" + (" (default)" if p.default else "")
            out.append(
                f"| {p.policy} | {knob} | {p.unserved:.5f} | {p.gpu_hours / oracle:.3f} "
                f"| {p.shortfall_minutes} |"
            )
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def write_readme(text: str) -> None:
    replace_section(BEGIN, END, text, "Frontier", README)


def synthetic_runs(out: Path) -> dict[str, list[str]]:
    """The generated minute-level traces (``benchmarks/synthetic_traces.py``) as runs."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from synthetic_traces import write

    return {
        f"{name} (synthetic, last 7 of 14 d)": [
            "--trace", str(path), "--format", "rate", "--prompt-tokens", "1000",
            "--output-tokens", "200", "--replay-days", "7",
        ]
        for name, path in write(out).items()
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="substring of the trace names to run")
    parser.add_argument("--cold", type=int, action="append", help="cold start(s) in seconds")
    parser.add_argument("--no-readme", action="store_true")
    parser.add_argument(
        "--from-points", action="store_true", help=f"no replay: tables and plots from {POINTS}"
    )
    args = parser.parse_args()
    whole = args.only is None and args.cold is None
    swept: list[tuple[str, int, list[Point]]] = []
    if args.from_points:
        for run in json.loads(POINTS.read_text()):
            swept.append((run["trace"], run["cold"], [Point(**p) for p in run["points"]]))
    else:
        runs = {**RUNS, **synthetic_runs(Path(tempfile.mkdtemp(prefix="prescaler-traces-")))}
        for name, trace_args in runs.items():
            if args.only is not None and args.only not in name:
                continue
            for cold in args.cold or COLD_STARTS:
                swept.append((name, cold, sweep(name, trace_args, cold)))
        if whole:
            runs_json = [
                {"trace": n, "cold": c, "points": [asdict(p) for p in pts]} for n, c, pts in swept
            ]
            POINTS.write_text(json.dumps(runs_json, indent=1) + "\n")
    results = []
    for name, cold, points in swept:
        path = PLOTS / (name.split(" ")[0] + f"-{cold}.png")
        plot(name, cold, points, path)
        results.append((name, cold, points, path))
    text = section(results)
    print(text)
    if not args.no_readme and (whole or args.from_points):
        write_readme(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
