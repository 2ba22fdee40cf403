"""Spec parsing and its domain meaning: capacity, policy and windows."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from prescaler.api import (
    InferencePoolSpec,
    InferencePoolStatus,
    SpecError,
    capacity_model,
    check_spec,
    parse_spec,
    scaling_policy,
    scheduled_windows,
)

EXAMPLE = """
apiVersion: prescaler.io/v1alpha1
kind: InferencePool
metadata:
  name: llama-chat
  namespace: serving
spec:
  target: {kind: Deployment, name: llama-chat}
  mode: replicas
  inferencePoolRef: {name: llama-chat}
  minReplicas: 2
  maxReplicas: 40
  model:
    preset: llama-3.1-70b
    gpuMemoryGiB: 80
    gpusPerReplica: 4
    tokensPerSecond: 12000
    contextQuantile: 0.95
  coldStart: {mode: auto, seconds: 420, marginSeconds: 60, samples: 20}
  forecast:
    prometheus:
      url: http://prometheus.monitoring:9090
      authSecretRef: {name: prometheus-reader}
    engine: vllm
    selector: 'namespace="serving",model_name="llama-chat"'
    lookbackSeconds: 1209600
    model: auto
    refitSeconds: 3600
    quantile: 0.9
    headroom: 1.3
  schedules:
    - name: black-friday
      start: "2025-11-28T08:00:00"
      end: "2025-11-28T23:00:00"
      timeZone: America/New_York
      expectedRequestsPerSecond: 120
      leadSeconds: 1800
    - name: weekday-morning
      cron: "0 9 * * 1-5"
      durationSeconds: 10800
      timeZone: Europe/Berlin
      minReplicas: 8
      leadSeconds: 900
  standby:
    imagePrePull: {enabled: true}
    placeholders: {enabled: true, maxReplicas: 4}
  scaleDown: {stabilizationSeconds: 900, maxPercent: 25}
  dryRun: false
"""


def _spec(**overrides: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "target": {"name": "web"},
        "model": {"tokensPerSecond": 3000},
    }
    raw.update(overrides)
    return raw


def test_the_readme_example_parses_and_converts() -> None:
    spec = parse_spec(yaml.safe_load(EXAMPLE)["spec"])
    check_spec(spec)
    policy = scaling_policy(spec)
    assert (policy.min_replicas, policy.max_replicas) == (2, 40)
    assert policy.standby_max_replicas == 4
    assert policy.scale_down_max_percent == 25
    assert policy.lead_margin_seconds == 60
    capacity = capacity_model(spec)
    assert capacity.replica is not None
    assert capacity.replica.model.name == "llama-3.1-70b"
    assert capacity.replica.model.kv_bytes_per_token == 327_680
    assert capacity.headroom == 1.3
    windows = scheduled_windows(spec)
    assert [w.name for w in windows] == ["black-friday", "weekday-morning"]
    assert windows[0].start is not None
    assert windows[1].cron == "0 9 * * 1-5"


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
            "leaves no memory",
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
