"""A job's execution log: what its operation logged and printed while it ran.

Log records live on the job's timeline as events (``job.log``), numbered by
the same gap-free ``seq`` as every other event, so the one cursor that pages a
timeline (``GET /jobs/<id>/events?after=N``) pages them too, a reader sees
them in order with the transitions around them, and retention, partitions
and the dashboard's timeline need nothing new. Each record is one event:
``level`` (``info``, ``warning``, ``error``), ``message`` (one line, or one
logging record with its traceback), ``fields`` ``{"logger", "levelname",
"source"}`` where ``source`` is ``logging``, ``stdout`` or ``stderr``.

What one job may store is bounded (``JobLogBudget``): at most
``JOB_LOG_MAX_RECORDS`` records and ``JOB_LOG_MAX_BYTES`` bytes of messages,
each message cut at ``JOB_LOG_MAX_MESSAGE_CHARS``. Past a bound the records
are counted, not stored, and one ``job.log_truncated`` event says how many
records and bytes were dropped. Local workers (``workers.log_capture``) and
the remote-worker endpoint (``POST /jobs/<id>/logs``) keep the same bounds.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from django.db import connection, transaction

from jobs.conf import knob
from jobs.dialect import dialect
from jobs.events import JOB_LOG, JOB_LOG_TRUNCATED, LOG_EVENTS
from jobs.exceptions import JobCancelled, JobNotFound, LeaseLost
from jobs.models import Job, JobEvent
from jobs.storable import printable
from jobs.tables import EVENT_TABLE
from jobs.transitions import RunEvent, append_run_events

# Where a record came from (its ``fields["source"]``).
SOURCE_LOGGING = "logging"
SOURCE_STDOUT = "stdout"
SOURCE_STDERR = "stderr"
SOURCE_REMOTE = "remote"


def event_level(levelno: int) -> str:
    """A logging level as a timeline level: ``error`` from ERROR, ``warning`` from WARNING."""
    if levelno >= logging.ERROR:
        return "error"
    if levelno >= logging.WARNING:
        return "warning"
    return "info"


@dataclass(frozen=True)
class LogLimits:
    """The bounds of one job's log, read from the knobs once per run (``current``)."""

    max_records: int = 10_000
    max_bytes: int = 1_000_000
    max_message_chars: int = 2_000

    @classmethod
    def current(cls) -> LogLimits:
        return cls(
            max_records=int(knob("JOB_LOG_MAX_RECORDS")),
            max_bytes=int(knob("JOB_LOG_MAX_BYTES")),
            max_message_chars=int(knob("JOB_LOG_MAX_MESSAGE_CHARS")),
        )


@dataclass(frozen=True)
class LogRecord:
    """One record as stored: ``age`` is seconds between the record and its write
    (the event's ``ts`` is the database's time less the age, ``jobs.clock``)."""

    level: str
    message: str
    logger: str
    levelname: str
    source: str
    age: float = 0.0

    def fields(self) -> dict[str, str]:
        return {"logger": self.logger, "levelname": self.levelname, "source": self.source}


def stored_message(text: str, limits: LogLimits) -> str:
    """``text`` as a log event's message: storable (NUL and lone surrogates replaced)
    and, past the per-record cap, its head and its tail around a visible marker (a
    traceback's last line says what was raised)."""
    text = printable(text)
    cap = limits.max_message_chars
    if cap <= 0 or len(text) <= cap:
        return text
    tail = cap // 4
    return (
        f"{text[: cap - tail]}… [truncated: {len(text) - cap} of {len(text)} characters "
        f"not stored] …{text[len(text) - tail :] if tail else ''}"
    )


class JobLogBudget:
    """What is left of one job's log bounds; counts what it refuses.

    ``take`` answers whether a message of ``size`` bytes may still be stored.
    Not thread-safe by itself: its owner holds a lock around it.
    """

    __slots__ = ("limits", "records", "bytes", "dropped_records", "dropped_bytes")

    def __init__(self, limits: LogLimits, *, records: int = 0, size: int = 0) -> None:
        self.limits = limits
        self.records = records
        self.bytes = size
        self.dropped_records = 0
        self.dropped_bytes = 0

    def take(self, size: int) -> bool:
        limits = self.limits
        if (
            self.dropped_records
            or self.records >= limits.max_records
            or self.bytes + size > limits.max_bytes
        ):
            # Once a record is dropped every later one is too: the log keeps its
            # head whole rather than a head with holes.
            self.dropped_records += 1
            self.dropped_bytes += size
            return False
        self.records += 1
        self.bytes += size
        return True

    @property
    def truncated(self) -> bool:
        return self.dropped_records > 0


