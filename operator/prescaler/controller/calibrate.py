"""A pool's risk model seeded from its own history, off the reconcile path.

A pool without a calibration (a new pool, or a status lost) would size with the
forecast's own band until a few dozen of its lookaheads have ended. Instead, its demand
history (``spec.forecast.lookbackSeconds``, as the forecaster reads it) is replayed through
the same planner (:func:`prescaler.backtest.calibrate_from_history`), in a fit process,
and the replay's risk model seeds the pool's. The same replay gives the pool its first
comparison with an HPA (``status.againstHpa.fromHistory``).

* **Off the loop.** A reconcile asks (:meth:`HistoryCalibrator.request`) and never waits:
  the history is read in the I/O threads and the replay runs in its own fit process
  (niced, one replay at a time), so a slow replay never holds a reconcile or a fit.
* **Bounded.** A replay that runs past ``timeout_seconds`` is abandoned and its process
  killed; a failed or abandoned one is retried after ``retry_seconds``. Meanwhile the pool
  plans as before (the forecast's band, its own lookaheads), and condition
  ``RiskCalibrated`` says why.
* **Shared.** Pools that read the same demand series with the same spec, capacity, cold
  start and HPA target get one replay.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import Executor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from typing import Final

import numpy as np
import pandas as pd

from prescaler.api import (
    AgainstHpaWindow,
    InferencePoolSpec,
    InferencePoolStatus,
    RiskStatus,
)
from prescaler.backtest import (
    Demand,
    FleetConfig,
    HistoryCalibration,
    ReplayOptions,
    calibrate_from_history,
    history_demand,
    pool_fleet,
    replay_span,
)
from prescaler.capacity import CapacityModel
from prescaler.controller.fits import FitProcesses, fit_failure
from prescaler.controller.status import (
    ConditionUpdate,
    against_hpa_summary,
    merge_conditions,
)
from prescaler.planning import Evidence, Lookahead, PeakRisk, RiskObjective
from prescaler.sources import PrometheusSource, SourceError

log = logging.getLogger("prescaler")

RISK_CALIBRATED: Final = "RiskCalibrated"
MINUTE = 60.0
"""The replay's resolution: one minute, as every backtest's."""


@dataclass(frozen=True)
class Seed:
    """What a replay of a pool's history gives it."""

    risk: PeakRisk
    against_hpa: AgainstHpaWindow
    replayed_hours: float
    seconds: float = 0.0
    """How long the replay took, from the request to its result."""
    evidence: Evidence | None = None
    """The forecast planner against the HPA swept over its target on the replayed demand
    (what ``spec.policy: auto`` weighs)."""
    replayed_at: float = 0.0
    """When the replayed history ended (unix seconds)."""


@dataclass(frozen=True)
class CalibrationView:
    """Where a pool's seed stands, for one reconcile."""

    seed: Seed | None = None
    running: bool = False
    problem: tuple[str, str] | None = None
    """Why there is no seed: a condition reason and message."""
    waiting: str | None = None
    """What the replay waits for before it starts."""


@dataclass(frozen=True)
class CalibrationJob:
    """What a replay needs, gathered by the reconcile."""

    spec: InferencePoolSpec
    source: PrometheusSource
    series_id: str
    capacity: CapacityModel
    cold_start_seconds: float
    hpa_target: float
    decision_seconds: float
    min_seconds: float
    """The shortest replay that calibrates: ``objective.min_outcomes`` decisions."""
    check: int = 0
    """Which daily check of ``spec.policy: auto`` the replay is for (the day's index):
    a new day's check is a new replay."""

    def key(self) -> str:
        """Which replays are the same: the series and what the spec and the HPA say. Not the
        capacity model or the cold start: measured, they move at every reconcile, and a
        replay restarted for each move would never end; it runs on those it started with."""
        spec = self.spec.model_dump_json(include={"forecast", "model", "objective", "scaling"})
        parts = (self.series_id, spec, self.hpa_target, self.decision_seconds, self.check)
        return hashlib.sha256(repr(parts).encode()).hexdigest()


@dataclass
class _Replay:
    task: asyncio.Task[None] | None = None
    seed: Seed | None = None
    problem: tuple[str, str] | None = None
    retry_at: float = -math.inf
    pools: set[str] = field(default_factory=set)


