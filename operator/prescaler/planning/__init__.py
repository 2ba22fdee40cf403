"""Planning: forecast + capacity + fleet + policy + clock -> ``ScalePlan`` (pure)."""

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
    "FleetState",
    "ForecastLike",
    "Mode",
    "Occurrence",
    "PlanInputs",
    "ScalePlan",
    "ScalingPolicy",
    "ScheduledWindow",
    "event_windows",
    "next_fleet_state",
    "plan",
]
