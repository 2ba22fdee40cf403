"""The peak risk model (prescaler.planning._risk) and how the planner and status use it."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest

from prescaler.api import parse_spec, risk_objective
from prescaler.capacity import CapacityModel, TokenProfile
from prescaler.controller.status import peak_risk, risk_status
from prescaler.planning import (
    BUDGET_ERROR_CAP,
    BUDGET_GAIN,
    BUDGET_MAX_TARGET,
    BUDGET_RATE,
    LEVEL_BUCKETS,
    LOG_BINS,
    MIN_RELATIVE_SCALE,
    FleetState,
    PeakRisk,
    PlanInputs,
    RiskObjective,
    RiskSizing,
    ScalingPolicy,
    Spend,
    budget_step,
    observe_risk,
    plan,
    record_risk,
    remember_plan,
    risk_sizing,
)
from prescaler.planning._risk import WEIGHT_CAP, Lookahead, demand_weight, waiting_demand
from unit.fake_forecasts import Forecast, Point

DAY = 86400.0
"""The pool's day in these tests (the spec's default shortest seasonality period)."""


def objective(**kw: float) -> RiskObjective:
    base: dict[str, float] = {
        "served_fraction": 0.99,
        "level": 0.9,
        "adapt_rate": 0.05,
        "memory": 1000.0,
        "min_outcomes": 3.0,
        "day_seconds": DAY,
    }
    base.update(kw)
    return RiskObjective(**base)


def one_lookahead(
    risk: PeakRisk, obj: RiskObjective, t: float, base: float, demands: list[float]
) -> PeakRisk:
    """Record a lookahead [t, t + 10] sized at ``base`` (margin 1) and observe ``demands``
    inside it, ready capacity matching the sized demand, then end it."""
    risk = record_risk(risk, t, t + 10, base, base)
    for i, d in enumerate(demands):
        risk = observe_risk(risk, obj, t + 1 + i, d, ready_capacity=base)
    return observe_risk(risk, obj, t + 11, None)


def test_a_lookahead_is_scored_once_it_ends_by_its_peak_over_what_was_known() -> None:
    obj = objective()
    risk = record_risk(PeakRisk(), 0, 10, base=10, sized=12)
    risk = observe_risk(risk, obj, 5, 11.0, ready_capacity=12)
    assert risk.outcomes == 0, "not ended yet"
    assert len(risk.pending) == 1
    assert risk.pending[0].peak == 11
    risk = observe_risk(risk, obj, 10, 14.0, ready_capacity=12)
    assert risk.outcomes == 1
    assert not risk.pending
    # log(14 / 10) = 0.336 falls in the bin [0.325, 0.35).
    (hit,) = [i for i, w in enumerate(risk.histogram) if w > 0]
    assert hit == int((math.log(1.4) + 0.5) / 0.025)
    assert risk.loss == pytest.approx(2 / 25), "2 of the 25 observed waited"


def test_missing_demand_adds_nothing_and_an_unobserved_lookahead_is_not_scored() -> None:
    obj = objective()
    risk = record_risk(PeakRisk(), 0, 10, base=10, sized=10)
    for bad in (None, math.nan, -1.0, math.inf):
        assert observe_risk(risk, obj, 5, bad).pending == risk.pending
    ended = observe_risk(risk, obj, 11, None)
    assert ended.outcomes == 0
    assert not ended.pending
    assert not ended.histogram


def test_garbage_capacity_reads_as_unknown() -> None:
    """A ready capacity that is no number scores against the sized demand, as an absent
    one does; a shadow HPA's that is no number is not scored at all."""
    obj = objective()
    risk = record_risk(PeakRisk(), 0, 10, base=10, sized=12)
    absent = observe_risk(risk, obj, 5, 14.0, hpa_ready_capacity=11.0)
    assert absent.pending[0].waited > 0
    assert absent.pending[0].hpa_seen == 1
    for bad in (math.nan, math.inf, -math.inf):
        seen = observe_risk(risk, obj, 5, 14.0, ready_capacity=bad, hpa_ready_capacity=bad)
        assert seen.pending[0].waited == absent.pending[0].waited
        assert seen.pending[0].seen == 1
        assert seen.pending[0].hpa_seen == 0
        assert seen.pending[0].hpa_waited == 0


def test_the_forecast_band_stands_in_until_enough_lookaheads_have_ended() -> None:
    obj = objective(min_outcomes=3)
    risk = PeakRisk()
    for k in range(2):
        risk = one_lookahead(risk, obj, 100 * k, 10, [12.0])
    assert not risk_sizing(risk, obj).calibrated
    risk = one_lookahead(risk, obj, 300, 10, [12.0])
    sizing = risk_sizing(risk, obj)
    assert sizing.calibrated
    # Every ratio was 1.2: the margin is the upper edge of its bin, never below it.
    assert 1.2 <= sizing.margin <= 1.2 * math.exp(0.025)


