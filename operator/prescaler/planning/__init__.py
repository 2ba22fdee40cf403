"""Planning: forecast + capacity + fleet + policy + clock -> ``ScalePlan`` (pure)."""

from prescaler.planning._drain import DrainPlan, PodLoad, drain_plan
from prescaler.planning._planner import (
    Action,
    DemandPoint,
    FleetState,
    ForecastLike,
    Mode,
    PlanInputs,
    ScalePlan,
    ScalingPolicy,
    next_fleet_state,
    plan,
)
from prescaler.planning._windows import Occurrence, ScheduledWindow, event_windows

__all__ = [
    "Action",
    "DemandPoint",
    "DrainPlan",
    "FleetState",
    "ForecastLike",
    "Mode",
    "Occurrence",
    "PlanInputs",
    "PodLoad",
    "ScalePlan",
    "ScalingPolicy",
    "ScheduledWindow",
    "drain_plan",
    "event_windows",
    "next_fleet_state",
    "plan",
]
