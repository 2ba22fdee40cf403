"""A disaggregated pool on the cluster: two Deployments, per-role series in a real Prometheus.

The prefill and decode pods export the same vLLM metric names, told apart by a ``role``
label (each role's ``selector``), and their pods start at different speeds (each role
measures its own cold start). The backfill reaches minutes into the future, so "now"
is set in advance: long documents first (prompt tokens six times the usual, output
unchanged), then short prompts with long outputs. Each role must follow its own
bottleneck: prefill grows in the first phase while decode stays, decode grows in the
second while prefill does not.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pytest

from cluster.objects import gpu_deployment
from cluster.prometheus import Sample, counter_from_rate
from integration.history_world import (  # noqa: F401 (fixtures)
    LIVE_RECENT_MEAN,
    SCRAPE_SECONDS,
    HistoryWorld,
    scrape_times,
    world_fixture,
)
from integration.operator_fixtures import Kube, crd_fixture, wait_for  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus]

RATE = 2.0
"""Requests/s throughout; only their lengths change."""
PREFILL_TPS = 4000.0
DECODE_TPS = 1000.0
# (prompt, output) tokens per request in each phase.
# Each requirement is well inside its replica count, so a forecast band does not tip it.
USUAL, DOCUMENTS, ESSAYS = (1000.0, 150.0), (5000.0, 150.0), (200.0, 1200.0)


def role_series(namespace: str, role: str, times: Sequence[float], essays: float) -> list[Sample]:
    """One pod of ``role``: requests, prompt and generated tokens (counters), long
    documents before ``essays`` and short prompts with long outputs from then on. A
    prefill pod generates one token per request (it hands the KV cache over); a decode pod
    counts the prompt it received and generates the output."""
    labels = {"namespace": namespace, "pod": f"{role}-0", "model_name": "llm", "role": role}
    mix = [ESSAYS if t >= essays else DOCUMENTS for t in times]
    per_request = {
        "vllm:request_success_total": [1.0 for _ in mix],
        "vllm:prompt_tokens_total": [prompt for prompt, _ in mix],
        "vllm:generation_tokens_total": [1.0 if role == "prefill" else out for _, out in mix],
    }
    samples = []
    for name, tokens in per_request.items():
        rates = [RATE * n for n in tokens]
        for ts, value in counter_from_rate(times, rates, step_s=SCRAPE_SECONDS):
            samples.append(Sample(name, labels, ts, value))
    return samples


def pd_spec(world: HistoryWorld) -> dict[str, Any]:
    return {
        "roles": {
            "prefill": {
                "target": {"name": "llm-prefill"},
                "tokensPerSecond": PREFILL_TPS,
                "selector": 'role="prefill"',
            },
            "decode": {
                "target": {"name": "llm-decode"},
                "tokensPerSecond": DECODE_TPS,
                "selector": 'role="decode"',
            },
        },
        "minReplicas": 1,
        "maxReplicas": 6,
        "model": {"promptTokens": USUAL[0], "outputTokens": USUAL[1]},
        "coldStart": {"mode": "auto", "seconds": 5, "marginSeconds": 0},
        # Released capacity stays for the test's length: a role that moved stays moved.
        "scaleDown": {"stabilizationSeconds": 3600},
        # The demand as it is, not where its step would be heading if it were a ramp
        # (`observedTrendSeconds`, tested in `tests/unit/test_observed_trend.py`).
        "forecast": {**world.forecast(LIVE_RECENT_MEAN), "observedTrendSeconds": 0},
        # The median of the peak over what is known, fixed: the capacity model's numbers,
        # not a margin learned from the one step this test plays, size the roles.
        "objective": {"startQuantile": 0.5, "adaptRate": 0},
    }


def replicas(k: Kube, name: str) -> int:
    return int(k.deployment(name).spec.replicas)


def scaled(k: Kube, role: str) -> list[str]:
    return [
        e.message
        for e in k.events("pd")
        if e.reason == "ScaledUp" and e.message.startswith(f"{role}:")
    ]


def test_each_role_scales_on_its_own_bottleneck(world: HistoryWorld) -> None:
    k, namespace = world.kube, world.namespace
    # Decode replicas take longer to start; each role measures its own.
    k.create_deployment(gpu_deployment("llm-prefill", 1, ready_delay="1s"))
    k.create_deployment(gpu_deployment("llm-decode", 1, ready_delay="20s"))
    now = time.time()
    # Long documents from an hour ago until `essays`, then short prompts, long outputs.
    essays = now + 240
    times = scrape_times(now - 3600, now + 1800)
    world.prometheus.backfill(
        role_series(namespace, "prefill", times, essays)
        + role_series(namespace, "decode", times, essays)
    )
    with world.chart_operator(rate_window="30s"):
        k.create_pool("pd", pd_spec(world))
        # 2 x 5000 = 10,000 prompt tok/s over 4,000: three prefill replicas; decode's
        # 2 x 150 = 300 output tok/s fit in one.
        wait_for(lambda: replicas(k, "llm-prefill") == 3, 120, "prefill at 3")
        # The status is written after the scale it records.
        status = wait_for(
            lambda: (
                (s := k.status("pd")).get("roles", {}).get("prefill", {}).get("desiredReplicas")
                == 3
                and s
            ),
            60,
            "the status of prefill at 3",
        )
        assert time.time() < essays, "the operator started too late for the first phase"
        assert replicas(k, "llm-decode") == 1
        assert scaled(k, "decode") == []
        roles = status["roles"]
        assert roles["prefill"]["plan"]["constraint"] == "compute"
        assert "prompt tok/s" in roles["prefill"]["plan"]["reason"]
        assert "output tok/s" in roles["decode"]["plan"]["reason"]
        # 2 x 1200 = 2,400 output tok/s over 1,000: three decode replicas; prefill's
        # 400 prompt tok/s need one, and its release waits out the stabilization.
        wait_for(lambda: replicas(k, "llm-decode") == 3, essays - time.time() + 120, "decode at 3")
        wait_for(
            lambda: "decode 3/3 compute" in (k.status("pd").get("roleSummary") or ""),
            60,
            "the summary with both roles",
        )
        status = k.status("pd")
    assert replicas(k, "llm-prefill") == 3
    prefill, decode = scaled(k, "prefill"), scaled(k, "decode")
    assert len(prefill) == 1, prefill
    assert len(decode) == 1, decode
    assert "Deployment llm-prefill: 1 -> 3" in prefill[0]
    assert "Deployment llm-decode: 1 -> 3" in decode[0]
    assert status["desiredReplicas"] == 6
    assert status["roleSummary"].startswith("prefill 3/3 ")
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"
    prefill_start, decode_start = (status["roles"][r]["coldStart"] for r in ("prefill", "decode"))
    assert prefill_start["source"] == decode_start["source"] == "measured"
    assert decode_start["p90Seconds"] >= 20
    assert prefill_start["p90Seconds"] < decode_start["p90Seconds"]
