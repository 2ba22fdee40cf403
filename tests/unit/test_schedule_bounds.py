"""Schedules cannot freeze the operator: a window recurs at most hourly, and what the
planner and the forecaster list of the windows stops at what they use, however many
windows a pool has and however long each occurrence lasts."""

from __future__ import annotations

from datetime import datetime
from itertools import pairwise

import pytest

from prescaler.capacity import CapacityModel, TokenProfile
from prescaler.planning import (
    MIN_RECURRENCE_SECONDS,
    FleetState,
    PlanInputs,
    ScalingPolicy,
    ScheduledWindow,
    event_windows,
    plan,
)
from prescaler.planning._windows import MAX_EVENTS

NOW = 1_800_000_000.0  # 2027-01-15 08:00 UTC
DAY = 86_400.0
CAPACITY = CapacityModel(TokenProfile(600, 400), tokens_per_second=1000)
SCHEDULES = 64  # the CRD's most


def hourly(index: int, duration: float = 31 * DAY, minute: int = 0) -> ScheduledWindow:
    """The densest window the spec admits: every hour, lasting the CRD's longest (so 744
    occurrences of it overlap any moment)."""
    return ScheduledWindow(
        f"w{index}", cron=f"{minute} * * * *", duration_seconds=duration, min_replicas=2
    )


@pytest.mark.parametrize(
    "cron", ["* * * * *", "*/15 * * * *", "0,30 9 * * *", "0-5 * * * *", "*/5 9 * * 1"]
)
def test_a_window_that_fires_more_than_once_an_hour_is_refused(cron: str) -> None:
    with pytest.raises(ValueError, match="more than once an hour"):
        ScheduledWindow("w", cron=cron, duration_seconds=60, min_replicas=1)


@pytest.mark.parametrize("cron", ["0 * * * *", "@hourly", "30 9-17 * * 1-5", "5 */2 * * *"])
def test_a_window_that_fires_at_most_hourly_is_accepted(cron: str) -> None:
    window = ScheduledWindow("w", cron=cron, duration_seconds=60, min_replicas=1)
    starts = [o.start for o in window.occurrences(NOW, NOW + 3 * DAY)]
    assert len(starts) >= 2
    assert min(b - a for a, b in pairwise(starts)) >= MIN_RECURRENCE_SECONDS


@pytest.fixture
def listed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of every occurrence the windows build, as they build it."""
    built: list[str] = []
    original = ScheduledWindow._occurrence

    def counting(self: ScheduledWindow, start, end):  # type: ignore[no-untyped-def]
        built.append(self.name)
        return original(self, start, end)

    monkeypatch.setattr(ScheduledWindow, "_occurrence", counting)
    return built


def test_the_planner_lists_one_occurrence_per_window(listed: list[str]) -> None:
    """64 hourly windows of 31 days each: 744 occurrences of each overlap the moment, and
    more within the standby's horizon. The planner asks each window for its first."""
    windows = tuple(hourly(i) for i in range(SCHEDULES))
    result = plan(
        PlanInputs(
            now=NOW,
            capacity=CAPACITY,
            fleet=FleetState(1, 1),
            policy=ScalingPolicy(min_replicas=1, max_replicas=20, standby_max_replicas=4),
            cold_start_seconds=240,
            forecast=None,
            windows=windows,
        )
    )
    assert result.desired_replicas == 2
    assert len(result.active_windows) == SCHEDULES
    # The window floor and the standby's horizon: at most one each per window.
    assert len(listed) <= 2 * SCHEDULES, len(listed)


def test_the_forecasters_calendar_stops_at_its_budget(listed: list[str]) -> None:
    """Over the longest range a forecaster asks for (90 days of history plus a 7-day
    horizon), 64 hourly windows hold 149,000 occurrences; the calendar lists its budget
    and at most one more per window."""
    windows = [hourly(i, duration=60, minute=i % 60) for i in range(SCHEDULES)]
    events = event_windows(windows, NOW - 90 * DAY, NOW + 7 * DAY)
    assert len(events) == MAX_EVENTS
    assert len(listed) <= MAX_EVENTS + SCHEDULES, len(listed)
    # Shared alike, the newest of each: every window keeps 3 or 4, up to the horizon's end.
    kept = {w.name: sum(e.name == w.name for e in events) for w in windows}
    assert set(kept.values()) <= {MAX_EVENTS // SCHEDULES, MAX_EVENTS // SCHEDULES + 1}
    assert all(e.start >= NOW + 7 * DAY - 4 * 3600 for e in events)


def test_the_calendar_keeps_what_the_full_listing_would() -> None:
    """Walking back from the end keeps exactly the newest occurrences of each window, in
    start order, and every occurrence of a window that has few."""
    rare = ScheduledWindow(
        "nightly", cron="30 2 * * *", duration_seconds=1800, expected_requests_per_second=5.0
    )
    dated = ScheduledWindow(
        "launch",
        start=datetime(2027, 1, 10, 12),
        end=datetime(2027, 1, 10, 14),
        min_replicas=3,
    )
    busy = hourly(0, duration=1800)
    since, until = NOW - 20 * DAY, NOW + DAY
    events = event_windows([busy, rare, dated], since, until)
    assert len(events) == MAX_EVENTS
    for window in (rare, dated):
        mine = [(e.start, e.end) for e in events if e.name == window.name]
        assert mine == [(o.start, o.end) for o in window.occurrences(since, until)]
    every = [o.start for o in busy.occurrences(since, until)]
    kept = [e.start for e in events if e.name == busy.name]
    assert kept == every[len(every) - len(kept) :]
    assert [e.start for e in events] == sorted(e.start for e in events)
