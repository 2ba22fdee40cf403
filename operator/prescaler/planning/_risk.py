"""The plan's one risk margin: a calibrated quantile of the lookahead's *peak* demand.

What ready capacity must cover is the largest demand between now and the moment new
capacity could be ready: the peak over the lookahead ``[now, now + cold start + margin]``,
not any single forecast point. The risk model sizes it as ``(base + u) × margin − u``:

* ``base`` is what is known now: the larger of the forecast mean's peak over the
  lookahead and the demand arriving now (the observation), so the prediction is
  conditioned on the observed level and on the forecast at once; when demand runs above
  the forecast's mean now, the forecast's climb over the lookahead is applied to the
  observed level (a forecast that runs low on an unusual day still knows the ramp's
  shape);
* ``u`` is the pool's typical demand (its recent mean, at least one replica's capacity):
  the margin is multiplicative on a high base and additive on a low one, so a burst out
  of a quiet spell asks for what such bursts bring in the demand's own scale, instead of
  an enormous ratio that would multiply the next high base as well;
* ``margin`` is ``exp(q)``, where ``q`` is the quantile at level ``θ`` of the pool's own
  recent scores ``log((peak + u) / (base + u))``: split-conformal on a calibration set
  that slides (a histogram whose old mass fades, so the margin follows the pool's
  volatility as it changes). The forecaster's own band is not the yardstick: with little
  history it is as wide as the data is short. Until enough lookaheads have ended, the
  forecast's own upper band stands (and what arrives now);
* ``θ`` starts at ``objective.startQuantile`` and adapts online so that the share of demand
  that waits tracks the objective ``ε`` (adaptive conformal inference, Gibbs and Candès
  2021, in its risk-control form), one ``θ`` per hour of the day (UTC, the hour a
  lookahead starts in: a Mondrian split, :data:`LEVEL_BUCKETS`), so a morning ramp's misses
  raise the margin for tomorrow's morning, not for the quiet hours after it, and a quiet
  hour's calm does not lower it before the ramp comes back. When a lookahead ends,
  ``θ ← θ + γ·(loss − ε)`` in its hour, where
  ``loss`` is the share of that lookahead's demand that waited (in [0, 1]), the step
  weighted by the lookahead's demand over the pool's typical demand (at most
  :data:`WEIGHT_CAP`: the update is bounded, so one burst cannot swing the fleet; the
  objective is a share of demand, so a busy lookahead's miss weighs more than a quiet
  one's). A miss raises the level; lookaheads
  without one lower it slowly, so over time the realized loss averages ``ε`` whatever the
  traffic does;
* ``ε`` is either absolute, ``1 − served fraction``, or relative to what a reactive HPA
  would leave waiting on the same traffic (the default): each lookahead also scores a
  shadow HPA's ready capacity over the same minutes (the operator's ``status.againstHpa``
  simulation, the backtest's too), and ``ε`` is ``ρ`` times the share of the recent
  demand that waited for the HPA (over all recent lookaheads, faded like the histogram:
  the HPA's record on this pool, not in the same minutes), at least a floor. Each
  lookahead is held to that one ``ε``, the ramps too: a forecast's value is in the ramps
  that catch the HPA out, and a target that gave there as the HPA does (``ρ`` times the
  HPA's share in the same minutes) left as much waiting in them as the HPA on the first
  halves, and no less than the floor bought elsewhere. A quiet pool, on which the HPA
  leaves nothing waiting, is held to the floor and its level falls, so it does not pay
  for bursts it never sees.
* with a budget (``objective.budgetToHpa``, ``B``) the cost holds both ways: the pool's
  GPU-hours over the trailing day (the shadow HPA's hourly record, :class:`Spend`) are
  held at ``B`` times the shadow HPA's by a scale ``s`` on ``ε`` (the ε in force is the
  objective's times ``s``). ``s`` is a PI controller's output on the log of the cost ratio
  over the budget (:func:`budget_step`): a pool dearer than its budget lets ``ε`` rise,
  past ``ρ`` times the HPA's share and past the HPA's share itself if need be (at most
  :data:`BUDGET_MAX_TARGET`), until it is inside the budget; a pool cheaper than it
  spends the difference on waiting less (``ρ`` scaled down to at most
  :data:`MIN_RELATIVE_SCALE` of itself, the floor holding). The update is as slow as the
  signal it reads (a trailing day, whose response to a change lags it by half a day and
  the levels' adaptation): the integral moves by :data:`BUDGET_RATE` per day per unit of
  log error, with a proportional term (:data:`BUDGET_GAIN`) for damping, and it stops
  (anti-windup) where it is at its bounds or where the levels that ``ε`` steers are at
  theirs (raising ``ε`` cannot make a pool cheaper whose every level is at the least).

Everything learned is a value (:class:`PeakRisk`): the operator keeps it in the pool's
status, so a restarted or failed-over operator plans with the calibration it had, and the
backtest carries it from one decision to the next. Both call these functions: one code path.
Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

__all__ = [
    "BUDGET_ERROR_CAP",
    "BUDGET_GAIN",
    "BUDGET_MAX_TARGET",
    "BUDGET_MEMORY_SECONDS",
    "BUDGET_RATE",
    "LEVEL_BUCKETS",
    "LOG_BINS",
    "MIN_RELATIVE_SCALE",
    "PEAK_CEILING",
    "Lookahead",
    "PeakRisk",
    "RiskObjective",
    "RiskSizing",
    "Spend",
    "budget_step",
    "capped_demand",
    "observe_risk",
    "record_risk",
    "risk_sizing",
    "sized_demand",
    "waiting_demand",
]

LOG_LOW, LOG_HIGH, LOG_BINS = -0.5, 2.0, 100
"""The histogram's range of scores (the peak's log ratio over what was known: margins 0.61
to 7.4) and its bins (one per 2.5 % of margin). A score outside the range counts in the
end bin."""

_WIDTH = (LOG_HIGH - LOG_LOW) / LOG_BINS
WEIGHT_CAP = 4.0
"""A lookahead's outcome moves the level by at most this many times an ordinary one's
(:func:`demand_weight`): one burst cannot swing the fleet. Chosen on the first halves
(the generated web and stream traces, ServeGen; 240 and 600 s): weighting by demand
left less unserved at the same or fewer GPU-hours in 11 of 12 cells at the default
floor, and 5 of 6 at a third of it."""
LEVEL_BUCKETS = 24
"""The level ``θ`` adapts per hour of the day (UTC): demand with a daily cycle misses in
the same hours every day (a ramp), and one level for the whole day swung with the time
since the last miss, high for the quiet hours after a ramp and low again by the next one.
Chosen on the first halves (the generated web and stream traces, ServeGen, NYC taxi; 240
and 600 s cold starts; ``benchmarks/README.md``, "A level per hour of the day")."""
MAX_PENDING = 64
"""Lookaheads awaiting their outcome, at most (the oldest go first)."""
PEAK_CEILING = 2.0
"""The margin sizes for at most this many times the largest demand observed lately
(:attr:`PeakRisk.peak_demand`; what is known now may ask for more). A pool with little
history and bursty demand calibrates margins of several times a quiet base; without a
ceiling its fleet sat at ``maxReplicas`` for demand it had never seen. Chosen on the first
halves (Azure conv and code at 10x, the generated web and stream traces): 2 leaves the
per-minute traces exactly as they were and cuts Azure's GPU-hours by 16-31 % for the same
unserved demand; 1.5 cut more there but left more unserved on web."""


BUDGET_MEMORY_SECONDS = 86400.0
"""The trailing record a budget (:attr:`RiskObjective.budget_to_hpa`) is held against: the
last day of both fleets' GPU-hours (the shadow HPA's hourly buckets, ``status.againstHpa``'s
``last24Hours``). A day's cycle weighs whole, and its ripple cancels."""
BUDGET_RATE = 1.0
"""The budget controller's integral rate: the log of the scale on ``ε`` moves by this per
day times the log of the trailing day's cost ratio over the budget. Chosen for no
oscillation: on a model of the loop (the trailing day's lag, a first-order lag of up to two
days for the levels to adapt, a cost whose log falls by up to 1 per unit of ``log ε``) it
overshoots the budget by at most 5 % of the first error (``tests/unit/test_risk.py``)."""
BUDGET_GAIN = 2.0
"""The budget controller's proportional gain on the same log error: the damping that lets
:data:`BUDGET_RATE` be as fast as it is without overshoot (at 0, a rate of 1 overshoots by
up to 44 % on the same model)."""
BUDGET_ERROR_CAP = math.log(2.0)
"""The log error the controller reads is clipped to this either way: a record of a few
hours, or a day twice over budget, moves ``ε`` no faster than one at twice the budget."""
BUDGET_MAX_TARGET = 0.2
"""However dear a pool is, the budget lets at most this share of demand wait (unless the
objective itself allows more): beyond it a pool that cannot meet its budget is short
for nothing, as its cost is elsewhere (floors, windows, the release)."""
MIN_RELATIVE_SCALE = 0.1
"""The budget tightens ``ρ`` to at most a tenth of itself."""


