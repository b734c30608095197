"""The hot path: claiming jobs, extending leases, finishing many jobs at once.

Each is one or two statements for any number of jobs; on PostgreSQL the
claim writes its ``job.started`` events in the same statement.

Two status transitions live here rather than in ``jobs.transitions``, whose
``move`` would cost a statement per outcome: ``queued -> running`` (the
claim, ``_claim_update``) and ``running -> succeeded`` (the batched
completion, ``_completion_update``). Each is checked against the
allowed-transition table (``jobs.states.check_transition``) where its SQL
is built, and writes its event with the job's next ``seq`` like every other
transition. Every time
they write or compare (leases, ``run_after``, ``started_at``, event ``ts``)
is the database's ``statement_timestamp()`` (``Dialect.now``), never the
worker's clock: workers on machines whose clocks differ agree on leases.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Collection, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connections, transaction
from django.utils import timezone

from jobs.dependencies import release
from jobs.dialect import array_literal, dialect, int_element, quoted_element
from jobs.events import JOB_STARTED, JOB_SUCCEEDED
from jobs.states import QUEUED, RUNNING, SUCCEEDED, check_transition
from jobs.status_writes import Ended
from jobs.tables import EVENT_TABLE, JOB_TABLE, REMOTE_OPERATION_TABLE, WORKER_TABLE
from jobs.wakeups import notify_queues


@dataclass(frozen=True)
class Runner:
    """The process that runs a claimed job, written into its ``job.started`` event.

    The worker row is deleted when its worker stops; the event is not, so a
    job's timeline still says which host and process ran each attempt after a
    deploy replaced every worker.
    """

    host: str
    pid: int | None


_HOST = socket.gethostname()


def this_process() -> Runner:
    """This process as a runner (``os.getpid()`` read each time: worker processes fork)."""
    return Runner(_HOST, os.getpid())


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
    # Seconds this run may take (``Job.timeout_seconds``); None: no per-job timeout.
    timeout_seconds: float | None = None
    # The enqueuer's trace context (``Job.trace_context``): the run span's parent.
    trace_context: dict[str, str] | None = None
    # Others wait for it or it is a workflow's step: its success is written with what it
    # releases (``complete_followed``), not by the cycle's one statement.
    followed: bool = False


# --- claim ----------------------------------------------------------------

_RETURNING = (
    "RETURNING id, operation, queue, payload, attempts, max_attempts, parent_id, "
    "lease_token, last_event_seq, (expires_at IS NOT NULL AND expires_at <= {now}) AS expired, "
    "timeout_seconds, trace_context, (has_dependents OR workflow_id IS NOT NULL) AS followed, "
    "started_at"
)
# PostgreSQL only (data-modifying CTEs): the database's clock, as the UPDATE beside them.
_STARTED_EVENT = (
    f"SELECT id, last_event_seq, started_at, '{JOB_STARTED}', 'info', '', "
    "jsonb_build_object('worker', %s::text, 'host', %s::text, 'pid', %s::int, 'attempt', attempts) "
    "FROM claimed"
)
_SUCCEEDED_EVENT = (
    f"SELECT id, last_event_seq, statement_timestamp(), '{JOB_SUCCEEDED}', 'info', '', "
    "jsonb_build_object('duration_ms', duration_ms) FROM done"
)
_EVENT_COLUMNS = f"{EVENT_TABLE} (job_id, seq, ts, event, level, message, fields)"


def _started_fields(worker: str, runner: Runner, attempt: int) -> dict[str, Any]:
    """A ``job.started`` event's fields, as ``_STARTED_EVENT`` builds them on PostgreSQL."""
    return {"worker": worker, "host": runner.host, "pid": runner.pid, "attempt": attempt}


