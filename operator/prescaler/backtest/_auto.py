"""``spec.policy: auto`` in a replay: the candidates on the same demand, a daily verdict.

The operator replays a pool's history under the forecast planner, the HPA led by the
forecast and the HPA swept over its target, and weighs them
(:func:`prescaler.planning.recheck`): on its history when the pool is new, then once a
day. A replay does the same on the demand it replays:

1. :func:`candidates` runs the forecast planner (the spec with ``policy: forecast``), the
   planner leading the HPA at the pool's target (``policy: leading``, on the same
   forecasts: they are made once), and the HPA at each target of :data:`HPA_SWEEP` (and
   the pool's own), each on a fleet of its own, from one day before the replayed span
   where the demand has it (that day is the history a new pool would replay);
2. :func:`daily_choices` weighs that first day (or what the warm-up gives of it) at the
   replayed span's start, as a new pool weighs its history, then each whole day at its
   end, as the daily re-check does;
3. the replayed fleet (:class:`prescaler.backtest.AutoPolicy`) follows the choices: each
   is in force from the check that made it. Before the first check the pool plans on the
   forecast, as a pool without history does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from prescaler.api import InferencePoolSpec
from prescaler.backtest._demand import MINUTE, Demand
from prescaler.backtest._policies import PredictivePolicy, SharedForecasts
from prescaler.backtest._report import BacktestResult, run_backtest
from prescaler.backtest._simulate import FleetConfig
from prescaler.capacity import CapacityModel
from prescaler.planning import Evidence, PolicyChoice, PolicyName, recheck
from prescaler.settings import ReconcileSettings

if TYPE_CHECKING:
    from prescaler.backtest._run import ReplayOptions

__all__ = [
    "CHECK_SECONDS",
    "FORECAST_CANDIDATE",
    "HPA_SWEEP",
    "LEADING_CANDIDATE",
    "auto_schedule",
    "candidates",
    "daily_choices",
    "evidence_in",
    "hpa_name",
]

HPA_SWEEP = (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9)
"""The HPA targets the forecast is weighed against: the benchmarks' range, dense enough that a
straight line between two points does not lie far above the curve (and flatter the forecast)."""
CHECK_SECONDS = ReconcileSettings().policy_check_seconds
"""How often the choice is re-checked, and over how much demand (the operator's default)."""
FORECAST_CANDIDATE = "forecast"
"""The forecast planner's run among the candidates."""
LEADING_CANDIDATE = "leading"
"""The HPA led by the forecast planner's forecasts, among the candidates."""


def hpa_name(target: float) -> str:
    return f"hpa-{target:g}"


def forecast_spec(spec: InferencePoolSpec) -> InferencePoolSpec:
    return spec.model_copy(update={"policy": "forecast"})


def candidates(
    spec: InferencePoolSpec,
    demand: Demand,
    *,
    capacity: CapacityModel,
    config: FleetConfig,
    options: ReplayOptions,
    lead_in_seconds: float = CHECK_SECONDS,
) -> tuple[BacktestResult, PredictivePolicy]:
    """The forecast planner, the HPA led by its forecasts and the swept HPAs, each on its
    own fleet, on ``demand`` from
    ``lead_in_seconds`` before its replayed span (as far as its warm-up allows: the
    forecaster keeps at least as much history as the span gives up); and the forecast
    planner's policy as it ended (its risk model is what the replay learnt)."""
    from prescaler.backtest._run import predictive_policy, reactive_policy  # _run uses this

    lead_in = int(lead_in_seconds // MINUTE)
    earlier = replace(
        demand, replay_from=max(demand.replay_from // 2, demand.replay_from - lead_in)
    )
    forecast = predictive_policy(
        forecast_spec(spec), earlier, capacity=capacity, config=config, options=options
    )
    forecast.name = FORECAST_CANDIDATE
    leading = predictive_policy(
        forecast_spec(spec), earlier, capacity=capacity, config=config, options=options
    )
    leading.name = LEADING_CANDIDATE
    leading.lead = reactive_policy(config, options.hpa_target)
    leading.forecaster = forecast.forecaster = SharedForecasts(forecast.forecaster)
    targets = sorted({*HPA_SWEEP, options.hpa_target})
    hpas = []
    for target in targets:
        hpa = reactive_policy(config, target)
        hpa.name = hpa_name(target)
        hpas.append(hpa)
    runs = run_backtest(earlier, [forecast, leading, *hpas], config, degradation=None)
    return runs, forecast


def evidence_in(scores: Mapping[str, Mapping[str, float | int]], hpa_target: float) -> Evidence:
    """The candidates' scores over one span as :class:`Evidence`."""
    forecast = scores[FORECAST_CANDIDATE]
    own = scores[hpa_name(hpa_target)]
    curve = tuple(
        (float(s["gpu_hours"]), float(s["unserved_token_fraction"]))
        for name, s in scores.items()
        if name.startswith("hpa-")
    )
    led = scores.get(LEADING_CANDIDATE)
    return Evidence(
        forecast_unserved=float(forecast["unserved_token_fraction"]),
        forecast_gpu_hours=float(forecast["gpu_hours"]),
        reactive_unserved=float(own["unserved_token_fraction"]),
        reactive_gpu_hours=float(own["gpu_hours"]),
        hpa_curve=curve,
        leading_unserved=None if led is None else float(led["unserved_token_fraction"]),
        leading_gpu_hours=None if led is None else float(led["gpu_hours"]),
    )


def daily_choices(
    result: BacktestResult,
    hpa_target: float,
    *,
    first_at: float | None = None,
    every_seconds: float = CHECK_SECONDS,
) -> list[PolicyChoice]:
    """The choices the checks make: the first at ``first_at`` (the replayed span's start)
    on all the candidates ran before it (the history a new pool replays), then one every
    ``every_seconds`` on the span since the previous check, to the runs' end. Without
    ``first_at``, or with nothing run before it, the first check comes a whole
    ``every_seconds`` after the runs' start."""
    start = result.demand.replay_start
    minutes = min(len(r.ready_per_step) for r in result.runs) // result.config.steps_per_minute
    end = start + minutes * MINUTE
    at = first_at if first_at is not None and first_at >= start + MINUTE else start + every_seconds
    since = start
    choices: list[PolicyChoice] = []
    choice: PolicyChoice | None = None
    while at <= end + 1e-6:
        choice = recheck(choice, evidence_in(result.span_scores(since, at), hpa_target), at)
        choices.append(choice)
        since, at = at, at + every_seconds
    return choices


def auto_schedule(
    choices: Sequence[PolicyChoice], fixed: PolicyName | None = None
) -> list[tuple[float, PolicyName]]:
    """When each choice comes into force; ``fixed``: one policy throughout."""
    if fixed is not None:
        return [(-math.inf, fixed)]
    schedule: list[tuple[float, PolicyName]] = []
    for choice in choices:
        if not schedule or schedule[-1][1] != choice.policy:
            schedule.append((choice.checked_at, choice.policy))
    return schedule
