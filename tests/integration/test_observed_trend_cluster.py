"""The ramp nowcast on the cluster: a climb that no forecast foresees, played live.

The history is flat for an hour, then demand climbs steadily from a minute after the test
starts (the backfill reaches minutes into the future, so "now" is set in advance). Two
pools read that one series and scale a Deployment each: ``trend`` at the default
``observedTrendSeconds`` (120 s), ``flat`` with it at 0. The operator remembers what it
observed at each reconcile and measures the rise over the last minute or so; the first
pool sizes what arrives where the climb is heading, the second sizes it as it is. The
planner's arithmetic is unit-tested (``tests/unit/test_observed_trend.py``); this is the
wiring: the rise the operator measures from Prometheus between its own reconciles.
"""

from __future__ import annotations

import math
import re
import time
from typing import Any

import pytest

from cluster.objects import gpu_deployment
from integration.history_world import (  # noqa: F401 (fixtures)
    LIVE_RECENT_MEAN,
    HistoryWorld,
    world_fixture,
)
from integration.operator_fixtures import crd_fixture, wait_for  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus]

LOW, HIGH = 2.0, 20.0
CLIMB = 6.0 / 60
"""Requests/s gained per second while climbing: 6 req/s a minute, 3 minutes from LOW to HIGH."""
# 600 prompt + 150 output tokens per request (the harness' vLLM profile): 5 req/s per replica.
MODEL = {"tokensPerSecond": 3750, "promptTokens": 600, "outputTokens": 150}
REPLICA_RPS = 5.0
TREND_SECONDS = 120.0
MAX_REPLICAS = 10
RISING = re.compile(r"rising ([-+.\deE]+)/s, ([-+.\deE]+) now")


def pool(world: HistoryWorld, target: str, **forecast: Any) -> dict[str, Any]:
    return world.pool_spec(
        {
            "minReplicas": 1,
            "maxReplicas": MAX_REPLICAS,
            "model": MODEL,
            "coldStart": {"mode": "fixed", "seconds": 5, "marginSeconds": 0},
            # The forecast planner's nowcast is what this plays: on a flat hour the HPA is
            # as good and cheaper, so spec.policy auto would plan as the HPA would.
            "policy": "forecast",
            # The median of the peak, fixed: the demand and its climb size the pools, not
            # a margin learned from the one climb this test plays.
            "objective": {"startQuantile": 0.5, "adaptRate": 0},
        },
        {**LIVE_RECENT_MEAN, **forecast},
        target=target,
    )


def test_a_live_climb_is_sized_where_it_is_heading(world: HistoryWorld) -> None:
    k = world.kube
    start = time.time() + 60

    def rate(t: float) -> float:
        return min(HIGH, LOW + CLIMB * max(0.0, t - start))

    world.backfill(rate, start - 3600, start + 1200)
    k.create_deployment(gpu_deployment("trend", 1, ready_delay="1s"))
    k.create_deployment(gpu_deployment("flat", 1, ready_delay="1s"))
    plans: dict[str, list[dict[str, Any]]] = {"trend": [], "flat": []}
    with world.chart_operator(rate_window="30s"):
        k.create_pool("trend", pool(world, "trend"))
        k.create_pool("flat", pool(world, "flat", observedTrendSeconds=0))

        def record() -> bool:
            for name, seen in plans.items():
                plan = k.status(name).get("plan")
                if plan and (not seen or plan != seen[-1]):
                    seen.append(plan)
            # Until the pool without the trend holds what the top of the climb needs.
            return int(k.deployment("flat").spec.replicas) >= math.ceil(HIGH / REPLICA_RPS)

        wait_for(record, start - time.time() + 600, "the flat pool at the top of the climb", 1.0)
    # The trend pool sized what arrived where the climb was heading: some plan, made while
    # the demand rose, asked for what the observed demand plus two minutes of its rise
    # needs, more than the observed demand alone needs.
    ahead = []
    for plan in plans["trend"]:
        found = RISING.search(plan["reason"])
        if found is None:
            continue
        rise, observed = float(found[1]), float(found[2])
        now_needs = math.ceil(observed / REPLICA_RPS)
        heading = math.ceil((observed + rise * TREND_SECONDS) / REPLICA_RPS)
        heading_needs = min(heading, MAX_REPLICAS)
        assert plan["targetReplicas"] >= heading_needs, plan
        if heading_needs > now_needs:
            ahead.append(plan)
    assert ahead, [p["reason"] for p in plans["trend"]]
    # The steepest rise it measured is the climb's (within a factor of two: the observed
    # rate lags, and reconciles land between scrapes); at the climb's ends it measures less.
    steepest = max(float(m[1]) for p in ahead if (m := RISING.search(p["reason"])))
    print(f"{len(ahead)} plans sized ahead of the demand; steepest rise {steepest:.3g}/s")
    assert CLIMB / 2 <= steepest <= CLIMB * 2, steepest
    # The pool without the trend sized the demand as it was, and never said it was rising.
    assert plans["flat"], "no plan of the flat pool"
    assert not any("rising" in p["reason"] for p in plans["flat"]), plans["flat"]