def test_misses_raise_the_level_calm_lowers_it_and_no_objective_keeps_it() -> None:
    obj = objective(level=0.9, served_fraction=0.99, adapt_rate=0.1)
    missed = one_lookahead(PeakRisk(), obj, 0, 10, [20.0, 20.0])
    assert missed.level_at(0, DAY) == pytest.approx(0.9 + 0.1 * (0.5 - 0.01))
    calm = one_lookahead(PeakRisk(), obj, 0, 10, [5.0, 8.0])
    # Weighted by its mean demand (6.5) over the typical demand when it ended (5).
    assert calm.level_at(0, DAY) == pytest.approx(0.9 - 0.1 * (6.5 / 5.0) * 0.01)
    fixed = objective(adapt_rate=0)
    assert one_lookahead(PeakRisk(), fixed, 0, 10, [20.0]).level_at(0, DAY) is None
    top = objective(level=0.999, adapt_rate=1.0)
    assert one_lookahead(PeakRisk(), top, 0, 10, [50.0]).level_at(0, DAY) == 0.999, "bounded"


HOUR = 3600.0


def test_each_hour_of_the_day_keeps_its_own_level() -> None:
    # A ramp missed at 08:00 raises 08:00's level: the margin at 08:00 tomorrow is the
    # raised one, while the hours after it size at the level they had (a Mondrian split:
    # one level for the day swung high for the quiet hours after each ramp).
    obj = objective(level=0.9, served_fraction=0.99, adapt_rate=0.1)
    risk = PeakRisk()
    for k in range(3):  # calibrated (min_outcomes 3) by calm lookaheads at 03:00
        risk = one_lookahead(risk, obj, 3 * HOUR + 20 * k, 10, [10.0])
    calm_level = risk.level_at(3 * HOUR, DAY)
    risk = one_lookahead(risk, obj, 8 * HOUR, 10, [20.0, 20.0])
    assert len(risk.levels) == LEVEL_BUCKETS
    raised = risk.level_at(8 * HOUR, DAY)
    assert raised is not None
    assert calm_level is not None
    assert raised > 0.9 + 0.1 * (0.5 - 0.01) > 0.9 > calm_level
    assert risk.level_at(3 * HOUR, DAY) == calm_level, "a miss at 08:00 leaves 03:00 alone"
    assert risk.level_at(9 * HOUR, DAY) == 0.9, "nor the hour after it"
    tomorrow = 86400 + 8 * HOUR + 60
    assert risk_sizing(risk, obj, tomorrow).level == risk.level_at(8 * HOUR, DAY)
    assert risk_sizing(risk, obj, 9 * HOUR).level == 0.9
    assert risk_sizing(risk, obj, tomorrow).margin >= risk_sizing(risk, obj, 9 * HOUR).margin
    # Without a time, the hour demand was last observed in.
    assert risk_sizing(risk, obj).level == risk.level_at(risk.observed_at, DAY)


def test_a_busy_lookaheads_miss_moves_the_level_more_than_a_quiet_ones() -> None:
    # The objective is a share of demand: the same share waiting in a lookahead twice as
    # busy as usual is twice the demand, and moves the level twice as far (at most 4 x).
    typical = Lookahead(start=0, end=10, base=10, sized=10, demand=30.0, seen=3)
    assert demand_weight(typical, 10.0) == pytest.approx(1.0)
    busy = Lookahead(start=0, end=10, base=10, sized=10, demand=60.0, seen=3)
    assert demand_weight(busy, 10.0) == pytest.approx(2.0)
    burst = Lookahead(start=0, end=10, base=10, sized=10, demand=3000.0, seen=3)
    assert demand_weight(burst, 10.0) == WEIGHT_CAP
    assert demand_weight(busy, None) == 1.0
    assert demand_weight(busy, 0.0) == 1.0


def test_over_time_the_share_that_waited_tracks_the_objective() -> None:
    # Ratios peak/base uniform over 1.0 .. 2.0; a miss leaves the share above the margin.
    obj = objective(served_fraction=0.95, level=0.5, adapt_rate=0.2, min_outcomes=20)
    risk = PeakRisk()
    shares = []
    for k in range(3000):
        ratio = 1.0 + ((k * 0.6180339887) % 1.0)
        sizing = risk_sizing(risk, obj)
        sized = 10 * (sizing.margin or 1.5)
        risk = record_risk(risk, 20 * k, 20 * k + 10, 10, sized)
        risk = observe_risk(risk, obj, 20 * k + 5, 10 * ratio, ready_capacity=sized)
        risk = observe_risk(risk, obj, 20 * k + 11, None)
        if k >= 1000:
            shares.append(max(0.0, 10 * ratio - sized) / (10 * ratio))
    assert sum(shares) / len(shares) == pytest.approx(0.05, abs=0.01)


