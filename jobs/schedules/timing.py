"""When a schedule fires: cron expressions, fixed intervals, time zones and DST.

A schedule fires either on a cron expression (5 fields, or 6 with a leading
seconds field: ``*/10 * * * * *``), read as wall-clock time in its IANA time
zone, or every ``every_seconds`` seconds of real time. Intervals are aligned
to the Unix epoch (``every_seconds=60`` fires on whole UTC minutes), so every
process computes the same fire times without talking to the others.

The DST rule (the same in docs/schedules.md). A cron expression names wall-clock
times; each one fires at most once, at one instant:

- A time that does not exist (02:30 on a spring-forward day, when clocks jump
  from 02:00 to 03:00) fires once, at the first instant after the gap
  (03:00 local). Several skipped times land on that same instant and fire
  once together: ``*/15 * * * *`` fires at 01:45, 03:00, 03:15.
- A time that happens twice (01:30 on a fall-back day) fires once, at its
  first occurrence. During the repeated hour nothing fires a second time, so
  ``*/15 * * * *`` is quiet for that hour; use ``every_seconds`` for work that
  must run at a fixed pace through DST changes.

cronsim (the parser, Debian cron's semantics) handles DST itself when given
aware datetimes, but in Debian's way: expressions that fire more often than
hourly run in both passes of a repeated hour. So it is given naive wall-clock
times only, and ``wall_to_instant`` applies the rule above.
"""

from __future__ import annotations

import functools
import math
import zoneinfo
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from cronsim import CronSim, CronSimError

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MIN_EVERY_SECONDS = 1.0
MAX_EVERY_SECONDS = 366 * 86400.0
MAX_CRON_LENGTH = 200
# Cron candidates looked at for one answer: a seconds-field expression
# crosses a one-hour DST gap or repeated hour in 3,600 of them.
SCAN_LIMIT = 20_000
_MICROSECOND = timedelta(microseconds=1)


