"""The InferencePool status, as pydantic models. Small by design: a dozen forecast points."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from prescaler.api._base import WireModel
from prescaler.planning import LEVEL_BUCKETS

ConditionType = Literal[
    "Ready",
    "MetricsAvailable",
    "ForecastHealthy",
    "CapacityAvailable",
    "ScheduleActive",
    "DryRun",
    "Invalid",
    "ExternalChange",
    "Prewarm",
    "RiskCalibrated",
    "StandbyAllowed",
    "KedaTrigger",
]
CONDITION_TYPES: tuple[ConditionType, ...] = (
    "Ready",
    "MetricsAvailable",
    "ForecastHealthy",
    "CapacityAvailable",
    "ScheduleActive",
    "DryRun",
    "Invalid",
    "ExternalChange",
    "Prewarm",
    "RiskCalibrated",
    "StandbyAllowed",
    "KedaTrigger",
)
MAX_FORECAST_POINTS = 12


class Condition(WireModel):
    """A standard Kubernetes condition."""

    type: ConditionType
    """Condition type."""
    status: Literal["True", "False", "Unknown"]
    """Whether the condition holds."""
    reason: str = Field(max_length=128)
    """CamelCase reason for the last transition."""
    message: str = Field(default="", max_length=1024)
    """Human-readable detail."""
    last_transition_time: str = Field(max_length=64)
    """When the status last changed (RFC 3339)."""
    observed_generation: int | None = None
    """The spec generation this condition was computed for."""


class RecentTarget(WireModel):
    """One earlier target the scale-down still respects."""

    at: str = Field(max_length=64)
    """When it was planned (RFC 3339)."""
    replicas: int = Field(ge=0)
    """What it asked for."""


class PlanStatus(WireModel):
    """The last plan: what it asked for and why."""

    action: Literal["scale_up", "scale_down", "hold", "steady"]
    """What the plan did."""
    reason: str = Field(max_length=1024)
    """Why, in one line."""
    constraint: Literal["memory", "compute", "schedule", "floor"]
    """The driving constraint (the bottleneck)."""
    target_replicas: int
    """What the lookahead asks for before scale-down pacing."""
    lookahead_seconds: float
    """Cold start plus margin: how far ahead the plan looked."""
    standby_replicas: int = 0
    """Warm standby the plan asks for."""
    active_windows: list[str] = Field(default_factory=list, max_length=64)
    """Scheduled windows that shaped this plan."""
    recent_targets: list[RecentTarget] = Field(default_factory=list, max_length=64)
    """The memory a scale-down respects: this plan's target and the larger ones of the last
    lookahead plus stabilization period, oldest first (kept here so a restart keeps it)."""
    planned_at: str | None = Field(default=None, max_length=64)
    """When the plan was made (RFC 3339). Written with the plan when it changes, else with
    the status checkpoints; the KEDA external scaler refuses a plan that has grown stale."""


class KedaStatus(WireModel):
    """What KEDA does with the plan (mode ``kedaTrigger``)."""

    scaled_object: str = Field(max_length=253)
    """The ScaledObject (``spec.target``)."""
    workload: str = Field(max_length=512)
    """Its ``scaleTargetRef``, ``<kind>/<name>``: the workload KEDA scales."""
    hpa: str | None = Field(default=None, max_length=253)
    """The HPA that KEDA made for it (``status.hpaName`` of the ScaledObject)."""
    workload_replicas: int = Field(ge=0)
    """The workload's replicas now: what KEDA's HPA set, from the plan and any other
    trigger (the HPA takes the largest)."""
    triggers: int = Field(ge=0)
    """The ScaledObject's ``external``/``external-push`` triggers that name this pool; 0
    means KEDA does not ask for the plan (see ``message``)."""
    metric: bool | None = None
    """KEDA's HPA carries the plan: it has an ``External`` metric KEDA made from this pool's
    trigger (``s<trigger index>-prescaler-<pool>``). False: KEDA's HPA has no such metric,
    so the plan scales nothing (KEDA leaves out of its HPA a trigger it could not reach
    when it built it, until the ScaledObject's spec changes). Unset: KEDA's HPA is not
    known yet."""
    active: bool | None = None
    """The ScaledObject's condition ``Active``, as KEDA reports it."""
    fallback: bool | None = None
    """The ScaledObject's condition ``Fallback``: true while KEDA holds
    ``spec.fallback.replicas`` because a trigger keeps failing (this one, if the operator
    cannot answer)."""
    message: str = Field(default="", max_length=1024)
    """One line on how KEDA uses the plan."""
    missing_since: str | None = Field(default=None, max_length=64)
    """Since when KEDA's HPA has carried no metric of this pool's trigger (or the
    ScaledObject has no trigger naming it), RFC 3339; unset while it carries one. Past
    ``keda.missing_periods`` reconcile periods: condition ``KedaTrigger`` False."""
    nudged_at: str | None = Field(default=None, max_length=64)
    """When the operator last nudged KEDA to rebuild its HPA (annotation
    ``prescaler.io/keda-reconcile`` on it; only with the ``keda.nudge`` setting on)."""


class ForecastPoint(WireModel):
    """One forecast step, demand in requests/s."""

    t: str = Field(max_length=64)
    """End of the step (RFC 3339)."""
    mean: float
    """Mean forecast."""
    upper: float
    """Upper quantile."""


class SelectionStatus(WireModel):
    """The latest auto-selection. A restarted operator resumes from it instead of
    backtesting again before the selection is due."""

    model: str = Field(max_length=128)
    """The model the backtest selected."""
    score: float
    """Its backtest sMAPE, percent (lower is better)."""
    selected_at: str = Field(max_length=64)
    """When the selection ran (RFC 3339); it is redone some hours later."""
    scores: dict[str, float] = Field(default_factory=dict, max_length=16)
    """Backtest sMAPE of every candidate, percent."""
    origins: int = 0
    """Forecast origins every candidate was scored at."""
    fingerprint: str = Field(default="", max_length=64)
    """Digest of the demand series and forecast settings it was made for (if they change,
    the selection is redone)."""


class ForecastStatus(WireModel):
    """A compact view of the forecast the plan used."""

    generated_at: str = Field(max_length=64)
    """When the forecast was made (RFC 3339)."""
    model: str = Field(max_length=128)
    """Model that produced it."""
    score: float | None = None
    """Backtest score of the model (lower is better)."""
    quantile: float
    """The upper quantile."""
    horizon_seconds: float
    """How far ahead the forecast reaches."""
    peak: float | None = None
    """Largest upper-quantile demand (requests/s) over the horizon."""
    points: list[ForecastPoint] = Field(default_factory=list, max_length=MAX_FORECAST_POINTS)
    """About a dozen points spread over the horizon."""
    selection: SelectionStatus | None = None
    """The latest auto-selection (``model: auto`` only)."""


class ColdStartStatus(WireModel):
    """The cold start the plan used, and what was measured."""

    seconds: float
    """The lead time in use."""
    source: Literal["measured", "fixed", "assumed"]
    """``measured`` (rolling p90 of observed starts), ``fixed`` (spec) or ``assumed``
    (auto mode before any start was observed)."""
    p90_seconds: float | None = None
    """Rolling p90 of observed starts (created -> Ready, the wait for a node included)."""
    scheduling_p90_seconds: float | None = None
    """Rolling p90 of the first part of a start: created -> scheduled on a node (the
    wait for a node an autoscaler brings)."""
    startup_p90_seconds: float | None = None
    """Rolling p90 of the second part: scheduled -> Ready (image pull, weight load)."""
    samples: list[float] = Field(default_factory=list, max_length=100)
    """Recent observed starts (created -> Ready), seconds, in the order counted."""
    scheduling_samples: list[float] = Field(default_factory=list, max_length=100)
    """The scheduling wait of each sample (created -> scheduled), in the same order."""
    observed_until: str | None = Field(default=None, max_length=64)
    """Creation time of the newest pod seen (RFC 3339)."""
    observed_pods: list[Annotated[str, Field(max_length=253)]] = Field(
        default_factory=list, max_length=100
    )
    """Pods created in the second of ``observedUntil`` that were already seen."""
    pending: list[Annotated[str, Field(max_length=253)]] = Field(
        default_factory=list, max_length=100
    )
    """Pods seen before they were Ready: each is a sample once Ready, unless it is
    given up on (unschedulable for 15 minutes, on its way out, or not Ready in an hour)."""


class WindowStatus(WireModel):
    """The scheduled window in progress or next to come."""

    name: str = Field(max_length=63)
    """Window name."""
    start: str = Field(max_length=64)
    """Start (RFC 3339)."""
    end: str = Field(max_length=64)
    """End (RFC 3339)."""
    prewarm_at: str = Field(max_length=64)
    """When capacity is requested for it (RFC 3339)."""


class StandbyPartStatus(WireModel):
    """One kind of standby object."""

    desired: int = 0
    """Pods wanted."""
    ready: int = 0
    """Pods ready."""
    promoted: int | None = None
    """Hot standby only: promoted pods serving in the target's Service now."""


class StandbyStatus(WireModel):
    """Warm standby objects the pool owns."""

    image_pre_pull: StandbyPartStatus | None = None
    """Pre-pull DaemonSet pods."""
    placeholders: StandbyPartStatus | None = None
    """Placeholder pods."""
    hot: StandbyPartStatus | None = None
    """Hot standby replicas."""


class DemandStatus(WireModel):
    """Demand as last measured."""

    requests_per_second: float | None = None
    """Requests/s arriving."""
    tokens_per_second: float | None = None
    """Prompt plus output tokens/s."""
    waiting: float | None = None
    """Requests queued."""
    shortfall_requests_per_second: float | None = None
    """Demand above what ready replicas can serve (0 when covered)."""
    idle_since: str | None = Field(default=None, max_length=64)
    """Since when demand has been zero or its series absent, as this operator saw it
    (RFC 3339); with ``minReplicas: 0`` the pool may reach zero a stabilization period
    later."""


class ExternalChangeStatus(WireModel):
    """The latest change of the target's replicas (or HPA floor) by someone else."""

    manager: str = Field(max_length=256)
    """The field manager that wrote it (``managedFields``), ``unknown`` if not recorded."""
    changed_at: str | None = Field(default=None, max_length=64)
    """When that manager wrote the target (RFC 3339), if recorded."""
    detected_at: str = Field(max_length=64)
    """When the operator found it (RFC 3339)."""
    from_replicas: int = Field(alias="from")
    """What the operator had set."""
    to_replicas: int = Field(alias="to")
    """What the other manager set."""
    action: Literal["Reverted", "Respected", "Paused", "Resumed"]
    """What the operator did about it (``spec.externalChanges``); ``Resumed`` once the
    operator scales the target again after respecting or pausing."""
    planned_replicas: int | None = None
    """``respect``: what the plan asked for at the change (before pacing); the other
    value holds while the plan asks for the same."""
    generation: int | None = None
    """``pause``: the spec generation at the change; an edited spec resumes scaling."""


DegradationLevel = Literal["normal", "warning", "critical"]
DegradationSignal = Literal["queue", "kvCache", "ttftP95", "ttftP99", "forecastShortfall"]


class AdmissionStatus(WireModel):
    """What a gateway applies at the current level (unset: no restriction)."""

    queue_depth_limit: int | None = None
    """Waiting requests (fleet-wide) beyond which new requests get 503."""
    retry_after_seconds: int | None = None
    """``Retry-After`` for those 503s: when the next capacity is expected to be ready."""
    max_context_tokens: int | None = None
    """Temporary cap on prompt plus output tokens per request."""
    shed_lanes: list[str] = Field(default_factory=list, max_length=16)
    """Priority lanes whose new requests are refused."""
    smaller_model_route: str | None = Field(default=None, max_length=253)
    """Where short requests may go instead."""
    smaller_model_max_prompt_tokens: int | None = None
    """What counts as short for that route."""


class DegradationStatus(WireModel):
    """The degradation level, why, and the admission policy published for gateways."""

    level: DegradationLevel
    """``normal``, ``warning`` or ``critical``."""
    since: str = Field(max_length=64)
    """When this level began (RFC 3339)."""
    reasons: list[Annotated[str, Field(max_length=512)]] = Field(default_factory=list, max_length=8)
    """The signals above normal, and why the level holds when it does."""
    forecast_shortfall_tokens_per_second: float | None = None
    """Upper-band demand over the next cold start minus capacity ready by then."""
    forecast_shortfall_percent: float | None = None
    """That share of the demand, percent."""
    admission: AdmissionStatus = Field(default_factory=AdmissionStatus)
    """The policy for this level."""
    config_map: str | None = Field(default=None, max_length=253)
    """The ConfigMap that publishes it, when ``spec.degradation.configMap``."""
    calm_since: str | None = Field(default=None, max_length=64)
    """Hysteresis: since when every signal has been below the level (RFC 3339)."""
    calm_peak: DegradationLevel = "normal"
    """Hysteresis: the highest level the signals showed since ``calmSince``."""
    raised_by: list[DegradationSignal] = Field(default_factory=list, max_length=8)
    """The signals at this level when it was last confirmed (a vanished one holds it)."""


class LookaheadStatus(WireModel):
    """One decision's lookahead, waiting to be scored when it ends (unix seconds, and
    demand in the plan's unit)."""

    start: float
    """The decision's time."""
    end: float
    """When new capacity asked for then is ready, plus the margin."""
    base: float
    """What was known at the decision: the forecast mean's peak or the observed demand."""
    sized: float
    """The demand sized for: ``base`` plus one replica's capacity, times the margin, less
    that replica."""
    unit: float = 0.0
    """The typical demand then (at least one replica's capacity): the ratio scored is
    ``(peak + unit) / (base + unit)``."""
    peak: float = 0.0
    """Largest demand observed in it so far."""
    demand: float = 0.0
    """Sum of the demand observed in it."""
    waited: float = 0.0
    """Sum of the demand observed to wait (above ready capacity, or behind a queue)."""
    seen: int = 0
    """Observations in it."""
    hpa_waited: float = 0.0
    """Sum of the demand that would have waited for the shadow HPA's ready replicas."""
    hpa_seen: int = 0
    """Observations in it with the shadow HPA known."""


class RiskBudgetStatus(WireModel):
    """The cost budget (``spec.objective.budgetToHpa``) as it holds now: a PI controller
    scales the objective's ``ε`` so that the pool's GPU-hours over the trailing day stay at
    the budget times its shadow HPA's."""

    budget_to_hpa: float
    """The budget: the pool's GPU-hours at most this share of its shadow HPA's."""
    gpu_hours_to_hpa: float | None = None
    """The pool's GPU-hours over the shadow HPA's over the trailing day
    (``status.againstHpa``'s last 24 hours; ``null``: no record yet)."""
    observed_hours: float | None = None
    """Hours of that record (with less than 24 the controller moves slower in
    proportion)."""
    binds: Literal["budget", "objective"] = "objective"
    """``budget``: the pool costs more than its budget and waits more than the objective
    asks, to stay inside it; ``objective``: the objective's ``ε`` holds (tightened while
    the pool is under budget)."""
    target_waited_fraction: float | None = None
    """The ``ε`` in force: the share of demand the next lookaheads are held to."""
    objective_waited_fraction: float | None = None
    """The objective's own ``ε`` (``relativeToHpa`` times ``hpaWaitedFraction``, at least
    ``relativeFloor``), before the budget's scale."""
    scale: float = 1.0
    """What the budget scales the objective by: above 1 the budget binds; below 1 (to 0.1)
    the pool spends what it saves on waiting less."""
    integral: float = 0.0
    """The controller's state: the integral part of ``log(scale)``."""
    message: str = Field(default="", max_length=512)
    """The same in words."""


class RiskStatus(WireModel):
    """The peak risk model: the margin the plan sizes with and what it learned from this
    pool's own lookaheads. Kept here so a restarted or failed-over operator goes on with
    the same calibration."""

    margin: float | None = None
    """The calibrated margin the last plan sized with, on what is known now plus the
    typical demand (``null`` until calibrated: what is known now over 0.7, and never
    below the forecast's upper band)."""
    quantile: float | None = None
    """The quantile level of the calibrated peak ratios the last plan sized with, as
    adapted to ``spec.objective`` in the current hour of the day (``null``: not adapted
    yet, ``spec.objective.startQuantile``)."""
    quantiles: list[float] = Field(default_factory=list, max_length=LEVEL_BUCKETS)
    """The adapted level per hour of the pool's day (its shortest seasonality period, from
    00:00 UTC; 24 of them): each hour's lookaheads move their own (empty: not adapted
    yet)."""
    outcomes: int = 0
    """Lookaheads scored so far."""
    objective: Literal["relativeToHpa", "servedFraction"] | None = None
    """The objective in force: relative to the shadow HPA (the default), or the absolute
    ``servedFraction`` when the spec sets one."""
    target_waited_fraction: float | None = None
    """The objective's current ``ε``, the share of demand it lets wait, over recent
    lookaheads (faded like the calibration): ``relativeToHpa`` times ``hpaWaitedFraction``,
    at least ``relativeFloor``, times the budget's ``budget.scale``; or
    ``1 - servedFraction``."""
    hpa_waited_fraction: float | None = None
    """Share of the demand of recent lookaheads that waited for the shadow HPA (faded like
    the calibration): the HPA's record on this pool, which a relative ``ε`` is a share of
    (``null``: no shadow HPA seen yet)."""
    hpa_demand: float | None = None
    """The faded demand ``hpaWaitedFraction`` is a share of (the plan's unit summed over
    observations): how much record it holds."""
    waited_fraction: float | None = None
    """Share of demand that waited in recent lookaheads (faded like the calibration):
    what ``targetWaitedFraction`` is held against."""
    budget: RiskBudgetStatus | None = None
    """With ``spec.objective.budgetToHpa``: the cost ceiling, what the pool spent against it
    over the trailing day, the ``ε`` in force, and which side binds."""
    calibration: list[float] = Field(default_factory=list, max_length=100)
    """Faded counts of the scores, ``log((peak + unit) / (base + unit))``, in 100 bins from
    -0.5 to 2.0."""
    pending: list[LookaheadStatus] = Field(default_factory=list, max_length=64)
    """Lookaheads not ended yet."""
    observed_at: float | None = None
    """When demand was last observed (unix seconds)."""
    mean_demand: float | None = None
    """The pool's typical demand (its recent mean, in the plan's unit): the margin is on
    what is known now plus this, so it is additive on a low base."""
    peak_demand: float | None = None
    """The largest demand observed lately (fading toward the typical demand, in the plan's
    unit): the margin never sizes for more than twice it."""
    seeded_from: Literal["history"] | None = None
    """``history``: the calibration started from a replay of the pool's own demand
    history through the same planner (a new pool, or a status lost), not from nothing."""
    seeded_hours: float | None = None
    """Hours of history the seed replayed (after the forecaster's warm-up)."""
    seeded_at: float | None = None
    """When the seed was taken (unix seconds)."""
    seed_seconds: float | None = None
    """How long the replay took, from the request to its result (seconds)."""


class AgainstHpaHour(WireModel):
    """One bucket of the comparison with the shadow HPA (the counters a restarted operator
    goes on from): an hour, or the hours of one UTC day once they are a day old. Demand
    counts requests (a role's tokens)."""

    start: float
    """The bucket's first second (unix seconds)."""
    span: float = Field(default=3600.0, gt=0, le=86400.0)
    """Seconds from ``start`` the bucket covers: 3600, or up to a day once merged."""
    seconds: float = 0.0
    """Seconds observed and scored in the bucket."""
    demand: float = 0.0
    """Demand that arrived."""
    gpu_hours: float = 0.0
    """Prescaler's GPU-hours, standby included."""
    standby_gpu_hours: float = 0.0
    """The standby part of ``gpuHours``."""
    unserved: float = 0.0
    """Demand prescaler's ready replicas did not serve in the step it arrived."""
    short_minutes: int = 0
    """Minutes prescaler's ready capacity was below demand in some step."""
    hpa_gpu_hours: float = 0.0
    """The shadow HPA's GPU-hours."""
    hpa_unserved: float = 0.0
    """Demand the shadow HPA's ready replicas did not serve in the step it arrived."""
    hpa_short_minutes: int = 0
    """Minutes the shadow HPA's ready capacity was below demand in some step."""
    direction_changes: int = 0
    """Times prescaler's fleet scaled the other way than its scale before."""
    hpa_direction_changes: int = 0
    """Times the shadow HPA scaled the other way than its scale before."""


class AgainstHpaWindow(WireModel):
    """Prescaler against the shadow HPA over one rolling window.

    A disaggregated pool's sums its roles' GPU-hours (``savedPercent`` from the sums);
    ``observedHours`` is the smaller of the roles' (the hours both were compared), and
    the unserved shares and minutes short are the worse role's. Those two are lower bounds
    for the pool: prefill and decode count demand in different tokens, so their shares do
    not add up, and the status counts each role's short minutes without keeping which
    minutes they were, so a minute both roles were short cannot be told from two."""

    observed_hours: float
    """Hours observed and scored in the window: the comparison's coverage."""
    gpu_hours: float
    """Prescaler's GPU-hours (its fleet, or in dry run its plan's, plus standby)."""
    standby_gpu_hours: float
    """The standby part of ``gpuHours``."""
    hpa_gpu_hours: float
    """The shadow HPA's GPU-hours."""
    saved_gpu_hours: float
    """``hpaGpuHours - gpuHours`` (negative: prescaler used more)."""
    saved_percent: float | None = None
    """``savedGpuHours`` as a percentage of ``hpaGpuHours``."""
    unserved_fraction: float | None = None
    """Share of the window's demand prescaler left unserved (estimated)."""
    hpa_unserved_fraction: float | None = None
    """Share of the window's demand the shadow HPA would have left unserved (estimated)."""
    short_minutes: int = 0
    """Minutes prescaler was short of demand."""
    hpa_short_minutes: int = 0
    """Minutes the shadow HPA would have been short of demand."""
    direction_changes: int = 0
    """Times prescaler's fleet changed direction (a scale-down after a scale-up, or the
    reverse). The planner holds it to the shadow HPA's count: a release that would be one
    change too many waits."""
    hpa_direction_changes: int = 0
    """Times the shadow HPA would have changed direction."""


class HpaRecommendation(WireModel):
    """One raw recommendation in the shadow HPA's scale-down stabilization window."""

    at: float
    """The sync's time (unix seconds)."""
    replicas: int
    """What it recommended."""


class ShadowFleetStatus(WireModel):
    """A simulated fleet: its ready replicas and when the starting ones become ready."""

    ready: int = 0
    """Ready replicas."""
    starting: list[float] = Field(default_factory=list, max_length=1000)
    """When each starting replica becomes ready (unix seconds)."""


class ShadowHpaStatus(ShadowFleetStatus):
    """The shadow HPA: the backtest's reactive policy (Kubernetes' HPA algorithm) run on
    the pool's observed demand with its measured cold start."""

    target: float = 0.7
    """The target utilization it scales to."""
    target_from: str = Field(default="default", max_length=320)
    """Where the target comes from: ``HorizontalPodAutoscaler/<name>`` (an HPA on the same
    target, its utilization target), or ``default`` (the backtest's 0.7)."""
    replica_capacity: float | None = None
    """What one replica serves, in the demand's unit (requests/s, a role's tokens/s)."""
    cold_start_seconds: float | None = None
    """The cold start its replicas take (the pool's measured cold start)."""
    recommendations: list[HpaRecommendation] = Field(default_factory=list, max_length=64)
    """Its scale-down stabilization window."""
    metric_ready: list[int] = Field(default_factory=list, max_length=8)
    """Its ready replicas at the last syncs (the pods its lagging metric came from)."""


class AgainstHpaStatus(WireModel):
    """What prescaler saved against a reactive HPA on the same demand, live: GPU-hours,
    demand left unserved and minutes short, over the last 24 hours and 7 days. Estimates:
    the demand is what reached the real fleet (served plus the queue's growth where it was
    saturated). Kept here so a restarted or failed-over operator goes on counting.

    A disaggregated pool's is its roles' sum and holds only ``basis``, ``summary`` and the
    two windows: each role runs its own shadow HPA, whose state and counters are under
    ``roles.<role>.againstHpa``."""

    basis: Literal["fleet", "plan"] = "fleet"
    """Prescaler's side: its real fleet, or in dry run its plan's fleet, simulated with the
    same cold start as the shadow's."""
    summary: str = Field(default="", max_length=128)
    """One line for ``kubectl get -o wide``: GPU-hours saved in the last 24 hours."""
    last24_hours: AgainstHpaWindow | None = None
    """The last 24 hours."""
    last7_days: AgainstHpaWindow | None = None
    """The last 7 days."""
    from_history: AgainstHpaWindow | None = None
    """An estimate from the replay of the pool's own history that seeded its risk model
    (``status.risk.seededFrom``): prescaler's planner and the HPA on the same past demand,
    simulated. Not the live shadow: it stands until the live windows have hours of their
    own, and is kept for reference."""
    hpa: ShadowHpaStatus | None = None
    """The shadow HPA now (a disaggregated pool's sum has none: see its roles')."""
    plan_fleet: ShadowFleetStatus | None = None
    """Dry run: the plan's simulated fleet."""
    clock: float | None = None
    """The shadow's last sync (unix seconds)."""
    queue: float | None = None
    """Prescaler's estimated queue (demand units)."""
    hpa_queue: float | None = None
    """The shadow HPA's estimated queue."""
    minute: float | None = None
    """The minute being counted (unix seconds)."""
    short: bool | None = None
    """Prescaler was short in ``minute`` so far."""
    hpa_short: bool | None = None
    """The shadow HPA was short in ``minute`` so far."""
    fleet_replicas: int | None = None
    """Prescaler's fleet (in dry run, its plan's) at the last observation."""
    direction: Literal[-1, 0, 1] | None = None
    """The direction of prescaler's last scale (1 up, -1 down)."""
    hpa_direction: Literal[-1, 0, 1] | None = None
    """The direction of the shadow HPA's last scale."""
    hours: list[AgainstHpaHour] | None = Field(default=None, max_length=170)
    """The counters of the last 7 days, oldest first: one bucket per hour for the last 24
    hours, one per UTC day before them (a disaggregated pool's sum has none: see its
    roles')."""


class FleetStatus(WireModel):
    """Observed state of one fleet: a unified pool, or one role of a disaggregated pool."""

    observed_generation: int | None = None
    """The spec generation last reconciled."""
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    )
    """Ready, MetricsAvailable, ForecastHealthy, CapacityAvailable, ScheduleActive, DryRun,
    Invalid, ExternalChange, Prewarm (pools with ``spec.prewarm``: ``True`` when the
    target's pods wait for their warm-up, ``False`` when they cannot: no readiness gate in
    the template, or no prompts), StandbyAllowed (pools with standby placeholders:
    ``False`` when their PriorityClass is not one the operator allows, or not below the
    priority of the target's pods; the pool scales, without placeholders), and KedaTrigger
    (mode ``kedaTrigger``: ``True`` while KEDA's HPA carries the plan, ``False`` when it has
    lacked this pool's trigger for a few periods, with the fix in its message)."""
    desired_replicas: int | None = None
    """Replicas the plan asks for."""
    current_replicas: int | None = None
    """Replicas (or HPA floor; in ``kedaTrigger`` mode the plan last served to KEDA) before
    the plan was applied."""
    ready_replicas: int | None = None
    """Ready replicas of the target."""
    plan: PlanStatus | None = None
    """The last plan."""
    forecast: ForecastStatus | None = None
    """The forecast in use."""
    demand: DemandStatus | None = None
    """Last measured demand."""
    cold_start: ColdStartStatus | None = None
    """The cold start in use."""
    risk: RiskStatus | None = None
    """The peak risk model's margin and calibration (pools with ``spec.forecast``)."""
    against_hpa: AgainstHpaStatus | None = None
    """Prescaler against a shadow HPA on the same demand (pools with ``spec.forecast``). A
    disaggregated pool has one per role, and at the top level their sum (the windows only)."""
    next_window: WindowStatus | None = None
    """The scheduled window in progress or next."""
    standby: StandbyStatus | None = None
    """Standby objects."""
    last_scale_time: str | None = Field(default=None, max_length=64)
    """Last time replicas were changed (RFC 3339)."""
    last_scale_up_time: str | None = Field(default=None, max_length=64)
    """Last scale-up (RFC 3339)."""
    last_scale_down_time: str | None = Field(default=None, max_length=64)
    """Last scale-down (RFC 3339)."""
    applied_replicas: int | None = None
    """Replicas (``hpaFloor``: HPA floor; ``kedaTrigger``: the plan served to KEDA) the
    operator last set on the target or kept there. The target holding another value,
    written by another field manager, is an external change."""
    applied_target: str | None = Field(default=None, max_length=512)
    """The target ``appliedReplicas`` is about, ``<kind>/<name>``. When ``spec.target``
    names another object, what the operator set on the old one is forgotten: the new
    target's replicas are not compared with it."""
    degradation: DegradationStatus | None = None
    """The degradation level and its admission policy."""
    external_change: ExternalChangeStatus | None = None
    """The latest external change and what was done about it (``spec.externalChanges``)."""
    keda: KedaStatus | None = None
    """What KEDA does with the plan (mode ``kedaTrigger`` only)."""


