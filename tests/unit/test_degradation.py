"""Degradation levels: signals, hysteresis, Retry-After from the cold start, the context
cap from the KV-cache model, and the forecast shortfall that rises before the queue."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from prescaler.capacity import PRESETS, CapacityModel, ReplicaSpec, TokenProfile
from prescaler.planning import (
    DegradationInputs,
    DegradationPolicy,
    DegradationState,
    Signals,
    assess,
    forecast_shortfall,
)
from unit.fake_forecasts import Forecast, Point

NOW = 1_800_000_000.0
STEP = 60.0
COLD = 300.0
# 1 request/s per replica: 1000 tokens per request at 1000 tokens/s.
CAPACITY = CapacityModel(TokenProfile(600, 400), tokens_per_second=1000)
POLICY = DegradationPolicy(hold_seconds=120.0)


def flat(rps: float, at: float = NOW, steps: int = 20) -> Forecast:
    return Forecast(tuple(Point(at + STEP * (i + 1), rps, rps) for i in range(steps)), at)


def inputs(
    serving: int = 4,
    *,
    waiting: float | None = 0.0,
    kv: float | None = None,
    p95: float | None = None,
    p99: float | None = None,
    forecast: Forecast | None = None,
    arrivals: tuple[float, ...] = (),
    previous: DegradationState | None = None,
    now: float = NOW,
    policy: DegradationPolicy = POLICY,
    capacity: CapacityModel = CAPACITY,
    observed: float | None = None,
) -> DegradationInputs:
    return DegradationInputs(
        now=now,
        policy=policy,
        capacity=capacity,
        signals=Signals(serving, waiting, kv, p95, p99, observed),
        cold_start_seconds=COLD,
        forecast=forecast,
        arrivals=arrivals,
        previous=previous or DegradationState(),
    )


@pytest.mark.parametrize(
    ("waiting", "level"),
    [(40.0, "normal"), (41.0, "warning"), (200.0, "warning"), (201.0, "critical")],
)
def test_queue_depth_per_serving_replica(waiting: float, level: str) -> None:
    # 4 serving replicas: warning above 10 each (40), critical above 50 each (200).
    result = assess(inputs(4, waiting=waiting))
    assert result.level == level
    assert result.signal_levels["queue"] == level


def test_a_queue_with_no_serving_replica_is_critical() -> None:
    assert assess(inputs(0, waiting=3.0)).level == "critical"
    assert assess(inputs(0, waiting=0.0)).level == "normal"


@pytest.mark.parametrize(("kv", "level"), [(0.89, "normal"), (0.9, "warning"), (0.97, "critical")])
def test_kv_cache_utilization(kv: float, level: str) -> None:
    assert assess(inputs(kv=kv)).level == level


def test_ttft_against_the_slo_and_no_slo_no_signal() -> None:
    slo = replace(POLICY, ttft_p95_slo_seconds=0.5, ttft_p99_slo_seconds=2.0)
    assert assess(inputs(p95=0.4, p99=1.0, policy=slo)).level == "normal"
    assert assess(inputs(p95=0.6, p99=1.0, policy=slo)).level == "warning"
    assert assess(inputs(p95=0.6, p99=2.5, policy=slo)).level == "critical"
    unset = assess(inputs(p95=9.0, p99=9.0))
    assert unset.level == "normal"
    assert "ttftP95" not in unset.signal_levels


def test_forecast_shortfall_alone_raises_warning_with_the_queue_still_empty() -> None:
    # 4 serving, none on the way; the upper band says 4.5 req/s (4,500 tokens/s) from the
    # next step: 500 tokens/s short, 11 % of the demand.
    result = assess(inputs(4, waiting=0.0, forecast=flat(4.5)))
    assert result.signal_levels["queue"] == "normal"
    assert result.level == "warning"
    assert result.shortfall is not None
    assert result.shortfall.tokens_per_second == pytest.approx(500.0)
    assert result.shortfall.fraction == pytest.approx(500 / 4500)
    assert any("forecast shortfall 500 tokens/s" in r for r in result.reasons)


def test_capacity_on_its_way_counts_from_its_expected_ready_time() -> None:
    # The 5th replica is ready in 30 s: only the first step (ending at +60 s, starting
    # now) is short; the worst step is that one.
    fc = flat(4.5)
    coming = forecast_shortfall(NOW, CAPACITY, fc, 4, (NOW + 30.0,), COLD)
    assert coming is not None
    assert coming.at == NOW + STEP
    # Ready by the start of the second step: the rest of the cold start is covered.
    later = [p for p in fc.points if p.t > NOW + STEP]
    rest = forecast_shortfall(
        NOW + STEP, CAPACITY, Forecast(tuple(later), NOW), 4, (NOW + 30,), COLD
    )
    assert rest is not None
    assert rest.tokens_per_second == 0.0
    # Capacity that arrives only after the cold start (no GPU node: never) does not help.
    assert assess(inputs(4, forecast=fc, arrivals=())).level == "warning"


def test_critical_shortfall_and_no_usable_forecast_is_no_signal() -> None:
    assert assess(inputs(4, forecast=flat(6.0))).level == "critical"  # 33 % short
    garbage = Forecast((Point(NOW + 60, 1.0, float("nan")),), NOW)
    assert "forecastShortfall" not in assess(inputs(forecast=garbage)).signal_levels
    assert assess(inputs(forecast=None)).shortfall is None


def test_levels_rise_at_once_and_fall_only_after_the_hold() -> None:
    up = assess(inputs(waiting=300.0))
    assert up.level == "critical"
    assert up.changed
    state = up.state
    t = NOW
    # Quiet signals: the level holds for the hold time, then falls.
    reasons = []
    for _ in range(4):  # 0, 30, 60, 90 s
        t += 30.0
        held = assess(inputs(waiting=0.0, now=t, previous=state))
        assert held.level == "critical"
        assert not held.changed
        assert any("holding critical" in r for r in held.reasons)
        reasons.append(held.reasons)
        state = held.state
    # The hold's reason names when it ends (no countdown that would change the published
    # ConfigMap at every reconcile of the hold).
    assert all(r == reasons[0] for r in reasons), reasons
    assert any("until " in r for r in reasons[0]), reasons[0]
    fallen = assess(inputs(waiting=0.0, now=t + 30.0, previous=state))
    assert fallen.level == "normal"
    assert fallen.changed


def test_a_noisy_signal_does_not_flap() -> None:
    state, levels = DegradationState(), []
    for i, waiting in enumerate([300, 0, 300, 0, 300, 0, 0, 0, 0, 0, 0]):
        result = assess(inputs(waiting=float(waiting), now=NOW + 30.0 * i, previous=state))
        state = result.state
        levels.append(result.level)
    # Critical from the first minute to 120 s after the last spike (at 120 s).
    assert levels[:9] == ["critical"] * 9
    assert levels[9:] == ["normal", "normal"]
    assert sum(1 for a, b in itertools.pairwise(levels) if a != b) == 1


def test_the_level_falls_to_the_highest_level_of_the_hold() -> None:
    state = assess(inputs(waiting=300.0)).state
    # Below critical, but at warning for part of the hold.
    for i, waiting in enumerate([100.0, 0.0, 0.0, 0.0], start=1):
        state = assess(inputs(waiting=waiting, now=NOW + 30.0 * i, previous=state)).state
    result = assess(inputs(waiting=0.0, now=NOW + 150.0, previous=state))
    assert result.level == "warning"


def test_a_signal_that_raised_the_level_and_vanished_holds_it() -> None:
    state = assess(inputs(kv=0.99)).state
    assert state.level == "critical"
    assert state.raised_by == ("kvCache",)
    result = assess(inputs(kv=None, now=NOW + 3600.0, previous=state))
    assert result.level == "critical"
    assert any("kvCache not measured" in r for r in result.reasons)


def test_retry_after_is_when_the_next_replica_is_ready() -> None:
    result = assess(inputs(waiting=100.0, arrivals=(NOW + 95.0, NOW + 20.5)))
    assert result.admission.retry_after_seconds == 21
    # None on the way: a replica asked for now needs one cold start.
    assert assess(inputs(waiting=100.0)).admission.retry_after_seconds == COLD
    # Normal: no restriction at all.
    assert assess(inputs(waiting=0.0)).admission.retry_after_seconds is None


def test_queue_limit_and_lanes_per_level() -> None:
    warning = assess(inputs(4, waiting=100.0)).admission
    assert warning.queue_depth_limit == 200  # the critical threshold: 50 x 4
    assert warning.shed_lanes == ("batch",)
    critical = assess(inputs(4, waiting=300.0)).admission
    assert critical.queue_depth_limit == 40  # drain to the warning threshold
    three = replace(POLICY, lanes=("batch", "standard", "interactive"))
    assert assess(inputs(4, waiting=300.0, policy=three)).admission.shed_lanes == (
        "batch",
        "standard",
    )
    one = replace(POLICY, lanes=("interactive",))
    assert assess(inputs(4, waiting=300.0, policy=one)).admission.shed_lanes == ()


def test_smaller_model_route_only_when_critical() -> None:
    route = replace(POLICY, smaller_model_route="llama-8b", smaller_model_max_prompt_tokens=512)
    assert assess(inputs(waiting=100.0, policy=route)).admission.smaller_model_route is None
    critical = assess(inputs(waiting=300.0, policy=route)).admission
    assert critical.smaller_model_route == "llama-8b"
    assert critical.smaller_model_max_prompt_tokens == 512


def kv_capacity(context: int = 8192) -> CapacityModel:
    replica = ReplicaSpec(PRESETS["llama-3.1-8b"], gpu_memory_gib=80, gpus_per_replica=1)
    return CapacityModel(TokenProfile(2000, 500, context), replica=replica, tokens_per_second=20000)


def test_the_context_cap_fits_the_expected_concurrency_into_the_kv_memory_ready() -> None:
    capacity = kv_capacity()
    replica = capacity.replica
    assert replica is not None
    tokens_per_replica = replica.kv_cache_bytes / replica.model.kv_bytes_per_token
    latency = capacity.request_latency_seconds
    # Demand whose concurrency at the p95 context (8192) needs 3 replicas' KV memory,
    # with 2 serving: the cap is what fits.
    rps = 3 * tokens_per_replica / 8192 / latency
    result = assess(
        inputs(2, waiting=100.0, capacity=capacity, forecast=flat(rps), observed=rps / 2)
    )
    cap = result.admission.max_context_tokens
    assert cap is not None
    concurrency = rps * latency
    assert cap * concurrency <= 2 * tokens_per_replica
    assert (cap + 1) * concurrency > 2 * tokens_per_replica
    assert cap < 8192
    # Enough memory for the contexts the traffic has: no cap.
    small = assess(inputs(2, waiting=100.0, capacity=capacity, forecast=flat(rps / 3)))
    assert small.admission.max_context_tokens is None
    # Never below the policy's floor; and no cap without a KV model.
    tiny = assess(inputs(2, waiting=100.0, capacity=capacity, forecast=flat(rps * 1000)))
    assert tiny.admission.max_context_tokens == POLICY.min_context_tokens
    assert assess(inputs(2, waiting=100.0, forecast=flat(9.0))).admission.max_context_tokens is None


def test_with_coarse_steps_only_steps_beginning_within_the_cold_start_count() -> None:
    # 30-minute steps, 300 s cold start: the step under way (covered) counts, the next one
    # (begins in 20 minutes, 6 req/s) does not: capacity asked for later is ready for it.
    step = 1800.0
    now = NOW + 600.0  # 10 minutes into the current step
    fc = Forecast((Point(NOW + step, 4.0, 4.0), Point(NOW + 2 * step, 6.0, 6.0)), NOW, step)
    short = forecast_shortfall(now, CAPACITY, fc, 4, (), COLD)
    assert short is not None
    assert short.tokens_per_second == 0.0
    # 1,500 s into the step the next one begins within the cold start: it counts.
    later = forecast_shortfall(NOW + 1500.0, CAPACITY, fc, 4, (), COLD)
    assert later is not None
    assert later.tokens_per_second == pytest.approx(2000.0)
