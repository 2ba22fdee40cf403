"""Replay per-minute demand through a simulated fleet under one policy, and score it.

Fleet model:

* Time advances in steps of ``step_seconds`` (15 s: the HPA sync period). Demand is the
  trace's per-minute average, constant within a minute.
* Each ready replica serves up to ``replica_tokens_per_second`` (the capacity model's
  effective limit: the binding one of KV-cache concurrency and compute). A replica is ready
  one cold start after it is requested (see :mod:`._fleet`).
* Demand beyond ready capacity waits in a FIFO fluid queue that drains when capacity frees.
  Policies see that queue as a metrics pipeline shows it (``metric_lag`` old), as the
  operator reads the engines' waiting requests.
* Warm standby (``FleetConfig.warm_start_seconds`` set): a policy that exposes a ``standby``
  count after ``decide`` (the predictive policy: the plan's ``standby_replicas``) holds that
  many standby slots; a replica started on a warm slot is ready after the warm start (see
  :mod:`._fleet` for the bookkeeping and its assumptions). Other policies have none.

Scores (per policy):

* ``shortfall_minutes`` - minutes in which ready capacity was below demand at any step,
  i.e. ``min ready in the minute × replica capacity < the minute's demand`` beyond float
  noise (:func:`prescaler.capacity.covers`); the timeline's ``_ready`` column is that
  minimum, so the count can be recomputed from the CSV.
* ``unserved_token_fraction`` - share of demand tokens not served in the step they arrived
  (they joined the queue).
* ``gpu_hours`` - replicas that exist (starting or ready) × GPUs per replica × time, plus
  standby slots held × GPUs per replica × time × ``standby_cost_fraction``.
* ``standby_gpu_hours`` - that standby part alone (already in ``gpu_hours``).
* ``warm_starts`` - replicas that started on a warm standby slot.
* ``scale_events`` - changes of the replica count.
* ``direction_changes`` - scale events whose direction differs from the previous one's (a
  scale-down after a scale-up, or the reverse), read from the timeline's ``_desired``
  column (:func:`direction_changes`); ``direction_changes_per_day`` per day of replay.

Signals (``simulate(..., signals_every_seconds=S)``): every ``S`` seconds, after that step's
decision, the run records what the fleet's metrics show (ready replicas, the queue and the
demand as old as the policies see them, the expected ready time of each starting replica)
and, for a policy with a forecaster, the forecast its plan could use: the inputs of a
degradation assessment (see :mod:`._levels`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from prescaler.backtest._demand import MINUTE, Demand
from prescaler.backtest._fleet import Fleet, cold_start_steps, short_of
from prescaler.backtest._policies import Observation, Policy
from prescaler.capacity import replicas_for
from prescaler.planning import ForecastLike

FloatArray = np.ndarray
Progress = Callable[[str, float], None]
"""Called with (policy name, fraction done)."""


@dataclass(frozen=True)
class FleetConfig:
    """The simulated fleet, shared by every policy."""

    replica_tokens_per_second: float
    """One replica's effective capacity (prompt + output tokens/s)."""
    cold_start_seconds: float
    min_replicas: int = 1
    max_replicas: int = 100
    gpus_per_replica: int = 1
    step_seconds: float = 15.0
    metric_lag_seconds: float = 30.0
    """How old the demand a policy observes is (scrape interval plus rate window)."""
    initial_replicas: int | None = None
    """Ready replicas at the start; ``None``: what the first minute needs at 70 % load."""
    warm_start_seconds: float | None = None
    """Start of a replica that takes a warm standby slot; ``None``: no standby simulated."""
    standby_cost_fraction: float = 1.0
    """GPU cost of a held standby slot as a share of a replica's (1: a held node costs what a
    busy one does)."""

    def __post_init__(self) -> None:
        if not self.replica_tokens_per_second > 0:
            raise ValueError("replica tokens per second must be > 0")
        if self.cold_start_seconds < 0:
            raise ValueError("cold start must be >= 0 seconds")
        if self.min_replicas < 0 or self.max_replicas < max(1, self.min_replicas):
            raise ValueError("need 0 <= min replicas <= max replicas and max replicas >= 1")
        ratio = MINUTE / self.step_seconds
        if not (self.step_seconds > 0 and abs(ratio - round(ratio)) < 1e-9):
            raise ValueError("the simulation step must divide 60 s")
        if self.gpus_per_replica < 1:
            raise ValueError("gpus per replica must be >= 1")
        if self.warm_start_seconds is not None and not (
            0 <= self.warm_start_seconds <= self.cold_start_seconds
        ):
            raise ValueError("the warm start must be >= 0 s and no longer than the cold start")
        if not (math.isfinite(self.standby_cost_fraction) and self.standby_cost_fraction >= 0):
            raise ValueError("the standby cost fraction must be >= 0")

    @property
    def steps_per_minute(self) -> int:
        return round(MINUTE / self.step_seconds)

    @property
    def lag_steps(self) -> int:
        return cold_start_steps(self.cold_start_seconds, self.step_seconds)

    @property
    def warm_lag_steps(self) -> int | None:
        if self.warm_start_seconds is None:
            return None
        return cold_start_steps(self.warm_start_seconds, self.step_seconds)

    def first_replicas(self, demand: Demand) -> int:
        if self.initial_replicas is not None:
            want = self.initial_replicas
        else:
            first = float(demand.tokens_per_s[demand.replay_from])
            want = replicas_for(first, 0.7 * self.replica_tokens_per_second)
        return min(max(want, self.min_replicas), self.max_replicas)


