"""The hot path: claiming jobs, extending leases, finishing many jobs at once.

Each is one or two statements for any number of jobs; on PostgreSQL the
claim writes its ``job.started`` events in the same statement.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import connections, transaction
from django.utils import timezone

from jobs.dialect import dialect
from jobs.states import RUNNING, SUCCEEDED, check_transition
from jobs.transitions import EVENT_TABLE, JOB_TABLE


@dataclass(frozen=True)
class ClaimedJob:
    id: uuid.UUID
    operation: str
    queue: str
    payload: dict[str, Any]
    attempt: int
    max_attempts: int
    parent_id: uuid.UUID | None
    lease_token: uuid.UUID
    expired: bool


# --- claim ----------------------------------------------------------------

def claim_jobs(
    *,
    queues: Sequence[str],
    worker_id: uuid.UUID,
    limit: int,
    lease_seconds: float,
    operations: Sequence[str] | None = None,
    cap: int | None = None,
    using: str = "default",
) -> list[ClaimedJob]:
    """Claim up to ``limit`` claimable jobs in one statement and start them.

    Claim order is priority (larger first), then ``run_after``. On PostgreSQL
    the pick is ``FOR UPDATE SKIP LOCKED`` and the ``job.started`` events are
    written by the same statement; on SQLite the IMMEDIATE transaction
    serialises claimers.

    ``cap`` (one queue only) is horsies' cluster-wide cap: the claim takes an
    advisory lock for the queue, counts its running jobs and claims at most
    ``cap - running``, so concurrent workers never exceed it together.
    """
    if limit <= 0 or not queues:
        return []
    d = dialect(using)
    now = timezone.now()
    pick_conditions = [
        "status = 'queued'",
        f"queue IN {d.in_list(len(queues))}",
        "run_after <= %s",
    ]
    pick_params: list[Any] = [*queues, d.ts(now)]
    if operations is not None:
        if not operations:
            return []
        pick_conditions.append(f"operation IN {d.in_list(len(operations))}")
        pick_params.extend(operations)
    pick = (
        f"SELECT id FROM {JOB_TABLE} WHERE {' AND '.join(pick_conditions)} "
        "ORDER BY priority DESC, run_after LIMIT %s"
    )
    pick_params.append(limit)
    if d.postgres:
        pick += " FOR UPDATE SKIP LOCKED"
    update = (
        f"UPDATE {JOB_TABLE} SET status = 'running', attempts = attempts + 1, "
        f"started_at = %s, leased_until = %s, lease_token = {d.new_token}, worker_id = %s, "
        "last_event_seq = last_event_seq + 1, last_event_at = %s "
        f"WHERE id IN ({pick}) "
        "RETURNING id, operation, queue, payload, attempts, max_attempts, parent_id, "
        "lease_token, last_event_seq, "
        "(expires_at IS NOT NULL AND expires_at <= %s) AS expired"
    )
    lease_until = now + timedelta(seconds=lease_seconds)
    params = [d.ts(now), d.ts(lease_until), d.uuid(worker_id), d.ts(now), *pick_params, d.ts(now)]
    worker_text = str(worker_id)
    # On PostgreSQL an uncapped claim is one statement, atomic on its own.
    needs_transaction = cap is not None or not d.postgres
    scope = transaction.atomic(using=using) if needs_transaction else nullcontext()
    with scope, connections[using].cursor() as cursor:
        if cap is not None:
            if len(queues) != 1:
                raise ValueError("A concurrency cap applies to one queue at a time.")
            if d.postgres:
                cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"cap:{queues[0]}"])
            cursor.execute(
                f"SELECT count(*) FROM {JOB_TABLE} WHERE status = 'running' AND queue = %s",
                [queues[0]],
            )
            free = cap - cursor.fetchone()[0]
            if free <= 0:
                return []
            params[-2] = min(limit, free)  # the LIMIT of the pick
        if d.postgres:
            # Django's psycopg connections never prepare statements
            # (prepare_threshold=None), so every claim is planned afresh against
            # the table as it is now: no plan cached while the table was empty.
            cursor.execute(
                f"WITH claimed AS ({update}), ev AS ("
                f"INSERT INTO {EVENT_TABLE} (job_id, seq, ts, event, level, message, fields) "
                "SELECT id, last_event_seq, %s, 'job.started', 'info', '', "
                "jsonb_build_object('worker', %s::text, 'attempt', attempts) FROM claimed) "
                "SELECT * FROM claimed",
                [*params, d.ts(now), worker_text],
            )
            rows = cursor.fetchall()
        else:
            cursor.execute(update, params)
            rows = cursor.fetchall()
            cursor.executemany(
                f"INSERT INTO {EVENT_TABLE} (job_id, seq, ts, event, level, message, fields) "
                "VALUES (%s, %s, %s, 'job.started', 'info', '', %s)",
                [
                    (r[0], r[8], d.ts(now), d.json({"worker": worker_text, "attempt": r[4]}))
                    for r in rows
                ],
            )
    claimed = [
        ClaimedJob(
            id=d.read_uuid(r[0]),
            operation=r[1],
            queue=r[2],
            payload=d.read_json(r[3]) or {},
            attempt=r[4],
            max_attempts=r[5],
            parent_id=d.read_uuid(r[6]),
            lease_token=d.read_uuid(r[7]),
            expired=bool(r[9]),
        )
        for r in rows
    ]
    return claimed


# --- leases ---------------------------------------------------------------

def extend_leases(
    *,
    worker_id: uuid.UUID,
    held: Sequence[tuple[uuid.UUID, uuid.UUID]],
    lease_seconds: float,
    using: str = "default",
) -> set[uuid.UUID]:
    """Extend the leases of ``held`` (job id, token) pairs; return the ids no longer held.

    A job missing from the result was cancelled, or reaped and maybe handed
    to someone else: the caller must stop it and write nothing over it.
    Also refreshes the worker's heartbeat, in the same transaction.
    """
    d = dialect(using)
    now = timezone.now()
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute(
            "UPDATE jobs_worker SET last_heartbeat = %s WHERE id = %s",
            [d.ts(now), d.uuid(worker_id)],
        )
        if not held:
            return set()
        tokens = [d.uuid(token) for _, token in held]
        cursor.execute(
            f"UPDATE {JOB_TABLE} SET leased_until = %s "
            f"WHERE status = 'running' AND lease_token IN {d.in_list(len(tokens))} "
            "RETURNING id",
            [d.ts(now + timedelta(seconds=lease_seconds)), *tokens],
        )
        kept = {d.read_uuid(r[0]) for r in cursor.fetchall()}
    return {job_id for job_id, _ in held} - kept


@dataclass(frozen=True)
class Completion:
    job_id: uuid.UUID
    lease_token: uuid.UUID
    result: Any = None
    progress: tuple[int | None, int | None] | None = None
    duration_ms: int | None = None


def complete_jobs(completions: Sequence[Completion], *, using: str = "default") -> list[uuid.UUID]:
    """Many running -> succeeded moves in one transaction; returns the ids that moved.

    Each job keeps its own guard and lease fence; a job that was cancelled or
    reaped meanwhile is simply left out (its newer state wins).
    """
    if not completions:
        return []
    check_transition(RUNNING, SUCCEEDED)
    d = dialect(using)
    now = timezone.now()
    cast = "::int" if d.postgres else ""
    row = f"({d.uuid_param}, {d.uuid_param}, {d.json_param}, %s{cast}, %s{cast}, %s{cast})"
    params: list[Any] = [d.ts(now), d.ts(now)]
    for c in completions:
        current, total = c.progress or (None, None)
        params += [
            d.uuid(c.job_id), d.uuid(c.lease_token), d.json(c.result), current, total,
            c.duration_ms,
        ]
    returning = f"{JOB_TABLE}.id, {JOB_TABLE}.last_event_seq"
    update = (
        f"UPDATE {JOB_TABLE} SET status = 'succeeded', last_event_seq = last_event_seq + 1, "
        "last_event_at = %s, finished_at = %s, result = v.column3, error_code = '', "
        "error_message = '', leased_until = NULL, lease_token = NULL, "
        "progress_current = COALESCE(v.column4, progress_current), "
        "progress_total = COALESCE(v.column5, progress_total) "
        f"FROM (VALUES {', '.join([row] * len(completions))}) AS v "
        f"WHERE {JOB_TABLE}.id = v.column1 AND {JOB_TABLE}.lease_token = v.column2 "
        f"AND {JOB_TABLE}.status = 'running' RETURNING {returning}"
    )
    if d.postgres:
        # One statement, atomic on its own: no BEGIN/COMMIT round trips.
        with connections[using].cursor() as cursor:
            cursor.execute(
                f"WITH done AS ({update}, v.column6 AS duration_ms) INSERT INTO {EVENT_TABLE} "
                "(job_id, seq, ts, event, level, message, fields) "
                "SELECT id, last_event_seq, %s, 'job.succeeded', 'info', '', "
                "jsonb_build_object('duration_ms', duration_ms) FROM done RETURNING job_id",
                [*params, d.ts(now)],
            )
            return [r[0] for r in cursor.fetchall()]
    # SQLite: RETURNING cannot name the VALUES table; take durations from our side.
    durations = {d.uuid(c.job_id): c.duration_ms for c in completions}
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute(update, params)
        rows = cursor.fetchall()
        cursor.executemany(
            f"INSERT INTO {EVENT_TABLE} (job_id, seq, ts, event, level, message, fields) "
            f"VALUES (%s, %s, %s, 'job.succeeded', 'info', '', {d.json_param})",
            [
                (r[0], r[1], d.ts(now), d.json({"duration_ms": durations.get(r[0])}))
                for r in rows
            ],
        )
    return [d.read_uuid(r[0]) for r in rows]


