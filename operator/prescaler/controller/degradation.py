"""One pool's degradation: the assessment's inputs from what a reconcile gathered, its
status, its Event and the ConfigMap gateways read (pure; the reconcile publishes them).

The ConfigMap ``<pool>-degradation`` is a versioned contract (``docs/degradation.md``):
every value is a string, and an empty string means "no restriction". Its content changes
only with the level or its policy, so an unchanged policy is never rewritten.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import replace

from prescaler.admission import CONFIG_MAP_KEYS as CONFIG_MAP_KEYS
from prescaler.admission import CONTRACT as CONTRACT
from prescaler.api import (
    AdmissionStatus,
    DegradationStatus,
    InferencePoolSpec,
    InferencePoolStatus,
    degradation_policy,
)
from prescaler.capacity import ROLES, CapacityModel, Role
from prescaler.controller.model import Gathered
from prescaler.controller.status import parse_rfc3339, rfc3339
from prescaler.kube import ROLE_PROMOTED
from prescaler.planning import (
    LEVELS,
    Assessment,
    DegradationInputs,
    DegradationState,
    ScalePlan,
    Signals,
    assess,
)


def config_map_name(pool: str) -> str:
    return f"{pool}-degradation"


def arrivals(
    gathered: Gathered, decision: ScalePlan, now: float, applied: bool = True
) -> tuple[float, ...]:
    """Expected ready times of the target's replicas on their way: a starting pod on a
    node at its scheduling plus the start-up part of the cold start (scheduled -> Ready;
    the wait for a node is behind it), one not on a node yet at its creation plus the
    whole cold start, and each replica the target (or, when the plan is ``applied``, the
    plan) asks for that has no pod yet at now plus the cold start. Pods no node can take
    are not on their way; nor are pods being deleted."""
    cold = gathered.cold_start.seconds
    startup = gathered.cold_start.startup_p90_seconds
    if startup is None or not startup <= cold:
        startup = cold
    own = [p for p in gathered.pods if p.role != ROLE_PROMOTED and not p.terminating]
    times = [
        max(now, p.scheduled_at + startup if p.scheduled_at is not None else p.created + cold)
        for p in own
        if not p.ready and p.unschedulable is None
    ]
    wanted = gathered.workload.replicas
    if applied:
        wanted = max(wanted, decision.desired_replicas)
    times += [now + cold] * max(0, wanted - len(own))
    return tuple(sorted(times))


def previous_state(previous: InferencePoolStatus) -> DegradationState:
    """The hysteresis memory from the last status (a missing or unparsable one starts
    afresh at ``normal``)."""
    d = previous.degradation
    if d is None:
        return DegradationState()
    since = parse_rfc3339(d.since)
    if since is None:
        return DegradationState()
    return DegradationState(
        level=d.level,
        since=since,
        calm_since=parse_rfc3339(d.calm_since),
        calm_peak=d.calm_peak,
        raised_by=tuple(d.raised_by),
    )


def assess_pool(
    spec: InferencePoolSpec,
    capacity: CapacityModel,
    gathered: Gathered,
    decision: ScalePlan,
    previous: InferencePoolStatus,
    now: float,
) -> Assessment:
    """The pool's level now: the signals Prometheus gave, the forecast the plan used, and
    the capacity ready now and on its way."""
    snapshot = gathered.snapshot
    promoted = sum(1 for p in gathered.hot_pods if p.role == ROLE_PROMOTED and p.ready)
    serving = gathered.workload.ready_replicas + promoted + decision.promote_replicas
    signals = Signals(
        serving_replicas=serving,
        waiting=snapshot.waiting if snapshot else None,
        kv_cache_usage=snapshot.kv_cache_usage if snapshot else None,
        ttft_p95_seconds=snapshot.ttft_p95_seconds if snapshot else None,
        ttft_p99_seconds=snapshot.ttft_p99_seconds if snapshot else None,
        observed_requests_per_second=snapshot.demand if snapshot else None,
    )
    result = gathered.forecast
    return assess(
        DegradationInputs(
            now=now,
            policy=degradation_policy(spec),
            capacity=capacity,
            signals=signals,
            cold_start_seconds=gathered.cold_start.seconds,
            # The forecast the plan could use (fresh and sound), or none.
            forecast=result.forecast if result is not None and decision.forecast_usable else None,
            arrivals=arrivals(gathered, decision, now, applied=not spec.dry_run),
            previous=previous_state(previous),
        )
    )


def degradation_status(assessment: Assessment, config_map: str | None) -> DegradationStatus:
    state, a = assessment.state, assessment.admission
    short = assessment.shortfall
    return DegradationStatus(
        level=state.level,
        since=rfc3339(state.since if state.since is not None else 0.0),
        reasons=[r[:512] for r in assessment.reasons[:8]],
        forecast_shortfall_tokens_per_second=(
            round(short.tokens_per_second, 1) if short is not None else None
        ),
        forecast_shortfall_percent=round(100 * short.fraction, 1) if short is not None else None,
        admission=AdmissionStatus(
            queue_depth_limit=a.queue_depth_limit,
            retry_after_seconds=a.retry_after_seconds,
            max_context_tokens=a.max_context_tokens,
            shed_lanes=list(a.shed_lanes),
            smaller_model_route=a.smaller_model_route,
            smaller_model_max_prompt_tokens=a.smaller_model_max_prompt_tokens,
        ),
        config_map=config_map,
        calm_since=rfc3339(state.calm_since) if state.calm_since is not None else None,
        calm_peak=state.calm_peak,
        raised_by=list(state.raised_by),
    )


def config_map_data(pool: str, status: DegradationStatus) -> dict[str, str]:
    """The ConfigMap's data: contract ``prescaler.io/degradation/v1``."""

    def text(value: int | str | None) -> str:
        return "" if value is None else str(value)

    a = status.admission
    data = {
        "contract": CONTRACT,
        "pool": pool,
        "level": status.level,
        "since": status.since,
        "queueDepthLimit": text(a.queue_depth_limit),
        "retryAfterSeconds": text(a.retry_after_seconds),
        "maxContextTokens": text(a.max_context_tokens),
        "shedLanes": ",".join(a.shed_lanes),
        "smallerModelRoute": text(a.smaller_model_route),
        "smallerModelMaxPromptTokens": text(a.smaller_model_max_prompt_tokens),
        "reasons": "\n".join(status.reasons),
    }
    assert tuple(data) == CONFIG_MAP_KEYS
    return data


