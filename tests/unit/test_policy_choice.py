"""Which way a pool plans: the forecast with a clear margin below the HPA's curve, the
cheaper within the margin, the HPA beyond it; switches after two checks in a row."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prescaler.planning import Evidence, frontier_ratio, judge, recheck

# The HPA swept over its target: dearer points leave less waiting.
CURVE = ((80.0, 0.04), (90.0, 0.02), (100.0, 0.01), (120.0, 0.002), (140.0, 0.0))
HPA_07 = (100.0, 0.01)


def evidence(unserved: float, gpu_hours: float) -> Evidence:
    return Evidence(unserved, gpu_hours, HPA_07[1], HPA_07[0], CURVE)


def test_the_ratio_reads_the_curve_at_the_same_gpu_hours() -> None:
    assert frontier_ratio(0.01, 100.0, CURVE) == pytest.approx(1.0)
    assert frontier_ratio(0.0075, 95.0, CURVE) == pytest.approx(0.5)  # curve 0.015 there
    # Past the dearest point, the plan is held to what that point leaves: none here.
    assert frontier_ratio(0.001, 150.0, CURVE) == math.inf
    assert frontier_ratio(0.0, 150.0, CURVE) is None
    # Both below one token in ten thousand: noise, not evidence.
    assert frontier_ratio(5e-5, 150.0, CURVE) is None
    # Cheaper than the cheapest point: held to what that point leaves.
    assert frontier_ratio(0.02, 70.0, CURVE) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("unserved", "gpu_hours", "policy"),
    [
        (0.002, 95.0, "forecast"),  # 0.13 of the curve: clearly below it
        (0.0, 90.0, "forecast"),  # nothing waiting, where the HPA leaves 2 %
        (0.011, 98.0, "forecast"),  # within the margin (0.92) and cheaper than the HPA
        (0.0095, 105.0, "reactive"),  # within the margin (1.1) and dearer
        (0.005, 130.0, "reactive"),  # 5 x the curve: the web log's dear default
        (0.0, 160.0, "reactive"),  # beyond the HPA's whole curve, neither leaves any
        (0.0, 141.0, "reactive"),  # dearer than its dearest point: beyond the curve
        (0.05, 60.0, "reactive"),  # cheaper than any HPA, but 1.25 x its cheapest's waiting
        (0.03, 60.0, "forecast"),  # cheaper than any HPA and less waiting than its cheapest
    ],
)
def test_the_verdict(unserved: float, gpu_hours: float, policy: str) -> None:
    assert judge(evidence(unserved, gpu_hours)).policy == policy


def test_the_first_verdict_is_taken_at_once_later_ones_after_two_days() -> None:
    good, bad = evidence(0.002, 95.0), evidence(0.005, 130.0)
    choice = recheck(None, bad, 0.0)
    assert (choice.policy, choice.since, choice.switches) == ("reactive", 0.0, 0)
    assert "HPA's curve" in choice.reason
    day = 86_400.0
    # One good day, pooled with the bad one, then a bad day: no switch.
    choice = recheck(recheck(choice, good, day), bad, 2 * day)
    assert (choice.policy, choice.switches) == ("reactive", 0)
    # Good days in a row: the pooled evidence turns, then two checks in a row switch.
    checks = []
    for n in range(3, 10):
        choice = recheck(choice, good, n * day)
        checks.append(choice.policy)
        if choice.policy == "forecast":
            break
    assert checks[-1] == "forecast"
    assert len(checks) >= 2  # never on the first good day: two checks in a row
    assert choice.switches == 1
    assert choice.since == n * day


def test_the_evidence_pools_the_days_with_the_new_one_weighing_less_than_half() -> None:
    a, b = evidence(0.0, 100.0), evidence(0.01, 120.0)
    pooled = b.pooled(a, 0.4)
    assert pooled.forecast_unserved == pytest.approx(0.004)
    assert pooled.forecast_gpu_hours == pytest.approx(108.0)
    assert pooled.hpa_curve == CURVE  # the same curve on both days
    assert b.pooled(None) is b


def led(unserved: float, gpu_hours: float, lu: float, lg: float) -> Evidence:
    return Evidence(unserved, gpu_hours, HPA_07[1], HPA_07[0], CURVE, lu, lg)


@pytest.mark.parametrize(
    ("forecast", "leading", "policy"),
    [
        # The forecast beyond the curve, the led HPA 0.49 of it (a little dearer than the
        # HPA at 0.7): led.
        ((0.005, 130.0), (0.0045, 102.0), "leading"),
        # The led HPA on the curve (1.0): the two-way verdict stands.
        ((0.005, 130.0), (0.0096, 102.0), "reactive"),
        # The led HPA beyond the HPA's whole curve: never.
        ((0.005, 130.0), (0.0, 141.0), "reactive"),
        # The forecast clearly below the curve (0.13) and the led HPA no clearer: forecast.
        ((0.002, 95.0), (0.0015, 102.0), "forecast"),
        # The forecast chosen within the margin (0.92, cheaper), the led HPA 0.3: led.
        ((0.011, 98.0), (0.0028, 102.0), "leading"),
        # Neither leaves anything waiting: the led HPA is never the cheaper.
        ((0.0, 160.0), (0.0, 140.0), "reactive"),
    ],
)
def test_the_verdict_among_three(
    forecast: tuple[float, float], leading: tuple[float, float], policy: str
) -> None:
    verdict = judge(led(*forecast, *leading))
    assert verdict.policy == policy, verdict.reason
    assert verdict.leading_ratio is None or verdict.leading_ratio >= 0
    if policy == "leading":
        assert "led by the forecast" in verdict.reason


def test_the_led_hpas_evidence_pools_and_survives_a_day_without_it() -> None:
    day1 = led(0.005, 130.0, 0.004, 102.0)
    day2 = led(0.005, 130.0, 0.002, 104.0)
    pooled = day2.pooled(day1)
    assert pooled.leading_unserved == pytest.approx(0.4 * 0.002 + 0.6 * 0.004)
    assert pooled.leading_gpu_hours == pytest.approx(0.4 * 104 + 0.6 * 102)
    # An earlier check without it: the new day's own numbers.
    assert day2.pooled(evidence(0.005, 130.0)).leading_unserved == pytest.approx(0.002)
    assert not evidence(0.005, 130.0).pooled(day1).led
    with pytest.raises(ValueError, match="both"):
        Evidence(0.0, 1.0, 0.0, 1.0, CURVE, 0.1, None)


def test_evidence_must_be_numbers() -> None:
    with pytest.raises(ValueError, match="finite"):
        Evidence(math.nan, 1.0, 0.0, 1.0, CURVE)
    with pytest.raises(ValueError, match="two points"):
        Evidence(0.0, 1.0, 0.0, 1.0, ((1.0, 0.0),))


fractions = st.floats(min_value=0.0, max_value=0.2)
hours = st.floats(min_value=1.0, max_value=500.0)


@given(unserved=fractions, gpu_hours=hours)
def test_the_forecast_is_never_chosen_when_the_hpa_is_better_on_both_axes(
    unserved: float, gpu_hours: float
) -> None:
    """Never dearer for nothing: a forecast that leaves more waiting at more GPU-hours
    than the HPA at the pool's target is never the verdict."""
    verdict = judge(evidence(unserved, gpu_hours))
    if unserved > HPA_07[1] and gpu_hours > HPA_07[0]:
        assert verdict.policy == "reactive"
    if verdict.policy == "forecast" and gpu_hours > HPA_07[0]:
        assert verdict.ratio is not None
        assert verdict.ratio <= 0.8


