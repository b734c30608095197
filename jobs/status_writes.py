"""The one guarded status write and its events, below ``jobs.transitions``.

``write_status`` is the UPDATE (guarded by status, ids, lease token and extra
SQL) that takes each job's next event ``seq`` and inserts its event in the
same statement (PostgreSQL) or transaction (SQLite), with the database's
clock. ``jobs.transitions.move`` checks a move against the allowed-transition
table, writes it here and follows up the ends it reports; ``jobs.dependencies``
moves the jobs a release cancels or revives through ``move_unfollowed``, since
it follows up those ends itself.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connections, transaction
from django.utils import timezone

from jobs import signals
from jobs.dialect import Dialect, Now, dialect
from jobs.states import Status, check_transition
from jobs.storable import cap_event_message
from jobs.tables import EVENT_TABLE, JOB_TABLE


class Sql(str):
    """An assignment given as an SQL expression rather than a value."""


class Json:
    """A value for a JSON column, whatever its Python type (a bare 5 or "done" too)."""

    def __init__(self, value: Any) -> None:
        self.value = value


DECREMENT_ATTEMPTS = Sql("CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END")


@dataclass(frozen=True)
class Moved:
    id: uuid.UUID
    seq: int


@dataclass(frozen=True)
class Event:
    """An event to write beside a status change."""

    event: str
    level: str = "info"
    message: str = ""
    fields: dict[str, Any] = field(default_factory=dict)


def adapt_value(d: Dialect, value: Any, at: datetime | None = None) -> tuple[str, list[Any]]:
    """An assignment's SQL and params; ``at`` is SQLite's instant for a ``Now``."""
    if isinstance(value, Now):
        return d.now(value.seconds, at=at)
    if isinstance(value, Sql):
        return str(value), []
    if isinstance(value, Json):
        return d.json_param, [d.json(value.value)]
    if value is None:
        return "NULL", []
    if isinstance(value, datetime):
        return "%s", [d.ts(value)]
    if isinstance(value, uuid.UUID):
        return "%s", [d.uuid(value)]
    if isinstance(value, (dict, list)):
        return d.json_param, [d.json(value)]
    if isinstance(value, Status):
        return "%s", [value.value]
    return "%s", [value]


def write_events(
    cursor: Any, d: Dialect, rows: Iterable[tuple[Any, int]], event: Event, ts: datetime | None
) -> None:
    """Insert one event per ``(db job id, seq)`` row in one round trip.

    ``ts`` None: the database's time (``Dialect.now``).
    """
    ts_sql, ts_params = d.now(at=ts)
    message = cap_event_message(event.message or "")
    params = [
        (job_id, seq, *ts_params, event.event, event.level, message, d.json(event.fields))
        for job_id, seq in rows
    ]
    if not params:
        return
    cursor.executemany(
        f"INSERT INTO {EVENT_TABLE} (job_id, seq, ts, event, level, message, fields) "
        f"VALUES (%s, %s, {ts_sql}, %s, %s, %s, {d.json_param})",
        params,
    )


@dataclass(frozen=True)
class Ended:
    """A job whose end a transaction just wrote, to follow up (``jobs.dependencies.release``)."""

    id: uuid.UUID
    status: Status
    workflow_id: uuid.UUID | None = None


def move_unfollowed(
    *,
    target: Status,
    event: Event,
    job_ids: Sequence[uuid.UUID],
    sources: Sequence[Status],
    assign: dict[str, Any] | None = None,
    using: str = "default",
) -> list[Moved]:
    """``jobs.transitions.move`` without its follow-up: for the caller that follows up itself."""
    for source in sources:
        check_transition(source, target)
    moved, _ = write_status(
        status=target,
        status_in=tuple(sources),
        event=event,
        job_ids=job_ids,
        where="",
        where_params=(),
        lease_token=None,
        assign=assign,
        at=None,
        follow_up=False,
        using=using,
    )
    return moved


def write_status(
    *,
    status: Status | None,
    status_in: tuple[Status, ...],
    event: Event,
    job_ids: Sequence[uuid.UUID] | None,
    where: str,
    where_params: Sequence[Any],
    lease_token: uuid.UUID | None,
    assign: dict[str, Any] | None,
    at: datetime | None,
    follow_up: bool,
    using: str,
) -> tuple[list[Moved], list[Ended]]:
    """The guarded UPDATE of ``jobs.transitions.move`` and ``rewrite`` and its events.

    With ``follow_up``, also the ended jobs whose end others wait for or that
    belong to a workflow: the caller follows them up in the same transaction
    (``jobs.dependencies.release``).
    """
    d = dialect(using)
    # PostgreSQL: its own clock, in the statement; SQLite: one instant of this process.
    now = at if at is not None else (None if d.postgres else timezone.now())
    now_sql, now_params = ("%s", [d.ts(at)]) if at is not None else d.now(at=now)
    sets = ["last_event_seq = last_event_seq + 1", f"last_event_at = {now_sql}"]
    params: list[Any] = [*now_params]
    if status is not None:
        sets.insert(0, "status = %s")
        params.insert(0, status.value)
    for column, value in (assign or {}).items():
        sql, values = adapt_value(d, value, at=now)
        sets.append(f"{column} = {sql}")
        params.extend(values)
    conditions = [f"status IN {d.in_list(len(status_in))}"]
    params.extend(s.value for s in status_in)
    if job_ids is not None:
        if not job_ids:
            return [], []
        conditions.append(f"id IN {d.in_list(len(job_ids))}")
        params.extend(d.uuid(i) for i in job_ids)
    if lease_token is not None:
        conditions.append("lease_token = %s")
        params.append(d.uuid(lease_token))
    if where:
        conditions.append(where)
        params.extend(where_params)
    # The outcome's columns only when someone hears it (jobs.signals): else the same statement.
    signal = signals.signal_for(status, event.event)
    heard = signals.wanted(signal)
    columns = f"id, last_event_seq{_OUTCOME_COLUMNS if heard else ''}"
    update = (
        f"UPDATE {JOB_TABLE} SET {', '.join(sets)} WHERE {' AND '.join(conditions)} "
        f"RETURNING {columns}{_FOLLOW_UP_COLUMNS if follow_up else ''}"
    )
    if follow_up:
        columns += ", followed, workflow_id"
    if d.postgres:
        # One statement, atomic on its own: the status change and its event
        # commit together without BEGIN/COMMIT round trips.
        insert = (
            f"INSERT INTO {EVENT_TABLE} (job_id, seq, ts, event, level, message, fields) "
            "SELECT id, last_event_seq, statement_timestamp(), %s, %s, %s, %s::jsonb FROM moved"
        )
        statement = (
            f"WITH moved AS ({update}), written AS ({insert}) SELECT {columns} FROM moved"
            if heard or follow_up
            else f"WITH moved AS ({update}) {insert} RETURNING job_id, seq"
        )
        with connections[using].cursor() as cursor:
            cursor.execute(
                statement,
                [
                    *params,
                    event.event,
                    event.level,
                    cap_event_message(event.message or ""),
                    d.json(event.fields),
                ],
            )
            rows = cursor.fetchall()
    else:
        with transaction.atomic(using=using), connections[using].cursor() as cursor:
            cursor.execute(update, params)
            rows = cursor.fetchall()
            write_events(cursor, d, [(r[0], r[1]) for r in rows], event, now)
    moved = [Moved(d.read_id(r[0]), r[1]) for r in rows]
    ended = (
        [Ended(m.id, status, d.read_uuid(r[-1])) for m, r in zip(moved, rows, strict=True) if r[-2]]
        if follow_up and status is not None
        else []
    )
    if heard and signal is not None and moved:
        changes = assign or {}
        outcomes = [
            _outcome(m.id, r, status, event, changes) for m, r in zip(moved, rows, strict=True)
        ]
        signals.dispatch(signal, outcomes, using=using)
    return moved, ended


# What ``_write`` also returns when a signal or hook hears the change: enough for
# ``jobs.signals.JobOutcome`` without another query.
_OUTCOME_COLUMNS = ", operation, queue, attempts, max_attempts, error_code, error_message"
# And for an end to follow up (``jobs.dependencies.release``): does anything wait for it?
_FOLLOW_UP_COLUMNS = ", has_dependents OR workflow_id IS NOT NULL AS followed, workflow_id"


def _outcome(
    job_id: uuid.UUID, row: Sequence[Any], status: Status | None, event: Event, assign: dict
) -> signals.JobOutcome:
    """A moved row (``_OUTCOME_COLUMNS``) as the outcome its signal carries."""
    _, _, operation, queue, attempts, max_attempts, error_code, error_message = row[:8]
    if assign.get("attempts") is DECREMENT_ATTEMPTS:
        attempts += 1  # the attempt that ran, not the one given back
    result = assign.get("result")
    return signals.JobOutcome(
        job_id=job_id,
        operation=operation,
        queue=queue,
        status=status.value if status is not None else "",
        attempt=attempts,
        max_attempts=max_attempts,
        event=event.event,
        message=event.message or "",
        error_code=error_code or "",
        error_message=error_message or "",
        fields=event.fields,
        result=result.value if isinstance(result, Json) else None,
    )