def _pick(
    d: Any,
    *,
    queues: Sequence[str],
    now: datetime | None,
    limit: int,
    operations: Sequence[str] | None,
    local_operations: Collection[str] | None,
) -> tuple[str, list[Any]]:
    """The SELECT of claimable ids, best first, ``FOR UPDATE SKIP LOCKED`` on PostgreSQL.

    ``local_operations`` leaves alone the jobs of operations that only remote
    workers provide (a live ``RemoteOperation`` this process does not run):
    read in the same statement, so a declaration is seen by the very next claim.

    PostgreSQL walks priority lanes (``controlplane_claimable_ids``, migration 0004):
    one ordered scan over ``(queue, priority DESC, run_after)`` would walk
    every job scheduled later at a higher priority before reaching today's
    work (100,000 future jobs made each claim read thousands of index
    entries). The function reads a ``(queue, priority)`` lane at a time, from
    the best priority down, each found by one descent of ``job_claimable_idx``
    and read only as far as ``run_after <= now``, and stops once it holds
    ``limit`` jobs: a future job costs nothing, and it locks what it takes.

    ``now`` is SQLite's instant (``Dialect.now``); PostgreSQL reads its own clock.
    """
    now_sql, now_params = d.now(at=now)
    if d.postgres:
        return (
            f"SELECT controlplane_claimable_ids(%s::text[], {now_sql}, %s, %s::text[], %s::text[])",
            [
                list(queues),
                limit,
                None if operations is None else list(operations),
                None if local_operations is None else list(local_operations),
            ],
        )
    conditions = [
        "status = 'queued'",
        "fair_turn IS NULL",  # keyed jobs are claimed by jobs.keyed_claims
        f"queue IN {d.in_list(len(queues))}",
        f"run_after <= {now_sql}",
    ]
    params: list[Any] = [*queues, *now_params]
    for condition, condition_params in operation_conditions(d, operations, local_operations):
        conditions.append(condition)
        params.extend(condition_params)
    sql = (
        f"SELECT id FROM {JOB_TABLE} WHERE {' AND '.join(conditions)} "
        "ORDER BY priority DESC, run_after LIMIT %s"
    )
    return sql, [*params, limit]


def operation_conditions(
    d: Any, operations: Sequence[str] | None, local_operations: Collection[str] | None
) -> list[tuple[str, list[Any]]]:
    """The pick's conditions on a job's operation: only ``operations``, none remote-only."""
    conditions: list[tuple[str, list[Any]]] = []
    if operations is not None:
        conditions.append((f"operation IN {d.in_list(len(operations))}", list(operations)))
    if local_operations is not None:
        remote = f"SELECT name FROM {REMOTE_OPERATION_TABLE} WHERE deleted = %s"
        params: list[Any] = [False]
        if local_operations:
            remote += f" AND name NOT IN {d.in_list(len(local_operations))}"
            params.extend(local_operations)
        conditions.append((f"operation NOT IN ({remote})", params))
    return conditions


def _claim_update(
    d: Any,
    *,
    pick: str,
    pick_params: list[Any],
    worker_id: uuid.UUID,
    now: datetime | None,
    lease_seconds: float,
    started_sql: str | None = None,
) -> tuple[str, list[Any]]:
    """The transition queued -> running of the picked jobs: UPDATE … RETURNING.

    PostgreSQL probes them by primary key. The pick reads queued jobs only.
    ``started_sql`` (PostgreSQL) is the start's time when it is not the
    statement's: a pick that counted running jobs later in the statement
    (``PickAfter``) starts its jobs after what it counted had ended.
    """
    check_transition(QUEUED, RUNNING)
    if started_sql is None:
        now_sql, now_params = d.now(at=now)
        lease_sql, lease_params = d.now(lease_seconds, at=now)
    else:
        now_sql, now_params = started_sql, []
        lease_sql, lease_params = f"({started_sql} + %s * interval '1 second')", [lease_seconds]
    # ``id = ANY(ARRAY(…))`` evaluates the pick once (an InitPlan) and then probes
    # controlplane_job_pkey: never a hash semi-join over a scan of the whole table.
    target = f"id = ANY(ARRAY({pick}))" if d.postgres else f"id IN ({pick})"
    sql = (
        f"UPDATE {JOB_TABLE} SET status = 'running', attempts = attempts + 1, "
        f"started_at = {now_sql}, leased_until = {lease_sql}, lease_token = {d.new_token}, "
        f"worker_id = %s, last_event_seq = last_event_seq + 1, last_event_at = {now_sql} "
        f"WHERE {target} {_RETURNING.format(now=now_sql)}"
    )
    params = [
        *now_params,
        *lease_params,
        d.uuid(worker_id),
        *now_params,
        *pick_params,
        *now_params,
    ]
    return sql, params


