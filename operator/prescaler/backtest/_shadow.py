"""A shadow HPA, driven step by step by live observations, and the comparison with it (pure).

The operator runs the backtest's :class:`~prescaler.backtest.ReactivePolicy` (the HPA v2
algorithm, the same code) on the demand it observes, every 15 s sync, with the pool's
measured cold start deciding when a shadow replica becomes ready. Each reconcile hands
:func:`shadow_step` what it saw; the function advances the shadow through the syncs since
the last call and scores both fleets on each step, as the backtest scores a replay:

* **GPU-hours** - replicas that exist (starting or ready) x GPUs per replica x time; for
  prescaler also its standby (placeholder and hot standby pods: each holds GPUs).
* **Unserved demand** - what arrives beyond what the ready replicas serve in the step,
  through the backtest's FIFO fluid queue (:func:`~prescaler.backtest.fluid_queue`): a
  backlog delays what arrives behind it.
* **Short minutes** - minutes in which ready capacity was below demand at any step.
* **Direction changes** - scales whose direction differs from the previous scale's (a
  scale-down after a scale-up, or the reverse): prescaler's from its fleet's count at each
  observation (in dry run, its plan's), the shadow's from its syncs. The planner may change
  direction as often as the shadow over the trailing day, and no more
  (:func:`direction_budget`).

Prescaler's side is its real fleet (ready and existing replicas, standby); a pool in dry
run scales nothing, so its side is the plan's own fleet, simulated like the shadow's
(``Observed.planned``).

The counters live in buckets for :data:`KEEP_SECONDS` (7 days), which the operator keeps in
the pool's status, so a restarted or failed-over operator goes on from them: one per hour
for the last :data:`HOURLY_SECONDS` (the 24-hour window is exact), older hours merged into
one per UTC day (31 buckets for a week, not 168: a status write costs the API server in
proportion to the object's size). A gap
between observations longer than :data:`MAX_GAP_SECONDS` (an operator down, Prometheus
unreadable) is not scored: the shadow's replicas become ready meanwhile, nothing is counted.

The estimate's limits: demand is what reached the real fleet (served plus the queue's
growth where the fleet was saturated, as the caller passes it in); demand that clients gave
up on before it queued is not seen by either side.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from prescaler.backtest._fleet import short_of
from prescaler.backtest._policies import Observation, ReactivePolicy
from prescaler.backtest._simulate import fluid_queue
from prescaler.capacity import replicas_for
from prescaler.planning import BUDGET_MEMORY_SECONDS, Spend

SYNC_SECONDS = ReactivePolicy.sync_seconds
"""The HPA's sync period: the shadow's step."""
HOUR = 3600.0
DAY = 86400.0
KEEP_SECONDS = 7 * DAY
"""How long the buckets are kept: the longest window reported."""
HOURLY_SECONDS = DAY
"""Buckets stay hourly for this long; older hours are merged into one bucket per UTC day."""
WINDOWS: tuple[tuple[str, float], ...] = (("24h", 86400.0), ("7d", KEEP_SECONDS))
"""The rolling windows reported: name and length."""
WHOLE_DAY_HOURS = 22.0
"""The shadow has wholly observed its trailing day (:func:`direction_budget`) when it
scored this many hours of it: the window's 23 whole hours, less an hour of gaps."""
MAX_GAP_SECONDS = 300.0
"""A longer time without an observation is not scored (the demand in it is unknown)."""
_METRIC_LAG_SYNCS = 2
"""The HPA's metric is 30 s (two syncs) old: the pods that reported it are the ones that
were ready then."""


@dataclass(frozen=True, slots=True)
class ShadowFleet:
    """Replicas of a simulated fleet: ready ones and the ready times of starting ones."""

    ready: int = 0
    starting: tuple[float, ...] = ()
    """Unix seconds at which each starting replica becomes ready, ascending."""

    @property
    def existing(self) -> int:
        return self.ready + len(self.starting)

    def advance(self, now: float) -> ShadowFleet:
        """Replicas whose start is over by ``now`` are ready."""
        done = bisect.bisect_right(self.starting, now)
        if not done:
            return self
        return ShadowFleet(self.ready + done, self.starting[done:])

    def scale_to(self, replicas: int, now: float, cold_start_seconds: float) -> ShadowFleet:
        """``replicas`` from ``now``: new ones ready one cold start later; a scale-down
        removes starting replicas first (the least advanced), then ready ones."""
        replicas = max(0, replicas)
        if replicas >= self.existing:
            extra = (now + cold_start_seconds,) * (replicas - self.existing)
            return ShadowFleet(self.ready, tuple(sorted(self.starting + extra))).advance(now)
        keep = min(len(self.starting), max(0, replicas - self.ready))
        return ShadowFleet(min(self.ready, replicas), self.starting[:keep])