def needs_seed(previous: RiskStatus | None, objective: RiskObjective) -> bool:
    """A pool whose risk model was never seeded and has not calibrated on its own
    lookaheads yet (a new pool, or one whose status was lost)."""
    if previous is None:
        return True
    return previous.seeded_from is None and previous.outcomes < objective.min_outcomes


@dataclass
class HistoryCalibrator:
    """The replays of one operator process."""

    io_executor: Executor | None = None
    """Threads for the Prometheus reads."""
    fit_processes: FitProcesses | None = None
    """Where a replay runs (its own slot, killed past the timeout); ``None``:
    ``executor``."""
    executor: Executor | None = None
    timeout_seconds: float = 600.0
    retry_seconds: float = 600.0
    clock: Callable[[], float] = time.time
    _replays: dict[str, _Replay] = field(default_factory=dict)
    _pools: dict[str, str] = field(default_factory=dict)
    _one: asyncio.Semaphore | None = None

    def request(self, uid: str, job: CalibrationJob) -> CalibrationView:
        """The pool's seed, if its replay has ended; else start it (once, retried after a
        failure) and say where it stands. Never waits."""
        key = job.key()
        if self._pools.get(uid, key) != key:
            self.forget(uid)
        self._pools[uid] = key
        replay = self._replays.setdefault(key, _Replay())
        replay.pools.add(uid)
        if replay.seed is not None:
            return CalibrationView(seed=replay.seed)
        running = replay.task is not None and not replay.task.done()
        if not running and self.clock() >= replay.retry_at:
            replay.problem = None
            replay.task = asyncio.create_task(self._run(replay, job))
            running = True
        return CalibrationView(running=running, problem=replay.problem)

    def forget(self, uid: str) -> None:
        """A pool seeded, deleted or changed: a replay nobody waits for is cancelled."""
        key = self._pools.pop(uid, None)
        replay = self._replays.get(key) if key is not None else None
        if replay is None:
            return
        replay.pools.discard(uid)
        if not replay.pools:
            if replay.task is not None:
                replay.task.cancel()
            del self._replays[key]  # type: ignore[arg-type]

    def close(self) -> None:
        for replay in self._replays.values():
            if replay.task is not None:
                replay.task.cancel()

    async def _run(self, replay: _Replay, job: CalibrationJob) -> None:
        started = self.clock()
        try:
            seed = await self._replay(job)
            replay.seed = replace(seed, seconds=max(0.0, self.clock() - started))
        except asyncio.CancelledError:
            raise
        except _Problem as exc:
            replay.problem = (exc.reason, exc.message)
        except Exception as exc:  # a boundary: a condition, never a stuck pool
            replay.problem = ("ReplayFailed", f"{type(exc).__name__}: {exc}"[:900])
        if replay.problem is not None:
            replay.retry_at = self.clock() + self.retry_seconds
            log.info("history calibration: %s: %s", *replay.problem)

    async def _replay(self, job: CalibrationJob) -> Seed:
        loop = asyncio.get_running_loop()
        spec = job.spec
        assert spec.forecast is not None
        now = self.clock()
        try:
            history = await loop.run_in_executor(
                self.io_executor,
                job.source.history,
                now - spec.forecast.lookback_seconds,
                now,
                MINUTE,
            )
        except SourceError as exc:
            message = f"the demand history cannot be read: {exc}"
            raise _Problem("HistoryUnavailable", message) from None
        start, rps = on_minutes(history)
        held = len(rps) * MINUTE
        span = replay_span(held, job.min_seconds)
        if span is None:
            raise _Problem(
                "InsufficientHistory",
                f"{held / 3600:.1f} h of demand history; a replay needs at least "
                f"{2 * job.min_seconds / 3600:.1f} h (half of it warms the forecaster up)",
            )
        try:
            demand = history_demand(start, rps, spec, span)
            config = pool_fleet(
                spec, job.capacity, cold_start_seconds=job.cold_start_seconds, policies=()
            )
        except ValueError as exc:
            raise _Problem("ReplayFailed", f"the history cannot be replayed: {exc}") from None
        options = ReplayOptions(decision_seconds=job.decision_seconds, hpa_target=job.hpa_target)
        if self._one is None:
            self._one = asyncio.Semaphore(1)
        async with self._one:
            calibration = await self._calibrate(spec, demand, job.capacity, config, options)
        return seed_of(calibration)

    async def _calibrate(
        self,
        spec: InferencePoolSpec,
        demand: Demand,
        capacity: CapacityModel,
        config: FleetConfig,
        options: ReplayOptions,
    ) -> HistoryCalibration:
        loop = asyncio.get_running_loop()
        slot = self.fit_processes.take() if self.fit_processes is not None else None
        call: asyncio.Future[HistoryCalibration] | None = None
        try:
            # Inside the try: a slot that refuses the job (its process died) is given back.
            call = loop.run_in_executor(
                slot or self.executor,
                _calibrate_call,
                spec,
                demand,
                capacity,
                config,
                options,
            )
            return await asyncio.wait_for(asyncio.shield(call), self.timeout_seconds)
        except TimeoutError:
            raise _Problem(
                "ReplayTimeout",
                f"the replay of the history did not finish within {self.timeout_seconds:g} s",
            ) from None
        except ValueError as exc:
            raise _Problem("ReplayFailed", f"the history cannot be replayed: {exc}") from None
        except (BrokenProcessPool, MemoryError) as exc:
            memory = self.fit_processes.memory_mib if self.fit_processes is not None else 0
            _, why = fit_failure(exc, memory)
            raise _Problem("ReplayFailed", f"the replay of the history failed: {why}") from None
        finally:
            hung = call is not None and not call.done()
            if slot is not None and self.fit_processes is not None:
                self.fit_processes.give(slot, hung=hung)
            if call is not None and hung:
                call.cancel()


