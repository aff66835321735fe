"""Schedule arithmetic: when the stop/start schedules fire and which hours they leave a stack running.

It owns evaluating the EventBridge cron expressions of `autostop.stop_schedule` and
`autostop.start_schedule` in `autostop.schedule_timezone` the way EventBridge Scheduler
does (daylight saving time included), and turning them, with `max_lifetime_hours`, into
the intervals a stack's node groups run. The cost model prices those hours ("as
scheduled"); `gpucluster spend` compares them with what AWS billed. It is pure: no AWS call,
no Pulumi; the spec has already validated the expressions.

The model, an upper bound (idle and budget stops only ever remove hours):
- no stop schedule and no lifetime: the stack runs all the time (24 x 7);
- no start schedule: nothing restarts a stopped stack on a timetable, and when a person
  resumes it is unknowable, so the estimate stays 24 x 7;
- with a start schedule: a stretch begins at each start that finds the stack stopped and
  ends at the next stop, or `max_lifetime_hours` (plus one lifetime check, 15 minutes)
  after it began; a lifetime stop counts until the next start (the start schedule restarts
  only schedule stops, so someone resumes it: `gpucluster resume`).
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from functools import cache
from zoneinfo import ZoneInfo

from gpucluster.spec import CRON_FIELDS, AutoStopConfig

# components/gpucluster/aws/guardrail_events.py LIFETIME_CHECK_EXPRESSION is rate(15 minutes): a group
# over its lifetime is stopped at the next check, so a stretch may run this much longer.
LIFETIME_CHECK = timedelta(minutes=15)
# How far back to look for the event that set the state at the start of a window: a year holds
# at least one firing of any expression that fires at all (the year field aside).
LOOKBACK = timedelta(days=366)


class ScheduleError(ValueError):
    """A cron expression this module cannot evaluate (the spec's checks normally catch it first)."""


# ------------------------------------------------------------------------ cron


def _value(token: str, names: dict[str, int]) -> int:
    upper = token.upper()
    if upper in names:
        return names[upper]
    if not token.isdigit():
        raise ScheduleError(f"not a number or name: {token!r}")
    return int(token)


def _expand(text: str, lo: int, hi: int, names: dict[str, int], *, wraps: bool = False) -> frozenset[int]:
    """`*`, `5`, `1-5`, `MON-FRI`, `0/15`, `*/2`, `1-5/2` and comma lists -> the values."""
    out: set[int] = set()
    for part in text.split(","):
        base, _, step_text = part.partition("/")
        step = int(step_text) if step_text else 1
        if base in ("*", "?"):
            first, last = lo, hi
        else:
            start, dash, end = base.partition("-")
            first = _value(start, names)
            last = _value(end, names) if dash else (hi if step_text else first)
        if last < first and wraps:  # day-of-week ranges such as FRI-MON wrap round the week
            values = list(range(first, hi + 1)) + list(range(lo, last + 1))
        else:
            values = list(range(first, last + 1))
        out.update(values[::step])
    return frozenset(out)


def _nearest_weekday(day: int, year: int, month: int) -> int:
    """`nW`: the weekday nearest to day n, never leaving the month (EventBridge, "Cron expressions")."""
    last = calendar.monthrange(year, month)[1]
    day = min(day, last)
    weekday = date(year, month, day).weekday()  # Monday 0 .. Sunday 6
    if weekday == 5:
        return day - 1 if day > 1 else day + 2
    if weekday == 6:
        return day + 1 if day < last else day - 2
    return day


@dataclass(frozen=True)
class Cron:
    """One EventBridge cron expression, parsed: `cron(min hour day-of-month month day-of-week year)`."""

    expression: str
    minutes: frozenset[int]
    hours: frozenset[int]
    months: frozenset[int]
    years: frozenset[int]
    day_of_month: str
    day_of_week: str

    def _dom_matches(self, d: date) -> bool:
        text = self.day_of_month
        if text == "?":
            return True
        last = calendar.monthrange(d.year, d.month)[1]
        for part in text.split(","):
            if part == "L":
                if d.day == last:
                    return True
            elif part == "LW":
                if d.day == _nearest_weekday(last, d.year, d.month) and d.weekday() < 5:
                    return True
            elif re.fullmatch(r"\d{1,2}W", part):
                if d.day == _nearest_weekday(int(part[:-1]), d.year, d.month):
                    return True
            elif d.day in _expand(part, 1, 31, {}):
                return True
        return False

    def _dow_matches(self, d: date) -> bool:
        text = self.day_of_week
        if text == "?":
            return True
        names = CRON_FIELDS[4][3]
        sunday_first = (d.weekday() + 1) % 7 + 1  # EventBridge: 1 = SUN .. 7 = SAT
        for part in text.split(","):
            special = re.fullmatch(r"(\w+?)(L|#([1-5]))", part)
            if special and not part.isdigit():
                if _value(special.group(1), names) != sunday_first:
                    continue
                if special.group(2) == "L":
                    if d.day + 7 > calendar.monthrange(d.year, d.month)[1]:
                        return True
                elif (d.day - 1) // 7 + 1 == int(special.group(3)):
                    return True
            elif sunday_first in _expand(part, 1, 7, names, wraps=True):
                return True
        return False

    def matches_day(self, d: date) -> bool:
        return (d.month in self.months and d.year in self.years
                and self._dom_matches(d) and self._dow_matches(d))

    def local_times(self, d: date) -> list[time]:
        """The wall-clock times the expression names on day `d` (none when the day does not match)."""
        if not self.matches_day(d):
            return []
        return [time(h, m) for h in sorted(self.hours) for m in sorted(self.minutes)]


@cache
def parse_cron(expression: str) -> Cron:
    """Parse an EventBridge cron expression (already validated by the spec)."""
    match = re.fullmatch(r"cron\((.*)\)", expression.strip())
    fields = match.group(1).split() if match else []
    if len(fields) != 6:
        raise ScheduleError(f"not an EventBridge cron expression: {expression!r}")
    minutes, hours, _, months, _, years = fields
    return Cron(expression=expression,
                minutes=_expand(minutes, 0, 59, {}), hours=_expand(hours, 0, 23, {}),
                months=_expand(months, 1, 12, CRON_FIELDS[3][3]), years=_expand(years, 1970, 2199, {}),
                day_of_month=fields[2], day_of_week=fields[4])


def resolve_local(naive: datetime, zone: ZoneInfo) -> datetime | None:
    """A wall-clock time in `zone` as UTC, the way EventBridge Scheduler treats DST.

    EventBridge Scheduler user guide, "Schedule types", daylight saving time: when the
    clock springs forward an invocation at a time that does not exist is skipped (None);
    when it falls back the invocation runs once, not twice (the first occurrence, fold 0).
    """
    local = naive.replace(tzinfo=zone, fold=0)
    as_utc = local.astimezone(UTC)
    if as_utc.astimezone(zone).replace(tzinfo=None) != naive:
        return None
    return as_utc


def firings(expression: str, timezone: str, start: datetime, end: datetime) -> list[datetime]:
    """Every time (UTC) the expression fires in [start, end), evaluated in `timezone`."""
    cron, zone = parse_cron(expression), ZoneInfo(timezone)
    first = start.astimezone(zone).date() - timedelta(days=1)
    last = end.astimezone(zone).date() + timedelta(days=1)
    out: list[datetime] = []
    day = first
    while day <= last:
        for wall in cron.local_times(day):
            when = resolve_local(datetime.combine(day, wall), zone)
            if when is not None and start <= when < end:
                out.append(when)
        day += timedelta(days=1)
    return sorted(set(out))


# ---------------------------------------------------------------- running hours


@dataclass(frozen=True)
class Interval:
    """The stack runs from `start` (inclusive) to `end` (exclusive), both UTC."""

    start: datetime
    end: datetime

    @property
    def hours(self) -> float:
        return (self.end - self.start).total_seconds() / 3600


def is_scheduled(a: AutoStopConfig) -> bool:
    """True when the schedules and lifetime bound the hours: a start schedule with a stop or a lifetime."""
    return a.enabled and a.start_schedule is not None and (
        a.stop_schedule is not None or a.max_lifetime_hours is not None)


def running_intervals(a: AutoStopConfig, start: datetime, end: datetime) -> list[Interval]:
    """The intervals in [start, end) the schedules and lifetime leave the stack running (see module doc)."""
    if start.tzinfo is None or end.tzinfo is None:
        raise ValueError("start and end must be timezone-aware")
    if not is_scheduled(a):
        return [Interval(start, end)] if end > start else []
    tz = a.schedule_timezone
    starts = firings(a.start_schedule or "", tz, start - LOOKBACK, end)
    stops = firings(a.stop_schedule, tz, start - LOOKBACK, end) if a.stop_schedule else []
    cap = timedelta(hours=a.max_lifetime_hours) + LIFETIME_CHECK if a.max_lifetime_hours else None
    # A stop and a start in the same minute: the stop first, so the stack runs on (the dearer,
    # budget-safe reading; in AWS the two Lambdas race).
    events = sorted([(t, 0, "stop") for t in stops] + [(t, 1, "start") for t in starts])
    # No event before the window: deployed and running from its start (the lifetime clock too).
    running_since = None if any(t < start for t, _, _ in events) else start
    out: list[Interval] = []
    for when, _, kind in [*events, (end, 0, "stop")]:
        if running_since is not None and cap is not None and running_since + cap < when:
            out.append(Interval(running_since, running_since + cap))  # lifetime stop
            running_since = None
        if kind == "stop" and running_since is not None:
            out.append(Interval(running_since, when))
            running_since = None
        elif kind == "start" and running_since is None:
            running_since = when
    out = [Interval(max(i.start, start), min(i.end, end)) for i in out]
    return [i for i in out if i.end > i.start]


def running_hours(a: AutoStopConfig, start: datetime, end: datetime) -> float:
    return sum(i.hours for i in running_intervals(a, start, end))


def hours_by_day(intervals: Sequence[Interval], days: Iterable[date]) -> dict[date, float]:
    """Running hours on each UTC day (Cost Explorer's days are UTC)."""
    out: dict[date, float] = {}
    for day in days:
        lo = datetime.combine(day, time(), UTC)
        hi = lo + timedelta(days=1)
        out[day] = sum(max(0.0, (min(i.end, hi) - max(i.start, lo)).total_seconds()) / 3600
                       for i in intervals)
    return out


@dataclass(frozen=True)
class ScheduledShare:
    """The share of a reference window the stack runs, and the window."""

    share: float
    start: datetime
    end: datetime
    running_hours: float

    @property
    def window_hours(self) -> float:
        return (self.end - self.start).total_seconds() / 3600


REFERENCE_WEEKS = 52


def scheduled_share(a: AutoStopConfig, year: int) -> ScheduledShare:
    """The share of the 52 weeks from 1 January of `year` (in the schedule's time zone) the stack runs.

    52 whole weeks, so a weekly schedule gives the same share every year, with both
    daylight saving changes inside the window.
    """
    zone = ZoneInfo(a.schedule_timezone)
    start = datetime(year, 1, 1, tzinfo=zone).astimezone(UTC)
    end = (datetime(year, 1, 1, tzinfo=zone) + timedelta(weeks=REFERENCE_WEEKS)).astimezone(UTC)
    hours = running_hours(a, start, end)
    total = (end - start).total_seconds() / 3600
    return ScheduledShare(hours / total if total else 1.0, start, end, hours)
