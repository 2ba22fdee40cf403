"""The fit queue: one job per key, earliest due first, bounded, a few at a time, fair."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from prescaler.controller.fits import FairQueue, FitScheduler


def test_earliest_due_first_and_arrival_order_among_equals() -> None:
    q: FairQueue[str] = FairQueue(limit=10)
    for key, due in (("b", 5.0), ("a", 1.0), ("c", 5.0), ("d", 9.0)):
        assert q.push(key, due)
    assert q.pop_ready(now=4.0) == "a"
    assert q.pop_ready(now=4.0) is None  # b and c are not due yet
    assert q.next_due() == 5.0
    assert [q.pop_ready(10.0), q.pop_ready(10.0), q.pop_ready(10.0)] == ["b", "c", "d"]
    assert len(q) == 0


def test_one_job_per_key_which_may_move_earlier_but_never_later() -> None:
    q: FairQueue[str] = FairQueue(limit=10)
    q.push("a", 5.0)
    q.push("b", 6.0)
    q.push("a", 9.0)  # later: keeps its place
    assert q.ahead_of("b") == 1
    q.push("b", 1.0)  # earlier: moves up
    assert len(q) == 2
    assert q.ahead_of("a") == 1
    assert q.pop_ready(10.0) == "b"
    assert q.pop_ready(10.0) == "a"


def test_a_full_queue_refuses_new_keys_but_not_queued_ones() -> None:
    q: FairQueue[str] = FairQueue(limit=2)
    assert q.push("a", 1.0)
    assert q.push("b", 1.0)
    assert not q.push("c", 0.0)
    assert q.push("a", 0.5)
    q.discard("a")
    assert "a" not in q
    assert q.push("c", 2.0)
    assert [q.pop_ready(9.0), q.pop_ready(9.0), q.pop_ready(9.0)] == ["b", "c", None]


def test_scheduler_runs_at_most_workers_jobs_at_once() -> None:
    async def scenario() -> int:
        running, peak = 0, 0
        release = asyncio.Event()

        async def job(key: int) -> None:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            await release.wait()
            running -= 1

        fits = FitScheduler(run=job, workers=2, clock=lambda: 0.0)
        for key in range(6):
            assert fits.submit(key, 0.0)
        for _ in range(20):
            await asyncio.sleep(0)
        assert (fits.running, fits.pending) == (2, 4)
        release.set()
        for _ in range(10_000):
            if not (fits.running or fits.pending):
                break
            await asyncio.sleep(0)
        fits.close()
        return peak

    assert asyncio.run(scenario()) == 2


def test_a_key_that_asks_again_after_each_run_does_not_starve_the_others() -> None:
    async def scenario() -> list[str]:
        order: list[str] = []
        clock = [0.0]

        async def job(key: str) -> None:
            order.append(key)
            clock[0] += 1.0
            await asyncio.sleep(0)

        fits: FitScheduler[str] = FitScheduler(run=job, workers=1, clock=lambda: clock[0])
        fits.submit("greedy", 0.0)
        for key in ("a", "b", "c"):
            fits.submit(key, 0.5)
        for _ in range(10_000):
            if len(order) >= 8:
                break
            if not fits.busy("greedy"):
                fits.submit("greedy", clock[0])  # due again as soon as it ran
            await asyncio.sleep(0)
        fits.close()
        return order

    order = asyncio.run(scenario())
    assert order[:4] == ["greedy", "a", "b", "c"]
    assert order[4:] == ["greedy"] * 4


def test_a_job_waits_for_its_due_time_and_a_failing_job_does_not_stop_the_queue(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> tuple[list[str], list[str]]:
        now = [0.0]  # the scheduler's clock, moved by the test only
        done: list[str] = []

        async def job(key: str) -> None:
            if key == "bad":
                raise RuntimeError("boom")
            done.append(key)

        async def until(condition: Callable[[], bool]) -> None:
            for _ in range(2000):  # generous: a busy machine may be slow to schedule
                if condition():
                    return
                await asyncio.sleep(0.01)

        fits: FitScheduler[str] = FitScheduler(run=job, workers=1, clock=lambda: now[0])
        fits.submit("bad", 0.0)
        fits.submit("later", 0.2)
        await until(lambda: fits.running == 0 and fits.pending == 1)
        before = list(done)  # "bad" has run and failed; "later" is not due yet
        now[0] = 1.0
        await until(lambda: bool(done))
        fits.close()
        return before, done

    before, done = asyncio.run(scenario())
    assert before == []
    assert done == ["later"]
    assert "boom" in caplog.text
