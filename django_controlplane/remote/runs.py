"""What a remote worker does with jobs: claim (long-poll), emit, complete, fail.

Every write on a held job is fenced by its ``lease_token``: the transition
functions match on it, so a worker whose lease was lost (requeued, reaped,
claimed by someone else, cancelled) gets ``LeaseLost``/``JobCancelled``
(409 at the API) and changes nothing. The token is also bound to the account
whose worker claimed the job: the same token from another account is
``LeaseNotYours`` (403), so a leaked token cannot finish someone else's job.
What a report would store is checked first (``jobs.storable``): text no
database holds, nesting past ``MAX_DEPTH`` and progress outside the integer
columns are a 400 before any write.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models.signals import post_delete, post_save

from django_controlplane.remote.errors import LeaseNotYours, RemoteRequestError
from django_controlplane.remote.grants import grant_for, remotely_servable
from django_controlplane.remote.workers import get_remote_worker, held_by_other_accounts
from jobs.claims import ClaimedJob, Runner, claim_jobs
from jobs.clock import DatabaseNow, db_now
from jobs.conf import knob
from jobs.events import LOG_EVENTS, TRANSITION_EVENTS
from jobs.exceptions import UnstorableValue
from jobs.keyed_claims import claim_keyed
from jobs.models import Job, Queue, QueueKind, Worker
from jobs.operations import registry
from jobs.rate_limits import TokenWaits, claim_rate_limited
from jobs.retry_policy import resolved_policy
from jobs.states import CANCELLED, RUNNING, Status
from jobs.storable import check_event_message, storable_json, text_problem, unstorable_fields
from jobs.transitions import cancel_jobs, complete_job, emit_event, fail_job

# A long-poll never parks longer than this.
MAX_WAIT_SECONDS = 30.0
MAX_CLAIM_LIMIT = 100

# Names only the engine writes: a remote worker may not forge its transitions, nor
# write log records past their bounds (logs go through POST /jobs/<id>/logs).
RESERVED_EVENTS = TRANSITION_EVENTS | frozenset(LOG_EVENTS)
LEVELS = ("info", "warning", "error")
# ``_progress_current``/``_progress_total`` land in integer columns (32-bit on
# PostgreSQL); a value outside them was a 500 there.
PROGRESS_MAX = 2**31 - 1
INVALID = "The request is invalid: fix the fields named in 'errors'."


# --- claim ----------------------------------------------------------------------


class _QueueSettings:
    """Every queue's settings, read at most once per ``TTL`` seconds per process.

    A claim attempt is what long-polling workers repeat: with the settings
    cached it costs the worker's row and one ``EXISTS``. A pause or a cap
    changed in this process is seen at once (``post_save``); one changed in
    another process within ``QUEUE_SETTINGS_CACHE_SECONDS`` (1, as local
    workers re-read them; 0 reads them on every attempt).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._read_at = -float("inf")
        self._queues: dict[str, Queue] = {}

    def get(self) -> dict[str, Queue]:
        ttl = float(knob("QUEUE_SETTINGS_CACHE_SECONDS"))
        with self._lock:
            if time.monotonic() - self._read_at < ttl:
                return self._queues
        queues = {q.name: q for q in Queue.objects.all()}
        with self._lock:
            self._queues, self._read_at = queues, time.monotonic()
        return queues

    def forget(self, *args: Any, **kwargs: Any) -> None:
        with self._lock:
            self._read_at = -float("inf")


queue_settings = _QueueSettings()
post_save.connect(
    queue_settings.forget, sender=Queue, dispatch_uid="django_controlplane.remote.queue_settings"
)
post_delete.connect(
    queue_settings.forget, sender=Queue, dispatch_uid="django_controlplane.remote.queue_settings.d"
)


# This process's view of which rate-limited buckets are empty, and until when.
token_waits = TokenWaits()


