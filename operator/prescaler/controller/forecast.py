"""Forecasts for the pools, shared per demand series and fitted off the reconcile path.

**Sharing.** Pools that read the same series (same Prometheus, same demand query, same
credentials) with the same fit settings (model, step, horizon, quantile, refit, lookback
and scheduled windows) share one :class:`_Series`: one history, one
:class:`prescaler_forecast.ForecastService`, one selection and one fit for all of them.

**Two paths.** A reconcile refreshes its series at most once per forecast step: it fetches
the new history (thread pool) and forecasts *without* an expensive step
(:meth:`ForecastService.forecast_cached`: cheap refits, a cached Prophet fit, or a cheap
stand-in while the chosen model is not fitted yet). It waits for that refresh at most
``wait_seconds``. When a selection or an expensive refit is due, the series is put on the
fit queue (:mod:`prescaler.controller.fits`), which runs it in the process pool, fairly and
a few at a time; the reconcile does not wait for it.

**Restarts.** The selection is kept in the pool's status; a restarted operator seeds the
series from it (when the fingerprint of series and settings matches) and does not redo it
before it is due. A series' first job in a process is spread over
``first_fit_spread_seconds`` so a restart does not start every fit at once.

**Failing models.** A model that raises or answers garbage is passed over by the
service (another model, else the last level, stands in: ``ForecastHealthy=False``,
reason ``ModelFailed``). The cheap forecast of a refresh runs in the thread pool and is
waited for at most ``model_timeout_seconds``: a model that hangs does not hold the event
loop, the last level stands in (reason ``ForecastTimeout``), and the series is not
forecast again until the hung call returns.

**Hung fits.** A fit-queue job (a selection, an expensive fit) that runs longer than
``fit_timeout_seconds`` is abandoned: the series keeps its last good forecast (refreshes
go on from its last fit, with the nowcast, or the cheap stand-in), reason
``ForecastTimeout`` says so until a later fit ends, ``prescaler_forecast_fit_timeouts_total``
counts it (by series fingerprint and step), and the job is retried later. In the
fit processes, the job's process is killed and replaced, so the worker is free for the
jobs queued behind it. A thread (``forecast_workers: 0``) cannot be killed: that series is
not fitted again until the hung call returns.

**Staleness.** When a due step waits longer than ``stale_seconds`` (a long queue, failing
fits) or the history stops refreshing, the result says ``Stale``: the plan still uses the
forecast (the planner holds on one older than its max age), and the condition and the
``prescaler_forecast_stale`` metric make it visible.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field

import pandas as pd

from prescaler.api import ForecastSpec, SelectionStatus, forecast_service
from prescaler.controller.fits import FitProcesses, FitScheduler, fit_failure
from prescaler.controller.model import ForecastResult
from prescaler.controller.status import selection_from_status, selection_status
from prescaler.metrics import Metrics
from prescaler.planning import ScheduledWindow, event_windows
from prescaler.settings import ReconcileSettings
from prescaler.sources import PrometheusSource
from prescaler_forecast import (
    AUTO,
    SELECTION,
    STATUS_INSUFFICIENT_HISTORY,
    STATUS_MODEL_FAILED,
    STATUS_OK,
    EventSource,
    EventWindow,
    Forecast,
    ForecastService,
)

RETRY_SECONDS = 600.0
"""A job that left its step still due (e.g. too little history for Prophet), failed or
timed out is not queued again sooner than this (or the refit period, if shorter)."""

_SETTINGS = ReconcileSettings()
"""The operator settings' defaults (the one place they are written)."""

log = logging.getLogger("prescaler")


@dataclass(frozen=True, slots=True)
class SeriesKey:
    """Which fits a pool can share: a digest of its demand series and fit settings."""

    digest: str

    @property
    def fingerprint(self) -> str:
        """The short form kept in the status with the selection."""
        return self.digest[:16]


