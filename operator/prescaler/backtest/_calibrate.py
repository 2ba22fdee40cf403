"""A new pool's risk model, calibrated by replaying its own history (pure).

A pool without a calibration (a new pool, or a status lost) would size with the
forecast's own band until enough of its lookaheads have ended. Instead, the operator
replays the pool's recent demand history through the same planner the backtest runs
(:func:`prescaler.backtest.backtest`, one code path with the operator): the predictive
policy's risk model at the replay's end is the pool's starting calibration (its margin
histogram, its level as adapted to the objective, its typical and peak demand, and the
objective's target as the replay's shadow HPA set it). The same replay scores a reactive
HPA on the same demand: the pool's first comparison with the HPA, marked as an estimate
from history until the live shadow has hours of its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from prescaler.api import InferencePoolSpec, risk_objective
from prescaler.backtest._auto import FORECAST_CANDIDATE, candidates, evidence_in, hpa_name
from prescaler.backtest._demand import MINUTE, Demand, demand_from_trace
from prescaler.backtest._run import ReplayOptions
from prescaler.backtest._simulate import FleetConfig, Score
from prescaler.backtest.traces import Trace
from prescaler.capacity import CapacityModel
from prescaler.planning import LEVEL_BUCKETS, Evidence, PeakRisk

__all__ = [
    "REPLAY_SECONDS",
    "HistoryCalibration",
    "calibrate_from_history",
    "history_demand",
    "replay_span",
]

REPLAY_SECONDS = 86400.0
"""How much of the history is replayed at most (the last day): enough lookaheads to
calibrate (a few thousand at the default period) and a whole daily cycle, in seconds of
compute. What comes before it is the forecaster's warm-up."""


@dataclass(frozen=True)
class HistoryCalibration:
    """What a replay of a pool's history taught."""

    risk: PeakRisk
    """The risk model at the replay's end, with nothing pending: the pool's starting
    calibration."""
    replayed_seconds: float
    """The span replayed (after the warm-up)."""
    predictive: Score
    """The predictive policy's score over the replayed span."""
    reactive: Score
    """The reactive HPA's score on the same demand and fleet."""
    demand: float
    """Demand replayed (requests: the sum of the per-minute rates times 60 s)."""
    evidence: Evidence | None = None
    """The forecast planner against the HPA swept over its target on the replayed demand
    (what ``spec.policy: auto`` weighs)."""
    replayed_until: float = 0.0
    """The end of the replayed demand (unix seconds)."""


def replay_span(history_seconds: float, min_seconds: float) -> float | None:
    """The span to replay out of ``history_seconds`` of history: the last day at most,
    and at most half of what there is (the rest warms the forecaster up); ``None`` when
    that is shorter than ``min_seconds`` (too little history to calibrate on)."""
    if not (math.isfinite(history_seconds) and history_seconds > 0):
        return None
    span = min(REPLAY_SECONDS, history_seconds / 2)
    span = math.floor(span / MINUTE) * MINUTE
    return span if span >= max(min_seconds, MINUTE) else None


def history_demand(
    start: float,
    requests_per_second: np.ndarray,
    spec: InferencePoolSpec,
    replay_seconds: float,
) -> Demand:
    """Per-minute demand from a pool's requests/s history (one value per minute from
    ``start``, NaN in gaps), at the spec's mean request size; only the last
    ``replay_seconds`` are replayed. Raises ``ValueError`` when nothing is usable."""
    rps = np.asarray(requests_per_second, dtype=float)
    if not np.isfinite(rps).any():
        raise ValueError("the history holds no demand sample")
    trace = Trace(start=start, step_seconds=MINUTE, rps=rps, name="history")
    demand = demand_from_trace(
        trace, prompt_tokens=spec.model.prompt_tokens, output_tokens=spec.model.output_tokens
    )
    return demand.with_replay_days(replay_seconds / 86400.0)


def calibrate_from_history(
    spec: InferencePoolSpec,
    demand: Demand,
    *,
    capacity: CapacityModel,
    config: FleetConfig,
    options: ReplayOptions,
) -> HistoryCalibration:
    """Replay ``demand`` (its warm-up, then its replayed minutes) as the operator would
    have planned it, and beside it a reactive HPA at ``options.hpa_target``; the
    predictive policy's risk model at the end is the calibration. Raises ``ValueError``
    (:class:`prescaler.api.SpecError` for the spec) on what cannot be replayed."""
    if spec.forecast is None:
        raise ValueError("a pool without spec.forecast has no risk model to calibrate")
    # The forecast planner (whatever spec.policy says: its risk model is what is seeded)
    # and the HPA swept over its target, on the same demand: the evidence spec.policy
    # auto weighs.
    run, predictive = candidates(
        spec,
        demand,
        capacity=capacity,
        config=config,
        options=options,
        lead_in_seconds=0.0,
    )
    risk = predictive.risk or PeakRisk()
    # The replay's open lookaheads refer to its own fleet: the live loop starts afresh.
    risk = replace(risk, pending=(), observed_at=None)
    if not risk.levels:
        risk = replace(risk, levels=(risk_objective(spec).level,) * LEVEL_BUCKETS)
    scores = run.scores
    replayed = demand.replay_tokens_per_s
    observed = np.asarray(demand.observed_requests_per_s[demand.replay_from :], dtype=float)
    return HistoryCalibration(
        risk=risk,
        replayed_seconds=len(replayed) * MINUTE,
        predictive=scores[FORECAST_CANDIDATE],
        reactive=scores[hpa_name(options.hpa_target)],
        demand=float(np.nansum(observed) * MINUTE),
        evidence=evidence_in(
            {name: score.as_dict() for name, score in scores.items()}, options.hpa_target
        ),
        replayed_until=float(demand.start) + len(demand) * MINUTE,
    )
