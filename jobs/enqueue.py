"""Putting jobs on queues, from Python, the CLI and the REST API alike.

``enqueue_many`` stores any number of jobs and their ``job.enqueued`` events
in one statement per 1,000 jobs, inside the caller's transaction if there is
one: the jobs exist only if the caller commits. On PostgreSQL the same
statement sends one ``NOTIFY`` per queue (only the queue name: workers treat
it as a hint and claim from the table).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.db import connections, transaction
from django.utils import timezone

from jobs.conf import knob
from jobs.dialect import dialect
from jobs.exceptions import EnqueueError
from jobs.models import PRIORITY_MAX, PRIORITY_MIN, Job
from jobs.operations import operation_spec

NOTIFY_CHANNEL = "controlplane_jobs"
CHUNK = 1000

JOB_COLUMNS = (
    "id, operation, queue, payload, status, priority, run_after, expires_at, attempts, "
    "max_attempts, lease_requeues, parent_id, progress_current, progress_total, error_code, "
    "error_message, created_at, idempotency_key, last_event_seq, last_event_at"
)


@dataclass
class JobSpec:
    """One job to enqueue; ``None`` fields take the operation's defaults."""

    operation: str
    payload: Any = field(default_factory=dict)
    queue: str | None = None
    priority: int = 0
    run_after: datetime | None = None
    expires_at: datetime | None = None
    max_attempts: int | None = None
    parent: uuid.UUID | str | None = None
    idempotency_key: str | None = None


def _validate(spec: JobSpec) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    try:
        op = operation_spec(spec.operation)
    except EnqueueError as error:
        return dict(error.errors)
    if not isinstance(spec.payload, dict):
        return {"payload": ["The payload must be a JSON object."]}
    size = len(json.dumps(spec.payload, separators=(",", ":")).encode())
    limit = int(knob("MAX_PAYLOAD_BYTES"))
    if size > limit:
        errors["payload"] = [f"The payload is {size} bytes; the limit is {limit} bytes."]
    else:
        errors.update(op.validate(spec.payload))
    if isinstance(spec.priority, bool) or not isinstance(spec.priority, int) or not (
        PRIORITY_MIN <= spec.priority <= PRIORITY_MAX
    ):
        errors["priority"] = [
            f"Priority must be a whole number from {PRIORITY_MIN} to {PRIORITY_MAX}."
        ]
    if spec.max_attempts is not None and (
        not isinstance(spec.max_attempts, int) or not 1 <= spec.max_attempts <= 1000
    ):
        errors["max_attempts"] = ["max_attempts must be a whole number from 1 to 1000."]
    for name in ("run_after", "expires_at"):
        value = getattr(spec, name)
        if value is not None and (not isinstance(value, datetime) or timezone.is_naive(value)):
            errors[name] = [f"{name} must be a timezone-aware datetime."]
    if spec.queue is not None and (not isinstance(spec.queue, str) or not spec.queue.strip()):
        errors["queue"] = ["The queue name must be a non-empty string."]
    if spec.idempotency_key is not None and (
        not isinstance(spec.idempotency_key, str) or not 0 < len(spec.idempotency_key) <= 255
    ):
        errors["idempotency_key"] = ["The idempotency key must be 1 to 255 characters."]
    return errors


def enqueue_many(specs: Sequence[JobSpec], *, using: str = "default") -> list[Job]:
    """Validate and store ``specs``; return their jobs in the same order.

    Nothing is stored if any spec is invalid (``EnqueueError`` names the
    index and field). A spec whose ``idempotency_key`` already exists returns
    the existing job instead of a new one.
    """
    errors: dict[str, list[str]] = {}
    for index, spec in enumerate(specs):
        for name, messages in _validate(spec).items():
            errors[name if len(specs) == 1 else f"{index}.{name}"] = messages
    if errors:
        raise EnqueueError("The job was not enqueued: fix the fields named in 'errors'.", errors)
    parents = {_canonical_id(s.parent) for s in specs if s.parent}
    if parents:
        try:
            found = {str(p) for p in Job.objects.using(using).filter(pk__in=parents).values_list("pk", flat=True)}
        except (ValueError, TypeError, ValidationError):  # not a UUID: reported as missing
            found = set()
        missing = parents - found
        if missing:
            raise EnqueueError(
                "The job was not enqueued: its parent does not exist.",
                {"parent": [f"No job with id {m}." for m in sorted(missing)]},
            )
    now = timezone.now()
    jobs = [_build(spec, now) for spec in specs]
    inserted: set[uuid.UUID] = set()
    with transaction.atomic(using=using):
        for start in range(0, len(jobs), CHUNK):
            inserted |= _insert(jobs[start : start + CHUNK], using=using)
    result = []
    keyed = {j.idempotency_key for j in jobs if j.pk not in inserted and j.idempotency_key}
    existing = {
        j.idempotency_key: j for j in Job.objects.using(using).filter(idempotency_key__in=keyed)
    } if keyed else {}
    for job in jobs:
        if job.pk in inserted:
            job._state.adding = False
            job._state.db = using
            result.append(job)
        else:
            result.append(existing[job.idempotency_key])
    return result


