"""Pure status pieces: cold-start learning, the compact forecast view, conditions."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from prescaler.api import ColdStartSpec, ColdStartStatus, Condition, InferencePoolStatus
from prescaler.controller.status import (
    ConditionUpdate,
    forecast_view,
    learn_cold_start,
    merge_conditions,
    p90,
    rfc3339,
    status_patch,
)
from prescaler.kube import PodStart


@dataclass(frozen=True)
class P:
    t: float
    mean: float
    upper: float


@dataclass(frozen=True)
class F:
    points: tuple[P, ...]
    generated_at: float
    step_seconds: float


def test_p90_nearest_rank() -> None:
    assert p90([10.0]) == 10
    assert p90([float(i) for i in range(1, 11)]) == 9
    assert p90([float(i) for i in range(1, 21)]) == 18


def test_cold_start_counts_each_pod_once_and_a_slow_pod_when_it_is_ready() -> None:
    spec = ColdStartSpec(mode="auto", seconds=300, samples=5)
    pods = [PodStart("a", 100, 130), PodStart("b", 110, None), PodStart("c", 120, 140)]
    first = learn_cold_start(None, spec, pods, now=150)
    assert first.samples == [30.0, 20.0], "a slow pod does not hold up the pods after it"
    assert first.pending == ["b"]
    assert first.observed_until == rfc3339(120)
    pods[1] = PodStart("b", 110, 170)
    second = learn_cold_start(first, spec, pods, now=180)
    assert second.samples == [30.0, 20.0, 60.0]
    assert second.pending == []
    assert second.source == "measured"
    assert second.seconds == 60.0
    again = learn_cold_start(second, spec, pods, now=200)
    assert again.samples == second.samples, "a pod is counted once"


def test_pods_created_in_the_same_second_are_each_counted_once() -> None:
    # Creation times have a resolution of one second: a Deployment scaled by 4 creates its
    # pods within one, and they become Ready in any order.
    spec = ColdStartSpec(mode="auto", seconds=300, samples=10)
    first_seen = [PodStart("x-b", 100, 110), PodStart("x-d", 100, None)]
    first = learn_cold_start(None, spec, first_seen, now=111)
    assert first.samples == [10.0]
    # Two more appear in the same second after the first listing; all are Ready later.
    later = [PodStart(n, 100, 100 + t) for n, t in (("x-a", 12), ("x-b", 10), ("x-c", 14))]
    later.append(PodStart("x-d", 100, 120))
    second = learn_cold_start(first, spec, later, now=130)
    assert sorted(second.samples) == [10.0, 12.0, 14.0, 20.0]
    assert learn_cold_start(second, spec, later, now=140).samples == second.samples


def test_cold_start_window_is_rolling_and_assumed_until_measured() -> None:
    spec = ColdStartSpec(mode="auto", seconds=300, samples=3)
    assert learn_cold_start(None, spec, [], now=0).source == "assumed"
    previous = ColdStartStatus(seconds=9, source="measured", samples=[9.0, 9.0, 9.0])
    pods = [PodStart("x", 1000, 1050)]
    assert learn_cold_start(previous, spec, pods, now=2000).samples == [9.0, 9.0, 50.0]
    fixed = learn_cold_start(previous, ColdStartSpec(mode="fixed", seconds=42), pods, now=0)
    assert (fixed.seconds, fixed.source) == (42, "fixed")


def test_stuck_pods_do_not_block_learning() -> None:
    spec = ColdStartSpec(mode="auto")
    pods = [PodStart("stuck", 0, None), PodStart("ok", 10, 70)]
    assert learn_cold_start(None, spec, pods, now=10_000).samples == [60.0]


def test_forecast_view_keeps_a_dozen_points_and_the_peak() -> None:
    points = tuple(P(1000 + 60 * i, 1.0, 2.0 if i != 37 else 9.0) for i in range(1, 121))
    view = forecast_view(F(points, 1000, 60), model="prophet", score=12.3456, quantile=0.9)
    assert len(view.points) == 12
    assert view.peak == 9.0
    assert max(p.upper for p in view.points) == 9.0
    assert view.horizon_seconds == 7200
    assert view.score == 12.346


def test_condition_transition_time_moves_only_on_change() -> None:
    first = merge_conditions([], [ConditionUpdate("Ready", "True", "Ok")], now=100, generation=1)
    same = merge_conditions(
        first, [ConditionUpdate("Ready", "True", "Ok", "msg")], now=200, generation=2
    )
    assert same[0].last_transition_time == rfc3339(100)
    assert same[0].observed_generation == 2
    flipped = merge_conditions(
        same, [ConditionUpdate("Ready", "False", "Scaling")], now=300, generation=2
    )
    assert flipped[0].last_transition_time == rfc3339(300)


def test_status_patch_clears_removed_fields() -> None:
    status = InferencePoolStatus(desired_replicas=2)
    patch = status_patch({"desiredReplicas": 1, "nextWindow": {"name": "x"}}, status)
    assert patch["nextWindow"] is None
    assert patch["desiredReplicas"] == 2


def test_status_patch_clears_removed_fields_inside_nested_objects() -> None:
    """A merge patch merges objects: a key gone from a role's status must be nulled there."""
    before = {"roles": {"decode": {"desiredReplicas": 3, "externalChange": {"from": 1}}}}
    status = InferencePoolStatus.model_validate({"roles": {"decode": {"desiredReplicas": 4}}})
    patch = status_patch(before, status)
    decode = patch["roles"]["decode"]
    assert (decode["desiredReplicas"], decode["externalChange"]) == (4, None)


def test_condition_model_rejects_unknown_types() -> None:
    with pytest.raises(ValueError, match="type"):
        Condition.model_validate(
            {"type": "Happy", "status": "True", "reason": "x", "lastTransitionTime": "t"}
        )


def test_forecast_view_leaves_out_non_finite_points() -> None:
    # One NaN in the status body makes the whole write invalid JSON: the API server refuses
    # it and status.forecast goes on showing an older forecast than the one the plan used.
    nan, inf = float("nan"), float("inf")
    points = (P(1060, 1.0, 2.0), P(1120, nan, 3.0), P(1180, 2.0, inf), P(1240, 4.0, 5.0))
    view = forecast_view(F(points, 1000, 60), model="seasonal_naive", score=None, quantile=0.9)
    body = view.model_dump(mode="json", by_alias=True)
    json.dumps(body, allow_nan=False)  # raises on a NaN or an infinity
    assert [p.upper for p in view.points] == [2.0, 5.0]
    assert view.peak == 5.0
