"""A new pool's risk model is seeded from its own history, read from a real Prometheus.

Six hours of bursty vLLM history are backfilled (a burst of 5 x the base for five minutes
in every half hour). A new pool over it has no calibration of its own: the operator
replays the history through the planner off the reconcile path, and the pool's plans
size with the margin the replay calibrated, long before its own lookaheads could have
(its cold start is four minutes, so sixty of them take more than six). A pool whose
history cannot be read (range queries answered 500 by a fault proxy, instant queries
passed) still plans, and its condition says why.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from cluster.faultproxy import FaultProxy
from cluster.objects import gpu_deployment
from integration.history_world import HistoryWorld, world_fixture  # noqa: F401 (fixtures)
from integration.operator_fixtures import crd_fixture, wait_for  # noqa: F401 (fixtures)

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.prometheus,
    pytest.mark.slow,
    pytest.mark.timeout(1800),
]

HOURS = 6
PERIOD, BURST_SECONDS = 1800.0, 300.0
BASE, BURST = 6.0, 30.0
COLD_START = 240.0


def _rate(t: float) -> float:
    return BURST if t % PERIOD < BURST_SECONDS else BASE


POOL: dict[str, Any] = {
    "minReplicas": 1,
    "maxReplicas": 20,
    "dryRun": True,
    "model": {"tokensPerSecond": 3750},
    "coldStart": {"mode": "fixed", "seconds": COLD_START},
}
FORECAST: dict[str, Any] = {
    "model": "recent_mean",
    "lookbackSeconds": HOURS * 3600,
    "stepSeconds": 60,
    "horizonSeconds": 900,
}


def test_a_new_pool_plans_with_a_margin_seeded_from_its_history_and_one_without_says_why(
    world: HistoryWorld,
) -> None:
    k = world.kube
    now = time.time()
    world.backfill(_rate, now - HOURS * 3600, now + 3600)
    k.create_deployment(gpu_deployment("llm", 1))
    k.create_deployment(gpu_deployment("blind", 1))
    k.create_deployment(gpu_deployment("named", 1))
    with FaultProxy(world.prometheus.url) as proxy:
        proxy.set("http500", only="/api/v1/query_range")  # history, not the instant reads
        world.create_pool("chat", POOL, FORECAST)
        world.create_pool("blind", POOL, FORECAST, target="blind", url=proxy.url)
        # spec.policy names the reactive way: never switched, whatever the history says.
        world.create_pool("named", {**POOL, "policy": "reactive"}, FORECAST, target="named")
        with world.operator(interval_seconds=2.0) as operator_metrics:
            seeded = wait_for(
                lambda: k.condition_is("chat", "RiskCalibrated", "True"),
                900,
                "pool chat calibrated",
                interval=1.0,
            )
            status = k.status("chat")
            blind = wait_for(
                lambda: (
                    k.condition_is("blind", "RiskCalibrated", "False")
                    if (k.condition("blind", "RiskCalibrated") or {}).get("reason")
                    == "HistoryUnavailable"
                    else None
                ),
                600,
                "pool blind's condition on its unreadable history",
                interval=1.0,
            )
            blind_status = k.status("blind")
            named = wait_for(
                lambda: (
                    k.status("named")
                    if "HPA holds" in (k.status("named").get("plan") or {}).get("reason", "")
                    else None
                ),
                300,
                "pool named planning as its HPA would",
                interval=1.0,
            )
            in_force = k.status("chat")["policy"]["inForce"]
            gauge = operator_metrics.registry.get_sample_value(
                "prescaler_policy_in_force",
                {"namespace": k.ns, "pool": "chat", "policy": in_force},
            )
        assert proxy.requests["http500"] > 0

    # spec.policy auto: the replay weighed the forecast against the HPA's curve at once.
    policy = status["policy"]
    assert policy["chosenBy"] == "history"
    assert policy["checkedAt"] is not None
    assert "the HPA" in policy["reason"]
    assert gauge == 1
    # The pool planned on the forecast until then: a verdict for the HPA (led or not) is a
    # switch.
    switches = [e for e in k.events("chat") if e.reason == "PolicySwitched"]
    assert (policy["inForce"] != "forecast") == bool(switches), (policy, switches)
    # Without a readable history there is no verdict: the forecast plans, and says why.
    assert blind_status["policy"]["inForce"] == "forecast"
    assert "no replay" in blind_status["policy"]["reason"]
    assert (named["policy"]["inForce"], named["policy"]["chosenBy"]) == ("reactive", "spec")
    assert named["policy"]["switches"] == 0

    # The first calibration the pool has is the replay's, not its own lookaheads'.
    assert seeded["reason"] == "FromHistory"
    risk = status["risk"]
    assert risk["seededFrom"] == "history"
    assert risk["seededHours"] == pytest.approx(HOURS / 2, abs=0.1)  # half: the rest warms up
    assert risk["outcomes"] >= 60
    assert risk["margin"] is not None  # the plan sized with the calibrated margin
    assert len(risk["calibration"]) == 100  # the replay's scores, binned
    assert sum(risk["calibration"]) > 0
    assert len(risk["quantiles"]) == 24  # the replay's level for each hour of the day
    estimate = status["againstHpa"]["fromHistory"]
    assert estimate["observedHours"] == pytest.approx(HOURS / 2, abs=0.1)
    assert estimate["hpaGpuHours"] > 0
    assert estimate["gpuHours"] > 0
    assert estimate["hpaShortMinutes"] > 0  # the HPA meets every burst a cold start late

    # The pool without history plans all the same, on what it observes now.
    assert "cannot be read" in blind["message"]
    assert blind_status["desiredReplicas"] >= 1
    assert blind_status.get("risk", {}).get("seededFrom") is None
    metrics = k.condition("blind", "MetricsAvailable")
    assert metrics is not None
    assert metrics["status"] == "True"
