"""A fit that never returns: abandoned at the fit timeout, its process killed and replaced.

The hub is the real ``ForecastHub`` with real fit processes (:class:`FitProcesses`, spawned
like the operator's) and a real thread pool; the model is Prophet, whose fit can be told
to never return (a fit stuck in its optimizer). Nothing is timed: every wait is on a
condition, with a generous deadline; only the timeout of the fit meant to hang is short.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd
import pytest

from prescaler.api import ForecastSpec
from prescaler.controller.fits import FitProcesses
from prescaler.controller.forecast import ForecastHub, _Series
from prescaler.controller.model import ForecastResult
from prescaler.metrics import Metrics
from prescaler.sources import PrometheusSource
from prescaler_forecast import EventSource, EventWindow, ForecastService, ProphetForecaster

DAY = 86_400.0
STEP = 60.0
NOW = 1_750_000_020.0  # on the step grid
REFIT = 600.0
DEADLINE = 180.0  # seconds: a spawned process imports Prophet, then fits, on a busy machine
HUNG = 1.0  # the fit timeout while the fit meant to hang starts
GENEROUS = 600.0  # the fit timeout otherwise


class Stalling(ProphetForecaster):
    """Prophet, whose fit never returns when built with ``hang``. Top-level, so that it
    pickles: an expensive model is sent to the fit processes unfitted."""

    release = threading.Event()
    """Ends a hang in a thread (a process is killed instead)."""

    def __init__(self, hang: bool = False, die: bool = False) -> None:
        super().__init__(lookback_seconds=2 * DAY)
        self.hang, self.die = hang, die

    def _fit(self) -> None:
        if self.die:  # as the kernel's OOM killer ends a process: no exception, no cleanup
            os._exit(137)
        while self.hang and not self.release.wait(60):
            pass
        super()._fit()


class Source:
    """Two days of a daily cycle, whatever the range asked for."""

    def history(self, start: float, end: float, step: float) -> pd.Series:
        t = np.arange(np.ceil(max(start, NOW - 2 * DAY) / step) * step, end - step + 1, step)
        rate = 10 + 5 * np.sin(2 * np.pi * t / DAY)
        return pd.Series(rate, index=pd.to_datetime(t, unit="s", utc=True))


def spec(horizon: int) -> ForecastSpec:
    return ForecastSpec.model_validate(
        {
            "prometheus": {"url": "http://prometheus:9090"},
            "model": "prophet",
            "horizonSeconds": horizon,
            "refitSeconds": int(REFIT),
            "lookbackSeconds": int(7 * DAY),
        }
    )


STUCK, OTHER = spec(1800), spec(2400)
"""Two series: the stuck one's fit hangs while ``hang`` is set; the other's never does."""


def stalling_service(hang: dict[str, bool]) -> Callable[..., ForecastService]:
    def make(s: ForecastSpec, events: Sequence[EventWindow] | EventSource) -> ForecastService:
        def model() -> Stalling:
            stuck = s.horizon_seconds == STUCK.horizon_seconds
            return Stalling(hang=hang["on"] and stuck, die=hang.get("die", False) and stuck)

        return ForecastService(
            model=s.model,
            horizon_seconds=s.horizon_seconds,
            step_seconds=s.step_seconds,
            refit_seconds=s.refit_seconds,
            lookback_seconds=s.lookback_seconds,
            events=events,
            models={"prophet": model},
        )

    return make


async def until(what: str, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {DEADLINE:g} s: {what}")
        await asyncio.sleep(0.05)


class Pools:
    """``get`` a pool's forecast from the hub at a time the test sets."""

    def __init__(self, hub: ForecastHub, clock: list[float]) -> None:
        self.hub, self.clock = hub, clock

    async def get(self, uid: str, s: ForecastSpec, now: float) -> ForecastResult:
        self.clock[0] = now
        source = cast(PrometheusSource, Source())
        result: ForecastResult = await self.hub.get(uid, s, (), source, f"series-{uid}", now)
        return result

    def series(self, uid: str) -> _Series:
        return self.hub._series[self.hub._pools[uid]]

    def idle(self) -> bool:
        return self.hub._fits.running == 0 and self.hub._fits.pending == 0

    def fitted_at(self, uid: str) -> float | None:
        fitted = self.series(uid).service.runner("prophet").fitted
        return None if fitted is None else fitted.history_end

    def timeouts(self, fingerprint: str) -> float | None:
        """The series' ``prescaler_forecast_fit_timeouts_total`` for its Prophet fits."""
        labels = {"series": fingerprint, "model": "prophet"}
        registry = self.hub.metrics.registry
        return registry.get_sample_value("prescaler_forecast_fit_timeouts_total", labels)