@dataclass(frozen=True)
class FleetSignals:
    """What one fleet's metrics showed at each assessment step (every ``every_seconds`` from
    the replay's first step, after that step's decision)."""

    every_seconds: float
    times: np.ndarray
    """Unix seconds of each assessment."""
    durations: np.ndarray
    """Seconds each assessment stands for, until the next one (the last may be shorter)."""
    ready: np.ndarray
    """Ready replicas."""
    queue_tokens: np.ndarray
    """The fleet's queue as the metrics show it (``metric_lag`` old), in tokens."""
    metric_tokens_per_s: np.ndarray
    """Demand as the metrics show it (``metric_lag`` old)."""
    arrivals: tuple[tuple[float, ...], ...]
    """Expected ready times (unix s) of the replicas starting at each assessment."""
    forecasts: tuple[ForecastLike | None, ...] | None = None
    """The forecast the policy's plan could use at each assessment (``None`` where it could
    not); ``None`` for a policy without a forecaster."""

    def __len__(self) -> int:
        return len(self.times)


@dataclass(frozen=True)
class PolicyRun:
    """One policy's replay: per-step fleet and per-minute summaries plus scores."""

    name: str
    ready_per_step: np.ndarray
    existing_per_step: np.ndarray
    scale_events: int
    seconds: float
    """Wall time of the replay."""
    standby_per_step: np.ndarray | None = None
    """Standby slots held per step; ``None`` for a policy without standby."""
    warm_starts: int = 0
    """Replicas that started on a warm standby slot."""
    signals: FleetSignals | None = None
    """The fleet's metrics at each assessment step; ``None`` unless asked for."""

    def ready_per_minute(self, steps_per_minute: int) -> np.ndarray:
        """The smallest ready count within each minute."""
        return np.asarray(self.ready_per_step.reshape(-1, steps_per_minute).min(axis=1))

    def existing_per_minute(self, steps_per_minute: int) -> np.ndarray:
        """The largest count of existing replicas within each minute."""
        return np.asarray(self.existing_per_step.reshape(-1, steps_per_minute).max(axis=1))

    def standby_per_minute(self, steps_per_minute: int) -> np.ndarray | None:
        """The largest count of standby slots held within each minute."""
        if self.standby_per_step is None:
            return None
        return np.asarray(self.standby_per_step.reshape(-1, steps_per_minute).max(axis=1))


