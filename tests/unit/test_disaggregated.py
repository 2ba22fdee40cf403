"""Disaggregated pools: each role sized on its own bottleneck, from the spec to the plan.

The traffic is described per request (requests/s, prompt and output lengths), as a user
sees it; each role's demand is derived from it the way the engine's counters would count
it (prefill: prompt tokens/s, decode: output tokens/s), forecast flat at that level, and
planned by the real planner on the role's capacity model built from the spec.
"""

from __future__ import annotations

from typing import Any

import pytest

from prescaler.api import (
    InferencePoolStatus,
    SpecError,
    capacity_model,
    check_spec,
    fleets,
    parse_spec,
    role_view,
    scaling_policy,
    scheduled_windows,
)
from prescaler.capacity import Role, TokenProfile, role_capacity
from prescaler.controller.status import combine_roles, role_previous
from prescaler.planning import FleetState, PlanInputs, plan
from unit.fake_forecasts import flat

NOW = 1_800_000_000.0


def pd_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "roles": {
            "prefill": {
                "target": {"name": "llm-prefill"},
                "tokensPerSecond": 20_000,
                "selector": 'role="prefill"',
            },
            "decode": {
                "target": {"name": "llm-decode"},
                "tokensPerSecond": 2_500,
                "maxReplicas": 30,
                "selector": 'role="decode"',
            },
        },
        "minReplicas": 1,
        "maxReplicas": 20,
        "model": {
            "preset": "llama-3.1-8b",
            "gpuMemoryGiB": 80,
            "contextTokens": 8192,
            "decodeTokensPerSecond": 30,
        },
        "forecast": {"prometheus": {"url": "http://prometheus:9090"}, "selector": 'ns="a"'},
    }
    spec.update(overrides)
    return spec


def role_plan(
    raw: dict[str, Any], role: Role, rps: float, prompt: float, output: float, current: int
) -> int:
    """The replicas ``role`` is planned to for ``rps`` requests of ``prompt`` and ``output``
    tokens, seen now and forecast to stay."""
    view = role_view(parse_spec(raw), role)
    capacity = capacity_model(view, role=role, prompt_tokens=prompt, output_tokens=output)
    demand = rps * (prompt if role == "prefill" else output)
    decision = plan(
        PlanInputs(
            now=NOW,
            capacity=capacity,
            fleet=FleetState(current, current, observed_requests_per_second=demand),
            policy=scaling_policy(view),
            cold_start_seconds=120,
            forecast=flat(demand, NOW),
        )
    )
    return decision.desired_replicas


# Usual chat traffic: 10 req/s of 1000 prompt and 300 output tokens.
BASE = (10.0, 1000.0, 300.0)


def fleet_for(traffic: tuple[float, float, float], current: dict[Role, int]) -> dict[Role, int]:
    return {r: role_plan(pd_spec(), r, *traffic, current=current[r]) for r in ("prefill", "decode")}


def test_the_usual_traffic_needs_a_small_fleet_of_each_role() -> None:
    steady = fleet_for(BASE, {"prefill": 1, "decode": 1})
    # 10 x 1000 = 10,000 prompt tok/s (the nowcast guard protects the present, x1): one
    # prefill replica. 10 x 300 = 3,000 output tok/s; a decode replica holds 56 contexts
    # of 8192 tokens at 30 tok/s each, 1,680 tok/s (below its 2,500 of compute): two.
    assert steady == {"prefill": 1, "decode": 2}


def test_a_burst_of_long_document_summaries_grows_prefill_and_leaves_decode_alone() -> None:
    steady = fleet_for(BASE, {"prefill": 1, "decode": 1})
    # The same requests/s, now 12,000-token documents summarised in 150 tokens.
    burst = fleet_for((10.0, 12_000.0, 150.0), steady)
    assert burst["prefill"] > 4 * steady["prefill"]
    # Fewer output tokens: decode does not grow (it may release one).
    assert burst["decode"] <= steady["decode"]


def test_a_burst_of_short_prompts_with_long_outputs_grows_decode_and_leaves_prefill_alone() -> None:
    steady = fleet_for(BASE, {"prefill": 1, "decode": 1})
    # Twice the requests, 150-token prompts each answered with 2,000 tokens.
    burst = fleet_for((20.0, 150.0, 2_000.0), steady)
    assert burst["decode"] > 4 * steady["decode"]
    assert burst["prefill"] == steady["prefill"]


def test_decode_is_memory_bound_when_contexts_are_long() -> None:
    """Little's law: requests decoding at once = output tok/s / decode speed, each holding
    its whole context; one replica's limit is its concurrency x the decode speed."""
    spec = parse_spec(pd_spec())
    decode = capacity_model(role_view(spec, "decode"), role="decode")
    concurrency = decode.max_concurrent_requests_per_replica
    assert concurrency == 56
    assert decode.memory_requests_per_second == pytest.approx(concurrency * 30)
    # 8192-token contexts on an 8B model: the KV cache, not the 2,500 tok/s, binds.
    assert decode.binding_constraint == "memory"
    need = decode.required(4 * concurrency * 30)
    assert (need.replicas, need.constraint) == (4, "memory")


