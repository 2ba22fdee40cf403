"""Degradation levels in the backtest: what :func:`prescaler.planning.assess` would have
published for each simulated fleet, and how early the forecast warned before the queue.

Every fleet is assessed at each of its recorded :class:`FleetSignals` steps (the run's
``signals_every_seconds``: the operator's reconcile period), with the hysteresis state of
one step handed to the next, on what that fleet's metrics show:

* ``serving_replicas``: its ready replicas;
* ``waiting``: its simulated queue, as old as the other metrics (``metric_lag``), in
  requests of the capacity model's mean size;
* ``kv_cache_usage`` and TTFT: not simulated (``None``), so those signals never fire: the
  fluid fleet has neither a KV cache nor per-request latencies;
* ``forecast``: the forecast the predictive policy's forecaster made at that moment (the
  same ``ForecastService`` output it planned on; as in the operator, only when its plan
  could use it), for *every* fleet: an HPA-run fleet is assessed as prescaler watching it,
  with the same forecasts and its own replicas;
* ``arrivals``: the expected ready time of each of its starting replicas;
* ``observed_requests_per_second``: the lagged demand.

**Lead.** A second assessment of the same fleet on the queue alone (``forecast=None``, its
own hysteresis) says when the queue would have raised the level. For each *episode* (the
queue-only level rises from ``normal`` to ``warning`` or above) the lead is how long the
forecast-shortfall signal (``Assessment.signal_levels["forecastShortfall"]``) had already
been at ``warning`` or above without a break, up to the step before the episode: at most
``window_seconds`` (an hour), 0 when it was not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from prescaler.backtest._simulate import FleetSignals
from prescaler.capacity import CapacityModel
from prescaler.planning import (
    LEVELS,
    DegradationInputs,
    DegradationPolicy,
    DegradationState,
    ForecastLike,
    Signals,
    assess,
)

LEAD_WINDOW_SECONDS = 3600.0
"""How far back a forecast warning counts towards a lead."""
NOT_SIMULATED = ("kvCache", "ttftP95", "ttftP99")
"""Signals the simulated fleet cannot produce."""


@dataclass(frozen=True)
class DegradationSetup:
    """How the backtest assesses degradation: the pool's thresholds (from its spec) and the
    capacity model the fleet runs on."""

    policy: DegradationPolicy
    capacity: CapacityModel
    every_seconds: float
    """The assessment cadence (a multiple of the simulation step)."""
    lead_window_seconds: float = LEAD_WINDOW_SECONDS


@dataclass(frozen=True)
class LeadStats:
    """How early the forecast-shortfall signal warned, per queue-only episode."""

    leads_seconds: tuple[float, ...]
    """One per episode, in order; 0 where the forecast did not warn first."""
    window_seconds: float

    @property
    def episodes(self) -> int:
        return len(self.leads_seconds)

    @property
    def forecast_first(self) -> int:
        """Episodes the forecast warned about before the queue."""
        return sum(1 for lead in self.leads_seconds if lead > 0)

    def as_dict(self) -> dict[str, Any]:
        leads = np.asarray(self.leads_seconds, dtype=float)
        some = len(leads) > 0
        return {
            "episodes": self.episodes,
            "forecast_first": self.forecast_first,
            "forecast_first_share": self.forecast_first / self.episodes if some else None,
            "median_seconds": float(np.percentile(leads, 50)) if some else None,
            "p90_seconds": float(np.percentile(leads, 90)) if some else None,
            "window_seconds": self.window_seconds,
        }


def lead_times(
    queue_levels: np.ndarray,
    shortfall_levels: np.ndarray,
    every_seconds: float,
    window_seconds: float = LEAD_WINDOW_SECONDS,
) -> LeadStats:
    """The lead of every queue-only episode (see the module docstring).

    ``queue_levels`` and ``shortfall_levels`` are level ranks (0 normal, 1 warning,
    2 critical) at consecutive assessments ``every_seconds`` apart; a shortfall rank below 0
    means the signal was not measured (no forecast). The level before the first assessment
    is ``normal``.
    """
    queue = np.asarray(queue_levels)
    short = np.asarray(shortfall_levels)
    if queue.shape != short.shape:
        raise ValueError("queue and shortfall levels must have the same length")
    if not every_seconds > 0:
        raise ValueError("the assessment cadence must be > 0 s")
    window_steps = int(window_seconds // every_seconds)
    up = queue >= 1
    starts = np.flatnonzero(up & ~np.concatenate([[False], up[:-1]]))
    warned = short >= 1
    leads: list[float] = []
    for e in starts:
        steps = 0
        i = int(e) - 1
        while i >= 0 and steps < window_steps and warned[i]:
            steps += 1
            i -= 1
        leads.append(steps * every_seconds)
    return LeadStats(tuple(leads), window_seconds)


@dataclass(frozen=True)
class DegradationRun:
    """One fleet's degradation levels over the replay."""

    name: str
    durations: np.ndarray
    """Seconds each assessment stands for."""
    levels: np.ndarray
    """The published level's rank at each assessment (every signal, forecast included)."""
    queue_levels: np.ndarray
    """The queue-only level's rank (its own hysteresis)."""
    shortfall_levels: np.ndarray
    """The forecast-shortfall signal's rank; -1 where it was not measured."""
    lead: LeadStats | None
    """``None`` when no forecast was made."""
    every_seconds: float

    def minutes(self, which: str = "levels") -> dict[str, float]:
        """Minutes at each level (``which``: ``levels`` or ``queue_levels``)."""
        ranks = self.levels if which == "levels" else self.queue_levels
        return {
            level: float(self.durations[ranks == i].sum()) / 60.0 for i, level in enumerate(LEVELS)
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "minutes": self.minutes(),
            "queue_only_minutes": self.minutes("queue_levels"),
            "forecast_shortfall_warning_minutes": float(
                self.durations[self.shortfall_levels >= 1].sum() / 60.0
            ),
            "lead": self.lead.as_dict() if self.lead is not None else None,
        }


