"""The planner: a pure function from forecast, capacity, fleet, policy and clock to a plan.

The rules, in order:

1. **Lead time.** Replicas asked for now are ready one cold start from now, so the target
   is the largest requirement over ``[now, now + cold start + margin]``. With the peak risk
   model (``PlanInputs.risk``, :mod:`prescaler.planning._risk`, what the operator and the
   backtest run) that is a calibrated quantile of the lookahead's *peak*: what is known
   now (the forecast mean's peak, or the observed demand if larger; when demand runs
   above the forecast's mean now, the forecast's climb over the lookahead from the
   observed level) plus the pool's typical demand, times the margin, less that typical
   demand; until the pool's own lookaheads calibrate the margin, the forecast's upper
   band. Without it, the forecast's *upper* quantile over the lookahead. The latest
   observed demand times ``observed_headroom`` (default 1: the present only) is a floor
   under it (the nowcast guard), so a forecast that lags a level shift never plans below
   what is already arriving; while it rises, the observation is taken as far up its rise
   as it climbs in ``observed_trend_seconds`` (the spec's default, 120 s: the ramp
   nowcast). The ramp extends a scale-up but does not start one: while what arrives now
   (sized as above without the ramp), the forecast and the floors fit the fleet, a climb
   only the nowcast sees adds no replica (a noisy minute looks like a ramp; an HPA within
   its tolerance does not act either). (The capacity model's own headroom multiplies
   both.) A full
   fleet serves only its capacity and queues the rest, so its served rate hides demand;
   when the queue is known, arrivals are what is served plus the queue's growth
   (conservation), and the backlog must drain by the time new capacity could arrive: the
   guard then asks for ``arrivals x headroom + waiting / lookahead`` (the queue term). It
   only ever adds: missing or garbage queue data is no term, and a draining queue lowers
   nothing below the plain guard.
2. **Windows.** Every scheduled window whose pre-warm span ``[start - lead, end)`` touches
   that lookahead adds its minimum (replicas, or load through the capacity model). The lead
   is stretched to the cold start plus margin when it is shorter, so the capacity is ready
   when the window opens.
3. **Bounds.** The result is clamped to ``[min_replicas, max_replicas]``.
4. **Missing data holds.** With no usable forecast (none, empty, stale or garbage), the
   plan may grow on observed demand and windows but never shrinks. With
   ``scale_down_requires_observation``, a missing observation (a metrics gap) holds too:
   a forecast that cannot be checked against the present does not release capacity.
5. **Scale-down.** Never below the windows' floor, and not within the stabilization
   period after a scale-up. The fleet may change direction as often as an HPA would on
   the same demand, and no more (``tests/unit/test_flapping.py``): given the direction
   changes left in the trailing day (``PlanInputs.direction_budget``: the shadow HPA's
   less the fleet's), a release that would reverse the last scale-up holds while none
   are left (unless it frees more than :data:`BORROW_SHARE` of the fleet and the trailing
   week has one left, ``PlanInputs.direction_reserve``), and frees more than
   :data:`RELEASE_TOLERANCE` of the fleet or waits. Every
   release keeps what the forecast asks back after the lookahead, over the rest of its
   horizon (sized as the target is), and waits wholly if that is every replica: buying
   replicas back is a direction change, and a dip whose end the forecast sees is not
   worth the changes a later release would need. Within the period
   after a release, replicas come back only for what arrives now (the nowcast guard or
   the queue term) or for a floor (``min_replicas``, a window), not for a forecast or
   margin alone: adding back what was just released is a second direction change in one
   period. With the risk model, a release
   keeps what it sizes for the lookahead (the target: a released replica can be back
   within it); without it, what the forecast's upper band needs over the lookahead *plus*
   the period, times the nowcast guard's headroom. Forecasts made at
   other times disagree, and a noisy one jumps from decision to decision, so a release
   also keeps the largest demand target (forecast, observation, queue; not a window's
   floor, which is known ahead and ends with the window) of the last lookahead plus period
   (with the risk model, plus :data:`RISK_MEMORY_PERIODS` periods): an HPA-style
   memory of recommendations, over the span in which a released replica would be needed
   back (``FleetState.recent_targets``). With the risk model each decision is remembered
   as the fleet that serves its demand with :data:`RELEASE_TOLERANCE` (the HPA's 10 %)
   to spare, this decision's included: a demand that hovers near a replica's edge holds
   that replica, as it holds an HPA. ``forecast`` mode releases at once
   what that does not need (the replica can be back one cold start before the forecast
   needs it); ``paced`` mode removes a bounded step at most once per stabilization period.
   Scale-up is immediate (optionally step-bounded), but for that period after a release.
6. **Standby.** Warm standby covers the gap between the plan and the most the horizon may
   ask for (the forecast's upper peak, and any window opening within it), so a surprise
   beyond the lookahead, or a window's pre-warm, starts from a warm node.
7. **No node, no more replicas.** Replicas the scheduler cannot place (Pending,
   ``Unschedulable``) are not arriving capacity. While any exist, a scale-up holds: more
   replicas would only queue behind them. (A scale-down removes them first.)
8. **Idle pools reach zero, and only they.** The plan goes from one replica to zero only
   with ``min_replicas`` 0 and demand witnessed zero or absent for a whole stabilization
   period (``FleetState.idle_seconds``). Such an idle pool may also shrink without a usable
   forecast (an absent series has no history to forecast from). Anything else that asks
   for a replica (forecast, window) still does.
9. **Hot standby.** While the replicas ready (plus hot pods already promoted) fall short
   of the plan, ready hot standby pods are promoted into the Service; promoted pods are
   retired once the target's own ready replicas cover the plan without them. A promoted
   pod that turned not Ready serves nothing: it is not counted, it is retired at once, and
   a ready standby pod, if any, is promoted in its place.

**Units.** Demand (forecast, observation, queue arrivals) counts in the capacity model's
:class:`~prescaler.capacity.DemandUnit`: requests/s for a unified pool, or one role's
tokens/s for a disaggregated one (prompt tokens for prefill, output tokens for decode),
each role planned on its own forecast by its own call. Request counts (a window's
expected requests/s, the queue) convert at the unit's tokens per request.

The planner never talks to a cluster: applying a plan is someone else's job.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

from prescaler.capacity import CapacityModel, Constraint, DemandUnit, replicas_for
from prescaler.planning._risk import (
    PEAK_CEILING,
    PeakRisk,
    RiskSizing,
    capped_demand,
    record_risk,
    sized_demand,
)
from prescaler.planning._windows import Occurrence, ScheduledWindow

RISK_MEMORY_PERIODS = 1
"""With the risk model, the memory of recent targets spans the lookahead plus this many
stabilization periods. Its targets follow what is known now, which jumps with a noisy
observation or forecast: a release must outlast those jumps, or the fleet flaps. Two
periods before the release kept :data:`RELEASE_TOLERANCE` to spare; with it, one period
flaps less than the HPA and costs less (``benchmarks/README.md``)."""
RELEASE_TOLERANCE = 0.1
"""The HPA's tolerance, on the release: each decision's demand target is remembered as the
fleet that serves its demand with this share to spare, so a release waits until every
decision of the memory fits in fewer replicas with that share to spare. An HPA does not
act on a load within 10 % of its target; without it, a demand that hovers near a replica's
edge added and released that replica again and again. A release that would reverse a
scale-up frees more than this share of the fleet, or waits (with ``directionChanges:
asHpa``): a direction change spent on less is one a later, larger release needs."""

BORROW_SHARE = 0.5
"""A release that frees more than this share of the fleet goes ahead when the trailing
day's direction changes are spent, if the trailing week's are not
(``PlanInputs.direction_reserve``): the fleet's count stays within the HPA's over the
week. Without it, a fleet that spent its day's changes on the afternoon's noise held the
evening's peak through the night, hours of the freed replicas where buying them back costs
one cold start of them: on NYC taxi at 600 s (last 28 days) three such nights held 32-44
replicas for 6-10 hours where the plan needed 3-6, 580 replica-hours (3 % of the HPA's
GPU-hours). Half: the fleet is then more than twice what the plan needs."""
HPA_DOWNSCALE_SECONDS = 300.0
"""Kubernetes' HPA scale-down stabilization window (its default behaviour): the largest
recommendation of this window holds. A pool that leads its HPA keeps its requirement as
long (``PlanInputs.leading_target``)."""

Mode = Literal["replicas", "hpaFloor", "kedaTrigger"]
ScaleDownMode = Literal["forecast", "paced"]
Action = Literal["scale_up", "scale_down", "hold", "steady"]
Driver = Literal[
    "forecast",
    "observed",
    "queue",
    "window",
    "floor",
    "release",
    "memory",
    "stabilization",
    "missing-data",
    "unschedulable",
    "reactive",
    "direction",
]
"""The rule a decision's replica count comes from: a requirement (``forecast``: the
forecast or the peak risk model; ``observed``: the nowcast guard; ``queue``; ``window``;
``floor``: min/maxReplicas), or what held replicas the requirement would release
(``release``: what the lookahead still needs, or what the forecast asks back over its
horizon of a release that would reverse a scale-up; ``memory``: the recent targets;
``stabilization``: too soon after a scale; ``missing-data``; ``unschedulable``;
``direction``: the fleet has changed direction as often as its shadow HPA over the
trailing day), or ``reactive``: the pool plans as its HPA would (``spec.policy``), the
HPA's count."""


