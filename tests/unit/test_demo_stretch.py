"""The demo's stretch rule (hack/demo/prescaler_demo/scenario.py): the strongest *recurring*
ramp that the seasonal history foretells, not the largest surprise; and the pool it
renders tells the forecaster the trace's compressed day and week."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from prescaler.api import parse_spec
from prescaler.backtest.traces import Trace

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hack" / "demo"))

from prescaler_demo.scenario import (
    Options,
    Scenario,
    TokenMeans,
    choose_among,
    choose_stretch,
    foretold_ramp,
    ramp,
    tenant_traces,
)

STEP = 600.0
DAY_STEPS = 144


def _trace(rps: np.ndarray) -> Trace:
    return Trace(start=1_704_067_200.0, step_seconds=STEP, rps=rps, name="synthetic")


def _days(n: int, base: float = 100.0) -> np.ndarray:
    """``n`` days of flat demand with a daily ramp at 10:00 (steps 60-63: x1.5) and the
    evening calm; every day alike."""
    day = np.full(DAY_STEPS, base)
    day[62:66] = base * np.array([1.2, 1.4, 1.5, 1.5])
    return np.tile(day, n)


def test_ramp_is_the_highest_held_level_after_the_lead_in_over_its_mean() -> None:
    assert ramp(np.array([100.0, 100.0, 120.0, 150.0, 150.0]), 2) == pytest.approx(1.5)
    assert ramp(np.array([100.0, 50.0, 90.0, 90.0]), 2) == pytest.approx(1.2)
    # A lone step is a blip: the level held for two steps counts.
    assert ramp(np.array([100.0, 100.0, 400.0, 120.0, 110.0]), 2) == pytest.approx(1.2)
    assert ramp(np.array([100.0, 100.0, 400.0, 120.0]), 2, hold=1) == pytest.approx(4.0)
    assert math.isnan(ramp(np.array([100.0, math.nan, 150.0]), 1))  # a gap
    assert math.isnan(ramp(np.array([100.0, 0.0, 150.0]), 1))  # zero: a collection gap
    assert math.isnan(ramp(np.array([100.0, 120.0]), 2))  # nothing after the lead-in
    assert math.isnan(ramp(np.array([100.0, 100.0, 120.0]), 2))  # nothing held after it


def test_foretold_is_the_median_over_the_days_before() -> None:
    rps = _days(9)
    start = 8 * DAY_STEPS + 60
    foretold, days = foretold_ramp(rps, start, 6, 2, DAY_STEPS, 7)
    assert days == 7
    assert foretold == pytest.approx(1.5)
    rps[start - DAY_STEPS : start - DAY_STEPS + 6] = np.nan  # yesterday's gap: one day fewer
    assert foretold_ramp(rps, start, 6, 2, DAY_STEPS, 7)[1] == 6


def test_the_recurring_ramp_wins_over_a_larger_surprise() -> None:
    rps = _days(10)
    # One burst on day 9 at 03:00 (x3), that no earlier day had.
    burst = 8 * DAY_STEPS + 20
    rps[burst + 3 : burst + 5] = 300.0
    st = choose_stretch(_trace(rps), 6, lead_steps=2)
    # The daily ramp (steps 62-65 of a day), after a flat two-step lead-in.
    seg = st.live_rps
    assert list(seg[:2]) == [100.0, 100.0]
    assert seg.max() == 150.0
    assert 56 <= st.start_index % DAY_STEPS <= 60
    assert st.start_index >= 7 * DAY_STEPS  # after a week of history
    assert st.rise == pytest.approx(1.5)
    assert st.foretold == pytest.approx(1.5)
    assert st.score == pytest.approx(1.5)
    assert st.lead_steps == 2
    # The surprise scores only what its ordinary days foretold.
    rise = ramp(rps[burst : burst + 6], 2)
    foretold, _ = foretold_ramp(rps, burst, 6, 2, DAY_STEPS, 7)
    assert rise == pytest.approx(3.0)
    assert min(rise, foretold) < st.score


def test_a_ramp_that_does_not_happen_this_time_is_not_chosen() -> None:
    """Foretold but absent on the live day: the score is the live rise, so a smaller ramp
    that does recur and happen wins."""
    rps = _days(9)
    rps[7 * DAY_STEPS :] = 100.0  # days 8-9: the 10:00 ramp is gone...
    rps[7 * DAY_STEPS + 100 : 7 * DAY_STEPS + 104] = 115.0  # ...a small daily one at 16:40
    for d in range(7):
        rps[d * DAY_STEPS + 100 : d * DAY_STEPS + 104] = 115.0
    st = choose_stretch(_trace(rps), 6, lead_steps=2)
    assert 95 <= st.start_index % DAY_STEPS <= 98
    assert st.score == pytest.approx(1.15)


def test_needs_gap_free_days_and_a_week_of_history() -> None:
    with pytest.raises(ValueError, match="at least 2 trace steps"):
        choose_stretch(_trace(_days(9)), 1)
    with pytest.raises(ValueError, match="no gap-free stretch"):
        choose_stretch(_trace(_days(3)), 6)
    # A two-step play keeps a one-step lead-in.
    assert choose_stretch(_trace(_days(9)), 2, lead_steps=2).lead_steps == 1


def test_the_pool_tells_the_forecaster_the_compressed_day_and_week(tmp_path: Path) -> None:
    rps = _days(9)
    trace_file = tmp_path / "t.csv"
    trace_file.write_text("t\n")
    stretch = choose_stretch(_trace(rps), 6)
    scenario = Scenario(
        Options(trace=trace_file, max_replicas=16),
        stretch,
        TokenMeans(120, 15, 585),
        1.0,
        40.0,
        64,
        1.0,
    )
    assert scenario.compression == 10
    assert scenario.seasonality_periods() == [8640, 60480]
    spec = parse_spec(yaml.safe_load(scenario.pool_yaml("http://p:9090", 0.0))["spec"])
    assert spec.forecast is not None
    assert spec.forecast.seasonality_periods == [8640, 60480]
    rows = {key: value for key, value, _, _ in scenario.non_default_settings()}
    assert rows["forecast.seasonalityPeriods"] == "8640,60480"
    # The risk model's memory counts decisions (real time): a tenth as many at 10x.
    assert spec.objective.memory_lookaheads == 144
    assert rows["objective.memoryLookaheads"] == "144"


def test_a_tenants_stronger_recurring_ramp_wins_and_a_tie_keeps_the_aggregate() -> None:
    aggregate = _trace(_days(9))  # the daily 10:00 ramp, x1.5
    tenant_rps = _days(9, base=20.0)
    for d in range(9):  # a daily job at 03:00: x4 every day
        tenant_rps[d * DAY_STEPS + 20 : d * DAY_STEPS + 23] = 80.0
    tenant = Trace(aggregate.start, STEP, tenant_rps, name="tenant a")
    st = choose_among([aggregate, tenant], 6, lead_steps=2)
    assert st.trace.name == "tenant a"
    assert st.score == pytest.approx(4.0)
    assert 15 <= st.start_index % DAY_STEPS <= 18  # the 03:00 job after a flat lead-in
    # An equal ramp in a tenant does not displace the aggregate.
    twin = Trace(aggregate.start, STEP, _days(9), name="twin")
    assert choose_among([aggregate, twin], 6, lead_steps=2).trace.name == "synthetic"
    # A tenant with a one-off surprise (x4 on the last day only) scores what its days
    # foretold, so the aggregate's recurring ramp wins.
    surprise = _days(9, base=20.0)
    surprise[8 * DAY_STEPS + 20 : 8 * DAY_STEPS + 23] = 80.0
    loud = Trace(aggregate.start, STEP, surprise, name="surprise")
    assert choose_among([aggregate, loud], 6, lead_steps=2).trace.name == "synthetic"
    # Series without a qualifying stretch are skipped; with none at all, the first error.
    short = Trace(aggregate.start, STEP, _days(3), name="short")
    assert choose_among([short, aggregate], 6, lead_steps=2).trace.name == "synthetic"
    with pytest.raises(ValueError, match="short: no gap-free stretch"):
        choose_among([short], 6)


def test_tenant_series_come_from_the_per_client_file_with_the_aggregates_gaps(
    tmp_path: Path,
) -> None:
    rps = _days(1)
    rps[5] = math.nan  # a collection gap in the aggregate
    aggregate = Trace(1_704_067_200.0, STEP, rps, name="agg.csv")
    trace_file = tmp_path / "m_aggregate_rate_10min.csv"
    trace_file.write_text("t_sec,rate_rps\n")
    assert tenant_traces(trace_file, aggregate) == []  # no per-client file
    t = np.arange(DAY_STEPS) * STEP
    clients = tmp_path / "m_per_client_rate_10min.csv"
    clients.write_text(
        "t_sec,client_0,client_1,trickle\n"
        + "".join(f"{x:g},{i % 7},2.5,{0.5 + (i == 9) * 30}\n" for i, x in enumerate(t))
    )
    tenants = tenant_traces(trace_file, aggregate)
    # The trickle (0.5 req/s but for one step of 30.5) is not a pool of its own.
    assert [x.name for x in tenants] == ["agg.csv, tenant client_0", "agg.csv, tenant client_1"]
    assert (tenants[0].start, tenants[0].step_seconds) == (aggregate.start, STEP)
    assert (tenants[0].rps[3], tenants[1].rps[3]) == (3.0, 2.5)
    assert all(math.isnan(x.rps[5]) for x in tenants)
    # A file on another grid is not the trace's tenants.
    clients.write_text("t_sec,client_0\n0,1\n600,2\n")
    assert tenant_traces(trace_file, aggregate) == []