def series_key(series_id: str, spec: ForecastSpec, windows: Sequence[ScheduledWindow]) -> SeriesKey:
    """The sharing key. ``series_id`` names the demand series (Prometheus, query and
    credentials, already digested); only the spec fields that change a fit count, and of
    the windows only what the fit sees (their occurrences, not their replica counts)."""
    parts = {
        "series": series_id,
        "model": spec.model,
        "step": spec.step_seconds,
        "horizon": spec.horizon_seconds,
        "quantile": spec.quantile,
        "refit": spec.refit_seconds,
        "lookback": spec.lookback_seconds,
        "windows": [
            [
                w.name,
                w.timezone,
                w.start.isoformat() if w.start else None,
                w.end.isoformat() if w.end else None,
                w.cron,
                w.duration_seconds,
            ]
            for w in windows
        ],
    }
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return SeriesKey(hashlib.sha256(text.encode()).hexdigest())


@dataclass
class _Series:
    key: SeriesKey
    spec: ForecastSpec
    service: ForecastService
    pools: set[str] = field(default_factory=set)
    source: PrometheusSource | None = None
    history: pd.Series | None = None
    history_at: float = -math.inf
    """The time forecasts are made as of: the end of the newest step of history (see
    :func:`as_of`)."""
    forecast: Forecast | None = None
    refreshed_at: float = -math.inf
    refresh: asyncio.Task[None] | None = None
    error: str | None = None
    due: str | None = None
    """The expensive step waiting (``selection`` or a model name), if any."""
    due_since: float | None = None
    retry_at: float = -math.inf
    started: bool = False
    """Whether this process queued a job for the series yet (the first one is spread)."""
    closed: bool = False
    computing: asyncio.Future[Forecast] | None = None
    """The cheap forecast running in the thread pool, if any (one at a time: the service
    is not thread-safe, and a hung model must not pile up threads)."""
    timed_out: str | None = None
    """Why the current forecast is the last level: the model did not answer in time."""
    fitting: asyncio.Future[Forecast] | None = None
    """The expensive step of the latest job; an abandoned one is kept until it ends."""
    fit_timed_out: str | None = None
    """Why the series plans with its last good forecast: a job ran past the fit timeout
    (cleared when a later fit ends)."""
    fit_failed: str | None = None
    """Why the series plans with its last good forecast: its last job failed in its fit
    process (cleared when a later one succeeds)."""


