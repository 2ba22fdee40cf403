"""One backtest: a pool's spec, a demand series and the policies to compare, to a result.

:func:`backtest` is the entry point every replay shares: ``prescaler backtest`` on a trace
file and on a pool's own Prometheus history, the demo's HPA comparison and the benchmarks.
Its inputs:

* **the spec** (:class:`prescaler.api.InferencePoolSpec`): the predictive policy runs what
  the operator would run for that pool (its planner, forecaster, risk objective, standby
  and degradation thresholds), every knob the spec leaves unset at the spec model's
  default. The spec's bounds and throughput size the simulated fleet unless a
  :class:`~prescaler.backtest.FleetConfig` is given;
* **the demand** (:class:`~prescaler.backtest.Demand`): per-minute tokens/s (the truth) and
  what the metrics showed (NaN in their gaps);
* **the policies**, by name (:data:`POLICIES`), and :class:`ReplayOptions`, the knobs that
  are not the pool's: how often the operator decides, the references' parameters and the
  reactive baseline's HPA target.

The result (:class:`Backtest`) holds each policy's scores, runs and degradation levels
(:class:`~prescaler.backtest.BacktestResult`) and writes the report's JSON sections.
:func:`backtest_roles` replays a disaggregated pool's roles the same way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from prescaler.api import (
    InferencePoolSpec,
    capacity_model,
    degradation_policy,
    forecast_service,
    risk_objective,
    role_view,
    scaling_policy,
    scheduled_windows,
)
from prescaler.backtest._auto import auto_schedule, candidates, daily_choices
from prescaler.backtest._demand import Demand
from prescaler.backtest._fleet import replicas_needed
from prescaler.backtest._levels import DegradationSetup
from prescaler.backtest._policies import (
    AutoPolicy,
    KedaPolicy,
    OraclePolicy,
    PersistencePolicy,
    Policy,
    PredictivePolicy,
    ReactivePolicy,
    ScheduleOnlyPolicy,
    SmoothedOraclePolicy,
    oracle_replicas,
    smoothed_oracle_replicas,
)
from prescaler.backtest._report import BacktestResult, run_backtest
from prescaler.backtest._roles import DisaggregatedResult
from prescaler.backtest._shadow import ShadowHpa, ShadowSetup
from prescaler.backtest._simulate import FleetConfig, Progress
from prescaler.capacity import CapacityModel, Role
from prescaler.planning import PolicyChoice, PolicyName, ScheduledWindow, event_windows
from prescaler.settings import ReconcileSettings

POLICIES = (
    "reactive",
    "predictive",
    "keda",
    "oracle",
    "schedule-only",
    "persistence",
    "smoothed-oracle",
)
"""Every policy a backtest can replay, by name."""
DEFAULT_POLICIES = ("reactive", "predictive", "oracle")
"""The brief's three: the HPA a user would pick instead, prescaler and the physical limit."""
HPA_TARGET = 0.7
"""The reactive baseline's target utilization (the brief's) when the pool's HPA gives none."""
PERSISTENCE_K = 1.4
SMOOTHED_ORACLE_K = 1.0
SMOOTHED_WINDOW_MINUTES = 31
WARM_START_SECONDS = 60.0
"""Default warm start: the weight load and runtime init left once a node is up and pulled."""


def check_policies(names: Sequence[str]) -> tuple[str, ...]:
    """``names`` as a tuple, refused when empty, unknown or repeated."""
    if not names:
        raise ValueError("give at least one policy")
    for name in names:
        if name not in POLICIES:
            raise ValueError(f"unknown policy {name!r}; expected some of {', '.join(POLICIES)}")
    if len(set(names)) != len(names):
        raise ValueError("a policy is listed twice")
    return tuple(names)