class _Problem(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message


def _calibrate_call(
    spec: InferencePoolSpec,
    demand: Demand,
    capacity: CapacityModel,
    config: FleetConfig,
    options: ReplayOptions,
) -> HistoryCalibration:
    """In the fit process: the replay (top level, so it pickles)."""
    return calibrate_from_history(spec, demand, capacity=capacity, config=config, options=options)


def on_minutes(history: pd.Series) -> tuple[float, np.ndarray]:
    """A history (samples stamped at their step's start) on a regular minute grid from its
    first sample to its last, NaN where a minute has none."""
    clean = history[np.isfinite(history.to_numpy(dtype=float))]
    if clean.empty:
        return 0.0, np.zeros(0)
    stamps = np.array([t.timestamp() for t in clean.index])
    first = math.floor(stamps[0] / MINUTE) * MINUTE
    index = np.floor((stamps - first) / MINUTE).astype(int)
    rps = np.full(int(index[-1]) + 1, np.nan)
    rps[index] = clean.to_numpy(dtype=float)
    return first, rps


def seed_of(calibration: HistoryCalibration) -> Seed:
    """The replay as the pool keeps it: the risk model, and the comparison with the HPA."""
    p, h = calibration.predictive, calibration.reactive
    saved = h.gpu_hours - p.gpu_hours
    hours = calibration.replayed_seconds / 3600
    window = AgainstHpaWindow(
        observed_hours=round(hours, 4),
        gpu_hours=round(p.gpu_hours, 4),
        standby_gpu_hours=round(p.standby_gpu_hours, 4),
        hpa_gpu_hours=round(h.gpu_hours, 4),
        saved_gpu_hours=round(saved, 4),
        saved_percent=round(100 * saved / h.gpu_hours, 2) if h.gpu_hours > 0 else None,
        unserved_fraction=round(p.unserved_token_fraction, 6),
        hpa_unserved_fraction=round(h.unserved_token_fraction, 6),
        short_minutes=p.shortfall_minutes,
        hpa_short_minutes=h.shortfall_minutes,
        direction_changes=p.direction_changes,
        hpa_direction_changes=h.direction_changes,
    )
    return Seed(
        risk=calibration.risk,
        against_hpa=window,
        replayed_hours=hours,
        evidence=calibration.evidence,
        replayed_at=calibration.replayed_until,
    )


def seeded(previous: RiskStatus | None, seed: Seed) -> PeakRisk:
    """The pool's risk model from the seed, keeping what its own loop has pending."""
    kept = previous.pending if previous is not None else []
    return PeakRisk(
        levels=seed.risk.levels,
        histogram=seed.risk.histogram,
        pending=tuple(Lookahead(**p.model_dump()) for p in kept),
        outcomes=seed.risk.outcomes,
        loss=seed.risk.loss,
        observed_at=previous.observed_at if previous is not None else None,
        mean_demand=seed.risk.mean_demand,
        peak_demand=seed.risk.peak_demand,
        target=seed.risk.target,
    )


def calibrated_condition(
    risk: RiskStatus | None, view: CalibrationView | None, objective: RiskObjective
) -> ConditionUpdate:
    """Condition ``RiskCalibrated``: whether the margin is calibrated, and from what."""
    outcomes = risk.outcomes if risk is not None else 0
    need = objective.min_outcomes
    if risk is not None and risk.seeded_from == "history":
        hours = risk.seeded_hours or 0.0
        took = f" (in {risk.seed_seconds:.0f} s)" if risk.seed_seconds is not None else ""
        return ConditionUpdate(
            RISK_CALIBRATED,
            "True",
            "FromHistory",
            f"seeded by replaying {hours:.1f} h of the pool's demand history through the "
            f"planner{took}; {outcomes} lookaheads scored, the replay's included",
        )
    if outcomes >= need:
        return ConditionUpdate(
            RISK_CALIBRATED, "True", "Live", f"calibrated on {outcomes} of the pool's lookaheads"
        )
    live = f"the forecast's band stands in until {need:g} lookaheads have ended ({outcomes} so far)"
    if view is not None and view.problem is not None:
        reason, message = view.problem
        return ConditionUpdate(RISK_CALIBRATED, "False", reason, f"{message}; {live}")
    if view is not None and view.running:
        return ConditionUpdate(
            RISK_CALIBRATED,
            "False",
            "Replaying",
            f"replaying the pool's demand history to seed the margin; {live}",
        )
    if view is not None and view.waiting is not None:
        return ConditionUpdate(
            RISK_CALIBRATED,
            "False",
            "Pending",
            f"the replay of the pool's history waits for {view.waiting}; {live}",
        )
    return ConditionUpdate(RISK_CALIBRATED, "False", "Pending", live)


def with_history_seed(
    status: InferencePoolStatus,
    previous: InferencePoolStatus,
    view: CalibrationView | None,
    objective: RiskObjective,
    now: float,
    generation: int | None,
) -> InferencePoolStatus:
    """The status with what a seed from history set: ``status.risk.seededFrom`` (this
    reconcile's seed, or the last status's), ``status.againstHpa.fromHistory`` (and its
    one-line summary while the live shadow has under an hour), and ``RiskCalibrated``."""
    seed = view.seed if view is not None else None
    risk, against = status.risk, status.against_hpa
    if risk is not None:
        if seed is not None:
            risk = risk.model_copy(
                update={
                    "seeded_from": "history",
                    "seeded_hours": round(seed.replayed_hours, 3),
                    "seeded_at": round(now, 3),
                    "seed_seconds": round(seed.seconds, 1),
                }
            )
        elif previous.risk is not None and previous.risk.seeded_from is not None:
            risk = risk.model_copy(
                update={
                    "seeded_from": previous.risk.seeded_from,
                    "seeded_hours": previous.risk.seeded_hours,
                    "seeded_at": previous.risk.seeded_at,
                    "seed_seconds": previous.risk.seed_seconds,
                }
            )
    if against is not None:
        estimate = (
            seed.against_hpa
            if seed is not None
            else previous.against_hpa.from_history
            if previous.against_hpa is not None
            else None
        )
        if estimate is not None:
            update: dict[str, object] = {"from_history": estimate}
            day = against.last24_hours
            if day is None or day.observed_hours < 1.0:
                update["summary"] = f"{against_hpa_summary(estimate)} from history"
            against = against.model_copy(update=update)
    condition = calibrated_condition(risk, view, objective)
    conditions = merge_conditions(status.conditions, [condition], now, generation)
    return status.model_copy(
        update={"risk": risk, "against_hpa": against, "conditions": conditions}
    )
