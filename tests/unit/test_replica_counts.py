"""Replica counts at a whole-replica boundary, with the float noise of measured rates.

Prometheus gives a pool's rates as sums over its pods, and tokens per request as a rate of
tokens over a rate of requests. Thirty pods at 0.1 requests/s of 1,000 tokens sum to
3.0000000000000013 requests/s, so 1,000 tokens per request comes out 999.9999999999995
(ten pods: 1000.0000000000002), and the demand built on it lands a hair off a whole
replica. A demand exactly at a replica boundary must still get the exact count: from the
planner, from the backtest's oracle, and in its shortfall count.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from prescaler.backtest import (
    Demand,
    FleetConfig,
    OraclePolicy,
    demand_from_trace,
    oracle_replicas,
    replicas_needed,
    score,
    short_of,
    simulate,
)
from prescaler.backtest.traces import Trace
from prescaler.capacity import (
    GIB,
    TOLERANCE,
    CapacityModel,
    ModelArchitecture,
    ReplicaSpec,
    TokenProfile,
    covers,
    replicas_for,
)
from prescaler.planning import FleetState, PlanInputs, ScalingPolicy, forecast_shortfall, plan
from prescaler.sources import DemandHistory
from unit.fake_forecasts import Forecast, Point

START = 1_700_000_000.0


def _history(pods: list[int]) -> DemandHistory:
    """Per minute, ``pods[i]`` pods each serving 0.1 requests/s of 600 prompt and 400 output
    tokens; the pool's rates are sums over its pods, as a PromQL ``sum`` adds them."""
    return DemandHistory(
        start=START,
        step_seconds=60.0,
        requests_per_second=np.array([sum([0.1] * n) for n in pods]),
        prompt_tokens_per_second=np.array([sum([60.0] * n) for n in pods]),
        output_tokens_per_second=np.array([sum([40.0] * n) for n in pods]),
    )


def _measured(pods: list[int]) -> Demand:
    """The demand the Prometheus path replays: the history's token mix per minute."""
    history = _history(pods)
    prompt, output = history.tokens_per_request()
    trace = Trace(
        start=START,
        step_seconds=60.0,
        rps=history.requests_per_second,
        prompt_tokens=prompt,
        output_tokens=output,
    )
    return demand_from_trace(trace)


def _exact(pods: list[int]) -> Demand:
    """The same series as a trace holds it: exactly 1,000 tokens per request."""
    rps = np.array([n / 10 for n in pods])
    return demand_from_trace(Trace(START, 60.0, rps), prompt_tokens=600.0, output_tokens=400.0)


def test_tokens_per_request_measured_from_summed_rates_is_off_by_float_noise() -> None:
    prompt, output = _history([30, 10]).tokens_per_request()
    assert [float(t) for t in prompt + output] == [999.9999999999995, 1000.0000000000002]


# --------------------------------------------------------------------------- backtest

# 3, 1, 5 and 2 replicas of 1,000 tokens/s exactly; measured, the 10- and 50-pod minutes
# come out 1000.0000000000001 and 5000.000000000001 tokens/s.
PODS = [30, 10, 50, 20]
EXACT = [3, 1, 5, 2]


def _config(demand: Demand) -> tuple[FleetConfig, float]:
    capacity = CapacityModel(
        TokenProfile(demand.prompt_tokens, demand.output_tokens), tokens_per_second=1000.0
    )
    cap = capacity.replica_tokens_per_second
    return FleetConfig(replica_tokens_per_second=cap, cold_start_seconds=60.0), cap


def _oracle(demand: Demand, config: FleetConfig, cap: float) -> OraclePolicy:
    per_step = np.repeat(demand.tokens_per_s, config.steps_per_minute)
    need = oracle_replicas(per_step, cap, config.lag_steps, 0, config.max_replicas)
    return OraclePolicy(need, config.step_seconds)


def test_measured_demand_at_a_boundary_needs_the_exact_count() -> None:
    demand = _measured(PODS)
    _, cap = _config(demand)
    assert not np.array_equal(demand.tokens_per_s, np.array(PODS) * 100.0)  # the noise
    np.testing.assert_array_equal(replicas_needed(demand.tokens_per_s, cap), EXACT)
    per_step = np.repeat(demand.tokens_per_s, 4)
    np.testing.assert_array_equal(oracle_replicas(per_step, cap, 0, 0, 10), np.repeat(EXACT, 4))
    assert not short_of(np.array(EXACT), demand.tokens_per_s, cap).any()
    assert short_of(np.array(EXACT) - 1, demand.tokens_per_s, cap).all()


def test_oracle_and_shortfall_on_measured_demand_match_the_trace_backtest() -> None:
    """The same series replayed from a trace and from Prometheus: the oracle costs the same,
    and the trace's oracle fleet is not short of the measured demand."""
    exact, measured = _exact(PODS), _measured(PODS)
    exact_config, exact_cap = _config(exact)
    config, cap = _config(measured)
    truth = simulate(exact, _oracle(exact, exact_config, exact_cap), exact_config)
    run = simulate(measured, _oracle(measured, config, cap), config)
    assert score(run, measured, config).gpu_hours == score(truth, exact, exact_config).gpu_hours
    np.testing.assert_array_equal(run.existing_per_step, truth.existing_per_step)
    assert score(truth, measured, config).shortfall_minutes == 0
    assert score(run, measured, config).shortfall_minutes == 0


# --------------------------------------------------------------------------- planner