@dataclass(frozen=True)
class ReplayOptions:
    """How the replay runs, beyond the pool's spec. The defaults are the operator's."""

    decision_seconds: float = field(default_factory=lambda: ReconcileSettings().interval_seconds)
    """How often the predictive policy plans (the operator's reconcile period); the fleets'
    degradation levels are assessed at the same cadence."""
    forecast_step_seconds: float = 60.0
    """The forecaster's resolution (no finer than the demand's minute)."""
    history_seconds: float | None = None
    """History handed to the forecaster; ``None``: ``spec.forecast.lookbackSeconds``, as
    the operator reads it."""
    scale_down_requires_observation: bool = True
    """No scale-down while the observed demand is missing, as the operator always does."""
    windows: tuple[ScheduledWindow, ...] | None = None
    """Scheduled windows for the predictive and schedule-only policies; ``None``: the
    spec's ``schedules``."""
    hpa_target: float = HPA_TARGET
    """The reactive (HPA) baseline's target utilization."""
    persistence_k: float = PERSISTENCE_K
    """The persistence reference: replicas for ``k`` x the demand seen now."""
    smoothed_oracle_k: float = SMOOTHED_ORACLE_K
    """The smoothed oracle: replicas for ``k`` x the future's centred rolling mean."""
    smoothed_window_minutes: int = SMOOTHED_WINDOW_MINUTES
    """The smoothed oracle's centred rolling-mean window."""

    def windows_of(self, spec: InferencePoolSpec) -> tuple[ScheduledWindow, ...]:
        return self.windows if self.windows is not None else scheduled_windows(spec)


@dataclass(frozen=True)
class Replay:
    """What one fleet replays: its demand, capacity model and simulated fleet."""

    demand: Demand
    capacity: CapacityModel
    config: FleetConfig


# --------------------------------------------------------------------------- the fleet


def pool_capacity(
    spec: InferencePoolSpec, demand: Demand, *, context_tokens: float | None = None
) -> CapacityModel:
    """The pool's capacity model on the demand's token mix (its request-weighted means and
    ``context_tokens``, else the demand's p95 context), as the operator plans on measured
    means."""
    context = context_tokens if context_tokens is not None else demand.context_p95
    return capacity_model(
        spec,
        prompt_tokens=demand.prompt_tokens,
        output_tokens=demand.output_tokens,
        context_tokens=context,
    )


def pool_fleet(
    spec: InferencePoolSpec,
    capacity: CapacityModel,
    *,
    cold_start_seconds: float | None = None,
    policies: Sequence[str] = DEFAULT_POLICIES,
) -> FleetConfig:
    """The simulated fleet of a pool: its bounds and GPUs, one replica's effective
    capacity, ``cold_start_seconds`` (default: the spec's), and the spec's warm standby
    when the predictive policy runs with placeholders on."""
    config = FleetConfig(
        replica_tokens_per_second=capacity.replica_tokens_per_second,
        cold_start_seconds=(
            float(spec.cold_start.seconds) if cold_start_seconds is None else cold_start_seconds
        ),
        min_replicas=spec.min_replicas,
        max_replicas=spec.max_replicas,
        gpus_per_replica=spec.model.gpus_per_replica,
    )
    if standby_max_replicas(spec, policies) > 0:
        config = with_standby(config)
    return config


def standby_max_replicas(spec: InferencePoolSpec, policies: Sequence[str]) -> int:
    """The predictive policy's standby bound, as the spec's placeholders set it (0 when
    the predictive policy does not run: only it has standby)."""
    planned = "predictive" in policies or "keda" in policies
    return scaling_policy(spec).standby_max_replicas if planned else 0


def with_standby(
    config: FleetConfig, *, warm_start_seconds: float | None = None, cost_fraction: float = 1.0
) -> FleetConfig:
    """The fleet with warm standby simulated: a replica on a warm slot is ready after
    ``warm_start_seconds`` (default :data:`WARM_START_SECONDS`, at most the cold start)."""
    warm = warm_start_seconds
    if warm is None:
        warm = min(WARM_START_SECONDS, config.cold_start_seconds)
    return replace(config, warm_start_seconds=warm, standby_cost_fraction=cost_fraction)


