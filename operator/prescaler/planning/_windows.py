"""Scheduled windows: known events that need capacity regardless of the forecast.

A window is either dated (a one-off such as a launch or Black Friday, with a time zone) or
recurring (a cron expression evaluated in a time zone, plus a duration). Each carries a
minimum replica count or an expected load in requests/s, and a pre-warm lead: capacity is
requested ``lead`` before the window starts, so it is ready when the window opens.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import islice, takewhile
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter

from prescaler_forecast import EventWindow

MAX_EVENTS = 200
"""Occurrences handed to the forecaster at most (each becomes regressor rows). The
listing stops there: a window that fires often costs no more than one that fires rarely."""

MIN_RECURRENCE_SECONDS = 3600
"""A recurring window fires at most once an hour: its cron expression names one minute.

A window is a known event the fleet pre-warms for ``lead`` ahead (10 minutes by default)
and keeps until it ends. Occurrences closer than an hour would keep the pre-warmed
capacity up between them for good, which is ``minReplicas`` under another name, and
demand that repeats within the hour is what the forecast's own seasonality and nowcast
follow. The CRD refuses such an expression at ``kubectl apply``; the operator answers
one stored before that rule with ``Invalid``."""


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name!r}") from None


@dataclass(frozen=True, slots=True)
class Occurrence:
    """One concrete occurrence of a window, in unix seconds."""

    name: str
    start: float
    end: float
    lead_seconds: float
    min_replicas: int | None
    expected_requests_per_second: float | None

    @property
    def prewarm_at(self) -> float:
        return self.start - self.lead_seconds


@dataclass(frozen=True, slots=True)
class ScheduledWindow:
    """A dated or recurring window of known demand.

    Exactly one of ``start`` (dated, with ``end``) and ``cron`` (recurring, with
    ``duration_seconds``) is set. Naive datetimes are read in ``timezone``.
    """

    name: str
    lead_seconds: float = 600.0
    min_replicas: int | None = None
    expected_requests_per_second: float | None = None
    timezone: str = "UTC"
    start: datetime | None = None
    end: datetime | None = None
    cron: str | None = None
    duration_seconds: float | None = None

    def __post_init__(self) -> None:
        _zone(self.timezone)
        if self.min_replicas is None and self.expected_requests_per_second is None:
            raise ValueError(f"window {self.name!r} needs minReplicas or an expected load")
        if self.min_replicas is not None and self.min_replicas < 0:
            raise ValueError(f"window {self.name!r}: minReplicas must be >= 0")
        if self.expected_requests_per_second is not None and self.expected_requests_per_second < 0:
            raise ValueError(f"window {self.name!r}: expected load must be >= 0")
        if self.lead_seconds < 0:
            raise ValueError(f"window {self.name!r}: lead must be >= 0")
        if (self.start is None) == (self.cron is None):
            raise ValueError(f"window {self.name!r} needs exactly one of start/end or cron")
        if self.start is not None:
            if self.end is None:
                raise ValueError(f"window {self.name!r} has a start but no end")
            if self._aware(self.end) <= self._aware(self.start):
                raise ValueError(f"window {self.name!r} ends before it starts")
        if self.cron is not None:
            if not croniter.is_valid(self.cron):
                raise ValueError(f"window {self.name!r}: invalid cron expression {self.cron!r}")
            try:
                croniter(self.cron, datetime(2000, 1, 1)).get_next(datetime)
            except CroniterError:
                raise ValueError(
                    f"window {self.name!r}: cron expression {self.cron!r} never fires "
                    "(no such date)"
                ) from None
            if self.duration_seconds is None or self.duration_seconds <= 0:
                raise ValueError(f"window {self.name!r}: a cron window needs a duration > 0")
            minutes = croniter(self.cron).expanded[0]  # ['*'] for every minute
            if len(minutes) != 1 or minutes[0] == "*":
                raise ValueError(
                    f"window {self.name!r}: cron expression {self.cron!r} fires more than "
                    "once an hour; a window recurs at most hourly (name one minute), the "
                    "forecast follows faster patterns"
                )

    def _aware(self, moment: datetime) -> datetime:
        if moment.tzinfo is None:
            return moment.replace(tzinfo=_zone(self.timezone))
        return moment

    def _occurrence(self, start: datetime, end: datetime) -> Occurrence:
        return Occurrence(
            name=self.name,
            start=start.timestamp(),
            end=end.timestamp(),
            lead_seconds=self.lead_seconds,
            min_replicas=self.min_replicas,
            expected_requests_per_second=self.expected_requests_per_second,
        )

    def _upcoming(self, since: float) -> Iterator[Occurrence]:
        """Occurrences that have not ended by ``since``, in start order."""
        if self.start is not None and self.end is not None:
            occurrence = self._occurrence(self._aware(self.start), self._aware(self.end))
            if occurrence.end > since:
                yield occurrence
            return
        assert self.cron is not None
        assert self.duration_seconds is not None
        zone = _zone(self.timezone)
        duration = timedelta(seconds=self.duration_seconds)
        # Start early enough to catch an occurrence that began before `since` and is still on.
        first = datetime.fromtimestamp(since - self.duration_seconds, zone)
        try:
            for start in croniter(self.cron, first, ret_type=datetime):
                occurrence = self._occurrence(start, start + duration)
                if occurrence.end > since:
                    yield occurrence
        except CroniterError:
            return  # no further date matches (e.g. a year field in the past)

    def newest_first(self, since: float, until: float) -> Iterator[Occurrence]:
        """Occurrences overlapping ``[since, until]`` as :meth:`occurrences` lists them, the
        newest first (a cron window walks back from ``until``: nothing is listed twice)."""
        if self.start is not None:
            yield from self.occurrences(since, until)
            return
        assert self.cron is not None
        assert self.duration_seconds is not None
        zone = _zone(self.timezone)
        duration = timedelta(seconds=self.duration_seconds)
        # The latest start whose pre-warm begins by `until` (cron fires on whole minutes).
        last = datetime.fromtimestamp(math.floor(until + self.lead_seconds) + 1, zone)
        try:
            for start in croniter(self.cron, last, ret_type=datetime, is_prev=True):
                occurrence = self._occurrence(start, start + duration)
                if occurrence.end <= since:
                    return  # earlier ones end earlier still
                yield occurrence
        except CroniterError:
            return

    def occurrences(self, since: float, until: float, limit: int | None = None) -> list[Occurrence]:
        """Occurrences whose span ``[start - lead, end)`` overlaps ``[since, until]``, in
        start order; the first ``limit`` only (listing stops there)."""
        found = takewhile(lambda o: o.prewarm_at <= until, self._upcoming(since))
        return list(islice(found, limit))

    def next_occurrence(self, now: float) -> Occurrence | None:
        """The occurrence in progress at ``now``, or the next one to come."""
        return next(self._upcoming(now), None)


def event_windows(
    windows: Sequence[ScheduledWindow], since: float, until: float
) -> list[EventWindow]:
    """Past and future occurrences as Prophet regressors (one regressor per window name), so a
    past Black Friday teaches the next one its lift. The operator and the backtest share it.

    At most :data:`MAX_EVENTS`, in start order. Beyond that, the windows share the budget
    (a rare window keeps all its occurrences) and each keeps its newest: the coming
    occurrences are the ones a forecast needs. The windows are walked back from ``until``
    one occurrence each in turn, so no more than the budget (plus one per window) is ever
    listed, however often a window fires and however long the range.
    """
    walks = [(w.name.replace("-", "_"), w.newest_first(since, until)) for w in windows]
    events: list[EventWindow] = []
    while walks and len(events) < MAX_EVENTS:
        going = []
        for name, walk in walks:
            if len(events) == MAX_EVENTS:
                break
            occurrence = next(walk, None)
            if occurrence is not None:
                events.append(EventWindow(start=occurrence.start, end=occurrence.end, name=name))
                going.append((name, walk))
        walks = going
    return sorted(events, key=lambda e: (e.start, e.name))
