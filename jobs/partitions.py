"""The events table's partitions on PostgreSQL: made ahead, retired whole.

Opt-in (``manage.py controlplane_partition_events``, ``jobs.event_layout``):
``controlplane_jobevent`` partitioned by RANGE of ``job_id``. Job ids are
UUIDv7 (``jobs.ids.new_job_ids``): they start with the millisecond the
job was made, so one range of ids is one period of job creation, and all
of a job's events share one partition. Hence:

- the unique ``(job_id, seq)`` index holds per partition (the key is in it),
  and the events cursor (``job_id = ? AND seq > ?``) is pruned to one
  partition at plan time;
- dropping a partition is deleting the events of the jobs made in its
  period, which is what age-based retention wants, with no DELETE, no dead
  rows and no vacuum behind it.

Partitioning by ``ts`` would break the unique ``(job_id, seq)`` (the key must
be in every unique index) and make every cursor read probe every partition.

The reaper (``workers.reaper``) calls :func:`ensure_partitions` each pass:
``EVENT_PARTITIONS_AHEAD`` periods of ``EVENT_PARTITION_HOURS`` are kept
made ahead of now. Ids no range covers land in the DEFAULT partition: jobs
made while the reaper was away, ids that are not UUIDv7 (``Job.objects``
default ``uuid4``, old databases), and the events of long-lived jobs whose
period was retired (below). Before a range is attached, its rows are moved
out of DEFAULT, so the reaper catching up never fails on them.

:func:`retire_partitions` drops a partition once its whole period is older
than the retention cutoff, which the reaper takes from the longest retention
in force (``jobs.retention``: by status and by queue, ``Retention.longest``),
so no finished job a retention still keeps loses its events that way; jobs
of a shorter retention are deleted with their events by the reaper's
DELETE before their partition goes. Jobs of that period that retention will not
delete now (not finished before the cutoff, or with children) keep their
events: those rows are copied into DEFAULT in the same transaction, so a job
scheduled weeks ahead or running for days never loses its timeline. The job
rows themselves go by the usual batched DELETE (``delete_finished_jobs``),
which on a partitioned table only takes jobs no attached range covers: their
events are in DEFAULT (few) or already dropped, so it deletes no events in
bulk. A job of the longest retention thus stays up to one partition period
longer than it.

SQLite keeps the plain table: every function here is a no-op there.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import connection, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from jobs.conf import knob
from jobs.tables import EVENT_TABLE, JOB_TABLE

DEFAULT_PARTITION = f"{EVENT_TABLE}_default"
PARTITION_PREFIX = f"{EVENT_TABLE}_p"
TERMINAL = "('succeeded', 'failed', 'cancelled')"
# Serialises partition changes across reapers (a transaction-level advisory lock:
# released at commit, so it is safe behind PgBouncer in transaction mode).
_LOCK_KEY = 0x6A6F6265_76656E74  # "jobevent"
_BOUNDS = re.compile(r"FROM \('([0-9a-f-]{36})'\) TO \('([0-9a-f-]{36})'\)")


@dataclass(frozen=True)
class Partition:
    """One attached range partition: job ids in ``[low, high)``."""

    name: str
    low: uuid.UUID
    high: uuid.UUID

    @property
    def start(self) -> datetime:
        return time_of(self.low)

    @property
    def end(self) -> datetime:
        return time_of(self.high)


@dataclass
class PartitionResult:
    created: int = 0
    dropped: int = 0
    kept_jobs: int = 0  # jobs of dropped periods whose events were moved to DEFAULT
    moved_events: int = 0


def id_at(moment: datetime) -> uuid.UUID:
    """The smallest UUIDv7 of ``moment``'s millisecond: the bound between two periods."""
    ms = int(moment.timestamp() * 1000)
    return uuid.UUID(int=(ms & 0xFFFF_FFFF_FFFF) << 80)


def time_of(job_id: uuid.UUID) -> datetime:
    """The creation millisecond written at the head of a UUIDv7."""
    return datetime.fromtimestamp((job_id.int >> 80) / 1000, UTC)


