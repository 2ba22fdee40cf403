"""The ``keda`` policy: prescaler's plan as a KEDA external trigger beside a reactive one."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from prescaler.api import InferencePoolSpec
from prescaler.backtest import Observation, ReactivePolicy, backtest, history_demand

CAP = 1000.0


def _obs(now: float, ready: int, existing: int, load: float) -> Observation:
    return Observation(
        now=now,
        step=0,
        ready=ready,
        existing=existing,
        metric_tokens_per_s=load,
        observed=pd.Series(dtype=float),
    )


def test_the_hpa_takes_the_larger_of_the_plan_and_the_reactive_metric() -> None:
    hpa = ReactivePolicy(CAP, min_replicas=1, max_replicas=100)
    on_target = 5 * CAP * hpa.target
    assert hpa.decide(_obs(0.0, 5, 5, on_target), external=5) == 5
    # The plan asks for more than the load does: the plan wins (rate limit: +4 or +100 %).
    assert hpa.decide(_obs(15.0, 5, 5, on_target), external=8) == 8
    # The load asks for more than the plan: the load wins.
    hot = ReactivePolicy(CAP, min_replicas=1, max_replicas=100)
    assert hot.decide(_obs(0.0, 5, 5, 1.6 * on_target), external=5) == 8
    # A plan within the tolerance of the count (10 % either side) moves nothing.
    assert hpa.external_recommendation(10, 11) == 10
    assert hpa.external_recommendation(10, 12) == 12
    assert hpa.external_recommendation(10, 9) == 10
    # Scale-down: the HPA's own 300 s stabilization holds the plan's release.
    assert hpa.decide(_obs(30.0, 8, 8, on_target), external=2) == 8


@pytest.mark.slow  # two days replayed under three policies
def test_forecast_plus_reactive_serves_what_each_misses_at_the_cost_of_the_larger() -> None:
    spec = InferencePoolSpec.model_validate(
        {
            "target": {"name": "x"},
            "minReplicas": 1,
            "maxReplicas": 40,
            "model": {"tokensPerSecond": 20000},
            "forecast": {"prometheus": {"url": "http://p:9090"}, "model": "seasonal_naive"},
        }
    )
    minutes = 2 * 1440
    t = np.arange(minutes)
    # A daily swell the forecast knows, and a daily surge at 18:00 the HPA meets late.
    rps = 5 + 15 * (np.sin(2 * np.pi * t / 1440) + 1) + np.where(t % 1440 // 60 == 18, 20, 0)
    demand = history_demand(1_700_006_400.0, rps, spec, 43200.0)
    run = backtest(spec, demand, ("reactive", "predictive", "keda"), degradation=None)
    s = run.result.scores
    assert s["reactive"].unserved_token_fraction > 0
    assert s["keda"].unserved_token_fraction <= s["predictive"].unserved_token_fraction + 1e-9
    assert s["keda"].unserved_token_fraction < s["reactive"].unserved_token_fraction
    # It runs at least what each trigger alone would ask for, most of the time.
    assert s["keda"].gpu_hours >= 0.98 * max(s["reactive"].gpu_hours, s["predictive"].gpu_hours)
