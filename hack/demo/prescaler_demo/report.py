"""After the live run: the HPA on the same demand (the backtest library), scores and the PNG."""

from __future__ import annotations

import csv
import itertools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from prescaler.api import parse_spec
from prescaler.backtest import (
    HPA_TARGET,
    FleetConfig,
    backtest,
    demand_from_trace,
    fluid_queue,
    reactive_policy,
    score,
    simulate,
)
from prescaler.backtest.traces import Trace
from prescaler_demo.scenario import Scenario


@dataclass(frozen=True)
class Sample:
    """One look at the cluster during the live run (every couple of seconds)."""

    t: float
    replicas: int
    """The Deployment's ``spec.replicas`` (what prescaler asked for)."""
    ready: int
    desired: int | None
    """``status.desiredReplicas`` of the pool."""
    standby: int
    """Placeholder pods the pool holds (GPUs held for standby)."""
    forecast_upper: float | None
    """Largest upper-quantile forecast (requests/s) over the plan's lookahead."""
    constraint: str


@dataclass(frozen=True)
class Record:
    """The fleet's per-second record (see :mod:`prescaler_demo.fleet`)."""

    t: np.ndarray
    demand_rps: np.ndarray
    ready: np.ndarray
    capacity_rps: np.ndarray
    waiting: np.ndarray

    @classmethod
    def read(cls, path: Path) -> Record:
        cols: dict[str, list[float]] = {}
        with path.open(newline="") as f:
            for row in csv.DictReader(f):
                for k, v in row.items():
                    cols.setdefault(k, []).append(float(v))

        def arr(name: str) -> np.ndarray:
            return np.asarray(cols.get(name, []), dtype=float)

        return cls(arr("t"), arr("demand_rps"), arr("ready"), arr("capacity_rps"), arr("waiting"))

    def __len__(self) -> int:
        return len(self.t)


HPA_CURVE_TARGETS = tuple(sorted({HPA_TARGET, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1}, reverse=True))
"""The HPA's target utilization, swept on the live stretch from its default (70 %) down:
how much headroom an HPA needs to serve the ramp as well as prescaler did, and at what
cost (the frontier benchmark's question, asked of the demo's minutes)."""


@dataclass(frozen=True)
class HpaPoint:
    """The HPA at one target utilization on the live stretch (simulated)."""

    target: float
    unserved: float
    gpu_hours: float


def matching_hpa(curve: tuple[HpaPoint, ...], unserved: float) -> HpaPoint | None:
    """The cheapest point of the HPA's curve that leaves no more demand waiting than
    ``unserved`` (to a hundredth of a percentage point: both sides are scored on the same
    steps, and a rounding's worth of a late request is not a difference); ``None`` when
    none does, or when ``unserved`` is not a number."""
    if not math.isfinite(unserved):
        return None
    fits = [p for p in curve if p.unserved <= unserved + 1e-4]
    return min(fits, key=lambda p: p.gpu_hours, default=None)


@dataclass(frozen=True)
class Comparison:
    """Prescaler (measured live) and the HPA (simulated on the same demand)."""

    prescaler_unserved: float
    prescaler_gpu_hours: float
    hpa_unserved: float
    hpa_gpu_hours: float
    hpa_t: np.ndarray
    hpa_ready: np.ndarray
    hpa_existing: np.ndarray
    oracle_unserved: float
    oracle_gpu_hours: float
    """The backtest's ``oracle`` (knows the future demand) on the same stretch: about the
    least a fleet that serves it all spends."""
    step_seconds: float = 15.0
    """The simulation's step, on which both sides' unserved share is scored."""
    hpa_curve: tuple[HpaPoint, ...] = ()
    """The HPA at each of :data:`HPA_CURVE_TARGETS` on the same demand."""