@dataclass(frozen=True, slots=True)
class Hour:
    """One bucket's counters: an hour, or (older than :data:`HOURLY_SECONDS`) the hours of
    one UTC day merged (``start``: its first second, unix)."""

    start: float
    seconds: float = 0.0
    """Seconds scored (observed) in the hour."""
    demand: float = 0.0
    """Demand that arrived (requests, or a role's tokens)."""
    gpu_hours: float = 0.0
    """Prescaler's GPU-hours, standby included."""
    standby_gpu_hours: float = 0.0
    """The standby part of ``gpu_hours``."""
    unserved: float = 0.0
    """Demand prescaler's ready replicas did not serve in the step it arrived."""
    short_minutes: int = 0
    hpa_gpu_hours: float = 0.0
    hpa_unserved: float = 0.0
    hpa_short_minutes: int = 0
    direction_changes: int = 0
    """Prescaler's fleet changed direction (scaled the other way than the scale before)."""
    hpa_direction_changes: int = 0
    span: float = HOUR
    """Seconds from ``start`` that the bucket covers: an hour, up to a day once merged."""

    def merged(self, other: Hour) -> Hour:
        """This bucket with ``other``'s counts added, covering up to ``other``'s end."""
        return Hour(
            self.start,
            seconds=self.seconds + other.seconds,
            demand=self.demand + other.demand,
            gpu_hours=self.gpu_hours + other.gpu_hours,
            standby_gpu_hours=self.standby_gpu_hours + other.standby_gpu_hours,
            unserved=self.unserved + other.unserved,
            short_minutes=self.short_minutes + other.short_minutes,
            hpa_gpu_hours=self.hpa_gpu_hours + other.hpa_gpu_hours,
            hpa_unserved=self.hpa_unserved + other.hpa_unserved,
            hpa_short_minutes=self.hpa_short_minutes + other.hpa_short_minutes,
            direction_changes=self.direction_changes + other.direction_changes,
            hpa_direction_changes=self.hpa_direction_changes + other.hpa_direction_changes,
            span=max(self.start + self.span, other.start + other.span) - self.start,
        )

    def counted_in(self, oldest: float) -> bool:
        """Whether a window from ``oldest`` counts this bucket: when most of it lies in
        the window (an hour: when it starts there; a day: its middle)."""
        return self.start + self.span / 2 >= oldest


@dataclass(frozen=True, slots=True)
class ShadowState:
    """Everything the comparison carries from one observation to the next."""

    clock: float | None = None
    """The last sync the shadow ran (unix s, a multiple of the sync period); ``None``:
    never started."""
    hpa: ShadowFleet = field(default_factory=ShadowFleet)
    planned: ShadowFleet | None = None
    """A dry-run pool's simulated fleet of its plan; ``None`` when the real fleet counts."""
    recommendations: tuple[tuple[float, int], ...] = ()
    """The HPA's scale-down stabilization window: (sync time, raw recommendation)."""
    metric_ready: tuple[int, ...] = ()
    """The shadow's ready replicas at the last syncs, oldest first (the metric's pods)."""
    queue: float = 0.0
    """Prescaler's fluid queue (demand units)."""
    hpa_queue: float = 0.0
    minute: float | None = None
    """Start of the minute being scored (unix s)."""
    short: bool = False
    """Prescaler was short in some step of ``minute``."""
    hpa_short: bool = False
    fleet_replicas: int | None = None
    """Prescaler's fleet (its plan's, in dry run) at the last observation."""
    direction: int = 0
    """The direction of prescaler's last scale: 1 up, -1 down, 0 none yet."""
    hpa_direction: int = 0
    """The direction of the shadow's last scale."""
    hours: tuple[Hour, ...] = ()
    """The counters' buckets, oldest first, for the last :data:`KEEP_SECONDS`: daily, then
    hourly for the last :data:`HOURLY_SECONDS`."""