def assess_fleet(
    name: str,
    signals: FleetSignals,
    forecasts: Sequence[ForecastLike | None] | None,
    setup: DegradationSetup,
    cold_start_seconds: float,
) -> DegradationRun:
    """Assess one fleet at each of its recorded steps, with and without the forecast."""
    if forecasts is not None and len(forecasts) != len(signals):
        raise ValueError(f"{name}: {len(forecasts)} forecasts for {len(signals)} assessments")
    per_request = setup.capacity.tokens.tokens_per_request
    n = len(signals)
    levels = np.zeros(n, dtype=np.int8)
    queue_levels = np.zeros(n, dtype=np.int8)
    shortfall = np.full(n, -1, dtype=np.int8)
    state = DegradationState()
    queue_state = DegradationState()
    for j in range(n):
        observed = float(signals.metric_tokens_per_s[j]) / per_request
        measured = Signals(
            serving_replicas=int(signals.ready[j]),
            waiting=float(signals.queue_tokens[j]) / per_request,
            observed_requests_per_second=observed,
        )
        now = float(signals.times[j])
        arrivals = signals.arrivals[j]
        forecast = forecasts[j] if forecasts is not None else None
        previous = state
        inputs = DegradationInputs(
            now=now,
            policy=setup.policy,
            capacity=setup.capacity,
            signals=measured,
            cold_start_seconds=cold_start_seconds,
            forecast=forecast,
            arrivals=arrivals,
            previous=state,
        )
        full = assess(inputs)
        state = full.state
        levels[j] = LEVELS.index(full.level)
        signal = full.signal_levels.get("forecastShortfall")
        if signal is not None:
            shortfall[j] = LEVELS.index(signal)
        if forecast is None and queue_state == previous:
            queue_only = full  # the same inputs: the same assessment
        else:
            queue_only = assess(replace(inputs, forecast=None, previous=queue_state))
        queue_state = queue_only.state
        queue_levels[j] = LEVELS.index(queue_only.level)
    lead = None
    if forecasts is not None:
        lead = lead_times(queue_levels, shortfall, signals.every_seconds, setup.lead_window_seconds)
    return DegradationRun(
        name=name,
        durations=signals.durations,
        levels=levels,
        queue_levels=queue_levels,
        shortfall_levels=shortfall,
        lead=lead,
        every_seconds=signals.every_seconds,
    )