def peak_need(demand: Demand, replica_tokens_per_second: float) -> int:
    """Replicas the replay's peak minute needs (at least one)."""
    peak = float(demand.replay_tokens_per_s.max())
    return max(1, int(replicas_needed(np.array([peak]), replica_tokens_per_second)[0]))


def peak_factor(peak: float, replicas: int, replica_tps: float) -> float:
    """The demand scale that makes the peak need exactly ``replicas`` replicas.

    ``replicas × capacity / peak`` can land the peak a float ulp above ``replicas``
    replicas' capacity: noise the shortfall test (and so the oracle) takes for none.
    """
    return replicas * replica_tps / peak


# --------------------------------------------------------------------------- the policies


def reactive_policy(config: FleetConfig, target: float = HPA_TARGET) -> ReactivePolicy:
    """The HPA baseline at ``target`` utilization, with the fleet's bounds."""
    return ReactivePolicy(
        config.replica_tokens_per_second, config.min_replicas, config.max_replicas, target=target
    )


def _smoothed_oracle(demand: Demand, config: FleetConfig, options: ReplayOptions) -> Policy:
    """The smoothed-oracle reference: ``k`` x the future's centred rolling mean."""
    replicas = smoothed_oracle_replicas(
        demand.tokens_per_s,
        config.steps_per_minute,
        config.replica_tokens_per_second,
        config.lag_steps,
        config.min_replicas,
        config.max_replicas,
        k=options.smoothed_oracle_k,
        window_minutes=options.smoothed_window_minutes,
    )
    return SmoothedOraclePolicy(replicas, config.step_seconds)


def _oracle(demand: Demand, config: FleetConfig) -> Policy:
    per_step = np.repeat(demand.tokens_per_s, config.steps_per_minute)
    replicas = oracle_replicas(
        per_step,
        config.replica_tokens_per_second,
        config.lag_steps,
        config.min_replicas,
        config.max_replicas,
    )
    return OraclePolicy(replicas, config.step_seconds)


def predictive_policy(
    spec: InferencePoolSpec,
    demand: Demand,
    *,
    capacity: CapacityModel,
    config: FleetConfig,
    options: ReplayOptions,
) -> PredictivePolicy:
    """The operator's planner and forecaster for ``spec``, deciding every
    ``options.decision_seconds`` on the fleet's cold start."""
    if spec.forecast is None:
        raise ValueError("the predictive policy needs spec.forecast (it forecasts demand)")
    windows = options.windows_of(spec)
    step = options.forecast_step_seconds
    cold_start = config.cold_start_seconds
    margin = spec.cold_start.margin_seconds
    horizon = max(cold_start + margin + step, 2 * step)
    horizon = math.ceil(horizon / step) * step
    if scaling_policy(spec).direction_changes_as_hpa:
        # As the operator: a release that would reverse a scale-up reads the forecast's
        # whole horizon (what it asks back after the lookahead).
        horizon = max(horizon, math.ceil(spec.forecast.horizon_seconds / step) * step)
    placeholders = spec.standby.placeholders
    if placeholders.enabled and placeholders.max_replicas > 0:
        # As the operator: standby covers the forecast's upper peak over the spec's whole
        # horizon, so with standby on the forecaster looks that far ahead.
        horizon = max(horizon, math.ceil(spec.forecast.horizon_seconds / step) * step)
    service = forecast_service(
        spec.forecast,
        # As the operator does: the windows' occurrences are the forecaster's events.
        events=event_windows(windows, float(demand.start), float(demand.times()[-1]) + horizon),
        horizon_seconds=horizon,
        step_seconds=step,
    )
    policy = replace(
        scaling_policy(spec),
        scale_down_requires_observation=options.scale_down_requires_observation,
    )
    objective = risk_objective(spec)
    hpa = None
    if objective.relative:
        # The relative objective's reference: the operator's shadow HPA on the same fleet.
        hpa = ShadowHpa(
            ShadowSetup(
                replica_capacity=capacity.replica_requests_per_second,
                min_replicas=config.min_replicas,
                max_replicas=config.max_replicas,
                cold_start_seconds=cold_start,
                gpus_per_replica=config.gpus_per_replica,
                target=options.hpa_target,
            )
        )
    return PredictivePolicy(
        forecaster=service,
        capacity=capacity,
        policy=policy,
        cold_start_seconds=cold_start,
        windows=tuple(windows),
        interval=options.decision_seconds,
        objective=objective,
        hpa=hpa,
        # As the operator: it reads spec.forecast.lookbackSeconds of history.
        history_seconds=(
            spec.forecast.lookback_seconds
            if options.history_seconds is None
            else options.history_seconds
        ),
    )


