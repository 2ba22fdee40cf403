"""A new pool's risk model seeded by replaying its own history."""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd
import pytest

from prescaler.api import InferencePoolSpec, InferencePoolStatus, RiskStatus, risk_objective
from prescaler.backtest import (
    ReplayOptions,
    calibrate_from_history,
    history_demand,
    pool_capacity,
    pool_fleet,
    replay_span,
)
from prescaler.capacity import CapacityModel
from prescaler.controller.calibrate import (
    CalibrationJob,
    CalibrationView,
    HistoryCalibrator,
    calibrated_condition,
    needs_seed,
    on_minutes,
    seed_of,
    seeded,
    with_history_seed,
)
from prescaler.controller.status import risk_status
from prescaler.planning import risk_sizing
from prescaler.sources import MetricsUnavailable

DAY0 = 1_700_006_400.0  # a UTC midnight


def _spec(**fields: Any) -> InferencePoolSpec:
    raw = {
        "target": {"name": "x"},
        "minReplicas": 1,
        "maxReplicas": 40,
        "model": {"tokensPerSecond": 20000},
        "forecast": {"prometheus": {"url": "http://p:9090"}, "model": "seasonal_naive"},
        **fields,
    }
    return InferencePoolSpec.model_validate(raw)


def _bursty(minutes: int, seed: int = 0) -> np.ndarray:
    """Requests/s with a daily swell and a burst every 40 minutes."""
    t = np.arange(minutes)
    rng = np.random.default_rng(seed)
    base = 8 + 6 * (np.sin(2 * np.pi * t / 1440) + 1)
    bursts = np.where(t % 40 < 4, 12.0, 0.0)
    return np.asarray(base + bursts + rng.normal(0, 0.5, minutes), dtype=float)


def _replay(spec: InferencePoolSpec, rps: np.ndarray) -> Any:
    span = replay_span(len(rps) * 60.0, 900.0)
    assert span is not None
    demand = history_demand(DAY0, rps, spec, span)
    capacity = pool_capacity(spec, demand)
    config = pool_fleet(spec, capacity, cold_start_seconds=240, policies=())
    options = ReplayOptions(decision_seconds=60.0)
    return calibrate_from_history(spec, demand, capacity=capacity, config=config, options=options)


# ---------------------------------------------------------------------- the replay (pure)


def test_the_span_is_the_last_day_at_most_and_half_the_history() -> None:
    assert replay_span(7 * 86400.0, 900.0) == 86400.0
    assert replay_span(6 * 3600.0, 900.0) == 3 * 3600.0
    assert replay_span(1000.0, 900.0) is None  # 500 s is under the 900 s a calibration needs
    assert replay_span(float("nan"), 900.0) is None


def test_a_replay_seeds_a_calibrated_margin_and_scores_the_hpa_beside_it() -> None:
    spec = _spec()
    calibration = _replay(spec, _bursty(6 * 60))
    objective = risk_objective(spec)
    risk = calibration.risk
    assert risk.outcomes >= objective.min_outcomes
    assert risk.pending == ()
    assert risk.observed_at is None
    sizing = risk_sizing(risk, objective)
    assert sizing.calibrated
    # Bursts of 1.5-2 x the base end lookaheads: the margin learned them.
    assert sizing.margin > 1.05
    assert calibration.replayed_seconds == 3 * 3600.0
    assert calibration.reactive.gpu_hours > 0
    assert calibration.predictive.gpu_hours > 0
    assert risk.target is not None  # the relative objective saw the replay's shadow HPA


def test_a_quiet_history_seeds_a_smaller_margin_than_a_bursty_one() -> None:
    spec = _spec()
    objective = risk_objective(spec)
    minutes = 6 * 60
    quiet = 10 + np.random.default_rng(1).normal(0, 0.2, minutes)
    calm = risk_sizing(_replay(spec, quiet).risk, objective)
    wild = risk_sizing(_replay(spec, _bursty(minutes)).risk, objective)
    assert calm.calibrated
    assert wild.calibrated
    assert calm.margin < wild.margin


def test_history_on_minutes_keeps_gaps_as_nan() -> None:
    stamps = pd.to_datetime([DAY0, DAY0 + 60, DAY0 + 180], unit="s", utc=True)
    start, rps = on_minutes(pd.Series([1.0, 2.0, 4.0], index=stamps))
    assert start == DAY0
    assert rps[:2].tolist() == [1.0, 2.0]
    assert math.isnan(rps[2])
    assert rps[3] == 4.0
    assert on_minutes(pd.Series([], dtype=float))[1].size == 0