class _KeyTokens:
    """When a key's next token is due, per queue: a parked claim tries again then.

    Only a hint: unlike a queue's empty bucket it never stops a claim (the
    queue's other keys may have tokens).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._due: dict[str, float] = {}

    def due(self, queue: str, seconds: float) -> None:
        at = time.monotonic() + seconds
        with self._lock:
            self._due[queue] = min(self._due.get(queue, at), at)

    def left(self, queues: list[str]) -> float | None:
        now = time.monotonic()
        with self._lock:
            ends = [self._due.pop(q) for q in queues if q in self._due]
        return max(0.0, min(ends) - now) if ends else None


key_tokens = _KeyTokens()


def _soonest(*waits: float | None) -> float | None:
    known = [w for w in waits if w is not None]
    return min(known) if known else None


@dataclass(frozen=True)
class _OpenQueues:
    """The worker's job queues that are not paused, by how a claim treats them."""

    uncapped: list[str]
    capped: dict[str, int]
    limited: dict[str, tuple[float, int | None]]  # queue -> (rate, cap)
    keyed: dict[str, tuple[float | None, int | None]]  # queue -> (rate, cap), for its keyed jobs


def _open_job_queues(queues: list[str]) -> _OpenQueues:
    settings = queue_settings.get()
    open_queues = _OpenQueues([], {}, {}, {})
    for name in queues:
        q = settings.get(name)
        kind = q.kind if q else Queue.default_kind(name)
        if kind != QueueKind.JOB or (q is not None and q.paused):
            continue
        if q is not None and q.keyed:
            open_queues.keyed[name] = (q.rate_limit_per_second, q.concurrency_cap)
        if q is not None and q.rate_limit_per_second is not None:
            open_queues.limited[name] = (q.rate_limit_per_second, q.concurrency_cap)
        elif q is not None and q.concurrency_cap is not None:
            open_queues.capped[name] = q.concurrency_cap
        else:
            open_queues.uncapped.append(name)
    return open_queues


@dataclass(frozen=True)
class _Served:
    """What a worker may claim now: its operations and queues, less what it may not serve."""

    operations: list[str]
    queues: list[str]


def _served(worker: Worker, user: Any) -> _Served:
    """The worker's operations (never a local one, unless allowed) and queues, narrowed to
    its account's grant as ``REMOTE_WORKER_GRANTS`` reads now (``grants``):
    the claim's SQL asks for these lists only, so a narrowed grant applies at once."""
    operations = remotely_servable(worker.operations)
    queues = list(worker.queues)
    grant = grant_for(user)
    if grant is not None:
        operations, queues = grant.operations_of(operations), grant.queues_of(queues)
    return _Served(operations, queues)


def _claim_once(worker: Worker, served: _Served, limit: int) -> list[ClaimedJob]:
    """Claim up to ``limit`` jobs; a rate-limited queue whose bucket is known empty is skipped
    without a query until its next token is due (``token_waits``)."""
    operations = served.operations
    if not operations:
        return []
    found = _open_job_queues(served.queues)
    uncapped, capped = found.uncapped, found.capped
    limited = {q: v for q, v in found.limited.items() if token_waits.ready(q, rate=v[0])}
    keyed = {
        q: v for q, v in found.keyed.items() if v[0] is None or token_waits.ready(q, rate=v[0])
    }
    queues = list(dict.fromkeys([*uncapped, *capped, *limited, *keyed]))
    if not queues:
        return []
    # A cheap read first: an empty poll must not take SQLite's write lock.
    if not Job.objects.filter(
        status=Status.QUEUED,
        queue__in=queues,
        operation__in=operations,
        run_after__lte=DatabaseNow(),
    ).exists():
        return []
    lease = float(knob("LEASE_SECONDS"))
    # The worker's own host and pid, as it registered them, on each job.started.
    runner = Runner(worker.hostname, worker.pid)
    claimed = (
        claim_jobs(
            queues=uncapped,
            worker_id=worker.pk,
            limit=limit,
            lease_seconds=lease,
            operations=operations,
            runner=runner,
        )
        if uncapped
        else []
    )
    for queue, cap in capped.items():
        if len(claimed) >= limit:
            break
        claimed += claim_jobs(
            queues=[queue],
            worker_id=worker.pk,
            limit=limit - len(claimed),
            lease_seconds=lease,
            operations=operations,
            runner=runner,
            cap=cap,
        )
    for queue, (rate, rate_queue_cap) in limited.items():
        if len(claimed) >= limit:
            break
        result = claim_rate_limited(
            queue=queue,
            worker_id=worker.pk,
            limit=limit - len(claimed),
            lease_seconds=lease,
            operations=operations,
            runner=runner,
            cap=rate_queue_cap,
        )
        if result.retry_in is not None:
            token_waits.hold(queue, rate=rate, seconds=result.retry_in)
        claimed += result.jobs
    for queue, (rate, keyed_cap) in keyed.items():
        if len(claimed) >= limit:
            break
        claimed += _claim_keyed(
            worker, queue, limit - len(claimed), operations, runner, rate, keyed_cap
        )
    return claimed