def _plan(capacity: CapacityModel, observed: float) -> int:
    return plan(
        PlanInputs(
            now=START,
            capacity=capacity,
            fleet=FleetState(1, 1, observed_requests_per_second=observed),
            policy=ScalingPolicy(min_replicas=0, max_replicas=1000),
            cold_start_seconds=240.0,
            forecast=None,
        )
    ).desired_replicas


def test_planner_gives_the_exact_count_on_a_measured_token_mix() -> None:
    """800 requests/s of 1,000 tokens at 20,000 tokens/s per replica is 40 replicas, on
    either side of the noise."""
    for pods in (30, 10):
        prompt, output = _history([pods]).tokens_per_request()
        capacity = CapacityModel(
            TokenProfile(float(prompt[0]), float(output[0])), tokens_per_second=20_000.0
        )
        assert _plan(capacity, 800.0) == 40


def test_planner_memory_limit_on_a_measured_token_mix_is_the_exact_count() -> None:
    """With no context length given, the planning context is the mean tokens per request
    rounded up: measured 1000.0000000000002 must be 1,000 tokens, not 1,001, or a replica
    whose KV cache holds exactly 100 such requests holds 99, and a demand of exactly four
    replicas' worth asks for five."""
    prompt, output = _history([10]).tokens_per_request()
    assert float(prompt[0] + output[0]) > 1000.0
    kv_cache = 100 * 1000 * 4  # 100 requests of 1,000 tokens at 4 bytes per token
    model = ModelArchitecture(
        "tiny", layers=1, kv_heads=1, head_dim=1, parameters=1.0, max_context_tokens=4096,
        weight_bytes_override=GIB - kv_cache,
    )  # fmt: skip
    replica = ReplicaSpec(
        model, gpu_memory_gib=1.0, gpus_per_replica=1, tokens_per_second=20_000.0,
        memory_utilization=1.0, overhead_gib_per_gpu=0.0,
        decode_tokens_per_second_per_request=40.0,
    )  # fmt: skip
    capacity = CapacityModel(TokenProfile(float(prompt[0]), float(output[0])), replica)
    assert capacity.tokens.planning_context_tokens == 1000
    assert capacity.binding_constraint == "memory"
    latency = 600 / 20_000 + 400 / 40  # one request of the exact mix, seconds
    assert _plan(capacity, 4 * 100 / latency) == 4


def test_forecast_shortfall_at_a_boundary_on_a_measured_token_mix_is_none() -> None:
    """Four replicas of 1,000 tokens/s and a forecast of exactly 4 requests/s of 1,000
    tokens: no shortfall, though the measured mix makes the demand 4000.000000000001."""
    prompt, output = _history([10]).tokens_per_request()
    capacity = CapacityModel(
        TokenProfile(float(prompt[0]), float(output[0])), tokens_per_second=1000.0
    )
    forecast = Forecast(tuple(Point(START + 60.0 * (i + 1), 4.0, 4.0) for i in range(10)), START)
    short = forecast_shortfall(START, capacity, forecast, 4, (), 300.0)
    assert short is not None
    assert (short.tokens_per_second, short.fraction) == (0.0, 0.0)


# --------------------------------------------------------------------------- the helper


def test_replicas_for_at_and_around_a_boundary() -> None:
    assert replicas_for(800_000.0, 20_000.0) == 40
    assert replicas_for(800_000.0, 19_999.999999999996) == 40
    assert replicas_for(800_000.0000000001, 20_000.0) == 40
    assert replicas_for(800_000.0 * (1 + 1e-8), 20_000.0) == 41  # more than noise
    assert replicas_for(799_999.9, 20_000.0) == 40
    assert replicas_for(0.0, 20_000.0) == 0
    assert replicas_for(-5.0, 20_000.0) == 0
    assert replicas_for(1.0, 20_000.0) == 1  # any real demand needs a replica
    # Relative, not absolute: ten million replicas a few ulps over are ten million.
    assert replicas_for(float(np.nextafter(1e7, 2e7))) == 10_000_000


@given(
    demand=st.floats(0.0, 1e12, allow_nan=False),
    capacity=st.floats(1e-3, 1e7, allow_nan=False),
)
def test_replicas_for_is_never_short_beyond_the_tolerance_and_never_one_too_many(
    demand: float, capacity: float
) -> None:
    needed = Fraction(demand) / Fraction(capacity)  # exact
    # The tolerance, with room for the rounding of the division and the test itself.
    slack = Fraction(TOLERANCE) * max(Fraction(1), needed) * Fraction(1 + 1e-6)
    replicas = replicas_for(demand, capacity)
    assert replicas >= needed - slack  # never fewer than needed beyond the tolerance
    # Never more than a plain ceil, and one fewer than that only within the tolerance.
    assert replicas <= math.ceil(needed)
    if replicas < math.ceil(needed):
        assert needed - replicas <= slack
    # The backtest's element-wise count and shortfall test say the same.
    assert int(replicas_needed(np.array([demand]), capacity)[0]) == replicas
    assert not short_of(np.array([replicas]), np.array([demand]), capacity)[0]


@given(
    replicas=st.integers(0, 10**6),
    capacity=st.floats(1e-3, 1e7, allow_nan=False),
    ulps=st.integers(-64, 64),
)
def test_a_demand_float_noise_off_a_boundary_needs_the_boundary(
    replicas: int, capacity: float, ulps: int
) -> None:
    demand = replicas * capacity
    for _ in range(abs(ulps)):
        demand = float(np.nextafter(demand, math.inf if ulps > 0 else -math.inf))
    assert replicas_for(max(0.0, demand), capacity) == replicas
    assert bool(covers(replicas, demand / capacity))
