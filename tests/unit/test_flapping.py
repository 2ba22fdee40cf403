"""Flapping, judged against the HPA: over a day of noisy demand, the default planner's fleet
changes direction no more often than a Kubernetes HPA at target 0.7 on the same series.

Each case (a forecasting model and a noise level) runs on several seeds: one day of
history, then a day replayed through the backtest (:func:`prescaler.backtest.backtest`)
with the spec's default planner and forecaster (the operator's code, deciding every 15 s
on the metric as the HPA sees it, replicas ready one cold start after they are asked for)
and the reactive baseline, the HPA v2 algorithm the operator's shadow HPA also runs, on
the same fleet. Direction changes (a scale-down after a scale-up, or the reverse) are
counted as the backtest reports them, from the timeline's ``<policy>_desired``.

A fixed rule (at most one direction change per stabilization period) judged this before;
on seeds other than the one it ran on, the default broke it (3 of 36 runs), and on real
traffic the default reversed 2-8 times as often as the HPA while passing it. The HPA's own
guard against small changes is its 10 % tolerance.

The planner now holds this by construction (``spec.scaleDown.directionChanges: asHpa``,
the default): its shadow HPA counts both fleets' direction changes, and a release that
would reverse a scale-up waits while the fleet's count over the trailing day has reached
the shadow's. This test checks the whole loop (the shadow's count, the budget, the hold)
against the backtest's own HPA and count.
"""

from __future__ import annotations

import numpy as np
import pytest

from prescaler.api import parse_spec
from prescaler.backtest import Backtest, Demand, backtest

pytestmark = pytest.mark.slow  # a simulated day per case and seed: seconds each

T0 = 1_750_000_000
PER_REQUEST = 750.0  # prompt + output tokens of the spec's model below

# (model, noise: coefficient of variation per minute)
CASES = [
    ("recent_mean", 0.05),
    ("recent_mean", 0.35),
    ("auto", 0.05),
    # With a day of noisy history: when the seasonal naive became eligible (one day in,
    # no history yet to score it) the selection fell back to persistence, whose forecast
    # jumps with every noisy minute, and the plan flapped. Fixed in auto-selection.
    ("auto", 0.2),
    # A model whose forecast is the last noisy minute: each decision's target jumps.
    ("persistence", 0.2),
    ("persistence", 0.35),
]
SEEDS = [1, 2, 3, 4, 5]


def noisy_demand(cv: float, seed: int) -> Demand:
    """A slow cycle (22 +- 3 req/s, about 9 h) times Gaussian noise of ``cv`` per minute:
    one day of history, then the day replayed."""
    rng = np.random.default_rng(seed)
    n = 2 * 24 * 60
    minutes = np.arange(n)
    level = 22.0 + 3.0 * np.sin(minutes / 90.0)
    rps = np.maximum(0.0, level * (1.0 + rng.normal(0.0, cv, n)))
    return Demand(
        start=float(T0),
        tokens_per_s=rps * PER_REQUEST,
        observed_requests_per_s=rps,
        prompt_tokens=600.0,
        output_tokens=150.0,
        replay_from=24 * 60,
    )


def replay(model: str, cv: float, seed: int) -> Backtest:
    spec = parse_spec(
        {
            "target": {"name": "llm"},
            "minReplicas": 1,
            "maxReplicas": 50,
            "model": {"tokensPerSecond": 3750, "promptTokens": 600, "outputTokens": 150},
            "coldStart": {"seconds": 300},
            "forecast": {
                "prometheus": {"url": "http://prometheus:9090"},
                "model": model,
                "lookbackSeconds": 24 * 3600,
            },
        }
    )
    assert spec.scale_down.mode == "forecast"  # the default under test
    return backtest(spec, noisy_demand(cv, seed), ("reactive", "predictive"), degradation=None)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("model", "cv"), CASES)
def test_the_fleet_changes_direction_no_more_often_than_the_hpa(
    model: str, cv: float, seed: int
) -> None:
    result = replay(model, cv, seed)
    ours, hpa = result.result.scores["predictive"], result.result.scores["reactive"]
    assert ours.minutes == hpa.minutes == 24 * 60
    assert ours.direction_changes <= hpa.direction_changes, (
        f"{ours.direction_changes} direction changes in the day ({ours.scale_events} scale "
        f"events), the HPA's {hpa.direction_changes} ({hpa.scale_events})"
    )
    # Not a fleet that stopped moving to pass: it follows the cycle (which turns five times
    # in the day) both ways, and is not parked at its maximum (50). The cycle peaks at 25
    # req/s (5 replicas); the noisiest minutes of a lookahead may need four times that.
    run = next(r for r in result.result.runs if r.name == "predictive")
    existing = run.existing_per_minute(result.result.config.steps_per_minute)
    assert ours.direction_changes >= 2
    assert existing.max() < 25
