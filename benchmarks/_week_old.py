"""The ``status.againstHpa`` of a pool a week old, as the operator keeps it (shared by the
operator-scale and API-cost benchmarks)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from prescaler.backtest import Observed, ShadowSetup, ShadowState, shadow_step
from prescaler.controller.status import against_hpa_status

_SETUP = ShadowSetup(
    replica_capacity=5.0, min_replicas=1, max_replicas=40, cold_start_seconds=240.0
)


def week_old_against_hpa(now: float) -> dict[str, Any]:
    """A week of daily-cycle demand observed once a minute up to ``now``, run through the
    shadow HPA (its buckets merged as the operator merges them), as the status wire form."""
    rng = np.random.default_rng(7)
    state = ShadowState()
    start = math.floor(now / 60.0) * 60.0 - 7 * 86400.0
    for minute in range(7 * 1440):
        demand = 60.0 + 40.0 * math.sin(2 * math.pi * minute / 1440) + rng.normal(0.0, 4.0)
        fleet = max(1, math.ceil(demand * 1.2 / _SETUP.replica_capacity))
        seen = Observed(now=start + 60.0 * minute, demand=demand, ready=fleet, existing=fleet)
        state = shadow_step(state, _SETUP, seen)
    return against_hpa_status(state, _SETUP, "default", now).wire()
