"""Per-job timeouts: a run past ``started_at + timeout_seconds`` is failed with ``JobTimeout``.

``Job.timeout_seconds`` comes from the job (enqueue) or its operation
(``@operation(..., timeout_seconds=…)``). Three parties enforce it, and each
writes the same outcome, ``running -> failed`` with ``error_code``
``JobTimeout`` and a ``job.timeout`` event, in one guarded UPDATE:

- the local worker holding the job, at the deadline (``time_out_job``,
  fenced by the lease token; ``workers.timeouts``);
- a remote worker's heartbeat, for the jobs it holds (``fail_overdue_jobs``
  with ``held``): the reply names them, so the client stops them;
- the reaper, ``TIMEOUT_GRACE_SECONDS`` after the deadline, for every
  running job whose worker did not act (dead, stuck, or remote and silent).

A timeout is final, as the CONTRACT's ``running -> failed`` says, even when
attempts remain: Python cannot stop the run's thread, so a retry could run
next to a run that is still going; and a run that overran its budget usually
overruns it again. An operator's retry (or a larger ``timeout_seconds``) is
the way back. The deadline counts from ``started_at``: a deferred parent's
time waiting for its batches counts too.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from django.db import connections

from jobs.dialect import Dialect, Now, dialect
from jobs.events import JOB_TIMEOUT
from jobs.failures import failure_fields
from jobs.states import FAILED, RUNNING
from jobs.tables import JOB_TABLE
from jobs.transitions import CLEAR_LEASE, Event, Moved, move, move_one

TIMEOUT_ERROR_CODE = "JobTimeout"


def timeout_message(timeout_seconds: float) -> str:
    """The error message of a timed-out job."""
    return (
        f"The job ran longer than its timeout of {timeout_seconds:g} s and was stopped; "
        "raise timeout_seconds or make the work smaller, then retry it."
    )


def _changes(
    timeout_seconds: float, *, by: str, traceback: str = ""
) -> tuple[Event, dict[str, Any]]:
    """The ``job.timeout`` event and the row's assignments for one timed-out job."""
    message = timeout_message(timeout_seconds)
    error = {"error_code": TIMEOUT_ERROR_CODE, "error_message": message}
    fields = {
        **error,
        **failure_fields(TIMEOUT_ERROR_CODE, message, traceback=traceback),
        "timeout_seconds": timeout_seconds,
        "by": by,
    }
    event = Event(JOB_TIMEOUT, level="error", message=message, fields=fields)
    return event, {**error, **CLEAR_LEASE, "finished_at": Now()}


def time_out_job(
    job_id: uuid.UUID,
    *,
    lease_token: uuid.UUID,
    timeout_seconds: float,
    traceback: str = "",
    using: str = "default",
) -> Moved:
    """running -> failed (``JobTimeout``, ``job.timeout``) by the worker that holds the lease.

    ``traceback`` is where the run's thread stood at the deadline, kept on the
    event like a failure's. Raises ``LeaseLost`` when the job is no longer
    held under ``lease_token`` (finished, cancelled or reaped meanwhile).
    """
    event, assign = _changes(timeout_seconds, by="worker", traceback=traceback)
    return move_one(
        job_id,
        target=FAILED,
        sources=(RUNNING,),
        lease_token=lease_token,
        event=event,
        assign=assign,
        using=using,
    )


def _overdue(d: Dialect) -> tuple[str, list[Any]]:
    """SQL true for a job past ``started_at + timeout_seconds`` plus a grace (the grace in
    seconds is its first param), and the params of its "now": the database's clock."""
    now_sql, now_params = d.now()
    if d.postgres:
        return (
            "timeout_seconds IS NOT NULL AND started_at "
            f"+ (timeout_seconds + %s) * interval '1 second' < {now_sql}"
        ), now_params
    # SQLite stores timestamps as ISO text; julianday reads them (to the millisecond).
    return (
        "timeout_seconds IS NOT NULL "
        f"AND julianday(started_at) + (timeout_seconds + %s) / 86400.0 < julianday({now_sql})"
    ), now_params


def fail_overdue_jobs(
    *,
    grace_seconds: float = 0.0,
    held: Sequence[tuple[uuid.UUID, uuid.UUID]] | None = None,
    by: str = "reaper",
    limit: int = 500,
    using: str = "default",
) -> list[uuid.UUID]:
    """Fail running jobs past ``started_at + timeout_seconds + grace_seconds``; return their ids.

    Without ``held`` (the reaper) it looks at every running job: the scan
    reads only running rows (the partial indexes on ``status = 'running'``),
    few by nature. With ``held`` ((id, lease token) pairs: a remote worker's
    heartbeat) only those jobs, each under its own token. Each job is moved
    by its own UPDATE that repeats the conditions, so two reapers (or a
    reaper and a heartbeat) never fail one twice, and a job finished
    meanwhile is left as it is.
    """
    if held is not None and not held:
        return []
    d = dialect(using)
    overdue, now_params = _overdue(d)
    overdue_params = [float(grace_seconds), *now_params]
    conditions, params = ["status = 'running'", overdue], list(overdue_params)
    tokens: dict[uuid.UUID, uuid.UUID] = {}
    if held is not None:
        tokens = {job_id: token for job_id, token in held}
        conditions.append(f"id IN {d.in_list(len(tokens))}")
        params.extend(d.uuid(job_id) for job_id in tokens)
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"SELECT id, timeout_seconds FROM {JOB_TABLE} WHERE {' AND '.join(conditions)} "
            f"LIMIT {int(limit)}",
            params,
        )
        rows = [(d.read_id(r[0]), float(r[1])) for r in cursor.fetchall()]
    failed: list[uuid.UUID] = []
    for job_id, timeout in rows:
        event, assign = _changes(timeout, by=by)
        moved = move(
            target=FAILED,
            sources=(RUNNING,),
            job_ids=[job_id],
            lease_token=tokens.get(job_id),
            where=overdue,
            where_params=overdue_params,
            event=event,
            assign=assign,
            using=using,
        )
        failed.extend(m.id for m in moved)
    return failed