def publish_key(data: dict[str, str], assessment: Assessment) -> str:
    """What a write of the ConfigMap depends on: every key gateways act on (the level, its
    start, the admission policy), and which signals stand above normal at which level, but
    not the live numbers in ``reasons`` (a queue's length, a shortfall's tokens/s), which
    change at every reconcile while a signal is raised. Those are refreshed when the
    ConfigMap is read back (every few periods), and with any change of the key."""
    acted_on = {k: v for k, v in data.items() if k != "reasons"}
    raised = sorted(
        (name, level) for name, level in assessment.signal_levels.items() if level != "normal"
    )
    text = json.dumps([acted_on, raised, len(assessment.reasons)], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def change_event(previous: InferencePoolStatus, assessment: Assessment) -> tuple[str, str, str]:
    """The Event (type, reason, message) for a level change."""
    old = previous.degradation.level if previous.degradation is not None else "normal"
    new = assessment.level
    rising = LEVELS.index(new) > LEVELS.index(old)
    why = "; ".join(assessment.reasons) or "every signal below warning"
    a = assessment.admission
    policy = []
    if a.queue_depth_limit is not None:
        policy.append(f"503 beyond {a.queue_depth_limit} waiting")
    if a.retry_after_seconds is not None:
        policy.append(f"Retry-After {a.retry_after_seconds}s")
    if a.max_context_tokens is not None:
        policy.append(f"context cap {a.max_context_tokens} tokens")
    if a.shed_lanes:
        policy.append(f"shed {', '.join(a.shed_lanes)}")
    if a.smaller_model_route:
        policy.append(f"short requests to {a.smaller_model_route}")
    tail = f" (policy: {'; '.join(policy)})" if policy else ""
    return (
        "Warning" if rising else "Normal",
        "DegradationRaised" if rising else "DegradationLowered",
        f"degradation {old} -> {new}: {why}{tail}",
    )


def combine(previous: InferencePoolStatus, roles: Mapping[Role, Assessment]) -> Assessment:
    """A disaggregated pool's one level for its gateway: its worst role's assessment (its
    admission policy, as that role is the bottleneck), with every role's reasons, each
    prefixed with the role. Each role keeps its own hysteresis in its status; the pool's
    level changes (an Event) when the worst role's does."""
    ordered = [(r, roles[r]) for r in ROLES if r in roles]
    _, worst = max(ordered, key=lambda ra: LEVELS.index(ra[1].level))
    reasons = tuple(f"{r}: {line}" for r, a in ordered for line in a.reasons)
    old = previous.degradation.level if previous.degradation is not None else "normal"
    return replace(worst, reasons=reasons, changed=worst.level != old)