# ---------------------------------------------------------------------- the status


def test_a_pool_is_seeded_once_and_only_while_uncalibrated() -> None:
    objective = risk_objective(_spec())
    assert needs_seed(None, objective)
    assert needs_seed(RiskStatus(outcomes=3), objective)
    assert not needs_seed(RiskStatus(outcomes=int(objective.min_outcomes)), objective)
    assert not needs_seed(RiskStatus(outcomes=0, seeded_from="history"), objective)


def test_the_seed_keeps_the_loops_own_pending_lookaheads() -> None:
    spec = _spec()
    seed = seed_of(_replay(spec, _bursty(6 * 60)))
    previous = RiskStatus(
        outcomes=2,
        observed_at=DAY0,
        pending=[{"start": DAY0, "end": DAY0 + 300, "base": 5.0, "sized": 7.0}],
    )
    risk = seeded(previous, seed)
    assert risk.outcomes == seed.risk.outcomes
    assert risk.histogram == seed.risk.histogram
    assert [p.end for p in risk.pending] == [DAY0 + 300]
    assert risk.observed_at == DAY0


def test_the_condition_says_what_the_margin_stands_on() -> None:
    objective = risk_objective(_spec())
    running = calibrated_condition(RiskStatus(outcomes=1), CalibrationView(running=True), objective)
    assert (running.status, running.reason) == ("False", "Replaying")
    failed = calibrated_condition(
        RiskStatus(outcomes=1),
        CalibrationView(problem=("HistoryUnavailable", "the demand history cannot be read: x")),
        objective,
    )
    assert (failed.status, failed.reason) == ("False", "HistoryUnavailable")
    assert "cannot be read" in failed.message
    assert "lookaheads" in failed.message
    waiting = calibrated_condition(
        RiskStatus(outcomes=1), CalibrationView(waiting="its forecast model"), objective
    )
    assert (waiting.status, waiting.reason) == ("False", "Pending")
    assert "waits for its forecast model" in waiting.message
    live = calibrated_condition(RiskStatus(outcomes=60), None, objective)
    assert (live.status, live.reason) == ("True", "Live")
    history = calibrated_condition(
        RiskStatus(outcomes=0, seeded_from="history", seeded_hours=24.0), None, objective
    )
    assert (history.status, history.reason) == ("True", "FromHistory")
    assert "24.0 h" in history.message


def test_the_status_records_the_seed_and_the_estimate_from_history() -> None:
    spec = _spec()
    objective = risk_objective(spec)
    seed = seed_of(_replay(spec, _bursty(6 * 60)))
    risk = risk_status(seed.risk, risk_sizing(seed.risk, objective), objective)
    status = InferencePoolStatus.model_validate(
        {"againstHpa": {"summary": "0.0 GPU-h"}}
    ).model_copy(update={"risk": risk})
    out = with_history_seed(
        status, InferencePoolStatus(), CalibrationView(seed=seed), objective, DAY0, 1
    )
    assert out.risk is not None
    assert out.risk.seeded_from == "history"
    assert out.risk.seeded_hours == pytest.approx(3.0)
    assert out.against_hpa is not None
    assert out.against_hpa.from_history == seed.against_hpa
    assert out.against_hpa.summary.endswith("from history")
    (condition,) = [c for c in out.conditions if c.type == "RiskCalibrated"]
    assert condition.reason == "FromHistory"
    # The next reconcile has no seed of its own: the last status's is carried on.
    later = with_history_seed(status, out, None, objective, DAY0 + 15, 1)
    assert later.risk is not None
    assert later.risk.seeded_from == "history"
    assert later.against_hpa is not None
    assert later.against_hpa.from_history == seed.against_hpa


# ---------------------------------------------------------------------- the calibrator


class _Source:
    """A demand source that answers a fixed history, or fails."""

    def __init__(self, history: pd.Series | None) -> None:
        self._history = history
        self.reads = 0

    def history(self, start: float, end: float, step: float) -> pd.Series:
        self.reads += 1
        if self._history is None:
            raise MetricsUnavailable("connection refused")
        return self._history


def _job(spec: InferencePoolSpec, source: _Source, capacity: CapacityModel) -> CalibrationJob:
    return CalibrationJob(
        spec=spec,
        source=source,  # type: ignore[arg-type]
        series_id="s",
        capacity=capacity,
        cold_start_seconds=240.0,
        hpa_target=0.7,
        decision_seconds=60.0,
        min_seconds=900.0,
    )