@dataclass(frozen=True, slots=True)
class Spend:
    """What a budget is held against: both fleets' GPU-hours over the trailing day."""

    gpu_hours: float
    """The pool's (standby included)."""
    hpa_gpu_hours: float
    """The shadow HPA's on the same demand."""
    hours: float
    """Hours observed in the record: with less than a day, the controller moves slower in
    proportion."""

    @property
    def ratio(self) -> float | None:
        """The pool's GPU-hours over the shadow HPA's (``None``: no record)."""
        ok = all(math.isfinite(x) for x in (self.gpu_hours, self.hpa_gpu_hours, self.hours))
        if not ok or self.hpa_gpu_hours <= 0 or self.gpu_hours < 0 or self.hours <= 0:
            return None
        return self.gpu_hours / self.hpa_gpu_hours


def budget_step(
    integral: float,
    ratio: float,
    hours: float,
    budget: float,
    interval: float,
    ceiling: float,
    *,
    may_loosen: bool = True,
    may_tighten: bool = True,
) -> tuple[float, float]:
    """One step of the budget's PI controller (pure): from its ``integral`` (the log of the
    scale on ``ε``, its state) and the trailing day's cost ``ratio`` over ``hours``
    observed, ``interval`` seconds later, the new ``(integral, scale)``.

    The error is ``log(ratio / budget)``, clipped to :data:`BUDGET_ERROR_CAP` and weighted
    by the record's coverage (``hours`` of 24). The integral moves by :data:`BUDGET_RATE`
    per day times the error; the scale is ``exp(integral + BUDGET_GAIN × error)``. Both
    stay within ``[MIN_RELATIVE_SCALE, ceiling]`` (``ceiling`` >= 1: the scale at which
    ``ε`` reaches :data:`BUDGET_MAX_TARGET`). Anti-windup: the integral stops at the
    bounds, and does not move up when ``may_loosen`` is false (the levels ``ε`` steers are
    at their least: a higher ``ε`` buys nothing) nor down when ``may_tighten`` is false (at
    their most); the proportional term, bounded, stays (no chatter at a bound)."""
    low, high = math.log(MIN_RELATIVE_SCALE), math.log(max(1.0, ceiling))
    if not math.isfinite(integral):
        integral = 0.0
    error = 0.0
    if math.isfinite(ratio) and ratio > 0 and math.isfinite(hours) and hours > 0:
        error = min(BUDGET_ERROR_CAP, max(-BUDGET_ERROR_CAP, math.log(ratio / budget)))
        error *= min(1.0, hours / 24.0)
    step = BUDGET_RATE * min(max(interval, 0.0), 60.0) / 86400.0 * error
    if (step > 0 and may_loosen) or (step < 0 and may_tighten):
        integral += step
    integral = min(high, max(low, integral))
    out = integral + BUDGET_GAIN * error
    return integral, math.exp(min(high, max(low, out)))