def run(scenario: Callable[[Pools, dict[str, bool]], Any], processes: FitProcesses | None) -> None:
    hang = {"on": False}
    io = ThreadPoolExecutor(max_workers=2, thread_name_prefix="test-io")
    clock = [NOW]
    hub = ForecastHub(
        metrics=Metrics(),
        executor=None,
        io_executor=io,
        fit_processes=processes,
        fit_workers=1,
        wait_seconds=DEADLINE,
        first_fit_spread_seconds=0.0,
        fit_timeout_seconds=GENEROUS,
        clock=lambda: clock[0],
        make_service=stalling_service(hang),
    )

    async def main() -> None:
        try:
            await scenario(Pools(hub, clock), hang)
        finally:
            Stalling.release.set()
            hub.close()

    Stalling.release.clear()
    try:
        asyncio.run(main())
    finally:
        Stalling.release.set()
        if processes is not None:
            processes.shutdown()
        io.shutdown(wait=True)


async def fitted_first(pools: Pools, uid: str, s: ForecastSpec, now: float) -> ForecastResult:
    """The pool's forecast once its first fit is done."""
    await pools.get(uid, s, now)
    await until(f"{uid}'s first fit", lambda: pools.idle() and pools.fitted_at(uid) is not None)
    return await pools.get(uid, s, now + 1)  # within the step: no new refresh


async def hang_next_fit(pools: Pools, hang: dict[str, bool], now: float) -> ForecastResult:
    """The stuck pool's refit at ``now``, which hangs; the short timeout holds for it alone."""
    before = pools.series("stuck").fitting
    hang["on"] = True
    pools.hub.fit_timeout_seconds = HUNG
    current = await pools.get("stuck", STUCK, now)
    await until("the hanging fit to start", lambda: pools.series("stuck").fitting is not before)
    pools.hub.fit_timeout_seconds = GENEROUS  # read as the job started; later jobs get this
    hang["on"] = False
    return current