def test_what_waits_is_the_excess_and_the_queue_ahead() -> None:
    assert waiting_demand(10, 12, None, None) == 0
    assert waiting_demand(10, 8, None, None) == 2
    assert waiting_demand(10, 12, 30, 30) == 1, "30 waiting over 30 s: 1/s of it waits"
    assert waiting_demand(10, 12, 3000, 30) == 10, "a long queue: everything waits"
    assert waiting_demand(10, 12, math.nan, 30) == 0


# ------------------------------------------------------------------------- planner


def capacity() -> CapacityModel:
    # One replica serves 10 requests/s.
    return CapacityModel(tokens=TokenProfile(900, 100), tokens_per_second=10_000)


def inputs(risk: RiskSizing | None, observed: float | None, current: int = 1) -> PlanInputs:
    forecast = Forecast(tuple(Point(60.0 * k, 30.0, 60.0) for k in range(1, 11)), 0)
    return PlanInputs(
        now=0,
        capacity=capacity(),
        fleet=FleetState(current_replicas=current, observed_requests_per_second=observed),
        policy=ScalingPolicy(max_replicas=100, scale_down_mode="forecast"),
        cold_start_seconds=240,
        forecast=forecast,
        risk=risk,
    )


SIZED = RiskSizing(margin=1.25, level=0.9, typical=10, calibrated=True)


def test_the_plan_sizes_what_is_known_now_plus_the_typical_demand_times_the_margin() -> None:
    # (30 + 10 typical) x 1.25 - 10 = 40: four replicas of 10 requests/s.
    decided = plan(inputs(SIZED, observed=20))
    assert (decided.risk_base, decided.risk_sized, decided.risk_unit) == (30, 40, 10)
    assert decided.desired_replicas == 4
    assert decided.driver == "forecast"
    # The observed level is part of what is known: above the forecast, it is the base.
    above = plan(inputs(SIZED, observed=40))
    assert above.risk_base == 40
    assert above.risk_sized == 52.5
    assert above.desired_replicas == 6
    # A quiet pool's typical demand is at least one replica's worth.
    quiet = plan(inputs(replace(SIZED, typical=0), observed=20))
    assert quiet.risk_unit == 10
    # Until calibrated, the forecast's own upper band stands in (or what arrives now).
    band = plan(inputs(RiskSizing(margin=1.0, level=0.9), observed=20))
    assert band.risk_sized == 60
    assert band.desired_replicas == 6
    burst = plan(inputs(RiskSizing(margin=1.0, level=0.9), observed=70))
    assert burst.risk_sized == 70


def rising(observed: float, means: tuple[float, ...]) -> PlanInputs:
    """:func:`inputs` with the forecast's means per minute from ``means`` (the last one
    held), the first minute holding now."""
    held = means + (means[-1],) * (10 - len(means))
    forecast = Forecast(tuple(Point(60.0 * (k + 1), m, 2 * m) for k, m in enumerate(held)), 0)
    return replace(inputs(SIZED, observed=observed), forecast=forecast)


def test_a_forecast_that_runs_low_still_climbs_from_where_demand_is() -> None:
    # The forecast climbs from 20 now to 30 within the lookahead; demand runs at 30 (1.5x
    # the forecast's now): the ramp climbs from there, to 30 x 30 / 20 = 45.
    climb = (20.0, 22.0, 25.0, 28.0, 30.0)
    low = plan(rising(30, climb))
    assert low.risk_base == pytest.approx(45)
    assert "the forecast's climb" in low.reason
    assert low.risk_sized == pytest.approx((45 + 10) * 1.25 - 10)
    # Demand at or below the forecast's now: the forecast's own peak, as before.
    assert plan(rising(20, climb)).risk_base == 30
    assert plan(rising(15, climb)).risk_base == 30
    # A flat or falling forecast has no climb: what arrives now is the base.
    assert plan(rising(40, (20.0,))).risk_base == 40
    assert plan(rising(40, (20.0, 18.0, 15.0))).risk_base == 40
    # Without an observation, nothing to climb from.
    blind = rising(30, climb)
    blind = replace(blind, fleet=replace(blind.fleet, observed_requests_per_second=None))
    assert plan(blind).risk_base == 30


