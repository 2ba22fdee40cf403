"""``status.policy``: what a pool plans with, from ``spec.policy`` and its replays."""

from __future__ import annotations

from typing import Any

from prescaler.api import AgainstHpaWindow, InferencePoolSpec
from prescaler.controller.calibrate import Seed
from prescaler.controller.policy import check_due, check_index, policy_status, switched
from prescaler.planning import Evidence, PeakRisk

DAY = 86_400.0
NOW = 1_800_000_000.0
CURVE = ((80.0, 0.04), (90.0, 0.02), (100.0, 0.01), (120.0, 0.002), (140.0, 0.0))
PAYS = Evidence(0.002, 95.0, 0.01, 100.0, CURVE)  # 0.13 of the HPA's curve
DEAR = Evidence(0.005, 130.0, 0.01, 100.0, CURVE)  # 5 x the curve, 1.3 x the GPU-hours


def spec(**fields: Any) -> InferencePoolSpec:
    return InferencePoolSpec.model_validate(
        {
            "target": {"name": "llm"},
            "model": {"tokensPerSecond": 1000},
            "forecast": {"prometheus": {"url": "http://prometheus:9090"}},
            **fields,
        }
    )


def seed(evidence: Evidence, at: float) -> Seed:
    window = AgainstHpaWindow(
        observed_hours=24.0,
        gpu_hours=1.0,
        standby_gpu_hours=0.0,
        hpa_gpu_hours=1.0,
        saved_gpu_hours=0.0,
    )
    return Seed(PeakRisk(), window, 24.0, evidence=evidence, replayed_at=at)


def test_auto_plans_on_the_forecast_until_its_history_is_replayed() -> None:
    status = policy_status(spec(), None, None, NOW)
    assert (status.in_force, status.chosen_by) == ("forecast", "history")
    assert "no replay" in status.reason
    assert check_due(spec(), status, NOW)


def test_a_history_that_says_reactive_starts_reactive_and_says_why() -> None:
    waiting = policy_status(spec(), None, None, NOW - 60)
    status = policy_status(spec(), waiting, seed(DEAR, NOW), NOW)
    # It planned on the forecast while it waited: the first verdict is its first switch.
    assert (status.in_force, status.chosen_by, status.switches) == ("reactive", "history", 1)
    assert switched(waiting, status)
    assert status.frontier_ratio == 5.0
    assert "5.00 of the HPA's curve" in status.reason
    assert status.checked_at is not None
    assert not check_due(spec(), status, NOW + DAY - 1)
    assert check_due(spec(), status, NOW + DAY)
    # The same replay weighed again changes nothing.
    assert policy_status(spec(), status, seed(DEAR, NOW), NOW + 15) == status
    # A first verdict for the way it already planned is no switch.
    kept = policy_status(spec(), waiting, seed(PAYS, NOW), NOW)
    assert (kept.in_force, kept.switches) == ("forecast", 0)
    assert not switched(waiting, kept)


def test_the_check_period_is_the_operators_setting() -> None:
    status = policy_status(spec(), None, seed(DEAR, NOW), NOW)
    assert not check_due(spec(), status, NOW + 59, every=60)
    assert check_due(spec(), status, NOW + 60, every=60)
    # Each period's check is a replay of its own (the calibrator's key).
    assert check_index(NOW + 60, every=60) == check_index(NOW, every=60) + 1
    assert check_index(NOW + 60) == check_index(NOW)


def test_it_switches_to_the_forecast_after_two_daily_checks_in_a_row() -> None:
    status = policy_status(spec(), None, seed(DEAR, NOW), NOW)
    seen = []
    for n in range(1, 8):  # the forecast pays every day from now on
        status = policy_status(spec(), status, seed(PAYS, NOW + n * DAY), NOW + n * DAY)
        seen.append((status.in_force, status.pending))
        if status.in_force == "forecast":
            break
    # The pooled evidence turns, one check favours the forecast, the next switches.
    assert seen[-2:] == [("reactive", 1), ("forecast", 0)], seen
    assert status.switches == 1
    assert status.since is not None
    assert status.since.startswith(f"2027-01-{15 + n}")


def test_an_explicit_policy_is_never_switched() -> None:
    named = spec(policy="reactive")
    status = policy_status(named, None, seed(PAYS, NOW), NOW)
    assert (status.in_force, status.chosen_by) == ("reactive", "spec")
    assert not check_due(named, status, NOW + 7 * DAY)
    again = policy_status(named, status, seed(PAYS, NOW + DAY), NOW + DAY)
    assert again == status
    forecast = policy_status(spec(policy="forecast"), status, seed(DEAR, NOW + DAY), NOW + DAY)
    assert (forecast.in_force, forecast.switches) == ("forecast", 1)


def test_the_pooled_evidence_survives_in_the_status() -> None:
    first = policy_status(spec(), None, seed(DEAR, NOW), NOW)
    assert first.evidence is not None
    assert first.evidence.forecast_gpu_hours == DEAR.forecast_gpu_hours
    # Through the API server and back, as the next reconcile reads it.
    stored = type(first).model_validate(first.model_dump(by_alias=True))
    second = policy_status(spec(), stored, seed(PAYS, NOW + DAY), NOW + DAY)
    assert second.evidence is not None
    pooled = 0.4 * PAYS.forecast_gpu_hours + 0.6 * DEAR.forecast_gpu_hours
    assert second.evidence.forecast_gpu_hours == pooled
    assert second.evidence.curve_unserved == [u for _, u in CURVE]


LED = Evidence(0.005, 130.0, 0.01, 100.0, CURVE, 0.0045, 102.0)  # the led HPA: 0.49 of it


def test_a_history_where_the_led_hpa_pays_starts_it_and_keeps_its_evidence() -> None:
    status = policy_status(spec(), None, seed(LED, NOW), NOW)
    assert (status.in_force, status.chosen_by) == ("leading", "history")
    assert "led by the forecast" in status.reason
    assert status.frontier_ratio == 5.0
    assert status.leading_frontier_ratio is not None
    assert 0.45 < status.leading_frontier_ratio < 0.5
    stored = type(status).model_validate(status.model_dump(by_alias=True))
    assert stored.evidence is not None
    assert (stored.evidence.leading_unserved, stored.evidence.leading_gpu_hours) == (0.0045, 102.0)
    # A day where it lies on the curve: pooled with the day before, it still lies below.
    on_curve = Evidence(0.005, 130.0, 0.01, 100.0, CURVE, 0.0092, 102.0)
    later = policy_status(spec(), stored, seed(on_curve, NOW + DAY), NOW + DAY)
    assert (later.in_force, later.pending) == ("leading", 0)
    assert later.evidence is not None
    assert later.evidence.leading_unserved == 0.4 * 0.0092 + 0.6 * 0.0045


def test_an_explicit_leading_policy_is_never_switched() -> None:
    named = spec(policy="leading")
    status = policy_status(named, None, seed(PAYS, NOW), NOW)
    assert (status.in_force, status.chosen_by) == ("leading", "spec")
    assert policy_status(named, status, seed(DEAR, NOW + DAY), NOW + DAY) == status
    assert not check_due(named, status, NOW + DAY)
