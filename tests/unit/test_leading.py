"""The HPA led by the forecast (``spec.policy: leading``) in a replay: the HPA's count, or
what the forecast mean's peak needs at the HPA's target if more, held for the HPA's
scale-down window; without a forecast, the HPA alone."""

from __future__ import annotations

import pandas as pd

from prescaler.backtest import Observation, ReactivePolicy
from prescaler.backtest._policies import LeadingPolicy, recorded_peaks
from prescaler.planning import HPA_DOWNSCALE_SECONDS, leading_replicas

CAP = 1000.0  # tokens/s per replica
RATE = 1.0  # requests/s per replica (a request is 1000 tokens)


def _obs(now: float, ready: int, tokens: float) -> Observation:
    return Observation(
        now=now,
        step=0,
        ready=ready,
        existing=ready,
        metric_tokens_per_s=tokens,
        observed=pd.Series(dtype=float),
    )


def test_the_forecast_at_the_hpas_target() -> None:
    assert leading_replicas(3.5, RATE, 0.7) == 5
    assert leading_replicas(3.5, RATE, 0.5) == 7
    assert leading_replicas(0.0, RATE, 0.7) == 0
    assert leading_replicas(float("nan"), RATE, 0.7) == 0
    assert leading_replicas(3.5, 0.0, 0.7) == 0


def test_a_led_hpa_asks_early_and_releases_after_the_hpas_window() -> None:
    record: list[tuple[float, float | None]] = []
    hpa = ReactivePolicy(CAP, min_replicas=1, max_replicas=20, target=0.7)
    policy = LeadingPolicy(hpa, recorded_peaks(record), RATE)
    # Demand at 1.4 req/s (2 replicas at 0.7); nothing recorded yet: the HPA alone.
    assert policy.decide(_obs(0.0, 2, 1400.0)) == 2
    # The forecast planner saw a peak of 7 req/s coming: 10 replicas, before the HPA sees it.
    record.append((10.0, 7.0))
    assert policy.decide(_obs(15.0, 2, 1400.0)) == 10
    # The forecast falls back: the 10 hold for the HPA's window, then go.
    record.append((40.0, 1.4))
    assert policy.decide(_obs(45.0, 10, 1400.0)) == 10
    assert policy.decide(_obs(15.0 + HPA_DOWNSCALE_SECONDS - 1, 10, 1400.0)) == 10
    later = policy.decide(_obs(15.0 + HPA_DOWNSCALE_SECONDS + 15, 10, 1400.0))
    assert later < 10
    # A forecast that lapsed (no usable one): the HPA's count.
    record.append((1000.0, None))
    assert policy.decide(_obs(1000.0 + HPA_DOWNSCALE_SECONDS + 30, 2, 1400.0)) == 2


def test_the_recorded_peaks_are_the_latest_at_or_before_the_time() -> None:
    record: list[tuple[float, float | None]] = [(10.0, 1.0)]
    at = recorded_peaks(record)
    assert at(5.0) is None
    assert at(10.0) == 1.0
    record.append((20.0, 2.0))  # the other run is still filling it
    assert at(19.0) == 1.0
    assert at(25.0) == 2.0
