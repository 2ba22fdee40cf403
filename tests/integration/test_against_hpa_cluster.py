"""A pool in dry run reports what a shadow HPA would have done: the same numbers as the
backtest library's shadow replayed on exactly what the operator read.

The pool reads backfilled vLLM history from a real Prometheus (a request rate that jumps
from 6 to 22 req/s for two minutes in every six). The operator runs the shadow HPA on the
demand it observes at each reconcile. Prometheus' query log says at which evaluation times
the operator asked its demand query; the test asks the same query at the same times and
steps the pure shadow (:func:`~prescaler.backtest.shadow_step`, which runs the backtest's
:class:`~prescaler.backtest.ReactivePolicy`) through them. The operator's GPU-hours, short
minutes and unserved share must be the replay's, within :data:`GPU_HOURS_TOLERANCE`,
:data:`SHORT_MINUTES_TOLERANCE` and :data:`UNSERVED_TOLERANCE`, however late its reconciles
ran on a busy machine: the comparison is of the wiring (the demand's unit, the target, the
cold start, the counters kept across reconciles), not of when the reconciles happened.
That the shadow makes the backtest's decisions on the same demand is pinned without I/O in
``tests/unit/test_shadow_hpa.py``. (A backtest of per-minute means instead, as the operator
would replay a day, differs from the live shadow by up to a fifth at some start phases: the
HPA holds the highest recommendation for five minutes, and a minute's mean is below the
jump's instantaneous peak.)

A restarted operator goes on counting from ``status.againstHpa`` (its own test, pool and
Prometheus, so that it runs beside the comparison rather than after it).
"""

from __future__ import annotations

import math
import time
from typing import Any

import pytest

from integration.history_world import (  # noqa: F401 (fixtures)
    RECENT_HOUR,
    HistoryWorld,
    world_fixture,
)
from integration.operator_fixtures import Kube, crd_fixture, wait_for  # noqa: F401 (fixtures)
from prescaler.backtest import Observed, ReactivePolicy, ShadowSetup, ShadowState, shadow_step
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
SYNC = ReactivePolicy.sync_seconds
OBSERVE_MINUTES = 9
START_PHASE = 240.0
"""Where in the period the pool is created: after the 2-minute rate window has settled on
the low rate, before the next jump, so that the shadow starts low and meets a jump."""
GPU_HOURS_TOLERANCE = 0.02
"""Relative: the operator's GPU-hours against the replay's (the status rounds them)."""
SHORT_MINUTES_TOLERANCE = 0
UNSERVED_TOLERANCE = 0.005
"""Absolute, on the share of demand left unserved."""
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


def _replay(
    world: HistoryWorld, query: str, setup: ShadowSetup, clock: float
) -> tuple[ShadowState, int]:
    """The pure shadow stepped through the operator's reads of ``query`` (from Prometheus'
    query log) up to the sync ``clock``, on what Prometheus answers at those times; and
    how many reads that was."""
    state, reads = ShadowState(), 0
    for at in world.prometheus.instant_queries(query):
        if math.floor(at / SYNC) * SYNC > clock + 1e-6:
            break
        result = world.prometheus.query(query, at)["result"]
        demand = float(result[0]["value"][1]) if result else None
        state = shadow_step(state, setup, Observed(at, demand, ready=1, existing=1, planned=1))
        reads += 1
    return state, reads


def test_a_dry_run_pool_counts_against_a_shadow_hpa_as_a_replay_of_what_it_read(
    world: HistoryWorld,
) -> None:
    k = world.kube
    _pool_over_history(world, _origin(START_PHASE))  # the pool starts in the low phase
    with world.operator(interval_seconds=2.0):
        wait_for(
            lambda: _observed_minutes(_against(k)) >= OBSERVE_MINUTES,
            OBSERVE_MINUTES * 60 + 600,
            f"{OBSERVE_MINUTES} minutes compared with the shadow HPA",
            interval=2.0,
        )
    against = _against(k)  # the last status the operator wrote (flushed as it stopped)
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

    query = render_queries("vllm", selector=world.selector, window="2m").demand_query
    setup = ShadowSetup(
        replica_capacity=against["hpa"]["replicaCapacity"],
        min_replicas=1,
        max_replicas=10,
        cold_start_seconds=COLD_START,
        target=ReactivePolicy.target,
    )
    replay, reads = _replay(world, query, setup, against["clock"])
    assert replay.clock == against["clock"]
    assert reads >= OBSERVE_MINUTES * 4  # a read a sync at least, however busy the machine
    hours = replay.hours
    seconds = sum(h.seconds for h in hours)
    assert seconds == pytest.approx(sum(h["seconds"] for h in against["hours"]))
    hpa_gpu_hours = sum(h.hpa_gpu_hours for h in hours)
    unserved = sum(h.hpa_unserved for h in hours) / sum(h.demand for h in hours)
    short = sum(h.hpa_short_minutes for h in hours)
    # Nine minutes hold at least one jump, which the HPA meets one cold start late.
    assert short >= 1
    assert day["hpaGpuHours"] == pytest.approx(hpa_gpu_hours, rel=GPU_HOURS_TOLERANCE)
    assert abs(day["hpaShortMinutes"] - short) <= SHORT_MINUTES_TOLERANCE
    assert day["hpaUnservedFraction"] == pytest.approx(unserved, abs=UNSERVED_TOLERANCE)
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