def build_policies(
    spec: InferencePoolSpec,
    demand: Demand,
    policies: Sequence[str],
    *,
    capacity: CapacityModel,
    config: FleetConfig,
    options: ReplayOptions | None = None,
) -> list[Policy]:
    """The named policies, in order, for this demand and fleet; the predictive one runs
    ``spec``."""
    options = options or ReplayOptions()
    built: list[Policy] = []
    for name in check_policies(policies):
        if name == "reactive":
            built.append(reactive_policy(config, options.hpa_target))
        elif name == "smoothed-oracle":
            built.append(_smoothed_oracle(demand, config, options))
        elif name == "oracle":
            built.append(_oracle(demand, config))
        elif name == "persistence":
            built.append(
                PersistencePolicy(
                    options.persistence_k,
                    config.replica_tokens_per_second,
                    config.min_replicas,
                    config.max_replicas,
                )
            )
        elif name == "schedule-only":
            windows = list(options.windows_of(spec))
            if not windows:
                raise ValueError("the schedule-only policy needs at least one scheduled window")
            built.append(
                ScheduleOnlyPolicy(windows, capacity, config.min_replicas, config.max_replicas)
            )
        elif name == "keda":
            # The plan as KEDA's external trigger beside the reactive one (the baseline's
            # target): one HPA, the larger recommendation wins.
            built.append(
                KedaPolicy(
                    predictive_policy(
                        spec, demand, capacity=capacity, config=config, options=options
                    ),
                    reactive_policy(config, options.hpa_target),
                )
            )
        else:
            built.append(
                planned_policy(spec, demand, capacity=capacity, config=config, options=options)
            )
    return built


def planned_policy(
    spec: InferencePoolSpec,
    demand: Demand,
    *,
    capacity: CapacityModel,
    config: FleetConfig,
    options: ReplayOptions,
) -> PredictivePolicy | AutoPolicy:
    """The pool as the operator plans it, per ``spec.policy``: the forecast planner
    (``forecast``, or any pool without ``spec.forecast``), the HPA at the pool's target
    with the windows' floors (``reactive``), that HPA led by the forecast (``leading``), or
    the one the daily re-checks choose on the replayed demand (``auto``,
    :mod:`prescaler.backtest._auto`)."""
    predictive = predictive_policy(spec, demand, capacity=capacity, config=config, options=options)
    if spec.forecast is None or spec.policy == "forecast":
        return predictive
    windows = list(options.windows_of(spec))
    floors = (
        ScheduleOnlyPolicy(windows, capacity, config.min_replicas, config.max_replicas)
        if windows
        else None
    )
    choices: list[PolicyChoice] = []
    if spec.policy == "auto":
        runs, _ = candidates(
            spec,
            demand,
            capacity=capacity,
            config=config,
            options=options,
        )
        choices = daily_choices(runs, options.hpa_target, first_at=demand.replay_start)
    fixed: PolicyName | None = None
    if spec.policy in ("reactive", "leading"):
        fixed = "reactive" if spec.policy == "reactive" else "leading"
    return AutoPolicy(
        predictive,
        reactive_policy(config, options.hpa_target),
        auto_schedule(choices, fixed),
        floors,
        choices,
    )


def _json_ratio(ratio: float | None) -> float | str | None:
    if ratio is None:
        return None
    return round(ratio, 4) if math.isfinite(ratio) else "inf"