def test_the_margin_sizes_at_most_twice_the_largest_demand_seen() -> None:
    # A margin of 4 on (30 + 10) - 10 = 150, more than twice the peak seen (50): 100.
    wide = replace(SIZED, margin=4.0, peak=50.0)
    capped = plan(inputs(wide, observed=20))
    assert capped.risk_sized == 100
    assert capped.desired_replicas == 10
    assert "at most 2x the peak seen" in capped.reason
    # What is known now may ask for more than the ceiling: it is never cut below that.
    above = plan(inputs(replace(wide, peak=10.0), observed=20))
    assert above.risk_sized == 30
    # Without a peak yet (or below the ceiling) the margin stands as it is.
    assert plan(inputs(replace(wide, peak=None), observed=20)).risk_sized == 150
    assert plan(inputs(replace(SIZED, peak=50.0), observed=20)).risk_sized == 40
    # Until calibrated, the forecast band's margin is under the same ceiling: a band of
    # 60 over a mean of 30, with a peak seen of 20, sizes 40 (never below the mean's 30).
    band = RiskSizing(margin=1.0, level=0.9, peak=20.0)
    uncalibrated = plan(inputs(band, observed=20))
    assert uncalibrated.risk_sized == 40
    assert "at most 2x the peak seen" in uncalibrated.reason
    assert plan(inputs(replace(band, peak=5.0), observed=20)).risk_sized == 30


def test_the_peak_seen_is_the_largest_demand_fading_toward_the_typical() -> None:
    obj = objective(memory=10.0)
    risk = PeakRisk()
    for t, demand in enumerate([10.0, 50.0, 10.0]):
        risk = observe_risk(risk, obj, float(t), demand)
    assert risk.peak_demand is not None
    assert 40 < risk.peak_demand < 50
    for t in range(3, 200):
        risk = observe_risk(risk, obj, float(t), 10.0)
    assert risk.peak_demand == pytest.approx(10.0, rel=0.01)
    assert risk_sizing(risk, obj).peak == risk.peak_demand
    # It is kept in the status with the rest of the calibration.
    restored = peak_risk(risk_status(risk, None))
    assert restored.peak_demand == pytest.approx(risk.peak_demand, rel=1e-6)


def test_a_release_keeps_what_the_risk_model_sizes_for_the_lookahead() -> None:
    sizing = SIZED
    decided = plan(inputs(sizing, observed=20, current=9))
    assert decided.action == "scale_down"
    # 40 req/s sized: 4 replicas, and the HPA's tolerance (10 %) to spare: 5.
    assert (decided.target_replicas, decided.desired_replicas) == (4, 5)
    # Without the risk model, the old band over lookahead plus period holds more.
    old = plan(inputs(None, observed=20, current=9))
    assert old.desired_replicas == 6


# ------------------------------------------------------------------------- status


def test_the_calibration_survives_a_restart_through_the_status() -> None:
    obj = objective()
    risk = PeakRisk()
    for k in range(5):
        risk = one_lookahead(risk, obj, 100 * k, 10, [11.0 + k, 30.0])
    risk = record_risk(risk, 1000, 1300, 12, 15)
    risk = observe_risk(risk, obj, 1001, 13.0, ready_capacity=15)
    kept = risk_status(risk, risk_sizing(risk, obj))
    restored = peak_risk(kept.model_validate(kept.model_dump(by_alias=True)))
    assert restored.level_at(0, DAY) == pytest.approx(risk.level_at(0, DAY) or 0, abs=1e-6)
    assert len(restored.histogram) == LOG_BINS
    assert restored.histogram == pytest.approx(risk.histogram, abs=1e-3)
    assert restored.pending == risk.pending
    assert risk_sizing(restored, obj).margin == pytest.approx(risk_sizing(risk, obj).margin)
    assert restored.levels == pytest.approx(risk.levels, abs=1e-6)


def test_a_status_from_before_the_hourly_levels_gives_its_level_to_every_hour() -> None:
    obj = objective()
    risk = one_lookahead(PeakRisk(), obj, 0, 10, [20.0])
    kept = risk_status(risk, risk_sizing(risk, obj))
    old = kept.model_validate({**kept.model_dump(by_alias=True), "quantiles": []})
    restored = peak_risk(old)
    assert kept.quantile is not None
    assert restored.levels == (kept.quantile,) * LEVEL_BUCKETS


def test_a_plan_without_the_risk_model_records_no_lookahead() -> None:
    decided = plan(inputs(None, observed=20))
    assert remember_plan(PeakRisk(), decided) == PeakRisk()
    with_risk = plan(inputs(SIZED, observed=20))
    (look,) = remember_plan(PeakRisk(), with_risk).pending
    assert (look.start, look.end, look.sized, look.unit) == (0, 300, 40, 10)


def relative(rho: float = 0.5, floor: float = 0.001, **kw: float) -> RiskObjective:
    base = objective(**kw)
    return replace(base, served_fraction=None, relative_to_hpa=rho, relative_floor=floor)