@dataclass(frozen=True, slots=True)
class RiskObjective:
    """What the risk model aims for and how fast it learns. Built from the spec
    (``prescaler.api.risk_objective``), where the defaults live."""

    served_fraction: float | None
    """Share of demand to serve without waiting for capacity (absolute: ``ε = 1 −`` it);
    ``None``: relative to the HPA (:attr:`relative_to_hpa`)."""
    level: float
    """The quantile level a pool starts at (``spec.forecast.quantile``)."""
    adapt_rate: float
    """``γ``: how far one lookahead's outcome moves the level."""
    memory: float
    """Lookaheads the calibration set holds, in effect: each new one fades the older ones
    by ``1 − 1/memory``."""
    day_seconds: float
    """The pool's day (its shortest seasonality period): the levels split it in
    :data:`LEVEL_BUCKETS` hours."""
    min_outcomes: float = 60.0
    """Lookaheads needed before the calibrated margin replaces the forecast's band."""
    min_level: float = 0.5
    max_level: float = 0.999
    relative_to_hpa: float | None = None
    """``ρ``: a lookahead's ``ε`` is this share of what waited for a shadow HPA in it
    (used when :attr:`served_fraction` is ``None``)."""
    relative_floor: float = 0.0
    """The relative ``ε`` is never below this (the HPA left nothing, or little, waiting)."""
    budget_to_hpa: float | None = None
    """A relative objective's budget: the pool's GPU-hours over the trailing day are held
    at this share of the shadow HPA's by a scale on ``ε`` (:attr:`PeakRisk.relative_scale`,
    :func:`budget_step`); ``None``: ``ε`` as the objective says."""

    def __post_init__(self) -> None:
        sf = self.served_fraction
        if sf is None:
            rho = self.relative_to_hpa
            if rho is None or not (math.isfinite(rho) and 0 < rho <= 1):
                raise ValueError("without a served fraction, relative to HPA must be in (0, 1]")
            if not (math.isfinite(self.relative_floor) and 0 <= self.relative_floor < 1):
                raise ValueError("the relative floor must be in [0, 1)")
            budget = self.budget_to_hpa
            if budget is not None and not (math.isfinite(budget) and budget > 0):
                raise ValueError("the budget relative to the HPA must be > 0")
        elif not (math.isfinite(sf) and 0 < sf < 1):
            raise ValueError("served fraction must be in (0, 1)")
        if not self.min_level <= self.level <= self.max_level:
            raise ValueError(f"level must be in [{self.min_level}, {self.max_level}]")
        if not (math.isfinite(self.day_seconds) and self.day_seconds >= LEVEL_BUCKETS):
            raise ValueError(f"the day must be at least {LEVEL_BUCKETS} seconds")
        if not (self.adapt_rate >= 0 and self.memory >= 1 and self.min_outcomes >= 0):
            raise ValueError("adapt rate, memory and min outcomes must be >= 0 (memory >= 1)")

    @property
    def relative(self) -> bool:
        """``ε`` follows the shadow HPA (no absolute served fraction)."""
        return self.served_fraction is None

    def target(self, hpa_share: float | None, scale: float = 1.0) -> float:
        """``ε``: absolute, or relative: ``ρ`` times ``hpa_share`` (the share of recent
        demand that waited for the shadow HPA, :attr:`PeakRisk.hpa_share`), at least the
        floor (the floor alone before any HPA was seen), with the budget's ``scale``
        (:attr:`PeakRisk.relative_scale`): below 1 it scales ``ρ`` down (the floor holds),
        above 1 the whole target up, to at most :data:`BUDGET_MAX_TARGET` (or the
        objective's own, if that is more)."""
        if self.served_fraction is not None:
            return 1.0 - self.served_fraction
        assert self.relative_to_hpa is not None
        share = hpa_share if hpa_share is not None and math.isfinite(hpa_share) else 0.0
        if not (math.isfinite(scale) and scale > 0):
            scale = 1.0
        own = min(1.0, max(self.relative_floor, self.relative_to_hpa * min(scale, 1.0) * share))
        if scale <= 1.0:
            return own
        return min(max(BUDGET_MAX_TARGET, own), own * scale)

    def budget_ceiling(self, hpa_share: float | None) -> float:
        """The largest scale the budget may put on ``ε``: where it reaches
        :data:`BUDGET_MAX_TARGET` (at least 1)."""
        own = self.target(hpa_share)
        return max(1.0, BUDGET_MAX_TARGET / own) if own > 0 else 1.0

    @property
    def budgeted(self) -> bool:
        """A relative objective with a budget: :func:`observe_risk` keeps the record."""
        return self.relative and self.budget_to_hpa is not None


