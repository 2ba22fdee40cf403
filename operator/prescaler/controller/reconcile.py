"""One pool's reconcile: gather (I/O) -> plan (pure) -> apply (I/O) -> status (pure).

:class:`Reconciler` is the only place that strings the adapters together; kopf handlers
call :meth:`Reconciler.reconcile` and write the status patch it returns. Failures are
typed: a spec that cannot work (:class:`SpecError`, unknown target, malformed PromQL)
becomes condition ``Invalid`` plus a Warning Event and the pool is left alone; missing
metrics or forecasts make the plan hold (grow on what is known, never shrink).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from typing import Any

from prescaler.api import (
    GROUP,
    PLURAL,
    PREWARM_CONDITION,
    VERSION,
    InferencePoolSpec,
    InferencePoolStatus,
    PolicyStatus,
    SpecError,
    StandbyPartStatus,
    StandbyStatus,
    capacity_model,
    check_spec,
    fleets,
    parse_spec,
    risk_objective,
    scaling_policy,
    scheduled_windows,
    target_of,
)
from prescaler.backtest import direction_budget as directions_left
from prescaler.capacity import ROLES, CapacityModel, Role
from prescaler.controller import degradation, external
from prescaler.controller.calibrate import (
    CalibrationJob,
    CalibrationView,
    HistoryCalibrator,
    needs_seed,
    seeded,
    with_history_seed,
)
from prescaler.controller.forecast import ForecastHub
from prescaler.controller.keda import TriggerWatch, with_trigger_condition
from prescaler.controller.model import (
    INVALID_REASONS,
    TARGET_CONFLICT,
    ForecastResult,
    Gathered,
    InvalidPool,
    NotServing,
    PoolGone,
    PoolObject,
    fleet_key,
    fleet_label,
)
from prescaler.controller.policy import (
    CHECK_SECONDS,
    check_due,
    check_index,
    policy_status,
    reactive_count,
    switched,
)
from prescaler.controller.prewarm import Prewarmer, with_prewarm_condition
from prescaler.controller.status import (
    ConditionUpdate,
    Shadow,
    apply_merge_patch,
    combine_roles,
    compose_status,
    forecast_error,
    idle_since,
    invalid_status,
    keda_status,
    learn_against_hpa,
    learn_cold_start,
    learn_risk,
    merge_conditions,
    merge_patch,
    observation_only,
    parse_rfc3339,
    parse_status,
    recent_targets,
    risk_status,
    role_previous,
    shadow_of,
    shortfall,
    status_ops,
    status_patch,
    unschedulable,
)
from prescaler.kube import (
    DELETION_COST_ANNOTATION,
    KEDA_GROUP,
    KEDA_VERSION,
    PLACEHOLDER_PRIORITY_VALUE,
    POOL_LABEL,
    ROLE_DEGRADATION,
    ROLE_HOT,
    ROLE_LABEL,
    ROLE_PLACEHOLDER,
    ROLE_PRE_PULL,
    ROLE_PROMOTED,
    SCALED_OBJECTS,
    Hpa,
    KubeApi,
    KubeError,
    NotFound,
    PodStart,
    ScaledObject,
    StandbyObservation,
    Workload,
    degradation_config_map,
    first_image,
    hot_standby_deployment,
    object_name,
    placeholder_deployment,
    placeholder_priority_class,
    pre_pull_daemonset,
    promotion_patch,
    scaled_object_from,
)
from prescaler.metrics import Metrics
from prescaler.planning import (
    LEVELS,
    Assessment,
    DrainPlan,
    FleetState,
    PlanInputs,
    PodLoad,
    RiskSizing,
    ScalePlan,
    ScheduledWindow,
    drain_plan,
    observed_rise,
    plan,
    remember_observation,
    remember_plan,
    risk_sizing,
)
from prescaler.settings import ReconcileSettings
from prescaler.sources import (
    MAX_RESPONSE_BYTES,
    ROLE_DEMAND,
    MetricsUnavailable,
    PrometheusSource,
    PromQLError,
    Queries,
    Snapshot,
    SourceError,
    render_queries,
    secret_credentials,
)
from prescaler_forecast import AUTO

DEFAULT_PRIORITY_CLASS = "prescaler-placeholder"
SHARED_SNAPSHOT_SECONDS = 15.0
"""Pools reading one series share its instant queries for this long (Prometheus' own
default scrape interval), or half a reconcile period if that is shorter."""
CHECKPOINT_PERIODS = 5
"""A status whose changes are only observations is written once in this many reconcile
periods (kept in memory meanwhile; an operator that crashes loses at most that much of its
learning, and one that stops writes it first)."""
REPLAY_DECISION_SECONDS = ReconcileSettings().interval_seconds
"""A replay of a new pool's history (its seed) plans at most this often: the operator's
default period."""
WAIT_FOR_MODEL = ("Interim", "Pending", "InsufficientHistory")
"""Forecast reasons under which the model a pool forecasts with is a stand-in: its seed's
replay waits for the real one."""
RECHECK_PERIODS = 10
"""A degradation ConfigMap whose content did not change is read back once in this many
reconcile periods (else never, as long as its content stays)."""


def demand_series_id(
    url: str,
    insecure: bool,
    headers: Mapping[str, str],
    basic: tuple[str, str] | None,
    queries: Queries,
) -> str:
    """A digest naming the demand history a pool reads: what the history query depends on
    (server, TLS, credentials, as a tenant may see other data, and the query)."""
    parts = (
        url.rstrip("/"),
        insecure,
        sorted(headers.items()),
        basic,
        queries.demand_query,
        queries.demand_template,
        queries.rate_window_seconds,
    )
    return hashlib.sha256(repr(parts).encode()).hexdigest()


@dataclass
class _Shared:
    """One snapshot of a series, its time, and the fleets that got it."""

    future: asyncio.Future[Snapshot]
    at: float
    users: set[str]


@dataclass
class Reconciler:
    """Reconciles pools; holds per-pool caches (Prometheus sources, forecasts)."""

    kube: KubeApi
    metrics: Metrics
    forecasts: ForecastHub
    io_executor: Executor | None = None
    prometheus_timeout_seconds: float = 10.0
    """The deadline of one Prometheus read, however slowly its bytes come."""
    prometheus_max_response_bytes: int = MAX_RESPONSE_BYTES
    """One Prometheus answer is read up to this many bytes, no further."""
    placeholder_priority_classes: tuple[str, ...] = (DEFAULT_PRIORITY_CLASS,)
    """The PriorityClasses standby placeholders may have (``ReconcileSettings``)."""
    rate_window: str = "2m"
    interval_seconds: float = 30.0
    """The reconcile period: a plan stands until the next reconcile, so its lookahead covers
    it (``PlanInputs.decision_interval_seconds``)."""
    policy_check_seconds: float = CHECK_SECONDS
    """How often a ``spec.policy: auto`` pool's choice is re-checked (``ReconcileSettings``)."""
    clock: Callable[[], float] = time.time
    prewarm: Prewarmer | None = None
    """Warm-up of new pods (``spec.prewarm``); without it the spec field is ignored."""
    calibrator: HistoryCalibrator | None = None
    """Replays of new pools' history that seed their risk model (``None``: a new pool
    calibrates on its own lookaheads only)."""
    keda: TriggerWatch = field(default_factory=TriggerWatch)
    """Whether KEDA's HPA carries a ``kedaTrigger`` pool's plan: told, nudged if allowed."""
    serving: Callable[[PoolObject], bool] = lambda _: True
    """Whether this replica still serves the pool (with shards: holds its shard's Lease,
    renewed within the renew deadline). Checked before the scale and the status write, so
    a reconcile that outlives its shard writes nothing more."""
    _sources: dict[str, tuple[str, PrometheusSource]] = field(default_factory=dict)
    _snapshots: dict[str, _Shared] = field(default_factory=dict)
    """The last snapshot of each source (by its key), shared by the pools that read it."""
    _mixes: dict[str, tuple[float | None, float | None, float | None]] = field(default_factory=dict)
    """Each fleet's last measured token mix (prompt, output, context tokens)."""
    _observed: dict[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    """Each fleet's recent demand observations (``prescaler.planning.observed_rise``)."""
    _pods: dict[str, tuple[str, tuple[PodStart, ...]]] = field(default_factory=dict)
    """Each fleet's target pods, with the target's resourceVersion they were read at."""
    _hpas: dict[str, tuple[float, list[Hpa]]] = field(default_factory=dict)
    """The HPAs of each namespace and when they were listed (shared by its pools)."""
    _kept: dict[str, tuple[PoolObject, dict[str, Any]]] = field(default_factory=dict)
    """Statuses not written yet (only observations moved), by pool uid, with the pool
    as read (its resourceVersion and stored status)."""
    _written: dict[str, float] = field(default_factory=dict)
    """When this reconciler last wrote each pool's status (its first write counts as
    made up to a checkpoint earlier, spread, so that pools started together do not all
    reach their checkpoint in the same cycle)."""
    checkpoint_spread: Callable[[float], float] = lambda period: random.random() * period
    """A delay in ``[0, x)``: where in its checkpoint period a pool's first write falls."""
    _ensured: dict[tuple[str, str], tuple[str, float]] = field(default_factory=dict)
    """Degradation ConfigMaps this reconciler wrote or found current: content hash, when."""
    _priorities: dict[str | None, tuple[float, int | None]] = field(default_factory=dict)
    """PriorityClass values read (key ``None``: the global default's) and when; a value
    ``None``: no such class."""
    _witnessed_from: float | None = None
    """This reconciler's first reconcile: idleness is only what it saw from then on."""

    @property
    def _recheck(self) -> float:
        """How often an object this reconciler keeps is read back although its content
        did not change (someone may have deleted or edited it)."""
        return RECHECK_PERIODS * self.interval_seconds

    def __post_init__(self) -> None:
        for reason in INVALID_REASONS:  # at 0, so "no errors" is a series and not nothing
            self.metrics.reconcile_errors.labels(reason)

    def forget(self, pool: PoolObject) -> None:
        """Drop caches and metric series of a deleted pool."""
        for role in (None, *ROLES):
            cached = self._sources.pop(fleet_key(pool.uid, role), None)
            if cached is not None:
                cached[1].close()
            self._pods.pop(fleet_key(pool.uid, role), None)
            self._mixes.pop(fleet_key(pool.uid, role), None)
            self._observed.pop(fleet_key(pool.uid, role), None)
            self.forecasts.forget(fleet_key(pool.uid, role))
            if self.calibrator is not None:
                self.calibrator.forget(fleet_key(pool.uid, role))
            self.metrics.forget(pool.namespace, fleet_label(pool.name, role))
        self._ensured.pop((pool.namespace, object_name(pool.name, ROLE_DEGRADATION)), None)
        self._kept.pop(pool.uid, None)
        self._written.pop(pool.uid, None)
        if self.prewarm is not None:
            self.prewarm.forget_pool(pool.uid)

    async def run(self, pool: PoolObject) -> None:
        """Reconcile once and write the status (see :meth:`write_status`). A status this
        reconciler kept back is the previous one while the pool has not changed since."""
        kept = self._kept.pop(pool.uid, None)
        base = pool
        if kept is not None and kept[0].resource_version == pool.resource_version:
            base = replace(pool, status=kept[1])
        try:
            patch = await self.reconcile(base)
            if pool.served_by is not None:
                patch["servedBy"] = pool.served_by.wire()
            if not self.serving(pool):
                raise NotServing
        except NotServing:
            return  # its new holder reconciles it
        await self.write_status(pool, patch, base.status)

    async def write_status(
        self, pool: PoolObject, patch: dict[str, Any], base: Mapping[str, Any] | None = None
    ) -> None:
        """Write a reconcile's status patch (made from ``base``, by default the pool's
        status), retried on conflicts, throttling and server errors by the adapter; a pool
        deleted meanwhile raises :class:`PoolGone` (its loop ends).

        Each write costs the API server and etcd in proportion to the whole object, and
        comes back as a watch event, so: only what changed is sent, as a JSON patch onto
        the version the status was read at (if the pool changed since, the whole merge
        patch is written instead). Nothing is sent when nothing changed. When only
        observations changed (:func:`~prescaler.controller.status.observation_only`:
        demand, forecast, risk model, shadow HPA, timestamps), the status is kept here and
        the next reconcile goes on from it; it is written once this reconciler's last
        write of the pool is :data:`CHECKPOINT_PERIODS` reconcile periods old, with any
        other change, and when the operator stops (:meth:`flush`)."""
        stored = dict(pool.status)
        new = apply_merge_patch(dict(stored if base is None else base), patch)
        now = self.clock()
        if pool.resource_version is not None:
            ops = status_ops(stored, new)
            written = self._written.get(pool.uid)
            checkpoint = CHECKPOINT_PERIODS * self.interval_seconds
            if not ops or (
                written is not None
                and now - written < checkpoint
                and all(observation_only(op) for op in ops)
            ):
                if ops:
                    self._kept[pool.uid] = (pool, new)
                self.metrics.status_writes.labels("kept").inc()
                return
            try:
                await self._send_ops(pool, pool.resource_version, ops)
                self._wrote(pool.uid, now)
                return
            except NotFound:
                raise PoolGone(f"pool {pool.namespace}/{pool.name} is gone") from None
            except KubeError as exc:
                if exc.status != 422:  # 422: the pool moved on since it was read
                    raise
        try:
            await self.kube.patch_status(
                GROUP, VERSION, PLURAL, pool.namespace, pool.name, merge_patch(stored, new)
            )
        except NotFound:
            raise PoolGone(f"pool {pool.namespace}/{pool.name} is gone") from None
        self.metrics.status_writes.labels("whole").inc()
        self._wrote(pool.uid, now)

    async def _send_ops(
        self, pool: PoolObject, resource_version: str, ops: list[dict[str, Any]]
    ) -> None:
        """Write ``ops`` onto the pool's status at ``resource_version`` (a JSON patch)."""
        await self.kube.patch_status_ops(
            GROUP, VERSION, PLURAL, pool.namespace, pool.name, resource_version, ops
        )
        self.metrics.status_writes.labels("changes").inc()

    def _wrote(self, uid: str, now: float) -> None:
        first = uid not in self._written
        period = CHECKPOINT_PERIODS * self.interval_seconds
        self._written[uid] = now - (self.checkpoint_spread(period) if first else 0.0)

    async def flush(self, only: Callable[[PoolObject], bool] | None = None) -> None:
        """Write the statuses kept back (see :meth:`write_status`), e.g. before the
        operator stops (``only``: those of the pools it accepts, e.g. of a shard given
        up); a pool that changed since keeps what it has."""
        chosen = [uid for uid, (pool, _) in self._kept.items() if only is None or only(pool)]
        kept = [self._kept.pop(uid) for uid in chosen]
        for pool, new in kept:
            ops = status_ops(dict(pool.status), new)
            if not ops or pool.resource_version is None:
                continue
            with contextlib.suppress(KubeError):
                await self._send_ops(pool, pool.resource_version, ops)

    async def reconcile(self, pool: PoolObject) -> dict[str, Any]:
        """Reconcile once; returns the status merge patch to write."""
        now = self.clock()
        previous = parse_status(dict(pool.status))
        started = time.perf_counter()
        try:
            try:
                spec = parse_spec(pool.spec)
                check_spec(spec)
                windows = scheduled_windows(spec)
            except SpecError as exc:
                raise InvalidPool("InvalidSpec", str(exc)) from None
            if spec.roles is None:
                status, assessment = await self._fleet(pool, None, spec, windows, previous, now)
            else:
                done: dict[Role, tuple[InferencePoolStatus, Assessment]] = {}
                for role, view in fleets(spec):
                    assert role is not None
                    mine = role_previous(previous, role)
                    done[role] = await self._fleet(pool, role, view, windows, mine, now)
                status = combine_roles(
                    previous, {r: st for r, (st, _) in done.items()}, now, pool.generation
                )
                self.metrics.set_against_hpa(pool.namespace, pool.name, status.against_hpa)
                assessment = degradation.combine(previous, {r: a for r, (_, a) in done.items()})
            published = await self._publish_degradation(pool, spec, assessment, previous)
            status = status.model_copy(
                update={"degradation": degradation.degradation_status(assessment, published)}
            )
            self._observe_degradation(pool, assessment)
            return status_patch(dict(pool.status), status)
        except InvalidPool as exc:
            self.metrics.reconcile_errors.labels(exc.reason).inc()
            return await self._invalid(pool, previous, exc, now)
        finally:
            self.metrics.reconcile_duration.observe(time.perf_counter() - started)
            self.metrics.last_reconcile.labels(pool.namespace, pool.name).set(now)

    async def _fleet(
        self,
        pool: PoolObject,
        role: Role | None,
        spec: InferencePoolSpec,
        windows: tuple[ScheduledWindow, ...],
        previous: InferencePoolStatus,
        now: float,
    ) -> tuple[InferencePoolStatus, Assessment]:
        """One fleet's gather, plan, apply and status: a unified pool's, or one role's
        (``spec`` is then the role's view and ``previous`` its status). Returns the status
        and the degradation assessment, which the caller publishes."""
        try:
            gathered = await self._gather(pool, role, spec, windows, previous, now)
        except SpecError as exc:
            raise InvalidPool("InvalidSpec", str(exc)) from None
        # After the pool's own checks, so its own errors are the ones it reports.
        if pool.superseded_by is not None:
            target = target_of(spec)
            raise InvalidPool(
                TARGET_CONFLICT,
                f"{target.kind}/{target.name} is already scaled by InferencePool "
                f"{pool.superseded_by} (the oldest pool keeps a target); point this pool "
                "elsewhere",
            )
        capacity = self._capacity(fleet_key(pool.uid, role), spec, role, gathered.snapshot)
        warmup = None
        prewarm = self.prewarm if role is None else None  # a role's pods are never warmed
        if prewarm is not None:
            warmup = await prewarm.pool_condition(pool, spec, gathered.workload, previous)
        examined = external.examine(spec, pool.generation, previous, gathered, now)
        previous = examined.previous
        risk, sizing, objective, shadow = None, None, None, None
        seeding: CalibrationView | None = None
        checked: CalibrationView | None = None
        if spec.forecast is not None:
            objective = risk_objective(spec)
            ready = gathered.workload.ready_replicas
            shadow = shadow_of(previous.against_hpa, spec, capacity, gathered)
            seeding = self._history_seed(
                pool, role, spec, previous, capacity, gathered, shadow, now
            )
            # A replay for spec.policy's daily check weighs the policies; it seeds the
            # risk model only while that has no calibration of its own.
            if not needs_seed(previous.risk, objective):
                seeding, checked = None, seeding
            else:
                checked = seeding
            seed = seeding.seed if seeding is not None else None
            risk = learn_risk(
                previous.risk,
                objective,
                now,
                gathered.snapshot,
                capacity,
                ready,
                shadow if objective.relative else None,
                seed=seeded(previous.risk, seed) if seed is not None else None,
            )
            sizing = risk_sizing(risk, objective, now)
        policy = None
        reactive = None
        leading_target: float | None = None
        if role is None:  # a disaggregated pool's roles plan on their forecasts
            evidence = checked.seed if checked is not None else None
            policy = policy_status(spec, previous.policy, evidence, now)
            if policy.in_force in ("reactive", "leading") and shadow is not None:
                reactive = reactive_count(shadow, gathered.current_replicas)
                if policy.in_force == "leading":
                    leading_target = shadow.setup.target
        key = fleet_key(pool.uid, role)
        snapshot = gathered.snapshot
        at, observed = (snapshot.at, snapshot.demand) if snapshot else (now, None)
        recent = self._observed.get(key, ())
        decision = decide(
            spec,
            capacity,
            gathered,
            windows,
            previous,
            now,
            sizing,
            self.interval_seconds,
            observed_rise(recent, at, observed),
            reactive,
            directions_left(shadow.state, now) if shadow is not None else None,
            leading_target,
            directions_left(shadow.state, now, "7d") if shadow is not None else None,
        )
        self._observed[key] = remember_observation(recent, at, observed)
        decision, change = external.govern(spec, pool.generation, examined, decision)
        if examined.found is not None:
            await self.kube.post_event(
                pool.ref,
                "Warning",
                "ExternalChange",
                _tag(role, external.describe(examined.found, spec)),
            )
        drain = None
        if decision.desired_replicas < decision.current_replicas and spec.mode == "replicas":
            drain = await self._drain_plan(pool, role, spec, gathered, now)
            decision = replace(decision, reason=f"{decision.reason}; {drain.reason}")
        self.metrics.declare_pool(pool.namespace, fleet_label(pool.name, role))
        assessment = degradation.assess_pool(spec, capacity, gathered, decision, previous, now)
        allowed = await self._placeholders_allowed(spec, gathered.workload)
        holders = allowed is None or allowed.status == "True"
        standby = await self._apply(
            pool, role, spec, decision, gathered, previous, drain, placeholders=holders
        )
        status = compose_status(
            spec, pool.generation, previous, decision, gathered, capacity, windows, standby, now
        )
        status = _with_standby_condition(status, allowed, now, pool.generation)
        await self._standby_event(pool, role, previous, allowed)
        keda, trigger = await self.keda.watch(
            self.kube,
            self.metrics,
            pool,
            role,
            keda_status(gathered, decision.desired_replicas, pool.namespace, pool.name),
            previous,
            now,
            self.interval_seconds,
            spec.dry_run,
        )
        status = status.model_copy(
            update={
                "degradation": degradation.degradation_status(assessment, None),
                "risk": (
                    risk_status(remember_plan(risk, decision), sizing, objective)
                    if risk is not None
                    else None
                ),
                "against_hpa": (
                    learn_against_hpa(shadow, spec, gathered, capacity, decision, standby, now)
                    if shadow is not None
                    else None
                ),
                "keda": keda,
            }
        )
        status = with_trigger_condition(status, trigger, now, pool.generation)
        if objective is not None and role is None:
            status = with_history_seed(status, previous, seeding, objective, now, pool.generation)
        if policy is not None:
            status = status.model_copy(update={"policy": policy})
            await self._policy_event(pool, previous.policy, policy)
        status = external.record(status, spec, examined, change, decision, now, pool.generation)
        if prewarm is not None:
            status = with_prewarm_condition(status, warmup, now, pool.generation)
        if not spec.dry_run:
            await self._capacity_event(pool, role, previous, status)
        self._observe(pool, role, decision, gathered, capacity, previous)
        self.metrics.set_against_hpa(
            pool.namespace, fleet_label(pool.name, role), status.against_hpa
        )
        return status, assessment

    def _history_seed(
        self,
        pool: PoolObject,
        role: Role | None,
        spec: InferencePoolSpec,
        previous: InferencePoolStatus,
        capacity: CapacityModel,
        gathered: Gathered,
        shadow: Shadow,
        now: float,
    ) -> CalibrationView | None:
        """Where the replay of the pool's history stands (see :mod:`.calibrate`): asked
        for while its risk model was never seeded nor calibrated on its own lookaheads (a
        unified pool; a role calibrates on its own), and once a day for ``spec.policy:
        auto``'s check (:func:`.policy.check_due`). Never waits for the replay."""
        key = fleet_key(pool.uid, role)
        if self.calibrator is None or role is not None or spec.forecast is None:
            return None
        objective = risk_objective(spec)
        cached = self._sources.get(key)
        due = check_due(spec, previous.policy, now, self.policy_check_seconds)
        if (not needs_seed(previous.risk, objective) and not due) or cached is None:
            self.calibrator.forget(key)
            return None
        # The replay forecasts with the model the pool forecasts with now (auto's choice):
        # a replay that selected again at every refit would take minutes, not seconds.
        # Until the pool has its own choice (its first selection), the replay waits.
        replayed = spec
        if spec.forecast.model == AUTO:
            result = gathered.forecast
            if result is None or result.forecast is None or result.reason in WAIT_FOR_MODEL:
                return CalibrationView(waiting="its forecast model (auto's first choice)")
            forecast = spec.forecast.model_copy(update={"model": result.forecast.model})
            replayed = spec.model_copy(update={"forecast": forecast})
        # The replay plans as often as the operator does, but at most every default period
        # (a shorter period, as in tests, only multiplies the replay's work).
        decision = max(self.interval_seconds, REPLAY_DECISION_SECONDS)
        job = CalibrationJob(
            spec=replayed,
            source=cached[1],
            series_id=cached[0],
            capacity=capacity,
            cold_start_seconds=gathered.cold_start.seconds,
            hpa_target=shadow.setup.target,
            decision_seconds=decision,
            min_seconds=objective.min_outcomes * decision,
            check=check_index(now, self.policy_check_seconds) if due else 0,
        )
        return self.calibrator.request(key, job)

    async def _policy_event(
        self, pool: PoolObject, previous: PolicyStatus | None, policy: PolicyStatus
    ) -> None:
        """One Event per switch of the policy in force, and the metric."""
        self.metrics.set_policy(pool.namespace, pool.name, policy.in_force)
        if switched(previous, policy):
            how = {
                "reactive": "its HPA would",
                "leading": "its HPA would, led by its forecast",
            }.get(policy.in_force, "its forecast says")
            await self.kube.post_event(
                pool.ref,
                "Normal",
                "PolicySwitched",
                f"plans as {how} ({policy.in_force}): {policy.reason}"[:1024],
            )

    # ------------------------------------------------------------------ gather
    async def _gather(
        self,
        pool: PoolObject,
        role: Role | None,
        spec: InferencePoolSpec,
        windows: tuple[ScheduledWindow, ...],
        previous: InferencePoolStatus,
        now: float,
    ) -> Gathered:
        ns = pool.namespace
        target = target_of(spec)
        keda: ScaledObject | None = None
        keda_hpa: Hpa | None = None
        try:
            if target.kind == "HorizontalPodAutoscaler":
                hpa = await self.kube.get_hpa(ns, target.name)
                if hpa.target_kind not in ("Deployment", "StatefulSet"):
                    raise InvalidPool(
                        "UnsupportedTarget",
                        f"HPA {target.name} scales a {hpa.target_kind or 'nothing'}; "
                        "only Deployments and StatefulSets are supported",
                    )
                if hpa.scaled_object is not None:
                    raise InvalidPool(
                        "KedaOwnedHpa", external.keda_owned_hpa(hpa.name, hpa.scaled_object)
                    )
                workload = await self.kube.get_workload(ns, hpa.target_kind, hpa.target_name)
                current = hpa.min_replicas
                writer = hpa.min_replicas_writer
                scaler: Hpa | None = hpa
            elif target.kind == "ScaledObject":
                keda = scaled_object_from(
                    await self.kube.get_custom_object(
                        KEDA_GROUP, KEDA_VERSION, SCALED_OBJECTS, ns, target.name
                    )
                )
                if keda.target_kind not in ("Deployment", "StatefulSet"):
                    raise InvalidPool(
                        "UnsupportedTarget",
                        f"ScaledObject {target.name} scales a {keda.target_kind}; "
                        "only Deployments and StatefulSets are supported",
                    )
                workload = await self.kube.get_workload(ns, keda.target_kind, keda.target_name)
                # KEDA owns the workload's replicas: the plan paces from the plan it served.
                served = previous.applied_target == external.applied_target(spec)
                current = (
                    previous.applied_replicas
                    if served and previous.applied_replicas is not None
                    else workload.replicas
                )
                writer = None
                keda_hpa = next(
                    (h for h in await self._hpas_in(ns) if h.name == keda.hpa_name), None
                )
                scaler = await self._hpa_on(ns, workload) if spec.forecast is not None else None
            else:
                workload = await self.kube.get_workload(ns, target.kind, target.name)
                current = workload.replicas
                writer = workload.replicas_writer
                scaler = await self._hpa_on(ns, workload) if spec.forecast is not None else None
        except NotFound as exc:
            raise InvalidPool("TargetNotFound", f"target not found: {exc}") from None

        pods = await self._target_pods(fleet_key(pool.uid, role), ns, workload)
        cold_start = learn_cold_start(previous.cold_start, spec.cold_start, pods, now)
        hot_pods: list[PodStart] = []
        was_hot = previous.standby.hot if previous.standby is not None else None
        if spec.standby.hot.replicas > 0 or (was_hot is not None and was_hot.promoted):
            hot_pods = await self.kube.list_pod_starts(
                ns, f"{POOL_LABEL}={pool.name},{ROLE_LABEL} in ({ROLE_HOT},{ROLE_PROMOTED})"
            )

        snapshot: Snapshot | None = None
        problem: str | None = None
        warning: str | None = None
        forecast: ForecastResult | None = None
        if spec.forecast is not None:
            source, series_id = await self._source(pool, role, spec)
            warning = source.warning
            try:
                snapshot = await self._snapshot(pool, role, source, now)
                if not snapshot.available:
                    problem = "; ".join(snapshot.problems) or "no demand data"
            except PromQLError as exc:
                raise InvalidPool("InvalidPromQL", str(exc)) from None
            except MetricsUnavailable as exc:
                problem = str(exc)
            kept = previous.forecast.selection if previous.forecast is not None else None
            forecast = await self.forecasts.get(
                fleet_key(pool.uid, role), spec.forecast, windows, source, series_id, now, kept=kept
            )
        if self._witnessed_from is None:
            self._witnessed_from = now
        idle = idle_since(previous.demand, snapshot, now, self._witnessed_from)
        return Gathered(
            workload,
            current,
            cold_start,
            snapshot,
            problem,
            forecast,
            pods=pods,
            hot_pods=tuple(hot_pods),
            idle_since=idle,
            current_writer=writer,
            hpa=scaler,
            keda=keda,
            keda_hpa=keda_hpa,
            metrics_warning=warning,
        )

    async def _target_pods(
        self, key: str, namespace: str, workload: Workload
    ) -> tuple[PodStart, ...]:
        """The target's pods. Read again only when the target moved (its resourceVersion
        follows its pods' readiness) or some pod was not Ready: pods that were all Ready
        in an unchanged target are what they were."""
        if not workload.selector:
            return ()
        kept = self._pods.get(key)
        if kept is not None and kept[0] == workload.resource_version:
            return kept[1]
        pods = tuple(await self.kube.list_pod_starts(namespace, workload.selector))
        settled = len(pods) == workload.replicas == workload.ready_replicas and all(
            p.ready and not p.terminating for p in pods
        )
        if settled and workload.resource_version is not None:
            self._pods[key] = (workload.resource_version, pods)
        else:
            self._pods.pop(key, None)
        return pods

    async def _snapshot(
        self, pool: PoolObject, role: Role | None, source: PrometheusSource, now: float
    ) -> Snapshot:
        """The source's snapshot at ``now``, shared: pools reading the same series (the
        same source key) within :data:`SHARED_SNAPSHOT_SECONDS` (at most half the
        reconcile period) get one set of instant queries, and those that ask meanwhile
        wait for it. A pool never gets the same snapshot twice; errors are not shared."""
        fleet = fleet_key(pool.uid, role)
        key = self._sources[fleet][0]
        fresh = min(SHARED_SNAPSHOT_SECONDS, self.interval_seconds / 2)
        kept = self._snapshots.get(key)
        if (
            kept is not None
            and now - kept.at < fresh
            and fleet not in kept.users
            and not (kept.future.done() and (kept.future.cancelled() or kept.future.exception()))
        ):
            kept.users.add(fleet)
            return await asyncio.shield(kept.future)
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self.io_executor, source.snapshot, now)
        self._snapshots[key] = _Shared(future, now, {fleet})
        for old in [k for k, v in self._snapshots.items() if now - v.at > 2 * fresh]:
            del self._snapshots[old]
        return await asyncio.shield(future)

    async def _hpas_in(self, namespace: str) -> list[Hpa]:
        """The namespace's HPAs, listed once per reconcile period for all its pools (none
        when they cannot be read)."""
        listed = self._hpas.get(namespace)
        if listed is not None and self.clock() - listed[0] < self.interval_seconds:
            return listed[1]
        try:
            hpas = await self.kube.list_hpas(namespace)
        except KubeError:
            return []
        self._hpas[namespace] = (self.clock(), hpas)
        return hpas

    async def _hpa_on(self, namespace: str, workload: Workload) -> Hpa | None:
        """An HPA that scales ``workload`` (the one a team runs today, whose target the
        shadow HPA takes), if any. Unreadable HPAs leave the shadow at its default."""
        found = [
            h
            for h in await self._hpas_in(namespace)
            if (h.target_kind, h.target_name) == (workload.kind, workload.name)
        ]
        return min(found, key=lambda h: h.name) if found else None

    async def _source(
        self, pool: PoolObject, role: Role | None, spec: InferencePoolSpec
    ) -> tuple[PrometheusSource, str]:
        """The pool's Prometheus source, and a digest naming its demand series (server,
        TLS, credentials and query): pools with the same digest read the same history."""
        assert spec.forecast is not None
        fc = spec.forecast
        headers: dict[str, str] = {}
        basic: tuple[str, str] | None = None
        if fc.prometheus.auth_secret_ref is not None:
            name = fc.prometheus.auth_secret_ref.name
            try:
                secret = await self.kube.read_secret(pool.namespace, name)
            except NotFound:
                raise InvalidPool("SecretNotFound", f"Secret {name} not found") from None
            try:
                headers, basic = secret_credentials(name, secret.data, secret.type)
            except ValueError as exc:
                raise InvalidPool("InvalidSecret", str(exc)) from None
        overrides = fc.queries.model_dump(exclude_none=True) if fc.queries is not None else {}
        try:
            queries = render_queries(
                fc.engine,
                selector=fc.selector,
                quantile=spec.model.context_quantile,
                window=self.rate_window,
                overrides=overrides,
                demand=ROLE_DEMAND[role] if role is not None else "requests_per_second",
            )
        except ValueError as exc:
            raise InvalidPool("InvalidSpec", f"spec.forecast: {exc}") from None
        key = repr((fc.prometheus, queries, sorted(headers.items()), basic))
        series_id = demand_series_id(
            fc.prometheus.url, fc.prometheus.insecure_skip_verify, headers, basic, queries
        )
        uid = fleet_key(pool.uid, role)
        cached = self._sources.get(uid)
        if cached is not None and cached[0] == key:
            return cached[1], series_id
        if cached is not None:
            cached[1].close()
        source = PrometheusSource(
            fc.prometheus.url,
            queries,
            headers=headers,
            basic_auth=basic,
            verify_tls=not fc.prometheus.insecure_skip_verify,
            timeout_seconds=self.prometheus_timeout_seconds,
            max_response_bytes=self.prometheus_max_response_bytes,
        )
        self._sources[uid] = (key, source)
        return source, series_id

    def _capacity(
        self, key: str, spec: InferencePoolSpec, role: Role | None, snapshot: Snapshot | None
    ) -> CapacityModel:
        """The capacity model on the token mix measured now; through a read that measured
        none (a failed or empty query, a Prometheus restart), on the last one measured, not
        the spec's: one missing read must not resize the fleet."""
        prompt = output = context = None
        if snapshot is not None:
            prompt, output = snapshot.mean_tokens()
            context = snapshot.context_tokens
        kept = self._mixes.get(key)
        if (prompt is None or output is None) and kept is not None:
            prompt, output = kept[0], kept[1]
        if context is None and kept is not None:
            context = kept[2]
        self._mixes[key] = (prompt, output, context)
        try:
            return capacity_model(
                spec,
                role=role,
                prompt_tokens=prompt,
                output_tokens=output,
                context_tokens=context,
            )
        except SpecError:
            # The measured mix is unusable (e.g. a context beyond the model): plan on the spec's.
            return capacity_model(spec, role=role)

    async def _drain_plan(
        self,
        pool: PoolObject,
        role: Role | None,
        spec: InferencePoolSpec,
        gathered: Gathered,
        now: float,
    ) -> DrainPlan:
        """Which pods the coming scale-down should remove: per-pod running requests read
        now (only before a scale-down), ranked by :func:`prescaler.planning.drain_plan`."""
        kind = target_of(spec).kind
        if kind != "Deployment":
            return DrainPlan((), f"drain: a {kind} removes its highest ordinals, not the idlest")
        pods = [
            PodLoad(p.name, p.deletion_cost)
            for p in gathered.pods
            if p.ready and p.role != ROLE_PROMOTED
        ]
        self._pods.pop(fleet_key(pool.uid, role), None)  # their deletion costs change
        if spec.forecast is None:
            return drain_plan(pods, None, "no spec.forecast")
        source, _ = await self._source(pool, role, spec)
        loop = asyncio.get_running_loop()
        try:
            running = await loop.run_in_executor(self.io_executor, source.running_by_pod, now)
        except SourceError as exc:
            return drain_plan(pods, None, str(exc)[:200])
        return drain_plan(pods, running)

    # ------------------------------------------------------------------ apply
    async def _apply(
        self,
        pool: PoolObject,
        role: Role | None,
        spec: InferencePoolSpec,
        decision: ScalePlan,
        gathered: Gathered,
        previous: InferencePoolStatus,
        drain: DrainPlan | None = None,
        *,
        placeholders: bool = True,
    ) -> StandbyStatus | None:
        """Carry out the plan: pod deletion costs, replicas or HPA floor, hot standby
        promotions, standby objects, Events. Dumb on purpose. ``placeholders``: whether
        the spec's placeholders may be created (their PriorityClass is allowed)."""
        if spec.dry_run:
            return None
        if not self.serving(pool):
            raise NotServing
        if decision.changed:
            await self._still_there(pool)
        ns, target = pool.namespace, target_of(spec)
        try:
            for pod, cost in drain.costs if drain is not None else ():
                # Before the scale-down, so the ReplicaSet ranks by them.
                with contextlib.suppress(NotFound):
                    await self.kube.patch_pod(
                        ns,
                        pod,
                        {"metadata": {"annotations": {DELETION_COST_ANNOTATION: str(cost)}}},
                    )
            if decision.changed:
                if spec.mode == "hpaFloor":
                    await self.kube.patch_hpa_min(ns, target.name, decision.desired_replicas)
                elif spec.mode == "kedaTrigger":
                    pass  # the plan is the trigger's metric: KEDA's HPA scales to it
                else:
                    await self.kube.patch_scale(
                        ns, target.kind, target.name, decision.desired_replicas
                    )
                direction = (
                    "up" if decision.desired_replicas > decision.current_replicas else "down"
                )
                self.metrics.scale_events.labels(ns, fleet_label(pool.name, role), direction).inc()
                what = {
                    "hpaFloor": "minReplicas of HPA",
                    "kedaTrigger": "plan served to KEDA for",
                }.get(spec.mode, "replicas of")
                await self.kube.post_event(
                    pool.ref,
                    "Normal",
                    "ScaledUp" if direction == "up" else "ScaledDown",
                    _tag(
                        role,
                        f"{what} {target.kind} {target.name}: {decision.current_replicas} -> "
                        f"{decision.desired_replicas} ({decision.constraint}): {decision.reason}",
                    ),
                )
            promoted = await self._promote(pool, spec, decision, gathered)
            standby = await self._standby(
                pool, spec, decision, gathered.workload, previous.standby, placeholders
            )
            if promoted or (standby is not None and standby.hot is not None):
                standby = standby or StandbyStatus()
                hot = standby.hot or StandbyPartStatus()
                standby = standby.model_copy(
                    update={"hot": hot.model_copy(update={"promoted": promoted})}
                )
            return standby
        except NotFound as exc:
            raise InvalidPool("TargetNotFound", str(exc)) from None

    async def _still_there(self, pool: PoolObject) -> None:
        """Raise :class:`PoolGone` unless the pool (this uid) exists now: a quorum read
        before a scale, since a pool deleted while the watch was down sends no event, and
        its loop may tick until a relist ends it."""
        uid = await self.kube.custom_object_uid(GROUP, VERSION, PLURAL, pool.namespace, pool.name)
        if uid != pool.uid:
            raise PoolGone(f"pool {pool.namespace}/{pool.name} ({pool.uid}) is gone")

    async def _promote(
        self, pool: PoolObject, spec: InferencePoolSpec, decision: ScalePlan, gathered: Gathered
    ) -> int:
        """Promote and retire hot standby pods as the plan says; returns the promoted pods
        serving afterwards."""
        ns, target = pool.namespace, target_of(spec)
        waiting = sorted(
            (p for p in gathered.hot_pods if p.role == ROLE_HOT and p.ready),
            key=lambda p: (p.created, p.name),
        )
        chosen = waiting[: decision.promote_replicas]
        # A promoted pod that turned not Ready serves nothing: it goes first, and the
        # plan's promotions already count the pods that take its place.
        failed = sorted(_unready_promoted(gathered), key=lambda p: (p.created, p.name))
        failed = failed[: decision.retire_unready_replicas]
        for pod in failed:
            with contextlib.suppress(NotFound):
                await self.kube.delete_pod(ns, pod.name)
        if failed:
            instead = (
                f"promoting {', '.join(p.name for p in chosen)}"
                if chosen
                else "no ready hot standby pod to promote"
            )
            await self.kube.post_event(
                pool.ref,
                "Warning",
                "HotStandbyNotReady",
                f"deleted promoted {', '.join(p.name for p in failed)}: no longer Ready, so "
                f"serving nothing; {instead} (the hot standby refills)",
            )
        promoted = [p for p in gathered.hot_pods if p.role == ROLE_PROMOTED and p.ready]
        for pod in chosen:
            with contextlib.suppress(NotFound):
                await self.kube.patch_pod(
                    ns, pod.name, promotion_patch(pool.ref, gathered.workload.template)
                )
        if chosen:
            await self.kube.post_event(
                pool.ref,
                "Normal",
                "HotStandbyPromoted",
                f"promoted {', '.join(p.name for p in chosen)} into the pods of "
                f"{target.kind} {target.name}: {decision.desired_replicas} wanted, "
                f"{gathered.workload.ready_replicas} of its own ready",
            )
        # The oldest first.
        promoted.sort(key=lambda p: (p.created, p.name))
        retired = promoted[: decision.retire_replicas]
        for pod in retired:
            await self.kube.delete_pod(ns, pod.name)
        if retired:
            await self.kube.post_event(
                pool.ref,
                "Normal",
                "HotStandbyRetired",
                f"deleted promoted {', '.join(p.name for p in retired)}: "
                f"{gathered.workload.ready_replicas} ready replicas of {target.kind} "
                f"{target.name} cover the plan of {decision.desired_replicas}",
            )
        return len(promoted) - len(retired) + len(chosen)

    async def _publish_degradation(
        self,
        pool: PoolObject,
        spec: InferencePoolSpec,
        assessment: Assessment,
        previous: InferencePoolStatus,
    ) -> str | None:
        """The ConfigMap gateways read (created, rewritten when its content changed, deleted
        when turned off), then the level's Event when it changed; returns the ConfigMap's
        name. The policy is published first: gateways act on it, people read the Event."""
        if spec.dry_run:
            return None
        name = object_name(pool.name, ROLE_DEGRADATION)
        if spec.degradation.config_map:
            body = degradation.degradation_status(assessment, name)
            data = degradation.config_map_data(pool.name, body)
            wanted = degradation_config_map(pool.ref, data)
            digest = degradation.publish_key(data, assessment)
            written = self._ensured.get((pool.namespace, name))
            now = self.clock()
            # Written by this reconciler with what gateways act on lately: not read again
            # (nor rewritten for the live numbers of its reasons) each time.
            if written is None or written[0] != digest or now - written[1] >= self._recheck:
                await self.kube.ensure(wanted)
                self._ensured[(pool.namespace, name)] = (digest, now)
        else:
            was = previous.degradation.config_map if previous.degradation is not None else None
            if was is not None:
                await self.kube.delete(pool.namespace, "ConfigMap", name)
            self._ensured.pop((pool.namespace, name), None)
        if assessment.changed:
            type_, reason, message = degradation.change_event(previous, assessment)
            await self.kube.post_event(pool.ref, type_, reason, message)
        return name if spec.degradation.config_map else None

    def _observe_degradation(self, pool: PoolObject, assessment: Assessment) -> None:
        labels = (pool.namespace, pool.name)
        self.metrics.degradation_level.labels(*labels).set(LEVELS.index(assessment.level))
        short = assessment.shortfall
        if short is None:
            with contextlib.suppress(KeyError):
                self.metrics.forecast_shortfall_tokens.remove(*labels)
        else:
            self.metrics.forecast_shortfall_tokens.labels(*labels).set(short.tokens_per_second)

    async def _capacity_event(
        self,
        pool: PoolObject,
        role: Role | None,
        previous: InferencePoolStatus,
        status: InferencePoolStatus,
    ) -> None:
        """An Event when CapacityAvailable changes (status or message), never per reconcile."""
        old = next((c for c in previous.conditions if c.type == "CapacityAvailable"), None)
        new = next((c for c in status.conditions if c.type == "CapacityAvailable"), None)
        if new is None:
            return
        if new.status == "False" and (
            old is None or old.status != "False" or old.message != new.message
        ):
            await self.kube.post_event(pool.ref, "Warning", new.reason, _tag(role, new.message))
        elif new.status == "True" and old is not None and old.status == "False":
            await self.kube.post_event(pool.ref, "Normal", new.reason, _tag(role, new.message))

    async def _standby(
        self,
        pool: PoolObject,
        spec: InferencePoolSpec,
        decision: ScalePlan,
        workload: Workload,
        previous: StandbyStatus | None,
        placeholders_allowed: bool = True,
    ) -> StandbyStatus | None:
        ns, owner, standby = pool.namespace, pool.ref, spec.standby
        template = workload.template

        async def part(
            enabled: bool,
            role: str,
            kind: str,
            existed: object,
            build: Callable[[], dict[str, Any]],
        ) -> StandbyPartStatus | None:
            if enabled:
                seen: StandbyObservation = await self.kube.ensure(build())
                return StandbyPartStatus(desired=seen.desired, ready=seen.ready)
            if existed is not None:
                await self.kube.delete(ns, kind, object_name(pool.name, role))
            return None

        prev = previous or StandbyStatus()
        pre_pull = standby.image_pre_pull
        image = pre_pull.image or first_image(template)
        pre = await part(
            pre_pull.enabled and image is not None,
            ROLE_PRE_PULL,
            "DaemonSet",
            prev.image_pre_pull,
            lambda: pre_pull_daemonset(owner, template, image or "", list(pre_pull.command)),
        )
        placeholders = standby.placeholders
        holders = await part(
            placeholders.enabled and placeholders_allowed,  # refused: removed if it existed
            ROLE_PLACEHOLDER,
            "Deployment",
            prev.placeholders,
            lambda: placeholder_deployment(
                owner,
                template,
                replicas=decision.standby_replicas,
                gpus=spec.model.gpus_per_replica,
                image=placeholders.image,
                priority_class=placeholders.priority_class_name,
            ),
        )
        hot = await part(
            standby.hot.replicas > 0,
            ROLE_HOT,
            "Deployment",
            prev.hot,
            lambda: hot_standby_deployment(
                owner,
                template,
                replicas=standby.hot.replicas,
                readiness_gate=PREWARM_CONDITION
                if spec.prewarm is not None and self.prewarm is not None
                else None,
            ),
        )
        if pre is None and holders is None and hot is None:
            return None
        return StandbyStatus(image_pre_pull=pre, placeholders=holders, hot=hot)

    async def _placeholders_allowed(
        self, spec: InferencePoolSpec, workload: Workload
    ) -> ConditionUpdate | None:
        """The ``StandbyAllowed`` condition of a pool with placeholders (``None``: none).

        Placeholders hold GPUs at their PriorityClass, and anyone who may create a pool
        names it: only the classes the operator is configured to allow
        (:attr:`placeholder_priority_classes`), and only below the priority of the
        target's own pods (a pod preempts only pods of lower priority, so a placeholder at
        the target's priority or above would keep its GPUs from the replicas it stands in
        for, and could preempt other workloads). A refused class leaves the pool scaling,
        without placeholders."""
        holders = spec.standby.placeholders
        if not holders.enabled:
            return None
        name = holders.priority_class_name
        allowed = self.placeholder_priority_classes
        if name not in allowed:
            listed = ", ".join(allowed) or "none"
            return ConditionUpdate(
                "StandbyAllowed",
                "False",
                "PriorityClassNotAllowed",
                f"spec.standby.placeholders.priorityClassName {name} is not a PriorityClass "
                f"this operator allows for placeholders ({listed}); no placeholders are "
                "created",
            )
        if name == DEFAULT_PRIORITY_CLASS and not spec.dry_run:
            await self.kube.ensure_priority_class(placeholder_priority_class(name))
        value = await self._priority(name)
        if value is None and name == DEFAULT_PRIORITY_CLASS:
            value = PLACEHOLDER_PRIORITY_VALUE  # a dry run: the operator would create it so
        if value is None:
            return ConditionUpdate(
                "StandbyAllowed",
                "False",
                "PriorityClassNotFound",
                f"PriorityClass {name} of the placeholders does not exist; no placeholders "
                "are created",
            )
        theirs = str((workload.template.get("spec") or {}).get("priorityClassName") or "")
        target = await self._priority(theirs or None)
        if target is None:
            return ConditionUpdate(
                "StandbyAllowed",
                "False",
                "PriorityClassNotFound",
                f"PriorityClass {theirs} of the target's pods does not exist, so the "
                "placeholders' cannot be checked against it; no placeholders are created",
            )
        whose = f"PriorityClass {theirs}" if theirs else "the default priority"
        if value >= target:
            return ConditionUpdate(
                "StandbyAllowed",
                "False",
                "PriorityNotBelowTarget",
                f"the placeholders' PriorityClass {name} ({value}) is not below the target's "
                f"pods' ({whose}, {target}): a replica could not preempt a placeholder to "
                "take its GPUs; no placeholders are created",
            )
        return ConditionUpdate(
            "StandbyAllowed",
            "True",
            "Allowed",
            f"placeholders at PriorityClass {name} ({value}), below the target's pods' "
            f"({whose}, {target})",
        )

    async def _priority(self, name: str | None) -> int | None:
        """A PriorityClass's value (``None``: the global default's, else 0), read again
        after :attr:`_recheck`; ``None`` when the class does not exist."""
        now = self.clock()
        kept = self._priorities.get(name)
        if kept is not None and now - kept[0] < self._recheck:
            return kept[1]
        try:
            value: int | None = await self.kube.priority_value(name)
        except NotFound:
            value = None
        self._priorities[name] = (now, value)
        return value

    async def _standby_event(
        self,
        pool: PoolObject,
        role: Role | None,
        previous: InferencePoolStatus,
        update: ConditionUpdate | None,
    ) -> None:
        """A Warning Event when placeholders are refused (or refused for a new reason),
        never per reconcile."""
        if update is None or update.status != "False":
            return
        old = next((c for c in previous.conditions if c.type == "StandbyAllowed"), None)
        if old is None or old.status != "False" or old.message != update.message:
            await self.kube.post_event(
                pool.ref, "Warning", update.reason, _tag(role, update.message)
            )

    # ------------------------------------------------------------------ invalid
    async def _invalid(
        self, pool: PoolObject, previous: InferencePoolStatus, exc: InvalidPool, now: float
    ) -> dict[str, Any]:
        message = str(exc)
        old = next((c for c in previous.conditions if c.type == "Invalid"), None)
        if old is None or old.status != "True" or old.message != message[:1024]:
            with contextlib.suppress(KubeError):  # the condition still says it
                await self.kube.post_event(pool.ref, "Warning", exc.reason, message)
        status = invalid_status(previous, exc.reason, message, now, pool.generation)
        return status_patch(dict(pool.status), status)

    # ------------------------------------------------------------------ metrics
    def _observe(
        self,
        pool: PoolObject,
        role: Role | None,
        decision: ScalePlan,
        gathered: Gathered,
        capacity: CapacityModel,
        previous: InferencePoolStatus,
    ) -> None:
        m, labels = self.metrics, (pool.namespace, fleet_label(pool.name, role))
        m.desired_replicas.labels(*labels).set(decision.desired_replicas)
        m.planned_replicas.labels(*labels).set(decision.target_replicas)
        m.ready_replicas.labels(*labels).set(gathered.workload.ready_replicas)
        m.standby_replicas.labels(*labels).set(decision.standby_replicas)
        m.cold_start_seconds.labels(*labels).set(gathered.cold_start.seconds)
        m.set_driving_constraint(*labels, decision.constraint)
        result = gathered.forecast
        if result is not None:
            m.forecast_stale.labels(*labels).set(1 if result.stale else 0)
            if result.age_seconds is not None:
                m.forecast_age.labels(*labels).set(result.age_seconds)
        if role is not None:
            return  # a role's demand counts tokens/s: the requests/s series are not its
        m.set_forecast_band(*labels, result.forecast if result else None, decision.now)
        if decision.forecast_peak_requests_per_second is not None:
            m.predicted_demand.labels(*labels).set(decision.forecast_peak_requests_per_second)
        observed = gathered.snapshot.demand if gathered.snapshot else None
        if observed is not None:
            m.observed_demand.labels(*labels).set(observed)
            m.shortfall.labels(*labels).set(shortfall(observed, gathered.workload, capacity))
            error = forecast_error(previous.forecast, observed, decision.now)
            if error is not None:
                m.forecast_error.labels(*labels).set(error)


