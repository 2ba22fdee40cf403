"""Spec parsing and its domain meaning: capacity, policy and windows."""

from __future__ import annotations

from typing import Any

import pytest

from prescaler.api import (
    InferencePoolSpec,
    InferencePoolStatus,
    ObjectiveSpec,
    SpecError,
    capacity_model,
    check_spec,
    parse_spec,
    scaling_policy,
    scheduled_windows,
)

FORECAST = {"prometheus": {"url": "http://prometheus:9090"}}


def _spec(**overrides: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "target": {"name": "web"},
        "model": {"tokensPerSecond": 3000},
    }
    raw.update(overrides)
    return raw


def test_operator_policy_guards_on_observed_demand_and_holds_without_metrics() -> None:
    policy = scaling_policy(parse_spec(_spec(forecast={**FORECAST, "observedHeadroom": 1.4})))
    assert policy.observed_headroom == 1.4
    assert policy.scale_down_requires_observation
    # A pool planned on schedules alone has no observation to guard on.
    assert scaling_policy(parse_spec(_spec())).observed_headroom == 1.0


def test_defaults_are_the_documented_ones() -> None:
    spec = parse_spec(_spec())
    assert spec.mode == "replicas"
    assert spec.target.kind == "Deployment"
    assert (spec.min_replicas, spec.max_replicas) == (1, 10)
    assert spec.cold_start.mode == "auto"
    assert spec.forecast is None
    assert not spec.dry_run
    assert spec.wire()["coldStart"]["marginSeconds"] == 60


def test_measured_token_mix_wins_over_spec_means() -> None:
    spec = parse_spec(_spec(model={"tokensPerSecond": 3000, "promptTokens": 100}))
    assert capacity_model(spec).tokens.prompt_tokens == 100
    measured = capacity_model(spec, prompt_tokens=2000, output_tokens=200, context_tokens=4000)
    assert measured.tokens.prompt_tokens == 2000
    assert measured.tokens.planning_context_tokens == 4000


def test_measured_context_is_clamped_to_the_model_maximum() -> None:
    raw = _spec(model={"tokensPerSecond": 3000, "preset": "mistral-7b", "gpuMemoryGiB": 80})
    capacity = capacity_model(parse_spec(raw), context_tokens=10**7)
    assert capacity.tokens.planning_context_tokens == 32_768


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (_spec(model={"tokensPerSecond": 0}), "spec.model.tokensPerSecond"),
        (_spec(target={}), "spec.target.name"),
        (_spec(mode="sideways"), "spec.mode"),
        (
            _spec(model={"tokensPerSecond": 1, "preset": "llama-3.1-405b", "gpuMemoryGiB": 24}),
            "spec.model: model llama-3.1-405b does not fit on 1 x 24 GiB",
        ),
        (
            _spec(model={"tokensPerSecond": 1, "preset": "llama-3.1-8b"}),
            "gpuMemoryGiB is required",
        ),
        (
            _spec(
                schedules=[
                    {
                        "name": "launch",
                        "start": "2025-01-02T10:00:00",
                        "end": "2025-01-02T09:00:00",
                        "minReplicas": 3,
                    }
                ]
            ),
            "ends before it starts",
        ),
        (
            _spec(
                schedules=[
                    {"name": "x", "cron": "61 * * * *", "durationSeconds": 60, "minReplicas": 1}
                ]
            ),
            "invalid cron",
        ),
        (
            _spec(
                schedules=[
                    {
                        "name": "x",
                        "start": "tomorrow",
                        "end": "2025-01-02T09:00:00",
                        "minReplicas": 1,
                    }
                ]
            ),
            "spec.schedules[0].start",
        ),
        (
            _spec(
                schedules=[
                    {
                        "name": "x",
                        "cron": "0 9 * * *",
                        "durationSeconds": 60,
                        "timeZone": "Mars/Olympus",
                        "minReplicas": 1,
                    }
                ]
            ),
            "unknown time zone",
        ),
        (_spec(minReplicas=5, maxReplicas=2), "maxReplicas"),
    ],
)
def test_semantic_errors_name_the_field(raw: dict[str, Any], fragment: str) -> None:
    with pytest.raises(SpecError, match=None) as info:
        check_spec(parse_spec(raw))
    assert fragment in str(info.value)


def test_offset_and_zone_windows_mean_the_same_instant() -> None:
    base = {"name": "w", "minReplicas": 1}
    zoned = {
        **base,
        "start": "2025-06-01T10:00:00",
        "end": "2025-06-01T11:00:00",
        "timeZone": "Europe/Berlin",
    }
    offset = {**base, "start": "2025-06-01T08:00:00Z", "end": "2025-06-01T09:00:00Z"}
    (a,) = scheduled_windows(parse_spec(_spec(schedules=[zoned])))
    (b,) = scheduled_windows(parse_spec(_spec(schedules=[offset])))
    occurrence_a = a.next_occurrence(0)
    occurrence_b = b.next_occurrence(0)
    assert occurrence_a is not None
    assert occurrence_b is not None
    assert (occurrence_a.start, occurrence_a.end) == (occurrence_b.start, occurrence_b.end)


def test_status_round_trips_through_the_wire_form() -> None:
    status = InferencePoolStatus.model_validate(
        {
            "desiredReplicas": 3,
            "plan": {
                "action": "steady",
                "reason": "r",
                "constraint": "floor",
                "targetReplicas": 3,
                "lookaheadSeconds": 90,
            },
            "unknownField": 1,
        }
    )
    assert status.wire()["plan"]["targetReplicas"] == 3
    assert "unknownField" not in status.wire()
    assert InferencePoolSpec.model_fields["dry_run"].description


def test_the_default_objective_is_relative_to_the_hpa_and_a_served_fraction_set_wins() -> None:
    from prescaler.api import risk_objective

    default = risk_objective(parse_spec(_spec(forecast=FORECAST)))
    assert default.relative
    assert default.relative_to_hpa == ObjectiveSpec.model_fields["relative_to_hpa"].default
    assert default.budget_to_hpa == ObjectiveSpec.model_fields["budget_to_hpa"].default
    assert default.budgeted
    assert default.served_fraction is None
    unbudgeted = risk_objective(parse_spec(_spec(forecast=FORECAST, objective={"budgetToHpa": 0})))
    assert unbudgeted.budget_to_hpa is None
    absolute = risk_objective(
        parse_spec(_spec(forecast=FORECAST, objective={"servedFraction": 0.999}))
    )
    assert not absolute.relative
    assert absolute.served_fraction == 0.999
    with pytest.raises(SpecError):
        parse_spec(_spec(objective={"relativeToHpa": 0}))
