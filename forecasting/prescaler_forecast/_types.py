"""Value types shared by every part of the package: forecasts, points, events and errors."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias

__all__ = [
    "SEASONALITY_PERIODS",
    "STATUS_INSUFFICIENT_HISTORY",
    "STATUS_MODEL_FAILED",
    "STATUS_OK",
    "EventSource",
    "EventWindow",
    "Forecast",
    "ForecastPoint",
    "InsufficientHistoryError",
    "check_periods",
]

SEASONALITY_PERIODS: Final = (86_400.0, 7 * 86_400.0)
"""The seasonal cycles in seconds when none are given: one day and one week."""


def check_periods(periods: Sequence[float]) -> tuple[float, ...]:
    """Seasonal periods in seconds, validated (each finite and > 0), sorted and deduplicated."""
    out = sorted({float(p) for p in periods})
    if not out:
        raise ValueError("seasonality needs at least one period")
    bad = [p for p in out if not (math.isfinite(p) and p > 0)]
    if bad:
        raise ValueError(f"seasonal periods must be finite and > 0 seconds, got {bad}")
    return tuple(out)


STATUS_OK: Final = "ok"
"""The requested (or auto-selected) model produced the forecast."""
STATUS_INSUFFICIENT_HISTORY: Final = "insufficient_history"
"""Too little history for any real model: a fallback (last level, or zero) was used."""
STATUS_MODEL_FAILED: Final = "model_failed"
"""The requested (or selected) model failed (raised, answered non-finite values, or, in
the operator, timed out): the next model that works, else the fallback (last level),
produced the points. ``detail`` says what failed."""


class InsufficientHistoryError(ValueError):
    """A model cannot be fitted on this much history.

    Raised by :meth:`Forecaster.fit`; :class:`ForecastService` never lets it escape and
    answers with ``status="insufficient_history"`` plus a fallback forecast instead.
    """


@dataclass(frozen=True)
class ForecastPoint:
    """One forecast step."""

    t: float
    """Unix seconds of the END of the step this point describes (the step is ``(t-step, t]``)."""
    mean: float
    """Expected mean demand over the step, in the input series' unit (requests/s); >= 0."""
    lower: float
    """Lower bound (the ``1 - quantile`` quantile); 0 <= lower <= mean."""
    upper: float
    """Upper bound (the requested upper ``quantile``); upper >= mean."""

    def __post_init__(self) -> None:
        if not all(math.isfinite(v) for v in (self.t, self.mean, self.lower, self.upper)):
            raise ValueError(f"forecast point has a non-finite value: {self}")
        if not 0 <= self.lower <= self.mean <= self.upper:
            raise ValueError(f"forecast point must have 0 <= lower <= mean <= upper: {self}")


@dataclass(frozen=True)
class Forecast:
    """A forecast for the next horizon, as the operator puts it in status."""

    model: str
    """Name of the model that produced the points (one of :data:`MODEL_NAMES`, such as
    ``"prophet"``, ``"seasonal_profile"`` or ``"recent_trend"``, or ``"fallback"``)."""
    score: float | None
    """The selection error (sMAPE in percent, see :mod:`prescaler_forecast`) of ``model``
    in the rolling-origin backtest that chose it; ``None`` if not chosen by a backtest."""
    step_seconds: float
    """Width of each point's step."""
    generated_at: float
    """Unix seconds: the "now" the forecast was made at (only data before it was used)."""
    quantile: float
    """The upper quantile that ``ForecastPoint.upper`` estimates, e.g. 0.9."""
    points: tuple[ForecastPoint, ...]
    """Consecutive steps covering ``(generated_at, generated_at + horizon]``."""
    status: str = STATUS_OK
    """``"ok"``, ``"insufficient_history"`` (a fallback produced the points) or
    ``"model_failed"`` (another model or the fallback stood in for a failed one)."""
    detail: str = ""
    """A human-readable note, e.g. why history was insufficient or how the model was chosen."""

    def peak_upper(self) -> float:
        """The largest upper bound over the horizon (0 for an empty forecast)."""
        return max((p.upper for p in self.points), default=0.0)

    def peak_mean(self) -> float:
        """The largest mean over the horizon (0 for an empty forecast)."""
        return max((p.mean for p in self.points), default=0.0)


@dataclass(frozen=True)
class EventWindow:
    """A scheduled window, turned into a Prophet regressor.

    Give every past and future occurrence of the same kind of event the same ``name``
    (e.g. ``"black_friday"``): Prophet then learns the lift from the past occurrences and
    applies it to the next one. A name without any occurrence inside the fitted history
    teaches nothing and is ignored by the model.
    """

    start: float
    """Unix seconds."""
    end: float
    """Unix seconds; must be after ``start``."""
    name: str = "event"
    """Regressor name; occurrences with the same name share one learned lift."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.start) and math.isfinite(self.end)) or self.end <= self.start:
            raise ValueError(f"event window must have finite start < end: {self}")
        if not self.name or not self.name.replace("_", "").isalnum():
            raise ValueError(f"event name must be a non-empty identifier, got {self.name!r}")


EventSource: TypeAlias = Callable[[float, float], Sequence[EventWindow]]
"""The scheduled windows' occurrences overlapping ``[since, until]`` (unix seconds): a
calendar asked again for every fit, so an occurrence that starts later is seen by the fits
that reach it (e.g. ``functools.partial(event_windows, windows)`` in the operator)."""
