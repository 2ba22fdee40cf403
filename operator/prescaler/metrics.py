"""The operator's own Prometheus metrics (prometheus_client), on their own registry."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from prescaler.api import AgainstHpaStatus, AgainstHpaWindow
from prescaler.backtest import WINDOWS
from prescaler.capacity import Constraint
from prescaler.planning import ForecastLike, PolicyName

_POOL = ("namespace", "pool")
CONSTRAINTS: tuple[Constraint, ...] = get_args(Constraint)
POLICIES: tuple[PolicyName, ...] = get_args(PolicyName)
"""Every value of ``prescaler_driving_constraint``'s ``constraint`` label."""
SCALE_DIRECTIONS = ("up", "down")
"""Every value of ``prescaler_scale_events_total``'s ``direction`` label."""
AGAINST_HPA_WINDOWS = tuple(name for name, _ in WINDOWS)
"""Every value of the ``window`` label of the ``prescaler_against_hpa_*`` gauges."""
AGAINST_HPA_FLEETS = ("prescaler", "hpa")
"""Every value of their ``fleet`` label: prescaler's fleet (in dry run its plan's) and the
shadow HPA's."""
SCALER_METHODS = ("IsActive", "StreamIsActive", "GetMetricSpec", "GetMetrics")
"""Every value of ``prescaler_scaler_calls_total``'s ``method`` label (KEDA's calls)."""
SCALER_OUTCOMES = (
    "ok",
    "invalid_argument",
    "not_found",
    "permission_denied",
    "failed_precondition",
    "unavailable",
    "resource_exhausted",
)
"""Every value of its ``outcome`` label: ``ok``, or the gRPC code of a refusal."""
NUDGE_OUTCOMES = ("written", "failed")
"""Every value of ``prescaler_keda_nudges_total``'s ``outcome`` label."""
_SECONDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120)


FIT_FAILURES = ("died", "memory", "error")
"""Why a fit-queue job failed, the ``reason`` of ``prescaler_forecast_fit_failures_total``."""


