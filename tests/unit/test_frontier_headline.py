"""The frontier's headline reads the default point against the HPA's swept curve; the
benchmark scripts (frontier, tenants, events) all judge a default through it."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import frontier as F


def hpa_curve(unserved_at_half: float) -> list[F.Point]:
    """The HPA swept from target 0.5 (dearest) to 0.9: GPU-hours 2.0 down to 1.0, its
    unserved rising linearly from ``unserved_at_half`` by 0.01 per step."""
    targets = sorted(F.HPA_TARGETS)
    n = len(targets) - 1
    return [
        F.Point("reactive", "target", t, t == 0.7, unserved_at_half + 0.01 * i, 2.0 - i / n, 0)
        for i, t in enumerate(targets)
    ]


def with_default(curve: list[F.Point], unserved: float, gpu_hours: float) -> list[F.Point]:
    return [*curve, F.Point("predictive", "servedFraction", 0.0, True, unserved, gpu_hours, 0)]


def test_a_default_below_the_curve_reads_its_ratio_and_band() -> None:
    points = with_default(hpa_curve(0.02), unserved=0.01, gpu_hours=1.5)
    on_curve = F.curve_at(points, "reactive", 1.5)
    assert on_curve is not None
    assert on_curve > 0
    h = F.default_headline(points)
    assert h.frontier_ratio == pytest.approx(0.01 / on_curve)
    assert h.band == "≤ 0.8"
    assert h.ratio_text == f"{0.01 / on_curve:.2f}"
    assert not h.worse_on_both


@pytest.mark.parametrize(("ratio", "band"), [(0.9, "0.8–1"), (1.0, "0.8–1"), (1.5, "> 1")])
def test_the_ratio_bands_above_the_target(ratio: float, band: str) -> None:
    curve = hpa_curve(0.02)
    on_curve = F.curve_at(curve, "reactive", 1.2)
    assert on_curve is not None
    h = F.default_headline(with_default(curve, unserved=ratio * on_curve, gpu_hours=1.2))
    assert h.frontier_ratio == pytest.approx(ratio)
    assert h.band == band


def test_a_curve_that_leaves_none_where_the_default_does_is_an_infinite_ratio() -> None:
    h = F.default_headline(with_default(hpa_curve(0.0), unserved=0.001, gpu_hours=2.0))
    assert h.frontier_ratio == math.inf
    assert h.band == "the HPA's curve leaves none there"
    assert h.ratio_text == h.band


def test_neither_leaving_any_is_no_ratio() -> None:
    h = F.default_headline(with_default(hpa_curve(0.0), unserved=0.0, gpu_hours=2.0))
    assert h.frontier_ratio is None
    assert h.band == "neither leaves any"


def test_a_default_dearer_than_the_whole_curve_is_outside_it() -> None:
    h = F.default_headline(with_default(hpa_curve(0.02), unserved=0.0, gpu_hours=2.5))
    assert h.frontier_ratio is None
    assert h.band == "outside the HPA's swept curve"
    assert h.dearer_than_half


def test_worse_than_the_hpa_on_both_axes() -> None:
    curve = hpa_curve(0.02)
    hpa = F.hpa_point(curve)
    worse = F.default_headline(with_default(curve, hpa.unserved * 1.1, hpa.gpu_hours * 1.1))
    cheaper = F.default_headline(with_default(curve, hpa.unserved * 1.1, hpa.gpu_hours * 0.9))
    assert worse.worse_on_both
    assert not cheaper.worse_on_both