@given(unserved=fractions, gpu_hours=hours, lu=fractions, lg=hours)
def test_the_led_hpa_is_never_chosen_when_the_hpa_is_better_on_both_axes(
    unserved: float, gpu_hours: float, lu: float, lg: float
) -> None:
    verdict = judge(led(unserved, gpu_hours, lu, lg))
    if lu >= HPA_07[1] and lg >= HPA_07[0]:
        assert verdict.policy != "leading"
    if verdict.policy == "leading":
        assert verdict.leading_ratio is not None
        assert verdict.leading_ratio <= 0.8


# ----------------------------------------------------------------- planning as the HPA


def _reactive_plan(
    hpa: int,
    current: int,
    *,
    windows: tuple[object, ...] = (),
    leading: float | None = None,
    mean: float = 10.0,
    now: float = 1_800_000_000.0,
    forecast_at: float | None = None,
    budget: int | None = None,
    **fleet: object,
):
    from prescaler.capacity import CapacityModel, TokenProfile
    from prescaler.planning import FleetState, PlanInputs, ScalingPolicy, plan
    from unit.fake_forecasts import Forecast, Point

    made = now if forecast_at is None else forecast_at
    # A forecast that asks for 12: in reactive mode it must not count.
    forecast = Forecast(tuple(Point(made + 60 * (i + 1), mean, 12.0) for i in range(10)), made)
    return plan(
        PlanInputs(
            now=now,
            capacity=CapacityModel(TokenProfile(600, 400), tokens_per_second=1000),
            fleet=FleetState(current, current, observed_requests_per_second=3.0, **fleet),  # type: ignore[arg-type]
            policy=ScalingPolicy(min_replicas=1, max_replicas=8),
            cold_start_seconds=240,
            forecast=forecast,
            windows=windows,  # type: ignore[arg-type]
            reactive_replicas=hpa,
            leading_target=leading,
            direction_budget=budget,
        )
    )