def hpa_lookahead(
    risk: PeakRisk,
    obj: RiskObjective,
    t: float,
    demand: float,
    ready: float,
    hpa_ready: float | None,
) -> PeakRisk:
    """A lookahead [t, t + 10] with ``demand`` observed ten times, against our ready
    capacity and the shadow HPA's."""
    risk = record_risk(risk, t, t + 10, demand, demand)
    for i in range(10):
        risk = observe_risk(risk, obj, t + 1 + i, demand, ready, None, hpa_ready, None)
    return observe_risk(risk, obj, t + 11, None)


def test_the_relative_objective_targets_a_share_of_what_the_hpa_left_waiting() -> None:
    obj = relative(rho=0.5, floor=0.001, level=0.9, adapt_rate=0.1)
    # The HPA's ready capacity leaves 40 % of the demand waiting; ours leaves 10 %: below
    # half the HPA's, so the level falls, and the target is 0.2.
    risk = hpa_lookahead(PeakRisk(), obj, 0, 100.0, 90.0, 60.0)
    assert risk.target == pytest.approx(0.2)
    assert risk.loss == pytest.approx(0.1)
    assert risk.level_at(0, DAY) == pytest.approx(0.9 + 0.1 * (0.1 - 0.2))
    # The same miss where the HPA would have kept up is held to the floor: the level rises.
    kept_up = hpa_lookahead(PeakRisk(), obj, 0, 100.0, 90.0, 100.0)
    assert kept_up.level_at(0, DAY) == pytest.approx(0.9 + 0.1 * (0.1 - 0.001))
    # Absolute: 1 - servedFraction whatever the HPA did.
    absolute = hpa_lookahead(PeakRisk(), objective(level=0.9, adapt_rate=0.1), 0, 100, 90, 60)
    assert absolute.target == pytest.approx(0.01)
    assert absolute.level_at(0, DAY) == pytest.approx(0.9 + 0.1 * (0.1 - 0.01))


def test_the_relative_target_is_the_hpa_s_record_on_the_pool_not_in_the_same_minutes() -> None:
    """A ramp that catches the HPA out is held to ρ times the HPA's share over recent
    lookaheads, not to ρ times its share in the ramp: the ramp is where a forecast wins,
    and a target that gave there as the HPA does left as much waiting there as the HPA."""
    obj = relative(rho=0.5, floor=0.001, level=0.9, adapt_rate=0.1, memory=1e9)
    risk = PeakRisk()
    for k in range(3):  # three calm lookaheads: neither fleet leaves anything waiting
        risk = hpa_lookahead(risk, obj, 20 * k, 100.0, 200.0, 200.0)
    assert risk.hpa_share == pytest.approx(0.0)
    assert risk.target == pytest.approx(0.001)
    # The ramp: the HPA leaves 40 % waiting, ours 10 %. Its share over the four lookaheads
    # is 10 %, so the target is 5 % (not 20 %, half of the ramp's own 40 %) and the ramp's
    # hour's level rises (it falls under a target of 20 %).
    before = risk.level_at(60, DAY)
    ramp = hpa_lookahead(risk, obj, 60, 100.0, 90.0, 60.0)
    assert ramp.hpa_share == pytest.approx(0.1)
    assert ramp.level_at(60, DAY) == pytest.approx((before or 0) + 0.1 * (0.1 - 0.05))
    # The restored status goes on from the same record.
    restored = peak_risk(risk_status(ramp, risk_sizing(ramp, obj), obj))
    assert restored.hpa_share == pytest.approx(0.1)


def test_a_quiet_pool_under_the_relative_objective_gets_cheaper() -> None:
    """Neither fleet leaves anything waiting: the level falls by the floor each time, so
    it is not driven to the top by a target of zero."""
    obj = relative(rho=0.5, floor=0.01, level=0.99, adapt_rate=0.5)
    risk = PeakRisk()
    for k in range(20):
        risk = hpa_lookahead(risk, obj, 20 * k, 100.0, 200.0, 200.0)
    assert risk.level_at(0, DAY) is not None
    assert risk.level_at(0, DAY) < 0.99 - 20 * 0.5 * 0.01 + 1e-9
    assert risk.target == pytest.approx(0.01)


def test_without_a_shadow_hpa_the_relative_objective_holds_to_its_floor() -> None:
    obj = relative(rho=0.5, floor=0.002, level=0.9, adapt_rate=0.1)
    risk = hpa_lookahead(PeakRisk(), obj, 0, 100.0, 90.0, None)
    assert risk.target == pytest.approx(0.002)


def test_a_relative_objective_needs_a_share_in_range() -> None:
    with pytest.raises(ValueError, match="relative to HPA"):
        replace(objective(), served_fraction=None)
    with pytest.raises(ValueError, match="relative to HPA"):
        relative(rho=0.0)
    with pytest.raises(ValueError, match="floor"):
        relative(floor=1.5)