def _claimed(d: Any, r: Sequence[Any]) -> ClaimedJob:
    return ClaimedJob(
        id=d.read_id(r[0]),
        operation=r[1],
        queue=r[2],
        payload=d.read_json(r[3]) or {},
        attempt=r[4],
        max_attempts=r[5],
        parent_id=d.read_uuid(r[6]),
        lease_token=d.read_uuid(r[7]),
        expired=bool(r[9]),
        timeout_seconds=r[10],
        trace_context=d.read_json(r[11]),
        followed=bool(r[12]),
    )


def claim_jobs(
    *,
    queues: Sequence[str],
    worker_id: uuid.UUID,
    limit: int,
    lease_seconds: float,
    operations: Sequence[str] | None = None,
    local_operations: Collection[str] | None = None,
    cap: int | None = None,
    runner: Runner | None = None,
    using: str = "default",
) -> list[ClaimedJob]:
    """Claim up to ``limit`` claimable jobs in one statement and start them.

    Claim order is priority (larger first), then ``run_after``. On PostgreSQL
    the pick is ``FOR UPDATE SKIP LOCKED`` and the ``job.started`` events are
    written by the same statement; on SQLite the IMMEDIATE transaction
    serialises claimers.

    ``operations`` restricts the claim to those operations (remote workers).
    ``local_operations`` (local workers: their registry's names) skips jobs
    whose operation only remote workers provide; every other job is claimed,
    so a job of a genuinely unknown operation still fails ``UnknownOperation``.

    ``cap`` (one queue only) is a cap across every worker: the claim takes an
    advisory lock for the queue, counts its running jobs and claims at most
    ``cap - running``, so concurrent workers never exceed it together.

    ``runner`` (this process unless given: a remote worker's claim runs in a
    web process) is recorded with each ``job.started``.
    """
    if limit <= 0 or not queues or (operations is not None and not operations):
        return []
    d = dialect(using)
    now = None if d.postgres else timezone.now()  # PostgreSQL: its own clock, in the statement
    runner = runner or this_process()
    # On PostgreSQL an uncapped claim is one statement, atomic on its own.
    needs_transaction = cap is not None or not d.postgres
    scope = transaction.atomic(using=using) if needs_transaction else nullcontext()
    with scope, connections[using].cursor() as cursor:
        if cap is not None:
            if len(queues) != 1:
                raise ValueError("A concurrency cap applies to one queue at a time.")
            limit = min(limit, room_under_cap(cursor, d, queues[0], cap))
            if limit <= 0:
                return []
        pick, pick_params = _pick(
            d,
            queues=queues,
            now=now,
            limit=limit,
            operations=operations,
            local_operations=local_operations,
        )
        return start_picked(
            cursor,
            d,
            pick=pick,
            pick_params=pick_params,
            worker_id=worker_id,
            now=now,
            lease_seconds=lease_seconds,
            runner=runner,
        )


def room_under_cap(cursor: Any, d: Any, queue: str, cap: int) -> int:
    """How many more jobs of ``queue`` may start under its cap; call inside the claim's transaction.

    PostgreSQL takes the queue's advisory lock first, so concurrent claimers count in turn.
    """
    if d.postgres:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"cap:{queue}"])
    cursor.execute(
        f"SELECT count(*) FROM {JOB_TABLE} WHERE status = 'running' AND queue = %s", [queue]
    )
    return cap - cursor.fetchone()[0]


