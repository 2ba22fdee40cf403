"""The auto-selection survives an operator restart through the pool's status.

The first operator selects a model over a backfilled history and writes the selection to
``status.forecast.selection`` (through the real API server and the CRD's schema). A second
operator process (a restart, or a takeover after failover) reads it back and forecasts
with it without backtesting again.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any

import pytest

from integration.history_world import (  # noqa: F401 (fixtures)
    RECENT_HOUR,
    HistoryWorld,
    world_fixture,
)
from integration.operator_fixtures import crd_fixture, wait_for  # noqa: F401 (fixtures)
from prescaler.metrics import Metrics

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus]

DAY = 86_400
STEP = 60


def _counter(metrics: Metrics, name: str, **labels: str) -> float:
    return sum(
        s.value
        for family in metrics.registry.collect()
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def test_a_restarted_operator_resumes_the_selection_from_status(world: HistoryWorld) -> None:
    k = world.kube
    now = time.time()
    world.pool_over_history(
        "chat",
        lambda t: 6 + 4 * math.sin(2 * math.pi * (t % DAY) / DAY),
        now - 2 * DAY,
        now + 600,
        pool={
            "minReplicas": 1,
            "maxReplicas": 4,
            "model": {"tokensPerSecond": 3750},
            "coldStart": {"mode": "fixed", "seconds": 60},
        },
        forecast={
            "model": "auto",
            "lookbackSeconds": 2 * DAY,
            "stepSeconds": STEP,
            "horizonSeconds": 900,
            "refitSeconds": 3600,
        },
    )
    fast = functools.partial(world.operator, first_fit_spread_seconds=0.0, interval_seconds=2.0)

    def selection() -> dict[str, Any] | None:
        return (k.status("chat").get("forecast") or {}).get("selection")

    with fast() as first:
        kept = wait_for(selection, 300, "an auto-selection in status", interval=1.0)
        # The selection is in use (and in status) before its job counts it: a chosen model
        # that needs a fit is fitted first. Wait for the count, don't race it.
        wait_for(
            lambda: _counter(first, "prescaler_forecast_fits_total", model="selection") >= 1,
            60,
            "the selection counted in prescaler_forecast_fits_total",
        )
    assert kept["model"] in kept["scores"]
    assert kept["score"] == kept["scores"][kept["model"]]
    assert len(kept["fingerprint"]) == 16
    restarted_at = time.time()

    def forecast_after_restart() -> dict[str, Any] | None:
        status = k.status("chat")
        forecast = status.get("forecast") or {}
        generated = forecast.get("generatedAt", "")
        healthy: dict[str, Any] = next(
            (c for c in status.get("conditions", []) if c["type"] == "ForecastHealthy"), {}
        )
        fresh = generated >= time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(restarted_at))
        return status if fresh and healthy.get("status") == "True" else None

    with fast() as second:
        status = wait_for(forecast_after_restart, 300, "a forecast from the new operator")
        assert _counter(second, "prescaler_forecast_selections_resumed_total") >= 1
        assert _counter(second, "prescaler_forecast_fits_total", model="selection") == 0
    assert status["forecast"]["selection"] == kept


def test_a_restarted_operator_keeps_the_risk_models_calibration(world: HistoryWorld) -> None:
    """The peak risk model learns from the pool's own lookaheads (``status.risk``). A
    restarted operator goes on from that calibration: it does not fall back to the
    forecast's band for another 60 lookaheads."""
    k = world.kube
    now = time.time()
    world.pool_over_history(
        "steady",
        lambda t: 6 + 2 * math.sin(2 * math.pi * t / 1800),
        now - 3 * 3600,
        now + 1800,
        pool={
            "minReplicas": 1,
            "maxReplicas": 6,
            "model": {"tokensPerSecond": 3750},
            # A lookahead of 3 s: with a reconcile a second, one ends every reconcile.
            "coldStart": {"mode": "fixed", "seconds": 2, "marginSeconds": 1},
        },
        forecast=RECENT_HOUR,
    )

    def risk() -> dict[str, Any]:
        return dict(k.status("steady").get("risk") or {})

    with world.operator(interval_seconds=1.0):
        kept = wait_for(
            lambda: (r := risk()) and r.get("margin") is not None and r,
            300,
            "a calibrated margin in status.risk",
            interval=1.0,
        )
    kept = risk()  # the last status the first operator wrote
    assert kept["outcomes"] >= 60
    assert len(kept["calibration"]) == 100
    assert len(kept["quantiles"]) == 24  # the level of each hour of the day

    with world.operator(interval_seconds=1.0):
        resumed = wait_for(
            lambda: (r := risk()) and r.get("observedAt") != kept.get("observedAt") and r,
            300,
            "a reconcile by the restarted operator",
            interval=0.2,
        )
    # Its first reconciles went on from the first operator's calibration: the count did not
    # start again, and the plan was sized with the calibrated margin, not the band.
    assert resumed["outcomes"] >= kept["outcomes"]
    assert resumed["margin"] is not None
    assert sum(resumed["calibration"]) > 0.9 * sum(kept["calibration"])
    # Every hour's level went on as it was, but the hour (or two) the lookaheads since
    # ended in.
    assert len(resumed["quantiles"]) == 24
    pairs = zip(kept["quantiles"], resumed["quantiles"], strict=True)
    moved = [h for h, (a, b) in enumerate(pairs) if a != b]
    assert len(moved) <= 2, moved