@dataclass(frozen=True, slots=True)
class ShadowSetup:
    """The fleet both sides share: the pool's capacity, bounds and cold start."""

    replica_capacity: float
    """What one replica serves, in the demand's unit (requests/s, or a role's tokens/s)."""
    min_replicas: int
    max_replicas: int
    cold_start_seconds: float
    gpus_per_replica: int = 1
    target: float = 0.7
    """The HPA's target utilization."""

    def policy(self, recommendations: tuple[tuple[float, int], ...]) -> ReactivePolicy:
        """The backtest's reactive policy, resumed with its stabilization window."""
        policy = ReactivePolicy(
            replica_tokens_per_second=self.replica_capacity,
            min_replicas=self.min_replicas,
            max_replicas=self.max_replicas,
            target=self.target,
        )
        if recommendations:
            policy._recommendations = deque(recommendations)
        return policy

    def initial_replicas(self, demand: float | None, ready: int) -> int:
        """The shadow starts where an HPA at its target would be for the demand seen (the
        backtest's warm start), else at the real fleet's ready replicas."""
        want = ready
        if demand is not None:
            want = replicas_for(demand, self.target * self.replica_capacity)
        return min(max(want, self.min_replicas), self.max_replicas)


@dataclass(frozen=True, slots=True)
class Observed:
    """What one reconcile saw."""

    now: float
    demand: float | None
    """Demand arriving (the demand's unit per second): served plus the queue's growth where
    the fleet is saturated; ``None`` when unknown (nothing is scored, the HPA holds)."""
    ready: int
    """The real fleet's ready replicas."""
    existing: int
    """The real fleet's replicas that hold GPUs (ready or starting)."""
    standby: int = 0
    """The real fleet's standby pods that hold GPUs (placeholders, hot standby)."""
    planned: int | None = None
    """Dry run: the replicas the plan asks for, simulated in place of the real fleet."""
    planned_standby: int = 0
    """Dry run: the standby the plan asks for."""


@dataclass
class ShadowHpa:
    """A shadow HPA that a replay steps on the demand it observes, as the operator steps
    ``status.againstHpa``: what the relative objective (``spec.objective.relativeToHpa``)
    holds each lookahead against. Only the HPA's side is read."""

    setup: ShadowSetup
    state: ShadowState = field(default_factory=ShadowState)

    def observe(self, now: float, demand: float | None, ready: int, existing: int) -> None:
        """One more observation (the demand in the setup's unit, the real fleet's)."""
        self.state = shadow_step(self.state, self.setup, Observed(now, demand, ready, existing))

    @property
    def ready_capacity(self) -> float | None:
        """What the HPA's ready replicas serve now (``None`` before the first step)."""
        return hpa_ready_capacity(self.state, self.setup)

    @property
    def waiting(self) -> float:
        """The HPA's queue (the demand's unit)."""
        return self.state.hpa_queue

    def spend(self, now: float) -> Spend:
        """Both fleets' GPU-hours over the trailing day (:func:`trailing_spend`)."""
        return trailing_spend(self.state, now)

    def direction_budget(self, now: float, window: str = "24h") -> int:
        """Direction changes the fleet may still make (:func:`direction_budget`)."""
        return direction_budget(self.state, now, window)


def hpa_ready_capacity(state: ShadowState, setup: ShadowSetup) -> float | None:
    """What the shadow HPA's ready replicas serve as of its last sync (``None``: it has
    not started)."""
    if state.clock is None:
        return None
    return state.hpa.ready * setup.replica_capacity


def shadow_step(state: ShadowState, setup: ShadowSetup, seen: Observed) -> ShadowState:
    """The comparison after one more observation: the syncs from ``state.clock`` up to
    ``seen.now`` are run and scored on ``seen``'s demand and fleet."""
    now, clock = seen.now, state.clock
    if clock is None or now < clock or now - clock > MAX_GAP_SECONDS:
        return _restart(state, setup, seen)
    if seen.planned is None:
        state = replace(state, planned=None)
    elif state.planned is None:
        state = replace(state, planned=ShadowFleet(seen.ready))
    t = clock + SYNC_SECONDS
    while t <= now + 1e-9:
        if seen.demand is not None:
            state = _score_step(state, setup, seen, t - SYNC_SECONDS)
        state = _sync(state, setup, seen, t)
        t += SYNC_SECONDS
    return _prune(_fleet_moved(state, seen), now)