class DemandPoint(Protocol):
    """One forecast step: demand over the step that ends at ``t``, in the capacity model's
    unit (requests/s, or a disaggregated role's tokens/s)."""

    @property
    def t(self) -> float: ...
    @property
    def mean(self) -> float: ...
    @property
    def upper(self) -> float: ...


class ForecastLike(Protocol):
    """What the planner needs of a forecast (``prescaler_forecast.Forecast`` fits)."""

    @property
    def points(self) -> Sequence[DemandPoint]: ...
    @property
    def generated_at(self) -> float: ...
    @property
    def step_seconds(self) -> float: ...


@dataclass(frozen=True, slots=True)
class ScalingPolicy:
    """How far ahead, how fast and within which bounds to scale.

    The field defaults are the bare planner's (a policy built by hand, as the unit tests
    do), not the product's: several differ from them (the stabilization period, the
    scale-down mode, the ramp nowcast). The product's defaults live in the spec, and
    ``prescaler.api.scaling_policy`` builds every policy the operator and the backtest
    (``prescaler backtest``, the benchmarks) plan with from it, setting each field."""

    min_replicas: int = 1
    max_replicas: int = 10
    lead_margin_seconds: float = 60.0
    """Added to the cold start: how much earlier than strictly needed capacity is ready."""
    observed_headroom: float = 1.0
    """Nowcast guard: the latest observed demand times this is a floor under the plan
    (>= 1). It covers the next step's rise when the forecast lags a level shift."""
    observed_trend_seconds: float = 0.0
    """The nowcast follows a ramp: while the observed demand rises
    (:attr:`FleetState.observed_rise_per_second`), the plan takes the observation as far
    up its rise as it climbs in this many seconds (0: the latest observation as it is)."""
    scale_down_mode: ScaleDownMode = "paced"
    """``forecast`` releases at once what the lookahead (the upper band over the next cold
    start plus margin, and the guard) does not need: a replica released now can be back,
    ready, before the forecast says it is needed. ``paced`` releases at most
    ``scale_down_max_percent`` per ``scale_down_stabilization_seconds``. Both wait
    ``scale_down_stabilization_seconds`` after a scale-up, and neither shrinks on missing
    data."""
    scale_down_stabilization_seconds: float = 600.0
    """No scale-down this soon after a scale-up; in ``paced`` mode also at most one
    scale-down per period."""
    scale_down_max_percent: float = 50.0
    """``paced`` mode: a scale-down step removes at most this share of current replicas
    (at least one)."""
    direction_changes_as_hpa: bool = True
    """Hold a release that would reverse a scale-up while no direction change is left
    (``PlanInputs.direction_budget``); ``False``: the budget is ignored."""
    scale_up_max_step: int | None = None
    """Replicas added per decision at most; ``None`` means unbounded."""
    scale_down_requires_observation: bool = False
    """Hold (no scale-down) while the observed demand is missing, e.g. in a metrics gap."""
    forecast_max_age_seconds: float = 900.0
    """A forecast older than this is stale: hold, don't shrink."""
    standby_max_replicas: int = 0
    """Upper bound on warm standby (placeholders); 0 disables standby."""
    mode: Mode = "replicas"
    """``replicas`` sets the target's replica count; ``hpaFloor`` sets an HPA's minReplicas;
    ``kedaTrigger`` serves the plan as a KEDA trigger's metric."""

    def __post_init__(self) -> None:
        if self.min_replicas < 0:
            raise ValueError("minReplicas must be >= 0")
        if self.max_replicas < max(self.min_replicas, 1):
            raise ValueError("maxReplicas must be >= minReplicas and >= 1")
        if self.lead_margin_seconds < 0 or self.scale_down_stabilization_seconds < 0:
            raise ValueError("lead margin and stabilization must be >= 0")
        if not (math.isfinite(self.observed_headroom) and self.observed_headroom >= 1):
            raise ValueError("observed headroom must be a finite number >= 1")
        if not (math.isfinite(self.observed_trend_seconds) and self.observed_trend_seconds >= 0):
            raise ValueError("observed trend seconds must be a finite number >= 0")
        if not 0 < self.scale_down_max_percent <= 100:
            raise ValueError("scale-down step percent must be in (0, 100]")
        if self.scale_up_max_step is not None and self.scale_up_max_step < 1:
            raise ValueError("scale-up step must be >= 1")
        if self.standby_max_replicas < 0:
            raise ValueError("standby max replicas must be >= 0")


