"""One fact, one place: the backtest's predictive policy runs the InferencePool spec's defaults.

The CLI must not carry its own copy of a default. These tests build the policy the way
``prescaler backtest`` does with no policy flag given, and compare it with what the
operator builds from a pool that sets nothing.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import pytest

from prescaler.api import (
    ForecastSpec,
    InferencePoolSpec,
    capacity_model,
    degradation_policy,
    forecast_service,
    risk_objective,
    scaling_policy,
)
from prescaler.backtest import FleetConfig
from prescaler.cli import backtest as cli_backtest
from prescaler.planning import ScalingPolicy
from prescaler.settings import ReconcileSettings

BASE = ["--trace", "x.csv", "--format", "nab", "--cold-start-seconds", "240"]


def _args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli_backtest.register(parser.add_subparsers())
    return parser.parse_args(["backtest", *BASE, *extra])


def _operator_pool(**fields: object) -> InferencePoolSpec:
    raw = {
        "target": {"name": "x"},
        "minReplicas": 1,
        "maxReplicas": 80,
        "model": {"tokensPerSecond": 20000},
        "forecast": {"prometheus": {"url": "http://p:9090"}},
        **fields,
    }
    return InferencePoolSpec.model_validate(raw)


CONFIG = FleetConfig(replica_tokens_per_second=20000, cold_start_seconds=240, max_replicas=80)


def test_backtest_without_policy_flags_runs_the_operators_policy() -> None:
    spec = cli_backtest.pool_spec(_args(), CONFIG)
    assert scaling_policy(spec) == scaling_policy(_operator_pool())


def test_backtest_forecaster_and_headroom_are_the_specs() -> None:
    spec = cli_backtest.pool_spec(_args(), CONFIG)
    assert spec.forecast is not None
    pool = _operator_pool()
    assert pool.forecast is not None
    ours, theirs = forecast_service(spec.forecast), forecast_service(pool.forecast)
    assert (ours.model, ours.spec.quantile, ours.refit_seconds) == (
        theirs.model,
        theirs.spec.quantile,
        theirs.refit_seconds,
    )
    assert capacity_model(spec).headroom == capacity_model(pool).headroom


def test_no_policy_flag_carries_a_default_of_its_own() -> None:
    args = _args()
    for flag in (
        "forecast_model",
        "quantile",
        "refit_minutes",
        "lead_margin_seconds",
        "observed_headroom",
        "observed_trend_seconds",
        "scale_down_stabilization_seconds",
        "scale_down_max_percent",
        "scale_down_mode",
        "headroom",
    ):
        assert getattr(args, flag) is None, flag
    # The operator never scales down in a metrics gap, and decides every reconcile period.
    assert args.scale_down_requires_observation is True
    assert args.decision_seconds == ReconcileSettings().interval_seconds


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--observed-headroom", "1.7"], {"observed_headroom": 1.7}),
        (["--observed-trend-seconds", "0"], {"observed_trend_seconds": 0.0}),
        (["--lead-margin-seconds", "90"], {"lead_margin_seconds": 90.0}),
        (["--scale-down-max-percent", "20"], {"scale_down_max_percent": 20.0}),
    ],
)
def test_a_flag_overrides_exactly_its_field(flags: list[str], expected: dict[str, float]) -> None:
    spec = cli_backtest.pool_spec(_args(*flags), CONFIG)
    assert scaling_policy(spec) == replace(scaling_policy(_operator_pool()), **expected)


def test_backtest_assesses_degradation_at_the_specs_thresholds() -> None:
    args = _args()
    prep = cli_backtest.Prepared(
        trace=None,
        demand=None,
        capacity=capacity_model(_operator_pool()),
        config=CONFIG,
        windows=[],
        spans=[],
        standby_max=0,
    )
    setup = cli_backtest.degradation_setup(args, prep)
    assert setup.policy == degradation_policy(_operator_pool())
    # Assessed at every decision of the predictive policy: the operator's reconcile period.
    assert setup.every_seconds == ReconcileSettings().interval_seconds


def _forecast_args(*extra: str) -> argparse.Namespace:
    from prescaler.cli import forecast as cli_forecast

    parser = argparse.ArgumentParser()
    cli_forecast.register(parser.add_subparsers())
    base = [
        "forecast",
        "--trace",
        "x.csv",
        "--format",
        "rate",
        "--at",
        "0",
        "--horizon-minutes",
        "5",
    ]
    return parser.parse_args([*base, *extra])


def test_the_forecast_commands_seasonal_periods_are_the_specs() -> None:
    spec = ForecastSpec.model_validate({"prometheus": {"url": "http://p:9090"}})
    assert _forecast_args().seasonality_periods == spec.seasonality_periods
    assert _forecast_args("--seasonality-periods", "14400").seasonality_periods == [14400]
    # Checked as the spec checks it: a period under a minute, or none, is refused.
    for bad in ("30", "", "day"):
        with pytest.raises(SystemExit):
            _forecast_args("--seasonality-periods", bad)


def test_the_budget_flag_sets_a_share_or_turns_it_off() -> None:
    assert cli_backtest.pool_spec(_args(), CONFIG).objective.budget_to_hpa == (
        _operator_pool().objective.budget_to_hpa
    )
    assert (
        cli_backtest.pool_spec(_args("--budget-to-hpa", "0.8"), CONFIG).objective.budget_to_hpa
        == 0.8
    )
    off = cli_backtest.pool_spec(_args("--budget-to-hpa", "0"), CONFIG)
    assert off.objective.budget_to_hpa == 0
    with pytest.raises(SystemExit):
        _args("--budget-to-hpa", "-1")


def test_the_operators_policy_has_the_specs_defaults_not_the_bare_planners() -> None:
    """``ScalingPolicy``'s own field defaults are the bare planner's; where they differ
    from the spec's, a pool that sets nothing still plans with the spec's."""
    pool = _operator_pool()
    assert pool.forecast is not None
    specs = (
        float(pool.scale_down.stabilization_seconds),
        pool.scale_down.mode,
        float(pool.forecast.observed_trend_seconds),
    )
    policy = scaling_policy(pool)
    bare = ScalingPolicy()
    fields = ("scale_down_stabilization_seconds", "scale_down_mode", "observed_trend_seconds")
    assert tuple(getattr(policy, f) for f in fields) == specs
    assert all(getattr(bare, f) != s for f, s in zip(fields, specs, strict=True))


def test_a_schedule_only_pool_reads_the_forecast_defaults_from_the_spec() -> None:
    """A pool without ``forecast`` (schedules and bounds only) gets the settings that
    ``ForecastSpec`` defaults to, the same as a pool whose ``forecast`` sets none of them;
    ``ForecastSpec`` itself cannot be built without its Prometheus."""
    schedule_only = _operator_pool(forecast=None)
    assert schedule_only.forecast is None
    with_forecast = _operator_pool()
    assert scaling_policy(schedule_only) == scaling_policy(with_forecast)
    assert risk_objective(schedule_only) == risk_objective(with_forecast)
    assert capacity_model(schedule_only) == capacity_model(with_forecast)
