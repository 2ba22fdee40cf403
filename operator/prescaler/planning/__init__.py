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
from prescaler.planning._windows import Occurrence, ScheduledWindow

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
    "next_fleet_state",
    "plan",
]
