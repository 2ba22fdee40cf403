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
it on the event loop. :class:`FitProcesses` are the processes the jobs fit in: one per
worker, each its own executor, so a fit that hangs is ended by killing its process alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import multiprocessing
import os
import resource
import signal
import time
from collections.abc import Awaitable, Callable, Hashable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
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


ONE_THREAD = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
"""A fit process runs one job at a time: its numeric libraries get one thread each (the
parallelism is the number of processes), which also keeps their address space, and so the
memory limit, independent of the node's core count."""


def start_fit_process(nice: int, memory_bytes: int) -> None:
    """In a new fit process, before its first job: lower its priority and bound its
    address space (``RLIMIT_AS``, inherited by the processes it starts, Stan's among them),
    so an oversized fit fails alone with ``MemoryError`` instead of taking the container."""
    os.nice(nice)
    if memory_bytes > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))


class FitProcesses:
    """The fit processes: ``workers`` slots, each a one-process executor of its own.

    A fit job takes a slot for as long as it runs (:meth:`take`) and gives it back
    (:meth:`give`). A job that ran past its timeout gives it back ``hung``: the slot's
    process is killed together with the processes it started (Prophet's Stan optimizer
    runs in one), and a fresh executor takes the slot. A slot whose process died under its
    job (killed, or ended by the kernel's OOM killer) is broken for good: it is replaced
    the same way when it is given back, whoever gives it. So a fit that never returns holds
    its worker only until its timeout, one that dies costs only its own job, the jobs
    queued behind either run on, and the other slots are not disturbed (one shared pool
    would break as a whole when one of its processes dies).

    Processes start with a slot's first fit (``spawn``: forking a process that runs
    threads is unsafe), at niceness ``nice``: fits are background work and must not slow
    the reconciles down. ``memory_mib`` bounds each process's address space (0: no bound).
    """

    def __init__(self, workers: int, *, nice: int = 0, memory_mib: int = 0) -> None:
        if workers < 1:
            raise ValueError("the fit processes need at least one worker")
        if memory_mib < 0:
            raise ValueError("the fit processes' memory limit must be >= 0")
        self.workers = workers
        self.nice = nice
        self.memory_mib = memory_mib
        self.replaced = 0
        """Slots whose process was killed (hung fits) or died, and replaced."""
        self.died = 0
        """Of those, slots whose process died under its job."""
        self._context = multiprocessing.get_context("spawn")
        for name in ONE_THREAD:  # read by the spawned processes as they start
            os.environ.setdefault(name, "1")
        self._free: list[ProcessPoolExecutor] = [self._new() for _ in range(workers)]
        self._taken: set[ProcessPoolExecutor] = set()
        self._closed = False

    def _new(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            max_workers=1,
            mp_context=self._context,
            initializer=start_fit_process,
            initargs=(self.nice, self.memory_mib * 2**20),
        )

    def take(self) -> ProcessPoolExecutor:
        """A free slot's executor, for one job."""
        if self._closed:
            raise RuntimeError("the fit processes are shut down")
        executor = self._free.pop() if self._free else self._new()
        self._taken.add(executor)
        return executor

    def give(self, executor: ProcessPoolExecutor, *, hung: bool = False) -> None:
        """Give a slot back after its job; ``hung``: kill its processes and replace it. A
        slot whose process died is replaced too (its executor refuses every later job)."""
        self._taken.discard(executor)
        died = not hung and is_broken(executor)
        if hung or died:
            kill_processes(executor)
            self.replaced += 1
            self.died += died
            if died:
                log.warning("a fit process died under its job; its slot has a new process")
            if self._closed:
                return
            executor = self._new()
        if self._closed or len(self._free) >= self.workers:
            executor.shutdown(wait=False, cancel_futures=True)
            return
        self._free.append(executor)

    def shutdown(self) -> None:
        """Stop every slot (a fit running finishes in its process, which then exits)."""
        self._closed = True
        for executor in [*self._free, *self._taken]:
            executor.shutdown(wait=False, cancel_futures=True)
        self._free.clear()
        self._taken.clear()


def fit_failure(exc: BaseException, memory_mib: int) -> tuple[str, str]:
    """Why a job failed in its fit process, as the ``reason`` of the failure counter and a
    sentence for the pool's condition."""
    if isinstance(exc, BrokenProcessPool):
        return "died", (
            "its fit process died (killed, or out of the node's memory) and was replaced"
        )
    if isinstance(exc, MemoryError):
        limit = f" ({memory_mib} MiB)" if memory_mib > 0 else ""
        return "memory", f"it needed more memory than a fit process may use{limit}"
    return "error", f"{type(exc).__name__}: {exc}"


def is_broken(executor: ProcessPoolExecutor) -> bool:
    """Whether a process of the executor died: it then fails every job given to it with
    ``BrokenProcessPool`` (the stdlib's own flag; it has no public one)."""
    return bool(getattr(executor, "_broken", False))


def kill_processes(executor: ProcessPoolExecutor) -> None:
    """Kill (SIGKILL) the executor's processes and every process they started, then shut
    it down: its futures fail with ``BrokenProcessPool``."""
    # The stdlib keeps no public handle on its processes.
    processes = getattr(executor, "_processes", None) or {}
    pids = [p.pid for p in list(processes.values()) if p.pid is not None]
    doomed = [pid for root in pids for pid in (root, *_descendants(root))]
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    if doomed:
        log.warning("killed a hung fit process and what it started: pids %s", doomed)
    executor.shutdown(wait=False, cancel_futures=True)


def _descendants(pid: int) -> list[int]:
    """The processes ``pid`` started, and theirs (Linux ``/proc``; none elsewhere)."""
    children: dict[int, list[int]] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found.extend(kids)
        todo.extend(kids)
    return found