def test_the_status_names_the_objective_in_force_and_keeps_its_target() -> None:
    obj = relative(rho=0.5, floor=0.001, level=0.9, adapt_rate=0.1)
    risk = hpa_lookahead(PeakRisk(), obj, 0, 100.0, 90.0, 60.0)
    status = risk_status(risk, risk_sizing(risk, obj), obj)
    assert status.objective == "relativeToHpa"
    assert status.target_waited_fraction == pytest.approx(0.2)
    assert peak_risk(status).target == pytest.approx(0.2)
    assert risk_status(risk, None, objective()).objective == "servedFraction"


def steady(
    risk: PeakRisk,
    obj: RiskObjective,
    minutes: int,
    ratio: float,
    hours: float = 24.0,
    hpa_ready: float = 80.0,
) -> PeakRisk:
    """``minutes`` of observations every 15 s: demand 100 (the HPA's ready capacity
    ``hpa_ready``: 80 leaves 20 % waiting; ours 100), the trailing day's GPU-hours
    ``ratio`` x the shadow HPA's over ``hours``; a lookahead a minute."""
    t = risk.observed_at if risk.observed_at is not None else 0.0
    spend = Spend(gpu_hours=ratio * 100.0, hpa_gpu_hours=100.0, hours=hours)
    for _ in range(minutes):
        risk = record_risk(risk, t, t + 60, 100.0, 100.0)
        for _ in range(4):
            t += 15
            risk = observe_risk(risk, obj, t, 100.0, 100.0, None, hpa_ready, None, spend)
    return risk


def budgeted(rho: float = 0.1, floor: float = 0.0001) -> RiskObjective:
    return replace(relative(rho=rho, floor=floor, level=0.9), budget_to_hpa=0.9)


def test_a_pool_cheaper_than_its_budget_spends_the_difference_on_waiting_less() -> None:
    """Under budget the scale on ε falls (the proportional step at once, the integral
    over the day), to a tenth of ρ at most; the target follows, and the controller's
    state survives a restart through the status."""
    obj = budgeted(rho=0.5)
    risk = steady(PeakRisk(), obj, 10, ratio=0.8)
    assert risk.capacity_ratio == pytest.approx(0.8)
    error = math.log(0.8 / 0.9)
    # Ten minutes at the error (the first observation has no interval: nothing to weigh).
    integral = BUDGET_RATE * error * (10 * 60 - 15) / DAY
    assert risk.budget_integral == pytest.approx(integral)
    assert math.log(risk.relative_scale) == pytest.approx(integral + BUDGET_GAIN * error)
    share = risk.hpa_share or 0.0
    assert risk.target is not None
    assert risk.target < 0.5 * share
    status = risk_status(risk, risk_sizing(risk, obj), obj)
    assert status.budget is not None
    assert status.budget.binds == "objective"
    assert status.budget.gpu_hours_to_hpa == pytest.approx(0.8)
    assert status.budget.budget_to_hpa == 0.9
    assert status.budget.scale == pytest.approx(risk.relative_scale, rel=1e-5)
    assert status.budget.target_waited_fraction == pytest.approx(
        obj.target(share, risk.relative_scale), rel=1e-5
    )
    assert "under the budget" in status.budget.message
    restored = peak_risk(status)
    assert restored.budget_integral == pytest.approx(risk.budget_integral, abs=1e-6)
    assert restored.relative_scale == pytest.approx(risk.relative_scale, rel=1e-5)
    # Days below the budget: the scale stops at its least, the floor holding.
    low = steady(restored, obj, 10 * 24 * 60, ratio=0.6)
    assert low.relative_scale == pytest.approx(MIN_RELATIVE_SCALE)
    assert low.budget_integral == pytest.approx(math.log(MIN_RELATIVE_SCALE))
    assert obj.target(share, low.relative_scale) == pytest.approx(0.5 * MIN_RELATIVE_SCALE * share)
    assert obj.target(0.0, low.relative_scale) == obj.relative_floor


def test_a_pool_dearer_than_its_budget_waits_more_past_rho_and_past_the_hpa() -> None:
    """Over budget the scale rises above 1: ε goes past ρ times the HPA's share and, if
    need be, past the HPA's share itself, to at most BUDGET_MAX_TARGET; the status says
    the budget binds. Back under budget, the scale comes down again (binding both ways)."""
    obj = replace(budgeted(rho=0.1), adapt_rate=0.0)  # the levels never reach their least
    dear = steady(PeakRisk(), obj, 5 * 24 * 60, ratio=1.8, hpa_ready=95.0)
    share = dear.hpa_share or 0.0
    assert share == pytest.approx(0.05)
    assert dear.relative_scale > 1 / 0.1  # past the HPA's own share
    eps = obj.target(share, dear.relative_scale)
    assert share < eps <= BUDGET_MAX_TARGET or eps == pytest.approx(BUDGET_MAX_TARGET)
    status = risk_status(dear, None, obj).budget
    assert status is not None
    assert status.binds == "budget"
    assert "the budget binds" in status.message
    # Held long at its ceiling, the integral did not wind up: the first hours back under
    # budget bring ε below the ceiling at once (the proportional step) and on down.
    ceiling = obj.budget_ceiling(share)
    assert dear.relative_scale == pytest.approx(ceiling)
    assert dear.budget_integral <= math.log(ceiling) + 1e-9
    back = steady(dear, obj, 60, ratio=0.8, hpa_ready=95.0)
    assert back.relative_scale < ceiling * math.exp(BUDGET_GAIN * math.log(0.8 / 0.9) * 0.99)
    later = steady(back, obj, 6 * 24 * 60, ratio=0.45, hpa_ready=95.0)
    assert later.relative_scale < 1.0
    assert risk_status(later, None, obj).budget.binds == "objective"  # type: ignore[union-attr]