def start_picked(
    cursor: Any,
    d: Any,
    *,
    pick: str,
    pick_params: list[Any],
    worker_id: uuid.UUID,
    now: datetime | None,
    lease_seconds: float,
    runner: Runner,
) -> list[ClaimedJob]:
    """Move the jobs ``pick`` selects from queued to running, with their ``job.started`` events."""
    update, params = _claim_update(
        d,
        pick=pick,
        pick_params=pick_params,
        worker_id=worker_id,
        now=now,
        lease_seconds=lease_seconds,
    )
    worker_text = str(worker_id)
    if d.postgres:
        # Django's psycopg connections never prepare statements
        # (prepare_threshold=None), so every claim is planned afresh against
        # the table as it is now: no plan cached while the table was empty.
        cursor.execute(
            f"WITH claimed AS ({update}), ev AS (INSERT INTO {_EVENT_COLUMNS} "
            f"{_STARTED_EVENT}) SELECT * FROM claimed",
            [*params, worker_text, runner.host, runner.pid],
        )
        rows = cursor.fetchall()
    else:
        cursor.execute(update, params)
        rows = cursor.fetchall()
        cursor.executemany(
            f"INSERT INTO {_EVENT_COLUMNS} VALUES (%s, %s, %s, '{JOB_STARTED}', 'info', '', %s)",
            [
                (r[0], r[8], d.ts(now), d.json(_started_fields(worker_text, runner, r[4])))
                for r in rows
            ],
        )
    return [_claimed(d, r) for r in rows]


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
    now = None if d.postgres else timezone.now()
    now_sql, now_params = d.now(at=now)
    beat = (
        f"UPDATE {WORKER_TABLE} SET last_heartbeat = {now_sql} WHERE id = %s",
        [*now_params, d.uuid(worker_id)],
    )
    if not held:  # one statement: no transaction to open (remote workers poll this)
        with connections[using].cursor() as cursor:
            cursor.execute(*beat)
        return set()
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute(*beat)
        ids = [d.uuid(job_id) for job_id, _ in held]
        tokens = [d.uuid(token) for _, token in held]
        # Probed by primary key; a token belongs to one job, so "id in ours and
        # token in ours" is "this job with its own token".
        if d.postgres:
            where, params = "id = ANY(%s::uuid[]) AND lease_token = ANY(%s::uuid[])", [ids, tokens]
        else:
            where = f"id IN {d.in_list(len(ids))} AND lease_token IN {d.in_list(len(tokens))}"
            params = [*ids, *tokens]
        lease_sql, lease_params = d.now(lease_seconds, at=now)
        if d.postgres:
            # Never wait for a job row: the same worker's batched success write
            # (complete_and_claim) locks its rows in the batch's order, this in
            # the index's, and two waits made a deadlock. A row
            # locked right now (being completed, or by a reaper or an operator)
            # is skipped: its lease is extended at the next beat, and it counts
            # as held while this statement's snapshot shows it running with our
            # token. Rows that left us before the snapshot are reported lost.
            held_where = f"{where} AND (status = 'running') IS TRUE"
            cursor.execute(
                f"WITH locked AS (SELECT id FROM {JOB_TABLE} WHERE {held_where} "
                "FOR UPDATE SKIP LOCKED), "
                f"extended AS (UPDATE {JOB_TABLE} SET leased_until = {lease_sql} "
                f"FROM locked WHERE {JOB_TABLE}.id = locked.id RETURNING {JOB_TABLE}.id) "
                f"SELECT id FROM extended UNION ALL SELECT id FROM {JOB_TABLE} "
                f"WHERE {held_where} AND id NOT IN (SELECT id FROM locked)",
                [*params, *lease_params, *params],
            )
        else:
            cursor.execute(
                f"UPDATE {JOB_TABLE} SET leased_until = {lease_sql} "
                f"WHERE {where} AND (status = 'running') IS TRUE RETURNING id",
                [*lease_params, *params],
            )
        kept = {d.read_id(r[0]) for r in cursor.fetchall()}
    return {job_id for job_id, _ in held} - kept


@dataclass(frozen=True)
class Completion:
    job_id: uuid.UUID
    lease_token: uuid.UUID
    result: Any = None
    progress: tuple[int | None, int | None] | None = None
    duration_ms: int | None = None