def test_a_fit_that_never_returns_is_abandoned_its_process_replaced_and_later_fits_run() -> None:
    processes = FitProcesses(1)  # one worker: the hung fit holds the only one

    async def scenario(pools: Pools, hang: dict[str, bool]) -> None:
        good = await fitted_first(pools, "stuck", STUCK, NOW)
        assert (good.reason, good.healthy) == ("Fresh", True), good
        stuck = pools.series("stuck").key.fingerprint
        assert pools.timeouts(stuck) == 0  # there from its first fit: increase() sees 0 -> 1
        # A refit is due a refit period later; it hangs. Meanwhile the pool forecasts from
        # its last good fit, and another series' first fit queues behind the hung one.
        later = NOW + REFIT
        current = await hang_next_fit(pools, hang, later)
        assert current.forecast is not None
        assert current.forecast.model == "prophet"
        last_good = current.forecast
        await pools.get("other", OTHER, later)
        await until("the fit timeout", lambda: pools.series("stuck").fit_timed_out is not None)
        timed_out = await pools.get("stuck", STUCK, later + 1)
        assert (timed_out.healthy, timed_out.reason) == (False, "ForecastTimeout"), timed_out
        assert "did not finish within 1s" in timed_out.message
        assert "its process was killed and replaced" in timed_out.message
        assert timed_out.forecast is last_good  # the last good forecast is kept
        assert processes.replaced == 1
        assert pools.timeouts(stuck) == 1  # counted for monitoring, on its own series
        # The queued fit ran in the replacement process.
        await until(
            "the other series' fit", lambda: pools.idle() and pools.fitted_at("other") is not None
        )
        other = await pools.get("other", OTHER, later + 1)
        assert (other.reason, other.healthy) == ("Fresh", True), other
        # The stuck series is retried a refit period later, and that fit succeeds.
        retry = later + REFIT
        await pools.get("stuck", STUCK, retry)
        await until(
            "the retried fit", lambda: pools.idle() and (pools.fitted_at("stuck") or 0) > later
        )
        recovered = await pools.get("stuck", STUCK, retry + 1)
        assert (recovered.reason, recovered.healthy) == ("Fresh", True), recovered
        assert processes.replaced == 1
        assert pools.timeouts(stuck) == 1  # the successful retry counts no timeout
        assert pools.timeouts(pools.series("other").key.fingerprint) == 0
        # The pool is forgotten and nobody reads its series: its counter goes with it.
        pools.hub.forget("stuck")
        assert pools.timeouts(stuck) is None

    run(scenario, processes)


def test_a_fit_hung_in_a_thread_is_abandoned_and_not_started_again_until_it_returns() -> None:
    """Without fit processes (``forecast_workers: 0``) the hung thread cannot be killed."""

    async def scenario(pools: Pools, hang: dict[str, bool]) -> None:
        await fitted_first(pools, "stuck", STUCK, NOW)
        later = NOW + REFIT
        current = await hang_next_fit(pools, hang, later)
        last_good = current.forecast
        await until("the fit timeout", lambda: pools.series("stuck").fit_timed_out is not None)
        timed_out = await pools.get("stuck", STUCK, later + 1)
        assert (timed_out.healthy, timed_out.reason) == (False, "ForecastTimeout"), timed_out
        assert "not started again until the hung call returns" in timed_out.message
        assert timed_out.forecast is last_good
        assert pools.timeouts(pools.series("stuck").key.fingerprint) == 1
        # Past the retry time the refit is due again, but not started beside the hung call.
        retry = later + REFIT
        await pools.get("stuck", STUCK, retry)
        assert pools.idle()
        assert (await pools.get("stuck", STUCK, retry + 1)).reason == "ForecastTimeout"
        # The call returns at last: its fit is installed, and the pool is healthy again.
        Stalling.release.set()
        await until("the hung fit to return", lambda: pools.series("stuck").fit_timed_out is None)
        assert (pools.fitted_at("stuck") or 0) > NOW  # its fit is installed
        recovered = await pools.get("stuck", STUCK, retry + STEP)
        assert (recovered.reason, recovered.healthy) == ("Fresh", True), recovered

    run(scenario, None)


def start_and_wait(pid_file: str) -> None:
    """In a fit process: start a process of its own (as Prophet starts Stan) and wait."""
    child = subprocess.Popen(["sleep", "3600"])
    Path(pid_file).write_text(str(child.pid))
    child.wait()


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended


def test_a_hung_slot_is_killed_with_the_processes_it_started_and_replaced(
    tmp_path: Path,
) -> None:
    processes = FitProcesses(1)
    pid_file = tmp_path / "child.pid"
    try:
        slot = processes.take()
        future = slot.submit(start_and_wait, str(pid_file))
        deadline = time.monotonic() + DEADLINE
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline, "the fit process did not start its child"
            time.sleep(0.05)
        child = int(pid_file.read_text())
        assert _alive(child)
        processes.give(slot, hung=True)
        with pytest.raises(BrokenProcessPool):
            future.result(timeout=DEADLINE)
        while _alive(child):
            assert time.monotonic() < deadline, "the fit process' child outlived it"
            time.sleep(0.05)
        assert processes.replaced == 1
        fresh = processes.take()
        assert fresh is not slot
        assert fresh.submit(os.getpid).result(timeout=DEADLINE) > 0  # the new slot works
        processes.give(fresh)
    finally:
        processes.shutdown()


