"""Degradation levels on the cluster, from a real Prometheus with backfilled series.

The backfill reaches minutes into the future, so the series "now" are set in advance:
a queue, then a full KV cache, then a slow TTFT, each for 45 s with calm in between.
The pool's level (status, Events, the ``<pool>-degradation`` ConfigMap a gateway reads)
must rise with each and fall back after the hold. In a second case the queue stays
empty and only the forecast sees demand beyond what can be ready: the level rises to
``warning`` before the demand arrives.

The operator runs as the Helm chart runs it (its ServiceAccount and RBAC), with a 30 s
rate window, so a phase shows in the rates within seconds of its start.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

import pytest

from cluster.objects import gpu_deployment
from cluster.prometheus import Sample, counter_from_rate, gauge_from_values
from integration.history_world import (  # noqa: F401 (fixtures)
    LIVE_RECENT_MEAN,
    SCRAPE_SECONDS,
    HistoryWorld,
    scrape_times,
    world_fixture,
)
from integration.operator_fixtures import (  # noqa: F401 (fixtures)
    Kube,
    crd_fixture,
    recorded,
    wait_for,
)

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus]

# 600 prompt + 150 output tokens per request (the harness' vLLM profile): 5 req/s a replica.
MODEL = {"tokensPerSecond": 3750, "promptTokens": 600, "outputTokens": 150}
PODS = ("a", "b")
TTFT_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, math.inf)
HOLD = 20


def _phase(
    times: Sequence[float], spans: Sequence[tuple[float, float]], on: float, off: float
) -> list[float]:
    return [on if any(a <= t < b for a, b in spans) else off for t in times]


def signal_series(
    namespace: str,
    times: Sequence[float],
    rate: float,
    *,
    waiting: Sequence[float],
    kv: Sequence[float],
    slow: Sequence[bool],
) -> list[Sample]:
    """Per pod: the queue and KV-cache gauges, and a TTFT histogram whose requests take
    0.2 s (fast) or 2 s (slow) to their first token."""
    out: list[Sample] = []
    per_pod = rate / len(PODS)
    for pod in PODS:
        labels = {"namespace": namespace, "pod": pod, "model_name": "llm"}
        queue = [w / len(PODS) for w in waiting]
        for ts, v in gauge_from_values(times, queue, step_s=SCRAPE_SECONDS):
            out.append(Sample("vllm:num_requests_waiting", labels, ts, v))
        for ts, v in gauge_from_values(times, list(kv), step_s=SCRAPE_SECONDS):
            out.append(Sample("vllm:kv_cache_usage_perc", labels, ts, v))
        for le in TTFT_BUCKETS:
            rates = [per_pod if le >= (2.0 if s else 0.2) else 0.0 for s in slow]
            bucket = {**labels, "le": "+Inf" if math.isinf(le) else f"{le:g}"}
            for ts, v in counter_from_rate(times, rates, step_s=SCRAPE_SECONDS):
                out.append(Sample("vllm:time_to_first_token_seconds_bucket", bucket, ts, v))
    return out


def pool_spec(world: HistoryWorld, **extra: Any) -> dict[str, Any]:
    spec = world.pool_spec(
        {
            "minReplicas": 1,
            "maxReplicas": 2,
            "model": MODEL,
            "coldStart": {"mode": "fixed", "seconds": 5, "marginSeconds": 0},
            "degradation": {"holdSeconds": HOLD, "ttft": {"p95Seconds": 1.0}},
        },
        LIVE_RECENT_MEAN,
    )
    spec.update(extra)
    return spec


def config_map_levels(k: Kube, name: str) -> AbstractContextManager[list[str]]:
    """Polls the ConfigMap until the block ends; yields the levels it showed, in order,
    each change once."""
    return recorded(lambda: k.core.read_namespaced_config_map(name, k.ns).data["level"], 0.5, True)


def level_events(k: Kube, name: str) -> list[str]:
    return [
        e.message for e in k.events(name) if e.reason in ("DegradationRaised", "DegradationLowered")
    ]


def test_queue_kv_and_ttft_raise_the_level_and_it_falls_back_after_the_hold(
    world: HistoryWorld,
) -> None:
    k, namespace = world.kube, world.namespace
    k.create_deployment(gpu_deployment("llm", 2, ready_delay="1s"))
    # A pool put on a serving fleet (a fleet with nothing Ready yet is critical: rightly).
    wait_for(lambda: (k.deployment("llm").status.ready_replicas or 0) == 2, 120, "2 Ready")
    now = time.time()
    t0 = now + 90  # the operator is up and has planned by then, even on a busy machine
    # Each phase lasts 45 s; the next starts 60 s after it ended (the 20 s hold, the 30 s
    # rate window and a reconcile to spare).
    queue, kv, ttft = (t0, t0 + 45), (t0 + 105, t0 + 150), (t0 + 210, t0 + 255)
    times = scrape_times(now - 3600, t0 + 1200)
    rate = 6.0  # 2 replicas serve it: no forecast shortfall
    samples = world.samples(times, lambda _: rate, pods=PODS)
    samples += signal_series(
        namespace,
        times,
        rate,
        waiting=_phase(times, [queue], 300.0, 0.0),
        kv=_phase(times, [kv], 0.95, 0.4),
        slow=[bool(x) for x in _phase(times, [ttft], 1.0, 0.0)],
    )
    world.prometheus.backfill(samples)
    with world.chart_operator(rate_window="30s"):
        k.create_pool("chat", pool_spec(world))
        with config_map_levels(k, "chat-degradation") as shown:
            wait_for(
                lambda: (k.status("chat").get("degradation") or {}).get("level") == "normal",
                120,
                "a normal level before the first phase",
            )
            assert time.time() < queue[0], "the operator started too late for the phases"
            # Three rises and three falls, each a single Event.
            wait_for(lambda: len(level_events(k, "chat")) >= 6, ttft[1] - time.time() + 240,
                     "three rises and three falls")  # fmt: skip
            wait_for(lambda: len(shown) >= 7, 60, "the ConfigMap back at normal")
            # The status is written after the ConfigMap it records (gateways act first).
            status = wait_for(
                lambda: (
                    (s := k.status("chat")).get("degradation", {}).get("level") == "normal" and s
                ),
                60,
                "the status back at normal",
            )
    messages = level_events(k, "chat")
    assert len(messages) == 6, messages
    assert messages[0].startswith("degradation normal -> critical: queue 300 waiting"), messages
    assert "503 beyond" in messages[0]
    assert "Retry-After" in messages[0]
    assert messages[1].startswith("degradation critical -> normal"), messages
    assert messages[2].startswith("degradation normal -> warning: KV cache 95% used"), messages
    assert messages[3].startswith("degradation warning -> normal"), messages
    assert messages[4].startswith("degradation normal -> warning: TTFT p95"), messages
    assert messages[5].startswith("degradation warning -> normal"), messages
    # The ConfigMap followed every change.
    assert shown == ["normal", "critical", "normal", "warning", "normal", "warning", "normal"]
    assert status["degradation"]["level"] == "normal"
    assert status["degradation"]["configMap"] == "chat-degradation"
    data = k.core.read_namespaced_config_map("chat-degradation", namespace).data
    assert data["contract"] == "prescaler.io/degradation/v1"
    assert data["queueDepthLimit"] == ""
    assert data["shedLanes"] == ""


def test_a_forecast_shortfall_alone_raises_warning_before_the_demand_arrives(
    world: HistoryWorld,
) -> None:
    """Yesterday's demand rose from 2 to 11.5 req/s at this time of day plus 6 minutes.
    Two replicas (the pool's maximum, asked for one cold start plus margin ahead) serve
    10 req/s: from one cold start before the rise the forecast is 1,125 tokens/s (13 %)
    short, with the queue empty."""
    k = world.kube
    k.create_deployment(gpu_deployment("llm", 1, ready_delay="1s"))
    wait_for(lambda: (k.deployment("llm").status.ready_replicas or 0) == 1, 120, "1 Ready")
    day, step = 86_400, 60
    rise = math.ceil((time.time() + 360) / step) * step
    times = scrape_times(rise - 2 * day - 1800, time.time() + 900)
    samples = world.samples(times, lambda t: 11.5 if (t - rise) % day < 1800 else 2.0, pods=PODS)
    samples += signal_series(
        world.namespace,
        times,
        2.0,
        waiting=[0.0] * len(times),
        kv=[0.3] * len(times),
        slow=[False] * len(times),
    )
    world.prometheus.backfill(samples)
    cold = 240
    spec = pool_spec(world, coldStart={"mode": "fixed", "seconds": cold, "marginSeconds": 60})
    spec["forecast"].update(
        {"model": "seasonal_naive", "lookbackSeconds": 2 * day, "stepSeconds": step,
         "horizonSeconds": 900, "quantile": 0.9}
    )  # fmt: skip
    # What a forecast-driven pool signals: with two replicas at most, every HPA on this
    # history spends as much as the forecast, so spec.policy auto may plan as the HPA would.
    spec["policy"] = "forecast"
    with world.chart_operator(rate_window="30s"):
        k.create_pool("chat", spec)
        wait_for(
            lambda: (k.status("chat").get("degradation") or {}).get("level") == "normal",
            120,
            "a normal level while the rise is beyond the cold start",
        )
        raised = wait_for(
            lambda: next((e for e in k.events("chat") if e.reason == "DegradationRaised"), None),
            rise - time.time() + 60,
            "the level raised by the forecast",
        )
        # The Event is posted before the reconcile writes the status that records the
        # raise: wait for that status, don't race it.
        status = wait_for(
            lambda: (s := k.status("chat")).get("degradation", {}).get("level") != "normal" and s,
            60,
            "the status of the raised level",
        )
    raised_at = (raised.event_time or raised.first_timestamp).timestamp()
    assert raised_at < rise, "the level rose only once the demand was there"
    assert raised.message.startswith("degradation normal -> warning: forecast shortfall")
    assert "queue" not in raised.message
    d = status["degradation"]
    assert d["level"] == "warning"
    assert d["raisedBy"] == ["forecastShortfall"]
    assert 5 <= d["forecastShortfallPercent"] < 25
    assert d["admission"]["shedLanes"] == ["batch"]