def simulate(
    demand: Demand,
    policy: Policy,
    config: FleetConfig,
    *,
    progress: Progress | None = None,
    until_minute: int | None = None,
    signals_every_seconds: float | None = None,
) -> PolicyRun:
    """Replay ``demand`` (from its ``replay_from`` minute) under ``policy``.

    ``until_minute`` (absolute) stops early, for tests. Step indices handed to the policy
    are absolute (minute ``m`` starts at step ``m * steps_per_minute``).
    ``signals_every_seconds`` (a multiple of the step) records :class:`FleetSignals`.
    """
    t0 = time.perf_counter()
    spm = config.steps_per_minute
    minutes = len(demand) if until_minute is None else min(until_minute, len(demand))
    first = demand.replay_from * spm
    steps = max(0, minutes * spm - first)
    dt = config.step_seconds
    every = round(policy.interval_seconds / dt)
    if every < 1 or abs(every * dt - policy.interval_seconds) > 1e-6:
        raise ValueError(
            f"{policy.name}: decision interval {policy.interval_seconds}s is not a multiple "
            f"of the {dt}s simulation step"
        )
    sig_every = 0
    if signals_every_seconds is not None:
        sig_every = round(signals_every_seconds / dt)
        if sig_every < 1 or abs(sig_every * dt - signals_every_seconds) > 1e-6:
            raise ValueError(
                f"signals every {signals_every_seconds}s is not a multiple of the {dt}s "
                "simulation step"
            )
    recorder = _SignalRecorder(sig_every, dt, policy) if sig_every else None
    tokens = np.repeat(np.asarray(demand.tokens_per_s[:minutes], dtype=float), spm)
    metric_lag = round(config.metric_lag_seconds / dt)
    history = demand.observed_series()
    lag_minutes_end = config.metric_lag_seconds
    initial = getattr(policy, "initial_replicas", None)
    first_count = initial(first) if callable(initial) else config.first_replicas(demand)
    fleet = Fleet(
        min(max(int(first_count), config.min_replicas), config.max_replicas),
        config.lag_steps,
        config.warm_lag_steps,
    )
    ready = np.empty(steps, dtype=np.int64)
    existing = np.empty(steps, dtype=np.int64)
    ready_before = fleet.ready  # what served before the replay's first step
    # Standby only for a policy that sizes it, and only when the config simulates it.
    has_standby = config.warm_start_seconds is not None and hasattr(policy, "standby")
    standby = np.zeros(steps, dtype=np.int64) if has_standby else None
    # The queue after each step (the fluid queue the scores use), for the policies to see.
    queue_after = np.zeros(steps)
    queue = 0.0
    report_every = max(1, steps // 50)
    lo, hi = config.min_replicas, config.max_replicas
    for k in range(steps):
        i = first + k
        fleet.advance(i)
        if k % every == 0:
            seen = k - 1 - metric_lag
            now = demand.start + i * dt
            # Minutes that ended at least the metric lag ago are visible; nothing later.
            visible = math.floor((i * dt - lag_minutes_end) / MINUTE + 1e-9)
            visible = max(0, min(visible, minutes))
            obs = Observation(
                now=now,
                step=i,
                ready=fleet.ready,
                existing=fleet.existing,
                metric_tokens_per_s=float(tokens[max(0, i - metric_lag)]),
                observed=history,
                visible_minutes=visible,
                queue_tokens=float(queue_after[seen]) if seen >= 0 else 0.0,
                ready_at_metric=int(ready[k - metric_lag]) if k >= metric_lag else ready_before,
            )
            desired = policy.decide(obs)
            fleet.scale_to(min(max(desired, lo), hi), i)
            if standby is not None:
                # After the scale: new replicas take the warm slots held so far, then the
                # plan's standby size is restored (replacements pending a cold start).
                fleet.set_standby(max(0, int(getattr(policy, "standby", 0))), i)
        if recorder is not None and k % sig_every == 0:
            seen = k - 1 - metric_lag
            recorder.record(
                now=demand.start + i * dt,
                fleet=fleet,
                start=demand.start,
                queue_tokens=float(queue_after[seen]) if seen >= 0 else 0.0,
                metric_tokens_per_s=float(tokens[max(0, i - metric_lag)]),
            )
        ready[k] = fleet.ready
        existing[k] = fleet.existing
        queue = max(0.0, queue + (tokens[i] - fleet.ready * config.replica_tokens_per_second) * dt)
        queue_after[k] = queue
        if standby is not None:
            standby[k] = fleet.standby
        if progress is not None and k % report_every == 0:
            progress(policy.name, k / steps)
    if progress is not None:
        progress(policy.name, 1.0)
    return PolicyRun(
        name=policy.name,
        ready_per_step=ready,
        existing_per_step=existing,
        scale_events=fleet.scale_events,
        seconds=time.perf_counter() - t0,
        standby_per_step=standby,
        warm_starts=fleet.warm_starts,
        signals=recorder.signals(steps) if recorder is not None else None,
    )


class _SignalRecorder:
    """Collects :class:`FleetSignals` during one replay."""

    def __init__(self, every_steps: int, step_seconds: float, policy: Policy) -> None:
        self.every = every_steps
        self.dt = step_seconds
        self.policy = policy
        self.forecasting = hasattr(policy, "last_forecast")
        self.times: list[float] = []
        self.ready: list[int] = []
        self.queue: list[float] = []
        self.metric: list[float] = []
        self.arrivals: list[tuple[float, ...]] = []
        self.forecasts: list[ForecastLike | None] = []

    def record(
        self,
        *,
        now: float,
        fleet: Fleet,
        start: float,
        queue_tokens: float,
        metric_tokens_per_s: float,
    ) -> None:
        self.times.append(now)
        self.ready.append(fleet.ready)
        self.queue.append(queue_tokens)
        self.metric.append(metric_tokens_per_s)
        self.arrivals.append(tuple(start + s * self.dt for s in fleet.starting_ready_steps))
        if self.forecasting:
            self.forecasts.append(getattr(self.policy, "last_forecast", None))

    def signals(self, steps: int) -> FleetSignals:
        n = len(self.times)
        # Each assessment stands until the next one; the last until the end of the replay.
        durations = np.full(n, self.every * self.dt)
        if n:
            durations[-1] = (steps - (n - 1) * self.every) * self.dt
        return FleetSignals(
            every_seconds=self.every * self.dt,
            times=np.asarray(self.times, dtype=float),
            durations=durations,
            ready=np.asarray(self.ready, dtype=np.int64),
            queue_tokens=np.asarray(self.queue, dtype=float),
            metric_tokens_per_s=np.asarray(self.metric, dtype=float),
            arrivals=tuple(self.arrivals),
            forecasts=tuple(self.forecasts) if self.forecasting else None,
        )


@dataclass(frozen=True)
class Score:
    shortfall_minutes: int
    unserved_token_fraction: float
    gpu_hours: float
    scale_events: int
    peak_queue_tokens: float
    mean_queue_delay_seconds: float
    """Little's law over the run: queued token-seconds / tokens."""
    peak_replicas: int
    standby_gpu_hours: float = 0.0
    """Standby slots' GPU-hours at the standby cost fraction (included in ``gpu_hours``)."""
    warm_starts: int = 0
    direction_changes: int = 0
    """Scale events that reversed the previous one's direction (:func:`direction_changes`)."""
    minutes: int = 0
    """Replayed minutes scored."""

    @property
    def direction_changes_per_day(self) -> float:
        return self.direction_changes * 1440.0 / self.minutes if self.minutes else 0.0

    def as_dict(self) -> dict[str, float | int]:
        return {
            "shortfall_minutes": self.shortfall_minutes,
            "unserved_token_fraction": self.unserved_token_fraction,
            "gpu_hours": self.gpu_hours,
            "scale_events": self.scale_events,
            "direction_changes": self.direction_changes,
            "direction_changes_per_day": round(self.direction_changes_per_day, 2),
            "peak_queue_tokens": self.peak_queue_tokens,
            "mean_queue_delay_seconds": self.mean_queue_delay_seconds,
            "peak_replicas": self.peak_replicas,
            "standby_gpu_hours": self.standby_gpu_hours,
            "warm_starts": self.warm_starts,
        }


def fluid_queue(arrivals: FloatArray, capacity: FloatArray) -> tuple[FloatArray, FloatArray]:
    """FIFO fluid queue per step: (queue after each step, arrivals not served in their step)."""
    n = len(arrivals)
    queue = np.zeros(n)
    delayed = np.zeros(n)
    q = 0.0
    # Only steps where demand exceeds capacity, or a queue is left, need the recursion.
    short = arrivals > capacity
    if not short.any():
        return queue, delayed
    for i in range(int(np.flatnonzero(short)[0]), n):
        a = arrivals[i]
        c = capacity[i]
        if q == 0.0 and a <= c:
            continue
        free_for_new = max(0.0, c - q)
        late = max(0.0, a - free_for_new)
        q = max(0.0, q + a - c)
        queue[i] = q
        delayed[i] = late
    return queue, delayed


def direction_changes(replicas: FloatArray) -> int:
    """How often a count series changes direction: the changes of the count whose sign
    differs from the previous change's (up then down, or down then up; a first change and
    changes in the same direction count none)."""
    steps = np.diff(np.asarray(replicas, dtype=np.int64))
    signs = np.sign(steps[steps != 0])
    return int(np.count_nonzero(np.diff(signs)))


def score(run: PolicyRun, demand: Demand, config: FleetConfig) -> Score:
    """Score one replay (see the module docstring)."""
    spm = config.steps_per_minute
    steps = len(run.ready_per_step)
    minutes = steps // spm
    dt = config.step_seconds
    cap = config.replica_tokens_per_second
    tokens_min = demand.replay_tokens_per_s[:minutes]
    ready_min = run.ready_per_minute(spm)
    shortfall = int(np.count_nonzero(short_of(ready_min, tokens_min, cap)))
    arrivals = np.repeat(tokens_min, spm) * dt
    capacity = run.ready_per_step.astype(float) * cap * dt
    queue, delayed = fluid_queue(arrivals, capacity)
    total = float(arrivals.sum())
    per_slot_hour = dt * config.gpus_per_replica / 3600.0
    standby_gpu_hours = 0.0
    if run.standby_per_step is not None:
        held = float(run.standby_per_step[:steps].sum())
        standby_gpu_hours = held * per_slot_hour * config.standby_cost_fraction
    gpu_hours = float(run.existing_per_step.sum()) * per_slot_hour + standby_gpu_hours
    return Score(
        shortfall_minutes=shortfall,
        unserved_token_fraction=float(delayed.sum() / total) if total > 0 else 0.0,
        gpu_hours=gpu_hours,
        scale_events=run.scale_events,
        peak_queue_tokens=float(queue.max()) if len(queue) else 0.0,
        mean_queue_delay_seconds=float(queue.sum() * dt / total) if total > 0 else 0.0,
        peak_replicas=int(run.existing_per_step.max()) if steps else 0,
        standby_gpu_hours=standby_gpu_hours,
        warm_starts=run.warm_starts,
        # The brief's count: from the timeline's `<policy>_desired` (existing replicas, the
        # most within each minute).
        direction_changes=direction_changes(run.existing_per_minute(spm)),
        minutes=minutes,
    )


def span_score(
    run: PolicyRun, demand: Demand, config: FleetConfig, first_minute: int, end_minute: int
) -> dict[str, float | int]:
    """Scores of the replayed minutes ``[first_minute, end_minute)`` alone (e.g. a known
    event's window): shortfall minutes, the unserved share of the span's tokens, GPU-hours
    (standby included) and scale events in the span. The queue is the whole run's, so a
    backlog from before the span still delays the span's tokens."""
    spm = config.steps_per_minute
    minutes = len(run.ready_per_step) // spm
    a, b = max(0, first_minute), min(minutes, end_minute)
    if a >= b:
        raise ValueError("the span has no replayed minute")
    dt = config.step_seconds
    cap = config.replica_tokens_per_second
    tokens_min = demand.replay_tokens_per_s[:minutes]
    ready_min = run.ready_per_minute(spm)
    shortfall = int(np.count_nonzero(short_of(ready_min[a:b], tokens_min[a:b], cap)))
    arrivals = np.repeat(tokens_min, spm) * dt
    capacity = run.ready_per_step.astype(float) * cap * dt
    _, delayed = fluid_queue(arrivals, capacity)
    steps = slice(a * spm, b * spm)
    total = float(arrivals[steps].sum())
    per_slot_hour = dt * config.gpus_per_replica / 3600.0
    standby = 0.0
    if run.standby_per_step is not None:
        standby = float(run.standby_per_step[steps].sum()) * per_slot_hour
        standby *= config.standby_cost_fraction
    existing = run.existing_per_step
    before = existing[a * spm - 1] if a > 0 else existing[0]
    changes = np.diff(np.concatenate([[before], existing[steps]]))
    return {
        "minutes": b - a,
        "shortfall_minutes": shortfall,
        "unserved_token_fraction": float(delayed[steps].sum() / total) if total > 0 else 0.0,
        "gpu_hours": float(existing[steps].sum()) * per_slot_hour + standby,
        "standby_gpu_hours": standby,
        "scale_events": int(np.count_nonzero(changes)),
        "peak_replicas": int(existing[steps].max()),
    }


def timeline(demand: Demand, runs: list[PolicyRun], config: FleetConfig) -> pd.DataFrame:
    """The per-minute timeline in the brief's column order; then, for each policy that held
    standby, ``<policy>_standby`` (the most slots held within the minute)."""
    spm = config.steps_per_minute
    replay = demand.replay_tokens_per_s
    minutes = min(len(r.ready_per_step) for r in runs) // spm if runs else len(replay)
    columns: dict[str, object] = {
        "minute": np.arange(minutes, dtype=np.int64),
        "demand_tokens_per_s": replay[:minutes],
        "replica_tokens_per_s": np.full(minutes, config.replica_tokens_per_second),
    }
    for run in runs:
        columns[f"{run.name}_ready"] = run.ready_per_minute(spm)[:minutes]
        columns[f"{run.name}_desired"] = run.existing_per_minute(spm)[:minutes]
    for run in runs:
        held = run.standby_per_minute(spm)
        if held is not None:
            columns[f"{run.name}_standby"] = held[:minutes]
    return pd.DataFrame(columns)
