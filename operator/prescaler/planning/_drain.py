"""Drain-aware scale-down: which pods a ReplicaSet should remove first (pure).

Before a Deployment's replicas are lowered, each Ready pod's
``controller.kubernetes.io/pod-deletion-cost`` is set to the requests it is running now,
so the ReplicaSet removes the idlest pods and the busiest keep their in-flight
generations. (Pods that are not Ready go first anyway: the ReplicaSet ranks them below
every Ready pod, before it looks at the cost.)

Missing numbers are not guessed: when any Ready pod has no per-pod measurement, no cost
is changed and the plan's reason says so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MAX_COST = 2**31 - 1
"""The annotation is an int32."""


@dataclass(frozen=True, slots=True)
class PodLoad:
    """A Ready pod that may be removed, and the deletion cost it carries now."""

    name: str
    deletion_cost: int | None = None


@dataclass(frozen=True, slots=True)
class DrainPlan:
    """The deletion costs to write before the scale-down, and why (one line)."""

    costs: tuple[tuple[str, int], ...]
    """(pod, cost) for every pod whose cost must change; unchanged ones are left out."""
    reason: str


def drain_plan(
    pods: Sequence[PodLoad], running: Mapping[str, float] | None, unavailable: str = ""
) -> DrainPlan:
    """Costs from ``running`` (requests running per pod name; ``None`` when they could
    not be read, ``unavailable`` saying why)."""
    if not pods:
        return DrainPlan((), "drain: no Ready pods to rank")
    if running is None:
        why = f" ({unavailable})" if unavailable else ""
        return DrainPlan(
            (), f"drain: no per-pod running requests{why}, pod deletion costs left as they are"
        )
    missing = sorted(p.name for p in pods if p.name not in running)
    if missing:
        shown = ", ".join(missing[:5]) + (", ..." if len(missing) > 5 else "")
        return DrainPlan(
            (),
            f"drain: no per-pod running requests for {shown}, pod deletion costs left as they are",
        )
    costs = {p.name: _cost(running[p.name]) for p in pods}
    ranked = sorted(pods, key=lambda p: (costs[p.name], p.name))
    shown = ", ".join(f"{p.name} {costs[p.name]}" for p in ranked[:8])
    if len(ranked) > 8:
        shown += ", ..."
    changes = tuple((p.name, costs[p.name]) for p in ranked if p.deletion_cost != costs[p.name])
    return DrainPlan(changes, f"drain: idlest first by running requests ({shown})")


def _cost(running: float) -> int:
    if not math.isfinite(running) or running <= 0:
        return 0
    return min(MAX_COST, round(running))