@dataclass(frozen=True, slots=True)
class FleetState:
    """What the cluster looks like now, as far as the planner cares."""

    current_replicas: int
    """Replicas the target asks for now (in hpaFloor mode: the HPA's current minReplicas; in
    kedaTrigger mode: the plan last served)."""
    ready_replicas: int = 0
    last_scale_up_at: float | None = None
    last_scale_down_at: float | None = None
    observed_requests_per_second: float | None = None
    """Latest measured demand, in the capacity model's unit (requests/s, or a role's
    tokens/s); ``None`` when metrics are missing."""
    observed_rise_per_second: float | None = None
    """How fast the observed demand rose lately, in its unit per second
    (:func:`observed_rise`); ``None``: not known. Only a rise is used: a fall never
    releases anything sooner."""
    unschedulable_replicas: int = 0
    """Replicas of the target no node can take now (Pending, ``Unschedulable``)."""
    idle_seconds: float | None = None
    """How long demand has been zero or its series absent, as witnessed (``None``: it
    is not, or it is not known)."""
    hot_ready_replicas: int = 0
    """Ready hot standby pods, not yet promoted."""
    promoted_replicas: int = 0
    """Hot standby pods promoted into the Service and still serving."""
    promoted_unready_replicas: int = 0
    """Promoted pods that turned not Ready (not counted in ``promoted_replicas``)."""
    waiting_requests: float | None = None
    """Requests queued now, fleet-wide (``None``: not known)."""
    waiting_growth_per_second: float | None = None
    """How fast that queue grows, requests/s, negative while it drains (``None``: not
    known). ``observed_requests_per_second`` plus this is what arrives."""
    recent_targets: tuple[tuple[float, int], ...] = ()
    """The planner's recent targets as ``(time, replicas)``, oldest first: the previous
    decision's :attr:`ScalePlan.recent_targets` (the operator keeps them in status)."""


@dataclass(frozen=True, slots=True)
class PlanInputs:
    now: float
    capacity: CapacityModel
    fleet: FleetState
    policy: ScalingPolicy
    cold_start_seconds: float
    forecast: ForecastLike | None = None
    windows: Sequence[ScheduledWindow] = field(default_factory=tuple)
    forecast_expected: bool = True
    """``False`` for a pool planned on schedules and bounds alone: no forecast is then not
    missing data, so scale-down after a window is allowed."""
    risk: RiskSizing | None = None
    """The peak risk model's margin (:mod:`prescaler.planning._risk`). With it, the
    forecast's requirement is :func:`sized_demand` of ``max(forecast mean peak over the
    lookahead, observed, observed x the forecast's climb)`` (the forecast's upper band
    until calibrated), and a release keeps exactly that; without it, the forecast's upper
    band."""
    decision_interval_seconds: float = 0.0
    """How long this plan stands: the time to the next decision (the operator's reconcile
    period). The lookahead covers it too, since capacity the next decision asks for is
    ready only one cold start after *that* decision: so every replica a need calls for is
    Ready at least ``lead_margin_seconds`` before it, whenever the decisions fall."""
    reactive_replicas: int | None = None
    """The replicas the pool's HPA holds (its shadow HPA, at the pool's target), when the
    pool plans as its HPA would (``spec.policy``): that count replaces what the forecast,
    the observation and the queue ask, and nothing is remembered beyond it (the HPA's own
    stabilization is in the count). Windows, standby and the bounds apply as ever."""
    leading_target: float | None = None
    """With ``reactive_replicas``: the pool *leads* its HPA (``spec.policy: leading``). The
    forecast is the HPA's second metric, an External one at this target utilization: the
    forecast mean's peak over the lookahead needs :func:`leading_replicas`, and the larger
    of that and the HPA's count is the requirement, so a scale-up the forecast sees is asked
    for one lookahead before the demand shows it. A release keeps the largest requirement
    of the last :data:`HPA_DOWNSCALE_SECONDS`, as the HPA's scale-down window keeps its
    largest recommendation, and no longer; the limit on direction changes holds as in
    forecast mode (the larger of two noisy counts turns more often than either). ``None``:
    the HPA's count alone."""
    direction_budget: int | None = None
    """How many more times the fleet may change direction over the trailing day: the
    shadow HPA's direction changes in it less the fleet's
    (:func:`prescaler.backtest.trailing_direction_changes`); ``None``: no limit. At zero or
    below, a scale-down that reverses the last scale-up holds (a scale-up never does): the
    fleet changes direction no more often than the HPA on the same demand."""
    direction_reserve: int | None = None
    """The same over the trailing week (:func:`prescaler.backtest.direction_budget` over
    ``7d``); ``None``: none. With the day's spent, a release of more than
    :data:`BORROW_SHARE` of the fleet may spend the week's: the fleet's count stays within
    the HPA's over the week, and a night is not held at the evening's peak."""


