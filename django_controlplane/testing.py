"""Helpers for a host project's tests: what was enqueued, and running it in the test.

Works under pytest-django (``db`` and ``transactional_db``) and Django's
``TestCase`` / ``TransactionTestCase``, on SQLite and PostgreSQL:

- ``assert_enqueued`` / ``refute_enqueued``: a job was (not) enqueued, by
  operation, queue and a payload subset; a failure lists what *was* enqueued.
- ``drain_jobs``: runs the jobs enqueued so far in the calling thread, on the
  test's own database connection, through the worker's own claim
  (``jobs.claims.claim_jobs``), run (``workers.execution.JobRunner``) and
  success write (``jobs.claims.complete_jobs``). So ``job.started`` /
  ``job.succeeded`` events, retries, children and batch queues behave as a
  worker makes them behave. The test's connection matters: inside
  ``TestCase``'s wrapping transaction no other connection sees the test's rows.
- ``run_jobs_at_once``: a context manager during which every enqueue (from
  this thread) runs its job straight away, through ``drain_jobs``.

What a worker does that a drain does not: per-job timeouts (the run is not
abandoned; it runs to its end), queue pauses, concurrency caps and rate
limits (a drain runs one job at a time, whatever the queue's settings), and
leases running out (a drain's lease is an hour). An operation that raises
``SystemExit`` or ``KeyboardInterrupt`` stops the test, as it would stop a
worker's main thread. The core (``jobs``, ``workers``) never imports this module.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.db import DataError, connection, connections, transaction

from jobs import signals, transitions
from jobs.batches import ClaimedMessage, claim_messages
from jobs.claims import ClaimedJob, claim_jobs, complete_jobs
from jobs.clock import DatabaseNow
from jobs.conf import knob
from jobs.enqueue_hooks import add_after_enqueue
from jobs.exceptions import LeaseLost
from jobs.independent import ALIAS as INDEPENDENT_ALIAS
from jobs.models import BatchMessage, Job, Queue, QueueKind, Schedule
from jobs.operations import OperationRegistry
from jobs.operations import registry as default_registry
from jobs.rescheduling import NotWaiting, run_job_now
from jobs.states import QUEUED
from workers.batch_runner import MessageFlight, run_message
from workers.execution import InFlight, JobRunner

__all__ = [
    "TEST_WORKER_ID",
    "JobRun",
    "MessageRun",
    "RunResult",
    "assert_enqueued",
    "drain_jobs",
    "enqueued_jobs",
    "refute_enqueued",
    "run_jobs_at_once",
]

# The worker id every drained job's ``job.started`` names: one fixed id, so a
# test can tell the jobs it ran itself from those of a real worker.
TEST_WORKER_ID = uuid.UUID("00000000-0000-4000-8000-000000007e57")
# A drain holds each lease for the length of one run: an hour, so no lease runs
# out under a slow test (nothing reaps them in a test anyway).
LEASE_SECONDS = 3600.0
# How many enqueued jobs an assertion's message lists before it says "… and N more".
LISTED_JOBS = 50

# What a success write may raise for one job's values: the worker fails that job.
_VALUE_ERRORS = (DataError, ValueError, TypeError, OverflowError)


# --- what was enqueued ---------------------------------------------------------------


def payload_contains(actual: Any, expected: Any) -> bool:
    """Whether ``actual`` holds ``expected``: dicts as subsets (nested too), the rest equal.

    A subset because a test usually cares about one or two keys of a payload,
    and spelling out the rest would break it whenever a key is added.
    """
    if isinstance(expected, Mapping):
        return isinstance(actual, Mapping) and all(
            key in actual and payload_contains(actual[key], value)
            for key, value in expected.items()
        )
    return bool(actual == expected)


def enqueued_jobs(
    operation: str | None = None,
    *,
    queue: str | None = None,
    payload: Mapping[str, Any] | None = None,
    parent: Job | uuid.UUID | str | None = None,
    schedule: Schedule | uuid.UUID | str | None = None,
) -> list[Job]:
    """Every stored job (any status, children too) matching all the given criteria, oldest first.

    ``parent`` (a ``Job`` or its id) keeps the children that job enqueued;
    ``schedule`` (a ``Schedule`` or its id) keeps the jobs that schedule fired.
    """
    jobs = Job.objects.all()
    if operation is not None:
        jobs = jobs.filter(operation=operation)
    if queue is not None:
        jobs = jobs.filter(queue=queue)
    if parent is not None:
        jobs = jobs.filter(parent=parent)
    if schedule is not None:
        jobs = jobs.filter(schedule=schedule)
    found = list(jobs.order_by("created_at", "id"))
    if payload is not None:
        found = [job for job in found if payload_contains(job.payload, payload)]
    return found


def _pk(value: Any) -> Any:
    """A model instance's primary key (what a failure message names), anything else as given."""
    return getattr(value, "pk", value)


