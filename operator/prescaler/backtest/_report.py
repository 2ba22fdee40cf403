"""Run several policies over one demand and write the JSON, the timeline CSV and the plots."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from prescaler.backtest._demand import MINUTE, Demand
from prescaler.backtest._levels import (
    NOT_SIMULATED,
    DegradationRun,
    DegradationSetup,
    assess_fleet,
)
from prescaler.backtest._policies import Policy
from prescaler.backtest._simulate import (
    FleetConfig,
    PolicyRun,
    Progress,
    Score,
    score,
    simulate,
    span_score,
    timeline,
)


@dataclass(frozen=True)
class BacktestResult:
    demand: Demand
    config: FleetConfig
    runs: tuple[PolicyRun, ...]
    scores: dict[str, Score]
    degradation: dict[str, DegradationRun] = field(default_factory=dict)
    """Each fleet's degradation levels (empty unless the run assessed them)."""
    degradation_setup: DegradationSetup | None = None
    forecasts_from: str | None = None
    """The policy whose forecasts every fleet was assessed with (``None``: no forecast)."""
    degradation_seconds: float = 0.0
    """Wall time of the assessments."""

    def timeline(self) -> pd.DataFrame:
        return timeline(self.demand, list(self.runs), self.config)

    def span_scores(self, start: float, end: float) -> dict[str, dict[str, float | int]]:
        """Each policy's :func:`span_score` over ``[start, end)`` (unix seconds), on whole
        replayed minutes (a partial minute at either end counts)."""
        origin = self.demand.replay_start
        first = math.floor((start - origin) / MINUTE)
        last = math.ceil((end - origin) / MINUTE)
        return {r.name: span_score(r, self.demand, self.config, first, last) for r in self.runs}

    def ratios(self) -> dict[str, float | None]:
        def ratio(a: float, b: float) -> float | None:
            if b == 0:
                return None if a else 1.0
            return a / b

        out: dict[str, float | None] = {}
        s = self.scores
        if "predictive" in s and "reactive" in s:
            out["shortfall_predictive_over_reactive"] = ratio(
                s["predictive"].shortfall_minutes, s["reactive"].shortfall_minutes
            )
        if "predictive" in s and "oracle" in s:
            out["gpu_hours_predictive_over_oracle"] = ratio(
                s["predictive"].gpu_hours, s["oracle"].gpu_hours
            )
        return out

    def to_json(
        self, *, trace: str, fmt: str, extra: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        d = self.demand
        cfg = self.config
        body: dict[str, Any] = {
            "trace": trace,
            "format": fmt,
            "cold_start_seconds": cfg.cold_start_seconds,
            "minutes": len(self.runs[0].ready_per_step) // cfg.steps_per_minute
            if self.runs
            else len(d),
            "start": pd.Timestamp(d.replay_start, unit="s", tz="UTC").isoformat(),
            "warmup_minutes": d.replay_from,
            "replica_tokens_per_s": cfg.replica_tokens_per_second,
            "gpus_per_replica": cfg.gpus_per_replica,
            "min_replicas": cfg.min_replicas,
            "max_replicas": cfg.max_replicas,
            "mean_prompt_tokens": d.prompt_tokens,
            "mean_output_tokens": d.output_tokens,
            "peak_demand_tokens_per_s": float(np.max(d.replay_tokens_per_s)),
            "policies": {name: self._policy_json(name, sc) for name, sc in self.scores.items()},
            "ratios": self.ratios(),
            "runtime_seconds": {r.name: round(r.seconds, 3) for r in self.runs},
        }
        setup = self.degradation_setup
        if setup is not None:
            body["degradation"] = {
                "assess_every_seconds": setup.every_seconds,
                "forecasts_from": self.forecasts_from,
                "lead_window_seconds": setup.lead_window_seconds,
                "not_simulated": list(NOT_SIMULATED),
                "seconds": round(self.degradation_seconds, 3),
            }
        if extra:
            body.update(extra)
        return body

    def _policy_json(self, name: str, sc: Score) -> dict[str, Any]:
        out: dict[str, Any] = dict(sc.as_dict())
        if name in self.degradation:
            out["degradation"] = self.degradation[name].as_dict()
        return out


def run_backtest(
    demand: Demand,
    policies: Sequence[Policy],
    config: FleetConfig,
    *,
    progress: Progress | None = None,
    degradation: DegradationSetup | None = None,
) -> BacktestResult:
    """Replay ``demand`` under each policy and score it; with ``degradation``, also assess
    every fleet's degradation level (see :mod:`._levels`) on the forecasts of the first
    policy that has a forecaster (the predictive one)."""
    every = degradation.every_seconds if degradation is not None else None
    runs = tuple(
        simulate(demand, p, config, progress=progress, signals_every_seconds=every)
        for p in policies
    )
    scores = {r.name: score(r, demand, config) for r in runs}
    levels: dict[str, DegradationRun] = {}
    source: str | None = None
    t0 = time.perf_counter()
    if degradation is not None:
        recorded = [(r.name, r.signals) for r in runs if r.signals is not None]
        forecasting = [(n, sig) for n, sig in recorded if sig.forecasts is not None]
        forecasts = forecasting[0][1].forecasts if forecasting else None
        source = forecasting[0][0] if forecasting else None
        for name, sig in recorded:
            if forecasting and not np.array_equal(sig.times, forecasting[0][1].times):
                raise ValueError(f"{name}: assessed at other times than {source}")
            levels[name] = assess_fleet(
                name, sig, forecasts, degradation, config.cold_start_seconds
            )
    return BacktestResult(
        demand=demand,
        config=config,
        runs=runs,
        scores=scores,
        degradation=levels,
        degradation_setup=degradation,
        forecasts_from=source,
        degradation_seconds=time.perf_counter() - t0,
    )


def write_timeline(result: BacktestResult, path: str | Path) -> None:
    result.timeline().to_csv(path, index=False)


# --------------------------------------------------------------------------- plots


def worst_ramp(demand_tokens: np.ndarray, window_minutes: int) -> tuple[int, int]:
    """``(start, end)`` minutes of the steepest rise of demand within ``window_minutes``."""
    n = len(demand_tokens)
    w = max(1, min(window_minutes, n - 1))
    if n < 2:
        return 0, n
    rise = demand_tokens[w:] - demand_tokens[:-w]
    i = int(np.argmax(rise))
    return i, i + w


def plot_paths(path: str | Path) -> tuple[Path, Path, Path]:
    """The three PNGs written for ``--plot OUT.png``: OUT.png, OUT-zoom.png, OUT-bars.png."""
    p = Path(path)
    stem = p.with_suffix("")
    return p, Path(f"{stem}-zoom.png"), Path(f"{stem}-bars.png")


def write_plots(result: BacktestResult, path: str | Path, *, title: str = "") -> list[Path]:
    """Demand vs ready capacity (whole trace and the worst ramp) and a summary bar chart."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = result.timeline()
    cap = result.config.replica_tokens_per_second
    hours = tl["minute"].to_numpy() / 60.0
    demand = tl["demand_tokens_per_s"].to_numpy()
    names = [r.name for r in result.runs]
    colors = {
        "reactive": "tab:red",
        "predictive": "tab:blue",
        "keda": "tab:cyan",
        "oracle": "tab:green",
        "schedule-only": "tab:purple",
        "persistence": "tab:gray",
        "smoothed-oracle": "tab:olive",
    }
    full, zoom, bars = plot_paths(path)

    def draw(ax: Any, sl: slice) -> None:
        ax.fill_between(hours[sl], demand[sl], color="0.8", step="post", label="demand")
        for name in names:
            ax.step(
                hours[sl],
                tl[f"{name}_ready"].to_numpy()[sl] * cap,
                where="post",
                color=colors.get(name),
                lw=1.0,
                label=f"{name} ready capacity",
            )
        ax.set_xlabel("hours since start")
        ax.set_ylabel("tokens/s")
        ax.legend(loc="upper left", fontsize=8)

    fig, ax = plt.subplots(figsize=(14, 5))
    draw(ax, slice(None))
    ax.set_title(
        f"{title} demand vs ready capacity (cold start {result.config.cold_start_seconds:.0f}s)"
    )
    fig.tight_layout()
    fig.savefig(full, dpi=110)
    plt.close(fig)

    cold_min = max(1, math.ceil(result.config.cold_start_seconds / MINUTE))
    a, b = worst_ramp(demand, cold_min)
    pad = 4 * cold_min
    sl = slice(max(0, a - pad), min(len(demand), b + pad))
    fig, ax = plt.subplots(figsize=(10, 5))
    draw(ax, sl)
    ax.axvspan(
        hours[a], hours[min(b, len(hours) - 1)], color="orange", alpha=0.15, label="worst ramp"
    )
    ax.set_title(f"{title} worst ramp (steepest rise within one cold start)")
    fig.tight_layout()
    fig.savefig(zoom, dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    shortfall = [result.scores[n].shortfall_minutes for n in names]
    gpu = [result.scores[n].gpu_hours for n in names]
    c = [colors.get(n, "tab:gray") for n in names]
    axes[0].bar(names, shortfall, color=c)
    axes[0].set_title("shortfall minutes")
    axes[1].bar(names, gpu, color=c)
    axes[1].set_title("GPU-hours")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(bars, dpi=110)
    plt.close(fig)
    return [full, zoom, bars]
