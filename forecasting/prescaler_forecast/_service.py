"""The stateful forecaster the operator and the backtest both use.

:class:`ForecastService` owns, per pool:

* **auto-selection** (:func:`select_model`), re-run every ``reselect_seconds`` (default 6 h)
  or when the set of models with enough history changes; each run backtests only the new
  history and pools it with the previous runs' evidence (48 h, recent chunks weighted
  more), scores the candidates at the plan's lookahead (``SelectionConfig.lookahead_seconds``,
  not the whole horizon), and keeps persistence or the recent mean unless another model
  is significantly better on that evidence;
* the **refit cadence**: cheap models are refitted on every call; Prophet every
  ``refit_seconds`` (default 600), or sooner if its cached curve does not reach the horizon;
* the **nowcast correction** of a cached Prophet fit between refits;
* the **fallback**: with too little history for any model, an ``insufficient_history``
  forecast (last level, or zero), never an exception. A model that *fails* (raises
  anything, or answers non-finite values) is passed over like one without enough
  history: the next candidate that works, else the last level, answers with status
  ``model_failed`` and says in ``detail`` what failed.

Off the event loop: :meth:`ForecastService.forecast_async` runs the two expensive steps,
:func:`select_model` and :func:`fit_model`, in the given executor (a
``ProcessPoolExecutor`` keeps the operator responsive); the rest is cheap and inline.
Alternatively, fit elsewhere and hand the result to :meth:`ForecastService.install`.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import replace
from functools import partial

import numpy as np
import pandas as pd

from prescaler_forecast._base import Forecaster, check_quantile
from prescaler_forecast._conformal import OnlineCalibrator
from prescaler_forecast._fitting import (
    MODEL_NAMES,
    FittedModel,
    ModelRunner,
    ModelSpec,
    eligible_models,
    fallback_forecast,
    fit_grid_model,
    forecast_from_fit,
)
from prescaler_forecast._hygiene import series_to_grid
from prescaler_forecast._selection import Selection, SelectionConfig, select_model
from prescaler_forecast._types import (
    SEASONALITY_PERIODS,
    STATUS_MODEL_FAILED,
    EventSource,
    EventWindow,
    Forecast,
    InsufficientHistoryError,
    check_periods,
)

__all__ = ["AUTO", "SELECTION", "ForecastService"]

FloatArray = np.ndarray

AUTO = "auto"
"""Model name that asks for auto-selection."""
SELECTION = "selection"
"""What :meth:`ForecastService.due_step` answers when the auto-selection is due."""


class ForecastService:
    """Forecasts for one demand series, with refits, nowcast, selection and fallback.

    Args:
        model: ``"auto"`` or a name from :data:`MODEL_NAMES`.
        horizon_seconds: how far ahead to forecast (the lead time plus margin).
        step_seconds: the forecast step (60 s for the operator; a coarse trace's own step).
        quantile: the upper quantile of the interval.
        refit_seconds: refit cadence of expensive models (Prophet).
        lookback_seconds: recent history Prophet fits on (default 14 days).
        events: scheduled windows for Prophet's regressors: their past and future
            occurrences, or an :data:`EventSource` that every fit asks for the occurrences
            over its own history and horizon (a recurring window's later occurrences then
            count without building the service again).
        candidates: models auto-selection considers (default all).
        selection: how auto-selection backtests.
        calibrate: replace the models' own upper band, once enough errors are in, by the
            per-lead quantile of the served forecasts' errors (:class:`OnlineCalibrator`).
        models: builders that replace registered models by name (a user's own model, or a
            failing one in a test). An expensive one's instances must pickle: the unfitted
            model is sent to the executor with each fit.
        seasonality_periods: the demand's cycles in seconds (default one day and one
            week): ``seasonal_naive`` repeats the shortest, ``seasonal_naive_weekly`` the
            longest (with one period it would repeat ``seasonal_naive``, and auto-selection
            leaves it out), ``seasonal_profile`` takes the median over the last cycles of
            the longest or the shortest, Prophet fits each its history covers twice. A
            model becomes eligible once the history covers its period (the profile: two
            of the shortest).
    """

    def __init__(
        self,
        *,
        model: str = AUTO,
        horizon_seconds: float,
        step_seconds: float,
        quantile: float = 0.9,
        refit_seconds: float = 600.0,
        lookback_seconds: float | None = None,
        events: Sequence[EventWindow] | EventSource = (),
        candidates: Sequence[str] = MODEL_NAMES,
        selection: SelectionConfig | None = None,
        calibrate: bool = True,
        models: Mapping[str, Callable[[], Forecaster]] | None = None,
        seasonality_periods: Sequence[float] = SEASONALITY_PERIODS,
    ) -> None:
        if model != AUTO and model not in MODEL_NAMES:
            raise ValueError(f"unknown model {model!r}; choose from auto, {', '.join(MODEL_NAMES)}")
        unknown = [c for c in candidates if c not in MODEL_NAMES]
        if unknown or not candidates:
            raise ValueError(f"bad candidate models {unknown or list(candidates)}")
        if not (math.isfinite(refit_seconds) and refit_seconds > 0):
            raise ValueError(f"refit_seconds must be > 0, got {refit_seconds}")
        periods = check_periods(seasonality_periods)
        if model == AUTO and len(periods) == 1:
            candidates = [c for c in candidates if c != "seasonal_naive_weekly"] or candidates
        self.model = model
        self.refit_seconds = float(refit_seconds)
        self.candidates = tuple(candidates) if model == AUTO else (model,)
        self.selection_config = selection or SelectionConfig()
        self.spec = ModelSpec(
            name=self.candidates[0],
            step_seconds=float(step_seconds),
            horizon_seconds=float(horizon_seconds),
            quantile=check_quantile(quantile),
            valid_seconds=2 * self.refit_seconds,
            lookback_seconds=lookback_seconds,
            events=() if callable(events) else tuple(events),
            seasonality_periods=periods,
        )
        self._calendar: EventSource | None = events if callable(events) else None
        self.selection: Selection | None = None
        """The latest auto-selection (``None`` before the first, or for a fixed model)."""
        self._runners: dict[str, ModelRunner] = {}
        self._models = dict(models or {})
        self.calibrator = OnlineCalibrator(self.spec.quantile) if calibrate else None
        """Sets the upper band from the served forecasts' own errors (``None``: off)."""

    # ------------------------------------------------------------------ state
    @property
    def horizon_seconds(self) -> float:
        return self.spec.horizon_seconds

    @property
    def step_seconds(self) -> float:
        return self.spec.step_seconds

    def runner(self, name: str) -> ModelRunner:
        """The cached-fit runner of one model (created on first use)."""
        if name not in self._runners:
            self._runners[name] = ModelRunner(
                replace(self.spec, name=name), self.refit_seconds, make=self._models.get(name)
            )
        return self._runners[name]

    def install(self, fitted: FittedModel) -> None:
        """Use a fit made elsewhere, e.g. by :func:`fit_model` in a process pool."""
        self.runner(fitted.name).install(fitted)

    def grid(self, history: pd.Series, now: float) -> tuple[float, FloatArray]:
        """The cleaned grid of ``history`` observed before ``now``."""
        return series_to_grid(history, self.step_seconds, before=now)

    # ------------------------------------------------------------------ forecasting
    def forecast(self, history: pd.Series, now: float) -> Forecast:
        """The forecast at ``now`` from ``history`` before it (later samples are ignored).

        Refits, reselects and falls back as described in the class docstring; runs any
        expensive step inline.
        """
        start, values = self.grid(history, now)
        eligible = self._eligible(start, values)
        if not eligible:
            return self._served(
                self._fallback(values, now, "no model has enough history yet"), start, values
            )
        self._follow_calendar(start, now)
        if self._selection_due(eligible, now):
            self.selection = select_model(
                start,
                values,
                now,
                candidates=eligible,
                spec=self.spec,
                refit_seconds=self.refit_seconds,
                config=self.selection_config,
                previous=self.selection,
            )
        return self._served(self._forecast(start, values, now, eligible), start, values)

    async def forecast_async(
        self, history: pd.Series, now: float, executor: Executor | None = None
    ) -> Forecast:
        """Like :meth:`forecast`, with selection and expensive fits run in ``executor``."""
        loop = asyncio.get_running_loop()
        start, values = self.grid(history, now)
        eligible = self._eligible(start, values)
        if not eligible:
            return self._served(
                self._fallback(values, now, "no model has enough history yet"), start, values
            )
        self._follow_calendar(start, now)
        if self._selection_due(eligible, now):
            self.selection = await loop.run_in_executor(
                executor,
                _select,
                start,
                values,
                now,
                eligible,
                self.spec,
                self.refit_seconds,
                self.selection_config,
                self.selection,
            )
        name = self._chosen(eligible)
        runner = self.runner(name)
        if runner.cheap or not runner.refit_due(now):
            return self._served(self._forecast(start, values, now, eligible), start, values)
        model = runner.make() if runner.make is not None else None
        try:
            fitted = await loop.run_in_executor(
                executor, partial(fit_grid_model, runner.spec, start, values, forecaster=model)
            )
        except InsufficientHistoryError:
            return self._served(
                self._forecast(start, values, now, tuple(e for e in eligible if e != name)),
                start,
                values,
            )
        runner.install(fitted)
        return self._served(self._forecast(start, values, now, eligible), start, values)

    # ------------------------------------------------------------------ scheduling
    # For callers that schedule the expensive steps themselves (the operator's fit queue):
    # ``due_step`` says whether one is due, ``forecast_cached`` forecasts without running
    # it, ``forecast_async`` runs it, and ``seed`` resumes from a selection kept elsewhere.

    def seed(self, selection: Selection) -> bool:
        """Adopt a selection made earlier (e.g. kept in a status by another process), so it
        is not redone before it is due. Ignored (``False``) when this service has a
        selection already, does not auto-select, or the selection names other models."""
        if self.model != AUTO or self.selection is not None:
            return False
        known = set(self.candidates)
        if selection.model not in known or not set(selection.candidates) <= known:
            return False
        self.selection = selection
        return True

    def due_step(self, history: pd.Series, now: float) -> str | None:
        """The expensive step a forecast at ``now`` needs: ``"selection"``, the name of the
        model to (re)fit, or ``None`` when :meth:`forecast_cached` is what
        :meth:`forecast` would answer."""
        start, values = self.grid(history, now)
        eligible = self._eligible(start, values)
        if not eligible:
            return None
        if self._selection_due(eligible, now):
            return SELECTION
        name = self._chosen(eligible)
        runner = self.runner(name)
        if not runner.cheap and runner.refit_due(now):
            return name
        return None

    def forecast_cached(self, history: pd.Series, now: float) -> Forecast:
        """The forecast at ``now`` without an expensive step: no selection, no Prophet fit.

        Cheap models are refitted as usual. An expensive model's cached fit is used while
        its curve covers the horizon, even when its refit is due. Without a usable fit of
        the chosen model, the cheap model with the best selection score stands in (the
        cheapest before any selection); the forecast's detail says so.
        """
        start, values = self.grid(history, now)
        eligible = self._eligible(start, values)
        if not eligible:
            return self._served(
                self._fallback(values, now, "no model has enough history yet"), start, values
            )
        name = self._chosen(eligible)
        runner = self.runner(name)
        fitted = runner.fitted
        if runner.cheap:
            return self._served(self._forecast(start, values, now, eligible), start, values)
        failed: list[str] = []
        if fitted is not None and fitted.usable_at(now, self.horizon_seconds):
            try:
                result = forecast_from_fit(fitted, start, values, now, self.horizon_seconds)
                return self._served(self._decorate(result, name), start, values)
            except Exception as exc:  # a failing model is passed over, never raised
                failed.append(f"{name} failed: {_describe_error(exc)}")
        scores = self.selection.scores if self.selection is not None else {}
        cheap = sorted(
            (c for c in eligible if self.runner(c).cheap),
            key=lambda c: (scores.get(c, math.inf), eligible.index(c)),
        )
        for candidate in cheap:
            try:
                result = self.runner(candidate).forecast(start, values, now)
            except InsufficientHistoryError:
                continue
            except Exception as exc:  # a failing model is passed over, never raised
                failed.append(f"{candidate} failed: {_describe_error(exc)}")
                continue
            note = f"interim: {candidate} until {name} is fitted"
            score = scores.get(candidate)
            detail = "; ".join(x for x in (*failed, note, result.detail) if x)
            status = STATUS_MODEL_FAILED if failed else result.status
            result = replace(result, score=score, detail=detail, status=status)
            return self._served(result, start, values)
        why = f"{name} is not fitted yet; no cheap model can stand in"
        fallback = self._fallback(values, now, "; ".join((*failed, why)))
        if failed:
            fallback = replace(fallback, status=STATUS_MODEL_FAILED)
        return self._served(fallback, start, values)

    def _served(self, forecast: Forecast, start: float, values: FloatArray) -> Forecast:
        """Every forecast this service answers passes here: the calibrator scores the
        forecasts it served before on the bins observed since, and widens or narrows this
        one's upper band to the quantile of those errors (see :class:`OnlineCalibrator`)."""
        if self.calibrator is None:
            return forecast
        self.calibrator.observe(start, values, self.step_seconds)
        return self.calibrator.calibrate(forecast)

    def _decorate(self, result: Forecast, name: str) -> Forecast:
        if self.selection is None or self.selection.model != name:
            return result
        detail = "; ".join(x for x in (self.selection.describe(), result.detail) if x)
        return replace(result, score=self.selection.score, detail=detail)

    # ------------------------------------------------------------------ internals
    def _follow_calendar(self, start: float, now: float) -> None:
        """Ask the event source (if any) for the occurrences a fit at ``now`` can use: from
        the start of the history to the end of the curve a fit caches (``valid_seconds``
        plus the horizon after ``now``). Every model, fitted from here on, gets them."""
        if self._calendar is None:
            return
        spec = self.spec
        until = now + spec.valid_seconds + spec.horizon_seconds + spec.step_seconds
        events = tuple(self._calendar(start, until))
        if events == spec.events:
            return
        self.spec = replace(spec, events=events)
        for runner in self._runners.values():
            runner.spec = replace(runner.spec, events=events)

    def _eligible(self, start: float, values: FloatArray) -> tuple[str, ...]:
        return eligible_models(
            self.candidates,
            start,
            values,
            self.step_seconds,
            seasonality_periods=self.spec.seasonality_periods,
        )

    def _selection_due(self, eligible: tuple[str, ...], now: float) -> bool:
        if self.model != AUTO:
            return False
        s = self.selection
        return (
            s is None
            or s.candidates != eligible
            or now - s.at >= self.selection_config.reselect_seconds
            or now < s.at
        )

    def _chosen(self, eligible: tuple[str, ...]) -> str:
        if self.model != AUTO:
            return self.model
        if self.selection is not None and self.selection.model in eligible:
            return self.selection.model
        return eligible[0]

    def _forecast(
        self, start: float, values: FloatArray, now: float, eligible: tuple[str, ...]
    ) -> Forecast:
        tried: list[str] = []
        failed: list[str] = []
        name = self._chosen(eligible) if eligible else None
        order = [n for n in (name, *eligible) if n is not None]
        for candidate in dict.fromkeys(order):
            try:
                result = self.runner(candidate).forecast(start, values, now)
            except InsufficientHistoryError as exc:
                tried.append(f"{candidate}: {exc}")
                continue
            except Exception as exc:  # a failing model is passed over, never raised
                failed.append(f"{candidate} failed: {_describe_error(exc)}")
                continue
            score, detail = None, result.detail
            if self.selection is not None and self.selection.model == candidate:
                score = self.selection.score
                detail = "; ".join(x for x in (self.selection.describe(), detail) if x)
            if failed:
                notes = [*failed, f"{candidate} took over", detail]
                detail = "; ".join(x for x in notes if x)
                return replace(result, score=score, detail=detail, status=STATUS_MODEL_FAILED)
            return replace(result, score=score, detail=detail)
        detail = "; ".join((*failed, *tried)) or "no model has enough history"
        fallback = self._fallback(values, now, detail)
        return replace(fallback, status=STATUS_MODEL_FAILED) if failed else fallback

    def fallback(self, history: pd.Series, now: float, detail: str) -> Forecast:
        """The last level of ``history`` before ``now``, flat, with status
        ``model_failed``: what to plan with when the models cannot answer at all (e.g.
        the operator gave up waiting for them). Touches no model state."""
        _, values = self.grid(history, now)
        return replace(self._fallback(values, now, detail), status=STATUS_MODEL_FAILED)

    def _fallback(self, values: FloatArray, now: float, detail: str) -> Forecast:
        return fallback_forecast(
            values, self.step_seconds, now, self.horizon_seconds, self.spec.quantile, detail
        )


def _describe_error(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


def _select(
    start: float,
    values: FloatArray,
    now: float,
    candidates: tuple[str, ...],
    spec: ModelSpec,
    refit_seconds: float,
    config: SelectionConfig,
    previous: Selection | None,
) -> Selection:
    """Positional wrapper of :func:`select_model` for ``run_in_executor``."""
    return select_model(
        start,
        values,
        now,
        candidates=candidates,
        spec=spec,
        refit_seconds=refit_seconds,
        config=config,
        previous=previous,
    )
