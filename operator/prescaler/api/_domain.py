"""From the wire models to the domain objects the planner takes (pure).

Everything the API server cannot check (a time zone, a cron expression, a dated window's
order, whether a preset leaves room for the KV cache) fails here with :class:`SpecError`,
which the operator turns into condition ``Invalid``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from prescaler.api._spec import (
    ForecastSpec,
    InferencePoolSpec,
    ModelSpec,
    TargetRef,
    WindowSpec,
)
from prescaler.capacity import (
    ROLES,
    CapacityModel,
    ModelArchitecture,
    ReplicaSpec,
    Role,
    TokenProfile,
    get_preset,
    role_capacity,
)
from prescaler.planning import DegradationPolicy, RiskObjective, ScalingPolicy, ScheduledWindow
from prescaler_forecast import EventSource, EventWindow, ForecastService


class SpecError(ValueError):
    """The spec is well-formed but cannot work; the message names the field."""


def parse_spec(raw: Mapping[str, Any]) -> InferencePoolSpec:
    """Validate a spec dict from the wire; errors become one :class:`SpecError`."""
    try:
        return InferencePoolSpec.model_validate(dict(raw))
    except ValidationError as exc:
        parts = []
        for error in exc.errors()[:5]:
            where = ".".join(str(p) for p in error["loc"]) or "spec"
            parts.append(f"spec.{where}: {error['msg']}")
        raise SpecError("; ".join(parts)) from None


def architecture(model: ModelSpec) -> ModelArchitecture | None:
    """The architecture a model spec names, or ``None`` for throughput-only planning."""
    if model.preset is not None:
        try:
            return get_preset(model.preset)
        except ValueError as exc:
            raise SpecError(f"spec.model.preset: {exc}") from None
    arch = model.architecture
    if arch is None:
        return None
    try:
        return ModelArchitecture(
            name=arch.name,
            layers=arch.layers,
            kv_heads=arch.kv_heads,
            head_dim=arch.head_dim,
            parameters=arch.parameters_billions * 1e9,
            max_context_tokens=arch.max_context_tokens,
            weight_dtype=arch.weight_dtype,
            kv_cache_dtype=arch.kv_cache_dtype,
            attention=arch.attention,
            kv_lora_rank=arch.kv_lora_rank,
            rope_head_dim=arch.rope_head_dim,
        )
    except ValueError as exc:
        raise SpecError(f"spec.model.architecture: {exc}") from None


def replica_spec(model: ModelSpec) -> ReplicaSpec | None:
    arch = architecture(model)
    if arch is None:
        return None
    if model.gpu_memory_gib is None:
        raise SpecError("spec.model.gpuMemoryGiB is required with a preset or an architecture")
    try:
        return ReplicaSpec(
            model=arch,
            gpu_memory_gib=model.gpu_memory_gib,
            gpus_per_replica=model.gpus_per_replica,
            tokens_per_second=model.tokens_per_second,
            memory_utilization=model.memory_utilization,
            decode_tokens_per_second_per_request=model.decode_tokens_per_second,
        )
    except ValueError as exc:
        raise SpecError(f"spec.model: {exc}") from None


def target_of(spec: InferencePoolSpec) -> TargetRef:
    """The one target a unified pool (or a role's view, :func:`role_view`) scales."""
    if spec.target is None:
        raise SpecError("spec.target: give a target, or roles for a disaggregated pool")
    return spec.target


def _matchers(*selectors: str) -> str:
    return ",".join(part for s in selectors if (part := s.strip().strip("{}").strip()))


def role_view(spec: InferencePoolSpec, role: Role) -> InferencePoolSpec:
    """One role of a disaggregated pool as the unified pool it is planned and scaled as:
    the role's target, bounds (the pool's where the role gives none), throughput and GPUs,
    and the pool's queries narrowed by the role's selector. Everything else (forecast
    settings, the model, cold start, pacing, windows, degradation) is the pool's."""
    if spec.roles is None:
        raise SpecError("spec.roles: not a disaggregated pool")
    r = spec.roles.prefill if role == "prefill" else spec.roles.decode
    model = spec.model.model_copy(
        update={
            "tokens_per_second": r.tokens_per_second,
            "gpus_per_replica": r.gpus_per_replica or spec.model.gpus_per_replica,
        }
    )
    forecast = spec.forecast
    if forecast is not None:
        forecast = forecast.model_copy(
            update={"selector": _matchers(forecast.selector, r.selector)}
        )
    return spec.model_copy(
        update={
            "target": r.target,
            "roles": None,
            "min_replicas": spec.min_replicas if r.min_replicas is None else r.min_replicas,
            "max_replicas": spec.max_replicas if r.max_replicas is None else r.max_replicas,
            "model": model,
            "forecast": forecast,
        }
    )


def fleets(spec: InferencePoolSpec) -> tuple[tuple[Role | None, InferencePoolSpec], ...]:
    """What a pool scales, each as a unified spec: the pool itself, or each role's view."""
    if spec.roles is None:
        return ((None, spec),)
    return tuple((role, role_view(spec, role)) for role in ROLES)


def capacity_model(
    spec: InferencePoolSpec,
    *,
    role: Role | None = None,
    prompt_tokens: float | None = None,
    output_tokens: float | None = None,
    context_tokens: float | None = None,
) -> CapacityModel:
    """The capacity model, on the measured token mix where given, else the spec's means.

    A fixed ``spec.model.contextTokens`` wins over a measured context length. A measured
    context longer than the model's maximum is clamped to it (the engine cannot hold more).
    With ``role`` (``spec`` is then the role's view), the role's model, counting its
    tokens (:func:`prescaler.capacity.role_capacity`).
    """
    model = spec.model
    replica = replica_spec(model)
    if not _measurable(prompt_tokens) or not _measurable(output_tokens):
        prompt_tokens = output_tokens = None  # a garbage measurement is no measurement
    prompt = prompt_tokens if prompt_tokens is not None else model.prompt_tokens
    output = output_tokens if output_tokens is not None else model.output_tokens
    context: int | None = model.context_tokens
    if context is None and _measurable(context_tokens) and context_tokens and context_tokens > 0:
        context = max(1, round(context_tokens))
        if replica is not None:
            context = min(context, replica.model.max_context_tokens)
    headroom = float(_forecast_setting(spec, "headroom"))
    try:
        tokens = TokenProfile(prompt, output, context)
        if (
            replica is not None
            and tokens.planning_context_tokens > replica.model.max_context_tokens
        ):
            raise SpecError(
                f"spec.model.contextTokens: {tokens.planning_context_tokens} exceeds the "
                f"maximum context {replica.model.max_context_tokens} of {replica.model.name}"
            )
        if role is None:
            return CapacityModel(
                tokens=tokens,
                replica=replica,
                tokens_per_second=model.tokens_per_second,
                headroom=headroom,
            )
        if model.tokens_per_second is None:
            raise SpecError(f"spec.roles.{role}.tokensPerSecond is required")
        if replica is not None:
            replica.check_fits(tokens.planning_context_tokens)  # every role loads the model
        return role_capacity(
            role,
            tokens,
            tokens_per_second=model.tokens_per_second,
            replica=replica if role == "decode" else None,
            headroom=headroom,
        )
    except SpecError:
        raise
    except ValueError as exc:
        raise SpecError(f"spec.model: {exc}") from None


def _measurable(value: float | None) -> bool:
    """``None`` (not measured) or a finite number >= 0; NaN, Inf and negatives are not."""
    return value is None or (math.isfinite(value) and value >= 0)


def scaling_policy(spec: InferencePoolSpec) -> ScalingPolicy:
    refit = float(_forecast_setting(spec, "refit_seconds"))
    guard = float(_forecast_setting(spec, "observed_headroom"))
    trend = float(_forecast_setting(spec, "observed_trend_seconds"))
    placeholders = spec.standby.placeholders
    try:
        return ScalingPolicy(
            min_replicas=spec.min_replicas,
            max_replicas=spec.max_replicas,
            lead_margin_seconds=spec.cold_start.margin_seconds,
            observed_headroom=guard,
            observed_trend_seconds=trend,
            # Missing or garbage metrics never cause a scale-down.
            scale_down_requires_observation=True,
            scale_down_mode=spec.scale_down.mode,
            scale_down_stabilization_seconds=spec.scale_down.stabilization_seconds,
            scale_down_max_percent=spec.scale_down.max_percent,
            direction_changes_as_hpa=spec.scale_down.direction_changes == "asHpa",
            scale_up_max_step=spec.scale_up.max_step,
            # A forecast survives one failed refit; after that the plan holds.
            forecast_max_age_seconds=max(900.0, 2.0 * refit + 300.0),
            standby_max_replicas=placeholders.max_replicas if placeholders.enabled else 0,
            mode=spec.mode,
        )
    except ValueError as exc:
        raise SpecError(f"spec: {exc}") from None


def risk_objective(spec: InferencePoolSpec) -> RiskObjective:
    """The peak risk model's objective from ``spec.objective``; the operator and the
    backtest both read it here."""
    o = spec.objective
    return RiskObjective(
        served_fraction=o.served_fraction,
        level=o.start_quantile,
        adapt_rate=o.adapt_rate,
        memory=float(o.memory_lookaheads),
        relative_to_hpa=o.relative_to_hpa,
        relative_floor=o.relative_floor,
        budget_to_hpa=o.budget_to_hpa or None,  # 0: off
        day_seconds=_day_seconds(spec),
    )


def _day_seconds(spec: InferencePoolSpec) -> float:
    """The pool's day: its shortest seasonality period (a day unless the spec says
    otherwise, as a compressed replay does)."""
    periods: list[int] = _forecast_setting(spec, "seasonality_periods")
    return float(min(periods))


def _forecast_setting(spec: InferencePoolSpec, name: str) -> Any:
    """``spec.forecast``'s setting ``name``, or its default where the pool has no
    ``forecast`` (a schedule-only pool, which observes nothing): the default lives in
    :class:`ForecastSpec`, which cannot be built without its Prometheus."""
    if spec.forecast is not None:
        return getattr(spec.forecast, name)
    return ForecastSpec.default_of(name)


def degradation_policy(spec: InferencePoolSpec) -> DegradationPolicy:
    """The degradation thresholds and admission settings of ``spec.degradation`` (the
    operator and the backtest both read them here)."""
    d = spec.degradation
    try:
        return DegradationPolicy(
            queue_warning_per_replica=d.queue.warning_per_replica,
            queue_critical_per_replica=d.queue.critical_per_replica,
            kv_warning=d.kv_cache.warning,
            kv_critical=d.kv_cache.critical,
            ttft_p95_slo_seconds=d.ttft.p95_seconds,
            ttft_p99_slo_seconds=d.ttft.p99_seconds,
            shortfall_warning_fraction=d.forecast_shortfall.warning_percent / 100.0,
            shortfall_critical_fraction=d.forecast_shortfall.critical_percent / 100.0,
            hold_seconds=d.hold_seconds,
            lanes=tuple(d.lanes),
            min_context_tokens=d.min_context_tokens,
            smaller_model_route=d.smaller_model.route if d.smaller_model else None,
            smaller_model_max_prompt_tokens=(
                d.smaller_model.max_prompt_tokens if d.smaller_model else None
            ),
        )
    except ValueError as exc:
        raise SpecError(f"spec.degradation: {exc}") from None


def forecast_service(
    forecast: ForecastSpec,
    *,
    events: Sequence[EventWindow] | EventSource = (),
    horizon_seconds: float | None = None,
    step_seconds: float | None = None,
) -> ForecastService:
    """The forecaster a pool's ``spec.forecast`` asks for: the operator and the backtest
    both build it here, so a default lives only in the spec model.

    ``horizon_seconds`` and ``step_seconds`` override the spec's (the backtest forecasts
    only its lookahead, at the trace's own resolution). ``events``: the scheduled windows'
    occurrences, or a calendar every fit asks for them (the operator's long-lived series).
    """
    try:
        return ForecastService(
            model=forecast.model,
            horizon_seconds=float(horizon_seconds or forecast.horizon_seconds),
            step_seconds=float(step_seconds or forecast.step_seconds),
            quantile=forecast.quantile,
            refit_seconds=forecast.refit_seconds,
            lookback_seconds=forecast.lookback_seconds,
            events=events if callable(events) else tuple(events),
            seasonality_periods=tuple(float(p) for p in forecast.seasonality_periods),
        )
    except ValueError as exc:
        raise SpecError(f"spec.forecast: {exc}") from None


def parse_moment(text: str, field: str) -> datetime:
    """An ISO 8601 date-time (a trailing ``Z`` is accepted), naive or with an offset."""
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise SpecError(f"{field}: {text!r} is not an ISO 8601 date-time") from None


def scheduled_window(window: WindowSpec, index: int) -> ScheduledWindow:
    where = f"spec.schedules[{index}]"
    start = parse_moment(window.start, f"{where}.start") if window.start is not None else None
    end = parse_moment(window.end, f"{where}.end") if window.end is not None else None
    try:
        return ScheduledWindow(
            name=window.name,
            lead_seconds=window.lead_seconds,
            min_replicas=window.min_replicas,
            expected_requests_per_second=window.expected_requests_per_second,
            timezone=window.time_zone,
            start=start,
            end=end,
            cron=window.cron,
            duration_seconds=window.duration_seconds,
        )
    except (ValueError, TypeError) as exc:
        raise SpecError(f"{where}: {exc}") from None


def scheduled_windows(spec: InferencePoolSpec) -> tuple[ScheduledWindow, ...]:
    return tuple(scheduled_window(w, i) for i, w in enumerate(spec.schedules))


def _check_roles(spec: InferencePoolSpec) -> None:
    """The schema's rules for a disaggregated pool, for specs that did not come through
    the API server (its CEL rules say the same)."""
    if (spec.target is None) == (spec.roles is None):
        raise SpecError("spec: give exactly one of target and roles")
    if spec.roles is None:
        assert spec.target is not None
        for mode, kind in (
            ("hpaFloor", "HorizontalPodAutoscaler"),
            ("kedaTrigger", "ScaledObject"),
        ):
            if (spec.mode == mode) != (spec.target.kind == kind):
                raise SpecError(f"spec: mode {mode} goes with a {kind} target, and only with it")
        return
    standby = spec.standby
    unified_only = [
        (f"mode {spec.mode}", spec.mode != "replicas"),
        ("model.tokensPerSecond", spec.model.tokens_per_second is not None),
        ("standby.hot", standby.hot.replicas > 0),
        ("standby.placeholders", standby.placeholders.enabled),
        ("standby.imagePrePull", standby.image_pre_pull.enabled),
        ("prewarm", spec.prewarm is not None),
        ("windows with minReplicas", any(w.min_replicas is not None for w in spec.schedules)),
    ]
    found = [name for name, present in unified_only if present]
    if found:
        raise SpecError(
            f"spec.roles: {', '.join(found)} are for unified pools, not disaggregated ones"
        )
    if spec.roles.prefill.target == spec.roles.decode.target:
        raise SpecError("spec.roles: prefill and decode need targets of their own")


def check_spec(spec: InferencePoolSpec) -> None:
    """Raise :class:`SpecError` for anything the planner's domain objects would refuse."""
    _check_roles(spec)
    for role, view in fleets(spec):
        where = f"spec.roles.{role}: " if role is not None else ""
        try:
            capacity_model(view, role=role)
            scaling_policy(view)
        except SpecError as exc:
            raise SpecError(f"{where}{exc}") from None
    scheduled_windows(spec)