def _criteria(
    operation: str | None,
    queue: str | None,
    payload: Any,
    parent: Any = None,
    schedule: Any = None,
) -> str:
    parts = [
        f"{name}={value!r}"
        for name, value in (
            ("operation", operation),
            ("queue", queue),
            ("parent", _pk(parent)),
            ("schedule", _pk(schedule)),
        )
        if value is not None
    ]
    if payload is not None:
        parts.append(f"payload containing {payload!r}")
    return ", ".join(parts) or "any job"


def _listing(jobs: list[Job], heading: str) -> str:
    if not jobs:
        return f"{heading}: none."
    lines = [
        f"  - {job.operation} queue={job.queue!r} status={job.status} payload={job.payload!r}"
        for job in jobs[:LISTED_JOBS]
    ]
    if len(jobs) > LISTED_JOBS:
        lines.append(f"  … and {len(jobs) - LISTED_JOBS} more")
    return f"{heading} ({len(jobs)}):\n" + "\n".join(lines)


def assert_enqueued(
    operation: str | None = None,
    *,
    queue: str | None = None,
    payload: Mapping[str, Any] | None = None,
    parent: Job | uuid.UUID | str | None = None,
    schedule: Schedule | uuid.UUID | str | None = None,
    count: int | None = None,
) -> list[Job]:
    """Assert that matching jobs were enqueued (at least one, or exactly ``count``); return them.

    ``payload`` matches a subset (``payload_contains``); ``parent`` and
    ``schedule`` as in ``enqueued_jobs``. A job counts whatever its status
    now, so it still counts after ``drain_jobs`` ran it. The
    ``AssertionError`` lists every job that was enqueued, to show the near miss.
    """
    found = enqueued_jobs(operation, queue=queue, payload=payload, parent=parent, schedule=schedule)
    if (len(found) >= 1) if count is None else (len(found) == count):
        return found
    wanted = "at least one job" if count is None else f"exactly {count} job(s)"
    criteria = _criteria(operation, queue, payload, parent, schedule)
    raise AssertionError(
        f"Expected {wanted} with {criteria}; found {len(found)}.\n"
        + _listing(enqueued_jobs(), "Enqueued jobs")
    )


def refute_enqueued(
    operation: str | None = None,
    *,
    queue: str | None = None,
    payload: Mapping[str, Any] | None = None,
    parent: Job | uuid.UUID | str | None = None,
    schedule: Schedule | uuid.UUID | str | None = None,
) -> None:
    """Assert that no job matching the criteria was enqueued; the error lists those that were."""
    found = enqueued_jobs(operation, queue=queue, payload=payload, parent=parent, schedule=schedule)
    if found:
        criteria = _criteria(operation, queue, payload, parent, schedule)
        raise AssertionError(
            f"Expected no job with {criteria}; found {len(found)}.\n"
            + _listing(found, "Matching jobs")
        )


# --- running them --------------------------------------------------------------------


@dataclass(frozen=True)
class JobRun:
    """One run of one job, as the worker's runner reported it."""

    job_id: uuid.UUID
    operation: str
    queue: str
    attempt: int
    # The runner's outcome: succeeded, failed, retry_scheduled, retry_later, deferred,
    # cancelled… (``workers.execution.Outcome.status``).
    outcome: str


@dataclass(frozen=True)
class MessageRun:
    """One batch message processed or written (``workers.batch_runner.run_message``)."""

    message_id: int
    queue: str
    operation: str
    batch_index: int
    # processed, written, closed_parent, retry_scheduled, failed_parent, dropped…
    outcome: str


@dataclass
class RunResult:
    """What one or more drains ran, in order."""

    runs: list[JobRun] = field(default_factory=list)
    messages: list[MessageRun] = field(default_factory=list)
    # True when a drain stopped at its ``limit`` with jobs or messages still due.
    hit_limit: bool = False

    @property
    def job_ids(self) -> list[uuid.UUID]:
        """The ids of the jobs run, each once, in the order of their first run."""
        return list(dict.fromkeys(run.job_id for run in self.runs))

    @property
    def jobs(self) -> list[Job]:
        """The jobs run, read from the database now (their final state), in first-run order."""
        by_id = Job.objects.in_bulk(self.job_ids)
        return [by_id[job_id] for job_id in self.job_ids if job_id in by_id]

    @property
    def counts(self) -> dict[str, int]:
        """How many of the jobs run are in each status now (read from the database)."""
        out: dict[str, int] = {}
        for job in self.jobs:
            out[job.status] = out.get(job.status, 0) + 1
        return out


class _Drain:
    """One drain in progress: the queues it serves may grow (``run_jobs_at_once``)."""

    def __init__(self, queues: set[str] | None) -> None:
        self.queues = queues  # None: every queue