def _fleet_moved(state: ShadowState, seen: Observed) -> ShadowState:
    """Prescaler's fleet as ``seen``, a change of direction counted at ``seen.now``."""
    count = seen.planned if seen.planned is not None else seen.existing
    last = state.fleet_replicas
    if last is None or count == last:
        return replace(state, fleet_replicas=count)
    sign = 1 if count > last else -1
    if state.direction and sign != state.direction:
        state = replace(state, hours=tuple(_add(list(state.hours), seen.now, changes=1)))
    return replace(state, fleet_replicas=count, direction=sign)


def _restart(state: ShadowState, setup: ShadowSetup, seen: Observed) -> ShadowState:
    """The first observation, or the first after a gap that is not scored. A new shadow
    starts warm; after a gap the shadow goes on, its starting replicas ready by now."""
    clock = math.floor(seen.now / SYNC_SECONDS) * SYNC_SECONDS
    if state.clock is None or seen.now < state.clock:
        state = ShadowState(
            hours=state.hours,
            fleet_replicas=state.fleet_replicas,
            direction=state.direction,
            hpa_direction=state.hpa_direction,
        )
        hpa = ShadowFleet(setup.initial_replicas(seen.demand, seen.ready))
    else:
        state = _close_minute(state)
        hpa = state.hpa.advance(clock)
    planned = None
    if seen.planned is not None:
        planned = (state.planned or ShadowFleet(seen.ready)).advance(clock)
    state = replace(
        state,
        clock=clock,
        hpa=hpa,
        planned=planned,
        metric_ready=(),
        queue=0.0,
        hpa_queue=0.0,
    )
    return _fleet_moved(state, seen)


def _close_minute(state: ShadowState) -> ShadowState:
    """Count the minute being scored as short or not, and start none."""
    if state.minute is None:
        return state
    hours = _add(
        list(state.hours),
        state.minute,
        short_minutes=int(state.short),
        hpa_short=int(state.hpa_short),
    )
    return replace(state, minute=None, short=False, hpa_short=False, hours=tuple(hours))


def _sync(state: ShadowState, setup: ShadowSetup, seen: Observed, t: float) -> ShadowState:
    """One HPA sync at ``t`` (and the dry-run plan's fleet follows the plan)."""
    cold = setup.cold_start_seconds
    hpa = state.hpa.advance(t)
    recommendations = state.recommendations
    hours, hpa_direction = state.hours, state.hpa_direction
    if seen.demand is not None:
        policy = setup.policy(recommendations)
        then = state.metric_ready[0] if len(state.metric_ready) >= _METRIC_LAG_SYNCS else None
        desired = policy.decide(
            Observation(
                now=t,
                step=round(t / SYNC_SECONDS),
                ready=hpa.ready,
                existing=hpa.existing,
                metric_tokens_per_s=seen.demand,
                observed=_NO_HISTORY,
                ready_at_metric=then,
            )
        )
        desired = min(max(desired, setup.min_replicas), setup.max_replicas)
        if desired != hpa.existing:
            sign = 1 if desired > hpa.existing else -1
            if hpa_direction and sign != hpa_direction:
                hours = tuple(_add(list(hours), t, hpa_changes=1))
            hpa_direction = sign
        hpa = hpa.scale_to(desired, t, cold)
        recommendations = tuple(policy._recommendations or ())
    planned = state.planned
    if planned is not None and seen.planned is not None:
        planned = planned.advance(t).scale_to(seen.planned, t, cold)
    metric_ready = (*state.metric_ready, hpa.ready)[-_METRIC_LAG_SYNCS:]
    return replace(
        state,
        clock=t,
        hpa=hpa,
        planned=planned,
        recommendations=recommendations,
        metric_ready=metric_ready,
        hpa_direction=hpa_direction,
        hours=hours,
    )


_NO_HISTORY = pd.Series(dtype=float)


