"""``prescaler backtest``'s flags as the library's inputs: the pool's spec and the replay's
options, shared by the trace replay, the Prometheus replay and the disaggregated roles."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from prescaler.api import InferencePoolSpec
from prescaler.cli._common import CliError


@dataclass(frozen=True)
class Prepared:
    """A demand turned into the simulation's inputs, as ``run`` uses them (and benchmarks
    that replay one trace under many policies)."""

    trace: Any
    demand: Any
    capacity: Any
    config: Any
    windows: list[Any]
    spans: list[Any]
    standby_max: int
    demand_scale: float = 1.0
    """The factor ``--scale-to-peak-replicas`` multiplied the trace's demand by."""


def pool_spec(args: argparse.Namespace, config: Any) -> InferencePoolSpec:
    """The InferencePool a user would apply for this fleet, with only the flags given set:
    every other knob is the spec model's default, exactly as the operator would run it."""
    return parsed_spec(pool_raw(args, config))


def parsed_spec(raw: dict[str, Any]) -> InferencePoolSpec:
    from prescaler.api import SpecError, parse_spec

    try:
        return parse_spec(raw)
    except SpecError as exc:
        raise CliError(str(exc)) from None


def pool_raw(args: argparse.Namespace, config: Any) -> dict[str, Any]:
    """:func:`pool_spec` as the wire dict, before it is parsed."""
    raw: dict[str, Any] = {
        "target": {"kind": "Deployment", "name": "backtest"},
        "minReplicas": config.min_replicas,
        "maxReplicas": config.max_replicas,
        "model": {"tokensPerSecond": config.replica_tokens_per_second},
        "coldStart": {"mode": "fixed", "seconds": min(7200, round(args.cold_start_seconds))},
        "forecast": {"prometheus": {"url": "http://backtest.invalid"}},
    }
    return with_policy_flags(raw, args)


def with_policy_flags(raw: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """``raw`` (a pool's spec on the wire) with each policy flag given set on its field;
    the fields no flag names keep their values."""
    forecast: dict[str, Any] = raw.setdefault("forecast", {})
    for flag, wire in (
        ("forecast_model", "model"),
        ("quantile", "quantile"),
        ("observed_headroom", "observedHeadroom"),
        ("observed_trend_seconds", "observedTrendSeconds"),
        ("headroom", "headroom"),
    ):
        if getattr(args, flag, None) is not None:
            forecast[wire] = getattr(args, flag)
    if args.refit_minutes is not None:
        forecast["refitSeconds"] = max(10, round(args.refit_minutes * 60.0))
    objective: dict[str, Any] = {}
    for flag, wire in (
        ("served_fraction", "servedFraction"),
        ("relative_to_hpa", "relativeToHpa"),
        ("relative_floor", "relativeFloor"),
        ("budget_to_hpa", "budgetToHpa"),
        ("adapt_rate", "adaptRate"),
    ):
        if getattr(args, flag, None) is not None:
            objective[wire] = getattr(args, flag)
    if objective:
        raw["objective"] = {**(raw.get("objective") or {}), **objective}
    if args.lead_margin_seconds is not None:
        raw.setdefault("coldStart", {})["marginSeconds"] = args.lead_margin_seconds
    if getattr(args, "policy", None) is not None:
        raw["policy"] = args.policy
    scale_down: dict[str, Any] = {}
    if args.scale_down_stabilization_seconds is not None:
        scale_down["stabilizationSeconds"] = args.scale_down_stabilization_seconds
    if args.scale_down_max_percent is not None:
        scale_down["maxPercent"] = args.scale_down_max_percent
    if args.scale_down_mode is not None:
        scale_down["mode"] = args.scale_down_mode
    if getattr(args, "direction_changes", None) is not None:
        scale_down["directionChanges"] = args.direction_changes
    if scale_down:
        raw["scaleDown"] = {**(raw.get("scaleDown") or {}), **scale_down}
    standby_max = getattr(args, "standby_max_replicas", None)
    if standby_max is not None:
        placeholders: dict[str, Any] = {"enabled": standby_max > 0}
        if standby_max > 0:
            placeholders["maxReplicas"] = standby_max
        raw["standby"] = {
            **(raw.get("standby") or {}),
            "imagePrePull": {"enabled": standby_max > 0},
            "placeholders": placeholders,
        }
    return raw


def replay_options(
    args: argparse.Namespace, *, windows: list[Any] | None, forecast_step: float
) -> Any:
    """The replay's knobs from the flags (:class:`prescaler.backtest.ReplayOptions`);
    ``windows`` ``None``: the spec's schedules."""
    from prescaler.backtest import HPA_TARGET, ReplayOptions

    return ReplayOptions(
        decision_seconds=args.decision_seconds,
        forecast_step_seconds=forecast_step,
        history_seconds=None if args.history_days is None else args.history_days * 86400.0,
        scale_down_requires_observation=args.scale_down_requires_observation,
        windows=None if windows is None else tuple(windows),
        hpa_target=args.hpa_target if args.hpa_target is not None else HPA_TARGET,
        persistence_k=args.persistence_k,
        smoothed_oracle_k=args.smoothed_oracle_k,
        smoothed_window_minutes=args.smoothed_window_minutes,
    )


def key_values(spec: str, flag: str, known: set[str]) -> dict[str, str]:
    """``key=value,key=value`` as a dict, refused (naming ``flag``) with another shape or
    a key not ``known``."""
    fields: dict[str, str] = {}
    for part in spec.split(","):
        if "=" not in part:
            raise CliError(f"{flag}: expected key=value pairs, got {part!r}")
        key, value = part.split("=", 1)
        fields[key.strip()] = value.strip()
    unknown = set(fields) - known
    if unknown:
        raise CliError(f"{flag}: unknown key(s) {', '.join(sorted(unknown))}")
    return fields


def _parse_span(spec: str) -> tuple[str, float, float]:
    """``name=...,start=ISO,end=ISO`` -> (name, start, end) in unix seconds (naive = UTC)."""
    import pandas as pd

    fields = key_values(spec, "--score-span", {"name", "start", "end"})
    if "start" not in fields or "end" not in fields:
        raise CliError("--score-span: needs start= and end=")
    try:
        bounds = [pd.Timestamp(fields[k]) for k in ("start", "end")]
    except ValueError as exc:
        raise CliError(f"--score-span: {exc}") from None
    start, end = (b.tz_localize("UTC") if b.tzinfo is None else b for b in bounds)
    if not end > start:
        raise CliError("--score-span: end must be after start")
    return fields.get("name", f"span{start.isoformat()}"), start.timestamp(), end.timestamp()


def _with_standby(args: argparse.Namespace, config: Any) -> Any:
    """The fleet with warm standby simulated: replicas on a warm slot start faster."""
    from prescaler.backtest import with_standby

    warm = args.warm_start_seconds
    if warm is not None and warm > config.cold_start_seconds:
        raise CliError("--warm-start-seconds must be at most --cold-start-seconds")
    try:
        return with_standby(
            config, warm_start_seconds=warm, cost_fraction=args.standby_cost_fraction
        )
    except ValueError as exc:
        raise CliError(str(exc)) from None
