"""A pool in dry run reports what a shadow HPA would have done, and it agrees with the
backtest of the same stretch.

The pool reads backfilled vLLM history from a real Prometheus (a request rate that jumps
from 6 to 22 req/s for two minutes in every six). The operator runs the shadow HPA on the
demand it observes; then the backtest's reactive policy replays the same stretch of the
same Prometheus series (per-minute means of the pool's demand query) through the
backtest's fleet, from the replicas the shadow started with. Their GPU-hours, short
minutes and unserved share must agree within :data:`GPU_HOURS_TOLERANCE`,
:data:`SHORT_MINUTES_TOLERANCE` and :data:`UNSERVED_TOLERANCE`: the live shadow sees each
step's demand as the reconcile after it observed it, the backtest sees per-minute means
30 s late (its metric lag), so a jump can land a sync apart. The operator starts in the low
phase (:data:`START_PHASE`): a stretch that starts on a jump gives the backtest's first
per-minute mean (and so its first decisions) a demand the shadow never saw, and over nine
minutes that start weighs more than any later difference.

A restarted operator goes on counting from ``status.againstHpa``.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import pytest

from cluster.launcher import LocalCluster
from cluster.objects import gpu_deployment
from cluster.prometheus import Prometheus, vllm_samples
from integration.operator_fixtures import (  # noqa: F401 (fixtures)
    Kube,
    crd_fixture,
    running_operator,
    wait_for,
)
from prescaler.backtest import Demand, FleetConfig, ReactivePolicy, score, simulate
from prescaler.sources import render_queries

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.prometheus,
    pytest.mark.slow,
    pytest.mark.timeout(1800),  # minutes of live demand, then a restart, on a busy machine
]

PERIOD, HIGH_SECONDS = 360.0, 120.0
HIGH, LOW = 22.0, 6.0
COLD_START = 60.0
OBSERVE_MINUTES = 9
START_PHASE = (150.0, 330.0)
"""Where in the period the compared stretch starts: after the 2-minute rate window has
settled on the low rate, before the next jump."""
GPU_HOURS_TOLERANCE = 0.10
"""Relative: the shadow's GPU-hours against the backtest's."""
SHORT_MINUTES_TOLERANCE = 2
UNSERVED_TOLERANCE = 0.1
"""Absolute, on the share of demand left unserved (one jump or two in the stretch: a jump
met a sync apart moves it by several points)."""


def _rate(t: float) -> float:
    return HIGH if t % PERIOD < HIGH_SECONDS else LOW


def _against(k: Kube) -> dict[str, Any]:
    return dict(k.status("chat").get("againstHpa") or {})


def _observed_minutes(against: dict[str, Any]) -> float:
    return float(sum(h.get("seconds", 0.0) for h in against.get("hours", []))) / 60.0


def test_a_dry_run_pool_compares_itself_with_a_shadow_hpa_as_the_backtest_does(
    cluster: LocalCluster,
    crd: None,
    kube: Any,
    namespace: str,
    prometheus: Prometheus,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    k = Kube(kube, namespace)
    now = time.time()
    start = now - 3600
    times = [start + 15 * i for i in range(int((now + 3 * 3600 - start) // 15))]
    prometheus.backfill(
        vllm_samples(times, [_rate(t) for t in times], namespace=namespace, model_name="llm")
    )
    selector = f'namespace="{namespace}"'
    k.create_deployment(gpu_deployment("llm", 1))
    time.sleep((START_PHASE[0] - time.time()) % PERIOD)  # the pool starts in the low phase
    k.create_pool(
        "chat",
        {
            "target": {"name": "llm"},
            "minReplicas": 1,
            "maxReplicas": 10,
            "dryRun": True,
            "model": {"tokensPerSecond": 3750},
            "coldStart": {"mode": "fixed", "seconds": COLD_START},
            "forecast": {
                "prometheus": {"url": prometheus.url},
                "selector": selector,
                "model": "recent_mean",
                "lookbackSeconds": 3600,
                "stepSeconds": 60,
                "horizonSeconds": 600,
            },
        },
    )
    with running_operator(cluster, namespace, interval_seconds=2.0):
        wait_for(
            lambda: _observed_minutes(_against(k)) >= OBSERVE_MINUTES,
            OBSERVE_MINUTES * 60 + 600,
            f"{OBSERVE_MINUTES} minutes compared with the shadow HPA",
            interval=2.0,
        )
    against = _against(k)  # the last status the operator wrote
    assert against["basis"] == "plan"  # dry run: prescaler's side is its plan's fleet
    assert against["hpa"]["targetFrom"] == "default"
    assert against["hpa"]["target"] == ReactivePolicy.target
    assert against["hpa"]["coldStartSeconds"] == COLD_START
    day = against["last24Hours"]
    assert day == against["last7Days"]  # all of it in the last hour or two
    assert against["summary"].endswith("%)")

    # The backtest of the same stretch: the steps the shadow scored, [first, clock).
    clock = against["clock"]
    seconds = sum(h["seconds"] for h in against["hours"])
    first = clock - seconds
    assert START_PHASE[0] <= first % PERIOD < START_PHASE[1], "the operator started late"
    minutes = int(seconds // 60)
    query = render_queries("vllm", selector=selector, window="2m").demand_query
    # The shadow scored each step on the demand the reconcile after it observed.
    values = prometheus.query_range(query, first + 15, first + 60 * minutes, 15)["result"]
    rates = np.array([float(v) for _, v in values[0]["values"]])
    assert len(rates) == 4 * minutes
    per_minute = rates.reshape(minutes, 4).mean(axis=1)
    cap = against["hpa"]["replicaCapacity"]
    demand = Demand(
        start=first,
        tokens_per_s=per_minute,
        observed_requests_per_s=per_minute,
        prompt_tokens=1.0,
        output_tokens=0.0,
    )
    # The shadow started where an HPA at its target would be for the demand it first saw.
    started = float(prometheus.query(query, first)["result"][0]["value"][1])
    config = FleetConfig(
        replica_tokens_per_second=cap,
        cold_start_seconds=COLD_START,
        max_replicas=10,
        initial_replicas=math.ceil(started / (ReactivePolicy.target * cap) - 1e-9),
    )
    run = simulate(demand, ReactivePolicy(cap, config.min_replicas, config.max_replicas), config)
    backtest = score(run, demand, config)
    # The stretch holds at least one jump, which the HPA meets one cold start late.
    assert backtest.shortfall_minutes >= 1
    assert day["hpaGpuHours"] == pytest.approx(backtest.gpu_hours, rel=GPU_HOURS_TOLERANCE)
    assert abs(day["hpaShortMinutes"] - backtest.shortfall_minutes) <= SHORT_MINUTES_TOLERANCE
    assert day["hpaUnservedFraction"] == pytest.approx(
        backtest.unserved_token_fraction, abs=UNSERVED_TOLERANCE
    )
    # The plan's fleet is prescaler's side: it runs replicas and reports what it left.
    assert day["gpuHours"] > 0
    assert day["unservedFraction"] is not None

    # A restarted operator goes on from the counters in status.
    kept_minutes = _observed_minutes(against)
    with running_operator(cluster, namespace, interval_seconds=2.0):
        resumed = wait_for(
            lambda: (a := _against(k)) and _observed_minutes(a) >= kept_minutes + 1 and a,
            300,
            "the restarted operator's comparison",
            interval=1.0,
        )
    assert resumed["hours"][0]["start"] == against["hours"][0]["start"]
    assert resumed["last24Hours"]["hpaGpuHours"] > day["hpaGpuHours"]
    assert resumed["last24Hours"]["hpaShortMinutes"] >= day["hpaShortMinutes"]
