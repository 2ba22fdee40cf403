"""ForecastHub: sharing per series, fits off the reconcile path, seeding, staleness.

No I/O: the Prometheus source is a fake that serves a synthetic history, the thread pool
runs inline, and the fit pool is a gate the test opens.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from typing import Any, cast

import numpy as np
import pandas as pd

from prescaler.api import ForecastSpec, SelectionStatus
from prescaler.controller.forecast import ForecastHub, as_of, series_key
from prescaler.controller.model import ForecastResult
from prescaler.metrics import Metrics
from prescaler.sources import PrometheusSource
from prescaler_forecast import EventWindow, ForecastService, SelectionConfig

DAY = 86_400.0
STEP = 60.0
NOW = 1_750_000_020.0  # on the step grid
CHEAP = ("recent_trend", "seasonal_naive")


class FakeSource:
    """Two days of a daily cycle, whatever the range asked for; counts reads."""

    def __init__(self) -> None:
        self.reads = 0

    def history(self, start: float, end: float, step: float) -> pd.Series:
        self.reads += 1
        t = np.arange(np.ceil(max(start, NOW - 2 * DAY) / step) * step, end - step + 1, step)
        rate = 10 + 5 * np.sin(2 * np.pi * t / DAY)
        return pd.Series(rate, index=pd.to_datetime(t, unit="s", utc=True))


class Inline(Executor):
    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_result(fn(*args, **kwargs))
        return future


class Gate(Executor):
    """Holds every submitted call until :meth:`open`; counts them."""

    def __init__(self) -> None:
        self.held: list[tuple[Future[Any], Callable[[], Any]]] = []
        self.calls = 0
        self.is_open = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.calls += 1
        future: Future[Any] = Future()
        self.held.append((future, lambda: fn(*args, **kwargs)))
        if self.is_open:
            self.flush()
        return future

    def open(self) -> None:
        self.is_open = True
        self.flush()

    def flush(self) -> None:
        while self.held:
            future, call = self.held.pop(0)
            future.set_result(call())


def cheap_service(spec: ForecastSpec, events: Sequence[EventWindow]) -> ForecastService:
    return ForecastService(
        model=spec.model,
        horizon_seconds=spec.horizon_seconds,
        step_seconds=spec.step_seconds,
        refit_seconds=spec.refit_seconds,
        candidates=CHEAP,
        selection=SelectionConfig(window_seconds=6 * 3600, memory_seconds=6 * 3600, origins=6),
    )


def spec(**changes: Any) -> ForecastSpec:
    body = {"prometheus": {"url": "http://prometheus:9090"}, "horizonSeconds": 1800}
    return ForecastSpec.model_validate({**body, **changes})


def hub(fits: Executor, clock: list[float], **kwargs: Any) -> ForecastHub:
    return ForecastHub(
        metrics=Metrics(),
        executor=fits,
        io_executor=Inline(),
        wait_seconds=1.0,
        first_fit_spread_seconds=0.0,
        clock=lambda: clock[0],
        make_service=cheap_service,
        **kwargs,
    )


async def settle(h: ForecastHub, check: Callable[[], bool]) -> None:
    """Let the loop run until ``check()`` holds (a generous bound, in loop turns)."""
    for _ in range(200_000):
        if check():
            return
        await asyncio.sleep(0)
    raise AssertionError("the hub did not settle")


def get(
    h: ForecastHub,
    uid: str,
    source: FakeSource,
    now: float,
    s: ForecastSpec | None = None,
    series: str = "series-a",
    kept: SelectionStatus | None = None,
) -> Any:
    return h.get(uid, s or spec(), (), cast(PrometheusSource, source), series, now, kept=kept)


def test_pools_on_one_series_share_history_selection_and_forecast() -> None:
    async def scenario() -> None:
        clock, gate, source = [NOW], Gate(), FakeSource()
        h = hub(gate, clock)
        a = await get(h, "a", source, NOW)
        b = await get(h, "b", source, NOW + 5, spec(headroom=2.0))  # not a fit setting
        assert h.series_count == 1
        assert source.reads == 1  # b reused a's refresh of this step
        assert a.forecast is b.forecast
        other = await get(h, "c", source, NOW, spec(model="recent_trend"))
        assert h.series_count == 2
        assert other.forecast is not a.forecast
        elsewhere = await get(h, "d", source, NOW, series="series-b")
        assert h.series_count == 3
        assert elsewhere.forecast is not a.forecast
        gate.open()
        await settle(h, lambda: h._fits.running == 0 and h._fits.pending == 0)
        assert gate.calls == 2  # one selection for a+b, one for d; none for the fixed model
        a2 = await get(h, "a", source, NOW + STEP)
        b2 = await get(h, "b", source, NOW + STEP + 5, spec(headroom=2.0))
        assert a2.selection is not None
        assert a2.selection == b2.selection
        assert a2.reason == b2.reason == "Fresh"
        assert source.reads == 4  # a, c, d at NOW; the a+b series again one step later
        for uid in "abcd":
            h.forget(uid)
        assert h.series_count == 0
        h.close()

    asyncio.run(scenario())


def test_a_reconcile_never_waits_for_a_fit() -> None:
    async def scenario() -> None:
        clock, gate, source = [NOW], Gate(), FakeSource()
        h = hub(gate, clock)
        first: ForecastResult = await get(h, "a", source, NOW)
        assert first.forecast is not None  # the cheapest model stands in
        assert (first.reason, first.healthy, first.stale) == ("Interim", True, False)
        assert "until the selection is ready" in first.message
        await settle(h, lambda: gate.calls == 1)  # the selection is held in the fit pool
        again = await get(h, "a", source, NOW + STEP)
        assert again.reason == "Interim"
        gate.open()
        await settle(h, lambda: h._fits.running == 0)
        done = await get(h, "a", source, NOW + 2 * STEP)
        assert done.reason == "Fresh"
        assert done.selection is not None
        assert done.selection.fingerprint == series_key("series-a", spec(), ()).fingerprint
        h.close()

    asyncio.run(scenario())


def test_a_fit_overdue_past_the_limit_is_reported_stale() -> None:
    async def scenario() -> None:
        clock, gate, source = [NOW], Gate(), FakeSource()
        h = hub(gate, clock, stale_seconds=300.0)
        await get(h, "a", source, NOW)
        clock[0] = NOW + 600
        late: ForecastResult = await get(h, "a", source, NOW + 600)
        assert late.forecast is not None  # still planned with
        assert (late.reason, late.healthy, late.stale) == ("Stale", False, True)
        assert "selection overdue for 600 s (running)" in late.message
        gate.open()
        await settle(h, lambda: h._fits.running == 0)
        clock[0] = NOW + 660
        fresh = await get(h, "a", source, NOW + 660)
        assert (fresh.reason, fresh.stale) == ("Fresh", False)
        h.close()

    asyncio.run(scenario())


def test_a_kept_selection_is_resumed_not_redone() -> None:
    async def scenario() -> None:
        clock, gate, source = [NOW], Gate(), FakeSource()
        h = hub(gate, clock)
        fingerprint = series_key("series-a", spec(), ()).fingerprint
        kept = SelectionStatus(
            model="seasonal_naive",
            score=5.0,
            selected_at="2025-06-15T14:00:00Z",  # an hour before NOW
            scores={"recent_trend": 9.0, "seasonal_naive": 5.0},
            origins=12,
            fingerprint=fingerprint,
        )
        r: ForecastResult = await get(h, "a", source, NOW, kept=kept)
        assert (r.reason, r.forecast is not None) == ("Fresh", True)
        assert r.forecast is not None
        assert r.forecast.model == "seasonal_naive"
        assert r.selection == kept
        assert gate.calls == 0
        assert h._fits.pending == 0
        assert h.metrics.selections_resumed._value.get() == 1
        # A selection made for other settings is not taken over.
        other: ForecastResult = await get(h, "b", source, NOW, spec(quantile=0.97), kept=kept)
        assert other.reason == "Interim"
        await settle(h, lambda: gate.calls == 1)
        h.close()

    asyncio.run(scenario())


def test_first_fits_after_a_start_are_spread() -> None:
    async def scenario() -> None:
        clock, gate, source = [NOW], Gate(), FakeSource()
        h = hub(gate, clock)
        h.first_fit_spread_seconds = 3600.0
        for i in range(20):
            await get(h, f"p{i}", source, NOW, series=f"series-{i}")
        assert h._fits.pending + h._fits.running == 20
        due = sorted(h._fits._queue.due_at(k) or NOW for k in h._fits._queue._entries)
        assert due[0] < NOW + 1800 < due[-1]  # not all at once
        h.close()

    asyncio.run(scenario())


def test_a_full_queue_refuses_and_the_pool_retries_later() -> None:
    async def scenario() -> None:
        clock, gate, source = [NOW], Gate(), FakeSource()
        h = hub(gate, clock, fit_queue_limit=1, fit_workers=1)
        h.first_fit_spread_seconds = 3600.0  # keep both queued
        await get(h, "a", source, NOW, series="one")
        refused: ForecastResult = await get(h, "b", source, NOW, series="two")
        assert refused.reason == "Interim"
        assert h.metrics.fit_queue_rejected._value.get() == 1
        clock[0] = NOW + 400
        late: ForecastResult = await get(h, "b", source, NOW + 400, series="two")
        assert late.reason == "Stale"
        assert "not queued" in late.message
        h.close()

    asyncio.run(scenario())


def test_forecasts_are_made_as_of_the_newest_step_of_history() -> None:
    source = FakeSource()
    late = source.history(NOW - DAY, NOW - 90, STEP)  # the newest full step ends at NOW - 120
    assert as_of(late, NOW, STEP) == NOW - 120
    assert as_of(source.history(NOW - DAY, NOW, STEP), NOW, STEP) == NOW
    assert as_of(source.history(NOW - DAY, NOW - 600, STEP), NOW, STEP) == NOW  # too old
    assert as_of(late.iloc[:0], NOW, STEP) == NOW


def test_a_series_whose_source_lags_a_step_still_forecasts_with_a_cheap_model() -> None:
    class Lagging(FakeSource):
        def history(self, start: float, end: float, step: float) -> pd.Series:
            return super().history(start, end - 90, step)

    async def scenario() -> ForecastResult:
        clock, gate = [NOW + 30], Gate()
        h = hub(gate, clock)
        result: ForecastResult = await get(
            h, "a", Lagging(), NOW + 30, spec(model="seasonal_naive")
        )
        h.close()
        return result

    result = asyncio.run(scenario())
    assert result.forecast is not None
    assert result.reason == "Fresh"
    assert result.forecast.generated_at == NOW - 60


def test_a_fit_abandoned_at_its_timeout_is_counted_on_its_series() -> None:
    """The held selection outlives a short fit timeout (nothing is timed: the test waits
    for the abandonment, however long it takes)."""
    name = "prescaler_forecast_fit_timeouts_total"

    async def scenario() -> None:
        clock, gate, source = [NOW], Gate(), FakeSource()
        h = hub(gate, clock, fit_timeout_seconds=0.01)
        count = h.metrics.registry.get_sample_value
        await get(h, "a", source, NOW)  # auto: a selection is due, and held in the gate
        await get(h, "c", source, NOW, spec(model="recent_trend"))  # never fits in the queue
        auto = series_key("series-a", spec(), ()).fingerprint
        fixed = series_key("series-a", spec(model="recent_trend"), ()).fingerprint
        assert count(name, {"series": fixed, "model": "recent_trend"}) == 0  # there from the start
        series = h._series[h._pools["a"]]
        for _ in range(6000):
            if series.fit_timed_out is not None:
                break
            await asyncio.sleep(0.01)
        assert series.fit_timed_out is not None
        assert count(name, {"series": auto, "model": "selection"}) == 1
        assert count(name, {"series": fixed, "model": "recent_trend"}) == 0
        h.forget("a")  # nobody reads the series any more: its counter goes with it
        assert count(name, {"series": auto, "model": "selection"}) is None
        assert count(name, {"series": fixed, "model": "recent_trend"}) == 0
        gate.open()
        h.close()

    asyncio.run(scenario())