async def _until(calibrator: HistoryCalibrator, uid: str, job: CalibrationJob) -> CalibrationView:
    for _ in range(6000):
        view = calibrator.request(uid, job)
        if not view.running:
            return view
        await asyncio.sleep(0.05)
    raise AssertionError("the replay never ended")


def test_the_calibrator_replays_once_and_shares_the_seed() -> None:
    spec = _spec()
    rps = _bursty(6 * 60)
    stamps = pd.to_datetime(DAY0 + 60.0 * np.arange(len(rps)), unit="s", utc=True)
    source = _Source(pd.Series(rps, index=stamps))
    demand = history_demand(DAY0, rps, spec, 3600.0)
    capacity = pool_capacity(spec, demand)

    async def main() -> tuple[CalibrationView, CalibrationView]:
        calibrator = HistoryCalibrator(clock=lambda: DAY0 + len(rps) * 60.0)
        first = calibrator.request("a", _job(spec, source, capacity))
        assert first.running
        assert first.seed is None
        done = await _until(calibrator, "a", _job(spec, source, capacity))
        other = calibrator.request("b", _job(spec, source, capacity))
        calibrator.close()
        return done, other

    done, other = asyncio.run(main())
    assert done.seed is not None
    assert done.problem is None
    assert other.seed is done.seed  # the same series and settings: one replay
    assert source.reads == 1


def test_a_replay_is_not_restarted_when_the_measured_capacity_or_cold_start_moves() -> None:
    # Measured live, both move at every reconcile: a replay restarted for each move never
    # ended (a pool whose capacity the snapshot measures stayed uncalibrated).
    spec = _spec()
    rps = _bursty(6 * 60)
    stamps = pd.to_datetime(DAY0 + 60.0 * np.arange(len(rps)), unit="s", utc=True)
    source = _Source(pd.Series(rps, index=stamps))
    capacity = pool_capacity(spec, history_demand(DAY0, rps, spec, 3600.0))
    other = replace(capacity, tokens_per_second=capacity.tokens_per_second * 1.01)

    jobs = [
        _job(spec, source, capacity),
        replace(_job(spec, source, other), cold_start_seconds=250.0),
    ]

    async def main() -> CalibrationView:
        calibrator = HistoryCalibrator(clock=lambda: DAY0 + len(rps) * 60.0)
        view = CalibrationView()
        for i in range(6000):  # each reconcile measures a little differently
            view = calibrator.request("a", jobs[i % 2])
            if view.seed is not None:
                break
            await asyncio.sleep(0.05)
        calibrator.close()
        return view

    view = asyncio.run(main())
    assert view.seed is not None
    assert source.reads == 1


def test_a_history_that_cannot_be_read_is_a_condition_and_retried_later() -> None:
    spec = _spec()
    source = _Source(None)
    capacity = pool_capacity(spec, history_demand(DAY0, np.full(120, 5.0), spec, 3600.0))
    now = [DAY0]

    async def main() -> tuple[CalibrationView, CalibrationView, CalibrationView]:
        calibrator = HistoryCalibrator(clock=lambda: now[0], retry_seconds=600.0)
        failed = await _until(calibrator, "a", _job(spec, source, capacity))
        again = calibrator.request("a", _job(spec, source, capacity))  # before the retry
        now[0] += 601.0
        retried = calibrator.request("a", _job(spec, source, capacity))
        await _until(calibrator, "a", _job(spec, source, capacity))
        calibrator.close()
        return failed, again, retried

    failed, again, retried = asyncio.run(main())
    assert failed.seed is None
    assert failed.problem is not None
    assert failed.problem[0] == "HistoryUnavailable"
    assert "connection refused" in failed.problem[1]
    assert again.problem == failed.problem
    assert not again.running
    assert retried.running
    assert source.reads == 2


def test_too_little_history_says_how_much_is_needed() -> None:
    spec = _spec()
    rps = np.full(20, 5.0)
    stamps = pd.to_datetime(DAY0 + 60.0 * np.arange(len(rps)), unit="s", utc=True)
    source = _Source(pd.Series(rps, index=stamps))
    capacity = pool_capacity(spec, history_demand(DAY0, np.full(120, 5.0), spec, 3600.0))

    async def main() -> CalibrationView:
        calibrator = HistoryCalibrator(clock=lambda: DAY0 + 1200.0)
        view = await _until(calibrator, "a", _job(spec, source, capacity))
        calibrator.close()
        return view

    view = asyncio.run(main())
    assert view.problem is not None
    assert view.problem[0] == "InsufficientHistory"
    assert "0.3 h" in view.problem[1]
    assert "0.5 h" in view.problem[1]