def degradation_setup(
    spec: InferencePoolSpec, capacity: CapacityModel, config: FleetConfig, every_seconds: float
) -> DegradationSetup:
    """How the fleets' degradation levels are assessed: the spec's thresholds, the run's
    capacity model, every ``every_seconds`` (the predictive policy's decisions)."""
    step = config.step_seconds
    if abs(every_seconds / step - round(every_seconds / step)) > 1e-9:
        raise ValueError(
            f"the decision interval must be a multiple of the {step:g} s simulation step"
        )
    return DegradationSetup(
        policy=degradation_policy(spec), capacity=capacity, every_seconds=every_seconds
    )


# --------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class Backtest:
    """A backtest's result: the scores and runs, the policies that ran and what they
    were given."""

    result: BacktestResult
    policies: tuple[Policy, ...]
    options: ReplayOptions
    capacity: CapacityModel
    """The capacity model the fleet ran on."""
    standby_max_replicas: int = 0
    roles: DisaggregatedResult | None = None
    """Both roles' replays, for a disaggregated replay (:func:`backtest_roles`)."""

    def drivers(self) -> dict[str, Any]:
        """Per planning policy, what drove its decisions: for each rule
        (:data:`prescaler.planning.Driver`), its share of the decisions and of the replica
        time (GPU-hours) they asked for."""
        out: dict[str, Any] = {}
        for policy in self.policies:
            drivers = getattr(policy, "drivers", None)
            if not drivers:
                continue
            decisions = sum(n for n, _ in drivers.values()) or 1
            seconds = sum(t for _, t in drivers.values()) or 1.0
            out[policy.name] = {
                name: {
                    "decisions": n,
                    "decision_share": round(n / decisions, 4),
                    "gpu_hour_share": round(t / seconds, 4),
                }
                for name, (n, t) in sorted(drivers.items(), key=lambda kv: -kv[1][1])
            }
        return out

    def policy_json(self) -> dict[str, Any]:
        """Per policy run under ``spec.policy`` ``auto`` or ``reactive``: each daily check
        (when, the verdict in force after it, the forecast's frontier ratio that day),
        the switches, the decisions made in each mode and the policy it ended on."""
        out: dict[str, Any] = {}
        for policy in self.policies:
            if not isinstance(policy, AutoPolicy):
                continue
            ended = policy.in_force(math.inf)
            out[policy.name] = {
                "ended_on": ended,
                "switches": max(0, len(policy.schedule) - 1)
                + (1 if policy.choices and policy.schedule[0][1] != "forecast" else 0),
                "decisions": dict(policy.decisions),
                "checks": [
                    {
                        "at": c.checked_at,
                        "policy": c.policy,
                        "frontier_ratio": _json_ratio(c.ratio),
                        "leading_frontier_ratio": _json_ratio(c.leading_ratio),
                    }
                    for c in policy.choices
                ],
            }
        return out

    def settings_json(self) -> dict[str, Any]:
        """The record of the reference and standby knobs this run used."""
        names = [p.name for p in self.policies]
        options, config = self.options, self.result.config
        out: dict[str, Any] = {}
        if "reactive" in names:
            out["hpa_target"] = options.hpa_target
        if "smoothed-oracle" in names:
            out["smoothed_oracle"] = {
                "k": options.smoothed_oracle_k,
                "window_minutes": options.smoothed_window_minutes,
            }
        if self.standby_max_replicas > 0:
            out["standby"] = {
                "max_replicas": self.standby_max_replicas,
                "warm_start_seconds": config.warm_start_seconds,
                "cost_fraction": config.standby_cost_fraction,
            }
        return out

    def span_scores(self, spans: Sequence[tuple[str, float, float]]) -> dict[str, Any]:
        """Each policy's scores in each ``(name, start, end)`` span (unix seconds); a span
        outside the replayed minutes raises ``ValueError`` naming it."""
        import pandas as pd

        out: dict[str, Any] = {}
        for name, start, end in spans:
            try:
                policies = self.result.span_scores(start, end)
            except ValueError:
                raise ValueError(f"span {name}: outside the replayed minutes") from None
            out[name] = {
                "start": pd.Timestamp(start, unit="s", tz="UTC").isoformat(),
                "end": pd.Timestamp(end, unit="s", tz="UTC").isoformat(),
                "policies": policies,
            }
        return out

    def roles_json(self, spans: Sequence[tuple[str, float, float]] = ()) -> dict[str, Any]:
        """The report's ``disaggregated`` section: the unified replica the roles are
        compared with, both roles' scores, and theirs in each span."""
        roles = self.roles
        if roles is None:
            return {}
        body: dict[str, Any] = {"unified_tokens_per_second": self.capacity.throughput}
        body.update(roles.to_json(self.result))
        if spans:
            body["spans"] = {
                name: {n: sc.as_dict() for n, sc in roles.span_scores(start, end).items()}
                for name, start, end in spans
            }
        return body

    def timeline(self) -> Any:
        """One row per replayed minute (and both roles' columns in a disaggregated replay)."""
        import pandas as pd

        if self.roles is None:
            return self.result.timeline()
        return pd.concat([self.result.timeline(), self.roles.timeline()], axis=1)