@dataclass(frozen=True, slots=True)
class Lookahead:
    """One decision's lookahead, scored when it ends."""

    start: float
    end: float
    base: float
    sized: float
    unit: float = 0.0
    """The typical demand then: ratios are of ``x + unit``."""
    peak: float = 0.0
    """Largest demand observed in it so far."""
    demand: float = 0.0
    """Sum of the demand observed in it."""
    waited: float = 0.0
    """Sum of the demand observed to wait (:func:`waiting_demand`)."""
    seen: int = 0
    """Observations in it."""
    hpa_waited: float = 0.0
    """Sum of the demand that would have waited for the shadow HPA's ready capacity."""
    hpa_seen: int = 0
    """Observations in it with the shadow HPA's capacity known."""


def _share(waited: float, demand: float) -> float | None:
    """The share of ``demand`` that waited (``None``: no demand)."""
    return waited / demand if demand > 0 else None


@dataclass(frozen=True, slots=True)
class PeakRisk:
    """What the risk model has learned: the level, the calibration set and what is pending."""

    levels: tuple[float, ...] = ()
    """``θ`` per hour of the day (UTC, :data:`LEVEL_BUCKETS` of them), once adapted (empty:
    the objective's starting level in every hour)."""
    histogram: tuple[float, ...] = ()
    """Faded counts of ``log((peak + u) / (base + u))`` per bin (empty: nothing learned
    yet)."""
    pending: tuple[Lookahead, ...] = ()
    outcomes: int = 0
    """Lookaheads scored so far (not faded)."""
    loss: float | None = None
    """The realized loss, faded like the histogram: the share of demand that waited in
    recent lookaheads (``None`` before the first)."""
    observed_at: float | None = None
    """When demand was last observed."""
    mean_demand: float | None = None
    """The pool's typical demand: the observed demand's mean, faded like the histogram."""
    peak_demand: float | None = None
    """The largest demand observed, fading toward the typical demand like the histogram:
    the margin never sizes for more than :data:`PEAK_CEILING` times it."""
    target: float | None = None
    """The objective's ``ε`` of recent lookaheads, faded like :attr:`loss`: what the loss
    is held against (``None`` before the first)."""
    hpa_waited: float = 0.0
    """The demand that would have waited for the shadow HPA in ended lookaheads, summed and
    faded like the histogram..."""
    hpa_demand: float = 0.0
    """...and their demand (of lookaheads with the HPA seen): :attr:`hpa_share`."""
    budget_integral: float = 0.0
    """The budget controller's state: the integral part of ``log`` :attr:`relative_scale`
    (:func:`budget_step`)."""
    relative_scale: float = 1.0
    """What the budget scales ``ε`` by now, in [:data:`MIN_RELATIVE_SCALE`, the objective's
    :meth:`~RiskObjective.budget_ceiling`]: above 1 the budget binds (the pool waits more
    than the objective asks, to stay inside its budget)."""
    spend: Spend | None = None
    """The trailing day's GPU-hours the budget last read."""

    @property
    def capacity_ratio(self) -> float | None:
        """The pool's GPU-hours over the shadow HPA's over the trailing day (``None``: no
        record)."""
        return self.spend.ratio if self.spend is not None else None

    @property
    def hpa_share(self) -> float | None:
        """The share of recent demand that waited for the shadow HPA (``None``: no HPA seen
        yet): what a relative objective's ``ε`` is a share of."""
        return _share(self.hpa_waited, self.hpa_demand)

    def level_at(self, t: float | None, day: float) -> float | None:
        """``θ`` in the hour of ``t`` in a day of ``day`` seconds (``None``: not adapted yet,
        or no time known)."""
        if not self.levels or t is None or not math.isfinite(t):
            return None
        return self.levels[level_bucket(t, day)]