def _claim_keyed(
    worker: Worker,
    queue: str,
    limit: int,
    operations: list[str],
    runner: Runner,
    rate: float | None,
    cap: int | None,
) -> list[ClaimedJob]:
    """The queue's keyed jobs, within their keys' limits (``jobs.keyed_claims``) and its own."""

    def claim(n: int) -> list[ClaimedJob]:
        result = claim_keyed(
            queue=queue,
            worker_id=worker.pk,
            limit=n,
            lease_seconds=float(knob("LEASE_SECONDS")),
            operations=operations,
            runner=runner,
            cap=cap,
        )
        if result.retry_in is not None:
            key_tokens.due(queue, result.retry_in)
        return result.jobs

    if rate is None:
        return claim(limit)
    bucket = claim_rate_limited(
        queue=queue,
        worker_id=worker.pk,
        limit=limit,
        lease_seconds=float(knob("LEASE_SECONDS")),
        claimer=claim,
    )
    if bucket.retry_in is not None:
        token_waits.hold(queue, rate=rate, seconds=bucket.retry_in)
    return bucket.jobs


@dataclass(frozen=True)
class ClaimAttempt:
    """What one claim attempt found, and what a parked long-poll needs to try again."""

    worker_id: uuid.UUID
    limit: int
    jobs: list[ClaimedJob]
    queues: frozenset[str]
    kind: Hashable  # claims of the same kind find the same jobs (see the ``relay`` module)
    # Seconds until a token is due on one of its rate-limited queues whose bucket is
    # empty; None when none is. A parked long-poll tries again then, unwoken.
    retry_in: float | None = None


def claim(*, worker_id: uuid.UUID | str, user: Any, limit: int = 1) -> ClaimAttempt:
    """Claim and start up to ``limit`` jobs for a remote worker, now, without waiting.

    ``limit`` is capped by the worker's concurrency. The long-poll around it
    (``wait``) is the view's: it parks on the process's relay between
    attempts (``django_controlplane.remote.claim_view``), holding no thread and no connection.
    """
    worker = get_remote_worker(worker_id, user=user)
    limit = max(1, min(int(limit or 1), worker.concurrency, MAX_CLAIM_LIMIT))
    served = _served(worker, user)
    jobs = _runnable(_claim_once(worker, served, limit))
    if jobs:
        Worker.objects.filter(pk=worker.pk).update(last_heartbeat=db_now())
    # A parked claim is woken for, and alike (``kind``) with, what it may claim now.
    queues = served.queues
    return ClaimAttempt(
        worker_id=worker.pk,
        limit=limit,
        jobs=jobs,
        queues=frozenset(queues),
        kind=(tuple(sorted(queues)), tuple(sorted(served.operations))),
        retry_in=None
        if jobs
        else _soonest(token_waits.seconds_left(queues), key_tokens.left(queues)),
    )