class ServedByStatus(WireModel):
    """Which operator replica and shard serve the pool (operators run with shards only).
    Written by the replica that serves it, when it takes the pool over."""

    replica: str = Field(min_length=1, max_length=253)
    """The replica's identity (its pod name in the Helm chart)."""
    shard: int = Field(ge=0, le=1023)
    """The pool's shard: a hash of its demand series, so pools reading one series share it."""
    shards: int = Field(ge=1, le=1024)
    """How many shards the pools are split into."""


class RolesStatus(WireModel):
    """A disaggregated pool's roles, each planned, scaled and reported on its own: the
    plan's forecast and demand count the role's tokens/s (prefill: prompt tokens, decode:
    output tokens) where a unified pool counts requests/s."""

    prefill: FleetStatus | None = None
    """The prefill role."""
    decode: FleetStatus | None = None
    """The decode role."""


class EvidenceStatus(WireModel):
    """The ways of planning on the replayed demand, pooled over the daily checks so far:
    the shares of demand left waiting and the GPU-hours (per replayed day)."""

    forecast_unserved: float = Field(ge=0)
    """The forecast planner: the share of demand it left waiting."""
    forecast_gpu_hours: float = Field(ge=0)
    """The forecast planner: its GPU-hours."""
    hpa_unserved: float = Field(ge=0)
    """The HPA at the pool's target: the share of demand it left waiting."""
    hpa_gpu_hours: float = Field(ge=0)
    """The HPA at the pool's target: its GPU-hours."""
    curve_unserved: list[Annotated[float, Field(ge=0)]] = Field(max_length=16)
    """The HPA swept over its target (0.5 to 0.9): what each point left waiting."""
    curve_gpu_hours: list[Annotated[float, Field(ge=0)]] = Field(max_length=16)
    """...and what each spent."""
    leading_unserved: float | None = Field(default=None, ge=0)
    """The HPA led by the forecast (``spec.policy: leading``): the share of demand it left
    waiting."""
    leading_gpu_hours: float | None = Field(default=None, ge=0)
    """The HPA led by the forecast: its GPU-hours."""