def test_a_fit_process_that_dies_costs_its_job_alone_and_later_fits_run() -> None:
    """A fit process ended under its job (as the OOM killer ends one) is replaced when its
    job gives it back: the series keeps its last good forecast and says why, the next job
    (another series' first fit) runs in the new process, and the retry succeeds. Before:
    the broken executor went back on the free list and every later job on it failed with
    ``BrokenProcessPool`` until a restart."""
    processes = FitProcesses(1)

    async def scenario(pools: Pools, hang: dict[str, bool]) -> None:
        good = await fitted_first(pools, "stuck", STUCK, NOW)
        assert (good.reason, good.healthy) == ("Fresh", True), good
        later = NOW + REFIT
        hang["die"] = True
        current = await pools.get("stuck", STUCK, later)
        last_good = current.forecast
        assert last_good is not None
        await until("the fit to fail", lambda: pools.series("stuck").fit_failed is not None)
        hang["die"] = False
        failed = await pools.get("stuck", STUCK, later + 1)
        assert (failed.healthy, failed.reason) == (False, "FitFailed"), failed
        assert "fit process died" in failed.message
        assert failed.forecast is last_good
        assert (processes.replaced, processes.died) == (1, 1)
        registry = pools.hub.metrics.registry
        died = {"reason": "died"}
        assert registry.get_sample_value("prescaler_forecast_fit_failures_total", died) == 1
        # The next job, another series' first fit, runs in the replacement process.
        await pools.get("other", OTHER, later + 1)
        await until(
            "the other series' fit", lambda: pools.idle() and pools.fitted_at("other") is not None
        )
        assert (await pools.get("other", OTHER, later + 2)).reason == "Fresh"
        # The failed series is retried later, and that fit succeeds.
        retry = later + REFIT
        await pools.get("stuck", STUCK, retry)
        await until(
            "the retried fit", lambda: pools.idle() and (pools.fitted_at("stuck") or 0) > later
        )
        recovered = await pools.get("stuck", STUCK, retry + 1)
        assert (recovered.reason, recovered.healthy) == ("Fresh", True), recovered
        assert processes.replaced == 1

    run(scenario, processes)


def _allocate(mib: int) -> int:
    """In a fit process: hold ``mib`` MiB at once, as an oversized fit would."""
    return len(bytearray(mib * 2**20))


def test_a_slot_whose_process_died_is_replaced_whoever_gives_it_back() -> None:
    processes = FitProcesses(1)
    try:
        slot = processes.take()
        with pytest.raises(BrokenProcessPool):
            slot.submit(os._exit, 137).result(timeout=DEADLINE)
        processes.give(slot)  # not hung: it died
        assert (processes.replaced, processes.died) == (1, 1)
        fresh = processes.take()
        assert fresh is not slot
        assert fresh.submit(os.getpid).result(timeout=DEADLINE) > 0
        processes.give(fresh)
        assert processes.replaced == 1  # a healthy slot goes back as it is
    finally:
        processes.shutdown()


def test_a_fit_past_the_memory_limit_fails_alone_and_its_process_lives_on() -> None:
    processes = FitProcesses(1, memory_mib=512)
    try:
        slot = processes.take()
        assert slot.submit(_allocate, 16).result(timeout=DEADLINE) == 16 * 2**20
        with pytest.raises(MemoryError):
            slot.submit(_allocate, 1024).result(timeout=DEADLINE)
        pid = slot.submit(os.getpid).result(timeout=DEADLINE)
        processes.give(slot)
        assert processes.replaced == 0  # the process survived its job's failure
        again = processes.take()
        assert again.submit(os.getpid).result(timeout=DEADLINE) == pid
        processes.give(again)
    finally:
        processes.shutdown()
