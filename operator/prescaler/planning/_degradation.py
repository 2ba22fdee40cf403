"""Degradation levels: how far demand will outrun what can be *ready*, and what a gateway
should do about it until capacity arrives. Pure: signals in, an assessment out.

The level is ``normal``, ``warning`` or ``critical``: the highest of its signals' levels.

* **Queue** (waiting requests per serving replica): warning above 10, critical above 50.
* **KV cache** (the fleet's mean KV-cache utilization, 0-1): warning from 0.90, critical
  from 0.97; a full cache preempts running requests.
* **TTFT** against the pool's SLO: p95 above its SLO is a warning, p99 above its SLO is
  critical. TTFT rises before throughput falls, so it is the earliest measured signal.
* **Forecast shortfall**, which only a forecaster can give: for each forecast step over the
  next cold start, demand on the forecast's upper band minus what will be *ready* by that
  step (the replicas ready now plus those on their way, each at its expected ready time),
  in tokens/s. Its largest share of the demand is a warning from 5 % and critical from
  25 %. It raises the level *before* the queue grows, and it knows whether capacity is
  20 s away or nowhere (no GPU node).

**Hysteresis.** A level rises at once. It falls only after every signal has stayed below
it for ``hold_seconds``, and then to the highest level seen during that hold. A signal
that raised the level and is no longer measured holds it: missing data never relaxes
admission control.

**The admission policy** for a level is what a gateway applies (published in status and
in the ``<pool>-degradation`` ConfigMap, see ``docs/degradation.md``):

* ``queue_depth_limit``: waiting requests beyond which new ones get 503 (warning: the
  critical threshold per serving replica; critical: the warning threshold, to drain);
* ``retry_after_seconds``: when the next capacity will be ready (the earliest expected
  ready time of the replicas on their way, from the measured cold start), not a constant;
* ``max_context_tokens``: a temporary cap so that the expected concurrency fits the
  KV-cache memory actually ready (only with a model architecture, only when needed);
* ``shed_lanes``: priority lanes to refuse, lowest first (warning: the lowest lane;
  critical: every lane but the highest);
* ``smaller_model_route`` (critical only, optional): where short requests may go instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from prescaler.capacity import CapacityModel, covers
from prescaler.planning._planner import ForecastLike

Level = Literal["normal", "warning", "critical"]
LEVELS: tuple[Level, ...] = ("normal", "warning", "critical")
Signal = Literal["queue", "kvCache", "ttftP95", "ttftP99", "forecastShortfall"]


def rank(level: Level) -> int:
    """0 for normal, 1 for warning, 2 for critical."""
    return LEVELS.index(level)


@dataclass(frozen=True, slots=True)
class DegradationPolicy:
    """Thresholds and what each level publishes (``spec.degradation``)."""

    queue_warning_per_replica: float = 10.0
    queue_critical_per_replica: float = 50.0
    kv_warning: float = 0.90
    kv_critical: float = 0.97
    ttft_p95_slo_seconds: float | None = None
    ttft_p99_slo_seconds: float | None = None
    shortfall_warning_fraction: float = 0.05
    shortfall_critical_fraction: float = 0.25
    hold_seconds: float = 300.0
    lanes: tuple[str, ...] = ("batch", "interactive")
    """Priority lanes, lowest first; the highest is never shed."""
    min_context_tokens: int = 1024
    """The context cap never goes below this."""
    smaller_model_route: str | None = None
    smaller_model_max_prompt_tokens: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.queue_warning_per_replica <= self.queue_critical_per_replica:
            raise ValueError("queue thresholds: 0 <= warning <= critical")
        if not 0 < self.kv_warning <= self.kv_critical <= 1:
            raise ValueError("KV-cache thresholds: 0 < warning <= critical <= 1")
        if not 0 <= self.shortfall_warning_fraction <= self.shortfall_critical_fraction:
            raise ValueError("forecast shortfall thresholds: 0 <= warning <= critical")
        if self.hold_seconds < 0:
            raise ValueError("hold seconds must be >= 0")
        if self.min_context_tokens < 1:
            raise ValueError("min context tokens must be >= 1")


@dataclass(frozen=True, slots=True)
class Signals:
    """What was measured now; ``None`` where it could not be."""

    serving_replicas: int
    """Replicas that take traffic now (ready, plus promoted hot standby)."""
    waiting: float | None = None
    """Requests queued, fleet-wide."""
    kv_cache_usage: float | None = None
    """Mean KV-cache utilization of the fleet, 0-1."""
    ttft_p95_seconds: float | None = None
    ttft_p99_seconds: float | None = None
    observed_requests_per_second: float | None = None
    """Demand arriving now (for the context cap's expected concurrency)."""


@dataclass(frozen=True, slots=True)
class DegradationState:
    """The hysteresis memory, kept in the pool's status between reconciles."""

    level: Level = "normal"
    since: float | None = None
    """When this level began."""
    calm_since: float | None = None
    """Since when every signal has been below ``level`` (``None``: it is not)."""
    calm_peak: Level = "normal"
    """The highest level the signals showed since ``calm_since``."""
    raised_by: tuple[Signal, ...] = ()
    """The signals at ``level`` when it was last confirmed."""


@dataclass(frozen=True, slots=True)
class DegradationInputs:
    now: float
    policy: DegradationPolicy
    capacity: CapacityModel
    signals: Signals
    cold_start_seconds: float
    forecast: ForecastLike | None = None
    arrivals: Sequence[float] = ()
    """Expected ready times (unix s) of the replicas on their way: starting pods (scheduled
    plus the cold start) and replicas asked for but not created yet (now plus the cold
    start). Pods no node can take are not on their way."""
    previous: DegradationState = field(default_factory=DegradationState)


@dataclass(frozen=True, slots=True)
class AdmissionPolicy:
    """What a gateway does at the current level; ``None`` / empty means no restriction."""

    queue_depth_limit: int | None = None
    retry_after_seconds: int | None = None
    max_context_tokens: int | None = None
    shed_lanes: tuple[str, ...] = ()
    smaller_model_route: str | None = None
    smaller_model_max_prompt_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Shortfall:
    """The forecast shortfall over the next cold start, at its worst step."""

    tokens_per_second: float
    """Upper-band demand minus capacity ready by then (>= 0)."""
    fraction: float
    """That share of the step's demand."""
    at: float
    """End of the worst step (unix s)."""


@dataclass(frozen=True, slots=True)
class Assessment:
    """The level, why, and what to publish. A value; publishing it is someone else's job."""

    level: Level
    raw_level: Level
    """The signals' level now, before hysteresis."""
    state: DegradationState
    reasons: tuple[str, ...]
    """One line per signal above normal (and why the level holds, when it does)."""
    signal_levels: dict[Signal, Level]
    """The level of every signal that could be measured."""
    shortfall: Shortfall | None
    admission: AdmissionPolicy
    changed: bool
    """The level differs from the previous one."""


def forecast_shortfall(
    now: float,
    capacity: CapacityModel,
    forecast: ForecastLike | None,
    serving_replicas: int,
    arrivals: Sequence[float],
    cold_start_seconds: float,
) -> Shortfall | None:
    """Upper-band demand of the steps under way or beginning within the next cold start,
    minus the capacity ready by each step's start, in tokens/s, at the step where it is
    largest (``None``: no usable forecast). A replica counts from its expected ready
    time."""
    if forecast is None:
        return None
    step = forecast.step_seconds
    # The steps under way now or beginning within the cold start (with coarse steps, a
    # step that begins later is demand new capacity can still meet).
    end = now + cold_start_seconds
    points = [p for p in forecast.points if p.t > now and p.t - step <= end]
    if not points or any(not (math.isfinite(p.upper) and p.upper >= 0) for p in points):
        return None
    per_request = capacity.tokens.tokens_per_request
    per_replica = capacity.replica_tokens_per_second
    worst: Shortfall | None = None
    for p in points:
        starts = max(now, p.t - step)
        ready = serving_replicas + sum(1 for a in arrivals if a <= starts)
        demand = p.upper * per_request
        # Float noise at a whole number of replicas is no shortfall.
        short = 0.0 if covers(ready, demand / per_replica) else demand - ready * per_replica
        fraction = short / demand if demand > 0 else 0.0
        if worst is None or short > worst.tokens_per_second:
            worst = Shortfall(short, fraction, p.t)
    return worst


def _threshold_level(value: float, warning: float, critical: float, strict: bool = True) -> Level:
    if (value > critical) if strict else (value >= critical):
        return "critical"
    if (value > warning) if strict else (value >= warning):
        return "warning"
    return "normal"


def _signals(
    inputs: DegradationInputs, shortfall: Shortfall | None
) -> tuple[dict[Signal, Level], dict[Signal, str]]:
    """Each measurable signal's level and a line saying why."""
    policy, s = inputs.policy, inputs.signals
    levels: dict[Signal, Level] = {}
    lines: dict[Signal, str] = {}
    serving = max(0, s.serving_replicas)
    if s.waiting is not None and math.isfinite(s.waiting) and s.waiting >= 0:
        per = (math.inf if s.waiting > 0 else 0.0) if serving == 0 else s.waiting / serving
        levels["queue"] = _threshold_level(
            per, policy.queue_warning_per_replica, policy.queue_critical_per_replica
        )
        lines["queue"] = f"queue {s.waiting:.0f} waiting on {serving} serving replicas"
    kv = s.kv_cache_usage
    if kv is not None and math.isfinite(kv) and 0 <= kv <= 1.5:
        levels["kvCache"] = _threshold_level(kv, policy.kv_warning, policy.kv_critical, False)
        lines["kvCache"] = f"KV cache {kv:.0%} used"
    for name, value, slo, level in (
        ("ttftP95", s.ttft_p95_seconds, policy.ttft_p95_slo_seconds, "warning"),
        ("ttftP99", s.ttft_p99_seconds, policy.ttft_p99_slo_seconds, "critical"),
    ):
        if slo is None or value is None or not (math.isfinite(value) and value >= 0):
            continue
        signal: Signal = "ttftP95" if name == "ttftP95" else "ttftP99"
        above: Level = "critical" if level == "critical" else "warning"
        levels[signal] = above if value > slo else "normal"
        lines[signal] = f"TTFT {name[-3:].lower()} {value:.2f}s against an SLO of {slo:g}s"
    if shortfall is not None:
        levels["forecastShortfall"] = (
            _threshold_level(
                shortfall.fraction,
                policy.shortfall_warning_fraction,
                policy.shortfall_critical_fraction,
                False,
            )
            if shortfall.tokens_per_second > 0
            else "normal"
        )
        lines["forecastShortfall"] = (
            f"forecast shortfall {shortfall.tokens_per_second:.0f} tokens/s "
            f"({shortfall.fraction:.0%} of demand) {shortfall.at - inputs.now:.0f}s ahead, "
            f"before new capacity is ready"
        )
    return levels, lines


def _hysteresis(
    inputs: DegradationInputs, raw: Level, levels: dict[Signal, Level]
) -> tuple[DegradationState, str | None]:
    """The next state, and why the level holds above the signals (if it does)."""
    now, prev, hold = inputs.now, inputs.previous, inputs.policy.hold_seconds
    at = [name for name, lvl in levels.items() if lvl == raw] if raw != "normal" else []
    raised: tuple[Signal, ...] = tuple(at)
    if rank(raw) > rank(prev.level) or prev.since is None:
        return DegradationState(raw, now, None, "normal", raised), None
    if raw == prev.level:
        return DegradationState(raw, prev.since, None, "normal", raised), None
    missing = [name for name in prev.raised_by if name not in levels]
    if missing:
        why = f"holding {prev.level}: {', '.join(missing)} not measured (never relaxed blind)"
        return DegradationState(prev.level, prev.since, None, "normal", prev.raised_by), why
    calm_since = prev.calm_since if prev.calm_since is not None else now
    peak = raw if prev.calm_since is None or rank(raw) > rank(prev.calm_peak) else prev.calm_peak
    if now - calm_since >= hold:
        # Down to the highest level of the hold; the signals at that level raised it.
        kept = (
            tuple(name for name, lvl in levels.items() if lvl == peak) if peak != "normal" else ()
        )
        return DegradationState(peak, now, None, "normal", kept or raised), None
    # When the hold ends, not a countdown: the reason stays the same from one reconcile
    # to the next, so the ConfigMap gateways read is not rewritten each time.
    why = (
        f"holding {prev.level} until {_clock(calm_since + hold)} "
        f"(signals below it since {_clock(calm_since)}, hold {hold:.0f}s)"
    )
    return DegradationState(prev.level, prev.since, calm_since, peak, prev.raised_by), why


def _clock(ts: float) -> str:
    """A time of day for people, in UTC."""
    return datetime.fromtimestamp(ts, UTC).strftime("%H:%M:%S UTC")


def _retry_after(now: float, arrivals: Sequence[float], cold_start_seconds: float) -> int:
    """Seconds until the next replica on its way is ready; with none on its way, one cold
    start (what a replica asked for now needs)."""
    upcoming = [a - now for a in arrivals if a > now]
    wait = min(upcoming) if upcoming else cold_start_seconds
    return max(1, math.ceil(wait))


def _context_cap(inputs: DegradationInputs, level: Level) -> int | None:
    """Context tokens per request at which the expected concurrency fits the KV-cache
    memory of the serving replicas; ``None`` when no cap is needed or it cannot be known."""
    replica = inputs.capacity.replica
    if level == "normal" or replica is None:
        return None
    serving = max(0, inputs.signals.serving_replicas)
    kv_bytes_per_token = replica.model.kv_bytes_per_token
    if kv_bytes_per_token <= 0 or replica.kv_cache_bytes <= 0:
        return None
    demand = 0.0
    observed = inputs.signals.observed_requests_per_second
    if observed is not None and math.isfinite(observed) and observed > 0:
        demand = observed
    forecast = inputs.forecast
    if forecast is not None:
        end = inputs.now + inputs.cold_start_seconds
        for p in forecast.points:
            if inputs.now < p.t and p.t - forecast.step_seconds <= end and math.isfinite(p.upper):
                demand = max(demand, p.upper)
    concurrency = demand * inputs.capacity.request_latency_seconds
    if concurrency <= 0:
        return None
    tokens_ready = serving * replica.kv_cache_bytes / kv_bytes_per_token
    cap = math.floor(tokens_ready / concurrency)
    if cap >= inputs.capacity.tokens.planning_context_tokens:
        return None  # the traffic's own contexts fit: no cap needed
    limit = min(max(cap, inputs.policy.min_context_tokens), replica.model.max_context_tokens)
    return int(limit)


def admission(inputs: DegradationInputs, level: Level) -> AdmissionPolicy:
    """What a gateway applies at ``level``."""
    if level == "normal":
        return AdmissionPolicy()
    policy = inputs.policy
    serving = max(1, inputs.signals.serving_replicas)
    per = (
        policy.queue_critical_per_replica
        if level == "warning"
        else policy.queue_warning_per_replica
    )
    lanes = policy.lanes
    shed = lanes[:1] if level == "warning" else lanes[:-1]
    if len(lanes) < 2:
        shed = ()
    critical = level == "critical"
    return AdmissionPolicy(
        queue_depth_limit=math.floor(per * serving),
        retry_after_seconds=_retry_after(inputs.now, inputs.arrivals, inputs.cold_start_seconds),
        max_context_tokens=_context_cap(inputs, level),
        shed_lanes=tuple(shed),
        smaller_model_route=policy.smaller_model_route if critical else None,
        smaller_model_max_prompt_tokens=(
            policy.smaller_model_max_prompt_tokens
            if critical and policy.smaller_model_route
            else None
        ),
    )


def assess(inputs: DegradationInputs) -> Assessment:
    """The pool's degradation level now, with hysteresis, and its admission policy."""
    if inputs.cold_start_seconds < 0:
        raise ValueError("cold start must be >= 0")
    shortfall = forecast_shortfall(
        inputs.now,
        inputs.capacity,
        inputs.forecast,
        inputs.signals.serving_replicas,
        inputs.arrivals,
        inputs.cold_start_seconds,
    )
    levels, lines = _signals(inputs, shortfall)
    raw: Level = max(levels.values(), key=rank, default="normal")
    state, holding = _hysteresis(inputs, raw, levels)
    reasons = [lines[name] for name, lvl in levels.items() if lvl != "normal"]
    if holding:
        reasons.append(holding)
    return Assessment(
        level=state.level,
        raw_level=raw,
        state=state,
        reasons=tuple(reasons),
        signal_levels=levels,
        shortfall=shortfall,
        admission=admission(inputs, state.level),
        changed=state.level != inputs.previous.level,
    )
