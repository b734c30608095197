"""Opt-in on PostgreSQL: the events table partitioned by RANGE of ``job_id``, or plain again.

``manage.py controlplane_partition_events`` (``--undo`` to go back) calls
``rebuild_event_table``. Partitioning is not the default: measured here, a
drain through the partitioned parent ran about 23% slower at the same CPU;
what it buys is retention by ``DROP`` (a fraction of the WAL, a table that
shrinks), which pays at a history of many millions of events
(bench/README.md, "Event history at scale"). Why by job id and not by time:
see ``jobs.partitions``.

Neither layout has a foreign key from the events to the jobs (migration
0019): events are written only under the job row's lock, and every path
that deletes jobs deletes their events in the same transaction (the
reaper's ``delete_finished_jobs``, ``jobs purge``, Django's cascade). On a
partitioned table the key's commit-time check also opened every partition
for each job retention deleted. ``--undo`` deletes any event whose job is
gone on the way back.

The table is rebuilt in place, in one transaction, under an ACCESS
EXCLUSIVE lock:

1. the old table is renamed aside with its index names, and its constraint,
   index and trigger definitions are read first;
2. the new table takes the old one's columns (``LIKE``), its identity
   continuing the old sequence, with a DEFAULT partition and the ranges from
   the retention window back to ``EVENT_PARTITIONS_AHEAD`` periods ahead;
3. every row is copied (older periods land in DEFAULT and are deleted there
   by the usual retention);
4. the constraints are made again, the primary key as ``(id, job_id)``
   (a partitioned table's unique indexes must hold the partition key; ``id``
   still comes from one sequence and stays unique, and the metrics rollup's
   ``id`` cursor reads it as before), then the indexes and the NOTIFY trigger;
5. the old table goes.

The model's state does not change: Django still sees ``id`` as the primary
key, which it is in every way the code uses it. Copying costs about what
writing the table once did: stop the workers and plan the downtime at that.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import NotSupportedError, connection, transaction
from django.utils import timezone

from jobs.conf import knob
from jobs.partitions import (
    DEFAULT_PARTITION,
    ensure_partitions,
    id_at,
    is_partitioned,
    period,
    time_of,
)
from jobs.tables import EVENT_TABLE, JOB_TABLE

OLD = f"{EVENT_TABLE}_unpartitioned"
SUFFIX = "_old"


Definitions = tuple[list[tuple[str, str, str]], list[tuple[str, str]], list[str]]


def _definitions(cursor: Any) -> Definitions:
    """Constraints (name, kind, definition), plain indexes (name, definition), triggers."""
    cursor.execute(
        "SELECT conname, contype, pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE conrelid = %s::regclass AND contype IN ('p', 'u', 'f') ORDER BY contype, conname",
        [EVENT_TABLE],
    )
    constraints = cursor.fetchall()
    cursor.execute(
        "SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i "
        "JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = %s::regclass "
        "AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid) "
        "ORDER BY c.relname",
        [EVENT_TABLE],
    )
    indexes = [(name, sql.replace(" ON ONLY ", " ON ")) for name, sql in cursor.fetchall()]
    cursor.execute(
        "SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = %s::regclass "
        "AND NOT tgisinternal ORDER BY tgname",
        [EVENT_TABLE],
    )
    triggers = [r[0] for r in cursor.fetchall()]
    return constraints, indexes, triggers


def _first_period(cursor: Any, now: datetime) -> datetime:
    """The start of the oldest period worth a partition: the retention window's, or later."""
    oldest = now - timedelta(days=float(knob("RETENTION_DAYS"))) - period()
    cursor.execute(
        f"SELECT job_id FROM {OLD} WHERE job_id >= %s ORDER BY job_id LIMIT 1", [id_at(oldest)]
    )
    found = cursor.fetchone()
    return max(oldest, min(time_of(found[0]), now)) if found else now


def _delete_orphaned_events(cursor: Any) -> None:
    """Events whose job is gone (none should be; the table keeps no key to prove it)."""
    cursor.execute(
        f"DELETE FROM {EVENT_TABLE} e WHERE NOT EXISTS "
        f"(SELECT 1 FROM {JOB_TABLE} j WHERE j.id = e.job_id)"
    )


def rebuild_event_table(*, partitioned: bool) -> bool:
    """Rebuild the events table partitioned by job id range, or plain; False if it already was."""
    if connection.vendor != "postgresql":
        raise NotSupportedError("Partitioned events need PostgreSQL; SQLite keeps a plain table.")
    if is_partitioned() == partitioned:
        return False
    now = timezone.now()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"LOCK TABLE {EVENT_TABLE} IN ACCESS EXCLUSIVE MODE")
        constraints, indexes, triggers = _definitions(cursor)
        cursor.execute(f"ALTER TABLE {EVENT_TABLE} RENAME TO {OLD}")
        for name, kind, _ in constraints:
            if kind in "pu":  # their indexes' names are the constraints' names
                cursor.execute(f'ALTER TABLE {OLD} RENAME CONSTRAINT "{name}" TO "{name}{SUFFIX}"')
        for name, _ in indexes:
            cursor.execute(f'ALTER INDEX "{name}" RENAME TO "{name}{SUFFIX}"')
        cursor.execute(
            f"CREATE TABLE {EVENT_TABLE} (LIKE {OLD} INCLUDING DEFAULTS INCLUDING CONSTRAINTS "
            "INCLUDING STORAGE)" + (" PARTITION BY RANGE (job_id)" if partitioned else "")
        )
        cursor.execute(
            f"ALTER TABLE {EVENT_TABLE} ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY"
        )
        if partitioned:
            cursor.execute(f"CREATE TABLE {DEFAULT_PARTITION} PARTITION OF {EVENT_TABLE} DEFAULT")
            ensure_partitions(now, since=_first_period(cursor, now))
        cursor.execute(f"INSERT INTO {EVENT_TABLE} OVERRIDING SYSTEM VALUE SELECT * FROM {OLD}")
        cursor.execute(
            "SELECT setval(pg_get_serial_sequence(%s, 'id'), "
            f"coalesce((SELECT max(id) FROM {OLD}), 1), (SELECT count(*) > 0 FROM {OLD}))",
            [EVENT_TABLE],
        )
        for name, kind, definition in constraints:
            if kind == "f":  # a key left from before migration 0019 is not made again
                continue
            if kind == "p":
                definition = "PRIMARY KEY (id, job_id)" if partitioned else "PRIMARY KEY (id)"
            cursor.execute(f'ALTER TABLE {EVENT_TABLE} ADD CONSTRAINT "{name}" {definition}')
        if not partitioned:
            _delete_orphaned_events(cursor)
        for _, sql in indexes:
            cursor.execute(sql)
        cursor.execute(f"DROP TABLE {OLD}")
        cursor.execute(
            "SELECT pg_get_serial_sequence(%s, 'id')",
            [EVENT_TABLE],
        )
        sequence = cursor.fetchone()[0]
        if not sequence.endswith(f"{EVENT_TABLE}_id_seq"):
            cursor.execute(f"ALTER SEQUENCE {sequence} RENAME TO {EVENT_TABLE}_id_seq")
        for sql in triggers:
            cursor.execute(sql)
        cursor.execute(f"ANALYZE {EVENT_TABLE}")
    return True