def hpa_on_same_demand(sc: Scenario, start: float) -> Comparison:
    """The backtest's ``reactive`` policy (Kubernetes HPA v2 at 70 %) on the live stretch, with
    the same replica capacity, cold start, bounds and starting fleet: the backtest library
    run on the demo's pool. Its ``oracle`` runs beside it, as what serving the stretch costs
    with perfect foresight."""
    o = sc.options
    trace = Trace(start=start, step_seconds=o.seconds_per_step, rps=sc.live_rps.astype(float))
    demand = demand_from_trace(
        trace, prompt_tokens=sc.tokens.prompt, output_tokens=sc.tokens.output
    )
    replica_tokens = sc.replica_rps * sc.tokens_per_request
    config = FleetConfig(
        replica_tokens_per_second=replica_tokens,
        cold_start_seconds=o.cold_start_seconds,
        min_replicas=o.min_replicas,
        max_replicas=o.max_replicas,
        initial_replicas=sc.initial_replicas(),
    )
    spec = parse_spec(yaml.safe_load(sc.pool_yaml("http://prometheus:9090", start))["spec"])
    result = backtest(spec, demand, ["reactive", "oracle"], config=config, degradation=None).result
    (run,) = [r for r in result.runs if r.name == "reactive"]
    s, oracle = result.scores[run.name], result.scores["oracle"]
    curve = []
    for target in HPA_CURVE_TARGETS:
        swept = score(simulate(demand, reactive_policy(config, target), config), demand, config)
        curve.append(HpaPoint(target, swept.unserved_token_fraction, swept.gpu_hours))
    # One more point at the end, so the last step is drawn over its whole width.
    n = len(run.ready_per_step)
    t = demand.start + np.arange(n + 1) * config.step_seconds
    return Comparison(
        prescaler_unserved=float("nan"),
        prescaler_gpu_hours=float("nan"),
        hpa_unserved=s.unserved_token_fraction,
        hpa_gpu_hours=s.gpu_hours,
        hpa_t=t,
        hpa_ready=np.append(run.ready_per_step, run.ready_per_step[-1:]),
        hpa_existing=np.append(run.existing_per_step, run.existing_per_step[-1:]),
        oracle_unserved=oracle.unserved_token_fraction,
        oracle_gpu_hours=oracle.gpu_hours,
        step_seconds=config.step_seconds,
        hpa_curve=tuple(curve),
    )


@dataclass(frozen=True)
class DayScores:
    """The tenant's backfilled week, its last day replayed (the rest warms the forecaster
    up), at the pool's defaults beside two HPAs: at 70 %, and at the target that served the
    live stretch as well as prescaler did. An HPA that serves the ramp pays its headroom all
    day; this is what a day costs each."""

    prescaler: HpaPoint
    """Prescaler at the pool's spec (``policy`` auto), its unserved share and GPU-hours."""
    hpa: HpaPoint
    """The HPA at 70 %."""
    matching: HpaPoint | None
    """The HPA at the target that served the live stretch as well (``None``: none did)."""
    policy: str
    """The policy prescaler ended the day on (``forecast``, ``reactive`` or ``leading``)."""


def day_backtest(sc: Scenario, start: float, matching_target: float | None) -> DayScores:
    """The week of history before ``start`` (the backfilled one) replayed as the operator
    would have planned its last day, on the same fleet as the live stretch."""
    o = sc.options
    history = sc.history_rps.astype(float)
    begin = start - len(history) * o.seconds_per_step
    trace = Trace(start=begin, step_seconds=o.seconds_per_step, rps=history)
    demand = demand_from_trace(
        trace, prompt_tokens=sc.tokens.prompt, output_tokens=sc.tokens.output
    )
    demand = demand.with_replay_days(1 / sc.compression)  # one trace day, compressed
    config = FleetConfig(
        replica_tokens_per_second=sc.replica_rps * sc.tokens_per_request,
        cold_start_seconds=o.cold_start_seconds,
        min_replicas=o.min_replicas,
        max_replicas=o.max_replicas,
    )
    spec = parse_spec(yaml.safe_load(sc.pool_yaml("http://prometheus:9090", start))["spec"])
    run = backtest(spec, demand, ["reactive", "predictive"], config=config, degradation=None)
    scores = run.result.scores

    def point(target: float, name: str) -> HpaPoint:
        s = scores[name]
        return HpaPoint(target, s.unserved_token_fraction, s.gpu_hours)

    matching = None
    if matching_target is not None:
        hpa = reactive_policy(config, matching_target)
        s = score(simulate(demand, hpa, config), demand, config)
        matching = HpaPoint(matching_target, s.unserved_token_fraction, s.gpu_hours)
    chosen = run.policy_json().get("predictive", {}).get("ended_on", "forecast")
    return DayScores(point(0.0, "predictive"), point(HPA_TARGET, "reactive"), matching, chosen)