@dataclass
class ForecastHub:
    """Forecast state of one operator process: shared series and the fit queue."""

    metrics: Metrics
    executor: Executor | None
    """Where fits and selections run without ``fit_processes`` (``None``: the loop's
    default thread pool)."""
    io_executor: Executor | None = None
    """Thread pool for Prometheus reads."""
    fit_processes: FitProcesses | None = None
    """Processes for fits and selections, one per running job (a hung one is killed and
    replaced); ``None``: ``executor``."""
    wait_seconds: float = _SETTINGS.forecast_wait_seconds
    """How long a reconcile waits for its series' history refresh (never for a fit)."""
    fit_workers: int = 1
    """Jobs the fit queue runs at once (the process pool's size)."""
    fit_queue_limit: int = _SETTINGS.fit_queue_limit
    """Jobs the fit queue holds at most."""
    first_fit_spread_seconds: float = _SETTINGS.first_fit_spread_seconds
    """A series' first job in this process is due within this long (spread by its key)."""
    stale_seconds: float = _SETTINGS.forecast_stale_seconds
    """A due step or refresh overdue by more than this makes the forecast ``Stale``."""
    model_timeout_seconds: float = _SETTINGS.forecast_model_timeout_seconds
    """How long a refresh waits for the cheap forecast before the last level stands in."""
    fit_timeout_seconds: float = _SETTINGS.forecast_fit_timeout_seconds
    """How long a fit-queue job may run before it is abandoned (and its process killed)."""
    clock: Callable[[], float] = time.time
    make_service: Callable[[ForecastSpec, Sequence[EventWindow] | EventSource], ForecastService] = (
        field(default=lambda spec, events: series_service(spec, events))
    )
    """Builds a series' forecaster (tests narrow the candidates); ``events`` is the
    calendar of the series' scheduled windows."""
    _series: dict[SeriesKey, _Series] = field(default_factory=dict)
    _pools: dict[str, SeriesKey] = field(default_factory=dict)
    _fits: FitScheduler[SeriesKey] = field(init=False)

    def __post_init__(self) -> None:
        self._fits = FitScheduler(
            run=self._job,
            workers=max(1, self.fit_workers),
            limit=self.fit_queue_limit,
            clock=self.clock,
            on_start=lambda _key, waited: self.metrics.fit_queue_wait.observe(waited),
        )

    # ------------------------------------------------------------------ public
    @property
    def series_count(self) -> int:
        return len(self._series)

    def forget(self, uid: str) -> None:
        """Detach a deleted pool; a series nobody reads any more is dropped."""
        key = self._pools.pop(uid, None)
        series = self._series.get(key) if key is not None else None
        if series is None:
            return
        series.pools.discard(uid)
        if not series.pools:
            series.closed = True
            if series.refresh is not None:
                series.refresh.cancel()
            self._fits.discard(series.key)
            del self._series[series.key]
            self.metrics.forget_series(series.key.fingerprint)
        self._gauges()

    def close(self) -> None:
        self._fits.close()
        for series in self._series.values():
            for task in (series.refresh, series.fitting):
                if task is not None:
                    task.cancel()

    async def get(
        self,
        uid: str,
        spec: ForecastSpec,
        windows: Sequence[ScheduledWindow],
        source: PrometheusSource,
        series_id: str,
        now: float,
        kept: SelectionStatus | None = None,
    ) -> ForecastResult:
        """The freshest forecast of the pool's series; waits at most ``wait_seconds``.

        ``kept`` is the selection in the pool's status: it seeds a series that has none.
        """
        series = self._attach(uid, spec, windows, series_id, now)
        series.source = source
        if kept is not None:
            self._seed(series, kept)
        if series.refresh is None and now - series.refreshed_at >= spec.step_seconds:
            series.refresh = asyncio.create_task(self._refresh(series, now))
        task = series.refresh
        if task is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), timeout=self.wait_seconds)
        self._gauges()
        return self._result(series, now)

    # ------------------------------------------------------------------ series
    def _attach(
        self,
        uid: str,
        spec: ForecastSpec,
        windows: Sequence[ScheduledWindow],
        series_id: str,
        now: float,
    ) -> _Series:
        key = series_key(series_id, spec, windows)
        if self._pools.get(uid, key) != key:
            self.forget(uid)
        series = self._series.get(key)
        if series is None:
            # The calendar, not this moment's occurrences: every fit asks it for those over
            # its own history and horizon, so later occurrences count without a restart.
            calendar = functools.partial(event_windows, tuple(windows))
            service = self.make_service(spec, calendar)
            series = _Series(key=key, spec=spec, service=service)
            self._series[key] = series
            # Its fit-timeout counter at 0 from the start: "none" is a series, not nothing.
            self.metrics.declare_fit(key.fingerprint, _step_label(None, service))
        series.pools.add(uid)
        self._pools[uid] = key
        return series

    def _seed(self, series: _Series, kept: SelectionStatus) -> None:
        service = series.service
        if service.selection is not None or self._fits.is_running(series.key):
            return
        selection = selection_from_status(kept, series.key.fingerprint, service.candidates)
        if selection is not None and service.seed(selection):
            self.metrics.selections_resumed.inc()

    async def _refresh(self, series: _Series, now: float) -> None:
        """New history, then a forecast without any expensive step; queue one if due."""
        loop = asyncio.get_running_loop()
        spec, service = series.spec, series.service
        try:
            assert series.source is not None
            step = float(spec.step_seconds)
            if series.history is None or series.history.empty:
                start = now - spec.lookback_seconds
            else:
                start = series.history.index[-1].timestamp() - 5 * step
            fresh = await loop.run_in_executor(
                self.io_executor, series.source.history, start, now, step
            )
            if series.closed:
                return
            history = fresh if series.history is None else pd.concat([series.history, fresh])
            history = history[~history.index.duplicated(keep="last")].sort_index()
            cutoff = pd.Timestamp(now - spec.lookback_seconds, unit="s", tz="UTC")
            series.history = history[history.index >= cutoff]
            series.history_at = at = as_of(series.history, now, step)
            due = service.due_step(series.history, at)
            if due is None:
                series.due = series.due_since = None
            else:
                self._want(series, due, now)
            series.forecast = await self._forecast_cached(series, series.history, at)
            series.error = None
        except Exception as exc:  # a boundary: any failure is reported, never raised
            series.error = f"{type(exc).__name__}: {exc}"[:1000]
        finally:
            series.refreshed_at = now
            series.refresh = None

    async def _forecast_cached(self, series: _Series, history: pd.Series, at: float) -> Forecast:
        """The service's cheap forecast, computed in the thread pool and waited for at most
        ``model_timeout_seconds``; the last level (status ``model_failed``) otherwise."""
        service = series.service
        if series.computing is not None and not series.computing.done():
            series.timed_out = "the forecast model has not returned from an earlier call"
            return service.fallback(history, at, series.timed_out)
        loop = asyncio.get_running_loop()
        before = _fit_counts(service)
        call = loop.run_in_executor(self.io_executor, service.forecast_cached, history, at)
        series.computing = call
        try:
            forecast = await asyncio.wait_for(asyncio.shield(call), self.model_timeout_seconds)
        except TimeoutError:
            series.timed_out = (
                f"the forecast model did not answer within {self.model_timeout_seconds:g}s"
            )
            return service.fallback(history, at, series.timed_out)
        series.timed_out = None
        self._count_fits(service, before, None)
        return forecast

    def _want(self, series: _Series, due: str, now: float) -> None:
        """Queue the series' due step unless it is queued or running already."""
        if series.due != due or series.due_since is None:
            series.due, series.due_since = due, now
        if self._fits.busy(series.key) or _running(series.fitting):
            return  # queued, running, or abandoned in a thread that has not returned
        due_at = max(now, series.retry_at)
        if not series.started:
            spread = int(series.key.digest[:8], 16) / 0xFFFFFFFF
            due_at = now + spread * self.first_fit_spread_seconds
        if self._fits.submit(series.key, due_at):
            series.started = True
        else:
            self.metrics.fit_queue_rejected.inc()

    async def _job(self, key: SeriesKey) -> None:
        """The expensive step(s) of one series, in the fit processes (run by the queue);
        abandoned past ``fit_timeout_seconds``."""
        series = self._series.get(key)
        if series is None or series.closed or series.history is None:
            return
        if _running(series.fitting):
            return  # an abandoned step still runs in a thread
        service, history, at = series.service, series.history, series.history_at
        before, selection_before = _fit_counts(service), service.selection
        started, step = time.perf_counter(), series.due
        self.metrics.declare_fit(series.key.fingerprint, _step_label(step, service))
        slot = self.fit_processes.take() if self.fit_processes is not None else None
        fitting = asyncio.ensure_future(
            service.forecast_async(history, at, executor=slot or self.executor)
        )
        fitting.add_done_callback(_retrieve)  # whoever waits for it, or nobody
        series.fitting = fitting
        timeout = self.fit_timeout_seconds
        try:
            await asyncio.wait({fitting}, timeout=timeout)
        finally:
            hung = not fitting.done()
            if slot is not None and self.fit_processes is not None:
                self.fit_processes.give(slot, hung=hung)  # a hung one is killed, replaced
        if hung:
            self._abandon(series, fitting, step, timeout, replaced=slot is not None)
            return
        try:
            fitting.result()
        except Exception as exc:  # a boundary: reported in the status, retried later
            memory = self.fit_processes.memory_mib if self.fit_processes is not None else 0
            reason, why = fit_failure(exc, memory)
            what = "the selection" if step == SELECTION else f"the {step or 'model'} fit"
            series.fit_failed = f"{what} failed: {why}"[:1000]
            series.retry_at = self.clock() + min(RETRY_SECONDS, series.spec.refit_seconds)
            self.metrics.fit_failures.labels(reason).inc()
            log.warning("forecast series %s: %s", series.key.fingerprint, series.fit_failed)
            return
        series.fit_timed_out = series.fit_failed = None
        self._count_fits(service, before, time.perf_counter() - started)
        if service.selection is not selection_before:
            self.metrics.fits.labels("selection").inc()
            self.metrics.fit_duration.labels("selection").observe(time.perf_counter() - started)
        if series.closed or series.history is None:
            return
        if series.computing is not None and not series.computing.done():
            return  # a refresh is forecasting; the next one uses the new fit
        # Forecast again from the newest history, now with the new fit or selection.
        now = series.history_at
        series.forecast = await self._forecast_cached(series, series.history, now)
        series.error = None
        due = service.due_step(series.history, now)
        if due is None:
            series.due = series.due_since = None
        else:  # the step did not help (e.g. too little history for it): not again soon
            series.retry_at = self.clock() + min(RETRY_SECONDS, series.spec.refit_seconds)

    def _abandon(
        self,
        series: _Series,
        fitting: asyncio.Future[Forecast],
        step: str | None,
        timeout: float,
        replaced: bool,
    ) -> None:
        """A job ran past the fit timeout: the series keeps its forecast and says so; the
        step is retried later (in a thread, once the hung call has returned)."""
        what = "the selection" if step == SELECTION else f"the {step or 'model'} fit"
        after = (
            "its process was killed and replaced"
            if replaced
            else "it is not started again until the hung call returns"
        )
        series.fit_timed_out = (
            f"{what} did not finish within {timeout:g}s and was abandoned ({after})"
        )
        series.retry_at = self.clock() + min(RETRY_SECONDS, series.spec.refit_seconds)
        if not series.closed:  # a dropped series' counter is gone and stays gone
            self.metrics.fit_timed_out(series.key.fingerprint, _step_label(step, series.service))
        log.warning("forecast series %s: %s", series.key.fingerprint, series.fit_timed_out)

        def ended(task: asyncio.Future[Forecast]) -> None:
            if task.cancelled() or task.exception() is not None:
                return  # killed (BrokenProcessPool) or failed: the retry will tell
            if not series.closed:  # it returned at last: its fit is installed
                series.fit_timed_out = None
                series.due = series.due_since = None  # the next refresh says what is due

        fitting.add_done_callback(ended)

    # ------------------------------------------------------------------ reporting
    def _count_fits(
        self, service: ForecastService, before: dict[str, int], elapsed: float | None
    ) -> None:
        for name, count in _fit_counts(service).items():
            fits = count - before.get(name, 0)
            if fits > 0:
                self.metrics.fits.labels(name).inc(fits)
                if elapsed is not None and not service.runner(name).cheap:
                    self.metrics.fit_duration.labels(name).observe(elapsed)

    def _gauges(self) -> None:
        self.metrics.fit_queue_jobs.labels("queued").set(self._fits.pending)
        self.metrics.fit_queue_jobs.labels("running").set(self._fits.running)
        self.metrics.forecast_series.set(len(self._series))

    def _result(self, series: _Series, now: float) -> ForecastResult:
        service = series.service
        forecast = series.forecast
        selection = selection_status(service.selection, series.key.fingerprint)
        if forecast is None:
            failed = series.error or series.fit_failed
            if failed is not None:
                return ForecastResult(None, False, "ForecastFailed", failed)
            return ForecastResult(None, False, "Pending", "first forecast is being fitted")
        if series.timed_out is not None:
            message = f"{series.timed_out}; planning with the last level"
            return ForecastResult(forecast, False, "ForecastTimeout", message)
        if series.fit_timed_out is not None and forecast.status == STATUS_INSUFFICIENT_HISTORY:
            message = f"{series.fit_timed_out}; {forecast.detail}"[:1000]
            return ForecastResult(None, False, "ForecastTimeout", message)
        if forecast.status == STATUS_MODEL_FAILED:
            message = f"{forecast.detail}; planning with {forecast.model}"[:1000]
            return ForecastResult(forecast, False, "ModelFailed", message, selection=selection)
        if forecast.status != STATUS_OK:
            message = f"{forecast.status}: {forecast.detail}"
            return ForecastResult(None, False, "InsufficientHistory", message)
        age = _fit_age(service, forecast, now)
        overdue = now - series.due_since if series.due_since is not None else 0.0
        lag = now - forecast.generated_at
        stale = max(overdue, lag) > self.stale_seconds

        def result(healthy: bool, reason: str, message: str) -> ForecastResult:
            return ForecastResult(forecast, healthy, reason, message, stale, age, selection)

        if series.error is not None:
            return result(False, "RefreshFailed", series.error)
        if series.fit_failed is not None:
            message = f"{series.fit_failed}; planning with {_describe(forecast)}, retried"
            return result(False, "FitFailed", message[:1000])
        if series.fit_timed_out is not None:
            fitted = f", fitted {age:.0f} s ago" if age is not None else ""
            message = f"{series.fit_timed_out}; planning with {_describe(forecast)}{fitted}"
            return result(False, "ForecastTimeout", message)
        if stale:
            return result(False, "Stale", self._stale_message(series, forecast, overdue, lag, age))
        wanted = service.selection.model if service.selection is not None else None
        if service.model != AUTO:
            wanted = service.model
        if (wanted is None and series.due == SELECTION) or (
            wanted is not None and forecast.model != wanted
        ):
            waiting = wanted or "the selection"
            return result(True, "Interim", f"{_describe(forecast)} until {waiting} is ready")
        return result(True, "Fresh", _describe(forecast))

    def _stale_message(
        self, series: _Series, forecast: Forecast, overdue: float, lag: float, age: float | None
    ) -> str:
        parts: list[str] = []
        if overdue > self.stale_seconds:
            ahead = self._fits.ahead_of(series.key)
            where = (
                "running"
                if self._fits.is_running(series.key)
                else f"{ahead} jobs ahead of it in the fit queue"
                if ahead is not None
                else "not queued (queue full or retrying later)"
            )
            parts.append(f"{series.due} overdue for {overdue:.0f} s ({where})")
        if lag > self.stale_seconds:
            parts.append(f"history not refreshed for {lag:.0f} s")
        fitted = f", fitted {age:.0f} s ago" if age is not None else ""
        parts.append(f"planning with {forecast.model}{fitted}")
        return "; ".join(parts)