def _runnable(jobs: list[ClaimedJob]) -> list[ClaimedJob]:
    """Settle at once, as local workers do, claimed jobs that must not run."""
    out = []
    for job in jobs:
        if job.expired:
            fail_job(
                job.id,
                lease_token=job.lease_token,
                error_code="JobExpired",
                error_message="The job expired before a worker could run it.",
            )
        elif job.parent_id and Job.objects.filter(pk=job.parent_id, status=CANCELLED).exists():
            cancel_jobs([job.id], reason="parent cancelled before the child ran")
        else:
            out.append(job)
    return out


# --- reports on a held job ----------------------------------------------------------


def _token(value: Any) -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except (ValueError, TypeError):
        raise RemoteRequestError(
            INVALID, {"lease_token": ["Give the lease_token the claim returned."]}
        ) from None


def _held_token(job_id: uuid.UUID, lease_token: Any, user: Any) -> uuid.UUID:
    """The lease token, once it is known the caller's account may use it on this job.

    ``LeaseNotYours`` (403) when the token is current but the job was claimed
    by a worker of another account; a stale token passes here and meets the
    fenced write (409), as before.
    """
    token = _token(lease_token)
    if held_by_other_accounts([(job_id, token)], user=user):
        raise LeaseNotYours([job_id])
    return token


def _refuse_unstorable(refusal: str, **values: Any) -> None:
    """``RemoteRequestError`` naming each value no database can store (NUL, surrogate, depth)."""
    errors = unstorable_fields(values)
    if errors:
        raise RemoteRequestError(refusal, errors)


def post_event(
    *,
    job_id: uuid.UUID,
    lease_token: Any,
    event: str,
    message: str = "",
    level: str = "info",
    fields: dict[str, Any] | None = None,
    user: Any,
) -> int:
    """Append an event to a held job's timeline; return its seq.

    ``_progress_current``/``_progress_total`` in ``fields`` move the job's
    progress: whole numbers from 0 to ``PROGRESS_MAX``. The job must have
    been claimed by a worker of ``user``'s account (403 otherwise).
    """
    refused = "The event was not written: fix the fields named in 'errors'."
    errors: dict[str, list[str]] = {}
    if not isinstance(event, str) or not event.strip() or len(event) > 200:
        errors["event"] = ["The event name must be a non-empty string of at most 200 characters."]
    elif event in RESERVED_EVENTS:
        errors["event"] = [
            f"{event!r} is written by the control plane itself; choose another name."
        ]
    elif reason := text_problem(event):
        errors["event"] = [f"The event name {reason}."]
    if level not in LEVELS:
        errors["level"] = [f"The level must be one of {', '.join(LEVELS)}."]
    if fields is not None and not isinstance(fields, dict):
        errors["fields"] = ["fields must be a JSON object."]
    for key in ("_progress_current", "_progress_total"):
        value = (fields or {}).get(key) if isinstance(fields, dict) else None
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= PROGRESS_MAX
        ):
            errors[f"fields.{key}"] = [f"{key} must be a whole number from 0 to {PROGRESS_MAX}."]
    if errors:
        raise RemoteRequestError(refused, errors)
    _refuse_unstorable(refused, message=message or "", fields=fields or {})
    try:  # as a local worker's ``emit``: its fields at most MAX_RESULT_BYTES of JSON
        storable_json(fields or {}, "event's fields", max_bytes=int(knob("MAX_RESULT_BYTES")))
    except UnstorableValue as error:
        raise RemoteRequestError(refused, {"fields": [str(error)]}) from None
    try:  # and its message at most MAX_EVENT_MESSAGE_CHARS
        check_event_message(message or "")
    except UnstorableValue as error:
        raise RemoteRequestError(refused, {"message": [str(error)]}) from None
    return emit_event(
        job_id,
        event=event,
        message=message or "",
        level=level,
        fields=fields or {},
        lease_token=_held_token(job_id, lease_token, user),
    )


