"""Scaling policies the backtest compares. Each decides a replica count from what it may see.

* :class:`ReactivePolicy` - the Kubernetes HPA v2 algorithm, as the brief defines it.
* :class:`PredictivePolicy` - the operator's forecaster and planner (the same code).
* :class:`OraclePolicy` - perfect foresight: the physical lower bound.
* :class:`SmoothedOraclePolicy` - a reference: foresight of the demand's centred rolling
  mean, none of its noise (``k`` x that mean, planned like the oracle). The bound on what a
  forecast of the predictable part can give; sweeping ``k`` traces its frontier.
* :class:`ScheduleOnlyPolicy` - KEDA-cron style: scheduled windows, else ``min_replicas``.
* :class:`PersistencePolicy` - a reference: ``k`` x the last observed demand, released at
  once. What a causal policy gets without any model; sweeping ``k`` traces its frontier.

A policy only sees an :class:`Observation`: the clock, its own fleet and the demand history
up to the metric lag. Only the oracle is handed the future, at construction.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import pandas as pd

from prescaler.backtest._fleet import replicas_needed
from prescaler.capacity import CapacityModel, replicas_for
from prescaler.planning import (
    HPA_DOWNSCALE_SECONDS,
    Driver,
    FleetState,
    ForecastLike,
    PeakRisk,
    PlanInputs,
    PolicyChoice,
    PolicyName,
    RiskObjective,
    ScalePlan,
    ScalingPolicy,
    ScheduledWindow,
    Spend,
    next_fleet_state,
    observe_risk,
    observed_rise,
    plan,
    remember_observation,
    remember_plan,
    risk_sizing,
)

FloatArray = np.ndarray


@dataclass(frozen=True, slots=True)
class Observation:
    """What a policy may know when it decides at ``now``."""

    now: float
    """Unix seconds."""
    step: int
    """Simulation step index (``now = start + step * step_seconds``)."""
    ready: int
    existing: int
    """Replicas that exist (ready or starting): what the scale target asks for."""
    metric_tokens_per_s: float
    """Demand as a metrics pipeline shows it at ``now``: the value ``metric_lag`` ago."""
    observed: pd.Series = field(repr=False)
    """The whole observed series; only its first ``visible_minutes`` may be read."""
    visible_minutes: int = 0
    queue_tokens: float | None = None
    """Tokens waiting in the fleet's queue as the metrics show it (``metric_lag`` old);
    ``None`` when the simulation does not track it."""
    ready_at_metric: int | None = None
    """Replicas that were ready ``metric_lag`` ago, whose load ``metric_tokens_per_s`` is;
    ``None``: ``ready``."""

    @property
    def history(self) -> pd.Series:
        """Observed load (mean-sized requests/s) per minute, for minutes that ended at least
        the metric lag before ``now``. NaN marks collection gaps. Tz-aware UTC index."""
        return self.observed.iloc[: self.visible_minutes]


class Policy(Protocol):
    """Decides a replica count every ``interval_seconds``."""

    @property
    def name(self) -> str: ...
    @property
    def interval_seconds(self) -> float: ...
    def decide(self, obs: Observation) -> int: ...


# --------------------------------------------------------------------------- reactive


@dataclass
class ReactivePolicy:
    """Kubernetes HPA v2 (``autoscaling/v2``) on a per-pod load metric.

    A pod's metric is its offered load as a share of its capacity, ``metric_lag`` seconds
    old: ``demand / (ready × replica_tokens_per_second)`` over the replicas that were ready
    then, and the target is ``target`` (0.7). The pods are grouped as Kubernetes groups them
    for a Pods metric (``groupPods``):

    * a replica that was ready one metric lag ago has a metric (the load it had then);
    * a replica that became ready since is running without a metric yet (*missing*);
    * a starting replica is an unready pod without metrics. It counts as *unready* (Pending:
      scheduling, node provisioning, image pull). Kubernetes would put a starting pod that
      is already running (loading its weights) with the missing ones instead; that changes
      only a scale-down while replicas start, where a missing pod counts at the target and
      an unready one is left out. The fleet does not split the cold start, so every
      starting replica is taken as Pending.

    :meth:`recommend` is ``calcPlainMetricReplicas`` on those groups, with Kubernetes 1.33's
    tolerances (``(1 - down) <= ratio <= (1 + up)``, both 0.1). :meth:`decide` adds the
    controller around it (``horizontal.go``): the first sight of the HPA records the
    current count as a recommendation; no metric at all keeps the count and records
    nothing; the default behaviours follow, scale-up at most ``max(4 pods, 100 %)`` per
    15 s with no stabilization, scale-down stabilized over 300 s (the largest
    recommendation in the window wins), bounded by min/max replicas.
    """

    replica_tokens_per_second: float
    min_replicas: int
    max_replicas: int
    target: float = 0.7
    scale_up_tolerance: float = 0.1
    scale_down_tolerance: float = 0.1
    scale_down_stabilization_seconds: float = HPA_DOWNSCALE_SECONDS
    sync_seconds: float = 15.0
    name: str = "reactive"
    _recommendations: deque[tuple[float, int]] | None = field(default=None, repr=False)

    @property
    def interval_seconds(self) -> float:
        return self.sync_seconds

    def within_tolerance(self, usage_ratio: float) -> bool:
        """``Tolerances.isWithin``: inclusive at both ends (1.1 with the defaults does not
        scale, though ``|1 - 1.1|`` is a hair above 0.1 in floating point)."""
        return 1.0 - self.scale_down_tolerance <= usage_ratio <= 1.0 + self.scale_up_tolerance

    def recommend(
        self,
        current: int,
        ready: int,
        demand_tokens_per_s: float,
        *,
        missing: int = 0,
        unready: int | None = None,
    ) -> int | None:
        """``calcPlainMetricReplicas``: the raw recommendation before behaviours.

        ``ready`` pods have a metric and reported ``demand_tokens_per_s`` together;
        ``missing`` pods run without a metric; ``unready`` pods are Pending (default: the
        rest of ``current``). ``None`` when no pod has a metric: Kubernetes cannot compute.
        """
        if ready <= 0:
            return None
        if unready is None:
            unready = max(0, current - ready - missing)
        usage_ratio = demand_tokens_per_s / (ready * self.replica_tokens_per_second) / self.target
        scale_up_with_unready = unready > 0 and usage_ratio > 1.0
        if not scale_up_with_unready and missing == 0:
            if self.within_tolerance(usage_ratio):
                return current
            return replicas_for(usage_ratio * ready)
        # Missing pods: at the target on a scale-down, 0 on a scale-up, left out at exactly
        # 1.0. Unready pods: 0 on a scale-up, else left out.
        total, pods = usage_ratio * ready, ready
        if missing > 0 and usage_ratio < 1.0:
            total, pods = total + missing, pods + missing
        elif missing > 0 and usage_ratio > 1.0:
            pods += missing
        if scale_up_with_unready:
            pods += unready
        new_ratio = total / pods
        if (
            self.within_tolerance(new_ratio)
            or (usage_ratio < 1.0 < new_ratio)
            or (usage_ratio > 1.0 > new_ratio)
        ):
            return current
        desired = replicas_for(new_ratio * pods)
        if (new_ratio < 1.0 and desired > current) or (new_ratio > 1.0 and desired < current):
            return current
        return desired

    def external_recommendation(self, current: int, replicas: int) -> int:
        """``GetExternalPerPodMetricReplicas`` for an External metric whose value is a
        replica count against an ``AverageValue`` target of 1 (a KEDA external trigger
        answering a plan): the count, unless within the tolerance of ``current``."""
        if current > 0 and self.within_tolerance(replicas / current):
            return current
        return replicas

    def decide(self, obs: Observation, external: int | None = None) -> int:
        """One sync of the controller. ``external``: a second metric's replica count (an
        External metric, see :meth:`external_recommendation`); as Kubernetes does with
        several metrics, the largest recommendation is the raw one."""
        current = obs.existing
        recs = self._recommendations
        if recs is None:  # recordInitialRecommendation: the first sight seeds the window
            recs = self._recommendations = deque([(obs.now, current)])
        if current == 0 and self.min_replicas != 0:
            return 0  # scaling is disabled while the target has no replicas
        if current > self.max_replicas:
            return self.max_replicas
        if current < self.min_replicas:
            return self.min_replicas
        # The metric is metric_lag old: it comes from the replicas that were ready then and
        # still exist; the ones ready since have none yet, the starting ones are unready.
        then = obs.ready if obs.ready_at_metric is None else obs.ready_at_metric
        with_metric = min(obs.ready, then)
        reported = obs.metric_tokens_per_s
        if with_metric < then:  # the remaining pods report the shares they had then
            reported *= with_metric / then
        raw = self.recommend(
            current,
            with_metric,
            reported,
            missing=obs.ready - with_metric,
            unready=max(0, current - obs.ready),
        )
        if external is not None:
            planned = self.external_recommendation(current, external)
            raw = planned if raw is None else max(raw, planned)
        if raw is None:
            return current  # no metric at all: the controller keeps the count, records nothing
        # Stabilization: scale-up window 0 s (the raw value), scale-down window 300 s.
        cutoff = obs.now - self.scale_down_stabilization_seconds
        while recs and recs[0][0] <= cutoff:
            recs.popleft()
        recs.append((obs.now, raw))
        down = max(r for _, r in recs)
        desired = current
        if desired < raw:
            desired = raw
        if desired > down:
            desired = down
        # Rate limit: at most max(+4 pods, +100 %) per 15 s; scale-down unlimited (100 %).
        if desired > current:
            desired = min(desired, max(current + 4, current * 2), self.max_replicas)
        elif desired < current:
            desired = max(desired, self.min_replicas)
        return desired


# --------------------------------------------------------------------------- oracle


def oracle_replicas(
    tokens_per_s_per_step: FloatArray,
    replica_tokens_per_second: float,
    lag_steps: int,
    min_replicas: int,
    max_replicas: int,
) -> np.ndarray:
    """Replicas that must exist at each step for zero shortfall at minimum GPU time.

    ``need[i]`` is the fewest replicas whose capacity covers ``demand[i]``, by the very
    comparison the score counts shortfall with (:func:`replicas_needed`: float noise a hair
    above a whole replica buys none, and is not counted short). A replica ready at step
    ``s`` was started at ``s - lag`` and has existed since, so ``exist[i] >= max(need[i..i+lag])``;
    starting each replica exactly ``lag`` steps before it is needed and removing it as soon
    as no later need within ``lag`` steps holds it meets that bound with equality.
    """
    need = replicas_needed(np.asarray(tokens_per_s_per_step), replica_tokens_per_second)
    need = np.asarray(np.clip(need, min_replicas, max_replicas), dtype=np.int64)
    if lag_steps == 0:
        return need
    padded = np.concatenate([need, np.full(lag_steps, need[-1], dtype=np.int64)])
    windows = np.lib.stride_tricks.sliding_window_view(padded, lag_steps + 1)
    return np.asarray(windows.max(axis=1), dtype=np.int64)


@dataclass
class OraclePolicy:
    """Knows future demand: applies :func:`oracle_replicas` at every step."""

    replicas_per_step: np.ndarray
    step_seconds: float
    name: str = "oracle"

    def initial_replicas(self, step: int) -> int:
        """Perfect foresight reaches back before the replay: it starts with what it needs
        (ready) rather than the shared warm start."""
        return int(self.replicas_per_step[step])

    @property
    def interval_seconds(self) -> float:
        return self.step_seconds

    def decide(self, obs: Observation) -> int:
        return int(self.replicas_per_step[obs.step])


# --------------------------------------------------------------------------- smoothed oracle


def smoothed_demand(tokens_per_minute: FloatArray, window_minutes: int) -> FloatArray:
    """The centred rolling mean of per-minute demand over ``window_minutes``.

    An odd window is symmetric (31: the minute itself, 15 before and 15 after). Near either
    end of the trace the window is cut short and averages what there is.
    """
    if window_minutes < 1:
        raise ValueError("the smoothing window must be >= 1 minute")
    series = pd.Series(np.asarray(tokens_per_minute, dtype=float))
    mean = series.rolling(window_minutes, center=True, min_periods=1).mean()
    return np.asarray(mean.to_numpy(), dtype=float)


def smoothed_oracle_replicas(
    tokens_per_minute: FloatArray,
    steps_per_minute: int,
    replica_tokens_per_second: float,
    lag_steps: int,
    min_replicas: int,
    max_replicas: int,
    *,
    k: float = 1.0,
    window_minutes: int = 31,
) -> np.ndarray:
    """:func:`oracle_replicas` planned on ``k ×`` the :func:`smoothed_demand`, per step.

    At each step the replicas that exist are the most that ``k ×`` the smoothed demand needs
    over the next cold start (clipped to min/max), so ready capacity covers ``k ×`` the
    smoothed mean at every step; they are released at once when no longer needed.
    """
    if not (math.isfinite(k) and k > 0):
        raise ValueError("the smoothed-oracle factor k must be > 0")
    smooth = k * smoothed_demand(tokens_per_minute, window_minutes)
    per_step = np.repeat(smooth, steps_per_minute)
    return oracle_replicas(
        per_step, replica_tokens_per_second, lag_steps, min_replicas, max_replicas
    )


@dataclass
class SmoothedOraclePolicy(OraclePolicy):
    """Reference, not a product policy: knows the future's centred rolling mean of demand
    (none of its minute-to-minute noise) and applies :func:`smoothed_oracle_replicas`.

    With ``k = 1`` it plans exactly the predictable part: where demand has no noise it *is*
    the oracle, and its shortfall elsewhere is what no forecast of the mean can avoid
    without a margin. Sweeping ``k`` traces the frontier of a perfect forecast of the mean
    plus a constant margin. Like the oracle, it starts with what it needs.
    """

    name: str = "smoothed-oracle"


# --------------------------------------------------------------------------- schedule-only


@dataclass
class ScheduleOnlyPolicy:
    """KEDA-cron style: inside a window (from its pre-warm lead on) the window's replicas,
    else ``min_replicas``. It ignores demand entirely."""

    windows: Sequence[ScheduledWindow]
    capacity: CapacityModel
    min_replicas: int
    max_replicas: int
    interval: float = 60.0
    name: str = "schedule-only"

    @property
    def interval_seconds(self) -> float:
        return self.interval

    def decide(self, obs: Observation) -> int:
        want = self.min_replicas
        for window in self.windows:
            # The first occurrence not yet over pre-warms first: it tells alone.
            for occ in window.occurrences(obs.now, obs.now + window.lead_seconds + 1.0, limit=1):
                if occ.prewarm_at <= obs.now < occ.end:
                    if occ.min_replicas is not None:
                        want = max(want, occ.min_replicas)
                    if occ.expected_requests_per_second is not None:
                        load = occ.expected_requests_per_second * self.capacity.unit.per_request
                        need = self.capacity.required(load)
                        want = max(want, need.replicas)
        return min(want, self.max_replicas)


# --------------------------------------------------------------------------- reference


@dataclass
class PersistencePolicy:
    """Reference, not a product policy: ``ceil(k × demand seen now / capacity)`` replicas.

    It sees what the HPA sees (demand ``metric_lag`` old, every 15 s), scales up and down
    at once with no tolerance or stabilization, and has no model of the future: its
    shortfall against GPU-hours over ``k`` is the frontier of "the next level is the last
    level times a margin", the best a causal policy does when changes are unpredictable.
    """

    k: float
    replica_tokens_per_second: float
    min_replicas: int
    max_replicas: int
    interval: float = 15.0
    name: str = "persistence"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.k) and self.k > 0):
            raise ValueError("the persistence factor k must be > 0")

    @property
    def interval_seconds(self) -> float:
        return self.interval

    def decide(self, obs: Observation) -> int:
        want = replicas_for(self.k * obs.metric_tokens_per_s, self.replica_tokens_per_second)
        return min(max(want, self.min_replicas), self.max_replicas)


# --------------------------------------------------------------------------- predictive


class Forecaster(Protocol):
    """What the predictive policy needs of ``prescaler_forecast.ForecastService``."""

    def forecast(self, history: pd.Series, now: float) -> ForecastLike: ...


class HpaShadow(Protocol):
    """A shadow HPA stepped on the same demand (``prescaler.backtest.ShadowHpa``)."""

    def observe(self, now: float, demand: float | None, ready: int, existing: int) -> None: ...
    @property
    def ready_capacity(self) -> float | None: ...
    @property
    def waiting(self) -> float: ...
    def spend(self, now: float) -> Spend: ...
    def direction_budget(self, now: float, window: str = "24h") -> int: ...


@dataclass
class PredictivePolicy:
    """The operator's loop: forecast on the history, then :func:`prescaler.planning.plan`.

    The fleet state it hands the planner is the simulated one, and the planner's own
    :func:`next_fleet_state` records scale times, exactly as the operator applies a plan.
    ``observed_requests_per_second`` is the demand the metrics pipeline shows now (the
    HPA's signal, ``metric_lag`` old, in requests/s of the capacity model's mean size)
    with ``fresh_observation``, else the last whole observed minute (``None`` when that is
    missing). The forecaster always gets whole minutes, a trace's collection gaps masked
    (NaN); the live metric is the same one the reactive baseline reads, gaps or not: a
    trace's gap is a hole in the record, and hiding the traffic in it from prescaler alone
    would compare the two on different information.

    The queue: the simulation observes *arrivals*, not what a full fleet served, so the
    planner's queue growth (``waiting_growth_per_second``, which the operator adds to the
    served rate) is ``None`` here: it is already in the observation, and adding it would
    count it twice. The backlog itself (``waiting_requests``) is the simulated fleet's
    queue, as old as the demand observation, in requests of the capacity model's mean
    size; the planner drains it within the lookahead as it does in the operator.

    A disaggregated role (``capacity`` from :func:`prescaler.capacity.role_capacity`) is
    planned the same way on its own tokens: it observes and forecasts its token rate (the
    capacity's unit), and its queue of tokens is handed over as the requests its engines
    would count waiting, at the role's mean tokens per request.
    """

    forecaster: Forecaster
    capacity: CapacityModel
    policy: ScalingPolicy
    cold_start_seconds: float
    windows: Sequence[ScheduledWindow] = ()
    interval: float = 60.0
    history_seconds: float | None = None
    """Only this much history is handed to the forecaster (``None``: all of it)."""
    fresh_observation: bool = True
    objective: RiskObjective | None = None
    """The peak risk model's objective (``prescaler.api.risk_objective``); ``None``: the
    forecast's upper band, as before the risk model."""
    hpa: HpaShadow | None = None
    """A shadow HPA on the observed demand (the relative objective's reference); the
    operator keeps the same one in ``status.againstHpa``."""
    name: str = "predictive"
    on_plan: Callable[[ScalePlan], None] | None = None
    standby: int = field(default=0, init=False)
    """Warm standby slots the last plan asks for (``ScalePlan.standby_replicas``); the
    simulation holds that many when it models standby."""
    risk: PeakRisk | None = field(default=None, init=False)
    """What the risk model has learned so far (the operator keeps it in status)."""
    drivers: dict[Driver, tuple[int, float]] = field(default_factory=dict, init=False)
    """Per driver (:data:`prescaler.planning.Driver`): the decisions it drove, and the
    replica-seconds they asked for until the next decision."""
    last_driver: Driver | None = field(default=None, init=False)
    """The last decision's driver."""
    _state: FleetState | None = field(default=None, repr=False)
    _forecast: ForecastLike | None = field(default=None, repr=False)
    _forecast_at: int = field(default=-1, repr=False)
    _forecast_usable: bool = field(default=False, repr=False)
    _observed: tuple[tuple[float, float], ...] = field(default=(), repr=False)
    """Recent observations, for the rise of the observed demand (as the operator keeps
    them)."""
    lead: ReactivePolicy | None = None
    """The HPA this planner leads (``spec.policy: leading``): each decision plans as that
    HPA's count led by the forecast (:attr:`prescaler.planning.PlanInputs.leading_target`)."""

    @property
    def interval_seconds(self) -> float:
        return self.interval

    @property
    def _tokens_per_request(self) -> float:
        """Simulated tokens per request of the traffic: the capacity model's tokens per
        "request" (all of a unified pool's; one for a disaggregated role, which counts its
        own tokens) times its unit's requests (one; a role's mean tokens per request)."""
        return self.capacity.tokens.tokens_per_request * self.capacity.unit.per_request

    @property
    def last_forecast(self) -> ForecastLike | None:
        """The forecast the last decision's plan could use (fresh and sound), else ``None``:
        what the operator assesses the degradation level with."""
        return self._forecast if self._forecast_usable else None

    def decide(self, obs: Observation, lead: ReactivePolicy | None = None) -> int:
        """One decision; with ``lead`` (or :attr:`lead`), as that HPA led by the forecast:
        the HPA decides here, and the plan is its count led at its target."""
        lead = lead or self.lead
        reactive = lead.decide(obs) if lead is not None else None
        history = obs.history
        if self.history_seconds is not None and len(history):
            keep = max(1, math.ceil(self.history_seconds / 60.0))
            history = history.iloc[-keep:]
        observed: float | None = None
        if len(history):
            last = float(history.iloc[-1])
            if self.fresh_observation:
                # The metric the reactive baseline reads too: a collection gap in the trace
                # is masked in the history the forecaster learns from, not hidden from one
                # autoscaler's live metric while the other reads it.
                last = obs.metric_tokens_per_s / self.capacity.tokens.tokens_per_request
            observed = last if math.isfinite(last) else None
        # As the operator's forecast hub: a forecast is refreshed when a new step of history
        # is visible, and the decisions in between plan on it with the fresh observation.
        if obs.visible_minutes != self._forecast_at:
            self._forecast = self.forecaster.forecast(history, obs.now) if len(history) else None
            self._forecast_at = obs.visible_minutes
        forecast = self._forecast
        state = self._state or FleetState(current_replicas=obs.existing)
        state = FleetState(
            current_replicas=obs.existing,
            ready_replicas=obs.ready,
            last_scale_up_at=state.last_scale_up_at,
            last_scale_down_at=state.last_scale_down_at,
            recent_targets=state.recent_targets,
            observed_requests_per_second=observed,
            observed_rise_per_second=observed_rise(self._observed, obs.now, observed),
            waiting_requests=(
                None if obs.queue_tokens is None else obs.queue_tokens / self._tokens_per_request
            ),
        )
        self._observed = remember_observation(self._observed, obs.now, observed)
        sizing = None
        budget: int | None = None
        reserve: int | None = None
        if self.objective is not None:
            # The operator's order: score the lookaheads that ended, then size.
            risk = self.risk or PeakRisk()
            ready = obs.ready * self.capacity.replica_requests_per_second
            hpa_ready = hpa_waiting = spend = None
            if self.hpa is not None:
                hpa_ready, hpa_waiting = self.hpa.ready_capacity, self.hpa.waiting
                spend = self.hpa.spend(obs.now)
                self.hpa.observe(obs.now, observed, obs.ready, obs.existing)
                budget = self.hpa.direction_budget(obs.now)
                reserve = self.hpa.direction_budget(obs.now, "7d")
            self.risk = observe_risk(
                risk,
                self.objective,
                obs.now,
                observed,
                ready,
                state.waiting_requests,
                hpa_ready,
                hpa_waiting,
                spend,
            )
            sizing = risk_sizing(self.risk, self.objective, obs.now)
        decision = plan(
            PlanInputs(
                now=obs.now,
                capacity=self.capacity,
                fleet=state,
                policy=self.policy,
                cold_start_seconds=self.cold_start_seconds,
                forecast=forecast,
                windows=tuple(self.windows),
                risk=sizing,
                decision_interval_seconds=self.interval,
                direction_budget=budget,
                direction_reserve=reserve,
                reactive_replicas=reactive,
                leading_target=lead.target if lead is not None else None,
            )
        )
        if self.risk is not None:
            self.risk = remember_plan(self.risk, decision)
        _count(self.drivers, decision.driver, decision.desired_replicas * self.interval)
        self.last_driver = decision.driver
        self._state = next_fleet_state(state, decision)
        self._forecast_usable = decision.forecast_usable
        self.standby = decision.standby_replicas
        if self.on_plan is not None:
            self.on_plan(decision)
        return decision.desired_replicas


@dataclass
class SharedForecasts:
    """One forecaster's forecasts, shared by ``runs`` runs on the same demand: a forecast is
    made once per decision time (the history a run sees depends on the demand alone, not on
    its fleet), the other runs at the same time get the first's, and it is let go once all
    of them have had it (runs replayed one after the other hold one replay's forecasts at
    most, not one per run)."""

    forecaster: Forecaster
    runs: int = 2
    _made: dict[float, tuple[ForecastLike, int]] = field(default_factory=dict, repr=False)

    def forecast(self, history: pd.Series, now: float) -> ForecastLike:
        made, served = self._made.pop(now, (None, 0))
        if made is None:
            made = self.forecaster.forecast(history, now)
        if served + 1 < self.runs:
            self._made[now] = (made, served + 1)
        return made

    @property
    def held(self) -> int:
        """Forecasts made and not yet had by every run."""
        return len(self._made)


def _count(drivers: dict[Driver, tuple[int, float]], driver: Driver, seconds: float) -> None:
    """One more decision ``driver`` drove, asking for ``seconds`` of replica time."""
    count, total = drivers.get(driver, (0, 0.0))
    drivers[driver] = (count + 1, total + seconds)


class _PlannerFront:
    """What a policy built around the forecast planner reports of it: its standby, its
    decisions' drivers and its last forecast."""

    predictive: PredictivePolicy

    @property
    def standby(self) -> int:
        return self.predictive.standby

    @property
    def drivers(self) -> dict[Driver, tuple[int, float]]:
        return self.predictive.drivers

    @property
    def last_forecast(self) -> ForecastLike | None:
        return self.predictive.last_forecast


@dataclass
class KedaPolicy(_PlannerFront):
    """prescaler as a KEDA external trigger beside a reactive one, as KEDA runs it: one HPA
    with two metrics, the pool's plan (an External metric, its planned replicas against
    an ``AverageValue`` target of 1) and the reactive trigger's per-pod load (the
    :class:`ReactivePolicy`'s metric), each recommending, the largest winning, then the
    HPA's own stabilization and rate limits. prescaler writes no replicas: its plan is
    only what the trigger answers at each sync (the operator's last plan)."""

    predictive: PredictivePolicy
    reactive: ReactivePolicy
    name: str = "keda"

    @property
    def interval_seconds(self) -> float:
        return self.reactive.sync_seconds

    def decide(self, obs: Observation) -> int:
        plan = self.predictive.decide(obs)
        return self.reactive.decide(obs, external=plan)


@dataclass
class AutoPolicy(_PlannerFront):
    """``spec.policy: auto`` (or a fixed ``reactive`` or ``leading``), as the operator runs
    it: the forecast planner and the HPA both decide at every step on this fleet, and the
    one in force per ``schedule`` (``(from, policy)`` in time order, the choices the daily
    re-checks made) is what the fleet gets; in ``leading`` mode the planner plans the HPA's
    count led by the forecast, as the operator does. In reactive mode the scheduled
    windows still hold their floors, as the operator's planner keeps them."""

    predictive: PredictivePolicy
    reactive: ReactivePolicy
    schedule: Sequence[tuple[float, PolicyName]]
    windows: ScheduleOnlyPolicy | None = None
    choices: Sequence[PolicyChoice] = ()
    """The daily re-checks' choices the schedule came from (none for a fixed policy)."""
    name: str = "predictive"
    decisions: dict[PolicyName, int] = field(default_factory=dict)
    """Decisions made in each mode."""
    fleet_drivers: dict[Driver, tuple[int, float]] = field(default_factory=dict, init=False)
    """What drove the fleet's decisions (:attr:`drivers`)."""

    @property
    def drivers(self) -> dict[Driver, tuple[int, float]]:
        """What drove the fleet's count at each decision, as :attr:`PredictivePolicy.drivers`
        counts it: the planner's driver where it plans (forecast, leading), ``reactive``
        (or ``window``, where a window's floor was more) where the HPA does. The planner
        keeps deciding in reactive mode too, but its count is not the fleet's."""
        return self.fleet_drivers

    def _drove(self, driver: Driver | None, replicas: int) -> int:
        if driver is not None:
            _count(self.fleet_drivers, driver, replicas * self.interval_seconds)
        return replicas

    @property
    def interval_seconds(self) -> float:
        return self.predictive.interval_seconds

    def in_force(self, now: float) -> PolicyName:
        mode: PolicyName = "forecast"
        for start, policy in self.schedule:
            if start > now:
                break
            mode = policy
        return mode

    def decide(self, obs: Observation) -> int:
        mode = self.in_force(obs.now)
        self.decisions[mode] = self.decisions.get(mode, 0) + 1
        if mode == "leading":  # the planner plans the HPA's count, led: windows included
            led = self.predictive.decide(obs, lead=self.reactive)
            return self._drove(self.predictive.last_driver, led)
        planned = self.predictive.decide(obs)
        hpa = self.reactive.decide(obs)
        if mode == "forecast":
            return self._drove(self.predictive.last_driver, planned)
        floor = self.windows.decide(obs) if self.windows is not None else 0
        return self._drove("window" if floor > hpa else "reactive", max(hpa, floor))
