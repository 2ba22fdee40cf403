"""Forecasts per pool, refreshed in the background so a reconcile never waits long.

Each pool has one :class:`prescaler_forecast.ForecastService` (rebuilt when its forecast
spec changes), its demand history (fetched once over the lookback, then incrementally) and
at most one refresh in flight. Expensive steps (model selection, Prophet fits) run in the
process pool the service is given; Prometheus reads run in the thread pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field

import pandas as pd

from prescaler.api import ForecastSpec
from prescaler.metrics import Metrics
from prescaler.planning import ScheduledWindow, event_windows
from prescaler.sources import PrometheusSource
from prescaler_forecast import STATUS_OK, Forecast, ForecastService


@dataclass
class _Entry:
    key: str
    service: ForecastService
    history: pd.Series | None = None
    forecast: Forecast | None = None
    refreshed_at: float = float("-inf")
    task: asyncio.Task[None] | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ForecastResult:
    """The forecast to plan with (``None`` if none is usable) and why."""

    forecast: Forecast | None
    healthy: bool
    reason: str
    message: str


@dataclass
class ForecastHub:
    """Per-pool forecast state for one operator process."""

    metrics: Metrics
    executor: Executor | None
    """Process pool for fits and selection (``None``: the loop's default thread pool)."""
    io_executor: Executor | None = None
    """Thread pool for Prometheus reads."""
    wait_seconds: float = 10.0
    clock: Callable[[], float] = time.time
    _entries: dict[str, _Entry] = field(default_factory=dict)

    def forget(self, uid: str) -> None:
        entry = self._entries.pop(uid, None)
        if entry is not None and entry.task is not None:
            entry.task.cancel()

    def _entry(
        self, uid: str, spec: ForecastSpec, windows: Sequence[ScheduledWindow], now: float
    ) -> _Entry:
        key = spec.model_dump_json() + "|" + repr(windows)
        entry = self._entries.get(uid)
        if entry is None or entry.key != key:
            if entry is not None and entry.task is not None:
                entry.task.cancel()
            service = ForecastService(
                model=spec.model,
                horizon_seconds=spec.horizon_seconds,
                step_seconds=spec.step_seconds,
                quantile=spec.quantile,
                refit_seconds=spec.refit_seconds,
                lookback_seconds=spec.lookback_seconds,
                events=event_windows(
                    windows, now - spec.lookback_seconds, now + spec.horizon_seconds
                ),
            )
            entry = _Entry(key=key, service=service)
            self._entries[uid] = entry
        return entry

    async def get(
        self,
        uid: str,
        spec: ForecastSpec,
        windows: Sequence[ScheduledWindow],
        source: PrometheusSource,
        now: float,
    ) -> ForecastResult:
        """The freshest forecast available within ``wait_seconds``."""
        entry = self._entry(uid, spec, windows, now)
        due = now - entry.refreshed_at >= min(spec.step_seconds, spec.refit_seconds)
        if entry.task is None and (due or entry.forecast is None):
            entry.task = asyncio.create_task(self._refresh(entry, spec, source, now))
        if entry.task is not None:
            task = entry.task
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), timeout=self.wait_seconds)
            if task.done():
                entry.task = None
        return self._result(entry)

    def _result(self, entry: _Entry) -> ForecastResult:
        forecast = entry.forecast
        if forecast is None:
            if entry.error is not None:
                return ForecastResult(None, False, "ForecastFailed", entry.error)
            return ForecastResult(None, False, "Pending", "first forecast is being fitted")
        if forecast.status != STATUS_OK:
            message = f"{forecast.status}: {forecast.detail}"
            return ForecastResult(None, False, "InsufficientHistory", message)
        if entry.error is not None:
            return ForecastResult(forecast, False, "RefreshFailed", entry.error)
        message = f"{forecast.model}" + (
            f", sMAPE {forecast.score:.1f}%" if forecast.score is not None else ""
        )
        return ForecastResult(forecast, True, "Fresh", message)

    async def _refresh(
        self, entry: _Entry, spec: ForecastSpec, source: PrometheusSource, now: float
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            step = float(spec.step_seconds)
            if entry.history is None or entry.history.empty:
                start = now - spec.lookback_seconds
            else:
                start = entry.history.index[-1].timestamp() - 5 * step
            fresh = await loop.run_in_executor(self.io_executor, source.history, start, now, step)
            history = fresh if entry.history is None else pd.concat([entry.history, fresh])
            history = history[~history.index.duplicated(keep="last")].sort_index()
            cutoff = pd.Timestamp(now - spec.lookback_seconds, unit="s", tz="UTC")
            entry.history = history[history.index >= cutoff]
            before = self._fit_counts(entry.service)
            selection_before = entry.service.selection
            started = time.perf_counter()
            forecast = await entry.service.forecast_async(
                entry.history, now, executor=self.executor
            )
            elapsed = time.perf_counter() - started
            after = self._fit_counts(entry.service)
            for name, count in after.items():
                fits = count - before.get(name, 0)
                if fits > 0:
                    self.metrics.fits.labels(name).inc(fits)
                    if not entry.service.runner(name).cheap:
                        self.metrics.fit_duration.labels(name).observe(elapsed)
            if entry.service.selection is not selection_before:
                self.metrics.fits.labels("selection").inc()
                self.metrics.fit_duration.labels("selection").observe(elapsed)
            entry.forecast = forecast
            entry.error = None
        except Exception as exc:  # a boundary: any failure is reported, never raised
            entry.error = f"{type(exc).__name__}: {exc}"[:1000]
        finally:
            entry.refreshed_at = now

    @staticmethod
    def _fit_counts(service: ForecastService) -> dict[str, int]:
        return {name: service.runner(name).fit_count for name in service.candidates}