class TimingError(ValueError):
    """A cron expression, interval or time zone that cannot be used; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


@functools.cache
def _zone_names() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def zone(name: Any) -> zoneinfo.ZoneInfo:
    """The IANA time zone ``name`` (``Europe/Berlin``, ``UTC``); ``TimingError`` if unknown.

    Only names in the installed tz database are accepted, so a path such as
    ``../../etc/passwd`` never reaches the file system.
    """
    if not isinstance(name, str) or not name:
        raise TimingError("timezone", "The time zone must be an IANA name such as 'Europe/Berlin'.")
    if name not in _zone_names():
        shown = name[:64].encode("utf-8", "backslashreplace").decode()
        raise TimingError(
            "timezone", f"Unknown time zone {shown!r}; use an IANA name such as 'Europe/Berlin'."
        )
    return zoneinfo.ZoneInfo(name)


def normalise_cron(expression: Any) -> str:
    """``expression`` checked and tidied (single spaces, upper case); ``TimingError`` if unusable.

    Five fields (minute hour day-of-month month day-of-week), or six with the
    seconds first. An expression that never matches within cronsim's 50-year
    horizon is refused too.
    """
    if not isinstance(expression, str) or not expression.strip():
        raise TimingError("cron", "The cron expression must be a non-empty string.")
    if len(expression) > MAX_CRON_LENGTH:
        raise TimingError(
            "cron", f"The cron expression is longer than {MAX_CRON_LENGTH} characters."
        )
    fields = expression.split()
    if len(fields) not in (5, 6):
        raise TimingError(
            "cron",
            f"A cron expression has 5 fields (minute hour day month weekday), or 6 with "
            f"seconds first; this one has {len(fields)}.",
        )
    text = " ".join(fields).upper()
    try:
        it = CronSim(text, datetime(2000, 1, 1))
        next(it)
    except CronSimError as error:
        raise TimingError("cron", f"The cron expression is invalid: {error}.") from None
    except StopIteration:
        raise TimingError("cron", "The cron expression never matches a date.") from None
    except (ValueError, OverflowError, IndexError, KeyError) as error:  # odd input cronsim missed
        raise TimingError("cron", f"The cron expression is invalid ({error}).") from None
    return text


def check_every_seconds(value: Any) -> float:
    """``value`` as an interval in seconds, from 1 s to 366 days; ``TimingError`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TimingError("every_seconds", "every_seconds must be a number of seconds.")
    if not MIN_EVERY_SECONDS <= value <= MAX_EVERY_SECONDS:
        raise TimingError(
            "every_seconds",
            f"every_seconds must be from {MIN_EVERY_SECONDS:g} to {MAX_EVERY_SECONDS:g} "
            "(366 days).",
        )
    return float(value)


def wall_to_instant(wall: datetime, tz: zoneinfo.ZoneInfo) -> datetime:
    """The instant (UTC) at which the naive wall-clock time ``wall`` in ``tz`` fires.

    The DST rule of this module: a repeated time fires at its first
    occurrence, a skipped time at the first instant after the gap.
    """
    first = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    second = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    if first <= second:  # the same instant, or a repeated time (fold=0 is the earlier one)
        return first
    # In a gap, fold=0 reads the time with the offset before the jump and fold=1
    # with the one after, so the jump lies between ``second`` and ``first``:
    # find the first whole second that has the new offset.
    after_jump = wall.replace(tzinfo=tz, fold=1).utcoffset()
    low, high = math.floor(second.timestamp()), math.ceil(first.timestamp())
    while high - low > 1:
        middle = (low + high) // 2
        if datetime.fromtimestamp(middle, tz).utcoffset() == after_jump:
            high = middle
        else:
            low = middle
    return datetime.fromtimestamp(high, UTC)


def _micros(instant: datetime) -> int:
    return (instant - EPOCH) // _MICROSECOND


@dataclass(frozen=True)
class Timing:
    """A schedule's timing: exactly one of ``cron`` and ``every_seconds``, and a time zone.

    Built from checked values (``normalise_cron``, ``check_every_seconds``,
    ``zone``); every instant in and out is timezone-aware, results in UTC.
    """

    cron: str = ""
    every_seconds: float | None = None
    timezone: str = "UTC"

    @classmethod
    def of(cls, schedule: Any) -> Timing:
        """The timing of a ``Schedule`` row (or anything with the same attributes)."""
        return cls(schedule.cron or "", schedule.every_seconds, schedule.timezone or "UTC")

    @property
    def _step(self) -> int:
        return max(1, round(float(self.every_seconds or 0) * 1_000_000))

    def next_after(self, after: datetime) -> datetime | None:
        """The first fire time strictly after ``after``; None if the cron never fires again."""
        if not self.cron:
            step = self._step
            return EPOCH + timedelta(microseconds=(_micros(after) // step + 1) * step)
        tz = zone(self.timezone)
        for instant in self._forward(tz, after.astimezone(tz).replace(tzinfo=None)):
            if instant > after:
                return instant
        return None

    def slots(self, start: datetime, end: datetime, *, newest: int) -> list[datetime]:
        """The newest ``newest`` fire times in [``start``, ``end``], oldest first."""
        if newest < 1 or end < start:
            return []
        if not self.cron:
            step = self._step
            high = _micros(end) // step
            low = max(-(-_micros(start) // step), high - newest + 1)
            return [EPOCH + timedelta(microseconds=k * step) for k in range(low, high + 1)]
        tz = zone(self.timezone)
        found: list[datetime] = []
        wall_end = end.astimezone(tz).replace(tzinfo=None) + _MICROSECOND
        for instant in self._walk(CronSim(self.cron, wall_end, reverse=True), tz):
            if instant > end:
                continue
            if instant < start:
                break
            if not found or found[-1] != instant:  # skipped times share the instant after the gap
                found.append(instant)
                if len(found) >= newest:
                    break
        return found[::-1]

    def _forward(self, tz: zoneinfo.ZoneInfo, wall: datetime) -> Iterator[datetime]:
        return self._walk(CronSim(self.cron, wall), tz)

    @staticmethod
    def _walk(it: CronSim, tz: zoneinfo.ZoneInfo) -> Iterator[datetime]:
        for _ in range(SCAN_LIMIT):
            try:
                wall = next(it)
            except StopIteration:
                return
            yield wall_to_instant(wall, tz)
