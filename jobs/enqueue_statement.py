"""The enqueue statements: a batch of jobs (and on PostgreSQL the NOTIFY) in one INSERT.

``insert_rows`` stores validated rows (``jobs.job_spec``) and returns the
ids it inserted: those whose unique key another job holds are skipped
(``ON CONFLICT DO NOTHING``). SQLite's form is a plain multi-row INSERT.
The rest of this module is PostgreSQL's.

One statement stores up to 1,000 jobs and sends one ``NOTIFY`` per queue
(only the queue name: a hint, delivered at commit). Each job's
``job.enqueued`` event is implied by its row (``jobs.timeline``), which is
inserted with ``last_event_seq = 1``.
The jobs travel as one JSON document, so the statement text never changes
(``jobs.prepared`` prepares it once per connection) and each payload goes in
as the JSON it was serialised to, not re-encoded per column.

Two forms of it:

- ``UNIFORM_INSERT``, for a batch whose jobs share operation, queue,
  priority, ``run_after``, ``expires_at`` and ``max_attempts``: what
  ``enqueue()`` makes and what bulk enqueue usually is. Those columns are
  parameters; each job's JSON holds only its id, payload and the rare
  optional columns. Against the general form that is about 110 bytes less
  JSON per job for the server to parse (2 of its 15 us of CPU per bulk job)
  and two parameters fewer to adapt per call.
- ``POSTGRES_INSERT``, for any batch: every column per job.

Ids are written as 32 hex digits (PostgreSQL's ``uuid`` reads them without
hyphens), which is cheaper to format than ``str(uuid)``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connections

from jobs.dialect import dialect
from jobs.prepared import fetch_all
from jobs.tables import JOB_TABLE
from jobs.wakeups import NOTIFY_CHANNEL


@dataclass(slots=True)
class Row:
    """A validated job, ready to insert: the payload is serialised once (``jobs.job_spec``)."""

    id: uuid.UUID
    operation: str
    queue: str
    payload: Any
    payload_json: str
    priority: int
    run_after: datetime | None  # None: waiting for its dependencies
    expires_at: datetime | None
    max_attempts: int
    parent_id: uuid.UUID | None
    unique_key: str | None
    unique_while: str | None
    timeout_seconds: float | None
    schedule_id: uuid.UUID | None = None
    # The enqueue span's propagated context (jobs.tracing); None when not traced.
    trace_context: dict[str, str] | None = None
    # The job's retry policy override (jobs.retry_policy); None for most jobs.
    retry_policy: dict[str, Any] | None = None
    # Flow keys (jobs.flow_keys); the first is the fair key, whose turn jobs.fair_turns gives.
    flow_keys: list[str] | None = None
    fair_key: str | None = None
    fair_turn: float | None = None
    # The row this one repeats with another id (``jobs.job_spec.again``: one spec given
    # several times in a call); None for a row made from its spec.
    repeats: Row | None = None


JOB_COLUMNS = (
    "id, operation, queue, payload, status, priority, run_after, expires_at, attempts, "
    "max_attempts, lease_requeues, parent_id, progress_current, progress_total, error_code, "
    "error_message, created_at, unique_key, last_event_seq, last_event_at, unique_while, "
    "timeout_seconds, schedule_id, trace_context, retry_policy, flow_keys, fair_key, fair_turn"
)
# Any unique index: in practice job_unique_key_held (a held key), as ids never repeat.
INSERT_CONFLICT = "ON CONFLICT DO NOTHING"

# The optional columns, absent from most jobs' JSON (a missing key reads as NULL).
_OPTIONAL = (
    "parent uuid, ukey text, uwhile text, timeout float8, schedule uuid, trace jsonb, retry jsonb, "
    "keys jsonb, fkey text, turn float8"
)

# One NOTIFY per statement and queue, evaluated once (a materialised CTE), delivered at commit.
_NOTIFY_ONE = (
    f"WITH notified AS MATERIALIZED (SELECT pg_notify('{NOTIFY_CHANNEL}', %(queue)s::text)) "
)
_NOTIFY_EACH = (
    f"WITH notified AS MATERIALIZED (SELECT count(pg_notify('{NOTIFY_CHANNEL}', q)) "
    "FROM unnest(%(queues)s::text[]) AS q) "
)

UNIFORM_INSERT = (
    _NOTIFY_ONE + f"INSERT INTO {JOB_TABLE} ({JOB_COLUMNS}) "
    "SELECT u.id, %(operation)s::text, %(queue)s::text, u.payload, 'queued', "
    "%(priority)s::int, %(run_after)s::timestamptz, %(expires_at)s::timestamptz, 0, "
    "%(max_attempts)s::int, 0, u.parent, 0, NULL, '', '', %(now)s, u.ukey, 1, %(now)s, "
    "u.uwhile, u.timeout, u.schedule, u.trace, u.retry, u.keys, u.fkey, u.turn "
    f"FROM jsonb_to_recordset(%(jobs)s::jsonb) AS u(id uuid, payload jsonb, {_OPTIONAL}) "
    f"CROSS JOIN notified {INSERT_CONFLICT} RETURNING id"
)

POSTGRES_INSERT = (
    _NOTIFY_EACH + f"INSERT INTO {JOB_TABLE} ({JOB_COLUMNS}) "
    "SELECT u.id, u.operation, u.queue, u.payload, 'queued', u.priority, u.run_after, "
    "u.expires_at, 0, u.max_attempts, 0, u.parent, 0, NULL, '', '', %(now)s, u.ukey, 1, "
    "%(now)s, u.uwhile, u.timeout, u.schedule, u.trace, u.retry, u.keys, u.fkey, u.turn "
    "FROM jsonb_to_recordset(%(jobs)s::jsonb) AS u(id uuid, payload jsonb, operation text, "
    "queue text, priority int, run_after timestamptz, expires_at timestamptz, "
    f"max_attempts int, {_OPTIONAL}) "
    f"CROSS JOIN notified {INSERT_CONFLICT} RETURNING id"
)


def insert_rows(rows: list[Row], now: datetime, using: str) -> list[uuid.UUID]:
    """Insert jobs (their ``job.enqueued`` events are implied: ``jobs.timeline``); return the
    ids actually inserted."""
    if dialect(using).postgres:
        return insert_postgres(rows, now, using)
    return _insert_sqlite(rows, now, using)


def insert_postgres(rows: list[Row], now: datetime, using: str) -> list[uuid.UUID]:
    """One statement (``statement``), prepared once per connection where allowed."""
    returned = fetch_all(using, *statement(rows, now), unless_rowcount=len(rows))
    if returned is None:  # every row was stored: nothing to read back
        return [r.id for r in rows]
    return [row[0] for row in returned]


_SQLITE_VALUES = (
    "(%s, %s, %s, %s, 'queued', %s, %s, %s, 0, %s, 0, %s, 0, NULL, '', '', %s, %s, 1, %s, "
    "%s, %s, %s, %s, %s, %s, %s, %s)"
)


def _insert_sqlite(rows: list[Row], now: datetime, using: str) -> list[uuid.UUID]:
    d = dialect(using)
    with connections[using].cursor() as cursor:
        params: list[Any] = []
        created = d.ts(now)
        for r in rows:
            params += [
                d.uuid(r.id),
                r.operation,
                r.queue,
                r.payload_json,
                r.priority,
                d.ts(r.run_after),
                d.ts(r.expires_at),
                r.max_attempts,
                d.uuid(r.parent_id),
                created,
                r.unique_key,
                created,
                r.unique_while,
                r.timeout_seconds,
                d.uuid(r.schedule_id),
                d.json(r.trace_context) if r.trace_context is not None else None,
                d.json(r.retry_policy) if r.retry_policy is not None else None,
                d.json(r.flow_keys) if r.flow_keys is not None else None,
                r.fair_key,
                r.fair_turn,
            ]
        cursor.execute(
            f"INSERT INTO {JOB_TABLE} ({JOB_COLUMNS}) "
            f"VALUES {', '.join([_SQLITE_VALUES] * len(rows))} "
            f"{INSERT_CONFLICT} RETURNING id",
            params,
        )
        return [d.read_id(row[0]) for row in cursor.fetchall()]


def statement(rows: Sequence[Row], now: datetime) -> tuple[str, dict[str, Any]]:
    """The INSERT of ``rows`` and its parameters: the uniform form when the rows allow it."""
    first = rows[0]
    operation, queue, priority = first.operation, first.queue, first.priority
    run_after, expires_at, max_attempts = first.run_after, first.expires_at, first.max_attempts
    dumps = json.dumps
    parts: list[str] = []
    append = parts.append
    origin = None  # the last row checked; a row repeating it (Row.repeats) shares its tail
    tail = ""
    for r in rows:
        if r.repeats is not None and r.repeats is origin:
            append(f'{{"id":"{r.id.int:032x}"{tail}')
            continue
        if (
            r.operation != operation
            or r.queue != queue
            or r.priority != priority
            or r.run_after != run_after
            or r.expires_at != expires_at
            or r.max_attempts != max_attempts
        ):
            return POSTGRES_INSERT, {
                "now": now,
                "jobs": _general_document(rows),
                "queues": sorted({r.queue for r in rows}),
            }
        origin = r.repeats or r
        tail = f',"payload":{r.payload_json}{_extras(r, dumps)}}}'
        append(f'{{"id":"{r.id.int:032x}"{tail}')
    return UNIFORM_INSERT, {
        "now": now,
        "jobs": "[" + ",".join(parts) + "]",
        "operation": operation,
        "queue": queue,
        "priority": priority,
        "run_after": run_after,
        "expires_at": expires_at,
        "max_attempts": max_attempts,
    }


def _general_document(rows: Sequence[Row]) -> str:
    """The batch as a JSON array, each payload's JSON spliced in as it was serialised.

    A batch usually repeats one operation, queue, priority, run_after and so
    on: the text of those columns is made once per distinct combination and
    each row adds only its id, payload and rare columns. Keys that are null
    are left out (``jsonb_to_recordset`` reads a missing key as NULL).
    """
    dumps = json.dumps
    commons: dict[tuple[Any, ...], str] = {}
    parts = []
    for r in rows:
        key = (r.operation, r.queue, r.priority, r.run_after, r.expires_at, r.max_attempts)
        common = commons.get(key)
        if common is None:
            common = commons[key] = (
                f'"operation":{dumps(r.operation)},"queue":{dumps(r.queue)},'
                f'"priority":{r.priority},'
                # None: waiting for its dependencies (jobs.dependencies), stored NULL.
                + (f'"run_after":"{r.run_after.isoformat()}",' if r.run_after else "")
                + (f'"expires_at":"{r.expires_at.isoformat()}",' if r.expires_at else "")
                + f'"max_attempts":{r.max_attempts}'
            )
        parts.append(
            f'{{"id":"{r.id.int:032x}","payload":{r.payload_json},{common}{_extras(r, dumps)}}}'
        )
    return "[" + ",".join(parts) + "]"


def _extras(row: Row, dumps: Any) -> str:
    """The optional columns of one row's JSON (``,"key":value`` each), empty for most jobs."""
    if (
        row.unique_key is None
        and row.timeout_seconds is None
        and row.schedule_id is None
        and row.trace_context is None
        and row.parent_id is None
        and row.retry_policy is None
        and row.flow_keys is None
    ):
        return ""
    out = f',"parent":"{row.parent_id}"' if row.parent_id is not None else ""
    if row.unique_key is not None:
        out += f',"ukey":{dumps(row.unique_key)},"uwhile":{dumps(row.unique_while)}'
    if row.timeout_seconds is not None:
        out += f',"timeout":{row.timeout_seconds!r}'
    if row.schedule_id is not None:
        out += f',"schedule":"{row.schedule_id}"'
    if row.trace_context is not None:
        out += f',"trace":{dumps(row.trace_context)}'
    if row.retry_policy is not None:
        out += f',"retry":{dumps(row.retry_policy)}'
    if row.flow_keys is not None:
        out += f',"keys":{dumps(row.flow_keys)},"fkey":{dumps(row.fair_key)}'
        out += f',"turn":{row.fair_turn!r}'
    return out