def backtest(
    spec: InferencePoolSpec,
    demand: Demand,
    policies: Sequence[str] = DEFAULT_POLICIES,
    *,
    capacity: CapacityModel | None = None,
    config: FleetConfig | None = None,
    options: ReplayOptions | None = None,
    degradation: DegradationSetup | Literal["spec"] | None = "spec",
    progress: Progress | None = None,
) -> Backtest:
    """Replay ``demand`` under each named policy, as a fleet of the pool ``spec``.

    ``capacity`` (default :func:`pool_capacity`) and ``config`` (default
    :func:`pool_fleet`) override what the spec and the demand give. ``degradation``:
    assess each fleet's degradation levels at the spec's thresholds (``"spec"``, every
    ``options.decision_seconds``), with a given setup, or not at all (``None``). A
    disaggregated replay adds its roles (:func:`backtest_roles`) as ``roles``. Raises
    ``ValueError`` (:class:`prescaler.api.SpecError` for the spec) on what cannot be
    replayed.
    """
    options = options or ReplayOptions()
    names = check_policies(policies)
    if capacity is None:
        capacity = pool_capacity(spec, demand)
    if config is None:
        config = pool_fleet(spec, capacity, policies=names)
    built = build_policies(spec, demand, names, capacity=capacity, config=config, options=options)
    setup = (
        degradation_setup(spec, capacity, config, options.decision_seconds)
        if degradation == "spec"
        else degradation
    )
    result = run_backtest(demand, built, config, progress=progress, degradation=setup)
    return Backtest(
        result=result,
        policies=tuple(built),
        options=options,
        capacity=capacity,
        standby_max_replicas=standby_max_replicas(spec, names),
    )


def backtest_roles(
    spec: InferencePoolSpec,
    fleets: Mapping[Role, Replay],
    policies: Sequence[str],
    *,
    options: ReplayOptions | None = None,
    progress: Progress | None = None,
) -> DisaggregatedResult:
    """Replay a disaggregated pool's roles (``spec.roles``), each under every policy on
    its own demand and fleet; each role's predictive policy runs the role's view of the
    spec (:func:`prescaler.api.role_view`)."""
    results = {}
    for role, fleet in fleets.items():
        built = build_policies(
            role_view(spec, role),
            fleet.demand,
            policies,
            capacity=fleet.capacity,
            config=fleet.config,
            options=options,
        )

        def report(name: str, done: float, role: Role = role) -> None:
            if progress is not None:
                progress(f"{role} {name}", done)

        results[role] = run_backtest(fleet.demand, built, fleet.config, progress=report)
    return DisaggregatedResult(
        roles=results, capacities={role: fleet.capacity for role, fleet in fleets.items()}
    )