def period() -> timedelta:
    hours = float(knob("EVENT_PARTITION_HOURS"))
    if hours <= 0:
        raise ValueError("EVENT_PARTITION_HOURS must be a positive number of hours.")
    return timedelta(hours=hours)


def period_start(moment: datetime, span: timedelta) -> datetime:
    """The start of the period holding ``moment`` (periods are aligned on the Unix epoch)."""
    seconds = span.total_seconds()
    return datetime.fromtimestamp(moment.timestamp() // seconds * seconds, UTC)


def is_partitioned(conn: BaseDatabaseWrapper | None = None) -> bool:
    """True on PostgreSQL once ``controlplane_partition_events`` partitioned the events table."""
    conn = conn or connection
    if conn.vendor != "postgresql":
        return False
    with conn.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM pg_class WHERE oid = to_regclass(%s) AND relkind = 'p'", [EVENT_TABLE]
        )
        return cursor.fetchone() is not None


def event_partitions(conn: BaseDatabaseWrapper | None = None) -> list[Partition]:
    """The attached range partitions, oldest first (DEFAULT is not one of them)."""
    conn = conn or connection
    with conn.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(%s)",
            [EVENT_TABLE],
        )
        rows = cursor.fetchall()
    found = []
    for name, bound in rows:
        match = _BOUNDS.search(bound or "")
        if match:
            found.append(Partition(name, uuid.UUID(match[1]), uuid.UUID(match[2])))
    return sorted(found, key=lambda p: p.low)


def covered_ranges(partitions: list[Partition]) -> list[tuple[uuid.UUID, uuid.UUID]]:
    """The attached ranges with touching neighbours merged (usually one range)."""
    merged: list[tuple[uuid.UUID, uuid.UUID]] = []
    for p in partitions:
        if merged and merged[-1][1] == p.low:
            merged[-1] = (merged[-1][0], p.high)
        else:
            merged.append((p.low, p.high))
    return merged


def partition_name(start: datetime) -> str:
    return f"{PARTITION_PREFIX}{start:%Y%m%d_%H%M}"


def ensure_partitions(
    now: datetime, *, ahead: int | None = None, since: datetime | None = None
) -> int:
    """Make the partitions from the current period (or ``since``) to ``ahead`` periods on.

    Starts after the newest attached range, never before the current period
    (the migration passes ``since`` to cover the jobs it found). Rows of a new
    range already in DEFAULT are moved into it first. Returns how many were made.
    """
    if not is_partitioned():
        return 0
    span = period()
    ahead = int(knob("EVENT_PARTITIONS_AHEAD")) if ahead is None else ahead
    existing = event_partitions()
    start = period_start(since or now, span)
    if existing:
        start = max(start, existing[-1].end)
    until = period_start(now, span) + span * (ahead + 1)
    made = 0
    while start < until:
        end = start + span
        attach_partition(start, end)
        made += 1
        start = end
    return made


def attach_partition(start: datetime, end: datetime) -> str:
    """Make the partition of jobs made in ``[start, end)`` and attach it; return its name.

    Its rows already in DEFAULT are moved into it first.

    ATTACH takes only a SHARE UPDATE EXCLUSIVE lock on the events table, so
    event writes go on meanwhile; DEFAULT is locked while it is checked.
    """
    name, low, high = partition_name(start), id_at(start), id_at(end)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK_KEY])
        cursor.execute("SELECT to_regclass(%s)", [name])
        if cursor.fetchone()[0] is not None:
            return name  # another reaper made it meanwhile
        cursor.execute(
            f'CREATE TABLE "{name}" (LIKE {EVENT_TABLE} '
            "INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE)"
        )
        cursor.execute(
            f'WITH moved AS (DELETE FROM "{DEFAULT_PARTITION}" '
            "WHERE job_id >= %s AND job_id < %s RETURNING *) "
            f'INSERT INTO "{name}" SELECT * FROM moved',
            [low, high],
        )
        cursor.execute(
            f'ALTER TABLE {EVENT_TABLE} ATTACH PARTITION "{name}" FOR VALUES FROM (%s) TO (%s)',
            [str(low), str(high)],
        )
    return name