def test_raising_epsilon_stops_where_the_levels_cannot_fall_further() -> None:
    """Anti-windup: with every hour's level at its least, a higher ε buys nothing, so the
    integral holds (the bounded proportional term stays); at its most, it does not fall."""
    integral, scale = budget_step(0.5, 1.2, 24.0, 0.9, 60.0, 100.0, may_loosen=False)
    assert integral == 0.5
    assert scale == pytest.approx(math.exp(0.5 + BUDGET_GAIN * math.log(1.2 / 0.9)))
    assert budget_step(0.5, 1.2, 24.0, 0.9, 60.0, 100.0)[0] > 0.5
    assert budget_step(-0.5, 0.8, 24.0, 0.9, 60.0, 100.0, may_tighten=False)[0] == -0.5
    # The levels at their least through observe_risk.
    obj = replace(budgeted(), min_level=0.9)  # the levels start at 0.9: at their least
    risk = replace(PeakRisk(), levels=(0.9,) * LEVEL_BUCKETS)
    held = steady(risk, obj, 60, ratio=1.2)
    assert held.budget_integral == 0.0
    assert held.relative_scale == pytest.approx(math.exp(BUDGET_GAIN * math.log(1.2 / 0.9)))


def test_a_short_record_or_a_wild_one_moves_the_budget_slower() -> None:
    """The error is weighted by the record's coverage (hours of 24) and clipped to
    BUDGET_ERROR_CAP: a few hours, or a day ten times over budget, cannot swing ε."""
    full = budget_step(0.0, 1.2, 24.0, 0.9, 60.0, 100.0)
    short = budget_step(0.0, 1.2, 6.0, 0.9, 60.0, 100.0)
    assert short[0] == pytest.approx(full[0] / 4)
    wild = budget_step(0.0, 9.0, 24.0, 0.9, 60.0, 100.0)
    assert math.log(wild[1]) == pytest.approx(
        BUDGET_ERROR_CAP * (BUDGET_GAIN + BUDGET_RATE * 60.0 / DAY)
    )
    assert budget_step(0.0, float("nan"), 24.0, 0.9, 60.0, 100.0) == (0.0, 1.0)


def _closed_loop(
    gain: float, lag_days: float, start: float, days: int = 14, rate: float | None = None
) -> list[float]:
    """The budget's controller on a model of the loop over a repeating day: the pool's
    cost ratio at each minute is ``start`` times a daily cycle (dearer in the day's ramp
    hours, cheaper at night; mean 1), times ``exp(-gain * y)``, where ``y`` follows the log
    of the scale through a first-order lag of ``lag_days`` (the levels adapting to a new
    ε); the controller reads the trailing day of it (a sliding 24 h mean), as the shadow's
    record gives it. Returns the trailing day's ratio at the end of each day."""
    minutes = 1440
    window: list[float] = []
    integral, scale, y = 0.0, 1.0, 0.0
    daily: list[float] = []
    for k in range(days * minutes):
        y += (math.log(scale) - y) / (lag_days * minutes)
        cycle = 1.0 + 0.3 * math.sin(2 * math.pi * k / minutes)
        window.append(start * cycle * math.exp(-gain * y))
        if len(window) > minutes:
            window.pop(0)
        ratio = sum(window) / len(window)
        if rate is None:
            integral, scale = budget_step(integral, ratio, len(window) / 60, 0.9, 60.0, 1e4)
        else:  # the same with another integral rate (the proportional term off)
            error = math.log(ratio / 0.9) * min(1.0, len(window) / minutes)
            integral += rate * error / minutes
            scale = math.exp(integral)
        if (k + 1) % minutes == 0:
            daily.append(ratio)
    return daily