@dataclass(frozen=True, slots=True)
class RiskSizing:
    """What the planner sizes with: ``margin`` on ``base + typical`` (see
    :func:`sized_demand`)."""

    margin: float
    """``exp(q)`` on ``base + u`` (1 until calibrated: the forecast's upper band stands)."""
    level: float
    calibrated: bool = False
    typical: float = 0.0
    """The pool's typical demand (its recent mean): ``u`` is at least this."""
    peak: float | None = None
    """The largest demand observed lately (:attr:`PeakRisk.peak_demand`)."""


def level_bucket(t: float, day: float) -> int:
    """The hour of the day (UTC; a day of ``day`` seconds, split in :data:`LEVEL_BUCKETS`)
    of unix time ``t``: which ``θ`` sizes and learns at ``t``."""
    return int(t % day // (day / LEVEL_BUCKETS)) % LEVEL_BUCKETS


def _bin(score: float) -> int:
    return min(LOG_BINS - 1, max(0, int((score - LOG_LOW) / _WIDTH)))


def _quantile(histogram: Sequence[float], level: float) -> float:
    """The upper edge of the bin where the cumulative weight reaches ``level`` (rounded
    up: a margin is never below the ratios it should cover)."""
    total = sum(histogram)
    need, cumulative = level * total, 0.0
    for i, w in enumerate(histogram):
        cumulative += w
        if cumulative >= need - 1e-12:
            return LOG_LOW + (i + 1) * _WIDTH
    return LOG_HIGH


def risk_sizing(risk: PeakRisk, objective: RiskObjective, now: float | None = None) -> RiskSizing:
    """The margin to size with at ``now`` (default: when demand was last observed), at the
    level of its hour: calibrated once ``min_outcomes`` lookaheads have ended, else ``None``
    (the forecast's own band stands in)."""
    at = risk.level_at(risk.observed_at if now is None else now, objective.day_seconds)
    level = objective.level if at is None else at
    typical = risk.mean_demand or 0.0
    if risk.histogram and risk.outcomes >= objective.min_outcomes:
        margin = math.exp(_quantile(risk.histogram, level))
        return RiskSizing(
            margin=margin, level=level, typical=typical, calibrated=True, peak=risk.peak_demand
        )
    return RiskSizing(margin=1.0, level=level, typical=typical, peak=risk.peak_demand)


def sized_demand(base: float, margin: float, unit: float) -> float:
    """What to size for: the margin on ``base + unit``, less the unit (>= ``base`` for a
    margin >= 1)."""
    return max(0.0, (base + unit) * margin - unit)


def capped_demand(sized: float, base: float, peak: float | None) -> float:
    """``sized``, at most :data:`PEAK_CEILING` times the largest demand observed lately
    (never below ``base``, what is known now)."""
    if peak is None or not (math.isfinite(peak) and peak > 0):
        return sized
    return max(base, min(sized, PEAK_CEILING * peak))


def record_risk(
    risk: PeakRisk,
    start: float,
    end: float,
    base: float,
    sized: float,
    unit: float = 0.0,
) -> PeakRisk:
    """Remember a decision's lookahead ``[start, end]`` to score it when it ends."""
    if not (math.isfinite(base) and math.isfinite(sized) and base >= 0 and end > start):
        return risk
    if not (math.isfinite(unit) and unit >= 0):
        unit = 0.0
    look = Lookahead(start=start, end=end, base=base, sized=sized, unit=unit)
    pending = (*risk.pending, look)
    return replace(risk, pending=pending[-MAX_PENDING:])


def waiting_demand(
    demand: float, capacity: float, waiting: float | None, interval: float | None
) -> float:
    """Of ``demand`` arriving now, the part that waits: what exceeds ``capacity``, plus
    the queue ahead of it (``waiting``, in the demand's unit times seconds) spread over
    the ``interval`` since the last observation. A queue longer than an interval's
    arrivals makes every arrival wait (FIFO). Missing queue data adds nothing."""
    excess = max(0.0, demand - capacity)
    if waiting is not None and math.isfinite(waiting) and waiting > 0 and interval:
        excess += waiting / interval
    return min(demand, excess)


def demand_weight(look: Lookahead, typical: float | None) -> float:
    """How much one ended lookahead's outcome moves the level: its mean demand over the
    pool's typical demand, at most :data:`WEIGHT_CAP` (1 without a typical demand). The
    objective is a share of *demand*: weighted so, the level tracks the share of the
    demand that waited, and a busy lookahead's miss weighs what it left waiting, not
    what a quiet one's share would."""
    if typical is None or not (typical > 0) or look.seen <= 0:
        return 1.0
    return min(WEIGHT_CAP, look.demand / (look.seen * typical))


def observe_risk(
    risk: PeakRisk,
    objective: RiskObjective,
    now: float,
    demand: float | None,
    ready_capacity: float | None = None,
    waiting: float | None = None,
    hpa_ready_capacity: float | None = None,
    hpa_waiting: float | None = None,
    spend: Spend | None = None,
) -> PeakRisk:
    """Add the demand observed at ``now`` to every open lookahead, and score those that
    have ended: their ratio joins the calibration set and their loss moves the level.

    The loss is what really waited (:func:`waiting_demand`): demand above
    ``ready_capacity``, the demand the ready replicas serve now (replicas asked for late
    are still starting, so a margin too small shows up here one cold start later), plus
    the queue ahead (``waiting``); without ``ready_capacity``, demand above the
    lookahead's sized demand. Missing or garbage demand adds nothing (a lookahead with no
    observation at all is dropped unscored, never counted as a miss or as calm).

    ``hpa_ready_capacity`` and ``hpa_waiting`` are a shadow HPA's on the same demand: what
    would have waited for it is scored too, for a relative objective's ``ε``. ``spend``:
    both fleets' GPU-hours over the trailing day, which a budget holds the pool's cost
    against (:func:`budget_step`)."""
    # Garbage reads as unknown: each is a number from here on, or None.
    demand = demand if demand is not None and math.isfinite(demand) and demand >= 0 else None
    ready_capacity = _finite(ready_capacity)
    hpa_ready_capacity = _finite(hpa_ready_capacity)
    interval = None
    if risk.observed_at is not None and now > risk.observed_at:
        interval = now - risk.observed_at
    histogram = list(risk.histogram) or [0.0] * LOG_BINS
    levels = list(risk.levels) if len(risk.levels) == LEVEL_BUCKETS else []
    outcomes, loss, aim = risk.outcomes, risk.loss, risk.target
    hpa_waited, hpa_demand = risk.hpa_waited, risk.hpa_demand
    fade = 1.0 - 1.0 / objective.memory
    integral, scale, kept = risk.budget_integral, risk.relative_scale, risk.spend
    budget = objective.budget_to_hpa
    ratio = spend.ratio if spend is not None else None
    if objective.budgeted and budget is not None and ratio is not None and interval is not None:
        share = _share(hpa_waited, hpa_demand)
        integral, scale = budget_step(
            integral,
            ratio,
            spend.hours if spend is not None else 0.0,
            budget,
            interval,
            objective.budget_ceiling(share),
            may_loosen=not _all_at(levels, objective.min_level),
            may_tighten=not _all_at(levels, objective.max_level),
        )
        kept = spend
    still: list[Lookahead] = []
    learned = False
    mean, peak = risk.mean_demand, risk.peak_demand
    if demand is not None:
        mean = demand if mean is None else mean * fade + demand * (1.0 - fade)
        peak = demand if peak is None else max(demand, peak * fade + mean * (1.0 - fade))
    # What waits now against the ready fleet (and the shadow's) is the same for every open
    # lookahead; only a lookahead scored against its own sized demand differs.
    waited_now = hpa_waited_now = None
    if demand is not None:
        if ready_capacity is not None:
            waited_now = waiting_demand(demand, ready_capacity, waiting, interval)
        if hpa_ready_capacity is not None:
            hpa_waited_now = waiting_demand(demand, hpa_ready_capacity, hpa_waiting, interval)
    for look in risk.pending:
        if demand is not None and look.start <= now <= look.end:
            look = Lookahead(
                start=look.start,
                end=look.end,
                base=look.base,
                sized=look.sized,
                unit=look.unit,
                peak=max(look.peak, demand),
                demand=look.demand + demand,
                waited=look.waited
                + (
                    waiting_demand(demand, look.sized, waiting, interval)
                    if waited_now is None
                    else waited_now
                ),
                seen=look.seen + 1,
                hpa_waited=look.hpa_waited + (hpa_waited_now or 0.0),
                hpa_seen=look.hpa_seen + (0 if hpa_waited_now is None else 1),
            )
        if now < look.end:
            still.append(look)
            continue
        if look.seen == 0 or (look.base + look.unit <= 0 and look.peak <= 0):
            continue
        below = look.base + look.unit
        log_ratio = math.log(max((look.peak + look.unit) / below, 1e-12)) if below > 0 else 1e9
        histogram = [w * fade for w in histogram]
        histogram[_bin(log_ratio)] += 1.0
        share = look.waited / look.demand if look.demand > 0 else 0.0
        loss = share if loss is None else loss * fade + share * (1.0 - fade)
        if look.hpa_seen > 0 and look.demand > 0:
            hpa_waited = hpa_waited * fade + look.hpa_waited
            hpa_demand = hpa_demand * fade + look.demand
        target = objective.target(_share(hpa_waited, hpa_demand), scale)
        aim = target if aim is None else aim * fade + target * (1.0 - fade)
        outcomes += 1
        learned = True
        if objective.adapt_rate > 0:
            levels = levels or [objective.level] * LEVEL_BUCKETS
            hour = level_bucket(look.start, objective.day_seconds)
            moved = levels[hour] + objective.adapt_rate * (
                demand_weight(look, risk.mean_demand) * (share - target)
            )
            levels[hour] = min(objective.max_level, max(objective.min_level, moved))
    return PeakRisk(
        levels=tuple(levels),
        histogram=tuple(histogram) if learned or risk.histogram else (),
        pending=tuple(still),
        outcomes=outcomes,
        loss=loss,
        observed_at=now if demand is not None else risk.observed_at,
        mean_demand=mean,
        peak_demand=peak,
        target=aim,
        hpa_waited=hpa_waited,
        hpa_demand=hpa_demand,
        budget_integral=integral,
        relative_scale=scale,
        spend=kept,
    )


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _all_at(levels: Sequence[float], bound: float) -> bool:
    """Every hour's level is at ``bound`` (none adapted yet: no)."""
    return bool(levels) and all(abs(v - bound) < 1e-9 for v in levels)