def complete(
    *,
    job_id: uuid.UUID,
    lease_token: Any,
    result: Any = None,
    deferred: bool = False,
    user: Any,
) -> Status:
    """running -> succeeded; or, ``deferred``, stay running, still held by this worker.

    A deferred remote job keeps its ``lease_token``: the worker's heartbeats
    go on extending the lease, and the worker (or its successor process
    holding the same token) closes it later with ``complete`` (not deferred)
    or ``fail``. The engine's batch machinery may also close it (a fan-out
    parent). If heartbeats stop, the lease expires and the reaper rescues it
    like any running job; a graceful disconnect requeues it.

    A ``result`` no database can store, or longer than ``MAX_RESULT_BYTES``
    as JSON, is refused (400) before anything is written: the job stays
    running and its lease is still good (the worker may ``fail`` it).
    Error and event messages are not refused: the transitions cut them to
    ``MAX_ERROR_MESSAGE_CHARS``/``MAX_EVENT_MESSAGE_CHARS`` with a marker.
    """
    refused = "The job was not completed: fix the fields named in 'errors'."
    _refuse_unstorable(refused, result=result)
    try:  # as a local worker's result: at most MAX_RESULT_BYTES of JSON
        storable_json(result, "result", max_bytes=int(knob("MAX_RESULT_BYTES")))
    except UnstorableValue as error:
        raise RemoteRequestError(refused, {"result": [str(error)]}) from None
    token = _held_token(job_id, lease_token, user)
    if deferred:
        defer_held_job(job_id, lease_token=token, result=result)
        return Status.RUNNING
    complete_job(job_id, lease_token=token, result=result)
    return Status.SUCCEEDED


def defer_held_job(job_id: uuid.UUID, *, lease_token: uuid.UUID, result: Any = None) -> int:
    """Record ``job.deferred`` (and the interim ``result``) without giving up the lease.

    The event write is fenced by the token and takes the row lock first, so
    the result update below cannot touch a job this worker no longer holds.
    Returns the event's seq.
    """
    with transaction.atomic():
        seq = emit_event(
            job_id,
            event="job.deferred",
            fields={"result": result, "held": True},
            lease_token=lease_token,
        )
        Job.objects.filter(pk=job_id, status=RUNNING, lease_token=lease_token).update(result=result)
    return seq


def retry_backoff(
    attempt: int, stored: dict[str, Any] | None = None, operation: str | None = None
) -> float:
    """The delay before a remote job's next attempt: its ``stored`` retry override
    (``Job.retry_policy``) over its operation's policy when the operation is a local
    one this process knows (``REMOTE_MAY_SERVE_LOCAL``), over the knobs
    (``jobs.retry_policy``), as local workers do. A remote declaration has no policy."""
    declared = registry.get(operation).retry_policy if operation in registry else None
    return resolved_policy(stored, declared).delay(attempt)


def fail(
    *,
    job_id: uuid.UUID,
    lease_token: Any,
    error_code: str,
    error_message: str,
    retryable: bool = False,
    traceback: str | None = "",
    user: Any,
) -> Status:
    """A failed run: queued with backoff while attempts remain (if retryable), else failed.

    ``traceback``, the worker's formatted one, is kept (bounded) on the failure's event.
    """
    _refuse_unstorable(
        "The job was not failed: fix the fields named in 'errors'.",
        error_code=error_code or "",
        error_message=error_message or "",
        traceback=traceback or "",
    )
    token = _held_token(job_id, lease_token, user)
    attempt, stored, operation = Job.objects.filter(pk=job_id).values_list(
        "attempts", "retry_policy", "operation"
    ).first() or (1, None, None)
    return fail_job(
        job_id,
        lease_token=token,
        error_code=(error_code or "RemoteError")[:200],
        error_message=error_message or "",
        retryable=bool(retryable),
        backoff_seconds=retry_backoff(attempt or 1, stored, operation) if retryable else None,
        traceback=traceback or "",
    )
