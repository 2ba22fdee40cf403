"""The pool's status, read and written in one place: parsing the previous status, learning
the cold start, the compact forecast view, conditions, and the new status composed from a
plan (or from an invalid pool), down to the merge patch kopf writes. No I/O here;
everything is a function of its arguments."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple

from prescaler.api import (
    CONDITION_TYPES,
    MAX_FORECAST_POINTS,
    AgainstHpaHour,
    AgainstHpaStatus,
    AgainstHpaWindow,
    ColdStartSpec,
    ColdStartStatus,
    Condition,
    ConditionType,
    DemandStatus,
    FleetStatus,
    ForecastPoint,
    ForecastStatus,
    HpaRecommendation,
    InferencePoolSpec,
    InferencePoolStatus,
    KedaStatus,
    LookaheadStatus,
    PlanStatus,
    RecentTarget,
    RiskBudgetStatus,
    RiskStatus,
    RolesStatus,
    SelectionStatus,
    ShadowFleetStatus,
    ShadowHpaStatus,
    StandbyPartStatus,
    StandbyStatus,
    WindowStatus,
)
from prescaler.backtest import (
    WINDOWS,
    Comparison,
    Hour,
    Observed,
    ReactivePolicy,
    ShadowFleet,
    ShadowSetup,
    ShadowState,
    compare,
    hpa_ready_capacity,
    shadow_step,
    trailing_spend,
)
from prescaler.capacity import ROLES, CapacityModel, Role
from prescaler.controller.model import Gathered
from prescaler.kube import ROLE_PROMOTED, Hpa, PodStart, Workload
from prescaler.planning import (
    LEVEL_BUCKETS,
    LOG_BINS,
    ForecastLike,
    Lookahead,
    PeakRisk,
    RiskObjective,
    RiskSizing,
    ScalePlan,
    ScheduledWindow,
    observe_risk,
)
from prescaler.scaler import Query
from prescaler.sources import Snapshot
from prescaler_forecast import Selection

STUCK_POD_SECONDS = 3600.0
"""A pod not Ready this long after creation is not waited for (it is not a cold start)."""
UNSCHEDULABLE_GIVE_UP_SECONDS = 900.0
"""A pod that no node has taken this long after its creation is capacity that is not
coming, not a cold start: it is left out of the samples (and reported through
``CapacityAvailable``). 15 minutes is the cluster autoscaler's own default
``--max-node-provision-time``: past it, the autoscaler gives up on the node too."""
MAX_TRACKED_PODS = 100
"""At most this many pod names in ``coldStart.pending`` and ``coldStart.observedPods``."""


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def recent_targets(previous: InferencePoolStatus) -> tuple[tuple[float, int], ...]:
    """The planner's memory of recent targets, from the last status (unparsable entries
    are left out: a lost entry only shortens the memory, it never scales anything)."""
    if previous.plan is None:
        return ()
    out = []
    for entry in previous.plan.recent_targets:
        at = parse_rfc3339(entry.at)
        if at is not None:
            out.append((at, entry.replicas))
    return tuple(sorted(out))


def p90(samples: Sequence[float]) -> float:
    """Nearest-rank 90th percentile."""
    if not samples:
        raise ValueError("no samples")
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def learn_cold_start(
    previous: ColdStartStatus | None, spec: ColdStartSpec, pods: Sequence[PodStart], now: float
) -> ColdStartStatus:
    """Add the starts of pods not counted yet; rolling p90 of the rest.

    A sample is a pod's creation to its Ready, as the lead time is: the wait for a node
    that an autoscaler brings is part of it, and ``schedulingSamples`` keep that part
    apart. Every pod is counted once: pods are taken in (creation, name) order past the
    watermark ``observedUntil`` (pods created in its very second and already seen are in
    ``observedPods``); one not Ready yet is remembered in ``pending`` and counted when it
    is, so a slow pod is never skipped and never holds up the pods after it. A pod is
    given up on, never a sample, when it is on its way out, when no node has taken it
    :data:`UNSCHEDULABLE_GIVE_UP_SECONDS` after its creation (capacity that does not come,
    reported as ``CapacityAvailable``), or when it is not Ready after
    :data:`STUCK_POD_SECONDS`.
    """
    if spec.mode == "fixed":
        return ColdStartStatus(seconds=float(spec.seconds), source="fixed")
    samples = list(previous.samples) if previous is not None else []
    waits = list(previous.scheduling_samples) if previous is not None else []
    until = parse_rfc3339(previous.observed_until) if previous is not None else None
    at_until = set(previous.observed_pods) if previous is not None else set()
    pending = set(previous.pending) if previous is not None else set()

    def fresh(pod: PodStart) -> bool:
        if until is None or pod.created > until:
            return True
        return pod.created == until and bool(at_until) and pod.name not in at_until

    still_pending: list[str] = []
    newest: list[PodStart] = []
    for pod in sorted(pods, key=lambda p: (p.created, p.name)):
        is_fresh = fresh(pod)
        if not is_fresh and pod.name not in pending:
            continue
        if is_fresh:
            newest.append(pod)
        if pod.ready_at is not None and not pod.terminating:
            samples.append(round(max(0.0, pod.ready_at - pod.created), 1))
            scheduled = pod.scheduled_at if pod.scheduled_at is not None else pod.created
            waits.append(round(min(max(0.0, scheduled - pod.created), samples[-1]), 1))
        elif not _given_up(pod, now):
            still_pending.append(pod.name)
    if newest:
        last = max(p.created for p in newest)
        carried = at_until if until is not None and last == until else set()
        at_until = carried | {p.name for p in newest if p.created == last}
        until = last
    # Parallel lists; an older status without scheduling samples pads them with zeros.
    waits = [0.0] * (len(samples) - len(waits)) + waits[-len(samples) :] if samples else []
    samples, waits = samples[-spec.samples :], waits[-spec.samples :]
    seen = ColdStartStatus(
        seconds=float(spec.seconds),
        source="assumed",
        observed_until=rfc3339(until) if until is not None else None,
        observed_pods=sorted(at_until)[-MAX_TRACKED_PODS:],
        pending=still_pending[-MAX_TRACKED_PODS:],
    )
    if not samples:
        return seen
    measured = p90(samples)
    return seen.model_copy(
        update={
            "seconds": measured,
            "source": "measured",
            "p90_seconds": measured,
            "scheduling_p90_seconds": p90(waits),
            "startup_p90_seconds": p90(
                [round(t - w, 1) for t, w in zip(samples, waits, strict=True)]
            ),
            "samples": samples,
            "scheduling_samples": waits,
        }
    )


def _given_up(pod: PodStart, now: float) -> bool:
    age = now - pod.created
    if pod.terminating or age >= STUCK_POD_SECONDS:
        return True
    return pod.unschedulable is not None and age >= UNSCHEDULABLE_GIVE_UP_SECONDS


def peak_risk(previous: RiskStatus | None) -> PeakRisk:
    """What the risk model had learned, from the last status (a status without it, or
    with a calibration of the wrong shape, starts afresh: the forecast's band stands in
    until the pool's own lookaheads have calibrated it again)."""
    if previous is None:
        return PeakRisk()
    calibration = tuple(previous.calibration)
    if calibration and len(calibration) != LOG_BINS:
        calibration = ()
    pending = tuple(Lookahead(**p.model_dump()) for p in previous.pending)
    levels: tuple[float, ...] = ()
    if len(previous.quantiles) == LEVEL_BUCKETS:
        levels = tuple(previous.quantiles)
    elif previous.quantile is not None:
        # A status from before the hourly levels: its one level in every hour.
        levels = (previous.quantile,) * LEVEL_BUCKETS
    # The HPA's record (garbage starts it afresh).
    hpa_share, hpa_demand = previous.hpa_waited_fraction, previous.hpa_demand
    if not (
        hpa_share is not None
        and hpa_demand is not None
        and math.isfinite(hpa_share)
        and math.isfinite(hpa_demand)
        and 0 <= hpa_share <= 1
        and hpa_demand > 0
    ):
        hpa_share, hpa_demand = 0.0, 0.0
    # The budget's controller (garbage starts it afresh, at the scale of 1); its record
    # is the shadow's, read again each reconcile.
    integral, scale = 0.0, 1.0
    kept = previous.budget
    if (
        kept is not None
        and math.isfinite(kept.integral)
        and math.isfinite(kept.scale)
        and kept.scale > 0
    ):
        integral, scale = kept.integral, kept.scale
    return PeakRisk(
        levels=levels,
        histogram=calibration,
        pending=pending,
        outcomes=previous.outcomes,
        loss=previous.waited_fraction,
        observed_at=previous.observed_at,
        mean_demand=previous.mean_demand,
        peak_demand=previous.peak_demand,
        target=previous.target_waited_fraction,
        hpa_waited=hpa_share * hpa_demand,
        hpa_demand=hpa_demand,
        budget_integral=integral,
        relative_scale=scale,
    )


def learn_risk(
    previous: RiskStatus | None,
    objective: RiskObjective,
    now: float,
    snapshot: Snapshot | None,
    capacity: CapacityModel,
    ready_replicas: int,
    shadow: Shadow | None = None,
    seed: PeakRisk | None = None,
) -> PeakRisk:
    """The risk model after this reconcile's observation: what arrives (served plus the
    queue's growth: a full fleet's served rate hides demand), against what the ready
    replicas serve, with the queue ahead (requests, counted in the demand's unit: a
    role's tokens), and against what the shadow HPA's ready replicas serve (``shadow``:
    the comparison as of the last reconcile, for a relative objective). ``seed``: start
    from it instead of the last status's (a calibration replayed from history). Missing
    data adds nothing."""
    risk = seed if seed is not None else peak_risk(previous)
    arriving = arriving_demand(snapshot, capacity)
    if snapshot is None or arriving is None:
        return risk
    per = capacity.unit.per_request
    waiting = snapshot.waiting * per if snapshot.waiting is not None else None
    ready = ready_replicas * capacity.replica_requests_per_second
    hpa_ready = hpa_waiting = spend = None
    if shadow is not None:
        hpa_ready = hpa_ready_capacity(shadow.state, shadow.setup)
        hpa_waiting = shadow.state.hpa_queue
        spend = trailing_spend(shadow.state, now)
    return observe_risk(
        risk, objective, now, arriving, ready, waiting, hpa_ready, hpa_waiting, spend
    )


def arriving_demand(snapshot: Snapshot | None, capacity: CapacityModel) -> float | None:
    """What arrives, in the plan's unit: served plus the queue's growth (a saturated
    fleet's served rate hides the demand beyond it); ``None`` when unknown."""
    if snapshot is None or snapshot.demand is None:
        return None
    arriving = snapshot.demand
    growth = snapshot.waiting_growth_per_second
    if growth is not None and math.isfinite(growth):
        arriving = max(0.0, arriving + growth * capacity.unit.per_request)
    return arriving


def risk_status(
    risk: PeakRisk, sizing: RiskSizing | None, objective: RiskObjective | None = None
) -> RiskStatus:
    """The risk model as the status keeps it (rounded: it is written every reconcile)."""
    in_force: Literal["relativeToHpa", "servedFraction"] | None = None
    if objective is not None:
        in_force = "relativeToHpa" if objective.relative else "servedFraction"
    return RiskStatus(
        margin=round(sizing.margin, 4) if sizing is not None and sizing.calibrated else None,
        quantile=None if not risk.levels or sizing is None else round(sizing.level, 6),
        quantiles=[round(v, 6) for v in risk.levels],
        outcomes=risk.outcomes,
        objective=in_force,
        target_waited_fraction=None if risk.target is None else round(risk.target, 6),
        waited_fraction=None if risk.loss is None else round(risk.loss, 6),
        hpa_waited_fraction=None if risk.hpa_share is None else round(risk.hpa_share, 8),
        hpa_demand=round(risk.hpa_demand, 6) if risk.hpa_demand > 0 else None,
        budget=budget_status(risk, objective),
        calibration=[round(w, 3) for w in risk.histogram],
        pending=[
            LookaheadStatus(
                **{k: round(v, 6) if isinstance(v, float) else v for k, v in asdict(p).items()}
            )
            for p in risk.pending
        ],
        observed_at=risk.observed_at,
        mean_demand=None if risk.mean_demand is None else round(risk.mean_demand, 6),
        peak_demand=None if risk.peak_demand is None else round(risk.peak_demand, 6),
    )


def budget_status(risk: PeakRisk, objective: RiskObjective | None) -> RiskBudgetStatus | None:
    """The cost budget as it holds now, and which side binds, in words too (``None``: no
    budget)."""
    if objective is None or not objective.budgeted or objective.budget_to_hpa is None:
        return None
    budget = objective.budget_to_hpa
    own = objective.target(risk.hpa_share)
    eps = objective.target(risk.hpa_share, risk.relative_scale)
    ratio = risk.capacity_ratio
    hours = risk.spend.hours if risk.spend is not None and ratio is not None else None
    binds: Literal["budget", "objective"] = (
        "budget" if risk.relative_scale > 1.0 + 1e-6 else "objective"
    )
    spent = (
        "no record of the last day yet"
        if ratio is None or hours is None
        else f"GPU-hours {ratio:.2f} x the shadow HPA's over the last {hours:.0f} h"
    )
    if binds == "budget":
        limit = (
            "; at its limit"
            if risk.relative_scale >= objective.budget_ceiling(risk.hpa_share)
            else ""
        )
        message = (
            f"{spent}, over the budget of {budget:g}: the budget binds, waiting share target "
            f"raised to {eps:.4%} ({risk.relative_scale:.2f} x the objective's {own:.4%}){limit}"
        )
    elif risk.relative_scale < 1.0 - 1e-6:
        message = (
            f"{spent}, under the budget of {budget:g}: the objective binds, tightened with "
            f"the savings to {eps:.4%} ({risk.relative_scale:.2f} x its {own:.4%})"
        )
    else:
        message = f"{spent}; budget {budget:g}: the objective binds ({own:.4%})"
    return RiskBudgetStatus(
        budget_to_hpa=budget,
        gpu_hours_to_hpa=None if ratio is None else round(ratio, 6),
        observed_hours=None if hours is None else round(hours, 3),
        binds=binds,
        target_waited_fraction=round(eps, 8),
        objective_waited_fraction=round(own, 8),
        scale=round(risk.relative_scale, 6),
        integral=round(risk.budget_integral, 6),
        message=message[:512],
    )


# ---------------------------------------------------------------------- against an HPA
def shadow_setup(
    spec: InferencePoolSpec, capacity: CapacityModel, cold_start_seconds: float, hpa: Hpa | None
) -> tuple[ShadowSetup, str]:
    """The shadow HPA's fleet (the pool's bounds, capacity and cold start) and its target:
    an HPA's on the same target (``Hpa.target_utilization``), else the reactive
    baseline's; returns it with where the target came from."""
    target, source = ReactivePolicy.target, "default"
    if hpa is not None and hpa.target_utilization is not None:
        target, source = hpa.target_utilization, f"HorizontalPodAutoscaler/{hpa.name}"
    setup = ShadowSetup(
        replica_capacity=capacity.replica_requests_per_second,
        min_replicas=spec.min_replicas,
        max_replicas=max(spec.max_replicas, spec.min_replicas, 1),
        cold_start_seconds=cold_start_seconds,
        gpus_per_replica=spec.model.gpus_per_replica,
        target=target,
    )
    return setup, source


def shadow_observed(
    spec: InferencePoolSpec,
    gathered: Gathered,
    capacity: CapacityModel,
    decision: ScalePlan,
    standby: StandbyStatus | None,
    now: float,
) -> Observed:
    """What this reconcile saw, for the comparison: the arriving demand and the fleet that
    served it (promoted hot standby pods serve too; placeholders and hot standby hold
    GPUs). In dry run the plan stands in for the fleet."""
    promoted = sum(1 for p in gathered.hot_pods if p.role == ROLE_PROMOTED and p.ready)
    held = 0
    if standby is not None:
        held = sum(part.desired for part in (standby.placeholders, standby.hot) if part)
    workload = gathered.workload
    return Observed(
        now=now,
        demand=arriving_demand(gathered.snapshot, capacity),
        ready=workload.ready_replicas + promoted,
        existing=max(workload.replicas, workload.ready_replicas) + promoted,
        standby=held,
        planned=decision.desired_replicas if spec.dry_run else None,
        planned_standby=decision.standby_replicas + spec.standby.hot.replicas,
    )


def shadow_state(previous: AgainstHpaStatus | None) -> ShadowState:
    """The comparison's state from the last status (none: it starts afresh)."""
    if previous is None:
        return ShadowState()
    hpa = previous.hpa or ShadowHpaStatus()  # a disaggregated pool's sum has no state
    plan = previous.plan_fleet
    hours = sorted(previous.hours or (), key=lambda h: h.start)
    return ShadowState(
        clock=previous.clock,
        hpa=ShadowFleet(hpa.ready, tuple(sorted(hpa.starting))),
        planned=None if plan is None else ShadowFleet(plan.ready, tuple(sorted(plan.starting))),
        recommendations=tuple((r.at, r.replicas) for r in hpa.recommendations),
        metric_ready=tuple(hpa.metric_ready),
        queue=previous.queue or 0.0,
        hpa_queue=previous.hpa_queue or 0.0,
        minute=previous.minute,
        short=bool(previous.short),
        hpa_short=bool(previous.hpa_short),
        fleet_replicas=previous.fleet_replicas,
        direction=previous.direction or 0,
        hpa_direction=previous.hpa_direction or 0,
        hours=tuple(Hour(**h.model_dump()) for h in hours),
    )


def against_hpa_status(
    state: ShadowState, setup: ShadowSetup, target_from: str, now: float
) -> AgainstHpaStatus:
    """The comparison as the status keeps it: the rolling windows, the shadow's state and
    the hourly counters (rounded: it is written every reconcile)."""
    windows = {name: window_status(compare(state, now, name, span)) for name, span in WINDOWS}
    day = windows["24h"]

    def fleet(f: ShadowFleet) -> dict[str, Any]:
        return {"ready": f.ready, "starting": [round(t, 3) for t in f.starting]}

    return AgainstHpaStatus(
        basis="plan" if state.planned is not None else "fleet",
        summary=against_hpa_summary(day),
        last24_hours=day,
        last7_days=windows["7d"],
        hpa=ShadowHpaStatus(
            **fleet(state.hpa),
            target=setup.target,
            target_from=target_from,
            replica_capacity=round(setup.replica_capacity, 6),
            cold_start_seconds=setup.cold_start_seconds,
            recommendations=[HpaRecommendation(at=t, replicas=r) for t, r in state.recommendations],
            metric_ready=list(state.metric_ready),
        ),
        plan_fleet=None if state.planned is None else ShadowFleetStatus(**fleet(state.planned)),
        clock=state.clock,
        queue=round(state.queue, 6),
        hpa_queue=round(state.hpa_queue, 6),
        minute=state.minute,
        short=state.short,
        hpa_short=state.hpa_short,
        fleet_replicas=state.fleet_replicas,
        direction=_sign(state.direction),
        hpa_direction=_sign(state.hpa_direction),
        hours=[
            AgainstHpaHour(
                **{k: round(v, 6) if isinstance(v, float) else v for k, v in asdict(h).items()}
            )
            for h in state.hours
        ],
    )


def _sign(direction: int) -> Literal[-1, 0, 1]:
    return 1 if direction > 0 else -1 if direction < 0 else 0


def against_hpa_summary(day: AgainstHpaWindow) -> str:
    """The one line of ``kubectl get -o wide``: GPU-hours saved over the last 24 hours."""
    summary = f"{day.saved_gpu_hours:.1f} GPU-h"
    if day.saved_percent is not None:
        summary += f" ({day.saved_percent:.0f}%)"
    return summary


def window_status(c: Comparison) -> AgainstHpaWindow:
    """One rolling window of the comparison, rounded for the status."""
    saved = c.saved_fraction
    return AgainstHpaWindow(
        observed_hours=round(c.observed_hours, 4),
        gpu_hours=round(c.gpu_hours, 4),
        standby_gpu_hours=round(c.standby_gpu_hours, 4),
        hpa_gpu_hours=round(c.hpa_gpu_hours, 4),
        saved_gpu_hours=round(c.saved_gpu_hours, 4),
        saved_percent=None if saved is None else round(100 * saved, 2),
        unserved_fraction=_round(c.unserved_fraction, 6),
        hpa_unserved_fraction=_round(c.hpa_unserved_fraction, 6),
        short_minutes=c.short_minutes,
        hpa_short_minutes=c.hpa_short_minutes,
        direction_changes=c.direction_changes,
        hpa_direction_changes=c.hpa_direction_changes,
    )


class Shadow(NamedTuple):
    """The shadow HPA as of the last status: its state, its fleet and where its target
    came from (read once per reconcile: the risk model and the comparison share it)."""

    state: ShadowState
    setup: ShadowSetup
    target_from: str


def shadow_of(
    previous: AgainstHpaStatus | None,
    spec: InferencePoolSpec,
    capacity: CapacityModel,
    gathered: Gathered,
) -> Shadow:
    setup, target_from = shadow_setup(spec, capacity, gathered.cold_start.seconds, gathered.hpa)
    return Shadow(shadow_state(previous), setup, target_from)


def learn_against_hpa(
    shadow: Shadow,
    spec: InferencePoolSpec,
    gathered: Gathered,
    capacity: CapacityModel,
    decision: ScalePlan,
    standby: StandbyStatus | None,
    now: float,
) -> AgainstHpaStatus:
    """The comparison with a shadow HPA after this reconcile (see
    :mod:`prescaler.backtest._shadow`): the last status's counters, one more observation."""
    seen = shadow_observed(spec, gathered, capacity, decision, standby, now)
    state = shadow_step(shadow.state, shadow.setup, seen)
    return against_hpa_status(state, shadow.setup, shadow.target_from, now)


def idle_since(
    previous: DemandStatus | None,
    snapshot: Snapshot | None,
    now: float,
    witnessed_from: float,
) -> float | None:
    """Since when demand has been zero or its series absent, as this operator witnessed it.

    ``snapshot`` is ``None`` when Prometheus could not be read: missing data is never
    idleness, so the clock stops. A garbage value stops it too; any demand > 0 resets it.
    The clock never starts before ``witnessed_from`` (this operator's first reconcile): an
    absent series right after a restart says nothing about the time before it.
    """
    if snapshot is None:
        return None
    rps = snapshot.demand
    if rps is None and not snapshot.demand_absent:
        return None
    if rps is not None and rps > 0:
        return None
    since = parse_rfc3339(previous.idle_since if previous is not None else None)
    return max(since if since is not None else now, witnessed_from)


def unschedulable(pods: Sequence[PodStart]) -> list[PodStart]:
    """Pods no node can take now (not terminating)."""
    return [p for p in pods if p.unschedulable is not None and not p.terminating]


def forecast_view(
    forecast: ForecastLike, *, model: str, score: float | None, quantile: float
) -> ForecastStatus:
    """About a dozen points spread evenly over the horizon, each the max over its stretch
    (so a short spike is not lost between shown points). A point with a non-finite value is
    left out: one NaN would make the whole status write invalid JSON, and the status would
    go on showing an older forecast than the plan's."""
    points = [p for p in forecast.points if math.isfinite(p.mean) and math.isfinite(p.upper)]
    shown: list[ForecastPoint] = []
    if points:
        per = max(1, math.ceil(len(points) / MAX_FORECAST_POINTS))
        for i in range(0, len(points), per):
            chunk = points[i : i + per]
            top = max(chunk, key=lambda p: p.upper)
            shown.append(
                ForecastPoint(
                    t=rfc3339(chunk[-1].t),
                    mean=round(max(p.mean for p in chunk), 4),
                    upper=round(top.upper, 4),
                )
            )
    horizon = (points[-1].t - forecast.generated_at) if points else 0.0
    peak = max((p.upper for p in points), default=None)
    return ForecastStatus(
        generated_at=rfc3339(forecast.generated_at),
        model=model,
        score=None if score is None or not math.isfinite(score) else round(score, 3),
        quantile=quantile,
        horizon_seconds=round(horizon, 1),
        # Four significant digits: what `kubectl get ppool` shows as the peak.
        peak=None if peak is None else float(f"{peak:.4g}"),
        points=shown[:MAX_FORECAST_POINTS],
    )


def selection_status(selection: Selection | None, fingerprint: str) -> SelectionStatus | None:
    """The compact status form of an auto-selection (``None`` when it has no score: with
    too little history to backtest there is nothing worth keeping)."""
    if selection is None or selection.score is None or not math.isfinite(selection.score):
        return None
    return SelectionStatus(
        model=selection.model,
        score=round(selection.score, 3),
        selected_at=rfc3339(selection.at),
        scores={k: round(v, 3) for k, v in selection.scores.items() if math.isfinite(v)},
        origins=selection.origins,
        fingerprint=fingerprint,
    )


def selection_from_status(
    status: SelectionStatus | None, fingerprint: str, candidates: Sequence[str]
) -> Selection | None:
    """The selection a previous operator kept in the status, if it was made for the same
    series and settings (``fingerprint``); ``candidates`` orders the scored models."""
    if status is None or status.fingerprint != fingerprint:
        return None
    at = parse_rfc3339(status.selected_at)
    scored = tuple(c for c in candidates if c in status.scores)
    if at is None or status.model not in scored or len(scored) != len(status.scores):
        return None
    return Selection(
        model=status.model,
        score=status.score,
        scores=dict(status.scores),
        at=at,
        origins=status.origins,
        candidates=scored,
    )


def next_window(windows: Sequence[ScheduledWindow], now: float) -> WindowStatus | None:
    best = None
    for window in windows:
        occurrence = window.next_occurrence(now)
        if occurrence is not None and (best is None or occurrence.start < best.start):
            best = occurrence
    if best is None:
        return None
    return WindowStatus(
        name=best.name,
        start=rfc3339(best.start),
        end=rfc3339(best.end),
        prewarm_at=rfc3339(best.prewarm_at),
    )


Status = Literal["True", "False", "Unknown"]


@dataclass(frozen=True, slots=True)
class ConditionUpdate:
    type: ConditionType
    status: Status
    reason: str
    message: str = ""


def merge_conditions(
    previous: Sequence[Condition],
    updates: Sequence[ConditionUpdate],
    now: float,
    generation: int | None,
) -> list[Condition]:
    """Apply updates; ``lastTransitionTime`` moves only when a condition's status changes."""
    by_type = {c.type: c for c in previous}
    for update in updates:
        old = by_type.get(update.type)
        moved = old is None or old.status != update.status
        by_type[update.type] = Condition(
            type=update.type,
            status=update.status,
            reason=update.reason,
            message=update.message[:1024],
            last_transition_time=rfc3339(now) if moved or old is None else old.last_transition_time,
            observed_generation=generation,
        )
    return sorted(by_type.values(), key=lambda c: CONDITION_TYPES.index(c.type))


def status_patch(previous: dict[str, Any], status: InferencePoolStatus) -> dict[str, Any]:
    """A merge patch that turns ``previous`` into ``status``: keys that are gone are set to
    null at every depth (a merge patch merges nested objects, so a key left out of a nested
    object, such as a role's ``externalChange``, would otherwise stay)."""
    return merge_patch(previous, status.wire())


def merge_patch(previous: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """A merge patch (RFC 7386) that turns the JSON object ``previous`` into ``new``."""
    patch: dict[str, Any] = {key: None for key in previous if key not in new}
    for key, value in new.items():
        old = previous.get(key)
        if isinstance(old, dict) and isinstance(value, dict):
            value = merge_patch(old, value)
        patch[key] = value
    return patch


def apply_merge_patch(previous: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """What a JSON merge patch (RFC 7386) makes of ``previous``: nested objects merge, a
    null removes, anything else (lists too) replaces."""
    out = dict(previous)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = apply_merge_patch(out[key], value)
        else:
            out[key] = value
    return out


def status_ops(previous: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
    """A JSON patch (RFC 6902) that turns the status ``previous`` into ``new``, carrying
    only what changed (empty: nothing did). Lists of the same length are patched element
    by element, so one hour of ``againstHpa.hours`` changing sends that hour, not the
    week; a list whose per-element patch would be longer than itself is replaced."""
    if not previous:
        return [] if not new else [{"op": "add", "path": "/status", "value": new}]
    return _ops("/status", previous, new)


OBSERVATIONS = (
    "/demand",
    "/forecast",
    "/risk",
    "/againstHpa",
    "/plan/reason",
    "/plan/lookaheadSeconds",
    "/plan/recentTargets",
    "/degradation/forecastShortfallPercent",
    "/degradation/forecastShortfallTokensPerSecond",
    "/degradation/reasons",
    "/keda",
)
"""Status paths (of a pool, or of a role under ``roles``) that move with every reconcile's
measurements and learning: demand, the forecast, the risk model, the comparison with a
shadow HPA, the wording of the plan and of the degradation level (e.g. how long a level
is still held). A change there alone need not be written at once."""
_DECISIONS = ("/forecast/selection",)
"""Exceptions under :data:`OBSERVATIONS`: a new auto-selection is written at once."""


def observation_only(op: dict[str, Any]) -> bool:
    """A JSON patch operation (of :func:`status_ops`) that only moves an observation
    (:data:`OBSERVATIONS`), a condition's message (its status and reason are decisions),
    or a timestamp (e.g. the time the plan's last target was seen)."""
    path = op["path"].removeprefix("/status")
    if path.startswith("/roles/"):
        path = "/" + path.removeprefix("/roles/").partition("/")[2]
    if not any(path == p or path.startswith(p + "/") for p in _DECISIONS) and any(
        path == p or path.startswith(p + "/") for p in OBSERVATIONS
    ):
        return True
    parts = path.split("/")
    if len(parts) == 4 and parts[1] == "conditions" and parts[3] == "message":
        return True  # a condition's wording (a refit's score, say); not its status or reason
    value = op.get("value")
    return op["op"] == "replace" and isinstance(value, str) and parse_rfc3339(value) is not None


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _ops(path: str, old: Any, new: Any) -> list[dict[str, Any]]:
    if isinstance(old, dict) and isinstance(new, dict):
        ops: list[dict[str, Any]] = [
            {"op": "remove", "path": f"{path}/{_pointer(k)}"} for k in old if k not in new
        ]
        for key, value in new.items():
            where = f"{path}/{_pointer(key)}"
            if key not in old:
                ops.append({"op": "add", "path": where, "value": value})
            else:
                ops += _ops(where, old[key], value)
        return ops
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        ops = [
            op
            for i, (a, b) in enumerate(zip(old, new, strict=True))
            for op in _ops(f"{path}/{i}", a, b)
        ]
        if len(ops) <= 1 or len(json.dumps(ops)) < len(json.dumps(new)):
            return ops
        return [{"op": "replace", "path": path, "value": new}]
    if old == new and isinstance(old, bool) == isinstance(new, bool):
        return []  # 2 and 2.0 alike: the API server keeps a whole float as an integer
    return [{"op": "replace", "path": path, "value": new}]


def parse_status(raw: dict[str, Any] | None) -> InferencePoolStatus:
    """The previous status, tolerating garbage (it is only a cache of our own output)."""
    try:
        return InferencePoolStatus.model_validate(raw or {})
    except ValueError:
        return InferencePoolStatus()


# ---------------------------------------------------------------------- composition
def shortfall(observed: float, workload: Workload, capacity: CapacityModel) -> float:
    """Demand above what the ready replicas serve, requests/s (0 when covered)."""
    served = workload.ready_replicas * capacity.replica_requests_per_second / capacity.headroom
    return max(0.0, observed - served)


def forecast_error(previous: ForecastStatus | None, observed: float, now: float) -> float | None:
    """Relative error of the previous forecast's mean for the step that contains ``now``."""
    if previous is None or not previous.points:
        return None
    for point in previous.points:
        t = parse_rfc3339(point.t)
        if t is not None and t >= now:
            return abs(observed - point.mean) / max(observed, 1e-9)
    return None


def compose_status(
    spec: InferencePoolSpec,
    generation: int | None,
    previous: InferencePoolStatus,
    decision: ScalePlan,
    gathered: Gathered,
    capacity: CapacityModel,
    windows: tuple[ScheduledWindow, ...],
    standby: StandbyStatus | None,
    now: float,
) -> InferencePoolStatus:
    """The new status from the plan and what was gathered (pure)."""
    applied = decision.changed and not spec.dry_run
    up = applied and decision.desired_replicas > decision.current_replicas
    down = applied and decision.desired_replicas < decision.current_replicas
    stamp = rfc3339(now)
    ready = gathered.workload.ready_replicas
    hot = standby.hot if standby is not None else None
    promoted = (hot.promoted or 0) if hot is not None else 0
    updates = [ConditionUpdate("Invalid", "False", "Valid", "")]
    stuck = unschedulable(gathered.pods)
    if stuck:
        updates.append(
            ConditionUpdate(
                "CapacityAvailable",
                "False",
                "Unschedulable",
                f"{len(stuck)} of {gathered.workload.replicas} replicas cannot be scheduled, "
                f"not counted as arriving capacity: {stuck[0].unschedulable}",
            )
        )
    else:
        updates.append(
            ConditionUpdate("CapacityAvailable", "True", "Schedulable", "every replica has a node")
        )
    if spec.forecast is None:
        updates.append(
            ConditionUpdate("MetricsAvailable", "Unknown", "NotConfigured", "no spec.forecast")
        )
        updates.append(
            ConditionUpdate("ForecastHealthy", "Unknown", "NotConfigured", "no spec.forecast")
        )
    else:
        warning = gathered.metrics_warning
        if gathered.metrics_problem is None and warning is not None:
            updates.append(
                ConditionUpdate("MetricsAvailable", "True", "PlaintextCredentials", warning)
            )
        elif gathered.metrics_problem is None:
            updates.append(ConditionUpdate("MetricsAvailable", "True", "Available", ""))
        else:
            also = f"; {warning}" if warning is not None else ""
            updates.append(
                ConditionUpdate(
                    "MetricsAvailable", "False", "Unavailable", gathered.metrics_problem + also
                )
            )
        result = gathered.forecast
        if result is not None:
            updates.append(
                ConditionUpdate(
                    "ForecastHealthy",
                    "True" if result.healthy else "False",
                    result.reason,
                    result.message,
                )
            )
    if decision.active_windows:
        names = ", ".join(decision.active_windows)
        updates.append(ConditionUpdate("ScheduleActive", "True", "WindowActive", names))
    else:
        updates.append(ConditionUpdate("ScheduleActive", "False", "NoWindow", ""))
    if spec.dry_run:
        updates.append(
            ConditionUpdate("DryRun", "True", "DryRun", f"would set {decision.desired_replicas}")
        )
    else:
        updates.append(ConditionUpdate("DryRun", "False", "Applying", ""))
    extra = f" (+{promoted} promoted hot standby)" if promoted else ""
    if ready + promoted >= decision.desired_replicas:
        updates.append(ConditionUpdate("Ready", "True", "CapacityReady", f"{ready} ready{extra}"))
    else:
        waiting = f", {len(stuck)} unschedulable" if stuck else ""
        updates.append(
            ConditionUpdate(
                "Ready",
                "False",
                "Scaling",
                f"{ready} of {decision.desired_replicas} ready{extra}{waiting}",
            )
        )

    forecast_status = previous.forecast if spec.forecast is not None else None
    result = gathered.forecast
    if result is not None and result.forecast is not None and spec.forecast is not None:
        fc = result.forecast
        forecast_status = forecast_view(fc, model=fc.model, score=fc.score, quantile=fc.quantile)
    if forecast_status is not None and result is not None and result.selection is not None:
        forecast_status = forecast_status.model_copy(update={"selection": result.selection})
    snapshot = gathered.snapshot
    demand = None
    if snapshot is not None:
        observed = snapshot.demand
        # In requests/s: a role's token shortfall over its tokens per request.
        per_request = capacity.unit.per_request
        short = None
        if observed is not None and per_request > 0:
            short = _round(shortfall(observed, gathered.workload, capacity) / per_request)
        demand = DemandStatus(
            requests_per_second=_round(snapshot.requests_per_second),
            tokens_per_second=_round(snapshot.tokens_per_second),
            waiting=_round(snapshot.waiting),
            shortfall_requests_per_second=short,
            idle_since=rfc3339(gathered.idle_since) if gathered.idle_since is not None else None,
        )
    if spec.dry_run:
        standby = StandbyStatus(
            placeholders=StandbyPartStatus(desired=decision.standby_replicas, ready=0)
            if spec.standby.placeholders.enabled
            else None
        )
    return InferencePoolStatus(
        observed_generation=generation,
        conditions=merge_conditions(previous.conditions, updates, now, generation),
        desired_replicas=decision.desired_replicas,
        current_replicas=decision.current_replicas,
        ready_replicas=ready,
        plan=PlanStatus(
            action=decision.action,
            reason=decision.reason[:1024],
            constraint=decision.constraint,
            target_replicas=decision.target_replicas,
            lookahead_seconds=round(decision.lookahead_seconds, 1),
            standby_replicas=decision.standby_replicas,
            active_windows=list(decision.active_windows),
            recent_targets=[
                RecentTarget(at=rfc3339(t), replicas=r) for t, r in decision.recent_targets
            ][-64:],
            planned_at=stamp,
        ),
        forecast=forecast_status,
        demand=demand,
        cold_start=gathered.cold_start,
        next_window=next_window(windows, now),
        standby=standby,
        last_scale_time=stamp if applied else previous.last_scale_time,
        last_scale_up_time=stamp if up else previous.last_scale_up_time,
        last_scale_down_time=stamp if down else previous.last_scale_down_time,
    )


def keda_status(gathered: Gathered, planned: int, namespace: str, pool: str) -> KedaStatus | None:
    """What KEDA does with the plan (mode ``kedaTrigger``), or ``None`` in other modes."""
    keda = gathered.keda
    if keda is None:
        return None
    workload = gathered.workload
    triggers = keda.triggers_for(namespace, pool)
    hpa = gathered.keda_hpa
    query = Query(namespace, pool)
    metric = (
        None if hpa is None else any(query.names_hpa_metric(name) for name in hpa.external_metrics)
    )
    if triggers == 0:
        message = (
            f"ScaledObject {keda.name} has no external trigger with metadata pool: {pool}; "
            "KEDA does not use the plan"
        )
    elif metric is False and hpa is not None:
        message = (
            f"KEDA's HPA {hpa.name} has no metric {query.metric_name} for this pool's "
            f"trigger, so the plan ({planned}) scales nothing: KEDA leaves out of its HPA a "
            "trigger it could not reach when it built it, until the spec of ScaledObject "
            f"{keda.name} changes; check that KEDA reaches prescaler's scaler"
        )
    elif keda.fallback:
        message = (
            f"KEDA holds {workload.kind}/{workload.name} at its fallback ({workload.replicas} "
            f"now): a trigger of ScaledObject {keda.name} keeps failing; the plan is {planned}"
        )
    else:
        message = (
            f"KEDA scales {workload.kind}/{workload.name} to the largest of its triggers: "
            f"{workload.replicas} now, the plan {planned}"
        )
    return KedaStatus(
        scaled_object=keda.name,
        workload=f"{workload.kind}/{workload.name}",
        hpa=keda.hpa_name,
        workload_replicas=workload.replicas,
        triggers=triggers,
        metric=metric,
        active=keda.active,
        fallback=keda.fallback,
        message=message,
    )


# ---------------------------------------------------------------------- roles
_ROLE_FIELDS = {"roles", "role_summary"}
# Per condition type, the statuses from worst to best: a pool's condition is its worst role's.
_WORST_FIRST: dict[ConditionType, tuple[Status, ...]] = {
    "Invalid": ("True", "Unknown", "False"),
    "ExternalChange": ("True", "Unknown", "False"),
    "ScheduleActive": ("True", "Unknown", "False"),
    "DryRun": ("True", "Unknown", "False"),
}


def role_previous(previous: InferencePoolStatus, role: Role) -> InferencePoolStatus:
    """One role's previous status, as the unified status its fleet is reconciled with."""
    fleet = getattr(previous.roles, role) if previous.roles is not None else None
    if fleet is None:
        return InferencePoolStatus()
    return InferencePoolStatus.model_validate(fleet.model_dump(by_alias=True))


def combine_roles(
    previous: InferencePoolStatus,
    roles: dict[Role, InferencePoolStatus],
    now: float,
    generation: int | None,
) -> InferencePoolStatus:
    """A disaggregated pool's status from its roles': each role's under ``roles``, the
    replica counts summed (every replica holds GPUs), each condition its worst role's
    (message prefixed with the role), a one-line summary for ``kubectl get``, and the
    roles' comparisons with a shadow HPA added up (:func:`roles_against_hpa`)."""
    ordered = [(r, roles[r]) for r in ROLES if r in roles]
    updates: list[ConditionUpdate] = []
    for type_ in CONDITION_TYPES:
        found = [(r, c) for r, st in ordered for c in st.conditions if c.type == type_]
        if not found:
            continue
        rank = _WORST_FIRST.get(type_, ("False", "Unknown", "True"))
        _, worst = min(found, key=lambda rc: rank.index(rc[1].status))
        message = "; ".join(
            f"{r}: {c.message}" for r, c in found if c.status == worst.status and c.message
        )
        updates.append(ConditionUpdate(type_, worst.status, worst.reason, message))

    def total(field: str) -> int | None:
        values = [getattr(st, field) for _, st in ordered]
        return None if any(v is None for v in values) else sum(values)

    def latest(field: str) -> str | None:
        values = [v for _, st in ordered if (v := getattr(st, field)) is not None]
        return max(values, default=None)

    summary = ", ".join(
        f"{r} {st.ready_replicas or 0}/{st.desired_replicas or 0}"
        + (f" {st.plan.constraint}" if st.plan is not None else "")
        for r, st in ordered
    )
    fleets = {r: FleetStatus.model_validate(st.model_dump(by_alias=True, exclude=_ROLE_FIELDS))
              for r, st in ordered}  # fmt: skip
    return InferencePoolStatus(
        observed_generation=generation,
        conditions=merge_conditions(previous.conditions, updates, now, generation),
        desired_replicas=total("desired_replicas"),
        current_replicas=total("current_replicas"),
        ready_replicas=total("ready_replicas"),
        next_window=ordered[0][1].next_window if ordered else None,
        last_scale_time=latest("last_scale_time"),
        last_scale_up_time=latest("last_scale_up_time"),
        last_scale_down_time=latest("last_scale_down_time"),
        roles=RolesStatus(prefill=fleets.get("prefill"), decode=fleets.get("decode")),
        role_summary=summary[:256],
        against_hpa=roles_against_hpa([st.against_hpa for _, st in ordered]),
    )


def roles_against_hpa(roles: Sequence[AgainstHpaStatus | None]) -> AgainstHpaStatus | None:
    """A disaggregated pool's comparison with a shadow HPA: its roles' windows added up
    (:func:`roles_window`), for ``kubectl get`` and the pool's metrics. The shadows' state
    and hourly counters stay each role's. ``None`` unless every role has a comparison."""
    known = [r for r in roles if r is not None]
    if not known or len(known) < len(roles):
        return None
    day = roles_window([r.last24_hours for r in known])
    return AgainstHpaStatus(
        basis="plan" if any(r.basis == "plan" for r in known) else "fleet",
        summary=against_hpa_summary(day) if day is not None else "",
        last24_hours=day,
        last7_days=roles_window([r.last7_days for r in known]),
    )


def roles_window(windows: Sequence[AgainstHpaWindow | None]) -> AgainstHpaWindow | None:
    """The roles' windows as one: GPU-hours summed and the saving recomputed from the sums;
    the hours both were compared; the worse role's unserved share and minutes short.

    The last two are lower bounds of the pool's. The roles count demand in different
    tokens (prompt, output), so a share of their summed demand would weigh each role by
    its tokens per request; a request that waited in either role waited, so the worse
    role's share is the least the pool's can be. Each role counts its short minutes, not
    which minutes they were, so a minute both were short cannot be told from two: the
    worse role's count is the least number of minutes some role was short. ``None`` unless
    every role has the window."""
    known = [w for w in windows if w is not None]
    if not known or len(known) < len(windows):
        return None
    gpu_hours = sum(w.gpu_hours for w in known)
    hpa_gpu_hours = sum(w.hpa_gpu_hours for w in known)
    saved = hpa_gpu_hours - gpu_hours
    return AgainstHpaWindow(
        observed_hours=min(w.observed_hours for w in known),
        gpu_hours=round(gpu_hours, 4),
        standby_gpu_hours=round(sum(w.standby_gpu_hours for w in known), 4),
        hpa_gpu_hours=round(hpa_gpu_hours, 4),
        saved_gpu_hours=round(saved, 4),
        saved_percent=round(100 * saved / hpa_gpu_hours, 2) if hpa_gpu_hours > 0 else None,
        unserved_fraction=_worst(w.unserved_fraction for w in known),
        hpa_unserved_fraction=_worst(w.hpa_unserved_fraction for w in known),
        short_minutes=max(w.short_minutes for w in known),
        hpa_short_minutes=max(w.hpa_short_minutes for w in known),
        direction_changes=sum(w.direction_changes for w in known),
        hpa_direction_changes=sum(w.hpa_direction_changes for w in known),
    )


def _worst(shares: Iterable[float | None]) -> float | None:
    """The largest share known (``None``: no role had demand)."""
    return max((s for s in shares if s is not None), default=None)


def invalid_status(
    previous: InferencePoolStatus,
    reason: str,
    message: str,
    now: float,
    generation: int | None,
) -> InferencePoolStatus:
    """The status of a pool that is not served: the previous one, marked Invalid."""
    conditions = merge_conditions(
        previous.conditions,
        [
            ConditionUpdate("Invalid", "True", reason, message),
            ConditionUpdate("Ready", "False", reason, "the pool is invalid and not served"),
        ],
        now,
        generation,
    )
    return previous.model_copy(update={"conditions": conditions, "observed_generation": generation})


def _round(value: float | None, digits: int = 4) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, digits)