def _completion_update(
    d: Any, completions: Sequence[Completion], now: datetime | None, *, followed: bool = False
) -> tuple[str, list[Any]]:
    """The transition running -> succeeded of many jobs, each fenced by its token.

    One UPDATE … FROM (VALUES …), or from arrays on PostgreSQL.

    The guard is written ``(status = 'running') IS TRUE``: the same meaning,
    but the planner cannot answer it from a partial index on ``status``
    (which would read every running row and every dead entry), so it probes
    the batch's ids in ``controlplane_job_pkey``.
    """
    check_transition(RUNNING, SUCCEEDED)
    now_sql, now_params = d.now(at=now)
    params: list[Any] = [*now_params, *now_params]
    if d.postgres:
        # Six arrays, whatever the batch size: the statement text never changes, so
        # psycopg converts it once (a text over 4 kB, as 32 VALUES rows made it,
        # was re-parsed client-side on every call: 40% of the worker's CPU).
        source = (
            "unnest(%s::uuid[], %s::uuid[], %s::jsonb[], %s::int[], %s::int[], %s::int[]) "
            "AS v(column1, column2, column3, column4, column5, column6)"
        )
        progress = [c.progress or (None, None) for c in completions]
        params += [
            array_literal(str(c.job_id) for c in completions),
            array_literal(str(c.lease_token) for c in completions),
            array_literal(quoted_element(d.json(c.result)) for c in completions),
            array_literal(int_element(p[0]) for p in progress),
            array_literal(int_element(p[1]) for p in progress),
            array_literal(int_element(c.duration_ms) for c in completions),
        ]
    else:
        source = f"(VALUES {', '.join(['(%s, %s, %s, %s, %s, %s)'] * len(completions))}) AS v"
        for c in completions:
            current, total = c.progress or (None, None)
            params += [
                d.uuid(c.job_id),
                d.uuid(c.lease_token),
                d.json(c.result),
                current,
                total,
                c.duration_ms,
            ]
    # A job whose end releases others or settles a workflow (jobs.dependencies)
    # is left out of the one-statement write, which has no transaction to
    # follow it up in: ``complete_followed`` writes it, ``followed=True``.
    flag = f"({JOB_TABLE}.has_dependents OR {JOB_TABLE}.workflow_id IS NOT NULL)"
    follow = f"AND {flag} " if followed else f"AND NOT {flag} "
    sql = (
        f"UPDATE {JOB_TABLE} SET status = 'succeeded', last_event_seq = last_event_seq + 1, "
        f"last_event_at = {now_sql}, finished_at = {now_sql}, result = v.column3, error_code = '', "
        "error_message = '', leased_until = NULL, lease_token = NULL, "
        "progress_current = COALESCE(v.column4, progress_current), "
        "progress_total = COALESCE(v.column5, progress_total) "
        f"FROM {source} "
        f"WHERE {JOB_TABLE}.id = v.column1 AND {JOB_TABLE}.lease_token = v.column2 "
        f"AND ({JOB_TABLE}.status = 'running') IS TRUE {follow}"
        f"RETURNING {JOB_TABLE}.id, {JOB_TABLE}.last_event_seq"
        + (f", {JOB_TABLE}.workflow_id" if followed else "")
    )
    return sql, params


def complete_jobs(completions: Sequence[Completion], *, using: str = "default") -> list[uuid.UUID]:
    """Many running -> succeeded moves in one transaction; returns the ids that moved.

    Each job keeps its own guard and lease fence; a job that was cancelled or
    reaped meanwhile is simply left out (its newer state wins).
    """
    if not completions:
        return []
    d = dialect(using)
    now = None if d.postgres else timezone.now()
    update, params = _completion_update(d, completions, now)
    if d.postgres:
        # One statement, atomic on its own: no BEGIN/COMMIT round trips.
        with connections[using].cursor() as cursor:
            cursor.execute(
                f"WITH done AS ({update}, v.column6 AS duration_ms) "
                f"INSERT INTO {_EVENT_COLUMNS} {_SUCCEEDED_EVENT} RETURNING job_id",
                params,
            )
            moved = [r[0] for r in cursor.fetchall()]
    else:
        with transaction.atomic(using=using), connections[using].cursor() as cursor:
            rows = _update_with_events(cursor, d, update, params, completions, now)
        moved = [d.read_id(r[0]) for r in rows]
    return moved + complete_followed(left_out(completions, moved), using=using)[0]


def _update_with_events(
    cursor: Any, d: Any, update: str, params: list[Any], completions: Sequence[Completion], now: Any
) -> list[Any]:
    """SQLite: the completions' UPDATE, then their events (RETURNING cannot name VALUES)."""
    durations = {d.uuid(c.job_id): c.duration_ms for c in completions}
    cursor.execute(update, params)
    rows = cursor.fetchall()
    cursor.executemany(
        f"INSERT INTO {_EVENT_COLUMNS} "
        f"VALUES (%s, %s, %s, '{JOB_SUCCEEDED}', 'info', '', {d.json_param})",
        [(r[0], r[1], d.ts(now), d.json({"duration_ms": durations.get(r[0])})) for r in rows],
    )
    return rows


def left_out(completions: Sequence[Completion], moved: Sequence[uuid.UUID]) -> list[Completion]:
    """The completions a one-statement write did not move: followed jobs, or lost leases."""
    if len(moved) == len(completions):
        return []
    done = set(moved)
    return [c for c in completions if c.job_id not in done]