def as_of(history: pd.Series, now: float, step: float, slack: int = 3) -> float:
    """When a forecast from ``history`` is made: at the end of its newest step when that is
    at most ``slack`` steps before ``now`` (a source may deliver the newest step or two
    late, e.g. a rate window wider than the step, read centred), else ``now``.

    The forecast then starts where the data ends; a model that extends the newest step
    (the cheap ones) cannot start later, and nothing after that end is known anyway.
    """
    if history.empty:
        return now
    end = history.index[-1].timestamp() + step
    return end if now - slack * step <= end < now else now


def series_service(
    spec: ForecastSpec, events: Sequence[EventWindow] | EventSource
) -> ForecastService:
    """The forecaster of a series, as its pools' ``spec.forecast`` asks for (built where
    the backtest builds it too)."""
    return forecast_service(spec, events=events)


def _running(task: asyncio.Future[Forecast] | None) -> bool:
    return task is not None and not task.done()


def _step_label(step: str | None, service: ForecastService) -> str:
    """The ``model`` label of a job's fit-timeout counter: its due step (``selection`` or
    the model to fit), else the series' first (its selection, or its fixed model)."""
    return step or (SELECTION if service.model == AUTO else service.model)


def _retrieve(task: asyncio.Future[Forecast]) -> None:
    """Mark a finished step's exception as seen (a killed fit's ``BrokenProcessPool`` has
    no other reader once its job gave up on it)."""
    if not task.cancelled():
        task.exception()


def _fit_counts(service: ForecastService) -> dict[str, int]:
    return {name: service.runner(name).fit_count for name in service.candidates}


def _fit_age(service: ForecastService, forecast: Forecast, now: float) -> float | None:
    if forecast.model not in service.candidates:
        return None
    fitted = service.runner(forecast.model).fitted
    return None if fitted is None else max(0.0, now - fitted.history_end)


def _describe(forecast: Forecast) -> str:
    score = f", sMAPE {forecast.score:.1f}%" if forecast.score is not None else ""
    return f"{forecast.model}{score}"
