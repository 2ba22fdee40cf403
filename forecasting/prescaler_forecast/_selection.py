"""Auto-selection: a rolling-origin backtest of the candidates on the pool's own history.

Every candidate is scored at the same origins, spread over the last ``window_seconds``
of history, with the horizon the caller asked for (the lead time), by sMAPE (see
``_evaluation``); the lowest wins, ties going to the cheaper model. Each candidate runs
as it would in service: cheap models refit at every origin; Prophet is fitted at most
``max_expensive_fits`` times across the window and nowcast-corrected in between, which is
a pessimistic stand-in for its 10-minute refits and keeps a selection to about a second.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from prescaler_forecast._evaluation import EvaluationResult, origins_between, rolling_origin
from prescaler_forecast._fitting import (
    ModelRunner,
    ModelSpec,
    fallback_forecast,
    make_forecaster,
)
from prescaler_forecast._types import Forecast, InsufficientHistoryError

__all__ = ["Selection", "SelectionConfig", "select_model"]

FloatArray = np.ndarray


@dataclass(frozen=True)
class SelectionConfig:
    """How auto-selection backtests the candidates."""

    window_seconds: float = 6 * 3600.0
    """History span the origins are spread over (ending one horizon before now)."""
    origins: int = 12
    """Number of origins."""
    max_expensive_fits: int = 3
    """Prophet fits per selection at most; nowcast-corrected forecasts in between."""
    reselect_seconds: float = 6 * 3600.0
    """A service re-runs the selection this often (or when the eligible models change)."""


@dataclass(frozen=True)
class Selection:
    """The outcome of auto-selection; the operator reports ``model`` and ``score``."""

    model: str
    """The winning model."""
    score: float | None
    """Its sMAPE in percent; ``None`` when there was too little history to backtest."""
    scores: dict[str, float] = field(default_factory=dict)
    """sMAPE of every candidate that could be scored."""
    at: float = 0.0
    """Unix seconds the selection was made at."""
    origins: int = 0
    """How many origins each candidate was scored on."""
    candidates: tuple[str, ...] = ()
    """The candidates considered (those with enough history)."""

    def describe(self) -> str:
        """One line for status/detail, e.g. ``auto: prophet (sMAPE 4.1 %; ...)``."""
        if self.score is None:
            return f"auto: {self.model} (too little history to backtest)"
        ranked = sorted(self.scores.items(), key=lambda kv: kv[1])
        others = ", ".join(f"{k} {v:.1f}" for k, v in ranked)
        return f"auto: {self.model} by sMAPE % over {self.origins} origins ({others})"


def select_model(
    start: float,
    values: FloatArray,
    now: float,
    *,
    candidates: Sequence[str],
    spec: ModelSpec,
    refit_seconds: float,
    config: SelectionConfig | None = None,
) -> Selection:
    """Pick the candidate with the lowest backtest sMAPE on the grid observed before ``now``.

    ``spec`` gives step, horizon, quantile, lookback and events (its ``name`` is ignored).
    A picklable top-level function, so it can run in a process pool.
    """
    if not candidates:
        raise ValueError("no candidate models")
    config = config or SelectionConfig()
    step = spec.step_seconds
    y = np.asarray(values, dtype=float)
    finite = np.flatnonzero(np.isfinite(y))
    if len(finite) == 0:
        return Selection(candidates[0], None, at=now, candidates=tuple(candidates))
    first_data = start + finite[0] * step
    need = max(make_forecaster(replace(spec, name=c)).min_history_seconds(step) for c in candidates)
    horizon = spec.horizon_seconds
    last_origin = now - math.ceil(horizon / step) * step
    first_origin = max(first_data + need, now - config.window_seconds)
    origins = origins_between(first_origin, last_origin, step, config.origins)
    if len(origins) < 2:
        return Selection(candidates[0], None, at=now, candidates=tuple(candidates))
    results: dict[str, EvaluationResult] = {}
    spread = origins[-1] - origins[0]
    for name in candidates:
        model_spec = replace(spec, name=name)
        cheap = make_forecaster(model_spec).cheap
        every = refit_seconds
        if not cheap:
            every = max(refit_seconds, spread / config.max_expensive_fits + step)
        runner = ModelRunner(replace(model_spec, valid_seconds=every), every)

        def run(s: float, v: FloatArray, t: float, runner: ModelRunner = runner) -> Forecast:
            try:
                return runner.forecast(s, v, t)
            except InsufficientHistoryError as exc:  # a gap at this origin: score the fallback
                return fallback_forecast(v, step, t, horizon, spec.quantile, str(exc))

        results[name] = rolling_origin(run, start, y, step, origins)
    scores = {k: r.smape for k, r in results.items() if math.isfinite(r.smape)}
    if not scores:
        return Selection(candidates[0], None, at=now, candidates=tuple(candidates))
    best = min(scores, key=lambda k: (scores[k], list(candidates).index(k)))
    return Selection(
        best, scores[best], scores, at=now, origins=len(origins), candidates=tuple(candidates)
    )
