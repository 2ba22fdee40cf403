"""``spec.policy: auto`` on a real Prometheus: a pool whose history says reactive starts
reactive, and switches to the forecast when its traffic gains a daily ramp.

The pool's "day" is half an hour (``seasonalityPeriods: [1800]``) and its checks come every
minute (``PRESCALER_RECONCILE_POLICY_CHECK_SECONDS``), so days of a pool's life pass in
minutes; everything else is the product's path: the history read from Prometheus, the
replay in the operator's fit process, the status, the Event, the metric.

Three hours of vLLM history are backfilled: a daily ramp (6 to 30 req/s, up over a third
of the day, held, down) for the first half, then only the base rate: the cycle stopped.
The pool's first replay (its last 90 minutes, the first half warming the forecaster up)
weighs the forecast, which still expects the ramps, against the HPA swept over its target:
both serve everything, and the forecast buys capacity for ramps that do not come: the
dearer of the two. So the pool plans as its HPA would, from its first
verdict, and says why. Then the ramp returns: a second pod's series, backfilled over the
replayed span and on into the live minutes, carries it. The next checks read the HPA a cold
start late on every ramp and the forecast ahead of it: after two checks in a row, the pool
switches to the forecast, with an Event. A pool over the same history whose spec names
``policy: forecast`` is never switched.

A pool that names ``policy: leading``, over a history whose every day has the ramp, plans its
HPA's count led by the forecast: as a ramp comes, the forecast's count at the HPA's target,
before the HPA's own count grows.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from cluster.objects import gpu_deployment
from integration.history_world import HistoryWorld, world_fixture  # noqa: F401 (fixtures)
from integration.operator_fixtures import crd_fixture, wait_for  # noqa: F401 (fixtures)

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.prometheus,
    pytest.mark.slow,
    pytest.mark.timeout(2400),
]

HOURS = 3
DAY = 1800.0
"""The pool's day: its seasonal period."""
BASE, PEAK = 6.0, 30.0
CHECK_SECONDS = 60.0


def _ramp(t: float) -> float:
    """The daily ramp: up over the day's first 30 %, held to half the day, down by 60 %."""
    x = (t % DAY) / DAY
    if x < 0.3:
        return BASE + (PEAK - BASE) * x / 0.3
    if x < 0.5:
        return PEAK
    if x < 0.6:
        return PEAK - (PEAK - BASE) * (x - 0.5) / 0.1
    return BASE


POOL: dict[str, Any] = {
    "minReplicas": 1,
    "maxReplicas": 20,
    "dryRun": True,
    "model": {"tokensPerSecond": 3750},
    "coldStart": {"mode": "fixed", "seconds": 120},
}
FORECAST: dict[str, Any] = {
    "model": "seasonal_profile",
    "seasonalityPeriods": [int(DAY)],
    "lookbackSeconds": HOURS * 3600,
    "stepSeconds": 60,
    "horizonSeconds": 900,
}


def test_auto_starts_reactive_on_a_stopped_cycle_and_switches_to_the_forecast_when_it_returns(
    world: HistoryWorld,
) -> None:
    k = world.kube
    now = time.time()
    stopped = now - HOURS * 3600 / 2  # the replayed span starts here

    world.backfill(lambda t: _ramp(t) if t < stopped else BASE, now - HOURS * 3600, now + 3600)
    k.create_deployment(gpu_deployment("llm", 1))
    k.create_deployment(gpu_deployment("named", 1))
    world.create_pool("chat", POOL, FORECAST)
    world.create_pool("named", {**POOL, "policy": "forecast"}, FORECAST, target="named")

    def policy(name: str) -> dict[str, Any]:
        return dict(k.status(name).get("policy") or {})

    with world.operator(interval_seconds=2.0, policy_check_seconds=CHECK_SECONDS) as metrics:
        first = wait_for(
            lambda: (
                (p := policy("chat")).get("chosenBy") == "history"
                and p.get("checkedAt") is not None
                and p
            ),
            900,
            "pool chat's first verdict from its history",
            interval=1.0,
        )
        # The ramp returns: a second pod serves it, over the replayed span and on.
        world.backfill(
            lambda t: _ramp(t) - BASE if t >= stopped else 0.0,
            stopped,
            time.time() + 3600,
            pods=("vllm-1",),
        )
        switched = wait_for(
            lambda: (
                (p := policy("chat")).get("inForce") == "forecast" and p.get("switches") == 2 and p
            ),
            900,
            "pool chat switched to the forecast",
            interval=1.0,
            explain=lambda: str(policy("chat")),
        )
        gauge = {
            name: metrics.registry.get_sample_value(
                "prescaler_policy_in_force", {"namespace": k.ns, "pool": "chat", "policy": name}
            )
            for name in ("forecast", "reactive")
        }
        named = policy("named")

    # The history said reactive at once, and why: the forecast was beyond the HPA's curve.
    # (Both served everything and the forecast was the dearer: the cheaper plans.)
    assert first["inForce"] == "reactive", first
    assert "x the HPA's GPU-hours" in first["reason"]
    evidence = first["evidence"]
    assert evidence["forecastGpuHours"] > evidence["hpaGpuHours"]
    assert evidence["forecastUnserved"] < 1e-4
    assert max(evidence["curveUnserved"]) < 1e-4

    # The ramp returned: the forecast left far less waiting than the HPA's curve there.
    assert switched["chosenBy"] == "history"
    assert switched["frontierRatio"] is not None
    assert switched["frontierRatio"] <= 0.8
    assert "2 checks in a row" in switched["reason"]
    assert switched["since"] > first["since"]
    assert gauge == {"forecast": 1, "reactive": 0}
    messages = [e.message for e in k.events("chat") if e.reason == "PolicySwitched"]
    assert len(messages) == 2, messages
    assert "(reactive)" in messages[0], messages
    assert "(forecast)" in messages[1], messages

    # The spec's choice stands, whatever the history says.
    assert (named["inForce"], named["chosenBy"], named["switches"]) == ("forecast", "spec", 0)
    assert not [e for e in k.events("named") if e.reason == "PolicySwitched"]


def test_a_pool_that_names_leading_asks_for_a_ramp_before_its_hpa(world: HistoryWorld) -> None:
    k = world.kube
    now = time.time()
    world.backfill(_ramp, now - HOURS * 3600, now + 3600)
    k.create_deployment(gpu_deployment("led", 1))
    world.create_pool("led", {**POOL, "policy": "leading"}, FORECAST, target="led")

    def plan() -> dict[str, Any]:
        return dict(k.status("led").get("plan") or {})

    def led() -> dict[str, Any] | None:
        p = plan()
        return p if "leading:" in p.get("reason", "") else None

    with world.operator(interval_seconds=2.0):
        # Within a day (half an hour) a ramp comes: the forecast sees it first.
        ahead = wait_for(
            led,
            DAY + 600,
            "pool led asking for the forecast's count before its HPA's",
            interval=1.0,
            explain=lambda: str(plan()),
        )
        policy = dict(k.status("led").get("policy") or {})

    assert (policy["inForce"], policy["chosenBy"], policy["switches"]) == ("leading", "spec", 0)
    # "... at the HPA's target 0.7 needs K (the HPA holds N)": more than the HPA's count.
    reason = ahead["reason"]
    needs = int(reason.split(" needs ")[1].split(" ")[0])
    holds = int(reason.split("(the HPA holds ")[1].rstrip(")"))
    assert needs > holds, reason
    assert ahead["targetReplicas"] == needs
    assert "forecast mean's peak" in reason