def _served(queue: float, arrivals: float, capacity: float) -> tuple[float, float]:
    """The backtest's fluid queue for one step that starts with ``queue`` waiting:
    (queue after, arrivals not served in the step)."""
    after, late = fluid_queue(np.array([queue, arrivals]), np.array([0.0, capacity]))
    return float(after[1]), float(late[1])


def _score_step(state: ShadowState, setup: ShadowSetup, seen: Observed, t: float) -> ShadowState:
    """Count the step ``[t, t + sync)`` for both fleets (as they were during it)."""
    assert seen.demand is not None
    dt = SYNC_SECONDS
    demand = max(0.0, seen.demand)
    cap = setup.replica_capacity
    if state.planned is not None:
        ready, existing, standby = state.planned.ready, state.planned.existing, seen.planned_standby
    else:
        ready, existing, standby = seen.ready, seen.existing, seen.standby
    queue, unserved = _served(state.queue, demand * dt, ready * cap * dt)
    hpa_queue, hpa_unserved = _served(state.hpa_queue, demand * dt, state.hpa.ready * cap * dt)
    short = bool(short_of(np.array([ready]), np.array([demand]), cap)[0])
    hpa_short = bool(short_of(np.array([state.hpa.ready]), np.array([demand]), cap)[0])
    # A minute is short if either fleet was short in any of its steps; counted when it ends.
    minute = math.floor(t / 60.0) * 60.0
    if minute != state.minute:
        state = _close_minute(state)
    per_hour = dt * setup.gpus_per_replica / HOUR
    hours = _add(
        list(state.hours),
        t,
        seconds=dt,
        demand=demand * dt,
        gpu_hours=(existing + standby) * per_hour,
        standby_gpu_hours=standby * per_hour,
        unserved=unserved,
        hpa_gpu_hours=state.hpa.existing * per_hour,
        hpa_unserved=hpa_unserved,
    )
    return replace(
        state,
        queue=queue,
        hpa_queue=hpa_queue,
        minute=minute,
        short=state.short or short,
        hpa_short=state.hpa_short or hpa_short,
        hours=tuple(hours),
    )


def _add(
    hours: list[Hour],
    t: float,
    *,
    seconds: float = 0.0,
    demand: float = 0.0,
    gpu_hours: float = 0.0,
    standby_gpu_hours: float = 0.0,
    unserved: float = 0.0,
    short_minutes: int = 0,
    hpa_gpu_hours: float = 0.0,
    hpa_unserved: float = 0.0,
    hpa_short: int = 0,
    changes: int = 0,
    hpa_changes: int = 0,
) -> list[Hour]:
    """``hours`` with the counts added to the bucket of ``t``'s hour."""
    start = math.floor(t / HOUR) * HOUR
    if not hours or hours[-1].start < start:
        hours.append(Hour(start))
    i = next(i for i in range(len(hours) - 1, -1, -1) if hours[i].start <= start)
    if hours[i].start != start:  # an hour older than the newest bucket (never in order)
        return hours
    hours[i] = hours[i].merged(
        Hour(
            start,
            seconds=seconds,
            demand=demand,
            gpu_hours=gpu_hours,
            standby_gpu_hours=standby_gpu_hours,
            unserved=unserved,
            short_minutes=short_minutes,
            hpa_gpu_hours=hpa_gpu_hours,
            hpa_unserved=hpa_unserved,
            hpa_short_minutes=hpa_short,
            direction_changes=changes,
            hpa_direction_changes=hpa_changes,
        )
    )
    return hours


def _prune(state: ShadowState, now: float) -> ShadowState:
    """Hours older than :data:`HOURLY_SECONDS` merged into their UTC day's bucket, and
    buckets no window counts any more dropped."""
    hour = math.floor(now / HOUR) * HOUR
    hourly_from = hour - HOURLY_SECONDS + HOUR
    oldest = hour - KEEP_SECONDS + HOUR
    if not state.hours or (
        state.hours[0].counted_in(oldest)
        and all(h.start >= hourly_from or h.start % DAY == 0 for h in state.hours)
    ):
        return state  # the old buckets are days already (one each: distinct starts)
    kept: list[Hour] = []
    for h in state.hours:
        if h.start < hourly_from:
            day = math.floor(h.start / DAY) * DAY
            if kept and kept[-1].start == day:
                kept[-1] = kept[-1].merged(h)
                continue
            h = replace(h, start=day, span=h.start + h.span - day)
        kept.append(h)
    return replace(state, hours=tuple(h for h in kept if h.counted_in(oldest)))