@dataclass(frozen=True, slots=True)
class ScalePlan:
    """The decision, as a value. Applying it is a separate step."""

    now: float
    mode: Mode
    current_replicas: int
    desired_replicas: int
    target_replicas: int
    """What the lookahead asks for, before scale-down pacing."""
    action: Action
    constraint: Constraint
    reason: str
    standby_replicas: int
    lookahead_seconds: float
    forecast_usable: bool
    forecast_peak_requests_per_second: float | None
    """Largest upper-quantile demand inside the lookahead."""
    active_windows: tuple[str, ...] = ()
    unschedulable_replicas: int = 0
    """Replicas no node can take (a scale-up holds while there are any)."""
    idle: bool = False
    """Demand zero or absent for a whole stabilization period (``min_replicas`` 0)."""
    promote_replicas: int = 0
    """Hot standby pods to promote into the Service now."""
    retire_replicas: int = 0
    """Promoted pods no longer needed (the target's own ready replicas cover the plan)."""
    retire_unready_replicas: int = 0
    """Promoted pods that turned not Ready: retired whatever the plan (they serve nothing);
    ``promote_replicas`` already counts the ready standby pods that take their place."""
    recent_targets: tuple[tuple[float, int], ...] = ()
    """The demand targets a scale-down must respect from now on: this decision's, and the
    earlier ones of the last lookahead plus stabilization period that are larger (rule 5);
    with the risk model, each is the fleet that serves its demand with
    :data:`RELEASE_TOLERANCE` to spare."""
    driver: Driver = "floor"
    """The rule the desired count comes from (see :data:`Driver`)."""
    risk_base: float | None = None
    """With the risk model: what is known now (the forecast mean's peak over the
    lookahead, or the observed demand if larger, or the forecast's climb from the observed
    level when demand runs above the forecast), in the demand's unit."""
    risk_sized: float | None = None
    """With the risk model: the demand sized for (:func:`sized_demand`)."""
    risk_unit: float | None = None
    """With the risk model: the typical demand (at least one replica's capacity) the
    margin also covers: it sizes ``(base + unit) x margin - unit``."""
    forecast_mean_peak: float | None = None
    """The usable forecast mean's largest value within the lookahead, in the demand's unit
    (``None`` without a usable forecast): what a pool that leads its HPA sizes on."""

    @property
    def changed(self) -> bool:
        return self.desired_replicas != self.current_replicas


def _usable_points(forecast: ForecastLike | None, now: float, max_age: float) -> list[DemandPoint]:
    if forecast is None or now - forecast.generated_at > max_age:
        return []
    points = [p for p in forecast.points if p.t > now]
    if not points or any(
        not (math.isfinite(p.upper) and p.upper >= 0 and math.isfinite(p.mean)) for p in points
    ):
        return []
    return points


def _queue_demand(
    fleet: FleetState, served: float, headroom: float, lookahead: float, unit: DemandUnit
) -> tuple[float, str] | None:
    """The queue term in the demand's unit, ``arrivals x headroom + waiting / lookahead``
    where arrivals are ``served + queue growth``, and how it came about; ``None`` without
    usable queue data (each part is left out alone when it is missing or garbage). The
    queue counts requests; a role's tokens are ``unit.per_request`` per request."""
    growth = fleet.waiting_growth_per_second
    if growth is not None and not math.isfinite(growth):
        growth = None
    waiting = fleet.waiting_requests
    if waiting is not None and not (math.isfinite(waiting) and waiting >= 0):
        waiting = None
    if growth is None and waiting is None:
        return None
    per = unit.per_request
    arriving = max(0.0, served + (growth or 0.0) * per)
    drain = waiting * per / lookahead if waiting is not None and lookahead > 0 else 0.0
    extra = f" x{headroom:g}" if headroom != 1 else ""
    what = f"served {served:.3g} {unit.name}"
    if growth is not None:
        what += f" {(growth or 0.0) * per:+.3g} queue growth = {arriving:.3g} arriving"
    what += extra
    if drain > 0:
        what += f" + {waiting:.0f} waiting / {lookahead:.0f}s"
    return arriving * headroom + drain, what


def _replica_rate(capacity: CapacityModel) -> float:
    """One replica's demand, or 0 where the capacity model's numbers are absurd (a token
    mix of 1e308: requirements saturate, and so does this)."""
    try:
        rate = capacity.replica_requests_per_second
    except (OverflowError, ValueError):
        return 0.0
    return rate if math.isfinite(rate) and rate > 0 else 0.0


def leading_replicas(mean_peak: float, replica_rate: float, target: float) -> int:
    """The replicas an HPA at ``target`` utilization would hold for the forecast mean's
    peak (``replica_rate``: one replica's demand); 0 for a peak or rate that is not a
    positive number."""
    if not (math.isfinite(mean_peak) and mean_peak > 0 and replica_rate > 0 and target > 0):
        return 0
    return replicas_for(mean_peak, target * replica_rate)


def _remember(
    recent: Sequence[tuple[float, int]], now: float, target: int, memory: float
) -> tuple[tuple[float, int], ...]:
    """The recent targets within ``memory`` seconds, with ``(now, target)`` appended, kept
    only where they still bound the maximum: an entry with a later one at least as large
    can never be the largest again, so the list is strictly decreasing in replicas and
    stays short (it is kept in the pool's status)."""
    kept = [(t, r) for t, r in recent if now - memory < t <= now and r > target]
    out: list[tuple[float, int]] = []
    for t, r in kept:
        while out and out[-1][1] <= r:
            out.pop()
        out.append((t, r))
    return (*out, (now, target))


RISE_MIN_AGE_SECONDS = 50.0
""":func:`observed_rise` measures the rise since an observation at least this old..."""
RISE_MAX_AGE_SECONDS = 180.0
"""...and at most this old: a rise over a longer gap says nothing about a ramp now."""


def remember_observation(
    recent: Sequence[tuple[float, float]], now: float, observed: float | None
) -> tuple[tuple[float, float], ...]:
    """The observations :func:`observed_rise` needs: ``recent`` (``(time, demand)``,
    oldest first) within :data:`RISE_MAX_AGE_SECONDS` of ``now``, only the newest of those
    at least :data:`RISE_MIN_AGE_SECONDS` old and the younger ones, with ``(now,
    observed)`` appended when it is a measurement (missing or garbage demand adds
    nothing)."""
    kept = [(t, v) for t, v in recent if now - RISE_MAX_AGE_SECONDS <= t < now]
    old = [i for i, (t, _) in enumerate(kept) if now - t >= RISE_MIN_AGE_SECONDS]
    if old:
        kept = kept[old[-1] :]
    if observed is not None and math.isfinite(observed) and observed >= 0:
        kept.append((now, observed))
    return tuple(kept)


