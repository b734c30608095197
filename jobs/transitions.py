"""Every write that changes a job's status, each with its event.

Each public function is one guarded UPDATE (``WHERE status IN <sources>``,
fenced by the lease token where a worker acts) followed by the INSERT of its
``JobEvent``, in one transaction. The next event ``seq`` is taken from the
job row by the same UPDATE, so the row lock orders the commits and the
timeline has no gaps. When the guard matches nothing, the caller gets a
clear exception (``LeaseLost``, ``IllegalTransition``, ``JobNotFound``).

``move`` (``move_one`` for one job) is that guarded UPDATE and its event,
checked against the allowed-transition table (``jobs.states.ALLOWED``): the
functions below and the reaper's rescues (``jobs.rescues``, ``jobs.timeouts``)
are calls of it, and ``rewrite`` is the same write for a change that keeps
the status (``jobs.rescheduling``). Two transitions live on the hot path
instead, in ``jobs.claims``, each one SQL statement for a whole batch:
``queued -> running`` (``claim_jobs``, ``complete_and_claim``) and
``running -> succeeded`` (``complete_jobs``, ``complete_and_claim``); they
are checked against the same table when their SQL is built.

Times written or compared here (``run_after``, ``finished_at``, event
``ts``) are the database's (``Now``, ``Dialect.now``), never the caller's
clock, so processes on machines whose clocks differ agree (``jobs.clock``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.utils import timezone

from jobs import events
from jobs.dependencies import after_retry, release
from jobs.dialect import Now, dialect
from jobs.exceptions import IllegalTransition, JobCancelled, JobNotFound, LeaseLost
from jobs.failures import failure_fields
from jobs.retry_policy import RETRY_LATER_LIMIT, RetryPolicy, resolved_policy
from jobs.states import (
    CANCELLED,
    FAILED,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    TERMINAL,
    Status,
    check_transition,
    sources_for,
)
from jobs.status_writes import (  # noqa: F401 - re-exported: the names callers import from here
    DECREMENT_ATTEMPTS,
    Event,
    Json,
    Moved,
    Sql,
    adapt_value,
    write_events,
    write_status,
)
from jobs.storable import (
    cap_error_message,
    checked_progress,
    progress_value,
)
from jobs.tables import BATCH_MESSAGE_TABLE, BATCH_RECEIPT_TABLE, EVENT_TABLE, JOB_TABLE
from jobs.wakeups import notify_queues

CLEAR_LEASE = {"leased_until": None, "lease_token": None}
# started_at for a requeue that does not count the attempt: cleared, except on
# a job whose unique key is held until its first start (unique_while 'queued'),
# for which it is the mark that it ran: it must not take its key again, nor
# collide with the job enqueued under that key since (jobs.uniqueness).
RESET_STARTED_AT = Sql("CASE WHEN unique_while = 'queued' THEN started_at END")


def move(
    *,
    target: Status,
    event: Event,
    job_ids: Sequence[uuid.UUID] | None = None,
    where: str = "",
    where_params: Sequence[Any] = (),
    lease_token: uuid.UUID | None = None,
    assign: dict[str, Any] | None = None,
    sources: Sequence[Status] | None = None,
    follow_up: bool = True,
    using: str = "default",
) -> list[Moved]:
    """Move the matching jobs to ``target`` and write ``event`` for each: the one status write.

    Every status change outside the hot path (``jobs.claims``) is this call:
    each ``source -> target`` in ``sources`` (default: every state the table
    allows into ``target``) is checked against ``jobs.states.ALLOWED`` first,
    then one guarded UPDATE (``status IN sources``, plus ``job_ids``, the
    ``lease_token`` fence and the extra ``where`` SQL) sets the status and
    ``assign`` (values, ``Now``, ``Sql`` or ``Json``), takes each job's next
    event ``seq`` and inserts its event in the same transaction. Returns the
    jobs that moved; none when the guard matched nothing (``move_one`` says why).

    A move to a terminal status is followed up in its transaction
    (``jobs.dependencies.release``) for the jobs that others wait for or that
    belong to a workflow; ``follow_up=False`` is for that follow-up's own moves.
    """
    sources = tuple(sources or sources_for(target))
    for source in sources:
        check_transition(source, target)
    return _write(
        status=target,
        status_in=sources,
        event=event,
        job_ids=job_ids,
        where=where,
        where_params=where_params,
        lease_token=lease_token,
        assign=assign,
        follow_up=follow_up and target in TERMINAL,
        using=using,
    )


def move_one(
    job_id: uuid.UUID,
    *,
    target: Status,
    event: Event,
    lease_token: uuid.UUID | None = None,
    **kwargs: Any,
) -> Moved:
    """``move`` for one job; raises ``JobNotFound``, ``LeaseLost`` or ``IllegalTransition``
    when its guard matches nothing."""
    moved = move(target=target, event=event, job_ids=[job_id], lease_token=lease_token, **kwargs)
    if not moved:
        raise _explain_miss(job_id, target, lease_token)
    return moved[0]


def rewrite(
    *,
    status_in: Sequence[Status],
    event: Event,
    job_ids: Sequence[uuid.UUID],
    where: str = "",
    where_params: Sequence[Any] = (),
    assign: dict[str, Any] | None = None,
    at: datetime | None = None,
    using: str = "default",
) -> list[Moved]:
    """A guarded write that leaves the status as it is, with its event, written like ``move``.

    For changes that are not transitions (``jobs.rescheduling`` brings a
    queued job's ``run_after`` forward): the same guarded UPDATE, next
    ``seq`` and event in the same transaction. ``at`` is the instant the job
    row records as its ``last_event_at`` (default: the database's clock).
    """
    return _write(
        status=None,
        status_in=tuple(status_in),
        event=event,
        job_ids=job_ids,
        where=where,
        where_params=where_params,
        assign=assign,
        at=at,
        using=using,
    )


def _write(
    *,
    status: Status | None,
    status_in: tuple[Status, ...],
    event: Event,
    job_ids: Sequence[uuid.UUID] | None = None,
    where: str = "",
    where_params: Sequence[Any] = (),
    lease_token: uuid.UUID | None = None,
    assign: dict[str, Any] | None = None,
    at: datetime | None = None,
    follow_up: bool = False,
    using: str = "default",
) -> list[Moved]:
    """The guarded UPDATE behind ``move`` and ``rewrite``, with its events."""
    # The end and what it releases commit together (no savepoint inside a caller's).
    scope = transaction.atomic(using=using, savepoint=False) if follow_up else nullcontext()
    with scope:
        moved, ended = write_status(
            status=status,
            status_in=status_in,
            event=event,
            job_ids=job_ids,
            where=where,
            where_params=where_params,
            lease_token=lease_token,
            assign=assign,
            at=at,
            follow_up=follow_up,
            using=using,
        )
        if ended:
            release(ended, using=using)
    return moved


def _explain_miss(job_id: uuid.UUID, target: Status, lease_token: uuid.UUID | None) -> Exception:
    """Why a guarded single-job UPDATE matched nothing, as the exception to raise."""
    from jobs.models import Job

    row = Job.objects.filter(pk=job_id).values_list("status", "lease_token").first()
    if row is None:
        return JobNotFound(job_id)
    status, token = row
    if lease_token is not None and (status != RUNNING or token != lease_token):
        return LeaseLost(job_id, status)
    return IllegalTransition(source=status, target=target.value, job_id=job_id)


# --- outcomes of a run ----------------------------------------------------


def _progress_assign(progress: tuple[int | None, int | None] | None) -> dict[str, Any]:
    if not progress:
        return {}
    current, total = checked_progress(*progress)
    out: dict[str, Any] = {}
    if current is not None:
        out["progress_current"] = current
    if total is not None:
        out["progress_total"] = total
    return out


def complete_job(
    job_id: uuid.UUID,
    *,
    lease_token: uuid.UUID | None,
    result: Any = None,
    progress: tuple[int | None, int | None] | None = None,
    event_fields: dict[str, Any] | None = None,
    using: str = "default",
) -> Moved:
    """running -> succeeded. ``lease_token=None`` is for closing a deferred parent."""
    return move_one(
        job_id,
        target=SUCCEEDED,
        lease_token=lease_token,
        event=Event(events.JOB_SUCCEEDED, fields=event_fields or {}),
        assign={
            "result": Sql("NULL") if result is None else Json(result),
            "finished_at": Now(),
            "error_code": "",
            "error_message": "",
            **CLEAR_LEASE,
            **_progress_assign(progress),
        },
        using=using,
    )


# Batches own a deferred parent's progress: while any message or receipt of
# the job exists, ``progress_current`` is the write step's count, and neither
# the coordinator's return value nor its emits may overwrite it.
BATCH_OWNED = (
    f"(EXISTS (SELECT 1 FROM {BATCH_MESSAGE_TABLE} bm"
    f" WHERE bm.parent_id = {JOB_TABLE}.id)"
    f" OR EXISTS (SELECT 1 FROM {BATCH_RECEIPT_TABLE} br"
    f" WHERE br.parent_id = {JOB_TABLE}.id))"
)


def _progress_sql(column: str, value: int) -> tuple[str, list[Any]]:
    """``column = value`` unless the job's batches own its progress."""
    return f"{column} = CASE WHEN {BATCH_OWNED} THEN {column} ELSE %s END", [
        progress_value(value, column.replace("_", " "))
    ]


def deferred_result(result: Any, total: int) -> Any:
    """The result a deferred parent closes with: its coordinator's, plus ``batches_written``."""
    merged = dict(result) if isinstance(result, dict) else {}
    merged["batches_written"] = total
    return merged


def defer_job(
    job_id: uuid.UUID,
    *,
    lease_token: uuid.UUID,
    result: Any = None,
    progress: tuple[int | None, int | None] | None = None,
    using: str = "default",
) -> int:
    """Keep a coordinator ``running`` after its operation returned deferred.

    Not a status change: its lease and worker are released (its batches hold
    it now, so no lease rescue may touch it; the reaper's hard timeout with
    stall grace still does) and it is closed by the write step of its last
    batch. When every batch was already written while the coordinator still
    held the lease (fast batches, or none at all), the write step could not
    close it, so this does: ``job.deferred`` then ``job.succeeded``, in one
    transaction. Returns the seq of the last event written.
    """
    d = dialect(using)
    now = None if d.postgres else timezone.now()
    now_sql, now_params = d.now(at=now)
    stored = None if result is None else Json(result)
    sets = [
        "last_event_seq = last_event_seq + 1",
        f"last_event_at = {now_sql}",
        "worker_id = NULL",
        "leased_until = NULL",
        "lease_token = NULL",
    ]
    params: list[Any] = [*now_params]
    sql, values = adapt_value(d, stored)
    sets.append(f"result = {sql}")
    params.extend(values)
    current, total = checked_progress(*(progress or (None, None)))
    for column, value in (("progress_current", current), ("progress_total", total)):
        if value is not None:
            sql, values = _progress_sql(column, value)
            sets.append(sql)
            params.extend(values)
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute(
            f"UPDATE {JOB_TABLE} SET {', '.join(sets)} "
            "WHERE id = %s AND status = 'running' AND lease_token = %s "
            "RETURNING id, last_event_seq, progress_current, progress_total",
            [*params, d.uuid(job_id), d.uuid(lease_token)],
        )
        rows = cursor.fetchall()
        if not rows:
            raise _explain_miss(job_id, RUNNING, lease_token)
        db_id, seq, done, planned = rows[0]
        deferred = Event(events.JOB_DEFERRED, fields={"result": result})
        write_events(cursor, d, [(db_id, seq)], deferred, now)
        if planned is not None and done >= planned:
            seq = complete_job(
                job_id,
                lease_token=None,
                result=deferred_result(result, planned),
                event_fields={"closed_by": "defer"},
                using=using,
            ).seq
    return seq


def fail_job(
    job_id: uuid.UUID,
    *,
    lease_token: uuid.UUID | None,
    error_code: str,
    error_message: str,
    retryable: bool = False,
    backoff_seconds: float | None = None,
    event: str = events.JOB_FAILED,
    traceback: str = "",
    frame: str | None = None,
    using: str = "default",
) -> Status:
    """running -> queued with backoff while attempts remain (if retryable), else -> failed.

    The event's fields carry the error, its ``fingerprint`` and, when given,
    the bounded ``traceback`` (``jobs.failures``; ``frame`` is the raising
    frame when the caller holds the exception). Returns the status the job
    moved to.
    """
    error_message = cap_error_message(error_message)
    error = {"error_code": error_code, "error_message": error_message}
    details = failure_fields(error_code, error_message, traceback=traceback, frame=frame)
    with transaction.atomic(using=using):
        if retryable and backoff_seconds is not None:
            moved = move(
                target=QUEUED,
                sources=(RUNNING,),  # never resurrect a cancelled or failed job
                job_ids=[job_id],
                lease_token=lease_token,
                where="attempts < max_attempts",
                event=Event(
                    events.JOB_RETRY_SCHEDULED,
                    level="warning",
                    message=error_message,
                    fields={**error, **details, "delay_seconds": round(backoff_seconds, 3)},
                ),
                assign={
                    **error,
                    **CLEAR_LEASE,
                    "run_after": Now(backoff_seconds),
                    "worker_id": None,
                },
                using=using,
            )
            if moved:
                return QUEUED
        move_one(
            job_id,
            target=FAILED,
            lease_token=lease_token,
            event=Event(event, level="error", message=error_message, fields={**error, **details}),
            assign={**error, **CLEAR_LEASE, "finished_at": Now()},
            using=using,
        )
    return FAILED


def retry_job_later(
    job_id: uuid.UUID,
    *,
    lease_token: uuid.UUID,
    reason: str,
    delay_seconds: float,
    policy: RetryPolicy | None = None,
    using: str = "default",
) -> Status:
    """running -> queued after ``delay_seconds``, the attempt not counted; or, past the
    job's bound, running -> failed with ``RetryLaterLimit``. Returns the status moved to.

    The bound is the job's retry policy (``jobs.retry_policy``: its stored override
    over ``policy``, the operation's, over the knobs): at most ``max_retry_later``
    times, counted on the row (``retry_laters``) so the count survives any worker,
    and within ``retry_later_max_seconds`` of the enqueue when that is set. Only
    the lease holder writes here, so the count read cannot move under us; the
    writes below are fenced by the token all the same.
    """
    from jobs.clock import db_now
    from jobs.models import Job

    with transaction.atomic(using=using):
        row = (
            Job.objects.using(using)
            .filter(pk=job_id)
            .values_list("retry_laters", "created_at", "retry_policy")
            .first()
        )
        if row is None:
            raise JobNotFound(job_id)
        snoozed, created_at, stored = row
        bound = resolved_policy(stored, policy)
        age = (db_now(using) - created_at).total_seconds()
        refusal = bound.retry_later_refusal(int(snoozed), age)
        if refusal is not None:
            return fail_job(
                job_id,
                lease_token=lease_token,
                error_code=RETRY_LATER_LIMIT,
                error_message=f"{refusal} Its last reason: {reason}" if reason else refusal,
                using=using,
            )
        move_one(
            job_id,
            target=QUEUED,
            sources=(RUNNING,),  # never resurrect a cancelled or failed job
            lease_token=lease_token,
            event=Event(
                events.JOB_RETRY_LATER,
                message=reason,
                fields={
                    "reason": reason,
                    "delay_seconds": delay_seconds,
                    "retry_laters": int(snoozed) + 1,
                    "max_retry_later": bound.max_retry_later,
                },
            ),
            assign={
                **CLEAR_LEASE,
                "attempts": DECREMENT_ATTEMPTS,
                "retry_laters": Sql("retry_laters + 1"),
                "run_after": Now(delay_seconds),
                "worker_id": None,
                "started_at": RESET_STARTED_AT,
            },
            using=using,
        )
    return QUEUED


OUTAGE_ERROR_CODE = "DatabaseUnavailable"

OUTAGE_REQUEUES_SPENT_SQL = (
    f"SELECT COUNT(*) FROM {EVENT_TABLE} WHERE job_id = %s AND event = %s AND seq > COALESCE("
    f"(SELECT MAX(seq) FROM {EVENT_TABLE} WHERE job_id = %s AND event = '{events.JOB_RETRIED}'), 0)"
)


def outage_requeues_spent(job_id: uuid.UUID, *, using: str = "default") -> int:
    """How many ``job.outage_requeue`` the job had since the last operator retry.

    Counted from the timeline, so the count survives every process that requeued it:
    the events are the record, and an operator retry gives the full budget back.
    """
    d = dialect(using)
    with connections[using].cursor() as cursor:
        cursor.execute(
            OUTAGE_REQUEUES_SPENT_SQL, [d.uuid(job_id), events.JOB_OUTAGE_REQUEUE, d.uuid(job_id)]
        )
        return int(cursor.fetchone()[0])


def requeue_after_outage(
    job_id: uuid.UUID,
    *,
    lease_token: uuid.UUID,
    cause: str,
    max_requeues: int,
    backoff: Callable[[int], float],
    using: str = "default",
) -> Status:
    """A database outage cut the run short: running -> queued, or -> failed past the budget.

    While fewer than ``max_requeues`` outage requeues were spent since the
    last operator retry, the job goes back to ``queued`` after
    ``backoff(n)`` seconds (``n`` = this requeue's number, from 1), its
    attempt not counted, with a ``job.outage_requeue`` event naming the cause.
    Past the budget it fails with ``DatabaseUnavailable`` (``job.failed``): a
    database that drops every run of one job is not a passing outage, and
    retrying without end hides it. Returns the status the job moved to.

    Not ``job.requeued`` (an immediate requeue by a shutdown, a disconnect or
    an operator) nor ``job.retry_later`` (the operation asked): this one has
    its own budget, and the timeline should say which it was.
    """
    with transaction.atomic(using=using):
        # Only the lease holder writes these events, so the count cannot move
        # under us; the UPDATE below is fenced by the token all the same.
        spent = outage_requeues_spent(job_id, using=using)
        if spent >= max_requeues:
            fail_job(
                job_id,
                lease_token=lease_token,
                error_code=OUTAGE_ERROR_CODE,
                error_message=(
                    f"The database became unavailable during {spent + 1} runs of this job "
                    f"(at most {max_requeues} are requeued); the last time: {cause}"
                ),
                using=using,
            )
            return FAILED
        number = spent + 1
        delay = round(max(float(backoff(number)), 0.0), 3)
        move_one(
            job_id,
            target=QUEUED,
            sources=(RUNNING,),  # never resurrect a cancelled or failed job
            lease_token=lease_token,
            event=Event(
                events.JOB_OUTAGE_REQUEUE,
                level="warning",
                message=(
                    f"The database became unavailable during the run ({cause}); "
                    f"requeued in {delay:g} s without counting the attempt "
                    f"({number} of {max_requeues})."
                ),
                fields={
                    "cause": cause,
                    "delay_seconds": delay,
                    "outage_requeues": number,
                    "max_outage_requeues": max_requeues,
                },
            ),
            assign={
                **CLEAR_LEASE,
                "attempts": DECREMENT_ATTEMPTS,
                "run_after": Now(delay),
                "worker_id": None,
                "started_at": RESET_STARTED_AT,
            },
            using=using,
        )
    return QUEUED


def requeue_job(
    job_id: uuid.UUID,
    *,
    lease_token: uuid.UUID | None,
    reason: str = "worker shutdown",
    by: str | None = None,
    using: str = "default",
) -> Moved:
    """running -> queued now (graceful shutdown, remote disconnect, an operator's requeue of
    an orphan); the attempt is not counted. ``by`` names the operator in the event."""
    return move_one(
        job_id,
        target=QUEUED,
        sources=(RUNNING,),  # never resurrect a cancelled or failed job
        lease_token=lease_token,
        event=Event(
            events.JOB_REQUEUED,
            level="warning",
            message=reason,
            fields={"reason": reason, **_operator_fields(by, None)},
        ),
        assign={
            **CLEAR_LEASE,
            "attempts": DECREMENT_ATTEMPTS,
            "run_after": Now(),
            "worker_id": None,
            "started_at": RESET_STARTED_AT,
        },
        using=using,
    )


# --- operator actions -----------------------------------------------------


def _operator_fields(by: str | None, reason: str | None) -> dict[str, Any]:
    return {k: v for k, v in {"by": by, "reason": reason}.items() if v}


DESCENDANTS_SQL = (
    "WITH RECURSIVE tree(id) AS ("
    f"SELECT id FROM {JOB_TABLE} WHERE parent_id IN {{roots}} "
    f"UNION SELECT j.id FROM {JOB_TABLE} j JOIN tree t ON j.parent_id = t.id"
    ") SELECT id FROM tree"
)


def cancel_jobs(
    job_ids: Sequence[uuid.UUID],
    *,
    by: str | None = None,
    reason: str | None = None,
    using: str = "default",
) -> list[uuid.UUID]:
    """Cancel queued and running jobs and, in the same transaction, all their descendants.

    Terminal jobs are left as they are. Pending batch messages of every
    cancelled job are dropped. Returns the ids that changed.
    """
    if not job_ids:
        return []
    d = dialect(using)
    fields = _operator_fields(by, reason)
    with transaction.atomic(using=using):
        moved = move(
            target=CANCELLED,
            job_ids=list(job_ids),
            event=Event(events.JOB_CANCELLED, level="warning", message=reason or "", fields=fields),
            assign={"finished_at": Now(), "leased_until": None},
            using=using,
        )
        with connections[using].cursor() as cursor:
            roots = [d.uuid(i) for i in job_ids]
            cursor.execute(DESCENDANTS_SQL.format(roots=d.in_list(len(roots))), roots)
            descendants = [d.read_id(r[0]) for r in cursor.fetchall()]
        moved += (
            move(
                target=CANCELLED,
                job_ids=descendants,
                event=Event(
                    events.JOB_CANCELLED,
                    level="warning",
                    message="parent cancelled",
                    fields={**fields, "cascade": True},
                ),
                assign={"finished_at": Now(), "leased_until": None},
                using=using,
            )
            if descendants
            else []
        )
        affected = [d.uuid(i) for i in [*job_ids, *descendants]]
        with connections[using].cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {BATCH_MESSAGE_TABLE} WHERE parent_id IN {d.in_list(len(affected))}",
                affected,
            )
    return [m.id for m in moved]


def cancel_job(
    job_id: uuid.UUID, *, by: str | None = None, reason: str | None = None, using: str = "default"
) -> bool:
    """Cancel one job (idempotent; a no-op on a terminal job). True if it changed."""
    from jobs.models import Job

    if not Job.objects.using(using).filter(pk=job_id).exists():
        raise JobNotFound(job_id)
    return job_id in cancel_jobs([job_id], by=by, reason=reason, using=using)


def _retry_assign() -> dict[str, Any]:
    return {
        **CLEAR_LEASE,
        "attempts": 0,
        "lease_requeues": 0,
        "retry_laters": 0,
        "run_after": Now(),
        "started_at": None,
        "finished_at": None,
        "worker_id": None,
        "error_code": "",
        "error_message": "",
        "result": Sql("NULL"),
    }


def notify_job_queues(job_ids: Sequence[uuid.UUID], *, using: str = "default") -> None:
    """Wake idle and long-polling workers of the queues of ``job_ids`` (PostgreSQL only)."""
    from jobs.models import Job

    if job_ids and dialect(using).postgres:
        jobs = Job.objects.using(using).filter(pk__in=list(job_ids))
        notify_queues(sorted(set(jobs.values_list("queue", flat=True))), using=using)


def retry_job(
    job_id: uuid.UUID, *, by: str | None = None, reason: str | None = None, using: str = "default"
) -> Moved:
    """Operator retry: failed or cancelled -> queued, with a fresh attempt budget.

    The fresh budget includes ``lease_requeues``: ``MAX_LEASE_REQUEUES`` counts
    lease rescues since the last operator retry, which is what an operator
    retrying a job expects. The job's queue is notified so workers claim it at once.
    While another job holds the job's unique key, ``UniqueKeyHeld`` (an
    ``IllegalTransition``) says which, and nothing changes.
    """
    try:
        with transaction.atomic(using=using):
            moved = move_one(
                job_id,
                target=QUEUED,
                sources=(FAILED, CANCELLED),
                event=Event(
                    events.JOB_RETRIED, message=reason or "", fields=_operator_fields(by, reason)
                ),
                assign=_retry_assign(),
                using=using,
            )
            after_retry([job_id], using=using)
            notify_job_queues([job_id], using=using)
    except IntegrityError as error:
        from jobs.key_holders import key_held_error

        held = key_held_error(job_id, using=using)
        if held is None:
            raise
        raise held from error
    return moved


def retry_jobs(
    job_ids: Sequence[uuid.UUID], *, by: str | None = None, reason: str | None = None
) -> list[uuid.UUID]:
    """Bulk operator retry: the failed or cancelled jobs among ``job_ids`` go back to queued.

    Jobs whose unique key another job holds stay as they are: when the one
    UPDATE meets such a key, the jobs are retried one by one instead.
    """
    try:
        with transaction.atomic():
            moved = move(
                target=QUEUED,
                sources=(FAILED, CANCELLED),
                job_ids=list(job_ids),
                event=Event(
                    events.JOB_RETRIED, message=reason or "", fields=_operator_fields(by, reason)
                ),
                assign=_retry_assign(),
            )
            after_retry([m.id for m in moved])
            notify_job_queues([m.id for m in moved])
    except IntegrityError:
        retried = []
        for job_id in job_ids:
            try:
                retry_job(job_id, by=by, reason=reason)
            except (IllegalTransition, JobNotFound):  # UniqueKeyHeld is one
                continue
            retried.append(job_id)
        return retried
    return [m.id for m in moved]


ANCESTORS_CANCELLED_SQL = (
    "WITH RECURSIVE up(id, parent_id, status) AS ("
    f"SELECT p.id, p.parent_id, p.status FROM {JOB_TABLE} c "
    f"JOIN {JOB_TABLE} p ON p.id = c.parent_id WHERE c.id = %s "
    f"UNION SELECT p.id, p.parent_id, p.status FROM {JOB_TABLE} p JOIN up ON p.id = up.parent_id"
    ") SELECT 1 FROM up WHERE status = 'cancelled' LIMIT 1"
)


def has_cancelled_ancestor(job_id: uuid.UUID, *, using: str = "default") -> bool:
    """Whether any ancestor of the job (parent, grandparent, …) is cancelled.

    The claim-time check for a child: a cancel cascades down in one
    transaction, but a child claimed just before it, or enqueued under a
    subtree whose root was cancelled, must not run either.
    """
    d = dialect(using)
    with connections[using].cursor() as cursor:
        cursor.execute(ANCESTORS_CANCELLED_SQL, [d.uuid(job_id)])
        return cursor.fetchone() is not None


# --- events during a run ----------------------------------------------------


def emit_event(
    job_id: uuid.UUID,
    *,
    event: str,
    message: str | None = None,
    level: str = "info",
    fields: dict[str, Any] | None = None,
    lease_token: uuid.UUID | None = None,
    using: str = "default",
) -> int:
    """Append an event to a job's timeline and return its seq.

    With ``lease_token`` the write is fenced: if the job was cancelled this
    raises ``JobCancelled``; if someone else holds it, ``LeaseLost``.
    ``_progress_current``/``_progress_total`` in ``fields`` update the job's progress.
    """
    d = dialect(using)
    fields = dict(fields or {})
    if fields.get("_progress_current") is not None or fields.get("_progress_total") is not None:
        # Checked (InvalidProgress) and clamped (current <= total) as stored.
        current, total = checked_progress(
            fields.get("_progress_current"), fields.get("_progress_total")
        )
        for key, value in (("_progress_current", current), ("_progress_total", total)):
            if value is not None:
                fields[key] = value
    now = None if d.postgres else timezone.now()
    now_sql, now_params = d.now(at=now)
    sets = ["last_event_seq = last_event_seq + 1", f"last_event_at = {now_sql}"]
    params: list[Any] = [*now_params]
    for key in ("_progress_current", "_progress_total"):
        if fields.get(key) is not None:
            sql, values = _progress_sql(key[1:], fields[key])
            sets.append(sql)
            params.extend(values)
    where, where_params = "id = %s", [d.uuid(job_id)]
    if lease_token is not None:
        where += " AND status = 'running' AND lease_token = %s"
        where_params.append(d.uuid(lease_token))
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute(
            f"UPDATE {JOB_TABLE} SET {', '.join(sets)} WHERE {where} RETURNING id, last_event_seq",
            [*params, *where_params],
        )
        rows = cursor.fetchall()
        if rows:
            write_events(cursor, d, rows, Event(event, level, message or "", fields), now)
    if not rows:
        error = _explain_miss(job_id, RUNNING, lease_token)
        if isinstance(error, LeaseLost) and error.status == CANCELLED:
            raise JobCancelled(job_id)
        raise error
    return rows[0][1]


# --- a run's buffered events (its execution log) ------------------------------------


@dataclass(frozen=True)
class RunEvent:
    """An event a run buffered: written ``age`` seconds after it happened."""

    event: str
    level: str
    message: str
    fields: dict[str, Any]
    age: float = 0.0


def append_run_events(
    job_id: uuid.UUID,
    run_events: Sequence[RunEvent],
    *,
    lease_token: uuid.UUID | None,
    using: str = "default",
) -> int:
    """Append ``run_events`` (in order) to a job's timeline in one transaction; return
    how many were written.

    Seqs are taken as one block from the job row (``last_event_seq + n``) under
    its row lock, so the timeline stays gap-free. Each event's ``ts`` is the
    database's time less its ``age``. Fenced loosely: written while the job is
    held with ``lease_token`` or held by nobody (the run's own tail after its
    outcome); never into a later run's timeline (another token): 0 then.
    Messages are stored as given (the caller caps them).
    """
    if not run_events:
        return 0
    d = dialect(using)
    count = len(run_events)
    now = None if d.postgres else timezone.now()
    now_sql, now_params = d.now(at=now)
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute(
            f"UPDATE {JOB_TABLE} SET last_event_seq = last_event_seq + %s, "
            f"last_event_at = {now_sql} "
            "WHERE id = %s AND (lease_token IS NULL OR lease_token = %s) "
            "RETURNING id, last_event_seq",
            [count, *now_params, d.uuid(job_id), d.uuid(lease_token)],
        )
        row = cursor.fetchone()
        if row is None:
            return 0
        db_id, last = row
        first = last - count + 1
        # Every row takes the same placeholders: PostgreSQL's ts is the statement's
        # time plus a (negative) interval, SQLite's this process's instant less the age.
        if d.postgres:
            ts_sql = "(statement_timestamp() + %s * interval '1 second')"
            stamps = [-item.age for item in run_events]
        else:
            ts_sql = "%s"
            stamps = [d.now(-item.age, at=now)[1][0] for item in run_events]
        cursor.executemany(
            f"INSERT INTO {EVENT_TABLE} (job_id, seq, ts, event, level, message, fields) "
            f"VALUES (%s, %s, {ts_sql}, %s, %s, %s, {d.json_param})",
            [
                (
                    db_id,
                    first + offset,
                    stamp,
                    item.event,
                    item.level,
                    item.message,
                    d.json(item.fields),
                )
                for offset, (item, stamp) in enumerate(zip(run_events, stamps, strict=True))
            ],
        )
    return count
