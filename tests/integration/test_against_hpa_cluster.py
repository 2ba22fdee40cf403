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
minutes that start weighs more than any later difference. The rate's phase is counted from
an origin the test picks (:func:`_origin`) so that the pool starts there at once, instead
of waiting for the wall clock to come round to it.

A restarted operator goes on counting from ``status.againstHpa`` (its own test, pool and
Prometheus, so that it runs beside the comparison rather than after it).
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import pytest

from integration.history_world import (  # noqa: F401 (fixtures)
    RECENT_HOUR,
    HistoryWorld,
    world_fixture,
)
from integration.operator_fixtures import Kube, crd_fixture, wait_for  # noqa: F401 (fixtures)
from prescaler.backtest import Demand, FleetConfig, ReactivePolicy, score, simulate
from prescaler.sources import render_queries

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.prometheus,
    pytest.mark.slow,
    pytest.mark.timeout(1800),  # minutes of live demand on a busy machine
]

PERIOD, HIGH_SECONDS = 360.0, 120.0
HIGH, LOW = 22.0, 6.0
COLD_START = 60.0
OBSERVE_MINUTES = 9
START_PHASE = (240.0, 330.0)
"""Where in the period the compared stretch starts: after the 2-minute rate window has
settled on the low rate (two minutes after the jump ends: until then the demand the shadow
first sees is still high and it starts with the replicas that meet the next jump in
time), before the next jump."""
GPU_HOURS_TOLERANCE = 0.10
"""Relative: the shadow's GPU-hours against the backtest's."""
SHORT_MINUTES_TOLERANCE = 2
UNSERVED_TOLERANCE = 0.1
"""Absolute, on the share of demand left unserved (one jump or two in the stretch: a jump
met a sync apart moves it by several points)."""
RESTART_PHASE = 270.0
"""Where in the period the restart test's pool starts: low and settled, a jump 90 s away,
so that a short minute is counted before the restart."""
MINUTES_BEFORE_RESTART = 3
MINUTES_AFTER_RESTART = 2


def _origin(phase: float) -> float:
    """The rate's time origin that puts now at ``phase`` into the period (at most one sync
    later): on the shadow HPA's sync grid, as the wall clock's multiples of the period are."""
    sync = ReactivePolicy.sync_seconds
    return math.floor((time.time() - phase) / sync) * sync


def _rate(t: float, origin: float) -> float:
    return HIGH if (t - origin) % PERIOD < HIGH_SECONDS else LOW


def _pool_over_history(world: HistoryWorld, origin: float) -> None:
    """An hour of history and three hours ahead (the live samples), one phase for both, and
    the dry-run pool over it."""
    now = time.time()
    world.pool_over_history(
        "chat",
        lambda t: _rate(t, origin),
        now - 3600,
        now + 3 * 3600,
        pool={
            "minReplicas": 1,
            "maxReplicas": 10,
            "dryRun": True,
            "model": {"tokensPerSecond": 3750},
            "coldStart": {"mode": "fixed", "seconds": COLD_START},
        },
        forecast=RECENT_HOUR,
    )


def _against(k: Kube) -> dict[str, Any]:
    return dict(k.status("chat").get("againstHpa") or {})


def _observed_minutes(against: dict[str, Any]) -> float:
    return float(sum(h.get("seconds", 0.0) for h in against.get("hours", []))) / 60.0


def test_a_dry_run_pool_compares_itself_with_a_shadow_hpa_as_the_backtest_does(
    world: HistoryWorld,
) -> None:
    k, prometheus = world.kube, world.prometheus
    origin = _origin(START_PHASE[0])  # the pool starts in the low phase
    _pool_over_history(world, origin)
    with world.operator(interval_seconds=2.0):
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
    # Under an hour observed live, the one-line summary is the estimate from the replay of
    # the pool's history (its seed), said so; the live windows are the comparison.
    if against.get("fromHistory") is not None and day["observedHours"] < 1.0:
        assert against["summary"].endswith("%) from history")
    else:
        assert against["summary"].endswith("%)")

    # The backtest of the same stretch: the steps the shadow scored, [first, clock).
    clock = against["clock"]
    seconds = sum(h["seconds"] for h in against["hours"])
    first = clock - seconds
    phase = (first - origin) % PERIOD
    assert START_PHASE[0] <= phase < START_PHASE[1], f"the operator started late ({phase:.0f} s)"
    minutes = int(seconds // 60)
    query = render_queries("vllm", selector=world.selector, window="2m").demand_query
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


def test_a_restarted_operator_goes_on_counting_against_the_shadow_hpa_from_status(
    world: HistoryWorld,
) -> None:
    k = world.kube
    _pool_over_history(world, _origin(RESTART_PHASE))

    def counted_a_jump() -> dict[str, Any] | None:
        # A few minutes, one of them short (the jump): a restart that dropped the counters
        # would lose it.
        a = _against(k)
        if _observed_minutes(a) < MINUTES_BEFORE_RESTART:
            return None
        return a if a["last24Hours"]["hpaShortMinutes"] >= 1 else None

    with world.operator(interval_seconds=2.0):
        wait_for(
            counted_a_jump,
            MINUTES_BEFORE_RESTART * 60 + PERIOD + 600,
            f"{MINUTES_BEFORE_RESTART} minutes compared with the shadow HPA, a jump among them",
            interval=2.0,
        )
    against = _against(k)  # the last status the operator wrote
    day = against["last24Hours"]

    # A restarted operator goes on from the counters in status.
    kept_minutes = _observed_minutes(against)
    with world.operator(interval_seconds=2.0):
        resumed = wait_for(
            lambda: (
                (a := _against(k))
                and _observed_minutes(a) >= kept_minutes + MINUTES_AFTER_RESTART
                and a
            ),
            MINUTES_AFTER_RESTART * 60 + 600,
            "the restarted operator's comparison",
            interval=1.0,
        )
    assert resumed["hours"][0]["start"] == against["hours"][0]["start"]
    assert resumed["last24Hours"]["hpaGpuHours"] > day["hpaGpuHours"]
    assert resumed["last24Hours"]["hpaShortMinutes"] >= day["hpaShortMinutes"]
