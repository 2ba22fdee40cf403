"""A forecast as the planner sees it (``prescaler.planning.ForecastLike``), built by hand."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Point:
    """One step: demand in requests/s over the step that ends at ``t``."""

    t: float
    mean: float
    upper: float


@dataclass(frozen=True)
class Forecast:
    points: tuple[Point, ...]
    generated_at: float
    step_seconds: float = 60.0


def flat(rps: float, at: float, steps: int = 20, step: float = 60.0) -> Forecast:
    """``rps`` (mean and upper) for ``steps`` steps from ``at``."""
    return Forecast(tuple(Point(at + step * (i + 1), rps, rps) for i in range(steps)), at, step)