def test_prefill_is_compute_bound_and_counts_prompt_tokens() -> None:
    prefill = role_capacity("prefill", TokenProfile(2000, 100), tokens_per_second=20_000)
    assert (prefill.unit.name, prefill.unit.per_request) == ("prompt tok/s", 2000)
    need = prefill.required(50_000)
    assert (need.replicas, need.constraint) == (3, "compute")


def test_a_window_in_requests_is_sized_per_role_in_its_tokens() -> None:
    raw = pd_spec(
        schedules=[
            {
                "name": "launch",
                "start": "2027-01-15T09:00:00Z",
                "end": "2027-01-15T10:00:00Z",
                "expectedRequestsPerSecond": 40,
            }
        ]
    )
    spec = parse_spec(raw)
    windows = scheduled_windows(spec)
    start = windows[0].occurrences(0, 4e9)[0].start
    wanted = {}
    for role, view in fleets(spec):
        assert role is not None
        capacity = capacity_model(view, role=role)  # spec means: 1000 prompt, 500 output
        decision = plan(
            PlanInputs(
                now=start,
                capacity=capacity,
                fleet=FleetState(1, 1),
                policy=scaling_policy(view),
                cold_start_seconds=120,
                windows=windows,
                forecast_expected=False,
            )
        )
        wanted[role] = decision.desired_replicas
        assert f"window launch needs {decision.desired_replicas}" in decision.reason
    # 40 x 1000 prompt tok/s over 20,000: 2 prefill; 40 x 500 output tok/s over 2,500: 8
    # by compute, more by memory at 8192-token contexts.
    assert wanted["prefill"] == 2
    assert wanted["decode"] >= 8


def test_a_role_view_is_the_pool_narrowed_to_the_role() -> None:
    spec = parse_spec(pd_spec())
    view = role_view(spec, "decode")
    assert view.roles is None
    assert view.target is not None
    assert view.target.name == "llm-decode"
    assert (view.min_replicas, view.max_replicas) == (1, 30)  # the pool's min, its own max
    assert view.model.tokens_per_second == 2_500
    assert view.forecast is not None
    assert view.forecast.selector == 'ns="a",role="decode"'


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"target": {"name": "llm"}}, "exactly one of target and roles"),
        ({"standby": {"hot": {"replicas": 1}}}, "standby.hot"),
        ({"prewarm": {"prompts": ["hi"]}}, "prewarm"),
        (
            {
                "schedules": [
                    {"name": "w", "cron": "0 9 * * *", "durationSeconds": 60, "minReplicas": 3}
                ]
            },
            "windows with minReplicas",
        ),
    ],
)
def test_unified_only_features_are_refused_with_roles(
    overrides: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(SpecError, match=fragment):
        check_spec(parse_spec(pd_spec(**overrides)))


def test_a_unified_pool_without_throughput_is_refused() -> None:
    raw = {"target": {"name": "llm"}, "model": {}}
    with pytest.raises(SpecError, match="tokens per second"):
        check_spec(parse_spec(raw))


def test_roles_status_sums_replicas_and_keeps_the_worst_condition() -> None:
    def role_status(ready: int, desired: int, constraint: str, metrics: str) -> InferencePoolStatus:
        return InferencePoolStatus.model_validate(
            {
                "desiredReplicas": desired,
                "currentReplicas": desired,
                "readyReplicas": ready,
                "plan": {"action": "steady", "reason": "r", "constraint": constraint,
                         "targetReplicas": desired, "lookaheadSeconds": 180},
                "conditions": [
                    {"type": "MetricsAvailable", "status": metrics, "reason": "X",
                     "message": f"metrics {metrics}", "lastTransitionTime": "2027-01-01T00:00:00Z"},
                ],
            }
        )  # fmt: skip

    status = combine_roles(
        InferencePoolStatus(),
        {
            "prefill": role_status(2, 3, "compute", "True"),
            "decode": role_status(4, 4, "memory", "False"),
        },
        NOW,
        7,
    )
    assert (status.desired_replicas, status.ready_replicas) == (7, 6)
    assert status.role_summary == "prefill 2/3 compute, decode 4/4 memory"
    (metrics,) = status.conditions
    assert (metrics.status, metrics.message) == ("False", "decode: metrics False")
    # Each role's status round-trips as the unified status its fleet reconciles with.
    again = InferencePoolStatus.model_validate(status.wire())
    assert role_previous(again, "decode").plan is not None
    assert role_previous(again, "decode").plan.constraint == "memory"  # type: ignore[union-attr]
    assert role_previous(InferencePoolStatus(), "prefill") == InferencePoolStatus()