class PolicyStatus(WireModel):
    """How the pool plans now (``spec.policy``), why and since when."""

    in_force: Literal["forecast", "reactive", "leading"]
    """``forecast``: ahead of demand, on the forecast and the risk model; ``reactive``: as
    its shadow HPA would (its count, at the pool's HPA target); ``leading``: that count, or
    what the forecast mean's peak over the lookahead needs at the HPA's target if more."""
    chosen_by: Literal["spec", "history"] = "spec"
    """``spec``: ``spec.policy`` names it; ``history``: ``auto`` chose it on the pool's
    replayed history (the first replay, then one a day)."""
    since: str | None = Field(default=None, max_length=64)
    """When it came into force (RFC 3339)."""
    reason: str = Field(default="", max_length=1024)
    """The evidence in one sentence: what each candidate left waiting and cost on the
    replayed demand, and the forecast's frontier ratio."""
    checked_at: str | None = Field(default=None, max_length=64)
    """When the evidence was last weighed (RFC 3339)."""
    frontier_ratio: float | None = None
    """The forecast's unserved demand over the HPA curve's at the same GPU-hours, at the
    last check (1: on the HPA's curve; ``None``: neither left any demand waiting; a very
    large number: the curve left none there and the forecast did)."""
    leading_frontier_ratio: float | None = None
    """The same for the HPA led by the forecast."""
    pending: int = Field(default=0, ge=0)
    """Checks in a row that favoured the other policy (a switch needs two)."""
    switches: int = Field(default=0, ge=0)
    """Switches since the pool was created."""
    evidence: EvidenceStatus | None = None
    """The evidence weighed, pooled over the checks (a new day counts 0.4, the days before
    it the rest, fading)."""


class InferencePoolStatus(FleetStatus):
    """Observed state of the pool. A disaggregated pool reports each role under ``roles``;
    its top-level replica counts are the roles' sums, its conditions hold only when they
    hold for every role, and its degradation level is the worst role's."""

    roles: RolesStatus | None = None
    """Per role (disaggregated pools only)."""
    role_summary: str | None = Field(default=None, max_length=256)
    """One line per pool for ``kubectl get``: each role's ready/desired replicas and its
    bottleneck, e.g. ``prefill 3/3 compute, decode 2/4 memory``."""
    served_by: ServedByStatus | None = None
    """The operator replica and shard that serve the pool (sharded operators only)."""
    policy: PolicyStatus | None = None
    """How the pool plans now: on the forecast, as its HPA would, or as its HPA led by the
    forecast would (``spec.policy``)."""