def observed_rise(
    recent: Sequence[tuple[float, float]], now: float, observed: float | None
) -> float | None:
    """How fast the observed demand rose, per second: from the newest of ``recent``
    (``(time, demand)``) that is between :data:`RISE_MIN_AGE_SECONDS` and
    :data:`RISE_MAX_AGE_SECONDS` old to ``observed`` now. ``None`` without such an
    observation or without a measurement now; negative while demand falls."""
    if observed is None or not (math.isfinite(observed) and observed >= 0):
        return None
    earlier = [
        (t, v)
        for t, v in recent
        if RISE_MIN_AGE_SECONDS <= now - t <= RISE_MAX_AGE_SECONDS and math.isfinite(v)
    ]
    if not earlier:
        return None
    t0, v0 = max(earlier)
    return (observed - v0) / (now - t0)


def _climb_at_observed(
    points: Sequence[DemandPoint],
    step: float,
    now: float,
    mean_peak: float,
    observed: float | None,
) -> float | None:
    """The forecast's climb over the lookahead, from the observed level: ``observed`` times
    the forecast mean's peak over its mean now (the step that holds ``now``), when demand
    runs above that mean; else ``None``. A forecast that runs low (an unusual day, a level
    the seasonal history did not have) still knows the ramp's *shape*: the ramp climbs
    from where demand is, not from where the forecast thought it would be. Only ever
    raises the base (``mean_peak`` above its mean now), never lowers it."""
    if observed is None or not (math.isfinite(observed) and observed > 0) or step <= 0:
        return None
    current = next((p.mean for p in points if p.t - step <= now < p.t), None)
    if current is None or not (math.isfinite(current) and current > 0) or observed <= current:
        return None
    if not (math.isfinite(mean_peak) and mean_peak > current):
        return None
    return observed * mean_peak / current


def _window_requirement(
    occurrences: Sequence[Occurrence], capacity: CapacityModel
) -> tuple[int, tuple[str, ...]]:
    floor = 0
    for occurrence in occurrences:
        if occurrence.min_replicas is not None:
            floor = max(floor, occurrence.min_replicas)
        if occurrence.expected_requests_per_second is not None:
            load = occurrence.expected_requests_per_second * capacity.unit.per_request
            floor = max(floor, capacity.required(load).replicas)
    return floor, tuple(dict.fromkeys(o.name for o in occurrences))