@dataclass(frozen=True, slots=True)
class Comparison:
    """Both fleets over one rolling window (the hours that start in its last ``span``)."""

    window: str
    observed_hours: float
    """Hours scored in the window: the comparison's coverage."""
    gpu_hours: float
    standby_gpu_hours: float
    hpa_gpu_hours: float
    unserved_fraction: float | None
    """Share of the window's demand prescaler left unserved (``None``: no demand)."""
    hpa_unserved_fraction: float | None
    short_minutes: int
    hpa_short_minutes: int
    direction_changes: int = 0
    """Times prescaler's fleet changed direction."""
    hpa_direction_changes: int = 0

    @property
    def saved_gpu_hours(self) -> float:
        return self.hpa_gpu_hours - self.gpu_hours

    @property
    def saved_fraction(self) -> float | None:
        """GPU-hours saved as a share of the shadow's (negative: prescaler used more)."""
        return self.saved_gpu_hours / self.hpa_gpu_hours if self.hpa_gpu_hours > 0 else None


def compare(state: ShadowState, now: float, window: str, span_seconds: float) -> Comparison:
    """Sum the buckets of the last ``span_seconds`` (the current hour included; a day's
    bucket when most of it lies in the window)."""
    oldest = math.floor(now / HOUR) * HOUR - span_seconds + HOUR
    hours = [h for h in state.hours if h.counted_in(oldest)]
    demand = sum(h.demand for h in hours)
    return Comparison(
        window=window,
        observed_hours=sum(h.seconds for h in hours) / HOUR,
        gpu_hours=sum(h.gpu_hours for h in hours),
        standby_gpu_hours=sum(h.standby_gpu_hours for h in hours),
        hpa_gpu_hours=sum(h.hpa_gpu_hours for h in hours),
        unserved_fraction=sum(h.unserved for h in hours) / demand if demand > 0 else None,
        hpa_unserved_fraction=sum(h.hpa_unserved for h in hours) / demand if demand > 0 else None,
        short_minutes=sum(h.short_minutes for h in hours),
        hpa_short_minutes=sum(h.hpa_short_minutes for h in hours),
        direction_changes=sum(h.direction_changes for h in hours),
        hpa_direction_changes=sum(h.hpa_direction_changes for h in hours),
    )


def trailing_spend(state: ShadowState, now: float) -> Spend:
    """Both fleets' GPU-hours over the trailing day (the ``24h`` window's buckets, as
    ``status.againstHpa.last24Hours`` reports them): what a cost budget
    (``spec.objective.budgetToHpa``) holds the pool to."""
    day = compare(state, now, "24h", BUDGET_MEMORY_SECONDS)
    return Spend(day.gpu_hours, day.hpa_gpu_hours, day.observed_hours)


def direction_budget(state: ShadowState, now: float, window: str = "24h") -> int:
    """How many more times prescaler's fleet may change direction over the trailing day
    (``window`` ``7d``: week): the shadow HPA's direction changes in it less the fleet's
    (the window's buckets). The planner holds a release that would reverse a scale-up while
    the day's is zero or less (``PlanInputs.direction_budget``), unless it frees most of
    the fleet and the week's is not (``PlanInputs.direction_reserve``). Over a window the
    shadow has not wholly observed (a new pool's first, or one with a gap in its metrics)
    one more: the shadow's count is then short of the HPA's, and a fleet that releases its
    overshoot before the HPA's first change of direction would otherwise keep it until
    then."""
    span = dict(WINDOWS)[window]
    seen = compare(state, now, window, span)
    left = seen.hpa_direction_changes - seen.direction_changes
    # A window the shadow has not wholly observed (a new pool, a metrics gap) does not hold
    # all of the HPA's changes yet: the fleet may lead it by one.
    whole = span / HOUR - (DAY / HOUR - WHOLE_DAY_HOURS)
    return left + 1 if seen.observed_hours < whole else left
