"""Each pool's reconcile loop: one asyncio task per key, fed by the pool watch.

kopf's own timers need a finalizer on every object they serve (kopf hard-codes it), so a
pool, or its namespace, could not be deleted while no operator ran. These loops need none:
the watch that feeds them (``controller.watch``) writes nothing to the object.

A loop's first tick comes after a random delay in ``[0, interval)``, so N pools do not fire
in one burst; later ticks fall on that pool's interval grid, so a slow tick does not push
the next ones later (ticks missed meanwhile are skipped, not run back to back). Each tick
gets the latest value fed for its key. A tick that raises is logged and the loop goes on.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

log = logging.getLogger("prescaler.loops")


def random_spread(interval: float) -> float:
    """A delay in ``[0, interval)``."""
    return random.random() * interval


@dataclass
class _Loop(Generic[T]):
    value: T
    task: asyncio.Task[None] | None = None
    ticking: bool = False
    stopped: bool = False
    first_within: float | None = None


class Loops(Generic[T]):
    """Periodic ticks per key: :meth:`feed` starts a key's loop or updates the value its next
    tick gets, :meth:`stop` ends it, :meth:`close` ends them all.

    ``expected`` errors are logged in one line, anything else with its traceback; either way
    the loop ticks again on its grid. ``clock``, ``sleep`` and ``spread`` are injectable for
    tests (``clock`` must be monotonic, in seconds).
    """

    def __init__(
        self,
        interval: float,
        tick: Callable[[T], Awaitable[None]],
        *,
        name: str = "loop",
        expected: tuple[type[Exception], ...] = (),
        spread: Callable[[float], float] = random_spread,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        logger: logging.Logger = log,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be > 0, not {interval!r}")
        self.interval = interval
        self._tick = tick
        self._name = name
        self._expected = expected
        self._spread = spread
        self._clock = clock
        self._sleep = sleep
        self._log = logger
        self._loops: dict[str, _Loop[T]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    def __contains__(self, key: object) -> bool:
        return key in self._loops

    def __len__(self) -> int:
        return len(self._loops)

    def feed(self, key: str, value: T, within: float | None = None) -> None:
        """Keep ``value`` for ``key``'s next tick; start the key's loop if none runs, its
        first tick within ``within`` seconds if given (else within the interval).
        Ignored once :meth:`close` was called."""
        if self._closed:
            return
        loop = self._loops.get(key)
        if loop is not None:
            loop.value = value
            return
        loop = _Loop(value, first_within=within)
        self._loops[key] = loop
        task = asyncio.create_task(self._run(key, loop), name=f"{self._name} {key}")
        loop.task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self, key: str) -> None:
        """End ``key``'s loop (no-op if it has none): at once while it waits for its next
        tick, after the tick while one runs. Returns when the loop has ended."""
        loop = self._loops.get(key)
        self.discard(key)
        if loop is not None and loop.task is not None:
            await asyncio.wait([loop.task])

    async def close(self) -> None:
        """Cancel every loop, running ticks included, and wait for them to end; later
        :meth:`feed` calls are ignored."""
        self._closed = True
        for loop in self._loops.values():
            loop.stopped = True
        self._loops.clear()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    def items(self) -> list[tuple[str, T]]:
        """Every running loop's key and latest value."""
        return [(key, loop.value) for key, loop in self._loops.items()]

    def discard(self, key: str) -> None:
        """End ``key``'s loop without waiting (no-op if it has none): at once while it
        waits, after its tick while one runs, so a tick may end its own loop."""
        loop = self._loops.pop(key, None)
        if loop is None or loop.task is None:
            return
        loop.stopped = True
        if not loop.ticking:
            loop.task.cancel()

    def next_due(self, start: float, now: float) -> float:
        """The first grid point ``start + k * interval`` strictly after ``now``."""
        periods = max(0, math.floor((now - start) / self.interval) + 1)
        return start + periods * self.interval

    async def _run(self, key: str, loop: _Loop[T]) -> None:
        first = self.interval if loop.first_within is None else loop.first_within
        start = self._clock() + (self._spread(first) if first > 0 else 0.0)
        due = start
        while True:
            delay = due - self._clock()
            if delay > 0:
                await self._sleep(delay)  # stop() cancels a loop here
            loop.ticking = True
            try:
                await self._tick(loop.value)
            except self._expected as exc:
                self._log.error("%s %s failed: %s; next try at the next tick", self._name, key, exc)
            except Exception:
                self._log.exception("%s %s failed; next try at the next tick", self._name, key)
            finally:
                loop.ticking = False
            if loop.stopped:
                return
            due = self.next_due(start, self._clock())