def _with_standby_condition(
    status: InferencePoolStatus, update: ConditionUpdate | None, now: float, generation: int | None
) -> InferencePoolStatus:
    """The status with the ``StandbyAllowed`` condition set, or removed (no placeholders)."""
    if update is None:
        kept = [c for c in status.conditions if c.type != "StandbyAllowed"]
        if len(kept) == len(status.conditions):
            return status
        return status.model_copy(update={"conditions": kept})
    conditions = merge_conditions(status.conditions, [update], now, generation)
    return status.model_copy(update={"conditions": conditions})


def _tag(role: Role | None, message: str) -> str:
    """An Event message of one role, prefixed with it."""
    return message if role is None else f"{role}: {message}"


# ---------------------------------------------------------------------- pure steps
def _unready_promoted(gathered: Gathered) -> list[PodStart]:
    """Promoted pods that turned not Ready (and are not on their way out already)."""
    return [
        p
        for p in gathered.hot_pods
        if p.role == ROLE_PROMOTED and not p.ready and not p.terminating
    ]


def decide(
    spec: InferencePoolSpec,
    capacity: CapacityModel,
    gathered: Gathered,
    windows: tuple[ScheduledWindow, ...],
    previous: InferencePoolStatus,
    now: float,
    risk: RiskSizing | None = None,
    interval_seconds: float = 0.0,
    rise: float | None = None,
    reactive: int | None = None,
    direction_budget: int | None = None,
    leading_target: float | None = None,
    direction_reserve: int | None = None,
) -> ScalePlan:
    """The planner's inputs from what was gathered, and its decision (pure). ``risk`` is
    the peak risk model's margin (see :func:`prescaler.controller.status.learn_risk`);
    ``interval_seconds`` the time to the next reconcile; ``rise`` how fast the
    observed demand rose lately (:func:`prescaler.planning.observed_rise`); ``reactive``
    the count the pool's HPA holds, when the pool plans as its HPA would;
    ``direction_budget`` the direction changes the fleet may still make
    (:func:`prescaler.backtest.direction_budget`); ``leading_target`` the HPA's target,
    when the forecast leads the HPA (``PlanInputs.leading_target``); ``direction_reserve``
    the same as ``direction_budget`` over the trailing week (``PlanInputs.direction_reserve``)."""
    snapshot = gathered.snapshot
    observed = snapshot.demand if snapshot else None
    hot = spec.standby.hot.replicas > 0
    fleet = FleetState(
        current_replicas=gathered.current_replicas,
        ready_replicas=gathered.workload.ready_replicas,
        last_scale_up_at=parse_rfc3339(previous.last_scale_up_time),
        last_scale_down_at=parse_rfc3339(previous.last_scale_down_time),
        observed_requests_per_second=observed,
        observed_rise_per_second=rise,
        unschedulable_replicas=len(unschedulable(gathered.pods)),
        idle_seconds=None if gathered.idle_since is None else now - gathered.idle_since,
        hot_ready_replicas=sum(
            1 for p in gathered.hot_pods if hot and p.role == ROLE_HOT and p.ready
        ),
        promoted_replicas=sum(1 for p in gathered.hot_pods if p.role == ROLE_PROMOTED and p.ready),
        promoted_unready_replicas=len(_unready_promoted(gathered)),
        # The queue: a full fleet's served rate hides demand (see prescaler.planning).
        waiting_requests=snapshot.waiting if snapshot else None,
        waiting_growth_per_second=snapshot.waiting_growth_per_second if snapshot else None,
        recent_targets=recent_targets(previous),
    )
    forecast = gathered.forecast.forecast if gathered.forecast is not None else None
    return plan(
        PlanInputs(
            now=now,
            capacity=capacity,
            fleet=fleet,
            policy=scaling_policy(spec),
            cold_start_seconds=gathered.cold_start.seconds,
            forecast=forecast,
            windows=windows,
            forecast_expected=spec.forecast is not None,
            risk=risk,
            decision_interval_seconds=interval_seconds,
            reactive_replicas=reactive,
            direction_budget=direction_budget,
            direction_reserve=direction_reserve,
            leading_target=leading_target,
        )
    )