@dataclass
class Metrics:
    """Per-pool gauges plus loop timings. Create one per operator run."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.predicted_demand = Gauge(
            "prescaler_predicted_demand_requests_per_second",
            "Forecast upper-quantile peak demand within the lookahead",
            _POOL,
            registry=r,
        )
        self.forecast_mean = Gauge(
            "prescaler_forecast_mean_requests_per_second",
            "Forecast mean demand for the step that contains now",
            _POOL,
            registry=r,
        )
        self.forecast_upper = Gauge(
            "prescaler_forecast_upper_requests_per_second",
            "Forecast upper-quantile demand (spec.forecast.quantile, the band the plan sizes"
            " on) for the step that contains now",
            _POOL,
            registry=r,
        )
        self.observed_demand = Gauge(
            "prescaler_observed_demand_requests_per_second", "Measured demand", _POOL, registry=r
        )
        self.planned_replicas = Gauge(
            "prescaler_planned_replicas",
            "Replicas the lookahead asks for, before scale-down pacing",
            _POOL,
            registry=r,
        )
        self.desired_replicas = Gauge(
            "prescaler_desired_replicas", "Replicas the plan sets", _POOL, registry=r
        )
        self.ready_replicas = Gauge(
            "prescaler_ready_replicas", "Ready replicas of the target", _POOL, registry=r
        )
        self.standby_replicas = Gauge(
            "prescaler_standby_replicas", "Placeholder pods the plan asks for", _POOL, registry=r
        )
        self.driving_constraint = Gauge(
            "prescaler_driving_constraint",
            "1 for the limit that drove the plan (memory, compute, schedule, floor), 0 for"
            " the others",
            (*_POOL, "constraint"),
            registry=r,
        )
        self.cold_start_seconds = Gauge(
            "prescaler_cold_start_seconds",
            "Cold start in use (measured p90 or fixed)",
            _POOL,
            registry=r,
        )
        self.shortfall = Gauge(
            "prescaler_shortfall_requests_per_second",
            "Demand above what ready replicas can serve (0 when covered)",
            _POOL,
            registry=r,
        )
        self.degradation_level = Gauge(
            "prescaler_degradation_level",
            "Degradation level published for gateways: 0 normal, 1 warning, 2 critical",
            _POOL,
            registry=r,
        )
        self.forecast_shortfall_tokens = Gauge(
            "prescaler_forecast_shortfall_tokens_per_second",
            "Upper-band demand over the next cold start minus the capacity ready by then,"
            " tokens/s (0 when covered)",
            _POOL,
            registry=r,
        )
        self.forecast_error = Gauge(
            "prescaler_forecast_error_ratio",
            "|observed - forecast mean| / observed for the step just measured",
            _POOL,
            registry=r,
        )
        self.against_hpa_gpu_hours = Gauge(
            "prescaler_against_hpa_gpu_hours",
            "GPU-hours over the rolling window (24h, 7d): prescaler's fleet and standby (in dry"
            " run its plan's), and a shadow HPA's on the same demand",
            (*_POOL, "window", "fleet"),
            registry=r,
        )
        self.against_hpa_saved_gpu_hours = Gauge(
            "prescaler_against_hpa_saved_gpu_hours",
            "The shadow HPA's GPU-hours minus prescaler's over the rolling window",
            (*_POOL, "window"),
            registry=r,
        )
        self.against_hpa_unserved = Gauge(
            "prescaler_against_hpa_unserved_ratio",
            "Estimated share of the window's demand the fleet's ready replicas left unserved",
            (*_POOL, "window", "fleet"),
            registry=r,
        )
        self.against_hpa_short_minutes = Gauge(
            "prescaler_against_hpa_short_minutes",
            "Minutes in the window the fleet's ready capacity was below demand",
            (*_POOL, "window", "fleet"),
            registry=r,
        )
        self.against_hpa_observed_hours = Gauge(
            "prescaler_against_hpa_observed_hours",
            "Hours of the window observed and compared (the comparison's coverage)",
            (*_POOL, "window"),
            registry=r,
        )
        self.shadow_hpa_replicas = Gauge(
            "prescaler_shadow_hpa_replicas",
            "Replicas the shadow HPA would run now (starting or ready)",
            _POOL,
            registry=r,
        )
        self.shadow_hpa_ready_replicas = Gauge(
            "prescaler_shadow_hpa_ready_replicas",
            "Replicas of the shadow HPA that would be ready now",
            _POOL,
            registry=r,
        )
        self.fit_duration = Histogram(
            "prescaler_forecast_fit_duration_seconds",
            "Duration of forecast refreshes that refit or reselected a model",
            ("model",),
            buckets=_SECONDS,
            registry=r,
        )
        self.fits = Counter(
            "prescaler_forecast_fits_total", "Model fits and selections run", ("model",), registry=r
        )
        self.fit_timeouts = Counter(
            "prescaler_forecast_fit_timeouts_total",
            "Selections and fits abandoned at the fit timeout (the pool keeps its last good"
            " forecast, reason ForecastTimeout), by demand series (its fingerprint, as in the"
            " log and an auto-selection's status.forecast.selection) and step (selection or"
            " the model fitted)",
            ("series", "model"),
            registry=r,
        )
        self.policy_in_force = Gauge(
            "prescaler_policy_in_force",
            "1 for the policy a pool plans with now (spec.policy): forecast, or reactive (as"
            " its HPA would); 0 for the other",
            ("namespace", "pool", "policy"),
            registry=r,
        )
        self.fit_failures = Counter(
            "prescaler_forecast_fit_failures_total",
            "Selections and fits that failed in their fit process (the pool keeps its last"
            " good forecast, reason FitFailed, and the step is retried), by why: the process"
            " died under it (killed, or out of the node's memory; it is replaced), the fit"
            " ran past the fit processes' memory limit, or another error",
            ("reason",),
            registry=r,
        )
        for reason in FIT_FAILURES:
            self.fit_failures.labels(reason)
        self._fit_steps: dict[str, set[str]] = {}
        self.keda_trigger_missing = Gauge(
            "prescaler_keda_trigger_missing",
            "1 while KEDA's HPA has lacked the pool's trigger for more than keda.missing_periods"
            " reconcile periods, so KEDA ignores the plan (condition KedaTrigger False); 0"
            " while it carries it, and for pools in other modes",
            _POOL,
            registry=r,
        )
        self.keda_nudges = Counter(
            "prescaler_keda_nudges_total",
            "Nudges of KEDA to rebuild its HPA (the annotation prescaler.io/keda-reconcile"
            " written on it; setting keda.nudge), by outcome (written, failed)",
            (*_POOL, "outcome"),
            registry=r,
        )
        self.forecast_stale = Gauge(
            "prescaler_forecast_stale",
            "1 while the pool plans with a stale forecast (a due fit or refresh is overdue)",
            _POOL,
            registry=r,
        )
        self.forecast_age = Gauge(
            "prescaler_forecast_age_seconds",
            "Seconds since the history behind the forecast's fit ended",
            _POOL,
            registry=r,
        )
        self.fit_queue_jobs = Gauge(
            "prescaler_forecast_queue_jobs",
            "Selection and fit jobs in the fit queue, by state (queued, running)",
            ("state",),
            registry=r,
        )
        self.fit_queue_wait = Histogram(
            "prescaler_forecast_queue_wait_seconds",
            "How long fit jobs waited past their due time before they started",
            buckets=_SECONDS,
            registry=r,
        )
        self.fit_queue_rejected = Counter(
            "prescaler_forecast_queue_rejected_total",
            "Fit jobs refused because the fit queue was full (retried later)",
            registry=r,
        )
        self.forecast_series = Gauge(
            "prescaler_forecast_series",
            "Distinct demand series forecast (pools reading the same series share one)",
            registry=r,
        )
        self.selections_resumed = Counter(
            "prescaler_forecast_selections_resumed_total",
            "Auto-selections taken over from a pool's status instead of being redone",
            registry=r,
        )
        self.leader = Gauge(
            "prescaler_leader",
            "1 while this replica holds the leader Lease and reconciles; 0 on a standby"
            " replica and with shards (see prescaler_shards_served); always 1 without"
            " leader election",
            registry=r,
        )
        self.leader.set(1)
        self.shards_served = Gauge(
            "prescaler_shards_served",
            "Shards whose Lease this replica holds and acts on (operators run with shards)",
            registry=r,
        )
        self.shard_served = Gauge(
            "prescaler_shard_served",
            "1 for each shard this replica serves now, 0 for one it holds no longer",
            ("shard", "replica"),
            registry=r,
        )
        self.pool_watch_events = Counter(
            "prescaler_pool_watch_events",
            "InferencePools this replica decoded from its watches (each listed pool and each"
            " event): watch is the shard whose pools a stream selects, 'relabel' for the"
            " stream of pools not yet labelled with their shard, 'all' without shards",
            ("watch",),
            registry=r,
        )
        self.pool_reconciles = Counter(
            "prescaler_pool_reconciles",
            "Reconciles of the pool by this replica since it took the pool's shard over"
            " (operators run with shards): says which replica and shard serve each pool",
            (*_POOL, "shard", "replica"),
            registry=r,
        )
        self._served: dict[tuple[str, str], tuple[str, str]] = {}
        self.last_reconcile = Gauge(
            "prescaler_last_reconcile_timestamp_seconds",
            "When the pool was last reconciled (Unix seconds)",
            _POOL,
            registry=r,
        )
        self.reconcile_duration = Histogram(
            "prescaler_reconcile_duration_seconds",
            "Duration of one pool's reconcile",
            buckets=_SECONDS,
            registry=r,
        )
        self.reconcile_errors = Counter(
            "prescaler_reconcile_errors_total", "Reconciles that failed", ("reason",), registry=r
        )
        self.status_writes = Counter(
            "prescaler_status_writes_total",
            "Reconciles' status writes: only the changes, the whole status (the pool moved"
            " on since it was read), or kept (nothing changed, or only observations, not"
            " written yet)",
            ("kind",),
            registry=r,
        )
        self.scale_events = Counter(
            "prescaler_scale_events_total",
            "Replica changes applied",
            (*_POOL, "direction"),
            registry=r,
        )
        self.scaler_calls = Counter(
            "prescaler_scaler_calls_total",
            "Calls of the KEDA external scaler (a stream counts each answer it pushes), by"
            " method and outcome (ok, or the gRPC code of a refusal)",
            ("method", "outcome"),
            registry=r,
        )
        for method in SCALER_METHODS:
            for outcome in SCALER_OUTCOMES:
                self.scaler_calls.labels(method, outcome)

        self.prewarm_pods = Counter(
            "prescaler_prewarm_pods_total",
            "Pods whose prescaler.io/prewarmed condition was set, by its reason (Prewarmed,"
            " PrewarmFailed, PrewarmTimedOut, PrewarmNotConfigured)",
            ("reason",),
            registry=r,
        )
        self.prewarm_running = Gauge(
            "prescaler_prewarm_running",
            "Pod warm-ups in progress (spec.prewarm)",
            registry=r,
        )
        self.prewarm_duration = Histogram(
            "prescaler_prewarm_duration_seconds",
            "Duration of one pod's warm-up: waiting for the engine, model lookup, requests",
            buckets=_SECONDS,
            registry=r,
        )

    def served(self, namespace: str, pool: str, shard: int, replica: str) -> None:
        """Count one reconcile of a pool by this replica on ``shard``."""
        labels = (str(shard), replica)
        previous = self._served.get((namespace, pool))
        if previous is not None and previous != labels:
            with contextlib.suppress(KeyError):
                self.pool_reconciles.remove(namespace, pool, *previous)
        self._served[(namespace, pool)] = labels
        self.pool_reconciles.labels(namespace, pool, *labels).inc()

    def declare_pool(self, namespace: str, pool: str) -> None:
        """Create the pool's scale-event and KEDA nudge counters at 0, so that
        ``increase()`` counts the first one too (a series born at 1 shows no increase), and
        its KEDA trigger flag at 0 (set by the reconcile only when KEDA ignores its plan)."""
        for direction in SCALE_DIRECTIONS:
            self.scale_events.labels(namespace, pool, direction)
        for outcome in NUDGE_OUTCOMES:
            self.keda_nudges.labels(namespace, pool, outcome)
        self.keda_trigger_missing.labels(namespace, pool)

    def set_policy(self, namespace: str, pool: str, policy: str) -> None:
        """The pool's policy in force (1) and the other (0)."""
        for name in POLICIES:
            self.policy_in_force.labels(namespace, pool, name).set(1 if name == policy else 0)

    def declare_fit(self, series: str, model: str) -> None:
        """Create a series' fit-timeout counter for ``model`` (a step: ``selection`` or a
        model's fit) at 0, as the series is first read and as its first job of a step
        starts, so that ``increase()`` counts the first timeout too."""
        self._fit_steps.setdefault(series, set()).add(model)
        self.fit_timeouts.labels(series, model)

    def fit_timed_out(self, series: str, model: str) -> None:
        """Count one job of ``series`` abandoned at the fit timeout."""
        self.declare_fit(series, model)
        self.fit_timeouts.labels(series, model).inc()

    def forget_series(self, series: str) -> None:
        """Drop the fit-timeout series of a demand series no pool reads any more."""
        for model in self._fit_steps.pop(series, set()):
            with contextlib.suppress(KeyError):
                self.fit_timeouts.remove(series, model)

    def set_forecast_band(
        self, namespace: str, pool: str, forecast: ForecastLike | None, now: float
    ) -> None:
        """Mean and upper band of the forecast step that contains ``now`` (the first point
        whose step ends at or after it). Without such a step (no forecast, or one that ends
        before ``now``) the series are dropped rather than left at an old value."""
        point = None
        if forecast is not None:
            point = next((p for p in forecast.points if p.t >= now), None)
        if point is None:
            for gauge in (self.forecast_mean, self.forecast_upper):
                with contextlib.suppress(KeyError):
                    gauge.remove(namespace, pool)
            return
        self.forecast_mean.labels(namespace, pool).set(point.mean)
        self.forecast_upper.labels(namespace, pool).set(point.upper)

    def set_driving_constraint(self, namespace: str, pool: str, constraint: Constraint) -> None:
        """One-hot: 1 on ``constraint``'s series, 0 on every other constraint's."""
        for name in CONSTRAINTS:
            value = 1 if name == constraint else 0
            self.driving_constraint.labels(namespace, pool, name).set(value)

    def set_against_hpa(self, namespace: str, pool: str, status: AgainstHpaStatus | None) -> None:
        """The comparison with the shadow HPA (``status.againstHpa``); without one the
        series are dropped. A disaggregated pool's (its roles' sum, under the pool's own
        name) has no shadow of its own: its shadow's replicas are its roles'."""
        if status is None:
            self._forget_against_hpa(namespace, pool)
            return
        windows: dict[str, AgainstHpaWindow | None] = {
            "24h": status.last24_hours,
            "7d": status.last7_days,
        }
        for name, window in windows.items():
            if window is None:
                continue
            self.against_hpa_saved_gpu_hours.labels(namespace, pool, name).set(
                window.saved_gpu_hours
            )
            self.against_hpa_observed_hours.labels(namespace, pool, name).set(window.observed_hours)
            sides = {
                "prescaler": (window.gpu_hours, window.unserved_fraction, window.short_minutes),
                "hpa": (
                    window.hpa_gpu_hours,
                    window.hpa_unserved_fraction,
                    window.hpa_short_minutes,
                ),
            }
            for fleet, (gpu_hours, unserved, short) in sides.items():
                labels = (namespace, pool, name, fleet)
                self.against_hpa_gpu_hours.labels(*labels).set(gpu_hours)
                self.against_hpa_short_minutes.labels(*labels).set(short)
                self.against_hpa_unserved.labels(*labels).set(unserved or 0.0)
        hpa = status.hpa
        if hpa is None:
            for gauge in (self.shadow_hpa_replicas, self.shadow_hpa_ready_replicas):
                with contextlib.suppress(KeyError):
                    gauge.remove(namespace, pool)
            return
        self.shadow_hpa_replicas.labels(namespace, pool).set(hpa.ready + len(hpa.starting))
        self.shadow_hpa_ready_replicas.labels(namespace, pool).set(hpa.ready)

    def _against_hpa_series(self) -> tuple[tuple[Gauge, tuple[tuple[str, ...], ...]], ...]:
        """The comparison's gauges with the extra label values of each of their series."""
        both = tuple((w, f) for w in AGAINST_HPA_WINDOWS for f in AGAINST_HPA_FLEETS)
        windows = tuple((w,) for w in AGAINST_HPA_WINDOWS)
        return (
            (self.against_hpa_gpu_hours, both),
            (self.against_hpa_unserved, both),
            (self.against_hpa_short_minutes, both),
            (self.against_hpa_saved_gpu_hours, windows),
            (self.against_hpa_observed_hours, windows),
            (self.shadow_hpa_replicas, ((),)),
            (self.shadow_hpa_ready_replicas, ((),)),
        )

    def _forget_against_hpa(self, namespace: str, pool: str) -> None:
        for gauge, extras in self._against_hpa_series():
            for extra in extras:
                with contextlib.suppress(KeyError):
                    gauge.remove(namespace, pool, *extra)

    def _per_pool(self) -> tuple[Gauge | Counter, ...]:
        """Every metric labelled by pool."""
        return (
            self.driving_constraint,
            self.scale_events,
            self.predicted_demand,
            self.forecast_mean,
            self.forecast_upper,
            self.observed_demand,
            self.planned_replicas,
            self.desired_replicas,
            self.ready_replicas,
            self.standby_replicas,
            self.cold_start_seconds,
            self.shortfall,
            self.degradation_level,
            self.forecast_shortfall_tokens,
            self.forecast_error,
            self.forecast_stale,
            self.keda_trigger_missing,
            self.keda_nudges,
            self.forecast_age,
            self.last_reconcile,
            *(gauge for gauge, _ in self._against_hpa_series()),
        )

    def forget(self, namespace: str, pool: str) -> None:
        """Drop a deleted pool's series (or those of a pool another replica serves now)."""
        served = self._served.pop((namespace, pool), None)
        if served is not None:
            with contextlib.suppress(KeyError):
                self.pool_reconciles.remove(namespace, pool, *served)
        for name in CONSTRAINTS:
            with contextlib.suppress(KeyError):
                self.driving_constraint.remove(namespace, pool, name)
        for direction in SCALE_DIRECTIONS:
            with contextlib.suppress(KeyError):
                self.scale_events.remove(namespace, pool, direction)
        for policy in POLICIES:
            with contextlib.suppress(KeyError):
                self.policy_in_force.remove(namespace, pool, policy)
        for outcome in NUDGE_OUTCOMES:
            with contextlib.suppress(KeyError):
                self.keda_nudges.remove(namespace, pool, outcome)
        self._forget_against_hpa(namespace, pool)
        labelled = {self.driving_constraint, self.scale_events, self.policy_in_force}
        labelled.add(self.keda_nudges)
        labelled.update(gauge for gauge, _ in self._against_hpa_series())
        for metric in self._per_pool():
            if metric not in labelled:
                with contextlib.suppress(KeyError):
                    metric.remove(namespace, pool)

    def scaler_call(self, method: str, outcome: str) -> None:
        """Count one call of the KEDA external scaler."""
        self.scaler_calls.labels(method, outcome).inc()

    def forget_pools(self) -> None:
        """Drop every pool's series: a replica that lost the lead reports none, so only
        the acting replica's numbers reach a dashboard."""
        for metric in self._per_pool():
            metric.clear()
        self.pool_reconciles.clear()
        self._served.clear()

    def serve(self, port: int, host: str = "0.0.0.0") -> None:
        """Start ``/metrics`` in a background thread."""
        start_http_server(port, addr=host, registry=self.registry)