@dataclass(frozen=True)
class Handoff:
    """A worker's claim made in the transaction that releases jobs (``complete_followed``)."""

    queues: Sequence[str]
    worker_id: uuid.UUID
    limit: int
    lease_seconds: float
    local_operations: Collection[str] | None = None


def complete_followed(
    completions: Sequence[Completion],
    *,
    handoff: Handoff | None = None,
    using: str = "default",
) -> tuple[list[uuid.UUID], list[ClaimedJob]]:
    """running -> succeeded of jobs whose end releases others, and that release, in one
    transaction (``jobs.dependencies.release``). Moves nothing for lost leases.

    ``complete_jobs`` calls it for what its one statement left out;
    ``complete_and_claim`` does not (its claims are committed by then): its
    caller passes it the completions it did not move (``left_out``).

    With ``handoff`` the worker claims, in the same transaction, up to as many
    jobs as the release made claimable (a chain's next step goes to the worker
    that ended the step before, without a NOTIFY round trip); only the queues
    of what it left are woken. Returns the ids that moved and the jobs claimed.
    """
    if not completions:
        return [], []
    d = dialect(using)
    now = None if d.postgres else timezone.now()
    update, params = _completion_update(d, completions, now, followed=True)
    claimed: list[ClaimedJob] = []
    with transaction.atomic(using=using, savepoint=False), connections[using].cursor() as cursor:
        if d.postgres:
            cursor.execute(
                f"WITH done AS ({update}, v.column6 AS duration_ms), "
                f"ev AS (INSERT INTO {_EVENT_COLUMNS} {_SUCCEEDED_EVENT}) "
                "SELECT id, workflow_id FROM done",
                params,
            )
            rows = cursor.fetchall()
        else:
            rows = [
                (r[0], r[2])
                for r in _update_with_events(cursor, d, update, params, completions, now)
            ]
        ended = [Ended(d.read_id(r[0]), SUCCEEDED, d.read_uuid(r[1])) for r in rows]
        released = release(ended, notify=handoff is None, using=using) if ended else []
        if handoff is not None and released:
            mine = sum(1 for _, queue in released if queue in handoff.queues)
            if mine and handoff.limit > 0:
                claimed = claim_jobs(
                    queues=handoff.queues,
                    worker_id=handoff.worker_id,
                    limit=min(handoff.limit, mine),
                    lease_seconds=handoff.lease_seconds,
                    local_operations=handoff.local_operations,
                    using=using,
                )
            taken = {job.id for job in claimed}
            left = sorted({queue for job, queue in released if job not in taken})
            notify_queues(left, using=using)
    return [e.id for e in ended], claimed


# --- both at once -------------------------------------------------------------


@dataclass
class PickAfter:
    """A pick that runs in ``complete_and_claim``'s statement after the plain one (keyed jobs).

    ``sql`` selects one row whose ``ids`` (uuid[]) are the jobs to start
    and ``at``, the database's clock when it chose them (or NULL): the
    claim's jobs start then, not at the statement's start, so their
    ``job.started`` never predates an end its choice saw. In it, before
    every placeholder of ``params``, ``{wanted}`` stands for how many the
    claim may still start and ``{ending}`` for a uuid[]: the lease tokens
    of the jobs the statement completes (they run no more). The
    row's other columns are read back into ``found`` (``jobs.keyed_claims``
    learns from them).
    """

    sql: str
    params: list[Any]
    found: dict[str, Any] | None = None


def _with_picks_after(
    ctes: list[str],
    params: list[Any],
    pick: str,
    pick_params: list[Any],
    after: Sequence[PickAfter],
    *,
    limit: int,
    completions: Sequence[Completion],
) -> tuple[str, list[Any], str]:
    """Add the plain pick and ``after`` as CTEs ``p0``, ``p1``…; the claim's pick and start time.

    Each later pick is told what the ones before it left of ``limit``.
    """
    ctes.append(f"p0 AS (SELECT ARRAY({pick}) AS ids)")
    params += pick_params
    taken = "cardinality((SELECT ids FROM p0))"
    ending = array_literal(str(c.lease_token) for c in completions)
    for i, later in enumerate(after, 1):
        call = later.sql.format(wanted=f"%s - {taken}", ending="%s::uuid[]")
        ctes.append(f"p{i} AS ({call})")
        params += [limit, ending, *later.params]
        taken += f" + cardinality((SELECT ids FROM p{i}))"
    picked = " || ".join(f"(SELECT ids FROM p{i})" for i in range(len(after) + 1))
    chosen_at = ", ".join(f"(SELECT at FROM p{i})" for i in range(1, len(after) + 1))
    return f"SELECT unnest({picked})", [], f"greatest(statement_timestamp(), {chosen_at})"


