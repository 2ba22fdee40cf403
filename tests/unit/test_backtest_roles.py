"""The disaggregated backtest: each role replayed on its own tokens, scored as one fleet, and
compared with the unified replica that time-shares both roles."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pytest

from prescaler.api import parse_spec, role_view, scaling_policy
from prescaler.backtest import (
    BacktestResult,
    Demand,
    DisaggregatedResult,
    FleetConfig,
    Observation,
    PredictivePolicy,
    ScheduleOnlyPolicy,
    demand_from_trace,
    role_demand,
    run_backtest,
    time_shared_tokens_per_second,
)
from prescaler.backtest.traces import Trace
from prescaler.capacity import ROLES, CapacityModel, Role, TokenProfile, role_capacity
from prescaler.cli import backtest as cli_backtest
from prescaler.cli import main
from prescaler.cli._disaggregated import role_tokens_per_second, roles_spec
from prescaler.planning import ScalePlan, ScalingPolicy, ScheduledWindow
from unit.fake_forecasts import flat

START = 1_700_000_040.0  # a whole minute


def _trace() -> Trace:
    return Trace(
        start=START,
        step_seconds=60.0,
        rps=np.array([2.0, np.nan, 4.0, 1.0]),
        prompt_tokens=np.array([1000.0, np.nan, 500.0, 2000.0]),
        output_tokens=np.array([100.0, np.nan, 300.0, 10.0]),
    )


# --------------------------------------------------------------------------- demand


def test_role_demands_split_the_unified_demand_into_each_roles_tokens() -> None:
    trace = _trace()
    unified = demand_from_trace(trace)
    prefill, decode = role_demand(trace, "prefill"), role_demand(trace, "decode")
    np.testing.assert_allclose(prefill.tokens_per_s, [2000, 2000, 2000, 2000])
    # The gap is interpolated for the truth in each role's own tokens, as it is in the sum.
    np.testing.assert_allclose(decode.tokens_per_s, [200, 700, 1200, 10])
    np.testing.assert_allclose(prefill.tokens_per_s + decode.tokens_per_s, unified.tokens_per_s)
    # Observed in the role's own tokens (a role's "request" is one token), NaN in the gap.
    assert prefill.tokens_per_request == decode.tokens_per_request == 1
    np.testing.assert_array_equal(decode.observed_requests_per_s[[0, 2, 3]], [200, 1200, 10])
    assert np.isnan(decode.observed_requests_per_s[1])
    assert prefill.start == unified.start


def test_a_role_demand_needs_per_request_token_lengths() -> None:
    trace = Trace(start=START, step_seconds=60.0, rps=np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="token lengths"):
        role_demand(trace, "decode")


# --------------------------------------------------------------------------- unified replica


def test_the_unified_replica_time_shares_the_roles_work() -> None:
    mix = TokenProfile(1000.0, 500.0)
    # A request costs 1000/20000 + 500/2500 = 0.25 s: 1500 tokens per 0.25 s.
    assert time_shared_tokens_per_second(mix, prefill=20_000, decode=2_500) == pytest.approx(6000)
    # Equal throughputs: the unified model's own (it costs every token alike).
    assert time_shared_tokens_per_second(mix, prefill=7_000, decode=7_000) == pytest.approx(7000)
    with pytest.raises(ValueError, match="> 0"):
        time_shared_tokens_per_second(mix, prefill=0, decode=1)


def test_on_compute_alone_the_unified_replica_needs_what_both_roles_need() -> None:
    mix = TokenProfile(1200.0, 300.0)
    unified = CapacityModel(
        mix, tokens_per_second=time_shared_tokens_per_second(mix, prefill=16_000, decode=3_000)
    )
    prefill = role_capacity("prefill", mix, tokens_per_second=16_000)
    decode = role_capacity("decode", mix, tokens_per_second=3_000)
    rps = 37.0
    roles = prefill.required(rps * 1200).exact + decode.required(rps * 300).exact
    assert unified.required(rps).exact == pytest.approx(roles)


# --------------------------------------------------------------------------- policies


@dataclass
class _Fixed:
    """Always the same replica count."""

    replicas: int
    name: str = "fixed"
    interval_seconds: float = 15.0

    def decide(self, obs: Observation) -> int:
        return self.replicas


def _role_demand(tokens: list[float]) -> Demand:
    values = np.asarray(tokens, dtype=float)
    return Demand(START, values, values.copy(), prompt_tokens=1.0, output_tokens=0.0)


def test_both_roles_score_as_one_fleet() -> None:
    prefill = _role_demand([1500, 500, 500, 500])
    decode = _role_demand([250, 50, 250, 50])
    results: dict[Role, BacktestResult] = {}
    capacities: dict[Role, CapacityModel] = {}
    roles: tuple[tuple[Role, Demand, float, int], ...] = (
        ("prefill", prefill, 1000.0, 1),
        ("decode", decode, 100.0, 2),
    )
    for role, demand, cap, replicas in roles:
        config = FleetConfig(cap, cold_start_seconds=0, max_replicas=10, gpus_per_replica=2)
        results[role] = run_backtest(demand, [_Fixed(replicas)], config)
        capacities[role] = role_capacity(role, TokenProfile(1, 1), tokens_per_second=cap)
    combined = DisaggregatedResult(results, capacities).scores()["fixed"]
    # Minutes 0 (both roles) and 2 (decode): a minute short in both counts once.
    assert combined.shortfall_minutes == 2
    assert sum(r.scores["fixed"].shortfall_minutes for r in results.values()) == 3
    # The FIFO queue, per 15 s step. Prefill: 22500 tokens arrive per step of minute 0 and
    # 15000 are served, the queue first; its 30000 backlog then delays three of minute 1's
    # steps. Decode: 3750 arrive per step of minutes 0 and 2 and 3000 are served; each
    # backlog delays one step of the next minute.
    prefill_late = (7_500 + 15_000 + 22_500 + 22_500) + 3 * 7_500
    decode_late = 2 * ((750 + 1_500 + 2_250 + 3_000) + 750)
    total = (1500 + 3 * 500) * 60 + (250 + 50 + 250 + 50) * 60
    assert combined.unserved_token_fraction == pytest.approx((prefill_late + decode_late) / total)
    # Replicas x GPUs x hours, both roles: (1 + 2) x 2 GPUs x 4 minutes.
    assert combined.gpu_hours == pytest.approx(3 * 2 * 4 / 60)


def test_both_roles_must_replay_the_same_minutes() -> None:
    config = FleetConfig(1000.0, cold_start_seconds=0)
    results: dict[Role, BacktestResult] = {
        "prefill": run_backtest(_role_demand([1, 2, 3]), [_Fixed(1)], config),
        "decode": run_backtest(_role_demand([1, 2]), [_Fixed(1)], config),
    }
    capacity = role_capacity("prefill", TokenProfile(1, 1), tokens_per_second=1000)
    with pytest.raises(ValueError, match="different minutes"):
        DisaggregatedResult(results, dict.fromkeys(ROLES, capacity))


def test_a_role_hands_the_planner_its_queue_as_requests_of_its_own_tokens() -> None:
    """Decode counts output tokens; its engines count waiting *requests* (100 output tokens
    each here), which the planner turns back into output tokens/s to drain."""
    capacity = role_capacity("decode", TokenProfile(1000.0, 100.0), tokens_per_second=1000)
    plans: list[ScalePlan] = []

    class _Flat:
        def forecast(self, history: pd.Series, now: float) -> Any:
            return flat(1000.0, now)

    policy = PredictivePolicy(
        forecaster=_Flat(),
        capacity=capacity,
        policy=ScalingPolicy(min_replicas=1, max_replicas=2000, lead_margin_seconds=60),
        cold_start_seconds=240,
        interval=60.0,
        on_plan=plans.append,
    )
    observed = pd.Series(
        [1000.0] * 5, index=pd.to_datetime(START + 60.0 * np.arange(5), unit="s", utc=True)
    )
    desired = policy.decide(
        Observation(
            now=START + 330.0,
            step=22,
            ready=1,
            existing=1,
            metric_tokens_per_s=1000.0,
            observed=observed,
            visible_minutes=5,
            queue_tokens=3_000_000.0,
        )
    )
    # 1000 output tok/s arriving + 30000 requests x 100 tokens drained over the 360 s
    # lookahead (cold start, margin, and the minute to the next decision) = 9333 output
    # tok/s: 10 replicas of 1000.
    assert "30000 waiting" in plans[0].reason
    assert desired == 10


def test_schedule_only_sizes_a_window_on_the_roles_tokens() -> None:
    capacity = role_capacity("prefill", TokenProfile(1000.0, 100.0), tokens_per_second=1000)
    window = ScheduledWindow(
        name="launch", lead_seconds=0, expected_requests_per_second=10, cron="0 * * * *",
        duration_seconds=3600,
    )  # fmt: skip
    policy = ScheduleOnlyPolicy([window], capacity, min_replicas=1, max_replicas=100)
    obs = Observation(START + 30, 2, 1, 1, 0.0, pd.Series(dtype=float))
    # 10 requests/s x 1000 prompt tokens = 10000 prompt tok/s: 10 prefill replicas.
    assert policy.decide(obs) == 10


# --------------------------------------------------------------------------- the CLI


BASE = ["--trace", "x.csv", "--format", "azure", "--cold-start-seconds", "240"]


def _args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli_backtest.register(parser.add_subparsers())
    return parser.parse_args(["backtest", *BASE, "--disaggregated", *extra])


def test_role_throughputs_default_to_the_unified_replicas() -> None:
    assert role_tokens_per_second(_args("--replica-tokens-per-second", "9000")) == {
        "prefill": 9000,
        "decode": 9000,
    }
    both = _args(
        "--prefill-replica-tokens-per-second", "20000", "--decode-replica-tokens-per-second", "900"
    )
    assert role_tokens_per_second(both) == {"prefill": 20000, "decode": 900}


@dataclass(frozen=True)
class _Fleet:
    """What :func:`roles_spec` reads of a prepared role."""

    config: FleetConfig
    capacity: CapacityModel


def test_each_roles_predictive_policy_is_the_role_view_of_a_pool_that_sets_nothing() -> None:
    mix = TokenProfile(1000.0, 100.0)
    fleets: dict[Role, Any] = {
        "prefill": _Fleet(
            FleetConfig(20_000, 240, max_replicas=12),
            role_capacity("prefill", mix, tokens_per_second=20_000),
        ),
        "decode": _Fleet(
            FleetConfig(2_500, 240, max_replicas=30),
            role_capacity("decode", mix, tokens_per_second=2_500),
        ),
    }
    ours = roles_spec(_args("--replica-tokens-per-second", "20000"), fleets)
    operator = parse_spec(
        {
            "roles": {
                role: {
                    "target": {"name": f"llm-{role}"},
                    "tokensPerSecond": tps,
                    "minReplicas": 1,
                    "maxReplicas": top,
                }
                for role, tps, top in (("prefill", 20_000, 12), ("decode", 2_500, 30))
            },
            "maxReplicas": 30,
            "model": {},
            "forecast": {"prometheus": {"url": "http://prometheus:9090"}},
        }
    )
    for role in ROLES:
        assert scaling_policy(role_view(ours, role)) == scaling_policy(role_view(operator, role))
        ours_forecast, theirs = role_view(ours, role).forecast, role_view(operator, role).forecast
        assert ours_forecast is not None
        assert theirs is not None
        assert ours_forecast.model_dump(exclude={"prometheus"}) == theirs.model_dump(
            exclude={"prometheus"}
        )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--format", "servegen"], "per-request token columns"),
        (["--format", "azure"], "--prefill-replica-tokens-per-second"),
        (
            ["--format", "azure", "--replica-tokens-per-second", "1",
             "--standby-max-replicas", "2"],
            "warm standby",
        ),
        (
            ["--format", "requests", "--replica-tokens-per-second", "1",
             "--window", "name=w,cron=0 9 * * *,duration=60,replicas=3"],
            "rps=",
        ),
    ],
)  # fmt: skip
def test_what_a_disaggregated_replay_cannot_do_is_refused_before_the_trace_is_read(
    capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    argv = ["backtest", "--trace", "missing.csv", "--cold-start-seconds", "240", "--disaggregated"]
    assert main([*argv, *extra]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "no such file" not in err
