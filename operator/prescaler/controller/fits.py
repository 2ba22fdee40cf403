"""The fit queue: expensive forecast steps (auto-selection, Prophet fits) off the reconcile path.

A reconcile never waits for a fit. It asks for one (:meth:`FitScheduler.submit`) and plans
with what the forecast hub has meanwhile. The queue:

* holds **at most one job per key** (a shared demand series): asking again while it is
  queued or running does not add a job;
* serves the **earliest due job first** (ties in arrival order). A key is queued again only
  after its job ran, so keys take turns and a busy one cannot starve the others;
* is **bounded** (``limit``): when it is full a submit is refused, and the caller retries
  on a later reconcile and reports the forecast as stale meanwhile;
* runs at most ``workers`` jobs at a time, and none before its due time, which lets a
  restarted operator spread its first fits instead of stampeding.

:class:`FairQueue` is the pure ordering (no asyncio, no clock); :class:`FitScheduler` runs
it on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

log = logging.getLogger("prescaler")


@dataclass
class FairQueue(Generic[K]):
    """Pending jobs, one per key, earliest due first; at most ``limit`` of them."""

    limit: int
    _heap: list[tuple[float, int, K]] = field(default_factory=list)
    _entries: dict[K, tuple[float, int]] = field(default_factory=dict)
    _seq: itertools.count[int] = field(default_factory=itertools.count)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def push(self, key: K, due_at: float) -> bool:
        """Queue ``key`` to run at ``due_at``. A key already queued keeps its place (or
        moves earlier); ``False`` when the queue is full."""
        old = self._entries.get(key)
        if old is not None:
            if due_at < old[0]:
                self._add(key, due_at, old[1])
            return True
        if len(self._entries) >= self.limit:
            return False
        self._add(key, due_at, next(self._seq))
        return True

    def _add(self, key: K, due_at: float, seq: int) -> None:
        self._entries[key] = (due_at, seq)
        heapq.heappush(self._heap, (due_at, seq, key))

    def _top(self) -> tuple[float, int, K] | None:
        while self._heap:
            due_at, seq, key = self._heap[0]
            if self._entries.get(key) == (due_at, seq):
                return self._heap[0]
            heapq.heappop(self._heap)  # superseded or discarded
        return None

    def next_due(self) -> float | None:
        """When the earliest job is due (``None``: the queue is empty)."""
        top = self._top()
        return None if top is None else top[0]

    def pop_ready(self, now: float) -> K | None:
        """Take the earliest job due by ``now``, or ``None``."""
        top = self._top()
        if top is None or top[0] > now:
            return None
        heapq.heappop(self._heap)
        del self._entries[top[2]]
        return top[2]

    def discard(self, key: K) -> None:
        self._entries.pop(key, None)

    def ahead_of(self, key: K) -> int | None:
        """How many queued jobs run before ``key`` (``None``: not queued)."""
        mine = self._entries.get(key)
        if mine is None:
            return None
        return sum(1 for entry in self._entries.values() if entry < mine)

    def due_at(self, key: K) -> float | None:
        entry = self._entries.get(key)
        return None if entry is None else entry[0]


@dataclass
class FitScheduler(Generic[K]):
    """Runs queued jobs on the event loop, ``workers`` at a time, earliest due first."""

    run: Callable[[K], Awaitable[None]]
    """The job of a key (it reads whatever it needs when it starts)."""
    workers: int = 1
    limit: int = 4096
    clock: Callable[[], float] = time.time
    on_start: Callable[[K, float], None] | None = None
    """Called as a job starts with how long it waited past its due time (seconds)."""
    _queue: FairQueue[K] = field(init=False)
    _running: dict[K, asyncio.Task[None]] = field(default_factory=dict)
    _wake: asyncio.Event | None = None
    _loop_task: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        if self.workers < 1 or self.limit < 1:
            raise ValueError("the fit queue needs at least one worker and one slot")
        self._queue = FairQueue(self.limit)

    # ------------------------------------------------------------------ queries
    @property
    def pending(self) -> int:
        """Jobs queued, not yet started."""
        return len(self._queue)

    @property
    def running(self) -> int:
        return len(self._running)

    def busy(self, key: K) -> bool:
        """Whether ``key`` has a job queued or running."""
        return key in self._queue or key in self._running

    def is_running(self, key: K) -> bool:
        return key in self._running

    def ahead_of(self, key: K) -> int | None:
        """Queued jobs that start before ``key``'s (``None``: not queued)."""
        return self._queue.ahead_of(key)

    # ------------------------------------------------------------------ changes
    def submit(self, key: K, due_at: float) -> bool:
        """Queue a job for ``key`` due at ``due_at`` (a no-op while one is queued or
        running). ``False`` when the queue is full."""
        if key in self._running:
            return True
        if not self._queue.push(key, due_at):
            return False
        self._poke()
        return True

    def discard(self, key: K) -> None:
        """Forget a queued job (a running one finishes; its result is the caller's to drop)."""
        self._queue.discard(key)

    def close(self) -> None:
        """Stop dispatching and cancel running jobs."""
        for task in [*self._running.values(), self._loop_task]:
            if task is not None:
                task.cancel()
        self._running.clear()
        self._loop_task = None

    # ------------------------------------------------------------------ loop
    def _poke(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._wake = asyncio.Event()
            self._loop_task = asyncio.get_running_loop().create_task(
                self._dispatch(), name="prescaler-fit-queue"
            )
        elif self._wake is not None:
            self._wake.set()

    async def _dispatch(self) -> None:
        assert self._wake is not None
        while True:
            now = self.clock()
            while len(self._running) < self.workers:
                due = self._queue.next_due()
                key = self._queue.pop_ready(now)
                if key is None:
                    break
                if self.on_start is not None and due is not None:
                    self.on_start(key, max(0.0, now - due))
                self._running[key] = asyncio.get_running_loop().create_task(self._one(key))
            timeout: float | None = None
            due = self._queue.next_due()
            if due is not None and len(self._running) < self.workers:
                timeout = max(0.01, due - now)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    async def _one(self, key: K) -> None:
        try:
            await self.run(key)
        except Exception:  # a boundary: one bad job never stops the queue
            log.exception("forecast job for %s failed", key)
        finally:
            self._running.pop(key, None)
            if self._wake is not None:
                self._wake.set()