_local = threading.local()  # .drain: the _Drain running in this thread, if any


def _runner(registry: OperationRegistry) -> JobRunner:
    """The runner a worker builds (``workers.engine.JobWorker``), from the same knobs."""
    return JobRunner(
        registry,
        retry_backoff_seconds=float(knob("RETRY_BACKOFF_SECONDS")),
        retry_backoff_max_seconds=float(knob("RETRY_BACKOFF_MAX_SECONDS")),
        max_outage_requeues=int(knob("MAX_OUTAGE_REQUEUES")),
    )


@contextmanager
def _writes_on_this_connection() -> Iterator[None]:
    """Inside a transaction, send the runner's "independent" writes through this connection.

    A worker writes an atomic operation's ``emit`` (PostgreSQL) and a
    last-resort failure on a second connection (``jobs.independent``), so they
    commit on their own. Inside ``TestCase``'s wrapping transaction that
    connection cannot see the test's uncommitted rows and would wait forever
    on the job row's lock; here it is this connection, so those writes join
    the test's transaction (and an atomic operation that fails rolls its
    emitted events back with it, unlike in production). Outside a
    transaction the worker's second connection is used, and closed at the end.
    """
    try:
        previous = connections[INDEPENDENT_ALIAS]
    except Exception:  # noqa: BLE001 - not created in this thread yet
        previous = None
    redirect = connection.in_atomic_block
    if redirect:
        connections[INDEPENDENT_ALIAS] = connections["default"]
    try:
        yield
    finally:
        if redirect:
            if previous is None:
                del connections[INDEPENDENT_ALIAS]
            else:
                connections[INDEPENDENT_ALIAS] = previous
        elif previous is None:
            _close_independent()


def _close_independent() -> None:
    """Close the second connection a drain opened: PostgreSQL cannot drop the test
    database at the end of the session while it stays open."""
    try:
        opened = connections[INDEPENDENT_ALIAS]
    except Exception:  # noqa: BLE001 - the drain never opened one
        return
    opened.close()
    del connections[INDEPENDENT_ALIAS]


def _job_queues(drain: _Drain) -> list[str]:
    if drain.queues is not None:
        return sorted(drain.queues)
    return sorted(set(Job.objects.filter(status=QUEUED).values_list("queue", flat=True)))


def _batch_queues(drain: _Drain) -> list[str]:
    if drain.queues is None:
        return sorted(set(BatchMessage.objects.values_list("queue", flat=True)))
    named = set(
        Queue.objects.filter(name__in=drain.queues, kind=QueueKind.BATCH).values_list(
            "name", flat=True
        )
    )
    return sorted(named | {q for q in drain.queues if q.endswith((".batch", ".write"))})


def _run_job(runner: JobRunner, job: ClaimedJob) -> JobRun:
    """Run one claimed job as ``JobWorker._execute`` does, and write its success as it does."""
    flight = InFlight(job)
    flight.thread_id = threading.get_ident()
    outcome = runner.run(flight)
    if outcome.completion is not None:
        completion = outcome.completion
        try:
            with transaction.atomic():
                moved = complete_jobs([completion])
                if moved and signals.wanted(signals.job_succeeded, runner.registry):
                    success = signals.success_outcome(job, completion)
                    signals.dispatch(signals.job_succeeded, [success], registry=runner.registry)
        except _VALUE_ERRORS as refused:
            # JobWorker._fail_unstorable: the database refused the result; the job fails.
            try:
                transitions.fail_job(
                    completion.job_id,
                    lease_token=completion.lease_token,
                    error_code="ResultNotStorable",
                    error_message=(
                        "The database refused to store this job's result or progress: "
                        f"{type(refused).__name__}: {refused}".strip()
                    ),
                )
            except LeaseLost:
                pass
            return JobRun(job.id, job.operation, job.queue, job.attempt, "failed")
    return JobRun(job.id, job.operation, job.queue, job.attempt, outcome.status)


def _run_message(message: ClaimedMessage) -> MessageRun:
    outcome = run_message(MessageFlight(message))
    return MessageRun(message.id, message.queue, message.operation, message.batch_index, outcome)


def _bring_one_forward(queues: list[str]) -> bool:
    """Make the earliest waiting job of ``queues`` due now (``run_job_now``); False if none.

    One at a time, earliest first, as the passing of time would release them,
    so due jobs always run before the ones brought forward.
    """
    if not queues:
        return False
    waiting = (
        Job.objects.filter(status=QUEUED, queue__in=queues, run_after__gt=DatabaseNow())
        .order_by("run_after", "id")
        .values_list("id", flat=True)
    )
    for job_id in waiting[:10]:
        try:
            run_job_now(job_id, by="drain_jobs", reason="include_scheduled=True")
            return True
        except NotWaiting:
            continue  # became due meanwhile: the next claim takes it
    return False