def plan(inputs: PlanInputs) -> ScalePlan:
    """Decide the replica count for ``inputs.now``. Pure and deterministic."""
    now, policy, fleet, capacity = inputs.now, inputs.policy, inputs.fleet, inputs.capacity
    if inputs.cold_start_seconds < 0:
        raise ValueError("cold start must be >= 0")
    interval = inputs.decision_interval_seconds
    if not (math.isfinite(interval) and interval >= 0):
        raise ValueError("decision interval must be a finite number >= 0")
    lookahead = inputs.cold_start_seconds + policy.lead_margin_seconds + interval
    horizon_end = now + lookahead

    points = _usable_points(inputs.forecast, now, policy.forecast_max_age_seconds)
    usable = bool(points)
    step = inputs.forecast.step_seconds if inputs.forecast is not None else 0.0
    in_lookahead = [p for p in points if p.t - step <= horizon_end]
    peak = max((p.upper for p in in_lookahead), default=None)
    forecast_mean_peak = max((p.mean for p in in_lookahead), default=None)
    # A replica released now is not added back within the stabilization period (that
    # would be a second direction change), so a release keeps what that period needs too.
    keep_until = horizon_end + policy.scale_down_stabilization_seconds
    keep_peak = max((p.upper for p in points if p.t - step <= keep_until), default=None)

    candidates: list[tuple[int, Constraint, str, Driver]] = []
    rates: list[float] = []  # what each demand candidate sizes for, in the demand's unit
    without_ramp = 0  # what the demand candidates need without the ramp nowcast
    observed = fleet.observed_requests_per_second
    seen = observed is not None and math.isfinite(observed) and observed >= 0
    rising = ""
    rise = fleet.observed_rise_per_second
    ramp = 0.0
    # Not within a stabilization period after a release: noise that looks like a climb
    # would add back what was just released (a second direction change in the period).
    released = fleet.last_scale_down_at
    settled = released is None or now - released >= policy.scale_down_stabilization_seconds
    if seen and settled and rise is not None and math.isfinite(rise) and rise > 0:
        ramp = rise * policy.observed_trend_seconds
    arriving = observed  # what arrives now, without the ramp
    if ramp > 0 and observed is not None:
        # A ramp under way: what arrives now is sized where it is heading, as a reactive
        # HPA's proportional step does (its first order covers the climb).
        rising = f" (rising {rise:.3g}/s, {observed:.3g} now)"
        observed += ramp
    risk_base = risk_sized = risk_unit = None
    if inputs.risk is not None and in_lookahead:
        mean_peak = max(p.mean for p in in_lookahead)
        if not (math.isfinite(mean_peak) and mean_peak >= 0):
            mean_peak = 0.0
        risk_base = max(mean_peak, observed if observed is not None and seen else 0.0)
        source = f"observed{rising}" if risk_base > mean_peak else "forecast mean peak"
        climbed = _climb_at_observed(points, step, now, mean_peak, observed if seen else None)
        if climbed is not None:  # above both the observation and the mean's peak
            risk_base, source = climbed, f"observed{rising} x the forecast's climb"
        risk_unit = max(_replica_rate(capacity), inputs.risk.typical)
        margin = inputs.risk.margin
        if inputs.risk.calibrated:
            sized = sized_demand(risk_base, margin, risk_unit)
            risk_sized = capped_demand(sized, risk_base, inputs.risk.peak)
            how = (
                f"{source} {risk_base:.3g} (+{risk_unit:.3g} typical) x{margin:.2f} "
                f"(quantile {inputs.risk.level:.3f})"
            )
            if risk_sized < sized:
                how += f", at most {PEAK_CEILING:g}x the peak seen"
        else:
            # Not calibrated yet: the forecast's own upper band, or what arrives now; the
            # band's margin under the same ceiling as a calibrated one.
            banded = max(risk_base, peak or 0.0)
            risk_sized = capped_demand(banded, risk_base, inputs.risk.peak)
            how = f"the forecast's upper band or {source} {risk_base:.3g}, until calibrated"
            if risk_sized < banded:
                how += f", at most {PEAK_CEILING:g}x the peak seen"
        need = capacity.required(risk_sized)
        rates.append(risk_sized)
        if ramp > 0 and arriving is not None:
            # The same sizing on what arrives now, without the ramp's extrapolation.
            flat = max(mean_peak, arriving)
            flat = _climb_at_observed(points, step, now, mean_peak, arriving) or flat
            if inputs.risk.calibrated:
                unramped = sized_demand(flat, margin, risk_unit)
            else:
                unramped = max(flat, peak or 0.0)
            unramped_need = capacity.required(capped_demand(unramped, flat, inputs.risk.peak))
            without_ramp = max(without_ramp, unramped_need.replicas)
        candidates.append(
            (
                need.replicas,
                need.constraint,
                f"peak within {lookahead:.0f}s: {how} = {risk_sized:.3g} {capacity.unit.name}"
                f" needs {need.replicas}",
                "forecast",
            )
        )
    elif peak is not None:
        need = capacity.required(peak)
        rates.append(peak)
        without_ramp = max(without_ramp, need.replicas)
        candidates.append(
            (
                need.replicas,
                need.constraint,
                f"forecast upper {peak:.3g} {capacity.unit.name} within {lookahead:.0f}s "
                f"needs {need.replicas}",
                "forecast",
            )
        )
    if observed is not None and seen:
        need = capacity.required(observed * policy.observed_headroom)
        rates.append(observed * policy.observed_headroom)
        if arriving is not None:
            plain = capacity.required(arriving * policy.observed_headroom).replicas
            without_ramp = max(without_ramp, plain)
        extra = f" x{policy.observed_headroom:g}" if policy.observed_headroom != 1 else ""
        candidates.append(
            (
                need.replicas,
                need.constraint,
                f"observed {observed:.3g} {capacity.unit.name}{rising}{extra} needs "
                f"{need.replicas}",
                "observed",
            )
        )

        # The queue term: only when it asks for more than the guard (it never lowers it).
        queued = _queue_demand(fleet, observed, policy.observed_headroom, lookahead, capacity.unit)
        if queued is not None and queued[0] > observed * policy.observed_headroom:
            need = capacity.required(queued[0])
            rates.append(queued[0])
            without_ramp = max(without_ramp, need.replicas)
            candidates.append(
                (
                    need.replicas,
                    need.constraint,
                    f"queue: {queued[1]} needs {need.replicas}",
                    "queue",
                )
            )

    reactive = inputs.reactive_replicas
    led = reactive is not None and inputs.leading_target is not None
    k = 0  # leading: the forecast's count at the HPA's target
    if reactive is not None:
        # Planning as the HPA would: its count is what demand asks for.
        n = max(0, reactive)
        candidates = [(n, "compute", f"reactive: the pool's HPA holds {n}", "reactive")]
        lead = inputs.leading_target
        if lead is not None and forecast_mean_peak is not None:
            k = min(leading_replicas(forecast_mean_peak, _replica_rate(capacity), lead), 10**9)
            k = min(k, policy.max_replicas)
            if k > n:
                candidates.append(
                    (
                        k,
                        "compute",
                        f"leading: the forecast mean's peak {forecast_mean_peak:.3g} "
                        f"{capacity.unit.name} within {lookahead:.0f}s at the HPA's target "
                        f"{lead:g} needs {k} (the HPA holds {n})",
                        "forecast",
                    )
                )

    # What demand asks for (forecast, observation, queue): the memory keeps these only, as
    # a window's floor is known in advance and ends when the window does.
    demand_target = min(max((c[0] for c in candidates), default=0), policy.max_replicas)
    demand_rate = max(rates, default=None) if reactive is None else None

    # A window pre-warms `lead` ahead, but never later than one cold start plus margin ahead.
    # A window's occurrences all ask the same, and the first to come starts (and pre-warms)
    # first: it alone tells whether the window is on, however often the window fires.
    occurrences = [
        o
        for w in inputs.windows
        for o in w.occurrences(now, horizon_end, limit=1)
        if min(o.prewarm_at, o.start - lookahead) <= now
    ]
    window_floor, window_names = _window_requirement(occurrences, capacity)
    if occurrences:
        names = ", ".join(window_names)
        candidates.append(
            (window_floor, "schedule", f"window {names} needs {window_floor}", "window")
        )
    candidates.append((policy.min_replicas, "floor", f"minReplicas {policy.min_replicas}", "floor"))

    target, constraint, why, driver = max(candidates, key=lambda c: c[0])
    if target > policy.max_replicas:
        why += f", capped at maxReplicas {policy.max_replicas}"
        target, driver = policy.max_replicas, "floor"

    current = fleet.current_replicas
    period = policy.scale_down_stabilization_seconds
    idle = (
        policy.min_replicas == 0 and fleet.idle_seconds is not None and fleet.idle_seconds >= period
    )
    if idle:
        why += f" (idle: no demand for {fleet.idle_seconds:.0f}s)"
    elif target == 0 and current > 0:
        target = 1
        why += f"; zero only after {period:.0f}s of zero or absent demand"
    hard_floor = min(max(window_floor, policy.min_replicas), policy.max_replicas)
    floor_driver: Driver = "window" if window_floor > policy.min_replicas else "floor"
    # With the risk model, a release keeps what it sizes for the lookahead (a released
    # replica can be back, ready, within it): the target itself, so nothing more here.
    if risk_sized is None and keep_peak is not None and reactive is None:
        # The guard will ask for observed demand x headroom within that period, and the
        # upper band is where observed demand is expected to stay.
        guard = policy.observed_headroom if seen else 1.0
        keep = capacity.required(keep_peak * guard).replicas
        if min(keep, policy.max_replicas) > hard_floor:
            hard_floor, floor_driver = min(keep, policy.max_replicas), "release"
    # The memory: a release keeps the largest target of the last lookahead plus period
    # (with the risk model, RISK_MEMORY_PERIODS periods), so a forecast that jumps from
    # one decision to the next does not flap the fleet. With the risk model, each target is
    # remembered with the HPA's tolerance to spare (this decision's too): a demand within
    # it of the fleet's edge holds the fleet, as it holds an HPA.
    memory = lookahead + period * (RISK_MEMORY_PERIODS if risk_sized is not None else 1)
    if led:
        # Leading its HPA: the HPA's scale-down window over the larger of its count and the
        # forecast's. (The forecast's alone turned a noisy pool's fleet more often than its
        # HPA: the HPA's count comes stabilized, the larger of the two less so.)
        memory = max(memory, HPA_DOWNSCALE_SECONDS)
    spared = demand_target
    if risk_sized is not None and demand_rate is not None and math.isfinite(demand_rate):
        spared = capacity.required(demand_rate * (1 + RELEASE_TOLERANCE)).replicas
        spared = max(demand_target, min(spared, policy.max_replicas))
    recent = _remember(fleet.recent_targets, now, spared, memory)
    if not idle and reactive is None:
        remembered = max((r for _, r in recent), default=0)
        if min(remembered, policy.max_replicas) > hard_floor:
            hard_floor, floor_driver = min(remembered, policy.max_replicas), "memory"
    elif not idle and led:
        remembered = max((r for t, r in recent if now - t < HPA_DOWNSCALE_SECONDS), default=0)
        if min(remembered, policy.max_replicas) > hard_floor:
            hard_floor, floor_driver = min(remembered, policy.max_replicas), "memory"
    blind = policy.scale_down_requires_observation and not seen
    may_shrink = (usable and not blind) or not inputs.forecast_expected or idle
    desired, action, reason = _pace(inputs, target, hard_floor, may_shrink, why)
    if action == "hold" and usable and blind and inputs.forecast_expected and not idle:
        reason = f"hold {current}: no observed demand, so no scale-down"
    # Within a stabilization period after a release, replicas come back for what arrives
    # now (the guard or the queue) or for a floor (minReplicas, a window), not for a
    # forecast or margin alone: one that asks again at once is the noise the release was
    # to outlast, and adding them back is a second direction change in the period.
    present = max((c[0] for c in candidates if c[3] in ("observed", "queue")), default=0)
    fixed_floor = min(max(window_floor, policy.min_replicas), policy.max_replicas)
    if (
        action == "scale_up"
        and not settled
        and reactive is None
        and current >= fixed_floor
        and present <= current
    ):
        desired, action, driver = current, "hold", "stabilization"
        reason = (
            f"hold {current} (target {target}): released {now - (released or now):.0f}s "
            f"ago; within the stabilization period ({period:.0f}s) only what arrives now "
            f"adds replicas back, and it needs {present}: {why}"
        )
    # A climb the ramp nowcast alone sees extends a scale-up, it does not start one: while
    # what arrives now (and the forecast, and a floor) fits the fleet, a noisy minute that
    # looks like a ramp adds nothing, as an HPA within its tolerance adds nothing.
    ramp_alone = max(without_ramp, fixed_floor) <= current
    if action == "scale_up" and ramp > 0 and reactive is None and ramp_alone:
        desired, action, driver = current, "hold", "stabilization"
        reason = (
            f"hold {current} (target {target}): only the ramp nowcast asks for more; "
            f"without it the plan needs {max(without_ramp, fixed_floor)}: {why}"
        )
    # Replicas released and bought back cost a direction change (two, if the release
    # reverses a scale-up): a release keeps what the forecast asks back over its horizon,
    # and waits wholly if that is every replica. One that would reverse a scale-up frees
    # more than the HPA's tolerance of the fleet, or waits: a change is not spent on less.
    if action == "scale_down" and reactive is None and policy.direction_changes_as_hpa:
        asked = min(_asked_back(inputs, points, step, horizon_end, risk_unit), policy.max_replicas)
        if asked >= current:
            desired, action, driver = current, "hold", "release"
            reason = (
                f"hold {current} (target {target}): the forecast asks {asked} back within "
                f"its horizon; buying them back would be a direction change: {why}"
            )
        elif asked > desired:
            desired, driver = asked, "release"
            reason = (
                f"scale down {current} -> {desired} (target {target}): the forecast asks "
                f"{asked} back within its horizon: {why}"
            )
        if (
            action == "scale_down"
            and _last_move_up(fleet)
            and current <= policy.max_replicas
            and current - desired <= RELEASE_TOLERANCE * current
        ):
            freed = current - desired
            desired, action, driver = current, "hold", "release"
            reason = (
                f"hold {current} (target {target}): releasing {freed} would reverse the last "
                f"scale-up for no more than the HPA's tolerance ({RELEASE_TOLERANCE:.0%} of "
                f"the fleet): {why}"
            )
    # The fleet changes direction no more often than its HPA on the same demand: once it
    # has over the trailing day, a release that would reverse the last scale-up waits (the
    # HPA's own count grows, or an old change leaves the day). A scale-up never waits.
    budget = inputs.direction_budget
    reserve = inputs.direction_reserve
    limited = (
        action == "scale_down"
        and (reactive is None or led)
        and budget is not None
        and budget <= 0
        and policy.direction_changes_as_hpa
        and _last_move_up(fleet)
        and current <= policy.max_replicas
    )
    borrows = reserve is not None and reserve > 0 and current - desired > BORROW_SHARE * current
    if limited and borrows:
        reason += (
            f" (the trailing day's direction changes are spent; releasing more than "
            f"{BORROW_SHARE:.0%} of the fleet spends one of the week's {reserve})"
        )
    elif limited:
        desired, action, driver = current, "hold", "direction"
        reason = (
            f"hold {current} (target {target}): the fleet has changed direction as often "
            f"as its shadow HPA over the trailing day, and a release now would be one more: "
            f"{why}"
        )
    stuck = fleet.unschedulable_replicas
    least = min(policy.min_replicas, policy.max_replicas)
    if action == "scale_up" and stuck > 0 and current >= least:
        desired, action = current, "hold"
        reason = (
            f"hold {current} (target {target}): {stuck} replicas cannot be scheduled "
            f"(no node has room), more would only queue: {why}"
        )
        driver = "unschedulable"
    elif action == "scale_up" and stuck > 0:
        # minReplicas is the user's floor: asked for even while pods wait for room (a
        # cluster autoscaler sizes nodes for the pods it sees waiting), nothing beyond it.
        desired = min(desired, least)
        reason = (
            f"scale up {current} -> {desired} (minReplicas; target {target}): {stuck} replicas "
            f"cannot be scheduled (no node has room), more would only queue: {why}"
        )
        driver = "floor"
    elif desired > target and driver not in ("direction", "release"):
        # Replicas the requirement would release, kept: by which rule (unless the direction
        # limit or what the forecast asks back, above, kept them).
        if desired == current and (not may_shrink or (blind and inputs.forecast_expected)):
            driver = "missing-data"
        elif desired > hard_floor:
            driver = "stabilization"
        else:
            driver = floor_driver

    serving = fleet.ready_replicas + fleet.promoted_replicas
    promote = min(fleet.hot_ready_replicas, max(0, desired - serving))
    retire = min(fleet.promoted_replicas, max(0, serving - desired))
    retire_unready = max(0, fleet.promoted_unready_replicas)

    standby = 0
    if policy.standby_max_replicas > 0:
        # Everything the horizon may ask for: the forecast's whole upper peak, and every
        # window that opens within it (or within the next two lookaheads), so that a
        # window's pre-warm finds warm nodes instead of starting cold.
        whole_peak = capacity.required(max(p.upper for p in points)).replicas if points else 0
        until = max(points[-1].t if points else now, now + 2 * lookahead)
        upcoming = [o for w in inputs.windows for o in w.occurrences(now, until, limit=1)]
        whole_peak = max(whole_peak, _window_requirement(upcoming, capacity)[0])
        room = max(0, policy.max_replicas - desired)
        standby = min(max(0, whole_peak - desired), policy.standby_max_replicas, room)

    return ScalePlan(
        now=now,
        mode=policy.mode,
        current_replicas=current,
        desired_replicas=desired,
        target_replicas=target,
        action=action,
        constraint=constraint,
        reason=reason,
        standby_replicas=standby,
        lookahead_seconds=lookahead,
        forecast_usable=usable,
        forecast_peak_requests_per_second=peak,
        active_windows=window_names,
        unschedulable_replicas=stuck,
        idle=idle,
        promote_replicas=promote,
        retire_replicas=retire,
        retire_unready_replicas=retire_unready,
        recent_targets=recent,
        driver=driver,
        risk_base=risk_base,
        risk_sized=risk_sized,
        risk_unit=risk_unit,
        forecast_mean_peak=forecast_mean_peak,
    )


