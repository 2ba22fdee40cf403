"""Which way a pool plans this reconcile (``spec.policy``), kept in ``status.policy``.

A pool that names ``forecast`` or ``reactive`` plans that way. One with ``auto`` (the
default) plans on the forecast until its history has been replayed, then with what the
replay's evidence says (:func:`prescaler.planning.recheck`): the first verdict at once,
later ones, from the replay asked for once a day (:func:`check_due`), after two in a row.
In reactive and leading mode the plan starts from the count the pool's shadow HPA holds
(:func:`reactive_count`); leading adds the forecast at the HPA's target
(:attr:`prescaler.planning.PlanInputs.leading_target`).

Pure: the status and the seed in, the status out; the reconcile posts the Event and sets
the metric on a switch.
"""

from __future__ import annotations

from dataclasses import replace

from prescaler.api import EvidenceStatus, InferencePoolSpec, PolicyStatus
from prescaler.backtest import CHECK_SECONDS
from prescaler.controller.calibrate import Seed
from prescaler.controller.status import Shadow, parse_rfc3339, rfc3339
from prescaler.planning import Evidence, PolicyChoice, recheck

__all__ = [
    "CHECK_SECONDS",
    "check_due",
    "check_index",
    "policy_status",
    "reactive_count",
    "switched",
]

WAITING = "no replay of its history yet: the forecast plans until the first one"


def check_due(
    spec: InferencePoolSpec,
    previous: PolicyStatus | None,
    now: float,
    every: float = CHECK_SECONDS,
) -> bool:
    """Whether ``auto`` wants a replay of the pool's history now: never weighed, or last
    weighed ``every`` seconds ago or more (a day, by default)."""
    if spec.policy != "auto" or spec.forecast is None:
        return False
    checked = parse_rfc3339(previous.checked_at) if previous is not None else None
    chosen = previous is not None and previous.chosen_by == "history"
    return not chosen or checked is None or now - checked >= every


def check_index(now: float, every: float = CHECK_SECONDS) -> int:
    """The check (of one every ``every`` seconds) a replay asked for at ``now`` is for."""
    return int(now // every)


def _evidence(status: EvidenceStatus | None) -> Evidence | None:
    if status is None or len(status.curve_gpu_hours) != len(status.curve_unserved):
        return None
    try:
        return Evidence(
            status.forecast_unserved,
            status.forecast_gpu_hours,
            status.hpa_unserved,
            status.hpa_gpu_hours,
            tuple(zip(status.curve_gpu_hours, status.curve_unserved, strict=True)),
            status.leading_unserved if status.leading_gpu_hours is not None else None,
            status.leading_gpu_hours if status.leading_unserved is not None else None,
        )
    except ValueError:  # garbage in an old status: the next check starts afresh
        return None


def _evidence_status(evidence: Evidence | None) -> EvidenceStatus | None:
    if evidence is None:
        return None
    return EvidenceStatus(
        forecast_unserved=round(evidence.forecast_unserved, 8),
        forecast_gpu_hours=round(evidence.forecast_gpu_hours, 4),
        hpa_unserved=round(evidence.reactive_unserved, 8),
        hpa_gpu_hours=round(evidence.reactive_gpu_hours, 4),
        curve_unserved=[round(u, 8) for _, u in evidence.hpa_curve],
        curve_gpu_hours=[round(g, 4) for g, _ in evidence.hpa_curve],
        leading_unserved=_rounded(evidence.leading_unserved, 8),
        leading_gpu_hours=_rounded(evidence.leading_gpu_hours, 4),
    )


def _rounded(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)


def _choice(previous: PolicyStatus | None) -> PolicyChoice | None:
    if previous is None or previous.chosen_by != "history":
        return None
    since = parse_rfc3339(previous.since)
    checked = parse_rfc3339(previous.checked_at)
    if since is None or checked is None:
        return None
    return PolicyChoice(
        previous.in_force,
        since,
        previous.reason,
        checked,
        previous.frontier_ratio,
        previous.pending,
        previous.switches,
        _evidence(previous.evidence),
        previous.leading_frontier_ratio,
    )


def _ratio(ratio: float | None) -> float | None:
    return None if ratio is None else round(min(ratio, 1e9), 4)


def _status(choice: PolicyChoice) -> PolicyStatus:
    ratio = choice.ratio
    return PolicyStatus(
        in_force=choice.policy,
        chosen_by="history",
        since=rfc3339(choice.since),
        reason=choice.reason[:1024],
        checked_at=rfc3339(choice.checked_at),
        frontier_ratio=_ratio(ratio),
        leading_frontier_ratio=_ratio(choice.leading_ratio),
        pending=choice.pending,
        switches=choice.switches,
        evidence=_evidence_status(choice.evidence),
    )


def policy_status(
    spec: InferencePoolSpec, previous: PolicyStatus | None, seed: Seed | None, now: float
) -> PolicyStatus:
    """The policy in force after this reconcile: ``spec.policy``'s, or ``auto``'s choice
    with the seed's evidence weighed once (a seed replayed after the last check)."""
    if spec.policy != "auto" or spec.forecast is None:
        named = "forecast" if spec.forecast is None else spec.policy
        assert named != "auto"
        if previous is not None and previous.chosen_by == "spec" and previous.in_force == named:
            return previous
        moved = previous is not None and previous.in_force != named
        return PolicyStatus(
            in_force=named,
            chosen_by="spec",
            since=rfc3339(now),
            reason=(
                "spec.policy names it"
                if spec.forecast is not None
                else "no spec.forecast: the windows and the bounds plan"
            ),
            switches=(previous.switches if previous is not None else 0) + int(moved),
        )
    choice = _choice(previous)
    evidence = seed.evidence if seed is not None else None
    fresh = seed is not None and (choice is None or seed.replayed_at > choice.checked_at)
    if seed is not None and evidence is not None and fresh:
        first = choice is None
        choice = recheck(choice, evidence, seed.replayed_at)
        if first and previous is not None:  # the first verdict may move the policy too
            turned = int(previous.in_force != choice.policy)
            choice = replace(choice, switches=previous.switches + turned)
    if choice is None:
        if previous is not None and previous.chosen_by == "history":
            return previous
        return PolicyStatus(
            in_force="forecast",
            chosen_by="history",
            since=rfc3339(now),
            reason=WAITING,
            switches=previous.switches if previous is not None else 0,
        )
    return _status(choice)


def switched(previous: PolicyStatus | None, current: PolicyStatus) -> bool:
    """Whether the policy in force changed (a pool's first status is no switch)."""
    return previous is not None and previous.in_force != current.in_force


def reactive_count(shadow: Shadow, current: int) -> int:
    """What the pool's HPA holds now: its shadow's replicas (starting ones included: each
    holds GPUs), or the current count before the shadow has synced once."""
    if shadow.state.clock is None:
        return current
    return shadow.state.hpa.existing