def complete_and_claim(
    completions: Sequence[Completion],
    *,
    queues: Sequence[str],
    worker_id: uuid.UUID,
    limit: int,
    lease_seconds: float,
    local_operations: Collection[str] | None = None,
    after: Sequence[PickAfter] = (),
    runner: Runner | None = None,
    using: str = "default",
) -> tuple[list[uuid.UUID], list[ClaimedJob]]:
    """``complete_jobs`` then an uncapped ``claim_jobs``, as one statement: one commit per cycle.

    PostgreSQL only (a data-modifying CTE). Returns the ids that moved to
    ``succeeded`` and the jobs claimed; completions of jobs whose end releases
    others are not moved: write them with ``complete_followed``. Both parts
    keep their own guarantees: each completion is fenced by its lease token,
    the pick is ``FOR UPDATE SKIP LOCKED`` and every transition writes its event (``job.succeeded``,
    ``job.started``) with the job's next ``seq``, in the same statement. The
    statement reads one snapshot, so the jobs it completes (running) and the
    jobs it claims (queued) never overlap.

    ``after``: picks that take what the plain pick of ``queues`` left of
    ``limit``, in order (``jobs.keyed_claims``), started by the same statement.
    """
    d = dialect(using)
    if not d.postgres:
        raise NotImplementedError("complete_and_claim needs PostgreSQL; call the two steps.")
    if limit <= 0:
        after = ()
    if not completions and not after:
        return [], claim_jobs(
            queues=queues,
            worker_id=worker_id,
            limit=limit,
            lease_seconds=lease_seconds,
            local_operations=local_operations,
            runner=runner,
            using=using,
        )
    if (limit <= 0 or not queues) and not after:
        return complete_jobs(completions, using=using), []
    now = None  # PostgreSQL: its own clock, in the statement
    ctes: list[str] = []
    params: list[Any] = []
    if completions:
        done, done_params = _completion_update(d, completions, now)
        ctes.append(f"done AS ({done}, v.column6 AS duration_ms)")
        params += done_params
    pick, pick_params = "SELECT NULL::uuid WHERE false", list[Any]()
    if queues:
        pick, pick_params = _pick(
            d,
            queues=queues,
            now=now,
            limit=limit,
            operations=None,
            local_operations=local_operations,
        )
    started_sql = None
    if after:
        pick, pick_params, started_sql = _with_picks_after(
            ctes, params, pick, pick_params, after, limit=limit, completions=completions
        )
    claim, claim_params = _claim_update(
        d,
        pick=pick,
        pick_params=pick_params,
        worker_id=worker_id,
        now=now,
        lease_seconds=lease_seconds,
        started_sql=started_sql,
    )
    ctes.append(f"claimed AS ({claim})")
    params += claim_params
    events = f"{_SUCCEEDED_EVENT} UNION ALL {_STARTED_EVENT}" if completions else _STARTED_EVENT
    ctes.append(f"ev AS (INSERT INTO {_EVENT_COLUMNS} {events})")
    runner = runner or this_process()
    params += [str(worker_id), runner.host, runner.pid]
    parts = [
        "SELECT id, operation, queue, payload, attempts, max_attempts, parent_id, lease_token, "
        "last_event_seq, expired, timeout_seconds, trace_context, followed FROM claimed"
    ]
    if completions:
        parts.append(
            "SELECT id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
            "NULL FROM done"
        )
    parts += [
        f"SELECT NULL, '{i}', NULL, to_jsonb(p{i}) - 'ids' "
        f"|| jsonb_build_object('started', cardinality(p{i}.ids)), "
        f"NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM p{i}"
        for i in range(1, len(after) + 1)
    ]
    sql = f"WITH {', '.join(ctes)} {' UNION ALL '.join(parts)}"
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    for r in rows:
        if r[0] is None:
            after[int(r[1]) - 1].found = d.read_json(r[3])
    moved = [r[0] for r in rows if r[0] is not None and r[1] is None]
    return moved, [_claimed(d, r) for r in rows if r[0] is not None and r[1] is not None]
