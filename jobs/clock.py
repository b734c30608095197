"""The database's clock: the one every process coordinates by.

Leases, ``run_after``, retry delays, timeouts, rate-limit stamps, schedule
slots and event times are compared between processes that may run on
machines whose clocks differ, so they all come from the database server's
clock. Statements read it themselves (``Dialect.now``:
``statement_timestamp()`` on PostgreSQL). Where Python needs the value (a
schedule's slots, a rate limit's refill, an enqueue's ``run_after``),
``db_now()`` gives it without a round trip: the database's time read with
``SELECT clock_timestamp()`` at most every ``SYNC_SECONDS`` and carried
forward on this process's monotonic clock in between. A reading lags the
database by up to its round trip and never runs ahead, so Python stamps
from it, while what decides that a row is due compares in the statement
(``Dialect.now``, ``DatabaseNow`` for querysets).

A process's own wall clock then serves only its logs. Workers and reapers
still compare it with the database's (``check_skew``) at start and on each
heartbeat: past ``CLOCK_SKEW_WARN_SECONDS`` they warn, and a worker past
``CLOCK_SKEW_MAX_SECONDS`` stops claiming (operation code that reads the
time, certificate checks and log lines still trust the host's clock).

SQLite is one machine: its database clock is this process's.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import connections
from django.db.models.functions import Now
from django.utils import timezone

from jobs.conf import knob

log = logging.getLogger("jobs.clock")

# How long a reading of the database's clock is carried on the monotonic clock.
SYNC_SECONDS = 30.0


@dataclass(frozen=True)
class Reading:
    """One look at the database's clock."""

    db: datetime  # the database's time at ``monotonic``
    monotonic: float  # this process's monotonic clock then (the round trip's end)
    skew: float  # this host's wall clock minus the database's, in seconds (> 0: ahead)
    round_trip: float  # seconds the reading took: the bound on its error, twice over

    def now(self) -> datetime:
        return self.db + timedelta(seconds=time.monotonic() - self.monotonic)


# A skew is logged at most once a minute per process and kind (each heartbeat checks it).
LOG_EVERY_SECONDS = 60.0

_readings: dict[str, Reading] = {}
_logged: dict[str, float] = {}
_lock = threading.Lock()


def _postgres(using: str) -> bool:
    return connections[using].vendor == "postgresql"


def read_clock(using: str = "default") -> Reading:
    """Read the database's clock now (one round trip on PostgreSQL) and keep it for ``db_now``."""
    if not _postgres(using):
        return Reading(timezone.now(), time.monotonic(), 0.0, 0.0)
    connection = connections[using]
    connection.ensure_connection()  # not the connect inside the timed round trip
    with connection.cursor() as cursor:
        wall_before, before = time.time(), time.monotonic()
        cursor.execute("SELECT clock_timestamp()")
        wall_after, after = time.time(), time.monotonic()
        db = cursor.fetchone()[0]
    if db.tzinfo is None:
        db = db.replace(tzinfo=UTC)
    reading = Reading(
        db=db,
        # As if read at the end of the round trip: behind by at most that, never ahead, so
        # a job enqueued for "now" is claimable by the very next statement.
        monotonic=after,
        skew=(wall_before + wall_after) / 2 - db.timestamp(),
        round_trip=after - before,
    )
    with _lock:
        _readings[using] = reading
    return reading


def db_now(using: str = "default") -> datetime:
    """The database server's time now, as an aware datetime (this process's on SQLite)."""
    if not _postgres(using):
        return timezone.now()
    reading = _readings.get(using)
    if reading is None or time.monotonic() - reading.monotonic > SYNC_SECONDS:
        reading = read_clock(using)
    return reading.now()


class DatabaseNow(Now):
    """The database's time inside an ORM statement: ``db_now()`` for querysets.

    A reading lags the database's clock by up to its round trip, so rows the
    database stamped itself (``statement_timestamp()``: a requeue's
    ``run_after``) can look a few milliseconds in the future to ``db_now()``.
    Comparing in the statement sees every such row, and every row stamped
    from a reading, as due. SQLite is one machine: this process's time.
    """

    def as_sqlite(self, compiler, connection, **extra_context):
        return "%s", [connection.ops.adapt_datetimefield_value(timezone.now())]


def skew_limits() -> tuple[float, float]:
    """(warn, max) in seconds; 0 turns either off."""
    return float(knob("CLOCK_SKEW_WARN_SECONDS") or 0), float(knob("CLOCK_SKEW_MAX_SECONDS") or 0)


def _due(kind: str) -> bool:
    now = time.monotonic()
    with _lock:
        last = _logged.get(kind)
        if last is not None and now - last < LOG_EVERY_SECONDS:
            return False
        _logged[kind] = now
        return True


def check_skew(who: str, using: str = "default") -> bool:
    """Compare this host's clock with the database's; log past the bounds.

    Returns False when the skew is past ``CLOCK_SKEW_MAX_SECONDS`` (a worker
    then claims nothing until it is back under), True otherwise.
    """
    reading = read_clock(using)
    warn, limit = skew_limits()
    skew = reading.skew
    if limit and abs(skew) > limit:
        if not _due("max"):
            return False
        log.error(
            "clock.skew who=%s skew=%.3fs max=%gs: this host's clock is %.1f s %s the "
            "database's; claiming stops until it is back within CLOCK_SKEW_MAX_SECONDS "
            "(sync the host with NTP)",
            who,
            skew,
            limit,
            abs(skew),
            "ahead of" if skew > 0 else "behind",
        )
        return False
    if warn and abs(skew) > warn and _due("warn"):
        log.warning(
            "clock.skew who=%s skew=%.3fs warn=%gs: this host's clock is %.1f s %s the "
            "database's; coordination uses the database's clock, but sync the host with NTP",
            who,
            skew,
            warn,
            abs(skew),
            "ahead of" if skew > 0 else "behind",
        )
    return True