def _due_left(drain: _Drain) -> bool:
    queues = _job_queues(drain)
    if Job.objects.filter(status=QUEUED, queue__in=queues, run_after__lte=DatabaseNow()).exists():
        return True
    return BatchMessage.objects.filter(
        queue__in=_batch_queues(drain), visible_after__lte=DatabaseNow()
    ).exists()


def _drain(
    drain: _Drain,
    result: RunResult,
    *,
    limit: int,
    include_scheduled: bool,
    registry: OperationRegistry,
) -> RunResult:
    runner = _runner(registry)
    local_operations = registry.names()
    done = 0
    outer = getattr(_local, "drain", None)
    _local.drain = drain
    try:
        with _writes_on_this_connection():
            while True:
                if done >= limit:
                    result.hit_limit = result.hit_limit or _due_left(drain)
                    break
                queues = _job_queues(drain)
                claimed = claim_jobs(
                    queues=queues,
                    worker_id=TEST_WORKER_ID,
                    limit=1,
                    lease_seconds=LEASE_SECONDS,
                    local_operations=local_operations,
                )
                if claimed:
                    result.runs.append(_run_job(runner, claimed[0]))
                    done += 1
                    continue
                message = None
                for queue in _batch_queues(drain):
                    messages = claim_messages(
                        queue=queue, limit=1, visibility_seconds=LEASE_SECONDS
                    )
                    if messages:
                        message = messages[0]
                        break
                if message is not None:
                    result.messages.append(_run_message(message))
                    done += 1
                    continue
                if include_scheduled and _bring_one_forward(queues):
                    continue
                break
    finally:
        _local.drain = outer
    return result


def drain_jobs(
    *,
    queues: list[str] | tuple[str, ...] | set[str] | None = None,
    limit: int = 1000,
    include_scheduled: bool = False,
    registry: OperationRegistry | None = None,
) -> RunResult:
    """Run due jobs (and batch messages) one at a time, here, until none is left or ``limit``.

    ``queues``: the queues to serve, as ``runworker --queue`` names them (a
    batch queue, ``<queue>.batch`` / ``<queue>.write``, only when named);
    None serves every queue, batch queues included. Jobs enqueued by the
    jobs run (children, retries, batches) run in the same drain when they
    are due in a served queue.

    ``include_scheduled``: when nothing is due, the earliest job waiting for
    a later ``run_after`` (scheduled, or a retry's backoff) is made due with
    ``jobs.rescheduling.run_job_now`` (its timeline shows ``job.run_now``),
    and the drain goes on; a batch message waiting for its retry is not
    brought forward (nothing public does that) and stays.

    ``limit`` counts runs (a retried job counts each run); reaching it with
    work still due sets ``hit_limit`` on the result instead of raising, so a
    test can assert on what did run. Returns the runs in order; the result's
    ``jobs`` and ``counts`` read each job's final state.
    """
    if limit < 0:
        raise ValueError("limit must be 0 or more.")
    drain = _Drain(set(queues) if queues is not None else None)
    return _drain(
        drain,
        RunResult(),
        limit=limit,
        include_scheduled=include_scheduled,
        registry=registry or default_registry,
    )


@contextmanager
def run_jobs_at_once(*, include_scheduled: bool = False, limit: int = 1000) -> Iterator[RunResult]:
    """While active, every job enqueued from this thread runs right after its enqueue.

    Each enqueue (``enqueue``, ``enqueue_many``, the REST API's or the tasks
    backend's, called in this thread on the ``default`` database) drains the
    queues of the jobs it made (``drain_jobs``), so the job has run, with its
    children, before ``enqueue`` returns. The ``Job`` that ``enqueue``
    returns is the one it stored: ``refresh_from_db()`` reads its outcome.
    Jobs already due on those queues run too (a worker takes them first),
    a job scheduled for later waits unless ``include_scheduled``, and a held
    unique key (a duplicate) runs nothing. Failures are recorded as a worker
    records them, not raised. Enqueues in other threads (a live server) are
    left to workers. Yields the ``RunResult`` that collects every run.
    """
    result = RunResult()
    thread = threading.get_ident()

    def run_now(jobs: Any, using: str) -> None:
        if threading.get_ident() != thread or using != "default":
            return
        queues = {job.queue for job in jobs if not getattr(job, "duplicate", False)}
        if not queues:
            return
        active: _Drain | None = getattr(_local, "drain", None)
        if active is not None:  # a job enqueued by a running job: that drain takes it
            if active.queues is not None:
                active.queues |= queues
            return
        _drain(
            _Drain(queues),
            result,
            limit=limit,
            include_scheduled=include_scheduled,
            registry=default_registry,
        )

    remove = add_after_enqueue(run_now)
    try:
        yield result
    finally:
        remove()