@pytest.mark.parametrize("gain", [0.1, 0.3, 0.5])
@pytest.mark.parametrize("lag_days", [0.25, 1.0, 2.0])
def test_the_budget_converges_on_a_daily_series_without_oscillating(
    gain: float, lag_days: float
) -> None:
    """A pool 1.3 x its HPA's GPU-hours with a budget of 0.9: the trailing day's ratio
    falls to the budget and does not swing past it by more than 10 % of the first gap
    (no oscillation: at most one crossing of the budget), whatever the cost's sensitivity
    to ε (its log falls by ``gain`` per unit of log ε) and however slowly the levels
    follow (``lag_days``). Mirrored: a pool at 0.7 x tightens toward the budget."""
    for start in (1.3, 0.7):
        daily = _closed_loop(gain, lag_days, start, days=30)
        gap = math.log(start / 0.9)
        errors = [math.log(r / 0.9) / gap for r in daily]  # 1 at the start, 0 at the budget
        assert min(errors) > -0.1, errors  # bounded overshoot
        # A swing is a move from one side of the budget to the other by more than 2 %.
        sides = [math.copysign(1.0, e) for e in errors if abs(e) > 0.02]
        swings = sum(1 for a, b in itertools.pairwise(sides) if a != b)
        assert swings <= 1, errors
        # Settled, and staying there: the last ten days within a band.
        assert max(abs(e) for e in errors[-10:]) < (0.1 if gain >= 0.3 else 0.4), errors


def test_a_faster_integral_alone_would_oscillate() -> None:
    """The design's reason for its proportional term: on the same model, an integral
    controller twice as fast and without it swings past the budget by more than a
    quarter of the first gap where the cost is sensitive and the levels slow."""
    daily = _closed_loop(1.0, 2.0, 1.3, days=30, rate=2 * BUDGET_RATE)
    errors = [math.log(r / 0.9) / math.log(1.3 / 0.9) for r in daily]
    assert min(errors) < -0.25


def test_without_a_budget_or_the_hpa_s_record_epsilon_stays_as_it_is() -> None:
    cheap = steady(PeakRisk(), relative(rho=0.5), 60, ratio=0.5)
    assert cheap.relative_scale == 1.0
    assert cheap.spend is None
    assert risk_status(cheap, None, relative(rho=0.5)).budget is None
    obj = budgeted(rho=0.5)
    risk = PeakRisk()
    for k in range(40):  # no shadow HPA seen: no record, no scale
        risk = observe_risk(risk, obj, 15.0 * k, 100.0, 40.0, None, None, None)
    assert risk.relative_scale == 1.0
    assert risk.capacity_ratio is None
    status = risk_status(risk, None, obj).budget
    assert status is not None
    assert status.binds == "objective"
    assert status.gpu_hours_to_hpa is None
    # An empty record (no hours, no HPA GPU-hours) is no record.
    empty = steady(PeakRisk(), obj, 5, ratio=1.0, hours=0.0)
    assert empty.relative_scale == 1.0
    # An absolute objective keeps no record either.
    absolute = replace(objective(), budget_to_hpa=0.9)
    assert not absolute.budgeted
    with pytest.raises(ValueError, match="budget"):
        replace(relative(rho=0.5), budget_to_hpa=0.0)


def test_a_garbage_budget_state_in_status_starts_afresh() -> None:
    obj = budgeted(rho=0.5)
    status = risk_status(steady(PeakRisk(), obj, 5, 0.8), None, obj)
    assert status.budget is not None
    for garbage in ({"scale": 0.0}, {"scale": float("inf")}, {"integral": float("nan")}):
        broken = status.model_copy(update={"budget": status.budget.model_copy(update=garbage)})
        restored = peak_risk(broken)
        assert restored.relative_scale == 1.0
        assert restored.budget_integral == 0.0


def test_the_hours_follow_the_pools_day() -> None:
    # A pool whose day is played ten times faster (seasonalityPeriods [8640, ...]) learns
    # its ramp's level by the hour of that day, not of the wall clock's.
    spec = parse_spec(
        {
            "target": {"name": "llm"},
            "model": {"tokensPerSecond": 3750, "promptTokens": 600, "outputTokens": 150},
            "forecast": {
                "prometheus": {"url": "http://prometheus:9090"},
                "seasonalityPeriods": [60480, 8640],
            },
        }
    )
    obj = replace(risk_objective(spec), served_fraction=0.99, adapt_rate=0.1, min_outcomes=3)
    assert obj.day_seconds == 8640
    ramp = 8 * 360.0  # 08:00 of the compressed day
    risk = one_lookahead(PeakRisk(), obj, ramp, 10, [20.0, 20.0])
    raised = risk.level_at(ramp, obj.day_seconds)
    assert raised is not None
    assert raised > obj.level
    assert risk.level_at(ramp + 8640, obj.day_seconds) == raised, "the next compressed day"
    assert risk.level_at(ramp + 3600, obj.day_seconds) == obj.level, "ten of its hours on"
    assert risk_sizing(risk, obj, ramp + 8640).level == raised