def truncated_marker(dropped_records: int, dropped_bytes: int, limits: LogLimits) -> LogRecord:
    """The one ``job.log_truncated`` record: written once per job, after the kept records."""
    return LogRecord(
        level="warning",
        message=(
            f"Log truncated: {dropped_records} records ({dropped_bytes} bytes) were not stored; "
            f"a job keeps at most {limits.max_records} records and {limits.max_bytes} bytes "
            "(JOB_LOG_MAX_RECORDS, JOB_LOG_MAX_BYTES)."
        ),
        logger="",
        levelname="WARNING",
        source="",
    )


def marker_fields(dropped_records: int, dropped_bytes: int, limits: LogLimits) -> dict[str, int]:
    return {
        "dropped_records": dropped_records,
        "dropped_bytes": dropped_bytes,
        "max_records": limits.max_records,
        "max_bytes": limits.max_bytes,
    }


# --- reads ----------------------------------------------------------------------------


def job_log_page(
    job_id: uuid.UUID, *, after: int = 0, limit: int = 100
) -> tuple[int, list[JobEvent]] | None:
    """A job's log events (``LOG_EVENTS``) with ``seq > after``, ascending, at most
    ``limit``, and the cursor to resume from; None when no such job.

    The cursor is a seq of the timeline, as ``GET /jobs/<id>/events``' is: the
    last event's when the page is full, else the job's last seq read before
    the events (every event up to it is committed, so nothing is skipped).
    """
    last_seq = Job.objects.filter(pk=job_id).values_list("last_event_seq", flat=True).first()
    if last_seq is None:
        return None
    events = list(
        JobEvent.objects.filter(
            job_id=job_id, seq__gt=after, seq__lte=last_seq, event__in=LOG_EVENTS
        ).order_by("seq")[:limit]
    )
    return (events[-1].seq if len(events) == limit else last_seq), events


# --- writes from remote workers ---------------------------------------------------------


@dataclass(frozen=True)
class Appended:
    """What ``append_logs`` did with a batch: records stored, dropped, and whether the
    job's log is truncated (a client stops sending then)."""

    stored: int
    dropped: int
    truncated: bool


# What a log already holds, counted on the server: records, bytes, whether it was cut.
_LOG_STATS = (
    "SELECT count(*), coalesce(sum({size}), 0), "
    "coalesce(max(CASE WHEN event = %s THEN 1 ELSE 0 END), 0) "
    "FROM {events} WHERE job_id = %s AND event IN (%s, %s)"
)


def append_logs(
    job_id: uuid.UUID,
    *,
    lease_token: uuid.UUID,
    records: Sequence[LogRecord],
    dropped_records: int = 0,
    dropped_bytes: int = 0,
) -> Appended:
    """Append a held job's records within its bounds (a remote worker's batch).

    The job row is locked first, so two batches of one job count its log one
    after the other. The ``job.log_truncated`` marker is written once, with
    the first batch that goes past a bound (or reports drops of its own);
    later drops are counted in the answer only. ``LeaseLost`` or
    ``JobCancelled`` when the job is no longer held with ``lease_token``.
    """
    limits = LogLimits.current()
    d = dialect("default")
    size = "octet_length(message)" if d.postgres else "length(CAST(message AS BLOB))"
    with transaction.atomic():
        held = (
            Job.objects.select_for_update()
            .filter(pk=job_id)
            .values_list("status", "lease_token")
            .first()
        )
        if held is None:
            raise JobNotFound(job_id)
        status, token = held
        if status == "cancelled":
            raise JobCancelled(job_id)
        if status != "running" or token != lease_token:
            raise LeaseLost(job_id, status)
        with connection.cursor() as cursor:
            cursor.execute(
                _LOG_STATS.format(size=size, events=EVENT_TABLE),
                [JOB_LOG_TRUNCATED, d.uuid(job_id), JOB_LOG, JOB_LOG_TRUNCATED],
            )
            count, stored_bytes, marked = cursor.fetchone()
        budget = JobLogBudget(limits, records=count - marked, size=int(stored_bytes))
        if marked:
            budget.dropped_records = 1  # cut already: nothing more is stored
        run_events = []
        for record in records:
            message = stored_message(record.message, limits)
            if budget.take(len(message.encode())):
                run_events.append(
                    RunEvent(JOB_LOG, record.level, message, record.fields(), record.age)
                )
        dropped = len(records) - len(run_events)
        if not marked and (dropped or dropped_records):
            total = (dropped + dropped_records, budget.dropped_bytes + dropped_bytes)
            marker = truncated_marker(*total, limits)
            run_events.append(
                RunEvent(
                    JOB_LOG_TRUNCATED, marker.level, marker.message, marker_fields(*total, limits)
                )
            )
        append_run_events(job_id, run_events, lease_token=lease_token)
    return Appended(
        stored=len(run_events) - (1 if not marked and (dropped or dropped_records) else 0),
        dropped=dropped,
        truncated=bool(marked or dropped or dropped_records),
    )
