"""The demo's report reads the HPA's curve on the live stretch: the cheapest HPA target that
leaves no more waiting than prescaler did (hack/demo/prescaler_demo/report.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hack" / "demo"))

from prescaler_demo.report import HpaPoint, matching_hpa

CURVE = (
    HpaPoint(0.7, 0.786, 0.71),
    HpaPoint(0.5, 0.31, 0.80),
    HpaPoint(0.3, 0.0, 1.10),
    HpaPoint(0.2, 0.0, 1.45),
    HpaPoint(0.1, 0.0, 2.20),
)


def test_the_cheapest_target_as_short_as_prescaler_or_less() -> None:
    assert matching_hpa(CURVE, 0.0) == HpaPoint(0.3, 0.0, 1.10)
    assert matching_hpa(CURVE, 0.4) == HpaPoint(0.5, 0.31, 0.80)
    assert matching_hpa(CURVE, 0.9) == HpaPoint(0.7, 0.786, 0.71)


def test_a_late_request_s_rounding_is_not_a_difference() -> None:
    assert matching_hpa((HpaPoint(0.6, 0.00005, 0.9), *CURVE), 0.0) == HpaPoint(0.6, 0.00005, 0.9)


def test_none_when_no_target_serves_as_well_or_the_score_is_missing() -> None:
    assert matching_hpa(CURVE[:2], 0.0) is None
    assert matching_hpa(CURVE, float("nan")) is None
    assert matching_hpa((), 0.0) is None