def _canonical_id(value: Any) -> str:
    """A job id as the database returns it (hyphenated), so a hex id is found too."""
    try:
        return str(uuid.UUID(str(value)))
    except ValueError:
        return str(value)


def enqueue(operation: str, payload: dict[str, Any] | None = None, **options: Any) -> Job:
    """Enqueue one job. Options are the fields of ``JobSpec``."""
    using = options.pop("using", "default")
    return enqueue_many([JobSpec(operation=operation, payload=payload if payload is not None else {}, **options)], using=using)[0]


def _build(spec: JobSpec, now: datetime) -> Job:
    op = operation_spec(spec.operation)
    return Job(
        id=uuid.uuid4(),
        operation=spec.operation,
        queue=spec.queue or op.queue,
        payload=spec.payload,
        priority=spec.priority,
        run_after=spec.run_after or now,
        expires_at=spec.expires_at,
        max_attempts=spec.max_attempts or op.max_attempts,
        parent_id=uuid.UUID(str(spec.parent)) if spec.parent else None,
        created_at=now,
        idempotency_key=spec.idempotency_key,
        last_event_seq=1,
        last_event_at=now,
    )


def _insert(jobs: list[Job], *, using: str) -> set[uuid.UUID]:
    d = dialect(using)
    row = f"(%s, %s, %s, {d.json_param}, 'queued', %s, %s, %s, 0, %s, 0, %s, 0, NULL, '', '', %s, %s, 1, %s)"
    params: list[Any] = []
    for j in jobs:
        params += [
            d.uuid(j.id),
            j.operation,
            j.queue,
            d.json(j.payload),
            j.priority,
            d.ts(j.run_after),
            d.ts(j.expires_at),
            j.max_attempts,
            d.uuid(j.parent_id),
            d.ts(j.created_at),
            j.idempotency_key,
            d.ts(j.created_at),
        ]
    insert = (
        f"INSERT INTO jobs_job ({JOB_COLUMNS}) VALUES {', '.join([row] * len(jobs))} "
        "ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING "
        "RETURNING id, created_at"
    )
    event_columns = "job_id, seq, ts, event, level, message, fields"
    with connections[using].cursor() as cursor:
        if d.postgres:
            cursor.execute(
                f"WITH ins AS ({insert}) INSERT INTO jobs_jobevent ({event_columns}) "
                "SELECT id, 1, created_at, 'job.enqueued', 'info', '', '{}'::jsonb FROM ins "
                "RETURNING job_id",
                params,
            )
            ids = {r[0] for r in cursor.fetchall()}
            # Delivered at commit, once per queue however many jobs it got.
            notify_queues(sorted({j.queue for j in jobs}), using=using)
            return ids
        cursor.execute(insert, params)
        rows = cursor.fetchall()
        cursor.executemany(
            f"INSERT INTO jobs_jobevent ({event_columns}) VALUES (%s, 1, %s, 'job.enqueued', 'info', '', '{{}}')",
            [(r[0], r[1]) for r in rows],
        )
        return {d.read_uuid(r[0]) for r in rows}


def notify_queues(queues: Sequence[str], *, using: str = "default") -> None:
    """Wake workers of ``queues`` (PostgreSQL only; a no-op on SQLite, where workers poll)."""
    if dialect(using).postgres and queues:
        with connections[using].cursor() as cursor:
            cursor.execute(
                f"SELECT pg_notify('{NOTIFY_CHANNEL}', q) FROM unnest(%s::text[]) AS q",
                [sorted(set(queues))],
            )
