"""``spec.policy`` in a replay: ``reactive`` is the HPA (windows held), ``auto`` follows
its checks: the first on the history before the replayed span, then one a day."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from prescaler.api import InferencePoolSpec
from prescaler.backtest import backtest, demand_from_trace
from prescaler.backtest._policies import AutoPolicy
from prescaler.backtest.traces import Trace

pytestmark = pytest.mark.slow  # replays days of minutes through the planner

DAY = 86_400.0
START = 1_700_006_400.0  # a UTC midnight


def spec(**fields: Any) -> InferencePoolSpec:
    return InferencePoolSpec.model_validate(
        {
            "target": {"name": "llm"},
            "minReplicas": 1,
            "maxReplicas": 30,
            "model": {"tokensPerSecond": 20_000, "promptTokens": 800, "outputTokens": 200},
            "coldStart": {"mode": "fixed", "seconds": 240},
            "forecast": {"prometheus": {"url": "http://p:9090"}, "model": "recent_mean"},
            **fields,
        }
    )


def bursty(days: float, seed: int = 1) -> Any:
    """Requests/s with bursts no forecast can foretell: a level with short, random spikes."""
    rng = np.random.default_rng(seed)
    n = int(days * 1440)
    rps = 40 + rng.normal(0, 2, n)
    for at in rng.choice(n - 10, size=int(days * 30), replace=False):
        rps[at : at + rng.integers(2, 6)] += rng.uniform(60, 140)
    demand = demand_from_trace(
        Trace(start=START, step_seconds=60.0, rps=np.clip(rps, 0, None), name="bursty"),
        prompt_tokens=800,
        output_tokens=200,
    )
    return demand.with_replay_days(days - 1)


def test_a_reactive_pool_replays_exactly_as_the_hpa() -> None:
    demand = bursty(2.0)
    run = backtest(spec(policy="reactive"), demand, ["reactive", "predictive"], degradation=None)
    planned, hpa = run.result.scores["predictive"], run.result.scores["reactive"]
    assert planned.gpu_hours == pytest.approx(hpa.gpu_hours)
    assert planned.unserved_token_fraction == pytest.approx(hpa.unserved_token_fraction)
    (policy,) = [p for p in run.policies if isinstance(p, AutoPolicy)]
    assert set(policy.decisions) == {"reactive"}
    assert run.policy_json()["predictive"]["ended_on"] == "reactive"
    # What drove the fleet: the HPA, every decision (the planner, deciding beside it in
    # reactive mode, drives nothing the fleet gets).
    assert set(policy.drivers) == {"reactive"}
    assert policy.predictive.drivers  # it did decide
    assert run.drivers()["predictive"]["reactive"]["gpu_hour_share"] == 1.0


def test_a_leading_pool_replays_as_the_hpa_led_by_its_forecast() -> None:
    demand = bursty(2.0)
    run = backtest(spec(policy="leading"), demand, ["reactive", "predictive"], degradation=None)
    (policy,) = [p for p in run.policies if isinstance(p, AutoPolicy)]
    assert set(policy.decisions) == {"leading"}
    assert run.policy_json()["predictive"]["ended_on"] == "leading"
    assert policy.drivers == policy.predictive.drivers  # the planner plans every count
    assert "reactive" in policy.drivers
    led, hpa = run.result.scores["predictive"], run.result.scores["reactive"]
    # The larger of two recommendations: never fewer GPU-hours than the HPA's own (its
    # count is one of them), and no more waiting.
    assert led.gpu_hours >= hpa.gpu_hours * 0.99
    assert led.unserved_token_fraction <= hpa.unserved_token_fraction * 1.01 + 1e-9


def test_auto_weighs_the_history_at_the_start_then_each_day() -> None:
    demand = bursty(2.0)
    run = backtest(spec(), demand, ["reactive", "predictive"], degradation=None)
    (policy,) = [p for p in run.policies if isinstance(p, AutoPolicy)]
    replay_start = demand.replay_start
    checks = [c.checked_at for c in policy.choices]
    # The first check at the replayed span's start (on the day before it), then daily.
    assert checks[0] == replay_start
    assert np.diff(checks).tolist() == [DAY] * (len(checks) - 1)
    assert len(checks) == 2  # the start, and the end of the replayed day
    # The fleet followed the checks: each decision in the mode in force at its time.
    for at, mode in policy.schedule:
        assert policy.in_force(at) == mode
    assert sum(policy.decisions.values()) > 0
    report = run.policy_json()["predictive"]
    assert [c["policy"] for c in report["checks"]] == [c.policy for c in policy.choices]
    for c in report["checks"]:
        for key in ("frontier_ratio", "leading_frontier_ratio"):  # the led HPA ran too
            ratio = c[key]
            assert ratio is None or ratio == "inf" or (isinstance(ratio, float) and ratio >= 0)
    assert all(c.evidence is not None and c.evidence.led for c in policy.choices)
    if policy.choices[0].policy == "reactive":  # the first verdict holds at once
        assert policy.in_force(replay_start + 1) == "reactive"
    assert not math.isnan(run.result.scores["predictive"].gpu_hours)
