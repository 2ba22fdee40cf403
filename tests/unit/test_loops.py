"""Each pool's reconcile loop (``prescaler.controller.loops``) on a virtual clock: the first
tick spread over one interval, later ticks on a sharp grid, the latest value fed used, a
stop ends the loop (at once while it waits, after the tick while one runs), a failing tick
does not end it, and close cancels everything. No real sleeps."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest

from prescaler.controller.loops import Loops, random_spread
from prescaler.kube import KubeError


class VirtualTime:
    """A clock that moves only when the test says so, and a sleep that waits on it."""

    def __init__(self) -> None:
        self.now = 0.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.now + seconds, next(self._seq), future))
        await future

    @property
    def sleeping(self) -> int:
        return sum(1 for *_, f in self._sleepers if not f.done())

    async def settle(self) -> None:
        for _ in range(20):
            await asyncio.sleep(0)

    async def advance(self, until: float) -> None:
        """Wake every sleeper due up to ``until``, in order, letting each run; then stop the
        clock at ``until``."""
        await self.settle()
        while self._sleepers and self._sleepers[0][0] <= until:
            at, _, future = heapq.heappop(self._sleepers)
            self.now = max(self.now, at)
            if not future.done():
                future.set_result(None)
            await self.settle()
        self.now = max(self.now, until)


def _loops(
    vt: VirtualTime,
    tick: Callable[[Any], Awaitable[None]],
    interval: float = 10.0,
    spread: Callable[[float], float] = lambda interval: 0.25 * interval,
    **kwargs: Any,
) -> Loops[Any]:
    return Loops(interval, tick, spread=spread, clock=vt.clock, sleep=vt.sleep, **kwargs)


def run(test: Callable[[VirtualTime], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test(VirtualTime()))


def test_the_first_tick_is_spread_within_one_interval() -> None:
    values = [random_spread(10.0) for _ in range(2000)]
    assert all(0.0 <= v < 10.0 for v in values)
    assert min(values) < 1.0
    assert max(values) > 9.0

    async def scenario(vt: VirtualTime) -> None:
        ticks: dict[str, list[float]] = {}

        async def tick(key: str) -> None:
            ticks.setdefault(key, []).append(vt.now)

        loops = _loops(vt, tick, spread=random_spread)
        for i in range(50):
            loops.feed(f"pool-{i}", f"pool-{i}")
        await vt.advance(10.0)
        firsts = sorted(t[0] for t in ticks.values())
        assert len(firsts) == 50
        assert firsts[-1] < 10.0
        # ... and not in one burst
        assert firsts[-1] - firsts[0] > 5.0
        assert len(set(firsts)) > 40
        await loops.close()

    run(scenario)


def test_ticks_fall_on_a_sharp_grid_that_a_slow_tick_does_not_push() -> None:
    async def scenario(vt: VirtualTime) -> None:
        ticks: list[float] = []
        slow = {2: 3.0, 5: 25.0}  # the 2nd tick takes 3 s, the 5th two and a half intervals

        async def tick(_: Any) -> None:
            ticks.append(vt.now)
            took = slow.get(len(ticks))
            if took:
                await vt.sleep(took)

        loops = _loops(vt, tick)
        loops.feed("pool", "body")
        await vt.advance(2.4)
        assert ticks == []  # spread: 2.5 s
        await vt.advance(100.0)
        # 2.5 + 10k; the slow 5th tick (at 42.5, ends at 67.5) skips 52.5 and 62.5.
        assert ticks == [2.5, 12.5, 22.5, 32.5, 42.5, 72.5, 82.5, 92.5]
        await loops.close()

    run(scenario)


def test_each_tick_gets_the_latest_value_fed() -> None:
    async def scenario(vt: VirtualTime) -> None:
        seen: list[tuple[float, str]] = []

        async def tick(value: str) -> None:
            seen.append((vt.now, value))

        loops = _loops(vt, tick)
        loops.feed("pool", "v1")
        loops.feed("pool", "v2")  # before the first tick: one loop, the newer value
        await vt.advance(5.0)
        loops.feed("pool", "v3")
        loops.feed("other", "o1")
        await vt.advance(12.5)
        assert seen == [(2.5, "v2"), (7.5, "o1"), (12.5, "v3")]  # "other" on its own grid
        assert len(loops) == 2
        await loops.close()

    run(scenario)


def test_a_stop_while_waiting_ends_the_loop_at_once() -> None:
    async def scenario(vt: VirtualTime) -> None:
        seen: list[float] = []

        async def tick(_: Any) -> None:
            seen.append(vt.now)

        loops = _loops(vt, tick)
        loops.feed("pool", "body")
        loops.feed("other", "body")
        await vt.advance(13.0)
        assert seen == [2.5, 2.5, 12.5, 12.5]
        await loops.stop("pool")
        assert "pool" not in loops
        assert "other" in loops
        await vt.advance(40.0)
        assert seen.count(22.5) == 1
        assert seen.count(32.5) == 1
        await loops.stop("pool")  # twice, or a key never fed: nothing to do
        await loops.stop("never")
        await loops.close()

    run(scenario)


def test_a_stop_during_a_tick_lets_it_finish_and_none_follows() -> None:
    async def scenario(vt: VirtualTime) -> None:
        events: list[str] = []

        async def tick(_: Any) -> None:
            events.append("start")
            await vt.sleep(4.0)  # a reconcile in flight
            events.append("end")

        loops = _loops(vt, tick)
        loops.feed("pool", "body")
        await vt.advance(3.0)
        assert events == ["start"]
        stopping = asyncio.create_task(loops.stop("pool"))
        await vt.settle()
        assert not stopping.done()  # waits for the tick in flight
        await vt.advance(7.0)
        await stopping
        assert events == ["start", "end"]
        await vt.advance(100.0)
        assert events == ["start", "end"]
        assert vt.sleeping == 0

    run(scenario)


def test_a_failing_tick_is_logged_and_the_loop_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(vt: VirtualTime) -> None:
        outcomes = iter([KubeError("patch: 409 Conflict", 409), ValueError("a bug"), None, None])
        seen: list[float] = []

        async def tick(_: Any) -> None:
            seen.append(vt.now)
            outcome = next(outcomes)
            if outcome is not None:
                raise outcome

        loops = _loops(vt, tick, name="reconcile of pool", expected=(KubeError,))
        loops.feed("ns/chat", "body")
        await vt.advance(35.0)
        assert seen == [2.5, 12.5, 22.5, 32.5]
        assert "ns/chat" in loops
        await loops.close()

    with caplog.at_level(logging.INFO, logger="prescaler.loops"):
        run(scenario)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in errors] == [
        "reconcile of pool ns/chat failed: patch: 409 Conflict; next try at the next tick",
        "reconcile of pool ns/chat failed; next try at the next tick",
    ]
    assert errors[0].exc_info is None  # an expected error: one line
    assert errors[1].exc_info is not None  # anything else: with its traceback


def test_close_cancels_waiting_and_running_loops_and_ignores_later_feeds() -> None:
    async def scenario(vt: VirtualTime) -> None:
        cancelled: list[str] = []

        async def tick(key: str) -> None:
            try:
                await vt.sleep(1000.0 if key == "busy" else 0.0)
            except asyncio.CancelledError:
                cancelled.append(key)
                raise

        loops = _loops(vt, tick, spread=lambda _: 0.0)
        loops.feed("busy", "busy")
        await vt.advance(0.0)
        loops.feed("idle", "idle")
        await vt.advance(0.5)
        await loops.close()
        assert cancelled == ["busy"]
        assert len(loops) == 0
        loops.feed("late", "late")
        assert len(loops) == 0
        current = asyncio.current_task()
        assert [t for t in asyncio.all_tasks() if t is not current] == []

    run(scenario)


def test_an_interval_must_be_positive() -> None:
    async def tick(_: Any) -> None:
        return None

    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="interval"):
            Loops(bad, tick)


def test_a_tick_can_end_its_own_loop_with_discard() -> None:
    async def scenario(vt: VirtualTime) -> None:
        ticks: list[float] = []

        async def tick(_: Any) -> None:
            ticks.append(vt.now)
            loops.discard("pool")  # e.g. the tick found its pool gone

        loops = _loops(vt, tick)
        loops.feed("pool", "body")
        await vt.advance(50.0)
        assert ticks == [2.5]
        assert "pool" not in loops
        assert vt.sleeping == 0
        loops.discard("pool")  # twice: nothing to do
        await loops.close()

    run(scenario)