def test_in_reactive_mode_the_plan_is_the_hpas_count_within_the_bounds() -> None:
    up = _reactive_plan(5, 3)
    assert (up.desired_replicas, up.driver) == (5, "reactive")
    assert "the pool's HPA holds 5" in up.reason
    assert _reactive_plan(20, 3).desired_replicas == 8  # maxReplicas
    floor = _reactive_plan(0, 3)
    assert floor.target_replicas == 1  # minReplicas; the pool's own scale-down paces the way
    assert floor.desired_replicas < 3


def test_in_reactive_mode_a_release_follows_the_hpa_without_the_memory() -> None:
    now = 1_800_000_000.0
    # The forecast planner remembered 7 a minute ago; the HPA now holds 4.
    down = _reactive_plan(4, 7, recent_targets=((now - 60, 7),), last_scale_up_at=now - 900)
    assert down.target_replicas == 4, down.reason
    assert down.driver != "memory"


def test_in_reactive_mode_a_window_still_holds_its_floor() -> None:
    from prescaler.planning import ScheduledWindow

    window = ScheduledWindow("sale", cron="0 * * * *", duration_seconds=3600, min_replicas=6)
    held = _reactive_plan(2, 2, windows=(window,))
    assert (held.desired_replicas, held.driver) == (6, "window")


# ----------------------------------------------------------------- the HPA led by the forecast


def test_leading_the_plan_is_the_hpas_count_or_the_forecast_at_the_hpas_target() -> None:
    # One replica serves 1 req/s; the forecast's mean peaks at 3.5: at the HPA's 0.7 that
    # is 5 replicas, ahead of an HPA that holds 2 (the upper band, 12, does not count).
    up = _reactive_plan(2, 2, leading=0.7, mean=3.5)
    assert (up.desired_replicas, up.driver) == (5, "forecast"), up.reason
    assert "at the HPA's target 0.7 needs 5" in up.reason
    assert up.forecast_mean_peak == pytest.approx(3.5)
    # The HPA holding more: its count.
    assert _reactive_plan(6, 6, leading=0.7, mean=3.5).desired_replicas == 6
    # Without leading, the same forecast adds nothing.
    assert _reactive_plan(2, 2, mean=3.5).desired_replicas == 2


def test_leading_a_release_waits_out_the_hpas_window_and_no_longer() -> None:
    now = 1_800_000_000.0
    # Asked for 5 four minutes ago (the HPA's window is five): held.
    held = _reactive_plan(
        2, 5, leading=0.7, mean=0.5, recent_targets=((now - 240, 5),), last_scale_up_at=now - 900
    )
    assert (held.desired_replicas, held.driver) == (5, "memory"), held.reason
    # Six minutes ago: released to what the HPA and the forecast need now.
    gone = _reactive_plan(
        2, 5, leading=0.7, mean=0.5, recent_targets=((now - 360, 5),), last_scale_up_at=now - 900
    )
    assert gone.target_replicas == 2
    assert gone.desired_replicas < 5


def test_leading_without_a_usable_forecast_is_the_hpa_alone() -> None:
    now = 1_800_000_000.0
    stale = _reactive_plan(2, 2, leading=0.7, mean=3.5, now=now, forecast_at=now - 7200)
    assert stale.desired_replicas == 2
    assert stale.forecast_mean_peak is None


def test_leading_a_release_that_reverses_a_scale_up_waits_once_the_hpas_changes_are_spent() -> None:
    from prescaler.planning import ScalingPolicy

    now = 1_800_000_000.0
    # Scaled up to 5 twenty minutes ago; the HPA and the forecast now need 2.
    up = {"last_scale_up_at": now - 1200, "last_scale_down_at": now - 3600}
    free = _reactive_plan(2, 5, leading=0.7, mean=0.5, **up)
    assert free.desired_replicas < 5
    spent = _reactive_plan(2, 5, leading=0.7, mean=0.5, budget=0, **up)
    assert (spent.desired_replicas, spent.driver) == (5, "direction"), spent.reason
    # The HPA's own count is never held: in reactive mode the HPA's count is the plan.
    assert _reactive_plan(2, 5, budget=0, **up).desired_replicas < 5
    assert ScalingPolicy().direction_changes_as_hpa