# Jobs of a period whose events must outlive its partition: retention will not
# delete them now (not finished before the cutoff, or parents: leaves go first).
_SURVIVORS = f"""
SELECT j.id FROM {JOB_TABLE} j
WHERE j.id >= %(low)s AND j.id < %(high)s
  AND (j.status NOT IN {TERMINAL} OR j.finished_at IS NULL OR j.finished_at >= %(cutoff)s
       OR EXISTS (SELECT 1 FROM {JOB_TABLE} c WHERE c.parent_id = j.id))
"""


def retire_partitions(
    cutoff: datetime, *, lock_timeout_ms: int = 2000, limit: int = 10
) -> PartitionResult:
    """Drop the partitions whose whole period lies before ``cutoff``, oldest first.

    Each in its own transaction (see :func:`retire_partition`); at most
    ``limit`` per call. A partition whose lock is not granted within
    ``lock_timeout_ms`` is left for the next pass.
    """
    result = PartitionResult()
    if not is_partitioned():
        return result
    for part in event_partitions()[:limit]:
        if part.end > cutoff:
            break
        done = retire_partition(part, cutoff, lock_timeout_ms=lock_timeout_ms)
        if done is None:
            break  # another reaper is at it
        kept, moved = done
        result.dropped += 1
        result.kept_jobs += kept
        result.moved_events += moved
    return result


def retire_partition(
    part: Partition, cutoff: datetime, *, lock_timeout_ms: int
) -> tuple[int, int] | None:
    """Drop one partition, moving the events of its surviving jobs to DEFAULT first.

    The survivors are found without blocking anyone, with the partition's
    newest event id noted. Then, under an ACCESS EXCLUSIVE lock on the events
    table (held for the detach, the copy and the drop only, and waited for at
    most ``lock_timeout_ms``), a changed newest id means a job of the period
    wrote an event meanwhile (every state change does), so the survivors are
    found again. Returns (surviving jobs, events moved), or None when another
    reaper holds the partition lock (it drops the partition itself).
    """
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [_LOCK_KEY])
        if not cursor.fetchone()[0]:
            return None
        cursor.execute(
            "SELECT 1 FROM pg_inherits WHERE inhrelid = to_regclass(%s) "
            "AND inhparent = to_regclass(%s)",
            [part.name, EVENT_TABLE],
        )
        if cursor.fetchone() is None:
            return None  # dropped by another reaper since we listed it
        name = f'"{part.name}"'
        params = {"low": part.low, "high": part.high, "cutoff": cutoff}
        cursor.execute(_SURVIVORS, params)
        survivors = [r[0] for r in cursor.fetchall()]
        cursor.execute(f"SELECT max(id) FROM {name}")
        newest = cursor.fetchone()[0]
        cursor.execute(f"SET LOCAL lock_timeout = {int(lock_timeout_ms)}")
        cursor.execute(f"LOCK TABLE ONLY {EVENT_TABLE} IN ACCESS EXCLUSIVE MODE")
        cursor.execute(f"SELECT max(id) FROM {name}")
        if cursor.fetchone()[0] != newest:
            cursor.execute(_SURVIVORS, params)
            survivors = [r[0] for r in cursor.fetchall()]
        cursor.execute(f"ALTER TABLE {EVENT_TABLE} DETACH PARTITION {name}")
        moved = 0
        if survivors:
            cursor.execute(
                f"INSERT INTO {EVENT_TABLE} OVERRIDING SYSTEM VALUE "
                f"SELECT * FROM {name} WHERE job_id = ANY(%s)",
                [survivors],
            )
            moved = cursor.rowcount
        cursor.execute(f"DROP TABLE {name}")
    return len(survivors), moved