def _asked_back(
    inputs: PlanInputs,
    points: Sequence[DemandPoint],
    step: float,
    horizon_end: float,
    unit: float | None,
) -> int:
    """The replicas the forecast asks for after the lookahead, over the rest of its
    horizon, sized as the lookahead's own target is (the calibrated margin on the mean's
    peak, or until calibrated the upper band); 0 without such a forecast."""
    later = [p for p in points if p.t - step > horizon_end]
    if not later:
        return 0
    risk = inputs.risk
    if risk is not None and risk.calibrated and unit is not None:
        base = max(0.0, max(p.mean for p in later))  # usable points are finite
        sized = capped_demand(sized_demand(base, risk.margin, unit), base, risk.peak)
    else:
        sized = max(p.upper for p in later)
    return inputs.capacity.required(sized).replicas


def _last_move_up(fleet: FleetState) -> bool:
    """Whether the fleet's last scale was up."""
    up, down = fleet.last_scale_up_at, fleet.last_scale_down_at
    return up is not None and (down is None or up > down)


def _pace(
    inputs: PlanInputs, target: int, hard_floor: int, usable: bool, why: str
) -> tuple[int, Action, str]:
    """Apply step limits and scale-down stabilization to the lookahead target."""
    policy, fleet, now = inputs.policy, inputs.fleet, inputs.now
    current = fleet.current_replicas
    if target > current:
        desired = target
        if policy.scale_up_max_step is not None:
            desired = min(target, current + policy.scale_up_max_step)
        return desired, "scale_up", f"scale up {current} -> {desired}: {why}"
    if current > policy.max_replicas:
        return policy.max_replicas, "scale_down", f"above maxReplicas {policy.max_replicas}"
    if target == current:
        return current, "steady", f"steady at {current}: {why}"
    if not usable:
        return current, "hold", f"hold {current}: no usable forecast, so no scale-down"
    period = policy.scale_down_stabilization_seconds
    recent = [("scale-up", fleet.last_scale_up_at)]
    if policy.scale_down_mode == "paced":
        recent.append(("scale-down", fleet.last_scale_down_at))
    for label, last in recent:
        if last is not None and now - last < period:
            wait = period - (now - last)
            return (
                current,
                "hold",
                (
                    f"hold {current} (target {target}): last {label} {now - last:.0f}s ago, "
                    f"stabilizing {wait:.0f}s more"
                ),
            )
    if policy.scale_down_mode == "forecast":
        desired = min(current, max(target, hard_floor))
        if desired == current:
            return (
                current,
                "hold",
                f"hold {current} (target {target}): the forecast needs them again within "
                f"the stabilization period ({period:.0f}s) after the lookahead",
            )
        return desired, "scale_down", f"scale down {current} -> {desired}: {why}"
    step = max(1, math.floor(current * policy.scale_down_max_percent / 100))
    desired = min(current, max(target, current - step, hard_floor))
    if desired == current:
        return (
            current,
            "hold",
            f"hold {current} (target {target}): the forecast needs them again within "
            f"the stabilization period ({period:.0f}s) after the lookahead",
        )
    return desired, "scale_down", f"scale down {current} -> {desired}: {why}"


def remember_plan(risk: PeakRisk, decision: ScalePlan) -> PeakRisk:
    """``risk`` with the decision's lookahead added, to score when it ends (nothing to add
    for a plan made without the risk model)."""
    if decision.risk_base is None or decision.risk_sized is None:
        return risk
    end = decision.now + decision.lookahead_seconds
    unit = decision.risk_unit or 0.0
    return record_risk(risk, decision.now, end, decision.risk_base, decision.risk_sized, unit)


def next_fleet_state(fleet: FleetState, plan: ScalePlan) -> FleetState:
    """The fleet state after ``plan`` is applied: the new count and the scale timestamps."""
    fleet = replace(fleet, recent_targets=plan.recent_targets)
    if plan.desired_replicas > fleet.current_replicas:
        return replace(fleet, current_replicas=plan.desired_replicas, last_scale_up_at=plan.now)
    if plan.desired_replicas < fleet.current_replicas:
        return replace(fleet, current_replicas=plan.desired_replicas, last_scale_down_at=plan.now)
    return fleet