def prescaler_scores(
    record: Record, samples: list[Sample], step_seconds: float = 15.0
) -> tuple[float, float, float]:
    """Unserved fraction (arrivals not served in the step they came, the backtest's fluid
    queue on the backtest's step, so that it compares with the HPA's), GPU-hours (replicas
    that exist plus placeholders, one GPU each) and the placeholders' share of them."""
    if len(record) < 2:
        return float("nan"), float("nan"), float("nan")
    dt = np.diff(record.t, prepend=record.t[0] - 1.0)
    # The fleet's seconds, summed into the backtest's steps: "served in the step it came"
    # means the same on both sides (on 1 s steps nearly every arrival after a queue forms
    # is late; on 15 s steps the first seconds of each step are not).
    bins = np.floor((record.t - record.t[0]) / step_seconds).astype(int)
    arrivals = np.bincount(bins, weights=record.demand_rps * dt)
    capacity = np.bincount(bins, weights=record.capacity_rps * dt)
    _, late = fluid_queue(arrivals, capacity)
    total = float(np.sum(arrivals))
    unserved = float(late.sum() / total) if total > 0 else 0.0
    gpu_seconds = standby_seconds = 0.0
    for a, b in itertools.pairwise(samples):
        gpu_seconds += (a.replicas + a.standby) * (b.t - a.t)
        standby_seconds += a.standby * (b.t - a.t)
    return unserved, gpu_seconds / 3600, standby_seconds / 3600


def plot(
    path: Path,
    sc: Scenario,
    start: float,
    record: Record,
    samples: list[Sample],
    hpa: Comparison,
    window: tuple[float, float],
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def minutes(t: np.ndarray) -> np.ndarray:
        return (np.asarray(t, dtype=float) - start) / 60

    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(10, 6.4), sharex=True, gridspec_kw={"height_ratios": [3, 2]}
    )
    r = sc.replica_rps
    top.plot(minutes(record.t), record.demand_rps, color="black", lw=1.8, label="demand (trace)")
    top.step(
        minutes(record.t), record.capacity_rps, where="post", color="tab:blue", lw=1.8,
        label="prescaler: ready capacity (live)",
    )  # fmt: skip
    top.step(
        minutes(hpa.hpa_t), hpa.hpa_ready * r, where="post", color="tab:red", lw=1.4, ls="--",
        label="HPA (70 %): ready capacity (simulated, same demand)",
    )  # fmt: skip
    fc = [(s.t, s.forecast_upper) for s in samples if s.forecast_upper is not None]
    if fc:
        ft, fv = zip(*fc, strict=True)
        top.plot(minutes(np.asarray(ft)), fv, color="tab:blue", lw=0.9, ls=":",
                 label="prescaler: forecast upper over the lead time")  # fmt: skip
    for ax in (top, bottom):
        ax.axvspan(*minutes(np.asarray(window)), color="orange", alpha=0.15)
    top.text(minutes(np.asarray([window[0]]))[0], top.get_ylim()[1] * 0.95, " scheduled window",
             va="top", fontsize=8, color="darkorange")  # fmt: skip
    top.set_ylabel("requests/s")
    top.legend(loc="upper left", fontsize=8)
    comp = sc.compression
    top.set_title(
        f"{sc.stretch.trace.name}: {sc.stretch.trace_time(sc.stretch.start_index)} onwards, "
        f"played {comp:g}x faster; cold start {sc.options.cold_start_seconds:g} s",
        fontsize=10,
    )
    st = np.asarray([s.t for s in samples])
    bottom.step(minutes(st), [s.replicas for s in samples], where="post", color="tab:blue",
                lw=1.2, ls="--", label="prescaler: replicas")  # fmt: skip
    bottom.step(minutes(st), [s.ready for s in samples], where="post", color="tab:blue",
                lw=1.8, label="prescaler: ready")  # fmt: skip
    bottom.step(minutes(hpa.hpa_t), hpa.hpa_existing, where="post", color="tab:red", lw=1.0,
                ls="--", label="HPA: replicas")  # fmt: skip
    bottom.step(minutes(hpa.hpa_t), hpa.hpa_ready, where="post", color="tab:red", lw=1.4,
                label="HPA: ready")  # fmt: skip
    bottom.set_ylabel("replicas")
    bottom.set_xlim(0, (max(record.t[-1], hpa.hpa_t[-1]) - start) / 60)
    bottom.set_xlabel("minutes since the live play started (wall clock)")
    bottom.legend(loc="upper left", fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
